/* ===========================================================================================
   C-family code generator, the matmul kernels: the stores every matmul kernel shares (its
   epilogue, by scalars or W columns at once), the register matmul (no work-group memory) and
   the matmul from packed panels (CPUs), around the values and expressions of codegen.c; the
   panels are codegen_pack.c's, the work-group tile matmul (GPUs) is codegen_tiles.c's, the
   program that runs them codegen_program.c's.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* Whether a register matmul's last block of vector columns is moved left to end at N (below). */
static bool tb__cg_mm_shifted(const tb__cg *g, const tb__plan_kernel *k) {
    int64_t n = tb__plan_mm_of(g->G, k->core).n;
    return k->mm == TB__MM_REGISTERS && tb__plan_shape(g->G, k->core)->dtype == TB_F32 &&
           g->d->vec_make != NULL && k->rn > 1 && n % k->rn != 0 && n > k->rn;
}

/* The store of one accumulator acc[ii][jj] of a matmul kernel at row gr, column gc (the caller
   has emitted both and opened the bounds check): the kernel's fused consumers run on the value
   and the result goes to out. Shared by every matmul kernel. False when code generation
   stopped (g->ix.status says why, if it failed). */
/* The position p of the matmul's output at (row var vr, column var vc) of the block, with the
   core's value there (`memo`: TB__MEMO_VALUE or TB__MEMO_VECTOR, value or vector v) noted at
   p, and *pr the root's position at the same flat offset (the consumers may see the matmul
   through a reshape, to other dims or its own). -1 when code generation stopped. */
static int32_t tb__cg_matmul_at(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                int32_t vr, int32_t vc, int memo, int32_t v, int32_t *pr) {
    const tb_shape *cs = tb__plan_shape(g->G, k->core), *rs = tb__plan_shape(g->G, k->root);
    int32_t r = cs->rank, d, p, pf;
    tb__lf dims[TB_MAX_RANK];
    for (d = 0; d < r - 2; d++)
        dims[d] = bdims[d];
    tb__lf_const(&dims[r - 2], 0);
    tb__lf_add_term(&dims[r - 2], vr, 1);
    tb__lf_const(&dims[r - 1], 0);
    tb__lf_add_term(&dims[r - 1], vc, 1);
    p = tb__ix_pos_multi(&g->ix, cs, dims);
    if (p < 0 || !tb__ix_need_flat(&g->ix, p)) return -1;
    tb__ix_memo_add(&g->ix, memo, k->core, p, 0, v);
    *pr = p;
    if (k->root != k->core) {
        pf = tb__ix_pos_flat(&g->ix, cs, &g->ix.pos[p].flat);
        *pr = tb__ix_pos_flat(&g->ix, rs, &g->ix.pos[p].flat);
        if (pf < 0 || *pr < 0) return -1;
        tb__ix_memo_add(&g->ix, memo, k->core, pf, 0, v);
    }
    return p;
}

static bool tb__cg_matmul_store(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims) {
    const tb_shape *cs = tb__plan_shape(g->G, k->core), *rs = tb__plan_shape(g->G, k->root);
    int32_t r = cs->rank, vr = tb__ix_new_var(&g->ix, 0, cs->dims[r - 2] - 1),
            vc = tb__ix_new_var(&g->ix, 0, cs->dims[r - 1] - 1), p, pr, vf, v;
    const char *t = tb__cg_ctype(cs->dtype);
    char flat[TB__LF_TEXT];
    if (vr < 0 || vc < 0) return false;
    tb__ix_line(&g->ix, "const long i%d = gr, i%d = gc;", (int)vr, (int)vc);
    vf = tb__cg_new_val(g, cs->dtype);
    if (vf < 0) return false;
    tb__ix_line(&g->ix, "const %s v%d = (%s)acc[ii][jj];", t, (int)vf, t);
    vf = tb__cg_round(g, cs->dtype, vf);
    if (vf < 0) return false;
    p = tb__cg_matmul_at(g, k, bdims, vr, vc, TB__MEMO_VALUE, vf, &pr);
    if (p < 0) return false;
    v = tb__cg_eval(g, k->root, pr);
    if (v < 0) return false;
    tb__lf_text(&g->ix.pos[p].flat, flat, sizeof flat);
    tb__cg_store(g, rs->dtype, "out", flat, v);
    return true;
}

/* The form of an axis of `size` elements at var * coef + c, as the views under a kernel's root
   make it: no term where the axis has one element. */
static void tb__cg_axis_form(tb__lf *f, int64_t size, int32_t var, int64_t coef, int64_t c) {
    tb__lf_const(f, c);
    if (size > 1) tb__lf_add_term(f, var, coef);
}

/* The store of acc[ii][jj] of a matmul that keeps part of each row of crop_wp columns
   (tb__plan_kernel.crop_wp): the slice's position is the matmul's batch dims, its row (C
   variable `gr`), the row of crop_wp columns (`sy`) and the place in it less crop_at (`sx`),
   the root's the same but for axes of one element (tb__plan_at_output); the matmul's value is
   noted at the column those make, where the slice and the reshape under it read it. */
static bool tb__cg_matmul_crop_store(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                     const char *sy, const char *sx) {
    const tb_shape *cs = tb__plan_shape(g->G, k->core), *rs = tb__plan_shape(g->G, k->root);
    int32_t r = cs->rank, d, j, vr, vy, vx, p, pf, pr, vf, v;
    const char *t = tb__cg_ctype(cs->dtype);
    char flat[TB__LF_TEXT];
    tb__lf dims[TB_MAX_RANK], rdims[TB_MAX_RANK];
    tb_shape ss = *cs; /* the slice's */
    ss.rank = r + 1;
    ss.dims[r - 1] = cs->dims[r - 1] / k->crop_wp;
    ss.dims[r] = k->crop_w;
    vr = tb__ix_new_var(&g->ix, 0, ss.dims[r - 2] - 1);
    vy = tb__ix_new_var(&g->ix, 0, ss.dims[r - 1] - 1);
    vx = tb__ix_new_var(&g->ix, 0, ss.dims[r] - 1);
    vf = tb__cg_new_val(g, cs->dtype);
    if (vr < 0 || vy < 0 || vx < 0 || vf < 0) return false;
    tb__ix_line(&g->ix, "const long i%d = gr, i%d = %s, i%d = %s;", (int)vr, (int)vy, sy, (int)vx,
                sx);
    tb__ix_line(&g->ix, "const %s v%d = (%s)acc[ii][jj];", t, (int)vf, t);
    vf = tb__cg_round(g, cs->dtype, vf);
    if (vf < 0) return false;
    /* the matmul's position: its column crop_at + sy * crop_wp + sx */
    for (d = 0; d < r - 2; d++)
        dims[d] = bdims[d];
    tb__cg_axis_form(&dims[r - 2], ss.dims[r - 2], vr, 1, 0);
    tb__cg_axis_form(&dims[r - 1], ss.dims[r - 1], vy, k->crop_wp, k->crop_at);
    if (ss.dims[r] > 1) tb__lf_add_term(&dims[r - 1], vx, 1);
    p = tb__ix_pos_multi(&g->ix, cs, dims);
    if (p < 0 || !tb__ix_need_flat(&g->ix, p)) return false;
    pf = tb__ix_pos_flat(&g->ix, cs, &g->ix.pos[p].flat);
    if (pf < 0) return false;
    tb__ix_memo_add(&g->ix, TB__MEMO_VALUE, k->core, p, 0, vf);
    tb__ix_memo_add(&g->ix, TB__MEMO_VALUE, k->core, pf, 0, vf);
    /* the slice's, then its forms on the root's axes of more than one element, in order */
    tb__cg_axis_form(&dims[r - 1], ss.dims[r - 1], vy, 1, 0);
    tb__cg_axis_form(&dims[r], ss.dims[r], vx, 1, 0);
    for (d = 0, j = 0; d < rs->rank; d++) {
        tb__lf_const(&rdims[d], 0);
        if (rs->dims[d] == 1) continue;
        while (j < ss.rank && ss.dims[j] == 1)
            j++;
        if (j < ss.rank) rdims[d] = dims[j++];
    }
    pr = tb__ix_pos_multi(&g->ix, rs, rdims);
    v = tb__cg_eval(g, k->root, pr);
    if (v < 0 || !tb__ix_need_flat(&g->ix, pr)) return false;
    tb__lf_text(&g->ix.pos[pr].flat, flat, sizeof flat);
    tb__cg_store(g, rs->dtype, "out", flat, v);
    return g->ix.status == TB_OK;
}

