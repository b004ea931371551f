/* DLPack export and import: the struct layout, zero-copy lending and borrowing on the cpu
   backend and the native one (whose shared buffers never take a new value in place), copies
   where needed, deleters run exactly once, every error path, and numpy through
   tests/dlpack_numpy.py. The OpenCL cases are in tests/test_dlpack_opencl.c. */
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
#include <sys/wait.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

static tb_device cpu;

/* ---- a producer for the import tests: a managed tensor over a caller's array ---- */

typedef struct producer {
    tb_dl_managed_tensor managed;
    tb_dl_managed_tensor_versioned versioned;
    int64_t shape[TB_MAX_RANK + 2];
    int64_t strides[TB_MAX_RANK + 2];
    int deleter_calls;
} producer;

static void producer_deleter(tb_dl_managed_tensor *self) {
    ((producer *)self->manager_ctx)->deleter_calls++;
}

static void producer_deleter_versioned(tb_dl_managed_tensor_versioned *self) {
    ((producer *)self->manager_ctx)->deleter_calls++;
}

/* A producer of `data` (C-contiguous unless strides are given). */
static void producer_init(producer *p, void *data, uint8_t code, uint8_t bits, int32_t ndim,
                          const int64_t *shape, const int64_t *strides) {
    memset(p, 0, sizeof *p);
    if (ndim > 0) memcpy(p->shape, shape, sizeof(int64_t) * (size_t)ndim);
    if (strides != NULL) memcpy(p->strides, strides, sizeof(int64_t) * (size_t)ndim);
    p->managed.dl_tensor.data = data;
    p->managed.dl_tensor.device.device_type = TB_DL_CPU;
    p->managed.dl_tensor.device.device_id = 0;
    p->managed.dl_tensor.ndim = ndim;
    p->managed.dl_tensor.dtype.code = code;
    p->managed.dl_tensor.dtype.bits = bits;
    p->managed.dl_tensor.dtype.lanes = 1;
    p->managed.dl_tensor.shape = p->shape;
    p->managed.dl_tensor.strides = strides != NULL ? p->strides : NULL;
    p->managed.dl_tensor.byte_offset = 0;
    p->managed.manager_ctx = p;
    p->managed.deleter = producer_deleter;
    p->versioned.version.major = 1;
    p->versioned.version.minor = 0;
    p->versioned.manager_ctx = p;
    p->versioned.deleter = producer_deleter_versioned;
    p->versioned.dl_tensor = p->managed.dl_tensor;
}

static tb_shape shape2(tb_dtype dtype, int64_t d0, int64_t d1) {
    int64_t dims[2];
    tb_shape s;
    dims[0] = d0;
    dims[1] = d1;
    assert_int_equal(tb_shape_make(&s, dtype, 2, dims), TB_OK);
    return s;
}

/* The address an export of the tensor lends (its cpu buffer). */
static void *buffer_of(tb_tensor *t) {
    tb_dl_managed_tensor *m = NULL;
    void *address;
    assert_int_equal(tb_dlpack_export(t, &m), TB_OK);
    address = m->dl_tensor.data;
    m->deleter(m);
    return address;
}

static void expect_error(const char *fragment) {
    if (strstr(tb_last_error(), fragment) == NULL)
        fail_msg("error '%s' lacks '%s'", tb_last_error(), fragment);
}

/* ---- layout ---- */

static void test_layout_matches_dlpack(void **state) {
    (void)state;
    /* DLPack's enum values and field offsets, as its header defines them. */
    assert_int_equal(TB_DL_CPU, 1);
    assert_int_equal(TB_DL_CUDA, 2);
    assert_int_equal(TB_DL_OPENCL, 4);
    assert_int_equal(TB_DL_HEXAGON, 16);
    assert_int_equal(TB_DL_INT, 0);
    assert_int_equal(TB_DL_UINT, 1);
    assert_int_equal(TB_DL_FLOAT, 2);
    assert_int_equal(TB_DL_COMPLEX, 5);
    assert_int_equal(TB_DL_BOOL, 6);
    assert_int_equal(sizeof(tb_dl_device), 8);
    assert_int_equal(sizeof(tb_dl_data_type), 4);
    assert_int_equal(offsetof(tb_dl_data_type, lanes), 2);
    assert_int_equal(offsetof(tb_dl_tensor, device), sizeof(void *));
    assert_int_equal(offsetof(tb_dl_tensor, ndim), sizeof(void *) + 8);
    assert_int_equal(offsetof(tb_dl_tensor, dtype), sizeof(void *) + 12);
    if (sizeof(void *) == 8) {
        assert_int_equal(offsetof(tb_dl_tensor, shape), 24);
        assert_int_equal(offsetof(tb_dl_tensor, strides), 32);
        assert_int_equal(offsetof(tb_dl_tensor, byte_offset), 40);
        assert_int_equal(sizeof(tb_dl_tensor), 48);
        assert_int_equal(offsetof(tb_dl_managed_tensor, manager_ctx), 48);
        assert_int_equal(offsetof(tb_dl_managed_tensor, deleter), 56);
        assert_int_equal(offsetof(tb_dl_managed_tensor_versioned, manager_ctx), 8);
        assert_int_equal(offsetof(tb_dl_managed_tensor_versioned, deleter), 16);
        assert_int_equal(offsetof(tb_dl_managed_tensor_versioned, flags), 24);
        assert_int_equal(offsetof(tb_dl_managed_tensor_versioned, dl_tensor), 32);
    }
    assert_int_equal(TB_DLPACK_FLAG_READ_ONLY, 1);
    assert_int_equal(TB_DLPACK_FLAG_IS_COPIED, 2);
    assert_int_equal(TB_DLPACK_MAJOR_VERSION, 1);
}

