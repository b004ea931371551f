/* ===========================================================================================
   C-family code generator, the row kernels: each kernel of the plan that is not a matmul
   (elementwise, concats, reductions, norms; matmul and its pack kernels are codegen_matmul.c's and
   codegen_tiles.c's) around the values and expressions of codegen.c; codegen_program.c renders the
   program of all of them. The naming rules of generated kernels are in codegen.c.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* ---- kernels ---- */

/* The kernel's row index i<v>: one work item per row, or one work-group per row with the
   item's index in the group as `lid` (the plan's layout). */
static int32_t tb__cg_row_header(tb__cg *g, const tb__plan_kernel *k, int64_t rows) {
    int32_t v = tb__ix_new_var(&g->ix, 0, rows > 0 ? rows - 1 : 0);
    char id[48];
    if (v < 0) return -1;
    if (k->group <= 1) {
        tb__cg_id(id, sizeof id, g->d->global_id, 0);
        tb__ix_line(&g->ix, "const long i%d = (long)%s;", (int)v, id);
        tb__ix_line(&g->ix, "if (i%d >= %lldL) return;", (int)v, (long long)rows);
    } else {
        tb__cg_id(id, sizeof id, g->d->group_id, 0);
        tb__ix_line(&g->ix, "const long i%d = (long)%s;", (int)v, id);
        tb__cg_id(id, sizeof id, g->d->local_id, 0);
        tb__ix_line(&g->ix, "const int lid = (int)%s;", id);
    }
    return v;
}

/* The tree reduction of `var` over a work-group of `groups` items. */
static void tb__cg_local_reduce(tb__cg *g, int64_t groups, const char *var, const char *type,
                                const char *combine) {
    tb__ix_line(&g->ix, "red[lid] = %s;", var);
    tb__ix_line(&g->ix, "%s", g->d->barrier);
    tb__ix_line(&g->ix, "for (int s = %d; s > 0; s >>= 1) {", (int)(groups / 2));
    tb__ix_line(&g->ix, "    if (lid < s) {");
    tb__ix_line(&g->ix, "        const %s a = red[lid], b = red[lid + s];", type);
    tb__ix_line(&g->ix, "        red[lid] = %s;", combine);
    tb__ix_line(&g->ix, "    }");
    tb__ix_line(&g->ix, "    %s", g->d->barrier);
    tb__ix_line(&g->ix, "}");
    tb__ix_line(&g->ix, "%s = red[0];", var);
    tb__ix_line(&g->ix, "%s", g->d->barrier);
}

/* The loop over a row's elements from..to (variable i<v> of that range), each evaluated and
   stored at row i<i0>. With step > 1 the loop's variable counts groups of `step` consecutive
   elements (from..to in groups), each element of a group in a block of its own: element
   step * i<v> + r, whose divisions by the step (a fold's phases, a view that splits the row)
   are constants of the block. False where a group's element found no position though code
   generation goes on (its form out of terms): the caller then emits the row at step 1. */
static bool tb__cg_row_loop(tb__cg *g, const tb__plan_kernel *k, int32_t i0, int64_t from,
                            int64_t to, int64_t step) {
    const tb_shape *rs = tb__plan_shape(g->G, k->root);
    int32_t ic = to > from ? tb__ix_new_var(&g->ix, from, to - 1) : -1, v, p0 = -1, d = 0;
    int64_t r;
    char head[112], index[112];
    bool formed = true;
    if (ic < 0) return true;
    g->row_var = g->d->item_loops ? ic : -1;
    g->ix.vars[ic].traced = 1; /* the row's period: the caller's choice of step */
    snprintf(head, sizeof head, "for (long i%d = %lld%s; i%d < %lldL; i%d++) ", (int)ic,
             (long long)from, from != 0 ? "L" : "", (int)ic, (long long)to, (int)ic);
    tb__ix_open(&g->ix, head);
    /* in groups: the row's start by dims (divided once a row), each element then that plus its
       offset along the row's axis (the last one other than trailing dims of 1) */
    if (step > 1) {
        for (d = rs->rank - 1; d > 0 && rs->dims[d] == 1; d--) {
        }
        p0 = tb__ix_var_pos_flat(&g->ix, rs, i0, k->row_len, -1);
        if (!tb__ix_need_multi(&g->ix, p0)) p0 = -1;
    }
    for (r = 0; r < step && (step == 1 || p0 >= 0); r++) {
        int32_t pos;
        if (step == 1) {
            pos = tb__ix_var_pos_flat(&g->ix, rs, i0, k->row_len, ic);
        } else {
            tb__lf dims[TB_MAX_RANK];
            tb__ix_open(&g->ix, "");
            memcpy(dims, g->ix.pos[p0].dim, sizeof dims);
            dims[d].c += r;
            pos = tb__lf_add_term(&dims[d], ic, step) ? tb__ix_pos_multi(&g->ix, rs, dims) : -1;
            formed = formed && (pos >= 0 || g->ix.status != TB_OK);
        }
        v = pos >= 0 ? tb__cg_eval(g, k->root, pos) : -1;
        if (v >= 0) {
            int n = snprintf(index, sizeof index, "i%d * %lldL + i%d", (int)i0,
                             (long long)k->row_len, (int)ic);
            if (step > 1)
                snprintf(index + n, sizeof index - (size_t)n, " * %lldL + %lldL", (long long)step,
                         (long long)r);
            tb__cg_store(g, rs->dtype, "out", index, v);
        }
        if (step > 1) tb__ix_close(&g->ix, "");
    }
    tb__ix_close(&g->ix, "");
    g->row_var = -1;
    return formed;
}

/* The row loop of an elementwise kernel, and its split into edges and an interior (see the
   caller). A row whose elements the view divides by a small period (a strided pooling's
   gradient, folded by phases; a pixel shuffle) is emitted again in groups of that period,
   where the compiler finds no division and stores the group's elements together. */
static void tb__cg_row_loops_once(tb__cg *g, const tb__plan_kernel *k, int32_t i0) {
    size_t mark = g->ix.body.len;
    int64_t lo, hi, step = 1, n = k->row_len, most = TB__CG_ROW_STEP;
    int pass;
    /* the whole row at step 1 (which learns its period), then at that period where it has one */
    for (pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            if (g->ix.status != TB_OK || g->ix.body.failed || g->ix.period < 2 ||
                g->ix.period > most || n % g->ix.period != 0 || n / g->ix.period < 4)
                break;
            step = g->ix.period;
            n /= step;
            tb__ix_drop(&g->ix, mark);
        }
        g->row_mixed = false;
        g->row_lo = 0;
        g->row_hi = n;
        g->ix.period = 0;
        if (!tb__cg_row_loop(g, k, i0, 0, n, step)) { /* from the start, in no groups */
            tb__ix_drop(&g->ix, mark);
            step = most = 1;
            n = k->row_len;
            pass = -1;
        }
    }
    lo = g->row_lo;
    hi = g->row_hi;
    /* an interior narrower than the row: some pad noted a test on the row's index */
    if (g->ix.status == TB_OK && !g->ix.body.failed && !g->row_mixed && hi - lo >= 8 &&
        (lo > 0 || hi < n)) {
        tb__ix_drop(&g->ix, mark);
        tb__cg_row_loop(g, k, i0, 0, lo, step);
        tb__cg_row_loop(g, k, i0, lo, hi, step);
        tb__cg_row_loop(g, k, i0, hi, n, step);
    }
}

/* The row loops, where a concat's test is on the row's index alone (a strided pooling's
   gradient, whose rows of even and odd index read different phases), once per operand of that
   concat in a case of its own, tested once a row: the loop then holds no branch of it. */
static void tb__cg_row_loops(tb__cg *g, const tb__plan_kernel *k, int32_t i0) {
    size_t mark = g->ix.body.len;
    int32_t c, v;
    g->row_item = i0;
    g->row_case = -1;
    g->num_cases = 0;
    tb__cg_row_loops_once(g, k, i0);
    if (g->num_cases >= 2 && g->ix.status == TB_OK && !g->ix.body.failed) {
        tb__ix_drop(&g->ix, mark);
        v = tb__ix_new_var(&g->ix, g->case_at[0], g->case_at[g->num_cases] - 1);
        if (v >= 0) tb__ix_line(&g->ix, "const long i%d = %s;", (int)v, g->case_text);
        for (c = 0; c < g->num_cases && v >= 0; c++) {
            char head[80];
            if (c + 1 < g->num_cases) {
                snprintf(head, sizeof head, "%sif (i%d < %lldL) ", c > 0 ? "else " : "", (int)v,
                         (long long)g->case_at[c + 1]);
            } else {
                snprintf(head, sizeof head, "else ");
            }
            g->row_case = c;
            tb__ix_open(&g->ix, head);
            tb__cg_row_loops_once(g, k, i0);
            tb__ix_close(&g->ix, "");
        }
    }
    g->row_item = -1;
    g->row_case = -2;
}

static tb_status tb__cg_kernel_elementwise(tb__cg *g, const tb__plan_kernel *k) {
    const tb_shape *rs = tb__plan_shape(g->G, k->root);
    int32_t i0, v;
    char index[64];
    if (k->vec > 0) {
        /* a block of W consecutive elements per work item (W divides the last axis) */
        i0 = tb__cg_row_header(g, k, (int64_t)k->items);
        if (i0 < 0) return g->ix.status;
        char ptr[48];
        v = tb__cg_veval(g, k->root, tb__ix_var_pos_flat(&g->ix, rs, i0, k->vec, -1));
        if (v < 0) return g->ix.status;
        snprintf(ptr, sizeof ptr, "out + i%d * %dL", (int)i0, (int)k->vec);
        tb__cg_vstore(g, rs->dtype, v, ptr, k->stream_out); /* out + i0 * W: aligned */
        return TB_OK;
    }
    if (k->row_len > 0) {
        /* a row of the last axis per work item: the leading dims' positions once a row. Where
           its pads have conditions on the row's index alone (a convolution's window at the
           edges), the loop is emitted again as edges and an interior without them. */
        i0 = tb__cg_row_header(g, k, tb__plan_numel(rs) / k->row_len);
        if (i0 < 0) return g->ix.status;
        tb__cg_row_loops(g, k, i0);
        return g->ix.status;
    }
    i0 = tb__cg_row_header(g, k, tb__plan_numel(rs));
    if (i0 < 0) return g->ix.status;
    v = tb__cg_eval(g, k->root, tb__ix_var_pos_flat(&g->ix, rs, i0, 1, -1));
    if (v < 0) return g->ix.status;
    snprintf(index, sizeof index, "i%d", (int)i0);
    tb__cg_store(g, rs->dtype, "out", index, v);
    return TB_OK;
}

