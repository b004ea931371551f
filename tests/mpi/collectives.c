/* The collectives of the `mpi` process group against a serial computation, run under the MPI
   launcher on 1, 2 and 3 ranks by tools/test.sh:

       mpirun -np 3 build/mpi/collectives

   Every dtype and reduce op, odd sizes and sizes that do not divide by the world size, every
   root; collectives recorded inside graphs with ops before and after them, synced once; ranks
   that call different collectives (eagerly recorded or inside a graph), a rank without a
   tensor, a rank whose input fails when the graph runs and a bad shape must give an error on
   every rank (and the group must go on working afterwards). Prints one line per rank and exits
   non-zero when a check failed. The tensors are on the default device (TB_DEVICE picks another
   backend's). */
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank_, size_, passed, failed;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            passed++;                                                                              \
        } else {                                                                                   \
            failed++;                                                                              \
            fprintf(stderr, "rank %d: line %d: ", rank_, __LINE__);                                \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " (%s)\n", tb_last_error());                                           \
        }                                                                                          \
    } while (0)

static const tb_dtype dtypes[] = {TB_F32, TB_F64, TB_I32, TB_I64, TB_U8, TB_BOOL, TB_F16, TB_BF16};
static const tb_reduce_op ops[] = {TB_REDUCE_SUM, TB_REDUCE_MEAN, TB_REDUCE_MAX, TB_REDUCE_MIN,
                                   TB_REDUCE_PRODUCT};

/* Rank r's element i: small values, exact in every dtype and under every op on 3 ranks. */
static double value(tb_dtype dt, int r, int64_t i) {
    if (dt == TB_BOOL) return (double)(((i + r) % 3) != 0);
    if (dt == TB_U8) return (double)((i * 7 + r * 3) % 5);
    if (dt == TB_I32 || dt == TB_I64) return (double)((i * 5 + r * 11) % 9 - 4);
    return 0.5 * (double)((i * 3 + r * 5) % 11) - 2.0;
}

static double reduce(tb_dtype dt, tb_reduce_op op, int64_t i) {
    double acc = value(dt, 0, i);
    int r;
    for (r = 1; r < size_; r++) {
        double v = value(dt, r, i);
        if (op == TB_REDUCE_SUM || op == TB_REDUCE_MEAN) acc += v;
        if (op == TB_REDUCE_MAX) acc = v > acc ? v : acc;
        if (op == TB_REDUCE_MIN) acc = v < acc ? v : acc;
        if (op == TB_REDUCE_PRODUCT) acc *= v;
    }
    if (op == TB_REDUCE_MEAN) acc /= size_;
    if (dt == TB_BOOL) acc = acc != 0.0;
    return acc;
}

static void put(void *buf, tb_dtype dt, int64_t i, double v) {
    switch (dt) {
    case TB_F32:
        ((float *)buf)[i] = (float)v;
        break;
    case TB_F64:
        ((double *)buf)[i] = v;
        break;
    case TB_I32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case TB_I64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    case TB_U8:
        ((uint8_t *)buf)[i] = (uint8_t)v;
        break;
    case TB_F16:
        ((uint16_t *)buf)[i] = tb_f32_to_f16((float)v);
        break;
    case TB_BF16:
        ((uint16_t *)buf)[i] = tb_f32_to_bf16((float)v);
        break;
    default:
        ((bool *)buf)[i] = v != 0.0;
        break;
    }
}

static double get(const void *buf, tb_dtype dt, int64_t i) {
    switch (dt) {
    case TB_F32:
        return ((const float *)buf)[i];
    case TB_F64:
        return ((const double *)buf)[i];
    case TB_I32:
        return ((const int32_t *)buf)[i];
    case TB_I64:
        return (double)((const int64_t *)buf)[i];
    case TB_U8:
        return ((const uint8_t *)buf)[i];
    case TB_F16:
        return tb_f16_to_f32(((const uint16_t *)buf)[i]);
    case TB_BF16:
        return tb_bf16_to_f32(((const uint16_t *)buf)[i]);
    default:
        return ((const bool *)buf)[i] ? 1.0 : 0.0;
    }
}

