/* The compute cases: each runs on every compiled backend beside PyTorch eager (and a
   hand-written OpenCL kernel, OpenBLAS, CLBlast where they mean something), every result
   checked before anything is timed, all sides timed in alternation. */
#define _GNU_SOURCE
#include "bench.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- our side: the case's ops recorded on one backend, synced, released ---- */

typedef tb_tensor *(*build_fn)(tb_tensor *const *in);

typedef struct ours_ctx {
    const bench_backend *be;
    tb_tensor *in[8];
    int n_in;
    build_fn build;
} ours_ctx;

static void ours_run(void *p) {
    ours_ctx *c = (ours_ctx *)p;
    tb_tensor *y = need(c->build(c->in), "the case's ops");
    sync_on(y, c->be);
    tb_tensor_release(y);
}

/* Uploads the inputs to `be` and checks one result against `want`. */
static void ours_prepare(ours_ctx *c, const bench_backend *be, const torch_input *in, int n_in,
                         build_fn build, const char *name, const float *want, size_t out_n,
                         double atol, double rtol) {
    char what[128];
    tb_tensor *y;
    float *got;
    int i;
    memset(c, 0, sizeof *c);
    c->be = be;
    c->n_in = n_in;
    c->build = build;
    for (i = 0; i < n_in; i++)
        c->in[i] = upload(in[i].data, in[i].rank, in[i].dims, &be->dev);
    y = need(build(c->in), name);
    if (numel_of(y) != out_n)
        die("%s on %s: %zu elements, expected %zu", name, be->name, numel_of(y), out_n);
    got = to_host(y);
    snprintf(what, sizeof what, "%s (%s vs the reference)", name, be->name);
    check_close(what, got, want, out_n, atol, rtol);
    free(got);
    tb_tensor_release(y);
}

static void ours_release(ours_ctx *c) {
    int i;
    for (i = 0; i < c->n_in; i++)
        tb_tensor_release(c->in[i]);
}

/* PyTorch's side: loaded and checked; 0 when PyTorch cannot run it. */
static int torch_prepare(side *s, const char *kase, const char *name, const torch_input *in,
                         int n_in, const float *want, size_t out_n, double atol, double rtol) {
    char what[128];
    float *got = torch_setup(kase, in, n_in, out_n);
    if (got == NULL) return 0;
    snprintf(what, sizeof what, "%s (PyTorch vs the reference)", name);
    check_close(what, got, want, out_n, atol, rtol);
    free(got);
    memset(s, 0, sizeof *s);
    s->name = "pytorch";
    s->timed = torch_timed;
    return 1;
}

/* ======================================================================================
   the bandwidth-bound cases: chain8, add, gates, sum, max, row_sums, softmax, layer_norm
   ====================================================================================== */

typedef struct bw_case {
    const char *name;  /* the row's name */
    const char *torch; /* torch_peer.py's case */
    torch_input in[3];
    int n_in;
    build_fn build;
    const float *want; /* the reference result */
    size_t out_n;
    double atol, rtol;           /* our check */
    double peer_atol, peer_rtol; /* PyTorch's and the hand-written kernel's */
    double bytes;                /* the least traffic: every input read, the output written */
    int writes;                  /* whether the output is more than a few floats */
    hand *(*make_hand)(const struct bw_case *c, cl_mem *in);
    int max; /* for make_hand */
    int64_t rows, cols;
} bw_case;

static void run_bw_case(const bw_case *d) {
    ours_ctx ours[NUM_BACKENDS];
    side sides[NUM_BACKENDS + 3];
    int on[NUM_BACKENDS], ns = 0, b, reps, torch_i = -1, hand_i = -1, bound_i = -1;
    hand *h = NULL;
    memset(sides, 0, sizeof sides);
    for (b = 0; b < NUM_BACKENDS; b++) {
        on[b] = -1;
        if (!g_backends[b].ok) continue;
        ours_prepare(&ours[b], &g_backends[b], d->in, d->n_in, d->build, d->name, d->want, d->out_n,
                     d->atol, d->rtol);
        on[b] = ns;
        sides[ns].name = g_backends[b].name;
        sides[ns].run = ours_run;
        sides[ns++].ctx = &ours[b];
    }
    if (g_backends[0].ok && d->make_hand != NULL) {
        cl_mem mem[3];
        size_t n;
        float *got;
        char what[128];
        int i;
        for (i = 0; i < d->n_in; i++)
            mem[i] = tensor_mem(ours[0].in[i]);
        h = d->make_hand(d, mem);
        hand_run(h);
        got = hand_result(h, &n);
        snprintf(what, sizeof what, "%s (hand-written kernel vs the reference)", d->name);
        check_close(what, got, d->want, n, d->peer_atol, d->peer_rtol);
        free(got);
        note("%s hand-written kernel: %s", d->name, hand_about(h));
        hand_i = ns;
        sides[ns].name = hand_label(h);
        sides[ns].run = hand_run;
        sides[ns++].ctx = h;
    }
    if (torch_prepare(&sides[ns], d->torch, d->name, d->in, d->n_in, d->want, d->out_n,
                      d->peer_atol, d->peer_rtol))
        torch_i = ns++;
    if (ns == 0) return;
    if (bound_side(&sides[ns], d->bytes, d->writes)) bound_i = ns++;
    /* every side streams from memory, as the bound does: nothing left in the caches by the
       side before (a 16M-float tensor is about the size of the caches here) */
    for (b = 0; b < ns; b++)
        sides[b].flush = 1;
    reps = measure(sides, ns, 0);
    note_faults(d->name, sides, ns);
    for (b = 0; b < NUM_BACKENDS; b++) {
        row r;
        if (on[b] < 0) continue;
        r = row_new(d->name, g_backends[b].name);
        r.ours = sides[on[b]].t;
        if (torch_i >= 0 && torch_ok()) r.torch = sides[torch_i].t;
        r.writes = d->writes;
        r.bound = bound_i >= 0 ? sides[bound_i].t : bound_time(d->bytes, d->writes);
        /* "bandwidth" rows get the final bandwidth's bound once it is measured */
        snprintf(r.bound_kind, sizeof r.bound_kind, "%s",
                 bound_i >= 0 ? "bandwidth_side" : "bandwidth");
        if (g_backends[b].opencl && hand_i >= 0) {
            snprintf(r.anchor_name, sizeof r.anchor_name, "%s", hand_label(h));
            r.anchor = sides[hand_i].t;
        }
        snprintf(r.unit, sizeof r.unit, "GB/s");
        r.value = d->bytes / r.ours / 1e9;
        r.bytes = d->bytes;
        r.reps = reps;
        add_row(&r);
    }
    for (b = 0; b < NUM_BACKENDS; b++)
        if (on[b] >= 0) ours_release(&ours[b]);
    hand_free(h);
}