/* A run of a concat's operands (TB__K_CONCAT): a work item per element of its slice of the
   output, the concat evaluated there (codegen.c: tb__cg_concat_run) and stored. */
static tb_status tb__cg_kernel_concat(tb__cg *g, const tb__plan_kernel *k) {
    const tb_node *n = g->G->info[k->root].node;
    const tb_shape *cs = &n->shape;
    int32_t dim = (int32_t)n->attrs[0], i0, pp, qp, v;
    tb_shape ps = *cs;
    tb__lf dims[TB_MAX_RANK];
    char index[TB__LF_TEXT];
    ps.dims[dim] = k->cat_len;
    i0 = tb__cg_row_header(g, k, tb__plan_numel(&ps));
    if (i0 < 0) return g->ix.status;
    /* the element of the slice, then of the output */
    pp = tb__ix_var_pos_flat(&g->ix, &ps, i0, 1, -1);
    if (pp < 0 || !tb__ix_need_multi(&g->ix, pp)) return g->ix.status;
    memcpy(dims, g->ix.pos[pp].dim, sizeof dims);
    dims[dim].c += k->cat_start;
    qp = tb__ix_pos_multi(&g->ix, cs, dims);
    v = qp >= 0 ? tb__cg_eval(g, k->root, qp) : -1;
    if (v < 0 || !tb__ix_need_flat(&g->ix, qp)) return g->ix.status;
    tb__lf_text(&g->ix.pos[qp].flat, index, sizeof index);
    tb__cg_store(g, cs->dtype, "out", index, v);
    return g->ix.status;
}

/* What a reduction kernel reads and how it folds: the operand x at (output row, reduction
   index), the accumulator type and the combination of two partial results. */
typedef struct tb__cg_red {
    const tb__plan_kernel *k;
    const tb_node *cn;
    int32_t x, i0, row, chunk_var, out_pos;
    const tb_shape *xs;
    tb_shape red;
    uint64_t mask;
    bool keepdim, is_arg, is_max;
    int64_t m, n_out, chunk;
    tb_dtype xd, od;
    const char *xt, *acc_t, *combine;
} tb__cg_red;

/* The value of x at reduction index i<r> + lane of the current row. */
static int32_t tb__cg_red_value(tb__cg *g, const tb__cg_red *rd, int32_t r, int64_t lane) {
    tb__lf lf;
    int32_t xp;
    tb__lf_const(&lf, lane);
    if (rd->k->suffix) {
        tb__lf_add_term(&lf, rd->row, rd->m);
        tb__lf_add_term(&lf, r, 1);
        xp = tb__ix_pos_flat(&g->ix, rd->xs, &lf);
    } else {
        tb__lf rl[TB_MAX_RANK];
        int32_t rp;
        tb__lf_add_term(&lf, r, 1);
        rp = tb__ix_pos_flat(&g->ix, &rd->red, &lf);
        if (rp < 0 || !tb__ix_need_multi(&g->ix, rp)) return -1;
        memcpy(rl, g->ix.pos[rp].dim, sizeof rl);
        xp = tb__cg_split_pos(g, rd->xs, rd->mask, rd->keepdim, rd->out_pos, rl);
    }
    if (xp < 0) return -1;
    return tb__cg_eval(g, rd->x, xp);
}

/* Accumulator `lane` of a reduction loop: acc, acc1, acc2, ... */
static void tb__cg_acc_name(char *buf, size_t cap, int32_t lane) {
    if (lane == 0)
        snprintf(buf, cap, "acc");
    else
        snprintf(buf, cap, "acc%d", (int)lane);
}

/* Folds value v<vx> (at reduction index i<r>) into the accumulator named `acc`. */
static void tb__cg_red_step(tb__cg *g, const tb__cg_red *rd, int32_t vx, int32_t r,
                            const char *acc) {
    const char *cmp = rd->is_max ? ">" : "<";
    switch (rd->cn->op) {
    case TB_OP_SUM:
    case TB_OP_MEAN:
        tb__ix_line(&g->ix, "%s += (%s)v%d;", acc, rd->acc_t, (int)vx);
        break;
    case TB_OP_PROD:
        tb__ix_line(&g->ix, "%s *= (%s)v%d;", acc, rd->acc_t, (int)vx);
        break;
    case TB_OP_MAX:
    case TB_OP_MIN:
        if (tb_dtype_is_float(rd->xd)) {
            tb__ix_line(&g->ix, "if (v%d %s %s || isnan(v%d)) %s = v%d;", (int)vx, cmp, acc,
                        (int)vx, acc, (int)vx);
        } else {
            tb__ix_line(&g->ix, "if (v%d %s %s) %s = v%d;", (int)vx, cmp, acc, acc, (int)vx);
        }
        break;
    default:
        if (tb_dtype_is_float(rd->xd)) {
            tb__ix_line(&g->ix,
                        "if (bi < 0 || v%d %s best || (isnan(v%d) && !isnan(best))) { best = v%d; "
                        "bi = i%d; }",
                        (int)vx, cmp, (int)vx, (int)vx, (int)r);
        } else {
            tb__ix_line(&g->ix, "if (bi < 0 || v%d %s best) { best = v%d; bi = i%d; }", (int)vx,
                        cmp, (int)vx, (int)r);
        }
        break;
    }
}

/* The reduction's description, its row header and its accumulators' first values. */
static bool tb__cg_red_begin(tb__cg *g, const tb__plan_kernel *k, tb__cg_red *rd) {
    const tb_node *cn = g->G->info[k->core].node;
    bool partial = k->kind == TB__K_PARTIAL, final = !partial && k->split > 0, sums;
    int32_t a;
    const char *init = "0";
    memset(rd, 0, sizeof *rd);
    rd->k = k;
    rd->cn = cn;
    rd->x = tb__plan_operand(g->G, k->core, 0);
    rd->xs = tb__plan_shape(g->G, rd->x);
    rd->is_arg = cn->op == TB_OP_ARGMAX || cn->op == TB_OP_ARGMIN;
    rd->is_max = cn->op == TB_OP_MAX || cn->op == TB_OP_ARGMAX;
    rd->mask = rd->is_arg ? ((uint64_t)1 << cn->attrs[0]) : (uint64_t)cn->attrs[0];
    rd->keepdim = cn->attrs[1] != 0;
    rd->xd = rd->xs->dtype;
    rd->od = cn->shape.dtype;
    rd->xt = tb__cg_ctype(rd->xd);
    rd->n_out = tb__plan_numel(&cn->shape);
    rd->m = 1;
    rd->red.dtype = rd->xd;
    for (a = 0; a < rd->xs->rank; a++) {
        if ((rd->mask >> a) & 1u) {
            rd->red.dims[rd->red.rank++] = rd->xs->dims[a];
            rd->m *= rd->xs->dims[a];
        }
    }
    sums = cn->op == TB_OP_SUM || cn->op == TB_OP_MEAN || cn->op == TB_OP_PROD;
    rd->acc_t = sums ? tb__cg_acc_ctype(k->acc) : rd->xt;
    rd->combine = cn->op == TB_OP_PROD ? "a * b" : "a + b";
    if (cn->op == TB_OP_MAX)
        rd->combine =
            tb_dtype_is_float(rd->xd) ? "((b > a || isnan(b)) ? b : a)" : "(b > a ? b : a)";
    if (cn->op == TB_OP_MIN)
        rd->combine =
            tb_dtype_is_float(rd->xd) ? "((b < a || isnan(b)) ? b : a)" : "(b < a ? b : a)";
    rd->i0 = tb__cg_row_header(g, k, partial ? rd->n_out * k->split : rd->n_out);
    if (rd->i0 < 0) return false;
    if (k->group > 1) {
        if (rd->is_arg) {
            tb__cg_local(g, rd->xt, "redv", k->group);
            tb__cg_local(g, "long", "redi", k->group);
        } else {
            tb__cg_local(g, rd->acc_t, "red", k->group);
        }
    }
    rd->row = rd->i0;
    if (partial) {
        rd->chunk = (rd->m + k->split - 1) / k->split;
        rd->row = tb__ix_new_var(&g->ix, 0, rd->n_out - 1);
        rd->chunk_var = tb__ix_new_var(&g->ix, 0, k->split - 1);
        if (rd->row < 0 || rd->chunk_var < 0) return false;
        tb__ix_line(&g->ix, "const long i%d = i%d / %d, i%d = i%d %% %d;", (int)rd->row,
                    (int)rd->i0, (int)k->split, (int)rd->chunk_var, (int)rd->i0, (int)k->split);
    }
    rd->out_pos = tb__ix_var_pos_flat(&g->ix, &cn->shape, rd->row, 1, -1);
    if (rd->out_pos < 0) return false;
    if (!final && !k->suffix && !tb__ix_need_multi(&g->ix, rd->out_pos)) return false;
    if (rd->is_arg) {
        tb__ix_line(&g->ix, "%s best = 0;", rd->xt);
        tb__ix_line(&g->ix, "long bi = -1;");
        return g->ix.status == TB_OK;
    }
    if (cn->op == TB_OP_PROD) init = "1";
    if (cn->op == TB_OP_MAX || cn->op == TB_OP_MIN) {
        if (tb_dtype_is_float(rd->xd)) {
            init = rd->is_max ? "-INFINITY" : "INFINITY";
        } else if (rd->xd == TB_I32) {
            init = rd->is_max ? "INT_MIN" : "INT_MAX";
        } else if (rd->xd == TB_I64) {
            init = rd->is_max ? "LONG_MIN" : "LONG_MAX";
        } else {
            init = rd->is_max ? "0" : "255";
        }
    }
    tb__ix_line(&g->ix, "%s acc = %s;", rd->acc_t, init);
    return g->ix.status == TB_OK;
}