/* The stores of a block of a matmul that keeps part of each row of crop_wp columns. Where the
   block's columns are consecutive (`cols` is "col0 + jj"), one run of them for each row of
   crop_wp they meet: the kept columns of that row the block holds, stored without a test (a
   loop the compiler can vectorise along the output's row); else each column tests whether
   its row keeps it. The run's loop goes over the whole block row with the run's bounds as a
   test: compilers make it masked vector stores, where a loop from ja to jb became a call to
   memcpy per row (ResNet's 7 x 7 stem, batch 8, on native on a 2-core Intel AVX-512 VM, K =
   192: its matmul 8.7 -> 8.5 ms, against 8.1 storing every column and a kernel of 1.9 ms
   after it that cut them). */
static bool tb__cg_matmul_crop_stores(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                      const char *rows, const char *cols) {
    const tb_shape *cs = tb__plan_shape(g->G, k->core);
    long long M = (long long)cs->dims[cs->rank - 2], N = (long long)cs->dims[cs->rank - 1];
    long long wp = (long long)k->crop_wp, at = (long long)k->crop_at, w = (long long)k->crop_w;
    const char *from = tb__cg_mm_shifted(g, k) ? "colb - col0" : "0"; /* the block's own */
    char head[192], sx[96];
    if (strcmp(cols, "col0 + jj") == 0) {
        snprintf(head, sizeof head,
                 "for (long sy = col0 / %lldL; sy < %lldL && sy * %lldL < col0 + %d; sy++) ", wp,
                 N / wp, wp, (int)k->rn);
        tb__ix_open(&g->ix, head);
        tb__ix_line(&g->ix, "long ja = sy * %lldL + %lldL - col0, jb = ja + %lldL;", wp, at, w);
        tb__ix_line(&g->ix, "if (ja < %s) ja = %s;", from, from);
        tb__ix_line(&g->ix, "if (jb > %dL) jb = %dL;", (int)k->rn, (int)k->rn);
        snprintf(head, sizeof head, "for (int ii = 0; ii < %d; ii++) ", (int)k->rm);
        tb__ix_open(&g->ix, head);
        tb__ix_line(&g->ix, "const long gr = %s;", rows);
        tb__ix_line(&g->ix, "if (gr >= %lldL) break;", M); /* a padded grid's item too */
        snprintf(head, sizeof head, "for (long jj = 0; jj < %dL; jj++) if (jj >= ja && jj < jb) ",
                 (int)k->rn);
        tb__ix_open(&g->ix, head);
        snprintf(sx, sizeof sx, "col0 + jj - sy * %lldL - %lldL", wp, at);
        if (!tb__cg_matmul_crop_store(g, k, bdims, "sy", sx)) return false;
        tb__ix_close(&g->ix, "");
        tb__ix_close(&g->ix, "");
        tb__ix_close(&g->ix, "");
        return g->ix.status == TB_OK;
    }
    snprintf(head, sizeof head, "for (int ii = 0; ii < %d; ii++) for (int jj = 0; jj < %d; jj++) ",
             (int)k->rm, (int)k->rn);
    tb__ix_open(&g->ix, head);
    tb__ix_line(&g->ix, "const long gr = %s, gc = %s;", rows, cols);
    snprintf(head, sizeof head,
             "if (gr < %lldL && gc < %lldL && gc %% %lldL >= %lldL && gc %% %lldL < %lldL) ", M, N,
             wp, at, wp, at + w);
    tb__ix_open(&g->ix, head);
    snprintf(head, sizeof head, "gc / %lldL", wp);
    snprintf(sx, sizeof sx, "gc %% %lldL - %lldL", wp, at);
    if (!tb__cg_matmul_crop_store(g, k, bdims, head, sx)) return false;
    tb__ix_close(&g->ix, "");
    tb__ix_close(&g->ix, "");
    return g->ix.status == TB_OK;
}

/* The stores of a packed matmul's interior block through its vector epilogue (k->vec: the
   planner checked it): for each of the block's rows, each run of W columns of acc[ii] as
   the matmul's vector at (row0 + ii, col0 + c), the epilogue on it and one vector store. */
static bool tb__cg_matmul_vstores(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims) {
    const tb_shape *cs = tb__plan_shape(g->G, k->core), *rs = tb__plan_shape(g->G, k->root);
    int32_t r = cs->rank, c, w = k->vec;
    char loop[96];
    snprintf(loop, sizeof loop, "for (int ii = 0; ii < %d; ii++) ", (int)k->rm);
    tb__ix_open(&g->ix, loop);
    for (c = 0; c < k->rn; c += w) {
        int32_t vr = tb__ix_new_var(&g->ix, 0, cs->dims[r - 2] - 1),
                vc = tb__ix_new_var(&g->ix, 0, cs->dims[r - 1] - 1), p, pr, v, vo;
        char flat[TB__LF_TEXT], ptr[TB__LF_TEXT + 16];
        if (vr < 0 || vc < 0) return false;
        tb__ix_open(&g->ix, "");
        tb__ix_line(&g->ix, "const long i%d = row0 + ii, i%d = col0 + %d;", (int)vr, (int)vc,
                    (int)c);
        v = tb__cg_new_vec(g);
        if (v < 0) return false;
        tb__ix_line(&g->ix, "const tb_vf v%d = TB_VLD(%d, acc[ii]);", (int)v, (int)(c / w));
        p = tb__cg_matmul_at(g, k, bdims, vr, vc, TB__MEMO_VECTOR, v, &pr);
        if (p < 0) return false;
        vo = tb__cg_veval(g, k->root, pr);
        if (vo < 0) return false;
        tb__lf_text(&g->ix.pos[p].flat, flat, sizeof flat);
        snprintf(ptr, sizeof ptr, "out + (%s)", flat);
        tb__cg_vstore(g, rs->dtype, vo, ptr, false);
        tb__ix_close(&g->ix, "");
    }
    tb__ix_close(&g->ix, "");
    return g->ix.status == TB_OK;
}

/* The loops over a work item's block of rm x rn outputs at `rows`, `cols` (row0 + ii (+ step *
   ii), col0 + jj (+ step * jj)), storing the real ones through the epilogue. A block that lies
   within the output (its span_r x span_c extent from row0, col0) stores without the bounds
   test, in loops of a constant count the compiler can vectorise; only edge blocks test each
   output (none when the block divides the output: a work item past the edge stores nothing). */