/* ---- export ---- */

static void test_export_cpu_lends_the_buffer(void **state) {
    (void)state;
    float host[6] = {1.5f, -2.0f, 0.25f, 8.0f, -0.5f, 3.0f};
    tb_shape s = shape2(TB_F32, 2, 3);
    tb_tensor *t = tb_tensor_from_host_borrowed(host, &s, &cpu);
    tb_dl_managed_tensor *m = NULL;
    assert_non_null(t);
    assert_int_equal(tb_dlpack_export(t, &m), TB_OK);
    assert_non_null(m);
    assert_ptr_equal(m->dl_tensor.data, host);
    assert_int_equal(m->dl_tensor.byte_offset, 0);
    assert_int_equal(m->dl_tensor.device.device_type, TB_DL_CPU);
    assert_int_equal(m->dl_tensor.device.device_id, 0);
    assert_int_equal(m->dl_tensor.ndim, 2);
    assert_int_equal(m->dl_tensor.dtype.code, TB_DL_FLOAT);
    assert_int_equal(m->dl_tensor.dtype.bits, 32);
    assert_int_equal(m->dl_tensor.dtype.lanes, 1);
    assert_int_equal(m->dl_tensor.shape[0], 2);
    assert_int_equal(m->dl_tensor.shape[1], 3);
    assert_non_null(m->dl_tensor.strides);
    assert_int_equal(m->dl_tensor.strides[0], 3);
    assert_int_equal(m->dl_tensor.strides[1], 1);
    assert_non_null(m->deleter);
    tb_tensor_release(t); /* the export keeps the value alive */
    assert_true(((float *)m->dl_tensor.data)[3] == 8.0f);
    m->deleter(m);
}

static void test_export_computed_values_outlive_the_tensor(void **state) {
    (void)state;
    float host[6] = {1, 2, 3, 4, 5, 6};
    tb_shape s = shape2(TB_F32, 3, 2);
    tb_tensor *x = tb_tensor_from_host(host, &s, &cpu);
    tb_tensor *x2 = tb_mul_scalar(x, 2.0);
    tb_tensor *y = tb_add_scalar(x2, 1.0); /* pending until the export */
    tb_dl_managed_tensor *m = NULL;
    int i;
    assert_non_null(y);
    assert_non_null(tb_tensor_node(y));
    assert_int_equal(tb_dlpack_export(y, &m), TB_OK);
    assert_null(tb_tensor_node(y)); /* synced */
    tb_tensor_release(x);
    tb_tensor_release(x2);
    tb_tensor_release(y);
    for (i = 0; i < 6; ++i)
        assert_true(((const float *)m->dl_tensor.data)[i] == host[i] * 2.0f + 1.0f);
    assert_int_equal(m->dl_tensor.shape[0], 3);
    assert_int_equal(m->dl_tensor.strides[0], 2);
    m->deleter(m);
}

