/* The code generator (src/compile/codegen*.c with the dialects dialect_opencl.c and
   dialect_c99.c) on its own: plans of lazy-tensor graphs rendered for described devices
   (AVX-512 and AVX2 CPUs and a GPU in OpenCL C, the native backend's C99 host), without a
   device or a compiler. What a program must be: one function per kernel in the dialect's form
   with the class's vector width, a kernel whose code repeats an earlier one's run by that
   function, fused products in the packed matmul, B's row as one vector in the register
   matmul, reductions per channel that read each image's run in order, sums over leading axes
   as columns of vectors, the range a pad's test gives its axis used under it, every math op's
   template filled in every float dtype, an error where
   a dialect cannot report a run-time failure, the same text every time, and an error (no
   leak) when memory runs out. Whether the programs compile and compute right is the
   compiled-backend suite's part (tests/backend_suite). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include "plan_graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

/* The program of `roots` for `dev` (free()); *plan_out gets its plan unless NULL. */
static char *program(int dev, tb_tensor *const *roots, size_t n, tb__plan **plan_out) {
    plan_target t;
    tb__plan *p = NULL;
    char *text = NULL;
    plan_target_of(&t, dev);
    if (program_of(&t, roots, n, &p, &text) != TB_OK)
        fail_msg("%s: %s", plan_dev_names[dev], tb_last_error());
    if (plan_out != NULL) {
        *plan_out = p;
    } else {
        tb__plan_free(p);
    }
    return text;
}

static size_t count_of(const char *text, const char *what) {
    size_t n = 0;
    const char *p = text;
    while ((p = strstr(p, what)) != NULL) {
        n++;
        p += strlen(what);
    }
    return n;
}

static void expect_text(const char *text, const char *what, const char *dev) {
    if (strstr(text, what) == NULL) fail_msg("%s: the program lacks \"%s\"", dev, what);
}

/* The program of `root` for `dev` has `has` and, unless NULL, lacks `lacks`. */
static void expect_program(int dev, tb_tensor *root, const char *has, const char *lacks) {
    char *text = program(dev, &root, 1, NULL);
    expect_text(text, has, plan_dev_names[dev]);
    if (lacks != NULL) assert_null(strstr(text, lacks));
    free(text);
}

/* ---- the dialects ---- */

/* exp(x) * 2 over a 512 x 512 array: an OpenCL C kernel reading vectors of the CPU class's
   width, a GPU kernel of one element per work item, a C99 function over work items. */
static void test_dialects(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 512, 512, 0), *e = tb_exp(x), *y = tb_mul_scalar(e, 2.0);
    tb__plan *p = NULL;
    char *text;
    (void)state;
    text = program(DEV_AVX512, &y, 1, &p);
    expect_text(text, "#define TB_VW 16\n", "AVX-512");
    expect_text(text, "__kernel void E_262144(", "AVX-512");
    expect_text(text, "TB_VEXP(", "AVX-512");
    assert_string_equal(p->kernels[0].fn, "E_262144");
    tb__plan_free(p);
    free(text);

    text = program(DEV_AVX2, &y, 1, NULL);
    expect_text(text, "#define TB_VW 8\n", "AVX2");
    expect_text(text, "TB_VEXP(", "AVX2");
    free(text);

    text = program(DEV_GPU, &y, 1, &p);
    expect_text(text, "__kernel void E_262144(", "GPU");
    assert_null(strstr(text + p->text_head, "TB_VEXP("));
    tb__plan_free(p);
    free(text);

    text = program(DEV_C99, &y, 1, &p);
    expect_text(text, "TB_EXPORT void E_262144(", "C99 host");
    expect_text(text, "TB_VEXP(", "C99 host");
    assert_null(strstr(text, "__kernel"));
    tb__plan_free(p);
    free(text);
    tb_tensor_release(y);
    tb_tensor_release(e);
    tb_tensor_release(x);
}

/* A log-sum-exp over rows of 203: one kernel that computes each row's max first, in four
   accumulators over the first 200 elements and one over the last 3, on every class and the
   GPU (where a work-group reduces a row: each of its items computes the max). */
static void test_hoisted_reduction_loops(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 16, 203, 0);
    int32_t axis = 1;
    tb_tensor *m = tb_max(x, &axis, 1, true), *d = tb_sub(x, m), *e = tb_exp(d);
    tb_tensor *s = tb_sum(e, &axis, 1, true), *l = tb_log(s), *y = tb_add(l, m);
    int dev;
    (void)state;
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        tb__plan *p = NULL;
        char *text = program(dev, &y, 1, &p), *lanes, *rest, *own;
        assert_int_equal(p->num_kernels, 1);
        assert_int_equal(p->kernels[0].hoists, 1);
        lanes = strstr(text, "L; i1 < 200L; i1 += 4) ");
        rest = strstr(text, "= 200L; i2 < 203L; i2 += 1) ");
        if (lanes == NULL || rest == NULL || rest < lanes)
            fail_msg("%s: no loop of four lanes then one over the row's max", plan_dev_names[dev]);
        /* four lanes and the rest, then three combined */
        assert_int_equal(count_of(text, " = TB_MAXS("), 8);
        own = strstr(rest, "acc"); /* the sum's own accumulators after */
        assert_non_null(own);
        tb__plan_free(p);
        free(text);
    }
    tb_tensor_release(y);
    tb_tensor_release(l);
    tb_tensor_release(s);
    tb_tensor_release(e);
    tb_tensor_release(d);
    tb_tensor_release(m);
    tb_tensor_release(x);
}

/* Two kernels doing the same work on other arrays: one function, which both run. */
static void test_repeated_kernel_is_one_function(void **state) {
    tb_tensor *a = plan_input(TB_F32, 2, 512, 512, 0), *b = plan_input(TB_F32, 2, 512, 512, 0);
    tb_tensor *ea = tb_exp(a), *eb = tb_exp(b), *y[2];
    int dev;
    (void)state;
    y[0] = tb_mul_scalar(ea, 2.0);
    y[1] = tb_mul_scalar(eb, 2.0);
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        tb__plan *p = NULL;
        char *text = program(dev, y, 2, &p), fn[80];
        assert_int_equal(p->num_kernels, 2);
        assert_string_not_equal(p->kernels[0].name, p->kernels[1].name);
        assert_string_equal(p->kernels[1].fn, p->kernels[0].name);
        snprintf(fn, sizeof fn, "void %s(", p->kernels[0].name);
        assert_int_equal(count_of(text, fn), 1);
        assert_null(strstr(text, p->kernels[1].name));
        tb__plan_free(p);
        free(text);
    }
    tb_tensor_release(y[1]);
    tb_tensor_release(y[0]);
    tb_tensor_release(eb);
    tb_tensor_release(ea);
    tb_tensor_release(b);
    tb_tensor_release(a);
}

/* The packed matmul's inner loop is fused products of a broadcast of A and a vector of B
   (TB_VMAD: fused where the device has FMA); the GPU's tiles are scalar. */
static void test_packed_matmul_fused_products(void **state) {
    tb_tensor *a = plan_input(TB_F32, 2, 512, 512, 0), *b = plan_input(TB_F32, 2, 512, 512, 0);
    tb_tensor *y = tb_matmul(a, b);
    char *text;
    (void)state;
    text = program(DEV_AVX512, &y, 1, NULL);
    expect_text(text, "TB_VMAD(TB_VSPLAT(", "AVX-512");
    free(text);
    text = program(DEV_C99, &y, 1, NULL);
    expect_text(text, "TB_VMAD(TB_VSPLAT(", "C99 host");
    free(text);
    text = program(DEV_GPU, &y, 1, NULL);
    assert_null(strstr(text, "TB_VMAD(TB_VSPLAT("));
    free(text);
    tb_tensor_release(y);
    tb_tensor_release(b);
    tb_tensor_release(a);
}