/* The vector part of a row's loop: `lanes` vector accumulators over [rs, rv), rv the last
   multiple of W x lanes from rs, folded into acc; the caller loops over [rv, re) one element
   at a time. */
static bool tb__cg_red_vloop(tb__cg *g, const tb__cg_red *rd) {
    const tb__plan_kernel *k = rd->k;
    int32_t w = k->vec, lanes = k->lanes > 1 ? k->lanes : 1, lane, r;
    const char *init, *fold;
    char head[192], name[16], prev[16];
    switch (rd->cn->op) {
    case TB_OP_PROD:
        init = "1.0f";
        break;
    case TB_OP_MAX:
        init = "-INFINITY";
        break;
    case TB_OP_MIN:
        init = "INFINITY";
        break;
    default:
        init = "0.0f";
        break;
    }
    for (lane = 0; lane < lanes; lane++)
        tb__ix_line(&g->ix, "tb_vf accv%d = TB_VBC(%s);", (int)lane, init);
    /* lane_parts: each accumulator its own part of the range (a stream through memory each,
       which a core's prefetchers fetch ahead in parallel); else the accumulators take turns
       along one stream */
    if (k->lane_parts) {
        tb__ix_line(&g->ix, "const long rn = (re - rs) / %dL * %dL, rv = rs + rn * %dL;",
                    (int)(w * lanes), (int)w, (int)lanes);
    } else {
        tb__ix_line(&g->ix, "const long rv = rs + (re - rs) / %dL * %dL;", (int)(w * lanes),
                    (int)(w * lanes));
    }
    r = tb__ix_new_var(&g->ix, 0, rd->m - 1);
    if (r < 0) return false;
    if (k->lane_parts) {
        snprintf(head, sizeof head, "for (long i%d = rs; i%d < rs + rn; i%d += %d) ", (int)r,
                 (int)r, (int)r, (int)w);
    } else {
        snprintf(head, sizeof head, "for (long i%d = rs; i%d < rv; i%d += %d) ", (int)r, (int)r,
                 (int)r, (int)(w * lanes));
    }
    tb__ix_open(&g->ix, head);
    for (lane = 0; lane < lanes; lane++) {
        tb__lf lf;
        int32_t xp, vx, rl = r;
        if (lane > 0 && k->lane_parts) {
            rl = tb__ix_new_var(&g->ix, 0, rd->m - 1);
            if (rl < 0) return false;
            tb__ix_line(&g->ix, "const long i%d = i%d + rn * %dL;", (int)rl, (int)r, (int)lane);
        }
        tb__lf_const(&lf, k->lane_parts ? 0 : (int64_t)lane * w);
        tb__lf_add_term(&lf, rd->row, rd->m);
        tb__lf_add_term(&lf, rl, 1);
        xp = tb__ix_pos_flat(&g->ix, rd->xs, &lf);
        vx = tb__cg_veval(g, rd->x, xp);
        if (vx < 0) return false;
        if (rd->cn->op == TB_OP_MAX || rd->cn->op == TB_OP_MIN) {
            tb__ix_line(&g->ix, "accv%d = tb_v%s(v%d, accv%d);", (int)lane,
                        rd->cn->op == TB_OP_MAX ? "max" : "min", (int)vx, (int)lane);
        } else {
            tb__ix_line(&g->ix, "accv%d %s= v%d;", (int)lane, rd->cn->op == TB_OP_PROD ? "*" : "+",
                        (int)vx);
        }
    }
    tb__ix_close(&g->ix, "");
    /* the lanes' vectors into one, then into acc */
    for (lane = 1; lane < lanes; lane++) {
        snprintf(name, sizeof name, "accv%d", (int)lane);
        if (rd->cn->op == TB_OP_MAX || rd->cn->op == TB_OP_MIN) {
            tb__ix_line(&g->ix, "accv0 = tb_v%s(accv0, %s);",
                        rd->cn->op == TB_OP_MAX ? "max" : "min", name);
        } else {
            tb__ix_line(&g->ix, "accv0 %s= %s;", rd->cn->op == TB_OP_PROD ? "*" : "+", name);
        }
    }
    fold = rd->cn->op == TB_OP_PROD  ? "tb_hprod"
           : rd->cn->op == TB_OP_MAX ? "tb_hmax"
           : rd->cn->op == TB_OP_MIN ? "tb_hmin"
                                     : "tb_hsum";
    snprintf(prev, sizeof prev, "%s", "acc");
    tb__ix_line(&g->ix, "%s = %s(accv0);", prev, fold);
    return g->ix.status == TB_OK;
}

/* The accumulators acc, acc1, .. acc<lanes - 1> combined pairwise into acc: acc_j with
   acc_(j + half), halving. */
static void tb__cg_red_pairwise(tb__cg *g, const tb__cg_red *rd, int32_t lanes) {
    int32_t half, j;
    for (half = lanes / 2; half >= 1; half /= 2) {
        for (j = 0; j < half; j++) {
            char dst[16], src[16];
            tb__cg_acc_name(dst, sizeof dst, j);
            tb__cg_acc_name(src, sizeof src, j + half);
            tb__ix_line(&g->ix, "{ const %s a = %s, b = %s; %s = %s; }", rd->acc_t, dst, src, dst,
                        rd->combine);
        }
    }
}

/* Whether the reduction's reduced axes end with x's last axis but also take an axis before one
   it keeps (the sum over N, H and W of [N, C, H, W] per channel): then the trailing run of
   reduced axes, *len elements at stride 1 from axis *first on, is an inner loop of its own under
   a loop over the other reduced axes, so that the inner loop reads x in order with no division
   per element (tb__cg_red_nested). Scalar loops over one work item per output only; argmax and
   argmin keep the flat loop (their index is the flat one). */
static bool tb__cg_red_inner(const tb__cg_red *rd, int32_t *first, int64_t *len) {
    int32_t a = rd->xs->rank - 1;
    *len = 1;
    if (rd->k->suffix || rd->is_arg || rd->k->group > 1 || rd->k->vec > 0 || a < 0 ||
        !((rd->mask >> a) & 1u))
        return false;
    for (; a >= 0 && ((rd->mask >> a) & 1u); a--)
        *len *= rd->xs->dims[a];
    *first = a + 1;
    return *len >= 8 && *len < rd->m;
}

/* Whether a reduction over trailing axes (a row, or the whole of x: plan's suffix) reads x
   through a view that unravels the flat index with divisions (a slice's or a permutation's),
   found by a trial emission of x at a traced index (then dropped): the trailing axes whose
   elements number the divisions' shortest period are then tb__cg_red_nested's inner run, so
   that x's dims are computed once per run, not per element (a sum over the interior of a
   convolution's whole padded rows, 4.7M elements, with four divisions per element: 6-9 ms
   on native and 13-15 ms on PoCL; 0.6-0.7 ms on both with the inner loop). */
static bool tb__cg_red_unravels(tb__cg *g, const tb__cg_red *rd, int32_t *first, int64_t *len) {
    size_t mark = g->ix.body.len;
    int32_t r, a = rd->xs->rank - 1;
    int64_t n = 1;
    bool ok;
    if (!rd->k->suffix || rd->is_arg || rd->k->group > 1 || rd->k->vec > 0 || rd->m < 16)
        return false;
    r = tb__ix_new_var(&g->ix, 0, rd->m - 1);
    if (r < 0) return false;
    g->ix.vars[r].traced = 1;
    g->ix.period = 0;
    tb__ix_open(&g->ix, "");
    ok = tb__cg_red_value(g, rd, r, 0) >= 0;
    tb__ix_close(&g->ix, "");
    tb__ix_drop(&g->ix, mark);
    if (!ok || g->ix.period < 8) return false;
    for (; a >= 0 && n < g->ix.period; a--)
        n *= rd->xs->dims[a];
    *first = a + 1;
    *len = n;
    return n == g->ix.period && n < rd->m;
}

/* The loop of tb__cg_red_inner's reductions over [from, to) of the reduced elements: for each
   index of the outer reduced axes, the inner run's part in the range with the plan's
   accumulators, combined pairwise at the end. x is read at its flat position: the kept axes' and
   the outer reduced axes' terms, plus the inner index. */