static void test_export_every_dtype_rank0_and_empty(void **state) {
    (void)state;
    static const struct {
        tb_dtype dtype;
        uint8_t code, bits;
    } table[] = {{TB_F32, TB_DL_FLOAT, 32}, {TB_F64, TB_DL_FLOAT, 64},  {TB_I32, TB_DL_INT, 32},
                 {TB_I64, TB_DL_INT, 64},   {TB_U8, TB_DL_UINT, 8},     {TB_BOOL, TB_DL_BOOL, 8},
                 {TB_F16, TB_DL_FLOAT, 16}, {TB_BF16, TB_DL_BFLOAT, 16}};
    size_t k;
    for (k = 0; k < sizeof table / sizeof table[0]; ++k) {
        unsigned char bytes[8 * 4];
        tb_shape s = shape2(table[k].dtype, 2, 2);
        tb_tensor *t = tb_ones(&s, &cpu);
        tb_dl_managed_tensor *m = NULL;
        assert_int_equal(tb_dlpack_export(t, &m), TB_OK);
        assert_int_equal(m->dl_tensor.dtype.code, table[k].code);
        assert_int_equal(m->dl_tensor.dtype.bits, table[k].bits);
        assert_int_equal(m->dl_tensor.dtype.lanes, 1);
        assert_int_equal(tb_tensor_to_host(t, bytes, 4 * tb_dtype_size(table[k].dtype)), TB_OK);
        assert_memory_equal(m->dl_tensor.data, bytes, 4 * tb_dtype_size(table[k].dtype));
        m->deleter(m);
        tb_tensor_release(t);
    }
    {
        tb_shape s;
        tb_tensor *t;
        tb_dl_managed_tensor *m = NULL;
        assert_int_equal(tb_shape_make(&s, TB_F64, 0, NULL), TB_OK);
        t = tb_full(&s, 2.5, &cpu);
        assert_int_equal(tb_dlpack_export(t, &m), TB_OK);
        assert_int_equal(m->dl_tensor.ndim, 0);
        assert_true(*(const double *)m->dl_tensor.data == 2.5);
        m->deleter(m);
        tb_tensor_release(t);
    }
    {
        tb_shape s = shape2(TB_I32, 0, 5);
        tb_tensor *t = tb_zeros(&s, &cpu);
        tb_dl_managed_tensor *m = NULL;
        assert_int_equal(tb_dlpack_export(t, &m), TB_OK);
        assert_int_equal(m->dl_tensor.shape[0], 0);
        assert_int_equal(m->dl_tensor.shape[1], 5);
        m->deleter(m);
        tb_tensor_release(t);
    }
}

static void test_export_versioned(void **state) {
    (void)state;
    int32_t host[4] = {4, 3, 2, 1};
    tb_shape s = shape2(TB_I32, 2, 2);
    tb_tensor *t = tb_tensor_from_host_borrowed(host, &s, &cpu);
    tb_dl_managed_tensor_versioned *m = NULL;
    assert_int_equal(tb_dlpack_export_versioned(t, &m), TB_OK);
    assert_int_equal(m->version.major, 1);
    assert_int_equal(m->version.minor, TB_DLPACK_MINOR_VERSION);
    assert_int_equal(m->flags, TB_DLPACK_FLAG_READ_ONLY);
    assert_ptr_equal(m->dl_tensor.data, host);
    assert_int_equal(m->dl_tensor.dtype.code, TB_DL_INT);
    tb_tensor_release(t);
    m->deleter(m);
}

static void test_export_errors(void **state) {
    (void)state;
    tb_dl_managed_tensor *m = NULL;
    tb_dl_managed_tensor_versioned *v = NULL;
    tb_shape s = shape2(TB_F32, 2, 3);
    tb_shape s4 = shape2(TB_F32, 4, 4);
    tb_tensor *t = tb_zeros(&s, &cpu);
    tb_tensor *u = tb_zeros(&s4, &cpu);
    tb_clear_error();
    assert_int_equal(tb_dlpack_export(NULL, &m), TB_ERR_INVALID_ARGUMENT);
    expect_error("tb_dlpack_export: tensor is NULL");
    assert_null(m);
    tb_clear_error();
    assert_int_equal(tb_dlpack_export(t, NULL), TB_ERR_INVALID_ARGUMENT);
    expect_error("tb_dlpack_export: out is NULL");
    tb_clear_error();
    assert_int_equal(tb_dlpack_export_versioned(NULL, &v), TB_ERR_INVALID_ARGUMENT);
    expect_error("tb_dlpack_export_versioned: tensor is NULL");
    assert_int_equal(tb_dlpack_export_versioned(t, NULL), TB_ERR_INVALID_ARGUMENT);
    expect_error("tb_dlpack_export_versioned: out is NULL");
    assert_null(v);
    /* A chain's first error stays. */
    tb_clear_error();
    assert_int_equal(tb_dlpack_export(tb_add(t, u), &m), TB_ERR_SHAPE);
    expect_error("tb_add");
    assert_null(m);
    tb_tensor_release(t);
    tb_tensor_release(u);
}

/* ---- import ---- */

static void test_import_contiguous_borrows(void **state) {
    (void)state;
    float host[6] = {0.5f, 1.5f, -2.5f, 3.5f, 4.5f, -5.5f};
    int64_t dims[2] = {2, 3};
    producer p;
    float out[6];
    tb_tensor *t, *y;
    int i;
    producer_init(&p, host, TB_DL_FLOAT, 32, 2, dims, NULL);
    t = tb_dlpack_import(&p.managed, &cpu);
    assert_non_null(t);
    assert_int_equal(p.deleter_calls, 0);
    {
        tb_shape got = tb_tensor_shape(t), want = shape2(TB_F32, 2, 3);
        assert_true(tb_shape_equal(&got, &want));
    }
    assert_ptr_equal(buffer_of(t), host); /* no copy */
    assert_int_equal(tb_tensor_to_host(t, out, sizeof out), TB_OK);
    assert_memory_equal(out, host, sizeof out);
    /* A pending op still reads the buffer: the deleter waits for it too. */
    y = tb_mul_scalar(t, 2.0);
    tb_tensor_release(t);
    assert_int_equal(p.deleter_calls, 0);
    assert_int_equal(tb_tensor_to_host(y, out, sizeof out), TB_OK);
    for (i = 0; i < 6; ++i)
        assert_true(out[i] == host[i] * 2.0f);
    tb_tensor_release(y);
    /* A cached computation may still hold its inputs; dropping the cache lets the buffer go. */
    assert_true(p.deleter_calls <= 1);
    tb_computation_cache_clear();
    assert_int_equal(p.deleter_calls, 1);
}