/* ---- chain8 and add ---- */

static tb_tensor *chain8_build(tb_tensor *const *in) {
    tb_tensor *x = in[0], *t[8];
    int i;
    t[0] = tb_mul_scalar(x, 1.5);
    t[1] = tb_add_scalar(t[0], 0.5);
    t[2] = tb_relu(t[1]);
    t[3] = tb_mul(t[2], x);
    t[4] = tb_sub_scalar(t[3], 0.25);
    t[5] = tb_abs(t[4]);
    t[6] = tb_neg(t[5]);
    t[7] = tb_exp(t[6]);
    for (i = 0; i < 7; i++)
        tb_tensor_release(t[i]);
    return t[7];
}

static tb_tensor *add_build(tb_tensor *const *in) {
    return tb_add(in[0], in[1]);
}

static hand *elementwise_hand(const bw_case *c, cl_mem *in) {
    int add = c->n_in == 2;
    return hand_elementwise(add, in[0], add ? in[1] : NULL, (int64_t)c->out_n);
}

static float *reference(tb_tensor *y) {
    float *h = to_host(need(y, "the reference"));
    tb_tensor_release(y);
    return h;
}

void case_chain8(int64_t n) {
    bw_case d;
    tb_tensor *xc;
    float *x = host_random((size_t)n, 1.0f);
    memset(&d, 0, sizeof d);
    d.name = d.torch = "chain8";
    d.in[0] = (torch_input){"x", x, 1, {n, 0}};
    d.n_in = 1;
    d.build = chain8_build;
    xc = upload(x, 1, &n, &g_cpu);
    d.want = reference(chain8_build(&xc));
    tb_tensor_release(xc);
    d.out_n = (size_t)n;
    d.atol = d.peer_atol = 1e-6;
    d.rtol = d.peer_rtol = 1e-5;
    d.bytes = 8.0 * (double)n;
    d.writes = 1;
    d.make_hand = elementwise_hand;
    run_bw_case(&d);
    free(x);
    free((void *)d.want);
}

void case_add(int64_t n) {
    bw_case d;
    float *x = host_random((size_t)n, 1.0f), *y = host_random((size_t)n, 1.0f), *want;
    int64_t i;
    memset(&d, 0, sizeof d);
    d.name = d.torch = "add";
    d.in[0] = (torch_input){"x", x, 1, {n, 0}};
    d.in[1] = (torch_input){"y", y, 1, {n, 0}};
    d.n_in = 2;
    d.build = add_build;
    want = host_alloc((size_t)n);
    for (i = 0; i < n; i++)
        want[i] = x[i] + y[i];
    d.want = want;
    d.out_n = (size_t)n;
    d.bytes = 12.0 * (double)n;
    d.writes = 1;
    d.make_hand = elementwise_hand;
    run_bw_case(&d);
    free(x);
    free(y);
    free(want);
}

/* gates: sigmoid(x) * tanh(y), the gating of an LSTM cell (two activations that need exp) */
static tb_tensor *gates_build(tb_tensor *const *in) {
    tb_tensor *s = tb_sigmoid(in[0]), *t = tb_tanh(in[1]), *y = tb_mul(s, t);
    tb_tensor_release(s);
    tb_tensor_release(t);
    return y;
}

void case_gates(int64_t n) {
    bw_case d;
    tb_tensor *xy[2];
    float *x = host_random((size_t)n, 4.0f), *y = host_random((size_t)n, 4.0f);
    memset(&d, 0, sizeof d);
    d.name = d.torch = "gates";
    d.in[0] = (torch_input){"x", x, 1, {n, 0}};
    d.in[1] = (torch_input){"y", y, 1, {n, 0}};
    d.n_in = 2;
    d.build = gates_build;
    xy[0] = upload(x, 1, &n, &g_cpu);
    xy[1] = upload(y, 1, &n, &g_cpu);
    d.want = reference(gates_build(xy));
    tb_tensor_release(xy[0]);
    tb_tensor_release(xy[1]);
    d.out_n = (size_t)n;
    d.atol = d.peer_atol = 1e-6;
    d.rtol = d.peer_rtol = 1e-5;
    d.bytes = 12.0 * (double)n;
    d.writes = 1;
    run_bw_case(&d);
    free(x);
    free(y);
    free((void *)d.want);
}

