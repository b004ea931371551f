/* The benchmark: the OpenCL backend of torch_backend.h beside its anchors, in one run.
   Build and run it with tools/bench.sh, which passes the flags below:

       cc -std=gnu11 -O2 -I. tools/bench.c -o build/bench/bench -lOpenCL -ldl -lpthread -lm
          [-DBENCH_CLBLAST -lclblast] [-DBENCH_OPENBLAS -lopenblas]
       build/bench/bench [--quick] [--json FILE]

   Every case runs on opencl:0 and checks its result (ours and the anchor's) against the cpu
   reference backend or a host computation before anything is timed; a wrong result stops the
   run with exit status 1. Timing: one untimed warm-up per side, then repetitions that alternate
   between our side and the anchor, each ending with clFinish on the library's queue; the median
   is reported. ratio = anchor time / our time, so > 1 means we are faster.

   The program re-executes itself for the parts that need a fresh process:
       --child coldstart     one MLP step in a new process (the caller sets TB_CACHE_DIR and
                             POCL_CACHE_DIR), prints "RESULT key=value" lines
       --child mlp-profile   MLP steps with per-kernel profiling (debug level 2), prints the
                             kernel times of the last step */
#define _GNU_SOURCE
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#ifdef BENCH_CLBLAST
#include <clblast_c.h>
#endif
#ifdef BENCH_OPENBLAS
#include <cblas.h>
/* OpenBLAS's own functions, declared here in case cblas.h is another implementation's */
int openblas_get_num_threads(void);
char *openblas_get_config(void);
#endif

/* ---- failing loudly ---- */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "bench: FAIL: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(1);
}

static tb_tensor *need(tb_tensor *t, const char *what) {
    if (t == NULL) die("%s: %s", what, tb_last_error());
    return t;
}

static void need_ok(tb_status st, const char *what) {
    if (st != TB_OK) die("%s: %s (%s)", what, tb_last_error(), tb_status_string(st));
}

static void cl_need(cl_int err, const char *what) {
    if (err != CL_SUCCESS) die("%s: OpenCL error %d", what, (int)err);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- global state ---- */

static int g_quick;
static const char *g_only; /* comma-separated case names, NULL: all */
static FILE *g_json;
static tb_device g_ocl, g_cpu;
static cl_platform_id g_platform;
static cl_device_id g_device;
static cl_context g_context;
static cl_command_queue g_queue;
static cl_program g_anchor_program;
static char g_self[4096];

static void finish(void) {
    cl_need(clFinish(g_queue), "clFinish");
}

/* ---- results ---- */

typedef struct row {
    char name[40];
    double tb;
    char anchor_name[24];
    double anchor;
    char unit[16];
    double value; /* our rate in `unit` */
    int reps;
} row;

static row g_rows[96];
static int g_num_rows;
static char g_notes[16384];

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...) {
    size_t len = strlen(g_notes);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_notes + len, sizeof g_notes - len, fmt, ap);
    va_end(ap);
    len = strlen(g_notes);
    if (len + 1 < sizeof g_notes) {
        g_notes[len] = '\n';
        g_notes[len + 1] = '\0';
    }
}

static double ratio_of(const row *r) {
    if (!(r->tb > 0) || !(r->anchor > 0)) return NAN;
    return r->anchor / r->tb;
}

static void fmt_time(double s, char *buf, size_t cap) {
    if (!(s > 0) && s != 0) {
        snprintf(buf, cap, "-");
    } else if (s >= 1.0) {
        snprintf(buf, cap, "%.3f s", s);
    } else if (s >= 1e-3) {
        snprintf(buf, cap, "%.3f ms", s * 1e3);
    } else {
        snprintf(buf, cap, "%.3f us", s * 1e6);
    }
}

static void json_num(FILE *f, double v) {
    if (isfinite(v)) {
        fprintf(f, "%.9g", v);
    } else {
        fprintf(f, "null");
    }
}

static void print_row(FILE *f, const row *r) {
    char a[32], b[32], rate[32];
    fmt_time(r->tb, a, sizeof a);
    fmt_time(r->anchor, b, sizeof b);
    if (isfinite(r->value)) {
        snprintf(rate, sizeof rate, "%.3f %s", r->value, r->unit);
    } else {
        snprintf(rate, sizeof rate, "- %s", r->unit);
    }
    fprintf(f, "%-22s %12s  %-15s %12s  %8.3f  %-22s %4d\n", r->name, a, r->anchor_name, b,
            ratio_of(r), rate, r->reps);
}

static double g_case_start;

static void add_row(const char *name, double tb, const char *anchor_name, double anchor,
                    const char *unit, double value, int reps) {
    row *r;
    if (g_num_rows >= (int)(sizeof g_rows / sizeof g_rows[0])) die("too many rows");
    r = &g_rows[g_num_rows++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->anchor_name, sizeof r->anchor_name, "%s", anchor_name);
    snprintf(r->unit, sizeof r->unit, "%s", unit);
    r->tb = tb;
    r->anchor = anchor;
    r->value = value;
    r->reps = reps;
    printf("  ");
    print_row(stdout, r);
    if (g_case_start > 0) printf("  %*s[case so far %.1f s]\n", 22, "", now_s() - g_case_start);
    fflush(stdout);
    if (g_json != NULL) {
        fprintf(g_json, "{\"case\": \"%s\", \"tb\": ", r->name);
        json_num(g_json, r->tb);
        fprintf(g_json, ", \"anchor_name\": \"%s\", \"anchor\": ", r->anchor_name);
        json_num(g_json, r->anchor);
        fprintf(g_json, ", \"unit\": \"%s\", \"ratio\": ", r->unit);
        json_num(g_json, ratio_of(r));
        fprintf(g_json, ", \"value\": ");
        json_num(g_json, r->value);
        fprintf(g_json, ", \"reps\": %d}\n", r->reps);
        fflush(g_json);
    }
}

/* Whether --only lets the case group `name` run. */
static int selected(const char *name) {
    const char *p = g_only;
    size_t len = strlen(name);
    if (p == NULL) return 1;
    while (*p != '\0') {
        size_t n = strcspn(p, ",");
        if (n == len && strncmp(p, name, n) == 0) return 1;
        p += n;
        if (*p == ',') p++;
    }
    return 0;
}

/* ---- timing ---- */

typedef void (*run_fn)(void *ctx);

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : (x > y ? 1 : 0);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double time_once(run_fn fn, void *ctx) {
    double t0 = now_s();
    fn(ctx);
    return now_s() - t0;
}

/* How many repetitions fit the time a case may take: about 4 s per side in a full run, at least
   3 (1 when one call takes seconds), at most 21; with --quick 3 for calls under 50 ms, else 1. */
static int reps_for(double one_call) {
    int r;
    if (g_quick) return one_call < 0.05 ? 3 : 1;
    if (one_call > 2.0) return 1;
    r = (int)(4.0 / (one_call > 1e-6 ? one_call : 1e-6));
    if (r < 3) r = 3;
    if (r > 21) r = 21;
    return r;
}

/* Warm-up (one untimed call each), one timed call each to size the repetitions, then the
   repetitions alternating between the sides. `b` may be NULL. */
static int measure(run_fn a, void *actx, run_fn b, void *bctx, double *ta, double *tbv) {
    double sa[32], sb[32], est;
    int reps, i;
    a(actx);
    if (b != NULL) b(bctx);
    sa[0] = time_once(a, actx);
    sb[0] = b != NULL ? time_once(b, bctx) : 0;
    est = sa[0] > sb[0] ? sa[0] : sb[0];
    reps = reps_for(est);
    for (i = 1; i < reps; i++) {
        sa[i] = time_once(a, actx);
        if (b != NULL) sb[i] = time_once(b, bctx);
    }
    *ta = median(sa, reps);
    if (tbv != NULL) *tbv = b != NULL ? median(sb, reps) : NAN;
    return reps;
}

/* ---- data ---- */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static void seed_rng(uint64_t seed) {
    g_rng = seed * 0x9E3779B97F4A7C15ull + 1;
}

static float urand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_rng >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static float *host_alloc(size_t n) {
    float *p = (float *)malloc((n > 0 ? n : 1) * sizeof(float));
    if (p == NULL) die("out of host memory (%zu floats)", n);
    return p;
}

static float *host_random(size_t n, float scale) {
    float *p = host_alloc(n);
    size_t i;
    for (i = 0; i < n; i++)
        p[i] = urand() * scale;
    return p;
}

static tb_tensor *upload(const float *h, int32_t rank, const int64_t *dims, const tb_device *dev) {
    tb_shape s;
    need_ok(tb_shape_make(&s, TB_F32, rank, dims), "tb_shape_make");
    return need(tb_tensor_from_host(h, &s, dev), "tb_tensor_from_host");
}

static size_t numel_of(tb_tensor *t) {
    tb_shape s = tb_tensor_shape(t);
    int64_t n = 0;
    need_ok(tb_shape_numel(&s, &n), "tb_shape_numel");
    return (size_t)n;
}

static float *to_host(tb_tensor *t) {
    size_t n = numel_of(t);
    float *h = host_alloc(n);
    need_ok(tb_tensor_to_host(t, h, n * sizeof(float)), "tb_tensor_to_host");
    return h;
}

static void sync1(tb_tensor *t) {
    need_ok(tb_sync(&t, 1), "tb_sync");
    finish();
}

static cl_mem tensor_mem(tb_tensor *t) {
    void *mem = NULL;
    size_t size = 0;
    need_ok(tb_opencl_tensor_buffer(t, &mem, &size), "tb_opencl_tensor_buffer");
    return (cl_mem)mem;
}

