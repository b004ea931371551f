/* DLPack with the OpenCL backend: exports are host memory (the buffer itself where the device
   shares the host's memory, else a copy); imports read an aligned contiguous array in place
   where the device shares the host's memory (its deleter runs once the library and the queue
   are done with it), else copy it to the device (the deleter runs at once). Skipped where no
   OpenCL device is usable. (Apart from
   tests/test_dlpack.c because the OpenCL runtime's own allocations are not leak-checked.) */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

static tb_device ocl;

static int deleter_calls;

static void counting_deleter(tb_dl_managed_tensor *self) {
    (void)self;
    deleter_calls++;
}

/* A kDLCPU f32 managed tensor over `data`; NULL strides mean C-contiguous. */
static void make_managed(tb_dl_managed_tensor *m, float *data, int64_t *shape, int32_t ndim,
                         int64_t *strides) {
    memset(m, 0, sizeof *m);
    m->dl_tensor.data = data;
    m->dl_tensor.device.device_type = TB_DL_CPU;
    m->dl_tensor.ndim = ndim;
    m->dl_tensor.dtype.code = TB_DL_FLOAT;
    m->dl_tensor.dtype.bits = 32;
    m->dl_tensor.dtype.lanes = 1;
    m->dl_tensor.shape = shape;
    m->dl_tensor.strides = strides;
    m->deleter = counting_deleter;
}

/* An export is host memory the consumer reads: on a device that shares the host's memory
   (PoCL's) the tensor's own buffer, mapped for reading until the deleter runs (no transfer;
   marked read-only, and no later result writes that buffer), elsewhere a copy of the consumer's
   own. Either way the tensor stays usable while exported, and an export outlives it. */
static void test_export_to_host(void **state) {
    (void)state;
    if (ocl.backend[0] == '\0') skip();
    float host[6] = {1, -2, 3.5f, 4, 0, -6}, out[6];
    int64_t dims[2] = {2, 3};
    tb_shape s;
    tb_tensor *t, *y, *z;
    tb_dl_managed_tensor *m = NULL;
    tb_dl_managed_tensor_versioned *v = NULL;
    tb_device_info info;
    int64_t moves;
    int i;
    assert_int_equal(tb_backend_device_info(&ocl, &info), TB_OK);
    assert_int_equal(tb_shape_make(&s, TB_F32, 2, dims), TB_OK);
    t = tb_tensor_from_host(host, &s, &ocl);
    y = tb_neg(t);
    assert_non_null(y);
    assert_int_equal(tb_sync(&y, 1), TB_OK);
    moves = tb_metrics_counter("TransferFromDeviceTime");
    assert_int_equal(tb_dlpack_export(y, &m), TB_OK);
    assert_int_equal(m->dl_tensor.device.device_type, TB_DL_CPU); /* host memory either way */
    assert_int_equal(m->dl_tensor.ndim, 2);
    assert_int_equal(m->dl_tensor.strides[0], 3);
    for (i = 0; i < 6; ++i)
        assert_true(((const float *)m->dl_tensor.data)[i] == -host[i]);
    assert_int_equal(tb_dlpack_export_versioned(y, &v), TB_OK);
    if (info.unified_memory) {
        assert_int_equal(v->flags, TB_DLPACK_FLAG_READ_ONLY); /* the tensor's own buffer */
        assert_int_equal(tb_metrics_counter("TransferFromDeviceTime"), moves);
    } else {
        assert_int_equal(v->flags, TB_DLPACK_FLAG_IS_COPIED); /* the consumer's own copy */
        assert_ptr_not_equal(v->dl_tensor.data, m->dl_tensor.data);
        assert_int_equal(tb_metrics_counter("TransferFromDeviceTime"), moves + 2);
    }
    /* the exported tensor read by a kernel and assigned a new value meanwhile: the exports
       keep what they had */
    z = tb_add(y, y);
    assert_non_null(z);
    assert_int_equal(tb_tensor_to_host(z, out, sizeof out), TB_OK);
    for (i = 0; i < 6; ++i)
        assert_true(out[i] == -2 * host[i]);
    assert_int_equal(tb_assign(y, t), TB_OK);
    assert_int_equal(tb_sync(&y, 1), TB_OK);
    tb_tensor_release(z);
    tb_tensor_release(t);
    tb_tensor_release(y);
    for (i = 0; i < 6; ++i) {
        assert_true(((const float *)m->dl_tensor.data)[i] == -host[i]);
        assert_true(((const float *)v->dl_tensor.data)[i] == -host[i]);
    }
    m->deleter(m);
    v->deleter(v);
}

