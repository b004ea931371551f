/* The host-overhead cases: trace (recording a graph), replay (a cached graph of 100 small
   steps, the cost of a kernel's launch, and the cache-hit cost of a tiny graph), coldstart (the
   first MLP step in a new process); and the child processes they and the mlp case start. */
#define _GNU_SOURCE
#include "bench.h"

#include <stdlib.h>
#include <string.h>

/* ======================================================================================
   trace: recording a 1000-node graph
   ====================================================================================== */

#define TRACE_NODES 1000

typedef struct trace_case {
    tb_tensor *x, *h;
    double t_record, t_release;
} trace_case;

/* 1000 ops of one node each (no scalars: each op is exactly one node). */
static tb_tensor *trace_record(const trace_case *c) {
    tb_tensor *y = tb_tensor_retain(c->x), *t;
    int i;
    for (i = 0; i < TRACE_NODES; i++) {
        switch (i % 4) {
        case 0:
            t = tb_add(y, c->x);
            break;
        case 1:
            t = tb_mul(y, c->h);
            break;
        case 2:
            t = tb_neg(y);
            break;
        default:
            t = tb_abs(y);
            break;
        }
        tb_tensor_release(y);
        y = t;
    }
    return need(y, "trace");
}

/* Records (timed), then releases the unsynced graph (timed apart: not part of recording). */
static double trace_timed(void *p) {
    trace_case *c = (trace_case *)p;
    double t0 = now_s(), t1;
    tb_tensor *y = trace_record(c);
    t1 = now_s();
    tb_tensor_release(y);
    c->t_record = t1 - t0;
    c->t_release = now_s() - t1;
    return c->t_record;
}

static void trace_prepare(trace_case *c, const tb_device *dev, const float *hx, const float *hh,
                          int64_t n) {
    c->x = upload(hx, 1, &n, dev);
    c->h = upload(hh, 1, &n, dev);
}

void case_trace(void) {
    int64_t n = 64, i;
    float *hx = host_random((size_t)n, 1.0f), *hh = host_alloc((size_t)n), *want, *got;
    trace_case cc, c[NUM_BACKENDS];
    side sides[NUM_BACKENDS + 1];
    int on[NUM_BACKENDS], ns = 0, b, reps;
    tb_tensor *y;
    memset(sides, 0, sizeof sides);
    for (i = 0; i < n; i++)
        hh[i] = 0.5f;
    trace_prepare(&cc, &g_cpu, hx, hh, n);
    y = trace_record(&cc);
    want = to_host(y);
    tb_tensor_release(y);
    for (b = 0; b < NUM_BACKENDS; b++) {
        char *text, what[96];
        size_t lines = 0, k;
        on[b] = -1;
        if (!g_backends[b].ok) continue;
        trace_prepare(&c[b], &g_backends[b].dev, hx, hh, n);
        y = trace_record(&c[b]);
        text = tb_ir_text(&y, 1);
        if (text == NULL) die("tb_ir_text: %s", tb_last_error());
        for (k = 0; text[k] != '\0'; k++)
            lines += text[k] == '\n';
        tb_free(text);
        /* 1000 op nodes plus the two device-data leaves */
        if (lines != TRACE_NODES + 2)
            die("trace: the graph has %zu nodes, expected %d", lines, TRACE_NODES + 2);
        got = to_host(y);
        snprintf(what, sizeof what, "trace graph (%s vs the reference)", g_backends[b].name);
        check_close(what, got, want, (size_t)n, 1e-6, 1e-5);
        free(got);
        tb_tensor_release(y);
        on[b] = ns;
        sides[ns].name = g_backends[b].name;
        sides[ns].timed = trace_timed;
        sides[ns++].ctx = &c[b];
    }
    sides[ns].name = "cpu";
    sides[ns].timed = trace_timed;
    sides[ns++].ctx = &cc;
    reps = measure(sides, ns, g_quick ? 3 : 31);
    for (b = 0; b < NUM_BACKENDS; b++) {
        row r;
        if (on[b] < 0) continue;
        r = row_new("trace", g_backends[b].name);
        r.ours = sides[on[b]].t / TRACE_NODES;
        snprintf(r.anchor_name, sizeof r.anchor_name, "target");
        r.anchor = 1e-6;
        snprintf(r.unit, sizeof r.unit, "us/node");
        r.value = r.ours * 1e6;
        r.reps = reps;
        add_row(&r);
        note("trace (%s): releasing the unsynced 1000-node graph: %.3f us/node (last call)",
             g_backends[b].name, c[b].t_release / TRACE_NODES * 1e6);
        tb_tensor_release(c[b].x);
        tb_tensor_release(c[b].h);
    }
    note("trace: %.3f us/node on cpu:0; PyTorch eager records no graph: no peer",
         sides[ns - 1].t / TRACE_NODES * 1e6);
    tb_tensor_release(cc.x);
    tb_tensor_release(cc.h);
    free(hx);
    free(hh);
    free(want);
}