static bool tb__cg_matmul_stores(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                 const char *rows, const char *cols, int32_t span_r,
                                 int32_t span_c) {
    const tb_shape *cs = tb__plan_shape(g->G, k->core);
    long long M = (long long)cs->dims[cs->rank - 2], N = (long long)cs->dims[cs->rank - 1];
    bool shifted = tb__cg_mm_shifted(g, k), exact = M % span_r == 0 && (N % span_c == 0 || shifted);
    char head[192], loops[192];
    int edge;
    if (k->crop_wp > 0) return tb__cg_matmul_crop_stores(g, k, bdims, rows, cols);
    snprintf(loops, sizeof loops,
             "for (int ii = 0; ii < %d; ii++) for (int jj = %s; jj < %d; jj++) ", (int)k->rm,
             shifted ? "(int)(colb - col0)" : "0", (int)k->rn);
    snprintf(head, sizeof head, "if (row0 + %d <= %lldL && col0 + %d <= %lldL) ", (int)span_r, M,
             (int)span_c, N);
    for (edge = 0; edge < (exact ? 1 : 2); edge++) {
        tb__ix_open(&g->ix, edge ? "else " : head);
        if (!edge && k->vec > 0 && k->mm == TB__MM_PACKED) { /* the block's own columns */
            if (!tb__cg_matmul_vstores(g, k, bdims)) return false;
            tb__ix_close(&g->ix, "");
            continue;
        }
        tb__ix_open(&g->ix, loops);
        tb__ix_line(&g->ix, "const long gr = %s, gc = %s;", rows, cols);
        if (edge) {
            snprintf(head, sizeof head, "if (gr < %lldL && gc < %lldL) ", M, N);
            tb__ix_open(&g->ix, head);
        }
        if (!tb__cg_matmul_store(g, k, bdims)) return false;
        if (edge) tb__ix_close(&g->ix, "");
        tb__ix_close(&g->ix, "");
        tb__ix_close(&g->ix, "");
    }
    return g->ix.status == TB_OK;
}

/* The value of a matmul operand (side 0: A, 1: B) at (row var, column var) of its matrix. */
static int32_t tb__cg_matmul_operand(tb__cg *g, const tb__plan_kernel *k, int side,
                                     const tb__lf *bdims, int32_t row, int32_t col) {
    int32_t x = tb__plan_operand(g->G, k->core, (size_t)side);
    const tb_shape *xs = tb__plan_shape(g->G, x);
    int32_t r = xs->rank, d;
    tb__lf dims[TB_MAX_RANK];
    for (d = 0; d + 2 < r; d++)
        dims[d] = bdims[d];
    tb__lf_const(&dims[r - 2], 0);
    tb__lf_add_term(&dims[r - 2], row, 1);
    tb__lf_const(&dims[r - 1], 0);
    tb__lf_add_term(&dims[r - 1], col, 1);
    return tb__cg_eval(g, x, tb__ix_pos_multi(&g->ix, xs, dims));
}

/* Opens a register matmul's loop over the depth and reads B's values at the block's first
   `ncols` columns in it (vb[j] for cols[j]); returns the depth variable, -1 if failed. */
static int32_t tb__cg_matmul_depth_open(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                        const int32_t *cols, int32_t ncols, int32_t *vb) {
    tb__plan_mm mm = tb__plan_mm_of(g->G, k->core);
    int32_t kv = tb__ix_new_var(&g->ix, 0, mm.k > 0 ? mm.k - 1 : 0), j;
    char head[160];
    if (kv < 0) return -1;
    snprintf(head, sizeof head, "for (long i%d = 0; i%d < %lldL; i%d++) ", (int)kv, (int)kv,
             (long long)mm.k, (int)kv);
    tb__ix_open(&g->ix, head);
    for (j = 0; j < ncols; j++) {
        vb[j] = tb__cg_matmul_operand(g, k, 1, bdims, kv, cols[j]);
        if (vb[j] < 0) return -1;
    }
    return kv;
}

/* Whether operand `which` (0: A, 1: B) of a matmul is an f32 buffer seen through views alone
   (no pad, nothing computed): its value is one read at a flat index. */
static bool tb__cg_matmul_f32_view(tb__cg *g, const tb__plan_kernel *k, int which) {
    int32_t x = tb__plan_operand(g->G, k->core, which);
    if (tb__plan_shape(g->G, x)->dtype != TB_F32) return false;
    while (!tb__cg_reads_buffer(g, x)) {
        tb_op op = g->G->info[x].node->op;
        if (op != TB_OP_RESHAPE && op != TB_OP_PERMUTE && op != TB_OP_SLICE && op != TB_OP_WINDOW &&
            op != TB_OP_EXPAND && op != TB_OP_FLIP)
            return false;
        x = tb__plan_operand(g->G, x, 0);
    }
    return true;
}

/* Whether a register matmul can read B's rn values at each step of K as one vector load: B is
   an f32 buffer seen through views alone (no pad, nothing computed), the blocks divide N (or
   the last is moved: tb__cg_mm_shifted), and its flat index is the column plus what does not
   depend on the column (no division of the column, which would break the run). Found by emitting
   B's value once at a traced column in a block then dropped from the text. */
static bool tb__cg_matmul_b_runs(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims) {
    tb__plan_mm mm = tb__plan_mm_of(g->G, k->core);
    int32_t kv, col, i;
    size_t mark = g->ix.body.len;
    char flat[TB__LF_TEXT];
    bool ok, unit = false, whole = mm.n % k->rn == 0 || tb__cg_mm_shifted(g, k);
    if (!whole || !tb__cg_matmul_f32_view(g, k, 1)) return false;
    kv = tb__ix_new_var(&g->ix, 0, mm.k > 0 ? mm.k - 1 : 0);
    col = tb__ix_new_var(&g->ix, 0, mm.n - 1);
    if (kv < 0 || col < 0) return false;
    g->ix.vars[col].traced = 1;
    g->ix.period = 0;
    flat[0] = '\0';
    g->capture = flat;
    g->capture_slot = -1;
    tb__ix_open(&g->ix, "");
    ok = tb__cg_matmul_operand(g, k, 1, bdims, kv, col) >= 0;
    tb__ix_close(&g->ix, "");
    g->capture = NULL;
    tb__ix_drop(&g->ix, mark);
    ok = ok && g->ix.status == TB_OK && g->capture_slot >= 0 && g->ix.period == 0;
    for (i = 0; ok && i < g->capture_flat.n; i++) {
        int32_t v = g->capture_flat.var[i];
        if (v == col) {
            unit = g->capture_flat.coef[i] == 1;
        } else {
            ok = !g->ix.vars[v].traced;
        }
    }
    return ok && unit; /* (a column broadcast along the row is no run) */
}

/* The most steps of K a table of row offsets holds (tb__cg_matmul_rows_table). */
#define TB__CG_ROW_TABLE_MAX 16384

/* Splits the flat index of an operand read in place at depth variable `ik` (B's row, or A's
   value in the register matmul) into a part that does not change along the depth, as C text in
   `rest`, and a part that depends on the depth alone, worked out for each of the K steps into
   rows[]: true where every term of the form is a variable declared before the depth loop (the
   column, the batch index) or one the index lines compute from the depth alone. A convolution's
   windows are such rows: the depth is unravelled into channel, kernel row and kernel column (two
   divisions and three remainders a step, as many scalar instructions as the step's FMAs take
   cycles, some on the port of the vector units), where a table lookup is one load. */
static bool tb__cg_matmul_rows_table(tb__cg *g, const tb__lf *flat, int32_t ik, int64_t K,
                                     int64_t *rows, char *rest, size_t cap) {
    tb__lf fixed;
    int64_t x, s;
    int32_t i;
    if (K < 1 || K > TB__CG_ROW_TABLE_MAX) return false;
    tb__lf_const(&fixed, flat->c);
    for (i = 0; i < flat->n; i++)
        if (flat->var[i] < ik && !tb__lf_add_term(&fixed, flat->var[i], flat->coef[i]))
            return false;
    for (x = 0; x < K; x++) {
        rows[x] = 0;
        for (i = 0; i < flat->n; i++) {
            if (flat->var[i] < ik) continue;
            if (!tb__ix_value(&g->ix, flat->var[i], ik, x, &s)) return false;
            rows[x] += flat->coef[i] * s;
        }
    }
    tb__lf_text(&fixed, rest, cap);
    return true;
}

/* Puts a table of an operand's row offsets (K entries, named `name`: tb_krow for B's) into
   the kernel's text at `mark`. */
