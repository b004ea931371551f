/* The planner (src/compile/planner.c, planner_layout.c) on its own: graphs of lazy tensors
   planned for described devices (AVX-512, AVX2 and SSE CPUs, a GPU, the C99 host), without a
   device or a compiler. What a plan must be: the kernels of each fusion, a vector per row of
   the class's width, split reductions with matching stages, the matmul form of each class and
   register blocks that fit its registers, kernels cut to the code budget and to the arguments a
   device takes, the same plan every time, and an error (no leak) when memory runs out. The
   values of these kernels are the compiled-backend suite's (tests/backend_suite). */
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

static const int g_cpus[] = {DEV_AVX512, DEV_AVX2, DEV_SSE};

/* the plan of one root for `dev` */
static tb__plan *plan1(int dev, tb_tensor *root) {
    plan_target t;
    tb__plan *p = NULL;
    plan_target_of(&t, dev);
    if (plan_of(&t, &root, 1, &p) != TB_OK)
        fail_msg("%s: %s", plan_dev_names[dev], tb_last_error());
    return p;
}

static size_t count_kind(const tb__plan *p, int32_t kind) {
    size_t i, n = 0;
    for (i = 0; i < p->num_kernels; i++)
        n += p->kernels[i].kind == kind && !p->kernels[i].empty;
    return n;
}

static const tb__plan_kernel *kernel_of_kind(const tb__plan *p, int32_t kind) {
    size_t i;
    for (i = 0; i < p->num_kernels; i++)
        if (p->kernels[i].kind == kind) return &p->kernels[i];
    fail_msg("the plan has no kernel of kind %d", (int)kind);
    return NULL;
}

/* ---- fusion ---- */

/* An elementwise chain is one kernel; on a CPU its rows go in vectors of the class's width
   (f32 lanes: 16, 8, 4), on a GPU a work item per element. Every computed node maps to it. */
static void test_elementwise_chain_is_one_kernel(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 64, 48, 0);
    tb_tensor *a = tb_mul_scalar(x, 2.0), *b = tb_add_scalar(a, 1.0), *y = tb_exp(b);
    int dev;
    (void)state;
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        tb__plan *p = plan1(dev, y);
        const tb__plan_kernel *k = &p->kernels[0];
        size_t i, computed;
        assert_int_equal(p->num_kernels, 1);
        assert_int_equal(k->kind, TB__K_ELEMENTWISE);
        assert_int_equal(p->num_params, 3); /* x and the two scalars */
        assert_int_equal(p->num_results, 1);
        if (dev == DEV_GPU) {
            assert_int_equal(k->vec, 0);
            assert_int_equal(k->items, 64 * 48);
        } else {
            int32_t lanes = dev == DEV_AVX2 ? 8 : (dev == DEV_SSE ? 4 : 16);
            assert_int_equal(k->vec, lanes);
            assert_int_equal(k->items, 64 * 48 / lanes);
        }
        /* the parameters map to no kernel, the three ops to this one */
        assert_int_equal(p->num_nodes, 6);
        for (i = 0, computed = 0; i < p->num_nodes; i++) {
            assert_true(p->node_kernel[i] == -1 || p->node_kernel[i] == 0);
            computed += p->node_kernel[i] == 0;
        }
        assert_int_equal(computed, 3);
        tb__plan_free(p);
    }
    tb_tensor_release(y);
    tb_tensor_release(b);
    tb_tensor_release(a);
    tb_tensor_release(x);
}

/* A sum over rows with an exp before it and a scale after it is one reduction kernel: on a
   CPU a work item per row (independent accumulators), on a GPU a work-group per row. */
static void test_reduction_takes_prologue_and_epilogue(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 64, 48, 0);
    int32_t axis = 1;
    tb_tensor *e = tb_exp(x), *s = tb_sum(e, &axis, 1, false), *y = tb_mul_scalar(s, 2.0);
    int dev;
    (void)state;
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        tb__plan *p = plan1(dev, y);
        const tb__plan_kernel *k = &p->kernels[0];
        assert_int_equal(p->num_kernels, 1);
        assert_int_equal(k->kind, TB__K_REDUCE);
        assert_true(k->suffix);
        if (dev == DEV_GPU) {
            assert_true(k->group > 1);
        } else {
            assert_int_equal(k->group, 1);
            assert_int_equal(k->items, 64);
            assert_true(k->lanes >= 1);
        }
        tb__plan_free(p);
    }
    tb_tensor_release(y);
    tb_tensor_release(s);
    tb_tensor_release(e);
    tb_tensor_release(x);
}

/* A sum of millions of elements into one is split: a stage of partial sums over chunks, and a
   final stage over them, both with the same chunk count, the final one reading the partials. */
static void test_large_reduction_is_split(void **state) {
    tb_tensor *x = plan_input(TB_F32, 1, (int64_t)1 << 22, 0, 0);
    int32_t axis = 0;
    tb_tensor *y = tb_sum(x, &axis, 1, false);
    int dev;
    (void)state;
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        tb__plan *p = plan1(dev, y);
        const tb__plan_kernel *part = kernel_of_kind(p, TB__K_PARTIAL);
        const tb__plan_kernel *fin = kernel_of_kind(p, TB__K_REDUCE);
        assert_int_equal(p->num_kernels, 2);
        assert_true(part->split > 1);
        assert_int_equal(part->split, fin->split);
        assert_int_equal(fin->partial_slot, part->out_slot);
        assert_true(part < fin); /* the partials are made first */
        tb__plan_free(p);
    }
    tb_tensor_release(y);
    tb_tensor_release(x);
}