/* ======================================================================================
   replay: a cached graph of 100 small steps, the cost of each kernel launched, and the
   cache-hit cost of a tiny graph
   ====================================================================================== */

#define REPLAY_KERNELS 100
#define REPLAY_ROWS    8
#define REPLAY_COLS    32

/* One backend's side of the replay: the chain as it is (`flip` 0), or with each step reading
   the last result's rows in reverse order (1), which no kernel can take from the step before:
   one kernel per step, for the cost of a launch. */
typedef struct replay_case {
    const bench_backend *be;
    tb_tensor *x, *r0;
    int flip;
    double t_call, t_exec;
} replay_case;

/* r <- max over each row of (r + x): a small reduction per step (the add read in it); with
   `flip`, r's rows reversed first */
static tb_tensor *replay_record(tb_tensor *x, tb_tensor *r0, int flip) {
    tb_tensor *r = tb_tensor_retain(r0), *t, *u, *f;
    int32_t axis = 1, rows = 0;
    int i;
    for (i = 0; i < REPLAY_KERNELS; i++) {
        f = flip ? tb_flip(r, &rows, 1) : tb_tensor_retain(r);
        t = tb_add(f, x);
        u = tb_max(t, &axis, 1, true);
        tb_tensor_release(t);
        tb_tensor_release(f);
        tb_tensor_release(r);
        r = u;
    }
    return need(r, "replay graph");
}

/* Records (not timed: that is the trace case's matter), then syncs and waits (timed). */
static double replay_timed(void *p) {
    replay_case *c = (replay_case *)p;
    tb_tensor *y = replay_record(c->x, c->r0, c->flip);
    double e0 = tb_metrics_total("ExecuteTime"), t0 = now_s(), t1;
    need_ok(tb_sync(&y, 1), "tb_sync (replay)");
    t1 = now_s();
    if (c->be->opencl) finish();
    c->t_call = t1 - t0;
    c->t_exec = (tb_metrics_total("ExecuteTime") - e0) * 1e-9;
    t1 = now_s() - t0;
    tb_tensor_release(y);
    return t1;
}

typedef struct replay_hand {
    cl_kernel k;
    cl_mem xm, r0m, ping, pong;
    int flip;
} replay_hand;

static void replay_hand_run(void *p) {
    replay_hand *c = (replay_hand *)p;
    int cols = REPLAY_COLS, i;
    for (i = 0; i < REPLAY_KERNELS; i++) {
        cl_mem src = i == 0 ? c->r0m : (i % 2 == 1 ? c->ping : c->pong);
        cl_mem dst = i % 2 == 0 ? c->ping : c->pong;
        size_t global = REPLAY_ROWS;
        cl_need(clSetKernelArg(c->k, 0, sizeof(cl_mem), &src), "clSetKernelArg");
        cl_need(clSetKernelArg(c->k, 1, sizeof(cl_mem), &c->xm), "clSetKernelArg");
        cl_need(clSetKernelArg(c->k, 2, sizeof(cl_mem), &dst), "clSetKernelArg");
        cl_need(clSetKernelArg(c->k, 3, sizeof(int), &cols), "clSetKernelArg");
        cl_need(clSetKernelArg(c->k, 4, sizeof(int), &c->flip), "clSetKernelArg");
        cl_need(clEnqueueNDRangeKernel(g_queue, c->k, 1, NULL, &global, NULL, 0, NULL, NULL),
                "clEnqueueNDRangeKernel");
    }
    finish();
}