static void tb__cg_insert_table(tb__cg *g, size_t mark, const char *name, const int64_t *rows,
                                int64_t K) {
    bool narrow = true;
    char *tail;
    int64_t i;
    for (i = 0; i < K; i++)
        narrow = narrow && rows[i] >= INT32_MIN && rows[i] <= INT32_MAX;
    if (g->ix.body.failed || g->ix.body.data == NULL || mark > g->ix.body.len) return;
    tail = tb__strdup(g->ix.body.data + mark);
    if (tail == NULL) {
        tb__ix_fail(&g->ix, TB_ERR_OUT_OF_MEMORY);
        return;
    }
    tb__ix_drop(&g->ix, mark);
    tb__cg_const_table(g, narrow ? "int" : "long", name, rows, (int32_t)K);
    tb__str_append(&g->ix.body, "%s", tail);
    tb__free(tail);
}

/* Whether a register matmul whose B runs (its flat index at the block's first column in
   g->capture_flat, at depth variable kv) reads B's rows and A's values at tables of their
   offsets, one entry per step of K: B's into tab[0, K) (the part outside it as C text in
   rest[0]) and, where A is an f32 buffer seen through views, A's into tab[K, 2K) (rest[1 +
   i] for row i of the block; every row the same offsets, tab[2K, 3K) the check's), A's
   buffer slot in *a_slot. A convolution's depth is its channel, kernel row and kernel column
   (two divisions and three remainders a step), which the tables make one load each: the
   input gradient of a LeNet-like convolution (1 x 896 x 800 per image, 4 vectors a step).
   Only where an index divides the depth (one affine in it costs less than a load). */
static bool tb__cg_matmul_reg_tables(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                     const int32_t *rows, int32_t kv, int64_t K, int64_t *tab,
                                     char (*rest)[TB__LF_TEXT], int32_t *a_slot) {
    tb__lf fb = g->capture_flat;
    char flat[TB__LF_TEXT];
    int32_t i, l;
    bool digits = false; /* a term on a variable computed from the depth: a division */
    for (i = 0; i < fb.n; i++)
        digits = digits || fb.var[i] > kv;
    if (!tb__cg_matmul_rows_table(g, &fb, kv, K, tab, rest[0], TB__LF_TEXT) ||
        !tb__cg_matmul_f32_view(g, k, 0))
        return false;
    for (i = 0; i < k->rm; i++) {
        int64_t *fill = i == 0 ? tab + K : tab + 2 * K;
        flat[0] = '\0';
        g->capture = flat;
        g->capture_slot = -1;
        if (tb__cg_matmul_operand(g, k, 0, bdims, rows[i], kv) < 0) {
            g->capture = NULL;
            return false;
        }
        g->capture = NULL;
        if (g->capture_slot < 0 || (i > 0 && g->capture_slot != *a_slot)) return false;
        *a_slot = g->capture_slot;
        for (l = 0; l < g->capture_flat.n; l++)
            digits = digits || g->capture_flat.var[l] > kv;
        if (!tb__cg_matmul_rows_table(g, &g->capture_flat, kv, K, fill, rest[1 + i], TB__LF_TEXT) ||
            (i > 0 && memcmp(tab + K, fill, (size_t)K * sizeof *tab) != 0))
            return false;
    }
    return digits;
}

/* The depth loop and stores of an f32 register matmul with nb vector accumulators per row of
   the block, of tb__plan_mm_reg_lanes lanes (rn <= 64): each
   step of K makes B's rn values nb vectors (lanes past rn zero; loads where they lie in a
   row of a buffer: tb__cg_matmul_b_runs, else the dialect's vec_make) and adds them times
   each row's A value. */
static tb_status tb__cg_matmul_registers_vec(tb__cg *g, const tb__plan_kernel *k,
                                             const tb__lf *bdims, const int32_t *rows,
                                             const int32_t *cols) {
    int32_t kv, i, j, vb[64], w = tb__plan_mm_reg_lanes(g->G->target->tuning, k->rn);
    int32_t nb = (k->rn + w - 1) / w, b_slot, a_slot = -1;
    int64_t K = tb__plan_mm_of(g->G, k->core).k, *tab = NULL;
    char zero[48], tv[16], flat[TB__LF_TEXT];
    char rest[17][TB__LF_TEXT]; /* with tables: B's part of the flat index outside them, A's */
    bool runs = k->rn == nb * w && tb__cg_matmul_b_runs(g, k, bdims), tables = false;
    size_t mark = 0;
    snprintf(tv, sizeof tv, "float%d", (int)w);
    snprintf(zero, sizeof zero, g->d->vec_zero, tv);
    for (i = 0; i < k->rm; i++)
        for (j = 0; j < nb; j++)
            tb__ix_line(&g->ix, "%s accv%d_%d = %s;", tv, (int)i, (int)j, zero);
    if (runs) { /* B's value at the first column read for its flat index, then nb loads */
        flat[0] = '\0';
        g->capture = flat;
        g->capture_slot = -1;
        mark = g->ix.body.len;
        kv = tb__cg_matmul_depth_open(g, k, bdims, cols, 1, vb);
        g->capture = NULL;
        if (kv < 0) return g->ix.status;
        b_slot = g->capture_slot;
        if (b_slot < 0) {
            tb__ix_fail(&g->ix, tb__error(TB_ERR_INTERNAL,
                                          "codegen: %s reads B by rows but no buffer", k->name));
            return g->ix.status;
        }
        if (K >= 1 && K <= TB__CG_ROW_TABLE_MAX) {
            tab = (int64_t *)tb__calloc((size_t)(3 * K), sizeof *tab);
            if (tab == NULL) return tb__ix_fail(&g->ix, TB_ERR_OUT_OF_MEMORY);
            tables = tb__cg_matmul_reg_tables(g, k, bdims, rows, kv, K, tab, rest, &a_slot);
        }
        if (tables) {
            tb__ix_line(&g->ix, "%sconst float *br = b%d + (%s) + tb_krow[i%d];", g->d->global,
                        (int)b_slot, rest[0], (int)kv);
        } else {
            tb__ix_line(&g->ix, "%sconst float *br = b%d + (%s);", g->d->global, (int)b_slot, flat);
        }
        for (j = 0; j < nb; j++)
            tb__ix_line(&g->ix, "const %s bv%d = vload%d(%d, br);", tv, (int)j, (int)w, (int)j);
    } else {
        kv = tb__cg_matmul_depth_open(g, k, bdims, cols, k->rn, vb);
        if (kv < 0) return g->ix.status;
        for (j = 0; j < nb; j++) /* lanes past rn: zeros */
            tb__cg_vector_of_lanes(g, tv, j, w, k->rn - j * w, "v%d", vb + j * w, "0.0f");
    }
    for (i = 0; i < k->rm; i++) {
        char av[24]; /* the row's value of A: read at the table's offset, or the operand's */
        if (tables) {
            snprintf(av, sizeof av, "am%d", (int)i);
            tb__ix_line(&g->ix, "const float %s = b%d[(%s) + tb_karow[i%d]];", av, (int)a_slot,
                        rest[1 + i], (int)kv);
        } else {
            int32_t va = tb__cg_matmul_operand(g, k, 0, bdims, rows[i], kv);
            if (va < 0) break;
            snprintf(av, sizeof av, "v%d", (int)va);
        }
        for (j = 0; j < nb; j++)
            tb__ix_line(&g->ix, "accv%d_%d += %s * bv%d;", (int)i, (int)j, av, (int)j);
    }
    tb__ix_close(&g->ix, "");
    /* the tables in front of the loop, at the kernel's outermost scope (OpenCL's rule for its
       constants) */
    if (tables) {
        tb__cg_insert_table(g, mark, "tb_karow", tab + K, K);
        tb__cg_insert_table(g, mark, "tb_krow", tab, K);
    }
    tb__free(tab);
    if (g->ix.status != TB_OK) return g->ix.status;
    /* rows of rn: a row's last vector writes its lanes past rn into the next row, which the
       next row's stores then overwrite (the spare row takes the last one's); with rows of
       nb * w, the compiler would copy the block out column by column */
    tb__ix_line(&g->ix, "float acc[%d][%d];", (int)k->rm + 1, (int)k->rn);
    for (i = 0; i < k->rm; i++)
        for (j = 0; j < nb; j++)
            tb__ix_line(&g->ix, "vstore%d(accv%d_%d, 0, &acc[0][0] + %d);", (int)w, (int)i, (int)j,
                        (int)(i * k->rn + j * w));
    tb__cg_matmul_stores(g, k, bdims, "row0 + ii", "col0 + jj", (int32_t)k->rm, (int32_t)k->rn);
    return g->ix.status;
}