/* An import on a device that shares the host's memory (PoCL's) reads a contiguous array that
   starts on a 64-byte boundary in place: an export of it lends that same array, and the
   producer's deleter runs once the library lets go. An unaligned or strided array, and any on a
   device with memory of its own, is copied and its deleter runs at once. */
static void test_import_borrows_or_copies(void **state) {
    (void)state;
    if (ocl.backend[0] == '\0') skip();
    float *host = (float *)aligned_alloc(64, 64 * sizeof(float)), out[64];
    int64_t dims[2] = {4, 16}, tdims[2] = {3, 2}, strides[2] = {1, 3};
    tb_dl_managed_tensor m, n, q, *e = NULL;
    tb_device_info info;
    tb_tensor *t, *u, *y;
    int i, j;
    assert_non_null(host);
    assert_int_equal(tb_backend_device_info(&ocl, &info), TB_OK);
    for (i = 0; i < 64; i++)
        host[i] = (float)i * 0.5f - 3.0f;
    deleter_calls = 0;
    make_managed(&m, host, dims, 2, NULL);
    t = tb_dlpack_import(&m, &ocl);
    assert_non_null(t);
    assert_string_equal(tb_tensor_device(t).backend, "opencl");
    assert_int_equal(deleter_calls, info.unified_memory ? 0 : 1);
    assert_int_equal(tb_dlpack_export(t, &e), TB_OK);
    if (info.unified_memory) assert_ptr_equal(e->dl_tensor.data, host); /* no copy either way */
    assert_memory_equal(e->dl_tensor.data, host, 64 * sizeof(float));
    u = tb_mul_scalar(t, 2.0);
    y = tb_add_scalar(u, 1.0);
    assert_non_null(y);
    assert_int_equal(tb_tensor_to_host(y, out, sizeof out), TB_OK);
    for (i = 0; i < 64; i++)
        assert_true(out[i] == host[i] * 2.0f + 1.0f);
    tb_tensor_release(y);
    tb_tensor_release(u);
    tb_tensor_release(t);
    assert_int_equal(deleter_calls, info.unified_memory ? 0 : 1); /* the export still holds it */
    e->deleter(e);
    tb_computation_cache_clear();
    assert_int_equal(deleter_calls, 1);
    /* off a 64-byte boundary: a copy */
    make_managed(&n, host + 1, dims + 1, 1, NULL);
    t = tb_dlpack_import(&n, &ocl);
    assert_non_null(t);
    assert_int_equal(deleter_calls, 2);
    assert_int_equal(tb_tensor_to_host(t, out, 16 * sizeof(float)), TB_OK);
    assert_memory_equal(out, host + 1, 16 * sizeof(float));
    tb_tensor_release(t);
    /* strided (a transpose of a 2x3 array): a copy */
    make_managed(&q, host, tdims, 2, strides);
    t = tb_dlpack_import(&q, &ocl);
    assert_non_null(t);
    assert_int_equal(deleter_calls, 3);
    assert_int_equal(tb_tensor_to_host(t, out, 6 * sizeof(float)), TB_OK);
    for (i = 0; i < 3; ++i)
        for (j = 0; j < 2; ++j)
            assert_true(out[i * 2 + j] == host[j * 3 + i]);
    tb_tensor_release(t);
    assert_int_equal(deleter_calls, 3);
    free(host);
}

/* The producer's array is given back only once the device's queue is done with it: kernels
   still queued when the imported tensor goes read the array, not what its deleter leaves
   there (NaN). */
