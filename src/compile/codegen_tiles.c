/* ===========================================================================================
   C-family code generator, the work-group tile matmul (GPUs: tiles of A and B in work-group
   memory, a block of outputs per work item) and the choice among a matmul's kernels, around
   the stores of codegen_matmul.c.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* Loads the tiles of A and B of depth kt into work-group memory. */
static bool tb__cg_matmul_tiles_load(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                     int32_t w, int32_t tm, int32_t tn) {
    tb__plan_mm mm = tb__plan_mm_of(g->G, k->core);
    const char *t = tb__cg_ctype(tb__plan_shape(g->G, k->core)->dtype);
    char head[160];
    int side;
    for (side = 0; side < 2; side++) {
        int32_t vr, vc, v;
        int tile_rows = side == 0 ? tm : k->tk, tile_cols = side == 0 ? k->tk : tn;
        snprintf(head, sizeof head, "for (int l = ly * %d + lx; l < %d; l += %d) ", (int)w,
                 tile_rows * tile_cols, (int)(w * w));
        tb__ix_open(&g->ix, head);
        tb__ix_line(&g->ix, "const int lr = l / %d, lc = l %% %d;", tile_cols, tile_cols);
        if (side == 0) {
            tb__ix_line(&g->ix, "const long gr = row0 + lr, gc = kt + lc;");
        } else {
            tb__ix_line(&g->ix, "const long gr = kt + lr, gc = col0 + lc;");
        }
        tb__ix_line(&g->ix, "%s e = 0;", t);
        snprintf(head, sizeof head, "if (gr < %lldL && gc < %lldL) ",
                 (long long)(side == 0 ? mm.m : mm.k), (long long)(side == 0 ? mm.k : mm.n));
        tb__ix_open(&g->ix, head);
        vr = tb__ix_new_var(&g->ix, 0, (side == 0 ? mm.m : mm.k) - 1);
        vc = tb__ix_new_var(&g->ix, 0, (side == 0 ? mm.k : mm.n) - 1);
        if (vr < 0 || vc < 0) return false;
        tb__ix_line(&g->ix, "const long i%d = gr, i%d = gc;", (int)vr, (int)vc);
        v = tb__cg_matmul_operand(g, k, side, bdims, vr, vc);
        if (v < 0) return false;
        tb__ix_line(&g->ix, "e = v%d;", (int)v);
        tb__ix_close(&g->ix, "");
        tb__ix_line(&g->ix, "%s", side == 0 ? "As[lc][lr] = e;" : "Bs[lr][lc] = e;");
        tb__ix_close(&g->ix, "");
    }
    return g->ix.status == TB_OK;
}

/* Matmul in work-group memory tiles (GPUs): a w x w work-group computes a (w rm) x (w rn)
   block, each item rm x rn outputs strided by w. */