/* Matmul from registers (CPU devices without packing: integers, small sizes): no work-group
   memory (the caches tile), each work item an rm x rn block of the output, operands read at
   clamped rows and columns where the blocks do not divide the axis (always in bounds; the
   epilogue writes only the real ones), a work item past the output returning at once. */
static tb_status tb__cg_kernel_matmul_registers(tb__cg *g, const tb__plan_kernel *k) {
    const tb_shape *cs = tb__plan_shape(g->G, k->core);
    tb__plan_mm mm = tb__plan_mm_of(g->G, k->core);
    int32_t i0, kv, i, j, rows[16], cols[64], va[16], vb[64];
    tb_dtype od = cs->dtype;
    const char *acc_t = tb__cg_acc_ctype(od);
    tb__lf bdims[TB_MAX_RANK];
    char id0[48], id1[48], id2[48];
    bool vec = od == TB_F32 && g->d->vec_make != NULL && k->rn > 1;
    bool shifted = tb__cg_mm_shifted(g, k);
    if (k->rm > 16 || k->rn > (vec ? 64 : 16)) {
        tb__ix_fail(&g->ix, tb__error(TB_ERR_INTERNAL, "codegen: a register block of %dx%d",
                                      (int)k->rm, (int)k->rn));
        return g->ix.status;
    }
    tb__cg_id(id0, sizeof id0, g->d->global_id, 0);
    tb__cg_id(id1, sizeof id1, g->d->global_id, 1);
    tb__cg_id(id2, sizeof id2, g->d->global_id, 2);
    tb__ix_line(&g->ix, "const long %s = (long)%s * %d, row0 = (long)%s * %d;",
                shifted ? "colb" : "col0", id0, (int)k->rn, id1, (int)k->rm);
    if (shifted)
        tb__ix_line(&g->ix, "const long col0 = colb < %lldL ? colb : %lldL;",
                    (long long)(mm.n - k->rn), (long long)(mm.n - k->rn));
    /* where the blocks divide an axis (or the last is moved) its reads are not clamped, so the
       work items a group pads the grid with (OpenCL CPU devices: groups of 8 x 4) read nothing */
    if (shifted || mm.m % k->rm == 0 || mm.n % k->rn == 0)
        tb__ix_line(&g->ix, "if (row0 >= %lldL || %s >= %lldL) return;", (long long)mm.m,
                    shifted ? "colb" : "col0", (long long)mm.n);
    i0 = tb__ix_new_var(&g->ix, 0, mm.batch > 0 ? mm.batch - 1 : 0);
    if (i0 < 0) return g->ix.status;
    tb__ix_line(&g->ix, "const long i%d = (long)%s;", (int)i0, id2);
    if (!tb__cg_batch_dims(g, cs, i0, bdims)) return g->ix.status;
    for (i = 0; i < k->rm; i++) {
        rows[i] = tb__ix_new_var(&g->ix, 0, mm.m - 1);
        if (rows[i] < 0) return g->ix.status;
        if (mm.m % k->rm == 0) { /* every block whole: no clamp */
            tb__ix_line(&g->ix, "const long i%d = row0 + %d;", (int)rows[i], (int)i);
        } else {
            tb__ix_line(&g->ix, "const long i%d = %s(row0 + %d, %lldL);", (int)rows[i],
                        g->d->min_long, (int)i, (long long)(mm.m - 1));
        }
    }
    for (j = 0; j < k->rn; j++) {
        cols[j] = tb__ix_new_var(&g->ix, 0, mm.n - 1);
        if (cols[j] < 0) return g->ix.status;
        if (mm.n % k->rn == 0 || shifted) { /* consecutive columns: read as one */
            tb__ix_line(&g->ix, "const long i%d = col0 + %d;", (int)cols[j], (int)j);
        } else {
            tb__ix_line(&g->ix, "const long i%d = %s(col0 + %d, %lldL);", (int)cols[j],
                        g->d->min_long, (int)j, (long long)(mm.n - 1));
        }
    }
    if (vec) return tb__cg_matmul_registers_vec(g, k, bdims, rows, cols);
    tb__ix_line(&g->ix, "%s acc[%d][%d];", acc_t, (int)k->rm, (int)k->rn);
    tb__ix_line(&g->ix, "for (int ii = 0; ii < %d; ii++)", (int)k->rm);
    tb__ix_line(&g->ix, "    for (int jj = 0; jj < %d; jj++) acc[ii][jj] = 0;", (int)k->rn);
    kv = tb__cg_matmul_depth_open(g, k, bdims, cols, k->rn, vb);
    if (kv < 0) return g->ix.status;
    for (i = 0; i < k->rm; i++) {
        va[i] = tb__cg_matmul_operand(g, k, 0, bdims, rows[i], kv);
        if (va[i] < 0) return g->ix.status;
    }
    for (i = 0; i < k->rm; i++) {
        for (j = 0; j < k->rn; j++) {
            if (tb_dtype_is_float(od)) {
                tb__ix_line(&g->ix, "acc[%d][%d] += v%d * v%d;", (int)i, (int)j, (int)va[i],
                            (int)vb[j]);
            } else {
                tb__ix_line(&g->ix, "acc[%d][%d] += (%s)v%d * (%s)v%d;", (int)i, (int)j, acc_t,
                            (int)va[i], acc_t, (int)vb[j]);
            }
        }
    }
    tb__ix_close(&g->ix, "");
    tb__cg_matmul_stores(g, k, bdims, "row0 + ii", "col0 + jj", (int32_t)k->rm, (int32_t)k->rn);
    return g->ix.status;
}

/* The offset of A's matrix for batch index `ib` of a matmul that reads A in place (A
   contiguous, broadcast over the batch where its dims are 1), as C text. */
static void tb__cg_matmul_a_offset(tb__cg *g, const tb__plan_kernel *k, int32_t ib, char *out,
                                   size_t size) {
    const tb_shape *cs = tb__plan_shape(g->G, k->core);
    const tb_shape *as = tb__plan_shape(g->G, tb__plan_mm_a_buffer(g->G, k->core));
    int64_t below = 1, stride = as->dims[as->rank - 1] * as->dims[as->rank - 2];
    size_t used = (size_t)snprintf(out, size, "0");
    int32_t d;
    for (d = cs->rank - 3; d >= 0; d--) {
        if (as->dims[d] != 1 && used < size)
            used += (size_t)snprintf(out + used, size - used, " + (i%d / %lldL %% %lldL) * %lldL",
                                     (int)ib, (long long)below, (long long)cs->dims[d],
                                     (long long)stride);
        below *= cs->dims[d];
        stride *= as->dims[d];
    }
}

/* The prefetch, in a packed matmul's loop over the depth (variable ik, K steps) that reads B's
   rows in place at the table's offsets (base `rest`), of the row k->mm_prefetch_b steps
   ahead (the last row near the end): each 64-byte line of its `width` values at the block's
   column, the last value's too (a row that starts inside a line ends in one more). Every
   address is one the loop reads. */
