/* The layers of real models: tb_linear, tb_embedding, tb_hardtanh, tb_relu6, tb_hardsigmoid,
   tb_hardswish, tb_tril, tb_triu, tb_masked_fill, tb_batch_norm (training with running
   statistics, and evaluation), tb_batch_norm_fold, tb_scaled_dot_product_attention (causal,
   bool and additive masks, dropout) and tb_interpolate (nearest, bilinear, linear; align
   corners); and the optimizer's state saved and restored (tb_optimizer_state_save/load through
   a safetensors file: training resumed gives the values of training not interrupted).
   Forward values, the gradients of sum(y * r) and batch norm's running statistics against
   PyTorch in f64 (/usr/bin/python3 tests/layers_torch.py; skipped with a message where torch
   is missing), the opencl and native backends against the cpu in f32, and the errors of bad
   arguments. */
#define _POSIX_C_SOURCE 200809L /* popen, mkstemp */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXN 4096
#define MAXT 6

/* How a tensor's values are drawn. */
enum { V_NORMAL, V_KINKS, V_POSITIVE, V_INDEX, V_BOOL, V_BOOL_ROWS };

typedef struct tspec {
    const char *role; /* x w b idx m rm rv q k v */
    tb_dtype dtype;   /* TB_F64 (f32 on the compiled backends), TB_I64 or TB_BOOL */
    bool grad;
    int rank;
    int64_t dims[4];
    int kind;
    int64_t bound; /* V_INDEX: indices in [0, bound) */
} tspec;

typedef struct lcase {
    const char *name;
    const char *op;
    int64_t ints[6];
    int nints;
    double fl[3]; /* the op's floats; V_KINKS: fl[2]... see kinks_of */
    int nfl;
    tspec t[MAXT];
    int nt;
} lcase;

#define F(r, g, rk, ...)                                                                           \
    { r, TB_F64, g, rk, {__VA_ARGS__}, V_NORMAL, 0 }
#define FK(r, rk, ...)                                                                             \
    { r, TB_F64, true, rk, {__VA_ARGS__}, V_KINKS, 0 }
#define FP(r, rk, ...)                                                                             \
    { r, TB_F64, false, rk, {__VA_ARGS__}, V_POSITIVE, 0 }

static const lcase g_cases[] = {
    {"linear_3d",
     "linear",
     {0},
     0,
     {0},
     0,
     {F("x", true, 3, 2, 3, 5), F("w", true, 2, 4, 5), F("b", true, 1, 4)},
     3},
    {"linear_1d_no_bias", "linear", {0}, 0, {0}, 0, {F("x", true, 1, 5), F("w", true, 2, 3, 5)}, 2},
    {"embedding_repeats",
     "embedding",
     {0},
     0,
     {0},
     0,
     {{"idx", TB_I64, false, 2, {2, 5}, V_INDEX, 4}, F("w", true, 2, 4, 3)},
     2},
    {"hardtanh", "hardtanh", {0}, 0, {-1.0, 1.5}, 2, {FK("x", 2, 3, 7)}, 1},
    {"relu6", "relu6", {0}, 0, {0}, 0, {FK("x", 2, 4, 6)}, 1},
    {"hardsigmoid", "hardsigmoid", {0}, 0, {0}, 0, {FK("x", 2, 4, 6)}, 1},
    {"hardswish", "hardswish", {0}, 0, {0}, 0, {FK("x", 3, 2, 4, 6)}, 1},
    {"tril", "tril", {0}, 1, {0}, 0, {F("x", true, 3, 2, 3, 4)}, 1},
    {"tril_below", "tril", {-1}, 1, {0}, 0, {F("x", true, 2, 4, 3)}, 1},
    {"triu_above", "triu", {1}, 1, {0}, 0, {F("x", true, 2, 3, 5)}, 1},
    {"triu_far", "triu", {-7}, 1, {0}, 0, {F("x", true, 2, 3, 5)}, 1},
    {"masked_fill",
     "masked_fill",
     {0},
     0,
     {-1.5},
     1,
     {F("x", true, 3, 2, 3, 4), {"m", TB_BOOL, false, 2, {3, 1}, V_BOOL, 0}},
     2},
    {"batch_norm_train",
     "batch_norm",
     {1},
     1,
     {0.1, 1e-5},
     2,
     {F("x", true, 4, 3, 4, 2, 3), F("rm", false, 1, 4), FP("rv", 1, 4), F("w", true, 1, 4),
      F("b", true, 1, 4)},
     5},
    {"batch_norm_train_2d",
     "batch_norm",
     {1},
     1,
     {0.3, 1e-3},
     2,
     {F("x", true, 2, 5, 3), F("w", true, 1, 3), F("b", true, 1, 3)},
     3},
    {"batch_norm_eval",
     "batch_norm",
     {0},
     1,
     {0.1, 1e-5},
     2,
     {F("x", true, 3, 2, 3, 4), F("rm", false, 1, 3), FP("rv", 1, 3), F("w", true, 1, 3),
      F("b", true, 1, 3)},
     5},
    {"sdpa",
     "sdpa",
     {0},
     1,
     {0.0},
     1,
     {F("q", true, 3, 2, 3, 4), F("k", true, 3, 2, 5, 4), F("v", true, 3, 2, 5, 6)},
     3},
    {"sdpa_causal",
     "sdpa",
     {1},
     1,
     {0.3},
     1,
     {F("q", true, 4, 2, 2, 4, 8), F("k", true, 4, 2, 2, 4, 8), F("v", true, 4, 2, 2, 4, 8)},
     3},
    {"sdpa_bool_mask",
     "sdpa",
     {0},
     1,
     {0.0},
     1,
     {F("q", true, 3, 1, 3, 4),
      F("k", true, 3, 1, 5, 4),
      F("v", true, 3, 1, 5, 2),
      {"m", TB_BOOL, false, 2, {3, 5}, V_BOOL_ROWS, 0}},
     4},
    {"sdpa_additive_mask",
     "sdpa",
     {0},
     1,
     {0.0},
     1,
     {F("q", true, 3, 1, 3, 4), F("k", true, 3, 1, 5, 4), F("v", true, 3, 1, 5, 2),
      F("m", false, 2, 3, 5)},
     4},
    {"nearest_up", "interpolate", {0, 0, 5, 7}, 4, {0}, 0, {F("x", true, 4, 1, 2, 3, 4)}, 1},
    {"nearest_double", "interpolate", {0, 0, 6, 8}, 4, {0}, 0, {F("x", true, 4, 1, 2, 3, 4)}, 1},
    {"nearest_down", "interpolate", {0, 0, 2, 3}, 4, {0}, 0, {F("x", true, 4, 2, 1, 5, 7)}, 1},
    {"bilinear_up", "interpolate", {1, 0, 5, 7}, 4, {0}, 0, {F("x", true, 4, 2, 1, 3, 4)}, 1},
    {"bilinear_align", "interpolate", {1, 1, 5, 7}, 4, {0}, 0, {F("x", true, 4, 2, 1, 3, 4)}, 1},
    {"bilinear_down", "interpolate", {1, 0, 2, 3}, 4, {0}, 0, {F("x", true, 4, 1, 2, 5, 7)}, 1},
    {"linear_1d_up", "interpolate", {1, 0, 8}, 3, {0}, 0, {F("x", true, 3, 1, 2, 5)}, 1},
};
#define NUM_CASES (sizeof g_cases / sizeof g_cases[0])