/* ---- reductions: sum and max of everything, row sums ---- */

static tb_tensor *sum_build(tb_tensor *const *in) {
    return tb_sum(in[0], NULL, 0, false);
}

static tb_tensor *max_build(tb_tensor *const *in) {
    return tb_max(in[0], NULL, 0, false);
}

static tb_tensor *row_sums_build(tb_tensor *const *in) {
    int32_t axis = 1;
    return tb_sum(in[0], &axis, 1, false);
}

static hand *reduce_hand(const bw_case *c, cl_mem *in) {
    return hand_reduce(c->max, in[0], c->rows * c->cols, c->rows > 1 ? c->rows : 0);
}

void case_reduce(const char *name, int max, int64_t n, int64_t rows) {
    bw_case d;
    int64_t cols = rows > 0 ? n / rows : n, r, i;
    size_t nout = rows > 0 ? (size_t)rows : 1;
    float *x = host_random((size_t)n, 1.0f), *want = host_alloc(nout);
    double abs_sum = 0;
    memset(&d, 0, sizeof d);
    d.name = d.torch = name;
    d.in[0] = rows > 0 ? (torch_input){"x", x, 2, {rows, cols}} : (torch_input){"x", x, 1, {n, 0}};
    d.n_in = 1;
    d.build = rows > 0 ? row_sums_build : (max ? max_build : sum_build);
    /* the expected values, in double on the host */
    for (r = 0; r < (int64_t)nout; r++) {
        double acc = max ? -INFINITY : 0.0;
        for (i = r * cols; i < (r + 1) * cols; i++) {
            if (!max) {
                acc += x[i];
            } else if (x[i] > acc) {
                acc = x[i];
            }
            abs_sum += fabs(x[i]);
        }
        want[r] = (float)acc;
    }
    /* float sums of many terms: the tolerance follows the sum of magnitudes per output */
    abs_sum /= (double)nout;
    d.want = want;
    d.out_n = nout;
    d.atol = max ? 0 : 1e-6 * abs_sum;
    d.rtol = max ? 0 : 1e-5;
    d.peer_atol = max ? 0 : 1e-5 * abs_sum;
    d.peer_rtol = max ? 0 : 1e-4;
    d.bytes = 4.0 * (double)n + 4.0 * (double)nout;
    d.writes = 0;
    d.make_hand = reduce_hand;
    d.max = max;
    d.rows = rows > 0 ? rows : 1;
    d.cols = cols;
    run_bw_case(&d);
    free(x);
    free(want);
}

/* ---- softmax and layer_norm over rows ---- */

#define LN_EPS 1e-5

static tb_tensor *softmax_build(tb_tensor *const *in) {
    return tb_softmax(in[0], 1);
}

static tb_tensor *layer_norm_build(tb_tensor *const *in) {
    return tb_layer_norm(in[0], 1, in[1], in[2], LN_EPS);
}

static hand *norm_hand(const bw_case *c, cl_mem *in) {
    int ln = c->n_in == 3;
    return hand_norm(ln, in[0], ln ? in[1] : NULL, ln ? in[2] : NULL, c->rows, c->cols,
                     (float)LN_EPS);
}

void case_norm(const char *name, int layer_norm, int64_t rows, int64_t cols) {
    bw_case d;
    size_t n = (size_t)(rows * cols);
    float *x = host_random(n, 3.0f), *w = host_random((size_t)cols, 1.0f),
          *b = host_random((size_t)cols, 1.0f);
    tb_tensor *ref[3];
    int i;
    memset(&d, 0, sizeof d);
    d.name = d.torch = name;
    d.in[0] = (torch_input){"x", x, 2, {rows, cols}};
    d.in[1] = (torch_input){"w", w, 1, {cols, 0}};
    d.in[2] = (torch_input){"b", b, 1, {cols, 0}};
    d.n_in = layer_norm ? 3 : 1;
    d.build = layer_norm ? layer_norm_build : softmax_build;
    for (i = 0; i < d.n_in; i++)
        ref[i] = upload(d.in[i].data, d.in[i].rank, d.in[i].dims, &g_cpu);
    d.want = reference(d.build(ref));
    for (i = 0; i < d.n_in; i++)
        tb_tensor_release(ref[i]);
    d.out_n = n;
    d.atol = layer_norm ? 1e-5 : 1e-8;
    d.rtol = 1e-5;
    d.peer_atol = layer_norm ? 1e-4 : 1e-7;
    d.peer_rtol = 1e-4;
    /* one read and one write of x (and w, b): the least traffic a row kernel needs */
    d.bytes = 8.0 * (double)n + (layer_norm ? 8.0 * (double)cols : 0.0);
    d.writes = 1;
    d.make_hand = norm_hand;
    d.rows = rows;
    d.cols = cols;
    run_bw_case(&d);
    free(x);
    free(w);
    free(b);
    free((void *)d.want);
}

