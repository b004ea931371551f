/* ===========================================================================================
   Autograd: tb_grad walks the recorded IR from the output back to the inputs and records, for
   each node on a path, its vector-Jacobian product as more IR built from the public ops (so
   every rule is itself differentiable, and gradients of gradients work). Rules follow
   PyTorch's derivatives (tools/autograd/derivatives.yaml): ties of max/min split the gradient
   evenly, clamp and pow mask as PyTorch does, integer-valued results carry no gradient.
   Also here: the scatter/index adds the rules need (tb_detach, requires_grad and tb_assign
   are in leaves.c).
   =========================================================================================== */
#include "../impl_begin.h"

/* ---- the arena: every tensor a rule makes is kept here and released at the end ---- */

static void tb__ag_init(tb__ag *a, const char *fn) {
    memset(a, 0, sizeof *a);
    a->fn = fn;
}

static tb_tensor *tb__ag_keep(tb__ag *a, tb_tensor *t) {
    if (t == NULL) {
        a->failed = true;
        return NULL;
    }
    if (tb__grow((void **)&a->temps, &a->cap_temps, a->num_temps + 1, sizeof(tb_tensor *)) !=
        TB_OK) {
        tb_tensor_release(t);
        a->failed = true;
        return NULL;
    }
    a->temps[a->num_temps++] = t;
    return t;
}

static void tb__ag_free(tb__ag *a) {
    size_t i;
    for (i = 0; i < a->num_temps; i++)
        tb_tensor_release(a->temps[i]);
    tb__free(a->temps);
    a->temps = NULL;
    a->num_temps = a->cap_temps = 0;
}

/* The node as a tensor (kept in the arena). */
static tb_tensor *tb__ag_node(tb__ag *a, tb_node *node) {
    tb__node_retain(node);
    return tb__ag_keep(a, tb__tensor_from_node(node));
}

/* A rank-0 constant of `dtype` (a graph parameter: its value never enters the hash). */
static tb_tensor *tb__ag_const(tb__ag *a, tb_dtype dtype, double value) {
    return tb__ag_keep(a, tb_scalar_tensor(tb_scalar_f(dtype, value), &a->device));
}

/* where(mask, x, 0) */
static tb_tensor *tb__ag_mask(tb__ag *a, tb_tensor *mask, tb_tensor *x) {
    tb_shape s = tb_tensor_shape(x);
    return tb__ag_keep(a, tb_where(mask, x, tb__ag_const(a, s.dtype, 0.0)));
}

/* The axes of a bitmask as a list; the count. */
static size_t tb__ag_axes(int64_t mask, int32_t rank, int32_t axes[TB_MAX_RANK]) {
    size_t n = 0;
    int32_t i;
    for (i = 0; i < rank; i++) {
        if ((mask >> i) & 1) axes[n++] = i;
    }
    return n;
}

/* g summed down to `target` (the operand of a broadcasting op or of an expand). */
static tb_tensor *tb__ag_unbroadcast(tb__ag *a, tb_tensor *g, const tb_shape *target) {
    tb_shape gs = tb_tensor_shape(g);
    int32_t axes[TB_MAX_RANK], i, lead = gs.rank - target->rank;
    size_t n = 0;
    if (g == NULL) return NULL;
    for (i = 0; i < gs.rank; i++) {
        if (i < lead || (target->dims[i - lead] == 1 && gs.dims[i] != 1)) axes[n++] = i;
    }
    if (n > 0) g = tb__ag_keep(a, tb_sum(g, axes, n, true));
    if (n > 0 || lead != 0) g = tb__ag_keep(a, tb_reshape(g, target->dims, target->rank));
    return g;
}

/* g, the result of a reduction of x over `mask`, expanded back to x's dims. */
static tb_tensor *tb__ag_restore(tb__ag *a, tb_tensor *g, const tb_shape *x, int64_t mask,
                                 bool keepdim) {
    int64_t dims[TB_MAX_RANK];
    int32_t i;
    if (!keepdim) {
        for (i = 0; i < x->rank; i++)
            dims[i] = ((mask >> i) & 1) ? 1 : x->dims[i];
        g = tb__ag_keep(a, tb_reshape(g, dims, x->rank));
    }
    return tb__ag_keep(a, tb_expand(g, x->dims, x->rank));
}

/* ---- scatter sums: out[p] = sum of src[q] over the q that index sends to p ---- */

/* The sum, of x's dims (`xs`), of src scattered along `dim` by `index` (gather's layout:
   index and src of x's rank). One fused reduction over a compare, no atomics. */
static tb_tensor *tb__ag_scatter(tb__ag *a, const tb_shape *xs, int32_t dim, tb_tensor *index,
                                 tb_tensor *src) {
    tb_shape is = tb_tensor_shape(index);
    int64_t dims[TB_MAX_RANK], pads[2 * TB_MAX_RANK];
    int32_t r = xs->rank, i;
    tb_tensor *idx, *s, *ar, *eq, *sum;
    bool pad = false;
    if (r + 1 > TB_MAX_RANK) {
        tb__error(TB_ERR_UNSUPPORTED, "%s: a scatter sum over rank %d needs rank %d (at most %d)",
                  a->fn, (int)r, (int)r + 1, TB_MAX_RANK);
        a->failed = true;
        return NULL;
    }
    idx = tb__ag_keep(a, tb_unsqueeze(index, dim + 1));
    s = tb__ag_keep(a, tb_unsqueeze(src, dim + 1));
    for (i = 0; i <= r; i++)
        dims[i] = 1;
    dims[dim + 1] = xs->dims[dim];
    ar = tb__ag_keep(a, tb_arange(0.0, (double)xs->dims[dim], 1.0, is.dtype, &a->device));
    ar = tb__ag_keep(a, tb_reshape(ar, dims, r + 1));
    eq = tb__ag_keep(a, tb_eq(idx, ar));
    sum = tb__ag_keep(a, tb_sum(tb__ag_mask(a, eq, s), &dim, 1, false));
    for (i = 0; i < r; i++) {
        int64_t have = i == dim ? xs->dims[i] : is.dims[i];
        pads[2 * (r - 1 - i)] = 0;
        pads[2 * (r - 1 - i) + 1] = xs->dims[i] - have;
        if (xs->dims[i] != have) pad = true;
    }
    if (pad) sum = tb__ag_keep(a, tb_pad(sum, pads, 2 * (size_t)r, 0.0));
    return sum;
}

/* The sum, of x's dims, of src's slices along `dim` sent by the 1-D `index` (index_add's
   layout: src has x's dims except dims[dim] = index's length). */
static tb_tensor *tb__ag_index_sum(tb__ag *a, const tb_shape *xs, int32_t dim, tb_tensor *index,
                                   tb_tensor *src) {
    tb_shape is = tb_tensor_shape(index);
    int64_t dims[TB_MAX_RANK];
    int32_t r = xs->rank, i;
    tb_tensor *idx, *s, *ar, *eq;
    if (r + 1 > TB_MAX_RANK) {
        tb__error(TB_ERR_UNSUPPORTED, "%s: an index sum over rank %d needs rank %d (at most %d)",
                  a->fn, (int)r, (int)r + 1, TB_MAX_RANK);
        a->failed = true;
        return NULL;
    }
    s = tb__ag_keep(a, tb_unsqueeze(src, dim + 1));
    for (i = 0; i <= r; i++)
        dims[i] = 1;
    dims[dim] = is.rank == 1 ? is.dims[0] : 0;
    idx = tb__ag_keep(a, tb_reshape(index, dims, r + 1));
    dims[dim] = 1;
    dims[dim + 1] = xs->dims[dim];
    ar = tb__ag_keep(a, tb_arange(0.0, (double)xs->dims[dim], 1.0, is.dtype, &a->device));
    ar = tb__ag_keep(a, tb_reshape(ar, dims, r + 1));
    eq = tb__ag_keep(a, tb_eq(idx, ar));
    return tb__ag_keep(a, tb_sum(tb__ag_mask(a, eq, s), &dim, 1, false));
}

/* The gradient of an index_select (an embedding's): the index sum of tb__ag_index_sum as one
   matmul, the one-hot rows of the index transposed [V, n] times g as [pre, n, post]: V x n x
   post products at the matmul's speed, where the masked sum computed them one by one (the
   small GPT's token embedding, 114 x 768 x 128 a step: 5.3 ms on native, a 2-core Intel Xeon
   with AVX-512). A value of g that is not finite reaches every row of its column (0 x inf),
   where the masked sum gives it to its own row; upstream of it every gradient is then not
   finite either. Integer or empty: the masked sum. */
