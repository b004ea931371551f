/* Gradients of seeded random graphs against torch.autograd. A graph draws 3 to 12 ops from
   every differentiable op of the public API (plus the helpers some ops record: a comparison
   for where, argmax for gather, a transpose for matmul; and at the end out + sum(r) for each
   result r that nothing used) over inputs of awkward shapes: rank 0, size-1 dims, odd sizes,
   broadcasting, views through permute, transpose, slices and flips, f32 inputs inside f64
   graphs (type promotion, rank-0 operands). tb_grad of sum(seed * out) for every
   floating-point input on the cpu backend is compared with what tests/grad_torch.py gets by
   replaying the graph op by op in PyTorch (/usr/bin/python3; skipped with a message where
   torch cannot be imported): f64 graphs to 1e-9 of the gradient's largest element (1e-4
   where it went through f32), f32 graphs to 2e-3. tests/test_grad_torch_opencl.c runs the f32
   graphs on opencl (skipped without a device) against the cpu's gradients by normalised
   squared error (a separate program, as the OpenCL runtime's own leaks are not checked).

   The generator keeps the comparison meaningful: values stay in bounded intervals (log, sqrt
   and pow see positive inputs, divisors stay away from 0), and ops with a kink or a tie rule
   (relu, abs, clamp, rounding, max/min, maximum/minimum, comparisons, argmax) only see values
   that both libraries compute bit for bit wherever they sit on the kink: exact ties are kept
   (PyTorch and tb_grad split the gradient evenly), ties that rounding could break are avoided.

   Environment: TB_GRAD_TORCH_GRAPHS=N runs N graphs of each dtype instead of 72 f64 and 28
   f32; TB_GRAD_TORCH_VERBOSE=1 prints each graph's worst error (2: and its ops);
   TB_GRAD_TORCH_KEEP=1 keeps the file of graphs given to PyTorch. */
#define _POSIX_C_SOURCE 200809L /* popen, mkstemp, getline */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#define N_F64_GRAPHS 72
#define N_F32_GRAPHS 28
#define MAX_VALS     64  /* values of a graph: inputs and op results */
#define MAX_GOPS     40  /* recorded ops of a graph, helpers included */
#define MAX_NUMEL    256 /* elements of any value */
#define MAX_LEAF     60  /* elements of an input */
#define MAX_RANK     5
#define CAP          1e3 /* bound on the magnitude of any value */
#define MAX_REPORTS  4   /* mismatching graphs described in full */

/* ---- random numbers (splitmix64: the same graphs on every machine) ---- */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* 0 .. n-1 */
static int rng_int(rng *r, int n) {
    return n <= 1 ? 0 : (int)(rng_next(r) % (uint64_t)n);
}
static double rng_unit(rng *r) {
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}
static bool rng_chance(rng *r, double p) {
    return rng_unit(r) < p;
}

/* ---- the ops of the graphs: X(ENUM, name, weight) ----
   Ops of weight > 0 are drawn at random with that weight and each is the focus of some graphs;
   those of weight 0 are helpers that other ops record (conditions of where, indices of
   gather). */
#define GT_OPS(X)                                                                                  \
    X(NEG, "neg", 1)                                                                               \
    X(ABS, "abs", 1)                                                                               \
    X(EXP, "exp", 1)                                                                               \
    X(LOG, "log", 1)                                                                               \
    X(SQRT, "sqrt", 1)                                                                             \
    X(RSQRT, "rsqrt", 1)                                                                           \
    X(SIN, "sin", 1)                                                                               \
    X(COS, "cos", 1)                                                                               \
    X(TANH, "tanh", 1)                                                                             \
    X(SIGMOID, "sigmoid", 1)                                                                       \
    X(RELU, "relu", 1)                                                                             \
    X(GELU, "gelu", 1)                                                                             \
    X(SILU, "silu", 1)                                                                             \
    X(SOFTPLUS, "softplus", 1)                                                                     \
    X(MISH, "mish", 1)                                                                             \
    X(RECIPROCAL, "reciprocal", 1)                                                                 \
    X(FLOOR, "floor", 1)                                                                           \
    X(CEIL, "ceil", 1)                                                                             \
    X(ROUND, "round", 1)                                                                           \
    X(SIGN, "sign", 1)                                                                             \
    X(ERF, "erf", 1)                                                                               \
    X(DETACH, "detach", 1)                                                                         \
    X(CAST, "cast", 2)                                                                             \
    X(ADD, "add", 3)                                                                               \
    X(SUB, "sub", 2)                                                                               \
    X(MUL, "mul", 3)                                                                               \
    X(DIV, "div", 2)                                                                               \
    X(POW, "pow", 1)                                                                               \
    X(MAXIMUM, "maximum", 2)                                                                       \
    X(MINIMUM, "minimum", 2)                                                                       \
    X(ADD_S, "add_s", 1)                                                                           \
    X(SUB_S, "sub_s", 1)                                                                           \
    X(MUL_S, "mul_s", 1)                                                                           \
    X(DIV_S, "div_s", 1)                                                                           \
    X(POW_S, "pow_s", 1)                                                                           \
    X(WHERE, "where", 3)                                                                           \
    X(CLAMP, "clamp", 2)                                                                           \
    X(CLAMP_T, "clamp_t", 2)                                                                       \
    X(SUM, "sum", 2)                                                                               \
    X(MEAN, "mean", 2)                                                                             \
    X(MAX, "max", 3)                                                                               \
    X(MIN, "min", 2)                                                                               \
    X(PROD, "prod", 2)                                                                             \
    X(MATMUL, "matmul", 3)                                                                         \
    X(SOFTMAX, "softmax", 2)                                                                       \
    X(LOG_SOFTMAX, "log_softmax", 2)                                                               \
    X(LAYER_NORM, "layer_norm", 2)                                                                 \
    X(RESHAPE, "reshape", 2)                                                                       \
    X(PERMUTE, "permute", 2)                                                                       \
    X(TRANSPOSE, "transpose", 2)                                                                   \
    X(EXPAND, "expand", 3)                                                                         \
    X(SQUEEZE, "squeeze", 1)                                                                       \
    X(UNSQUEEZE, "unsqueeze", 1)                                                                   \
    X(SLICE, "slice", 3)                                                                           \
    X(FLIP, "flip", 2)                                                                             \
    X(CONCAT, "concat", 2)                                                                         \
    X(PAD, "pad", 2)                                                                               \
    X(GATHER, "gather", 2)                                                                         \
    X(INDEX_SELECT, "index_select", 2)                                                             \
    X(SCATTER_ADD, "scatter_add", 2)                                                               \
    X(INDEX_ADD, "index_add", 2)                                                                   \
    X(CROSS_ENTROPY, "cross_entropy", 1)                                                           \
    X(NLL_LOSS, "nll_loss", 1)                                                                     \
    X(MSE_LOSS, "mse_loss", 1)                                                                     \
    X(LT, "lt", 0)                                                                                 \
    X(LE, "le", 0)                                                                                 \
    X(GT, "gt", 0)                                                                                 \
    X(GE, "ge", 0)                                                                                 \
    X(EQ, "eq", 0)                                                                                 \
    X(NE, "ne", 0)                                                                                 \
    X(LOGICAL_NOT, "logical_not", 0)                                                               \
    X(LOGICAL_AND, "logical_and", 0)                                                               \
    X(LOGICAL_OR, "logical_or", 0)                                                                 \
    X(ARGMAX, "argmax", 0)                                                                         \
    X(ARGMIN, "argmin", 0)

enum {
#define GT_ENUM(e, name, weight) OP_##e,
    GT_OPS(GT_ENUM)
#undef GT_ENUM
        OP_COUNT
};

static const char *const g_op_names[OP_COUNT] = {
#define GT_NAME(e, name, weight) name,
    GT_OPS(GT_NAME)
#undef GT_NAME
};

static const int g_op_weight[OP_COUNT] = {
#define GT_WEIGHT(e, name, weight) weight,
    GT_OPS(GT_WEIGHT)
#undef GT_WEIGHT
};

/* ---- a graph: values (inputs and op results) and the ops that compute them ---- */

enum { K_FLOAT, K_BOOL, K_INDEX };
enum { NORMAL, POSITIVE, TIES };

/* What a value may hold, for the ops that have kinks or tie rules:
   DUP      elements that are equal in exact arithmetic (expand, pad, gather, rounding, ...);
   SPECIAL  elements sitting exactly on a kink (0 of relu, clamp's bounds, integers, x.5);
   INEXACT  computed through an op whose last bit differs between libraries (exp, sums, ...);
   RISKY    equal elements computed apart by such an op: ties that rounding may break. */
enum { F_DUP = 1, F_SPECIAL = 2, F_INEXACT = 4, F_RISKY = 8 };

typedef struct gval {
    int kind;
    tb_dtype dtype;
    int32_t rank;
    int64_t dims[TB_MAX_RANK];
    double lo, hi;   /* bounds of the elements (an index: 0 .. hi - 1) */
    unsigned flags;  /* F_* */
    uint64_t leaves; /* the inputs (by value id) it depends on */
    uint64_t lowp;   /* the inputs whose path to it passes through a lower precision */
    int uses;
    int op;       /* the op computing it; -1 for an input */
    double *data; /* an input's elements */
} gval;

typedef struct gop {
    int code;
    int out;
    int nargs;
    int args[4];
    int nints;
    int64_t ints[2 * TB_MAX_RANK + 2];
    int nf;
    double f[2];
} gop;

typedef struct graph {
    int index;      /* in its dtype's list */
    uint64_t seed;  /* of its rng */
    tb_dtype dtype; /* f64 or f32: the precision of its inputs and ops */
    int focus;      /* the main op it must contain */
    bool fresh;     /* operands are new inputs (the focus op found none that suit) */
    rng r;
    int nvals;
    gval v[MAX_VALS];
    int nops;
    gop op[MAX_GOPS];
    int out;
    size_t nseed;
    double seedv[MAX_NUMEL];
} graph;

static int64_t numel_of(int32_t rank, const int64_t *dims) {
    int64_t n = 1;
    int32_t i;
    for (i = 0; i < rank; i++)
        n *= dims[i];
    return n;
}
static int64_t vnumel(const gval *v) {
    return numel_of(v->rank, v->dims);
}
static double mag(const gval *v) {
    return fmax(fabs(v->lo), fabs(v->hi));
}
static double dmin4(double a, double b, double c, double d) {
    return fmin(fmin(a, b), fmin(c, d));
}
static double dmax4(double a, double b, double c, double d) {
    return fmax(fmax(a, b), fmax(c, d));
}
static tb_dtype wider(tb_dtype a, tb_dtype b) {
    return a == TB_F64 || b == TB_F64 ? TB_F64 : TB_F32;
}
/* f32 work inside an f64 graph */
static bool is_lowp(const graph *g, tb_dtype dt) {
    return g->dtype == TB_F64 && dt != TB_F64;
}
/* an op with a kink or a tie rule may see v */
static bool kink_ok(const gval *v) {
    return (v->flags & F_RISKY) == 0 && !((v->flags & F_INEXACT) && (v->flags & F_SPECIAL));
}
/* an op comparing a with b element by element may see them */
static bool cross_ok(const gval *a, const gval *b) {
    bool related =
        (a->leaves & b->leaves) != 0 || ((a->flags & F_SPECIAL) && (b->flags & F_SPECIAL));
    return kink_ok(a) && kink_ok(b) && !(related && ((a->flags | b->flags) & F_INEXACT));
}
/* the flags of an op's result from its operands' (or'ed): an exact op keeps them, an inexact
   one turns duplicates into risky ties */
static unsigned inexact_flags(unsigned in) {
    return in | F_INEXACT | ((in & (F_DUP | F_RISKY)) ? F_RISKY : 0);
}

/* PyTorch's result type of two floating-point operands: tensors with dims before rank-0 ones */
static tb_dtype promote2(const gval *a, const gval *b) {
    if ((a->rank > 0) == (b->rank > 0)) return wider(a->dtype, b->dtype);
    return a->rank > 0 ? a->dtype : b->dtype;
}

/* NumPy broadcasting of dims; false when they do not broadcast or the result is too big */
static bool bcast(int32_t ra, const int64_t *da, int32_t rb, const int64_t *db, int32_t *ro,
                  int64_t *dout) {
    int32_t r = ra > rb ? ra : rb, i;
    for (i = 0; i < r; i++) {
        int64_t x = i - (r - ra) >= 0 ? da[i - (r - ra)] : 1;
        int64_t y = i - (r - rb) >= 0 ? db[i - (r - rb)] : 1;
        if (x != y && x != 1 && y != 1) return false;
        dout[i] = x == 1 ? y : x;
    }
    *ro = r;
    return numel_of(r, dout) <= MAX_NUMEL;
}

/* ---- building a graph ---- */

static int add_value(graph *g, int kind, tb_dtype dt, int32_t rank, const int64_t *dims, double lo,
                     double hi, unsigned flags) {
    gval *v;
    if (g->nvals >= MAX_VALS) return -1;
    v = &g->v[g->nvals];
    memset(v, 0, sizeof *v);
    v->kind = kind;
    v->dtype = dt;
    v->rank = rank;
    if (rank > 0) memcpy(v->dims, dims, (size_t)rank * sizeof(int64_t));
    v->lo = lo;
    v->hi = hi;
    v->flags = flags;
    v->op = -1;
    return g->nvals++;
}

/* A new input of these dims: NORMAL values in [-2, 2], POSITIVE in [0.5, 2], TIES multiples of
   0.5 in [-1.5, 1.5] (zeros and repeats). */