static cl_mem cl_buffer(size_t bytes) {
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(g_context, CL_MEM_READ_WRITE, bytes > 0 ? bytes : 4, NULL, &err);
    cl_need(err, "clCreateBuffer");
    return m;
}

static float *cl_read(cl_mem m, size_t n) {
    float *h = host_alloc(n);
    cl_need(clEnqueueReadBuffer(g_queue, m, CL_TRUE, 0, n * sizeof(float), h, 0, NULL, NULL),
            "clEnqueueReadBuffer");
    return h;
}

/* max |got - want| <= atol + rtol * |want| everywhere, or the run stops. */
static void check_close(const char *what, const float *got, const float *want, size_t n,
                        double atol, double rtol) {
    size_t i, worst = 0;
    double worst_excess = -1;
    for (i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        double err = fabs(g - w), tol = atol + rtol * fabs(w);
        if (isnan(g) != isnan(w) || (!isnan(w) && !(err <= tol))) {
            die("%s: element %zu is %.9g, expected %.9g (tolerance %.3g); %zu elements checked",
                what, i, g, w, tol, n);
        }
        if (err - tol > worst_excess) {
            worst_excess = err - tol;
            worst = i;
        }
    }
    (void)worst;
}

/* ---- anchors: hand-written OpenCL C ---- */

static const char *const g_anchor_src =
    "/* elementwise: the chain8 case in one kernel */\n"
    "__kernel void chain8(__global const float *restrict x, __global float *restrict y,\n"
    "                     const int n) {\n"
    "    const int i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    const float v = x[i];\n"
    "    float t = v * 1.5f;\n"
    "    t = t + 0.5f;\n"
    "    t = fmax(t, 0.0f);\n"
    "    t = t * v;\n"
    "    t = t - 0.25f;\n"
    "    t = fabs(t);\n"
    "    t = -t;\n"
    "    y[i] = exp(t);\n"
    "}\n"
    "\n"
    "/* one stage of a reduction: group g reduces the contiguous chunk g of x (so with as many\n"
    "   groups as rows it gives row reductions); the local size is a power of two */\n"
    "#define ADDF(a, b) ((a) + (b))\n"
    "#define REDUCE_KERNEL(NAME, INIT, OP)                                                 \\\n"
    "    __kernel void NAME(__global const float *restrict x, __global float *restrict out, \\\n"
    "                       const long n, __local float *scratch) {                      \\\n"
    "        const long g = get_group_id(0), ng = get_num_groups(0);                      \\\n"
    "        const int lid = get_local_id(0), ls = get_local_size(0);                     \\\n"
    "        const long chunk = (n + ng - 1) / ng, start = g * chunk;                     \\\n"
    "        const long end = start + chunk < n ? start + chunk : n;                      \\\n"
    "        float acc = INIT;                                                            \\\n"
    "        for (long i = start + lid; i < end; i += ls) acc = OP(acc, x[i]);            \\\n"
    "        scratch[lid] = acc;                                                          \\\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);                                                \\\n"
    "        for (int s = ls / 2; s > 0; s >>= 1) {                                       \\\n"
    "            if (lid < s) scratch[lid] = OP(scratch[lid], scratch[lid + s]);          \\\n"
    "            barrier(CLK_LOCAL_MEM_FENCE);                                            \\\n"
    "        }                                                                            \\\n"
    "        if (lid == 0) out[g] = scratch[0];                                           \\\n"
    "    }\n"
    "REDUCE_KERNEL(reduce_sum, 0.0f, ADDF)\n"
    "REDUCE_KERNEL(reduce_max, -INFINITY, fmax)\n"
    "/* the other design of stage 1, the one CPUs like: work item g reduces the contiguous chunk\n"
    "   g of x on its own (with as many items as rows it gives row reductions) */\n"
    "#define ITEMS_KERNEL(NAME, INIT, OP)                                                  \\\n"
    "    __kernel void NAME(__global const float *restrict x, __global float *restrict out, \\\n"
    "                       const long n) {                                              \\\n"
    "        const long g = get_global_id(0), ng = get_global_size(0);                    \\\n"
    "        const long chunk = (n + ng - 1) / ng, start = g * chunk;                     \\\n"
    "        const long end = start + chunk < n ? start + chunk : n;                      \\\n"
    "        float acc = INIT;                                                            \\\n"
    "        for (long i = start; i < end; i++) acc = OP(acc, x[i]);                      \\\n"
    "        out[g] = acc;                                                                \\\n"
    "    }\n"
    "ITEMS_KERNEL(reduce_sum_items, 0.0f, ADDF)\n"
    "ITEMS_KERNEL(reduce_max_items, -INFINITY, fmax)\n"
    "\n"
    "/* work-group sum and max; every work item gets the result */\n"
    "float wg_sum(__local float *s, float v) {\n"
    "    const int lid = get_local_id(0), ls = get_local_size(0);\n"
    "    s[lid] = v;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (int k = ls / 2; k > 0; k >>= 1) {\n"
    "        if (lid < k) s[lid] += s[lid + k];\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "    const float r = s[0];\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    return r;\n"
    "}\n"
    "float wg_max(__local float *s, float v) {\n"
    "    const int lid = get_local_id(0), ls = get_local_size(0);\n"
    "    s[lid] = v;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (int k = ls / 2; k > 0; k >>= 1) {\n"
    "        if (lid < k) s[lid] = fmax(s[lid], s[lid + k]);\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "    const float r = s[0];\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    return r;\n"
    "}\n"
    "\n"
    "/* softmax over rows, one work-group per row: max, sum of exp, write (three reads) */\n"
    "__kernel void softmax_rows(__global const float *restrict x, __global float *restrict y,\n"
    "                           const int cols, __local float *s) {\n"
    "    const long row = get_group_id(0);\n"
    "    const int lid = get_local_id(0), ls = get_local_size(0);\n"
    "    __global const float *xr = x + row * cols;\n"
    "    __global float *yr = y + row * cols;\n"
    "    float m = -INFINITY;\n"
    "    for (int i = lid; i < cols; i += ls) m = fmax(m, xr[i]);\n"
    "    m = wg_max(s, m);\n"
    "    float sum = 0.0f;\n"
    "    for (int i = lid; i < cols; i += ls) sum += exp(xr[i] - m);\n"
    "    sum = wg_sum(s, sum);\n"
    "    const float inv = 1.0f / sum;\n"
    "    for (int i = lid; i < cols; i += ls) yr[i] = exp(xr[i] - m) * inv;\n"
    "}\n"
    "\n"
    "/* layer norm over rows with weight and bias, one work-group per row: mean, variance,\n"
    "   write (three reads) */\n"
    "__kernel void layer_norm_rows(__global const float *restrict x,\n"
    "                              __global const float *restrict w,\n"
    "                              __global const float *restrict b, __global float *restrict y,\n"
    "                              const int cols, const float eps, __local float *s) {\n"
    "    const long row = get_group_id(0);\n"
    "    const int lid = get_local_id(0), ls = get_local_size(0);\n"
    "    __global const float *xr = x + row * cols;\n"
    "    __global float *yr = y + row * cols;\n"
    "    float acc = 0.0f;\n"
    "    for (int i = lid; i < cols; i += ls) acc += xr[i];\n"
    "    const float mean = wg_sum(s, acc) / (float)cols;\n"
    "    acc = 0.0f;\n"
    "    for (int i = lid; i < cols; i += ls) {\n"
    "        const float d = xr[i] - mean;\n"
    "        acc += d * d;\n"
    "    }\n"
    "    const float rstd = 1.0f / sqrt(wg_sum(s, acc) / (float)cols + eps);\n"
    "    for (int i = lid; i < cols; i += ls) yr[i] = (xr[i] - mean) * rstd * w[i] + b[i];\n"
    "}\n"
    "\n"
    "/* a trivial kernel for the replay case: r_out[row] = max_j (r_in[row] + x[row, j]) */\n"
    "__kernel void rowmax_add(__global const float *restrict r_in,\n"
    "                         __global const float *restrict x, __global float *restrict r_out,\n"
    "                         const int cols) {\n"
    "    const int row = get_global_id(0);\n"
    "    const float r = r_in[row];\n"
    "    float m = -INFINITY;\n"
    "    for (int j = 0; j < cols; j++) m = fmax(m, r + x[row * cols + j]);\n"
    "    r_out[row] = m;\n"
    "}\n";

static void build_anchors(void) {
    cl_int err = CL_SUCCESS;
    const char *src = g_anchor_src;
    g_anchor_program = clCreateProgramWithSource(g_context, 1, &src, NULL, &err);
    cl_need(err, "clCreateProgramWithSource (anchors)");
    err = clBuildProgram(g_anchor_program, 1, &g_device, "-cl-std=CL1.2", NULL, NULL);
    if (err != CL_SUCCESS) {
        char log[16384];
        log[0] = '\0';
        clGetProgramBuildInfo(g_anchor_program, g_device, CL_PROGRAM_BUILD_LOG, sizeof log, log,
                              NULL);
        die("the anchor kernels do not build (%d):\n%s", (int)err, log);
    }
}

static cl_kernel anchor_kernel(const char *name) {
    cl_int err = CL_SUCCESS;
    cl_kernel k = clCreateKernel(g_anchor_program, name, &err);
    cl_need(err, name);
    return k;
}