static bool tb__cg_red_nested(tb__cg *g, const tb__cg_red *rd, const char *from, const char *to,
                              int32_t first, int64_t len) {
    const tb_shape *xs = rd->xs;
    int32_t lanes = rd->k->lanes > 1 ? rd->k->lanes : 1, lane, o, j, a, oi = 0, ri = 0, opos = -1;
    int64_t strides[TB_MAX_RANK];
    tb__lf base, lf;
    tb_shape outer;
    char head[256], name[16];
    tb__ix_contig(xs->rank, xs->dims, strides);
    memset(&outer, 0, sizeof outer);
    outer.dtype = xs->dtype;
    for (a = 0; a < first; a++)
        if ((rd->mask >> a) & 1u) outer.dims[outer.rank++] = xs->dims[a];
    tb__ix_open(&g->ix, "");
    for (lane = 1; lane < lanes; lane++)
        tb__ix_line(&g->ix, "%s acc%d = acc;", rd->acc_t, (int)lane);
    tb__ix_line(&g->ix, "const long rs = %s, re = %s;", from, to);
    o = tb__ix_new_var(&g->ix, 0, rd->m / len - 1);
    if (o < 0) return false;
    snprintf(head, sizeof head, "for (long i%d = rs / %lldL; i%d * %lldL < re; i%d++) ", (int)o,
             (long long)len, (int)o, (long long)len, (int)o);
    tb__ix_open(&g->ix, head);
    tb__ix_line(&g->ix, "const long js = rs > i%d * %lldL ? rs - i%d * %lldL : 0L;", (int)o,
                (long long)len, (int)o, (long long)len);
    tb__ix_line(&g->ix, "const long je = re < (i%d + 1) * %lldL ? re - i%d * %lldL : %lldL;",
                (int)o, (long long)len, (int)o, (long long)len, (long long)len);
    tb__ix_line(&g->ix, "const long jm = js + ((je - js) & ~%dL);", (int)lanes - 1);
    if (outer.rank > 0) {
        opos = tb__ix_var_pos_flat(&g->ix, &outer, o, 1, -1);
        if (!tb__ix_need_multi(&g->ix, opos)) return false;
    }
    /* a suffix reduction's row is flat (tb__cg_red_begin): its kept dims, once per item */
    if (rd->k->suffix && !tb__ix_need_multi(&g->ix, rd->out_pos)) return false;
    tb__lf_const(&base, 0);
    for (a = 0; a < xs->rank; a++) {
        const tb__lf *d = NULL;
        if ((rd->mask >> a) & 1u) {
            if (a < first) d = &g->ix.pos[opos].dim[ri++];
            if (rd->keepdim) oi++;
        } else {
            d = &g->ix.pos[rd->out_pos].dim[oi++];
        }
        if (d != NULL && !tb__ix_lf_addmul(&g->ix, &base, d, strides[a])) return false;
    }
    for (j = 0; j < 2; j++) {
        /* the run in steps of `lanes` (one value per accumulator: r + lane < len, so that a
           view's index splits r + lane without a carry), then what is left */
        int32_t n = j == 0 ? lanes : 1, r = tb__ix_new_var(&g->ix, 0, len >= n ? len - n : 0);
        if (r < 0) return false;
        if (j == 0) {
            snprintf(head, sizeof head, "for (long i%d = js; i%d < jm; i%d += %d) ", (int)r, (int)r,
                     (int)r, (int)lanes);
        } else {
            snprintf(head, sizeof head, "for (long i%d = jm; i%d < je; i%d++) ", (int)r, (int)r,
                     (int)r);
        }
        tb__ix_open(&g->ix, head);
        for (lane = 0; lane < n; lane++) {
            int32_t xp, vx;
            lf = base;
            lf.c += lane;
            if (!tb__lf_add_term(&lf, r, 1)) return false;
            xp = tb__ix_pos_flat(&g->ix, xs, &lf);
            vx = xp >= 0 ? tb__cg_eval(g, rd->x, xp) : -1;
            if (vx < 0) return false;
            tb__cg_acc_name(name, sizeof name, lane);
            tb__cg_red_step(g, rd, vx, r, name);
        }
        tb__ix_close(&g->ix, "");
    }
    tb__ix_close(&g->ix, "");
    tb__cg_red_pairwise(g, rd, lanes);
    tb__ix_close(&g->ix, "");
    return g->ix.status == TB_OK;
}

/* The loop over a row (or a chunk of one) with the plan's number of accumulators, combined
   pairwise at the end. */
static bool tb__cg_red_loop(tb__cg *g, const tb__cg_red *rd) {
    const tb__plan_kernel *k = rd->k;
    char head[384], from[64], to[96];
    int32_t r, vx, lane, rt, lanes = k->lanes > 1 ? k->lanes : 1;
    if (k->kind == TB__K_PARTIAL) {
        snprintf(from, sizeof from, "i%d * %lldL", (int)rd->chunk_var, (long long)rd->chunk);
        snprintf(to, sizeof to, "%s((i%d + 1) * %lldL, %lldL)", g->d->min_long, (int)rd->chunk_var,
                 (long long)rd->chunk, (long long)rd->m);
    } else {
        snprintf(from, sizeof from, "0L");
        snprintf(to, sizeof to, "%lldL", (long long)rd->m);
    }
    if (k->vec > 0) {
        tb__ix_open(&g->ix, "");
        tb__ix_line(&g->ix, "const long rs = %s, re = %s;", from, to);
        if (!tb__cg_red_vloop(g, rd)) return false;
        rt = tb__ix_new_var(&g->ix, 0, rd->m - 1);
        if (rt < 0) return false;
        snprintf(head, sizeof head, "for (long i%d = rv; i%d < re; i%d++) ", (int)rt, (int)rt,
                 (int)rt);
        tb__ix_open(&g->ix, head);
        vx = tb__cg_red_value(g, rd, rt, 0);
        if (vx < 0) return false;
        tb__cg_red_step(g, rd, vx, rt, "acc");
        tb__ix_close(&g->ix, "");
        tb__ix_close(&g->ix, "");
        return g->ix.status == TB_OK;
    }
    {
        int32_t first;
        int64_t len;
        if (tb__cg_red_inner(rd, &first, &len) || tb__cg_red_unravels(g, rd, &first, &len))
            return tb__cg_red_nested(g, rd, from, to, first, len);
    }
    if (lanes == 1) {
        r = tb__ix_new_var(&g->ix, 0, rd->m > 0 ? rd->m - 1 : 0);
        if (r < 0) return false;
        if (k->group <= 1) {
            snprintf(head, sizeof head, "for (long i%d = %s; i%d < %s; i%d++) ", (int)r, from,
                     (int)r, to, (int)r);
        } else {
            snprintf(head, sizeof head, "for (long i%d = %s + lid; i%d < %s; i%d += %d) ", (int)r,
                     from, (int)r, to, (int)r, (int)k->group);
        }
        tb__ix_open(&g->ix, head);
        vx = tb__cg_red_value(g, rd, r, 0);
        if (vx < 0) return false;
        tb__cg_red_step(g, rd, vx, r, "acc");
        tb__ix_close(&g->ix, "");
        return g->ix.status == TB_OK;
    }
    tb__ix_open(&g->ix, "");
    for (lane = 1; lane < lanes; lane++)
        tb__ix_line(&g->ix, "%s acc%d = acc;", rd->acc_t, (int)lane);
    tb__ix_line(&g->ix, "const long rs = %s, re = %s, rm = rs + ((re - rs) & ~%dL);", from, to,
                (int)lanes - 1);
    r = tb__ix_new_var(&g->ix, 0, rd->m - lanes);
    if (r < 0) return false;
    snprintf(head, sizeof head, "for (long i%d = rs; i%d < rm; i%d += %d) ", (int)r, (int)r, (int)r,
             (int)lanes);
    tb__ix_open(&g->ix, head);
    for (lane = 0; lane < lanes; lane++) {
        char name[16];
        tb__cg_acc_name(name, sizeof name, lane);
        vx = tb__cg_red_value(g, rd, r, lane);
        if (vx < 0) return false;
        tb__cg_red_step(g, rd, vx, r, name);
    }
    tb__ix_close(&g->ix, "");
    rt = tb__ix_new_var(&g->ix, 0, rd->m - 1);
    if (rt < 0) return false;
    snprintf(head, sizeof head, "for (long i%d = rm; i%d < re; i%d++) ", (int)rt, (int)rt, (int)rt);
    tb__ix_open(&g->ix, head);
    vx = tb__cg_red_value(g, rd, rt, 0);
    if (vx < 0) return false;
    tb__cg_red_step(g, rd, vx, rt, "acc");
    tb__ix_close(&g->ix, "");
    tb__cg_red_pairwise(g, rd, lanes);
    tb__ix_close(&g->ix, "");
    return g->ix.status == TB_OK;
}

/* Combines the work-group's results (a row per group): sums and extremes by a tree, argmax and
   argmin keeping the first index of the extreme. Opens `if (lid == 0)`. */
static void tb__cg_red_group(tb__cg *g, const tb__cg_red *rd) {
    const char *cmp = rd->is_max ? ">" : "<";
    if (!rd->is_arg) {
        tb__cg_local_reduce(g, rd->k->group, "acc", rd->acc_t, rd->combine);
        tb__ix_open(&g->ix, "if (lid == 0) ");
        return;
    }
    tb__ix_line(&g->ix, "redv[lid] = best;");
    tb__ix_line(&g->ix, "redi[lid] = bi;");
    tb__ix_line(&g->ix, "%s", g->d->barrier);
    tb__ix_line(&g->ix, "for (int s = %d; s > 0; s >>= 1) {", (int)(rd->k->group / 2));
    tb__ix_line(&g->ix, "    if (lid < s) {");
    tb__ix_line(&g->ix, "        const %s ov = redv[lid + s], cv = redv[lid];", rd->xt);
    tb__ix_line(&g->ix, "        const long oi = redi[lid + s], ci = redi[lid];");
    if (tb_dtype_is_float(rd->xd)) {
        tb__ix_line(&g->ix,
                    "        if (oi >= 0 && (ci < 0 || (isnan(ov) ? (!isnan(cv) || oi < "
                    "ci) : (!isnan(cv) && (ov %s cv || (ov == cv && oi < ci)))))) {",
                    cmp);
    } else {
        tb__ix_line(&g->ix,
                    "        if (oi >= 0 && (ci < 0 || ov %s cv || (ov == cv && oi < "
                    "ci))) {",
                    cmp);
    }
    tb__ix_line(&g->ix, "            redv[lid] = ov;");
    tb__ix_line(&g->ix, "            redi[lid] = oi;");
    tb__ix_line(&g->ix, "        }");
    tb__ix_line(&g->ix, "    }");
    tb__ix_line(&g->ix, "    %s", g->d->barrier);
    tb__ix_line(&g->ix, "}");
    tb__ix_line(&g->ix, "bi = redi[0];");
    tb__ix_open(&g->ix, "if (lid == 0) ");
}

/* A reduction over leading axes of x that keeps its trailing ones (plan: col_vec): a work item
   per block of W consecutive outputs, x read W at a time along each reduced row (its flat index
   is the reduced row's times the outputs' count plus the block's), `lanes` vector accumulators
   taking turns along the rows and combined in order, then the epilogue on the block and one
   vector store. */