static void tb__cg_matmul_prefetch_b(tb__cg *g, const tb__plan_kernel *k, const char *t,
                                     const char *rest, int32_t ik, int64_t K, int width) {
    int per_line = 64 / (int)tb__plan_pack_bytes(g->G, k), off;
    tb__ix_line(&g->ix, "%sconst %s *bf = b%d + (%s) + tb_krow[i%d < %lldL ? i%d + %d : %lldL];",
                g->d->global, t, (int)g->capture_slot, rest, (int)ik,
                (long long)(K - k->mm_prefetch_b), (int)ik, (int)k->mm_prefetch_b,
                (long long)(K - 1));
    for (off = 0; off < width; off += per_line)
        tb__ix_line(&g->ix, "TB_PREFETCH(bf + %d);", off);
    if ((width - 1) % per_line != 0) tb__ix_line(&g->ix, "TB_PREFETCH(bf + %d);", width - 1);
}

/* A packed matmul's loop over the depth, accumulating into accv<i>_<j> (declared before it):
   B from its panel at bp (in_place 0), or read in place (1: the block's columns all within
   B's N, each step of K one row of B from one address; 2: the last panel, whose vectors past
   N are neither read nor multiplied, their accumulators left at zero, and whose vector that N
   cuts is made of its lanes and zeros) at the column of the variable `lane`; A from its panels or
   itself at ap. `rows` (in place; NULL: none): the table of the rows' offsets
   (tb__cg_matmul_rows_table) the loop reads as tb_krow where *has_rows, else where the rows
   split so: then filled in and *has_rows set, for the caller to put in the kernel. */
static bool tb__cg_matmul_depth(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                int32_t lane, int in_place, int rm, int nb, int rw, bool panels_a,
                                const char *count, int64_t *rows, bool *has_rows) {
    /* the next row panel of packed A (pointer an) along, where the plan says so */
    bool prefetch_a = k->mm_prefetch_a && panels_a;
    const tb_shape *cs = tb__plan_shape(g->G, k->core);
    const char *t = tb__cg_ctype(cs->dtype);
    /* rows of the dialect's float vectors (f32, and f16 and bf16 computed in f32): each
       product added with one rounding where the target has FMA (one instruction: a multiply
       and an add share the FMA units on Intel's cores) */
    bool fma = strcmp(t, "float") == 0 && rw == g->d->vec_width;
    int64_t za[6], n = tb__plan_mm_of(g->G, k->core).n;
    /* the columns of the block that hold B's: all but in the last panel read in place */
    int64_t valid = in_place == 2 ? n - (n - 1) / (nb * rw) * (nb * rw) : (int64_t)nb * rw;
    char head[160], tv[16], flat[TB__LF_TEXT], rest[TB__LF_TEXT], zero[24];
    int32_t ik, offsets[16];
    int i, j, l;
    tb__plan_pack_sizes(g->G, k->core, true, za);
    snprintf(tv, sizeof tv, "%s%d", t, rw);
    ik = tb__ix_new_var(&g->ix, 0, za[3] - 1);
    if (ik < 0) return false;
    if (count != NULL) {
        snprintf(head, sizeof head, "for (long i%d = 0; i%d < %s; i%d++) ", (int)ik, (int)ik, count,
                 (int)ik);
    } else {
        snprintf(head, sizeof head, "for (long i%d = 0; i%d < %lldL; i%d++) ", (int)ik, (int)ik,
                 (long long)za[3], (int)ik);
    }
    tb__ix_open(&g->ix, head);
    if (in_place == 0) {
        for (j = 0; j < nb; j++)
            tb__ix_line(&g->ix, "const %s bv%d = vload%d(i%d * %d + %d, bp);", tv, j, rw, (int)ik,
                        nb, j);
    } else {
        /* the address of B's row: the flat index its first column is read at */
        flat[0] = '\0';
        g->capture = flat;
        g->capture_slot = -1;
        if (tb__cg_matmul_operand(g, k, 1, bdims, ik, lane) < 0) {
            g->capture = NULL;
            return false;
        }
        g->capture = NULL;
        if (g->capture_slot < 0) {
            tb__ix_fail(&g->ix, tb__error(TB_ERR_INTERNAL,
                                          "codegen: %s reads B in place but no buffer", k->name));
            return false;
        }
        /* the first loop fills the table; a later one checks that its rows are the same */
        int64_t *fill = rows == NULL ? NULL : (*has_rows ? rows + za[3] : rows);
        if (fill != NULL &&
            tb__cg_matmul_rows_table(g, &g->capture_flat, ik, za[3], fill, rest, sizeof rest) &&
            (fill == rows || memcmp(rows, fill, (size_t)za[3] * sizeof *rows) == 0)) {
            *has_rows = true;
            tb__ix_line(&g->ix, "%sconst %s *br = b%d + (%s) + tb_krow[i%d];", g->d->global, t,
                        (int)g->capture_slot, rest, (int)ik);
            if (in_place == 1 && k->mm_prefetch_b > 0)
                tb__cg_matmul_prefetch_b(g, k, t, rest, ik, za[3], nb * rw);
        } else {
            tb__ix_line(&g->ix, "%sconst %s *br = b%d + (%s);", g->d->global, t,
                        (int)g->capture_slot, flat);
        }
        for (j = 0; j < nb && j * rw < valid; j++) {
            if ((j + 1) * rw <= valid) {
                tb__ix_line(&g->ix, "const %s bv%d = vload%d(%d, br);", tv, j, rw, j);
                continue;
            }
            /* the vector that N cuts: its lanes, those past N zeros (made in registers; a
               copy through an array went through the stack every step) */
            for (l = 0; l < rw; l++)
                offsets[l] = j * rw + l;
            snprintf(zero, sizeof zero, "(%s)0", t);
            tb__cg_vector_of_lanes(g, tv, j, rw, (int32_t)(valid - j * rw), "br[%d]", offsets,
                                   zero);
        }
    }
    tb__ix_line(&g->ix, "%sconst %s *ak = ap + i%d * %d;", g->d->global, t, (int)ik,
                panels_a ? rm : 1);
    if (prefetch_a) tb__ix_line(&g->ix, "TB_PREFETCH_L2(an + i%d * %d);", (int)ik, rm);
    for (i = 0; i < rm; i++) {
        tb__ix_line(&g->ix, "const %s am%d = ak[%lld];", t, i,
                    (long long)(panels_a ? i : i * za[3]));
        for (j = 0; j < nb && j * rw < valid; j++) {
            if (fma) {
                tb__ix_line(&g->ix, "accv%d_%d = TB_VMAD(TB_VSPLAT(am%d), bv%d, accv%d_%d);", i, j,
                            i, j, i, j);
            } else {
                tb__ix_line(&g->ix, "accv%d_%d += am%d * bv%d;", i, j, i, j);
            }
        }
    }
    tb__ix_close(&g->ix, "");
    return g->ix.status == TB_OK;
}

/* The pointer ap to a packed matmul's A at row panel pr (row0 = pr * rm declared), depth
   `depth0` (C text, or NULL: 0) on: A's panels, one set for every batch index or one per index
   (variable ib), or A itself read in place. */
static void tb__cg_matmul_a_pointer(tb__cg *g, const tb__plan_kernel *k, int32_t ib, int32_t a_slot,
                                    bool panels_a, const char *depth0) {
    const char *t = tb__cg_ctype(tb__plan_shape(g->G, k->core)->dtype);
    int64_t za[6], K;
    int rm = (int)k->rm;
    char off[256], at[64] = "";
    tb__plan_pack_sizes(g->G, k->core, true, za);
    K = za[3];
    if (depth0 != NULL) {
        if (panels_a) {
            snprintf(at, sizeof at, " + %s * %d", depth0, rm);
        } else {
            snprintf(at, sizeof at, " + %s", depth0);
        }
    }
    if (panels_a && za[0] == 1) { /* one matrix A for every batch index */
        tb__ix_line(&g->ix, "%sconst %s *ap = b%d + pr * %lldL%s;", g->d->global, t, (int)a_slot,
                    (long long)(K * rm), at);
    } else if (panels_a) {
        tb__ix_line(&g->ix, "%sconst %s *ap = b%d + (i%d * %lldL + pr) * %lldL%s;", g->d->global, t,
                    (int)a_slot, (int)ib, (long long)za[4], (long long)(K * rm), at);
    } else {
        tb__cg_matmul_a_offset(g, k, ib, off, sizeof off);
        tb__ix_line(&g->ix, "%sconst %s *ap = b%d + (%s) + row0 * %lldL%s;", g->d->global, t,
                    (int)a_slot, off, (long long)K, at);
    }
}

