/* ===========================================================================================
   C-family code generator: renders a kernel plan (planner.c) as source text through a
   dialect, a small description of what differs between OpenCL C and C99 (address-space
   qualifiers, work-item ids, local memory and barriers, vector types, a few built-in names,
   the shape of a kernel's entry point). OpenCL C and C99 are two dialects of this one
   generator; the backends own their dialects (opencl.c, native.c). It emits exactly what the
   plan says: which nodes each kernel evaluates, its arguments, its layout.

   Names in generated kernels: one namespace, split by form so that no two kinds can meet.
   - Numbered names are exactly one kind letter and a decimal number, and nothing else has that
     form: v<n> values and i<n> index variables (numbered by this kernel's counters), b<slot>
     buffer and s<param> scalar arguments (numbered by the plan), x<k> a custom op's operands.
     A kind's numbers are unique, and the letters differ, so numbered names never collide.
   - Every other name is a fixed word of a kernel template (out, acc, mean, row0, tb_err, ...)
     and is never one letter followed by digits, so it cannot meet a numbered name whatever
     the graph; fixed names are the same in every kernel of a kind, so a test of that kind
     shows a collision among them.

   This part: the renderer's values and expressions (one node at a position; codegen_vector.c
   the same as vectors along rows); codegen_matmul.c and codegen_kernels.c write the kernels
   with them, codegen_program.c the program (compile.h).
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* Values one kernel may emit before the renderer gives up: the planner's budget bounds what a
   plan asks for far below this; reaching it is a bug. */
#define TB__CG_HARD_VALUES 1000000

/* The C type of a value of the dtype in a kernel: 16-bit floats compute in float. */
static const char *tb__cg_ctype(tb_dtype dtype) {
    switch (dtype) {
    case TB_F32:
    case TB_F16:
    case TB_BF16:
        return "float";
    case TB_F64:
        return "double";
    case TB_I32:
        return "int";
    case TB_I64:
        return "long";
    default:
        return "uchar"; /* u8 and bool (0 or 1) */
    }
}

static bool tb__cg_is_half(tb_dtype dtype) {
    return dtype == TB_F16 || dtype == TB_BF16;
}

/* The C type of a buffer's elements: 16-bit floats are stored as their bits. */
static const char *tb__cg_btype(tb_dtype dtype) {
    return tb__cg_is_half(dtype) ? "ushort" : tb__cg_ctype(dtype);
}

/* What a store of v<v> as `dtype` stores: the value before v's rounding when v was just
   rounded to that dtype (the store rounds it the same way), else v. */
static int32_t tb__cg_unrounded(const tb__cg *g, tb_dtype dtype, int32_t v) {
    return v == g->rounded && dtype == g->rounded_dtype ? g->unrounded : v;
}

/* The statement that stores value v<v> as element `index` of buffer `buf` (16-bit floats
   rounded to nearest even: TB_STH is the dialect's, tb_f2bf the prelude's). */
static void tb__cg_store(tb__cg *g, tb_dtype dtype, const char *buf, const char *index, int32_t v) {
    v = tb__cg_unrounded(g, dtype, v);
    if (dtype == TB_F16) {
        tb__ix_line(&g->ix, "TB_STH(%s, %s, v%d);", buf, index, (int)v);
    } else if (dtype == TB_BF16) {
        tb__ix_line(&g->ix, "%s[%s] = (ushort)tb_f2bf(v%d);", buf, index, (int)v);
    } else {
        tb__ix_line(&g->ix, "%s[%s] = v%d;", buf, index, (int)v);
    }
}

/* A computed value (`vector`: a vector of W lanes) of a 16-bit float dtype rounded to it:
   values stay floats in a kernel, and every op's result is rounded once, as PyTorch stores it.
   Other dtypes: v itself. The rounding is remembered for the store that may follow. */
static int32_t tb__cg_round_as(tb__cg *g, tb_dtype dtype, int32_t v, bool vector) {
    int32_t r;
    if (!tb__cg_is_half(dtype) || v < 0) return v;
    r = vector ? tb__cg_new_val(g, TB_F32) : tb__cg_new_val(g, dtype);
    if (r < 0) return -1;
    if (vector) {
        tb__ix_line(&g->ix, "const tb_vf v%d = %s(v%d);", (int)r,
                    dtype == TB_F16 ? "TB_VRNDH" : "tb_vrnd_bf16", (int)v);
    } else {
        tb__ix_line(&g->ix, "const float v%d = %s(v%d);", (int)r,
                    dtype == TB_F16 ? "tb_rnd_f16" : "tb_rnd_bf16", (int)v);
    }
    g->rounded = r;
    g->unrounded = v;
    g->rounded_dtype = dtype;
    return r;
}

static int32_t tb__cg_round(tb__cg *g, tb_dtype dtype, int32_t v) {
    return tb__cg_round_as(g, dtype, v, false);
}

/* The unsigned type integer arithmetic wraps in. */
static const char *tb__cg_utype(tb_dtype dtype) {
    return dtype == TB_I64 ? "ulong" : "uint";
}

/* The C type of an accumulator dtype chosen by the planner (integers wrap: unsigned). */
static const char *tb__cg_acc_ctype(tb_dtype acc) {
    if (tb_dtype_is_float(acc)) return tb__cg_ctype(acc);
    return tb__cg_utype(acc);
}

static const tb__plan *tb__cg_plan(const tb__cg *g) {
    return g->P;
}

static tb__plan_kernel *tb__cg_kernel(const tb__cg *g) {
    return &g->P->kernels[g->kernel];
}