static void set_arg(cl_kernel k, cl_uint i, size_t size, const void *value) {
    cl_need(clSetKernelArg(k, i, size, value), "clSetKernelArg");
}

static void launch(cl_kernel k, size_t global, size_t local) {
    cl_need(clEnqueueNDRangeKernel(g_queue, k, 1, NULL, &global, local > 0 ? &local : NULL, 0, NULL,
                                   NULL),
            "clEnqueueNDRangeKernel");
}

/* A power-of-two local size for the hand-written group kernels: 128, less for short rows. */
static size_t group_size_for(int64_t len) {
    size_t ls = 128;
    while (ls > 1 && (int64_t)ls / 2 >= len)
        ls /= 2;
    return ls;
}

static size_t kernel_max_group(cl_kernel k) {
    size_t m = 0;
    cl_need(clGetKernelWorkGroupInfo(k, g_device, CL_KERNEL_WORK_GROUP_SIZE, sizeof m, &m, NULL),
            "clGetKernelWorkGroupInfo");
    return m;
}

/* The anchors get their best launch shape: each candidate value of *param is run once to warm
   up and timed twice; the fastest stays in *param. Returns its time. */
static double tune(run_fn run, void *ctx, size_t *param, const size_t *cands, int n, size_t limit) {
    double best = INFINITY;
    size_t best_v = cands[0];
    int i;
    for (i = 0; i < n; i++) {
        double t;
        if (limit > 0 && cands[i] > limit) continue;
        *param = cands[i];
        run(ctx);
        t = time_once(run, ctx);
        if (!g_quick) {
            double t2 = time_once(run, ctx);
            if (t2 < t) t = t2;
        }
        if (t < best) {
            best = t;
            best_v = cands[i];
        }
    }
    *param = best_v;
    return best;
}

/* ======================================================================================
   chain8: eight elementwise ops
   ====================================================================================== */

static tb_tensor *chain8_tb(tb_tensor *x) {
    tb_tensor *t[8];
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
    return need(t[7], "chain8");
}

typedef struct unary_case {
    tb_tensor *x;
    cl_kernel k;
    cl_mem in, out, partial;
    int n;
    size_t groups, local;
} unary_case;

static void chain8_run_tb(void *p) {
    unary_case *c = (unary_case *)p;
    tb_tensor *y = chain8_tb(c->x);
    sync1(y);
    tb_tensor_release(y);
}

static void chain8_run_anchor(void *p) {
    unary_case *c = (unary_case *)p;
    size_t global =
        c->local > 0 ? ((size_t)c->n + c->local - 1) / c->local * c->local : (size_t)c->n;
    launch(c->k, global, c->local);
    finish();
}

static void case_chain8(int64_t n) {
    float *h = host_random((size_t)n, 1.0f), *want, *got;
    tb_tensor *xc, *yc, *y;
    unary_case c;
    double t_tb, t_an;
    int reps;
    memset(&c, 0, sizeof c);
    c.n = (int)n;
    c.x = upload(h, 1, &n, &g_ocl);
    xc = upload(h, 1, &n, &g_cpu);
    yc = chain8_tb(xc);
    want = to_host(yc);
    y = chain8_tb(c.x);
    got = to_host(y);
    check_close("chain8 (opencl vs cpu reference)", got, want, (size_t)n, 1e-6, 1e-5);
    free(got);
    c.k = anchor_kernel("chain8");
    c.in = tensor_mem(c.x);
    c.out = cl_buffer((size_t)n * 4);
    set_arg(c.k, 0, sizeof(cl_mem), &c.in);
    set_arg(c.k, 1, sizeof(cl_mem), &c.out);
    set_arg(c.k, 2, sizeof(int), &c.n);
    {
        static const size_t cands[] = {0, 64, 128, 256, 1024, 4096};
        tune(chain8_run_anchor, &c, &c.local, cands, 6, kernel_max_group(c.k));
        note("chain8 anchor: local size %zu (0: the driver's choice)", c.local);
    }
    chain8_run_anchor(&c);
    got = cl_read(c.out, (size_t)n);
    check_close("chain8 (hand-written kernel vs cpu reference)", got, want, (size_t)n, 1e-6, 1e-5);
    free(got);
    reps = measure(chain8_run_tb, &c, chain8_run_anchor, &c, &t_tb, &t_an);
    add_row("chain8", t_tb, "hand_kernel", t_an, "GB/s", 8.0 * (double)n / t_tb / 1e9, reps);
    tb_tensor_release(y);
    tb_tensor_release(yc);
    tb_tensor_release(xc);
    tb_tensor_release(c.x);
    clReleaseMemObject(c.out);
    clReleaseKernel(c.k);
    free(h);
    free(want);
}

/* ======================================================================================
   reductions: sum and max of everything, row sums
   ====================================================================================== */

typedef struct reduce_case {
    tb_tensor *x;
    int op;    /* 0 sum, 1 max */
    int rows;  /* > 0: row sums of x viewed as [rows, n / rows] */
    int items; /* stage 1 design: 0 a group per chunk, 1 a work item per chunk */
    cl_kernel k, k_items;
    cl_mem in, partial, out;
    long n;
    size_t groups, local;
} reduce_case;

static tb_tensor *reduce_tb(const reduce_case *c) {
    if (c->rows > 0) {
        int32_t axis = 1;
        return need(tb_sum(c->x, &axis, 1, false), "tb_sum rows");
    }
    return need(c->op == 0 ? tb_sum(c->x, NULL, 0, false) : tb_max(c->x, NULL, 0, false),
                "reduction");
}

static void reduce_run_tb(void *p) {
    reduce_case *c = (reduce_case *)p;
    tb_tensor *y = reduce_tb(c);
    sync1(y);
    tb_tensor_release(y);
}

static void reduce_run_anchor(void *p) {
    reduce_case *c = (reduce_case *)p;
    long n2 = (long)c->groups;
    size_t local2 = group_size_for((int64_t)c->groups);
    cl_mem *stage1_out = c->rows > 0 ? &c->out : &c->partial;
    /* stage 1: c->groups partial results (or the row results themselves) */
    if (c->items) {
        set_arg(c->k_items, 0, sizeof(cl_mem), &c->in);
        set_arg(c->k_items, 1, sizeof(cl_mem), stage1_out);
        set_arg(c->k_items, 2, sizeof(long), &c->n);
        launch(c->k_items, c->groups, 0);
    } else {
        set_arg(c->k, 0, sizeof(cl_mem), &c->in);
        set_arg(c->k, 1, sizeof(cl_mem), stage1_out);
        set_arg(c->k, 2, sizeof(long), &c->n);
        set_arg(c->k, 3, c->local * sizeof(float), NULL);
        launch(c->k, c->groups * c->local, c->local);
    }
    if (c->rows == 0) {
        /* stage 2: one group over the partial results */
        set_arg(c->k, 0, sizeof(cl_mem), &c->partial);
        set_arg(c->k, 1, sizeof(cl_mem), &c->out);
        set_arg(c->k, 2, sizeof(long), &n2);
        set_arg(c->k, 3, local2 * sizeof(float), NULL);
        launch(c->k, local2, local2);
    }
    finish();
}

static void case_reduce(const char *name, int op, int64_t n, int64_t rows) {
    float *h = host_random((size_t)n, 1.0f), *got, *want;
    reduce_case c;
    double t_tb, t_an, abs_sum = 0;
    int64_t i, r, cols = rows > 0 ? n / rows : n;
    int64_t dims[2];
    size_t nout = rows > 0 ? (size_t)rows : 1;
    tb_tensor *y;
    int reps;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.rows = (int)rows;
    c.n = (long)n;
    if (rows > 0) {
        dims[0] = rows;
        dims[1] = cols;
        c.x = upload(h, 2, dims, &g_ocl);
    } else {
        c.x = upload(h, 1, &n, &g_ocl);
    }
    /* the expected values, in double on the host */
    want = host_alloc(nout);
    for (r = 0; r < (int64_t)nout; r++) {
        double acc = op == 0 ? 0.0 : -INFINITY;
        for (i = r * cols; i < (r + 1) * cols; i++) {
            if (op == 0) {
                acc += h[i];
            } else if (h[i] > acc) {
                acc = h[i];
            }
            abs_sum += fabs(h[i]);
        }
        want[r] = (float)acc;
    }
    /* float sums of many terms: the tolerance follows the sum of magnitudes per output */
    abs_sum /= (double)nout;
    y = reduce_tb(&c);
    got = to_host(y);
    check_close(name, got, want, nout, op == 0 ? 1e-6 * abs_sum : 0.0, op == 0 ? 1e-5 : 0.0);
    free(got);
    tb_tensor_release(y);
    c.k = anchor_kernel(op == 0 ? "reduce_sum" : "reduce_max");
    c.in = tensor_mem(c.x);
    c.local = rows > 0 ? group_size_for(cols) : 128;
    c.groups = rows > 0 ? (size_t)rows : 64;
    c.partial = cl_buffer(1024 * sizeof(float));
    c.out = cl_buffer(nout * sizeof(float));
    c.k_items = anchor_kernel(op == 0 ? "reduce_sum_items" : "reduce_max_items");
    {
        /* the anchor takes the faster of the two stage-1 designs, each at its best shape */
        static const size_t locals[] = {16, 32, 64, 128, 256, 512};
        static const size_t groups[] = {4, 16, 64, 256, 1024};
        size_t limit = kernel_max_group(c.k), best_l = 128, best_g = 64;
        double best = INFINITY, t;
        size_t g;
        if (rows > 0) {
            c.items = 0;
            best = tune(reduce_run_anchor, &c, &c.local, locals, 6, limit);
            best_l = c.local;
            best_g = (size_t)rows;
            c.items = 1;
            reduce_run_anchor(&c);
            t = time_once(reduce_run_anchor, &c);
            if (!g_quick) {
                double t2 = time_once(reduce_run_anchor, &c);
                if (t2 < t) t = t2;
            }
            c.items = t < best ? 1 : 0;
            c.local = best_l;
            if (c.items) {
                note("%s anchor: one work item per row", name);
            } else {
                note("%s anchor: one group of %zu per row", name, c.local);
            }
        } else {
            static const size_t item_counts[] = {2, 4, 8, 16, 64, 256, 1024};
            int best_items = 0;
            for (g = 0; g < 5; g++) {
                c.groups = groups[g];
                c.items = 0;
                t = tune(reduce_run_anchor, &c, &c.local, locals + 2, 4, limit);
                if (t < best) {
                    best = t;
                    best_g = c.groups;
                    best_l = c.local;
                    best_items = 0;
                }
            }
            c.items = 1;
            t = tune(reduce_run_anchor, &c, &c.groups, item_counts, 7, 0);
            if (t < best) {
                best_g = c.groups;
                best_items = 1;
            }
            c.items = best_items;
            c.groups = best_g;
            c.local = best_l;
            if (c.items) {
                note("%s anchor: %zu work items on contiguous chunks, then one group", name,
                     c.groups);
            } else {
                note("%s anchor: %zu groups of %zu, then one group", name, c.groups, c.local);
            }
        }
    }
    reduce_run_anchor(&c);
    got = cl_read(c.out, nout);
    {
        char what[96];
        snprintf(what, sizeof what, "%s (hand-written two-stage reduction)", name);
        check_close(what, got, want, nout, op == 0 ? 1e-5 * abs_sum : 0.0, op == 0 ? 1e-4 : 0.0);
    }
    free(got);
    reps = measure(reduce_run_tb, &c, reduce_run_anchor, &c, &t_tb, &t_an);
    add_row(name, t_tb, "hand_2stage", t_an, "GB/s", 4.0 * (double)n / t_tb / 1e9, reps);
    tb_tensor_release(c.x);
    clReleaseMemObject(c.partial);
    clReleaseMemObject(c.out);
    clReleaseKernel(c.k);
    clReleaseKernel(c.k_items);
    free(h);
    free(want);
}