/* Whether a reduced value is right: floats to their precision (f16 and bf16 reduce in f32 and
   round once), the others exactly. */
static bool close_enough(tb_dtype dt, double got, double want) {
    double tol = dt == TB_F32 ? 1e-6 : dt == TB_F16 ? 1e-3 : dt == TB_BF16 ? 8e-3 : 0.0;
    return fabs(got - want) <= tol * (1 + fabs(want));
}

/* Rank r's tensor of `rows` x `cols` (cols 0: a vector; rows < 0: a scalar). */
static tb_tensor *input(tb_dtype dt, int r, int64_t rows, int64_t cols) {
    int64_t dims[2] = {rows, cols}, n, i;
    tb_shape s;
    void *buf;
    tb_tensor *t;
    int32_t rank = rows < 0 ? 0 : cols > 0 ? 2 : 1;
    if (tb_shape_make(&s, dt, rank, dims) != TB_OK) return NULL;
    n = rows < 0 ? 1 : cols > 0 ? rows * cols : rows;
    buf = calloc((size_t)n + 1, 8);
    for (i = 0; i < n; i++)
        put(buf, dt, i, value(dt, r, i));
    t = tb_tensor_from_host(buf, &s, NULL);
    free(buf);
    return t;
}

/* The values of t into a new host array, NULL on failure. */
static void *values(tb_tensor *t, int64_t *n) {
    tb_shape s = tb_tensor_shape(t);
    size_t bytes = 0;
    void *buf;
    tb_shape_nbytes(&s, &bytes);
    tb_shape_numel(&s, n);
    buf = malloc(bytes + 8);
    if (tb_tensor_to_host(t, buf, bytes) != TB_OK) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void test_all_reduce(tb_process_group *g) {
    static const int64_t sizes[] = {0, 1, 5, 17, 1031};
    size_t d, o, k;
    for (d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        for (o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
                tb_dtype dt = dtypes[d];
                tb_tensor *x = input(dt, rank_, sizes[k], 0);
                tb_tensor *y = tb_all_reduce(g, x, ops[o]);
                int64_t n = 0, i, bad = 0;
                void *v;
                if (ops[o] == TB_REDUCE_MEAN && !tb_dtype_is_float(dt)) {
                    CHECK(y == NULL && tb_last_status() == TB_ERR_DTYPE, "mean of %s refused",
                          tb_dtype_name(dt));
                    tb_clear_error();
                    tb_tensor_release(x);
                    continue;
                }
                CHECK(y != NULL, "all_reduce %s %s [%lld]", tb_dtype_name(dt),
                      tb_reduce_op_name(ops[o]), (long long)sizes[k]);
                v = y != NULL ? values(y, &n) : NULL;
                for (i = 0; v != NULL && i < n; i++) {
                    double want = reduce(dt, ops[o], i), got = get(v, dt, i);
                    if (!close_enough(dt, got, want)) bad++;
                }
                if (y != NULL) {
                    CHECK(v != NULL && n == sizes[k] && bad == 0,
                          "all_reduce %s %s [%lld]: %lld wrong values", tb_dtype_name(dt),
                          tb_reduce_op_name(ops[o]), (long long)sizes[k], (long long)bad);
                }
                free(v);
                tb_tensor_release(x);
                tb_tensor_release(y);
                tb_clear_error();
            }
        }
    }
}

static void test_all_gather(tb_process_group *g) {
    static const int64_t rows[] = {-1, 0, 1, 3, 7};
    size_t d, k;
    for (d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        for (k = 0; k < sizeof rows / sizeof rows[0]; k++) {
            tb_dtype dt = dtypes[d];
            int64_t cols = rows[k] == 3 ? 0 : 3,
                    per = rows[k] < 0 ? 1 : rows[k] * (cols ? cols : 1);
            tb_tensor *x = input(dt, rank_, rows[k], cols);
            tb_tensor *y = tb_all_gather(g, x);
            tb_shape s = tb_tensor_shape(y);
            int64_t n = 0, i, bad = 0;
            void *v = y != NULL ? values(y, &n) : NULL;
            CHECK(y != NULL && n == per * size_ &&
                      s.dims[0] == (rows[k] < 0 ? size_ : rows[k] * size_),
                  "all_gather %s rows %lld", tb_dtype_name(dt), (long long)rows[k]);
            for (i = 0; v != NULL && i < n; i++) {
                if (get(v, dt, i) != value(dt, (int)(i / per), i % per)) bad++;
            }
            CHECK(bad == 0, "all_gather %s rows %lld: %lld wrong", tb_dtype_name(dt),
                  (long long)rows[k], (long long)bad);
            free(v);
            tb_tensor_release(x);
            tb_tensor_release(y);
        }
    }
}

