/* Allocation failures on the cpu backend: the workload of tests/fault_workload.h (every public
   area) with allocation n refused, for every n from 1 until the workload makes fewer. Each
   refusal gives an error (TB_ERR_OUT_OF_MEMORY, with a message) or exactly the results of a
   clean run; the same session then runs the workload right; tb_shutdown leaves no block.
   The OpenCL sweep is tests/test_alloc_faults_opencl.c. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault_workload.h"

/* Whether the example plugin was built into TB_BACKEND_PATH (tools/test.sh builds it). */
static bool plugin_built(void) {
    const char *dir = getenv("TB_BACKEND_PATH");
    char path[1024];
    size_t len;
    if (dir == NULL || dir[0] == '\0') return false;
    len = strcspn(dir, ":");
    snprintf(path, sizeof path, "%.*s/libtb_backend_plugin.so", (int)len, dir);
    return access(path, R_OK) == 0;
}

static void test_cpu_every_allocation(void **state) {
    wl_config cfg;
    wl_sweep_stats stats;
    (void)state;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.dev.backend, sizeof cfg.dev.backend, "cpu");
    cfg.dev.type = TB_DEVICE_CPU;
    snprintf(cfg.other.backend, sizeof cfg.other.backend, "wl_host");
    cfg.other.type = TB_DEVICE_CPU;
    snprintf(cfg.dir, sizeof cfg.dir, "%s", wl_dir);
    cfg.plugin = plugin_built();
    if (!cfg.plugin) print_message("the plugin is not built: the sweep does not load it\n");
    wl_sweep(&cfg, true, 0, &stats);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_every_allocation),
    };
    return cmocka_run_group_tests(tests, wl_group_setup, wl_group_teardown);
}