static int new_input(graph *g, tb_dtype dt, int32_t rank, const int64_t *dims, int mode) {
    int64_t n = numel_of(rank, dims), i;
    double lo = mode == POSITIVE ? 0.5 : mode == TIES ? -1.5 : -2.0;
    double hi = mode == TIES ? 1.5 : 2.0;
    int id;
    assert_true(n <= MAX_NUMEL);
    id = add_value(g, K_FLOAT, dt, rank, dims, lo, hi, mode == TIES ? F_DUP | F_SPECIAL : 0);
    if (id < 0) return -1;
    g->v[id].data = (double *)malloc((size_t)n * sizeof(double) + 1);
    assert_non_null(g->v[id].data);
    for (i = 0; i < n; i++) {
        double x = mode == TIES ? 0.5 * (rng_int(&g->r, 7) - 3) : lo + (hi - lo) * rng_unit(&g->r);
        g->v[id].data[i] = dt == TB_F32 ? (double)(float)x : x;
    }
    g->v[id].leaves = (uint64_t)1 << id;
    if (is_lowp(g, dt)) g->v[id].lowp = g->v[id].leaves;
    return id;
}

/* A bool input (a mask) or an index input with values in [0, bound). */
static int new_aux_input(graph *g, int kind, int32_t rank, const int64_t *dims, int64_t bound) {
    int64_t n = numel_of(rank, dims), i;
    int id = add_value(g, kind, kind == K_BOOL ? TB_BOOL : TB_I64, rank, dims, 0,
                       kind == K_BOOL ? 1 : (double)bound, 0);
    if (id < 0) return -1;
    g->v[id].data = (double *)malloc((size_t)n * sizeof(double) + 1);
    assert_non_null(g->v[id].data);
    for (i = 0; i < n; i++)
        g->v[id].data[i] =
            kind == K_BOOL ? (double)rng_int(&g->r, 2) : (double)rng_int(&g->r, (int)bound);
    return id;
}

/* Records op `code` on args computing a new value; its leaves, lowp and uses follow. */
static gop *add_op(graph *g, int code, const int *args, int nargs, int out) {
    gop *o;
    gval *v = &g->v[out];
    int i;
    assert_true(g->nops < MAX_GOPS);
    o = &g->op[g->nops];
    memset(o, 0, sizeof *o);
    o->code = code;
    o->out = out;
    o->nargs = nargs;
    for (i = 0; i < nargs; i++) {
        o->args[i] = args[i];
        v->leaves |= g->v[args[i]].leaves;
        v->lowp |= g->v[args[i]].lowp;
        g->v[args[i]].uses++;
    }
    if (v->kind == K_FLOAT && is_lowp(g, v->dtype)) v->lowp |= v->leaves;
    v->op = g->nops++;
    return o;
}

static int result(graph *g, int code, const int *args, int nargs, int kind, tb_dtype dt,
                  int32_t rank, const int64_t *dims, double lo, double hi, unsigned flags,
                  gop **op) {
    int out;
    if (kind == K_FLOAT && !(fmax(fabs(lo), fabs(hi)) <= CAP)) return -1;
    if (numel_of(rank, dims) > MAX_NUMEL) return -1;
    out = add_value(g, kind, dt, rank, dims, lo, hi, flags);
    if (out < 0 || g->nops >= MAX_GOPS) return -1;
    *op = add_op(g, code, args, nargs, out);
    return out;
}

/* Awkward dims for a new input: rank 0 to 4, sizes 1, 2, 3, 4, 5, 7. */
static int32_t random_dims(rng *r, int64_t *dims) {
    static const int32_t ranks[10] = {0, 1, 1, 2, 2, 2, 3, 3, 3, 4};
    static const int64_t sizes[8] = {1, 1, 2, 3, 3, 4, 5, 7};
    int32_t rank = ranks[rng_int(r, 10)], i;
    for (;;) {
        for (i = 0; i < rank; i++)
            dims[i] = sizes[rng_int(r, 8)];
        if (numel_of(rank, dims) <= MAX_LEAF) return rank;
    }
}

static tb_dtype input_dtype(graph *g) {
    return g->dtype == TB_F64 && rng_chance(&g->r, 0.15) ? TB_F32 : g->dtype;
}

/* A floating-point operand: mostly a result that no op uses yet (so that the graph grows as
   one expression), else any earlier value or a new input. */
static int pick(graph *g, int mode) {
    int unused[MAX_VALS], all[MAX_VALS], nu = 0, na = 0, i;
    int64_t dims[TB_MAX_RANK];
    int32_t rank;
    if (!g->fresh) {
        for (i = 0; i < g->nvals; i++) {
            if (g->v[i].kind != K_FLOAT) continue;
            all[na++] = i;
            if (g->v[i].op >= 0 && g->v[i].uses == 0) unused[nu++] = i;
        }
        if (nu > 0 && rng_chance(&g->r, 0.8))
            return rng_chance(&g->r, 0.6) ? unused[nu - 1] : unused[rng_int(&g->r, nu)];
        if (na > 0 && rng_chance(&g->r, 0.4)) return all[rng_int(&g->r, na)];
    }
    rank = random_dims(&g->r, dims);
    if (mode == NORMAL && rng_chance(&g->r, 0.2)) mode = TIES;
    return new_input(g, input_dtype(g), rank, dims, mode);
}

/* Dims that broadcast with a's: the same, some set to 1, leading ones dropped, rank 0, or one
   more leading dim. */
static int32_t partner_dims(graph *g, const gval *a, int64_t *dims) {
    int32_t rank = a->rank, i, drop;
    memcpy(dims, a->dims, sizeof a->dims);
    switch (rng_int(&g->r, 6)) {
    case 0:
    case 1:
        break;
    case 2:
        for (i = 0; i < rank; i++)
            if (rng_chance(&g->r, 0.5)) dims[i] = 1;
        break;
    case 3:
        drop = rng_int(&g->r, rank + 1);
        for (i = drop; i < rank; i++)
            dims[i - drop] = a->dims[i];
        rank -= drop;
        break;
    case 4:
        rank = 0;
        break;
    default:
        if (rank < MAX_RANK) {
            for (i = rank; i > 0; i--)
                dims[i] = dims[i - 1];
            dims[0] = 1 + rng_int(&g->r, 3);
            rank++;
        }
        break;
    }
    return rank;
}

/* A second operand for a: an earlier value whose dims broadcast with a's (and of dtype `dt`
   when dt is a float dtype; TB_BOOL means any), or a new input of partner dims. */
static int pick_partner(graph *g, const gval *a, int mode, tb_dtype dt) {
    int cands[MAX_VALS], n = 0, i, pass;
    int64_t dims[TB_MAX_RANK], od[TB_MAX_RANK];
    int32_t rank, orank;
    /* an unused result first, then any earlier value */
    for (pass = 0; pass < 2 && !g->fresh; pass++) {
        if (!rng_chance(&g->r, pass == 0 ? 0.6 : 0.3)) continue;
        for (i = 0; i < g->nvals; i++) {
            const gval *v = &g->v[i];
            if (v->kind != K_FLOAT || v == a || (pass == 0 && (v->op < 0 || v->uses > 0))) continue;
            if (dt != TB_BOOL && v->dtype != dt) continue;
            if (mode == POSITIVE && v->lo < 0.25) continue;
            if (bcast(a->rank, a->dims, v->rank, v->dims, &orank, od)) cands[n++] = i;
        }
        if (n > 0) return cands[rng_int(&g->r, n)];
    }
    rank = partner_dims(g, a, dims);
    if (numel_of(rank, dims) > MAX_LEAF) rank = 0;
    if (mode == NORMAL && rng_chance(&g->r, 0.2)) mode = TIES;
    return new_input(g, dt != TB_BOOL ? dt : input_dtype(g), rank, dims, mode);
}

/* an axis of a rank-r value, sometimes written from the end */
static int32_t random_axis(rng *r, int32_t rank, int32_t axis) {
    return rank > 0 && rng_chance(r, 0.3) ? axis - rank : axis;
}

/* ---- the generators of the ops: each returns false (the graph unchanged as far as it
   matters: rolled back by the caller) when its operands do not suit ---- */

static bool gen_unary(graph *g, int code) {
    int mode = code == OP_LOG || code == OP_SQRT || code == OP_RSQRT || code == OP_RECIPROCAL
                   ? POSITIVE
                   : NORMAL;
    int x = pick(g, mode);
    gval *v;
    double lo, hi;
    bool exact = false, kink = false;
    unsigned fl;
    gop *o;
    if (x < 0) return false;
    v = &g->v[x];
    lo = v->lo;
    hi = v->hi;
    fl = v->flags;
    switch (code) {
    case OP_NEG:
        lo = -v->hi;
        hi = -v->lo;
        exact = true;
        break;
    case OP_ABS:
        lo = v->lo >= 0 ? v->lo : v->hi <= 0 ? -v->hi : 0;
        hi = mag(v);
        exact = kink = true;
        break;
    case OP_EXP:
        if (v->hi > 4) return false;
        lo = exp(v->lo);
        hi = exp(v->hi);
        break;
    case OP_LOG:
        if (v->lo < 0.1) return false;
        lo = log(v->lo);
        hi = log(v->hi);
        break;
    case OP_SQRT:
        if (v->lo < 0.1) return false;
        lo = sqrt(v->lo);
        hi = sqrt(v->hi);
        exact = true;
        break;
    case OP_RSQRT:
        if (v->lo < 0.1) return false;
        lo = 1 / sqrt(v->hi);
        hi = 1 / sqrt(v->lo);
        break;
    case OP_SIN:
    case OP_COS:
        lo = -1;
        hi = 1;
        break;
    case OP_TANH:
        lo = tanh(v->lo);
        hi = tanh(v->hi);
        break;
    case OP_SIGMOID:
        lo = 1 / (1 + exp(-v->lo));
        hi = 1 / (1 + exp(-v->hi));
        break;
    case OP_ERF:
        lo = erf(v->lo);
        hi = erf(v->hi);
        break;
    case OP_GELU:
    case OP_SILU:
    case OP_MISH:
        lo = v->lo >= 0 ? 0 : code == OP_GELU ? -0.17 : code == OP_SILU ? -0.28 : -0.31;
        hi = fmax(v->hi, 0);
        break;
    case OP_SOFTPLUS:
        lo = log1p(exp(fmin(v->lo, 20)));
        hi = v->hi > 20 ? v->hi : log1p(exp(v->hi));
        break;
    case OP_RELU:
        lo = fmax(v->lo, 0);
        hi = fmax(v->hi, 0);
        exact = kink = true;
        fl |= F_DUP | F_SPECIAL;
        break;
    case OP_RECIPROCAL:
        if (v->lo < 0.2 && v->hi > -0.2) return false;
        lo = 1 / v->hi;
        hi = 1 / v->lo;
        exact = true;
        break;
    case OP_FLOOR:
    case OP_CEIL:
    case OP_ROUND:
        lo = floor(v->lo);
        hi = ceil(v->hi);
        exact = kink = true;
        fl |= F_DUP | F_SPECIAL;
        break;
    case OP_SIGN:
        lo = v->lo > 0 ? 1 : -1;
        hi = v->hi < 0 ? -1 : 1;
        exact = kink = true;
        fl |= F_DUP | F_SPECIAL;
        break;
    case OP_DETACH:
        exact = true;
        break;
    default:
        return false;
    }
    if (kink && !kink_ok(v)) return false;
    if (!exact && is_lowp(g, v->dtype)) return false;
    return result(g, code, &x, 1, K_FLOAT, v->dtype, v->rank, v->dims, lo, hi,
                  exact ? fl : inexact_flags(fl), &o) >= 0;
}

static bool gen_cast(graph *g) {
    int x = pick(g, NORMAL);
    gval *v;
    gop *o;
    tb_dtype to;
    if (x < 0) return false;
    v = &g->v[x];
    /* to the other float dtype; rounding to f32 may make elements equal */
    to = v->dtype == TB_F64 ? TB_F32 : TB_F64;
    if (result(g, OP_CAST, &x, 1, K_FLOAT, to, v->rank, v->dims, v->lo, v->hi,
               v->flags | (to == TB_F32 ? F_DUP : 0), &o) < 0)
        return false;
    o->nints = 1;
    o->ints[0] = to == TB_F64 ? 0 : 1;
    return true;
}

static bool gen_binary(graph *g, int code) {
    int a = pick(g, code == OP_POW ? POSITIVE : NORMAL), b, args[2], out;
    const gval *va, *vb;
    int32_t rank;
    int64_t dims[TB_MAX_RANK];
    double lo, hi;
    bool exact = true;
    tb_dtype dt;
    unsigned fl;
    gop *o;
    if (a < 0) return false;
    va = &g->v[a];
    b = pick_partner(g, va, code == OP_DIV || code == OP_POW ? POSITIVE : NORMAL, TB_BOOL);
    if (b < 0) return false;
    va = &g->v[a];
    vb = &g->v[b];
    if (rng_chance(&g->r, 0.3) && code != OP_DIV && code != OP_POW) { /* b first */
        const gval *t = va;
        int ti = a;
        va = vb;
        vb = t;
        a = b;
        b = ti;
    }
    if (!bcast(va->rank, va->dims, vb->rank, vb->dims, &rank, dims)) return false;
    dt = promote2(va, vb);
    fl = va->flags | vb->flags;
    switch (code) {
    case OP_ADD:
        lo = va->lo + vb->lo;
        hi = va->hi + vb->hi;
        break;
    case OP_SUB:
        lo = va->lo - vb->hi;
        hi = va->hi - vb->lo;
        break;
    case OP_MUL:
        lo = dmin4(va->lo * vb->lo, va->lo * vb->hi, va->hi * vb->lo, va->hi * vb->hi);
        hi = dmax4(va->lo * vb->lo, va->lo * vb->hi, va->hi * vb->lo, va->hi * vb->hi);
        break;
    case OP_DIV:
        if (vb->lo < 0.25 && vb->hi > -0.25) return false;
        lo = dmin4(va->lo / vb->lo, va->lo / vb->hi, va->hi / vb->lo, va->hi / vb->hi);
        hi = dmax4(va->lo / vb->lo, va->lo / vb->hi, va->hi / vb->lo, va->hi / vb->hi);
        break;
    case OP_POW:
        if (va->lo < 0.25 || mag(vb) > 3) return false;
        lo = dmin4(pow(va->lo, vb->lo), pow(va->lo, vb->hi), pow(va->hi, vb->lo),
                   pow(va->hi, vb->hi));
        hi = dmax4(pow(va->lo, vb->lo), pow(va->lo, vb->hi), pow(va->hi, vb->lo),
                   pow(va->hi, vb->hi));
        exact = false;
        break;
    case OP_MAXIMUM:
    case OP_MINIMUM:
        if (!cross_ok(va, vb)) return false;
        lo = code == OP_MAXIMUM ? fmax(va->lo, vb->lo) : fmin(va->lo, vb->lo);
        hi = code == OP_MAXIMUM ? fmax(va->hi, vb->hi) : fmin(va->hi, vb->hi);
        /* elements taken from a broadcast operand repeat */
        if (vnumel(va) < numel_of(rank, dims) || vnumel(vb) < numel_of(rank, dims)) fl |= F_DUP;
        break;
    default:
        return false;
    }
    if (!exact && is_lowp(g, dt)) return false;
    args[0] = a;
    args[1] = b;
    out = result(g, code, args, 2, K_FLOAT, dt, rank, dims, lo, hi, exact ? fl : inexact_flags(fl),
                 &o);
    /* PyTorch's pow backward takes log(a) in a's own dtype: an f32 base gives the exponent's
       gradient f32 precision even when the exponent is f64 */
    if (out >= 0 && code == OP_POW && va->dtype != vb->dtype) g->v[out].lowp |= g->v[out].leaves;
    return out >= 0;
}