/* The row maxima of a chain, each over the last one's result plus a row of x (r = max(r + x),
   from r = min(x)): one kernel, which computes the reductions it reads at the start of each of
   its rows (hoisted), at most 128 of them a kernel (a chain of 200: two kernels). A sum whose
   long row is split into stages keeps the reduction it reads in a kernel of its own. */
static tb_tensor *max_chain(tb_tensor *x, int steps) {
    int32_t axis = 1;
    tb_tensor *r = tb_min(x, &axis, 1, true), *t, *u;
    int i;
    for (i = 0; i < steps; i++) {
        t = tb_add(r, x);
        u = tb_max(t, &axis, 1, true);
        tb_tensor_release(t);
        tb_tensor_release(r);
        r = u;
    }
    return r;
}

static void test_row_reductions_hoisted(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 8, 32, 0), *small = plan_input(TB_F32, 2, 1, 1000, 0);
    tb_tensor *big = plan_input(TB_F32, 2, 1, (int64_t)1 << 20, 0);
    tb_tensor *c100 = max_chain(x, 100), *c200 = max_chain(x, 200), *m, *d, *s;
    int32_t axis = 1;
    int dev;
    size_t i;
    (void)state;
    m = tb_max(small, &axis, 1, true);
    d = tb_sub(big, m);
    s = tb_sum(d, &axis, 1, true);
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        tb__plan *p = plan1(dev, c100);
        assert_int_equal(p->num_kernels, 1);
        assert_int_equal(p->kernels[0].kind, TB__K_REDUCE);
        assert_int_equal(p->kernels[0].hoists, 100);
        assert_int_equal(p->kernels[0].split, 0);
        assert_int_equal(p->kernels[0].col_vec, 0);
        tb__plan_free(p);
        p = plan1(dev, c200);
        assert_int_equal(p->num_kernels, 2);
        assert_int_equal(p->kernels[0].hoists, 71);
        assert_int_equal(p->kernels[1].hoists, 128);
        tb__plan_free(p);
        p = plan1(dev, s);
        assert_int_equal(count_kind(p, TB__K_PARTIAL), 1);
        for (i = 0; i < p->num_kernels; i++)
            assert_int_equal(p->kernels[i].hoists, 0);
        tb__plan_free(p);
    }
    tb_tensor_release(s);
    tb_tensor_release(d);
    tb_tensor_release(m);
    tb_tensor_release(c200);
    tb_tensor_release(c100);
    tb_tensor_release(big);
    tb_tensor_release(small);
    tb_tensor_release(x);
}

/* ---- matmul ---- */

/* A small matmul is one kernel of register blocks with its epilogue; a large one on a CPU is
   packed (the panels of B made by a kernel of their own, A read in place or packed), and its
   register block fits the class's registers: rm rows of rn / lanes accumulators, rn / lanes
   vectors of B and a broadcast of A. A GPU multiplies in tiles of work-group memory. */
static void test_matmul_forms(void **state) {
    tb_tensor *a = plan_input(TB_F32, 2, 64, 48, 0), *w = plan_input(TB_F32, 2, 48, 32, 0);
    tb_tensor *big = plan_input(TB_F32, 2, 512, 512, 0), *big2 = plan_input(TB_F32, 2, 512, 512, 0);
    tb_tensor *mm = tb_matmul(a, w), *small = tb_relu(mm), *large = tb_matmul(big, big2);
    size_t c;
    (void)state;
    for (c = 0; c < sizeof g_cpus / sizeof g_cpus[0]; c++) {
        int dev = g_cpus[c];
        tb_kit_facts f = plan_facts(dev);
        int32_t lanes = (int32_t)f.vector_bytes / 4, vectors;
        tb__plan *p = plan1(dev, small);
        assert_int_equal(p->num_kernels, 1);
        assert_int_equal(p->kernels[0].kind, TB__K_MATMUL);
        assert_int_equal(p->kernels[0].mm, TB__MM_REGISTERS);
        tb__plan_free(p);
        p = plan1(dev, large);
        assert_int_equal(count_kind(p, TB__K_MATMUL), 1);
        assert_int_equal(count_kind(p, TB__K_PACK_B), 1);
        {
            const tb__plan_kernel *k = kernel_of_kind(p, TB__K_MATMUL);
            assert_int_equal(k->mm, TB__MM_PACKED);
            assert_int_equal(k->rn % lanes, 0);
            vectors = k->rm * (k->rn / lanes) + k->rn / lanes + 1;
            if (vectors > (int32_t)f.vector_registers)
                fail_msg("%s: a %d x %d block needs %d vector registers, the class has %u",
                         plan_dev_names[dev], (int)k->rm, (int)k->rn, (int)vectors,
                         (unsigned)f.vector_registers);
            /* and uses most of them: a block half the registers leaves speed behind */
            assert_true(2 * vectors > (int32_t)f.vector_registers);
        }
        tb__plan_free(p);
    }
    {
        tb__plan *p = plan1(DEV_GPU, large);
        assert_int_equal(p->num_kernels, 1);
        assert_int_equal(p->kernels[0].mm, TB__MM_TILES);
        assert_true(p->kernels[0].tk > 0);
        tb__plan_free(p);
    }
    tb_tensor_release(large);
    tb_tensor_release(small);
    tb_tensor_release(mm);
    tb_tensor_release(big2);
    tb_tensor_release(big);
    tb_tensor_release(w);
    tb_tensor_release(a);
}