/* ======================================================================================
   matmul: compute-bound; OpenBLAS on the host is the bound, CLBlast the OpenCL anchor
   ====================================================================================== */

/* BLAS threads spin for about 0.1 s after a call (OpenBLAS's default): a side that uses them
   sleeps this long after each call (see measure). Every side of these cases is primed, so
   all run at the speed of a loop of calls. */
#define BLAS_COOLDOWN 0.15

typedef struct matmul_ctx {
    int n;
    const float *ha, *hb;
    float *hc;
    cl_mem am, bm, cm;
} matmul_ctx;

static tb_tensor *matmul_build(tb_tensor *const *in) {
    return tb_matmul(in[0], in[1]);
}

static void matmul_openblas(void *p) {
    matmul_ctx *c = (matmul_ctx *)p;
    openblas_sgemm(c->n, c->n, c->n, c->ha, c->hb, 0.0f, c->hc);
}

static void matmul_clblast(void *p) {
    matmul_ctx *c = (matmul_ctx *)p;
    clblast_sgemm(c->n, c->am, c->bm, c->cm);
}

/* Checks sampled entries (and the corners) against double dot products on the host. */
static void check_matmul(const char *what, const float *got, const float *a, const float *b,
                         int n) {
    int s, k;
    uint64_t state = 12345;
    for (s = 0; s < 256; s++) {
        int i, j;
        double acc = 0, mag = 0;
        if (s < 4) {
            i = (s & 1) ? n - 1 : 0;
            j = (s & 2) ? n - 1 : 0;
        } else {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            i = (int)((state >> 33) % (uint64_t)n);
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            j = (int)((state >> 33) % (uint64_t)n);
        }
        for (k = 0; k < n; k++) {
            acc += (double)a[(size_t)i * n + k] * b[(size_t)k * n + j];
            mag += fabs((double)a[(size_t)i * n + k] * b[(size_t)k * n + j]);
        }
        if (!(fabs(got[(size_t)i * n + j] - acc) <= 1e-5 * mag + 1e-6)) {
            die("%s: C[%d][%d] is %.9g, expected %.9g (n = %d)", what, i, j, got[(size_t)i * n + j],
                acc, n);
        }
    }
}

static void gflops(char *buf, size_t cap, double flops, double t) {
    if (t > 0) {
        snprintf(buf, cap, "%.1f", flops / t / 1e9);
    } else {
        snprintf(buf, cap, "-");
    }
}

void case_matmul(int n) {
    size_t nn = (size_t)n * n;
    float *ha = host_random(nn, 1.0f), *hb = host_random(nn, 1.0f), *got;
    double flops = 2.0 * n * (double)n * n;
    ours_ctx ours[NUM_BACKENDS];
    side sides[NUM_BACKENDS + 3];
    int on[NUM_BACKENDS], ns = 0, b, reps, torch_i = -1, ob_i = -1, cb_i = -1;
    matmul_ctx c;
    torch_input in[2];
    char name[32], what[96];
    memset(sides, 0, sizeof sides);
    memset(&c, 0, sizeof c);
    snprintf(name, sizeof name, "matmul_%d", n);
    in[0] = (torch_input){"a", ha, 2, {n, n}};
    in[1] = (torch_input){"b", hb, 2, {n, n}};
    c.n = n;
    c.ha = ha;
    c.hb = hb;
    c.hc = host_alloc(nn);
    for (b = 0; b < NUM_BACKENDS; b++) {
        tb_tensor *y;
        on[b] = -1;
        if (!g_backends[b].ok) continue;
        memset(&ours[b], 0, sizeof ours[b]);
        ours[b].be = &g_backends[b];
        ours[b].n_in = 2;
        ours[b].build = matmul_build;
        ours[b].in[0] = upload(ha, 2, in[0].dims, &g_backends[b].dev);
        ours[b].in[1] = upload(hb, 2, in[1].dims, &g_backends[b].dev);
        y = need(tb_matmul(ours[b].in[0], ours[b].in[1]), "tb_matmul");
        got = to_host(y);
        snprintf(what, sizeof what, "%s (%s)", name, g_backends[b].name);
        check_matmul(what, got, ha, hb, n);
        free(got);
        tb_tensor_release(y);
        on[b] = ns;
        sides[ns].name = g_backends[b].name;
        sides[ns].run = ours_run;
        sides[ns].prime = 1;
        sides[ns++].ctx = &ours[b];
    }
    if (have_openblas()) {
        matmul_openblas(&c);
        snprintf(what, sizeof what, "%s (OpenBLAS)", name);
        check_matmul(what, c.hc, ha, hb, n);
        ob_i = ns;
        sides[ns].name = "openblas";
        sides[ns].run = matmul_openblas;
        sides[ns].ctx = &c;
        sides[ns].prime = 1;
        sides[ns++].cooldown = BLAS_COOLDOWN;
    }
    if (have_clblast() && g_backends[0].ok) {
        c.am = tensor_mem(ours[0].in[0]);
        c.bm = tensor_mem(ours[0].in[1]);
        c.cm = cl_buffer(nn * sizeof(float));
        matmul_clblast(&c);
        got = cl_read(c.cm, nn);
        snprintf(what, sizeof what, "%s (CLBlast)", name);
        check_matmul(what, got, ha, hb, n);
        free(got);
        cb_i = ns;
        sides[ns].name = "clblast";
        sides[ns].run = matmul_clblast;
        sides[ns].prime = 1;
        sides[ns++].ctx = &c;
    }
    got = torch_setup("matmul", in, 2, nn);
    if (got != NULL) {
        snprintf(what, sizeof what, "%s (PyTorch)", name);
        check_matmul(what, got, ha, hb, n);
        free(got);
        torch_i = ns;
        sides[ns].name = "pytorch";
        sides[ns].timed = torch_timed;
        sides[ns].prime = 1; /* its BLAS is OpenBLAS too */
        sides[ns++].cooldown = BLAS_COOLDOWN;
    }
    if (ns > 0) {
        reps = measure(sides, ns, 0);
        note_faults(name, sides, ns);
        for (b = 0; b < NUM_BACKENDS; b++) {
            row r;
            if (on[b] < 0) continue;
            r = row_new(name, g_backends[b].name);
            r.ours = sides[on[b]].t;
            if (torch_i >= 0 && torch_ok()) r.torch = sides[torch_i].t;
            if (ob_i >= 0) {
                r.bound = sides[ob_i].t;
                snprintf(r.bound_kind, sizeof r.bound_kind, "openblas");
            }
            if (g_backends[b].opencl && cb_i >= 0) {
                snprintf(r.anchor_name, sizeof r.anchor_name, "clblast");
                r.anchor = sides[cb_i].t;
            }
            snprintf(r.unit, sizeof r.unit, "GFLOP/s");
            r.value = flops / r.ours / 1e9;
            r.flops = flops;
            r.bytes = 12.0 * (double)nn;
            r.reps = reps;
            add_row(&r);
        }
        {
            char ob[32], cb[32], pt[32];
            gflops(ob, sizeof ob, flops, ob_i >= 0 ? sides[ob_i].t : NAN);
            gflops(cb, sizeof cb, flops, cb_i >= 0 ? sides[cb_i].t : NAN);
            gflops(pt, sizeof pt, flops, torch_i >= 0 && torch_ok() ? sides[torch_i].t : NAN);
            note("%s: OpenBLAS %s, CLBlast %s, PyTorch %s GFLOP/s", name, ob, cb, pt);
        }
    }
    for (b = 0; b < NUM_BACKENDS; b++)
        if (on[b] >= 0) ours_release(&ours[b]);
    if (c.cm != NULL) clReleaseMemObject(c.cm);
    free(ha);
    free(hb);
    free(c.hc);
}

