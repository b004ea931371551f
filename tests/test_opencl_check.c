/* TB_CHECK: every graph also runs on the reference backend, and the first node whose values
   differ is reported with its op, shape and the two values; at 2 (TB_CHECK=2) that sync also
   fails. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

/* The backend under test ("opencl"; tests/test_native_check.c includes this file for "native"). */
#ifndef TEST_BACKEND
#define TEST_BACKEND "opencl"
#endif

static char warnings[4096];

static void capture(tb_log_level level, const char *message, void *user_data) {
    (void)user_data;
    if (level <= TB_LOG_WARN && strlen(warnings) + strlen(message) + 2 < sizeof warnings) {
        strcat(warnings, message);
        strcat(warnings, "\n");
    }
}

/* The reference adds 1; the kernel expression adds 2: a backend bug made to order. */
static tb_status plus_one_ref(const void *const *in, const tb_shape *in_shapes, size_t n, void *out,
                              const tb_shape *out_shape, const int64_t *attrs, size_t num_attrs,
                              void *user_data) {
    int64_t count = 0;
    (void)in_shapes, (void)n, (void)attrs, (void)num_attrs, (void)user_data;
    tb_shape_numel(out_shape, &count);
    for (int64_t i = 0; i < count; ++i)
        ((float *)out)[i] = ((const float *)in[0])[i] + 1.0f;
    return TB_OK;
}

static int setup(void **state) {
    (void)state;
    tb_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.check = 1;
    desc.logger.func = capture;
    return tb_setup(&desc) == TB_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tb_shutdown();
    return 0;
}

static bool have_opencl(void) {
    size_t count = 0;
    return tb_backend_devices(TEST_BACKEND, NULL, 0, &count) == TB_OK && count > 0;
}

static tb_tensor *input(const tb_device *dev) {
    static const float v[6] = {-1.5f, 0.0f, 0.25f, 1.0f, 2.0f, 3.5f};
    tb_shape s = tb_shape_of(TB_F32, 2, 2, 3);
    return tb_tensor_from_host(v, &s, dev);
}

static void test_agreeing_graph_is_checked_silently(void **state) {
    (void)state;
    if (!have_opencl()) {
        printf("no OpenCL device: skipping\n");
        skip();
    }
    tb_device dev;
    assert_int_equal(tb_device_make(TEST_BACKEND, 0, &dev), TB_OK);
    warnings[0] = '\0';
    tb_metrics_reset();
    tb_tensor *x = input(&dev);
    tb_tensor *e = tb_exp(x);
    tb_tensor *y = tb_softmax(e, 1);
    float out[6];
    assert_int_equal(tb_tensor_to_host(y, out, sizeof out), TB_OK);
    assert_int_equal(tb_metrics_counter("CheckedGraphs"), 1);
    assert_int_equal(tb_metrics_counter("CheckMismatch"), 0);
    assert_string_equal(warnings, "");
    tb_tensor_release(y);
    tb_tensor_release(e);
    tb_tensor_release(x);
}

static void test_first_differing_node_is_reported(void **state) {
    (void)state;
    if (!have_opencl()) {
        printf("no OpenCL device: skipping\n");
        skip();
    }
    tb_custom_op_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.name = "plus_one";
    desc.num_inputs = 1;
    desc.reference = plus_one_ref;
    desc.opencl_expr = "x0 + (T)2";
    tb_op op;
    assert_int_equal(tb_op_register(&desc, &op), TB_OK);
    tb_device dev;
    assert_int_equal(tb_device_make(TEST_BACKEND, 0, &dev), TB_OK);
    warnings[0] = '\0';
    tb_metrics_reset();
    tb_tensor *x = input(&dev);
    tb_tensor *r = tb_relu(x);
    tb_tensor *p = tb_call_op(op, &r, 1, NULL, 0);
    tb_tensor *y = tb_mul_scalar(p, 3.0); /* differs too, but after the first */
    float out[6];
    /* the user's result is the backend's, and the call succeeds: the check only reports */
    assert_int_equal(tb_tensor_to_host(y, out, sizeof out), TB_OK);
    assert_true(out[0] == 6.0f);
    assert_int_equal(tb_metrics_counter("CheckMismatch"), 1);
    if (strstr(warnings, "plus_one f32[2,3]") == NULL ||
        strstr(warnings, "differs at element 0") == NULL || strstr(warnings, "gives 2,") == NULL ||
        strstr(warnings, "the reference gives 1") == NULL)
        fail_msg("unexpected report: %s", warnings);
    tb_tensor_release(y);
    tb_tensor_release(p);
    tb_tensor_release(r);
    tb_tensor_release(x);
}