static tb_tensor *tb__ag_index_grad(tb__ag *a, const tb_shape *xs, int32_t dim, tb_tensor *index,
                                    tb_tensor *g) {
    tb_shape is = tb_tensor_shape(index), gs = tb_tensor_shape(g);
    int64_t n = is.rank == 1 ? is.dims[0] : 0, pre = 1, post = 1, dims[3];
    int32_t i;
    tb_tensor *eq, *e;
    if (!tb_dtype_is_float(gs.dtype) || n < 1 || xs->dims[dim] < 1 || gs.rank != xs->rank)
        return tb__ag_index_sum(a, xs, dim, index, g);
    for (i = 0; i < dim; i++)
        pre *= gs.dims[i];
    for (i = dim + 1; i < gs.rank; i++)
        post *= gs.dims[i];
    dims[0] = n;
    dims[1] = 1;
    eq = tb__ag_keep(a, tb_reshape(index, dims, 2));
    e = tb__ag_keep(a, tb_arange(0.0, (double)xs->dims[dim], 1.0, is.dtype, &a->device));
    eq = tb__ag_keep(a, tb_eq(eq, e));                                             /* [n, V] */
    e = tb__ag_keep(a, tb_transpose(tb__ag_keep(a, tb_cast(eq, gs.dtype)), 0, 1)); /* [V, n] */
    dims[0] = pre;
    dims[1] = n;
    dims[2] = post;
    g = tb__ag_keep(a, pre > 1 ? tb_reshape(g, dims, 3) : tb_reshape(g, dims + 1, 2));
    return tb__ag_keep(a, tb_reshape(tb__ag_keep(a, tb_matmul(e, g)), xs->dims, xs->rank));
}

/* ---- the rules: out[k] gets operand k's gradient where need[k], else stays NULL ---- */

/* how many rules the calling thread is inside (tb__ag_in_rule) */
static TB__THREAD_LOCAL int tb__ag_rules = 0;

static bool tb__ag_in_rule(void) {
    return tb__ag_rules > 0;
}

typedef struct tb__vjp {
    tb__ag *a;
    tb_node *node;
    tb_tensor *y;       /* the node's own value */
    tb_tensor *g;       /* the gradient of the node's value */
    tb_tensor **x;      /* the operands */
    const bool *need;   /* which operands want a gradient */
    tb_tensor **out;    /* their gradients */
    const tb_shape *xs; /* the operands' shapes */
    tb_dtype dt;        /* the node's dtype */
    /* gradients a rule gives nodes below its operands directly (an expand's source, the input
       of a convolution's windows): two at most */
    tb_node **past_node;
    tb_tensor **past_grad;
} tb__vjp;

#define TB__K(expr)  tb__ag_keep(v->a, (expr))
#define TB__C(value) tb__ag_const(v->a, v->dt, (value))

static void tb__vjp_unary(const tb__vjp *v) {
    tb_tensor *g = v->g, *x = v->x[0], *y = v->y, *r = NULL, *s = NULL;
    switch (v->node->op) {
#define TB__VJP_MATH(ID, name, ints, REF, CODE, CODE_F32, VEC, GRAD)                               \
    case TB_OP_##ID:                                                                               \
        r = (GRAD);                                                                                \
        break;
        TB__MATH_OPS(TB__VJP_MATH)
#undef TB__VJP_MATH
    case TB_OP_NEG:
        r = TB__K(tb_neg(g));
        break;
    case TB_OP_ABS:
        r = TB__K(tb_mul(g, TB__K(tb_sign(x))));
        break;
    case TB_OP_RELU: /* the mask from the result (y > 0 exactly where x > 0), as PyTorch's
                        threshold_backward: x has no reader left but the ReLU, so it is not
                        materialised beside y (a matmul's bias and ReLU stay its epilogue) */
        r = tb__ag_mask(v->a, TB__K(tb_gt(y, TB__C(0.0))), g);
        break;
    case TB_OP_CAST:
        if (tb_dtype_is_float(v->xs[0].dtype)) r = TB__K(tb_cast(g, v->xs[0].dtype));
        break;
    default: /* FLOOR CEIL ROUND SIGN: zero almost everywhere */
        r = NULL;
        break;
    }
    (void)s;
    v->out[0] = r;
}

/* maximum/minimum: the gradient goes to the larger (smaller) operand, half to each on a tie */
static void tb__vjp_extreme(const tb__vjp *v, bool maximum) {
    tb_tensor *a = v->x[0], *b = v->x[1], *g = v->g;
    tb_tensor *half = TB__K(tb_where(TB__K(tb_eq(a, b)), TB__K(tb_mul_scalar(g, 0.5)), g));
    tb_tensor *a_loses = TB__K(maximum ? tb_lt(a, b) : tb_gt(a, b));
    tb_tensor *b_loses = TB__K(maximum ? tb_gt(a, b) : tb_lt(a, b));
    if (v->need[0])
        v->out[0] = tb__ag_unbroadcast(
            v->a, tb__ag_mask(v->a, TB__K(tb_logical_not(a_loses)), half), &v->xs[0]);
    if (v->need[1])
        v->out[1] = tb__ag_unbroadcast(
            v->a, tb__ag_mask(v->a, TB__K(tb_logical_not(b_loses)), half), &v->xs[1]);
}

static void tb__vjp_binary(const tb__vjp *v) {
    tb_tensor *a = v->x[0], *b = v->x[1], *g = v->g, *y = v->y, *ga = NULL, *gb = NULL;
    switch (v->node->op) {
    case TB_OP_ADD:
        ga = g;
        gb = g;
        break;
    case TB_OP_SUB:
        ga = g;
        if (v->need[1]) gb = TB__K(tb_neg(g));
        break;
    case TB_OP_MUL:
        if (v->need[0]) ga = TB__K(tb_mul(g, b));
        if (v->need[1]) gb = TB__K(tb_mul(g, a));
        break;
    case TB_OP_DIV:
        if (v->need[0]) ga = TB__K(tb_div(g, b));
        if (v->need[1]) gb = TB__K(tb_neg(TB__K(tb_div(TB__K(tb_mul(g, y)), b))));
        break;
    case TB_OP_POW:
        /* a: where(b == 0, 0, g b a^(b-1));  b: where(a == 0 & b >= 0, 0, g y log(a)) */
        if (v->need[0]) {
            tb_tensor *d = TB__K(tb_mul(b, TB__K(tb_pow(a, TB__K(tb_sub_scalar(b, 1.0))))));
            ga = tb__ag_mask(v->a, TB__K(tb_ne(b, TB__C(0.0))), TB__K(tb_mul(g, d)));
        }
        if (v->need[1]) {
            tb_tensor *skip =
                TB__K(tb_logical_and(TB__K(tb_eq(a, TB__C(0.0))), TB__K(tb_ge(b, TB__C(0.0)))));
            gb = tb__ag_mask(v->a, TB__K(tb_logical_not(skip)),
                             TB__K(tb_mul(g, TB__K(tb_mul(y, TB__K(tb_log(a)))))));
        }
        break;
    case TB_OP_MAXIMUM:
        tb__vjp_extreme(v, true);
        return;
    case TB_OP_MINIMUM:
        tb__vjp_extreme(v, false);
        return;
    default:
        return; /* comparisons and logic: no gradient */
    }
    if (v->need[0]) v->out[0] = tb__ag_unbroadcast(v->a, ga, &v->xs[0]);
    if (v->need[1]) v->out[1] = tb__ag_unbroadcast(v->a, gb, &v->xs[1]);
}

static void tb__vjp_ternary(const tb__vjp *v) {
    tb_tensor *g = v->g;
    if (v->node->op == TB_OP_WHERE) {
        tb_tensor *c = v->x[0];
        if (v->need[1]) v->out[1] = tb__ag_unbroadcast(v->a, tb__ag_mask(v->a, c, g), &v->xs[1]);
        if (v->need[2]) {
            v->out[2] =
                tb__ag_unbroadcast(v->a, tb__ag_mask(v->a, TB__K(tb_logical_not(c)), g), &v->xs[2]);
        }
        return;
    } else {
        /* clamp(x, lo, hi) = min(max(x, lo), hi): x where lo <= x <= hi; lo where x < lo and
           lo < hi; hi where x > hi or hi < lo */
        tb_tensor *x = v->x[0], *lo = v->x[1], *hi = v->x[2];
        if (v->need[0]) {
            tb_tensor *in = TB__K(tb_logical_and(TB__K(tb_ge(x, lo)), TB__K(tb_le(x, hi))));
            v->out[0] = tb__ag_unbroadcast(v->a, tb__ag_mask(v->a, in, g), &v->xs[0]);
        }
        if (v->need[1]) {
            tb_tensor *m = TB__K(tb_logical_and(TB__K(tb_lt(x, lo)), TB__K(tb_lt(lo, hi))));
            v->out[1] = tb__ag_unbroadcast(v->a, tb__ag_mask(v->a, m, g), &v->xs[1]);
        }
        if (v->need[2]) {
            tb_tensor *m = TB__K(tb_logical_or(TB__K(tb_gt(x, hi)), TB__K(tb_lt(hi, lo))));
            v->out[2] = tb__ag_unbroadcast(v->a, tb__ag_mask(v->a, m, g), &v->xs[2]);
        }
    }
}