static void case_cache_hit(void);

/* The reference result of the chain (flipped or not) */
static float *replay_want(const float *h, const float *h0, int flip) {
    int64_t dims[2] = {REPLAY_ROWS, REPLAY_COLS}, rdims[2] = {REPLAY_ROWS, 1};
    tb_tensor *xc = upload(h, 2, dims, &g_cpu), *rc = upload(h0, 2, rdims, &g_cpu);
    tb_tensor *y = replay_record(xc, rc, flip);
    float *want = to_host(y);
    tb_tensor_release(y);
    tb_tensor_release(xc);
    tb_tensor_release(rc);
    return want;
}

/* Sets up backend b's side of the chain (flipped or not), checked against the reference;
   returns the kernels one replay launches. */
static int replay_setup(replay_case *c, const bench_backend *be, const float *h, const float *h0,
                        int flip, const float *want) {
    int64_t dims[2] = {REPLAY_ROWS, REPLAY_COLS}, rdims[2] = {REPLAY_ROWS, 1};
    char what[96], counter[32];
    tb_tensor *y;
    float *got;
    double k0;
    int kernels;
    c->be = be;
    c->flip = flip;
    c->x = upload(h, 2, dims, &be->dev);
    c->r0 = upload(h0, 2, rdims, &be->dev);
    y = replay_record(c->x, c->r0, flip);
    got = to_host(y);
    snprintf(what, sizeof what, "replay graph%s (%s vs the reference)", flip ? " (flipped)" : "",
             be->name);
    check_close(what, got, want, REPLAY_ROWS, 0, 1e-6);
    free(got);
    tb_tensor_release(y);
    snprintf(counter, sizeof counter, "%s::KernelLaunch", be->opencl ? "OpenCL" : "Native");
    k0 = backend_counter(be->name, counter);
    replay_timed(c);
    kernels = (int)(backend_counter(be->name, counter) - k0);
    return kernels > 0 ? kernels : 1;
}

