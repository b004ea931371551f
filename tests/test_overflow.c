/* Sizes that overflow: the checked arithmetic helpers against exact 128-bit results, the size
   rule of shapes (empty shapes included), view ops given huge dims or steps, DLPack imports
   whose strides or byte_offset reach beyond int64, and .npy files whose header claims more
   than the file holds (the claim is checked before anything of its size is allocated). */
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
#include <sys/stat.h>
#include <sys/wait.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

static int setup(void **state) {
    (void)state;
    tb_clear_error();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tb_shutdown();
    return 0;
}

static void expect_status(tb_status status, const char *fragment) {
    if (tb_last_status() != status) {
        fail_msg("expected %s, got %s: %s", tb_status_string(status),
                 tb_status_string(tb_last_status()), tb_last_error());
    }
    if (fragment != NULL && strstr(tb_last_error(), fragment) == NULL)
        fail_msg("error '%s' lacks '%s'", tb_last_error(), fragment);
    tb_clear_error();
}

static tb_shape make_shape(tb_dtype dtype, int32_t rank, const int64_t *dims) {
    tb_shape s;
    memset(&s, 0, sizeof s);
    if (tb_shape_make(&s, dtype, rank, dims) != TB_OK) fail_msg("shape: %s", tb_last_error());
    return s;
}

/* ---- the helpers ---- */

__extension__ typedef __int128 wide;

static const int64_t edges[] = {0,
                                1,
                                -1,
                                2,
                                -2,
                                3,
                                7,
                                INT64_C(1) << 31,
                                -(INT64_C(1) << 31),
                                INT64_C(3037000499),
                                INT64_C(3037000500),
                                INT64_C(1) << 32,
                                INT64_C(1) << 62,
                                -(INT64_C(1) << 62),
                                INT64_MAX / 2,
                                INT64_MAX / 3,
                                INT64_MIN / 2,
                                INT64_MAX - 1,
                                INT64_MAX,
                                INT64_MIN + 1,
                                INT64_MIN};
#define NUM_EDGES (sizeof edges / sizeof edges[0])

static void check_i64(const char *what, bool ok, int64_t got, wide exact) {
    bool fits = exact >= (wide)INT64_MIN && exact <= (wide)INT64_MAX;
    if (ok != fits) fail_msg("%s: reported %s", what, ok ? "fits" : "overflow");
    if (ok && (wide)got != exact) fail_msg("%s: wrong value %lld", what, (long long)got);
    if (!ok && got != 12345) fail_msg("%s: *out changed on overflow", what);
}

static void test_checked_helpers(void **state) {
    size_t i, j;
    (void)state;
    for (i = 0; i < NUM_EDGES; i++) {
        for (j = 0; j < NUM_EDGES; j++) {
            int64_t a = edges[i], b = edges[j], r;
            bool ok;
            char what[96];
            snprintf(what, sizeof what, "%lld op %lld", (long long)a, (long long)b);
            r = 12345;
            ok = tb__add_i64(a, b, &r);
            check_i64(what, ok, r, (wide)a + b);
            r = 12345;
            ok = tb__add_i64_portable(a, b, &r);
            check_i64(what, ok, r, (wide)a + b);
            r = 12345;
            ok = tb__sub_i64(a, b, &r);
            check_i64(what, ok, r, (wide)a - b);
            r = 12345;
            ok = tb__sub_i64_portable(a, b, &r);
            check_i64(what, ok, r, (wide)a - b);
            r = 12345;
            ok = tb__mul_i64(a, b, &r);
            check_i64(what, ok, r, (wide)a * b);
            r = 12345;
            ok = tb__mul_i64_portable(a, b, &r);
            check_i64(what, ok, r, (wide)a * b);
        }
    }
    {
        size_t s = 7;
        assert_true(tb__mul_size(SIZE_MAX / 2, 2, &s) && s == SIZE_MAX - 1);
        assert_false(tb__mul_size(SIZE_MAX / 2 + 1, 2, &s));
        assert_false(tb__mul_size_portable(SIZE_MAX / 2 + 1, 2, &s));
        assert_true(tb__mul_size_portable(0, SIZE_MAX, &s) && s == 0);
        assert_false(tb__add_size(SIZE_MAX, 1, &s));
        assert_false(tb__add_size_portable(SIZE_MAX, 1, &s));
        assert_true(tb__add_size_portable(SIZE_MAX - 1, 1, &s) && s == SIZE_MAX);
        assert_false(tb__i64_to_size(-1, &s));
        assert_true(tb__i64_to_size(INT64_MAX, &s) && s == (size_t)INT64_MAX);
    }
}

