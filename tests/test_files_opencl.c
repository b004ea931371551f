/* Model files and printing on an OpenCL device: loads copy the values to a device with memory
   of its own, or, on one that shares the host's (PoCL's), read the 64-byte aligned tensors in
   the file's mapping, and keep nothing mapped once the tensors go; saves read the values back,
   and the printed text names the device. Skipped without an OpenCL device. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include "scratch_dir.h"

static tb_device cl;

static int mappings_of(const char *path) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    int n = 0;
    if (f == NULL) return -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (strstr(line, path) != NULL) ++n;
    fclose(f);
    return n;
}

static void skip_without_opencl(void) {
    if (cl.backend[0] == '\0') {
        printf("no OpenCL device: skipping\n");
        skip();
    }
}

static tb_tensor_set *sample_set(void) {
    tb_tensor_set *set = tb_tensor_set_new();
    const int64_t d23[2] = {2, 3};
    const float f[6] = {1.5f, -2, 0, 3.25f, 1e-30f, -7};
    const int64_t l[6] = {INT64_MIN, -5, 0, 5, 6, INT64_MAX};
    const uint8_t b[6] = {1, 0, 0, 1, 1, 0};
    tb_shape sf, sl, sb;
    assert_int_equal(tb_shape_make(&sf, TB_F32, 2, d23), TB_OK);
    assert_int_equal(tb_shape_make(&sl, TB_I64, 2, d23), TB_OK);
    assert_int_equal(tb_shape_make(&sb, TB_BOOL, 2, d23), TB_OK);
    tb_tensor *ts[3] = {tb_tensor_from_host(f, &sf, &cl), tb_tensor_from_host(l, &sl, &cl),
                        tb_tensor_from_host(b, &sb, &cl)};
    const char *names[3] = {"f", "l", "b"};
    for (int i = 0; i < 3; ++i) {
        assert_non_null(ts[i]);
        /* a pending op on the device: the save syncs it there */
        tb_tensor *pending = i == 0 ? tb_mul_scalar(ts[i], 2.0) : tb_tensor_retain(ts[i]);
        assert_int_equal(tb_tensor_set_add(set, names[i], pending), TB_OK);
        tb_tensor_release(pending);
        tb_tensor_release(ts[i]);
    }
    return set;
}

static void check_set(tb_tensor_set *set) {
    float f[6];
    int64_t l[6];
    uint8_t b[6];
    const float want_f[6] = {3, -4, 0, 6.5f, 2e-30f, -14};
    const int64_t want_l[6] = {INT64_MIN, -5, 0, 5, 6, INT64_MAX};
    const uint8_t want_b[6] = {1, 0, 0, 1, 1, 0};
    assert_int_equal(tb_tensor_set_count(set), 3);
    for (size_t i = 0; i < 3; ++i) {
        tb_device dev = tb_tensor_device(tb_tensor_set_tensor(set, i));
        assert_true(tb_device_equal(&dev, &cl));
    }
    assert_int_equal(tb_tensor_to_host(tb_tensor_set_get(set, "f"), f, sizeof f), TB_OK);
    assert_int_equal(tb_tensor_to_host(tb_tensor_set_get(set, "l"), l, sizeof l), TB_OK);
    assert_int_equal(tb_tensor_to_host(tb_tensor_set_get(set, "b"), b, sizeof b), TB_OK);
    assert_memory_equal(f, want_f, sizeof f);
    assert_memory_equal(l, want_l, sizeof l);
    assert_memory_equal(b, want_b, sizeof b);
}

static void test_safetensors_on_opencl(void **state) {
    tb_device_info info;
    (void)state;
    skip_without_opencl();
    tb_tensor_set *set = sample_set();
    const char *path = path_of("cl.safetensors");
    assert_int_equal(tb_safetensors_save(path, set), TB_OK);
    tb_tensor_set_free(set);
    set = tb_safetensors_load(path, &cl);
    if (set == NULL) fail_msg("%s", tb_last_error());
    assert_int_equal(tb_backend_device_info(&cl, &info), TB_OK);
    /* copied to a device with memory of its own: nothing stays mapped; a device that shares
       the host's memory reads the 64-byte aligned tensors in the mapping */
    if (!info.unified_memory) assert_int_equal(mappings_of(path), 0);
    check_set(set);
    tb_tensor_set_free(set);
    assert_int_equal(mappings_of(path), 0); /* given back with the last tensor */
}

static void test_npz_on_opencl(void **state) {
    (void)state;
    skip_without_opencl();
    tb_tensor_set *set = sample_set();
    const char *path = path_of("cl.npz");
    assert_int_equal(tb_npz_save(path, set), TB_OK);
    tb_tensor_set_free(set);
    set = tb_npz_load(path, &cl);
    if (set == NULL) fail_msg("%s", tb_last_error());
    assert_int_equal(mappings_of(path), 0);
    check_set(set);
    tb_tensor_set_free(set);
}

static void test_print_names_the_device(void **state) {
    (void)state;
    skip_without_opencl();
    tb_tensor *t = tb_arange(0, 3, 1, TB_I32, &cl);
    tb_tensor *u = tb_mul_scalar(t, 2.0); /* i32 * a float number is f32, as in PyTorch */
    char text[128];
    char want[128];
    char dev[64];
    tb_device_format(&cl, dev, sizeof dev);
    snprintf(want, sizeof want, "tensor([0., 2., 4.], device='%s', dtype=f32)", dev);
    assert_int_equal(tb_tensor_format(u, text, sizeof text, NULL), TB_OK);
    assert_string_equal(text, want);
    tb_tensor_release(u);
    tb_tensor_release(t);
}

static int setup(void **state) {
    (void)state;
    if (scratch_make("tb_files_cl") != 0) return -1;
    memset(&cl, 0, sizeof cl);
    if (tb_device_make("opencl", 0, &cl) != TB_OK) {
        memset(&cl, 0, sizeof cl);
        tb_clear_error();
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_on_opencl),
        cmocka_unit_test(test_npz_on_opencl),
        cmocka_unit_test(test_print_names_the_device),
    };
    return cmocka_run_group_tests_name("files_opencl", tests, setup, teardown);
}