void case_replay(void) {
    size_t n = REPLAY_ROWS * REPLAY_COLS;
    float *h = host_random(n, 2.0f), h0[REPLAY_ROWS], *want[2], *got;
    replay_case c[2][NUM_BACKENDS];
    replay_hand rh[2];
    side sides[2 * NUM_BACKENDS + 3];
    torch_input in[2];
    int on[2][NUM_BACKENDS], ns = 0, b, i, f, reps, hand_i[2] = {-1, -1}, torch_i = -1;
    int kernels[2][NUM_BACKENDS];
    char flipped[NUM_BACKENDS][48];
    memset(sides, 0, sizeof sides);
    memset(rh, 0, sizeof rh);
    for (i = 0; i < REPLAY_ROWS; i++)
        h0[i] = 0.0f;
    for (f = 0; f < 2; f++)
        want[f] = replay_want(h, h0, f);
    for (f = 0; f < 2; f++) {
        for (b = 0; b < NUM_BACKENDS; b++) {
            const bench_backend *be = &g_backends[b];
            on[f][b] = -1;
            if (!be->ok) continue;
            kernels[f][b] = replay_setup(&c[f][b], be, h, h0, f, want[f]);
            on[f][b] = ns;
            snprintf(flipped[b], sizeof flipped[b], "%s_flipped", be->name);
            sides[ns].name = f ? flipped[b] : be->name;
            sides[ns].timed = replay_timed;
            sides[ns++].ctx = &c[f][b];
        }
        if (g_backends[0].ok) {
            replay_hand *r = &rh[f];
            r->k = hand_kernel("rowmax_add");
            r->flip = f;
            r->xm = tensor_mem(c[f][0].x);
            r->r0m = tensor_mem(c[f][0].r0);
            r->ping = cl_buffer(REPLAY_ROWS * sizeof(float));
            r->pong = cl_buffer(REPLAY_ROWS * sizeof(float));
            replay_hand_run(r);
            got = cl_read(REPLAY_KERNELS % 2 == 1 ? r->ping : r->pong, REPLAY_ROWS);
            check_close(f ? "replay flipped (hand-enqueued kernels vs the reference)"
                          : "replay (hand-enqueued kernels vs the reference)",
                        got, want[f], REPLAY_ROWS, 0, 1e-6);
            free(got);
            hand_i[f] = ns;
            sides[ns].name = f ? "hand_flipped" : "hand_enqueue";
            sides[ns].run = replay_hand_run;
            sides[ns++].ctx = r;
        }
    }
    in[0] = (torch_input){"x", h, 2, {REPLAY_ROWS, REPLAY_COLS}};
    in[1] = (torch_input){"r0", h0, 2, {REPLAY_ROWS, 1}};
    got = torch_setup("replay", in, 2, REPLAY_ROWS);
    if (got != NULL) {
        check_close("replay (PyTorch vs the reference)", got, want[0], REPLAY_ROWS, 0, 1e-6);
        free(got);
        torch_i = ns;
        sides[ns].name = "pytorch";
        sides[ns++].timed = torch_timed;
    }
    reps = measure(sides, ns, g_quick ? 11 : 51);
    note_faults("replay", sides, ns);
    for (b = 0; b < NUM_BACKENDS; b++) {
        const bench_backend *be = &g_backends[b];
        double per_kernel, diff[64];
        int fk = kernels[1][b];
        row r;
        if (on[0][b] < 0) continue;
        r = row_new("replay", be->name);
        r.ours = sides[on[0][b]].t;
        if (torch_i >= 0 && torch_ok()) r.torch = sides[torch_i].t;
        if (be->opencl && hand_i[0] >= 0) {
            snprintf(r.anchor_name, sizeof r.anchor_name, "hand_enqueue");
            r.anchor = sides[hand_i[0]].t;
        }
        snprintf(r.unit, sizeof r.unit, "us/step");
        r.value = r.ours / REPLAY_KERNELS * 1e6;
        r.reps = reps;
        add_row(&r);
        if (be->opencl && hand_i[1] >= 0) {
            /* the median of the paired differences: the sides ran in the same rounds, so a
               slow period of the machine hits both */
            for (i = 0; i < reps; i++)
                diff[i] = sides[on[1][b]].samples[i] - sides[hand_i[1]].samples[i];
            per_kernel = median(diff, reps) / fk;
        } else {
            per_kernel = sides[on[1][b]].t / fk;
        }
        r = row_new("replay_overhead", be->name);
        r.ours = per_kernel;
        snprintf(r.anchor_name, sizeof r.anchor_name, "target");
        r.anchor = 5e-6;
        snprintf(r.unit, sizeof r.unit, "us/kernel");
        r.value = per_kernel * 1e6;
        r.reps = reps;
        add_row(&r);
        /* the split of a few more replays */
        for (f = 0; f < 2; f++) {
            double call[9], exe[9];
            for (i = 0; i < 9; i++) {
                replay_timed(&c[f][b]);
                call[i] = c[f][b].t_call;
                exe[i] = c[f][b].t_exec;
            }
            note("replay%s (%s): %d kernel%s per graph (r = max(%s + x, 1) on f32[%d,%d], 100 "
                 "times): %.3f ms in all; tb_sync returns after %.3f ms, of which ExecuteTime "
                 "%.3f ms%s",
                 f ? "_overhead" : "", be->name, kernels[f][b], kernels[f][b] == 1 ? "" : "s",
                 f ? "flip(r, 0)" : "r", REPLAY_ROWS, REPLAY_COLS, sides[on[f][b]].t * 1e3,
                 median(call, 9) * 1e3, median(exe, 9) * 1e3,
                 !f           ? ""
                 : be->opencl ? "; per kernel: the paired difference with the same kernels "
                                "enqueued by hand"
                              : "; per kernel: the whole time / kernels (their work is tiny)");
            tb_tensor_release(c[f][b].x);
            tb_tensor_release(c[f][b].r0);
        }
    }
    for (f = 0; f < 2; f++) {
        if (hand_i[f] < 0) continue;
        clReleaseMemObject(rh[f].ping);
        clReleaseMemObject(rh[f].pong);
        clReleaseKernel(rh[f].k);
    }
    free(h);
    free(want[0]);
    free(want[1]);
    case_cache_hit();
}