/* TB_CHECK=2 in the environment (what a user's CI sets): the sync of a graph that differs
   fails with TB_ERR_EXECUTE and the report as its message, so the program can fail; a graph
   that agrees syncs as before. */
static void test_check_2_from_env_fails_the_sync(void **state) {
    (void)state;
    if (!have_opencl()) {
        printf("no OpenCL device: skipping\n");
        skip();
    }
    tb_shutdown();
    setenv("TB_CHECK", "2", 1);
    tb_desc setup_desc;
    memset(&setup_desc, 0, sizeof setup_desc);
    setup_desc.logger.func = capture;
    assert_int_equal(tb_setup(&setup_desc), TB_OK);
    unsetenv("TB_CHECK");
    tb_custom_op_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.name = "plus_one";
    desc.num_inputs = 1;
    desc.reference = plus_one_ref;
    desc.opencl_expr = "x0 + (T)2";
    tb_op op;
    assert_int_equal(tb_op_register(&desc, &op), TB_OK);
    tb_device dev;
    assert_int_equal(tb_device_make(TEST_BACKEND, 0, &dev), TB_OK);
    warnings[0] = '\0';
    tb_tensor *x = input(&dev);
    tb_tensor *good = tb_neg(x);
    float out[6];
    assert_int_equal(tb_tensor_to_host(good, out, sizeof out), TB_OK);
    assert_true(out[0] == 1.5f);
    assert_string_equal(warnings, "");
    tb_tensor *p = tb_call_op(op, &x, 1, NULL, 0);
    tb_clear_error();
    assert_int_equal(tb_tensor_to_host(p, out, sizeof out), TB_ERR_EXECUTE);
    assert_int_equal(tb_last_status(), TB_ERR_EXECUTE);
    if (strncmp(tb_last_error(), "tb_tensor_to_host: TB_CHECK: graph ", 35) != 0 ||
        strstr(tb_last_error(), "plus_one f32[2,3]") == NULL ||
        strstr(tb_last_error(), "differs at element 0") == NULL)
        fail_msg("unexpected error: %s", tb_last_error());
    assert_non_null(strstr(warnings, "differs at element 0")); /* reported as at level 1 too */
    assert_int_equal(tb_metrics_counter("CheckMismatch"), 1);
    tb_tensor_release(p);
    tb_tensor_release(good);
    tb_tensor_release(x);
    /* back to the group's setup (TB_CHECK=1 through the desc) */
    tb_shutdown();
    assert_int_equal(setup(NULL), 0);
}

static void test_cpu_graphs_are_not_checked_against_themselves(void **state) {
    (void)state;
    tb_metrics_reset();
    tb_tensor *x = input(NULL);
    tb_tensor *y = tb_neg(x);
    float out[6];
    assert_int_equal(tb_tensor_to_host(y, out, sizeof out), TB_OK);
    assert_int_equal(tb_metrics_counter("CheckedGraphs"), 0);
    tb_tensor_release(y);
    tb_tensor_release(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agreeing_graph_is_checked_silently),
        cmocka_unit_test(test_first_differing_node_is_reported),
        cmocka_unit_test(test_check_2_from_env_fails_the_sync),
        cmocka_unit_test(test_cpu_graphs_are_not_checked_against_themselves),
    };
    return cmocka_run_group_tests_name("TB_CHECK", tests, setup, teardown);
}