static int32_t tb__cg_new_val(tb__cg *g, tb_dtype dtype) {
    if (g->num_vals >= TB__CG_HARD_VALUES) {
        tb__ix_fail(&g->ix, tb__error(TB_ERR_INTERNAL, "codegen: kernel %s exceeds its budget",
                                      tb__cg_kernel(g)->name));
        return -1;
    }
    if (tb__grow((void **)&g->val_dtype, &g->cap_vals, g->num_vals + 1, sizeof(tb_dtype)) !=
        TB_OK) {
        tb__ix_fail(&g->ix, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    g->val_dtype[g->num_vals] = dtype;
    return (int32_t)g->num_vals++;
}

/* A math function of the dialect for a dtype. */
static const char *tb__cg_math(const tb__cg *g, const char *fn, tb_dtype dtype) {
    return g->d->math(fn, dtype);
}

/* A floating literal of the dtype (a float literal carries the f suffix). */
static void tb__cg_flit(tb_dtype dtype, double v, char *buf, size_t cap) {
    bool f32 = dtype != TB_F64;
    if (v != v) {
        snprintf(buf, cap, "%s", f32 ? "NAN" : "((double)NAN)");
    } else if (v > DBL_MAX || v < -DBL_MAX) {
        snprintf(buf, cap, "%s%s", v < 0 ? "-" : "", f32 ? "INFINITY" : "((double)INFINITY)");
    } else {
        char tmp[40]; /* "%.17g" needs at most 24 bytes; the rest leaves room for ".0" */
        snprintf(tmp, sizeof tmp, f32 ? "%.9g" : "%.17g", f32 ? (double)(float)v : v);
        if (strchr(tmp, '.') == NULL && strchr(tmp, 'e') == NULL) strcat(tmp, ".0");
        snprintf(buf, cap, "%s%s", tmp, f32 ? "f" : "");
    }
}

/* Checks that the plan gave this kernel the argument (the planner decides them all). */
static bool tb__cg_arg(tb__cg *g, int32_t kind, int32_t index) {
    const tb__plan_kernel *k = tb__cg_kernel(g);
    size_t i;
    for (i = 0; i < k->num_args; i++)
        if (k->args[i].kind == kind && k->args[i].index == index) return true;
    tb__ix_fail(&g->ix, tb__error(TB_ERR_INTERNAL,
                                  "codegen: kernel %s reads argument %d:%d, which its plan "
                                  "does not give it",
                                  k->name, (int)kind, (int)index));
    return false;
}

/* The code a kernel reports (tb_report, tb__cg_render) for a node that can fail at run time. */
static int32_t tb__cg_errsite(tb__cg *g, int32_t node) {
    int32_t code = tb__plan_errsite_code(g->P, node);
    if (code < 0 || !tb__cg_arg(g, TB__ARG_ERR, 0)) {
        if (g->ix.status == TB_OK)
            tb__ix_fail(&g->ix,
                        tb__error(TB_ERR_INTERNAL, "codegen: node %d has no errsite", (int)node));
        return -1;
    }
    return code;
}

/* The id of work item dimension d, as the dialect names it. */
static void tb__cg_id(char *buf, size_t cap, const char *fmt, int d) {
    snprintf(buf, cap, fmt, d);
}

/* ---- values ---- */

static bool tb__cg_push_frame(tb__cg *g, int32_t node, int32_t pos) {
    if (tb__grow((void **)&g->frames, &g->cap_frames, g->num_frames + 1, sizeof(tb__cg_frame)) !=
        TB_OK) {
        tb__ix_fail(&g->ix, TB_ERR_OUT_OF_MEMORY);
        return false;
    }
    g->frames[g->num_frames].node = node;
    g->frames[g->num_frames].pos = pos;
    g->frames[g->num_frames].state = 0;
    g->frames[g->num_frames].vbase = 0;
    g->num_frames++;
    return true;
}

static bool tb__cg_push_value(tb__cg *g, int32_t v) {
    if (tb__grow((void **)&g->stack, &g->cap_stack, g->num_stack + 1, sizeof(int32_t)) != TB_OK) {
        tb__ix_fail(&g->ix, TB_ERR_OUT_OF_MEMORY);
        return false;
    }
    g->stack[g->num_stack++] = v;
    return true;
}

/* Whether the current kernel reads node from a buffer (a parameter, or another kernel's
   output): b<slot> at the node's own flat index. */
static bool tb__cg_reads_buffer(const tb__cg *g, int32_t node) {
    const tb__pnode *in = &g->G->info[node];
    return in->param >= 0 || (in->root && node != tb__cg_kernel(g)->root);
}

/* The position of operand k of an elementwise or movement node at position `pos`. */
static int32_t tb__cg_operand_pos(tb__cg *g, int32_t node, int32_t pos, size_t k) {
    const tb_node *n = g->G->info[node].node;
    const tb_node *c = g->G->info[tb__plan_operand(g->G, node, k)].node;
    const tb_shape *ns = &n->shape, *cs = &c->shape;
    tb__lf dims[TB_MAX_RANK];
    int32_t i, off;
    tb__pos p;
    if (n->op == TB_OP_RAND || n->op == TB_OP_RANDN) {
        tb__lf zero;
        tb__lf_const(&zero, 0);
        return tb__ix_pos_flat(&g->ix, cs, &zero);
    }
    if (n->op == TB_OP_RESHAPE) {
        /* per dim where the axes group (merged or split runs), else through the flat index;
           a buffer is read at its flat index, which a reshape keeps (no digits to unravel) */
        if (g->ix.pos[pos].has_multi && !g->ix.pos[pos].has_flat &&
            !tb__cg_reads_buffer(g, tb__plan_operand(g->G, node, k)) &&
            tb__ix_regroup(&g->ix, g->ix.pos[pos].dim, ns, cs, dims))
            return tb__ix_pos_multi(&g->ix, cs, dims);
        if (!tb__ix_need_flat(&g->ix, pos)) return -1;
        return tb__ix_pos_flat(&g->ix, cs, &g->ix.pos[pos].flat);
    }
    if (tb__plan_is_elementwise(n->op) && tb__plan_same_dims(ns, cs)) return pos;
    if (tb__plan_numel(cs) <= 1 && n->op != TB_OP_PAD && n->op != TB_OP_CONCAT) {
        tb__lf zero;
        tb__lf_const(&zero, 0);
        return tb__ix_pos_flat(&g->ix, cs, &zero);
    }
    if (!tb__ix_need_multi(&g->ix, pos)) return -1;
    p = g->ix.pos[pos];
    switch (n->op) {
    case TB_OP_PERMUTE:
        for (i = 0; i < ns->rank; i++)
            dims[n->attrs[i]] = p.dim[i];
        break;
    case TB_OP_SLICE: {
        int32_t d = (int32_t)n->attrs[0];
        for (i = 0; i < cs->rank; i++)
            dims[i] = p.dim[i];
        tb__lf_const(&dims[d], n->attrs[1]);
        if (!tb__ix_lf_addmul(&g->ix, &dims[d], &p.dim[d], n->attrs[3])) return -1;
        break;
    }
    case TB_OP_WINDOW: {
        /* the plain form adds the kernel axes after x's; the diagonal one reads x's own */
        int32_t nsp = (int32_t)n->attrs[0], diag = n->num_attrs == 2 + 4 * (size_t)nsp;
        int32_t lead = cs->rank - (diag ? 2 : 1) * nsp;
        for (i = 0; i < cs->rank; i++)
            dims[i] = p.dim[i];
        for (i = 0; i < nsp; i++) {
            tb__lf_const(&dims[lead + i], 0);
            if (!tb__ix_lf_addmul(&g->ix, &dims[lead + i], &p.dim[lead + i], n->attrs[3 + 4 * i]) ||
                !tb__ix_lf_addmul(&g->ix, &dims[lead + i], &p.dim[lead + nsp + i],
                                  n->attrs[4 + 4 * i]))
                return -1;
        }
        break;
    }
    case TB_OP_FLIP:
        for (i = 0; i < cs->rank; i++) {
            if (((uint64_t)n->attrs[0] >> i) & 1u) {
                tb__lf_const(&dims[i], cs->dims[i] - 1);
                if (!tb__ix_lf_addmul(&g->ix, &dims[i], &p.dim[i], -1)) return -1;
            } else {
                dims[i] = p.dim[i];
            }
        }
        break;
    default: /* EXPAND and broadcasting elementwise operands: aligned at the last axis */
        off = ns->rank - cs->rank;
        for (i = 0; i < cs->rank; i++) {
            if (cs->dims[i] == 1 || i + off < 0) {
                tb__lf_const(&dims[i], 0);
            } else {
                dims[i] = p.dim[i + off];
            }
        }
        break;
    }
    return tb__ix_pos_multi(&g->ix, cs, dims);
}

/* Reads element `pos` of a buffer slot. */
static int32_t tb__cg_read_slot(tb__cg *g, int32_t slot, tb_dtype dtype, int32_t pos) {
    char text[TB__LF_TEXT], split[2 * TB__LF_TEXT + 32];
    int32_t v;
    if (!tb__cg_arg(g, TB__ARG_BUF, slot)) return -1;
    if (!tb__ix_need_flat(&g->ix, pos)) return -1;
    tb__lf_text(&g->ix.pos[pos].flat, text, sizeof text);
    if (g->capture != NULL) {
        memcpy(g->capture, text, sizeof text);
        g->capture_slot = slot;
        g->capture_flat = g->ix.pos[pos].flat;
        g->capture = NULL;
    }
    v = tb__cg_new_val(g, dtype);
    if (v < 0) return -1;
    if (dtype == TB_F16) {
        tb__ix_line(&g->ix, "const float v%d = TB_LDH(b%d, %s);", (int)v, (int)slot, text);
    } else if (dtype == TB_BF16) {
        tb__ix_line(&g->ix, "const float v%d = tb_bf2f(b%d[%s]);", (int)v, (int)slot, text);
    } else if (tb__ix_split_text(&g->ix, &g->ix.pos[pos].flat, g->inner_var, (int)slot, split,
                                 sizeof split)) {
        tb__ix_line(&g->ix, "const %s v%d = %s;", tb__cg_ctype(dtype), (int)v, split);
    } else {
        tb__ix_line(&g->ix, "const %s v%d = b%d[%s];", tb__cg_ctype(dtype), (int)v, (int)slot,
                    text);
    }
    return v;
}

/* The type a scalar argument has in the kernel: doubles travel as floats where the device has
   no double precision, 16-bit floats as their bits. */
static const char *tb__cg_scalar_ctype(const tb__cg *g, tb_dtype dtype) {
    if (dtype == TB_F64 && !g->d->f64) return "float";
    if (tb__cg_is_half(dtype)) return "ushort";
    return tb__cg_ctype(dtype);
}

/* Enters a pad, concat or gather (they evaluate their operands recursively); the planner
   bounds their nesting in a kernel. */
static bool tb__cg_enter(tb__cg *g, int32_t node) {
    if (++g->depth > g->G->target->tuning->nesting + 1) {
        g->depth--;
        tb__ix_fail(&g->ix,
                    tb__error(TB_ERR_INTERNAL,
                              "codegen: node %d nested deeper than its plan allows", (int)node));
        return false;
    }
    return true;
}

/* A pad's condition on the row loop's variable (form f within [before, end)): narrows the
   interior where every such condition holds; a form other than k * row + c (k > 0) leaves the
   loop unsplit. */
static void tb__cg_row_note(tb__cg *g, const tb__lf *f, int64_t before, int64_t end) {
    int64_t k = f->coef[0], lo, hi;
    if (f->n != 1 || k <= 0) {
        g->row_mixed = true;
        return;
    }
    lo = tb__ix_ceil_div(before - f->c, k);
    hi = tb__ix_ceil_div(end - f->c, k);
    if (lo > g->row_lo) g->row_lo = lo;
    if (hi < g->row_hi) g->row_hi = hi;
}

/* A pad's test on a pack run's row (tb__cg.row_rt): a form row + other terms is kept for the
   run's interior; any other leaves the run unsplit. */
static void tb__cg_row_form(tb__cg *g, const tb__lf *f, int64_t before, int64_t end) {
    if (tb__lf_coef(f, g->row_var) != 1 || g->num_row_forms >= TB__CG_ROW_FORMS) {
        g->row_mixed = true;
        return;
    }
    g->row_forms[g->num_row_forms] = *f;
    g->row_before[g->num_row_forms] = before;
    g->row_end[g->num_row_forms] = end;
    g->num_row_forms++;
}

/* A pad (or crop) at position pos: x where pos falls inside it, else its value. An axis the
   index ranges show inside x is not checked. In a row loop, the axes whose form does not hold
   the row's variable are clamped into x and the result selected by them (no branch: the loop
   vectorises), while a condition on the row's variable stays a branch and is noted
   (tb__cg_row_note) for the loop's split into edges and an interior free of it. */
static int32_t tb__cg_pad(tb__cg *g, int32_t node, int32_t pos) {
    const tb_node *n = g->G->info[node].node;
    int32_t x = tb__plan_operand(g->G, node, 0), val = tb__plan_operand(g->G, node, 1);
    const tb_shape *xs = &g->G->info[x].node->shape;
    const char *t = tb__cg_ctype(n->shape.dtype);
    tb__lf zero, dims[TB_MAX_RANK];
    tb__str cond, clamp; /* the whole head, and the clamped axes' test, built then checked */
    uint64_t clamped = 0, tested = 0;
    int32_t vv, v, vx, i, qp, ok = -1;
    tb__pos p;
    tb__lf_const(&zero, 0);
    vv = tb__cg_eval(g, val, tb__ix_pos_flat(&g->ix, &g->G->info[val].node->shape, &zero));
    if (vv < 0) return -1;
    v = tb__cg_new_val(g, n->shape.dtype);
    if (v < 0) return -1;
    tb__ix_line(&g->ix, "%s v%d = (%s)v%d;", t, (int)v, t, (int)vv);
    if (tb__plan_numel(xs) == 0) return v;
    if (!tb__ix_need_multi(&g->ix, pos)) return -1;
    p = g->ix.pos[pos];
    memset(&cond, 0, sizeof cond);
    memset(&clamp, 0, sizeof clamp);
    for (i = 0; i < xs->rank; i++) {
        long long before = (long long)n->attrs[2 * i], end = before + (long long)xs->dims[i];
        int64_t lo, hi;
        bool row = false;
        char text[TB__LF_TEXT];
        tb__str *to = &cond;
        dims[i] = p.dim[i];
        dims[i].c -= before;
        tb__ix_lf_range(&g->ix, &p.dim[i], &lo, &hi);
        if (lo >= before && hi < end) continue;
        if (tb__lf_coef(&p.dim[i], g->row_inside) == 1) {
            g->row_skipped++; /* the run's interior: its bounds hold this test */
            continue;
        }
        row = tb__lf_coef(&p.dim[i], g->row_var) != 0;
        if (g->row_var >= 0 && !row && !g->row_rt) {
            clamped |= (uint64_t)1 << i;
            to = &clamp;
        } else if (row && g->row_rt) {
            tb__cg_row_form(g, &p.dim[i], before, end);
        } else if (row) {
            tb__cg_row_note(g, &p.dim[i], before, end);
        }
        if (to == &cond && !row) tested |= (uint64_t)1 << i;
        tb__lf_text(&p.dim[i], text, sizeof text);
        tb__str_append(to, "%s(%s) >= %lldL && (%s) < %lldL",
                       to->len > 0 ? " && " : (to == &cond ? "if (" : ""), text, before, text, end);
    }
    if (cond.len > 0) tb__str_append(&cond, ") ");
    if (clamped != 0 && !clamp.failed && (ok = tb__ix_new_var(&g->ix, 0, 1)) >= 0)
        tb__ix_line(&g->ix, "const long i%d = %s;", (int)ok, clamp.data);
    for (i = 0; i < xs->rank && ok >= 0; i++) {
        char text[TB__LF_TEXT];
        int32_t c;
        if (!((clamped >> i) & 1u)) continue;
        c = tb__ix_new_var(&g->ix, 0, xs->dims[i] - 1);
        ok = c < 0 ? -1 : ok; /* failed: reported below, no read left unclamped */
        if (ok < 0) break;
        tb__lf_text(&dims[i], text, sizeof text);
        tb__ix_line(&g->ix, "const long i%d = i%d ? %s : 0L;", (int)c, (int)ok, text);
        tb__lf_const(&dims[i], 0);
        tb__lf_add_term(&dims[i], c, 1);
    }
    if (cond.failed || clamp.failed || (clamped != 0 && ok < 0)) {
        tb__str_free(&cond);
        tb__str_free(&clamp);
        tb__ix_fail(&g->ix, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    tb__ix_open(&g->ix, cond.len > 0 ? cond.data : "");
    tb__str_free(&cond);
    tb__str_free(&clamp);
    for (i = 0, qp = 0; i < xs->rank && qp >= 0; i++) /* tested axes: the test's range */
        if ((tested >> i) & 1u) qp = tb__ix_narrow_axis(&g->ix, &dims[i], 0, xs->dims[i] - 1);
    if (qp >= 0) qp = tb__ix_pos_multi(&g->ix, xs, dims);
    vx = qp >= 0 ? tb__cg_eval(g, x, qp) : -1;
    if (vx >= 0 && ok < 0) tb__ix_line(&g->ix, "v%d = v%d;", (int)v, (int)vx);
    if (vx >= 0 && ok >= 0 && strcmp(t, "float") == 0)
        tb__ix_line(&g->ix, "v%d = tb_sel_f32((int)i%d, v%d, v%d);", (int)v, (int)ok, (int)vx,
                    (int)v);
    else if (vx >= 0 && ok >= 0)
        tb__ix_line(&g->ix, "v%d = i%d ? v%d : v%d;", (int)v, (int)ok, (int)vx, (int)v);
    tb__ix_close(&g->ix, "");
    return vx >= 0 ? v : -1;
}

/* Operand j of a concat (starting at `start` along the axis) at the element position p of
   the concat reads, into v<v>; false if failed. */
static bool tb__cg_concat_leaf(tb__cg *g, int32_t node, const tb__pos *p, int32_t j, int64_t start,
                               int32_t v) {
    int32_t dim = (int32_t)g->G->info[node].node->attrs[0];
    int32_t x = tb__plan_operand(g->G, node, (size_t)j), qp, vx, d;
    const tb_shape *xs = &g->G->info[x].node->shape;
    tb__lf dims[TB_MAX_RANK];
    memset(dims, 0, sizeof dims); /* only rank entries are used; optimisers cannot tell */
    for (d = 0; d < xs->rank; d++)
        dims[d] = p->dim[d];
    dims[dim].c -= start;
    qp = tb__ix_pos_multi(&g->ix, xs, dims);
    vx = qp >= 0 ? tb__cg_eval(g, x, qp) : -1;
    if (vx >= 0) tb__ix_line(&g->ix, "v%d = v%d;", (int)v, (int)vx);
    return vx >= 0;
}

/* Operands idx[lo, hi) of a concat run (starting at starts[] along the axis, where i<c> is),
   one leaf each of a balanced tree of comparisons, into v<v>. */
static bool tb__cg_concat_tree(tb__cg *g, int32_t node, const tb__pos *p, const int32_t *idx,
                               const int64_t *starts, int32_t lo, int32_t hi, int32_t c,
                               int32_t v) {
    char head[64];
    int32_t mid = lo + (hi - lo) / 2;
    bool ok;
    if (hi - lo == 1) return tb__cg_concat_leaf(g, node, p, idx[lo], starts[lo], v);
    snprintf(head, sizeof head, "if (i%d < %lldL) ", (int)c, (long long)starts[mid]);
    tb__ix_open(&g->ix, head);
    ok = tb__cg_concat_tree(g, node, p, idx, starts, lo, mid, c, v);
    tb__ix_close(&g->ix, "");
    if (!ok) return false;
    tb__ix_open(&g->ix, "else ");
    ok = tb__cg_concat_tree(g, node, p, idx, starts, mid, hi, c, v);
    tb__ix_close(&g->ix, "");
    return ok;
}

/* A constant table of the kernel (in the dialect's storage for them) named `name`: `count`
   entries `vals` of type `type`. */
static void tb__cg_const_table(tb__cg *g, const char *type, const char *name, const int64_t *vals,
                               int32_t count) {
    tb__str t;
    int32_t i;
    memset(&t, 0, sizeof t);
    tb__str_append(&t, "%s%s %s[%d] = {", g->d->constant, type, name, (int)count);
    for (i = 0; i < count; i++)
        tb__str_append(&t, "%s%lld", i > 0 ? ", " : "", (long long)vals[i]);
    tb__str_append(&t, "};");
    if (t.failed) {
        tb__ix_fail(&g->ix, TB_ERR_OUT_OF_MEMORY);
    } else {
        tb__ix_line(&g->ix, "%s", t.data);
    }
    tb__str_free(&t);
}

/* The scalar parameter a concat operand is a view of (tb__plan_cat_class: TB__CAT_SCALARS). */
/* The entry of the kernel's run of the table of scalars that holds parameter `param`. */
static int32_t tb__cg_table_entry(tb__cg *g, int32_t param) {
    const tb__plan_kernel *k = tb__cg_kernel(g);
    size_t i;
    for (i = 0; i < k->num_table_params; i++)
        if (k->table_params[i] == param) return (int32_t)i;
    tb__ix_fail(&g->ix,
                tb__error(TB_ERR_INTERNAL, "codegen: kernel %s reads scalar %d, not in its table",
                          k->name, (int)param));
    return -1;
}

static int32_t tb__cg_concat_scalar(tb__cg *g, int32_t x) {
    while (g->G->info[x].param < 0)
        x = tb__plan_operand(g->G, x, 0);
    return tb__cg_table_entry(g, g->G->info[x].param);
}

/* The element index in its operand of a table run's element at run coordinate i<r>: the
   concat's flat index before its axis `outer` (a text), the operand's length `len` and start
   `at` along the axis (texts), the concat's flat index after the axis `inner` (a text) of
   `inner_size` elements; into buf. */
static void tb__cg_concat_index(char *buf, size_t cap, const char *outer, bool has_outer,
                                const char *len, int32_t r, const char *at, int64_t inner_size,
                                const char *inner, bool has_inner) {
    char mid[TB__LF_TEXT + 192];
    if (has_outer) {
        snprintf(mid, sizeof mid, "(%s) * %s + i%d - %s", outer, len, (int)r, at);
    } else {
        snprintf(mid, sizeof mid, "i%d - %s", (int)r, at);
    }
    if (inner_size == 1) {
        snprintf(buf, cap, "%s", mid);
    } else {
        snprintf(buf, cap, "(%s) * %lldL%s%s%s", mid, (long long)inner_size,
                 has_inner ? " + (" : "", has_inner ? inner : "", has_inner ? ")" : "");
    }
}

/* A table run's selection of its operand i<k>: i<k> itself, or its entry of a constant table
   `name` of `vals` (when they are not i<k> + base); into buf. */
static void tb__cg_concat_select(tb__cg *g, const char *name, const int64_t *vals, int32_t count,
                                 int32_t kv, char *buf, size_t cap) {
    int32_t j;
    bool affine = true;
    for (j = 0; j < count; j++)
        affine = affine && vals[j] == vals[0] + j;
    if (affine) {
        snprintf(buf, cap, "%lld + i%d", (long long)vals[0], (int)kv);
    } else {
        tb__cg_const_table(g, "int", name, vals, count);
        snprintf(buf, cap, "%s[i%d]", name, (int)kv);
    }
}

/* A run of a concat's operands read through a table (a TB__K_CONCAT kernel of form
   TB__CAT_ARGS or TB__CAT_SCALARS) at position p, i<c> its coordinate along the axis, into
   v<v>: the element's operand i<k> by division (operands of one length) or by binary search
   in their offsets, then its buffer from the table of arguments (tb_in) at the element's
   index in it, or its scalar from the table of scalars. */
static bool tb__cg_concat_lookup(tb__cg *g, int32_t node, const tb__pos *p, int32_t c, int32_t v) {
    const tb__plan_kernel *k = tb__cg_kernel(g);
    const tb_node *n = g->G->info[node].node;
    const tb_shape *cs = &n->shape;
    int32_t dim = (int32_t)n->attrs[0], count = k->cat_count, j, r, kv, d, vx;
    tb_dtype xd = g->G->info[tb__plan_operand(g->G, node, (size_t)k->cat_first)].node->shape.dtype;
    const char *t = tb__cg_ctype(xd);
    int64_t *vals = (int64_t *)tb__calloc((size_t)count + 1, sizeof(int64_t)), len = -1;
    int64_t inner = 1, stride = 1;
    bool same = true, ok = false;
    char len_text[64], at_text[64], sel[64], ptr[96], outer_text[TB__LF_TEXT];
    char inner_text[TB__LF_TEXT], index[2 * TB__LF_TEXT + 256];
    tb__lf outer, innerf;
    if (vals == NULL) {
        tb__ix_fail(&g->ix, TB_ERR_OUT_OF_MEMORY);
        return false;
    }
    /* the operands' offsets along the axis from the run's start */
    for (j = 0; j < count; j++) {
        int64_t xl = g->G->info[tb__plan_operand(g->G, node, (size_t)(k->cat_first + j))]
                         .node->shape.dims[dim];
        vals[j + 1] = vals[j] + xl;
        if (len < 0) len = xl;
        same = same && xl == len;
    }
    r = tb__ix_new_var(&g->ix, 0, k->cat_len > 0 ? k->cat_len - 1 : 0);
    kv = tb__ix_new_var(&g->ix, 0, count - 1);
    if (r < 0 || kv < 0) goto done;
    tb__ix_line(&g->ix, "const long i%d = i%d - %lldL;", (int)r, (int)c, (long long)k->cat_start);
    if (same && len > 0) {
        tb__ix_line(&g->ix, "const long i%d = i%d / %lldL;", (int)kv, (int)r, (long long)len);
        snprintf(len_text, sizeof len_text, "%lldL", (long long)len);
        snprintf(at_text, sizeof at_text, "i%d * %lldL", (int)kv, (long long)len);
    } else {
        /* the last operand starting at or before the element (empty ones start where the
           next one does) */
        tb__cg_const_table(g, "long", "tb_cat_at", vals, count + 1);
        tb__ix_line(&g->ix, "long i%d = 0;", (int)kv);
        tb__ix_line(&g->ix, "for (long tb_hi = %dL; tb_hi - i%d > 1L;) {", (int)count, (int)kv);
        tb__ix_line(&g->ix, "    const long tb_mid = (i%d + tb_hi) / 2L;", (int)kv);
        tb__ix_line(&g->ix, "    if (i%d >= tb_cat_at[tb_mid]) i%d = tb_mid; else tb_hi = tb_mid;",
                    (int)r, (int)kv);
        tb__ix_line(&g->ix, "}");
        snprintf(len_text, sizeof len_text, "(tb_cat_at[i%d + 1] - tb_cat_at[i%d])", (int)kv,
                 (int)kv);
        snprintf(at_text, sizeof at_text, "tb_cat_at[i%d]", (int)kv);
    }
    vx = tb__cg_new_val(g, xd);
    if (vx < 0) goto done;
    if (k->cat_form == TB__CAT_SCALARS) {
        /* the scalars' parameters: their entries of the table of scalars */
        for (j = 0; j < count; j++) {
            vals[j] =
                tb__cg_concat_scalar(g, tb__plan_operand(g->G, node, (size_t)(k->cat_first + j)));
            if (vals[j] < 0) goto done;
        }
        tb__cg_concat_select(g, "tb_cat_sc", vals, count, kv, sel, sizeof sel);
        if (!tb__cg_arg(g, TB__ARG_TABLE, 0)) goto done;
        if (tb__cg_is_half(xd)) {
            tb__ix_line(&g->ix, "const float v%d = %s((uint)tb_sc[%s] & 0xffffu);", (int)vx,
                        xd == TB_F16 ? "tb_h2f" : "tb_bf2f", sel);
        } else if (xd == TB_F32 || (xd == TB_F64 && !g->d->f64)) {
            tb__ix_line(&g->ix, "const %s v%d = (%s)%s((uint)tb_sc[%s]);", t, (int)vx, t,
                        g->d->bits_f32, sel);
        } else if (xd == TB_F64) {
            tb__ix_line(&g->ix, "const double v%d = %s(tb_sc[%s]);", (int)vx, g->d->bits_f64, sel);
        } else {
            tb__ix_line(&g->ix, "const %s v%d = (%s)tb_sc[%s];", t, (int)vx, t, sel);
        }
    } else {
        /* the buffers' positions among the kernel's arguments (repeated ones are one) */
        for (j = 0; j < count; j++) {
            int32_t slot =
                g->G->info[tb__plan_operand(g->G, node, (size_t)(k->cat_first + j))].slot;
            size_t a;
            vals[j] = -1;
            for (a = 0; a < k->num_args && vals[j] < 0; a++)
                if (k->args[a].kind == TB__ARG_BUF && k->args[a].index == slot)
                    vals[j] = (int64_t)a;
            if (vals[j] < 0) {
                tb__cg_arg(g, TB__ARG_BUF, slot); /* the error */
                goto done;
            }
        }
        tb__cg_concat_select(g, "tb_cat_arg", vals, count, kv, sel, sizeof sel);
        /* the element's flat index in its operand: the concat's index before the axis, the
           index along the axis within the operand, the index after the axis */
        tb__lf_const(&outer, 0);
        tb__lf_const(&innerf, 0);
        for (d = cs->rank - 1; d > dim; d--) {
            if (!tb__ix_lf_addmul(&g->ix, &innerf, &p->dim[d], inner)) goto done;
            inner *= cs->dims[d];
        }
        for (d = dim - 1; d >= 0; d--) {
            if (!tb__ix_lf_addmul(&g->ix, &outer, &p->dim[d], stride)) goto done;
            stride *= cs->dims[d];
        }
        tb__lf_text(&outer, outer_text, sizeof outer_text);
        tb__lf_text(&innerf, inner_text, sizeof inner_text);
        tb__cg_concat_index(index, sizeof index, outer_text, outer.n > 0 || outer.c != 0, len_text,
                            r, at_text, inner, inner_text, innerf.n > 0 || innerf.c != 0);
        snprintf(ptr, sizeof ptr, "((const %s%s *)tb_in[%s])", g->d->global, tb__cg_btype(xd), sel);
        if (xd == TB_F16) {
            tb__ix_line(&g->ix, "const float v%d = TB_LDH(%s, %s);", (int)vx, ptr, index);
        } else if (xd == TB_BF16) {
            tb__ix_line(&g->ix, "const float v%d = tb_bf2f(%s[%s]);", (int)vx, ptr, index);
        } else {
            tb__ix_line(&g->ix, "const %s v%d = %s[%s];", t, (int)vx, ptr, index);
        }
    }
    tb__ix_line(&g->ix, "v%d = v%d;", (int)v, (int)vx);
    ok = true;
done:
    tb__free(vals);
    return ok;
}

/* A TB__K_CONCAT kernel's run of its root concat's operands at position `pos`. */
static int32_t tb__cg_concat_run(tb__cg *g, int32_t node, int32_t pos) {
    const tb__plan_kernel *k = tb__cg_kernel(g);
    const tb_node *n = g->G->info[node].node;
    int32_t dim = (int32_t)n->attrs[0], v, c, j, m = 0;
    int64_t start = k->cat_start;
    char text[TB__LF_TEXT];
    int32_t *idx;
    int64_t *starts;
    bool ok;
    tb__pos p;
    v = tb__cg_new_val(g, n->shape.dtype);
    c = tb__ix_new_var(&g->ix, 0, n->shape.dims[dim] > 0 ? n->shape.dims[dim] - 1 : 0);
    if (v < 0 || c < 0 || !tb__ix_need_multi(&g->ix, pos)) return -1;
    p = g->ix.pos[pos];
    tb__lf_text(&p.dim[dim], text, sizeof text);
    tb__ix_line(&g->ix, "%s v%d = 0;", tb__cg_ctype(n->shape.dtype), (int)v);
    tb__ix_line(&g->ix, "const long i%d = %s;", (int)c, text);
    if (k->cat_form != TB__CAT_TREE) return tb__cg_concat_lookup(g, node, &p, c, v) ? v : -1;
    idx = (int32_t *)tb__calloc((size_t)k->cat_count + 1, sizeof(int32_t));
    starts = (int64_t *)tb__calloc((size_t)k->cat_count + 1, sizeof(int64_t));
    if (idx == NULL || starts == NULL) {
        tb__free(idx);
        tb__free(starts);
        tb__ix_fail(&g->ix, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    for (j = k->cat_first; j < k->cat_first + k->cat_count; j++) {
        int64_t xl = n->operands[j]->shape.dims[dim];
        if (xl > 0) {
            idx[m] = j;
            starts[m++] = start;
        }
        start += xl;
    }
    ok = m == 0 || tb__cg_concat_tree(g, node, &p, idx, starts, 0, m, c, v);
    tb__free(idx);
    tb__free(starts);
    return ok ? v : -1;
}

/* The values [*lo, *hi] of a concat's test along axis `dim` of its node n at form f: f's range;
   in a row's loop (tb__cg_row_loops), where f is of the row's index alone, the first such
   concat's operands are noted as the row's cases, and inside a case the range narrows to its
   operand's. */
static void tb__cg_concat_range(tb__cg *g, const tb_node *n, int32_t dim, const tb__lf *f,
                                int64_t *lo, int64_t *hi) {
    int64_t start = 0, at[TB__CG_ROW_CASES + 1];
    int32_t i, m = 0;
    tb__str form;
    bool same, many = false;
    tb__ix_lf_range(&g->ix, f, lo, hi);
    if (g->row_item < 0 || g->row_case == -2 || *lo >= *hi) return;
    if (g->row_case == -1 && g->num_cases > 0) return; /* one concat's cases a row */
    /* the form's text in the row's index and the variables before it (all declared before the
       row's loops) */
    memset(&form, 0, sizeof form);
    if (!tb__ix_form_text(&g->ix, f, g->row_item + 1, -1, &form) ||
        form.len >= sizeof g->case_text) {
        tb__str_free(&form);
        return;
    }
    if (g->row_case >= 0) { /* in a case: its operand's values, where the test is the case's */
        int64_t a = g->case_at[g->row_case], b = g->case_at[g->row_case + 1] - 1;
        same = strcmp(form.data, g->case_text) == 0;
        tb__str_free(&form);
        if (!same || a > *hi || b < *lo) return;
        if (a > *lo) *lo = a;
        if (b < *hi) *hi = b;
        return;
    }
    for (i = 0; i < (int32_t)n->num_operands; i++) {
        int64_t end = start + n->operands[i]->shape.dims[dim];
        if (end > start && end > *lo && start <= *hi) {
            many = m == TB__CG_ROW_CASES; /* more operands than cases: none */
            if (many) break;
            at[m++] = start > *lo ? start : *lo;
        }
        start = end;
    }
    if (m >= 2 && !many) {
        at[m] = *hi + 1;
        memcpy(g->case_at, at, sizeof at);
        memcpy(g->case_text, form.data, form.len + 1);
        g->num_cases = m;
    }
    tb__str_free(&form);
}

/* A concat at pos: the operand its index along the axis is in, by a chain of tests on it; the
   operands its range misses, and the test of the one it ends in, are left out. */
static int32_t tb__cg_concat(tb__cg *g, int32_t node, int32_t pos) {
    const tb_node *n = g->G->info[node].node;
    int32_t dim = (int32_t)n->attrs[0], v, i, emitted = 0;
    int64_t start = 0, lo, hi;
    char text[TB__LF_TEXT];
    tb__pos p;
    if (tb__cg_kernel(g)->kind == TB__K_CONCAT && node == tb__cg_kernel(g)->root)
        return tb__cg_concat_run(g, node, pos);
    v = tb__cg_new_val(g, n->shape.dtype);
    if (v < 0) return -1;
    tb__ix_line(&g->ix, "%s v%d = 0;", tb__cg_ctype(n->shape.dtype), (int)v);
    if (!tb__ix_need_multi(&g->ix, pos)) return -1;
    p = g->ix.pos[pos];
    tb__lf_text(&p.dim[dim], text, sizeof text);
    tb__cg_concat_range(g, n, dim, &p.dim[dim], &lo, &hi);
    for (i = 0; i < (int32_t)n->num_operands; i++) {
        int32_t x = tb__plan_operand(g->G, node, (size_t)i), qp, vx;
        const tb_shape *xs = &g->G->info[x].node->shape;
        int64_t end = start + xs->dims[dim];
        tb__lf dims[TB_MAX_RANK];
        char head[TB__LF_TEXT + 64];
        int32_t d;
        memset(dims, 0, sizeof dims); /* only rank entries are used; optimisers cannot tell */
        if (xs->dims[dim] == 0 || end <= lo || start > hi) {
            start = end;
            continue;
        }
        if (hi < end) {
            snprintf(head, sizeof head, "%s", emitted > 0 ? "else " : "");
        } else {
            snprintf(head, sizeof head, "%sif ((%s) < %lldL) ", emitted > 0 ? "else " : "", text,
                     (long long)end);
        }
        tb__ix_open(&g->ix, head);
        for (d = 0; d < xs->rank; d++)
            dims[d] = p.dim[d];
        dims[dim].c -= start;
        qp = tb__ix_pos_multi(&g->ix, xs, dims);
        vx = qp >= 0 ? tb__cg_eval(g, x, qp) : -1;
        if (vx >= 0) tb__ix_line(&g->ix, "v%d = v%d;", (int)v, (int)vx);
        tb__ix_close(&g->ix, "");
        if (vx < 0) return -1;
        emitted++;
        if (hi < end) break;
        start = end;
    }
    return v;
}

/* GATHER and INDEX_SELECT: the index becomes a variable of the operand's position. */
static int32_t tb__cg_gather(tb__cg *g, int32_t node, int32_t pos) {
    const tb_node *n = g->G->info[node].node;
    int32_t x = tb__plan_operand(g->G, node, 0), ix = tb__plan_operand(g->G, node, 1);
    const tb_shape *xs = &g->G->info[x].node->shape, *is = &g->G->info[ix].node->shape;
    int32_t dim = (int32_t)n->attrs[0], vi, t, code, qp, d;
    int64_t size = xs->dims[dim];
    tb__lf dims[TB_MAX_RANK];
    tb__pos p;
    if (n->op == TB_OP_GATHER) {
        vi = tb__cg_eval(g, ix, pos);
    } else {
        if (!tb__ix_need_multi(&g->ix, pos)) return -1;
        vi = tb__cg_eval(g, ix, tb__ix_pos_multi(&g->ix, is, &g->ix.pos[pos].dim[dim]));
    }
    if (vi < 0) return -1;
    t = tb__ix_new_var(&g->ix, 0, size > 0 ? size - 1 : 0);
    code = tb__cg_errsite(g, node);
    if (t < 0 || code < 0) return -1;
    tb__ix_line(&g->ix, "long i%d = (long)v%d;", (int)t, (int)vi);
    tb__ix_line(&g->ix, "if (i%d < 0 || i%d >= %lldL) { tb_report(tb_err, %du, i%d, 0); i%d = 0; }",
                (int)t, (int)t, (long long)size, (int)code, (int)t, (int)t);
    if (!tb__ix_need_multi(&g->ix, pos)) return -1;
    p = g->ix.pos[pos];
    for (d = 0; d < xs->rank; d++) {
        if (d == dim) {
            tb__lf_const(&dims[d], 0);
            tb__lf_add_term(&dims[d], t, 1);
        } else {
            dims[d] = p.dim[d];
        }
    }
    qp = tb__ix_pos_multi(&g->ix, xs, dims);
    if (qp < 0) return -1;
    return tb__cg_eval(g, x, qp);
}

static int32_t tb__cg_generator(tb__cg *g, int32_t node, int32_t pos) {
    const tb_node *n = g->G->info[node].node;
    tb_dtype od = n->shape.dtype;
    const char *t = tb__cg_ctype(od);
    char a[TB__LF_TEXT], b[TB__LF_TEXT];
    int32_t v;
    if (!tb__ix_need_multi(&g->ix, pos)) return -1;
    tb__lf_text(&g->ix.pos[pos].dim[0], a, sizeof a);
    v = tb__cg_new_val(g, od);
    if (v < 0) return -1;
    if (n->op == TB_OP_EYE) {
        tb__lf_text(&g->ix.pos[pos].dim[1], b, sizeof b);
        tb__ix_line(&g->ix, "const %s v%d = (%s)((%s) == (%s));", t, (int)v, t, a, b);
    } else if (tb_dtype_is_float(od)) {
        char s0[64], s1[64];
        tb__cg_flit(TB_F64, n->fattrs[0], s0, sizeof s0);
        tb__cg_flit(TB_F64, n->fattrs[1], s1, sizeof s1);
        tb__ix_line(&g->ix, "const %s v%d = (%s)(%s + (double)(%s) * %s);", t, (int)v, t, s0, a,
                    s1);
    } else {
        double s = n->fattrs[0], st = n->fattrs[1];
        long long s0 = (s != s) ? 0 : (long long)s, s1 = (st != st) ? 0 : (long long)st;
        tb__ix_line(&g->ix, "const %s v%d = (%s)((ulong)%lldL + (ulong)(%s) * (ulong)%lldL);", t,
                    (int)v, t, s0, a, s1);
    }
    return tb__cg_round(g, od, v);
}

/* Nodes that are not computed from operand values at the same kind of position: leaves,
   other kernels' outputs and the ops with their own control flow. */
/* The step r of an argmax or argmin unrolled where it is read: value v taken over the best
   (acc, at index idx) when it is greater (smaller), or NaN where the best is not; no branch on
   the data, ties keeping the first, as the reference. A float best is a blend of bits
   (tb_sel_f32), where compilers made the two updates one branch that pools mispredict. */
static void tb__cg_inline_arg_step(tb__cg *g, const tb_node *n, int32_t v, int32_t acc, int32_t idx,
                                   int64_t r, bool f32) {
    tb__ix_line(&g->ix, "{");
    tb__ix_line(&g->ix, "    const int tk = (v%d %s v%d) | ((v%d != v%d) & (v%d == v%d));", (int)v,
                n->op == TB_OP_ARGMAX ? ">" : "<", (int)acc, (int)v, (int)v, (int)acc, (int)acc);
    if (f32)
        tb__ix_line(&g->ix, "    v%d = tb_sel_f32(tk, v%d, v%d);", (int)acc, (int)v, (int)acc);
    else
        tb__ix_line(&g->ix, "    v%d = tk ? v%d : v%d;", (int)acc, (int)v, (int)acc);
    tb__ix_line(&g->ix, "    v%d = tk ? %lldL : v%d;", (int)idx, (long long)r, (int)idx);
    tb__ix_line(&g->ix, "}");
}

/* The index of an argmax or argmin unrolled where it is read, where the compiler vectorises a
   work item's own loops (tb__dialect.item_loops), of its m values vals[]: the extreme first
   (TB_MAXS or TB_MINS), then selects from the last value to the first, for the first equal to
   it, then for the first NaN (which wins), as the reference. No select waits on another's test,
   where each step of tb__cg_inline_arg_step tests against the best so far (a 3 x 3 max pool's
   argmax on native: 3.8 -> 1.6 ms; on PoCL, vectors across items, 3.7 -> 5.9 ms: not there). */
static int32_t tb__cg_inline_arg(tb__cg *g, const tb_node *n, const int32_t *vals, int64_t m,
                                 tb_dtype xd) {
    const char *t = tb__cg_ctype(n->shape.dtype), *at = tb__cg_ctype(xd);
    int32_t acc = tb__cg_new_val(g, xd), idx = tb__cg_new_val(g, n->shape.dtype);
    int64_t r;
    if (acc < 0 || idx < 0) return -1;
    tb__ix_line(&g->ix, "%s v%d = (%s)v%d;", at, (int)acc, at, (int)vals[0]);
    for (r = 1; r < m; r++)
        tb__ix_line(&g->ix, "v%d = %s(v%d, v%d);", (int)acc,
                    n->op == TB_OP_ARGMAX ? "TB_MAXS" : "TB_MINS", (int)vals[r], (int)acc);
    tb__ix_line(&g->ix, "%s v%d = %lldL;", t, (int)idx, (long long)(m - 1));
    for (r = m - 2; r >= 0; r--)
        tb__ix_line(&g->ix, "v%d = (v%d == v%d) ? %lldL : v%d;", (int)idx, (int)vals[r], (int)acc,
                    (long long)r, (int)idx);
    for (r = m - 1; r >= 0; r--)
        tb__ix_line(&g->ix, "v%d = (v%d != v%d) ? %lldL : v%d;", (int)idx, (int)vals[r],
                    (int)vals[r], (long long)r, (int)idx);
    return idx;
}

/* A reduction over a few elements, unrolled where it is read: its operand at each of the m
   positions the output position spans, combined as the reduction kernels do (extremes keeping
   NaN, argmax and argmin the first extreme or NaN), but f32 sums in f32, as a matmul's dot
   products and PyTorch's windows: at most TB__PLAN_INLINE_REDUCE terms, where double would
   halve the vectors (a depthwise convolution on native, 5.8 -> 3.1 ms). */
static int32_t tb__cg_inline_reduce(tb__cg *g, int32_t node, int32_t pos) {
    const tb_node *n = g->G->info[node].node;
    int32_t x = tb__plan_operand(g->G, node, 0), a, v, xp, acc = -1, nan = 0, idx = -1;
    int32_t vals[TB__PLAN_INLINE_REDUCE];
    const tb_shape *xs = tb__plan_shape(g->G, x);
    bool arg = n->op == TB_OP_ARGMAX || n->op == TB_OP_ARGMIN;
    uint64_t mask = arg ? (uint64_t)1 << n->attrs[0] : (uint64_t)n->attrs[0];
    bool keep = n->attrs[1] != 0, sums = n->op == TB_OP_SUM || n->op == TB_OP_MEAN;
    bool fx = !sums && !arg, selects = arg && g->d->item_loops; /* tb__cg_inline_arg */
    int64_t m = tb__plan_inline_reduce(n), r;
    const char *t = tb__cg_ctype(n->shape.dtype);
    const char *at = arg ? tb__cg_ctype(xs->dtype) : t;
    tb__lf dims[TB_MAX_RANK];
    tb__pos p;
    if (!tb__ix_need_multi(&g->ix, pos)) return -1;
    p = g->ix.pos[pos];
    for (r = 0; r < m; r++) {
        int64_t rest = r;
        int32_t o = n->shape.rank;
        for (a = xs->rank - 1; a >= 0; a--) { /* the last reduced axis runs fastest */
            if ((mask >> a) & 1u) {
                tb__lf_const(&dims[a], rest % xs->dims[a]);
                rest /= xs->dims[a];
                if (keep) o--;
            } else {
                dims[a] = p.dim[--o];
            }
        }
        xp = tb__ix_pos_multi(&g->ix, xs, dims);
        v = xp >= 0 ? tb__cg_eval(g, x, xp) : -1;
        if (v < 0) return -1;
        if (selects) {
            vals[r] = v; /* combined after the last */
        } else if (r == 0) {
            acc = tb__cg_new_val(g, arg ? xs->dtype : n->shape.dtype);
            nan = fx ? tb__cg_new_val(g, n->shape.dtype) : 0;
            idx = arg ? tb__cg_new_val(g, n->shape.dtype) : 0;
            if (acc < 0 || nan < 0 || idx < 0) return -1;
            tb__ix_line(&g->ix, "%s v%d = (%s)v%d;", at, (int)acc, at, (int)v);
            if (fx) tb__ix_line(&g->ix, "%s v%d = v%d;", at, (int)nan, (int)acc);
            if (arg) tb__ix_line(&g->ix, "%s v%d = 0;", t, (int)idx);
        } else if (arg) {
            tb__cg_inline_arg_step(g, n, v, acc, idx, r, strcmp(at, "float") == 0);
        } else if (sums) {
            tb__ix_line(&g->ix, "v%d += (%s)v%d;", (int)acc, at, (int)v);
        } else { /* no branch on the data (f32 and f64 only); ties keep the first (+0 before
                    -0, as the reference); the last NaN seen kept apart */
            tb__ix_line(&g->ix, "v%d = %s(v%d, v%d);", (int)acc,
                        n->op == TB_OP_MAX ? "TB_MAXS" : "TB_MINS", (int)v, (int)acc);
            tb__ix_line(&g->ix, "if (v%d != v%d) v%d = v%d;", (int)v, (int)v, (int)nan, (int)v);
        }
    }
    if (selects) return tb__cg_inline_arg(g, n, vals, m, xs->dtype);
    if (fx)
        tb__ix_line(&g->ix, "if (v%d != v%d) v%d = v%d;", (int)nan, (int)nan, (int)acc, (int)nan);
    v = tb__cg_new_val(g, n->shape.dtype);
    if (v < 0) return -1;
    if (n->op == TB_OP_MEAN) {
        tb__ix_line(&g->ix, "const %s v%d = (%s)(v%d / (%s)%lld);", t, (int)v, t, (int)acc, at,
                    (long long)m);
    } else if (arg) {
        tb__ix_line(&g->ix, "const %s v%d = v%d;", t, (int)v, (int)idx);
    } else {
        tb__ix_line(&g->ix, "const %s v%d = (%s)v%d;", t, (int)v, t, (int)acc);
    }
    return v;
}

static int32_t tb__cg_special(tb__cg *g, int32_t node, int32_t pos, bool *handled) {
    const tb__pnode *in = &g->G->info[node];
    const tb__plan_kernel *k = tb__cg_kernel(g);
    int32_t v;
    *handled = true;
    if (in->param >= 0) {
        if (in->node->op == TB_OP_SCALAR && tb__cg_plan(g)->scalar_table) {
            tb_dtype dt = in->node->shape.dtype;
            const char *ct = tb__cg_ctype(dt);
            int32_t e = tb__cg_table_entry(g, in->param);
            if (e < 0 || !tb__cg_arg(g, TB__ARG_TABLE, 0)) return -1;
            v = tb__cg_new_val(g, dt);
            if (v < 0) return -1;
            if (tb__cg_is_half(dt)) {
                tb__ix_line(&g->ix, "const float v%d = %s((uint)tb_sc[%d] & 0xffffu);", (int)v,
                            dt == TB_F16 ? "tb_h2f" : "tb_bf2f", (int)e);
            } else if (dt == TB_F32 || (dt == TB_F64 && !g->d->f64)) {
                tb__ix_line(&g->ix, "const %s v%d = (%s)%s((uint)tb_sc[%d]);", ct, (int)v, ct,
                            g->d->bits_f32, (int)e);
            } else if (dt == TB_F64) {
                tb__ix_line(&g->ix, "const double v%d = %s(tb_sc[%d]);", (int)v, g->d->bits_f64,
                            (int)e);
            } else {
                tb__ix_line(&g->ix, "const %s v%d = (%s)tb_sc[%d];", ct, (int)v, ct, (int)e);
            }
            return v;
        }
        if (in->node->op == TB_OP_SCALAR) {
            tb_dtype dt = in->node->shape.dtype;
            if (!tb__cg_arg(g, TB__ARG_SCALAR, in->param)) return -1;
            v = tb__cg_new_val(g, dt);
            if (v < 0) return -1;
            if (tb__cg_is_half(dt)) {
                tb__ix_line(&g->ix, "const float v%d = %s((uint)s%d);", (int)v,
                            dt == TB_F16 ? "tb_h2f" : "tb_bf2f", (int)in->param);
            } else {
                tb__ix_line(&g->ix, "const %s v%d = (%s)s%d;", tb__cg_ctype(dt), (int)v,
                            tb__cg_ctype(dt), (int)in->param);
            }
            return v;
        }
        return tb__cg_read_slot(g, in->slot, in->node->shape.dtype, pos);
    }
    if (node == k->core) {
        tb__ix_fail(&g->ix, tb__error(TB_ERR_INTERNAL, "codegen: a kernel's core read at another "
                                                       "position than its output"));
        return -1;
    }
    if (in->root && node != k->root)
        return tb__cg_read_slot(g, in->slot, in->node->shape.dtype, pos);
    if (in->ctx != k->owner && in->ctx != TB__CTX_ANY) {
        tb__ix_fail(&g->ix, tb__error(TB_ERR_INTERNAL,
                                      "codegen: node %d evaluated in kernel %d, "
                                      "planned for kernel %d",
                                      (int)node, (int)g->kernel, (int)in->ctx));
        return -1;
    }
    if (in->hoist) { /* computed at the start of the row (tb__cg_hoist_row) */
        v = tb__ix_memo_find(&g->ix, TB__MEMO_VALUE, node, TB__MEMO_HOIST, 0);
        if (v < 0) tb__ix_fail(&g->ix, TB_ERR_INTERNAL);
        return v;
    }
    if (tb__plan_inline_reduce(in->node) > 0) return tb__cg_inline_reduce(g, node, pos);
    switch (in->node->op) {
    case TB_OP_PAD:
    case TB_OP_CONCAT:
    case TB_OP_GATHER:
    case TB_OP_INDEX_SELECT:
        if (!tb__cg_enter(g, node)) return -1;
        if (in->node->op == TB_OP_PAD) {
            v = tb__cg_pad(g, node, pos);
        } else if (in->node->op == TB_OP_CONCAT) {
            v = tb__cg_concat(g, node, pos);
        } else {
            v = tb__cg_gather(g, node, pos);
        }
        g->depth--;
        return v;
    case TB_OP_ARANGE:
    case TB_OP_EYE:
        return tb__cg_generator(g, node, pos);
    default:
        *handled = false;
        return -1;
    }
}

static int32_t tb__cg_emit_custom(tb__cg *g, const tb_node *n, const int32_t *ops, size_t nops) {
    const tb_custom_op_desc *d = tb__plan_custom(n->op);
    const char *t = tb__cg_ctype(n->shape.dtype);
    int32_t v = tb__cg_new_val(g, n->shape.dtype);
    size_t i;
    if (v < 0 || d == NULL || d->opencl_expr == NULL) {
        return v < 0 ? -1 : (tb__ix_fail(&g->ix, TB_ERR_INTERNAL), -1);
    }
    tb__ix_line(&g->ix, "%s v%d;", t, (int)v);
    tb__ix_open(&g->ix, "");
    tb__str_append(&g->ix.body, "#define T %s\n", t);
    for (i = 0; i < nops; i++)
        tb__ix_line(&g->ix, "const T x%zu = (T)v%d;", i, (int)ops[i]);
    tb__ix_line(&g->ix, "v%d = (T)(%s);", (int)v, d->opencl_expr);
    tb__str_append(&g->ix.body, "#undef T\n");
    tb__ix_close(&g->ix, "");
    return v;
}

/* The expression of a unary op other than math functions; false when `n` is not one. */
static bool tb__cg_expr_unary(tb__cg *g, const tb_node *n, tb_dtype ad, const char *a, char *e,
                              size_t cap) {
    tb_dtype od = n->shape.dtype;
    bool afl = tb_dtype_is_float(ad);
    const char *t = tb__cg_ctype(od), *u = tb__cg_utype(od);
    bool fl = tb_dtype_is_float(od);
    switch (n->op) {
    case TB_OP_NEG:
        if (fl) {
            snprintf(e, cap, "-%s", a);
        } else if (od == TB_BOOL) {
            snprintf(e, cap, "%s", a);
        } else {
            snprintf(e, cap, "(%s)((%s)0 - (%s)%s)", t, u, u, a);
        }
        break;
    case TB_OP_ABS:
        if (fl) {
            snprintf(e, cap, "%s(%s)", tb__cg_math(g, "fabs", od), a);
        } else if (od == TB_U8 || od == TB_BOOL) {
            snprintf(e, cap, "%s", a);
        } else if (g->d->iabs != NULL) {
            snprintf(e, cap, "(%s)%s(%s)", t, g->d->iabs, a); /* the minimum wraps to itself */
        } else {
            snprintf(e, cap, "(%s)(%s < 0 ? (%s)0 - (%s)%s : (%s)%s)", t, a, u, u, a, u, a);
        }
        break;
    case TB_OP_RELU:
        if (od == TB_U8 || od == TB_BOOL) {
            snprintf(e, cap, "%s", a);
        } else {
            snprintf(e, cap, "(%s < (%s)0 ? (%s)0 : %s)", a, t, t, a);
        }
        break;
    case TB_OP_FLOOR:
    case TB_OP_CEIL:
    case TB_OP_ROUND:
        if (fl) {
            snprintf(e, cap, "%s(%s)",
                     tb__cg_math(g,
                                 n->op == TB_OP_FLOOR  ? "floor"
                                 : n->op == TB_OP_CEIL ? "ceil"
                                                       : "rint",
                                 od),
                     a);
        } else {
            snprintf(e, cap, "%s", a);
        }
        break;
    case TB_OP_SIGN:
        if (od == TB_BOOL) {
            snprintf(e, cap, "%s", a);
        } else {
            snprintf(e, cap, "(%s)((%s > (%s)0) - (%s < (%s)0))", t, a, t, a, t);
        }
        break;
    case TB_OP_LOGICAL_NOT:
        snprintf(e, cap, "(uchar)(%s == 0)", a);
        break;
    case TB_OP_CAST:
        if (od == TB_BOOL) {
            snprintf(e, cap, "(uchar)(%s != 0)", a);
        } else if (afl && !fl) {
            /* truncation toward zero saturating at the int64 range, NaN 0, then wrapping */
            snprintf(e, cap, "(%s)tb_f2i_%s(%s)", t, ad == TB_F64 ? "f64" : "f32", a);
        } else {
            snprintf(e, cap, "(%s)%s", t, a);
        }
        break;
    default:
        return false;
    }
    return true;
}

/* Expands a code template of ops_table.h: $a the operand, $t the compute type, $x the operand
   cast to it, $NAME the dialect's math function NAME for `dtype` (lower case, digits, _). False
   when the text does not fit in `cap` bytes or a $ names nothing of these. */
static bool tb__cg_template(const tb__cg *g, const char *tpl, tb_dtype dtype, const char *a,
                            char *e, size_t cap) {
    const char *t = tb__cg_ctype(dtype);
    size_t len = 0;
    e[0] = '\0';
    while (*tpl != '\0') {
        char name[32], text[64];
        const char *piece = text;
        size_t k = 0, n;
        if (*tpl != '$') {
            text[0] = *tpl++;
            text[1] = '\0';
        } else {
            for (tpl++;
                 ((*tpl >= 'a' && *tpl <= 'z') || (*tpl >= '0' && *tpl <= '9') || *tpl == '_') &&
                 k + 1 < sizeof name;
                 tpl++)
                name[k++] = *tpl;
            name[k] = '\0';
            if (k == 0 || k + 1 == sizeof name) return false;
            if (strcmp(name, "a") == 0) {
                piece = a;
            } else if (strcmp(name, "t") == 0) {
                piece = t;
            } else if (strcmp(name, "x") == 0) {
                snprintf(text, sizeof text, "((%s)%s)", t, a);
            } else {
                piece = tb__cg_math(g, name, dtype);
            }
        }
        n = strlen(piece);
        if (len + n + 1 > cap) return false;
        memcpy(e + len, piece, n + 1);
        len += n;
    }
    return true;
}

/* The expression of an elementwise math op (a row of ops_table.h); 0 when `n` is not one, -1
   on error. */
static int tb__cg_expr_math(tb__cg *g, const tb_node *n, const char *a, char *e, size_t cap) {
    const tb__math_code *c = tb__math_code_of(n->op);
    const char *t = tb__cg_ctype(n->shape.dtype);
    if (c == NULL) return 0;
    if (tb__cg_template(g, c->code_f32 != NULL && strcmp(t, "float") == 0 ? c->code_f32 : c->code,
                        n->shape.dtype, a, e, cap))
        return 1;
    tb__ix_fail(&g->ix, tb__error(TB_ERR_INTERNAL,
                                  "codegen: the code template of op %s is malformed or too long",
                                  tb_op_name(n->op)));
    return -1;
}

/* The expression of a binary or ternary op: 1, 0 when `n` is not one, -1 on error (an op may
   emit a line of its own first: clamp's lower bound, the check of an integer power). */
static int tb__cg_expr_binary(tb__cg *g, int32_t node, const char *a, const char *b, const char *c,
                              char *e, size_t cap) {
    const tb_node *n = g->G->info[node].node;
    tb_dtype od = n->shape.dtype;
    const char *t = tb__cg_ctype(od), *u = tb__cg_utype(od), *m = t;
    bool fl = tb_dtype_is_float(od);
    switch (n->op) {
    case TB_OP_ADD:
    case TB_OP_SUB:
    case TB_OP_MUL: {
        const char *op = n->op == TB_OP_ADD ? "+" : (n->op == TB_OP_SUB ? "-" : "*");
        if (fl) {
            snprintf(e, cap, "%s %s %s", a, op, b);
        } else if (od == TB_BOOL) {
            snprintf(e, cap, "(uchar)((%s %s %s) != 0)", a, op, b);
        } else {
            snprintf(e, cap, "(%s)((%s)%s %s (%s)%s)", t, u, a, op, u, b);
        }
        break;
    }
    case TB_OP_DIV:
        snprintf(e, cap, "%s / %s", a, b);
        break;
    case TB_OP_POW:
        if (fl) {
            snprintf(e, cap, "(%s)%s((%s)%s, (%s)%s)", t, tb__cg_math(g, "pow", od), m, a, m, b);
        } else {
            int32_t code = tb__cg_errsite(g, node);
            if (code < 0) return -1;
            tb__ix_line(&g->ix, "if (%s < 0) tb_report(tb_err, %du, (long)%s, (long)%s);", b,
                        (int)code, a, b);
            snprintf(e, cap, "(%s)tb_ipow((long)%s, (long)%s)", t, a, b);
        }
        break;
    case TB_OP_MAXIMUM:
    case TB_OP_MINIMUM: {
        const char *cmp = n->op == TB_OP_MAXIMUM ? ">" : "<";
        if (fl) {
            snprintf(e, cap, "((%s %s %s || isnan(%s)) ? %s : %s)", a, cmp, b, a, a, b);
        } else {
            snprintf(e, cap, "(%s %s %s ? %s : %s)", a, cmp, b, a, b);
        }
        break;
    }
    case TB_OP_EQ:
    case TB_OP_NE:
    case TB_OP_LT:
    case TB_OP_LE:
    case TB_OP_GT:
    case TB_OP_GE: {
        const char *cmp = n->op == TB_OP_EQ   ? "=="
                          : n->op == TB_OP_NE ? "!="
                          : n->op == TB_OP_LT ? "<"
                          : n->op == TB_OP_LE ? "<="
                          : n->op == TB_OP_GT ? ">"
                                              : ">=";
        snprintf(e, cap, "(uchar)(%s %s %s)", a, cmp, b);
        break;
    }
    case TB_OP_LOGICAL_AND:
        snprintf(e, cap, "(uchar)(%s != 0 && %s != 0)", a, b);
        break;
    case TB_OP_LOGICAL_OR:
        snprintf(e, cap, "(uchar)(%s != 0 || %s != 0)", a, b);
        break;
    case TB_OP_WHERE: /* f32 blended: no branch on a mask (dropout's) to mispredict */
        if (strcmp(t, "float") == 0)
            snprintf(e, cap, "tb_sel_f32(%s != 0, %s, %s)", a, b, c);
        else
            snprintf(e, cap, "(%s != 0 ? %s : %s)", a, b, c);
        break;
    case TB_OP_CLAMP: {
        int32_t lo = tb__cg_new_val(g, od);
        if (lo < 0) return -1;
        if (fl) {
            tb__ix_line(&g->ix, "const %s v%d = ((%s > %s || isnan(%s)) ? %s : %s);", t, (int)lo, a,
                        b, a, a, b);
            snprintf(e, cap, "((v%d < %s || isnan(v%d)) ? v%d : %s)", (int)lo, c, (int)lo, (int)lo,
                     c);
        } else {
            tb__ix_line(&g->ix, "const %s v%d = (%s < %s ? %s : %s);", t, (int)lo, a, b, b, a);
            snprintf(e, cap, "(v%d > %s ? %s : v%d)", (int)lo, c, c, (int)lo);
        }
        break;
    }
    default:
        return 0;
    }
    return 1;
}

/* One elementwise op (or RAND/RANDN) from its operands' values. */
static int32_t tb__cg_emit_op(tb__cg *g, int32_t node, int32_t pos, const int32_t *ops,
                              size_t nops) {
    const tb_node *n = g->G->info[node].node;
    tb_dtype od = n->shape.dtype, ad = nops > 0 ? g->val_dtype[ops[0]] : od;
    char e[1024], a[16], b[16], c[16];
    int32_t v;
    int handled;
    e[0] = '\0';
    snprintf(a, sizeof a, "v%d", nops > 0 ? (int)ops[0] : 0);
    snprintf(b, sizeof b, "v%d", nops > 1 ? (int)ops[1] : 0);
    snprintf(c, sizeof c, "v%d", nops > 2 ? (int)ops[2] : 0);
    if (tb_op_get_kind(n->op) == TB_KIND_MOVEMENT) return ops[0]; /* the position did it all */
    if (n->op >= TB_OP_BUILTIN_COUNT) return tb__cg_emit_custom(g, n, ops, nops);
    if (n->op == TB_OP_RAND || n->op == TB_OP_RANDN) {
        char flat[TB__LF_TEXT];
        if (!tb__ix_need_flat(&g->ix, pos)) return -1;
        tb__lf_text(&g->ix.pos[pos].flat, flat, sizeof flat);
        snprintf(e, sizeof e, "tb_%s_%s((ulong)%s, (ulong)%s, (ulong)(%s))",
                 n->op == TB_OP_RAND ? "rand" : "randn", od == TB_F64 ? "f64" : "f32", a, b, flat);
        handled = 1;
    } else if (tb__cg_expr_unary(g, n, ad, a, e, sizeof e)) {
        handled = 1;
    } else if ((handled = tb__cg_expr_math(g, n, a, e, sizeof e)) == 0) {
        handled = tb__cg_expr_binary(g, node, a, b, c, e, sizeof e);
    }
    if (handled < 0) return -1;
    if (handled == 0) {
        tb__ix_fail(&g->ix, tb__error(TB_ERR_INTERNAL, "codegen: no code for op %s",
                                      tb_op_name(n->op) != NULL ? tb_op_name(n->op) : "?"));
        return -1;
    }
    v = tb__cg_new_val(g, od);
    if (v < 0) return -1;
    tb__ix_line(&g->ix, "const %s v%d = %s;", tb__cg_ctype(od), (int)v, e);
    return v;
}

/* Whether an op's result is one of its operands' values, or exact in their dtype, whenever
   they are of its 16-bit dtype: no rounding needed. */
static bool tb__cg_exact(const tb_node *n) {
    size_t k;
    for (k = n->op == TB_OP_WHERE ? 1 : 0; k < n->num_operands; k++) /* where: after cond */
        if (n->operands[k]->shape.dtype != n->shape.dtype) return false;
    switch (n->op) {
    case TB_OP_NEG:
    case TB_OP_ABS:
    case TB_OP_RELU:
    case TB_OP_FLOOR:
    case TB_OP_CEIL:
    case TB_OP_ROUND:
    case TB_OP_SIGN:
    case TB_OP_MAXIMUM:
    case TB_OP_MINIMUM:
    case TB_OP_WHERE:
        return true;
    default:
        return false;
    }
}

/* Whether v is one of the operand values on the stack from `base` (a view of an operand). */
static bool tb__cg_passes(const tb__cg *g, int32_t base, size_t num_operands, int32_t v) {
    size_t k;
    for (k = 0; k < num_operands; k++)
        if (g->stack[(size_t)base + k] == v) return true;
    return false;
}

/* The value of `node` at `pos`: operands first (an explicit stack, so chains of any length do
   not recurse), each (node, position) emitted once per scope. */
static int32_t tb__cg_eval(tb__cg *g, int32_t node, int32_t pos) {
    size_t fbase = g->num_frames, sbase = g->num_stack;
    int32_t v;
    if (pos < 0 || g->ix.status != TB_OK) return -1;
    if (!tb__cg_push_frame(g, node, pos)) return -1;
    while (g->num_frames > fbase) {
        tb__cg_frame *f = &g->frames[g->num_frames - 1];
        int32_t fnode = f->node, fpos = f->pos;
        const tb_node *n = g->G->info[fnode].node;
        if (g->ix.status != TB_OK) goto fail;
        if (f->state == 0) {
            v = tb__ix_memo_find(&g->ix, TB__MEMO_VALUE, fnode, fpos, 0);
            if (v < 0) {
                bool handled = false;
                v = tb__cg_special(g, fnode, fpos, &handled);
                if (!handled) {
                    f->state = 1;
                    f->vbase = (int32_t)g->num_stack;
                    continue;
                }
                if (v < 0) goto fail;
                tb__ix_memo_add(&g->ix, TB__MEMO_VALUE, fnode, fpos, 0, v);
            }
            g->num_frames--;
            if (!tb__cg_push_value(g, v)) goto fail;
            continue;
        }
        if ((uint32_t)(f->state - 1) < n->num_operands) {
            size_t k = (size_t)(f->state - 1);
            int32_t cp;
            f->state++;
            cp = tb__cg_operand_pos(g, fnode, fpos, k);
            if (cp < 0) goto fail;
            if (!tb__cg_push_frame(g, tb__plan_operand(g->G, fnode, k), cp)) goto fail;
            continue;
        }
        v = tb__cg_emit_op(g, fnode, fpos, &g->stack[f->vbase], n->num_operands);
        if (v < 0) goto fail;
        if (tb__cg_is_half(n->shape.dtype) && !tb__cg_exact(n) &&
            !tb__cg_passes(g, f->vbase, n->num_operands, v)) {
            v = tb__cg_round(g, n->shape.dtype, v); /* a computed value, not an operand's */
            if (v < 0) goto fail;
        }
        g->num_stack = (size_t)g->frames[g->num_frames - 1].vbase;
        tb__ix_memo_add(&g->ix, TB__MEMO_VALUE, fnode, fpos, 0, v);
        g->num_frames--;
        if (!tb__cg_push_value(g, v)) goto fail;
    }
    v = g->stack[--g->num_stack];
    return v;
fail:
    g->num_frames = fbase;
    g->num_stack = sbase;
    if (g->ix.status == TB_OK) tb__ix_fail(&g->ix, TB_ERR_INTERNAL);
    return -1;
}

/* Work-group memory of `count` elements of `type` named `name`. */
static void tb__cg_local(tb__cg *g, const char *type, const char *name, int64_t count) {
    if (g->d->local == NULL) {
        tb__ix_fail(&g->ix, tb__error(TB_ERR_INTERNAL,
                                      "codegen: kernel %s needs work-group memory, which %s has "
                                      "not",
                                      tb__cg_kernel(g)->name, g->d->name));
        return;
    }
    tb__ix_line(&g->ix, "%s%s %s[%lld];", g->d->local, type, name, (long long)count);
}

#endif /* TB__HAVE_COMPILED_BACKENDS */