/* ======================================================================================
   mlp: 784-512-512-10 forward, relu, softmax
   ====================================================================================== */

const int64_t g_mlp_sizes[MLP_LAYERS + 1] = {784, 512, 512, 10};

void mlp_init_host(mlp *m, int64_t batch) {
    int l;
    memset(m, 0, sizeof *m);
    m->batch = batch;
    seed_rng(7);
    m->hx = host_random((size_t)(batch * g_mlp_sizes[0]), 1.0f);
    for (l = 0; l < MLP_LAYERS; l++) {
        float scale = (float)(1.0 / sqrt((double)g_mlp_sizes[l]));
        m->hw[l] = host_random((size_t)(g_mlp_sizes[l] * g_mlp_sizes[l + 1]), scale);
        m->hb[l] = host_random((size_t)g_mlp_sizes[l + 1], 0.1f);
    }
}

void mlp_upload(mlp *m, const bench_backend *be) {
    const tb_device *dev = be != NULL ? &be->dev : &g_cpu;
    int l;
    int64_t dims[2];
    m->be = be;
    dims[0] = m->batch;
    dims[1] = g_mlp_sizes[0];
    m->x = upload(m->hx, 2, dims, dev);
    for (l = 0; l < MLP_LAYERS; l++) {
        dims[0] = g_mlp_sizes[l];
        dims[1] = g_mlp_sizes[l + 1];
        m->w[l] = upload(m->hw[l], 2, dims, dev);
        m->b[l] = upload(m->hb[l], 1, &g_mlp_sizes[l + 1], dev);
    }
}

void mlp_release(mlp *m) {
    int l;
    tb_tensor_release(m->x);
    m->x = NULL;
    for (l = 0; l < MLP_LAYERS; l++) {
        tb_tensor_release(m->w[l]);
        tb_tensor_release(m->b[l]);
        m->w[l] = m->b[l] = NULL;
    }
}

void mlp_free_host(mlp *m) {
    int l;
    free(m->hx);
    for (l = 0; l < MLP_LAYERS; l++) {
        free(m->hw[l]);
        free(m->hb[l]);
    }
}

/* The forward pass as recorded ops (nothing runs). */
tb_tensor *mlp_forward(const mlp *m) {
    tb_tensor *h = tb_tensor_retain(m->x);
    int l;
    for (l = 0; l < MLP_LAYERS; l++) {
        tb_tensor *mm = tb_matmul(h, m->w[l]);
        tb_tensor *z = tb_add(mm, m->b[l]);
        tb_tensor_release(mm);
        tb_tensor_release(h);
        h = l + 1 < MLP_LAYERS ? tb_relu(z) : tb_softmax(z, 1);
        tb_tensor_release(z);
    }
    return need(h, "mlp forward");
}