/* y's plan for dev has one matmul, packed, prefetching A's next row panel or not. */
static void expect_prefetch(int dev, tb_tensor *y, bool want) {
    const char *name = plan_dev_names[dev];
    tb__plan *p = NULL;
    char *text = program(dev, &y, 1, &p);
    size_t i;
    int packed = 0;
    for (i = 0; i < p->num_kernels; i++) {
        if (p->kernels[i].kind != TB__K_MATMUL) continue;
        assert_int_equal(p->kernels[i].mm, TB__MM_PACKED);
        if (p->kernels[i].mm_prefetch_a != want)
            fail_msg("%s: mm_prefetch_a is %d, not %d", name, (int)p->kernels[i].mm_prefetch_a,
                     (int)want);
        packed++;
    }
    assert_int_equal(packed, 1);
    if (want) {
        expect_text(text, "*an = pr + 1 < ", name);
        expect_text(text, "TB_PREFETCH_L2(an + ", name);
    } else {
        assert_null(strstr(text, "TB_PREFETCH_L2(an"));
    }
    tb__plan_free(p);
    free(text);
}

/* A packed matmul of packed A (A transposed: 768 x 512, 1.5 MiB: more than half of the
   described CPUs' 2 MiB caches) prefetches the next row panel of A as it reads its own, on
   every CPU class; within A's panels: the last row panel prefetches its own. One row panel
   (6 x 65536: 1.5 MiB too), an A the cache keeps (256 x 256: 256 KiB) and a GPU's tiles
   prefetch nothing. */
static void test_packed_matmul_prefetches_a(void **state) {
    tb_tensor *at = plan_input(TB_F32, 2, 512, 768, 0), *a = tb_transpose(at, 0, 1);
    tb_tensor *b = plan_input(TB_F32, 2, 512, 512, 0), *y = tb_matmul(a, b);
    tb_tensor *a6t = plan_input(TB_F32, 2, 65536, 6, 0), *a6 = tb_transpose(a6t, 0, 1);
    tb_tensor *b6 = plan_input(TB_F32, 2, 65536, 512, 0), *y6 = tb_matmul(a6, b6);
    tb_tensor *st = plan_input(TB_F32, 2, 256, 256, 0), *s = tb_transpose(st, 0, 1);
    tb_tensor *ys = tb_matmul(s, s);
    static const int devs[] = {DEV_AVX512, DEV_AVX2, DEV_SSE, DEV_C99};
    size_t d;
    char *text;
    (void)state;
    for (d = 0; d < sizeof devs / sizeof devs[0]; d++) {
        expect_prefetch(devs[d], y, true);
        expect_prefetch(devs[d], y6, false);
        expect_prefetch(devs[d], ys, false);
    }
    text = program(DEV_GPU, &y, 1, NULL);
    assert_null(strstr(text, "TB_PREFETCH_L2(an"));
    free(text);
    tb_tensor_release(ys);
    tb_tensor_release(s);
    tb_tensor_release(st);
    tb_tensor_release(y6);
    tb_tensor_release(b6);
    tb_tensor_release(a6);
    tb_tensor_release(a6t);
    tb_tensor_release(y);
    tb_tensor_release(b);
    tb_tensor_release(a);
    tb_tensor_release(at);
}

/* A 3 x 3 convolution over whole padded rows (8 images, 64 -> 64 channels, 28 x 28, padding
   1) is a packed matmul reading B's rows in place at a table's offsets; with blocks of 16 or
   more vector FMAs a step (AVX-512 and the C99 host of 64-byte vectors: 13 rows of two
   registers, 26 FMAs) each step prefetches the row 45 steps ahead (1152 FMAs / 26), its three
   lines of 32 floats (the row may start inside a line); the row 45 steps past the last step
   is the last row. AVX2's 4 x 24 and SSE's 6 x 8 (12 FMAs), which read the same table, and
   the GPU's tiles prefetch nothing. */
static void test_conv_matmul_prefetches_b(void **state) {
    static const int64_t pad[2] = {1, 1};
    const int64_t xd[4] = {8, 64, 28, 28}, wd[4] = {64, 64, 3, 3};
    tb_tensor *x = plan_input(TB_F32, 3, 8, 64, 28 * 28), *w = plan_input(TB_F32, 3, 64, 64, 9);
    tb_tensor *x4 = tb_reshape(x, xd, 4), *w4 = tb_reshape(w, wd, 4);
    tb_tensor *y = tb_conv2d(x4, w4, NULL, NULL, pad, NULL, 1);
    static const int with[] = {DEV_AVX512, DEV_C99}, without[] = {DEV_AVX2, DEV_SSE};
    size_t d;
    (void)state;
    assert_non_null(y);
    for (d = 0; d < sizeof with / sizeof with[0]; d++) {
        char *text = program(with[d], &y, 1, NULL);
        const char *name = plan_dev_names[with[d]];
        expect_text(text, " < 531L ? i", name);
        expect_text(text, " + 45 : 575L];", name);
        if (count_of(text, "TB_PREFETCH(bf + ") != 3 ||
            strstr(text, "TB_PREFETCH(bf + 0);") == NULL ||
            strstr(text, "TB_PREFETCH(bf + 16);") == NULL ||
            strstr(text, "TB_PREFETCH(bf + 31);") == NULL)
            fail_msg("%s: not the row's three lines:\n%s", name, text);
        free(text);
    }
    for (d = 0; d < sizeof without / sizeof without[0]; d++)
        expect_program(without[d], y, "+ tb_krow[i", "TB_PREFETCH(bf");
    /* AVX2's wide block in OpenCL C too: it reads B in place (tb__kit_target) */
    expect_program(DEV_AVX2, y, "accv3_2 = ", "accv4_");
    expect_program(DEV_GPU, y, "MM_64_", "TB_PREFETCH(bf");
    tb_tensor_release(y);
    tb_tensor_release(w4);
    tb_tensor_release(x4);
    tb_tensor_release(w);
    tb_tensor_release(x);
}

/* The register matmul of few columns (a classifier's last layer, 256x10x512) makes B's row
   vectors per step of the depth, added times each row's value of A, in OpenCL C for CPU
   classes as in the native backend's C: one vector of 16 lanes holds the 10 columns where the
   registers are of 16 lanes; with AVX2's 8 it is two vectors of 8 (one of 16 would be kept in
   memory), and 4 rows (8 accumulator registers of 16), not 16. */
static void test_register_matmul_vectors(void **state) {
    tb_tensor *a = plan_input(TB_F32, 2, 256, 512, 0), *b = plan_input(TB_F32, 2, 512, 10, 0);
    tb_tensor *y = tb_matmul(a, b);
    static const int devs[] = {DEV_AVX512, DEV_AVX2, DEV_C99};
    size_t d;
    (void)state;
    for (d = 0; d < sizeof devs / sizeof devs[0]; d++) {
        char *text = program(devs[d], &y, 1, NULL);
        const char *name = plan_dev_names[devs[d]];
        if (devs[d] == DEV_AVX2) {
            expect_text(text, "const float8 bv1 = ", name);
            expect_text(text, "accv3_1 += v", name);
            expect_text(text, "row0 = (long)get_global_id(1) * 4;", name);
            assert_null(strstr(text, "float16"));
        } else {
            expect_text(text, "const float16 bv0 = ", name);
            expect_text(text, "accv15_0 += v", name);
        }
        free(text);
    }
    tb_tensor_release(y);
    tb_tensor_release(b);
    tb_tensor_release(a);
}