static bool gen_scalar(graph *g, int code) {
    /* dyadic constants: exact in f32, so x * c is the same number in both libraries */
    static const double addc[5] = {0.5, -1.5, 2.0, 0.25, -0.75};
    static const double mulc[5] = {2.0, -0.5, 1.5, -3.0, 0.75};
    static const double divc[4] = {2.0, -4.0, 0.5, 8.0};
    static const double powc[7] = {2.0, 3.0, 0.5, -1.0, 1.5, -0.5, 0.0};
    int x = pick(g, code == OP_POW_S ? POSITIVE : NORMAL);
    gval *v;
    double c, lo, hi;
    bool exact = true;
    gop *o;
    if (x < 0) return false;
    v = &g->v[x];
    switch (code) {
    case OP_ADD_S:
    case OP_SUB_S:
        c = addc[rng_int(&g->r, 5)];
        lo = code == OP_ADD_S ? v->lo + c : v->lo - c;
        hi = code == OP_ADD_S ? v->hi + c : v->hi - c;
        break;
    case OP_MUL_S:
        c = mulc[rng_int(&g->r, 5)];
        lo = fmin(v->lo * c, v->hi * c);
        hi = fmax(v->lo * c, v->hi * c);
        break;
    case OP_DIV_S:
        c = divc[rng_int(&g->r, 4)];
        lo = fmin(v->lo / c, v->hi / c);
        hi = fmax(v->lo / c, v->hi / c);
        break;
    case OP_POW_S: {
        double p1, p2;
        c = powc[rng_int(&g->r, 7)];
        if (c != floor(c) && v->lo < 0.25) return false;          /* a real power: positive base */
        if (c < 0 && v->lo < 0.25 && v->hi > -0.25) return false; /* away from 0 */
        p1 = pow(v->lo, c);
        p2 = pow(v->hi, c);
        lo = fmin(p1, p2);
        hi = fmax(p1, p2);
        if (c == 2.0 && v->lo < 0 && v->hi > 0) lo = 0;
        exact = false;
        break;
    }
    default:
        return false;
    }
    if (!exact && is_lowp(g, v->dtype)) return false;
    if (result(g, code, &x, 1, K_FLOAT, v->dtype, v->rank, v->dims, lo, hi,
               exact ? v->flags : inexact_flags(v->flags), &o) < 0)
        return false;
    o->nf = 1;
    o->f[0] = c;
    return true;
}

/* A bool condition whose dims broadcast with (rank, dims): a mask input, or a comparison of
   two values (sometimes negated, or combined with a mask). */
static int gen_condition(graph *g, int32_t rank, const int64_t *dims) {
    int c, args[2];
    int64_t cd[TB_MAX_RANK], od[TB_MAX_RANK];
    int32_t cr, orank;
    gop *o;
    gval proto;
    memset(&proto, 0, sizeof proto);
    proto.rank = rank;
    memcpy(proto.dims, dims, sizeof proto.dims);
    if (rng_chance(&g->r, 0.3)) {
        cr = partner_dims(g, &proto, cd);
        if (numel_of(cr, cd) > MAX_LEAF) cr = 0;
        return new_aux_input(g, K_BOOL, cr, cd, 2);
    } else {
        /* compare x (one of the values, or an input of partner dims) with y */
        int x, y, code = OP_LT + rng_int(&g->r, 6);
        const gval *vx, *vy;
        cr = partner_dims(g, &proto, cd);
        if (numel_of(cr, cd) > MAX_LEAF) cr = 0;
        x = rng_chance(&g->r, 0.5) ? pick(g, NORMAL) : new_input(g, input_dtype(g), cr, cd, NORMAL);
        if (x < 0) return -1;
        y = pick_partner(g, &g->v[x], NORMAL, TB_BOOL);
        if (y < 0) return -1;
        vx = &g->v[x];
        vy = &g->v[y];
        if (!cross_ok(vx, vy)) return -1;
        if (!bcast(vx->rank, vx->dims, vy->rank, vy->dims, &cr, cd)) return -1;
        if (!bcast(cr, cd, rank, dims, &orank, od)) return -1;
        args[0] = x;
        args[1] = y;
        c = result(g, code, args, 2, K_BOOL, TB_BOOL, cr, cd, 0, 1, 0, &o);
        if (c < 0) return -1;
    }
    if (rng_chance(&g->r, 0.2)) {
        args[0] = c;
        c = result(g, OP_LOGICAL_NOT, args, 1, K_BOOL, TB_BOOL, cr, cd, 0, 1, 0, &o);
    } else if (rng_chance(&g->r, 0.2)) {
        int64_t md[TB_MAX_RANK];
        gval cp;
        int32_t mr;
        memset(&cp, 0, sizeof cp);
        cp.rank = cr;
        memcpy(cp.dims, cd, sizeof cd);
        mr = partner_dims(g, &cp, md);
        if (numel_of(mr, md) > MAX_LEAF) mr = 0;
        args[0] = c;
        args[1] = new_aux_input(g, K_BOOL, mr, md, 2);
        if (args[1] < 0 || !bcast(cr, cd, mr, md, &orank, od)) return -1;
        c = result(g, rng_chance(&g->r, 0.5) ? OP_LOGICAL_AND : OP_LOGICAL_OR, args, 2, K_BOOL,
                   TB_BOOL, orank, od, 0, 1, 0, &o);
    }
    return c;
}

static bool gen_where(graph *g) {
    int a = pick(g, NORMAL), b, c, args[3];
    unsigned fl;
    const gval *va, *vb;
    int32_t rank, orank;
    int64_t dims[TB_MAX_RANK], od[TB_MAX_RANK];
    gop *o;
    if (a < 0) return false;
    b = pick_partner(g, &g->v[a], NORMAL, TB_BOOL);
    if (b < 0) return false;
    va = &g->v[a];
    vb = &g->v[b];
    if (!bcast(va->rank, va->dims, vb->rank, vb->dims, &rank, dims)) return false;
    c = gen_condition(g, rank, dims);
    if (c < 0) return false;
    va = &g->v[a];
    vb = &g->v[b];
    if (!bcast(g->v[c].rank, g->v[c].dims, rank, dims, &orank, od)) return false;
    args[0] = c;
    args[1] = a;
    args[2] = b;
    /* elements taken from a broadcast operand repeat */
    fl = va->flags | vb->flags;
    if (vnumel(va) < numel_of(orank, od) || vnumel(vb) < numel_of(orank, od)) fl |= F_DUP;
    return result(g, OP_WHERE, args, 3, K_FLOAT, promote2(va, vb), orank, od, fmin(va->lo, vb->lo),
                  fmax(va->hi, vb->hi), fl, &o) >= 0;
}

static double eighths(double x) {
    return floor(x * 8) / 8;
}

static bool gen_clamp(graph *g) {
    int x = pick(g, NORMAL);
    gval *v;
    double lo, hi;
    gop *o;
    if (x < 0) return false;
    v = &g->v[x];
    if (!kink_ok(v)) return false;
    lo = eighths(v->lo + (v->hi - v->lo) * rng_unit(&g->r) * 0.6);
    hi = eighths(lo + (v->hi - lo) * rng_unit(&g->r) + 0.125);
    if (rng_chance(&g->r, 0.1)) { /* lo > hi: hi everywhere, as PyTorch */
        double t = lo;
        lo = hi + 0.25;
        hi = t;
    }
    if (result(g, OP_CLAMP, &x, 1, K_FLOAT, v->dtype, v->rank, v->dims, fmin(fmax(v->lo, lo), hi),
               fmin(fmax(v->hi, lo), hi), v->flags | F_DUP | F_SPECIAL, &o) < 0)
        return false;
    o->nf = 2;
    o->f[0] = lo;
    o->f[1] = hi;
    return true;
}

/* clamp with tensor bounds (tb_call_op: operands of one dtype, broadcasting) */
static bool gen_clamp_t(graph *g) {
    int x = pick(g, NORMAL), lo, hi, args[3];
    const gval *vx, *vl, *vh;
    int32_t r1, r2;
    int64_t d1[TB_MAX_RANK], d2[TB_MAX_RANK];
    gop *o;
    if (x < 0) return false;
    lo = pick_partner(g, &g->v[x], NORMAL, g->v[x].dtype);
    if (lo < 0) return false;
    hi = pick_partner(g, &g->v[x], NORMAL, g->v[x].dtype);
    if (hi < 0) return false;
    vx = &g->v[x];
    vl = &g->v[lo];
    vh = &g->v[hi];
    if (vl->dtype != vx->dtype || vh->dtype != vx->dtype) return false;
    if (!cross_ok(vx, vl) || !cross_ok(vx, vh) || !cross_ok(vl, vh)) return false;
    if (!bcast(vx->rank, vx->dims, vl->rank, vl->dims, &r1, d1) ||
        !bcast(r1, d1, vh->rank, vh->dims, &r2, d2))
        return false;
    args[0] = x;
    args[1] = lo;
    args[2] = hi;
    return result(g, OP_CLAMP_T, args, 3, K_FLOAT, vx->dtype, r2, d2,
                  fmin(fmax(vx->lo, vl->lo), vh->lo), fmin(fmax(vx->hi, vl->hi), vh->hi),
                  vx->flags | vl->flags | vh->flags | F_DUP | F_SPECIAL, &o) >= 0;
}

/* axes for a reduction: all (none listed) or a random subset, some written from the end */
static void random_axes(graph *g, const gval *v, gop *o, int64_t *count, int32_t *rank,
                        int64_t *dims) {
    int32_t i, n = 0, r = 0;
    bool keep = rng_chance(&g->r, 0.4), red[TB_MAX_RANK];
    memset(red, 0, sizeof red);
    if (v->rank == 0 || rng_chance(&g->r, 0.25)) {
        for (i = 0; i < v->rank; i++)
            red[i] = true;
    } else {
        while (n == 0) {
            for (i = 0; i < v->rank; i++)
                if ((red[i] = rng_chance(&g->r, 0.45))) n++;
        }
    }
    o->ints[0] = keep;
    o->ints[1] = n;
    n = 0;
    for (i = 0; i < v->rank; i++)
        if (red[i] && o->ints[1] > 0) o->ints[2 + n++] = random_axis(&g->r, v->rank, i);
    for (i = 0; i + 1 < n; i++) { /* in a random order */
        int32_t j = i + rng_int(&g->r, n - i);
        int64_t t = o->ints[2 + i];
        o->ints[2 + i] = o->ints[2 + j];
        o->ints[2 + j] = t;
    }
    o->nints = 2 + n;
    *count = 1;
    for (i = 0; i < v->rank; i++) {
        if (red[i]) {
            *count *= v->dims[i];
            if (keep) dims[r++] = 1;
        } else {
            dims[r++] = v->dims[i];
        }
    }
    *rank = r;
}

static bool gen_reduce(graph *g, int code) {
    int x = pick(g, NORMAL), out;
    gval *v;
    gop tmp, *o;
    int64_t count, dims[TB_MAX_RANK];
    int32_t rank;
    double lo, hi;
    unsigned fl;
    if (x < 0) return false;
    v = &g->v[x];
    memset(&tmp, 0, sizeof tmp);
    random_axes(g, v, &tmp, &count, &rank, dims);
    fl = v->flags;
    switch (code) {
    case OP_SUM:
        lo = v->lo * (double)count;
        hi = v->hi * (double)count;
        fl = inexact_flags(fl);
        break;
    case OP_MEAN:
        lo = v->lo;
        hi = v->hi;
        fl = inexact_flags(fl);
        break;
    case OP_MAX:
    case OP_MIN:
        if (!kink_ok(v)) return false;
        lo = v->lo;
        hi = v->hi;
        break;
    case OP_PROD:
        hi = pow(mag(v), (double)count);
        lo = v->lo >= 0 ? pow(v->lo, (double)count) : -hi;
        if (v->lo >= 0) hi = pow(v->hi, (double)count);
        fl = inexact_flags(fl);
        break;
    default:
        return false;
    }
    if (is_lowp(g, v->dtype) && code != OP_MAX && code != OP_MIN) return false;
    out = result(g, code, &x, 1, K_FLOAT, v->dtype, rank, dims, lo, hi, fl, &o);
    if (out < 0) return false;
    memcpy(o->ints, tmp.ints, sizeof tmp.ints);
    o->nints = tmp.nints;
    return true;
}

