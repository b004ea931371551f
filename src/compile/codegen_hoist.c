/* ===========================================================================================
   C-family code generator, reductions at the start of a row: the reductions the planner
   hoisted into a reduction's kernel (tb__plan_hoist), each a loop over its elements at the row
   the kernel is reducing, before the kernel's own loop over it (codegen_kernels.c), so that
   every read of one in the row finds its value; and the positions of x of a reduction at a row
   plus a reduction index, which both use.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* The operand's position of a reduction or norm: the output's dims for the kept axes, the
   loop's index for the reduced ones. */
static int32_t tb__cg_split_pos(tb__cg *g, const tb_shape *xs, uint64_t mask, bool keepdim,
                                int32_t out_pos, const tb__lf *red) {
    tb__lf dims[TB_MAX_RANK];
    const tb__pos *p = &g->ix.pos[out_pos];
    int32_t a, oi = 0, ri = 0;
    for (a = 0; a < xs->rank; a++) {
        if ((mask >> a) & 1u) {
            dims[a] = red[ri++];
            if (keepdim) oi++;
        } else {
            dims[a] = p->dim[oi++];
        }
    }
    return tb__ix_pos_multi(&g->ix, xs, dims);
}

/* A reduction hoisted into a reduction's kernel (tb__plan_hoist): x, its operand, read at
   position hp of the row plus a reduction index, into its accumulators. */
typedef struct tb__cg_hoist {
    const tb_node *n;
    int32_t x, hp, acc[TB__HOIST_LANES], nan;
    const tb_shape *xs;
    tb_shape red;
    uint64_t mask;
    bool keep, sums;
    const char *at, *fold; /* the accumulators' C type; max and min: TB_MAXS or TB_MINS */
} tb__cg_hoist;

/* Folds x at reduction index i<r> + lane into accumulator `lane`. */
static bool tb__cg_hoist_step(tb__cg *g, const tb__cg_hoist *hs, int32_t r, int32_t lane) {
    tb__lf lf, rl[TB_MAX_RANK];
    int32_t rp, xp, vx, acc = hs->acc[lane];
    tb__lf_const(&lf, lane);
    tb__lf_add_term(&lf, r, 1);
    rp = tb__ix_pos_flat(&g->ix, &hs->red, &lf);
    if (rp < 0 || !tb__ix_need_multi(&g->ix, rp)) return false;
    memcpy(rl, g->ix.pos[rp].dim, sizeof rl);
    xp = tb__cg_split_pos(g, hs->xs, hs->mask, hs->keep, hs->hp, rl);
    vx = xp >= 0 ? tb__cg_eval(g, hs->x, xp) : -1;
    if (vx < 0) return false;
    if (hs->sums) {
        tb__ix_line(&g->ix, "v%d += (%s)v%d;", (int)acc, hs->at, (int)vx);
    } else { /* no branch on the data; ties keep the first, a NaN seen wins at the end */
        tb__ix_line(&g->ix, "v%d = %s(v%d, v%d);", (int)acc, hs->fold, (int)vx, (int)acc);
        tb__ix_line(&g->ix, "if (v%d != v%d) v%d = v%d;", (int)vx, (int)vx, (int)hs->nan, (int)vx);
    }
    return true;
}

/* The loop over reduction indices [from, to) in steps of `lanes`, each step folding one index
   into each accumulator. */
static bool tb__cg_hoist_loop(tb__cg *g, const tb__cg_hoist *hs, int64_t from, int64_t to,
                              int32_t lanes) {
    char head[160];
    int32_t r, lane;
    if (to == from) return true;
    r = tb__ix_new_var(&g->ix, from, to - lanes);
    if (r < 0) return false;
    snprintf(head, sizeof head, "for (long i%d = %lldL; i%d < %lldL; i%d += %d) ", (int)r,
             (long long)from, (int)r, (long long)to, (int)r, (int)lanes);
    tb__ix_open(&g->ix, head);
    for (lane = 0; lane < lanes; lane++)
        if (!tb__cg_hoist_step(g, hs, r, lane)) return false;
    tb__ix_close(&g->ix, "");
    return true;
}

/* The value of hoisted reduction h at the current row: its loops (the lanes in turn, then
   the rest one by one), the lanes combined in order. */