static void test_reduce_scatter(tb_process_group *g) {
    static const int64_t blocks[] = {0, 1, 3};
    size_t d, o, k;
    for (d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        for (o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            for (k = 0; k < sizeof blocks / sizeof blocks[0]; k++) {
                tb_dtype dt = dtypes[d];
                tb_tensor *x = input(dt, rank_, blocks[k] * size_, 2);
                tb_tensor *y = tb_reduce_scatter(g, x, ops[o]);
                int64_t n = 0, i, bad = 0, per = blocks[k] * 2;
                void *v;
                if (ops[o] == TB_REDUCE_MEAN && !tb_dtype_is_float(dt)) {
                    CHECK(y == NULL && tb_last_status() == TB_ERR_DTYPE, "mean refused");
                    tb_clear_error();
                    tb_tensor_release(x);
                    continue;
                }
                v = y != NULL ? values(y, &n) : NULL;
                CHECK(v != NULL && n == per, "reduce_scatter %s %s %lld", tb_dtype_name(dt),
                      tb_reduce_op_name(ops[o]), (long long)blocks[k]);
                for (i = 0; v != NULL && i < n; i++) {
                    double want = reduce(dt, ops[o], rank_ * per + i), got = get(v, dt, i);
                    if (!close_enough(dt, got, want)) bad++;
                }
                CHECK(bad == 0, "reduce_scatter %s %s: %lld wrong", tb_dtype_name(dt),
                      tb_reduce_op_name(ops[o]), (long long)bad);
                free(v);
                tb_tensor_release(x);
                tb_tensor_release(y);
            }
        }
    }
    if (size_ > 1) { /* a dim 0 that does not split: an error on every rank */
        tb_tensor *x = input(TB_F32, rank_, 2 * size_ + 1, 0);
        tb_tensor *y = tb_reduce_scatter(g, x, TB_REDUCE_SUM);
        CHECK(y == NULL && tb_last_status() == TB_ERR_SHAPE, "uneven reduce_scatter refused");
        tb_clear_error();
        tb_tensor_release(x);
    }
}

static void test_broadcast(tb_process_group *g) {
    size_t d;
    int root;
    for (d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        for (root = 0; root < size_; root++) {
            tb_dtype dt = dtypes[d];
            tb_tensor *x = input(dt, rank_, 13, 0);
            tb_tensor *y = tb_broadcast(g, x, root);
            int64_t n = 0, i, bad = 0;
            void *v = y != NULL ? values(y, &n) : NULL;
            CHECK(v != NULL && n == 13, "broadcast %s from %d", tb_dtype_name(dt), root);
            for (i = 0; v != NULL && i < n; i++)
                bad += get(v, dt, i) != value(dt, root, i);
            CHECK(bad == 0, "broadcast %s from %d: %lld wrong", tb_dtype_name(dt), root,
                  (long long)bad);
            free(v);
            tb_tensor_release(x);
            tb_tensor_release(y);
        }
    }
}

/* Collectives inside graphs, with ops before and after them, synced once:
   y = all_reduce(x * 2) + 1, g = all_gather(exp(x)) * 2, b = broadcast(all_reduce(x, max) * 3,
   last rank) - 1 and s = reduce_scatter(x2) of an i32 tensor, against the serial computation.
   Twice: the second time every graph around the collectives comes from the cache. */
