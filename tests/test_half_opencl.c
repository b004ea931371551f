/* f16 and bf16 on the opencl backend: every case of tests/half_torch.py against its reference
   within the case's tolerance (bit equality for exactly rounded ops, one unit in the last place
   otherwise, PyTorch's own 16-bit kernels within a stated number of units at the output's
   scale: see tests/test_half.c), and against the cpu backend (the reference backend) within
   the same number of units; 16-bit kernels with fused chains and reductions checked by
   TB_CHECK's run on the reference. TB_HALF_ORACLE_PREFIX and TB_HALF_VERBOSE as in
   tests/test_half.c. Skipped where no OpenCL device is usable or PyTorch is not importable. */
#define _POSIX_C_SOURCE 200809L /* popen, getline, strtok_r */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"
#include "half_cases.h"

static tb_device ocl;

static void need_cases(void) {
    if (ocl.backend[0] == '\0') skip();
    half_need();
}

static void test_ops_against_torch_and_reference(void **state) {
    tb_device cpu;
    void **on_ocl = NULL, **on_cpu = NULL;
    size_t ci;
    int64_t n = 0, i;
    int differ = 0;
    char why[160];
    (void)state;
    need_cases();
    assert_int_equal(tb_device_parse("cpu:0", &cpu), TB_OK);
    assert_int_equal(half_device_conversions(&ocl), 0);
    assert_int_equal(half_run_cases(&ocl, &on_ocl), 0);
    assert_int_equal(half_run_cases(&cpu, &on_cpu), 0);
    for (ci = 0; ci < g_half.num_cases; ci++) {
        const half_case *c = &g_half.cases[ci];
        tb_shape_numel(&c->out.shape, &n);
        for (i = 0; i < n; i++) {
            if (!half_close(c->out.shape.dtype, on_ocl[ci], on_cpu[ci], i, c->ulps, why,
                            sizeof why)) {
                print_message("%s: opencl against cpu, %s\n", c->name, why);
                differ++;
                break;
            }
        }
        free(on_ocl[ci]);
        free(on_cpu[ci]);
    }
    free(on_ocl);
    free(on_cpu);
    assert_int_equal(differ, 0);
}

/* A longer graph: two 16-bit dtypes, a cast between them, a fused chain into a split
   reduction, a matmul with an epilogue, all checked node by node against the reference. */
static void test_graph_checked_on_reference(void **state) {
    tb_shape s = tb_shape_of(TB_F16, 2, 64, 4096);
    tb_tensor *x, *b, *y, *r, *m, *w;
    uint16_t out[64];
    (void)state;
    if (ocl.backend[0] == '\0') skip();
    setenv("TB_CHECK", "1", 1);
    tb_manual_seed(7);
    x = tb_cast(tb_rand(&s, &ocl), TB_F16);
    b = tb_cast(x, TB_BF16);
    y = tb_mul_scalar(tb_add(tb_exp(x), tb_cast(b, TB_F16)), 0.5);
    r = tb_sum(y, (int32_t[]){1}, 1, false);
    m = tb_matmul(tb_slice(y, 1, 0, 64, 1), tb_transpose(tb_slice(x, 1, 0, 64, 1), 0, 1));
    w = tb_relu(tb_sub(m, tb_full(&(tb_shape){TB_F16, 0, {0}}, 8.0, &ocl)));
    assert_int_equal(tb_tensor_to_host(r, out, sizeof out), TB_OK);
    assert_int_equal(tb_sync(&w, 1), TB_OK);
    unsetenv("TB_CHECK");
    tb_tensor_release(w);
    tb_tensor_release(m);
    tb_tensor_release(r);
    tb_tensor_release(y);
    tb_tensor_release(b);
    tb_tensor_release(x);
}

static int setup(void **state) {
    size_t count = 0;
    (void)state;
    if (tb_opencl_available() != TB_OK || tb_backend_devices("opencl", NULL, 0, &count) != TB_OK ||
        count == 0 || tb_device_make("opencl", 0, &ocl) != TB_OK) {
        printf("no OpenCL device (%s): the tests skip\n", tb_last_error());
        memset(&ocl, 0, sizeof ocl);
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    half_free();
    tb_shutdown();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_against_torch_and_reference),
        cmocka_unit_test(test_graph_checked_on_reference),
    };
    return cmocka_run_group_tests_name("half_opencl", tests, setup, teardown);
}