/* ---- the size rule of shapes ---- */

static void test_shape_size_rule_covers_empty_shapes(void **state) {
    tb_shape s, marker;
    int64_t strides[TB_MAX_RANK];
    (void)state;
    memset(&marker, 0x5a, sizeof marker);
    s = marker;
    {
        /* the product overflows before it reaches the 0: rejected, as PyTorch does */
        const int64_t dims[3] = {3, INT64_MAX, 0};
        assert_int_equal(tb_shape_make(&s, TB_F32, 3, dims), TB_ERR_OVERFLOW);
        assert_non_null(strstr(tb_last_error(), "f32[3,9223372036854775807,0] is empty"));
        assert_memory_equal(&s, &marker, sizeof s);
    }
    {
        /* the same dims in another order: rejected too (PyTorch accepts this one) */
        const int64_t dims[3] = {0, 3, INT64_MAX};
        assert_int_equal(tb_shape_make(&s, TB_U8, 3, dims), TB_ERR_OVERFLOW);
        assert_memory_equal(&s, &marker, sizeof s);
    }
    {
        /* the byte size counts: 2^62 f32 elements are 2^64 bytes */
        const int64_t dims[2] = {INT64_C(1) << 62, 0};
        assert_int_equal(tb_shape_make(&s, TB_F32, 2, dims), TB_ERR_OVERFLOW);
        s = make_shape(TB_U8, 2, dims);
    }
    {
        /* within the limit an empty shape is fine, and its strides fit */
        const int64_t dims[3] = {0, INT64_C(1) << 31, INT64_C(1) << 31};
        int64_t n = -1;
        s = make_shape(TB_U8, 3, dims);
        assert_int_equal(tb_shape_numel(&s, &n), TB_OK);
        assert_true(n == 0);
        assert_int_equal(tb_shape_strides(&s, strides), TB_OK);
        assert_true(strides[0] == INT64_C(1) << 62 && strides[1] == INT64_C(1) << 31 &&
                    strides[2] == 1);
    }
    assert_int_equal(tb_shape_parse("f32[3,9223372036854775807,0]", &s), TB_ERR_OVERFLOW);
    assert_int_equal(tb_shape_parse("u8[0,9223372036854775807]", &s), TB_OK);
    assert_int_equal(tb_shape_parse("i32[0,9223372036854775807]", &s), TB_ERR_OVERFLOW);
    tb_clear_error();
}

/* ---- view ops ---- */

static tb_tensor *zeros_of(tb_dtype dtype, int32_t rank, const int64_t *dims) {
    tb_shape s = make_shape(dtype, rank, dims);
    tb_tensor *t = tb_zeros(&s, NULL);
    assert_non_null(t);
    return t;
}

static void test_expand_of_empty_to_overflowing_dims(void **state) {
    const int64_t one_zero[2] = {1, 0};
    tb_tensor *x, *y;
    (void)state;
    x = zeros_of(TB_F32, 2, one_zero);
    {
        const int64_t to[3] = {3, INT64_MAX, 0};
        tb_clear_error();
        assert_null(tb_expand(x, to, 3));
        expect_status(TB_ERR_OVERFLOW, "tb_expand: ");
    }
    {
        const int64_t to[3] = {0, INT64_MAX, 0};
        assert_null(tb_expand(x, to, 3));
        expect_status(TB_ERR_OVERFLOW, "tb_expand: ");
    }
    {
        /* a degenerate expand within the limit works and syncs */
        const int64_t to[3] = {INT64_C(1) << 20, 1 << 20, 0};
        float none[1];
        y = tb_expand(x, to, 3);
        assert_non_null(y);
        assert_int_equal(tb_tensor_to_host(y, none, 0), TB_OK);
        tb_tensor_release(y);
    }
    {
        /* reshape and full go through the same rule */
        const int64_t to[3] = {0, INT64_MAX, 2};
        assert_null(tb_reshape(x, to, 3));
        expect_status(TB_ERR_OVERFLOW, "tb_reshape: ");
    }
    tb_tensor_release(x);
}