static void test_in_a_graph(tb_process_group *g) {
    int round;
    for (round = 0; round < 2; round++) {
        tb_tensor *x = input(TB_F32, rank_, 7, 0), *xi = input(TB_I32, rank_, 2 * size_, 3);
        tb_tensor *a = tb_mul_scalar(x, 2.0), *r = tb_all_reduce(g, a, TB_REDUCE_SUM);
        tb_tensor *y = tb_add_scalar(r, 1.0), *e = tb_exp(x), *ge = tb_all_gather(g, e);
        tb_tensor *gg = tb_mul_scalar(ge, 2.0), *mx = tb_all_reduce(g, x, TB_REDUCE_MAX);
        tb_tensor *m3 = tb_mul_scalar(mx, 3.0), *bc = tb_broadcast(g, m3, size_ - 1);
        tb_tensor *b = tb_sub_scalar(bc, 1.0), *x2 = tb_add(xi, xi);
        tb_tensor *sc = tb_reduce_scatter(g, x2, TB_REDUCE_SUM);
        tb_tensor *outs[4];
        float vy[7], vg[64], vb[7];
        int32_t vs[6];
        int64_t i;
        int bad = 0;
        outs[0] = y, outs[1] = gg, outs[2] = b, outs[3] = sc;
        tb_metrics_reset();
        CHECK(y != NULL && gg != NULL && b != NULL && sc != NULL && tb_sync(outs, 4) == TB_OK,
              "collectives in a graph, synced once (round %d)", round);
        CHECK(tb_metrics_counter("CollectiveOnHost") == 5, "five collectives ran on the host");
        if (round == 1) {
            CHECK(tb_metrics_counter("UncachedCompile") == 0,
                  "the graphs around the collectives from the cache");
        }
        if (tb_tensor_to_host(y, vy, sizeof vy) == TB_OK &&
            tb_tensor_to_host(gg, vg, (size_t)(7 * size_) * sizeof(float)) == TB_OK &&
            tb_tensor_to_host(b, vb, sizeof vb) == TB_OK &&
            tb_tensor_to_host(sc, vs, sizeof vs) == TB_OK) {
            for (i = 0; i < 7; i++) {
                double sum = 0, mxv = value(TB_F32, 0, i);
                int q;
                for (q = 0; q < size_; q++) {
                    double v = value(TB_F32, q, i);
                    sum += 2.0 * v;
                    mxv = v > mxv ? v : mxv;
                    bad += !close_enough(TB_F32, vg[q * 7 + i], 2.0 * exp(v));
                }
                bad += !close_enough(TB_F32, vy[i], sum + 1.0);
                bad += !close_enough(TB_F32, vb[i], 3.0 * mxv - 1.0);
            }
            for (i = 0; i < 6; i++) { /* rank r's block: rows 2r, 2r + 1 of [2 * size, 3] */
                double want = 0;
                int q;
                for (q = 0; q < size_; q++)
                    want += 2.0 * value(TB_I32, q, rank_ * 6 + i);
                bad += vs[i] != (int32_t)want;
            }
        } else {
            bad++;
        }
        CHECK(bad == 0, "collectives in a graph: %d wrong values (round %d)", bad, round);
        tb_tensor_release(x), tb_tensor_release(xi), tb_tensor_release(a), tb_tensor_release(r);
        tb_tensor_release(y), tb_tensor_release(e), tb_tensor_release(ge), tb_tensor_release(gg);
        tb_tensor_release(mx), tb_tensor_release(m3), tb_tensor_release(bc), tb_tensor_release(b);
        tb_tensor_release(x2), tb_tensor_release(sc);
        tb_clear_error();
    }
}

/* Ranks that disagree, or a rank without a tensor, or a rank whose input fails: an error on
   every rank, then the group works again. The collectives are lazy: the ranks meet when the
   graph runs. */