static tb_status tb__cg_kernel_reduce_cols(tb__cg *g, const tb__plan_kernel *k) {
    const tb_node *cn = g->G->info[k->core].node;
    int32_t x = tb__plan_operand(g->G, k->core, 0), w = k->col_vec, i0, op, r, j, lane, vx, vf;
    int32_t lanes = k->lanes > 1 ? k->lanes : 1;
    const tb_shape *rs = tb__plan_shape(g->G, k->root);
    int64_t n_out, m;
    bool extreme = cn->op == TB_OP_MAX || cn->op == TB_OP_MIN;
    const char *fold = cn->op == TB_OP_MAX ? "max" : "min";
    char head[160], ptr[48];
    tb__plan_reduce_sizes(g->G, k->core, &n_out, &m);
    i0 = tb__cg_row_header(g, k, (int64_t)k->items);
    if (i0 < 0) return g->ix.status;
    op = tb__ix_var_pos_flat(&g->ix, &cn->shape, i0, w, -1);
    if (op < 0) return g->ix.status;
    for (lane = 0; lane < lanes; lane++)
        tb__ix_line(&g->ix, "tb_vf accv%d = TB_VBC(%s);", (int)lane,
                    cn->op == TB_OP_MAX   ? "-INFINITY"
                    : cn->op == TB_OP_MIN ? "INFINITY"
                                          : "0.0f");
    for (j = 0; j < 2; j++) {
        /* the rows in steps of `lanes` (one per accumulator), then what is left */
        int32_t n = j == 0 ? lanes : 1;
        int64_t end = j == 0 ? m / lanes * lanes : m;
        if (j == 1 && end == m / lanes * lanes) break;
        r = tb__ix_new_var(&g->ix, 0, m > 0 ? m - 1 : 0);
        if (r < 0) return g->ix.status;
        snprintf(head, sizeof head, "for (long i%d = %lldL; i%d < %lldL; i%d += %d) ", (int)r,
                 (long long)(j == 0 ? 0 : m / lanes * lanes), (int)r, (long long)end, (int)r,
                 (int)n);
        tb__ix_open(&g->ix, head);
        for (lane = 0; lane < n; lane++) {
            tb__lf lf;
            tb__lf_const(&lf, (int64_t)lane * n_out);
            if (!tb__lf_add_term(&lf, r, n_out) || !tb__lf_add_term(&lf, i0, w)) {
                tb__ix_fail(&g->ix, TB_ERR_INTERNAL);
                return g->ix.status;
            }
            vx = tb__cg_veval(g, x, tb__ix_pos_flat(&g->ix, tb__plan_shape(g->G, x), &lf));
            if (vx < 0) return g->ix.status;
            if (extreme) {
                tb__ix_line(&g->ix, "accv%d = tb_v%s(v%d, accv%d);", (int)lane, fold, (int)vx,
                            (int)lane);
            } else {
                tb__ix_line(&g->ix, "accv%d += v%d;", (int)lane, (int)vx);
            }
        }
        tb__ix_close(&g->ix, "");
    }
    for (lane = 1; lane < lanes; lane++) {
        if (extreme) {
            tb__ix_line(&g->ix, "accv0 = tb_v%s(accv0, accv%d);", fold, (int)lane);
        } else {
            tb__ix_line(&g->ix, "accv0 += accv%d;", (int)lane);
        }
    }
    vf = tb__cg_new_vec(g);
    if (vf < 0) return g->ix.status;
    if (cn->op == TB_OP_MEAN) {
        tb__ix_line(&g->ix, "const tb_vf v%d = accv0 / TB_VBC((float)%lld);", (int)vf,
                    (long long)m);
    } else {
        tb__ix_line(&g->ix, "const tb_vf v%d = accv0;", (int)vf);
    }
    vf = tb__cg_vround(g, cn->shape.dtype, vf);
    if (vf < 0) return g->ix.status;
    tb__ix_memo_add(&g->ix, TB__MEMO_VECTOR, k->core, op, 0, vf);
    vf = tb__cg_veval(g, k->root, op);
    if (vf < 0) return g->ix.status;
    snprintf(ptr, sizeof ptr, "out + i%d * %dL", (int)i0, (int)w);
    tb__cg_vstore(g, rs->dtype, vf, ptr, false); /* out + i0 * W */
    return g->ix.status;
}

/* A reduction: one work item or one work-group per output, or, when the reduction is split,
   the partial stage (one per chunk of a row, raw accumulators out) or the final stage
   (combines the chunks of its row, then finishes and runs the epilogue). */
static tb_status tb__cg_kernel_reduce(tb__cg *g, const tb__plan_kernel *k) {
    tb__cg_red rd;
    bool partial = k->kind == TB__K_PARTIAL, final = !partial && k->split > 0;
    const char *t;
    int32_t vf, vr;
    tb_dtype pd =
        k->partial_slot >= 0 ? tb__cg_plan(g)->slots[k->partial_slot].shape.dtype : TB_F32;
    char index[32];
    if (k->col_vec > 0) return tb__cg_kernel_reduce_cols(g, k);
    if (!tb__cg_red_begin(g, k, &rd) ||
        (k->hoists > 0 && !tb__cg_hoist_row(g, rd.mask, rd.keepdim, rd.out_pos)))
        return g->ix.status;
    t = tb__cg_ctype(rd.od);
    if (final) {
        /* the partial results of this row, in chunk order */
        if (!tb__cg_arg(g, TB__ARG_BUF, k->partial_slot)) return g->ix.status;
        tb__ix_line(&g->ix, "for (int c = 0; c < %d; c++) {", (int)k->split);
        if (tb__cg_is_half(pd)) { /* max and min of 16-bit floats keep partials in them */
            tb__ix_line(&g->ix, "    const float b = %s(b%d[i%d * %d + c]);",
                        pd == TB_F16 ? "tb_h2f" : "tb_bf2f", (int)k->partial_slot, (int)rd.i0,
                        (int)k->split);
        } else {
            tb__ix_line(&g->ix, "    const %s b = (%s)b%d[i%d * %d + c];", rd.acc_t, rd.acc_t,
                        (int)k->partial_slot, (int)rd.i0, (int)k->split);
        }
        tb__ix_line(&g->ix, "    const %s a = acc;", rd.acc_t);
        tb__ix_line(&g->ix, "    acc = %s;", rd.combine);
        tb__ix_line(&g->ix, "}");
    } else if (!tb__cg_red_loop(g, &rd)) {
        return g->ix.status;
    }
    if (k->group > 1) tb__cg_red_group(g, &rd);
    snprintf(index, sizeof index, "i%d", (int)rd.i0);
    if (partial && tb__cg_is_half(tb__cg_plan(g)->slots[k->out_slot].shape.dtype)) {
        vf = tb__cg_new_val(g, tb__cg_plan(g)->slots[k->out_slot].shape.dtype);
        if (vf < 0) return g->ix.status;
        tb__ix_line(&g->ix, "const float v%d = (float)acc;", (int)vf);
        tb__cg_store(g, tb__cg_plan(g)->slots[k->out_slot].shape.dtype, "out", index, vf);
    } else if (partial) {
        tb__ix_line(&g->ix, "out[i%d] = (%s)acc;", (int)rd.i0,
                    tb__cg_ctype(tb__cg_plan(g)->slots[k->out_slot].shape.dtype));
    } else {
        vf = tb__cg_new_val(g, rd.od);
        if (vf < 0) return g->ix.status;
        if (rd.cn->op == TB_OP_MEAN) {
            tb__ix_line(&g->ix, "const %s v%d = (%s)(acc / (%s)%lld);", t, (int)vf, t, rd.acc_t,
                        (long long)rd.m);
        } else if (rd.is_arg) {
            tb__ix_line(&g->ix, "const %s v%d = (%s)bi;", t, (int)vf, t);
        } else {
            tb__ix_line(&g->ix, "const %s v%d = (%s)acc;", t, (int)vf, t);
        }
        vf = tb__cg_round(g, rd.od, vf);
        if (vf < 0) return g->ix.status;
        tb__ix_memo_add(&g->ix, TB__MEMO_VALUE, k->core, rd.out_pos, 0, vf);
        vr = tb__cg_eval(g, k->root, rd.out_pos);
        if (vr < 0) return g->ix.status;
        tb__cg_store(g, tb__plan_shape(g->G, k->root)->dtype, "out", index, vr);
    }
    if (k->group > 1) tb__ix_close(&g->ix, "");
    return g->ix.status;
}

/* What a softmax, log_softmax or layer_norm kernel reads: x by rows of `len` elements (the
   trailing axes, or one axis of a row shape for softmax over an inner axis), weight and bias. */
typedef struct tb__cg_norm {
    const tb__plan_kernel *k;
    const tb_node *cn;
    const tb_shape *xs;
    int32_t x, w, b, axis, i0, row_pos;
    int64_t len;
    bool layer;
    /* a softmax whose kernel ends with it (no epilogue): the second pass stores each exp in
       out, the last scales out by 1 / sum in place, so each element's exp is computed once */
    bool stash;
    tb_dtype od;
    const char *t, *ct; /* the output's type and the accumulators' */
} tb__cg_norm;

/* The position of x at element i<j> of the current row. */
static int32_t tb__cg_norm_pos(tb__cg *g, const tb__cg_norm *nm, int32_t j) {
    tb__lf dims[TB_MAX_RANK];
    int32_t a, ri = 0;
    if (nm->k->suffix) return tb__ix_var_pos_flat(&g->ix, nm->xs, nm->i0, nm->len, j);
    for (a = 0; a < nm->xs->rank; a++) {
        if (a == nm->axis) {
            tb__lf_const(&dims[a], 0);
            tb__lf_add_term(&dims[a], j, 1);
        } else {
            dims[a] = g->ix.pos[nm->row_pos].dim[ri++];
        }
    }
    return tb__ix_pos_multi(&g->ix, nm->xs, dims);
}