static void test_import_then_export_shares_one_buffer(void **state) {
    (void)state;
    int64_t host[4] = {1, -2, 3, 1LL << 40};
    int64_t dims[1] = {4};
    producer p;
    tb_dl_managed_tensor *m = NULL;
    tb_tensor *t;
    producer_init(&p, host, TB_DL_INT, 64, 1, dims, NULL);
    t = tb_dlpack_import(&p.managed, NULL); /* the current device: cpu */
    assert_non_null(t);
    assert_int_equal(tb_dlpack_export(t, &m), TB_OK);
    assert_ptr_equal(m->dl_tensor.data, host);
    tb_tensor_release(t);
    assert_int_equal(p.deleter_calls, 0); /* the export still lends it */
    assert_true(((const int64_t *)m->dl_tensor.data)[3] == (1LL << 40));
    m->deleter(m);
    assert_int_equal(p.deleter_calls, 1);
}

static void test_import_strided_copies(void **state) {
    (void)state;
    /* base is 3x4 row-major; the producer hands out its transpose (4x3, strides 1, 4). */
    int32_t base[12];
    int64_t dims[2] = {4, 3}, strides[2] = {1, 4};
    int32_t out[12];
    producer p;
    tb_tensor *t;
    int i, j;
    for (i = 0; i < 12; ++i)
        base[i] = i * 10 - 3;
    producer_init(&p, base, TB_DL_INT, 32, 2, dims, strides);
    t = tb_dlpack_import(&p.managed, &cpu);
    assert_non_null(t);
    assert_int_equal(p.deleter_calls, 1); /* copied: released at once */
    assert_ptr_not_equal(buffer_of(t), base);
    assert_int_equal(tb_tensor_to_host(t, out, sizeof out), TB_OK);
    for (i = 0; i < 4; ++i)
        for (j = 0; j < 3; ++j)
            assert_int_equal(out[i * 3 + j], base[j * 4 + i]);
    tb_tensor_release(t);
    assert_int_equal(p.deleter_calls, 1);
}

static void test_import_negative_strides_and_byte_offset(void **state) {
    (void)state;
    /* x[::-1, ::2] of a 3x4 f64 array: first element at x[2][0], strides (-4, 2). */
    double base[12];
    int64_t dims[2] = {3, 2}, strides[2] = {-4, 2};
    double out[6];
    producer p;
    tb_tensor *t;
    int i, j;
    for (i = 0; i < 12; ++i)
        base[i] = i * 0.25;
    producer_init(&p, base, TB_DL_FLOAT, 64, 2, dims, strides);
    p.managed.dl_tensor.byte_offset = 8 * sizeof(double);
    t = tb_dlpack_import(&p.managed, &cpu);
    assert_non_null(t);
    assert_int_equal(p.deleter_calls, 1);
    assert_int_equal(tb_tensor_to_host(t, out, sizeof out), TB_OK);
    for (i = 0; i < 3; ++i)
        for (j = 0; j < 2; ++j)
            assert_true(out[i * 2 + j] == base[(2 - i) * 4 + j * 2]);
    tb_tensor_release(t);
}

static void test_import_byte_offset_in_place(void **state) {
    (void)state;
    /* rows 1..2 of a 3x2 u8 array, contiguous, as an offset into the allocation */
    unsigned char base[6] = {9, 8, 7, 6, 5, 4};
    int64_t dims[2] = {2, 2}, strides[2] = {2, 1};
    unsigned char out[4];
    producer p;
    tb_tensor *t;
    producer_init(&p, base, TB_DL_UINT, 8, 2, dims, strides);
    p.managed.dl_tensor.byte_offset = 2;
    t = tb_dlpack_import(&p.managed, &cpu);
    assert_non_null(t);
    assert_int_equal(p.deleter_calls, 0);
    assert_ptr_equal(buffer_of(t), base + 2);
    assert_int_equal(tb_tensor_to_host(t, out, sizeof out), TB_OK);
    assert_memory_equal(out, base + 2, 4);
    tb_tensor_release(t);
    assert_int_equal(p.deleter_calls, 1);
}

static void test_import_size_one_dims_any_stride(void **state) {
    (void)state;
    /* PyTorch gives size-1 dims arbitrary strides; the array is still contiguous. */
    float host[3] = {1, 2, 3};
    int64_t dims[3] = {1, 3, 1}, strides[3] = {99, 1, 7};
    producer p;
    tb_tensor *t;
    producer_init(&p, host, TB_DL_FLOAT, 32, 3, dims, strides);
    t = tb_dlpack_import(&p.managed, &cpu);
    assert_non_null(t);
    assert_int_equal(p.deleter_calls, 0);
    assert_ptr_equal(buffer_of(t), host);
    tb_tensor_release(t);
    assert_int_equal(p.deleter_calls, 1);
}