typedef struct values {
    double v[MAXT][MAXN];
    double r[MAXN];
    int64_t rd[4];
    int rr;
} values;

typedef struct results {
    double y[MAXN], g[MAXT][MAXN], s[2][MAXN];
    int64_t ny, ng[MAXT], ns[2];
} results;

static uint64_t g_rng;
static double next_unit(void) { /* [0, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)((g_rng >> 11) & ((1ull << 53) - 1)) / 9007199254740992.0;
}

static int64_t numel(const int64_t *dims, int rank) {
    int64_t n = 1;
    int i;
    for (i = 0; i < rank; i++)
        n *= dims[i];
    return n;
}

/* A value in [-5, 9] at least 0.1 from every kink of the activations tested. */
static double away_from_kinks(void) {
    static const double kinks[] = {-3.0, -1.0, 0.0, 1.5, 3.0, 6.0};
    for (;;) {
        double v = next_unit() * 14.0 - 5.0;
        size_t i;
        bool ok = true;
        for (i = 0; i < sizeof kinks / sizeof kinks[0]; i++)
            if (fabs(v - kinks[i]) < 0.1) ok = false;
        if (ok) return v;
    }
}

static void make_values(const lcase *c, values *in, uint64_t seed) {
    int k;
    int64_t i, n;
    g_rng = seed;
    memset(in, 0, sizeof *in);
    for (k = 0; k < c->nt; k++) {
        const tspec *t = &c->t[k];
        n = numel(t->dims, t->rank);
        assert_true(n <= MAXN);
        for (i = 0; i < n; i++) {
            switch (t->kind) {
            case V_KINKS:
                in->v[k][i] = away_from_kinks();
                break;
            case V_POSITIVE:
                in->v[k][i] = 0.5 + 1.5 * next_unit();
                break;
            case V_INDEX:
                in->v[k][i] = (double)(int64_t)(next_unit() * (double)t->bound);
                break;
            case V_BOOL:
                in->v[k][i] = next_unit() < 0.5;
                break;
            case V_BOOL_ROWS: /* each row keeps its first position */
                in->v[k][i] = i % t->dims[t->rank - 1] == 0 || next_unit() < 0.5;
                break;
            default:
                in->v[k][i] = next_unit() * 4.0 - 2.0;
            }
        }
    }
}

static tb_tensor *host_tensor(const double *v, const tspec *t, tb_dtype fdt, const tb_device *dev) {
    static float f[MAXN];
    static int64_t ix[MAXN];
    static bool b[MAXN];
    tb_shape s;
    int64_t i, n = numel(t->dims, t->rank);
    tb_dtype dt = t->dtype == TB_F64 ? fdt : t->dtype;
    const void *data = v;
    assert_int_equal(tb_shape_make(&s, dt, t->rank, t->dims), TB_OK);
    for (i = 0; i < n; i++) {
        f[i] = (float)v[i];
        ix[i] = (int64_t)v[i];
        b[i] = v[i] != 0.0;
    }
    if (dt == TB_F32) data = f;
    if (dt == TB_I64) data = ix;
    if (dt == TB_BOOL) data = b;
    return tb_tensor_from_host(data, &s, dev);
}

static void to_f64(tb_tensor *t, double *out, int64_t *count) {
    static float f[MAXN];
    tb_shape s = tb_tensor_shape(t);
    int64_t n = numel(s.dims, s.rank), i;
    assert_true(n <= MAXN);
    *count = n;
    if (s.dtype == TB_F64) {
        assert_int_equal(tb_tensor_to_host(t, out, (size_t)n * 8), TB_OK);
        return;
    }
    assert_int_equal(s.dtype, TB_F32);
    assert_int_equal(tb_tensor_to_host(t, f, (size_t)n * 4), TB_OK);
    for (i = 0; i < n; i++)
        out[i] = f[i];
}

static tb_tensor *role(tb_tensor *const *ts, const lcase *c, const char *name) {
    int k;
    for (k = 0; k < c->nt; k++)
        if (strcmp(c->t[k].role, name) == 0) return ts[k];
    return NULL;
}

static tb_tensor *apply(const lcase *c, tb_tensor *const *t, double dropout) {
    const char *op = c->op;
    if (strcmp(op, "linear") == 0) return tb_linear(t[0], t[1], role(t, c, "b"));
    if (strcmp(op, "embedding") == 0) return tb_embedding(t[0], t[1]);
    if (strcmp(op, "hardtanh") == 0) return tb_hardtanh(t[0], c->fl[0], c->fl[1]);
    if (strcmp(op, "relu6") == 0) return tb_relu6(t[0]);
    if (strcmp(op, "hardsigmoid") == 0) return tb_hardsigmoid(t[0]);
    if (strcmp(op, "hardswish") == 0) return tb_hardswish(t[0]);
    if (strcmp(op, "tril") == 0) return tb_tril(t[0], c->ints[0]);
    if (strcmp(op, "triu") == 0) return tb_triu(t[0], c->ints[0]);
    if (strcmp(op, "masked_fill") == 0) return tb_masked_fill(t[0], t[1], c->fl[0]);
    if (strcmp(op, "batch_norm") == 0)
        return tb_batch_norm(t[0], role(t, c, "rm"), role(t, c, "rv"), role(t, c, "w"),
                             role(t, c, "b"), c->ints[0] != 0, c->fl[0], c->fl[1]);
    if (strcmp(op, "sdpa") == 0)
        return tb_scaled_dot_product_attention(t[0], t[1], t[2], role(t, c, "m"), dropout,
                                               c->ints[0] != 0, c->fl[0]);
    if (strcmp(op, "interpolate") == 0)
        return tb_interpolate(t[0], c->ints + 2, (size_t)c->nints - 2,
                              (tb_interpolate_mode)c->ints[0], c->ints[1] != 0);
    fail_msg("unknown op %s", op);
    return NULL;
}

/* Runs a case on `backend` with floats of dtype fdt; in->r is drawn the first time. */
static void run_case(const lcase *c, values *in, const char *backend, tb_dtype fdt, double dropout,
                     results *res) {
    tb_device dev;
    tb_tensor *t[MAXT], *ins[MAXT], *grads[MAXT], *y, *r, *prod, *loss;
    tspec rs;
    size_t nin = 0, k;
    int i, at[MAXT];
    tb_shape ys;
    assert_int_equal(tb_device_make(backend, 0, &dev), TB_OK);
    for (i = 0; i < c->nt; i++) {
        t[i] = host_tensor(in->v[i], &c->t[i], fdt, &dev);
        assert_non_null(t[i]);
        if (c->t[i].grad) {
            assert_int_equal(tb_set_requires_grad(t[i], true), TB_OK);
            at[nin] = i;
            ins[nin++] = t[i];
        }
    }
    tb_manual_seed(77);
    y = apply(c, t, dropout);
    if (y == NULL) fail_msg("%s on %s: %s", c->name, backend, tb_last_error());
    ys = tb_tensor_shape(y);
    if (in->rr == 0) {
        int64_t j;
        in->rr = ys.rank;
        memcpy(in->rd, ys.dims, sizeof(int64_t) * (size_t)ys.rank);
        for (j = 0; j < numel(ys.dims, ys.rank); j++)
            in->r[j] = next_unit() * 2.0 - 1.0;
    }
    memset(&rs, 0, sizeof rs);
    rs.dtype = TB_F64;
    rs.rank = in->rr;
    memcpy(rs.dims, in->rd, sizeof rs.dims);
    r = host_tensor(in->r, &rs, fdt, &dev);
    prod = tb_mul(y, r);
    loss = tb_sum(prod, NULL, 0, false);
    tb_tensor_release(prod);
    memset(grads, 0, sizeof grads);
    if (nin > 0 && tb_grad(loss, NULL, ins, nin, grads) != TB_OK)
        fail_msg("%s on %s: grad: %s", c->name, backend, tb_last_error());
    to_f64(y, res->y, &res->ny);
    for (k = 0; k < MAXT; k++)
        res->ng[k] = 0;
    for (k = 0; k < nin; k++) {
        if (grads[k] == NULL)
            fail_msg("%s on %s: no gradient of %s", c->name, backend, c->t[at[k]].role);
        to_f64(grads[k], res->g[k], &res->ng[k]);
        tb_tensor_release(grads[k]);
    }
    res->ns[0] = res->ns[1] = 0;
    if (role(t, c, "rm") != NULL) {
        to_f64(role(t, c, "rm"), res->s[0], &res->ns[0]);
        to_f64(role(t, c, "rv"), res->s[1], &res->ns[1]);
    }
    for (i = 0; i < c->nt; i++)
        tb_tensor_release(t[i]);
    tb_tensor_release(loss);
    tb_tensor_release(r);
    tb_tensor_release(y);
}

/* max |a - b| / max(1, max |b|); NaN anywhere (or only on one side) is infinite */
static double rel_err(const double *a, const double *b, int64_t n) {
    double worst = 0, scale = 1;
    int64_t i;
    for (i = 0; i < n; i++)
        if (fabs(b[i]) > scale) scale = fabs(b[i]);
    for (i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]);
        if (e != e) return INFINITY;
        if (e > worst) worst = e;
    }
    return worst / scale;
}