static float *poisoned;
static size_t poisoned_count;

static void poisoning_deleter(tb_dl_managed_tensor *self) {
    size_t i;
    (void)self;
    for (i = 0; i < poisoned_count; i++)
        poisoned[i] = NAN;
    deleter_calls++;
}

static void test_import_given_back_after_the_queue(void **state) {
    (void)state;
    if (ocl.backend[0] == '\0') skip();
    const int64_t rows = 64, cols = 1 << 18; /* 64 MiB: some milliseconds of kernels */
    int64_t dims[2] = {rows, cols};
    int32_t axis = 1;
    tb_dl_managed_tensor m;
    tb_tensor *t, *a, *b, *y;
    float sums[64];
    size_t i;
    poisoned_count = (size_t)(rows * cols);
    poisoned = (float *)aligned_alloc(64, poisoned_count * sizeof(float));
    assert_non_null(poisoned);
    for (i = 0; i < poisoned_count; i++)
        poisoned[i] = (float)(i % 7) * 0.25f;
    deleter_calls = 0;
    make_managed(&m, poisoned, dims, 2, NULL);
    m.deleter = poisoning_deleter;
    t = tb_dlpack_import(&m, &ocl);
    assert_non_null(t);
    a = tb_exp(t);
    b = tb_mul(a, t);
    y = tb_sum(b, &axis, 1, false);
    assert_non_null(y);
    assert_int_equal(tb_sync(&y, 1), TB_OK); /* queued; the kernels may still run */
    tb_tensor_release(b);
    tb_tensor_release(a);
    tb_tensor_release(t); /* where borrowed: given back here, after the queue */
    tb_computation_cache_clear();
    assert_int_equal(deleter_calls, 1);
    assert_int_equal(tb_tensor_to_host(y, sums, sizeof sums), TB_OK);
    for (i = 0; i < (size_t)rows; i++) {
        /* row i: cols values (i * cols + j) % 7 * 0.25, each residue cols / 7 times or once more */
        double want = 0;
        int r;
        for (r = 0; r < 7; r++) {
            size_t first = (size_t)((7 - (int)((i * (size_t)cols) % 7) + r) % 7);
            size_t count = first < (size_t)cols ? ((size_t)cols - 1 - first) / 7 + 1 : 0;
            want += (double)count * exp(r * 0.25) * (r * 0.25);
        }
        assert_true(isfinite(sums[i]));
        assert_true(fabs(sums[i] - want) <= 1e-4 * want);
    }
    tb_tensor_release(y);
    free(poisoned);
    poisoned = NULL;
}

static void test_round_trip_cpu_to_opencl(void **state) {
    (void)state;
    if (ocl.backend[0] == '\0') skip();
    /* A cpu tensor's export imported onto opencl: copied, our export's deleter runs at once
       and the cpu tensor's buffer is free to go. */
    int32_t host[4] = {7, -8, 9, -10}, out[4];
    int64_t dims[1] = {4};
    tb_shape s;
    tb_device cpu;
    tb_tensor *a, *b;
    tb_dl_managed_tensor *m = NULL;
    assert_int_equal(tb_device_make("cpu", 0, &cpu), TB_OK);
    assert_int_equal(tb_shape_make(&s, TB_I32, 1, dims), TB_OK);
    a = tb_tensor_from_host(host, &s, &cpu);
    assert_int_equal(tb_dlpack_export(a, &m), TB_OK);
    tb_tensor_release(a);
    b = tb_dlpack_import(m, &ocl);
    assert_non_null(b);
    assert_int_equal(tb_tensor_to_host(b, out, sizeof out), TB_OK);
    assert_memory_equal(out, host, sizeof out);
    tb_tensor_release(b);
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
    tb_shutdown();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_to_host),
        cmocka_unit_test(test_import_borrows_or_copies),
        cmocka_unit_test(test_import_given_back_after_the_queue),
        cmocka_unit_test(test_round_trip_cpu_to_opencl),
    };
    return cmocka_run_group_tests_name("dlpack_opencl", tests, setup, teardown);
}