/* ======================================================================================
   softmax and layer_norm over rows
   ====================================================================================== */

typedef struct norm_case {
    int layer_norm;
    tb_tensor *x, *w, *b;
    cl_kernel k;
    cl_mem in, wm, bm, out;
    int rows, cols;
    size_t local;
} norm_case;

#define LN_EPS 1e-5

static tb_tensor *norm_tb(tb_tensor *x, tb_tensor *w, tb_tensor *b, int layer_norm) {
    if (layer_norm) return need(tb_layer_norm(x, 1, w, b, LN_EPS), "tb_layer_norm");
    return need(tb_softmax(x, 1), "tb_softmax");
}

static void norm_run_tb(void *p) {
    norm_case *c = (norm_case *)p;
    tb_tensor *y = norm_tb(c->x, c->w, c->b, c->layer_norm);
    sync1(y);
    tb_tensor_release(y);
}

static void norm_run_anchor(void *p) {
    norm_case *c = (norm_case *)p;
    set_arg(c->k, c->layer_norm ? 6 : 3, c->local * sizeof(float), NULL);
    launch(c->k, (size_t)c->rows * c->local, c->local);
    finish();
}

static void case_norm(const char *name, int layer_norm, int64_t rows, int64_t cols) {
    int64_t dims[2];
    size_t n = (size_t)(rows * cols);
    float *h = host_random(n, 3.0f), *hw = host_random((size_t)cols, 1.0f),
          *hb = host_random((size_t)cols, 1.0f), *want, *got;
    tb_tensor *xc, *wc, *bc, *yc, *y;
    norm_case c;
    double t_tb, t_an;
    int reps;
    char what[96];
    memset(&c, 0, sizeof c);
    dims[0] = rows;
    dims[1] = cols;
    c.layer_norm = layer_norm;
    c.rows = (int)rows;
    c.cols = (int)cols;
    c.x = upload(h, 2, dims, &g_ocl);
    c.w = upload(hw, 1, &cols, &g_ocl);
    c.b = upload(hb, 1, &cols, &g_ocl);
    xc = upload(h, 2, dims, &g_cpu);
    wc = upload(hw, 1, &cols, &g_cpu);
    bc = upload(hb, 1, &cols, &g_cpu);
    yc = norm_tb(xc, wc, bc, layer_norm);
    want = to_host(yc);
    y = norm_tb(c.x, c.w, c.b, layer_norm);
    got = to_host(y);
    snprintf(what, sizeof what, "%s (opencl vs cpu reference)", name);
    check_close(what, got, want, n, layer_norm ? 1e-5 : 1e-8, 1e-5);
    free(got);
    tb_tensor_release(y);
    c.k = anchor_kernel(layer_norm ? "layer_norm_rows" : "softmax_rows");
    c.local = group_size_for(cols);
    c.in = tensor_mem(c.x);
    c.out = cl_buffer(n * sizeof(float));
    if (layer_norm) {
        float eps = (float)LN_EPS;
        c.wm = tensor_mem(c.w);
        c.bm = tensor_mem(c.b);
        set_arg(c.k, 0, sizeof(cl_mem), &c.in);
        set_arg(c.k, 1, sizeof(cl_mem), &c.wm);
        set_arg(c.k, 2, sizeof(cl_mem), &c.bm);
        set_arg(c.k, 3, sizeof(cl_mem), &c.out);
        set_arg(c.k, 4, sizeof(int), &c.cols);
        set_arg(c.k, 5, sizeof(float), &eps);
        set_arg(c.k, 6, c.local * sizeof(float), NULL);
    } else {
        set_arg(c.k, 0, sizeof(cl_mem), &c.in);
        set_arg(c.k, 1, sizeof(cl_mem), &c.out);
        set_arg(c.k, 2, sizeof(int), &c.cols);
        set_arg(c.k, 3, c.local * sizeof(float), NULL);
    }
    {
        static const size_t locals[] = {16, 32, 64, 128, 256, 512};
        size_t limit = kernel_max_group(c.k);
        tune(norm_run_anchor, &c, &c.local, locals, 6, limit);
        note("%s anchor: one group of %zu per row", name, c.local);
    }
    norm_run_anchor(&c);
    got = cl_read(c.out, n);
    snprintf(what, sizeof what, "%s (hand-written kernel vs cpu reference)", name);
    check_close(what, got, want, n, layer_norm ? 1e-4 : 1e-7, 1e-4);
    free(got);
    reps = measure(norm_run_tb, &c, norm_run_anchor, &c, &t_tb, &t_an);
    /* one read and one write of x: the least traffic a row kernel needs */
    add_row(name, t_tb, "hand_kernel", t_an, "GB/s", 8.0 * (double)n / t_tb / 1e9, reps);
    tb_tensor_release(yc);
    tb_tensor_release(xc);
    tb_tensor_release(wc);
    tb_tensor_release(bc);
    tb_tensor_release(c.x);
    tb_tensor_release(c.w);
    tb_tensor_release(c.b);
    clReleaseMemObject(c.out);
    clReleaseKernel(c.k);
    free(h);
    free(hw);
    free(hb);
    free(want);
}

/* ======================================================================================
   matmul
   ====================================================================================== */

typedef struct matmul_case {
    tb_tensor *a, *b;
    const float *ha, *hb;
    float *hc;
    cl_mem am, bm, cm;
    int n;
} matmul_case;

static void matmul_run_tb(void *p) {
    matmul_case *c = (matmul_case *)p;
    tb_tensor *y = need(tb_matmul(c->a, c->b), "tb_matmul");
    sync1(y);
    tb_tensor_release(y);
}

#ifdef BENCH_CLBLAST
static void matmul_run_clblast(void *p) {
    matmul_case *c = (matmul_case *)p;
    size_t n = (size_t)c->n;
    CLBlastStatusCode st =
        CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, n, n, n, 1.0f,
                     c->am, 0, n, c->bm, 0, n, 0.0f, c->cm, 0, n, &g_queue, NULL);
    if (st != CLBlastSuccess) die("CLBlastSgemm: status %d", (int)st);
    finish();
}
#endif

#ifdef BENCH_OPENBLAS
static void matmul_run_openblas(void *p) {
    matmul_case *c = (matmul_case *)p;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c->n, c->n, c->n, 1.0f, c->ha, c->n,
                c->hb, c->n, 0.0f, c->hc, c->n);
}
#endif

/* Checks sampled entries (and whole rows and columns at the corners) against double dot
   products on the host. */
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