/* A batched matrix-vector product (64 x [1 x 256] @ [256 x 512]) takes blocks of 64 columns
   (8 registers of AVX2's 8 lanes, 4 of AVX-512's 16) and reads B's row at each step of the
   depth as vector loads from one address; with B transposed, or one column broadcast along
   the row, its values are gathered one by one into the same vectors. */
static void test_register_matmul_rows(void **state) {
    static const int64_t wide[3] = {64, 256, 512};
    tb_tensor *a = plan_input(TB_F32, 3, 64, 1, 256), *b = plan_input(TB_F32, 3, 64, 256, 512);
    tb_tensor *bt = plan_input(TB_F32, 3, 64, 512, 256), *t = tb_transpose(bt, 1, 2);
    tb_tensor *b1 = plan_input(TB_F32, 3, 64, 256, 1), *e = tb_expand(b1, wide, 3);
    tb_tensor *y = tb_matmul(a, b), *yt = tb_matmul(a, t), *ye = tb_matmul(a, e);
    static const int devs[] = {DEV_AVX512, DEV_AVX2, DEV_C99};
    size_t d;
    (void)state;
    for (d = 0; d < sizeof devs / sizeof devs[0]; d++) {
        const char *name = plan_dev_names[devs[d]];
        bool avx2 = devs[d] == DEV_AVX2;
        char *text = program(devs[d], &y, 1, NULL);
        expect_text(text, " * 64, row0 = ", name);
        expect_text(text, "const float *br = b", name);
        expect_text(text,
                    avx2 ? "const float8 bv7 = vload8(7, br);"
                         : "const float16 bv3 = vload16(3, br);",
                    name);
        assert_null(strstr(text, avx2 ? "bv8" : "bv4"));
        assert_null(strstr(text, "tb_krow")); /* rows one stride apart: no table */
        free(text);
        text = program(devs[d], &yt, 1, NULL);
        expect_text(text, " * 64, row0 = ", name);
        assert_null(strstr(text, "*br = b"));
        expect_text(text, avx2 ? "const float8 bv7 = (float8)" : "const float16 bv3 = (float16)",
                    name);
        free(text);
        text = program(devs[d], &ye, 1, NULL);
        assert_null(strstr(text, "*br = b"));
        free(text);
    }
    /* blocks that divide the output read unclamped: the items an OpenCL CPU device's groups
       pad the grid with (72 columns are 9 blocks, in groups of 8) return before reading */
    {
        tb_tensor *s = plan_input(TB_F32, 2, 40, 15, 0), *r = plan_input(TB_F32, 2, 15, 72, 0);
        tb_tensor *sr = tb_matmul(s, r);
        expect_program(DEV_AVX2, sr, "if (row0 >= 40L || col0 >= 72L) return;", "min(col0 + ");
        tb_tensor_release(sr);
        tb_tensor_release(r);
        tb_tensor_release(s);
    }
    tb_tensor_release(ye);
    tb_tensor_release(e);
    tb_tensor_release(b1);
    tb_tensor_release(yt);
    tb_tensor_release(y);
    tb_tensor_release(t);
    tb_tensor_release(bt);
    tb_tensor_release(b);
    tb_tensor_release(a);
}

/* The input gradient of a LeNet-like convolution (4 images, 1 -> 32 channels, 28 x 28, 5 x
   5) is a convolution over whole padded rows by the flipped weight: per image a register
   matmul of 1 x 784 x 800 (rows of 24 + 4 columns) whose depth is a channel, a kernel row and
   a kernel column. B's rows and A's values are read at tables of their offsets (tb_krow,
   tb_karow), not at the depth's digits divided out at each step. Its blocks of 64 columns do
   not divide 784: the last one is moved left to end at column 784 (12 x 64 + 16). */
static void test_register_matmul_tables(void **state) {
    const int64_t xd[4] = {4, 1, 28, 28}, wd[4] = {32, 1, 5, 5};
    tb_tensor *x = plan_input(TB_F32, 3, 4, 1, 28 * 28), *w = plan_input(TB_F32, 3, 32, 1, 25);
    tb_tensor *x4 = tb_reshape(x, xd, 4), *w4 = tb_reshape(w, wd, 4), *y, *l, *g = NULL;
    static const int devs[] = {DEV_AVX512, DEV_AVX2, DEV_C99};
    size_t d;
    (void)state;
    assert_int_equal(tb_set_requires_grad(x4, true), TB_OK);
    y = tb_conv2d(x4, w4, NULL, NULL, NULL, NULL, 1);
    l = tb_sum(y, NULL, 0, false);
    assert_int_equal(tb_grad(l, NULL, &x4, 1, &g), TB_OK);
    for (d = 0; d < sizeof devs / sizeof devs[0]; d++) {
        const char *name = plan_dev_names[devs[d]];
        char *text = program(devs[d], &g, 1, NULL);
        expect_text(text, " * 64, row0 = ", name);
        expect_text(text, "tb_krow[800] = {0, 1, 2, 3, 4, 28, ", name);
        expect_text(text, "col0 = colb < 720L ? colb : 720L;", name);
        expect_text(text, "+ tb_krow[i", name);
        expect_text(text, "tb_karow[800] = {0, -1, -2, -3, -4, -5, ", name);
        expect_text(text, " + tb_karow[i", name);
        free(text);
    }
    tb_tensor_release(g);
    tb_tensor_release(l);
    tb_tensor_release(y);
    tb_tensor_release(w4);
    tb_tensor_release(x4);
    tb_tensor_release(w);
    tb_tensor_release(x);
}

/* The weight gradient of a 3 x 3 convolution (padding 1, 16 -> 32 channels) of n images of
   hw x hw, and its forward in *y. */
static tb_tensor *weight_grad(int64_t n, int64_t hw, tb_tensor **y) {
    static const int64_t pad[2] = {1, 1};
    const int64_t xd[4] = {n, 16, hw, hw}, wd[4] = {32, 16, 3, 3};
    tb_tensor *x = plan_input(TB_F32, 3, n, 16, hw * hw), *w = plan_input(TB_F32, 3, 32, 16, 9);
    tb_tensor *x4 = tb_reshape(x, xd, 4), *w4 = tb_reshape(w, wd, 4), *l, *g = NULL;
    assert_int_equal(tb_set_requires_grad(w4, true), TB_OK);
    *y = tb_conv2d(x4, w4, NULL, NULL, pad, NULL, 1);
    l = tb_sum(*y, NULL, 0, false);
    assert_int_equal(tb_grad(l, NULL, &w4, 1, &g), TB_OK);
    tb_tensor_release(l);
    tb_tensor_release(w4);
    tb_tensor_release(x4);
    tb_tensor_release(w);
    tb_tensor_release(x);
    return g;
}

/* A convolution's weight gradient (dY [32, N P] times the windows of x, [N P, C 3 3]) packs
   B lane by lane: a panel's lanes are a window's 3 columns at a time, its rows an input row's
   pixels, so each lane's rows are read in runs along the input (divided once per run); runs
   of 56 (not 28) are split where the padding's left and right edges fall (the interior has no
   test of the column); the forward's B (lanes along an output row) keeps runs of lanes. Rows
   of 14 go lane by lane too (the tuning's pack_lane_rows, 8), rows of 7 run by run of lanes. */