static void compare(const char *what, const lcase *c, const results *got, const results *want,
                    double tol) {
    int k;
    assert_int_equal(got->ny, want->ny);
    if (rel_err(got->y, want->y, got->ny) > tol)
        fail_msg("%s: y differs by %g", what, rel_err(got->y, want->y, got->ny));
    for (k = 0; k < MAXT; k++) {
        assert_int_equal(got->ng[k], want->ng[k]);
        if (rel_err(got->g[k], want->g[k], got->ng[k]) > tol)
            fail_msg("%s: gradient %d differs by %g", what, k,
                     rel_err(got->g[k], want->g[k], got->ng[k]));
    }
    for (k = 0; k < 2; k++) {
        assert_int_equal(got->ns[k], want->ns[k]);
        if (rel_err(got->s[k], want->s[k], got->ns[k]) > tol)
            fail_msg("%s: running statistic %d differs", what, k);
    }
    (void)c;
}

/* ---- PyTorch ---- */

static void write_tensor(FILE *f, const tspec *t, const double *v, bool grad) {
    int64_t i;
    fprintf(f, "t %s %s %d %d", t->role, tb_dtype_name(t->dtype), grad ? 1 : 0, t->rank);
    for (i = 0; i < t->rank; i++)
        fprintf(f, " %lld", (long long)t->dims[i]);
    for (i = 0; i < numel(t->dims, t->rank); i++)
        fprintf(f, " %.17g", v[i]);
    fprintf(f, "\n");
}