static void tb__vjp_reduce(const tb__vjp *v) {
    const tb_shape *xs = &v->xs[0];
    int64_t mask = v->node->attrs[0];
    bool keep = v->node->attrs[1] != 0;
    tb_tensor *x = v->x[0], *g;
    int32_t axes[TB_MAX_RANK];
    size_t n = tb__ag_axes(mask, xs->rank, axes), i;
    if (n == 0) { /* each output element is its one input element */
        v->out[0] = v->node->op == TB_OP_ARGMAX || v->node->op == TB_OP_ARGMIN ? NULL : v->g;
        return;
    }
    g = tb__ag_restore(v->a, v->g, xs, mask, keep);
    switch (v->node->op) {
    case TB_OP_SUM:
        v->out[0] = g;
        break;
    case TB_OP_MEAN: {
        double count = 1.0;
        for (i = 0; i < n; i++)
            count *= (double)xs->dims[axes[i]];
        v->out[0] = TB__K(tb_div_scalar(g, count));
        break;
    }
    case TB_OP_MAX:
    case TB_OP_MIN: { /* (g / count of the extremes) at each extreme */
        tb_tensor *y;
        if (v->node->num_attrs >= 3 && v->node->attrs[2] != 0) { /* g at the first extreme */
            int32_t ax = axes[0];
            tb_tensor *at =
                TB__K(v->node->op == TB_OP_MAX ? tb_argmax(x, ax, true) : tb_argmin(x, ax, true));
            tb_tensor *k = TB__K(tb_arange(0.0, (double)xs->dims[ax], 1.0, TB_I64, &v->a->device));
            int64_t kd[TB_MAX_RANK];
            int32_t j;
            for (j = 0; j < xs->rank; j++)
                kd[j] = j == ax ? xs->dims[ax] : 1;
            k = TB__K(tb_reshape(k, kd, xs->rank));
            v->out[0] = tb__ag_mask(v->a, TB__K(tb_eq(k, at)), g);
            break;
        }
        y = tb__ag_restore(v->a, v->y, xs, mask, keep);
        tb_tensor *hit = TB__K(tb_cast(TB__K(tb_eq(x, y)), v->dt));
        tb_tensor *count = TB__K(tb_sum(hit, axes, n, true));
        v->out[0] = TB__K(tb_mul(TB__K(tb_div(g, count)), hit));
        break;
    }
    case TB_OP_PROD: {
        /* the product of the others: y / x without zeros; with one zero, that element gets the
           product of the rest; with more, all get 0 */
        tb_tensor *zero = TB__K(tb_eq(x, TB__C(0.0)));
        tb_tensor *safe = TB__K(tb_where(zero, TB__C(1.0), x));
        tb_tensor *rest = TB__K(tb_prod(safe, axes, n, true));
        tb_tensor *zeros = TB__K(tb_sum(TB__K(tb_cast(zero, TB_I64)), axes, n, true));
        tb_tensor *none =
            TB__K(tb_eq(zeros, TB__K(tb_scalar_tensor(tb_scalar_i(TB_I64, 0), &v->a->device))));
        tb_tensor *one =
            TB__K(tb_eq(zeros, TB__K(tb_scalar_tensor(tb_scalar_i(TB_I64, 1), &v->a->device))));
        tb_tensor *gr = TB__K(tb_mul(g, rest));
        tb_tensor *lone = tb__ag_mask(v->a, TB__K(tb_logical_and(one, zero)), gr);
        v->out[0] = TB__K(tb_where(none, TB__K(tb_div(gr, safe)), lone));
        break;
    }
    default:
        break; /* argmax, argmin */
    }
}

/* How many leading batch axes A of a matmul is expanded along (its expand's source has 1
   there) when the other batch axes are not expanded: 0 when it is not that shape. */
static int32_t tb__ag_mm_lead(const tb_node *a) {
    const tb_node *src = a->op == TB_OP_EXPAND ? a->operands[0] : NULL;
    int32_t r = a->shape.rank, p = 0, i;
    if (src == NULL || src->shape.rank != r) return 0;
    while (p < r - 2 && src->shape.dims[p] == 1 && a->shape.dims[p] > 1)
        p++;
    for (i = p; i < r - 2; i++)
        if (src->shape.dims[i] != a->shape.dims[i]) return 0;
    return p;
}

/* A's gradient summed over the `p` leading batch axes it is expanded along, as one matmul
   whose depth runs over those axes and B's columns (a convolution's weight gradient: batch
   and positions contracted at once, no per-image product to sum, except where
   tb__ag_mm_per_batch prefers those): g [L.., A.., n, m] as [A.., n, L * m] times B [L..,
   A.., k, m] as [A.., L * m, k], in the expand's source's dims. */
static tb_tensor *tb__ag_mm_folded(const tb__vjp *v, int32_t p) {
    const tb_shape *as = &v->xs[0];
    int32_t r = as->rank, q = r - 2 - p, i, pg[TB_MAX_RANK], pb[TB_MAX_RANK];
    int64_t dg[TB_MAX_RANK], db[TB_MAX_RANK], lm = v->xs[1].dims[r - 1];
    tb_tensor *gt, *bt;
    for (i = 0; i < p; i++)
        lm *= as->dims[i];
    for (i = 0; i < q; i++) {
        pg[i] = pb[i] = p + i;
        dg[i] = db[i] = as->dims[p + i];
    }
    pg[q] = r - 2;
    for (i = 0; i < p; i++)
        pg[q + 1 + i] = pb[q + i] = i;
    pg[r - 1] = pb[r - 2] = r - 1;
    pb[r - 1] = r - 2;
    dg[q] = as->dims[r - 2];
    dg[q + 1] = db[q] = lm;
    db[q + 1] = as->dims[r - 1];
    gt = TB__K(tb_reshape(TB__K(tb_permute(v->g, pg, r)), dg, q + 2));
    bt = TB__K(tb_reshape(TB__K(tb_permute(v->x[1], pb, r)), db, q + 2));
    return TB__K(
        tb_reshape(TB__K(tb_matmul(gt, bt)), v->node->operands[0]->operands[0]->shape.dims, r));
}

/* conv.c's rule for the gradient of a stride-1 convolution's input (tb__ag_set_conv_grad),
   set once a convolution was recorded */
static tb__ag_conv_grad_fn tb__ag_conv_grad = NULL;

static void tb__ag_set_conv_grad(tb__ag_conv_grad_fn fn) {
    __atomic_store_n(&tb__ag_conv_grad, fn, __ATOMIC_RELEASE);
}

/* Whether the gradient of A shared over leading batch axes is better a product per batch
   element summed afterwards than folded into one matmul (tb__ag_mm_folded): where each
   element's product, n x k, is small beside the operands it reads, m x (n + k) (a network's
   first convolution: 64 x 147 outputs from 12544 positions an image). Folded, such a matmul
   has few column panels (k) over a long depth, too few to give each work item its own panels
   of B, so B's panels (the windows: 8 images, 64 MB) are written to memory and read back, and
   a device of many cores has few outputs to split; per element, each image's panels stay in a
   core's cache, and the partial products (under 1/64 of the operands' traffic) add in one
   small kernel. ResNet-18's first convolution, batch 8, on a 2-core AMD EPYC (Zen 5) VM with
   AVX-512 (TB_DEBUG=2): its weight gradient 17.4 -> 13.9 ms native, 21.3 -> 13.8 ms on PoCL. */
static bool tb__ag_mm_per_batch(const tb__vjp *v) {
    const tb_shape *as = &v->xs[0];
    double n = (double)as->dims[as->rank - 2], k = (double)as->dims[as->rank - 1];
    double m = (double)v->xs[1].dims[v->xs[1].rank - 1];
    return n * k * 64.0 <= m * (n + k);
}