static void test_pack_lane_by_lane(void **state) {
    tb_tensor *y, *y56, *y14, *y7;
    tb_tensor *g = weight_grad(4, 28, &y), *g56 = weight_grad(2, 56, &y56);
    tb_tensor *g14 = weight_grad(8, 14, &y14), *g7 = weight_grad(16, 7, &y7);
    int dev;
    (void)state;
    for (dev = DEV_AVX512; dev <= DEV_SSE; dev++) {
        expect_program(dev, g, "pk += pn;", "long plo = pr0, phi = pr0 + pn;");
        expect_program(dev, g56, "long plo = pr0, phi = pr0 + pn;", NULL);
        expect_program(dev, g56, " = plo; i", NULL); /* the interior's loop */
        expect_program(dev, y, "pj += pn;", "pk += pn;");
        expect_program(dev, g14, "pk += pn;", "long plo = pr0, phi = pr0 + pn;");
        expect_program(dev, g7, "pj += pn;", "pk += pn;");
    }
    tb_tensor_release(g7);
    tb_tensor_release(y7);
    tb_tensor_release(g14);
    tb_tensor_release(y14);
    tb_tensor_release(g56);
    tb_tensor_release(y56);
    tb_tensor_release(g);
    tb_tensor_release(y);
}

/* The weight gradient of a 3 x 3 convolution without padding (16 -> 32 channels, n images of
   h x w) of x + x (a buffer of its own), read with its last two dims exchanged where
   `swapped`. */
static tb_tensor *weight_grad_of_sum(int64_t n, int64_t h, int64_t w, bool swapped, tb_dtype dt) {
    const int64_t xd[4] = {n, 16, swapped ? w : h, swapped ? h : w}, wd[4] = {32, 16, 3, 3};
    tb_tensor *x = plan_input(dt, 3, n, 16, h * w), *k = plan_input(dt, 3, 32, 16, 9);
    tb_tensor *x4 = tb_reshape(x, xd, 4), *k4 = tb_reshape(k, wd, 4), *xt, *x2, *y, *l, *g = NULL;
    assert_non_null(x4);
    assert_non_null(k4);
    x2 = tb_add(x4, x4);
    xt = swapped ? tb_transpose(x2, 2, 3) : x2;
    assert_int_equal(tb_set_requires_grad(k4, true), TB_OK);
    y = tb_conv2d(xt, k4, NULL, NULL, NULL, NULL, 1);
    assert_non_null(y);
    l = tb_sum(y, NULL, 0, false);
    assert_int_equal(tb_grad(l, NULL, &k4, 1, &g), TB_OK);
    tb_tensor_release(l);
    tb_tensor_release(y);
    tb_tensor_release(x2);
    if (swapped) tb_tensor_release(xt);
    tb_tensor_release(k4);
    tb_tensor_release(x4);
    tb_tensor_release(k);
    tb_tensor_release(x);
    return g;
}

/* Where a weight gradient's B is a buffer read through views alone, a CPU device's pack reads
   each lane's run of rows as vectors and transposes blocks of lanes x lanes in registers: a
   shuffle of two vectors per lane at each of log2(lanes) stages (C99's TB_SHUF, OpenCL's
   shuffle2), a vector store per row. Rows of 54 in the matmul's own packing of B (per image):
   blocks of the class's lanes (16 with AVX-512, 8 with AVX2); in the C99 host's pack kernel
   (items of 8 rows) and for rows of 12 blocks of 8, where OpenCL C keeps lane by lane. Not with
   SSE's 4 lanes, not on the GPU (no packs), not for f64, nor where a row's pixels are not
   consecutive (x transposed) or the windows test the padding. */
static void test_pack_blocks(void **state) {
    tb_tensor *g54 = weight_grad_of_sum(2, 40, 56, false, TB_F32);
    tb_tensor *gpk = weight_grad_of_sum(2, 16, 56, false, TB_F32);
    tb_tensor *g12 = weight_grad_of_sum(2, 40, 14, false, TB_F32);
    tb_tensor *gt = weight_grad_of_sum(2, 56, 16, true, TB_F32);
    tb_tensor *g64 = weight_grad_of_sum(2, 16, 56, false, TB_F64), *yp,
              *gp = weight_grad(2, 56, &yp);
    int dev;
    (void)state;
    expect_program(DEV_C99, g54, "tb_src[pt] = b", NULL);
    expect_program(DEV_C99, g54, "TB_SHUF(tb_t0_0, tb_t0_1, int16, 0, 16, 2, 18, 4, 20, ", NULL);
    expect_program(DEV_C99, g54,
                   "TB_SHUF(tb_t3_7, tb_t3_15, int16, 8, 9, 10, 11, 12, 13, 14, 15, "
                   "24, 25, 26, 27, 28, 29, 30, 31)",
                   NULL);
    expect_program(DEV_C99, g54, "vstore16(tb_t4_15, 0, ", NULL);
    expect_program(DEV_AVX512, g54, "shuffle2(tb_t0_0, tb_t0_1, (uint16)(0, 16, 2, 18, ", NULL);
    expect_program(DEV_AVX2, g54, "shuffle2(tb_t0_0, tb_t0_1, (uint8)(0, 8, 2, 10, 4, 12, 6, 14))",
                   NULL);
    expect_program(DEV_AVX2, g54, "vstore8(tb_t3_7, 0, ", NULL);
    expect_program(DEV_C99, gpk, "void PB_", NULL);
    expect_program(DEV_C99, gpk, "if (pn >= 8L) ", NULL);
    expect_program(DEV_C99, g12, "if (pn >= 8L) ", NULL);
    expect_program(DEV_C99, g12, "TB_SHUF(tb_t0_0, tb_t0_1, int8, 0, 8, 2, 10, 4, 12, 6, 14)",
                   NULL);
    expect_program(DEV_AVX512, g12, "pk += pn;", "tb_src");
    for (dev = DEV_SSE; dev <= DEV_GPU; dev++)
        expect_program(dev, g54, "E_", "tb_src");
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        if (dev == DEV_GPU) continue;
        expect_program(dev, gt, "pk += pn;", "tb_src"); /* lane by lane */
        expect_program(dev, g64, "pk += pn;", "tb_src");
        expect_program(dev, gp, "long plo = pr0, phi = pr0 + pn;", "tb_src");
    }
    tb_tensor_release(gp);
    tb_tensor_release(yp);
    tb_tensor_release(g64);
    tb_tensor_release(gt);
    tb_tensor_release(g12);
    tb_tensor_release(gpk);
    tb_tensor_release(g54);
}

/* Whether a line of `text` reads a buffer at an address of what stays along the loop, indexed
   by the loop's variable times `step` ("= (b3 + (...))[i9 * 2];"), as tb__cg_read_slot writes
   it (PoCL's compiler vectorises that form of a strided run, not one sum). */
static bool reads_split(const char *text, const char *step) {
    const char *line = text;
    while (line != NULL && *line != '\0') {
        const char *end = strchr(line, '\n'), *at = strstr(line, "= (b"), *idx;
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        idx = at != NULL ? strstr(at, "))[i") : NULL;
        if (at != NULL && idx != NULL && idx < line + len && (size_t)(idx - line) + 4 < len) {
            const char *mul = strstr(idx, step);
            if (mul != NULL && mul < line + len && mul[strlen(step)] == ']') return true;
        }
        line = end != NULL ? end + 1 : NULL;
    }
    return false;
}

/* The windows of a 7 x 7 convolution at stride 2 (ResNet's first, its input padded before),
   trained: the matmul packs B from the input every second element along an output row. The
   pack's copy reads each run as the address of its start and the lane times 2, on every
   class and in C (where both parts are never negative: a padded read, whose index has a
   constant below 0, keeps one sum). */
