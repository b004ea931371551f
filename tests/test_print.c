/* tb_tensor_format and tb_tensor_print: PyTorch's layout (checked against texts PyTorch 1.13
   printed, and live against torch's own formatter when /usr/bin/python3 has torch), the
   snprintf contract, errors, and that only the printed tensor is synced. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

static tb_device cpu;

/* The text of a tensor (the test frees it); fails the test on error. */
static char *text_of(tb_tensor *t) {
    size_t needed = 0;
    assert_int_equal(tb_tensor_format(t, NULL, 0, &needed), TB_OK);
    char *buf = (char *)malloc(needed + 1);
    assert_non_null(buf);
    size_t again = 0;
    assert_int_equal(tb_tensor_format(t, buf, needed + 1, &again), TB_OK);
    assert_int_equal(again, needed);
    assert_int_equal(strlen(buf), needed);
    return buf;
}

static void expect_text(tb_tensor *t, const char *expected) {
    assert_non_null(t);
    char *got = text_of(t);
    if (strcmp(got, expected) != 0) {
        printf("expected:\n%s\ngot:\n%s\n", expected, got);
        free(got);
        fail_msg("the texts differ");
    }
    free(got);
    tb_tensor_release(t);
}

static tb_tensor *from(const void *data, tb_dtype dtype, int32_t rank, const int64_t *dims) {
    tb_shape shape;
    assert_int_equal(tb_shape_make(&shape, dtype, rank, dims), TB_OK);
    tb_tensor *t = tb_tensor_from_host(data, &shape, &cpu);
    assert_non_null(t);
    return t;
}

static tb_tensor *reshaped(tb_tensor *t, int64_t d0, int64_t d1, int64_t d2, int32_t rank) {
    const int64_t dims[3] = {d0, d1, d2};
    tb_tensor *r = tb_reshape(t, dims, rank);
    tb_tensor_release(t);
    assert_non_null(r);
    return r;
}

/* t / v and t * v, releasing t */
static tb_tensor *div_consume(tb_tensor *t, double v) {
    tb_tensor *r = tb_div_scalar(t, v);
    tb_tensor_release(t);
    return r;
}
static tb_tensor *mul_consume(tb_tensor *t, double v) {
    tb_tensor *r = tb_mul_scalar(t, v);
    tb_tensor_release(t);
    return r;
}

/* Each expected text is what PyTorch 1.13 prints for the same values (torch._tensor_str), with
   our device and dtype as the suffixes. */