/* The MLP's output on the cpu reference backend. */
float *mlp_reference(mlp *m) {
    mlp ref = *m;
    tb_tensor *y;
    float *out;
    mlp_upload(&ref, NULL);
    y = mlp_forward(&ref);
    out = to_host(y);
    tb_tensor_release(y);
    mlp_release(&ref);
    return out;
}

static void mlp_run_tb(void *p) {
    mlp *m = (mlp *)p;
    double t0 = now_s(), t1, t2;
    tb_tensor *y = mlp_forward(m);
    t1 = now_s();
    need_ok(tb_sync(&y, 1), "tb_sync (mlp)");
    t2 = now_s();
    if (m->be->opencl) finish();
    m->t_finish = now_s() - t2;
    m->t_sync = t2 - t1;
    m->t_record = t1 - t0;
    tb_tensor_release(y);
}

/* The MLP with OpenBLAS on the host: bias copied into the output, sgemm with beta 1, relu,
   softmax; the activations are reused from step to step. */
typedef struct mlp_blas {
    const mlp *m;
    float *act[MLP_LAYERS + 1];
} mlp_blas;

static void mlp_run_openblas(void *p) {
    mlp_blas *o = (mlp_blas *)p;
    const mlp *m = o->m;
    int l;
    int64_t r, j;
    for (l = 0; l < MLP_LAYERS; l++) {
        const float *in = l == 0 ? m->hx : o->act[l];
        float *out = o->act[l + 1];
        int k = (int)g_mlp_sizes[l], n = (int)g_mlp_sizes[l + 1];
        for (r = 0; r < m->batch; r++)
            memcpy(out + r * n, m->hb[l], (size_t)n * sizeof(float));
        openblas_sgemm((int)m->batch, n, k, in, m->hw[l], 1.0f, out);
        if (l + 1 < MLP_LAYERS) {
            for (j = 0; j < m->batch * n; j++)
                out[j] = out[j] > 0 ? out[j] : 0;
        } else {
            for (r = 0; r < m->batch; r++) {
                float *o2 = out + r * n, mx = -INFINITY, s = 0;
                for (j = 0; j < n; j++)
                    mx = o2[j] > mx ? o2[j] : mx;
                for (j = 0; j < n; j++) {
                    o2[j] = expf(o2[j] - mx);
                    s += o2[j];
                }
                for (j = 0; j < n; j++)
                    o2[j] /= s;
            }
        }
    }
}

/* The host split of a few more steps on one backend, and the kernel share from a child with
   per-kernel profiling. */
static void mlp_notes(mlp *m, const bench_backend *be, double t_step) {
    double rec[9], syn[9], fin[9], exe[9];
    int steps = g_quick ? 3 : 9, i;
    char buf[8192];
    for (i = 0; i < steps; i++) {
        double e0 = tb_metrics_total("ExecuteTime");
        mlp_run_tb(m);
        exe[i] = (tb_metrics_total("ExecuteTime") - e0) * 1e-9;
        rec[i] = m->t_record;
        syn[i] = m->t_sync;
        fin[i] = m->t_finish;
    }
    note("mlp (%s): batch %lld, 784-512-512-10: per step %.3f ms; medians of the parts: record "
         "%.3f ms, tb_sync %.3f ms (ExecuteTime %.3f ms of it)%s",
         be->name, (long long)m->batch, t_step * 1e3, median(rec, steps) * 1e3,
         median(syn, steps) * 1e3, median(exe, steps) * 1e3,
         be->opencl ? "" : "; native runs its kernels inside tb_sync");
    if (be->opencl) note("mlp (opencl): clFinish wait %.3f ms", median(fin, steps) * 1e3);
    /* kernel times come from a process with profiling on (debug level 2: each kernel is waited
       for and timed); that process also gives the wall time of its steps, so the share
       compares numbers of one period */
    if (run_child("mlp-profile", be->name, "", buf, sizeof buf) == 0) {
        double kernel_s = NAN, wall_s = NAN;
        char *line = strtok(buf, "\n");
        while (line != NULL) {
            if (sscanf(line, "RESULT kernel_s=%lf", &kernel_s) == 1) {
            } else if (sscanf(line, "RESULT wall_s=%lf", &wall_s) == 1) {
            } else if (strncmp(line, "KERNEL ", 7) == 0) {
                note("mlp (%s):   %s", be->name, line + 7);
            }
            line = strtok(NULL, "\n");
        }
        if (isfinite(kernel_s) && isfinite(wall_s)) {
            row r = row_new("mlp_non_kernel", be->name);
            r.ours = wall_s;
            snprintf(r.anchor_name, sizeof r.anchor_name, "kernel_time");
            r.anchor = kernel_s;
            snprintf(r.unit, sizeof r.unit, "%% not kernel");
            r.value = (wall_s - kernel_s) / wall_s * 100.0;
            r.reps = g_quick ? 3 : 9;
            add_row(&r);
        } else {
            note("mlp (%s): the profiling child gave no kernel time", be->name);
        }
    } else {
        note("mlp (%s): the profiling child failed; no kernel time", be->name);
    }
}