/* A realised [10, 4] f32 tensor holding 0..39. */
static tb_tensor *grid(void) {
    float v[40];
    const int64_t dims[2] = {10, 4};
    tb_shape s = make_shape(TB_F32, 2, dims);
    tb_tensor *t;
    int i;
    for (i = 0; i < 40; i++)
        v[i] = (float)i;
    t = tb_tensor_from_host(v, &s, NULL);
    assert_non_null(t);
    return t;
}

static void expect_values(tb_tensor *t, const char *shape_text, const float *want, size_t n) {
    float got[40];
    char text[96];
    tb_shape s;
    size_t i;
    assert_non_null(t);
    s = tb_tensor_shape(t);
    tb_shape_format(&s, text, sizeof text);
    assert_string_equal(text, shape_text);
    assert_int_equal(tb_tensor_to_host(t, got, n * sizeof(float)), TB_OK);
    for (i = 0; i < n; i++) {
        if (got[i] != want[i]) fail_msg("%s: element %zu is %g, want %g", text, i, got[i], want[i]);
    }
    tb_tensor_release(t);
}

static void test_slice_with_huge_steps(void **state) {
    const int64_t huge = INT64_C(1) << 62;
    tb_tensor *x;
    (void)state;
    x = grid();
    {
        const float want[4] = {0, 1, 2, 3};
        expect_values(tb_slice(x, 0, 0, 10, huge), "f32[1,4]", want, 4);
    }
    {
        const float want[4] = {12, 13, 14, 15};
        expect_values(tb_slice(x, 0, 3, INT64_MAX, INT64_MAX), "f32[1,4]", want, 4);
    }
    {
        const float want[10] = {2, 6, 10, 14, 18, 22, 26, 30, 34, 38};
        expect_values(tb_slice(x, 1, 2, 4, huge), "f32[10,1]", want, 10);
    }
    {
        /* a slice of a slice, then an elementwise op that iterates over the view */
        tb_tensor *a = tb_slice(x, 0, 1, 10, 3); /* rows 1, 4, 7 */
        tb_tensor *b = tb_slice(a, 0, 1, 3, huge);
        tb_tensor *c = tb_add_scalar(b, 0.5);
        const float want[4] = {16.5f, 17.5f, 18.5f, 19.5f};
        expect_values(c, "f32[1,4]", want, 4);
        tb_tensor_release(a);
        tb_tensor_release(b);
    }
    {
        /* the node form straight through tb_call_op */
        const int64_t attrs[4] = {0, 9, 10, INT64_MAX};
        const float want[4] = {36, 37, 38, 39};
        expect_values(tb_call_op(TB_OP_SLICE, &x, 1, attrs, 4), "f32[1,4]", want, 4);
    }
    tb_tensor_release(x);
}

static void test_other_view_ops_at_the_limit(void **state) {
    const int64_t one[1] = {1};
    const int64_t big[1] = {INT64_C(1) << 62};
    tb_tensor *x, *e, *parts[3];
    (void)state;
    x = zeros_of(TB_U8, 1, one);
    e = tb_expand(x, big, 1); /* 2^62 bytes: a view of one element, never allocated */
    assert_non_null(e);
    parts[0] = parts[1] = parts[2] = e;
    assert_null(tb_concat(parts, 2, 0)); /* 2^63 elements */
    expect_status(TB_ERR_OVERFLOW, "tb_concat: ");
    {
        const int64_t pads[2] = {INT64_MAX, 0};
        assert_null(tb_pad(x, pads, 2, 0.0));
        expect_status(TB_ERR_OVERFLOW, "tb_pad: ");
    }
    {
        const int64_t pads[2] = {(INT64_C(1) << 62), 0};
        assert_null(tb_pad(e, pads, 2, 0.0));
        expect_status(TB_ERR_OVERFLOW, "tb_pad: ");
    }
    {
        const int64_t dims[2] = {-1, INT64_C(1) << 61};
        tb_tensor *r = tb_reshape(e, dims, 2);
        char text[64];
        tb_shape s;
        assert_non_null(r);
        s = tb_tensor_shape(r);
        tb_shape_format(&s, text, sizeof text);
        assert_string_equal(text, "u8[2,2305843009213693952]");
        tb_tensor_release(r);
    }
    {
        const int64_t dims[3] = {INT64_MAX, INT64_MAX, 2};
        assert_null(tb_reshape(e, dims, 3));
        expect_status(TB_ERR_OVERFLOW, "tb_reshape: ");
    }
    {
        const int64_t to[2] = {4, INT64_C(1) << 62};
        assert_null(tb_expand(e, to, 2));
        expect_status(TB_ERR_OVERFLOW, "tb_expand: ");
    }
    tb_tensor_release(e);
    tb_tensor_release(x);
}