static int32_t tb__cg_hoist_value(tb__cg *g, int32_t h, uint64_t mask, bool keepdim,
                                  int32_t out_pos, const tb__lf *zero) {
    tb__cg_hoist hs;
    const char *t, *init;
    int32_t a, lane, lanes, v;
    int64_t m = 1, m4;
    memset(&hs, 0, sizeof hs);
    hs.n = g->G->info[h].node;
    hs.x = tb__plan_operand(g->G, h, 0);
    hs.xs = tb__plan_shape(g->G, hs.x);
    hs.mask = (uint64_t)hs.n->attrs[0];
    hs.keep = hs.n->attrs[1] != 0;
    hs.sums = hs.n->op == TB_OP_SUM || hs.n->op == TB_OP_MEAN;
    hs.fold = hs.n->op == TB_OP_MAX ? "TB_MAXS" : "TB_MINS";
    t = tb__cg_ctype(hs.n->shape.dtype);
    hs.at = hs.sums ? tb__cg_acc_ctype(tb__plan_reduce_acc(g->G, h)) : t;
    init = hs.sums ? "0" : hs.n->op == TB_OP_MAX ? "-INFINITY" : "INFINITY";
    hs.red.dtype = hs.xs->dtype;
    for (a = 0; a < hs.xs->rank; a++)
        if ((hs.mask >> a) & 1u) m *= (hs.red.dims[hs.red.rank++] = hs.xs->dims[a]);
    lanes = tb__plan_hoist_lanes(hs.n);
    m4 = m / lanes * lanes;
    hs.hp = tb__cg_split_pos(g, &hs.n->shape, mask, keepdim, out_pos, zero);
    if (hs.hp < 0 || !tb__ix_need_multi(&g->ix, hs.hp)) return -1;
    /* the accumulators, then (max, min) the last NaN seen */
    for (lane = 0; lane < lanes + (hs.sums ? 0 : 1); lane++) {
        v = tb__cg_new_val(g, hs.n->shape.dtype);
        if (v < 0) return -1;
        *(lane < lanes ? &hs.acc[lane] : &hs.nan) = v;
        tb__ix_line(&g->ix, "%s v%d = %s;", hs.at, (int)v, init);
    }
    if (!tb__cg_hoist_loop(g, &hs, 0, m4, lanes) || !tb__cg_hoist_loop(g, &hs, m4, m, 1)) return -1;
    for (lane = 1; lane < lanes; lane++) {
        if (hs.sums) {
            tb__ix_line(&g->ix, "v%d += v%d;", (int)hs.acc[0], (int)hs.acc[lane]);
        } else {
            tb__ix_line(&g->ix, "v%d = %s(v%d, v%d);", (int)hs.acc[0], hs.fold, (int)hs.acc[lane],
                        (int)hs.acc[0]);
        }
    }
    if (!hs.sums)
        tb__ix_line(&g->ix, "if (v%d != v%d) v%d = v%d;", (int)hs.nan, (int)hs.nan, (int)hs.acc[0],
                    (int)hs.nan);
    v = tb__cg_new_val(g, hs.n->shape.dtype);
    if (v < 0) return -1;
    if (hs.n->op == TB_OP_MEAN) {
        tb__ix_line(&g->ix, "const %s v%d = (%s)(v%d / (%s)%lld);", t, (int)v, t, (int)hs.acc[0],
                    hs.at, (long long)m);
    } else {
        tb__ix_line(&g->ix, "const %s v%d = (%s)v%d;", t, (int)v, t, (int)hs.acc[0]);
    }
    return v;
}

static bool tb__cg_hoist_row(tb__cg *g, uint64_t mask, bool keepdim, int32_t out_pos) {
    tb__lf zero[TB_MAX_RANK];
    int32_t h, a, v;
    for (a = 0; a < TB_MAX_RANK; a++)
        tb__lf_const(&zero[a], 0);
    if (!tb__ix_need_multi(&g->ix, out_pos)) goto fail;
    for (h = 0; h < (int32_t)g->G->n; h++) {
        if (!g->G->info[h].hoist || g->G->info[h].ctx != tb__cg_kernel(g)->owner) continue;
        v = tb__cg_hoist_value(g, h, mask, keepdim, out_pos, zero);
        if (v < 0) goto fail;
        tb__ix_memo_add(&g->ix, TB__MEMO_VALUE, h, TB__MEMO_HOIST, 0, v);
    }
    return g->ix.status == TB_OK;
fail:
    if (g->ix.status == TB_OK) tb__ix_fail(&g->ix, TB_ERR_INTERNAL);
    return false;
}

#endif /* TB__HAVE_COMPILED_BACKENDS */