void case_mlp(int64_t batch) {
    mlp base, ms[NUM_BACKENDS];
    mlp_blas ob;
    side sides[NUM_BACKENDS + 2];
    torch_input in[7];
    int on[NUM_BACKENDS], ns = 0, b, l, reps, torch_i = -1, ob_i = -1;
    size_t n = (size_t)(batch * g_mlp_sizes[MLP_LAYERS]);
    float *want, *got;
    double flops = 0;
    static const char *const names[7] = {"x", "w0", "b0", "w1", "b1", "w2", "b2"};
    memset(sides, 0, sizeof sides);
    memset(&ob, 0, sizeof ob);
    mlp_init_host(&base, batch);
    want = mlp_reference(&base);
    for (l = 0; l < MLP_LAYERS; l++)
        flops += 2.0 * (double)batch * (double)g_mlp_sizes[l] * (double)g_mlp_sizes[l + 1];
    for (b = 0; b < NUM_BACKENDS; b++) {
        char what[96];
        tb_tensor *y;
        on[b] = -1;
        if (!g_backends[b].ok) continue;
        ms[b] = base;
        mlp_upload(&ms[b], &g_backends[b]);
        y = mlp_forward(&ms[b]);
        got = to_host(y);
        snprintf(what, sizeof what, "mlp (%s vs the reference)", g_backends[b].name);
        check_close(what, got, want, n, 1e-6, 1e-4);
        free(got);
        tb_tensor_release(y);
        on[b] = ns;
        sides[ns].name = g_backends[b].name;
        sides[ns].run = mlp_run_tb;
        sides[ns].prime = 1;
        sides[ns++].ctx = &ms[b];
    }
    if (have_openblas()) {
        ob.m = &base;
        for (l = 0; l <= MLP_LAYERS; l++)
            ob.act[l] = host_alloc((size_t)(batch * g_mlp_sizes[l]));
        mlp_run_openblas(&ob);
        check_close("mlp (OpenBLAS on the host vs the reference)", ob.act[MLP_LAYERS], want, n,
                    1e-6, 1e-4);
        ob_i = ns;
        sides[ns].name = "openblas";
        sides[ns].run = mlp_run_openblas;
        sides[ns].ctx = &ob;
        sides[ns].prime = 1;
        sides[ns++].cooldown = BLAS_COOLDOWN;
    }
    in[0] = (torch_input){names[0], base.hx, 2, {batch, g_mlp_sizes[0]}};
    for (l = 0; l < MLP_LAYERS; l++) {
        in[1 + 2 * l] =
            (torch_input){names[1 + 2 * l], base.hw[l], 2, {g_mlp_sizes[l], g_mlp_sizes[l + 1]}};
        in[2 + 2 * l] = (torch_input){names[2 + 2 * l], base.hb[l], 1, {g_mlp_sizes[l + 1], 0}};
    }
    if (torch_prepare(&sides[ns], "mlp", "mlp", in, 7, want, n, 1e-6, 1e-4)) {
        sides[ns].prime = 1;
        sides[ns].cooldown = BLAS_COOLDOWN;
        torch_i = ns++;
    }
    if (ns > 0) {
        reps = measure(sides, ns, 0);
        note_faults("mlp", sides, ns);
        for (b = 0; b < NUM_BACKENDS; b++) {
            row r;
            if (on[b] < 0) continue;
            r = row_new("mlp", g_backends[b].name);
            r.ours = sides[on[b]].t;
            if (torch_i >= 0 && torch_ok()) r.torch = sides[torch_i].t;
            if (ob_i >= 0) {
                r.bound = sides[ob_i].t;
                snprintf(r.bound_kind, sizeof r.bound_kind, "openblas");
            }
            snprintf(r.unit, sizeof r.unit, "GFLOP/s");
            r.value = flops / r.ours / 1e9;
            r.flops = flops;
            r.reps = reps;
            add_row(&r);
        }
        for (b = 0; b < NUM_BACKENDS; b++)
            if (on[b] >= 0) mlp_notes(&ms[b], &g_backends[b], sides[on[b]].t);
    }
    for (b = 0; b < NUM_BACKENDS; b++)
        if (on[b] >= 0) mlp_release(&ms[b]);
    for (l = 0; l <= MLP_LAYERS; l++)
        free(ob.act[l]);
    mlp_free_host(&base);
    free(want);
}

/* ======================================================================================
   half: chain8, axpy, sum and matmul with f16 and bf16 storage beside f32, on each backend
   ====================================================================================== */

/* The f32 input cast to `dt` on the device, materialised (the cast is not timed). */
static tb_tensor *upload_as(const float *h, int32_t rank, const int64_t *dims, tb_dtype dt,
                            const tb_device *dev) {
    tb_tensor *x = upload(h, rank, dims, dev), *y;
    if (dt == TB_F32) return x;
    y = need(tb_cast(x, dt), "tb_cast");
    need_ok(tb_sync(&y, 1), "tb_sync");
    tb_tensor_release(x);
    return y;
}

/* The result as f32 on the host. */
static float *to_host_f32(tb_tensor *y) {
    tb_tensor *f = need(tb_cast(y, TB_F32), "tb_cast");
    float *h = to_host(f);
    tb_tensor_release(f);
    return h;
}

/* axpy: 2.5 x + y (two inputs, two roundings in a 16-bit dtype). */
static tb_tensor *axpy_build(tb_tensor *const *in) {
    tb_tensor *ax = tb_mul_scalar(in[0], 2.5), *r = tb_add(ax, in[1]);
    tb_tensor_release(ax);
    return r;
}