/* The packed f32 matmul's two register blocks where 16 registers hold 32-byte vectors, the CPU
   has FMA and the kernels are C (the native backend's host): rows of 6 by two vectors of B (6 x
   16) or rows of 4 by three (4 x 24), whichever pads the M x N output less, the wide one on a
   tie. A ResNet-like layer's 64 x 576 (M by N) takes 4 x 24 (6 x 16 pads to 66 rows); 96 x 512
   takes 6 x 16 (4 x 24 pads to 528 columns). Without FMA (a product's register the 17th), in
   f64 (its products never fused), with SSE's 16-byte vectors (no FMA), with AVX-512's 32
   registers (12 to 14 rows by 32) there is one block; in OpenCL C for an AVX2 CPU, whose
   compiler (PoCL's LLVM) keeps the wide block's 16 registers without spills only where the
   matmul reads B in place (test_codegen's convolution), a matmul packing B keeps 6 x 16. */
static void test_matmul_wide_block(void **state) {
    static const struct {
        int dev;
        bool c99, fma;
        tb_dtype dtype;
        int64_t m, n;
        int32_t rm, rn;
    } cases[] = {
        {DEV_AVX2, true, true, TB_F32, 64, 576, 4, 24},
        {DEV_AVX2, true, true, TB_F32, 96, 512, 6, 16},
        {DEV_AVX2, true, true, TB_F64, 64, 240, 6, 8},
        {DEV_AVX2, true, true, TB_F64, 96, 256, 6, 8},
        {DEV_AVX2, true, true, TB_F32, 48, 384, 4, 24}, /* a tie: 48 x 384 either way */
        {DEV_AVX2, true, false, TB_F32, 64, 576, 6, 16},
        {DEV_AVX2, false, true, TB_F32, 64, 576, 6, 16},
        {DEV_AVX2, false, true, TB_F32, 48, 384, 6, 16},
        {DEV_SSE, false, false, TB_F32, 64, 576, 6, 8},
        {DEV_SSE, false, true, TB_F32, 64, 576, 6, 8},
        {DEV_AVX512, false, true, TB_F32, 64, 576, 13, 32},
        {DEV_AVX512, true, true, TB_F32, 64, 576, 13, 32},
    };
    size_t c;
    (void)state;
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tb_tensor *a = plan_input(cases[c].dtype, 2, cases[c].m, 256, 0);
        tb_tensor *b = plan_input(cases[c].dtype, 2, 256, cases[c].n, 0);
        tb_tensor *y = tb_matmul(a, b);
        tb_kit_facts f = plan_facts(cases[c].dev);
        plan_target t;
        tb__plan *p = NULL;
        const tb__plan_kernel *k, *pb;
        assert_non_null(y);
        f.fma = cases[c].fma;
        if (cases[c].c99) { /* the native backend's host of this vector shape */
            f.language = TB_KIT_C99;
            f.max_group = 1;
            f.max_args = 4096;
        }
        plan_target_of_facts(&t, &f);
        assert_int_equal(plan_of(&t, &y, 1, &p), TB_OK);
        k = kernel_of_kind(p, TB__K_MATMUL);
        assert_int_equal(k->mm, TB__MM_PACKED);
        if (k->rm != cases[c].rm || k->rn != cases[c].rn)
            fail_msg("%s%s%s, %s %d x %d: a %d x %d block, not %d x %d",
                     plan_dev_names[cases[c].dev], cases[c].c99 ? " in C" : " in OpenCL C",
                     cases[c].fma ? "" : " without FMA", cases[c].dtype == TB_F64 ? "f64" : "f32",
                     (int)cases[c].m, (int)cases[c].n, (int)k->rm, (int)k->rn, (int)cases[c].rm,
                     (int)cases[c].rn);
        /* B's panels are made in the block's width: N rounded up to whole panels, by K */
        pb = kernel_of_kind(p, TB__K_PACK_B);
        assert_non_null(pb);
        assert_int_equal(p->slots[pb->out_slot].shape.dims[0],
                         (cases[c].n + cases[c].rn - 1) / cases[c].rn * cases[c].rn * 256);
        tb__plan_free(p);
        tb_tensor_release(y);
        tb_tensor_release(b);
        tb_tensor_release(a);
    }
}

/* A convolution's matmul (the weight against each image's windows, 16 x 16 of them: whole
   panels, so not the images side by side; no padding, so that its rows of 20 for 16 outputs
   keep it off the whole rows of tb__conv_rows): the weight's panels are
   made once for all the images (a pack kernel of one batch index), and the windows' panels by
   the matmul's own work items, each item one column panel into a private buffer (as many rows
   at a time as the buffer holds) and every row panel against it, launched over the column
   panels alone; with no private buffer (the tuning's mm_own_b_bytes 0), by a pack kernel. A
   parameter's B is packed by a kernel everywhere: the backends keep those panels. */