static void test_disagreement(tb_process_group *g) {
    tb_tensor *x = input(TB_F32, rank_, 10, 0), *y, *z;
    tb_status st;
    y = rank_ == 0 ? tb_all_reduce(g, x, TB_REDUCE_SUM) : tb_broadcast(g, x, 0);
    st = y != NULL ? tb_sync(&y, 1) : TB_ERR_INTERNAL;
    CHECK(size_ == 1
              ? st == TB_OK
              : st == TB_ERR_STATE && strstr(tb_last_error(), "different collectives") != NULL,
          "different collectives refused on every rank");
    tb_tensor_release(y);
    tb_clear_error();
    z = input(TB_F32, rank_, rank_ == size_ - 1 ? 11 : 10, 0);
    y = tb_all_reduce(g, z, TB_REDUCE_SUM);
    st = y != NULL ? tb_sync(&y, 1) : TB_ERR_INTERNAL;
    CHECK(size_ == 1 ? st == TB_OK : st == TB_ERR_STATE, "different shapes refused on every rank");
    tb_tensor_release(y);
    tb_tensor_release(z);
    tb_clear_error();
    /* rank 0 has no tensor: it meets the others at once, they meet it when they sync */
    y = tb_all_reduce(g, rank_ == 0 ? NULL : x, TB_REDUCE_MAX);
    st = y != NULL ? tb_sync(&y, 1) : tb_last_status();
    CHECK(st != TB_OK && (rank_ == 0) == (y == NULL), "a rank without a tensor: error everywhere");
    tb_tensor_release(y);
    tb_clear_error();
    /* inside a graph: rank 0 all_reduces, the others broadcast; ops before and after */
    {
        tb_tensor *a = tb_mul_scalar(x, 2.0);
        tb_tensor *c = rank_ == 0 ? tb_all_reduce(g, a, TB_REDUCE_SUM) : tb_broadcast(g, a, 0);
        tb_tensor *d = tb_add_scalar(c, 1.0);
        st = d != NULL ? tb_sync(&d, 1) : TB_ERR_INTERNAL;
        CHECK(size_ == 1
                  ? st == TB_OK
                  : st == TB_ERR_STATE && strstr(tb_last_error(), "different collectives") != NULL,
              "different collectives inside a graph refused on every rank");
        tb_tensor_release(d), tb_tensor_release(c), tb_tensor_release(a);
        tb_clear_error();
    }
    /* the last rank's input fails when the graph runs (an index out of range) */
    {
        int64_t idx[10], i;
        tb_shape is = tb_shape_of(TB_I64, 1, 10);
        tb_tensor *index, *picked, *c, *d;
        for (i = 0; i < 10; i++)
            idx[i] = rank_ == size_ - 1 && i == 9 ? 99 : i;
        index = tb_tensor_from_host(idx, &is, NULL);
        picked = tb_gather(x, 0, index);
        c = tb_all_reduce(g, picked, TB_REDUCE_SUM);
        d = tb_add_scalar(c, 1.0);
        st = d != NULL ? tb_sync(&d, 1) : TB_ERR_INTERNAL;
        CHECK(st != TB_OK &&
                  (rank_ == size_ - 1 || strstr(tb_last_error(), "could not take part") != NULL),
              "a rank whose input failed: error everywhere");
        tb_tensor_release(d), tb_tensor_release(c), tb_tensor_release(picked);
        tb_tensor_release(index);
        tb_clear_error();
    }
    y = tb_all_reduce(g, x, TB_REDUCE_SUM);
    CHECK(y != NULL && tb_sync(&y, 1) == TB_OK, "the group works after the errors");
    tb_tensor_release(y);
    CHECK(tb_barrier(g) == TB_OK, "barrier");
    tb_tensor_release(x);
}

int main(void) {
    tb_process_group *g = tb_process_group_get("mpi");
    if (g == NULL) {
        fprintf(stderr, "collectives: %s\n", tb_last_error());
        return 1;
    }
    rank_ = tb_process_group_rank(g);
    size_ = tb_process_group_size(g);
    test_all_reduce(g);
    test_all_gather(g);
    test_reduce_scatter(g);
    test_broadcast(g);
    test_in_a_graph(g);
    test_disagreement(g);
    {
        char dev[64];
        tb_tensor *probe = input(TB_F32, rank_, 1, 0);
        tb_device d = tb_tensor_device(probe);
        tb_device_format(&d, dev, sizeof dev);
        tb_tensor_release(probe);
        printf("collectives: rank %d of %d on %s: %d checks passed, %d failed\n", rank_, size_, dev,
               passed, failed);
    }
    tb_shutdown();
    return failed != 0;
}