/* ---- DLPack ---- */

typedef struct producer {
    tb_dl_managed_tensor managed;
    int64_t shape[TB_MAX_RANK];
    int64_t strides[TB_MAX_RANK];
    int deleter_calls;
} producer;

static void producer_deleter(tb_dl_managed_tensor *self) {
    ((producer *)self->manager_ctx)->deleter_calls++;
}

static void producer_init(producer *p, void *data, int32_t ndim, const int64_t *shape,
                          const int64_t *strides) {
    memset(p, 0, sizeof *p);
    memcpy(p->shape, shape, sizeof(int64_t) * (size_t)ndim);
    if (strides != NULL) memcpy(p->strides, strides, sizeof(int64_t) * (size_t)ndim);
    p->managed.dl_tensor.data = data;
    p->managed.dl_tensor.device.device_type = TB_DL_CPU;
    p->managed.dl_tensor.ndim = ndim;
    p->managed.dl_tensor.dtype.code = TB_DL_FLOAT;
    p->managed.dl_tensor.dtype.bits = 32;
    p->managed.dl_tensor.dtype.lanes = 1;
    p->managed.dl_tensor.shape = p->shape;
    p->managed.dl_tensor.strides = strides != NULL ? p->strides : NULL;
    p->managed.manager_ctx = p;
    p->managed.deleter = producer_deleter;
}

static void expect_dl_overflow(producer *p) {
    tb_clear_error();
    assert_null(tb_dlpack_import(&p->managed, NULL));
    expect_status(TB_ERR_OVERFLOW, "tb_dlpack_import: ");
    assert_int_equal(p->deleter_calls, 0);
}

static void test_dlpack_extent_is_checked_before_the_data(void **state) {
    float host[4] = {1, 2, 3, 4};
    const int64_t two[2] = {2, 2}, three[1] = {3};
    producer p;
    (void)state;
    {
        /* each stride passes alone; the last element's byte offset is 2^63 */
        const int64_t st[2] = {INT64_C(1) << 60, INT64_C(1) << 60};
        producer_init(&p, host, 2, two, st);
        expect_dl_overflow(&p);
    }
    {
        const int64_t st[2] = {-(INT64_C(1) << 60), -(INT64_C(1) << 60)};
        producer_init(&p, host, 2, two, st);
        expect_dl_overflow(&p);
    }
    {
        const int64_t st[2] = {INT64_MIN, 1};
        producer_init(&p, host, 2, two, st);
        expect_dl_overflow(&p);
    }
    {
        /* byte_offset beyond int64, and one that wraps the address around */
        producer_init(&p, host, 2, two, NULL);
        p.managed.dl_tensor.byte_offset = UINT64_MAX - 3;
        expect_dl_overflow(&p);
        producer_init(&p, host, 2, two, NULL);
        p.managed.dl_tensor.byte_offset = (uint64_t)INT64_MAX;
        p.managed.dl_tensor.data = (void *)(UINTPTR_MAX - 64);
        expect_dl_overflow(&p);
    }
    {
        /* a negative stride that reaches below the address 0 */
        const int64_t st[1] = {-(INT64_C(1) << 58)};
        producer_init(&p, (void *)(uintptr_t)4096, 1, three, st);
        expect_dl_overflow(&p);
    }
    {
        /* a valid negative stride still imports: host[2], host[1], host[0] */
        const int64_t st[1] = {-1};
        float out[3];
        tb_tensor *t;
        producer_init(&p, &host[2], 1, three, st);
        t = tb_dlpack_import(&p.managed, NULL);
        assert_non_null(t);
        assert_int_equal(tb_tensor_to_host(t, out, sizeof out), TB_OK);
        assert_true(out[0] == 3 && out[1] == 2 && out[2] == 1);
        tb_tensor_release(t);
        assert_int_equal(p.deleter_calls, 1);
    }
    {
        /* an empty tensor reads nothing whatever its strides */
        const int64_t dims[2] = {0, 2}, st[2] = {INT64_MAX, INT64_MIN};
        tb_tensor *t;
        producer_init(&p, host, 2, dims, st);
        t = tb_dlpack_import(&p.managed, NULL);
        assert_non_null(t);
        tb_tensor_release(t);
    }
}