static void test_matmul_own_panels(void **state) {
    tb_tensor *x = plan_input(TB_F32, 3, 8, 32, 400), *w = plan_input(TB_F32, 3, 64, 32, 25);
    tb_tensor *b = plan_input(TB_F32, 3, 8, 800, 196);
    int64_t xd[4] = {8, 32, 20, 20}, wd[4] = {64, 32, 5, 5}, one[2] = {1, 1}, zero[2] = {0, 0};
    /* AVX-512's f32 panels are 32 columns: an OpenCL CPU's 64 KiB holds 512 rows of one (800
       rows in 2 fills of 400), 32 KiB 256 rows (4 fills of 200) */
    int64_t w3d[3] = {1, 64, 800}, budgets[4] = {-1, 0, 32768, -1}, fill[4] = {400, 0, 200, 800};
    int devs[4] = {DEV_AVX512, DEV_AVX512, DEV_AVX512, DEV_C99}, c, rm;
    tb_tensor *x4 = tb_reshape(x, xd, 4), *w4 = tb_reshape(w, wd, 4);
    tb_tensor *y = tb_conv2d(x4, w4, NULL, one, zero, one, 1), *w3 = tb_reshape(w, w3d, 3), *z;
    (void)state;
    assert_non_null(y);
    z = tb_matmul(w3, b);
    assert_non_null(z);
    for (c = 0; c < 4; c++) {
        plan_target t;
        tb__plan *p = NULL;
        const tb__plan_kernel *k, *pa;
        plan_target_of(&t, devs[c]);
        if (budgets[c] >= 0) t.tuning.mm_own_b_bytes = budgets[c];
        assert_int_equal(plan_of(&t, &y, 1, &p), TB_OK);
        k = kernel_of_kind(p, TB__K_MATMUL);
        assert_int_equal(k->mm, TB__MM_PACKED);
        assert_int_equal(count_kind(p, TB__K_PACK_A), 1);
        pa = kernel_of_kind(p, TB__K_PACK_A);
        /* one batch index: 64 rows in whole panels, of the rows that pad 64 least (AVX-512: 13
           of 12 to 14, 65 rows) */
        rm = (int)k->rm;
        assert_true(rm >= t.tuning.mm_panel_rows_min && rm <= t.tuning.mm_panel_rows);
        if (devs[c] == DEV_AVX512) assert_int_equal(rm, 13);
        assert_int_equal(p->slots[pa->out_slot].shape.dims[0], (64 + rm - 1) / rm * rm * 800);
        assert_int_equal(k->own_b, fill[c] > 0);
        assert_int_equal(count_kind(p, TB__K_PACK_B), fill[c] > 0 ? 0 : 1);
        if (fill[c] > 0) {
            assert_int_equal(k->own_b_k, fill[c]);
            assert_int_equal(k->mm_group, 0);
            assert_int_equal(k->groups[0] * k->groups[1] * k->groups[2],
                             (size_t)(8 * ((256 + k->rn - 1) / k->rn)));
        }
        tb__plan_free(p);
        assert_int_equal(plan_of(&t, &z, 1, &p), TB_OK);
        assert_false(kernel_of_kind(p, TB__K_MATMUL)->own_b);
        assert_int_equal(count_kind(p, TB__K_PACK_B), 1);
        tb__plan_free(p);
    }
    tb_tensor_release(z);
    tb_tensor_release(w3);
    tb_tensor_release(y);
    tb_tensor_release(w4);
    tb_tensor_release(x4);
    tb_tensor_release(b);
    tb_tensor_release(w);
    tb_tensor_release(x);
}

/* A matmul that reads B in place (a 3 x 3 convolution over whole padded rows, no pack kernel
   of B and no panels of its own) runs its work items row panel by row panel at each column
   panel (groups of one) where all of A fits the group's share of the cache (64 x 576 floats),
   else in groups as wide as B's panels fit that share (256 x 2304); a matmul whose B is packed
   keeps its groups whatever the size of A. */
static void test_matmul_group_in_place(void **state) {
    static const int devs[3] = {DEV_AVX512, DEV_AVX2, DEV_C99};
    static const int64_t chans[2] = {64, 256}, sides[2] = {56, 14};
    int64_t one[2] = {1, 1}, d, c;
    (void)state;
    for (c = 0; c < 2; c++) {
        int64_t xd[4] = {2, chans[c], sides[c], sides[c]}, wd[4] = {chans[c], chans[c], 3, 3};
        int64_t md[3] = {1, chans[c], chans[c] * 9};
        tb_tensor *x = plan_input(TB_F32, 2, 2 * chans[c], sides[c] * sides[c], 1);
        tb_tensor *w = plan_input(TB_F32, 2, chans[c], chans[c] * 9, 1);
        tb_tensor *b = plan_input(TB_F32, 3, 2, chans[c] * 9, sides[c] * sides[c]);
        tb_tensor *x4 = tb_reshape(x, xd, 4), *w4 = tb_reshape(w, wd, 4),
                  *w3 = tb_reshape(w, md, 3);
        tb_tensor *y = tb_conv2d(x4, w4, NULL, one, one, one, 1), *z = tb_matmul(w3, b);
        assert_non_null(y);
        assert_non_null(z);
        for (d = 0; d < 3; d++) {
            plan_target t;
            tb__plan *p = NULL;
            const tb__plan_kernel *k;
            plan_target_of(&t, devs[d]);
            assert_int_equal(plan_of(&t, &y, 1, &p), TB_OK);
            k = kernel_of_kind(p, TB__K_MATMUL);
            assert_int_equal(k->mm, TB__MM_PACKED);
            assert_int_equal(count_kind(p, TB__K_PACK_B), 0);
            assert_false(k->own_b);
            if (c == 0) {
                assert_int_equal(k->mm_group, 1);
            } else {
                assert_true(k->mm_group > 1);
            }
            tb__plan_free(p);
            assert_int_equal(plan_of(&t, &z, 1, &p), TB_OK);
            k = kernel_of_kind(p, TB__K_MATMUL);
            assert_int_equal(count_kind(p, TB__K_PACK_B), 1);
            assert_true(k->mm_group > 1);
            tb__plan_free(p);
        }
        tb_tensor_release(z);
        tb_tensor_release(y);
        tb_tensor_release(w3);
        tb_tensor_release(w4);
        tb_tensor_release(x4);
        tb_tensor_release(b);
        tb_tensor_release(w);
        tb_tensor_release(x);
    }
}

