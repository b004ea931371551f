/* ===========================================================================================
   C-family code generator, vectors along rows: the values of codegen.c as vectors of W lanes
   (TB_VW) where the planner found a row kernel's ops all have a vector form (tb__cg_veval),
   their stores and roundings.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* A vector value of W f32 lanes (v<n> too; its dtype is f32; 16-bit floats are loaded to f32
   lanes). */
static int32_t tb__cg_new_vec(tb__cg *g) {
    return tb__cg_new_val(g, TB_F32);
}

/* The line "const <tv> bv<j> = <the dialect's vector of w lanes>;": lane l < live the text
   of `lane` (a printf format of one int) with ids[l], the others `zero`. */
static void tb__cg_vector_of_lanes(tb__cg *g, const char *tv, int32_t j, int32_t w, int32_t live,
                                   const char *lane, const int32_t *ids, const char *zero) {
    tb__str list, vec;
    int32_t l;
    memset(&list, 0, sizeof list);
    memset(&vec, 0, sizeof vec);
    for (l = 0; l < w; l++) {
        if (l > 0) tb__str_append(&list, ", ");
        if (l < live) {
            tb__str_append(&list, lane, (int)ids[l]);
        } else {
            tb__str_append(&list, "%s", zero);
        }
    }
    if (!list.failed) tb__str_append(&vec, g->d->vec_make, tv, list.data);
    if (list.failed || vec.failed) {
        tb__ix_fail(&g->ix, TB_ERR_OUT_OF_MEMORY);
    } else {
        tb__ix_line(&g->ix, "const %s bv%d = %s;", tv, (int)j, vec.data);
    }
    tb__str_free(&vec);
    tb__str_free(&list);
}

/* The statement that stores vector v<v> as the W elements of `dtype` at `ptr` (16-bit floats
   rounded to nearest even: the dialect's TB_VSTH, TB_VSTBF; a value just rounded is stored
   from before its rounding, which the store repeats). f32 with `stream`: the dialect's
   non-temporal TB_VSTREAM (the caller has checked that ptr is aligned to a vector). */
static void tb__cg_vstore(tb__cg *g, tb_dtype dtype, int32_t v, const char *ptr, bool stream) {
    v = tb__cg_unrounded(g, dtype, v);
    if (dtype == TB_F16) {
        tb__ix_line(&g->ix, "TB_VSTH(v%d, %s);", (int)v, ptr);
    } else if (dtype == TB_BF16) {
        tb__ix_line(&g->ix, "TB_VSTBF(v%d, %s);", (int)v, ptr);
    } else if (stream) {
        tb__ix_line(&g->ix, "TB_VSTREAM(v%d, %s);", (int)v, ptr);
    } else {
        tb__ix_line(&g->ix, "TB_VST(v%d, 0, %s);", (int)v, ptr);
    }
}

/* A computed vector of a 16-bit float dtype rounded to it lane by lane. */
static int32_t tb__cg_vround(tb__cg *g, tb_dtype dtype, int32_t v) {
    return tb__cg_round_as(g, dtype, v, true);
}

/* The text of a value as a vector operand: vectors as they are, scalars widened. */
static void tb__cg_vec_operand(int32_t v, bool is_vec, char *buf, size_t cap) {
    if (is_vec) {
        snprintf(buf, cap, "v%d", (int)v);
    } else {
        snprintf(buf, cap, "TB_VBC(v%d)", (int)v);
    }
}

/* One op of the planner's vector set on vector (and scalar) operands. */
static int32_t tb__cg_vec_op(tb__cg *g, const tb_node *n, const int32_t *ops, const bool *is_vec) {
    char a[32], b[32], e[160];
    int32_t v;
    tb__cg_vec_operand(ops[0], is_vec[0], a, sizeof a);
    if (n->op == TB_OP_WHERE && !is_vec[0]) /* a condition constant along the row */
        snprintf(a, sizeof a, "TB_VBC(v%d != 0 ? 1.0f : 0.0f)", (int)ops[0]);
    if (n->num_operands > 1) tb__cg_vec_operand(ops[1], is_vec[1], b, sizeof b);
    switch (n->op) {
    case TB_OP_ADD:
    case TB_OP_SUB:
    case TB_OP_MUL:
    case TB_OP_DIV:
        snprintf(e, sizeof e, "%s %s %s", a,
                 n->op == TB_OP_ADD   ? "+"
                 : n->op == TB_OP_SUB ? "-"
                 : n->op == TB_OP_MUL ? "*"
                                      : "/",
                 b);
        break;
    case TB_OP_RESHAPE: /* to the same dims: nothing to compute */
    case TB_OP_CAST:    /* between f32 and 16-bit floats: the rounding below at most */
        if (is_vec[0] && (n->op == TB_OP_RESHAPE || !tb__cg_is_half(n->shape.dtype))) return ops[0];
        snprintf(e, sizeof e, "%s", a);
        break;
    case TB_OP_NEG:
        snprintf(e, sizeof e, "-%s", a);
        break;
    case TB_OP_ABS:
    case TB_OP_RELU:
        snprintf(e, sizeof e, "tb_v%s(%s)", n->op == TB_OP_ABS ? "abs" : "relu", a);
        break;
    case TB_OP_WHERE: { /* the condition as 0 or 1 in each lane (tb__cg_vcond) */
        char c[32];
        tb__cg_vec_operand(ops[2], is_vec[2], c, sizeof c);
        snprintf(e, sizeof e, "TB_VSEL(%s, %s, %s != 0.0f)", c, b, a);
        break;
    }
    case TB_OP_MAXIMUM:
    case TB_OP_MINIMUM:
        snprintf(e, sizeof e, "tb_v%s(%s, %s)", n->op == TB_OP_MAXIMUM ? "max" : "min", a, b);
        break;
    case TB_OP_CLAMP: { /* as the scalar code: the lower bound, then the upper, NaN kept */
        char c[32];
        tb__cg_vec_operand(ops[2], is_vec[2], c, sizeof c);
        snprintf(e, sizeof e, "tb_vmin(tb_vmax(%s, %s), %s)", a, b, c);
        break;
    }
    default: {
        /* a math op of ops_table.h with a vector form (TB_VEXP is the dialect's: a device's
           built-in where it has a faster one; tb_verf and tb_vgelu the prelude's) */
        const tb__math_code *c = tb__math_code_of(n->op);
        if (c != NULL && c->vec != NULL && tb__cg_template(g, c->vec, TB_F32, a, e, sizeof e))
            break;
        tb__ix_fail(&g->ix, tb__error(TB_ERR_INTERNAL, "codegen: no vector code for op %s",
                                      tb_op_name(n->op) != NULL ? tb_op_name(n->op) : "?"));
        return -1;
    }
    }
    v = tb__cg_new_vec(g);
    if (v < 0) return -1;
    tb__ix_line(&g->ix, "const tb_vf v%d = %s;", (int)v, e);
    /* a reshape widens an operand that is already of its dtype: nothing to round */
    return tb__cg_exact(n) || n->op == TB_OP_RESHAPE ? v : tb__cg_vround(g, n->shape.dtype, v);
}