static void case_matmul(int n) {
    int64_t dims[2];
    size_t nn = (size_t)n * n;
    float *ha = host_random(nn, 1.0f), *hb = host_random(nn, 1.0f), *got;
    matmul_case c;
    tb_tensor *y;
    double t_tb, t_an, flops = 2.0 * n * (double)n * n;
    int reps;
    char name[32], what[96];
    memset(&c, 0, sizeof c);
    snprintf(name, sizeof name, "matmul_%d", n);
    dims[0] = n;
    dims[1] = n;
    c.n = n;
    c.ha = ha;
    c.hb = hb;
    c.hc = host_alloc(nn);
    c.a = upload(ha, 2, dims, &g_ocl);
    c.b = upload(hb, 2, dims, &g_ocl);
    y = need(tb_matmul(c.a, c.b), "tb_matmul");
    got = to_host(y);
    snprintf(what, sizeof what, "%s (opencl)", name);
    check_matmul(what, got, ha, hb, n);
    free(got);
    tb_tensor_release(y);
    c.am = tensor_mem(c.a);
    c.bm = tensor_mem(c.b);
    c.cm = cl_buffer(nn * sizeof(float));
#ifdef BENCH_CLBLAST
    matmul_run_clblast(&c);
    got = cl_read(c.cm, nn);
    snprintf(what, sizeof what, "%s (CLBlast)", name);
    check_matmul(what, got, ha, hb, n);
    free(got);
    reps = measure(matmul_run_tb, &c, matmul_run_clblast, &c, &t_tb, &t_an);
    add_row(name, t_tb, "clblast", t_an, "GFLOP/s", flops / t_tb / 1e9, reps);
#else
    reps = measure(matmul_run_tb, &c, NULL, NULL, &t_tb, NULL);
    add_row(name, t_tb, "clblast(absent)", NAN, "GFLOP/s", flops / t_tb / 1e9, reps);
#endif
#ifdef BENCH_OPENBLAS
    /* measured apart from the OpenCL side: OpenBLAS threads keep spinning after a call and
       would take the cores from the device's threads */
    matmul_run_openblas(&c);
    snprintf(what, sizeof what, "%s (OpenBLAS)", name);
    check_matmul(what, c.hc, ha, hb, n);
    {
        double t_ob;
        int reps2 = measure(matmul_run_openblas, &c, NULL, NULL, &t_ob, NULL);
        add_row(name, t_tb, "openblas", t_ob, "GFLOP/s", flops / t_tb / 1e9,
                reps < reps2 ? reps : reps2);
    }
    usleep(200000); /* let the OpenBLAS threads go back to sleep */
#else
    add_row(name, t_tb, "openblas(absent)", NAN, "GFLOP/s", flops / t_tb / 1e9, reps);
#endif
    tb_tensor_release(c.a);
    tb_tensor_release(c.b);
    clReleaseMemObject(c.cm);
    free(ha);
    free(hb);
    free(c.hc);
}

/* ======================================================================================
   mlp: 784-512-512-10, relu, softmax
   ====================================================================================== */

#define MLP_LAYERS 3
static const int64_t g_mlp_sizes[MLP_LAYERS + 1] = {784, 512, 512, 10};

typedef struct mlp {
    int64_t batch;
    float *hx, *hw[MLP_LAYERS], *hb[MLP_LAYERS];
    tb_tensor *x, *w[MLP_LAYERS], *b[MLP_LAYERS];
    /* host split of the last run */
    double t_record, t_sync, t_finish;
    /* OpenBLAS anchor buffers */
    float *act[MLP_LAYERS + 1];
} mlp;