static void test_pack_strided_run(void **state) {
    static const int64_t stride[2] = {2, 2};
    const int64_t xd[4] = {2, 3, 38, 38}, wd[4] = {16, 3, 7, 7};
    tb_tensor *x = plan_input(TB_F32, 3, 2, 3, 38 * 38), *w = plan_input(TB_F32, 3, 16, 3, 49);
    tb_tensor *x4 = tb_reshape(x, xd, 4), *w4 = tb_reshape(w, wd, 4), *y;
    int dev;
    (void)state;
    assert_int_equal(tb_set_requires_grad(w4, true), TB_OK);
    y = tb_conv2d(x4, w4, NULL, stride, NULL, NULL, 1);
    assert_non_null(y);
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        char *text = program(dev, &y, 1, NULL);
        if (dev != DEV_GPU && !reads_split(text, " * 2"))
            fail_msg("%s: no strided run read as address and index in:\n%s", plan_dev_names[dev],
                     text);
        free(text);
    }
    tb_tensor_release(y);
    tb_tensor_release(w4);
    tb_tensor_release(x4);
    tb_tensor_release(w);
    tb_tensor_release(x);
}

/* Selects on the data have no branch: an argmax over a few elements (a max pool's window, in
   its backward) is unrolled. In OpenCL C each step takes the best f32 value as a blend of bits
   (tb_sel_f32) and its index as a select; in the native backend's C the maximum comes first
   (TB_MAXS) and the index is selects that test each value against it, then for NaN, with no
   step's test waiting on the one before. A where of f32 values (dropout's mask, relu's
   gradient) is a blend too; f64 values stay selects. */
static void test_selects_blend(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 1024, 4, 0), *xd = plan_input(TB_F64, 2, 1024, 4, 0);
    tb_tensor *y = tb_argmax(x, 1, false), *yd = tb_argmax(xd, 1, false);
    tb_tensor *a = plan_input(TB_F32, 2, 1000, 14, 0), *ad = plan_input(TB_F64, 2, 1000, 14, 0);
    tb_tensor *m = plan_input(TB_BOOL, 2, 1000, 14, 0),
              *zero = tb_scalar_tensor(tb_scalar_f(TB_F32, 0.0), NULL);
    tb_tensor *zd = tb_scalar_tensor(tb_scalar_f(TB_F64, 0.0), NULL);
    tb_tensor *w = tb_where(m, a, zero), *wd = tb_where(m, ad, zd);
    int dev;
    (void)state;
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        if (dev == DEV_C99) {
            expect_program(dev, y, "= TB_MAXS(v", "const int tk = (");
            expect_program(dev, y, ") ? 2L : v", NULL);
            expect_program(dev, yd, "= TB_MAXS(v", "const int tk = (");
        } else {
            expect_program(dev, y, "= tb_sel_f32(tk, v", NULL);
            expect_program(dev, y, "= tk ? 3L : v", NULL);
            expect_program(dev, yd, "= tk ? v", "= tb_sel_f32(tk, v");
        }
        expect_program(dev, w, "tb_sel_f32(v", NULL);
        expect_program(dev, wd, " != 0 ? v", "tb_sel_f32(v");
    }
    tb_tensor_release(wd);
    tb_tensor_release(w);
    tb_tensor_release(zd);
    tb_tensor_release(zero);
    tb_tensor_release(m);
    tb_tensor_release(ad);
    tb_tensor_release(a);
    tb_tensor_release(yd);
    tb_tensor_release(y);
    tb_tensor_release(xd);
    tb_tensor_release(x);
}

/* A depthwise convolution's kernel (a row of W per work item, its 3x3 window padded by 1) in
   the native backend's C: the row loop splits into its two edges and an interior [1, 39) with
   no test of the padding along W, where the test along H is a clamp and a blend of bits (no
   branch: gcc vectorises the interior). OpenCL C keeps one loop with its tests (PoCL
   vectorises across work items, where the split form ran slower). */
static void test_pad_rows_split(void **state) {
    tb_tensor *x3 = plan_input(TB_F32, 3, 16, 16, 40), *w3 = plan_input(TB_F32, 3, 8, 3, 3);
    static const int64_t one[2] = {1, 1}, xd[4] = {2, 8, 16, 40}, wd[4] = {8, 1, 3, 3};
    tb_tensor *x = tb_reshape(x3, xd, 4), *w = tb_reshape(w3, wd, 4);
    tb_tensor *y = tb_conv2d(x, w, NULL, one, one, one, 8);
    char *text;
    int dev;
    (void)state;
    assert_non_null(y);
    text = program(DEV_C99, &y, 1, NULL);
    expect_text(text, "= 0; i", "C99 host");
    expect_text(text, "= 1L; i", "C99 host");
    expect_text(text, " < 39L; i", "C99 host");
    expect_text(text, "= 39L; i", "C99 host");
    expect_text(text, " < 40L; i", "C99 host");
    expect_text(text, "tb_sel_f32((int)i", "C99 host");
    free(text);
    for (dev = DEV_AVX512; dev < DEV_C99; dev++)
        expect_program(dev, y, "if ((i", "tb_sel_f32((int)i");
    tb_tensor_release(y);
    tb_tensor_release(w);
    tb_tensor_release(x);
    tb_tensor_release(w3);
    tb_tensor_release(x3);
}

/* A pad's test that an axis is inside x tells the index arithmetic under it that axis's range:
   exp(a + b[..., :5]) for a of [2, 3, 4, 5] through a view of [6, 20], padded before its
   second axis. Under the test the padded axis is a copy of its variable with the test's range,
   so the reads of a and b take the four dims without splitting the view's row (3 channels)
   back out by a division: no "/ 3L" or "% 3L" in the program of any device (the C host's
   clamps the axis instead of testing it). ResNet-18's pool gradient on PoCL computed 64-bit
   divisions per element so (25 -> 3 ms). */
static void test_pad_test_narrows_the_axis(void **state) {
    tb_tensor *a3 = plan_input(TB_F32, 3, 6, 4, 5), *b3 = plan_input(TB_F32, 3, 6, 4, 6);
    static const int64_t rows[2] = {6, 20}, dims[4] = {2, 3, 4, 5}, bd[4] = {2, 3, 4, 6};
    static const int64_t pads[8] = {0, 0, 0, 0, 1, 0, 0, 0};
    tb_tensor *a = tb_reshape(a3, dims, 4), *b = tb_reshape(b3, bd, 4);
    tb_tensor *s = tb_slice(b, 3, 0, 5, 1), *q = tb_add(a, s), *r = tb_reshape(q, rows, 2);
    tb_tensor *e = tb_exp(r), *r2 = tb_reshape(e, dims, 4), *y = tb_pad(r2, pads, 8, 0.0);
    int dev;
    (void)state;
    assert_non_null(y);
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        char *text = program(dev, &y, 1, NULL);
        if (dev != DEV_C99) expect_text(text, "if ((i", plan_dev_names[dev]); /* C: clamped */
        if (strstr(text, "/ 3L") != NULL || strstr(text, "% 3L") != NULL)
            fail_msg("%s: the padded read divides by the channels:\n%s", plan_dev_names[dev], text);
        free(text);
    }
    tb_tensor_release(y);
    tb_tensor_release(r2);
    tb_tensor_release(e);
    tb_tensor_release(r);
    tb_tensor_release(q);
    tb_tensor_release(s);
    tb_tensor_release(b);
    tb_tensor_release(a);
    tb_tensor_release(b3);
    tb_tensor_release(a3);
}

/* The input gradient of a 3 x 3 max-pool at stride 2, padded by 1 (ResNet's), folded by phases,
   in the native backend's C: its rows of 40 run in 20 pairs, each pair's two elements stored
   side by side. In pairs the fold's division of the column by 2 is a constant of each element,
   so no index along the row is divided (the padded row's 21 phases: no "% 21L"), and the
   edges split from an interior as for a padding. The phase of the row (even rows read other
   windows than odd ones: a concat of the two along the rows) is tested once a row, before its
   loops, for every CPU: no loop holds that test. */