/* One of chain8, axpy, sum, matmul (n: elements, or the matmul's side) in f16 and bf16, each timed
   beside the same case in f32 on the same backend (the row's anchor: anchor / ours is the
   speed-up of 16-bit storage), checked against the cpu reference backend in the same dtype
   (within a few units in the last place of the dtype: devices may round a sum's terms in
   another order). Rows: chain8_f16, sum_bf16, matmul_f16_N, ... */
void case_half(const char *kase, int64_t n) {
    static const tb_dtype dts[2] = {TB_F16, TB_BF16};
    int is_mm = strcmp(kase, "matmul") == 0, is_axpy = strcmp(kase, "axpy") == 0, k, b, i;
    int64_t dims[2] = {n, n};
    int32_t rank = is_mm ? 2 : 1;
    size_t numel = is_mm ? (size_t)(n * n) : (size_t)n;
    float *x = host_random(numel, 1.0f), *x2 = is_mm || is_axpy ? host_random(numel, 1.0f) : NULL;
    build_fn build = is_mm                      ? matmul_build
                     : is_axpy                  ? axpy_build
                     : strcmp(kase, "sum") == 0 ? sum_build
                                                : chain8_build;
    for (k = 0; k < 2; k++) {
        tb_dtype dt = dts[k];
        double es = 2.0, tol = dt == TB_F16 ? 4.0 / 1024 : 4.0 / 128;
        char name[40];
        tb_tensor *xc = upload_as(x, rank, dims, dt, &g_cpu);
        tb_tensor *yc = x2 != NULL ? upload_as(x2, rank, dims, dt, &g_cpu) : tb_tensor_retain(xc);
        tb_tensor *in2[2] = {xc, yc};
        float *want = to_host_f32(need(build(in2), "the reference"));
        size_t out_n = is_mm ? numel : strcmp(kase, "sum") == 0 ? 1 : numel;
        tb_tensor_release(xc);
        tb_tensor_release(yc);
        if (is_mm) {
            snprintf(name, sizeof name, "matmul_%s_%lld", tb_dtype_name(dt), (long long)n);
        } else {
            snprintf(name, sizeof name, "%s_%s", kase, tb_dtype_name(dt));
        }
        for (b = 0; b < NUM_BACKENDS; b++) {
            ours_ctx o[2];
            side sides[2];
            int reps, j;
            double bytes, flops = 2.0 * (double)n * (double)n * (double)n;
            row r;
            char what[96];
            if (!g_backends[b].ok) continue;
            memset(sides, 0, sizeof sides);
            for (j = 0; j < 2; j++) { /* 0: the 16-bit dtype, 1: f32 */
                tb_tensor *y;
                float *got;
                memset(&o[j], 0, sizeof o[j]);
                o[j].be = &g_backends[b];
                o[j].build = build;
                o[j].n_in = is_mm || is_axpy ? 2 : 1;
                o[j].in[0] = upload_as(x, rank, dims, j == 0 ? dt : TB_F32, &g_backends[b].dev);
                o[j].in[1] = o[j].n_in == 2 ? upload_as(x2, rank, dims, j == 0 ? dt : TB_F32,
                                                        &g_backends[b].dev)
                                            : NULL;
                y = need(build(o[j].in), name);
                got = to_host_f32(y);
                tb_tensor_release(y);
                snprintf(what, sizeof what, "%s (%s%s vs the reference)", name, g_backends[b].name,
                         j == 0 ? "" : ", f32");
                /* f32 against the 16-bit reference: within the rounding of the 16-bit inputs */
                for (i = 0; i < (int)out_n && i<1 << 20; i += out_n> 4096 ? 7 : 1)
                    check_close(what, got + i, want + i, 1,
                                j == 0 ? 1e-3 : 4.0 * tol * (is_mm ? sqrt((double)n) : 1.0),
                                tol * (j == 0 ? 1 : 2));
                free(got);
                sides[j].name = j == 0 ? tb_dtype_name(dt) : "f32";
                sides[j].run = ours_run;
                sides[j].ctx = &o[j];
                sides[j].flush = !is_mm;
                sides[j].prime = is_mm;
            }
            reps = measure(sides, 2, 0);
            note_faults(name, sides, 2);
            r = row_new(name, g_backends[b].name);
            r.ours = sides[0].t;
            snprintf(r.anchor_name, sizeof r.anchor_name, "ours_f32");
            r.anchor = sides[1].t;
            r.reps = reps;
            if (is_mm) {
                snprintf(r.unit, sizeof r.unit, "GFLOP/s");
                r.value = flops / r.ours / 1e9;
                r.flops = flops;
                r.bytes = 3.0 * es * (double)numel;
            } else {
                bytes = es * (double)numel * (is_axpy ? 2.0 : 1.0) +
                        (out_n > 1 ? es * (double)out_n : 0.0);
                r.writes = out_n > 1;
                r.bound = bound_time(bytes, r.writes);
                snprintf(r.bound_kind, sizeof r.bound_kind, "bandwidth");
                snprintf(r.unit, sizeof r.unit, "GB/s");
                r.value = bytes / r.ours / 1e9;
                r.bytes = bytes;
            }
            add_row(&r);
            ours_release(&o[0]);
            ours_release(&o[1]);
        }
        free(want);
    }
    free(x);
    free(x2);
}
