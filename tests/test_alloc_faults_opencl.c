/* Allocation failures on the opencl backend: the workload of tests/fault_workload.h with
   allocation n refused. Each refusal gives an error (TB_ERR_OUT_OF_MEMORY, with a message) or
   exactly the results of a clean run; the same session then runs the workload right;
   tb_shutdown leaves no block. The suite refuses a sample of the allocations (the first 16 and
   a spread over the rest); TB_TEST_ALLOC_SWEEP=full refuses every one (tools/fault_sweep.sh;
   TB_TEST_ALLOC_SHARD=i/k takes the n equal to i modulo k, for k processes),
   TB_TEST_ALLOC_SWEEP=<count> that many. Skipped without an OpenCL device. */
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

/* Allocations refused in the suite's run (about a minute on two cores under the sanitizers). */
#define SAMPLE 48

static void test_opencl_allocations(void **state) {
    wl_config cfg;
    wl_sweep_stats stats;
    size_t count = 0;
    (void)state;
    if (tb_opencl_available() != TB_OK) {
        print_message("no OpenCL device, skipped: %s\n", tb_last_error());
        tb_shutdown();
        skip();
    }
    assert_int_equal(tb_backend_devices("opencl", NULL, 0, &count), TB_OK);
    memset(&cfg, 0, sizeof cfg);
    assert_int_equal(tb_device_make("opencl", 0, &cfg.dev), TB_OK);
    /* transfers go to a second OpenCL device where there is one (POCL_DEVICES="pthread
       pthread"), else to the cpu backend */
    if (count > 1) {
        assert_int_equal(tb_device_make("opencl", 1, &cfg.other), TB_OK);
    } else {
        assert_int_equal(tb_device_make("cpu", 0, &cfg.other), TB_OK);
    }
    tb_shutdown();
    snprintf(cfg.dir, sizeof cfg.dir, "%s", wl_dir);
    wl_sweep(&cfg, false, SAMPLE, &stats);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opencl_allocations),
    };
    return cmocka_run_group_tests(tests, wl_group_setup, wl_group_teardown);
}