static void test_pool_grad_rows_in_pairs(void **state) {
    tb_tensor *x3 = plan_input(TB_F32, 3, 16, 16, 40), *x, *y, *s, *gx = NULL;
    static const int64_t xd[4] = {2, 8, 16, 40}, k3[2] = {3, 3}, s2[2] = {2, 2}, p1[2] = {1, 1};
    char *text;
    int dev;
    (void)state;
    assert_int_equal(tb_set_requires_grad(x3, true), TB_OK);
    x = tb_reshape(x3, xd, 4);
    y = tb_max_pool2d(x, k3, s2, p1, NULL, false);
    s = tb_sum(y, NULL, 0, false);
    assert_non_null(s);
    assert_int_equal(tb_grad(s, NULL, &x3, 1, &gx), TB_OK);
    text = program(DEV_C99, &gx, 1, NULL);
    expect_text(text, " * 2L + 1L] = ", "C99 host");
    expect_text(text, " < 20L; i", "C99 host");
    if (strstr(text, "% 21L") != NULL) fail_msg("a division along the row in:\n%s", text);
    free(text);
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        const char *kernel, *case_test, *loop;
        if (dev == DEV_GPU) continue; /* an item per element there: no loop along the row */
        text = program(dev, &gx, 1, NULL);
        kernel = strstr(text, "E_10240"); /* the gradient's kernel (the argmax's is E_2560) */
        case_test = kernel ? strstr(kernel, " = (((i0 % 16L) + 1L) % 2L);") : NULL;
        loop = kernel ? strstr(kernel, "for (long i") : NULL;
        if (case_test == NULL || loop == NULL || loop < case_test ||
            strstr(text, ") < 1L) ") != NULL)
            fail_msg("%s: the row's phase is not tested once before its loops in:\n%s",
                     plan_dev_names[dev], text);
        free(text);
    }
    tb_tensor_release(gx);
    tb_tensor_release(s);
    tb_tensor_release(y);
    tb_tensor_release(x);
    tb_tensor_release(x3);
}

/* The C entry point of a pack kernel that visits its items panel by panel at each block of
   rows (tb__plan_kernel.panels_first), after the kernel named `name` in `text`: 1 yes, 0 block
   by block, -1 no such kernel. */
static int pack_panels_first(const char *text, const char *name) {
    const char *at = strstr(text, name), *item;
    const size_t head = strlen("TB_EXPORT void ");
    while (at != NULL &&
           ((size_t)(at - text) < head || strncmp(at - head, "TB_EXPORT void ", head) != 0))
        at = strstr(at + 1, name);
    if (at == NULL) return -1;
    item = strstr(at, "_item(");
    return item != NULL && strncmp(item, "_item(tb_w / ", strlen("_item(tb_w / ")) == 0;
}

/* The OpenCL pack kernel named `name` in `text` and its plan: 1 where its work-groups take the
   panels along dim 0 (get_global_id(0), and as many groups along dim 0 as the name's panels:
   PA_<panels>_<K>_<width>), 0 where they take the rows along dim 0, -1 for neither. */
static int pack_panels_dim0(const char *text, const tb__plan *p, const char *name) {
    const char *at = strstr(text, name), *id;
    long panels = 0;
    size_t i;
    if (at == NULL || sscanf(at + 3, "%ld", &panels) != 1) return -1;
    id = strstr(at, "const long pk0 = (long)get_global_id(");
    if (id == NULL) return -1;
    id += strlen("const long pk0 = (long)get_global_id(");
    for (i = 0; i < p->num_kernels; i++) {
        const tb__plan_kernel *k = &p->kernels[i];
        if (k->kind != TB__K_PACK_A || strncmp(k->name, at, strlen(k->name)) != 0) continue;
        if (*id == '1' && k->groups[0] == (size_t)panels && k->groups[1] > 1) return 1;
        if (*id == '0' && k->groups[1] == (size_t)panels) return 0;
    }
    return -1;
}

/* A 3 x 3 convolution's input gradient packs the weight read transposed, A[ci, (co, kh, kw)]:
   a block of rows reads a few values of each co, so the C entry point takes the panels in turn
   at each block (reading on along ci), and an OpenCL CPU device's kernel, whose work-groups
   are one item each and run in the order of dim 0, takes the panels along dim 0; the forward's
   pack of the weight, rows in order, goes block by block on both. */
static void test_pack_panels_first(void **state) {
    tb_tensor *x3 = plan_input(TB_F32, 3, 2 * 64, 14, 14), *w3 = plan_input(TB_F32, 3, 64, 64, 9);
    static const int64_t xd[4] = {2, 64, 14, 14}, wd[4] = {64, 64, 3, 3}, p1[2] = {1, 1};
    tb_tensor *x, *w = tb_reshape(w3, wd, 4), *y, *s, *gx = NULL;
    tb__plan *p = NULL;
    char *text;
    (void)state;
    assert_int_equal(tb_set_requires_grad(x3, true), TB_OK);
    x = tb_reshape(x3, xd, 4);
    y = tb_conv2d(x, w, NULL, NULL, p1, NULL, 1);
    s = tb_sum(y, NULL, 0, false);
    assert_non_null(s);
    assert_int_equal(tb_grad(s, NULL, &x3, 1, &gx), TB_OK);
    text = program(DEV_C99, &gx, 1, NULL);
    if (pack_panels_first(text, "PA_") != 1)
        fail_msg("the weight's pack goes block by block in:\n%s", text);
    free(text);
    text = program(DEV_AVX512, &gx, 1, &p);
    if (pack_panels_dim0(text, p, "PA_") != 1)
        fail_msg("AVX-512: the weight's pack takes rows along dim 0 in:\n%s", text);
    tb__plan_free(p);
    free(text);
    text = program(DEV_C99, &y, 1, NULL);
    if (pack_panels_first(text, "PA_") != 0)
        fail_msg("the forward's pack of the weight goes panel by panel in:\n%s", text);
    free(text);
    text = program(DEV_AVX512, &y, 1, &p);
    if (pack_panels_dim0(text, p, "PA_") != 0)
        fail_msg("AVX-512: the forward's pack of the weight goes panel by panel in:\n%s", text);
    tb__plan_free(p);
    free(text);
    tb_tensor_release(gx);
    tb_tensor_release(s);
    tb_tensor_release(y);
    tb_tensor_release(w);
    tb_tensor_release(x);
    tb_tensor_release(w3);
    tb_tensor_release(x3);
}

/* A sum per channel over N, H and W of [N, C, H, W] (a bias's gradient) loops over each
   image's H x W run in order, with no division per element; a sum over the trailing axes reads
   rows; a sum over N alone (a strided run) keeps the flat loop. */
static void test_reduction_loops(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 64 * 16, 28 * 28, 0), *x4, *per_channel, *rows, *over_n;
    int64_t dims[4] = {64, 16, 28, 28};
    int32_t nhw[3] = {0, 2, 3}, hw[2] = {2, 3}, n0 = 0;
    int dev;
    (void)state;
    x4 = tb_reshape(x, dims, 4);
    per_channel = tb_sum(x4, nhw, 3, false);
    rows = tb_sum(x4, hw, 2, false);
    over_n = tb_sum(x4, &n0, 1, false);
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        char *text = program(dev, &per_channel, 1, NULL);
        if (dev == DEV_GPU) {
            assert_null(strstr(text, "const long jm = js + "));
        } else {
            expect_text(text, "const long jm = js + ", plan_dev_names[dev]);
            expect_text(text, " < re; i", plan_dev_names[dev]);
            assert_null(strstr(text, " / 28L"));
        }
        free(text);
        text = program(dev, &rows, 1, NULL);
        assert_null(strstr(text, "const long jm = js + "));
        free(text);
        text = program(dev, &over_n, 1, NULL);
        assert_null(strstr(text, "const long jm = js + "));
        free(text);
    }
    tb_tensor_release(over_n);
    tb_tensor_release(rows);
    tb_tensor_release(per_channel);
    tb_tensor_release(x4);
    tb_tensor_release(x);
}