/* The W consecutive elements of `node` from position `pos` on, as a vector: the planner
   checked that every node on the way is of the vector set, aligned with the row (consecutive
   elements), constant along it (evaluated as a scalar) or a buffer of the row's dims. */
/* W bytes of a buffer (a where's condition) at `pos` as a vector of 0 and 1. */
static int32_t tb__cg_vcond(tb__cg *g, int32_t node, int32_t pos) {
    const tb__pnode *in = &g->G->info[node];
    char flat[TB__LF_TEXT];
    int32_t v;
    if (pos < 0 || g->ix.status != TB_OK) return -1;
    v = tb__ix_memo_find(&g->ix, TB__MEMO_VECTOR, node, pos, 0);
    if (v >= 0) return v;
    if (!tb__cg_arg(g, TB__ARG_BUF, in->slot) || !tb__ix_need_flat(&g->ix, pos)) return -1;
    tb__lf_text(&g->ix.pos[pos].flat, flat, sizeof flat);
    v = tb__cg_new_vec(g);
    if (v < 0) return -1;
    tb__ix_line(&g->ix, "const tb_vf v%d = TB_VLDB(b%d + (%s));", (int)v, (int)in->slot, flat);
    tb__ix_memo_add(&g->ix, TB__MEMO_VECTOR, node, pos, 0, v);
    return v;
}

static int32_t tb__cg_veval(tb__cg *g, int32_t node, int32_t pos) {
    const tb__pnode *in = &g->G->info[node];
    const tb__plan_kernel *k = tb__cg_kernel(g);
    int32_t v, ops[3];
    bool is_vec[3];
    size_t j;
    if (pos < 0 || g->ix.status != TB_OK) return -1;
    v = tb__ix_memo_find(&g->ix, TB__MEMO_VECTOR, node, pos, 0);
    if (v >= 0) return v;
    if (tb__cg_reads_buffer(g, node)) {
        char flat[TB__LF_TEXT];
        if (!tb__cg_arg(g, TB__ARG_BUF, in->slot) || !tb__ix_need_flat(&g->ix, pos)) return -1;
        tb__lf_text(&g->ix.pos[pos].flat, flat, sizeof flat);
        tb_dtype dt = in->node->shape.dtype;
        v = tb__cg_new_vec(g);
        if (v < 0) return -1;
        tb__ix_line(&g->ix, "const tb_vf v%d = %s(%sb%d + (%s));", (int)v,
                    dt == TB_F16    ? "TB_VLDH"
                    : dt == TB_BF16 ? "TB_VLDBF"
                                    : "TB_VLD",
                    dt == TB_F32 ? "0, " : "", (int)in->slot, flat);
    } else {
        if (in->node->num_operands > 3) {
            tb__ix_fail(&g->ix, TB_ERR_INTERNAL);
            return -1;
        }
        for (j = 0; j < in->node->num_operands; j++) {
            int32_t o = tb__plan_operand(g->G, node, j), op;
            op = tb__cg_operand_pos(g, node, pos, j);
            is_vec[j] = tb__plan_row_relation(&in->node->shape, tb__plan_shape(g->G, o),
                                              k->vec_axes) == TB__ROW_ALIGNED;
            if (is_vec[j] && in->node->op == TB_OP_WHERE && j == 0)
                ops[j] = tb__cg_vcond(g, o, op);
            else
                ops[j] = is_vec[j] ? tb__cg_veval(g, o, op) : tb__cg_eval(g, o, op);
            if (ops[j] < 0) return -1;
        }
        v = tb__cg_vec_op(g, in->node, ops, is_vec);
        if (v < 0) return -1;
    }
    tb__ix_memo_add(&g->ix, TB__MEMO_VECTOR, node, pos, 0, v);
    return v;
}

#endif /* TB__HAVE_COMPILED_BACKENDS */