static bool read_values(FILE *p, const char *tag, double *out, int64_t want) {
    char word[16];
    long long n;
    int64_t i;
    if (fscanf(p, " %15s", word) != 1 || strcmp(word, tag) != 0) return false;
    if (strcmp(tag, "y") != 0 && fscanf(p, " %15s", word) != 1) return false;
    if (fscanf(p, " %lld", &n) != 1 || n != want) return false;
    for (i = 0; i < n; i++)
        if (fscanf(p, " %lf", &out[i]) != 1) return false;
    return true;
}

static void test_against_torch(void **state) {
    static values in[NUM_CASES];
    static results ours[NUM_CASES], theirs;
    char path[] = "/tmp/tb_layers_XXXXXX", cmd[256], word[64];
    size_t i;
    int fd, j, k;
    FILE *f, *p;
    (void)state;
    if (access("/usr/bin/python3", X_OK) != 0) {
        print_message("no /usr/bin/python3: PyTorch comparison skipped\n");
        skip();
    }
    fd = mkstemp(path);
    assert_true(fd >= 0);
    f = fdopen(fd, "w");
    assert_non_null(f);
    for (i = 0; i < NUM_CASES; i++) {
        const lcase *c = &g_cases[i];
        tspec rs;
        make_values(c, &in[i], 1000 + i);
        run_case(c, &in[i], "cpu", TB_F64, 0.0, &ours[i]);
        fprintf(f, "case %s %s\ni", c->name, c->op);
        for (j = 0; j < c->nints; j++)
            fprintf(f, " %lld", (long long)c->ints[j]);
        fprintf(f, "\nf");
        for (j = 0; j < c->nfl; j++)
            fprintf(f, " %.17g", c->fl[j]);
        fprintf(f, "\n");
        for (k = 0; k < c->nt; k++)
            write_tensor(f, &c->t[k], in[i].v[k], c->t[k].grad);
        memset(&rs, 0, sizeof rs);
        rs.role = "r";
        rs.dtype = TB_F64;
        rs.rank = in[i].rr;
        memcpy(rs.dims, in[i].rd, sizeof rs.dims);
        write_tensor(f, &rs, in[i].r, false);
        fprintf(f, "end\n");
    }
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/layers_torch.py %s 2>&1", path);
    p = popen(cmd, "r");
    assert_non_null(p);
    for (i = 0; i < NUM_CASES; i++) {
        const results *o = &ours[i];
        bool ok;
        if (fscanf(p, " %63s", word) != 1) fail_msg("no output from tests/layers_torch.py");
        if (strcmp(word, "torch-unavailable") == 0) {
            pclose(p);
            unlink(path);
            print_message("PyTorch is not available: comparison skipped\n");
            skip();
        }
        if (strcmp(word, "case") != 0 || fscanf(p, " %63s", word) != 1 ||
            strcmp(word, g_cases[i].name) != 0)
            fail_msg("tests/layers_torch.py: unexpected output at case %s", g_cases[i].name);
        memset(&theirs, 0, sizeof theirs);
        theirs.ny = o->ny;
        ok = read_values(p, "y", theirs.y, o->ny);
        for (k = 0; ok && k < MAXT; k++) {
            theirs.ng[k] = o->ng[k];
            if (o->ng[k] > 0) ok = read_values(p, "g", theirs.g[k], o->ng[k]);
        }
        for (k = 0; ok && k < 2; k++) {
            theirs.ns[k] = o->ns[k];
            if (o->ns[k] > 0) ok = read_values(p, "s", theirs.s[k], o->ns[k]);
        }
        if (!ok) fail_msg("tests/layers_torch.py: bad values for case %s", g_cases[i].name);
        /* PyTorch's hard activations' backward multiply by 1/6 rounded to f32 in every dtype */
        compare(g_cases[i].name, &g_cases[i], o, &theirs,
                strncmp(g_cases[i].op, "hards", 5) == 0 ? 1e-7 : 1e-12);
    }
    pclose(p);
    unlink(path);
}

/* f32 on a compiled backend against the cpu, dropout included where asked. */
static void against_cpu(const char *backend) {
    static values in, in2;
    static results want, got;
    tb_device dev;
    size_t i;
    if (tb_device_make(backend, 0, &dev) != TB_OK) {
        print_message("no %s device, skipped: %s\n", backend, tb_last_error());
        tb_clear_error();
        skip();
    }
    for (i = 0; i < NUM_CASES; i++) {
        const lcase *c = &g_cases[i];
        double p = strcmp(c->op, "sdpa") == 0 ? 0.25 : 0.0;
        char what[96];
        int pass;
        for (pass = 0; pass < (p > 0 ? 2 : 1); pass++) {
            make_values(c, &in, 2000 + i);
            run_case(c, &in, "cpu", TB_F32, pass ? p : 0.0, &want);
            in2 = in;
            run_case(c, &in2, backend, TB_F32, pass ? p : 0.0, &got);
            snprintf(what, sizeof what, "%s%s on %s", c->name, pass ? " (dropout)" : "", backend);
            compare(what, c, &got, &want, 2e-5);
        }
    }
}

static void test_opencl_against_cpu(void **state) {
    (void)state;
    against_cpu("opencl");
}

static void test_native_against_cpu(void **state) {
    (void)state;
    against_cpu("native");
}

static tb_tensor *vec_f64(const double *v, int64_t n) {
    tb_shape s;
    assert_int_equal(tb_shape_make(&s, TB_F64, 1, &n), TB_OK);
    return tb_tensor_from_host(v, &s, NULL);
}