/* ---- .npy files that lie about their size ---- */

static size_t largest_request;

static void *counting_alloc(size_t size, void *user_data) {
    (void)user_data;
    if (size > largest_request) largest_request = size;
    return size > ((size_t)1 << 30) ? NULL : malloc(size);
}

static void counting_free(void *ptr, void *user_data) {
    (void)user_data;
    free(ptr);
}

static void setup_counting(void) {
    tb_desc desc;
    tb_shutdown();
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = counting_alloc;
    desc.allocator.free = counting_free;
    assert_int_equal(tb_setup(&desc), TB_OK);
    largest_request = 0;
}

/* A .npy 1.0 preamble and header for `dict`, padded to 64 bytes; returns the length. */
static size_t npy_header(unsigned char *buf, const char *dict) {
    size_t dict_len = strlen(dict), total = (10 + dict_len + 1 + 63) / 64 * 64;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)((total - 10) & 0xff);
    buf[9] = (unsigned char)((total - 10) >> 8);
    memset(buf + 10, ' ', total - 10);
    memcpy(buf + 10, dict, dict_len);
    buf[total - 1] = '\n';
    return total;
}

static const char *temp_path(const char *name) {
    static char path[512];
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/tb_overflow_%ld_%s", dir != NULL ? dir : "/tmp", (long)getpid(),
             name);
    return path;
}

static void write_file(const char *path, const unsigned char *data, size_t size) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
}

static const char claims_128gib[] =
    "{'descr': '<f4', 'fortran_order': False, 'shape': (32, 1024, 1024, 1024), }";

static void test_npy_claims_are_checked_against_the_file(void **state) {
    unsigned char buf[256];
    size_t n;
    const char *path = temp_path("claim.npy");
    (void)state;
    setup_counting();
    /* 128 GiB claimed by a file of 128 + 10 bytes */
    n = npy_header(buf, claims_128gib);
    memset(buf + n, 0, 10);
    write_file(path, buf, n + 10);
    tb_clear_error();
    assert_null(tb_npy_load(path, NULL));
    expect_status(TB_ERR_FORMAT, "truncated");
    if (largest_request > 4096)
        fail_msg("allocated %zu bytes for a 138-byte file", largest_request);
    /* a version 2 header of 16 MiB promised by a 12-byte file */
    memcpy(buf, "\x93NUMPY\x02\x00\x00\x00\x00\x01", 12);
    write_file(path, buf, 12);
    largest_request = 0;
    assert_null(tb_npy_load(path, NULL));
    expect_status(TB_ERR_FORMAT, "truncated header");
    if (largest_request > 4096) fail_msg("allocated %zu bytes for a 12-byte file", largest_request);
    remove(path);
}

/* The same from a FIFO, whose size is not known in advance: the buffer grows with the bytes
   that arrive instead. */
static void test_npy_claims_from_a_fifo(void **state) {
    unsigned char buf[256];
    size_t n;
    pid_t child;
    int status = 0;
    const char *path = temp_path("fifo.npy");
    (void)state;
    setup_counting();
    n = npy_header(buf, claims_128gib);
    memset(buf + n, 0, 10);
    remove(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        FILE *w = fopen(path, "wb");
        _exit(w != NULL && fwrite(buf, 1, n + 10, w) == n + 10 && fclose(w) == 0 ? 0 : 1);
    }
    tb_clear_error();
    assert_null(tb_npy_load(path, NULL));
    expect_status(TB_ERR_FORMAT, "truncated");
    assert_int_equal(waitpid(child, &status, 0), child);
    remove(path);
    if (largest_request > ((size_t)1 << 17))
        fail_msg("allocated %zu bytes for 138 bytes from a FIFO", largest_request);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_checked_helpers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shape_size_rule_covers_empty_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expand_of_empty_to_overflowing_dims, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slice_with_huge_steps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_view_ops_at_the_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dlpack_extent_is_checked_before_the_data, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_npy_claims_are_checked_against_the_file, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_npy_claims_from_a_fifo, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