static void tb__vjp_matmul(const tb__vjp *v) {
    tb_tensor *a = v->x[0], *b = v->x[1], *g = v->g;
    tb__ag_conv_grad_fn fn;
    int32_t p = v->need[0] ? tb__ag_mm_lead(v->node->operands[0]) : 0;
    if (p > 0 && tb__ag_mm_per_batch(v)) p = 0; /* the products' sum: the expand's rule */
    if (p > 0) {
        /* given to the expand's source past the expand (v->out[0] stays NULL) */
        v->past_node[0] = v->node->operands[0]->operands[0];
        v->past_grad[0] = tb__ag_mm_folded(v, p);
    } else if (v->need[0]) {
        v->out[0] = TB__K(tb_matmul(g, TB__K(tb_transpose(b, -2, -1))));
    }
    fn = __atomic_load_n(&tb__ag_conv_grad, __ATOMIC_ACQUIRE);
    if (fn != NULL && v->need[1] && v->node->operands[1]->op == TB_OP_RESHAPE && !v->a->failed) {
        tb__saved_error before;
        tb__error_save(&before);
        v->past_grad[1] = fn(v->a, v->node, v->g, &v->past_node[1]);
        if (v->past_grad[1] != NULL) return;
        v->past_node[1] = NULL; /* not a convolution's windows: the rules' fold */
        v->a->failed = false;
        tb__error_restore(&before);
    }
    if (v->need[1]) v->out[1] = TB__K(tb_matmul(TB__K(tb_transpose(a, -2, -1)), g));
}

static void tb__vjp_layer_norm(const tb__vjp *v) {
    const tb_shape *xs = &v->xs[0];
    int32_t nd = (int32_t)v->node->attrs[0], axes[TB_MAX_RANK], lead[TB_MAX_RANK], i;
    bool has_w = v->node->attrs[1] != 0, has_b = v->node->attrs[2] != 0;
    size_t nlead = (size_t)(xs->rank - nd);
    tb_tensor *x = v->x[0], *g = v->g, *mean, *xc, *var, *rstd, *xhat, *dxhat;
    for (i = 0; i < nd; i++)
        axes[i] = xs->rank - nd + i;
    for (i = 0; i < (int32_t)nlead; i++)
        lead[i] = i;
    mean = TB__K(tb_mean(x, axes, (size_t)nd, true));
    xc = TB__K(tb_sub(x, mean));
    var = TB__K(tb_mean(TB__K(tb_mul(xc, xc)), axes, (size_t)nd, true));
    rstd = TB__K(tb_rsqrt(TB__K(tb_add_scalar(var, v->node->fattrs[0]))));
    xhat = TB__K(tb_mul(xc, rstd));
    dxhat = has_w ? TB__K(tb_mul(g, v->x[1])) : g;
    if (v->need[0]) {
        tb_tensor *m1 = TB__K(tb_mean(dxhat, axes, (size_t)nd, true));
        tb_tensor *m2 = TB__K(tb_mean(TB__K(tb_mul(dxhat, xhat)), axes, (size_t)nd, true));
        tb_tensor *inner = TB__K(tb_sub(TB__K(tb_sub(dxhat, m1)), TB__K(tb_mul(xhat, m2))));
        v->out[0] = TB__K(tb_mul(rstd, inner));
    }
    if (has_w && v->need[1]) {
        tb_tensor *t = TB__K(tb_mul(g, xhat));
        v->out[1] = nlead > 0 ? TB__K(tb_sum(t, lead, nlead, false)) : t;
    }
    if (has_b && v->need[has_w ? 2 : 1]) {
        v->out[has_w ? 2 : 1] = nlead > 0 ? TB__K(tb_sum(g, lead, nlead, false)) : g;
    }
}

static void tb__vjp_norm(const tb__vjp *v) {
    int32_t axis = (int32_t)v->node->attrs[0];
    tb_tensor *g = v->g, *y = v->y;
    if (v->node->op == TB_OP_SOFTMAX) { /* y (g - sum(g y)) */
        tb_tensor *s = TB__K(tb_sum(TB__K(tb_mul(g, y)), &axis, 1, true));
        v->out[0] = TB__K(tb_mul(y, TB__K(tb_sub(g, s))));
    } else if (v->node->op == TB_OP_LOG_SOFTMAX) { /* g - exp(y) sum(g) */
        tb_tensor *s = TB__K(tb_sum(g, &axis, 1, true));
        v->out[0] = TB__K(tb_sub(g, TB__K(tb_mul(TB__K(tb_exp(y)), s))));
    } else {
        tb__vjp_layer_norm(v);
    }
}

/* Element o of a window axis moved to o * stride (stride - 1 zeros between neighbours):
   g [L, O_1, .., O_n, K_1, .., K_n], axis 1 + i grows to (O_i - 1) * stride + 1. */
static tb_tensor *tb__ag_spread(tb__ag *a, tb_tensor *g, int32_t i, int64_t stride) {
    tb_shape s = tb_tensor_shape(g);
    int64_t pads[2 * TB_MAX_RANK], dims[TB_MAX_RANK], o = s.dims[1 + i];
    int32_t ax = 2 + i, r = s.rank + 1, d;
    tb_tensor *t;
    if (stride <= 1 || o <= 1) return g;
    t = tb__ag_keep(a, tb_unsqueeze(g, ax));
    memset(pads, 0, sizeof pads);
    pads[2 * (r - 1 - ax) + 1] = stride - 1;
    t = tb__ag_keep(a, tb_pad(t, pads, 2 * (size_t)r, 0.0));
    for (d = 0; d < s.rank; d++)
        dims[d] = d == 1 + i ? o * stride : s.dims[d];
    t = tb__ag_keep(a, tb_reshape(t, dims, s.rank));
    return tb__ag_keep(a, tb_slice(t, 1 + i, 0, (o - 1) * stride + 1, 1));
}

/* Whether windows tile their axes without overlap or gaps (stride = kernel, dilation 1). */
static bool tb__ag_fold_tiles(int32_t n, const int64_t *kernel, const int64_t *stride,
                              const int64_t *dilation) {
    int32_t i;
    for (i = 0; i < n; i++)
        if (dilation[i] != 1 || stride[i] != kernel[i]) return false;
    return true;
}

/* The fold of tiling windows, a view: [.., O_1, .., O_n, K_1, .., K_n] -> [.., O_1, K_1, ..,
   O_n, K_n] -> [.., O_1 * K_1, .., O_n * K_n], zero-padded at the end to sizes. */
static tb_tensor *tb__ag_untile(tb__ag *a, tb_tensor *g, int32_t n, const int64_t *sizes) {
    tb_shape gs = tb_tensor_shape(g);
    int64_t dims[TB_MAX_RANK], pads[2 * TB_MAX_RANK];
    int32_t perm[TB_MAX_RANK], lead = gs.rank - 2 * n, i, r = lead + n;
    bool pad = false;
    tb_tensor *t;
    for (i = 0; i < lead; i++) {
        perm[i] = i;
        dims[i] = gs.dims[i];
    }
    memset(pads, 0, sizeof pads);
    for (i = 0; i < n; i++) {
        perm[lead + 2 * i] = lead + i;
        perm[lead + 2 * i + 1] = lead + n + i;
        dims[lead + i] = gs.dims[lead + i] * gs.dims[lead + n + i];
        pads[2 * (n - 1 - i) + 1] = sizes[i] - dims[lead + i];
        pad = pad || sizes[i] > dims[lead + i];
    }
    t = tb__ag_keep(a, tb_permute(g, perm, gs.rank));
    t = t != NULL ? tb__ag_keep(a, tb_reshape(t, dims, r)) : NULL;
    return t != NULL && pad ? tb__ag_keep(a, tb_pad(t, pads, 2 * (size_t)n, 0.0)) : t;
}

/* t [L, O'_1, .., O'_n, K_1, .., K_n] (window positions at stride 1) placed back onto
   [L, sizes.., K..]: element [l, a, k] = t[l, a - k * dilation, k] (0 outside). Padded by
   (K - 1) * dilation before, its kernel axes flipped, it is the diagonal window [l, a, j] ->
   [l, a + j * dilation, j] (one view), flipped back when `flip_back`. */