static void test_import_misaligned_copies(void **state) {
    (void)state;
    /* f32 values starting one byte into a float-aligned allocation: copied, not read
       misaligned */
    float storage[4];
    float values[3] = {1.25f, -7.0f, 3.0f}, out[3];
    int64_t dims[1] = {3};
    producer p;
    tb_tensor *t;
    memcpy((unsigned char *)storage + 1, values, sizeof values);
    producer_init(&p, storage, TB_DL_FLOAT, 32, 1, dims, NULL);
    p.managed.dl_tensor.byte_offset = 1;
    t = tb_dlpack_import(&p.managed, &cpu);
    assert_non_null(t);
    assert_int_equal(p.deleter_calls, 1);
    assert_int_equal(tb_tensor_to_host(t, out, sizeof out), TB_OK);
    assert_memory_equal(out, values, sizeof out);
    tb_tensor_release(t);
}

static void test_import_bool(void **state) {
    (void)state;
    unsigned char clean[4] = {1, 0, 0, 1}, dirty[4] = {2, 0, 255, 1}, out[4];
    int64_t dims[1] = {4};
    producer p, q;
    tb_tensor *t, *u;
    producer_init(&p, clean, TB_DL_BOOL, 8, 1, dims, NULL);
    t = tb_dlpack_import(&p.managed, &cpu);
    assert_non_null(t);
    assert_int_equal(tb_tensor_shape(t).dtype, TB_BOOL);
    assert_int_equal(p.deleter_calls, 0);
    assert_ptr_equal(buffer_of(t), clean);
    /* bytes other than 0 and 1 are true: copied as 1 */
    producer_init(&q, dirty, TB_DL_BOOL, 8, 1, dims, NULL);
    u = tb_dlpack_import(&q.managed, &cpu);
    assert_non_null(u);
    assert_int_equal(q.deleter_calls, 1);
    assert_int_equal(tb_tensor_to_host(u, out, sizeof out), TB_OK);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 0);
    assert_int_equal(out[2], 1);
    assert_int_equal(out[3], 1);
    tb_tensor_release(t);
    tb_tensor_release(u);
    assert_int_equal(p.deleter_calls, 1);
}

static void test_import_rank0_empty_and_null_deleter(void **state) {
    (void)state;
    double value = -4.5, got = 0;
    int64_t dims[2] = {0, 3};
    producer p, q;
    tb_tensor *t, *u;
    producer_init(&p, &value, TB_DL_FLOAT, 64, 0, NULL, NULL);
    p.managed.dl_tensor.shape = NULL; /* allowed for ndim 0 */
    t = tb_dlpack_import(&p.managed, &cpu);
    assert_non_null(t);
    assert_int_equal(tb_tensor_item(t, &got), TB_OK);
    assert_true(got == -4.5);
    tb_tensor_release(t);
    assert_int_equal(p.deleter_calls, 1);
    /* empty, with a NULL data pointer as DLPack recommends */
    producer_init(&q, NULL, TB_DL_INT, 32, 2, dims, NULL);
    u = tb_dlpack_import(&q.managed, &cpu);
    assert_non_null(u);
    assert_int_equal(q.deleter_calls, 1);
    assert_int_equal(tb_tensor_shape(u).dims[0], 0);
    tb_tensor_release(u);
    /* no deleter at all: nothing to call */
    producer_init(&p, &value, TB_DL_FLOAT, 64, 0, NULL, NULL);
    p.managed.deleter = NULL;
    t = tb_dlpack_import(&p.managed, &cpu);
    assert_non_null(t);
    tb_tensor_release(t);
    assert_int_equal(p.deleter_calls, 0);
}

static void test_import_versioned(void **state) {
    (void)state;
    float host[2] = {3, 4};
    int64_t dims[1] = {2};
    producer p;
    tb_tensor *t;
    producer_init(&p, host, TB_DL_FLOAT, 32, 1, dims, NULL);
    p.versioned.flags = TB_DLPACK_FLAG_READ_ONLY;
    p.versioned.version.minor = 7; /* a later minor version reads the same */
    t = tb_dlpack_import_versioned(&p.versioned, &cpu);
    assert_non_null(t);
    assert_ptr_equal(buffer_of(t), host);
    assert_int_equal(p.deleter_calls, 0);
    tb_tensor_release(t);
    assert_int_equal(p.deleter_calls, 1);
    /* another major version: refused, the caller keeps it */
    p.versioned.version.major = 2;
    tb_clear_error();
    assert_null(tb_dlpack_import_versioned(&p.versioned, &cpu));
    assert_int_equal(tb_last_status(), TB_ERR_UNSUPPORTED);
    expect_error("tb_dlpack_import_versioned: DLPack major version 2");
    assert_int_equal(p.deleter_calls, 1);
    tb_clear_error();
    assert_null(tb_dlpack_import_versioned(NULL, &cpu));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    expect_error("tb_dlpack_import_versioned: managed is NULL");
}