/* The gradients of sum(conv2d(x, w) * r) for x [600, ch, 9, 9] and w [16, ch, 3, 3] (3 x 3,
   no padding: r [600, 16, 7, 7]), each an input of the plans: g[1] the weight's, g[0] x's
   where `with_x` (else NULL); t holds what to release. Each image's product is not small
   beside what it reads (16 x 9 ch outputs from 49 positions), so the weight's gradient is one
   matmul over the images' positions, 16 x 9 ch x 29400. */
typedef struct wgrad_graph {
    tb_tensor *t[9], *g[2];
} wgrad_graph;

static void wgrad_make(wgrad_graph *q, int64_t ch, bool with_x) {
    int64_t xd[4] = {600, ch, 9, 9}, wd[4] = {16, ch, 3, 3}, rd[4] = {600, 16, 7, 7};
    int64_t one[2] = {1, 1}, zero[2] = {0, 0};
    tb_tensor *x, *w, *r, *ins[2];
    memset(q, 0, sizeof *q);
    q->t[0] = plan_input(TB_F32, 2, 600 * ch, 9 * 9, 1);
    q->t[1] = plan_input(TB_F32, 2, 16, ch * 9, 1);
    q->t[2] = plan_input(TB_F32, 2, 600 * 16, 7 * 7, 1);
    q->t[3] = x = tb_reshape(q->t[0], xd, 4);
    q->t[4] = w = tb_reshape(q->t[1], wd, 4);
    q->t[5] = r = tb_reshape(q->t[2], rd, 4);
    assert_non_null(x && w && r);
    if (with_x) assert_int_equal(tb_set_requires_grad(x, true), TB_OK);
    assert_int_equal(tb_set_requires_grad(w, true), TB_OK);
    q->t[6] = tb_conv2d(x, w, NULL, one, zero, one, 1);
    q->t[7] = tb_mul(q->t[6], r);
    q->t[8] = tb_sum(q->t[7], NULL, 0, false);
    ins[0] = x;
    ins[1] = w;
    if (with_x) {
        assert_int_equal(tb_grad(q->t[8], NULL, ins, 2, q->g), TB_OK);
    } else {
        assert_int_equal(tb_grad(q->t[8], NULL, &w, 1, &q->g[1]), TB_OK);
    }
}

static void wgrad_release(wgrad_graph *q) {
    int i;
    tb_tensor_release(q->g[0]);
    tb_tensor_release(q->g[1]);
    for (i = 8; i >= 0; i--)
        tb_tensor_release(q->t[i]);
}

/* A convolution's weight gradient whose A (the output's gradient: 16 x 29400, 600 images of 7 x
   7 outputs, its rows padded to two panels of 12) outgrows a core's cache (2 MiB): on the
   native backend's host each work item takes several column panels of B (its windows, 288
   columns: 9 panels of 32) in turn, one fill of the depth at a time, as many as split the
   panels between the two compute units (5, then 4) and as the tuning's tile of accumulators
   holds; one panel an item where the tile is 0 or A fits the cache. A cache of 128 KiB keeps
   682 rows of A in its half: fills of 669 rows (44 of them), not the buffer's 1279 (23). */
static void test_matmul_own_panels_per_item(void **state) {
    wgrad_graph q;
    tb_tensor **g = q.g;
    /* the tuning's tile: as it is, three panels' accumulators, none; the cache: as it is, 64 MiB */
    int64_t tiles[5] = {-1, 3, 0, -1, -1};
    int64_t caches[5] = {-1, -1, -1, (int64_t)64 << 20, (int64_t)128 << 10};
    int64_t fills[5] = {1279, 1279, 1279, 1279, 669};
    int32_t want[5] = {5, 3, 1, 1, 5};
    int c;
    (void)state;
    wgrad_make(&q, 32, true);
    for (c = 0; c < 5; c++) {
        plan_target t;
        tb__plan *p = NULL;
        const tb__plan_kernel *k;
        int64_t tile;
        plan_target_of(&t, DEV_C99);
        assert_int_equal(plan_of(&t, &g[1], 1, &p), TB_OK);
        k = kernel_of_kind(p, TB__K_MATMUL);
        assert_non_null(k);
        tile = (int64_t)((16 + k->rm - 1) / k->rm * k->rm) * k->rn * 4;
        tb__plan_free(p);
        if (tiles[c] >= 0) t.tuning.mm_own_b_tile = tiles[c] * tile;
        if (caches[c] >= 0) t.target.cache_bytes = (uint64_t)caches[c];
        assert_int_equal(plan_of(&t, &g[1], 1, &p), TB_OK);
        k = kernel_of_kind(p, TB__K_MATMUL);
        assert_int_equal(k->mm, TB__MM_PACKED);
        assert_int_equal(k->rn, 32);
        assert_true(k->own_b);
        assert_int_equal(k->rm, 12);
        assert_int_equal(k->own_b_k, fills[c]);
        assert_int_equal(k->own_b_span, want[c]);
        assert_int_equal(k->groups[0] * k->groups[1] * k->groups[2],
                         (size_t)((9 + want[c] - 1) / want[c]));
        tb__plan_free(p);
    }
    wgrad_release(&q);
    {
        /* a batch of no matrices: planned (nothing to split between the compute units) */
        tb_tensor *a = plan_input(TB_F32, 3, 0, 256, 256), *mm = tb_matmul(a, a);
        plan_target t;
        tb__plan *p = NULL;
        assert_non_null(mm);
        plan_target_of(&t, DEV_C99);
        assert_int_equal(plan_of(&t, &mm, 1, &p), TB_OK);
        tb__plan_free(p);
        tb_tensor_release(mm);
        tb_tensor_release(a);
    }
}