/* A work item's own column panel of B (column col0 on, declared), its rows `pk0` to `pk1`
   (C text) into its buffer bpk, row pk0 at the buffer's start where `from_pk0` (else row 0).
   Where the dialect has noinline, the packing is a function of its own that the item calls:
   with its loops in the same function as the matmul's, gcc tuned for AMD's cores (znver3,
   what -march=native picks on Zen 3 to 5) keeps the packing's integers in vector registers
   that the matmul's loop then lacks, and that loop reads B's vectors from the stack (Zen 5,
   ResNet-18's weight gradient of 256 x 2304 x 1568 on 2 threads: 9.8 ms, 5.3 ms apart). */
static bool tb__cg_matmul_own_b_pack(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                     const char *pk0, const char *pk1, bool from_pk0) {
    char params[160], args[160];
    tb__cg_helper h;
    bool ok;
    if (g->d->noinline == NULL) {
        tb__ix_open(&g->ix, "");
        tb__ix_line(&g->ix, "const long pk0 = %s, pk1 = %s, pl0 = col0;", pk0, pk1);
        ok = tb__cg_pack_panel(g, k, bdims, "bpk", "0", from_pk0 ? "pk0" : NULL);
        tb__ix_close(&g->ix, "");
        return ok;
    }
    tb__cg_helper_begin(g, &h);
    ok = tb__cg_pack_panel(g, k, bdims, "bpk", "0", from_pk0 ? "pk0" : NULL);
    snprintf(params, sizeof params,
             ", %s *restrict bpk, const long pk0, const long pk1, const long pl0",
             tb__cg_ctype(tb__plan_shape(g->G, k->core)->dtype));
    snprintf(args, sizeof args, ", bpk, %s, %s, col0", pk0, pk1);
    return tb__cg_helper_end(g, &h, ok, params, args);
}

/* The body of a packed matmul whose work item packs its own column panel of B own_b_k rows at
   a time (fewer than K: tb__plan_kernel.own_b_k), after the item's column `pc` and batch index
   (variable ib, bdims) are set: for each fill of the item's buffer bpk, each row panel's
   accumulators come from its tile of ct, run over the fill's rows and go back; the epilogue
   then stores every row panel from ct. An item of several column panels (own_b_span: item
   pc takes panels pc * own_b_span on) packs and runs each in turn for each fill, with a
   tile of ct per panel. */
static bool tb__cg_matmul_own_b_fills(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                      int32_t ib, int32_t a_slot, bool panels_a, int rw, int nb) {
    const tb_shape *cs = tb__plan_shape(g->G, k->core);
    const char *t = tb__cg_ctype(cs->dtype);
    int64_t za[6], zb[6], K, fill = k->own_b_k, npr, panels = k->own_b_span > 1 ? k->own_b_span : 1;
    int rm = (int)k->rm, vw = (int)k->rn, i, j;
    char tv[16], head[192], tile[32];
    tb__plan_pack_sizes(g->G, k->core, true, za);
    tb__plan_pack_sizes(g->G, k->core, false, zb);
    K = za[3];
    npr = za[4];
    snprintf(tv, sizeof tv, "%s%d", t, rw);
    snprintf(tile, sizeof tile, panels > 1 ? "ct[pp][pr]" : "ct[pr]");
    if (panels > 1) {
        tb__ix_line(&g->ix, "const long pc0 = pc * %lldL;", (long long)panels);
        tb__ix_line(&g->ix, "const long pcn = %lldL - pc0 < %lldL ? %lldL - pc0 : %lldL;",
                    (long long)zb[4], (long long)panels, (long long)zb[4], (long long)panels);
        tb__ix_line(&g->ix, "%s ct[%lld][%lld][%d][%d];", t, (long long)panels, (long long)npr, rm,
                    vw);
    } else {
        tb__ix_line(&g->ix, "const long col0 = pc * %d;", vw);
        tb__ix_line(&g->ix, "%s ct[%lld][%d][%d];", t, (long long)npr, rm, vw);
    }
    tb__ix_line(&g->ix, "%s bpk[%lld];", t, (long long)(fill * vw));
    tb__ix_line(&g->ix, "for (long l = 0; l < %lldL; l++) ((%s *)ct)[l] = 0;",
                (long long)(panels * npr * rm * vw), t);
    snprintf(head, sizeof head, "for (long kc0 = 0; kc0 < %lldL; kc0 += %lldL) ", (long long)K,
             (long long)fill);
    tb__ix_open(&g->ix, head);
    tb__ix_line(&g->ix, "const long kn = %lldL - kc0 < %lldL ? %lldL - kc0 : %lldL;", (long long)K,
                (long long)fill, (long long)K, (long long)fill);
    if (panels > 1) {
        tb__ix_open(&g->ix, "for (long pp = 0; pp < pcn; pp++) ");
        tb__ix_line(&g->ix, "const long col0 = (pc0 + pp) * %d;", vw);
    }
    if (!tb__cg_matmul_own_b_pack(g, k, bdims, "kc0", "kc0 + kn", true)) return false;
    tb__ix_line(&g->ix, "const %s *bp = bpk;", t);
    snprintf(head, sizeof head, "for (long pr = 0; pr < %lldL; pr++) ", (long long)npr);
    tb__ix_open(&g->ix, head);
    if (!panels_a) tb__ix_line(&g->ix, "const long row0 = pr * %d;", rm);
    tb__cg_matmul_a_pointer(g, k, ib, a_slot, panels_a, "kc0");
    for (i = 0; i < rm; i++)
        for (j = 0; j < nb; j++)
            tb__ix_line(&g->ix, "%s accv%d_%d = vload%d(%d, %s[%d]);", tv, i, j, rw, j, tile, i);
    if (!tb__cg_matmul_depth(g, k, bdims, -1, 0, rm, nb, rw, panels_a, "kn", NULL, NULL))
        return false;
    for (i = 0; i < rm; i++)
        for (j = 0; j < nb; j++)
            tb__ix_line(&g->ix, "vstore%d(accv%d_%d, %d, %s[%d]);", rw, i, j, j, tile, i);
    tb__ix_close(&g->ix, "");
    if (panels > 1) tb__ix_close(&g->ix, "");
    tb__ix_close(&g->ix, "");
    if (panels > 1) {
        tb__ix_open(&g->ix, "for (long pp = 0; pp < pcn; pp++) ");
        tb__ix_line(&g->ix, "const long col0 = (pc0 + pp) * %d;", vw);
    }
    snprintf(head, sizeof head, "for (long pr = 0; pr < %lldL; pr++) ", (long long)npr);
    tb__ix_open(&g->ix, head);
    tb__ix_line(&g->ix, "const long row0 = pr * %d;", rm);
    tb__ix_line(&g->ix, "%s (*acc)[%d] = %s;", t, vw, tile);
    if (!tb__cg_matmul_stores(g, k, bdims, "row0 + ii", "col0 + jj", (int32_t)k->rm,
                              (int32_t)k->rn))
        return false;
    tb__ix_close(&g->ix, "");
    if (panels > 1) tb__ix_close(&g->ix, "");
    return g->ix.status == TB_OK;
}