/* Cache hit on the cpu backend: a tiny graph, sync time minus execute time. */
static void case_cache_hit(void) {
    int64_t hn = 16;
    float hx[16], out[16], expect[16];
    double over[401], walls[401], t;
    int count = g_quick ? 101 : 401, i, j;
    tb_tensor *x;
    row r;
    for (i = 0; i < 16; i++)
        hx[i] = (float)i - 7.5f;
    x = upload(hx, 1, &hn, &g_cpu);
    for (i = 0; i < count; i++) {
        tb_tensor *a = tb_mul_scalar(x, 2.0), *b = tb_add_scalar(a, 1.0), *rl = tb_relu(b),
                  *s = tb_sub_scalar(rl, 0.5);
        double e0, t0, t1, e1;
        need(s, "cache-hit graph");
        e0 = tb_metrics_total("ExecuteTime");
        t0 = now_s();
        need_ok(tb_sync(&s, 1), "tb_sync (cache hit)");
        t1 = now_s();
        e1 = tb_metrics_total("ExecuteTime");
        walls[i] = t1 - t0;
        over[i] = (t1 - t0) - (e1 - e0) * 1e-9;
        if (i == 0) {
            need_ok(tb_tensor_to_host(s, out, sizeof out), "tb_tensor_to_host");
            for (j = 0; j < 16; j++) {
                float v = hx[j] * 2.0f + 1.0f;
                expect[j] = (v > 0 ? v : 0) - 0.5f;
            }
            check_close("cache-hit graph (cpu)", out, expect, 16, 0, 0);
        }
        tb_tensor_release(a);
        tb_tensor_release(b);
        tb_tensor_release(rl);
        tb_tensor_release(s);
    }
    /* the first sync compiled: leave it out */
    t = median(over + 1, count - 1);
    r = row_new("cache_hit", "cpu");
    r.ours = t;
    snprintf(r.anchor_name, sizeof r.anchor_name, "target");
    r.anchor = 10e-6;
    snprintf(r.unit, sizeof r.unit, "us/graph");
    r.value = t * 1e6;
    r.reps = count - 1;
    add_row(&r);
    note("cache hit (cpu:0, 5-node graph): tb_sync %.3f us, of which outside execute %.3f us",
         median(walls + 1, count - 1) * 1e6, t * 1e6);
    tb_tensor_release(x);
}

/* ======================================================================================
   coldstart: the MLP step in a new process, cold and warm
   ====================================================================================== */

typedef struct cold_result {
    double first_step, compile, disk_hits, builds;
} cold_result;