/* Attention with dropout is the softmax's weights through tb_dropout (same stream), then v. */
static void test_attention_dropout(void **state) {
    double q[2 * 3 * 4], k[2 * 5 * 4], v[2 * 5 * 2], a[2 * 3 * 2], b[2 * 3 * 2];
    tb_shape qs = tb_shape_of(TB_F64, 3, 2, 3, 4), ks = tb_shape_of(TB_F64, 3, 2, 5, 4),
             vs = tb_shape_of(TB_F64, 3, 2, 5, 2);
    tb_tensor *tq, *tk, *tv, *y, *s, *p, *w, *z, *kt;
    int i;
    (void)state;
    g_rng = 5;
    for (i = 0; i < 24; i++)
        q[i] = next_unit() - 0.5;
    for (i = 0; i < 40; i++)
        k[i] = next_unit() - 0.5;
    for (i = 0; i < 20; i++)
        v[i] = next_unit() + 0.5;
    tq = tb_tensor_from_host(q, &qs, NULL);
    tk = tb_tensor_from_host(k, &ks, NULL);
    tv = tb_tensor_from_host(v, &vs, NULL);
    tb_manual_seed(9);
    y = tb_scaled_dot_product_attention(tq, tk, tv, NULL, 0.5, false, 0.0);
    assert_non_null(y);
    assert_int_equal(tb_tensor_to_host(y, a, sizeof a), TB_OK);
    tb_manual_seed(9);
    kt = tb_transpose(tk, 1, 2);
    s = tb_matmul(tq, kt);
    assert_non_null(s);
    tb_tensor_release(kt);
    w = tb_mul_scalar(s, 0.5);
    p = tb_softmax(w, -1);
    z = tb_dropout(p, 0.5, true);
    tb_tensor_release(s);
    s = tb_matmul(z, tv);
    assert_int_equal(tb_tensor_to_host(s, b, sizeof b), TB_OK);
    for (i = 0; i < 12; i++) {
        assert_true(fabs(a[i] - b[i]) <= 1e-12 * (1 + fabs(b[i])));
    }
    tb_tensor_release(s);
    tb_tensor_release(z);
    tb_tensor_release(p);
    tb_tensor_release(w);
    tb_tensor_release(y);
    tb_tensor_release(tv);
    tb_tensor_release(tk);
    tb_tensor_release(tq);
}

/* conv(x, w, b) then batch norm (eval) equals conv(x, folded w, folded b). */
static void test_batch_norm_fold(void **state) {
    double x[2 * 3 * 5 * 5], w[4 * 3 * 3 * 3], cb[4], rm[4], rv[4], g[4], be[4];
    double a[2 * 4 * 3 * 3], b[2 * 4 * 3 * 3];
    tb_shape xs = tb_shape_of(TB_F64, 4, 2, 3, 5, 5), ws = tb_shape_of(TB_F64, 4, 4, 3, 3, 3);
    tb_tensor *tx, *tw, *tcb, *trm, *trv, *tg, *tbe, *c1, *y1, *wf = NULL, *bf = NULL, *y2;
    int i, with;
    (void)state;
    g_rng = 11;
    for (i = 0; i < 150; i++)
        x[i] = next_unit() * 2 - 1;
    for (i = 0; i < 108; i++)
        w[i] = next_unit() - 0.5;
    for (i = 0; i < 4; i++) {
        cb[i] = next_unit();
        rm[i] = next_unit() - 0.5;
        rv[i] = 0.5 + next_unit();
        g[i] = next_unit() + 0.5;
        be[i] = next_unit() - 0.5;
    }
    tx = tb_tensor_from_host(x, &xs, NULL);
    tw = tb_tensor_from_host(w, &ws, NULL);
    tcb = vec_f64(cb, 4);
    trm = vec_f64(rm, 4);
    trv = vec_f64(rv, 4);
    tg = vec_f64(g, 4);
    tbe = vec_f64(be, 4);
    for (with = 0; with < 2; with++) { /* with and without the conv's bias and bn's affine */
        tb_tensor *bias = with ? tcb : NULL, *gw = with ? tg : NULL, *gb = with ? tbe : NULL;
        c1 = tb_conv2d(tx, tw, bias, NULL, NULL, NULL, 1);
        y1 = tb_batch_norm(c1, trm, trv, gw, gb, false, 0.1, 1e-5);
        assert_non_null(y1);
        assert_int_equal(tb_batch_norm_fold(tw, bias, trm, trv, gw, gb, 1e-5, &wf, &bf), TB_OK);
        y2 = tb_conv2d(tx, wf, bf, NULL, NULL, NULL, 1);
        assert_int_equal(tb_tensor_to_host(y1, a, sizeof a), TB_OK);
        assert_int_equal(tb_tensor_to_host(y2, b, sizeof b), TB_OK);
        for (i = 0; i < 72; i++)
            assert_true(fabs(a[i] - b[i]) <= 1e-12 * (1 + fabs(a[i])));
        tb_tensor_release(y2);
        tb_tensor_release(wf);
        tb_tensor_release(bf);
        tb_tensor_release(y1);
        tb_tensor_release(c1);
    }
    /* errors: both outputs NULL, the inputs untouched */
    wf = bf = tx;
    assert_int_equal(tb_batch_norm_fold(tw, NULL, trm, tx, NULL, NULL, 1e-5, &wf, &bf),
                     TB_ERR_SHAPE);
    assert_null(wf);
    assert_null(bf);
    assert_int_equal(tb_batch_norm_fold(tw, NULL, trm, trv, NULL, NULL, 0.0, &wf, &bf),
                     TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_batch_norm_fold(NULL, NULL, trm, trv, NULL, NULL, 1e-5, &wf, &bf),
                     TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_batch_norm_fold(tw, NULL, trm, trv, NULL, NULL, 1e-5, NULL, &bf),
                     TB_ERR_INVALID_ARGUMENT);
    tb_tensor_release(tbe);
    tb_tensor_release(tg);
    tb_tensor_release(trv);
    tb_tensor_release(trm);
    tb_tensor_release(tcb);
    tb_tensor_release(tw);
    tb_tensor_release(tx);
}