/* Matmul from the panels of the pack kernels before it: each work item an rm x width block of
   the output, rows of `width` lanes held as nb registers of the device's width (its row vectors'
   lanes: f64 half as many) each; the inner loop reads nb vectors of B and rm values of A per
   step of K: consecutive ones of A's panel, or (no panels of A: A is a contiguous buffer whose
   rows fill whole panels) one from each of the block's rows of A itself, and adds each A value
   times each B vector into its accumulator. */
static tb_status tb__cg_kernel_matmul_packed(tb__cg *g, const tb__plan_kernel *k) {
    const tb_shape *cs = tb__plan_shape(g->G, k->core);
    int64_t za[6], zb[6], K;
    int rm = (int)k->rm, vw = (int)k->rn, i, j, nb, rw;
    const char *t = tb__cg_ctype(cs->dtype);
    char tv[16], zero[48], head[160], id0[48], id1[48], id2[48], pk1[32];
    int32_t ib, a_slot = k->pack_slot[0];
    bool panels_a = a_slot >= 0;
    tb__lf bdims[TB_MAX_RANK];
    tb__plan_pack_sizes(g->G, k->core, true, za);
    tb__plan_pack_sizes(g->G, k->core, false, zb);
    K = za[3];
    if (!panels_a) {
        int32_t a = tb__plan_mm_a_buffer(g->G, k->core);
        a_slot = a >= 0 ? g->G->info[a].slot : -1;
    }
    rw = tb__plan_mm_reg_width(g->G, k);
    nb = vw / rw;
    snprintf(tv, sizeof tv, "%s%d", t, rw);
    if (!tb__cg_arg(g, TB__ARG_BUF, a_slot) ||
        (k->pack_slot[1] >= 0 && !tb__cg_arg(g, TB__ARG_BUF, k->pack_slot[1])))
        return g->ix.status;
    ib = tb__ix_new_var(&g->ix, 0, zb[0] - 1);
    if (ib < 0) return g->ix.status;
    tb__cg_id(id0, sizeof id0, g->d->global_id, 0);
    tb__cg_id(id1, sizeof id1, g->d->global_id, 1);
    tb__cg_id(id2, sizeof id2, g->d->global_id, 2);
    if (k->own_b) {
        tb__ix_line(&g->ix, "const long pc = (long)%s;", id0);
    } else if (k->mm_group > 0) {
        /* the items in groups of mm_group column panels, each group row panel by row panel
           (the last group may be narrower) */
        long long gw = k->mm_group, npc = zb[4], npr = za[4], last = npc - (npc - 1) / gw * gw;
        tb__ix_line(&g->ix, "const long pw = (long)%s * %lldL + (long)%s;", id1, npc, id0);
        tb__ix_line(&g->ix, "const long pg = pw / %lldL, pq = pw %% %lldL;", gw * npr, gw * npr);
        tb__ix_line(&g->ix, "const long pgw = (pg + 1) * %lldL <= %lldL ? %lldL : %lldL;", gw, npc,
                    gw, last);
        tb__ix_line(&g->ix, "const long pr = pq / pgw, pc = pg * %lldL + pq %% pgw;", gw);
    } else {
        tb__ix_line(&g->ix, "const long pc = (long)%s, pr = (long)%s;", id0, id1);
    }
    tb__ix_line(&g->ix, "const long i%d = (long)%s;", (int)ib, id2);
    if (!tb__cg_batch_dims(g, cs, ib, bdims)) return g->ix.status;
    if (k->own_b && k->own_b_k < K) {
        tb__cg_matmul_own_b_fills(g, k, bdims, ib, a_slot, panels_a, rw, nb);
        return g->ix.status;
    }
    if (k->own_b) {
        /* B's column panel packed into the item's own buffer, then every row panel */
        tb__ix_line(&g->ix, "const long col0 = pc * %d;", vw);
        tb__ix_line(&g->ix, "%s bpk[%lld];", t, (long long)(K * vw));
        snprintf(pk1, sizeof pk1, "%lldL", (long long)K);
        if (!tb__cg_matmul_own_b_pack(g, k, bdims, "0", pk1, false)) return g->ix.status;
        tb__ix_line(&g->ix, "const %s *bp = bpk;", t);
        snprintf(head, sizeof head, "for (long pr = 0; pr < %lldL; pr++) ", (long long)za[4]);
        tb__ix_open(&g->ix, head);
        tb__ix_line(&g->ix, "const long row0 = pr * %d;", rm);
    } else {
        tb__ix_line(&g->ix, "const long col0 = pc * %d, row0 = pr * %d;", vw, rm);
    }
    tb__cg_matmul_a_pointer(g, k, ib, a_slot, panels_a, NULL);
    if (k->mm_prefetch_a && panels_a)
        tb__ix_line(&g->ix, "%sconst %s *an = pr + 1 < %lldL ? ap + %lldL : ap;", g->d->global, t,
                    (long long)za[4], (long long)(K * rm));
    if (k->pack_slot[1] >= 0)
        tb__ix_line(&g->ix, "%sconst %s *bp = b%d + (i%d * %lldL + pc) * %lldL;", g->d->global, t,
                    (int)k->pack_slot[1], (int)ib, (long long)zb[4], (long long)(K * vw));
    snprintf(zero, sizeof zero, g->d->vec_zero, tv);
    for (i = 0; i < rm; i++)
        for (j = 0; j < nb; j++)
            tb__ix_line(&g->ix, "%s accv%d_%d = %s;", tv, i, j, zero);
    if (k->pack_slot[1] >= 0 || k->own_b) {
        if (!tb__cg_matmul_depth(g, k, bdims, -1, 0, rm, nb, rw, panels_a, NULL, NULL, NULL))
            return g->ix.status;
    } else {
        /* B in place: whole panels read rows of B; the last, partial one reads what is left */
        int64_t n = tb__plan_mm_of(g->G, k->core).n;
        int32_t lane = tb__ix_new_var(&g->ix, 0, n - 1);
        if (lane < 0) return g->ix.status;
        size_t mark;
        int64_t *rows = NULL;
        bool has_rows = false, ok;
        if (K <= TB__CG_ROW_TABLE_MAX) {
            rows = (int64_t *)tb__calloc((size_t)(2 * K), sizeof *rows);
            if (rows == NULL) return tb__ix_fail(&g->ix, TB_ERR_OUT_OF_MEMORY);
        }
        tb__ix_line(&g->ix, "const long i%d = col0;", (int)lane);
        mark = g->ix.body.len;
        snprintf(head, sizeof head, "if (col0 + %dL <= %lldL) ", vw, (long long)n);
        tb__ix_open(&g->ix, head);
        ok = tb__cg_matmul_depth(g, k, bdims, lane, 1, rm, nb, rw, panels_a, NULL, rows, &has_rows);
        tb__ix_close(&g->ix, " else");
        tb__ix_open(&g->ix, "");
        ok = ok &&
             tb__cg_matmul_depth(g, k, bdims, lane, 2, rm, nb, rw, panels_a, NULL, rows, &has_rows);
        tb__ix_close(&g->ix, "");
        /* the table in front of the loops, at the kernel's outermost scope (OpenCL's rule for
           its constants) */
        if (ok && has_rows) tb__cg_insert_table(g, mark, "tb_krow", rows, K);
        tb__free(rows);
        if (!ok) return g->ix.status;
    }
    tb__ix_line(&g->ix, "%s acc[%d][%d];", t, rm, vw);
    for (i = 0; i < rm; i++)
        for (j = 0; j < nb; j++)
            tb__ix_line(&g->ix, "vstore%d(accv%d_%d, %d, acc[%d]);", rw, i, j, j, i);
    tb__cg_matmul_stores(g, k, bdims, "row0 + ii", "col0 + jj", (int32_t)k->rm, (int32_t)k->rn);
    if (k->own_b) tb__ix_close(&g->ix, "");
    return g->ix.status;
}

#endif /* TB__HAVE_COMPILED_BACKENDS */