static void test_layouts_match_pytorch(void **state) {
    (void)state;
    const float m[4] = {1.0f, -2.5f, 3.0f, 4.0f};
    const int64_t d22[2] = {2, 2};
    expect_text(from(m, TB_F32, 2, d22), "tensor([[ 1.0000, -2.5000],\n"
                                         "        [ 3.0000,  4.0000]], device='cpu:0', dtype=f32)");
    const float ints[3] = {1, 2, 3};
    const int64_t d3[1] = {3};
    expect_text(from(ints, TB_F32, 1, d3), "tensor([1., 2., 3.], device='cpu:0', dtype=f32)");
    const double sci[3] = {1e-5, 1.0, 123.0};
    expect_text(from(sci, TB_F64, 1, d3),
                "tensor([1.0000e-05, 1.0000e+00, 1.2300e+02], device='cpu:0', dtype=f64)");
    const float scalar = 3.5f;
    expect_text(from(&scalar, TB_F32, 0, NULL), "tensor(3.5000, device='cpu:0', dtype=f32)");
    expect_text(tb_arange(0, 2000, 1, TB_I64, &cpu),
                "tensor([   0,    1,    2,  ..., 1997, 1998, 1999], device='cpu:0', dtype=i64)");
    const uint8_t flags[3] = {1, 0, 1};
    expect_text(from(flags, TB_BOOL, 1, d3),
                "tensor([ True, False,  True], device='cpu:0', dtype=bool)");
    const float special[5] = {NAN, INFINITY, -INFINITY, 0.5f, -0.0f};
    const int64_t d5[1] = {5};
    expect_text(from(special, TB_F32, 1, d5),
                "tensor([   nan,    inf,   -inf, 0.5000, -0.0000], device='cpu:0', dtype=f32)");
    expect_text(div_consume(tb_arange(0, 30, 1, TB_F32, &cpu), 7.0),
                "tensor([0.0000, 0.1429, 0.2857, 0.4286, 0.5714, 0.7143, 0.8571, 1.0000, 1.1429,\n"
                "        1.2857, 1.4286, 1.5714, 1.7143, 1.8571, 2.0000, 2.1429, 2.2857, 2.4286,\n"
                "        2.5714, 2.7143, 2.8571, 3.0000, 3.1429, 3.2857, 3.4286, 3.5714, 3.7143,\n"
                "        3.8571, 4.0000, 4.1429], device='cpu:0', dtype=f32)");
    /* a line that leaves no room for the suffixes: they go on the next line */
    expect_text(div_consume(tb_arange(0, 9, 1, TB_F32, &cpu), 7.0),
                "tensor([0.0000, 0.1429, 0.2857, 0.4286, 0.5714, 0.7143, 0.8571, 1.0000, 1.1429],\n"
                "       device='cpu:0', dtype=f32)");
    expect_text(reshaped(mul_consume(tb_arange(0, 1600, 1, TB_F32, &cpu), 0.5), 40, 40, 0, 2),
                "tensor([[0.0000e+00, 5.0000e-01, 1.0000e+00,  ..., 1.8500e+01, 1.9000e+01,\n"
                "         1.9500e+01],\n"
                "        [2.0000e+01, 2.0500e+01, 2.1000e+01,  ..., 3.8500e+01, 3.9000e+01,\n"
                "         3.9500e+01],\n"
                "        [4.0000e+01, 4.0500e+01, 4.1000e+01,  ..., 5.8500e+01, 5.9000e+01,\n"
                "         5.9500e+01],\n"
                "        ...,\n"
                "        [7.4000e+02, 7.4050e+02, 7.4100e+02,  ..., 7.5850e+02, 7.5900e+02,\n"
                "         7.5950e+02],\n"
                "        [7.6000e+02, 7.6050e+02, 7.6100e+02,  ..., 7.7850e+02, 7.7900e+02,\n"
                "         7.7950e+02],\n"
                "        [7.8000e+02, 7.8050e+02, 7.8100e+02,  ..., 7.9850e+02, 7.9900e+02,\n"
                "         7.9950e+02]], device='cpu:0', dtype=f32)");
    expect_text(reshaped(tb_arange(-6, 6, 1, TB_I32, &cpu), 2, 3, 2, 3),
                "tensor([[[-6, -5],\n"
                "         [-4, -3],\n"
                "         [-2, -1]],\n"
                "\n"
                "        [[ 0,  1],\n"
                "         [ 2,  3],\n"
                "         [ 4,  5]]], device='cpu:0', dtype=i32)");
    const uint8_t bytes[3] = {0, 7, 255};
    expect_text(from(bytes, TB_U8, 1, d3), "tensor([  0,   7, 255], device='cpu:0', dtype=u8)");
    const int64_t d203[3] = {2, 0, 3};
    expect_text(from(NULL, TB_F32, 3, d203),
                "tensor([], device='cpu:0', size=(2, 0, 3), dtype=f32)");
    const int64_t d0[1] = {0};
    expect_text(from(NULL, TB_I64, 1, d0), "tensor([], device='cpu:0', dtype=i64)");
}