/* A reduction over the trailing axes of a view that unravels its flat index (a slice of the
   last axis: a convolution's output over whole padded rows) takes the view's last axis as an
   inner loop, so that no element divides its index (the whole of it, split into chunks, and a
   row of it per output); a sum of the tensor itself (no view) keeps the flat loop. */
static void test_reduction_through_view(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 128 * 8 * 36, 28, 0), *x4, *v, *vv, *all, *rows, *dense;
    int64_t dims[4] = {128, 8, 36, 28};
    int32_t trailing[3] = {1, 2, 3};
    int dev;
    (void)state;
    x4 = tb_reshape(x, dims, 4);
    v = tb_slice(x4, 3, 2, 26, 1);
    vv = tb_mul(v, v);
    all = tb_sum(vv, NULL, 0, false);
    rows = tb_max(vv, trailing, 3, true);
    dense = tb_sum(x4, NULL, 0, false);
    assert_non_null(all);
    assert_non_null(rows);
    assert_non_null(dense);
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        char *text;
        if (dev == DEV_GPU) continue; /* a work-group per row: its items stride the row */
        expect_program(dev, all, "const long jm = js + ", "% 24L");
        expect_program(dev, rows, "const long jm = js + ", "% 24L");
        text = program(dev, &dense, 1, NULL);
        assert_null(strstr(text, "const long jm = js + "));
        free(text);
    }
    tb_tensor_release(dense);
    tb_tensor_release(rows);
    tb_tensor_release(all);
    tb_tensor_release(vv);
    tb_tensor_release(v);
    tb_tensor_release(x4);
    tb_tensor_release(x);
}

/* A sum over the leading axes that keeps the last one (a bias's gradient: [768, 128] over
   its rows, [12, 64, 128] over its first two axes) is columns of vectors on CPU devices: a work
   item per 16 outputs, accumulators of whole vectors along the rows, one vector store; a GPU
   keeps an item per output, and so does a last axis 16 does not divide or a sum over an axis
   between kept ones. */
static void test_reduction_columns(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 768, 128, 0), *x3, *part, *x4, *cols, *cols3, *odd, *mid;
    int64_t d3[3] = {12, 64, 128}, d4[3] = {8, 96, 100};
    int32_t lead[2] = {0, 1}, one = 1;
    int dev;
    (void)state;
    x3 = tb_reshape(x, d3, 3);
    part = tb_slice(x, 0, 0, 600, 1);
    x4 = tb_reshape(part, d4, 3);
    cols = tb_sum(x, lead, 1, false);
    cols3 = tb_mean(x3, lead, 2, false);
    odd = tb_sum(x4, lead, 2, false);
    mid = tb_sum(x3, &one, 1, false);
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        tb_tensor *const roots[2] = {cols, cols3};
        tb__plan *p = NULL;
        char *text = program(dev, roots, 2, &p);
        size_t i, col = 0;
        for (i = 0; i < p->num_kernels; i++)
            if (p->kernels[i].col_vec > 0) col++;
        if (dev == DEV_GPU) {
            assert_int_equal(col, 0);
            assert_null(strstr(text, "accv0 += v"));
        } else {
            if (col != 2) fail_msg("%s: %zu column kernels, not 2", plan_dev_names[dev], col);
            expect_text(text, "accv0 += v", plan_dev_names[dev]);
            expect_text(text, "accv3 += v", plan_dev_names[dev]);    /* four accumulators */
            expect_text(text, " * 128 + 384)", plan_dev_names[dev]); /* the fourth's row */
        }
        tb__plan_free(p);
        free(text);
        text = program(dev, &odd, 1, &p);
        assert_int_equal(p->kernels[p->num_kernels - 1].col_vec, 0);
        tb__plan_free(p);
        free(text);
        text = program(dev, &mid, 1, &p);
        assert_int_equal(p->kernels[p->num_kernels - 1].col_vec, 0);
        tb__plan_free(p);
        free(text);
    }
    tb_tensor_release(mid);
    tb_tensor_release(odd);
    tb_tensor_release(cols3);
    tb_tensor_release(cols);
    tb_tensor_release(x4);
    tb_tensor_release(part);
    tb_tensor_release(x3);
    tb_tensor_release(x);
}

/* ---- the op table's templates ---- */

typedef tb_tensor *(*unary_fn)(tb_tensor *);

#define MATH_FN(ID, name, ints, REF, CODE, CODE_F32, VEC, GRAD) {#name, tb_##name},
static const struct {
    const char *name;
    unary_fn fn;
} g_math[] = {TB__MATH_OPS(MATH_FN)};
#undef MATH_FN

/* Every math op of src/graph/ops_table.h in f32, f64, f16 and bf16, alone and with its
   gradient, in each dialect: a program with no template text left in it ('$'). */
static void test_every_math_op_renders(void **state) {
    static const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_F16, TB_BF16};
    static const int devs[] = {DEV_AVX512, DEV_GPU, DEV_C99};
    size_t o, d, v;
    (void)state;
    for (o = 0; o < sizeof g_math / sizeof g_math[0]; o++) {
        for (d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
            tb_tensor *x = plan_input(dtypes[d], 2, 8, 24, 0), *y = g_math[o].fn(x), *roots[2];
            tb_tensor *g = NULL;
            assert_non_null(y);
            roots[0] = y;
            /* x * dy/dx through the op's gradient rule (f32 for integer-free rules) */
            if (tb_grad(y, x, &x, 1, &g) != TB_OK)
                fail_msg("%s in %s: %s", g_math[o].name, tb_dtype_name(dtypes[d]), tb_last_error());
            assert_non_null(g);
            roots[1] = g;
            for (v = 0; v < sizeof devs / sizeof devs[0]; v++) {
                char *text = program(devs[v], roots, 2, NULL);
                if (strchr(text, '$') != NULL)
                    fail_msg("%s in %s on %s: a template was left unfilled near \"%.60s\"",
                             g_math[o].name, tb_dtype_name(dtypes[d]), plan_dev_names[devs[v]],
                             strchr(text, '$'));
                free(text);
            }
            tb_tensor_release(g);
            tb_tensor_release(y);
            tb_tensor_release(x);
        }
    }
}

/* ---- errors ---- */

/* A graph that can fail at run time (an index out of range) needs a dialect that can claim
   the error report; one without is an internal error, not a program that hides the failure. */
static void test_error_report_needs_the_dialect(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 5, 3, 0), *idx = plan_input(TB_I64, 1, 4, 0, 0);
    tb_tensor *y = tb_index_select(x, 0, idx);
    plan_target t;
    tb__plan *p = NULL;
    char *text = NULL;
    (void)state;
    text = program(DEV_AVX512, &y, 1, NULL);
    expect_text(text, "tb_report(", "AVX-512");
    free(text);
    plan_target_of(&t, DEV_AVX512);
    t.dialect.err_claim = NULL;
    assert_int_equal(program_of(&t, &y, 1, &p, &text), TB_ERR_INTERNAL);
    assert_non_null(strstr(tb_last_error(), "cannot report errors"));
    assert_null(text);
    tb__plan_free(p);
    tb_clear_error();
    tb_tensor_release(y);
    tb_tensor_release(idx);
    tb_tensor_release(x);
}

/* ---- the same text every time; memory running out ---- */

/* Renders the plan of `roots` for `dev` with each of its allocations failing in turn:
   TB_ERR_OUT_OF_MEMORY and no text each time (the sanitizers' leak check holds the rest),
   until it is `want`. */