/* The last pass: the normalised value of x at xp (v<vx>), then the epilogue and the store. */
static bool tb__cg_norm_store(tb__cg *g, const tb__cg_norm *nm, int32_t j, int32_t xp, int32_t vx) {
    const tb__pgraph *G = g->G;
    int32_t vf = tb__cg_new_val(g, nm->od), vr;
    char flat[TB__LF_TEXT];
    const char *t = nm->t, *ct = nm->ct;
    if (vf < 0) return false;
    if (nm->layer) {
        tb__ix_line(&g->ix, "%s y = ((%s)v%d - mean) * rstd;", ct, ct, (int)vx);
        if (nm->w >= 0) {
            int32_t vw = tb__cg_eval(
                g, nm->w, tb__ix_var_pos_flat(&g->ix, tb__plan_shape(G, nm->w), j, 1, -1));
            if (vw < 0) return false;
            tb__ix_line(&g->ix, "y = y * (%s)v%d;", ct, (int)vw);
        }
        if (nm->b >= 0) {
            int32_t vb = tb__cg_eval(
                g, nm->b, tb__ix_var_pos_flat(&g->ix, tb__plan_shape(G, nm->b), j, 1, -1));
            if (vb < 0) return false;
            tb__ix_line(&g->ix, "y = y + (%s)v%d;", ct, (int)vb);
        }
        tb__ix_line(&g->ix, "const %s v%d = (%s)y;", t, (int)vf, t);
    } else if (nm->cn->op == TB_OP_SOFTMAX) {
        tb__ix_line(&g->ix, "const %s v%d = (%s)((%s)%s(v%d - (%s)mx) * rsm);", t, (int)vf, t, ct,
                    tb__cg_math(g, "exp", nm->od), (int)vx, t);
    } else {
        tb__ix_line(&g->ix, "const %s v%d = (%s)((%s)v%d - mx - lse);", t, (int)vf, t, ct, (int)vx);
    }
    vf = tb__cg_round(g, nm->od, vf);
    if (vf < 0) return false;
    tb__ix_memo_add(&g->ix, TB__MEMO_VALUE, nm->k->core, xp, 0, vf);
    vr = tb__cg_eval(g, nm->k->root, xp);
    if (vr < 0 || !tb__ix_need_flat(&g->ix, xp)) return false;
    tb__lf_text(&g->ix.pos[xp].flat, flat, sizeof flat);
    tb__cg_store(g, tb__plan_shape(g->G, nm->k->root)->dtype, "out", flat, vr);
    return g->ix.status == TB_OK;
}

/* A stashing softmax's passes 1 and 2 read and write out at x's position: its flat index in
   `flat`. False when code generation stopped. */
static bool tb__cg_norm_stash_at(tb__cg *g, const tb__cg_norm *nm, int pass, int32_t xp,
                                 char flat[TB__LF_TEXT]) {
    if (!nm->stash || pass < 1) return true;
    if (!tb__ix_need_flat(&g->ix, xp)) return false;
    tb__lf_text(&g->ix.pos[xp].flat, flat, TB__LF_TEXT);
    return true;
}

/* Whether a flat offset is a multiple of w wherever the vector loop variable j (a multiple
   of w) is: every other term's coefficient and the constant are. */
static bool tb__cg_vec_aligned(const tb__lf *flat, int32_t j, int32_t w) {
    int32_t i;
    if (flat->c % w != 0) return false;
    for (i = 0; i < flat->n; i++)
        if (flat->var[i] != j && flat->coef[i] % w != 0) return false;
    return true;
}

/* The prefetch (`how`: the dialect's TB_PREFETCH or TB_PREFETCH_L2) of x's element one row
   ahead of position xp, where x is read from a buffer (a parameter or another kernel's
   output) along contiguous rows; nothing otherwise. False when code generation stopped. */
static bool tb__cg_norm_prefetch(tb__cg *g, const tb__cg_norm *nm, int32_t xp, const char *how) {
    char flat[TB__LF_TEXT];
    if (!nm->k->suffix || !tb__cg_reads_buffer(g, nm->x)) return true;
    if (!tb__ix_need_flat(&g->ix, xp)) return false;
    tb__lf_text(&g->ix.pos[xp].flat, flat, sizeof flat);
    tb__ix_line(&g->ix, "%s(b%d + (%s) + %lldL);", how, (int)g->G->info[nm->x].slot, flat,
                (long long)nm->len);
    return g->ix.status == TB_OK;
}

/* The accumulator of a norm's vector reduction pass (0: the sum or the maximum, 1: the squared
   deviations or the sum of exponentials), accumulator `u` of the pass's chains (0: "mxv"). */
static void tb__cg_norm_acc(const tb__cg_norm *nm, int pass, int u, char *buf, size_t cap) {
    const char *base = pass == 0 ? (nm->layer ? "sumv" : "mxv") : (nm->layer ? "sqv" : "smv");
    if (u == 0) {
        snprintf(buf, cap, "%s", base);
    } else {
        snprintf(buf, cap, "%s%d", base, u);
    }
}

/* Folds the W elements of x at the vector loop variable i<j> into accumulator `u` of a
   reduction pass (a stashing softmax's pass 1 also stores its exponentials). */
static bool tb__cg_norm_vfold(tb__cg *g, const tb__cg_norm *nm, int pass, int32_t j, int u) {
    char acc[16], flat[TB__LF_TEXT];
    int32_t xp = tb__cg_norm_pos(g, nm, j), vx;
    tb__cg_norm_acc(nm, pass, u, acc, sizeof acc);
    if (!tb__cg_norm_stash_at(g, nm, pass, xp, flat)) return false;
    vx = tb__cg_veval(g, nm->x, xp);
    if (vx < 0) return false;
    if (pass == 1 && nm->k->prefetch_rows && !tb__cg_norm_prefetch(g, nm, xp, "TB_PREFETCH"))
        return false;
    if (nm->stash && pass == 1) {
        tb__ix_line(&g->ix, "const tb_vf evv%d = TB_VEXP(v%d - mx);", u, (int)vx);
        tb__ix_line(&g->ix, "%s += evv%d;", acc, u);
        tb__ix_line(&g->ix, "TB_VST(evv%d, 0, out + (%s));", u, flat);
    } else if (pass == 0) {
        if (nm->layer) {
            tb__ix_line(&g->ix, "%s += v%d;", acc, (int)vx);
        } else {
            tb__ix_line(&g->ix, "%s = tb_vmax(v%d, %s);", acc, (int)vx, acc);
        }
    } else if (nm->layer) {
        tb__ix_line(&g->ix, "const tb_vf dv%d = v%d - mean;", u, (int)vx);
        tb__ix_line(&g->ix, "%s += dv%d * dv%d;", acc, u, u);
    } else {
        tb__ix_line(&g->ix, "%s += TB_VEXP(v%d - mx);", acc, (int)vx);
    }
    return g->ix.status == TB_OK;
}

/* The vector part of a reduction pass over the row (elements [0, rv), W at a time): where the
   vectors are narrower than 16 lanes, 16 / W accumulators take turns (each its own chain of
   dependent adds or maxima), so that a row's chain is as long whatever the vector width; then
   they are combined, in a fixed order, and the result folded to a scalar. */
static bool tb__cg_norm_vreduce(tb__cg *g, const tb__cg_norm *nm, int pass) {
    int32_t w = nm->k->vec, lanes = w < 16 ? 16 / w : 1, j, u;
    char head[160], acc[16], acc0[16];
    tb__cg_norm_acc(nm, pass, 0, acc0, sizeof acc0);
    for (u = 1; u < lanes; u++) {
        tb__cg_norm_acc(nm, pass, u, acc, sizeof acc);
        tb__ix_line(&g->ix, "tb_vf %s = TB_VBC(%s);", acc,
                    pass == 0 && !nm->layer ? "-INFINITY" : "0.0f");
    }
    if (lanes > 1) {
        tb__ix_line(&g->ix, "const long ru%d = rv / %dL * %dL;", pass, (int)(lanes * w),
                    (int)(lanes * w));
        j = tb__ix_new_var(&g->ix, 0, nm->len - 1);
        if (j < 0) return false;
        snprintf(head, sizeof head, "for (long i%d = 0; i%d < ru%d; i%d += %d) ", (int)j, (int)j,
                 pass, (int)j, (int)(lanes * w));
        tb__ix_open(&g->ix, head);
        if (!tb__cg_norm_vfold(g, nm, pass, j, 0)) return false;
        for (u = 1; u < lanes; u++) {
            int32_t ju = tb__ix_new_var(&g->ix, 0, nm->len - 1);
            if (ju < 0) return false;
            tb__ix_line(&g->ix, "const long i%d = i%d + %dL;", (int)ju, (int)j, (int)(u * w));
            if (!tb__cg_norm_vfold(g, nm, pass, ju, u)) return false;
        }
        tb__ix_close(&g->ix, "");
    }
    j = tb__ix_new_var(&g->ix, 0, nm->len - 1);
    if (j < 0) return false;
    if (lanes > 1) {
        snprintf(head, sizeof head, "for (long i%d = ru%d; i%d < rv; i%d += %d) ", (int)j, pass,
                 (int)j, (int)j, (int)w);
    } else {
        snprintf(head, sizeof head, "for (long i%d = 0; i%d < rv; i%d += %d) ", (int)j, (int)j,
                 (int)j, (int)w);
    }
    tb__ix_open(&g->ix, head);
    if (!tb__cg_norm_vfold(g, nm, pass, j, 0)) return false;
    tb__ix_close(&g->ix, "");
    for (u = 1; u < lanes; u++) {
        tb__cg_norm_acc(nm, pass, u, acc, sizeof acc);
        if (pass == 0 && !nm->layer) {
            tb__ix_line(&g->ix, "%s = tb_vmax(%s, %s);", acc0, acc, acc0);
        } else {
            tb__ix_line(&g->ix, "%s += %s;", acc0, acc);
        }
    }
    if (pass == 0) {
        tb__ix_line(&g->ix, "%s", nm->layer ? "sum = tb_hsum(sumv);" : "mx = tb_hmax(mxv);");
    } else {
        tb__ix_line(&g->ix, "%s", nm->layer ? "sqdev = tb_hsum(sqv);" : "sm = tb_hsum(smv);");
    }
    return g->ix.status == TB_OK;
}