static tb_tensor *tb__ag_place(tb__ag *a, tb_tensor *t, int32_t n, const int64_t *sizes,
                               const int64_t *kernel, const int64_t *dilation, bool flip_back) {
    tb_shape ts = tb_tensor_shape(t);
    int64_t pads[2 * TB_MAX_RANK], attrs[2 + 4 * 3];
    int32_t i, r = 1 + 2 * n, kax[3];
    memset(pads, 0, sizeof pads);
    attrs[0] = n;
    for (i = 0; i < n; i++) {
        int32_t from_end = 2 * n - 1 - i; /* axis 1 + i */
        pads[2 * from_end] = (kernel[i] - 1) * dilation[i];
        pads[2 * from_end + 1] = sizes[i] - ts.dims[1 + i];
        kax[i] = 1 + n + i;
        attrs[1 + 4 * i] = sizes[i];
        attrs[2 + 4 * i] = kernel[i];
        attrs[3 + 4 * i] = 1;
        attrs[4 + 4 * i] = dilation[i];
    }
    attrs[1 + 4 * n] = 1;
    t = tb__ag_keep(a, tb_pad(t, pads, 2 * (size_t)r, 0.0));
    t = t != NULL ? tb__ag_keep(a, tb_flip(t, kax, (size_t)n)) : NULL;
    t = t != NULL ? tb__ag_keep(a, tb_call_op(TB_OP_WINDOW, &t, 1, attrs, 2 + 4 * (size_t)n))
                  : NULL;
    return t != NULL && flip_back ? tb__ag_keep(a, tb_flip(t, kax, (size_t)n)) : t;
}

/* g [..., O.., K..] with its leading axes merged into one, spread by the strides. */
static tb_tensor *tb__ag_merge_spread(tb__ag *a, tb_tensor *g, int32_t n, int32_t lead,
                                      const int64_t *stride) {
    tb_shape gs = tb_tensor_shape(g);
    int64_t dims[TB_MAX_RANK], lead_numel = 1;
    int32_t i;
    tb_tensor *t;
    for (i = 0; i < lead; i++)
        lead_numel *= gs.dims[i];
    dims[0] = lead_numel;
    for (i = 0; i < 2 * n; i++)
        dims[1 + i] = gs.dims[lead + i];
    t = tb__ag_keep(a, tb_reshape(g, dims, 1 + 2 * n));
    for (i = 0; i < n && t != NULL; i++)
        t = tb__ag_spread(a, t, i, stride[i]);
    return t;
}

/* t [L, rest..] as [lead dims of `like`.., rest..]. */
static tb_tensor *tb__ag_unmerge(tb__ag *a, tb_tensor *t, const tb_shape *like, int32_t lead) {
    tb_shape ts;
    int64_t dims[TB_MAX_RANK];
    int32_t i;
    if (t == NULL) return NULL;
    ts = tb_tensor_shape(t);
    for (i = 0; i < lead; i++)
        dims[i] = like->dims[i];
    for (i = 1; i < ts.rank; i++)
        dims[lead + i - 1] = ts.dims[i];
    return tb__ag_keep(a, tb_reshape(t, dims, lead + ts.rank - 1));
}

/* Whether a fold runs by phases (tb__ag_fold_phases): dilation 1, a stride above 1, at most 16
   phases and 25 taps (each tap is a term of its own). */
static bool tb__ag_fold_phased(int32_t n, const int64_t *kernel, const int64_t *stride,
                               const int64_t *dilation) {
    int64_t phases = 1, taps = 1;
    int32_t i;
    for (i = 0; i < n; i++) {
        if (dilation[i] != 1 || stride[i] > 16 || kernel[i] > 25) return false;
        phases *= stride[i];
        taps *= kernel[i];
    }
    return phases > 1 && phases <= 16 && taps <= 25;
}

/* One phase r of a phased fold onto [L.., Q..]: the sum of its taps k = r + j * s (per axis),
   tap j's [L.., O..] slice of g moved j along (padded), or zeros where the phase has no tap;
   then seen as [L.., Q_1, 1, .., Q_n, 1] for the interleave. Sums of pads, not a reduction, so
   that the interleave's kernel computes them (and what g is made of) where it reads them. */
static tb_tensor *tb__ag_fold_phase(tb__ag *a, tb_tensor *g, int32_t n, const int64_t *q,
                                    const int64_t *kernel, const int64_t *stride,
                                    const int64_t *r) {
    tb_shape gs = tb_tensor_shape(g);
    int64_t m[3], j[3] = {0, 0, 0}, dims[TB_MAX_RANK], pads[2 * TB_MAX_RANK];
    int32_t lead = gs.rank - 2 * n, i;
    int64_t taps = 1, tap;
    tb_tensor *sum = NULL;
    for (i = 0; i < n; i++) {
        m[i] = r[i] < kernel[i] ? (kernel[i] - r[i] + stride[i] - 1) / stride[i] : 0;
        taps *= m[i];
    }
    for (i = 0; i < lead + n; i++)
        dims[i] = i < lead ? gs.dims[i] : q[i - lead];
    if (taps == 0) { /* no window puts anything there */
        tb_shape zs;
        tb_device dev = tb_tensor_device(g);
        sum = tb__ag_keep(
            a, tb_shape_make(&zs, gs.dtype, lead + n, dims) == TB_OK ? tb_zeros(&zs, &dev) : NULL);
    }
    memset(pads, 0, sizeof pads);
    for (tap = 0; tap < taps && !a->failed; tap++) {
        tb_tensor *t = g;
        int64_t rest = tap;
        for (i = n - 1; i >= 0; i--) {
            j[i] = rest % m[i];
            rest /= m[i];
        }
        for (i = 0; i < n && t != NULL; i++) {
            int64_t k = r[i] + j[i] * stride[i];
            t = tb__ag_keep(a, tb_slice(t, lead + n + i, k, k + 1, 1));
            pads[2 * (n - 1 - i)] = j[i];
            pads[2 * (n - 1 - i) + 1] = q[i] - gs.dims[lead + i] - j[i];
        }
        t = t != NULL ? tb__ag_keep(a, tb_reshape(t, gs.dims, lead + n)) : NULL;
        t = t != NULL ? tb__ag_keep(a, tb_pad(t, pads, 2 * (size_t)n, 0.0)) : NULL;
        sum = sum == NULL || t == NULL ? t : tb__ag_keep(a, tb_add(sum, t));
    }
    for (i = n - 1; i >= 0; i--) {
        dims[lead + 2 * i] = q[i];
        dims[lead + 2 * i + 1] = 1;
    }
    return sum != NULL && !a->failed ? tb__ag_keep(a, tb_reshape(sum, dims, lead + 2 * n)) : NULL;
}

/* The fold of strided windows (dilation 1) by phases: along each axis, output element
   s * q + r gets the taps r, r + s, .. of windows q, q - 1, .., so each of the s_1 * .. * s_n
   phases is a stride-1 fold of a few taps, and the phases interleave (concatenated on their
   unit axes, merged, cut to sizes). The spread's way reads every tap of every window at each
   output element, zeros included (9 for a 3 x 3 window at stride 2, where 2.25 count). */
static tb_tensor *tb__ag_fold_phases(tb__ag *a, tb_tensor *g, int32_t n, const int64_t *sizes,
                                     const int64_t *kernel, const int64_t *stride) {
    tb_shape gs = tb_tensor_shape(g);
    tb_tensor *pieces[16];
    int64_t q[3], r[3], dims[TB_MAX_RANK];
    int32_t lead = gs.rank - 2 * n, i;
    size_t count = 1, p, j;
    bool ok = true;
    for (i = 0; i < n; i++) {
        q[i] = (sizes[i] + stride[i] - 1) / stride[i];
        count *= (size_t)stride[i];
    }
    for (p = 0; p < count; p++) { /* phases in row-major order of r */
        size_t rest = p;
        for (i = n - 1; i >= 0; i--) {
            r[i] = (int64_t)(rest % (size_t)stride[i]);
            rest /= (size_t)stride[i];
        }
        pieces[p] = ok ? tb__ag_fold_phase(a, g, n, q, kernel, stride, r) : NULL;
        ok = pieces[p] != NULL;
    }
    for (i = n - 1; i >= 0 && ok; i--) { /* the last axis's phases first */
        size_t groups = count / (size_t)stride[i];
        for (j = 0; j < groups && ok && stride[i] > 1; j++) {
            pieces[j] = tb__ag_keep(
                a, tb_concat(pieces + j * (size_t)stride[i], (size_t)stride[i], lead + 2 * i + 1));
            ok = pieces[j] != NULL;
        }
        count = groups;
    }
    if (!ok) return NULL;
    for (i = 0; i < lead; i++)
        dims[i] = gs.dims[i];
    for (i = 0; i < n; i++)
        dims[lead + i] = q[i] * stride[i];
    pieces[0] = tb__ag_keep(a, tb_reshape(pieces[0], dims, lead + n));
    for (i = 0; i < n && pieces[0] != NULL; i++)
        if (dims[lead + i] > sizes[i])
            pieces[0] = tb__ag_keep(a, tb_slice(pieces[0], lead + i, 0, sizes[i], 1));
    return pieces[0];
}