#define REFUSED(call, status)                                                                      \
    do {                                                                                           \
        tb_clear_error();                                                                          \
        assert_null(call);                                                                         \
        assert_int_equal(tb_last_status(), status);                                                \
        assert_true(strlen(tb_last_error()) > 0);                                                  \
    } while (0)

static void test_errors(void **state) {
    tb_shape s23 = tb_shape_of(TB_F32, 2, 2, 3), s43 = tb_shape_of(TB_F32, 2, 4, 3),
             s4 = tb_shape_of(TB_F32, 1, 4), si = tb_shape_of(TB_I64, 1, 2),
             sb = tb_shape_of(TB_BOOL, 2, 2, 3), sb5 = tb_shape_of(TB_BOOL, 1, 5),
             sd = tb_shape_of(TB_F64, 2, 2, 3), s2x1 = tb_shape_of(TB_F32, 3, 1, 2, 1);
    tb_tensor *x = tb_zeros(&s23, NULL), *w = tb_zeros(&s43, NULL), *v4 = tb_zeros(&s4, NULL),
              *idx = tb_zeros(&si, NULL), *m = tb_zeros(&sb, NULL), *m5 = tb_zeros(&sb5, NULL),
              *xd = tb_zeros(&sd, NULL), *x1 = tb_zeros(&s2x1, NULL);
    int64_t size[2] = {4, 4}, bad[2] = {0, 4};
    (void)state;
    REFUSED(tb_linear(NULL, w, NULL), TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_linear(x, v4, NULL), TB_ERR_SHAPE);
    REFUSED(tb_linear(v4, w, NULL), TB_ERR_SHAPE);
    REFUSED(tb_linear(x, w, x), TB_ERR_SHAPE);
    REFUSED(tb_linear(xd, w, NULL), TB_ERR_DTYPE);
    REFUSED(tb_linear(idx, w, NULL), TB_ERR_DTYPE);
    REFUSED(tb_embedding(x, w), TB_ERR_DTYPE);
    REFUSED(tb_embedding(idx, v4), TB_ERR_SHAPE);
    REFUSED(tb_embedding(NULL, w), TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_hardtanh(x, 2.0, 1.0), TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_relu6(idx), TB_ERR_DTYPE);
    REFUSED(tb_hardswish(NULL), TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_tril(v4, 0), TB_ERR_SHAPE);
    REFUSED(tb_masked_fill(x, x, 1.0), TB_ERR_DTYPE);
    REFUSED(tb_masked_fill(x, m5, 1.0), TB_ERR_SHAPE);
    REFUSED(tb_batch_norm(x, NULL, NULL, NULL, NULL, false, 0.1, 1e-5), TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_batch_norm(x, v4, v4, NULL, NULL, true, 0.1, 1e-5), TB_ERR_SHAPE);
    REFUSED(tb_batch_norm(x, NULL, NULL, NULL, NULL, true, 1.5, 1e-5), TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_batch_norm(x, NULL, NULL, NULL, NULL, true, 0.1, 0.0), TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_batch_norm(v4, NULL, NULL, NULL, NULL, true, 0.1, 1e-5), TB_ERR_SHAPE);
    REFUSED(tb_batch_norm(x1, NULL, NULL, NULL, NULL, true, 0.1, 1e-5), TB_ERR_SHAPE);
    REFUSED(tb_scaled_dot_product_attention(x, w, x, NULL, 0.0, false, 0.0), TB_ERR_SHAPE);
    REFUSED(tb_scaled_dot_product_attention(x, x, xd, NULL, 0.0, false, 0.0), TB_ERR_DTYPE);
    REFUSED(tb_scaled_dot_product_attention(x, x, x, m, 0.0, true, 0.0), TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_scaled_dot_product_attention(x, x, x, NULL, 1.0, false, 0.0),
            TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_scaled_dot_product_attention(x, x, x, NULL, 0.0, false, -1.0),
            TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_scaled_dot_product_attention(x, x, x, idx, 0.0, false, 0.0), TB_ERR_DTYPE);
    REFUSED(tb_scaled_dot_product_attention(NULL, x, x, NULL, 0.0, false, 0.0),
            TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_interpolate(x, size, 2, TB_INTERPOLATE_NEAREST, false), TB_ERR_SHAPE);
    REFUSED(tb_interpolate(x1, size, 1, TB_INTERPOLATE_NEAREST, true), TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_interpolate(x1, bad, 1, TB_INTERPOLATE_BILINEAR, false), TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_interpolate(x1, size, 1, (tb_interpolate_mode)7, false), TB_ERR_INVALID_ARGUMENT);
    REFUSED(tb_interpolate(x1, NULL, 1, TB_INTERPOLATE_NEAREST, false), TB_ERR_INVALID_ARGUMENT);
    tb_tensor_release(x1);
    tb_tensor_release(xd);
    tb_tensor_release(m5);
    tb_tensor_release(m);
    tb_tensor_release(idx);
    tb_tensor_release(v4);
    tb_tensor_release(w);
    tb_tensor_release(x);
}

/* An embedding's gradient is one matmul (the index's one-hot rows transposed times the
   gradient), on every backend: tokens that repeat sum into their row, rows no token reads stay
   0, in f32 and f64 and with an i32 index. */