/* The same weight gradient with 128 input channels: B's 1152 columns are 36 panels. With a
   tile of 12 panels' accumulators, 3 items of 12 would keep one of the two compute units idle
   for a third of the kernel: 4 items of 9 (the fewest panels on the busier unit). With 4 units
   and a tile of 6, 6 items of 6 leave 12 panels on two of them: 12 items of 3 leave 9 on each.
   With 2 units and a tile of 3: 12 items of 3 (18 of 2 would leave as many on each unit and
   read A from memory more often). */
static void test_matmul_own_panels_balanced(void **state) {
    wgrad_graph q;
    int64_t tiles[3] = {12, 6, 3}, units[3] = {2, 4, 2};
    int32_t want[3] = {9, 3, 3}, c;
    (void)state;
    wgrad_make(&q, 128, false);
    for (c = 0; c < 3; c++) {
        plan_target t;
        tb__plan *p = NULL;
        const tb__plan_kernel *k;
        plan_target_of(&t, DEV_C99);
        t.target.compute_units = (uint32_t)units[c];
        assert_int_equal(plan_of(&t, &q.g[1], 1, &p), TB_OK);
        k = kernel_of_kind(p, TB__K_MATMUL);
        assert_non_null(k);
        t.tuning.mm_own_b_tile = tiles[c] * ((16 + k->rm - 1) / k->rm * k->rm) * k->rn * 4;
        tb__plan_free(p);
        assert_int_equal(plan_of(&t, &q.g[1], 1, &p), TB_OK);
        k = kernel_of_kind(p, TB__K_MATMUL);
        assert_true(k->own_b);
        assert_int_equal(k->rn, 32);
        assert_int_equal(k->own_b_span, want[c]);
        assert_int_equal(k->groups[0] * k->groups[1] * k->groups[2], (size_t)(36 / want[c]));
        tb__plan_free(p);
    }
    wgrad_release(&q);
}

/* A matmul read through a reshape that splits its columns into rows of 40 and a slice of
   columns 1..30 of each (a convolution over whole padded rows), then a residual and a relu: one
   matmul kernel on every class, storing the slice's 30 columns of each row of 40 through that
   epilogue (no kernel of its own reading the matmul's output again). A slice of every other
   column is not a crop: it keeps its own kernel. */
static void test_matmul_crop(void **state) {
    tb_tensor *a = plan_input(TB_F32, 3, 2, 64, 72), *b = plan_input(TB_F32, 3, 2, 72, 480);
    tb_tensor *e = plan_input(TB_F32, 3, 2, 64, 360);
    const int64_t split[4] = {2, 64, 12, 40}, rows[4] = {2, 64, 12, 30};
    const int devs[5] = {DEV_AVX512, DEV_AVX2, DEV_SSE, DEV_GPU, DEV_C99};
    tb_tensor *m = tb_matmul(a, b), *r = tb_reshape(m, split, 4), *er = tb_reshape(e, rows, 4);
    tb_tensor *s = tb_slice(r, 3, 1, 31, 1), *sum = tb_add(s, er), *y = tb_relu(sum);
    tb_tensor *s2 = tb_slice(r, 3, 0, 40, 2), *y2 = tb_relu(s2);
    int c;
    (void)state;
    assert_non_null(y);
    assert_non_null(y2);
    for (c = 0; c < 5; c++) {
        tb__plan *p = plan1(devs[c], y);
        const tb__plan_kernel *k = kernel_of_kind(p, TB__K_MATMUL);
        assert_int_equal(count_kind(p, TB__K_ELEMENTWISE), 0);
        assert_int_equal(k->crop_wp, 40);
        assert_int_equal(k->crop_at, 1);
        assert_int_equal(k->crop_w, 30);
        assert_int_equal(k->vec, 0); /* the epilogue's vectors would cross the rows */
        tb__plan_free(p);
        p = plan1(devs[c], y2);
        assert_int_equal(count_kind(p, TB__K_ELEMENTWISE), 1);
        assert_int_equal(kernel_of_kind(p, TB__K_MATMUL)->crop_wp, 0);
        tb__plan_free(p);
    }
    tb_tensor_release(y2);
    tb_tensor_release(s2);
    tb_tensor_release(y);
    tb_tensor_release(sum);
    tb_tensor_release(s);
    tb_tensor_release(er);
    tb_tensor_release(r);
    tb_tensor_release(m);
    tb_tensor_release(e);
    tb_tensor_release(b);
    tb_tensor_release(a);
}