/* The vector part of a pass over the row: elements [0, rv) W at a time, folded into the
   vector accumulators (passes 0 and 1: tb__cg_norm_vreduce) or normalised and stored (pass 2);
   the caller does the rest [rv, len) one element at a time. */
static bool tb__cg_norm_vpass(tb__cg *g, const tb__cg_norm *nm, int pass) {
    int32_t w = nm->k->vec, j, xp, vx, wp, vf, vr;
    char head[128], flat[TB__LF_TEXT];
    bool stream = false;
    if (pass < 2) return tb__cg_norm_vreduce(g, nm, pass);
    j = tb__ix_new_var(&g->ix, 0, nm->len - 1);
    if (j < 0) return false;
    snprintf(head, sizeof head, "for (long i%d = 0; i%d < rv; i%d += %d) ", (int)j, (int)j, (int)j,
             (int)w);
    tb__ix_open(&g->ix, head);
    xp = tb__cg_norm_pos(g, nm, j);
    if (!tb__cg_norm_stash_at(g, nm, pass, xp, flat)) return false;
    if (nm->stash) {
        tb__ix_line(&g->ix, "TB_VST(TB_VLD(0, out + (%s)) * rsm, 0, out + (%s));", flat, flat);
        tb__ix_close(&g->ix, "");
        return g->ix.status == TB_OK;
    }
    vx = tb__cg_veval(g, nm->x, xp);
    if (vx < 0) return false;
    vf = tb__cg_new_vec(g);
    if (vf < 0) return false;
    if (nm->layer) {
        tb__ix_line(&g->ix, "tb_vf y = (v%d - mean) * rstd;", (int)vx);
        if (nm->w >= 0) {
            wp = tb__ix_var_pos_flat(&g->ix, tb__plan_shape(g->G, nm->w), j, 1, -1);
            vr = tb__cg_veval(g, nm->w, wp);
            if (vr < 0) return false;
            tb__ix_line(&g->ix, "y = y * v%d;", (int)vr);
        }
        if (nm->b >= 0) {
            wp = tb__ix_var_pos_flat(&g->ix, tb__plan_shape(g->G, nm->b), j, 1, -1);
            vr = tb__cg_veval(g, nm->b, wp);
            if (vr < 0) return false;
            tb__ix_line(&g->ix, "y = y + v%d;", (int)vr);
        }
        tb__ix_line(&g->ix, "const tb_vf v%d = y;", (int)vf);
    } else if (nm->cn->op == TB_OP_SOFTMAX) {
        tb__ix_line(&g->ix, "const tb_vf v%d = TB_VEXP(v%d - mx) * rsm;", (int)vf, (int)vx);
    } else {
        tb__ix_line(&g->ix, "const tb_vf v%d = v%d - mx - lse;", (int)vf, (int)vx);
    }
    vf = tb__cg_vround(g, nm->od, vf);
    if (vf < 0) return false;
    tb__ix_memo_add(&g->ix, TB__MEMO_VECTOR, nm->k->core, xp, 0, vf);
    vr = tb__cg_veval(g, nm->k->root, xp);
    if (vr < 0 || !tb__ix_need_flat(&g->ix, xp)) return false;
    tb__lf_text(&g->ix.pos[xp].flat, flat, sizeof flat);
    stream = nm->k->stream_out && tb__cg_vec_aligned(&g->ix.pos[xp].flat, j, w);
    {
        char ptr[TB__LF_TEXT + 16];
        snprintf(ptr, sizeof ptr, "out + (%s)", flat);
        tb__cg_vstore(g, tb__plan_shape(g->G, nm->k->root)->dtype, vr, ptr, stream);
    }
    tb__ix_close(&g->ix, "");
    if (stream) tb__ix_line(&g->ix, "TB_VSTREAM_END();");
    return g->ix.status == TB_OK;
}

/* One pass over the row: 0 the sum or the maximum, 1 the squared deviations or the sum of
   exponentials, 2 the output. */
static bool tb__cg_norm_pass(tb__cg *g, const tb__cg_norm *nm, int pass) {
    const tb__plan_kernel *k = nm->k;
    const char *ct = nm->ct;
    char head[128], flat[TB__LF_TEXT];
    int32_t j, xp, vx;
    if (k->vec > 0 && !tb__cg_norm_vpass(g, nm, pass)) return false;
    j = tb__ix_new_var(&g->ix, 0, nm->len > 0 ? nm->len - 1 : 0);
    if (j < 0) return false;
    if (k->group <= 1) {
        snprintf(head, sizeof head, "for (long i%d = %s; i%d < %lldL; i%d++) ", (int)j,
                 k->vec > 0 ? "rv" : "0", (int)j, (long long)nm->len, (int)j);
    } else {
        snprintf(head, sizeof head, "for (long i%d = lid; i%d < %lldL; i%d += %d) ", (int)j, (int)j,
                 (long long)nm->len, (int)j, (int)k->group);
    }
    tb__ix_open(&g->ix, head);
    xp = tb__cg_norm_pos(g, nm, j);
    if (!tb__cg_norm_stash_at(g, nm, pass, xp, flat)) return false;
    if (nm->stash && pass == 2) {
        tb__ix_line(&g->ix, "out[%s] = (%s)((%s)out[%s] * rsm);", flat, nm->t, ct, flat);
        tb__ix_close(&g->ix, "");
        return g->ix.status == TB_OK;
    }
    vx = tb__cg_eval(g, nm->x, xp);
    if (vx < 0) return false;
    if (nm->stash && pass == 1) {
        tb__ix_line(&g->ix, "const %s ev = (%s)%s(v%d - (%s)mx);", ct, ct,
                    tb__cg_math(g, "exp", nm->od), (int)vx, nm->t);
        tb__ix_line(&g->ix, "sm += ev;");
        tb__ix_line(&g->ix, "out[%s] = (%s)ev;", flat, nm->t);
    } else if (pass == 0) {
        if (nm->layer) {
            tb__ix_line(&g->ix, "sum += (%s)v%d;", ct, (int)vx);
        } else {
            tb__ix_line(&g->ix, "if ((%s)v%d > mx || isnan(v%d)) mx = (%s)v%d;", ct, (int)vx,
                        (int)vx, ct, (int)vx);
        }
    } else if (pass == 1) {
        if (nm->layer) {
            tb__ix_line(&g->ix, "const %s dv = (%s)v%d - mean;", ct, ct, (int)vx);
            tb__ix_line(&g->ix, "sqdev += dv * dv;");
        } else {
            tb__ix_line(&g->ix, "sm += (%s)%s(v%d - (%s)mx);", ct, tb__cg_math(g, "exp", nm->od),
                        (int)vx, nm->t);
        }
    } else if (!tb__cg_norm_store(g, nm, j, xp, vx)) {
        return false;
    }
    tb__ix_close(&g->ix, "");
    return g->ix.status == TB_OK;
}

/* A pipelined softmax's store of elements [j, j + W) of row `row` (C expressions): that row's
   half of tb_scr, scaled by its rsp, streamed to out. */
static void tb__cg_softmax_pipe_store(tb__cg *g, const tb__cg_norm *nm, const char *row,
                                      const char *j) {
    tb__ix_line(
        &g->ix, "TB_VSTREAM(tb_scr[((%s) & 1) * %lld + %s / %d] * rsp, out + (%s) * %lldL + %s);",
        row, (long long)(nm->len / nm->k->vec), j, (int)nm->k->vec, row, (long long)nm->len, j);
}

/* Element vector at i<j> of one vector pass of a pipelined softmax over row i<row>, folded
   into accumulator `u` (mxv, mxv1, ...: pass 0 the maximum; smv, smv1, ...: pass 1 the
   exponentials, summed and kept in the row's half of tb_scr, and, where `drain`, the previous
   row's (the other half) scaled by its rsp and streamed out). */
static bool tb__cg_softmax_pipe_fold(tb__cg *g, const tb__cg_norm *nm, int32_t row, int pass,
                                     bool drain, int32_t j, int u) {
    long long nv = (long long)(nm->len / nm->k->vec); /* vectors per row */
    int32_t xp = tb__cg_norm_pos(g, nm, j), vx;
    char acc[16];
    tb__cg_norm_acc(nm, pass, u, acc, sizeof acc);
    vx = tb__cg_veval(g, nm->x, xp);
    if (vx < 0) return false;
    if (pass == 0) {
        tb__ix_line(&g->ix, "%s = tb_vmax(v%d, %s);", acc, (int)vx, acc);
        return g->ix.status == TB_OK;
    }
    if (nm->k->prefetch_rows && !tb__cg_norm_prefetch(g, nm, xp, "TB_PREFETCH_L2")) return false;
    tb__ix_line(&g->ix, "const tb_vf evv%d = TB_VEXP(v%d - mx);", u, (int)vx);
    tb__ix_line(&g->ix, "%s += evv%d;", acc, u);
    if (drain) {
        char prev[32], jt[32];
        snprintf(prev, sizeof prev, "i%d - 1", (int)row);
        snprintf(jt, sizeof jt, "i%d", (int)j);
        tb__cg_softmax_pipe_store(g, nm, prev, jt);
    }
    tb__ix_line(&g->ix, "tb_scr[(i%d & 1) * %lld + i%d / %d] = evv%d;", (int)row, nv, (int)j,
                (int)nm->k->vec, u);
    return g->ix.status == TB_OK;
}

/* One vector pass of a pipelined softmax over row i<row> (tb__cg_softmax_pipe_fold): where the
   vectors are narrower than 16 lanes and the row a multiple of 16, 16 / W accumulators take
   turns, so that the chain of a row is as long whatever the vector width (as in
   tb__cg_norm_vreduce); then they are combined in a fixed order. */