static void test_import_round_trip_of_our_export(void **state) {
    (void)state;
    /* Our export consumed by our import: one buffer, each deleter once, no leak. */
    float host[4] = {1, 2, 3, 4};
    tb_shape s = shape2(TB_F32, 2, 2);
    tb_tensor *a = tb_tensor_from_host(host, &s, &cpu);
    tb_tensor *b;
    tb_dl_managed_tensor *m = NULL;
    void *buffer;
    float out[4];
    assert_int_equal(tb_dlpack_export(a, &m), TB_OK);
    buffer = m->dl_tensor.data;
    b = tb_dlpack_import(m, &cpu);
    assert_non_null(b);
    tb_tensor_release(a);
    assert_ptr_equal(buffer_of(b), buffer);
    assert_int_equal(tb_tensor_to_host(b, out, sizeof out), TB_OK);
    assert_memory_equal(out, host, sizeof out);
    tb_tensor_release(b); /* runs our export's deleter, which frees the last reference */
}

/* Each case: NULL returned, the status, a message naming the function and the value, and the
   deleter never called. */
static void expect_import_error(producer *p, tb_status status, const char *fragment) {
    tb_clear_error();
    assert_null(tb_dlpack_import(&p->managed, &cpu));
    assert_int_equal(tb_last_status(), status);
    expect_error("tb_dlpack_import: ");
    expect_error(fragment);
    assert_int_equal(p->deleter_calls, 0);
}