static void cold_run(const char *backend, const char *tb_cache, const char *pocl_cache,
                     cold_result *r) {
    char env[4096], buf[8192];
    char *line;
    snprintf(env, sizeof env, "TB_CACHE_DIR='%s' POCL_CACHE_DIR='%s'", tb_cache, pocl_cache);
    if (run_child("coldstart", backend, env, buf, sizeof buf) != 0) die("coldstart child failed");
    memset(r, 0, sizeof *r);
    r->first_step = NAN;
    for (line = strtok(buf, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        double v;
        if (sscanf(line, "RESULT first_step=%lf", &v) == 1) r->first_step = v;
        if (sscanf(line, "RESULT compile=%lf", &v) == 1) r->compile = v;
        if (sscanf(line, "RESULT disk_hits=%lf", &v) == 1) r->disk_hits = v;
        if (sscanf(line, "RESULT builds=%lf", &v) == 1) r->builds = v;
    }
    if (!isfinite(r->first_step)) die("coldstart child printed no result:\n%s", buf);
}

static void cold_row(const char *name, const char *backend, double warm, double cold, int runs) {
    row r = row_new(name, backend);
    r.ours = warm;
    snprintf(r.anchor_name, sizeof r.anchor_name, "cold");
    r.anchor = cold;
    snprintf(r.unit, sizeof r.unit, "warm/cold");
    r.value = warm / cold;
    r.reps = runs;
    add_row(&r);
}

void case_coldstart(void) {
    int runs = g_quick ? 1 : 3, i, b;
    for (b = 0; b < NUM_BACKENDS; b++) {
        const bench_backend *be = &g_backends[b];
        double cold_s[8], warm_s[8], both_s[8], cold_c[8], warm_c[8];
        double warm_hits = 0, warm_builds = 0;
        cold_result r;
        char tbdir[1024], pocl[1024], pocl_keep[1024];
        if (!be->ok) continue;
        for (i = 0; i < runs; i++) {
            make_temp_dir(tbdir, sizeof tbdir, "tbcache");
            make_temp_dir(pocl, sizeof pocl, "pocl");
            make_temp_dir(pocl_keep, sizeof pocl_keep, "poclkeep");
            /* cold: no cache holds anything */
            cold_run(be->name, tbdir, pocl_keep, &r);
            cold_s[i] = r.first_step;
            cold_c[i] = r.compile;
            /* warm: our disk cache filled by the cold run (and a fresh PoCL cache) */
            cold_run(be->name, tbdir, pocl, &r);
            warm_s[i] = r.first_step;
            warm_c[i] = r.compile;
            warm_hits += r.disk_hits;
            warm_builds += r.builds;
            /* OpenCL: both caches warm (what a second start of a program sees) */
            if (be->opencl) {
                cold_run(be->name, tbdir, pocl_keep, &r);
                both_s[i] = r.first_step;
            }
            remove_tree(tbdir);
            remove_tree(pocl);
            remove_tree(pocl_keep);
        }
        {
            double cs = median(cold_s, runs), ws = median(warm_s, runs);
            double cc = median(cold_c, runs), wc = median(warm_c, runs);
            cold_row("coldstart", be->name, ws, cs, runs);
            cold_row("coldstart_compile", be->name, wc, cc, runs);
            if (be->opencl) {
                double bs = median(both_s, runs);
                cold_row("coldstart_both_warm", be->name, bs, cs, runs);
                note("coldstart (opencl): first MLP step (record + compile + run + wait) in a "
                     "new process: cold %.3f s (CompileTime %.3f s), warm from our disk cache "
                     "with a fresh PoCL cache %.3f s (CompileTime %.3f s; disk hits %.0f, "
                     "program builds %.0f over %d runs), both caches warm %.3f s; warm minus "
                     "both-warm is the driver compiling kernels at their first launch",
                     cs, cc, ws, wc, warm_hits, warm_builds, runs, bs);
            } else {
                note("coldstart (native): first MLP step in a new process: cold %.3f s "
                     "(CompileTime %.3f s: the C compiler), warm from our disk cache %.3f s "
                     "(CompileTime %.3f s; disk hits %.0f, compiles %.0f over %d runs)",
                     cs, cc, ws, wc, warm_hits, warm_builds, runs);
            }
        }
    }
}

/* ======================================================================================
   the child processes
   ====================================================================================== */

/* The kernels of the profiled steps: names from the first, times of each step. */
#define PROFILE_KERNELS 32
#define PROFILE_STEPS   16
static char g_kernel_names[PROFILE_KERNELS][128];
static double g_kernel_ms[PROFILE_STEPS][PROFILE_KERNELS];
static int g_step = -1, g_kernel, g_num_kernels;

/* TB_DEBUG=2 lines: "BACKEND:ORDINAL KERNEL TIME ms ..." */
static void child_log(tb_log_level level, const char *message, void *user_data) {
    char backend[16], name[120];
    int ord;
    double ms;
    double *sum = (double *)user_data;
    if (sscanf(message, "%15[a-z]:%d %119s %lf ms", backend, &ord, name, &ms) == 4) {
        *sum += ms;
        if (g_step >= 0 && g_step < PROFILE_STEPS && g_kernel < PROFILE_KERNELS) {
            if (g_step == 0) {
                snprintf(g_kernel_names[g_kernel], sizeof g_kernel_names[0], "%s", name);
                g_num_kernels = g_kernel + 1;
            }
            g_kernel_ms[g_step][g_kernel] = ms;
        }
        g_kernel++;
    } else if (level <= TB_LOG_WARN) {
        fprintf(stderr, "tb: %s\n", message);
    }
}

static int child_coldstart(const bench_backend *be) {
    mlp m;
    float *want, *got;
    double t0, t1;
    tb_tensor *y;
    int64_t batch = 256;
    mlp_init_host(&m, batch);
    want = mlp_reference(&m);
    mlp_upload(&m, be);
    if (be->opencl) finish();
    t0 = now_s();
    y = mlp_forward(&m);
    sync_on(y, be);
    t1 = now_s();
    got = to_host(y);
    check_close("coldstart mlp (vs the reference)", got, want,
                (size_t)(batch * g_mlp_sizes[MLP_LAYERS]), 1e-6, 1e-4);
    printf("RESULT first_step=%.9f\n", t1 - t0);
    printf("RESULT compile=%.9f\n", tb_metrics_total("CompileTime") * 1e-9);
    if (be->opencl) {
        printf("RESULT disk_hits=%.0f\n", backend_counter("opencl", "OpenCL::DiskCacheHit"));
        printf("RESULT builds=%.0f\n", backend_counter("opencl", "OpenCL::ProgramBuild"));
    } else {
        printf("RESULT disk_hits=%.0f\n", backend_counter("native", "Native::DiskCacheHit"));
        printf("RESULT builds=%.0f\n", backend_counter("native", "Native::ProgramCompile"));
    }
    free(got);
    free(want);
    tb_tensor_release(y);
    mlp_release(&m);
    mlp_free_host(&m);
    return 0;
}

static int child_mlp_profile(const bench_backend *be, double *sum) {
    mlp m;
    double walls[PROFILE_STEPS], kernels[PROFILE_STEPS];
    int i, k, steps = g_quick ? 3 : 9;
    mlp_init_host(&m, 256);
    mlp_upload(&m, be);
    for (i = -1; i < steps; i++) { /* step -1 compiles */
        double t0 = now_s();
        tb_tensor *y = mlp_forward(&m);
        g_step = i;
        g_kernel = 0;
        *sum = 0;
        sync_on(y, be);
        tb_tensor_release(y);
        if (i >= 0) {
            walls[i] = now_s() - t0;
            kernels[i] = *sum * 1e-3;
        }
    }
    for (k = 0; k < g_num_kernels; k++) {
        double v[PROFILE_STEPS];
        for (i = 0; i < steps; i++)
            v[i] = g_kernel_ms[i][k];
        printf("KERNEL %-28s %9.3f ms (median of %d steps)\n", g_kernel_names[k], median(v, steps),
               steps);
    }
    printf("RESULT kernel_s=%.9f\n", median(kernels, steps));
    printf("RESULT wall_s=%.9f\n", median(walls, steps));
    mlp_release(&m);
    mlp_free_host(&m);
    return 0;
}

int child_main(const char *mode, const char *backend) {
    bench_backend *be = backend_named(backend);
    double sum = 0;
    int rc;
    if (be == NULL) {
        fprintf(stderr, "bench: unknown backend '%s'\n", backend);
        return 2;
    }
    if (strcmp(mode, "mlp-profile") == 0) {
        tb_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.debug = 2;
        desc.logger.func = child_log;
        desc.logger.user_data = &sum;
        need_ok(tb_setup(&desc), "tb_setup");
    } else if (strcmp(mode, "coldstart") != 0) {
        fprintf(stderr, "bench: unknown child mode '%s'\n", mode);
        return 2;
    }
    open_backends(be->opencl, !be->opencl);
    if (!be->ok) die("%s: %s", be->name, be->why);
    rc = mode[0] == 'c' ? child_coldstart(be) : child_mlp_profile(be, &sum);
    tb_shutdown();
    return rc;
}