static bool tb__cg_softmax_pipe_pass(tb__cg *g, const tb__cg_norm *nm, int32_t row, int pass,
                                     bool drain) {
    int32_t w = nm->k->vec, lanes = w < 16 && nm->len % 16 == 0 ? 16 / w : 1, u;
    int32_t j = tb__ix_new_var(&g->ix, 0, nm->len - 1);
    char head[128], acc[16], acc0[16];
    if (j < 0) return false;
    tb__cg_norm_acc(nm, pass, 0, acc0, sizeof acc0);
    for (u = 1; u < lanes; u++) {
        tb__cg_norm_acc(nm, pass, u, acc, sizeof acc);
        tb__ix_line(&g->ix, "tb_vf %s = TB_VBC(%s);", acc, pass == 0 ? "-INFINITY" : "0.0f");
    }
    snprintf(head, sizeof head, "for (long i%d = 0; i%d < %lldL; i%d += %d) ", (int)j, (int)j,
             (long long)nm->len, (int)j, (int)(lanes * w));
    tb__ix_open(&g->ix, head);
    if (!tb__cg_softmax_pipe_fold(g, nm, row, pass, drain, j, 0)) return false;
    for (u = 1; u < lanes; u++) {
        int32_t ju = tb__ix_new_var(&g->ix, 0, nm->len - 1);
        if (ju < 0) return false;
        tb__ix_line(&g->ix, "const long i%d = i%d + %dL;", (int)ju, (int)j, (int)(u * w));
        if (!tb__cg_softmax_pipe_fold(g, nm, row, pass, drain, ju, u)) return false;
    }
    tb__ix_close(&g->ix, "");
    for (u = 1; u < lanes; u++) {
        tb__cg_norm_acc(nm, pass, u, acc, sizeof acc);
        if (pass == 0) {
            tb__ix_line(&g->ix, "%s = tb_vmax(%s, %s);", acc0, acc, acc0);
        } else {
            tb__ix_line(&g->ix, "%s += %s;", acc0, acc);
        }
    }
    return g->ix.status == TB_OK;
}

/* A softmax over contiguous rows with a streamed output, pipelined (k->chunk_rows): a work
   item takes a chunk of consecutive rows; the pass that computes a row's exponentials keeps
   them in a private buffer of two rows and streams the previous row out, scaled, so memory
   reads the next row (prefetched) and writes the previous one while the exponentials are
   computed, and no line of out is read before it is written. The values are those of the
   kernel that keeps its exponentials in out: the same exp, sum and scaling. */
static tb_status tb__cg_kernel_softmax_pipe(tb__cg *g, const tb__cg_norm *nm, int64_t rows) {
    const tb__plan_kernel *k = nm->k;
    long long len = (long long)nm->len, ch = (long long)k->chunk_rows;
    int32_t i0 = nm->i0;
    char id[48], head[128];
    tb__cg_id(id, sizeof id, g->d->global_id, 0);
    tb__ix_line(&g->ix, "const long tb_c = (long)%s;", id);
    tb__ix_line(&g->ix, "if (tb_c >= %lldL) return;", (long long)k->items); /* the chunks */
    tb__ix_line(&g->ix, "const long tb_r0 = tb_c * %lldL;", ch);
    tb__ix_line(&g->ix, "const long tb_r1 = tb_r0 + %lldL < %lldL ? tb_r0 + %lldL : %lldL;", ch,
                (long long)rows, ch, (long long)rows);
    tb__ix_line(&g->ix, "tb_vf tb_scr[%lld];", 2 * len / k->vec);
    tb__ix_line(&g->ix, "float rsp = 0;");
    snprintf(head, sizeof head, "for (long i%d = tb_r0; i%d < tb_r1; i%d++) ", (int)i0, (int)i0,
             (int)i0);
    tb__ix_open(&g->ix, head);
    tb__ix_line(&g->ix, "tb_vf mxv = TB_VBC(-INFINITY), smv = TB_VBC(0.0f);");
    if (!tb__cg_softmax_pipe_pass(g, nm, i0, 0, false)) return g->ix.status;
    tb__ix_line(&g->ix, "const float mx = tb_hmax(mxv);");
    snprintf(head, sizeof head, "if (i%d > tb_r0) ", (int)i0);
    tb__ix_open(&g->ix, head);
    if (!tb__cg_softmax_pipe_pass(g, nm, i0, 1, true)) return g->ix.status;
    tb__ix_close(&g->ix, "");
    tb__ix_open(&g->ix, "else ");
    if (!tb__cg_softmax_pipe_pass(g, nm, i0, 1, false)) return g->ix.status;
    tb__ix_close(&g->ix, "");
    tb__ix_line(&g->ix, "rsp = (float)1 / tb_hsum(smv);");
    tb__ix_close(&g->ix, "");
    snprintf(head, sizeof head, "for (long tb_j = 0; tb_j < %lldL; tb_j += %d) ", len, (int)k->vec);
    tb__ix_open(&g->ix, head);
    tb__cg_softmax_pipe_store(g, nm, "tb_r1 - 1", "tb_j");
    tb__ix_close(&g->ix, "");
    tb__ix_line(&g->ix, "TB_VSTREAM_END();");
    return g->ix.status;
}

static tb_status tb__cg_kernel_norm(tb__cg *g, const tb__plan_kernel *k) {
    const tb__pgraph *G = g->G;
    tb__cg_norm nm;
    tb_shape rowshape;
    int32_t a, pass;
    memset(&nm, 0, sizeof nm);
    nm.k = k;
    nm.cn = G->info[k->core].node;
    nm.x = tb__plan_operand(G, k->core, 0);
    nm.xs = tb__plan_shape(G, nm.x);
    nm.w = nm.b = nm.row_pos = -1;
    nm.layer = nm.cn->op == TB_OP_LAYER_NORM;
    /* a 16-bit output cannot hold the exponentials between passes: no stash there */
    nm.stash =
        nm.cn->op == TB_OP_SOFTMAX && k->root == k->core && !tb__cg_is_half(nm.cn->shape.dtype);
    nm.axis = nm.layer ? nm.xs->rank - 1 : (int32_t)nm.cn->attrs[0];
    nm.od = nm.cn->shape.dtype;
    nm.t = tb__cg_ctype(nm.od);
    nm.ct = tb__cg_ctype(k->acc);
    nm.len = 1;
    memset(&rowshape, 0, sizeof rowshape);
    rowshape.dtype = nm.xs->dtype;
    if (nm.layer) {
        int32_t next = 1;
        for (a = nm.xs->rank - (int32_t)nm.cn->attrs[0]; a < nm.xs->rank; a++)
            nm.len *= nm.xs->dims[a];
        if (nm.cn->attrs[1] != 0) nm.w = tb__plan_operand(G, k->core, (size_t)next++);
        if (nm.cn->attrs[2] != 0) nm.b = tb__plan_operand(G, k->core, (size_t)next++);
    } else {
        nm.len = nm.xs->dims[nm.axis];
        for (a = 0; a < nm.xs->rank; a++)
            if (a != nm.axis) rowshape.dims[rowshape.rank++] = nm.xs->dims[a];
    }
    if (k->chunk_rows > 0) {
        int64_t rows = tb__plan_numel(nm.xs) / nm.len; /* the planner's: len > 0 */
        nm.i0 = tb__ix_new_var(&g->ix, 0, rows - 1);
        if (nm.i0 < 0) return g->ix.status;
        return tb__cg_kernel_softmax_pipe(g, &nm, rows);
    }
    nm.i0 = tb__cg_row_header(g, k, nm.len > 0 ? tb__plan_numel(nm.xs) / nm.len : 0);
    if (nm.i0 < 0) return g->ix.status;
    if (k->group > 1) tb__cg_local(g, nm.ct, "red", k->group);
    if (!k->suffix) {
        nm.row_pos = tb__ix_var_pos_flat(&g->ix, &rowshape, nm.i0, 1, -1);
        if (nm.row_pos < 0 || !tb__ix_need_multi(&g->ix, nm.row_pos)) return g->ix.status;
    }
    if (nm.layer) {
        tb__ix_line(&g->ix, "%s sum = 0, sqdev = 0;", nm.ct);
    } else {
        tb__ix_line(&g->ix, "%s mx = -INFINITY, sm = 0;", nm.ct);
    }
    if (k->vec > 0) {
        tb__ix_line(&g->ix, "const long rv = %lldL;", (long long)(nm.len / k->vec * k->vec));
        tb__ix_line(&g->ix, "%s",
                    nm.layer ? "tb_vf sumv = TB_VBC(0.0f), sqv = TB_VBC(0.0f);"
                             : "tb_vf mxv = TB_VBC(-INFINITY), smv = TB_VBC(0.0f);");
    }
    for (pass = 0; pass < 3; pass++) {
        if (!tb__cg_norm_pass(g, &nm, pass)) return g->ix.status;
        if (pass == 0) {
            if (k->group > 1)
                tb__cg_local_reduce(g, k->group, nm.layer ? "sum" : "mx", nm.ct,
                                    nm.layer ? "a + b" : "((b > a || isnan(b)) ? b : a)");
            if (nm.layer)
                tb__ix_line(&g->ix, "const %s mean = sum / (%s)%lld;", nm.ct, nm.ct,
                            (long long)nm.len);
        } else if (pass == 1) {
            char eps[64];
            if (k->group > 1)
                tb__cg_local_reduce(g, k->group, nm.layer ? "sqdev" : "sm", nm.ct, "a + b");
            if (nm.layer) {
                tb__cg_flit(k->acc, nm.cn->fattrs[0], eps, sizeof eps);
                tb__ix_line(&g->ix, "const %s rstd = (%s)1 / %s(sqdev / (%s)%lld + %s);", nm.ct,
                            nm.ct, tb__cg_math(g, "sqrt", k->acc), nm.ct, (long long)nm.len, eps);
            } else if (nm.cn->op == TB_OP_LOG_SOFTMAX) {
                tb__ix_line(&g->ix, "const %s lse = %s(sm);", nm.ct, tb__cg_math(g, "log", k->acc));
            } else {
                tb__ix_line(&g->ix, "const %s rsm = (%s)1 / sm;", nm.ct, nm.ct);
            }
        }
    }
    return g->ix.status;
}

#endif /* TB__HAVE_COMPILED_BACKENDS */