/* The tuning decides: with mm_pack_min_work above the matmul's work it is not packed. */
static void test_tuning_decides_packing(void **state) {
    tb_tensor *a = plan_input(TB_F32, 2, 512, 512, 0), *b = plan_input(TB_F32, 2, 512, 512, 0);
    tb_tensor *y = tb_matmul(a, b);
    plan_target t;
    tb__plan *p = NULL;
    (void)state;
    plan_target_of(&t, DEV_AVX512);
    t.tuning.mm_pack_min_work = (int64_t)1 << 40;
    assert_int_equal(plan_of(&t, &y, 1, &p), TB_OK);
    assert_int_equal(p->num_kernels, 1);
    assert_int_equal(p->kernels[0].mm, TB__MM_REGISTERS);
    tb__plan_free(p);
    tb_tensor_release(y);
    tb_tensor_release(b);
    tb_tensor_release(a);
}

/* ---- kernels cut to the budgets ---- */

/* A chain longer than one kernel's code budget is cut into several kernels, more for a smaller
   budget; the last computes the result. */
static void test_long_chain_cut_to_budget(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 16, 16, 0), *y = tb_tensor_retain(x);
    size_t budgets[3] = {0, 64, 16}, prev = 0;
    int i;
    (void)state;
    for (i = 0; i < 200; i++) {
        tb_tensor *n = i % 2 == 0 ? tb_add(y, x) : tb_mul_scalar(y, 0.5);
        tb_tensor_release(y);
        y = n;
    }
    for (i = 0; i < 3; i++) {
        plan_target t;
        tb__plan *p = NULL;
        plan_target_of(&t, DEV_AVX512);
        if (budgets[i] > 0) t.tuning.values_per_kernel = (int64_t)budgets[i];
        assert_int_equal(plan_of(&t, &y, 1, &p), TB_OK);
        if (i == 0) assert_int_equal(p->num_kernels, 1);
        if (i > 0) assert_true(p->num_kernels > prev);
        assert_int_equal(count_kind(p, TB__K_ELEMENTWISE), p->num_kernels);
        assert_int_equal(p->slots[p->result_slot[0]].kind, TB__SLOT_RESULT);
        assert_int_equal(p->kernels[p->num_kernels - 1].out_slot, p->result_slot[0]);
        prev = p->num_kernels;
        tb__plan_free(p);
    }
    tb_tensor_release(y);
    tb_tensor_release(x);
}

/* A sum of 24 inputs on a device that takes 8 arguments: kernels of at most 8 arguments each.
   A node that alone reads more than the device takes is an error that says so. */
static void test_kernels_fit_the_arguments(void **state) {
    tb_tensor *in[24], *y;
    plan_target t;
    tb__plan *p = NULL;
    size_t i;
    (void)state;
    for (i = 0; i < 24; i++)
        in[i] = plan_input(TB_F32, 1, 32, 0, 0);
    y = tb_tensor_retain(in[0]);
    for (i = 1; i < 24; i++) {
        tb_tensor *n = tb_add(y, in[i]);
        tb_tensor_release(y);
        y = n;
    }
    plan_target_of(&t, DEV_AVX512);
    t.target.max_args = 8;
    assert_int_equal(plan_of(&t, &y, 1, &p), TB_OK);
    assert_true(p->num_kernels >= 3);
    for (i = 0; i < p->num_kernels; i++)
        assert_true(p->kernels[i].num_args <= 8);
    tb__plan_free(p);
    tb_tensor_release(y);

    y = tb_add(in[0], in[1]); /* reads two arrays and writes one */
    t.target.max_args = 2;
    assert_int_equal(plan_of(&t, &y, 1, &p), TB_ERR_UNSUPPORTED);
    assert_null(p);
    assert_non_null(strstr(tb_last_error(), "more than the 2 arguments the device takes"));
    tb_clear_error();
    tb_tensor_release(y);
    for (i = 0; i < 24; i++)
        tb_tensor_release(in[i]);
}

/* A concat of 300 inputs on a device of 128 arguments: concat kernels that together write
   each operand once, none over the device's arguments. */
static void test_concat_of_many_inputs(void **state) {
    tb_tensor *in[300], *y;
    tb__plan *p;
    size_t i;
    int32_t covered = 0;
    (void)state;
    for (i = 0; i < 300; i++)
        in[i] = plan_input(TB_F32, 2, 4, 3, 0);
    y = tb_concat(in, 300, 1);
    p = plan1(DEV_AVX512, y);
    assert_true(count_kind(p, TB__K_CONCAT) >= 3);
    for (i = 0; i < p->num_kernels; i++) {
        assert_true(p->kernels[i].num_args <= 128);
        if (p->kernels[i].kind == TB__K_CONCAT) covered += p->kernels[i].cat_count;
    }
    assert_int_equal(covered, 300);
    tb__plan_free(p);
    tb_tensor_release(y);
    for (i = 0; i < 300; i++)
        tb_tensor_release(in[i]);
}

/* ---- run-time error sites ---- */

/* An index_select can read out of range: the plan holds an error site for it (the op, the dim
   and its size), which the node's error code names; a graph without one has none. */