static void test_snprintf_contract(void **state) {
    (void)state;
    const float v[2] = {1.5f, 2.0f};
    const int64_t d2[1] = {2};
    tb_tensor *t = from(v, TB_F32, 1, d2);
    const char *full = "tensor([1.5000, 2.0000], device='cpu:0', dtype=f32)";
    char buf[16];
    size_t needed = 0;
    memset(buf, 'x', sizeof buf);
    assert_int_equal(tb_tensor_format(t, buf, sizeof buf, &needed), TB_OK);
    assert_int_equal(needed, strlen(full));
    assert_int_equal(strlen(buf), sizeof buf - 1);
    assert_memory_equal(buf, full, sizeof buf - 1);
    /* cap 1: only the NUL; needed may be NULL */
    assert_int_equal(tb_tensor_format(t, buf, 1, NULL), TB_OK);
    assert_int_equal(buf[0], '\0');
    /* NULL buf with a capacity is an error, and tells so */
    tb_clear_error();
    assert_int_equal(tb_tensor_format(t, NULL, 8, &needed), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(needed, 0);
    assert_non_null(strstr(tb_last_error(), "buf is NULL"));
    assert_int_equal(tb_tensor_print(t), TB_OK);
    tb_tensor_release(t);
}

static void test_errors(void **state) {
    (void)state;
    char buf[32];
    size_t needed = 99;
    tb_clear_error();
    strcpy(buf, "old");
    assert_int_equal(tb_tensor_format(NULL, buf, sizeof buf, &needed), TB_ERR_INVALID_ARGUMENT);
    assert_string_equal(buf, "");
    assert_int_equal(needed, 0);
    assert_non_null(strstr(tb_last_error(), "tb_tensor_format: tensor is NULL"));
    tb_clear_error();
    assert_int_equal(tb_tensor_print(NULL), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "tb_tensor_print: tensor is NULL"));
    /* a chain of ops that failed: the first error is kept */
    const int64_t d2[1] = {2}, d3[1] = {3};
    float two[2] = {1, 2}, three[3] = {1, 2, 3};
    tb_tensor *x = from(two, TB_F32, 1, d2), *y = from(three, TB_F32, 1, d3);
    tb_clear_error();
    tb_tensor *bad = tb_add(x, y);
    assert_null(bad);
    assert_int_equal(tb_tensor_format(bad, buf, sizeof buf, NULL), TB_ERR_SHAPE);
    assert_non_null(strstr(tb_last_error(), "tb_add"));
    tb_tensor_release(x);
    tb_tensor_release(y);
}

/* tb_tensor_print writes tb_tensor_format's text and a newline to stdout, and nothing when it
   fails. stdout goes to a file for the test. */
static void test_print_writes_stdout(void **state) {
    (void)state;
    char path[] = "/tmp/tb_print_out_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    assert_true(saved >= 0);
    assert_int_equal(dup2(fd, STDOUT_FILENO), STDOUT_FILENO);
    tb_tensor *x = reshaped(tb_arange(0, 6, 1, TB_F32, &cpu), 2, 3, 0, 2);
    tb_tensor *y = div_consume(tb_tensor_retain(x), 4.0);
    tb_status first = tb_tensor_print(y);
    tb_clear_error(); /* a NULL tensor after an error would keep that error */
    tb_status second = tb_tensor_print(NULL);
    fflush(stdout);
    assert_int_equal(dup2(saved, STDOUT_FILENO), STDOUT_FILENO);
    close(saved);
    close(fd);
    if (first != TB_OK) fail_msg("tb_tensor_print: %s", tb_last_error());
    assert_int_equal(second, TB_ERR_INVALID_ARGUMENT);
    char got[512];
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(got, 1, sizeof got - 1, f);
    fclose(f);
    remove(path);
    got[n] = '\0';
    assert_string_equal(got, "tensor([[0.0000, 0.2500, 0.5000],\n"
                             "        [0.7500, 1.0000, 1.2500]], device='cpu:0', dtype=f32)\n");
    tb_tensor_release(y);
    tb_tensor_release(x);
}

/* Printing syncs the printed tensor and nothing else. */
static void test_syncs_only_that_tensor(void **state) {
    (void)state;
    tb_tensor *x = tb_arange(0, 4, 1, TB_F32, &cpu);
    tb_tensor *a = tb_mul_scalar(x, 2.0);
    tb_tensor *b = tb_add_scalar(x, 1.0);
    assert_non_null(tb_tensor_node(a));
    assert_non_null(tb_tensor_node(b));
    char *text = text_of(a);
    assert_string_equal(text, "tensor([0., 2., 4., 6.], device='cpu:0', dtype=f32)");
    free(text);
    assert_null(tb_tensor_node(a));
    assert_non_null(tb_tensor_node(b)); /* still pending */
    tb_tensor_release(a);
    tb_tensor_release(b);
    tb_tensor_release(x);
}