static void mlp_init_host(mlp *m, int64_t batch) {
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

static void mlp_upload(mlp *m, const tb_device *dev) {
    int l;
    int64_t dims[2];
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

static void mlp_release(mlp *m) {
    int l;
    tb_tensor_release(m->x);
    m->x = NULL;
    for (l = 0; l < MLP_LAYERS; l++) {
        tb_tensor_release(m->w[l]);
        tb_tensor_release(m->b[l]);
        m->w[l] = m->b[l] = NULL;
    }
}

static void mlp_free_host(mlp *m) {
    int l;
    free(m->hx);
    for (l = 0; l < MLP_LAYERS; l++) {
        free(m->hw[l]);
        free(m->hb[l]);
    }
    for (l = 0; l <= MLP_LAYERS; l++)
        free(m->act[l]);
}

/* The forward pass as recorded ops (nothing runs). */
static tb_tensor *mlp_forward(const mlp *m) {
    tb_tensor *h = tb_tensor_retain(m->x);
    int l;
    for (l = 0; l < MLP_LAYERS; l++) {
        tb_tensor *mm = tb_matmul(h, m->w[l]);
        tb_tensor *z = tb_add(mm, m->b[l]);
        tb_tensor_release(mm);
        tb_tensor_release(h);
        if (l + 1 < MLP_LAYERS) {
            h = tb_relu(z);
            tb_tensor_release(z);
        } else {
            h = tb_softmax(z, 1);
            tb_tensor_release(z);
        }
    }
    return need(h, "mlp forward");
}

static void mlp_run_tb(void *p) {
    mlp *m = (mlp *)p;
    double t0 = now_s(), t1, t2;
    tb_tensor *y = mlp_forward(m);
    t1 = now_s();
    need_ok(tb_sync(&y, 1), "tb_sync (mlp)");
    t2 = now_s();
    finish();
    m->t_finish = now_s() - t2;
    m->t_sync = t2 - t1;
    m->t_record = t1 - t0;
    tb_tensor_release(y);
}

#ifdef BENCH_OPENBLAS
static void mlp_run_openblas(void *p) {
    mlp *m = (mlp *)p;
    int l;
    int64_t r, j;
    for (l = 0; l < MLP_LAYERS; l++) {
        const float *in = l == 0 ? m->hx : m->act[l];
        float *out = m->act[l + 1];
        int k = (int)g_mlp_sizes[l], n = (int)g_mlp_sizes[l + 1];
        for (r = 0; r < m->batch; r++)
            memcpy(out + r * n, m->hb[l], (size_t)n * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m->batch, n, k, 1.0f, in, k,
                    m->hw[l], n, 1.0f, out, n);
        if (l + 1 < MLP_LAYERS) {
            for (j = 0; j < m->batch * n; j++)
                out[j] = out[j] > 0 ? out[j] : 0;
        } else {
            for (r = 0; r < m->batch; r++) {
                float *o = out + r * n, mx = -INFINITY, s = 0;
                for (j = 0; j < n; j++)
                    mx = o[j] > mx ? o[j] : mx;
                for (j = 0; j < n; j++) {
                    o[j] = expf(o[j] - mx);
                    s += o[j];
                }
                for (j = 0; j < n; j++)
                    o[j] /= s;
            }
        }
    }
}
#endif

/* The MLP output on the cpu reference backend. */
static float *mlp_reference(mlp *m) {
    mlp ref = *m;
    tb_tensor *y;
    float *out;
    mlp_upload(&ref, &g_cpu);
    y = mlp_forward(&ref);
    out = to_host(y);
    tb_tensor_release(y);
    mlp_release(&ref);
    return out;
}

static int run_child(const char *mode, const char *env, char *out, size_t cap);

static void case_mlp(int64_t batch) {
    mlp m;
    float *want, *got;
    tb_tensor *y;
    double t_tb, t_an = NAN, t_rec, t_sync, t_fin, t_exe;
    int reps, i;
    size_t n = (size_t)(batch * g_mlp_sizes[MLP_LAYERS]);
    char buf[8192];
    mlp_init_host(&m, batch);
    want = mlp_reference(&m);
    mlp_upload(&m, &g_ocl);
    y = mlp_forward(&m);
    got = to_host(y);
    check_close("mlp (opencl vs cpu reference)", got, want, n, 1e-6, 1e-4);
    free(got);
    tb_tensor_release(y);
#ifdef BENCH_OPENBLAS
    for (i = 0; i <= MLP_LAYERS; i++)
        m.act[i] = host_alloc((size_t)(batch * (i == 0 ? g_mlp_sizes[0] : g_mlp_sizes[i])));
    mlp_run_openblas(&m);
    check_close("mlp (OpenBLAS on the host vs cpu reference)", m.act[MLP_LAYERS], want, n, 1e-6,
                1e-4);
#endif
    reps = measure(mlp_run_tb, &m, NULL, NULL, &t_tb, NULL);
    /* the host split, the median of a few more steps each */
    {
        double rec[7], syn[7], fin[7], exe[7];
        int steps = g_quick ? 3 : 7;
        for (i = 0; i < steps; i++) {
            double e0 = tb_metrics_total("ExecuteTime");
            mlp_run_tb(&m);
            exe[i] = (tb_metrics_total("ExecuteTime") - e0) * 1e-9;
            rec[i] = m.t_record;
            syn[i] = m.t_sync;
            fin[i] = m.t_finish;
        }
        t_rec = median(rec, steps);
        t_sync = median(syn, steps);
        t_fin = median(fin, steps);
        t_exe = median(exe, steps);
    }
#ifdef BENCH_OPENBLAS
    {
        int reps2 = measure(mlp_run_openblas, &m, NULL, NULL, &t_an, NULL);
        add_row("mlp", t_tb, "openblas_host", t_an, "ms/step", t_tb * 1e3,
                reps < reps2 ? reps : reps2);
        usleep(200000);
    }
#else
    add_row("mlp", t_tb, "openblas(absent)", t_an, "ms/step", t_tb * 1e3, reps);
#endif
    note("mlp: batch %lld, 784-512-512-10: per step %.3f ms; medians of the parts: record %.3f ms, "
         "tb_sync %.3f ms (ExecuteTime %.3f ms of it: args + enqueue), clFinish wait %.3f ms",
         (long long)batch, t_tb * 1e3, t_rec * 1e3, t_sync * 1e3, t_exe * 1e3, t_fin * 1e3);
    /* kernel times come from a process with profiling on (debug level 2: the step waits for
       its kernels inside tb_sync and reads their profiling events); that process also gives
       the wall time of its steps, so the share compares numbers of one period */
    if (run_child("mlp-profile", "", buf, sizeof buf) == 0) {
        double kernel_s = NAN, wall_s = NAN;
        char *line = strtok(buf, "\n");
        while (line != NULL) {
            if (sscanf(line, "RESULT kernel_s=%lf", &kernel_s) == 1) {
            } else if (sscanf(line, "RESULT wall_s=%lf", &wall_s) == 1) {
            } else if (strncmp(line, "KERNEL ", 7) == 0) {
                note("mlp:   %s", line + 7);
            }
            line = strtok(NULL, "\n");
        }
        if (isfinite(kernel_s) && isfinite(wall_s)) {
            add_row("mlp_non_kernel", wall_s, "kernel_time", kernel_s, "% not kernel",
                    (wall_s - kernel_s) / wall_s * 100.0, g_quick ? 3 : 9);
        } else {
            note("mlp: the profiling child gave no kernel time");
        }
    } else {
        note("mlp: the profiling child failed; no kernel time");
    }
    mlp_release(&m);
    mlp_free_host(&m);
    free(want);
}

/* ======================================================================================
   trace: recording a 1000-node graph
   ====================================================================================== */

#define TRACE_NODES 1000

typedef struct trace_case {
    tb_tensor *x, *h;
    const tb_device *dev;
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

static void trace_run(void *p) {
    trace_case *c = (trace_case *)p;
    tb_tensor *y = trace_record(c);
    /* the release of the unsynced graph is not part of recording */
    tb_tensor_release(y);
}

static double g_trace_release, g_trace_record;

static void trace_run_timed_release(void *p) {
    trace_case *c = (trace_case *)p;
    tb_tensor *y = trace_record(c);
    double t0 = now_s();
    tb_tensor_release(y);
    g_trace_release = now_s() - t0;
}

static void trace_run_record_only(void *p) {
    trace_case *c = (trace_case *)p;
    double t0 = now_s();
    tb_tensor *y = trace_record(c);
    g_trace_record = now_s() - t0;
    tb_tensor_release(y);
}

static void case_trace(void) {
    int64_t n = 64;
    float *hx = host_random((size_t)n, 1.0f), *hh = host_alloc((size_t)n), *want, *got;
    trace_case c, cc;
    tb_tensor *y;
    double t, rec[64], rel[64], t_rec, t_rel;
    int64_t i;
    int reps, r;
    char *text;
    size_t lines = 0;
    for (i = 0; i < n; i++)
        hh[i] = 0.5f;
    c.x = upload(hx, 1, &n, &g_ocl);
    c.h = upload(hh, 1, &n, &g_ocl);
    c.dev = &g_ocl;
    cc.x = upload(hx, 1, &n, &g_cpu);
    cc.h = upload(hh, 1, &n, &g_cpu);
    cc.dev = &g_cpu;
    y = trace_record(&cc);
    want = to_host(y);
    tb_tensor_release(y);
    y = trace_record(&c);
    text = tb_ir_text(&y, 1);
    if (text == NULL) die("tb_ir_text: %s", tb_last_error());
    for (i = 0; text[i] != '\0'; i++)
        lines += text[i] == '\n';
    tb_free(text);
    /* 1000 op nodes plus the two device-data leaves */
    if (lines != TRACE_NODES + 2)
        die("trace: the graph has %zu nodes, expected %d", lines, TRACE_NODES + 2);
    got = to_host(y);
    check_close("trace graph (opencl vs cpu reference)", got, want, (size_t)n, 1e-6, 1e-5);
    free(got);
    tb_tensor_release(y);
    reps = measure(trace_run, &c, NULL, NULL, &t, NULL);
    add_row("trace", t / TRACE_NODES, "target", 1e-6, "us/node", t / TRACE_NODES * 1e6, reps);
    /* the same on the cpu device, and the release of an unsynced graph, for the notes */
    r = reps < 64 ? (reps > 5 ? reps : 5) : 64;
    for (i = 0; i < r; i++) {
        trace_run_record_only(&cc);
        rec[i] = g_trace_record;
        trace_run_timed_release(&c);
        rel[i] = g_trace_release;
    }
    t_rec = median(rec, r);
    t_rel = median(rel, r);
    note("trace: %.3f us/node on opencl:0, %.3f us/node on cpu:0; releasing the unsynced "
         "1000-node graph: %.3f us/node",
         t / TRACE_NODES * 1e6, t_rec / TRACE_NODES * 1e6, t_rel / TRACE_NODES * 1e6);
    tb_tensor_release(c.x);
    tb_tensor_release(c.h);
    tb_tensor_release(cc.x);
    tb_tensor_release(cc.h);
    free(hx);
    free(hh);
    free(want);
}

/* ======================================================================================
   replay: a cached 100-kernel graph, and the cache-hit cost of a tiny graph
   ====================================================================================== */

#define REPLAY_KERNELS 100
#define REPLAY_ROWS    8
#define REPLAY_COLS    32

typedef struct replay_case {
    tb_tensor *x, *r0;
    cl_kernel k;
    cl_mem xm, r0m, ping, pong;
    double t_call, t_wait, t_exec;
} replay_case;

/* r <- max over each row of (r + x): one small reduction kernel per step (the add is fused
   into it), and nothing else */
static tb_tensor *replay_record(tb_tensor *x, tb_tensor *r0) {
    tb_tensor *r = tb_tensor_retain(r0), *t, *u;
    int32_t axis = 1;
    int i;
    for (i = 0; i < REPLAY_KERNELS; i++) {
        t = tb_add(r, x);
        u = tb_max(t, &axis, 1, true);
        tb_tensor_release(t);
        tb_tensor_release(r);
        r = u;
    }
    return need(r, "replay graph");
}

/* Records (not timed), then syncs and waits (timed). */
static void replay_run_tb(void *p) {
    replay_case *c = (replay_case *)p;
    tb_tensor *y = replay_record(c->x, c->r0);
    double e0 = tb_metrics_total("ExecuteTime"), t0 = now_s(), t1;
    need_ok(tb_sync(&y, 1), "tb_sync (replay)");
    t1 = now_s();
    finish();
    c->t_wait = now_s() - t1;
    c->t_call = t1 - t0;
    c->t_exec = (tb_metrics_total("ExecuteTime") - e0) * 1e-9;
    tb_tensor_release(y);
}

static void replay_run_anchor(void *p) {
    replay_case *c = (replay_case *)p;
    int cols = REPLAY_COLS, i;
    for (i = 0; i < REPLAY_KERNELS; i++) {
        cl_mem src = i == 0 ? c->r0m : (i % 2 == 1 ? c->ping : c->pong);
        cl_mem dst = i % 2 == 0 ? c->ping : c->pong;
        set_arg(c->k, 0, sizeof(cl_mem), &src);
        set_arg(c->k, 1, sizeof(cl_mem), &c->xm);
        set_arg(c->k, 2, sizeof(cl_mem), &dst);
        set_arg(c->k, 3, sizeof(int), &cols);
        launch(c->k, REPLAY_ROWS, 0);
    }
    finish();
}

typedef struct hit_case {
    tb_tensor *x;
    double overhead;
} hit_case;

static void case_replay(void) {
    int64_t dims[2] = {REPLAY_ROWS, REPLAY_COLS}, rdims[2] = {REPLAY_ROWS, 1};
    size_t n = REPLAY_ROWS * REPLAY_COLS;
    float *h = host_random(n, 2.0f), h0[REPLAY_ROWS], *want, *got;
    replay_case c;
    tb_tensor *xc, *rc, *y;
    double t_an, call_s[64], wait_s[64], exec_s[64], an_s[64], sum_s[64], diff_s[64], launches0,
        launches1;
    double t_sync, t_call, t_exec, per_kernel;
    int reps, i, kernels;
    memset(&c, 0, sizeof c);
    for (i = 0; i < REPLAY_ROWS; i++)
        h0[i] = 0.0f;
    c.x = upload(h, 2, dims, &g_ocl);
    c.r0 = upload(h0, 2, rdims, &g_ocl);
    xc = upload(h, 2, dims, &g_cpu);
    rc = upload(h0, 2, rdims, &g_cpu);
    y = replay_record(xc, rc);
    want = to_host(y);
    tb_tensor_release(y);
    y = replay_record(c.x, c.r0);
    got = to_host(y);
    check_close("replay graph (opencl vs cpu reference)", got, want, REPLAY_ROWS, 0, 1e-6);
    free(got);
    tb_tensor_release(y);
    c.k = anchor_kernel("rowmax_add");
    c.xm = tensor_mem(c.x);
    c.r0m = tensor_mem(c.r0);
    c.ping = cl_buffer(REPLAY_ROWS * sizeof(float));
    c.pong = cl_buffer(REPLAY_ROWS * sizeof(float));
    replay_run_anchor(&c);
    got = cl_read(REPLAY_KERNELS % 2 == 1 ? c.ping : c.pong, REPLAY_ROWS);
    check_close("replay (hand-enqueued kernels vs cpu reference)", got, want, REPLAY_ROWS, 0, 1e-6);
    free(got);
    /* how many kernels one replay launches */
    launches0 = (double)tb_metrics_counter("OpenCL::KernelLaunch");
    replay_run_tb(&c);
    launches1 = (double)tb_metrics_counter("OpenCL::KernelLaunch");
    kernels = (int)(launches1 - launches0);
    if (kernels <= 0) kernels = REPLAY_KERNELS;
    /* our side is timed from tb_sync to the end of clFinish (recording is the trace case's
       matter); the two sides alternate */
    replay_run_anchor(&c);
    reps = 51;
    for (i = 0; i < reps; i++) {
        double t0;
        replay_run_tb(&c);
        call_s[i] = c.t_call;
        wait_s[i] = c.t_wait;
        sum_s[i] = c.t_call + c.t_wait;
        exec_s[i] = c.t_exec;
        t0 = now_s();
        replay_run_anchor(&c);
        an_s[i] = now_s() - t0;
        diff_s[i] = sum_s[i] - an_s[i];
    }
    t_sync = median(sum_s, reps);
    t_call = median(call_s, reps);
    t_exec = median(exec_s, reps);
    t_an = median(an_s, reps);
    /* the median of the paired differences: the sides ran back to back, so a slow period of
       the machine hits both */
    per_kernel = median(diff_s, reps) / kernels;
    add_row("replay", t_sync, "hand_enqueue", t_an, "us/kernel", per_kernel * 1e6, reps);
    add_row("replay_overhead", per_kernel, "target", 5e-6, "us/kernel", per_kernel * 1e6, reps);
    note("replay: %d kernels per graph (r = max(r + x, 1) on f32[%d,%d], 100 times): tb_sync + "
         "clFinish %.3f ms, hand-enqueued + clFinish %.3f ms; tb_sync returns after %.3f ms, "
         "of which ExecuteTime (args + enqueue) %.3f ms and before execute (walk, hash, cache "
         "lookup) %.3f ms; wait after tb_sync %.3f ms",
         kernels, REPLAY_ROWS, REPLAY_COLS, t_sync * 1e3, t_an * 1e3, t_call * 1e3, t_exec * 1e3,
         (t_call - t_exec) * 1e3, median(wait_s, reps) * 1e3);
    clReleaseMemObject(c.ping);
    clReleaseMemObject(c.pong);
    clReleaseKernel(c.k);
    tb_tensor_release(c.x);
    tb_tensor_release(c.r0);
    tb_tensor_release(xc);
    tb_tensor_release(rc);
    free(h);
    free(want);

    /* cache hit on the cpu backend: a tiny graph, sync time minus execute time */
    {
        int64_t hn = 16;
        float hx[16], out[16], expect[16];
        hit_case hc;
        double over[401], walls[401];
        int count = g_quick ? 101 : 401;
        for (i = 0; i < 16; i++)
            hx[i] = (float)i - 7.5f;
        hc.x = upload(hx, 1, &hn, &g_cpu);
        for (i = 0; i < count; i++) {
            tb_tensor *a = tb_mul_scalar(hc.x, 2.0), *b = tb_add_scalar(a, 1.0), *r = tb_relu(b),
                      *s = tb_sub_scalar(r, 0.5);
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
                int j;
                need_ok(tb_tensor_to_host(s, out, sizeof out), "tb_tensor_to_host");
                for (j = 0; j < 16; j++) {
                    float v = hx[j] * 2.0f + 1.0f;
                    expect[j] = (v > 0 ? v : 0) - 0.5f;
                }
                check_close("cache-hit graph (cpu)", out, expect, 16, 0, 0);
            }
            tb_tensor_release(a);
            tb_tensor_release(b);
            tb_tensor_release(r);
            tb_tensor_release(s);
        }
        /* the first sync compiled: leave it out */
        hc.overhead = median(over + 1, count - 1);
        add_row("cache_hit_cpu", hc.overhead, "target", 10e-6, "us/graph", hc.overhead * 1e6,
                count - 1);
        note("cache hit (cpu:0, 5-node graph): tb_sync %.3f us, of which outside execute %.3f us",
             median(walls + 1, count - 1) * 1e6, hc.overhead * 1e6);
        tb_tensor_release(hc.x);
    }
}

/* ======================================================================================
   coldstart: the MLP step in a new process, cold and warm
   ====================================================================================== */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void remove_tree(const char *dir) {
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void make_temp_dir(char *out, size_t cap, const char *tag) {
    const char *base = getenv("TMPDIR");
    snprintf(out, cap, "%s/tb_bench_%s_XXXXXX", base != NULL && base[0] ? base : "/tmp", tag);
    if (mkdtemp(out) == NULL) die("mkdtemp %s: %s", out, strerror(errno));
}

/* Runs this program as `--child MODE` with `env` (NAME=value words) added; its stdout goes to
   `out`. Returns its exit status (-1 when it could not start). */
static int run_child(const char *mode, const char *env, char *out, size_t cap) {
    char cmd[8192];
    FILE *p;
    size_t len = 0;
    int st;
    snprintf(cmd, sizeof cmd, "env %s '%s' --child %s%s", env, g_self, mode,
             g_quick ? " --quick" : "");
    fflush(stdout);
    p = popen(cmd, "r");
    if (p == NULL) return -1;
    while (len + 1 < cap) {
        size_t got = fread(out + len, 1, cap - 1 - len, p);
        if (got == 0) break;
        len += got;
    }
    out[len] = '\0';
    st = pclose(p);
    if (st != 0) {
        fprintf(stderr, "bench: child '%s' failed (status %d); its output:\n%s\n", mode, st, out);
    }
    return st;
}

typedef struct cold_result {
    double first_step, compile, execute;
    double disk_hits, builds;
} cold_result;

static void cold_run(const char *tb_cache, const char *pocl_cache, cold_result *r) {
    char env[4096], buf[8192];
    char *line;
    snprintf(env, sizeof env, "TB_CACHE_DIR='%s' POCL_CACHE_DIR='%s'", tb_cache, pocl_cache);
    if (run_child("coldstart", env, buf, sizeof buf) != 0) die("coldstart child failed");
    memset(r, 0, sizeof *r);
    r->first_step = NAN;
    for (line = strtok(buf, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        double v;
        if (sscanf(line, "RESULT first_step=%lf", &v) == 1) r->first_step = v;
        if (sscanf(line, "RESULT compile=%lf", &v) == 1) r->compile = v;
        if (sscanf(line, "RESULT execute=%lf", &v) == 1) r->execute = v;
        if (sscanf(line, "RESULT disk_hits=%lf", &v) == 1) r->disk_hits = v;
        if (sscanf(line, "RESULT builds=%lf", &v) == 1) r->builds = v;
    }
    if (!isfinite(r->first_step)) die("coldstart child printed no result:\n%s", buf);
}

static void case_coldstart(void) {
    int runs = g_quick ? 1 : 3, i;
    double cold_s[8], warm_s[8], both_s[8], cold_c[8], warm_c[8];
    cold_result r;
    char tbdir[1024], pocl[1024], pocl_keep[1024];
    double warm_hits = 0, warm_builds = 0;
    for (i = 0; i < runs; i++) {
        make_temp_dir(tbdir, sizeof tbdir, "tbcache");
        make_temp_dir(pocl, sizeof pocl, "pocl");
        make_temp_dir(pocl_keep, sizeof pocl_keep, "poclkeep");
        /* cold: neither cache holds anything */
        cold_run(tbdir, pocl_keep, &r);
        cold_s[i] = r.first_step;
        cold_c[i] = r.compile;
        /* warm: our disk cache filled by the cold run, a fresh PoCL cache */
        cold_run(tbdir, pocl, &r);
        warm_s[i] = r.first_step;
        warm_c[i] = r.compile;
        warm_hits += r.disk_hits;
        warm_builds += r.builds;
        /* both caches warm (what a second start of a program sees) */
        cold_run(tbdir, pocl_keep, &r);
        both_s[i] = r.first_step;
        remove_tree(tbdir);
        remove_tree(pocl);
        remove_tree(pocl_keep);
    }
    {
        double cs = median(cold_s, runs), ws = median(warm_s, runs), bs = median(both_s, runs);
        double cc = median(cold_c, runs), wc = median(warm_c, runs);
        add_row("coldstart", ws, "cold", cs, "warm/cold", ws / cs, runs);
        add_row("coldstart_compile", wc, "cold", cc, "warm/cold", wc / cc, runs);
        add_row("coldstart_both_warm", bs, "cold", cs, "warm/cold", bs / cs, runs);
        note("coldstart: first MLP step (record + compile + run + wait) in a new process: cold "
             "%.3f s (CompileTime %.3f s), warm from our disk cache with a fresh PoCL cache %.3f "
             "s (CompileTime %.3f s; disk hits %.0f, program builds %.0f over %d runs), both "
             "caches warm %.3f s; warm minus both-warm is the driver compiling kernels at their "
             "first launch",
             cs, cc, ws, wc, warm_hits, warm_builds, runs, bs);
    }
}

/* The child processes. */

static int g_print_kernels;

static void child_log(tb_log_level level, const char *message, void *user_data) {
    char name[128];
    int ord;
    double ms;
    double *sum = (double *)user_data;
    if (sscanf(message, "opencl:%d %127s %lf ms", &ord, name, &ms) == 3) {
        if (g_print_kernels) printf("KERNEL %-28s %9.3f ms\n", name, ms);
        *sum += ms;
    } else if (level <= TB_LOG_WARN) {
        fprintf(stderr, "tb: %s\n", message);
    }
}

static void open_device(void);

static int child_main(const char *mode) {
    mlp m;
    int64_t batch = 256;
    if (strcmp(mode, "coldstart") == 0) {
        float *want, *got;
        double t0, t1;
        tb_tensor *y;
        open_device();
        mlp_init_host(&m, batch);
        want = mlp_reference(&m);
        mlp_upload(&m, &g_ocl);
        finish();
        t0 = now_s();
        y = mlp_forward(&m);
        need_ok(tb_sync(&y, 1), "tb_sync (coldstart)");
        finish();
        t1 = now_s();
        got = to_host(y);
        check_close("coldstart mlp (opencl vs cpu reference)", got, want,
                    (size_t)(batch * g_mlp_sizes[MLP_LAYERS]), 1e-6, 1e-4);
        printf("RESULT first_step=%.9f\n", t1 - t0);
        printf("RESULT compile=%.9f\n", tb_metrics_total("CompileTime") * 1e-9);
        printf("RESULT execute=%.9f\n", tb_metrics_total("ExecuteTime") * 1e-9);
        printf("RESULT disk_hits=%lld\n", (long long)tb_metrics_counter("OpenCL::DiskCacheHit"));
        printf("RESULT builds=%lld\n", (long long)tb_metrics_counter("OpenCL::ProgramBuild"));
        free(got);
        free(want);
        tb_tensor_release(y);
        mlp_release(&m);
        mlp_free_host(&m);
        tb_shutdown();
        return 0;
    }
    if (strcmp(mode, "mlp-profile") == 0) {
        tb_desc desc;
        double sum = 0, walls[16], kernels[16];
        int i, steps = g_quick ? 3 : 9;
        memset(&desc, 0, sizeof desc);
        desc.debug = 2;
        desc.logger.func = child_log;
        desc.logger.user_data = &sum;
        need_ok(tb_setup(&desc), "tb_setup");
        open_device();
        mlp_init_host(&m, batch);
        mlp_upload(&m, &g_ocl);
        for (i = -1; i < steps; i++) { /* step -1 compiles */
            double t0 = now_s();
            tb_tensor *y = mlp_forward(&m);
            g_print_kernels = i == steps - 1;
            sum = 0;
            sync1(y);
            tb_tensor_release(y);
            if (i >= 0) {
                walls[i] = now_s() - t0;
                kernels[i] = sum * 1e-3;
            }
        }
        printf("RESULT kernel_s=%.9f\n", median(kernels, steps));
        printf("RESULT wall_s=%.9f\n", median(walls, steps));
        mlp_release(&m);
        mlp_free_host(&m);
        tb_shutdown();
        return 0;
    }
    fprintf(stderr, "bench: unknown child mode '%s'\n", mode);
    return 2;
}

/* ======================================================================================
   main
   ====================================================================================== */

static void open_device(void) {
    tb_opencl_native nat;
    size_t count = 0;
    if (tb_opencl_available() != TB_OK) {
        fprintf(stderr, "bench: the OpenCL backend is unavailable here: %s\n", tb_last_error());
        exit(2);
    }
    need_ok(tb_backend_devices("opencl", NULL, 0, &count), "tb_backend_devices");
    if (count == 0) {
        fprintf(stderr, "bench: no OpenCL device\n");
        exit(2);
    }
    need_ok(tb_device_make("opencl", 0, &g_ocl), "tb_device_make opencl:0");
    need_ok(tb_device_make("cpu", 0, &g_cpu), "tb_device_make cpu:0");
    need_ok(tb_opencl_native_device(&g_ocl, &nat), "tb_opencl_native_device");
    g_platform = (cl_platform_id)nat.platform;
    g_device = (cl_device_id)nat.device;
    g_context = (cl_context)nat.context;
    g_queue = (cl_command_queue)nat.queue;
}

static void print_machine(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512], cpu[256] = "unknown", pver[256] = "", pname[256] = "";
    tb_device_info info;
    if (f != NULL) {
        while (fgets(line, sizeof line, f) != NULL) {
            if (strncmp(line, "model name", 10) == 0) {
                char *c = strchr(line, ':');
                if (c != NULL) {
                    snprintf(cpu, sizeof cpu, "%s", c + 2);
                    cpu[strcspn(cpu, "\n")] = '\0';
                }
                break;
            }
        }
        fclose(f);
    }
    clGetPlatformInfo(g_platform, CL_PLATFORM_NAME, sizeof pname, pname, NULL);
    clGetPlatformInfo(g_platform, CL_PLATFORM_VERSION, sizeof pver, pver, NULL);
    memset(&info, 0, sizeof info);
    tb_backend_device_info(&g_ocl, &info);
    printf("\nmachine: %s, %ld cores online\n", cpu, sysconf(_SC_NPROCESSORS_ONLN));
    printf("opencl:0: %s (%s, driver %s, %u compute units)\n", info.name, info.language_version,
           info.driver_version, info.compute_units);
    printf("platform: %s, %s\n", pname, pver);
#ifdef BENCH_OPENBLAS
    printf("OpenBLAS: %s, %d threads\n", openblas_get_config(), openblas_get_num_threads());
#else
    printf("OpenBLAS: not installed (anchor skipped)\n");
#endif
#ifdef BENCH_CLBLAST
    printf("CLBlast: linked\n");
#else
    printf("CLBlast: not installed (anchor skipped)\n");
#endif
    printf("torch_backend.h %s\n", TB_VERSION_STRING);
}

int main(int argc, char **argv) {
    const char *json_path = NULL;
    char cache_dir[1024] = "";
    int i, own_cache = 0;
    double t_start = now_s();
    ssize_t len;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            g_quick = 1;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            g_only = argv[++i];
        } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json_path = argv[++i];
        } else if (strcmp(argv[i], "--child") == 0 && i + 1 < argc) {
            const char *mode = argv[++i];
            if (i + 1 < argc && strcmp(argv[i + 1], "--quick") == 0) g_quick = 1;
            return child_main(mode);
        } else {
            fprintf(stderr,
                    "usage: %s [--quick] [--json FILE] [--only CASE,...]\n"
                    "cases: chain8 sum max row_sums softmax layer_norm matmul mlp trace replay "
                    "coldstart\n",
                    argv[0]);
            return 2;
        }
    }
    if (g_only != NULL) {
        static const char *const names[] = {"chain8",  "sum",        "max",      "row_sums",
                                            "softmax", "layer_norm", "matmul",   "mlp",
                                            "trace",   "replay",     "coldstart"};
        const char *p = g_only;
        while (*p != '\0') {
            size_t n = strcspn(p, ","), k;
            int known = 0;
            for (k = 0; k < sizeof names / sizeof names[0]; k++)
                if (strlen(names[k]) == n && strncmp(p, names[k], n) == 0) known = 1;
            if (!known) {
                fprintf(stderr, "bench: unknown case '%.*s' in --only\n", (int)n, p);
                return 2;
            }
            p += n;
            if (*p == ',') p++;
        }
    }
    len = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (len <= 0) die("readlink /proc/self/exe: %s", strerror(errno));
    g_self[len] = '\0';
    if (getenv("TB_CACHE_DIR") == NULL) {
        make_temp_dir(cache_dir, sizeof cache_dir, "cache");
        setenv("TB_CACHE_DIR", cache_dir, 1);
        own_cache = 1;
    }
    if (json_path != NULL) {
        g_json = fopen(json_path, "w");
        if (g_json == NULL) die("cannot write %s: %s", json_path, strerror(errno));
    }
    open_device();
    build_anchors();
    printf("torch_backend.h benchmark%s on opencl:0; ratio = anchor time / our time (> 1: we are "
           "faster)\n\n",
           g_quick ? " (--quick)" : "");
    printf("  %-22s %12s  %-15s %12s  %8s  %-22s %4s\n", "case", "tb", "anchor", "anchor time",
           "ratio", "rate (tb)", "reps");
    {
        int64_t n = g_quick ? (int64_t)1 << 20 : (int64_t)1 << 24;
        int64_t side = g_quick ? 1024 : 4096;
        static const int sizes_full[] = {256, 512, 1024, 2048};
        int num_sizes = g_quick ? 1 : 4, s;
        g_case_start = now_s();
        if (selected("chain8")) case_chain8(n);
        g_case_start = now_s();
        if (selected("sum")) case_reduce("sum", 0, n, 0);
        g_case_start = now_s();
        if (selected("max")) case_reduce("max", 1, n, 0);
        g_case_start = now_s();
        if (selected("row_sums")) case_reduce("row_sums", 0, side * side, side);
        g_case_start = now_s();
        if (selected("softmax")) case_norm("softmax", 0, side, side);
        g_case_start = now_s();
        if (selected("layer_norm")) case_norm("layer_norm", 1, side, side);
        for (s = 0; s < num_sizes && selected("matmul"); s++) {
            g_case_start = now_s();
            case_matmul(sizes_full[s]);
        }
        g_case_start = now_s();
        if (selected("mlp")) case_mlp(256);
        g_case_start = now_s();
        if (selected("trace")) case_trace();
        g_case_start = now_s();
        if (selected("replay")) case_replay();
        g_case_start = now_s();
        if (selected("coldstart")) case_coldstart();
    }
    printf("\n  %-22s %12s  %-15s %12s  %8s  %-22s %4s\n", "case", "tb", "anchor", "anchor time",
           "ratio", "rate (tb)", "reps");
    for (i = 0; i < g_num_rows; i++) {
        printf("  ");
        print_row(stdout, &g_rows[i]);
    }
    printf("\nrates: chain8 8 B/element (read + write); sum/max/row_sums 4 B/element read; "
           "softmax/layer_norm 8 B/element (one read + one write, the least traffic); matmul "
           "2*N^3 flop\n");
    printf("\n%s", g_notes);
    print_machine();
    printf("total %.1f s\n", now_s() - t_start);
    clReleaseProgram(g_anchor_program);
    tb_shutdown();
    if (g_json != NULL) fclose(g_json);
    if (own_cache) remove_tree(cache_dir);
    return 0;
}