static void test_error_sites(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 5, 3, 0), *idx = plan_input(TB_I64, 1, 4, 0, 0);
    tb_tensor *y = tb_index_select(x, 0, idx), *z = tb_exp(x);
    tb__plan *p = plan1(DEV_AVX512, y);
    size_t i;
    bool named = false;
    (void)state;
    assert_int_equal(p->num_errsites, 1);
    assert_int_equal(p->errsites[0].op, TB_OP_INDEX_SELECT);
    assert_int_equal(p->errsites[0].size, 5);
    for (i = 0; i < p->num_nodes; i++)
        named = named || tb__plan_errsite_code(p, (int32_t)i) == 1;
    assert_true(named);
    tb__plan_free(p);
    p = plan1(DEV_AVX512, z);
    assert_int_equal(p->num_errsites, 0);
    tb__plan_free(p);
    tb_tensor_release(z);
    tb_tensor_release(y);
    tb_tensor_release(idx);
    tb_tensor_release(x);
}

/* ---- the same plan every time ---- */

static void test_plans_are_repeatable(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 64, 48, 0), *w = plan_input(TB_F32, 2, 48, 48, 0);
    tb_tensor *h = tb_matmul(x, w), *g = tb_gelu(h), *y = tb_softmax(g, 1);
    int dev;
    (void)state;
    for (dev = DEV_AVX512; dev <= DEV_C99; dev++) {
        tb__plan *p = plan1(dev, y), *q = plan1(dev, y);
        size_t i;
        assert_int_equal(p->num_kernels, q->num_kernels);
        assert_int_equal(p->num_slots, q->num_slots);
        for (i = 0; i < p->num_kernels; i++) {
            assert_string_equal(p->kernels[i].name, q->kernels[i].name);
            assert_int_equal(p->kernels[i].kind, q->kernels[i].kind);
            assert_int_equal(p->kernels[i].num_args, q->kernels[i].num_args);
            assert_int_equal(p->kernels[i].items, q->kernels[i].items);
        }
        tb__plan_free(p);
        tb__plan_free(q);
    }
    tb_tensor_release(y);
    tb_tensor_release(g);
    tb_tensor_release(h);
    tb_tensor_release(w);
    tb_tensor_release(x);
}

/* ---- memory running out ---- */

/* Every allocation of planning fails in turn: each time the planner returns
   TB_ERR_OUT_OF_MEMORY with no plan (the sanitizers' leak check holds the rest), or, where it
   can do without what it asked for, the plan made before. */
static void test_allocation_failures(void **state) {
    tb_tensor *x = plan_input(TB_F32, 2, 64, 48, 0), *w = plan_input(TB_F32, 2, 48, 512, 0);
    tb_tensor *in[40], *parts[3], *y;
    int32_t axis = 1;
    tb__plan *p = NULL;
    plan_target t;
    size_t want, i;
    long at;
    (void)state;
    for (i = 0; i < 40; i++)
        in[i] = plan_input(TB_F32, 2, 64, 2, 0);
    parts[0] = tb_matmul(x, w);
    parts[1] = tb_concat(in, 40, 1);
    parts[2] = tb_softmax(parts[0], 1);
    y = tb_sum(parts[2], &axis, 1, true);
    plan_target_of(&t, DEV_AVX512);
    t.target.max_args = 16;
    assert_int_equal(plan_of(&t, &y, 1, &p), TB_OK);
    want = p->num_kernels;
    tb__plan_free(p);
    for (at = 1;; at++) {
        tb_status st;
        g_count = 0;
        g_failed = false;
        g_fail_at = at;
        st = plan_of(&t, &y, 1, &p);
        g_fail_at = 0;
        if (!g_failed) {
            assert_int_equal(st, TB_OK);
            assert_int_equal(p->num_kernels, want);
            tb__plan_free(p);
            break;
        }
        if (st == TB_OK) {
            /* what the planner does without (a kernel's flop count for TB_DEBUG, a result
               computed into a donor's buffer): the same kernels */
            assert_int_equal(p->num_kernels, want);
            tb__plan_free(p);
            continue;
        }
        if (st != TB_ERR_OUT_OF_MEMORY) fail_msg("allocation %ld failed: status %d", at, (int)st);
        assert_null(p);
        tb_clear_error();
    }
    assert_true(at > 10);
    tb_tensor_release(y);
    for (i = 0; i < 3; i++)
        tb_tensor_release(parts[i]);
    for (i = 0; i < 40; i++)
        tb_tensor_release(in[i]);
    tb_tensor_release(w);
    tb_tensor_release(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise_chain_is_one_kernel),
        cmocka_unit_test(test_reduction_takes_prologue_and_epilogue),
        cmocka_unit_test(test_large_reduction_is_split),
        cmocka_unit_test(test_row_reductions_hoisted),
        cmocka_unit_test(test_matmul_forms),
        cmocka_unit_test(test_matmul_wide_block),
        cmocka_unit_test(test_matmul_own_panels),
        cmocka_unit_test(test_matmul_group_in_place),
        cmocka_unit_test(test_matmul_own_panels_per_item),
        cmocka_unit_test(test_matmul_own_panels_balanced),
        cmocka_unit_test(test_matmul_crop),
        cmocka_unit_test(test_tuning_decides_packing),
        cmocka_unit_test(test_long_chain_cut_to_budget),
        cmocka_unit_test(test_kernels_fit_the_arguments),
        cmocka_unit_test(test_concat_of_many_inputs),
        cmocka_unit_test(test_error_sites),
        cmocka_unit_test(test_plans_are_repeatable),
        cmocka_unit_test(test_allocation_failures),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