static void render_out_of_memory(int dev, tb_tensor *const *roots, size_t n, const char *want) {
    plan_graph pg;
    plan_target t;
    long at;
    plan_target_of(&t, dev);
    plan_graph_of(&pg, roots, n);
    for (at = 1;; at++) {
        tb__pgraph G;
        tb__plan *p = NULL;
        char *out = NULL;
        size_t len = 0;
        tb_status st;
        assert_int_equal(tb__plan_build(&pg.g, &t.target, &G, &p), TB_OK);
        g_count = 0;
        g_failed = false;
        g_fail_at = at;
        st = tb__cg_render(&G, p, &t.dialect, &out, &len);
        g_fail_at = 0;
        tb__pgraph_free(&G);
        tb__plan_free(p);
        if (!g_failed) {
            assert_int_equal(st, TB_OK);
            assert_int_equal(len, strlen(want));
            assert_memory_equal(out, want, len);
            tb__free(out);
            break;
        }
        if (st != TB_ERR_OUT_OF_MEMORY)
            fail_msg("%s: allocation %ld failed: status %d", plan_dev_names[dev], at, (int)st);
        assert_null(out);
        tb_clear_error();
    }
    assert_true(at > 10);
    plan_graph_free(&pg);
}

/* Three graphs that between them make every kind of kernel (a layer: matmul, bias, gelu,
   softmax over rows; a packed matmul and a split sum; a concat of 40 arrays, an index_select
   that can fail, a max over columns), each rendered twice for each device: the same program.
   Then the same with every allocation failing in turn. */
static void test_repeatable_and_out_of_memory(void **state) {
    static const int devs[] = {DEV_AVX512, DEV_GPU, DEV_C99};
    tb_tensor *x = plan_input(TB_F32, 2, 64, 96, 0), *w = plan_input(TB_F32, 2, 96, 96, 0);
    tb_tensor *bias = plan_input(TB_F32, 1, 96, 0, 0), *big = plan_input(TB_F32, 2, 512, 512, 0);
    tb_tensor *idx = plan_input(TB_I64, 1, 7, 0, 0), *in[40], *keep[8], *roots[3][2];
    size_t counts[3] = {1, 2, 2}, c, v, i, nk = 0;
    int32_t axis0 = 0;
    (void)state;
    for (i = 0; i < 40; i++)
        in[i] = plan_input(TB_F32, 2, 16, 3, 0);
    keep[nk++] = tb_matmul(x, w);
    keep[nk++] = tb_add(keep[0], bias);
    keep[nk++] = tb_gelu(keep[1]);
    roots[0][0] = tb_softmax(keep[2], 1);
    roots[1][0] = tb_matmul(big, big);
    roots[1][1] = tb_sum(big, NULL, 0, false);
    keep[nk++] = tb_concat(in, 40, 1);
    roots[2][0] = tb_index_select(keep[3], 0, idx);
    roots[2][1] = tb_max(keep[3], &axis0, 1, false);
    for (c = 0; c < 3; c++) {
        for (v = 0; v < sizeof devs / sizeof devs[0]; v++) {
            char *want = program(devs[v], roots[c], counts[c], NULL);
            char *again = program(devs[v], roots[c], counts[c], NULL);
            assert_string_equal(want, again);
            free(again);
            render_out_of_memory(devs[v], roots[c], counts[c], want);
            free(want);
        }
    }
    for (c = 0; c < 3; c++)
        for (i = 0; i < counts[c]; i++)
            tb_tensor_release(roots[c][i]);
    for (i = 0; i < nk; i++)
        tb_tensor_release(keep[i]);
    for (i = 0; i < 40; i++)
        tb_tensor_release(in[i]);
    tb_tensor_release(idx);
    tb_tensor_release(big);
    tb_tensor_release(bias);
    tb_tensor_release(w);
    tb_tensor_release(x);
}

/* The vector width of an OpenCL CPU device is that of the code its driver compiles, where the
   device version names the target CPU (PoCL's "HSTR: ..."): an AVX-512 host whose PoCL uses
   its AVX2 kernel library (POCL_KERNELLIB_NAME=avx2) reports 16 lanes, and its kernels get 8.
   A name is matched whole after a '-' ("skylake-avx512" is not "skylake", "xpenryn" is not
   "penryn"); a name the table lacks and a version without the string give 0 (the width query
   stands). PoCL's SSE2 kernel library names athlon64. */
static void test_opencl_target_lanes(void **state) {
    static const struct {
        const char *version;
        uint32_t lanes;
    } cases[] = {
        {"OpenCL 3.0 PoCL HSTR: pthread-x86_64-pc-linux-gnu-haswell", 8},
        {"OpenCL 3.0 PoCL HSTR: pthread-x86_64-pc-linux-gnu-skylake-avx512", 16},
        {"OpenCL 3.0 PoCL HSTR: pthread-x86_64-pc-linux-gnu-skylake", 8},
        {"OpenCL 3.0 PoCL HSTR: cpu-x86_64-pc-linux-gnu-znver3", 8},
        {"OpenCL 3.0 PoCL HSTR: pthread-x86_64-pc-linux-gnu-penryn", 4},
        {"OpenCL 3.0 PoCL HSTR: pthread-x86_64-pc-linux-gnu-athlon64", 4},
        {"OpenCL 3.0 PoCL HSTR: pthread-x86_64-pc-linux-gnu-x86-64-v3", 8},
        {"OpenCL 3.0 PoCL HSTR: pthread-x86_64-pc-linux-gnu-x86-64", 4},
        {"OpenCL 3.0 PoCL HSTR: pthread-x86_64-pc-linux-gnu-znver3 extra", 8},
        {"OpenCL 3.0 PoCL HSTR: pthread-x86_64-pc-linux-gnu-xpenryn", 0},
        {"OpenCL 3.0 PoCL HSTR: pthread-aarch64-linux-gnu-cortex-a72", 0},
        {"OpenCL 3.0 PoCL HSTR: haswell", 0},
        {"OpenCL 3.0 CUDA", 0},
        {"", 0},
        {NULL, 0},
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (tb__ocl_target_lanes(cases[i].version) != cases[i].lanes)
            fail_msg("\"%s\": %u lanes, not %u",
                     cases[i].version != NULL ? cases[i].version : "(null)",
                     (unsigned)tb__ocl_target_lanes(cases[i].version), (unsigned)cases[i].lanes);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dialects),
        cmocka_unit_test(test_repeated_kernel_is_one_function),
        cmocka_unit_test(test_hoisted_reduction_loops),
        cmocka_unit_test(test_packed_matmul_fused_products),
        cmocka_unit_test(test_packed_matmul_prefetches_a),
        cmocka_unit_test(test_conv_matmul_prefetches_b),
        cmocka_unit_test(test_register_matmul_tables),
        cmocka_unit_test(test_register_matmul_vectors),
        cmocka_unit_test(test_register_matmul_rows),
        cmocka_unit_test(test_pack_lane_by_lane),
        cmocka_unit_test(test_pack_blocks),
        cmocka_unit_test(test_pack_strided_run),
        cmocka_unit_test(test_selects_blend),
        cmocka_unit_test(test_pad_rows_split),
        cmocka_unit_test(test_pad_test_narrows_the_axis),
        cmocka_unit_test(test_pool_grad_rows_in_pairs),
        cmocka_unit_test(test_pack_panels_first),
        cmocka_unit_test(test_reduction_through_view),
        cmocka_unit_test(test_reduction_loops),
        cmocka_unit_test(test_reduction_columns),
        cmocka_unit_test(test_every_math_op_renders),
        cmocka_unit_test(test_error_report_needs_the_dialect),
        cmocka_unit_test(test_repeatable_and_out_of_memory),
        cmocka_unit_test(test_opencl_target_lanes),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