static bool gen_matmul(graph *g) {
    int a = pick(g, NORMAL), b, args[2];
    gval *va;
    int32_t ra, rb = 0, i, orank = 0, nb;
    int64_t bd[TB_MAX_RANK], od[TB_MAX_RANK], k, n, m = 1 + rng_int(&g->r, 4);
    gop *o;
    if (a < 0) return false;
    va = &g->v[a];
    ra = va->rank;
    if (ra == 0 || is_lowp(g, va->dtype) || ra > 4) return false;
    k = va->dims[ra - 1];
    n = ra >= 2 ? va->dims[ra - 2] : 1;
    if (ra >= 2 && rng_chance(&g->r, 0.2)) {
        /* a @ a^T through a transpose */
        int t;
        gop *to;
        t = result(g, OP_TRANSPOSE, &a, 1, K_FLOAT, va->dtype, ra, va->dims, va->lo, va->hi,
                   va->flags, &to);
        if (t < 0) return false;
        to->nints = 2;
        to->ints[0] = random_axis(&g->r, ra, ra - 2);
        to->ints[1] = random_axis(&g->r, ra, ra - 1);
        g->v[t].dims[ra - 2] = va->dims[ra - 1];
        g->v[t].dims[ra - 1] = va->dims[ra - 2];
        b = t;
        rb = ra;
        memcpy(bd, g->v[t].dims, sizeof bd);
        m = n;
    } else {
        switch (rng_int(&g->r, 4)) {
        case 0: /* a vector */
            rb = 1;
            bd[0] = k;
            break;
        case 1: /* a matrix */
            rb = 2;
            bd[0] = k;
            bd[1] = m;
            break;
        default: { /* batched, broadcasting a's batch dims (or adding one) */
            int32_t na = ra > 2 ? ra - 2 : 0;
            if (na + 3 <= MAX_RANK && (na == 0 || rng_chance(&g->r, 0.3))) {
                rb = na + 3;
                for (i = 0; i < rb - 2; i++)
                    bd[i] = i < rb - 2 - na ? 1 + rng_int(&g->r, 3) : va->dims[i - (rb - 2 - na)];
            } else {
                rb = na + 2;
                for (i = 0; i < na; i++)
                    bd[i] = rng_chance(&g->r, 0.4) ? 1 : va->dims[i];
            }
            bd[rb - 2] = k;
            bd[rb - 1] = m;
            break;
        }
        }
        if (numel_of(rb, bd) > MAX_LEAF) return false;
        b = new_input(g, va->dtype, rb, bd, NORMAL);
        if (b < 0) return false;
    }
    va = &g->v[a];
    /* the result's dims, as tb_matmul (and torch.matmul) give them */
    {
        int32_t ba = ra > 2 ? ra - 2 : 0, bb = rb > 2 ? rb - 2 : 0;
        int64_t batch[TB_MAX_RANK];
        if (!bcast(ba, va->dims, bb, bd, &nb, batch)) return false;
        for (i = 0; i < nb; i++)
            od[orank++] = batch[i];
        if (ra >= 2) od[orank++] = n;
        if (rb >= 2) od[orank++] = m;
    }
    args[0] = a;
    args[1] = b;
    if (rng_chance(&g->r, 0.3) && rb == ra && ra == 2 && b != a) { /* b @ a when it fits */
        if (bd[1] == va->dims[0]) {
            args[0] = b;
            args[1] = a;
            orank = 2;
            od[0] = bd[0];
            od[1] = va->dims[1];
        }
    }
    {
        double bound = (double)k * mag(va) * mag(&g->v[b]);
        return result(g, OP_MATMUL, args, 2, K_FLOAT, va->dtype, orank, od, -bound, bound,
                      inexact_flags(va->flags | g->v[b].flags), &o) >= 0;
    }
}

static bool gen_softmax(graph *g, int code) {
    int x = pick(g, NORMAL);
    gval *v;
    int32_t axis;
    int64_t n;
    double lo, hi;
    gop *o;
    if (x < 0) return false;
    v = &g->v[x];
    if (is_lowp(g, v->dtype)) return false;
    axis = v->rank > 0 ? rng_int(&g->r, v->rank) : 0;
    n = v->rank > 0 ? v->dims[axis] : 1;
    if (code == OP_SOFTMAX) {
        lo = exp(v->lo - v->hi) / (double)n;
        hi = 1;
    } else {
        lo = v->lo - v->hi - log((double)n);
        hi = 0;
    }
    if (result(g, code, &x, 1, K_FLOAT, v->dtype, v->rank, v->dims, lo, hi, inexact_flags(v->flags),
               &o) < 0)
        return false;
    o->nints = 1;
    o->ints[0] = v->rank > 0 ? random_axis(&g->r, v->rank, axis) : rng_int(&g->r, 2) - 1;
    return true;
}

static bool gen_layer_norm(graph *g) {
    static const double eps[3] = {1e-5, 1e-3, 0.1};
    int x = pick(g, NORMAL), args[3], n = 1, w = -1, b = -1;
    gval *v;
    int32_t nd;
    double mw = 1, mb = 0, bound;
    unsigned fl;
    bool constant;
    gop *o;
    if (x < 0) return false;
    v = &g->v[x];
    if (v->rank == 0 || is_lowp(g, v->dtype)) return false;
    nd = 1 + rng_int(&g->r, v->rank < 3 ? v->rank : 3);
    /* a row of equal elements normalises the rounding noise of x - mean by 1 / sqrt(eps): too
       much for f32; in f64 the noise stays small but sits on 0, a kink */
    constant = (v->flags & F_DUP) || numel_of(nd, v->dims + v->rank - nd) < 2;
    if (g->dtype == TB_F32 && constant) return false;
    fl = v->flags | (constant ? F_DUP | F_SPECIAL : 0);
    args[0] = x;
    if (rng_chance(&g->r, 0.7)) {
        w = new_input(g, v->dtype, nd, v->dims + v->rank - nd, NORMAL);
        if (w < 0) return false;
        args[n++] = w;
        fl |= g->v[w].flags;
        mw = 2;
    }
    if (rng_chance(&g->r, 0.7)) {
        b = new_input(g, v->dtype, nd, v->dims + v->rank - nd, NORMAL);
        if (b < 0) return false;
        args[n++] = b;
        fl |= g->v[b].flags;
        mb = 2;
    }
    v = &g->v[x];
    bound = sqrt((double)numel_of(nd, v->dims + v->rank - nd)) * mw + mb;
    if (result(g, OP_LAYER_NORM, args, n, K_FLOAT, v->dtype, v->rank, v->dims, -bound, bound,
               inexact_flags(fl), &o) < 0)
        return false;
    o->nints = 3;
    o->ints[0] = nd;
    o->ints[1] = w >= 0;
    o->ints[2] = b >= 0;
    o->nf = 1;
    /* eps 1e-5 only in f64: f32 rounding noise grows as 1 / sqrt(var + eps) */
    o->f[0] = eps[g->dtype == TB_F32 ? 1 + rng_int(&g->r, 2) : rng_int(&g->r, 3)];
    return true;
}

/* ---- views ---- */

static bool gen_reshape(graph *g) {
    int x = pick(g, NORMAL);
    gval *v;
    int64_t n, dims[TB_MAX_RANK], left, f;
    int32_t rank, i;
    gop *o;
    if (x < 0) return false;
    v = &g->v[x];
    n = vnumel(v);
    rank = rng_int(&g->r, 5);
    if (rank == 0 && n != 1) rank = 1;
    for (i = 0; i < rank; i++)
        dims[i] = 1;
    /* deal n's prime factors out to random dims */
    left = n;
    for (f = 2; left > 1 && rank > 0;) {
        if (left % f == 0) {
            dims[rng_int(&g->r, rank)] *= f;
            left /= f;
        } else {
            f++;
        }
    }
    if (result(g, OP_RESHAPE, &x, 1, K_FLOAT, v->dtype, rank, dims, v->lo, v->hi, v->flags, &o) < 0)
        return false;
    o->nints = rank;
    for (i = 0; i < rank; i++)
        o->ints[i] = dims[i];
    if (rank > 0 && rng_chance(&g->r, 0.3)) o->ints[rng_int(&g->r, rank)] = -1;
    return true;
}