/* ---- live comparison with torch's formatter ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static uint64_t next_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double next_unit(void) { /* [0, 1) */
    return (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct oracle_case {
    tb_dtype dtype;
    int32_t rank;
    int64_t dims[4];
    int kind;     /* floats: 0 uniform, 1 integer valued, 2 with nan/inf/-0, 3 zeros, 4 log-wide */
    double scale; /* magnitude */
} oracle_case;

static const oracle_case oracle_cases[] = {
    {TB_F32, 1, {1000}, 0, 1.0},      {TB_F32, 1, {1001}, 0, 1.0},
    {TB_F64, 3, {7, 7, 7}, 0, 50.0},  {TB_F32, 3, {11, 11, 11}, 0, 3.0},
    {TB_F32, 4, {2, 3, 4, 5}, 1, 99}, {TB_F64, 3, {1, 1, 1200}, 1, 1e9},
    {TB_F32, 2, {1200, 1}, 2, 10.0},  {TB_F64, 2, {3, 400}, 4, 1.0},
    {TB_F32, 2, {6, 200}, 3, 0},      {TB_F32, 2, {7, 150}, 2, 1e-3},
    {TB_F64, 1, {13}, 4, 1.0},        {TB_F32, 0, {0}, 0, 1e10},
    {TB_F64, 1, {25}, 1, 1000},       {TB_F32, 2, {5, 17}, 0, 1e-5},
    {TB_I32, 2, {4, 9}, 0, 0},        {TB_I64, 1, {2001}, 0, 0},
    {TB_I64, 2, {3, 5}, 0, 0},        {TB_U8, 3, {9, 9, 20}, 0, 0},
    {TB_BOOL, 2, {30, 40}, 0, 0},     {TB_BOOL, 1, {5}, 0, 0},
    {TB_F32, 2, {0, 5}, 0, 1.0},      {TB_I32, 4, {8, 8, 8, 8}, 0, 0},
};
#define ORACLE_COUNT (sizeof oracle_cases / sizeof oracle_cases[0])

static tb_tensor *oracle_tensor(const oracle_case *c) {
    tb_shape shape;
    size_t nbytes = 0;
    int64_t numel = 0;
    assert_int_equal(tb_shape_make(&shape, c->dtype, c->rank, c->dims), TB_OK);
    assert_int_equal(tb_shape_nbytes(&shape, &nbytes), TB_OK);
    assert_int_equal(tb_shape_numel(&shape, &numel), TB_OK);
    unsigned char *data = (unsigned char *)malloc(nbytes ? nbytes : 1);
    assert_non_null(data);
    for (int64_t i = 0; i < numel; ++i) {
        double v = 0;
        int64_t k = (int64_t)(next_u64() >> 1);
        switch (c->kind) {
        case 0:
            v = (next_unit() * 2 - 1) * c->scale;
            break;
        case 1:
            v = floor((next_unit() * 2 - 1) * c->scale);
            break;
        case 2: {
            static const double specials[4] = {NAN, INFINITY, -INFINITY, -0.0};
            v = next_u64() % 5 == 0 ? specials[next_u64() % 4] : (next_unit() - 0.5) * c->scale;
            break;
        }
        case 4:
            v = (next_unit() < 0.5 ? -1 : 1) * pow(10.0, next_unit() * 12 - 6);
            break;
        default:
            v = 0;
        }
        switch (c->dtype) {
        case TB_F32: {
            float f = (float)v;
            memcpy(data + i * 4, &f, 4);
            break;
        }
        case TB_F64:
            memcpy(data + i * 8, &v, 8);
            break;
        case TB_I32: {
            int32_t x = (int32_t)(uint32_t)next_u64();
            if (i % 7 == 3) x = INT32_MIN;
            if (i % 11 == 5) x = (int32_t)(k % 100) - 50;
            memcpy(data + i * 4, &x, 4);
            break;
        }
        case TB_I64: {
            int64_t x = (int64_t)next_u64();
            if (i == 1) x = INT64_MIN;
            if (c->dims[0] == 3 && i % 2) x = k % 1000;
            memcpy(data + i * 8, &x, 8);
            break;
        }
        default:
            data[i] = c->dtype == TB_BOOL ? (unsigned char)(next_u64() & 1) : (unsigned char)k;
        }
    }
    tb_tensor *t = tb_tensor_from_host(data, &shape, &cpu);
    free(data);
    assert_non_null(t);
    return t;
}

/* Our text without "tensor(" and the suffixes: what torch._tensor_str._tensor_str gives. */
static char *body_of(const char *text) {
    const char *end = NULL, *p = text;
    while ((p = strstr(p, "device='")) != NULL)
        end = p++;
    assert_non_null(end);
    while (end > text && (end[-1] == ' ' || end[-1] == '\n'))
        --end;
    assert_true(end > text + 7 && end[-1] == ',');
    --end;
    assert_memory_equal(text, "tensor(", 7);
    size_t n = (size_t)(end - (text + 7));
    char *body = (char *)malloc(n + 1);
    assert_non_null(body);
    memcpy(body, text + 7, n);
    body[n] = '\0';
    return body;
}

static void test_matches_torch_live(void **state) {
    (void)state;
    char dir[] = "/tmp/tb_print_XXXXXX", path[512], cmd[1024];
    if (access("/usr/bin/python3", X_OK) != 0 ||
        system("/usr/bin/python3 -c 'import numpy, torch' >/dev/null 2>&1") != 0) {
        printf("/usr/bin/python3 with numpy and torch not found: skipping\n");
        skip();
    }
    assert_non_null(mkdtemp(dir));
    char *ours[ORACLE_COUNT];
    for (size_t i = 0; i < ORACLE_COUNT; ++i) {
        tb_tensor *t = oracle_tensor(&oracle_cases[i]);
        snprintf(path, sizeof path, "%s/case%u.npy", dir, (unsigned)i);
        assert_int_equal(tb_npy_save(path, t), TB_OK);
        ours[i] = text_of(t);
        tb_tensor_release(t);
    }
    snprintf(path, sizeof path, "%s/oracle.py", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("import sys, numpy as np, torch\n"
          "from torch._tensor_str import _tensor_str\n"
          "d, n = sys.argv[1], int(sys.argv[2])\n"
          "with open(d + '/torch.txt', 'w') as out:\n"
          "    for i in range(n):\n"
          "        t = torch.from_numpy(np.load('%s/case%d.npy' % (d, i)))\n"
          "        out.write(_tensor_str(t, 7) + '\\n\\x01\\n')\n",
          f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/oracle.py %s %u", dir, dir,
             (unsigned)ORACLE_COUNT);
    fflush(stdout);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/torch.txt", dir);
    f = fopen(path, "rb");
    assert_non_null(f);
    static char theirs[1 << 20];
    size_t len = fread(theirs, 1, sizeof theirs - 1, f);
    fclose(f);
    theirs[len] = '\0';
    char *cursor = theirs;
    int mismatches = 0;
    for (size_t i = 0; i < ORACLE_COUNT; ++i) {
        char *sep = strstr(cursor, "\n\x01\n");
        assert_non_null(sep);
        *sep = '\0';
        char *body = body_of(ours[i]);
        if (strcmp(body, cursor) != 0) {
            printf("case %u differs from torch:\n--- torch\n%s\n--- ours\n%s\n", (unsigned)i,
                   cursor, body);
            ++mismatches;
        }
        free(body);
        free(ours[i]);
        cursor = sep + 3;
    }
    printf("%u cases compared with torch's formatter\n", (unsigned)ORACLE_COUNT);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(mismatches, 0);
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
        cmocka_unit_test(test_layouts_match_pytorch),
        cmocka_unit_test(test_snprintf_contract),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_syncs_only_that_tensor),
        cmocka_unit_test(test_print_writes_stdout),

        cmocka_unit_test(test_matches_torch_live),
    };
    return cmocka_run_group_tests_name("print", tests, setup, teardown);
}