/* The adjoint of WINDOW (col2im): g [..., O_1, .., O_n, K_1, .., K_n] summed back onto
   [..., sizes]: element [..., o, k] adds to [..., o_i * stride_i + k_i * dilation_i]. Tiling
   windows need a view only; strided ones run by phases (tb__ag_fold_phases); others are
   spread by the strides, placed (tb__ag_place: one diagonal window) and summed over the kernel
   axes: one reduction reading g through views, whatever the kernel size. */
static tb_tensor *tb__ag_fold(tb__ag *a, tb_tensor *g, int32_t n, const int64_t *sizes,
                              const int64_t *kernel, const int64_t *stride,
                              const int64_t *dilation) {
    tb_shape gs = tb_tensor_shape(g);
    int32_t lead = gs.rank - 2 * n, i, axes[3];
    tb_tensor *t;
    if (tb__ag_fold_tiles(n, kernel, stride, dilation)) return tb__ag_untile(a, g, n, sizes);
    if (tb__ag_fold_phased(n, kernel, stride, dilation))
        return tb__ag_fold_phases(a, g, n, sizes, kernel, stride);
    t = tb__ag_merge_spread(a, g, n, lead, stride);
    t = t != NULL ? tb__ag_place(a, t, n, sizes, kernel, dilation, false) : NULL;
    for (i = 0; i < n; i++)
        axes[i] = 1 + n + i;
    t = t != NULL ? tb__ag_keep(a, tb_sum(t, axes, (size_t)n, false)) : NULL;
    return tb__ag_unmerge(a, t, &gs, lead);
}

static void tb__vjp_movement(const tb__vjp *v) {
    const tb_shape *xs = &v->xs[0];
    const int64_t *at = v->node->attrs;
    tb_tensor *g = v->g;
    int32_t r = xs->rank, i, list[TB_MAX_RANK];
    switch (v->node->op) {
    case TB_OP_RESHAPE:
        v->out[0] = TB__K(tb_reshape(g, xs->dims, r));
        break;
    case TB_OP_PERMUTE:
        for (i = 0; i < r; i++)
            list[at[i]] = i;
        v->out[0] = TB__K(tb_permute(g, list, r));
        break;
    case TB_OP_EXPAND:
        v->out[0] = tb__ag_unbroadcast(v->a, g, xs);
        break;
    case TB_OP_WINDOW: {
        int64_t sizes[3], kernel[3], stride[3], dilation[3];
        int32_t n = (int32_t)at[0];
        bool diag = v->node->num_attrs == 2 + 4 * (size_t)n;
        for (i = 0; i < n; i++) {
            sizes[i] = xs->dims[r - (diag ? 2 : 1) * n + i];
            kernel[i] = at[2 + 4 * i];
            stride[i] = at[3 + 4 * i];
            dilation[i] = at[4 + 4 * i];
        }
        if (!diag) {
            v->out[0] = tb__ag_fold(v->a, g, n, sizes, kernel, stride, dilation);
        } else { /* x [.., L.., K..]: g spread and placed back, kernel axes kept */
            tb_tensor *t = tb__ag_merge_spread(v->a, g, n, r - 2 * n, stride);
            t = t != NULL ? tb__ag_place(v->a, t, n, sizes, kernel, dilation, true) : NULL;
            v->out[0] = tb__ag_unmerge(v->a, t, xs, r - 2 * n);
        }
        break;
    }
    case TB_OP_FLIP: {
        size_t n = tb__ag_axes(at[0], r, list);
        v->out[0] = n > 0 ? TB__K(tb_flip(g, list, n)) : g;
        break;
    }
    case TB_OP_SLICE: {
        /* element j of the slice goes back to start + j * step: spread g by step (a new axis
           padded to step, folded in), then pad to the input's extent */
        int32_t dim = (int32_t)at[0];
        int64_t start = at[1], step = at[3], n = v->node->shape.dims[dim];
        int64_t dims[TB_MAX_RANK], pads[2 * TB_MAX_RANK], len;
        tb_tensor *t = g;
        memset(pads, 0, sizeof pads);
        if (step > 1 && n > 0) {
            if (r + 1 > TB_MAX_RANK) {
                tb__error(TB_ERR_UNSUPPORTED, "%s: the gradient of a strided slice of rank %d",
                          v->a->fn, (int)r);
                v->a->failed = true;
                return;
            }
            t = TB__K(tb_unsqueeze(t, dim + 1));
            pads[2 * (r - 1 - dim) + 1] = step - 1; /* the new axis is r - 1 - dim from the end */
            t = TB__K(tb_pad(t, pads, 2 * (size_t)(r + 1), 0.0));
            pads[2 * (r - 1 - dim) + 1] = 0;
            for (i = 0; i < r; i++)
                dims[i] = i == dim ? n * step : v->node->shape.dims[i];
            t = TB__K(tb_reshape(t, dims, r));
            len = xs->dims[dim] - start < n * step ? xs->dims[dim] - start : n * step;
            t = TB__K(tb_slice(t, dim, 0, len, 1));
        } else {
            len = n;
        }
        pads[2 * (r - 1 - dim)] = start;
        pads[2 * (r - 1 - dim) + 1] = xs->dims[dim] - start - len;
        v->out[0] = TB__K(tb_pad(t, pads, 2 * (size_t)r, 0.0));
        break;
    }
    default:
        break;
    }
}

/* A collective's vjp: every rank's all_reduce output reads every rank's input alike, so the
   gradient of a sum (a mean) is the all_reduce sum (mean) of the ranks' gradients, recorded as
   the same collective (every rank runs tb_grad alike). Other collectives: an error. */
static tb_tensor *tb__vjp_collective(const tb__vjp *v) {
    const int64_t *at = v->node->attrs;
    tb_node *gn, *node;
    if (at[1] != 1 || (at[2] != TB_REDUCE_SUM && at[2] != TB_REDUCE_MEAN)) {
        static const char *const names[] = {"?", "all_reduce", "all_gather", "reduce_scatter",
                                            "broadcast"};
        static const char *const ops[] = {"sum", "mean", "max", "min", "product"};
        tb__error(TB_ERR_UNSUPPORTED,
                  "%s: %s%s%s%s is on the path; of the collectives only all_reduce with sum or "
                  "mean has a gradient",
                  v->a->fn, at[1] >= 1 && at[1] <= 4 ? names[at[1]] : "?",
                  at[1] == 1 || at[1] == 3 ? "(" : "",
                  at[1] == 1 || at[1] == 3 ? ops[at[2] >= 0 && at[2] <= 4 ? at[2] : 0] : "",
                  at[1] == 1 || at[1] == 3 ? ")" : "");
        v->a->failed = true;
        return NULL;
    }
    gn = tb__tensor_ir(v->g);
    node = gn != NULL ? tb__emit(v->a->fn, TB_OP_COLLECTIVE, &gn->shape, &gn->device, &gn, 1, at,
                                 v->node->num_attrs, NULL)
                      : NULL;
    return TB__K(tb__tensor_from_node(node));
}

static void tb__vjp_other(const tb__vjp *v) {
    const tb_shape *xs = &v->xs[0];
    const int64_t *at = v->node->attrs;
    tb_tensor *g = v->g;
    int32_t r = xs->rank, i;
    uint32_t k;
    switch (v->node->op) {
    case TB_OP_CONCAT: {
        int32_t dim = (int32_t)at[0];
        int64_t offset = 0;
        for (k = 0; k < v->node->num_operands; k++) {
            int64_t len = v->xs[k].dims[dim];
            if (v->need[k]) v->out[k] = TB__K(tb_slice(g, dim, offset, offset + len, 1));
            offset += len;
        }
        break;
    }
    case TB_OP_PAD: {
        tb_tensor *t = g;
        for (i = 0; i < r; i++) {
            if (at[2 * i] != 0 || at[2 * i + 1] != 0)
                t = TB__K(tb_slice(t, i, at[2 * i], at[2 * i] + xs->dims[i], 1));
        }
        if (v->need[0]) v->out[0] = t;
        if (v->need[1]) { /* the border's sum */
            v->out[1] =
                TB__K(tb_sub(TB__K(tb_sum(g, NULL, 0, false)), TB__K(tb_sum(t, NULL, 0, false))));
        }
        break;
    }
    case TB_OP_GATHER:
        if (v->need[0]) v->out[0] = tb__ag_scatter(v->a, xs, (int32_t)at[0], v->x[1], g);
        break;
    case TB_OP_INDEX_SELECT:
        if (v->need[0]) v->out[0] = tb__ag_index_grad(v->a, xs, (int32_t)at[0], v->x[1], g);
        break;
    case TB_OP_COLLECTIVE:
        if (v->need[0]) v->out[0] = tb__vjp_collective(v);
        break;
    default:
        break;
    }
}