static void embedding_grad_case(const char *device, tb_dtype dt, tb_dtype it) {
    int64_t iv[7] = {0, 2, 2, 4, 0, 2, 4};
    double wv[15], cv[21], want[15], got[15];
    tb_shape ws = tb_shape_of(TB_F64, 2, 5, 3), cs = tb_shape_of(TB_F64, 2, 7, 3),
             is = tb_shape_of(TB_I64, 1, 7);
    tb_device dev;
    tb_tensor *idx64, *idx, *w64, *w, *c64, *c, *y, *yc, *loss, *gw = NULL, *g64;
    char *ir;
    int i, d;
    if (tb_device_make(device, 0, &dev) != TB_OK) {
        tb_clear_error();
        return;
    }
    for (i = 0; i < 15; i++) {
        wv[i] = 0.1 * i - 0.7;
        want[i] = 0;
    }
    for (i = 0; i < 21; i++)
        cv[i] = 0.25 * (i % 5) - 0.5 + 0.01 * i;
    for (i = 0; i < 7; i++)
        for (d = 0; d < 3; d++)
            want[iv[i] * 3 + d] += cv[i * 3 + d];
    idx64 = tb_tensor_from_host(iv, &is, &dev);
    w64 = tb_tensor_from_host(wv, &ws, &dev);
    c64 = tb_tensor_from_host(cv, &cs, &dev);
    idx = tb_cast(idx64, it);
    w = tb_cast(w64, dt);
    c = tb_cast(c64, dt);
    assert_non_null(idx);
    assert_non_null(w);
    assert_non_null(c);
    assert_int_equal(tb_set_requires_grad(w, true), TB_OK);
    y = tb_embedding(idx, w);
    yc = tb_mul(y, c);
    loss = tb_sum(yc, NULL, 0, false);
    assert_non_null(loss);
    assert_int_equal(tb_grad(loss, NULL, &w, 1, &gw), TB_OK);
    ir = tb_ir_text(&gw, 1);
    assert_non_null(ir);
    if (strstr(ir, "matmul") == NULL)
        fail_msg("%s: the embedding's gradient has no matmul:\n%s", device, ir);
    tb_free(ir);
    g64 = tb_cast(gw, TB_F64);
    assert_int_equal(tb_tensor_to_host(g64, got, sizeof got), TB_OK);
    for (i = 0; i < 15; i++)
        if (fabs(got[i] - want[i]) > (dt == TB_F64 ? 1e-12 : 1e-6))
            fail_msg("%s %s: gradient[%d] %.9g, want %.9g", device, tb_dtype_name(dt), i, got[i],
                     want[i]);
    tb_tensor_release(g64);
    tb_tensor_release(gw);
    tb_tensor_release(loss);
    tb_tensor_release(yc);
    tb_tensor_release(y);
    tb_tensor_release(c);
    tb_tensor_release(w);
    tb_tensor_release(idx);
    tb_tensor_release(c64);
    tb_tensor_release(w64);
    tb_tensor_release(idx64);
}

static void test_embedding_grad(void **state) {
    const char *devices[3] = {"cpu", "native", "opencl"};
    int i;
    (void)state;
    for (i = 0; i < 3; i++) {
        embedding_grad_case(devices[i], TB_F32, TB_I64);
        embedding_grad_case(devices[i], TB_F64, TB_I32);
    }
}

/* ---- optimizer state ---- */

/* loss = sum((p0 @ data - 1)^2) + sum(p1^3): a few steps of opt. */
static void train_steps(tb_optimizer *opt, tb_tensor *p0, tb_tensor *p1, tb_tensor *data,
                        int steps) {
    int i;
    for (i = 0; i < steps; i++) {
        tb_tensor *params[2] = {p0, p1}, *grads[2] = {NULL, NULL};
        tb_tensor *a = tb_matmul(p0, data), *b = tb_sub_scalar(a, 1.0), *c = tb_mul(b, b);
        tb_tensor *d = tb_mul(p1, tb_mul(p1, p1)), *l0 = tb_sum(c, NULL, 0, false),
                  *l1 = tb_sum(d, NULL, 0, false), *loss = tb_add(l0, l1);
        assert_int_equal(tb_grad(loss, NULL, params, 2, grads), TB_OK);
        assert_int_equal(tb_optimizer_step(opt, grads, &loss, 1), TB_OK);
        tb_tensor_release(grads[0]);
        tb_tensor_release(grads[1]);
        tb_tensor_release(loss);
        tb_tensor_release(l1);
        tb_tensor_release(l0);
        tb_tensor_release(d);
        tb_tensor_release(c);
        tb_tensor_release(b);
        tb_tensor_release(a);
    }
}

static void optimizer_resume(const tb_optimizer_desc *desc, const char *device) {
    double d0[6] = {0.3, -0.2, 0.5, 0.1, 0.4, -0.6}, d1[3] = {0.2, -0.4, 0.9};
    double data[12] = {1, 2, 0.5, -1, 0.3, 0.7, -0.2, 0.4, 1.5, -0.3, 0.2, 0.1};
    double a0[6], b0[6], a1[3], b1[3];
    tb_shape s0 = tb_shape_of(TB_F64, 2, 2, 3), s1 = tb_shape_of(TB_F64, 1, 3),
             sd = tb_shape_of(TB_F64, 2, 3, 4);
    tb_device dev;
    tb_tensor *p0, *p1, *q0, *q1, *td, *params[2];
    tb_optimizer *o1, *o2;
    tb_tensor_set *set, *back;
    char path[] = "/tmp/tb_layers_state_XXXXXX";
    int fd, i;
    if (tb_device_make(device, 0, &dev) != TB_OK) {
        tb_clear_error();
        return;
    }
    p0 = tb_tensor_from_host(d0, &s0, &dev);
    p1 = tb_tensor_from_host(d1, &s1, &dev);
    td = tb_tensor_from_host(data, &sd, &dev);
    params[0] = p0;
    params[1] = p1;
    o1 = tb_optimizer_new(desc, params, 2);
    assert_non_null(o1);
    train_steps(o1, p0, p1, td, 3);
    /* checkpoint: parameters and state in one file */
    set = tb_tensor_set_new();
    assert_int_equal(tb_tensor_set_add(set, "p0", p0), TB_OK);
    assert_int_equal(tb_tensor_set_add(set, "p1", p1), TB_OK);
    assert_int_equal(tb_optimizer_state_save(o1, set, "optim."), TB_OK);
    assert_int_equal(tb_optimizer_state_save(o1, set, "optim."), TB_ERR_DUPLICATE);
    fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(tb_safetensors_save(path, set), TB_OK);
    tb_tensor_set_free(set);
    /* the run goes on ... */
    train_steps(o1, p0, p1, td, 2);
    /* ... and another resumes from the file (loaded on the cpu, the state moved over) */
    back = tb_safetensors_load(path, NULL);
    assert_non_null(back);
    unlink(path);
    q0 = tb_to_device(tb_tensor_set_get(back, "p0"), &dev);
    q1 = tb_to_device(tb_tensor_set_get(back, "p1"), &dev);
    params[0] = q0;
    params[1] = q1;
    o2 = tb_optimizer_new(desc, params, 2);
    assert_non_null(o2);
    tb_optimizer_set_lr(o2, desc->lr * 3);
    assert_int_equal(tb_optimizer_state_load(o2, back, "optim."), TB_OK);
    assert_int_equal(tb_optimizer_steps(o2), 3);
    assert_true(tb_optimizer_lr(o2) == desc->lr);
    tb_tensor_set_free(back);
    train_steps(o2, q0, q1, td, 2);
    assert_int_equal(tb_tensor_to_host(p0, a0, sizeof a0), TB_OK);
    assert_int_equal(tb_tensor_to_host(q0, b0, sizeof b0), TB_OK);
    assert_int_equal(tb_tensor_to_host(p1, a1, sizeof a1), TB_OK);
    assert_int_equal(tb_tensor_to_host(q1, b1, sizeof b1), TB_OK);
    for (i = 0; i < 6; i++)
        assert_true(fabs(a0[i] - b0[i]) <= 1e-13 * (1 + fabs(a0[i])));
    for (i = 0; i < 3; i++)
        assert_true(fabs(a1[i] - b1[i]) <= 1e-13 * (1 + fabs(a1[i])));
    for (i = 0; i < 3; i++) /* the restored run moved: it is not the checkpoint's value */
        assert_true(a1[i] != d1[i]);
    tb_optimizer_free(o2);
    tb_optimizer_free(o1);
    tb_tensor_release(q1);
    tb_tensor_release(q0);
    tb_tensor_release(td);
    tb_tensor_release(p1);
    tb_tensor_release(p0);
}