static bool gen_permute(graph *g, int code) {
    int x = pick(g, NORMAL);
    gval *v;
    int64_t dims[TB_MAX_RANK];
    int32_t perm[TB_MAX_RANK], i, r;
    gop *o;
    if (x < 0) return false;
    v = &g->v[x];
    r = v->rank;
    if (r < 2) return false;
    for (i = 0; i < r; i++)
        perm[i] = i;
    if (code == OP_PERMUTE) {
        for (i = r - 1; i > 0; i--) {
            int32_t j = rng_int(&g->r, i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
    } else {
        int32_t a = rng_int(&g->r, r), b = rng_int(&g->r, r - 1), t;
        if (b >= a) b++;
        t = perm[a];
        perm[a] = perm[b];
        perm[b] = t;
        dims[0] = a;
        dims[1] = b;
    }
    {
        int64_t d0 = dims[0], d1 = dims[1], od[TB_MAX_RANK];
        for (i = 0; i < r; i++)
            od[i] = v->dims[perm[i]];
        if (result(g, code, &x, 1, K_FLOAT, v->dtype, r, od, v->lo, v->hi, v->flags, &o) < 0)
            return false;
        if (code == OP_PERMUTE) {
            o->nints = r;
            for (i = 0; i < r; i++)
                o->ints[i] = random_axis(&g->r, r, perm[i]);
        } else {
            o->nints = 2;
            o->ints[0] = random_axis(&g->r, r, (int32_t)d0);
            o->ints[1] = random_axis(&g->r, r, (int32_t)d1);
        }
    }
    return true;
}

static bool gen_expand(graph *g) {
    int x = pick(g, NORMAL);
    gval *v;
    int64_t dims[TB_MAX_RANK], arg[TB_MAX_RANK];
    int32_t r, lead, i;
    bool grew = false;
    gop *o;
    if (x < 0) return false;
    v = &g->v[x];
    lead = rng_int(&g->r, 3);
    if (v->rank + lead > MAX_RANK) lead = MAX_RANK - v->rank;
    r = v->rank + lead;
    for (i = 0; i < lead; i++) {
        dims[i] = arg[i] = 1 + rng_int(&g->r, 3);
        grew = grew || dims[i] > 1;
    }
    for (i = 0; i < v->rank; i++) {
        int64_t d = v->dims[i];
        if (d == 1 && rng_chance(&g->r, 0.7)) d = 2 + rng_int(&g->r, 3);
        dims[lead + i] = d;
        arg[lead + i] = d == v->dims[i] && rng_chance(&g->r, 0.4) ? -1 : d;
        grew = grew || d != v->dims[i];
    }
    if (result(g, OP_EXPAND, &x, 1, K_FLOAT, v->dtype, r, dims, v->lo, v->hi,
               v->flags | (grew ? F_DUP : 0), &o) < 0)
        return false;
    o->nints = r;
    for (i = 0; i < r; i++)
        o->ints[i] = arg[i];
    return true;
}

static bool gen_squeeze(graph *g, int code) {
    int x = pick(g, NORMAL);
    gval *v;
    int64_t dims[TB_MAX_RANK];
    int32_t ones[TB_MAX_RANK], n = 0, i, r, d;
    gop *o;
    if (x < 0) return false;
    v = &g->v[x];
    r = v->rank;
    if (code == OP_SQUEEZE) {
        for (i = 0; i < r; i++)
            if (v->dims[i] == 1) ones[n++] = i;
        if (n == 0) return false;
        d = ones[rng_int(&g->r, n)];
        for (i = 0; i < r - 1; i++)
            dims[i] = v->dims[i < d ? i : i + 1];
        r--;
    } else {
        if (r >= MAX_RANK) return false;
        d = rng_int(&g->r, r + 1);
        for (i = 0; i <= r; i++)
            dims[i] = i < d ? v->dims[i] : i == d ? 1 : v->dims[i - 1];
        r++;
    }
    if (result(g, code, &x, 1, K_FLOAT, v->dtype, r, dims, v->lo, v->hi, v->flags, &o) < 0)
        return false;
    o->nints = 1;
    o->ints[0] = random_axis(&g->r, code == OP_SQUEEZE ? r + 1 : r, d);
    return true;
}

static bool gen_slice(graph *g) {
    int x = pick(g, NORMAL);
    gval *v;
    int64_t dims[TB_MAX_RANK], n, start, end, step, s, e, len;
    int32_t d;
    gop *o;
    if (x < 0) return false;
    v = &g->v[x];
    if (v->rank == 0) return false;
    d = rng_int(&g->r, v->rank);
    n = v->dims[d];
    step = 1 + rng_int(&g->r, 3);
    start = rng_int(&g->r, (int)(2 * n + 3)) - n - 1;
    end = rng_chance(&g->r, 0.2) ? n + 5 : rng_int(&g->r, (int)(2 * n + 3)) - n - 1;
    /* Python's clamping */
    s = start < 0 ? (start + n < 0 ? 0 : start + n) : (start > n ? n : start);
    e = end < 0 ? (end + n < 0 ? 0 : end + n) : (end > n ? n : end);
    len = e > s ? (e - s + step - 1) / step : 0;
    if (len < 1) return false;
    memcpy(dims, v->dims, sizeof dims);
    dims[d] = len;
    if (result(g, OP_SLICE, &x, 1, K_FLOAT, v->dtype, v->rank, dims, v->lo, v->hi, v->flags, &o) <
        0)
        return false;
    o->nints = 4;
    o->ints[0] = random_axis(&g->r, v->rank, d);
    o->ints[1] = start;
    o->ints[2] = end;
    o->ints[3] = step;
    return true;
}

static bool gen_flip(graph *g) {
    int x = pick(g, NORMAL);
    gval *v;
    int32_t i, n = 0;
    gop *o;
    int64_t axes[TB_MAX_RANK];
    if (x < 0) return false;
    v = &g->v[x];
    if (v->rank == 0) return false;
    while (n == 0)
        for (i = 0; i < v->rank; i++)
            if (rng_chance(&g->r, 0.5)) axes[n++] = random_axis(&g->r, v->rank, i);
    if (result(g, OP_FLIP, &x, 1, K_FLOAT, v->dtype, v->rank, v->dims, v->lo, v->hi, v->flags, &o) <
        0)
        return false;
    o->nints = n;
    memcpy(o->ints, axes, (size_t)n * sizeof(int64_t));
    return true;
}

/* ---- copies ---- */

static bool gen_concat(graph *g) {
    int x = pick(g, NORMAL), args[3], n = 1, i, j;
    gval *v;
    int32_t d;
    int64_t dims[TB_MAX_RANK];
    double lo, hi;
    unsigned fl;
    uint64_t seen;
    tb_dtype dt;
    gop *o;
    bool shared = false;
    if (x < 0) return false;
    v = &g->v[x];
    if (v->rank == 0) return false;
    d = rng_int(&g->r, v->rank);
    args[0] = x;
    memcpy(dims, v->dims, sizeof dims);
    for (i = 1 + rng_int(&g->r, 2); i > 0; i--) {
        int y = -1;
        if (rng_chance(&g->r, 0.2)) {
            y = x;
        } else if (rng_chance(&g->r, 0.3)) { /* an earlier value that fits */
            int cands[MAX_VALS], nc = 0, k;
            for (k = 0; k < g->nvals; k++) {
                const gval *c = &g->v[k];
                bool ok = c->kind == K_FLOAT && c->rank == v->rank;
                for (j = 0; ok && j < v->rank; j++)
                    ok = j == d || c->dims[j] == v->dims[j];
                if (ok) cands[nc++] = k;
            }
            if (nc > 0) y = cands[rng_int(&g->r, nc)];
        }
        if (y < 0) {
            int64_t nd[TB_MAX_RANK];
            memcpy(nd, g->v[x].dims, sizeof nd);
            nd[d] = 1 + rng_int(&g->r, 3);
            if (numel_of(g->v[x].rank, nd) > MAX_LEAF) return false;
            y = new_input(g, rng_chance(&g->r, 0.8) ? g->v[x].dtype : input_dtype(g), g->v[x].rank,
                          nd, NORMAL);
            if (y < 0) return false;
        }
        args[n++] = y;
        dims[d] += g->v[y].dims[d];
    }
    v = &g->v[x];
    lo = v->lo;
    hi = v->hi;
    fl = 0;
    seen = 0;
    dt = v->dtype;
    for (i = 0; i < n; i++) {
        const gval *a = &g->v[args[i]];
        lo = fmin(lo, a->lo);
        hi = fmax(hi, a->hi);
        fl |= a->flags;
        if (a->leaves & seen) shared = true;
        seen |= a->leaves;
        dt = wider(dt, a->dtype);
    }
    if (result(g, OP_CONCAT, args, n, K_FLOAT, dt, v->rank, dims, lo, hi, fl | (shared ? F_DUP : 0),
               &o) < 0)
        return false;
    o->nints = 1;
    o->ints[0] = random_axis(&g->r, v->rank, d);
    return true;
}

static bool gen_pad(graph *g) {
    static const double values[4] = {0.0, 0.5, -1.25, 2.0};
    int x = pick(g, NORMAL);
    gval *v;
    int32_t k, i;
    int64_t dims[TB_MAX_RANK], pads[2 * TB_MAX_RANK];
    double value = values[rng_int(&g->r, 4)];
    gop *o;
    if (x < 0) return false;
    v = &g->v[x];
    if (v->rank == 0) return false;
    k = 1 + rng_int(&g->r, v->rank < 3 ? v->rank : 3);
    memcpy(dims, v->dims, sizeof dims);
    for (i = 0; i < 2 * k; i++) {
        pads[i] = rng_int(&g->r, 3);
        dims[v->rank - 1 - i / 2] += pads[i];
    }
    if (result(g, OP_PAD, &x, 1, K_FLOAT, v->dtype, v->rank, dims, fmin(v->lo, value),
               fmax(v->hi, value), v->flags | F_DUP | F_SPECIAL, &o) < 0)
        return false;
    o->nints = 2 * k;
    memcpy(o->ints, pads, (size_t)(2 * k) * sizeof(int64_t));
    o->nf = 1;
    o->f[0] = value;
    return true;
}

/* An index for gather/scatter_add on x along d: an input of x's rank with dims[e] <= x's for
   e != d, or (gather only) argmax/argmin of x along d with keepdim. */
static int gen_gather_index(graph *g, int x, int32_t d, bool allow_arg) {
    const gval *v = &g->v[x];
    int64_t dims[TB_MAX_RANK];
    int32_t i;
    gop *o;
    if (allow_arg && v->rank > 0 && rng_chance(&g->r, 0.5) && kink_ok(v)) {
        int id;
        memcpy(dims, v->dims, sizeof dims);
        dims[d] = 1;
        id = result(g, rng_chance(&g->r, 0.5) ? OP_ARGMAX : OP_ARGMIN, &x, 1, K_INDEX, TB_I64,
                    v->rank, dims, 0, (double)v->dims[d], 0, &o);
        if (id < 0) return -1;
        o->nints = 2;
        o->ints[0] = random_axis(&g->r, v->rank, d);
        o->ints[1] = 1;
        return id;
    }
    for (i = 0; i < v->rank; i++)
        dims[i] = i == d ? 1 + rng_int(&g->r, 4) : 1 + rng_int(&g->r, (int)v->dims[i]);
    if (numel_of(v->rank, dims) > MAX_LEAF) return -1;
    return new_aux_input(g, K_INDEX, v->rank, dims, v->rank > 0 ? v->dims[d] : 1);
}

static bool gen_gather(graph *g, int code) {
    int x = pick(g, NORMAL), idx, args[3], n = 2;
    const gval *v;
    int32_t d, rank;
    int64_t dims[TB_MAX_RANK];
    double lo, hi;
    unsigned fl;
    gop *o;
    if (x < 0) return false;
    v = &g->v[x];
    if (code != OP_GATHER && code != OP_INDEX_SELECT && v->rank == 0) return false;
    d = v->rank > 0 ? rng_int(&g->r, v->rank) : 0;
    if (code == OP_GATHER || code == OP_SCATTER_ADD) {
        idx = gen_gather_index(g, x, d, code == OP_GATHER);
    } else {
        int64_t len = 1 + rng_int(&g->r, 5);
        if (v->rank == 0) len = 1;
        idx = new_aux_input(g, K_INDEX, 1, &len, v->rank > 0 ? v->dims[d] : 1);
        if (v->rank == 0 && rng_chance(&g->r, 0.5)) g->v[idx].rank = 0;
    }
    if (idx < 0) return false;
    v = &g->v[x];
    args[0] = x;
    args[1] = idx;
    lo = v->lo;
    hi = v->hi;
    fl = v->flags | F_DUP;
    rank = v->rank;
    memcpy(dims, v->dims, sizeof dims);
    if (code == OP_GATHER) {
        rank = g->v[idx].rank;
        memcpy(dims, g->v[idx].dims, sizeof dims);
    } else if (code == OP_INDEX_SELECT) {
        if (rank > 0) dims[d] = g->v[idx].dims[0];
    } else {
        /* src: of index's dims (scatter_add) or x's with dims[d] = index's length (index_add) */
        int64_t sd[TB_MAX_RANK];
        int src = -1, k, j;
        int32_t sr = v->rank;
        double cnt;
        memcpy(sd, code == OP_SCATTER_ADD ? g->v[idx].dims : v->dims, sizeof sd);
        if (code == OP_INDEX_ADD) sd[d] = g->v[idx].dims[0];
        if (rng_chance(&g->r, 0.3)) {
            for (k = 0; k < g->nvals && src < 0; k++) {
                const gval *c = &g->v[k];
                bool ok = c->kind == K_FLOAT && c->rank == sr && c->dtype == v->dtype && k != x;
                for (j = 0; ok && j < sr; j++)
                    ok = c->dims[j] == sd[j];
                if (ok) src = k;
            }
        }
        if (src < 0 && numel_of(sr, sd) > MAX_LEAF) return false;
        if (src < 0) src = new_input(g, v->dtype, sr, sd, NORMAL);
        if (src < 0) return false;
        v = &g->v[x];
        args[n++] = src;
        cnt = (double)(code == OP_SCATTER_ADD ? g->v[idx].dims[d] : g->v[idx].dims[0]);
        lo = v->lo + cnt * fmin(0, g->v[src].lo);
        hi = v->hi + cnt * fmax(0, g->v[src].hi);
        fl = inexact_flags(v->flags | g->v[src].flags);
        if (is_lowp(g, v->dtype)) return false;
    }
    if (result(g, code, args, n, K_FLOAT, v->dtype, rank, dims, lo, hi, fl, &o) < 0) return false;
    o->nints = 1;
    o->ints[0] = random_axis(&g->r, v->rank, d);
    return true;
}

/* ---- losses ---- */

static bool gen_loss(graph *g, int code) {
    int x = pick(g, NORMAL), t, args[2];
    gval *v;
    int32_t red = rng_int(&g->r, 3), rank = 0, i, cax;
    int64_t dims[TB_MAX_RANK], cnt, c;
    double lo, hi, smooth = 0;
    bool probs = false;
    gop *o;
    if (x < 0) return false;
    v = &g->v[x];
    if (is_lowp(g, v->dtype)) return false;
    if (code == OP_MSE_LOSS) {
        t = pick_partner(g, v, NORMAL, v->dtype);
        if (t < 0) return false;
        v = &g->v[x];
        if (g->v[t].rank != v->rank || vnumel(&g->v[t]) != vnumel(v) ||
            memcmp(g->v[t].dims, v->dims, (size_t)v->rank * sizeof(int64_t)) != 0) {
            t = new_input(g, v->dtype, v->rank, v->dims, NORMAL);
            if (t < 0) return false;
            v = &g->v[x];
        }
        cnt = vnumel(v);
        hi = (mag(v) + mag(&g->v[t])) * (mag(v) + mag(&g->v[t]));
        if (red == TB_REDUCTION_SUM) hi *= (double)cnt;
        rank = red == TB_REDUCTION_NONE ? v->rank : 0;
        memcpy(dims, v->dims, sizeof dims);
        args[0] = x;
        args[1] = t;
        if (result(g, code, args, 2, K_FLOAT, v->dtype, rank, dims, 0, hi,
                   inexact_flags(v->flags | g->v[t].flags), &o) < 0)
            return false;
        o->nints = 1;
        o->ints[0] = red;
        return true;
    }
    /* logits [C] or [N, C, d...]: the class axis is 1 (0 for rank 1) */
    if (v->rank == 0 || v->rank > 3) return false;
    cax = v->rank == 1 ? 0 : 1;
    c = v->dims[cax];
    for (i = 0; i < v->rank; i++)
        if (i != cax) dims[rank++] = v->dims[i];
    probs = code == OP_CROSS_ENTROPY && rng_chance(&g->r, 0.4);
    if (probs) {
        t = new_input(g, v->dtype, v->rank, v->dims, POSITIVE);
    } else {
        t = new_aux_input(g, K_INDEX, rank, dims, c);
    }
    if (t < 0) return false;
    v = &g->v[x];
    cnt = numel_of(rank, dims);
    if (code == OP_CROSS_ENTROPY) {
        double l = v->hi - v->lo + log((double)c);
        smooth = rng_chance(&g->r, 0.5) ? 0.0 : 0.25;
        lo = 0;
        hi = probs ? (double)c * 2 * l : l;
    } else {
        lo = -v->hi;
        hi = -v->lo;
    }
    if (red == TB_REDUCTION_SUM) {
        lo = fmin(lo * (double)cnt, lo);
        hi = fmax(hi * (double)cnt, hi);
    }
    if (red != TB_REDUCTION_NONE) rank = 0;
    args[0] = x;
    args[1] = t;
    if (result(g, code, args, 2, K_FLOAT, v->dtype, rank, dims, lo, hi,
               inexact_flags(v->flags | g->v[t].flags), &o) < 0)
        return false;
    o->nints = 1;
    o->ints[0] = red;
    if (code == OP_CROSS_ENTROPY) {
        o->nf = 1;
        o->f[0] = smooth;
    }
    return true;
}

static bool gen_op(graph *g, int code) {
    switch (code) {
    case OP_NEG:
    case OP_ABS:
    case OP_EXP:
    case OP_LOG:
    case OP_SQRT:
    case OP_RSQRT:
    case OP_SIN:
    case OP_COS:
    case OP_TANH:
    case OP_SIGMOID:
    case OP_RELU:
    case OP_GELU:
    case OP_SILU:
    case OP_SOFTPLUS:
    case OP_MISH:
    case OP_RECIPROCAL:
    case OP_FLOOR:
    case OP_CEIL:
    case OP_ROUND:
    case OP_SIGN:
    case OP_ERF:
    case OP_DETACH:
        return gen_unary(g, code);
    case OP_CAST:
        return gen_cast(g);
    case OP_ADD:
    case OP_SUB:
    case OP_MUL:
    case OP_DIV:
    case OP_POW:
    case OP_MAXIMUM:
    case OP_MINIMUM:
        return gen_binary(g, code);
    case OP_ADD_S:
    case OP_SUB_S:
    case OP_MUL_S:
    case OP_DIV_S:
    case OP_POW_S:
        return gen_scalar(g, code);
    case OP_WHERE:
        return gen_where(g);
    case OP_CLAMP:
        return gen_clamp(g);
    case OP_CLAMP_T:
        return gen_clamp_t(g);
    case OP_SUM:
    case OP_MEAN:
    case OP_MAX:
    case OP_MIN:
    case OP_PROD:
        return gen_reduce(g, code);
    case OP_MATMUL:
        return gen_matmul(g);
    case OP_SOFTMAX:
    case OP_LOG_SOFTMAX:
        return gen_softmax(g, code);
    case OP_LAYER_NORM:
        return gen_layer_norm(g);
    case OP_RESHAPE:
        return gen_reshape(g);
    case OP_PERMUTE:
    case OP_TRANSPOSE:
        return gen_permute(g, code);
    case OP_EXPAND:
        return gen_expand(g);
    case OP_SQUEEZE:
    case OP_UNSQUEEZE:
        return gen_squeeze(g, code);
    case OP_SLICE:
        return gen_slice(g);
    case OP_FLIP:
        return gen_flip(g);
    case OP_CONCAT:
        return gen_concat(g);
    case OP_PAD:
        return gen_pad(g);
    case OP_GATHER:
    case OP_INDEX_SELECT:
    case OP_SCATTER_ADD:
    case OP_INDEX_ADD:
        return gen_gather(g, code);
    case OP_CROSS_ENTROPY:
    case OP_NLL_LOSS:
    case OP_MSE_LOSS:
        return gen_loss(g, code);
    default:
        return false;
    }
}

static int g_main_ops[OP_COUNT], g_num_main, g_draw[4 * OP_COUNT], g_num_draw;

static void graph_free(graph *g) {
    int i;
    for (i = 0; i < g->nvals; i++) {
        free(g->v[i].data);
        g->v[i].data = NULL;
    }
    g->nvals = 0;
    g->nops = 0;
}

/* Undoes what a failed generator added. */
static void rollback(graph *g, int nvals, int nops, const int *uses) {
    int i;
    for (i = nvals; i < g->nvals; i++)
        free(g->v[i].data);
    g->nvals = nvals;
    g->nops = nops;
    for (i = 0; i < nvals; i++)
        g->v[i].uses = uses[i];
}

/* out = out + sum(d) (d cast to f64 first where it is f32 inside an f64 graph) */
static void fold_into_out(graph *g, int d) {
    int args[2], nv = g->nvals, no = g->nops, uses[MAX_VALS], k, sum, out;
    const gval *v;
    double lo, hi;
    gop *o;
    for (k = 0; k < nv; k++)
        uses[k] = g->v[k].uses;
    if (g->nvals + 3 > MAX_VALS || g->nops + 3 > MAX_GOPS) return;
    v = &g->v[d];
    if (is_lowp(g, v->dtype)) {
        d = result(g, OP_CAST, &d, 1, K_FLOAT, TB_F64, v->rank, v->dims, v->lo, v->hi, v->flags,
                   &o);
        if (d < 0) goto undo;
        o->nints = 1;
        o->ints[0] = 0;
        v = &g->v[d];
    }
    lo = v->lo * (double)vnumel(v);
    hi = v->hi * (double)vnumel(v);
    sum = result(g, OP_SUM, &d, 1, K_FLOAT, v->dtype, 0, v->dims, lo, hi, inexact_flags(v->flags),
                 &o);
    if (sum < 0) goto undo;
    o->nints = 2;
    o->ints[0] = 0;
    o->ints[1] = 0;
    args[0] = g->out;
    args[1] = sum;
    v = &g->v[g->out];
    out = result(g, OP_ADD, args, 2, K_FLOAT, promote2(v, &g->v[sum]), v->rank, v->dims, v->lo + lo,
                 v->hi + hi, v->flags | g->v[sum].flags, &o);
    if (out < 0) goto undo;
    g->out = out;
    return;
undo:
    rollback(g, nv, no, uses);
}

static void graph_generate(graph *g) {
    int target, focus_at, made = 0, tries = 0, focus_tries = 0, i;
    bool focus_done = false;
    int uses[MAX_VALS];
    g->r.s = g->seed;
    g->nvals = 0;
    g->nops = 0;
    target = 3 + rng_int(&g->r, 10);
    focus_at = rng_int(&g->r, target);
    while (made < target && tries < 2000) {
        int code = g_draw[rng_int(&g->r, g_num_draw)], nv = g->nvals, no = g->nops;
        g->fresh = false;
        if (!focus_done && (made >= focus_at || tries > 200)) {
            code = g->focus;
            g->fresh = focus_tries++ >= 10;
        }
        tries++;
        for (i = 0; i < nv; i++)
            uses[i] = g->v[i].uses;
        if (g->nvals >= MAX_VALS - 8 || g->nops >= MAX_GOPS - 4) break;
        if (gen_op(g, code)) {
            made++;
            if (code == g->focus) focus_done = true;
        } else {
            rollback(g, nv, no, uses);
        }
    }
    if (!focus_done)
        fail_msg("%s graph %d (seed %llu): no %s could be generated", tb_dtype_name(g->dtype),
                 g->index, (unsigned long long)g->seed, g_op_names[g->focus]);
    g->fresh = false;
    /* the output: the last float result, plus the sums of the other results nothing uses */
    g->out = -1;
    for (i = g->nvals - 1; i >= 0 && g->out < 0; i--)
        if (g->v[i].kind == K_FLOAT && g->v[i].op >= 0) g->out = i;
    assert_true(g->out >= 0);
    for (i = 0; i < g->nvals; i++) {
        if (g->v[i].kind == K_FLOAT && g->v[i].op >= 0 && g->v[i].uses == 0 && i != g->out)
            fold_into_out(g, i);
    }
    g->nseed = (size_t)vnumel(&g->v[g->out]);
    for (i = 0; i < (int)g->nseed; i++) {
        double s = 2 * rng_unit(&g->r) - 1;
        g->seedv[i] = g->v[g->out].dtype == TB_F32 ? (double)(float)s : s;
    }
}

/* ---- text: for PyTorch and for messages ---- */

static void write_value_line(const graph *g, int id, FILE *f) {
    const gval *v = &g->v[id];
    int i;
    if (v->op < 0) {
        int64_t n = vnumel(v), k;
        fprintf(f, "in %d %s %d", id, tb_dtype_name(v->dtype), (int)v->rank);
        for (i = 0; i < v->rank; i++)
            fprintf(f, " %lld", (long long)v->dims[i]);
        fprintf(f, " %lld", (long long)n);
        for (k = 0; k < n; k++)
            fprintf(f, " %.17g", v->data[k]);
    } else {
        const gop *o = &g->op[v->op];
        fprintf(f, "op %d %s %d", id, g_op_names[o->code], o->nargs);
        for (i = 0; i < o->nargs; i++)
            fprintf(f, " %d", o->args[i]);
        fprintf(f, " %d", o->nints);
        for (i = 0; i < o->nints; i++)
            fprintf(f, " %lld", (long long)o->ints[i]);
        fprintf(f, " %d", o->nf);
        for (i = 0; i < o->nf; i++)
            fprintf(f, " %.17g", o->f[i]);
    }
    fputc('\n', f);
}

static void graph_write(const graph *g, int key, FILE *f) {
    size_t i;
    int id;
    fprintf(f, "graph %d\n", key);
    for (id = 0; id < g->nvals; id++)
        write_value_line(g, id, f);
    fprintf(f, "out %d %zu", g->out, g->nseed);
    for (i = 0; i < g->nseed; i++)
        fprintf(f, " %.17g", g->seedv[i]);
    fprintf(f, "\nend\n");
}

static void shape_text(const gval *v, char *buf, size_t cap) {
    size_t at = (size_t)snprintf(buf, cap, "%s[", tb_dtype_name(v->dtype));
    int32_t i;
    for (i = 0; i < v->rank && at < cap; i++)
        at +=
            (size_t)snprintf(buf + at, cap - at, "%s%lld", i > 0 ? "," : "", (long long)v->dims[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* The op sequence, one line per value: "%3 = matmul(%1, %2) [7, 1] -> f64[2,1]". */
static void graph_describe(const graph *g, FILE *f) {
    int id, i;
    char s[96];
    for (id = 0; id < g->nvals; id++) {
        const gval *v = &g->v[id];
        shape_text(v, s, sizeof s);
        if (v->op < 0) {
            fprintf(f, "      %%%d = input %s%s\n", id, s,
                    v->kind == K_FLOAT && (v->flags & F_SPECIAL) ? " (ties)" : "");
            continue;
        }
        {
            const gop *o = &g->op[v->op];
            fprintf(f, "      %%%d = %s(", id, g_op_names[o->code]);
            for (i = 0; i < o->nargs; i++)
                fprintf(f, "%s%%%d", i > 0 ? ", " : "", o->args[i]);
            fprintf(f, ")");
            if (o->nints > 0) {
                fprintf(f, " ints [");
                for (i = 0; i < o->nints; i++)
                    fprintf(f, "%s%lld", i > 0 ? ", " : "", (long long)o->ints[i]);
                fprintf(f, "]");
            }
            for (i = 0; i < o->nf; i++)
                fprintf(f, "%s%.6g", i == 0 ? " floats " : ", ", o->f[i]);
            fprintf(f, " -> %s%s\n", s, id == g->out ? " (out)" : "");
        }
    }
}

/* ---- running a graph with the library ---- */

static tb_device g_cpu;

static tb_tensor *upload(const gval *v, const tb_device *dev) {
    tb_shape s;
    int64_t n = vnumel(v), i;
    size_t bytes;
    void *buf;
    tb_tensor *t;
    assert_int_equal(tb_shape_make(&s, v->dtype, v->rank, v->dims), TB_OK);
    assert_int_equal(tb_shape_nbytes(&s, &bytes), TB_OK);
    buf = malloc(bytes + 8);
    assert_non_null(buf);
    for (i = 0; i < n; i++) {
        switch (v->dtype) {
        case TB_F64:
            ((double *)buf)[i] = v->data[i];
            break;
        case TB_F32:
            ((float *)buf)[i] = (float)v->data[i];
            break;
        case TB_I64:
            ((int64_t *)buf)[i] = (int64_t)v->data[i];
            break;
        default:
            ((uint8_t *)buf)[i] = v->data[i] != 0;
            break;
        }
    }
    t = tb_tensor_from_host(buf, &s, dev);
    free(buf);
    return t;
}

static tb_tensor *run_op(const gop *o, tb_tensor *const *t) {
    tb_tensor *a = t[o->args[0]], *b = o->nargs > 1 ? t[o->args[1]] : NULL;
    tb_tensor *c = o->nargs > 2 ? t[o->args[2]] : NULL;
    int32_t i32[2 * TB_MAX_RANK + 2];
    int i;
    for (i = 0; i < o->nints; i++)
        i32[i] = (int32_t)o->ints[i];
    switch (o->code) {
    case OP_NEG:
        return tb_neg(a);
    case OP_ABS:
        return tb_abs(a);
    case OP_EXP:
        return tb_exp(a);
    case OP_LOG:
        return tb_log(a);
    case OP_SQRT:
        return tb_sqrt(a);
    case OP_RSQRT:
        return tb_rsqrt(a);
    case OP_SIN:
        return tb_sin(a);
    case OP_COS:
        return tb_cos(a);
    case OP_TANH:
        return tb_tanh(a);
    case OP_SIGMOID:
        return tb_sigmoid(a);
    case OP_RELU:
        return tb_relu(a);
    case OP_GELU:
        return tb_gelu(a);
    case OP_SILU:
        return tb_silu(a);
    case OP_SOFTPLUS:
        return tb_softplus(a);
    case OP_MISH:
        return tb_mish(a);
    case OP_RECIPROCAL:
        return tb_reciprocal(a);
    case OP_FLOOR:
        return tb_floor(a);
    case OP_CEIL:
        return tb_ceil(a);
    case OP_ROUND:
        return tb_round(a);
    case OP_SIGN:
        return tb_sign(a);
    case OP_ERF:
        return tb_erf(a);
    case OP_DETACH:
        return tb_detach(a);
    case OP_CAST:
        return tb_cast(a, o->ints[0] == 0 ? TB_F64 : TB_F32);
    case OP_ADD:
        return tb_add(a, b);
    case OP_SUB:
        return tb_sub(a, b);
    case OP_MUL:
        return tb_mul(a, b);
    case OP_DIV:
        return tb_div(a, b);
    case OP_POW:
        return tb_pow(a, b);
    case OP_MAXIMUM:
        return tb_maximum(a, b);
    case OP_MINIMUM:
        return tb_minimum(a, b);
    case OP_ADD_S:
        return tb_add_scalar(a, o->f[0]);
    case OP_SUB_S:
        return tb_sub_scalar(a, o->f[0]);
    case OP_MUL_S:
        return tb_mul_scalar(a, o->f[0]);
    case OP_DIV_S:
        return tb_div_scalar(a, o->f[0]);
    case OP_POW_S:
        return tb_pow_scalar(a, o->f[0]);
    case OP_LT:
        return tb_lt(a, b);
    case OP_LE:
        return tb_le(a, b);
    case OP_GT:
        return tb_gt(a, b);
    case OP_GE:
        return tb_ge(a, b);
    case OP_EQ:
        return tb_eq(a, b);
    case OP_NE:
        return tb_ne(a, b);
    case OP_LOGICAL_NOT:
        return tb_logical_not(a);
    case OP_LOGICAL_AND:
        return tb_logical_and(a, b);
    case OP_LOGICAL_OR:
        return tb_logical_or(a, b);
    case OP_WHERE:
        return tb_where(a, b, c);
    case OP_CLAMP:
        return tb_clamp(a, o->f[0], o->f[1]);
    case OP_CLAMP_T: {
        tb_tensor *in[3];
        in[0] = a;
        in[1] = b;
        in[2] = c;
        return tb_call_op(TB_OP_CLAMP, in, 3, NULL, 0);
    }
    case OP_SUM:
        return tb_sum(a, i32 + 2, (size_t)o->ints[1], o->ints[0] != 0);
    case OP_MEAN:
        return tb_mean(a, i32 + 2, (size_t)o->ints[1], o->ints[0] != 0);
    case OP_MAX:
        return tb_max(a, i32 + 2, (size_t)o->ints[1], o->ints[0] != 0);
    case OP_MIN:
        return tb_min(a, i32 + 2, (size_t)o->ints[1], o->ints[0] != 0);
    case OP_PROD:
        return tb_prod(a, i32 + 2, (size_t)o->ints[1], o->ints[0] != 0);
    case OP_ARGMAX:
        return tb_argmax(a, i32[0], o->ints[1] != 0);
    case OP_ARGMIN:
        return tb_argmin(a, i32[0], o->ints[1] != 0);
    case OP_MATMUL:
        return tb_matmul(a, b);
    case OP_SOFTMAX:
        return tb_softmax(a, i32[0]);
    case OP_LOG_SOFTMAX:
        return tb_log_softmax(a, i32[0]);
    case OP_LAYER_NORM: {
        tb_tensor *w = o->ints[1] ? t[o->args[1]] : NULL;
        tb_tensor *bias = o->ints[2] ? t[o->args[1 + (o->ints[1] != 0)]] : NULL;
        return tb_layer_norm(a, i32[0], w, bias, o->f[0]);
    }
    case OP_RESHAPE:
        return tb_reshape(a, o->ints, o->nints);
    case OP_PERMUTE:
        return tb_permute(a, i32, o->nints);
    case OP_TRANSPOSE:
        return tb_transpose(a, i32[0], i32[1]);
    case OP_EXPAND:
        return tb_expand(a, o->ints, o->nints);
    case OP_SQUEEZE:
        return tb_squeeze(a, i32[0]);
    case OP_UNSQUEEZE:
        return tb_unsqueeze(a, i32[0]);
    case OP_SLICE:
        return tb_slice(a, i32[0], o->ints[1], o->ints[2], o->ints[3]);
    case OP_FLIP:
        return tb_flip(a, i32, (size_t)o->nints);
    case OP_CONCAT: {
        tb_tensor *in[4];
        for (i = 0; i < o->nargs; i++)
            in[i] = t[o->args[i]];
        return tb_concat(in, (size_t)o->nargs, i32[0]);
    }
    case OP_PAD:
        return tb_pad(a, o->ints, (size_t)o->nints, o->f[0]);
    case OP_GATHER:
        return tb_gather(a, i32[0], b);
    case OP_INDEX_SELECT:
        return tb_index_select(a, i32[0], b);
    case OP_SCATTER_ADD:
        return tb_scatter_add(a, i32[0], b, c);
    case OP_INDEX_ADD:
        return tb_index_add(a, i32[0], b, c);
    case OP_CROSS_ENTROPY:
        return tb_cross_entropy(a, b, (tb_reduction)o->ints[0], o->f[0]);
    case OP_NLL_LOSS:
        return tb_nll_loss(a, b, (tb_reduction)o->ints[0]);
    case OP_MSE_LOSS:
        return tb_mse_loss(a, b, (tb_reduction)o->ints[0]);
    default:
        return NULL;
    }
}

/* The gradients of one graph: for each input id, NULL (no path) or its values (malloc'd). */
typedef struct grads {
    double *g[MAX_VALS];
} grads;

static void grads_free(grads *r) {
    int i;
    for (i = 0; i < MAX_VALS; i++) {
        free(r->g[i]);
        r->g[i] = NULL;
    }
}

/* Marks the built-in ops of the pending graph under node. */
static void walk_ir(const tb_node *node, bool *seen_ops, const tb_node **visited, size_t *nvisited,
                    size_t cap) {
    size_t i;
    if (node == NULL) return;
    for (i = 0; i < *nvisited; i++)
        if (visited[i] == node) return;
    if (*nvisited < cap) visited[(*nvisited)++] = node;
    if (tb_node_op(node) >= 0 && tb_node_op(node) < TB_OP_BUILTIN_COUNT)
        seen_ops[tb_node_op(node)] = true;
    for (i = 0; i < tb_node_num_operands(node); i++)
        walk_ir(tb_node_operand(node, i), seen_ops, visited, nvisited, cap);
}

/* Builds g on dev and computes tb_grad for every float input; false with *err set on a
   library error. seen_ops (may be NULL) collects the built-in ops of the forward graph. */
static bool graph_grads(const graph *g, const tb_device *dev, grads *out, bool *seen_ops, char *err,
                        size_t errcap) {
    tb_tensor *t[MAX_VALS], *ins[MAX_VALS], *gr[MAX_VALS], *seed;
    int ids[MAX_VALS], n = 0, id, i;
    bool ok = true;
    memset(t, 0, sizeof t);
    memset(gr, 0, sizeof gr);
    memset(ins, 0, sizeof ins);
    memset(out, 0, sizeof *out);
    if (dev == NULL) dev = &g_cpu;
    for (id = 0; id < g->nvals && ok; id++) {
        const gval *v = &g->v[id];
        t[id] = v->op < 0 ? upload(v, dev) : run_op(&g->op[v->op], t);
        if (t[id] == NULL) {
            snprintf(err, errcap, "building %%%d (%s): %.400s", id,
                     v->op < 0 ? "input" : g_op_names[g->op[v->op].code], tb_last_error());
            ok = false;
            break;
        }
        {
            tb_shape s = tb_tensor_shape(t[id]);
            char want[96], got[96];
            shape_text(v, want, sizeof want);
            tb_shape_format(&s, got, sizeof got);
            if (strcmp(want, got) != 0) {
                snprintf(err, errcap, "%%%d has shape %s, the generator expected %s", id, got,
                         want);
                ok = false;
                break;
            }
        }
        if (v->op < 0 && v->kind == K_FLOAT) {
            ids[n] = id;
            ins[n++] = t[id];
        }
    }
    if (ok && seen_ops != NULL) {
        const tb_node *visited[512];
        size_t nvisited = 0;
        walk_ir(tb_tensor_node(t[g->out]), seen_ops, visited, &nvisited, 512);
    }
    if (ok) {
        gval sv = g->v[g->out];
        sv.data = (double *)g->seedv;
        seed = upload(&sv, dev);
        if (tb_grad(t[g->out], seed, ins, (size_t)n, gr) != TB_OK) {
            snprintf(err, errcap, "tb_grad: %.400s", tb_last_error());
            ok = false;
        }
        tb_tensor_release(seed);
    }
    /* every gradient in one graph, then each read in its own dtype */
    if (ok) {
        tb_tensor *live[MAX_VALS];
        size_t nlive = 0;
        for (i = 0; i < n; i++)
            if (gr[i] != NULL) live[nlive++] = gr[i];
        if (nlive > 0 && tb_sync(live, nlive) != TB_OK) {
            snprintf(err, errcap, "tb_sync of the gradients: %.400s", tb_last_error());
            ok = false;
        }
    }
    for (i = 0; ok && i < n; i++) {
        tb_shape s;
        int64_t cnt = 0, k;
        void *buf;
        if (gr[i] == NULL) continue;
        s = tb_tensor_shape(gr[i]);
        if (s.dtype != g->v[ids[i]].dtype) {
            snprintf(err, errcap, "the gradient of %%%d is %s, the input %s", ids[i],
                     tb_dtype_name(s.dtype), tb_dtype_name(g->v[ids[i]].dtype));
            ok = false;
            break;
        }
        assert_int_equal(tb_shape_numel(&s, &cnt), TB_OK);
        assert_int_equal(cnt, vnumel(&g->v[ids[i]]));
        out->g[ids[i]] = (double *)malloc((size_t)cnt * sizeof(double) + 1);
        buf = malloc((size_t)cnt * sizeof(double) + 1);
        assert_non_null(out->g[ids[i]]);
        assert_non_null(buf);
        if (tb_tensor_to_host(gr[i], buf, (size_t)cnt * tb_dtype_size(s.dtype)) != TB_OK) {
            snprintf(err, errcap, "reading the gradient of %%%d: %.400s", ids[i], tb_last_error());
            ok = false;
        }
        for (k = 0; ok && k < cnt; k++)
            out->g[ids[i]][k] = s.dtype == TB_F64 ? ((double *)buf)[k] : ((float *)buf)[k];
        free(buf);
    }
    for (i = 0; i < n; i++)
        tb_tensor_release(gr[i]);
    if (!ok) grads_free(out);
    for (i = 0; i < MAX_VALS; i++)
        tb_tensor_release(t[i]);
    return ok;
}

/* ---- the graphs ---- */

static graph *g_f64, *g_f32;
static int g_n64 = N_F64_GRAPHS, g_n32 = N_F32_GRAPHS;

static void make_graphs(void) {
    int i;
    const char *env = getenv("TB_GRAD_TORCH_GRAPHS");
    if (g_f64 != NULL) return;
    assert_int_equal(tb_device_make("cpu", 0, &g_cpu), TB_OK);
    if (env != NULL && atoi(env) > 0) g_n64 = g_n32 = atoi(env);
    g_num_main = g_num_draw = 0;
    for (i = 0; i < OP_COUNT; i++) {
        int w;
        if (g_op_weight[i] > 0) g_main_ops[g_num_main++] = i;
        for (w = 0; w < g_op_weight[i]; w++)
            g_draw[g_num_draw++] = i;
    }
    g_f64 = (graph *)calloc((size_t)g_n64, sizeof(graph));
    g_f32 = (graph *)calloc((size_t)g_n32, sizeof(graph));
    assert_non_null(g_f64);
    assert_non_null(g_f32);
    for (i = 0; i < g_n64; i++) {
        g_f64[i].index = i;
        g_f64[i].seed = 1000 + (uint64_t)i;
        g_f64[i].dtype = TB_F64;
        g_f64[i].focus = g_main_ops[i % g_num_main];
        graph_generate(&g_f64[i]);
    }
    for (i = 0; i < g_n32; i++) {
        g_f32[i].index = i;
        g_f32[i].seed = 5000 + (uint64_t)i;
        g_f32[i].dtype = TB_F32;
        g_f32[i].focus = g_main_ops[(i * 7 + 3) % g_num_main];
        graph_generate(&g_f32[i]);
    }
}

/* ---- PyTorch's gradients ---- */

typedef struct torch_result {
    bool done;       /* the graph's line came */
    char error[512]; /* torch refused the graph */
    double *g[MAX_VALS];
    int64_t n[MAX_VALS]; /* -1: none */
} torch_result;

static torch_result *g_t64, *g_t32;
enum { TORCH_NOT_RUN, TORCH_UNAVAILABLE, TORCH_BROKEN, TORCH_RAN };
static int g_torch_state = TORCH_NOT_RUN;
static char g_torch_why[512];

/* Writes every graph to a temporary file, runs tests/grad_torch.py on it once and keeps what
   it prints in g_t64 / g_t32. */
static void run_torch(void) {
    char path[512], cmd[700], *line = NULL;
    const char *tmp = getenv("TMPDIR");
    size_t cap = 0;
    int fd, i, key;
    bool unavailable = false;
    FILE *f, *p;
    torch_result *cur = NULL;
    if (g_torch_state != TORCH_NOT_RUN) return;
    make_graphs();
    g_torch_state = TORCH_UNAVAILABLE;
    if (access("/usr/bin/python3", X_OK) != 0) {
        snprintf(g_torch_why, sizeof g_torch_why, "no /usr/bin/python3");
        return;
    }
    g_torch_state = TORCH_BROKEN;
    if (access("tests/grad_torch.py", R_OK) != 0) {
        snprintf(g_torch_why, sizeof g_torch_why,
                 "tests/grad_torch.py not found (run the test from the repository's root)");
        return;
    }
    g_t64 = (torch_result *)calloc((size_t)g_n64, sizeof(torch_result));
    g_t32 = (torch_result *)calloc((size_t)g_n32, sizeof(torch_result));
    assert_non_null(g_t64);
    assert_non_null(g_t32);
    snprintf(path, sizeof path, "%s/tb_grad_torch_XXXXXX", tmp != NULL && *tmp ? tmp : "/tmp");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    f = fdopen(fd, "w");
    assert_non_null(f);
    for (i = 0; i < g_n64; i++)
        graph_write(&g_f64[i], i, f);
    for (i = 0; i < g_n32; i++)
        graph_write(&g_f32[i], g_n64 + i, f);
    assert_int_equal(fclose(f), 0);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/grad_torch.py %s 2>&1", path);
    p = popen(cmd, "r");
    assert_non_null(p);
    snprintf(g_torch_why, sizeof g_torch_why, "tests/grad_torch.py printed nothing");
    while (getline(&line, &cap, p) > 0) {
        char *s, *end;
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "torch-unavailable", 17) == 0) {
            snprintf(g_torch_why, sizeof g_torch_why, "%s", line + 17 + strspn(line + 17, " "));
            unavailable = true;
        } else if (strncmp(line, "graph ", 6) == 0) {
            key = (int)strtol(line + 6, &end, 10);
            cur = key >= 0 && key < g_n64               ? &g_t64[key]
                  : key >= g_n64 && key < g_n64 + g_n32 ? &g_t32[key - g_n64]
                                                        : NULL;
            if (cur == NULL) continue;
            cur->done = true;
            for (i = 0; i < MAX_VALS; i++)
                cur->n[i] = -1;
            if (strncmp(end, " error ", 7) == 0)
                snprintf(cur->error, sizeof cur->error, "%s", end + 7);
            g_torch_state = TORCH_RAN;
        } else if (strncmp(line, "grad ", 5) == 0 && cur != NULL) {
            int id = (int)strtol(line + 5, &end, 10);
            int64_t n, k;
            if (id < 0 || id >= MAX_VALS || cur->g[id] != NULL) continue;
            s = end;
            while (*s == ' ')
                s++;
            if (strncmp(s, "none", 4) == 0) continue;
            n = strtoll(s, &end, 10);
            if (n < 0 || n > MAX_NUMEL) continue;
            s = end;
            cur->n[id] = n;
            cur->g[id] = (double *)malloc((size_t)n * sizeof(double) + 1);
            assert_non_null(cur->g[id]);
            for (k = 0; k < n; k++) {
                cur->g[id][k] = strtod(s, &end);
                s = end;
            }
        } else if (g_torch_state != TORCH_RAN && !unavailable) {
            snprintf(g_torch_why, sizeof g_torch_why, "%s", line); /* the last line of an error */
        }
    }
    free(line);
    pclose(p);
    if (unavailable) g_torch_state = TORCH_UNAVAILABLE;
    if (getenv("TB_GRAD_TORCH_KEEP") != NULL)
        print_message("graphs for PyTorch kept in %s\n", path);
    else
        remove(path);
}

/* ---- comparing ---- */

/* The tolerance for the gradient of input id: relative to the largest element of PyTorch's
   gradient. f64 graphs are held to f64 precision except where the gradient went through f32. */
static double tolerance(const graph *g, int id) {
    if (g->dtype == TB_F32) return 2e-3;
    if (g->v[id].dtype != TB_F64 || (g->v[g->out].lowp >> id) & 1) return 1e-4;
    return 1e-9;
}

static int g_reports;

static void report(const graph *g, const char *what) {
    if (g_reports++ >= MAX_REPORTS) return;
    print_message("%s graph %d (seed %llu, %d ops, focus %s): %s\n    ops:\n",
                  tb_dtype_name(g->dtype), g->index, (unsigned long long)g->seed, g->nops,
                  g_op_names[g->focus], what);
    fflush(stdout);
    graph_describe(g, stdout);
    fflush(stdout);
}

/* 0 when the graph's gradients match PyTorch's, else 1 (reported). */
static int compare_torch(const graph *g, const torch_result *t) {
    grads c;
    char err[600], msg[900];
    int id;
    double worst = 0, gscale = 0;
    int64_t compared = 0;
    if (!t->done) {
        report(g, "tests/grad_torch.py printed no result");
        return 1;
    }
    if (t->error[0] != '\0') {
        snprintf(msg, sizeof msg, "PyTorch refused the graph: %s", t->error);
        report(g, msg);
        return 1;
    }
    if (!graph_grads(g, NULL, &c, NULL, err, sizeof err)) {
        report(g, err);
        return 1;
    }
    /* a hundredth of the largest gradient element of the graph (or 1e-2): a floor for the
       scale of each gradient, whose elements may all be rounding noise around 0 (the gradient
       of sum(softmax(x))) */
    for (id = 0; id < g->nvals; id++) {
        int64_t k;
        for (k = 0; t->n[id] > 0 && k < t->n[id]; k++)
            if (isfinite(t->g[id][k])) gscale = fmax(gscale, fabs(t->g[id][k]));
    }
    for (id = 0; id < g->nvals; id++) {
        const gval *v = &g->v[id];
        int64_t n = vnumel(v), k;
        double scale = fmax(1e-2 * gscale, 1e-2), tol = tolerance(g, id);
        char s[96];
        if (v->op >= 0 || v->kind != K_FLOAT) continue;
        shape_text(v, s, sizeof s);
        if ((c.g[id] == NULL) != (t->n[id] < 0)) {
            snprintf(msg, sizeof msg, "input %%%d %s: tb_grad gives %s, PyTorch %s", id, s,
                     c.g[id] == NULL ? "no gradient" : "a gradient",
                     t->n[id] < 0 ? "none" : "a gradient");
            report(g, msg);
            grads_free(&c);
            return 1;
        }
        if (c.g[id] == NULL) continue;
        if (t->n[id] != n) {
            snprintf(msg, sizeof msg, "input %%%d %s: PyTorch's gradient has %lld elements", id, s,
                     (long long)t->n[id]);
            report(g, msg);
            grads_free(&c);
            return 1;
        }
        for (k = 0; k < n; k++)
            if (isfinite(t->g[id][k])) scale = fmax(scale, fabs(t->g[id][k]));
        for (k = 0; k < n; k++) {
            double got = c.g[id][k], want = t->g[id][k], err_k = fabs(got - want);
            bool same = got == want || (isnan(got) && isnan(want));
            if (!same && !(err_k <= tol * scale + 1e-300)) {
                snprintf(msg, sizeof msg,
                         "input %%%d %s: gradient element %lld: tb_grad %.17g, PyTorch %.17g "
                         "(error %.3g of the largest element %.3g; tolerance %.0e)",
                         id, s, (long long)k, got, want, err_k / (scale > 0 ? scale : 1), scale,
                         tol);
                report(g, msg);
                grads_free(&c);
                return 1;
            }
            if (scale > 0 && err_k / scale / tol > worst) worst = err_k / scale / tol;
        }
        compared += n;
    }
    grads_free(&c);
    if (getenv("TB_GRAD_TORCH_VERBOSE") != NULL)
        print_message("%s graph %d: %lld gradient elements, worst error %.3g of the tolerance\n",
                      tb_dtype_name(g->dtype), g->index, (long long)compared, worst);
    if (getenv("TB_GRAD_TORCH_VERBOSE") != NULL && atoi(getenv("TB_GRAD_TORCH_VERBOSE")) > 1) {
        graph_describe(g, stdout);
        fflush(stdout);
    }
    return 0;
}

static void against_torch(tb_dtype dt) {
    graph *gs;
    torch_result *ts;
    int n, i, failed = 0;
    run_torch();
    if (g_torch_state == TORCH_UNAVAILABLE) {
        print_message("PyTorch (python3-torch, imported by /usr/bin/python3) is not available: "
                      "random graphs against torch.autograd skipped (%s)\n",
                      g_torch_why);
        skip();
    }
    if (g_torch_state != TORCH_RAN) fail_msg("running tests/grad_torch.py: %s", g_torch_why);
    gs = dt == TB_F64 ? g_f64 : g_f32;
    ts = dt == TB_F64 ? g_t64 : g_t32;
    n = dt == TB_F64 ? g_n64 : g_n32;
    for (i = 0; i < n; i++)
        failed += compare_torch(&gs[i], &ts[i]);
    if (failed > 0)
        fail_msg("%d of %d %s graphs differ from PyTorch (the first %d described above)", failed, n,
                 tb_dtype_name(dt), MAX_REPORTS);
}

static void test_f64_against_torch(void **state) {
    (void)state;
    against_torch(TB_F64);
}

static void test_f32_against_torch(void **state) {
    (void)state;
    against_torch(TB_F32);
}

/* Every differentiable built-in op appears in the forward graphs (without PyTorch). */
static void test_every_op_covered(void **state) {
    bool seen[TB_OP_BUILTIN_COUNT];
    static const int needed[] = {
        TB_OP_NEG,          TB_OP_ABS,        TB_OP_EXP,      TB_OP_LOG,        TB_OP_SQRT,
        TB_OP_RSQRT,        TB_OP_SIN,        TB_OP_COS,      TB_OP_TANH,       TB_OP_SIGMOID,
        TB_OP_RELU,         TB_OP_GELU,       TB_OP_SILU,     TB_OP_RECIPROCAL, TB_OP_FLOOR,
        TB_OP_CEIL,         TB_OP_ROUND,      TB_OP_SIGN,     TB_OP_CAST,       TB_OP_ADD,
        TB_OP_SUB,          TB_OP_MUL,        TB_OP_DIV,      TB_OP_POW,        TB_OP_MAXIMUM,
        TB_OP_MINIMUM,      TB_OP_WHERE,      TB_OP_CLAMP,    TB_OP_SUM,        TB_OP_MEAN,
        TB_OP_MAX,          TB_OP_MIN,        TB_OP_PROD,     TB_OP_MATMUL,     TB_OP_SOFTMAX,
        TB_OP_LOG_SOFTMAX,  TB_OP_LAYER_NORM, TB_OP_RESHAPE,  TB_OP_PERMUTE,    TB_OP_EXPAND,
        TB_OP_SLICE,        TB_OP_FLIP,       TB_OP_CONCAT,   TB_OP_PAD,        TB_OP_GATHER,
        TB_OP_INDEX_SELECT, TB_OP_ERF,        TB_OP_SOFTPLUS, TB_OP_MISH};
    size_t k;
    int i, missing = 0;
    char err[600];
    (void)state;
    make_graphs();
    memset(seen, 0, sizeof seen);
    for (i = 0; i < g_n64 + g_n32; i++) {
        const graph *g = i < g_n64 ? &g_f64[i] : &g_f32[i - g_n64];
        grads c;
        if (!graph_grads(g, NULL, &c, seen, err, sizeof err))
            fail_msg("%s graph %d (seed %llu): %s", tb_dtype_name(g->dtype), g->index,
                     (unsigned long long)g->seed, err);
        grads_free(&c);
    }
    for (k = 0; k < sizeof needed / sizeof needed[0]; k++) {
        if (!seen[needed[k]]) {
            print_message("no graph records %s\n", tb_op_name(needed[k]));
            missing++;
        }
    }
    assert_int_equal(missing, 0);
}

/* The f32 graphs on opencl against the cpu: normalised error of each gradient. */
static void test_opencl_matches_cpu(void **state) {
    tb_device dev;
    int i, failed = 0, ran = 0;
    char err[600], msg[900];
    (void)state;
    if (tb_device_make("opencl", 0, &dev) != TB_OK) {
        print_message("no opencl device, skipped: %s\n", tb_last_error());
        tb_clear_error();
        skip();
    }
    make_graphs();
    for (i = 0; i < g_n32; i++) {
        const graph *g = &g_f32[i];
        grads want, got;
        int id;
        double gscale = 0, floor2;
        if (!graph_grads(g, NULL, &want, NULL, err, sizeof err)) {
            report(g, err);
            failed++;
            continue;
        }
        if (getenv("TB_GRAD_TORCH_VERBOSE") != NULL) {
            print_message("opencl: f32 graph %d\n", i);
            fflush(stdout);
        }
        if (!graph_grads(g, &dev, &got, NULL, err, sizeof err)) {
            snprintf(msg, sizeof msg, "on opencl: %s", err);
            report(g, msg);
            grads_free(&want);
            failed++;
            continue;
        }
        ran++;
        for (id = 0; id < g->nvals; id++) {
            int64_t k;
            for (k = 0; want.g[id] != NULL && k < vnumel(&g->v[id]); k++)
                if (isfinite(want.g[id][k])) gscale = fmax(gscale, fabs(want.g[id][k]));
        }
        floor2 = fmax(1e-2 * gscale, 1e-2) * fmax(1e-2 * gscale, 1e-2);
        for (id = 0; id < g->nvals; id++) {
            const gval *v = &g->v[id];
            int64_t n = vnumel(v), k;
            double num = 0, den = 0;
            if (v->op >= 0 || v->kind != K_FLOAT) continue;
            if ((want.g[id] == NULL) != (got.g[id] == NULL)) {
                snprintf(msg, sizeof msg, "input %%%d: a gradient on %s only", id,
                         want.g[id] != NULL ? "cpu" : "opencl");
                report(g, msg);
                failed++;
                break;
            }
            if (want.g[id] == NULL) continue;
            for (k = 0; k < n; k++) {
                double d = got.g[id][k] - want.g[id][k];
                num += d * d;
                den += want.g[id][k] * want.g[id][k];
            }
            /* elements that are rounding noise count at the graph's scale (see compare_torch) */
            if (!(num <= 1e-8 * fmax(den, (double)n * floor2))) {
                int64_t worst = 0;
                for (k = 1; k < n; k++)
                    if (fabs(got.g[id][k] - want.g[id][k]) >
                        fabs(got.g[id][worst] - want.g[id][worst]))
                        worst = k;
                snprintf(msg, sizeof msg,
                         "input %%%d: normalised squared error %.3g on opencl (limit 1e-8); "
                         "element %lld: opencl %.9g, cpu %.9g",
                         id, den > 0 ? num / den : num, (long long)worst, got.g[id][worst],
                         want.g[id][worst]);
                report(g, msg);
                failed++;
                break;
            }
        }
        grads_free(&want);
        grads_free(&got);
    }
    print_message("opencl: %d f32 graphs compared with the cpu\n", ran);
    if (failed > 0) fail_msg("%d of %d f32 graphs differ on opencl", failed, g_n32);
}

static int teardown(void **state) {
    int i, id;
    (void)state;
    for (i = 0; g_f64 != NULL && i < g_n64; i++)
        graph_free(&g_f64[i]);
    for (i = 0; g_f32 != NULL && i < g_n32; i++)
        graph_free(&g_f32[i]);
    for (i = 0; g_t64 != NULL && i < g_n64; i++)
        for (id = 0; id < MAX_VALS; id++)
            free(g_t64[i].g[id]);
    for (i = 0; g_t32 != NULL && i < g_n32; i++)
        for (id = 0; id < MAX_VALS; id++)
            free(g_t32[i].g[id]);
    free(g_f64);
    free(g_f32);
    free(g_t64);
    free(g_t32);
    tb_shutdown();
    return 0;
}

int main(void) {
    const struct CMUnitTest cpu[] = {
        cmocka_unit_test(test_every_op_covered),
        cmocka_unit_test(test_f64_against_torch),
        cmocka_unit_test(test_f32_against_torch),
    };
    const struct CMUnitTest devices[] = {
        cmocka_unit_test(test_opencl_matches_cpu),
    };
#if defined(GRAD_TORCH_DEVICES)
    (void)cpu;
    return cmocka_run_group_tests_name("grad_torch_devices", devices, NULL, teardown);
#else
    (void)devices;
    return cmocka_run_group_tests_name("grad_torch", cpu, NULL, teardown);
#endif
}