#undef TB__K
#undef TB__C

/* A custom op's vjp, or an error naming it. */
static void tb__vjp_custom(const tb__vjp *v) {
    const tb_custom_op_desc *desc = tb_op_custom_desc(v->node->op);
    tb_tensor *grads[8] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    tb__saved_error before;
    uint32_t k, n = v->node->num_operands;
    tb_status st;
    if (desc == NULL || desc->vjp == NULL) {
        tb__error(TB_ERR_UNSUPPORTED,
                  "%s: the custom op '%s' is on the path and has no vjp "
                  "(tb_custom_op_desc.vjp)",
                  v->a->fn, desc != NULL ? desc->name : "?");
        v->a->failed = true;
        return;
    }
    tb__error_save(&before);
    st = desc->vjp(v->x, n, v->y, v->g, v->node->attrs, v->node->num_attrs, grads, desc->user_data);
    for (k = 0; k < n && k < 8; k++) {
        if (grads[k] != NULL) {
            tb__ag_keep(v->a, grads[k]);
            if (v->need[k]) v->out[k] = grads[k];
        }
    }
    if (st != TB_OK) {
        if (tb_last_status() == TB_OK || tb_last_status() == before.status)
            tb__error(st > TB_OK && st < TB_STATUS_COUNT ? st : TB_ERR_UNSUPPORTED,
                      "%s: the vjp of the custom op '%s' failed (%s)", v->a->fn, desc->name,
                      tb_status_string(st));
        v->a->failed = true;
    }
}

static void tb__vjp_dispatch(const tb__vjp *v) {
    switch (tb_op_get_kind(v->node->op)) {
    case TB_KIND_UNARY:
        tb__vjp_unary(v);
        break;
    case TB_KIND_BINARY:
        tb__vjp_binary(v);
        break;
    case TB_KIND_TERNARY:
        tb__vjp_ternary(v);
        break;
    case TB_KIND_REDUCE:
        tb__vjp_reduce(v);
        break;
    case TB_KIND_MATMUL:
        tb__vjp_matmul(v);
        break;
    case TB_KIND_NORM:
        tb__vjp_norm(v);
        break;
    case TB_KIND_MOVEMENT:
        tb__vjp_movement(v);
        break;
    case TB_KIND_OTHER:
        tb__vjp_other(v);
        break;
    case TB_KIND_CUSTOM:
        tb__vjp_custom(v);
        break;
    default:
        break; /* leaves */
    }
}

/* ---- the walk ---- */

typedef struct tb__ag_graph {
    tb_node **order; /* post-order: operands before their users */
    size_t num, cap;
    tb_node **keys; /* node -> position, open addressing */
    size_t *values;
    size_t slots;
} tb__ag_graph;

static size_t tb__ag_slot(const tb__ag_graph *w, const tb_node *node) {
    uint64_t h = (uint64_t)(uintptr_t)node * 0x9e3779b97f4a7c15ull;
    size_t i = (size_t)(h >> 17) & (w->slots - 1);
    while (w->keys[i] != NULL && w->keys[i] != node)
        i = (i + 1) & (w->slots - 1);
    return i;
}

static bool tb__ag_find(const tb__ag_graph *w, const tb_node *node, size_t *pos) {
    size_t i;
    if (w->slots == 0 || node == NULL) return false;
    i = tb__ag_slot(w, node);
    if (w->keys[i] == NULL) return false;
    *pos = w->values[i];
    return true;
}