static void test_import_errors(void **state) {
    (void)state;
    float host[4] = {0};
    int64_t dims[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    int64_t huge[2] = {INT64_MAX / 2, 3};
    int64_t wild[2] = {INT64_MAX / 2, 1};
    int64_t two[2] = {2, 2};
    producer p;
    tb_device bogus;

    tb_clear_error();
    assert_null(tb_dlpack_import(NULL, &cpu));
    assert_int_equal(tb_last_status(), TB_ERR_INVALID_ARGUMENT);
    expect_error("tb_dlpack_import: managed is NULL");

    producer_init(&p, host, TB_DL_FLOAT, 32, 2, two, NULL);
    p.managed.dl_tensor.device.device_type = TB_DL_CUDA;
    expect_import_error(&p, TB_ERR_UNSUPPORTED, "device type 2 (CUDA) is not supported");
    p.managed.dl_tensor.device.device_type = TB_DL_OPENCL;
    expect_import_error(&p, TB_ERR_UNSUPPORTED, "device type 4 (OpenCL)");
    p.managed.dl_tensor.device.device_type = 99;
    expect_import_error(&p, TB_ERR_UNSUPPORTED, "device type 99 (unknown)");

    producer_init(&p, host, TB_DL_FLOAT, 32, 2, two, NULL);
    p.managed.dl_tensor.dtype.lanes = 4;
    expect_import_error(&p, TB_ERR_DTYPE, "4 lanes");
    producer_init(&p, host, TB_DL_FLOAT, 8, 2, two, NULL);
    expect_import_error(&p, TB_ERR_DTYPE, "dtype code 2 (float) with 8 bits is not supported");
    producer_init(&p, host, TB_DL_COMPLEX, 64, 2, two, NULL);
    expect_import_error(&p, TB_ERR_DTYPE, "dtype code 5 (complex)");
    producer_init(&p, host, TB_DL_UINT, 32, 2, two, NULL);
    expect_import_error(&p, TB_ERR_DTYPE, "dtype code 1 (uint) with 32 bits");
    producer_init(&p, host, TB_DL_BFLOAT, 32, 2, two, NULL);
    expect_import_error(&p, TB_ERR_DTYPE, "(bfloat)");
    producer_init(&p, host, TB_DL_BOOL, 1, 2, two, NULL);
    expect_import_error(&p, TB_ERR_DTYPE, "(bool) with 1 bits");

    producer_init(&p, host, TB_DL_FLOAT, 32, 9, dims, NULL);
    expect_import_error(&p, TB_ERR_SHAPE, "ndim 9 is outside 0..8");
    producer_init(&p, host, TB_DL_FLOAT, 32, 2, two, NULL);
    p.managed.dl_tensor.ndim = -1;
    expect_import_error(&p, TB_ERR_SHAPE, "ndim -1");
    producer_init(&p, host, TB_DL_FLOAT, 32, 2, two, NULL);
    p.shape[1] = -3;
    expect_import_error(&p, TB_ERR_SHAPE, "dimension 1 is -3");
    producer_init(&p, host, TB_DL_FLOAT, 32, 2, two, NULL);
    p.managed.dl_tensor.shape = NULL;
    expect_import_error(&p, TB_ERR_INVALID_ARGUMENT, "shape is NULL for ndim 2");
    producer_init(&p, NULL, TB_DL_FLOAT, 32, 2, two, NULL);
    expect_import_error(&p, TB_ERR_INVALID_ARGUMENT, "data is NULL for f32[2,2]");
    producer_init(&p, host, TB_DL_FLOAT, 32, 2, huge, NULL);
    expect_import_error(&p, TB_ERR_OVERFLOW, "overflows");
    producer_init(&p, host, TB_DL_FLOAT, 32, 2, two, wild);
    expect_import_error(&p, TB_ERR_OVERFLOW, "stride 4611686018427387903 of dimension 0");

    /* an unknown device: the import fails, the deleter is not called */
    producer_init(&p, host, TB_DL_FLOAT, 32, 2, two, NULL);
    memset(&bogus, 0, sizeof bogus);
    strcpy(bogus.backend, "nosuchbackend");
    tb_clear_error();
    assert_null(tb_dlpack_import(&p.managed, &bogus));
    assert_int_not_equal(tb_last_status(), TB_OK);
    expect_error("nosuchbackend");
    assert_int_equal(p.deleter_calls, 0);
    /* the same strided import onto the bogus device: the copy fails, no deleter either */
    producer_init(&p, host, TB_DL_FLOAT, 32, 2, two, two);
    p.strides[1] = 2;
    p.strides[0] = 1;
    tb_clear_error();
    assert_null(tb_dlpack_import(&p.managed, &bogus));
    assert_int_equal(p.deleter_calls, 0);
}

/* ---- numpy ---- */

static const char *python(void) {
    return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

static void test_numpy_through_ctypes(void **state) {
    (void)state;
    char dir[] = "/tmp/tb_dlpack_XXXXXX";
    char cmd[2048];
    const char *cc = getenv("CC") != NULL && getenv("CC")[0] != '\0' ? getenv("CC") : "cc";
    int rc;
    snprintf(cmd, sizeof cmd, "%s -c 'import numpy' >/dev/null 2>&1", python());
    if (system(cmd) != 0) {
        printf("numpy is not installed: skipping the numpy exchange\n");
        skip();
    }
    if (access("tests/dlpack_shim.c", R_OK) != 0 || access("tests/dlpack_numpy.py", R_OK) != 0) {
        printf("tests/dlpack_shim.c not found (run from the repository root): skipping\n");
        skip();
    }
    assert_non_null(mkdtemp(dir));
    /* The shim is a plain shared object (no sanitizers): it loads into Python. */
    snprintf(cmd, sizeof cmd,
             "%s -std=c11 -g -O1 -shared -fPIC -I. tests/dlpack_shim.c "
             "-o %s/libtb_dlpack_shim.so -ldl -lpthread -lm",
             cc, dir);
    rc = system(cmd);
    if (rc != 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        (void)system(cmd);
        fail_msg("building the shim failed (exit status %d)", rc);
    }
    snprintf(cmd, sizeof cmd, "%s -u tests/dlpack_numpy.py %s/libtb_dlpack_shim.so", python(), dir);
    fflush(stdout);
    rc = system(cmd);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    (void)system(cmd);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) {
        printf("the script found no numpy: skipping\n");
        skip();
    }
    assert_int_equal(rc, 0);
}

/* ---- the native backend: host memory, borrowed and lent in place ---- */

/* The native device, or a skip where this machine has no C compiler for it. */
static tb_device native_or_skip(void) {
    tb_device dev;
    if (tb_device_make("native", 0, &dev) != TB_OK) {
        printf("no native:0 here (%s): skipping\n", tb_last_error());
        tb_clear_error();
        skip();
    }
    return dev;
}

/* An aligned array is borrowed in place and lent back by an export; a computed value is lent
   from the backend's own buffer; the deleter runs once, when the library lets go. An array that
   is not 64-byte aligned is copied (its deleter runs at once). */
static void test_native_borrows_and_lends(void **state) {
    tb_device dev = native_or_skip();
    float *host = (float *)aligned_alloc(64, 64 * sizeof(float)), out[64];
    int64_t dims[2] = {4, 16};
    producer p, q;
    tb_dl_managed_tensor *m = NULL;
    tb_tensor *t, *y, *u;
    int i;
    (void)state;
    assert_non_null(host);
    for (i = 0; i < 64; i++)
        host[i] = (float)i * 0.5f - 3.0f;
    producer_init(&p, host, TB_DL_FLOAT, 32, 2, dims, NULL);
    t = tb_dlpack_import(&p.managed, &dev);
    assert_non_null(t);
    assert_ptr_equal(buffer_of(t), host); /* no copy */
    u = tb_mul_scalar(t, 2.0);
    y = tb_add_scalar(u, 1.0);
    tb_tensor_release(u);
    assert_non_null(y);
    assert_int_equal(tb_dlpack_export(y, &m), TB_OK);
    assert_true(m->dl_tensor.data != host);
    for (i = 0; i < 64; i++)
        assert_true(((const float *)m->dl_tensor.data)[i] == host[i] * 2.0f + 1.0f);
    tb_tensor_release(y); /* the export keeps its buffer */
    assert_true(((const float *)m->dl_tensor.data)[5] == host[5] * 2.0f + 1.0f);
    m->deleter(m);
    tb_tensor_release(t);
    tb_computation_cache_clear();
    assert_int_equal(p.deleter_calls, 1);
    /* not aligned to 64 bytes: a copy */
    producer_init(&q, host + 1, TB_DL_FLOAT, 32, 1, dims + 1, NULL);
    u = tb_dlpack_import(&q.managed, &dev);
    assert_non_null(u);
    assert_int_equal(q.deleter_calls, 1);
    assert_true(buffer_of(u) != (void *)(host + 1));
    assert_int_equal(tb_tensor_to_host(u, out, 16 * sizeof(float)), TB_OK);
    assert_memory_equal(out, host + 1, 16 * sizeof(float));
    tb_tensor_release(u);
    free(host);
}

/* A tensor over a borrowed array, or one whose buffer an export lends, takes a new value by
   tb_assign: the new value goes to a buffer of its own, never into the shared memory. */
static void test_native_shared_buffers_are_never_donated(void **state) {
    tb_device dev = native_or_skip();
    float *host = (float *)aligned_alloc(64, 1024 * sizeof(float)), *out;
    tb_shape s = shape2(TB_F32, 32, 32);
    tb_dl_managed_tensor *m = NULL;
    tb_tensor *t, *v, *w;
    int i, round;
    (void)state;
    out = (float *)malloc(1024 * sizeof(float));
    assert_non_null(host);
    assert_non_null(out);
    for (i = 0; i < 1024; i++)
        host[i] = (float)(i % 17);
    t = tb_tensor_from_host_borrowed(host, &s, &dev);
    assert_non_null(t);
    assert_ptr_equal(buffer_of(t), host);
    w = tb_tensor_from_host(host, &s, &dev);
    assert_non_null(w);
    assert_int_equal(tb_dlpack_export(w, &m), TB_OK); /* lends w's buffer */
    for (round = 0; round < 3; round++) {
        tb_tensor *const both[2] = {t, w};
        v = tb_add_scalar(t, 1.0);
        assert_int_equal(tb_assign(t, v), TB_OK);
        tb_tensor_release(v);
        v = tb_mul_scalar(w, 3.0);
        assert_int_equal(tb_assign(w, v), TB_OK);
        tb_tensor_release(v);
        assert_int_equal(tb_sync(both, 2), TB_OK);
    }
    for (i = 0; i < 1024; i++) {
        assert_true(host[i] == (float)(i % 17));
        assert_true(((const float *)m->dl_tensor.data)[i] == (float)(i % 17));
    }
    assert_int_equal(tb_tensor_to_host(t, out, 1024 * sizeof(float)), TB_OK);
    for (i = 0; i < 1024; i++)
        assert_true(out[i] == (float)(i % 17) + 3.0f);
    assert_int_equal(tb_tensor_to_host(w, out, 1024 * sizeof(float)), TB_OK);
    for (i = 0; i < 1024; i++)
        assert_true(out[i] == (float)(i % 17) * 27.0f);
    m->deleter(m);
    tb_tensor_release(w);
    tb_tensor_release(t);
    tb_computation_cache_clear();
    free(out);
    free(host);
}

static int setup(void **state) {
    (void)state;
    return tb_device_make("cpu", 0, &cpu) == TB_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tb_shutdown();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_matches_dlpack),
        cmocka_unit_test(test_export_cpu_lends_the_buffer),
        cmocka_unit_test(test_export_computed_values_outlive_the_tensor),
        cmocka_unit_test(test_export_every_dtype_rank0_and_empty),
        cmocka_unit_test(test_export_versioned),
        cmocka_unit_test(test_export_errors),
        cmocka_unit_test(test_import_contiguous_borrows),
        cmocka_unit_test(test_import_then_export_shares_one_buffer),
        cmocka_unit_test(test_import_strided_copies),
        cmocka_unit_test(test_import_negative_strides_and_byte_offset),
        cmocka_unit_test(test_import_byte_offset_in_place),
        cmocka_unit_test(test_import_size_one_dims_any_stride),
        cmocka_unit_test(test_import_misaligned_copies),
        cmocka_unit_test(test_import_bool),
        cmocka_unit_test(test_import_rank0_empty_and_null_deleter),
        cmocka_unit_test(test_import_versioned),
        cmocka_unit_test(test_import_round_trip_of_our_export),
        cmocka_unit_test(test_import_errors),
        cmocka_unit_test(test_native_borrows_and_lends),
        cmocka_unit_test(test_native_shared_buffers_are_never_donated),
        cmocka_unit_test(test_numpy_through_ctypes),
    };
    return cmocka_run_group_tests_name("dlpack", tests, setup, teardown);
}