static tb_status tb__cg_kernel_matmul_tiles(tb__cg *g, const tb__plan_kernel *k) {
    const tb_shape *cs = tb__plan_shape(g->G, k->core);
    tb__plan_mm mm = tb__plan_mm_of(g->G, k->core);
    int32_t w = (int32_t)k->group_size[0], tm = w * k->rm, tn = w * k->rn, i0;
    tb_dtype od = cs->dtype;
    const char *t = tb__cg_ctype(od), *acc_t = tb__cg_acc_ctype(od);
    tb__lf bdims[TB_MAX_RANK];
    char head[160], rows[64], cols[64], name[32], lx[48], ly[48], gx[48], gy[48], gz[48];
    tb__cg_id(lx, sizeof lx, g->d->local_id, 0);
    tb__cg_id(ly, sizeof ly, g->d->local_id, 1);
    tb__cg_id(gx, sizeof gx, g->d->group_id, 0);
    tb__cg_id(gy, sizeof gy, g->d->group_id, 1);
    tb__cg_id(gz, sizeof gz, g->d->group_id, 2);
    snprintf(name, sizeof name, "As[%d]", (int)k->tk);
    tb__cg_local(g, t, name, tm);
    snprintf(name, sizeof name, "Bs[%d]", (int)k->tk);
    tb__cg_local(g, t, name, tn);
    tb__ix_line(&g->ix, "const int lx = (int)%s, ly = (int)%s;", lx, ly);
    tb__ix_line(&g->ix, "const long row0 = (long)%s * %d, col0 = (long)%s * %d;", gy, (int)tm, gx,
                (int)tn);
    i0 = tb__ix_new_var(&g->ix, 0, mm.batch > 0 ? mm.batch - 1 : 0);
    if (i0 < 0) return g->ix.status;
    tb__ix_line(&g->ix, "const long i%d = (long)%s;", (int)i0, gz);
    if (!tb__cg_batch_dims(g, cs, i0, bdims)) return g->ix.status;
    tb__ix_line(&g->ix, "%s acc[%d][%d];", acc_t, (int)k->rm, (int)k->rn);
    tb__ix_line(&g->ix, "for (int ii = 0; ii < %d; ii++)", (int)k->rm);
    tb__ix_line(&g->ix, "    for (int jj = 0; jj < %d; jj++) acc[ii][jj] = 0;", (int)k->rn);
    snprintf(head, sizeof head, "for (long kt = 0; kt < %lldL; kt += %d) ", (long long)mm.k,
             (int)k->tk);
    tb__ix_open(&g->ix, head);
    if (!tb__cg_matmul_tiles_load(g, k, bdims, w, tm, tn)) return g->ix.status;
    tb__ix_line(&g->ix, "%s", g->d->barrier);
    tb__ix_line(&g->ix, "for (int kk = 0; kk < %d; kk++) {", (int)k->tk);
    tb__ix_line(&g->ix, "    %s ra[%d], rb[%d];", t, (int)k->rm, (int)k->rn);
    tb__ix_line(&g->ix, "    for (int ii = 0; ii < %d; ii++) ra[ii] = As[kk][ly + ii * %d];",
                (int)k->rm, (int)w);
    tb__ix_line(&g->ix, "    for (int jj = 0; jj < %d; jj++) rb[jj] = Bs[kk][lx + jj * %d];",
                (int)k->rn, (int)w);
    tb__ix_line(&g->ix, "    for (int ii = 0; ii < %d; ii++)", (int)k->rm);
    if (tb_dtype_is_float(od)) {
        tb__ix_line(&g->ix,
                    "        for (int jj = 0; jj < %d; jj++) acc[ii][jj] += ra[ii] * rb[jj];",
                    (int)k->rn);
    } else {
        tb__ix_line(&g->ix,
                    "        for (int jj = 0; jj < %d; jj++) acc[ii][jj] += (%s)ra[ii] * "
                    "(%s)rb[jj];",
                    (int)k->rn, acc_t, acc_t);
    }
    tb__ix_line(&g->ix, "}");
    tb__ix_line(&g->ix, "%s", g->d->barrier);
    tb__ix_close(&g->ix, "");
    snprintf(rows, sizeof rows, "row0 + ly + ii * %d", (int)w);
    snprintf(cols, sizeof cols, "col0 + lx + jj * %d", (int)w);
    tb__cg_matmul_stores(g, k, bdims, rows, cols, (int32_t)tm, (int32_t)tn);
    return g->ix.status;
}

static tb_status tb__cg_kernel_matmul(tb__cg *g, const tb__plan_kernel *k) {
    if (k->mm == TB__MM_PACKED) return tb__cg_kernel_matmul_packed(g, k);
    if (k->mm == TB__MM_REGISTERS) return tb__cg_kernel_matmul_registers(g, k);
    return tb__cg_kernel_matmul_tiles(g, k);
}

#endif /* TB__HAVE_COMPILED_BACKENDS */