static tb_status tb__ag_insert(tb__ag_graph *w, tb_node *node) {
    size_t i;
    if (tb__grow((void **)&w->order, &w->cap, w->num + 1, sizeof(tb_node *)) != TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    if (2 * (w->num + 1) > w->slots) {
        size_t slots = w->slots ? 2 * w->slots : 64, j;
        tb_node **keys = (tb_node **)tb__calloc(slots, sizeof *keys);
        size_t *values = (size_t *)tb__calloc(slots, sizeof *values);
        tb__ag_graph grown = *w;
        if (keys == NULL || values == NULL) {
            tb__free(keys);
            tb__free(values);
            return TB_ERR_OUT_OF_MEMORY;
        }
        grown.keys = keys;
        grown.values = values;
        grown.slots = slots;
        for (j = 0; j < w->num; j++) {
            i = tb__ag_slot(&grown, w->order[j]);
            keys[i] = w->order[j];
            values[i] = j;
        }
        tb__free(w->keys);
        tb__free(w->values);
        *w = grown;
    }
    i = tb__ag_slot(w, node);
    w->keys[i] = node;
    w->values[i] = w->num;
    w->order[w->num++] = node;
    return TB_OK;
}

static void tb__ag_graph_free(tb__ag_graph *w) {
    tb__free(w->order);
    tb__free(w->keys);
    tb__free(w->values);
    memset(w, 0, sizeof *w);
}

/* Whether gradients flow from the node into its operands. */
static bool tb__ag_expands(const tb_node *node) {
    tb_op_kind kind = tb_op_get_kind(node->op);
    return kind != TB_KIND_LEAF && kind != TB_KIND_INVALID && !node->stop_grad &&
           tb_dtype_is_float(node->shape.dtype);
}

/* The nodes that gradients reach from `root`, operands first, without recursion. */
static tb_status tb__ag_walk(tb__ag_graph *w, tb_node *root) {
    typedef struct {
        tb_node *node;
        uint32_t next;
    } frame;
    frame *stack = NULL;
    size_t depth = 0, cap = 0, pos;
    tb_status st = TB_OK;
    if (tb__grow((void **)&stack, &cap, 1, sizeof *stack) != TB_OK) return TB_ERR_OUT_OF_MEMORY;
    stack[depth].node = root;
    stack[depth++].next = 0;
    while (depth > 0 && st == TB_OK) {
        frame *f = &stack[depth - 1];
        tb_node *node = f->node;
        if (tb__ag_expands(node) && f->next < node->num_operands) {
            tb_node *operand = node->operands[f->next++];
            if (tb__ag_find(w, operand, &pos)) continue;
            /* an operand on the stack already would be a cycle: IR never has one */
            if (tb__grow((void **)&stack, &cap, depth + 1, sizeof *stack) != TB_OK) {
                st = TB_ERR_OUT_OF_MEMORY;
                break;
            }
            stack[depth].node = operand;
            stack[depth++].next = 0;
            continue;
        }
        depth--;
        if (!tb__ag_find(w, node, &pos)) st = tb__ag_insert(w, node);
    }
    tb__free(stack);
    return st;
}

/* ---- tb_grad ---- */

static tb_status tb__grad_check(const char *fn, tb_tensor *out, tb_tensor *seed,
                                tb_tensor *const *inputs, size_t n) {
    tb_device device;
    tb_shape os;
    size_t i;
    char a[64], b[64];
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (n > 0 && inputs == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: inputs is NULL", fn);
    os = tb_tensor_shape(out);
    device = tb_tensor_device(out);
    if (!tb_dtype_is_float(os.dtype)) {
        return tb__error(TB_ERR_DTYPE, "%s: out is %s; only floating-point values have gradients",
                         fn, tb_dtype_name(os.dtype));
    }
    for (i = 0; i < n; i++) {
        tb_shape s;
        tb_device d;
        if (inputs[i] == NULL)
            return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: inputs[%zu] is NULL", fn, i);
        s = tb_tensor_shape(inputs[i]);
        d = tb_tensor_device(inputs[i]);
        if (!tb_dtype_is_float(s.dtype)) {
            return tb__error(TB_ERR_DTYPE,
                             "%s: inputs[%zu] is %s; only floating-point tensors have gradients",
                             fn, i, tb_dtype_name(s.dtype));
        }
        if (!tb_device_equal(&d, &device)) {
            tb_device_format(&device, a, sizeof a);
            tb_device_format(&d, b, sizeof b);
            return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: inputs[%zu] is on %s, out on %s", fn, i,
                             b, a);
        }
    }
    if (seed == NULL) {
        int64_t numel = 1;
        int32_t k;
        for (k = 0; k < os.rank; k++)
            numel *= os.dims[k];
        if (numel != 1) {
            char sb[96];
            tb__shape_text(&os, sb);
            return tb__error(TB_ERR_SHAPE,
                             "%s: out is %s; a gradient without a seed needs a single element "
                             "(give a seed of out's shape)",
                             fn, sb);
        }
    } else {
        tb_shape ss = tb_tensor_shape(seed);
        tb_device sd = tb_tensor_device(seed);
        int32_t k;
        bool same = ss.rank == os.rank;
        for (k = 0; same && k < os.rank; k++)
            same = ss.dims[k] == os.dims[k];
        if (!same) {
            char sa[96], sb[96];
            tb__shape_text(&ss, sa);
            tb__shape_text(&os, sb);
            return tb__error(TB_ERR_SHAPE, "%s: the seed is %s, out is %s (they must be equal)", fn,
                             sa, sb);
        }
        if (!tb_device_equal(&sd, &device)) {
            tb_device_format(&device, a, sizeof a);
            tb_device_format(&sd, b, sizeof b);
            return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: the seed is on %s, out on %s", fn, b, a);
        }
    }
    return TB_OK;
}

/* Adds `g` to the gradient of the operand at `pos`, of shape `want`. */
static void tb__ag_accumulate(tb__ag *a, tb_tensor **grads, size_t pos, tb_tensor *g,
                              const tb_node *user, const tb_shape *want) {
    tb_shape s = tb_tensor_shape(g);
    int32_t k;
    bool same = s.rank == want->rank;
    for (k = 0; same && k < s.rank; k++)
        same = s.dims[k] == want->dims[k];
    if (!same) {
        char sa[96], sb[96];
        tb__shape_text(&s, sa);
        tb__shape_text(want, sb);
        tb__error(TB_ERR_INTERNAL, "%s: the gradient rule of %s gave %s for an operand of %s",
                  a->fn, tb_op_name(user->op) ? tb_op_name(user->op) : "a custom op", sa, sb);
        a->failed = true;
        return;
    }
    if (s.dtype != want->dtype) g = tb__ag_keep(a, tb_cast(g, want->dtype));
    grads[pos] = grads[pos] == NULL ? g : tb__ag_keep(a, tb_add(grads[pos], g));
}

/* One node's rule: its operands' gradients added to `grads`. */
static void tb__ag_backward_node(tb__ag *a, const tb__ag_graph *w, const bool *leads,
                                 tb_tensor **grads, size_t at) {
    tb_node *node = w->order[at];
    uint32_t n = node->num_operands, k;
    tb_tensor *xl[8], *ol[8], **x = xl, **out = ol;
    tb_shape sl[8], *xs = sl;
    bool nl[8], *need = nl, any = false;
    tb__vjp v;
    tb_node *past_node[2] = {NULL, NULL};
    tb_tensor *past_grad[2] = {NULL, NULL};
    size_t pos;
    if (n > 8) {
        x = (tb_tensor **)tb__calloc(n, sizeof *x);
        out = (tb_tensor **)tb__calloc(n, sizeof *out);
        xs = (tb_shape *)tb__calloc(n, sizeof *xs);
        need = (bool *)tb__calloc(n, sizeof *need);
        if (x == NULL || out == NULL || xs == NULL || need == NULL) {
            a->failed = true;
            goto done;
        }
    }
    for (k = 0; k < n; k++) {
        tb_node *o = node->operands[k];
        need[k] = tb__ag_find(w, o, &pos) && leads[pos] && tb_dtype_is_float(o->shape.dtype);
        any = any || need[k];
        out[k] = NULL;
        xs[k] = o->shape;
    }
    if (!any) goto done;
    for (k = 0; k < n; k++)
        x[k] = tb__ag_node(a, node->operands[k]);
    v.a = a;
    v.node = node;
    v.y = tb__ag_node(a, node);
    v.g = grads[at];
    v.x = x;
    v.need = need;
    v.out = out;
    v.xs = xs;
    v.dt = node->shape.dtype;
    v.past_node = past_node;
    v.past_grad = past_grad;
    if (!a->failed) {
        tb__ag_rules++;
        tb__vjp_dispatch(&v);
        tb__ag_rules--;
    }
    for (k = 0; k < n && !a->failed; k++) {
        if (!need[k] || out[k] == NULL) continue;
        if (tb__ag_find(w, node->operands[k], &pos))
            tb__ag_accumulate(a, grads, pos, out[k], node, &xs[k]);
    }
    for (k = 0; k < 2 && !a->failed; k++)
        if (past_node[k] != NULL && past_grad[k] != NULL && tb__ag_find(w, past_node[k], &pos))
            tb__ag_accumulate(a, grads, pos, past_grad[k], node, &past_node[k]->shape);
done:
    if (n > 8) {
        tb__free(x);
        tb__free(out);
        tb__free(xs);
        tb__free(need);
    }
}

static tb_status tb__grad(tb__ag *a, tb_tensor *out, tb_tensor *seed, tb_tensor *const *inputs,
                          size_t n, tb_tensor **grads_out) {
    tb__ag_graph w;
    tb_node *root = tb__tensor_ir(out);
    tb_tensor **grads = NULL;
    bool *leads = NULL;
    size_t i, pos;
    tb_status st;
    memset(&w, 0, sizeof w);
    if (root == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    st = tb__ag_walk(&w, root);
    if (st == TB_OK) {
        grads = (tb_tensor **)tb__calloc(w.num + 1, sizeof *grads);
        leads = (bool *)tb__calloc(w.num + 1, sizeof *leads);
        if (grads == NULL || leads == NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    for (i = 0; i < n && st == TB_OK; i++) {
        tb_node *in = tb__tensor_ir(inputs[i]);
        if (in == NULL) st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
        if (in != NULL && tb__ag_find(&w, in, &pos)) leads[pos] = true;
    }
    /* leads[i]: a wanted input is at or below order[i] */
    for (i = 0; i < w.num && st == TB_OK; i++) {
        tb_node *node = w.order[i];
        uint32_t k;
        if (!tb__ag_expands(node)) continue;
        for (k = 0; k < node->num_operands && !leads[i]; k++) {
            if (tb__ag_find(&w, node->operands[k], &pos) && leads[pos]) leads[i] = true;
        }
    }
    if (st == TB_OK) {
        tb_shape os = tb_tensor_shape(out);
        grads[w.num - 1] = seed != NULL ? tb__ag_keep(a, tb_cast(seed, os.dtype))
                                        : tb__ag_keep(a, tb_ones(&os, &a->device));
    }
    for (i = w.num; i-- > 0 && st == TB_OK && !a->failed;) {
        if (grads[i] == NULL || !leads[i] || !tb__ag_expands(w.order[i])) continue;
        tb__ag_backward_node(a, &w, leads, grads, i);
    }
    if (st == TB_OK && a->failed)
        st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < n && st == TB_OK; i++) {
        tb_node *in = tb__tensor_ir(inputs[i]);
        tb_tensor *g = NULL;
        if (!tb__ag_find(&w, in, &pos)) continue; /* no path: NULL */
        if (grads[pos] != NULL) {
            g = tb_tensor_retain(grads[pos]);
        } else {
            tb_shape s = tb_tensor_shape(inputs[i]);
            g = tb_zeros(&s, &a->device);
        }
        if (g == NULL) st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
        grads_out[i] = g;
    }
    if (st != TB_OK) {
        for (i = 0; i < n; i++) {
            tb_tensor_release(grads_out[i]);
            grads_out[i] = NULL;
        }
    }
    tb__free(grads);
    tb__free(leads);
    tb__ag_graph_free(&w);
    return st;
}

TBDEF tb_status tb_grad(tb_tensor *out, tb_tensor *seed, tb_tensor *const *inputs, size_t n,
                        tb_tensor **grads_out) {
    const char *fn = "tb_grad";
    tb__ag a;
    tb_status st;
    size_t i;
    tb__ensure_setup();
    if (n > 0 && grads_out == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: grads_out is NULL", fn);
    for (i = 0; i < n; i++)
        grads_out[i] = NULL;
    st = tb__grad_check(fn, out, seed, inputs, n);
    if (st != TB_OK) return st;
    tb__ag_init(&a, fn);
    a.device = tb_tensor_device(out);
    st = tb__grad(&a, out, seed, inputs, n, grads_out);
    tb__ag_free(&a);
    return st;
}