static void test_optimizer_resume(void **state) {
    tb_optimizer_desc sgd = tb_sgd_desc(0.05), adam = tb_adam_desc(0.01),
                      adamw = tb_adamw_desc(0.02);
    (void)state;
    sgd.momentum = 0.9;
    optimizer_resume(&sgd, "cpu");
    optimizer_resume(&adam, "cpu");
    optimizer_resume(&adamw, "cpu");
    optimizer_resume(&adamw, "native");
    optimizer_resume(&adam, "opencl");
}

static void test_optimizer_state_errors(void **state) {
    double v[3] = {1, 2, 3}, keep[3];
    tb_shape s = tb_shape_of(TB_F64, 1, 3), s2 = tb_shape_of(TB_F64, 1, 2);
    tb_tensor *p = tb_tensor_from_host(v, &s, NULL), *bad = tb_zeros(&s2, NULL);
    tb_optimizer_desc adam = tb_adam_desc(0.01), sgd = tb_sgd_desc(0.1);
    tb_optimizer *o = tb_optimizer_new(&adam, &p, 1), *os = tb_optimizer_new(&sgd, &p, 1);
    tb_tensor_set *set = tb_tensor_set_new(), *other = tb_tensor_set_new();
    tb_tensor *grad = tb_full(&s, 0.5, NULL);
    (void)state;
    assert_int_equal(tb_optimizer_step(o, &grad, NULL, 0), TB_OK);
    assert_int_equal(tb_optimizer_state_save(NULL, set, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_optimizer_state_save(o, NULL, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_optimizer_state_save(o, set, NULL), TB_OK);
    assert_non_null(tb_tensor_set_get(set, "state.0.exp_avg_sq"));
    assert_string_equal(tb_tensor_set_metadata(set, "kind"), "adam");
    assert_string_equal(tb_tensor_set_metadata(set, "steps"), "1");
    /* the kind must match; nothing changes on error */
    assert_int_equal(tb_optimizer_state_load(os, set, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_int_equal(tb_optimizer_steps(os), 0);
    /* a missing entry, a wrong shape, a bad count: named, and the state is kept */
    assert_int_equal(tb_tensor_set_add(other, "state.0.exp_avg", bad), TB_OK);
    assert_int_equal(tb_tensor_set_set_metadata(other, "kind", "adam"), TB_OK);
    assert_int_equal(tb_tensor_set_set_metadata(other, "steps", "x1"), TB_OK);
    assert_int_equal(tb_tensor_set_set_metadata(other, "lr", "0.5"), TB_OK);
    assert_int_equal(tb_optimizer_state_load(o, other, NULL), TB_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tb_last_error(), "steps"));
    assert_int_equal(tb_tensor_set_set_metadata(other, "steps", "4"), TB_OK);
    assert_int_equal(tb_optimizer_state_load(o, other, NULL), TB_ERR_SHAPE);
    assert_non_null(strstr(tb_last_error(), "state.0.exp_avg"));
    assert_int_equal(tb_optimizer_state_load(o, other, "pre."), TB_ERR_NOT_FOUND);
    assert_int_equal(tb_optimizer_steps(o), 1);
    assert_true(tb_optimizer_lr(o) == 0.01);
    assert_int_equal(tb_tensor_to_host(p, keep, sizeof keep), TB_OK);
    assert_true(keep[0] < 1.0); /* one step of Adam moved it */
    assert_int_equal(tb_optimizer_state_load(o, set, NULL), TB_OK);
    assert_int_equal(tb_optimizer_steps(o), 1);
    tb_tensor_set_free(other);
    tb_tensor_set_free(set);
    tb_optimizer_free(os);
    tb_optimizer_free(o);
    tb_tensor_release(grad);
    tb_tensor_release(bad);
    tb_tensor_release(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_torch),          cmocka_unit_test(test_native_against_cpu),
        cmocka_unit_test(test_opencl_against_cpu),     cmocka_unit_test(test_attention_dropout),
        cmocka_unit_test(test_batch_norm_fold),        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_embedding_grad),         cmocka_unit_test(test_optimizer_resume),
        cmocka_unit_test(test_optimizer_state_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
