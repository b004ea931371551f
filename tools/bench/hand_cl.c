/* The hand-written OpenCL kernels: a floor on the OpenCL device, written the way CPUs like
   (each work item takes a contiguous chunk, float16 vectors, float accumulators, several of them
   for reductions), each tuned once over a few launch shapes before it is checked and timed. */
#include "bench.h"

#include <stdlib.h>
#include <string.h>

static const char *const g_hand_src =
    "/* the eight ops of chain8, in the library's order (on a float or a float16) */\n"
    "#define CHAIN8(v) exp(-fabs(fmax((v) * 1.5f + 0.5f, 0.0f) * (v) - 0.25f))\n"
    "\n"
    "/* work item g of n takes [lo, hi): contiguous chunks, multiples of 16 elements */\n"
    "#define CHUNK(n)                                                                     \\\n"
    "    const long ng_ = get_global_size(0);                                             \\\n"
    "    const long chunk_ = ((n) + 16 * ng_ - 1) / (16 * ng_) * 16;                      \\\n"
    "    const long lo = get_global_id(0) * chunk_;                                       \\\n"
    "    const long hi = lo + chunk_ < (n) ? lo + chunk_ : (n);\n"
    "\n"
    "/* elementwise, two designs: a work item per element (PoCL vectorises across the\n"
    "   work-group), or a contiguous chunk per work item with float16 loads and stores */\n"
    "__kernel void chain8_items(__global const float *restrict x, __global float *restrict y,\n"
    "                           const long n) {\n"
    "    const long i = get_global_id(0);\n"
    "    if (i < n) y[i] = CHAIN8(x[i]);\n"
    "}\n"
    "__kernel void chain8_chunks(__global const float *restrict x, __global float *restrict y,\n"
    "                            const long n) {\n"
    "    CHUNK(n)\n"
    "    long i = lo;\n"
    "    for (; i + 16 <= hi; i += 16) {\n"
    "        const float16 v = vload16(0, x + i);\n"
    "        vstore16(CHAIN8(v), 0, y + i);\n"
    "    }\n"
    "    for (; i < hi; i++) y[i] = CHAIN8(x[i]);\n"
    "}\n"
    "__kernel void add_items(__global const float *restrict x, __global const float *restrict y,\n"
    "                        __global float *restrict z, const long n) {\n"
    "    const long i = get_global_id(0);\n"
    "    if (i < n) z[i] = x[i] + y[i];\n"
    "}\n"
    "__kernel void add_chunks(__global const float *restrict x, __global const float *restrict y,\n"
    "                         __global float *restrict z, const long n) {\n"
    "    CHUNK(n)\n"
    "    long i = lo;\n"
    "    for (; i + 16 <= hi; i += 16) vstore16(vload16(0, x + i) + vload16(0, y + i), 0, z + i);\n"
    "    for (; i < hi; i++) z[i] = x[i] + y[i];\n"
    "}\n"
    "\n"
    "/* horizontal sum and max of a float16 */\n"
    "float hsum16(float16 v) {\n"
    "    const float8 a = v.lo + v.hi;\n"
    "    const float4 b = a.lo + a.hi;\n"
    "    const float2 c = b.lo + b.hi;\n"
    "    return c.x + c.y;\n"
    "}\n"
    "float hmax16(float16 v) {\n"
    "    const float8 a = fmax(v.lo, v.hi);\n"
    "    const float4 b = fmax(a.lo, a.hi);\n"
    "    const float2 c = fmax(b.lo, b.hi);\n"
    "    return fmax(c.x, c.y);\n"
    "}\n"
    "\n"
    "/* work item g reduces x[g * len, min(n, (g + 1) * len)) with four float16 accumulators\n"
    "   into out[g]: with len = cols it gives row reductions, with a chunk length the first\n"
    "   stage of a full reduction (the second is the same kernel on one work item) */\n"
    "#define ADDF(a, b) ((a) + (b))\n"
    "#define REDUCE_KERNEL(NAME, INIT, OP, HOP)                                            \\\n"
    "    __kernel void NAME(__global const float *restrict x, __global float *restrict out, \\\n"
    "                       const long n, const long len) {                              \\\n"
    "        const long g = get_global_id(0), lo = g * len;                              \\\n"
    "        const long hi = lo + len < n ? lo + len : n;                                 \\\n"
    "        float16 a0 = (float16)(INIT), a1 = a0, a2 = a0, a3 = a0;                    \\\n"
    "        long i = lo;                                                                 \\\n"
    "        for (; i + 64 <= hi; i += 64) {                                              \\\n"
    "            a0 = OP(a0, vload16(0, x + i));                                          \\\n"
    "            a1 = OP(a1, vload16(0, x + i + 16));                                     \\\n"
    "            a2 = OP(a2, vload16(0, x + i + 32));                                     \\\n"
    "            a3 = OP(a3, vload16(0, x + i + 48));                                     \\\n"
    "        }                                                                            \\\n"
    "        for (; i + 16 <= hi; i += 16) a0 = OP(a0, vload16(0, x + i));                \\\n"
    "        float r = HOP(OP(OP(a0, a1), OP(a2, a3)));                                   \\\n"
    "        for (; i < hi; i++) r = OP(r, x[i]);                                         \\\n"
    "        if (lo < n) out[g] = r;                                                      \\\n"
    "    }\n"
    "REDUCE_KERNEL(reduce_sum, 0.0f, ADDF, hsum16)\n"
    "REDUCE_KERNEL(reduce_max, -INFINITY, fmax, hmax16)\n"
    "\n"
    "/* softmax over rows, a work item per row: max; exp written and summed; scaled (the row\n"
    "   stays in cache, so memory sees one read and one write, and exp runs once) */\n"
    "__kernel void softmax_rows(__global const float *restrict x, __global float *restrict y,\n"
    "                           const long cols) {\n"
    "    __global const float *xr = x + get_global_id(0) * cols;\n"
    "    __global float *yr = y + get_global_id(0) * cols;\n"
    "    float16 m0 = (float16)(-INFINITY), m1 = m0;\n"
    "    long i = 0;\n"
    "    for (; i + 32 <= cols; i += 32) {\n"
    "        m0 = fmax(m0, vload16(0, xr + i));\n"
    "        m1 = fmax(m1, vload16(0, xr + i + 16));\n"
    "    }\n"
    "    float m = hmax16(fmax(m0, m1));\n"
    "    for (; i < cols; i++) m = fmax(m, xr[i]);\n"
    "    float16 s0 = (float16)(0.0f), s1 = s0;\n"
    "    for (i = 0; i + 32 <= cols; i += 32) {\n"
    "        const float16 e0 = exp(vload16(0, xr + i) - m);\n"
    "        const float16 e1 = exp(vload16(0, xr + i + 16) - m);\n"
    "        vstore16(e0, 0, yr + i);\n"
    "        vstore16(e1, 0, yr + i + 16);\n"
    "        s0 += e0;\n"
    "        s1 += e1;\n"
    "    }\n"
    "    float s = hsum16(s0 + s1);\n"
    "    for (; i < cols; i++) {\n"
    "        yr[i] = exp(xr[i] - m);\n"
    "        s += yr[i];\n"
    "    }\n"
    "    const float inv = 1.0f / s;\n"
    "    for (i = 0; i + 16 <= cols; i += 16) vstore16(vload16(0, yr + i) * inv, 0, yr + i);\n"
    "    for (; i < cols; i++) yr[i] *= inv;\n"
    "}\n"
    "\n"
    "/* layer norm over rows with weight and bias, a work item per row: mean, variance (two\n"
    "   passes), write */\n"
    "__kernel void layer_norm_rows(__global const float *restrict x,\n"
    "                              __global const float *restrict w,\n"
    "                              __global const float *restrict b, __global float *restrict y,\n"
    "                              const long cols, const float eps) {\n"
    "    __global const float *xr = x + get_global_id(0) * cols;\n"
    "    __global float *yr = y + get_global_id(0) * cols;\n"
    "    float16 s0 = (float16)(0.0f), s1 = s0;\n"
    "    long i = 0;\n"
    "    for (; i + 32 <= cols; i += 32) {\n"
    "        s0 += vload16(0, xr + i);\n"
    "        s1 += vload16(0, xr + i + 16);\n"
    "    }\n"
    "    float s = hsum16(s0 + s1);\n"
    "    for (; i < cols; i++) s += xr[i];\n"
    "    const float mean = s / (float)cols;\n"
    "    s0 = (float16)(0.0f);\n"
    "    s1 = s0;\n"
    "    for (i = 0; i + 32 <= cols; i += 32) {\n"
    "        const float16 d0 = vload16(0, xr + i) - mean, d1 = vload16(0, xr + i + 16) - mean;\n"
    "        s0 += d0 * d0;\n"
    "        s1 += d1 * d1;\n"
    "    }\n"
    "    s = hsum16(s0 + s1);\n"
    "    for (; i < cols; i++) s += (xr[i] - mean) * (xr[i] - mean);\n"
    "    const float rstd = 1.0f / sqrt(s / (float)cols + eps);\n"
    "    for (i = 0; i + 16 <= cols; i += 16)\n"
    "        vstore16((vload16(0, xr + i) - mean) * rstd * vload16(0, w + i) + vload16(0, b + i), "
    "0,\n"
    "                 yr + i);\n"
    "    for (; i < cols; i++) yr[i] = (xr[i] - mean) * rstd * w[i] + b[i];\n"
    "}\n"
    "\n"
    "/* a trivial kernel for the replay case: r_out[row] = max_j (r_in[row] + x[row, j]), or\n"
    "   with flip r_in's rows reversed */\n"
    "__kernel void rowmax_add(__global const float *restrict r_in,\n"
    "                         __global const float *restrict x, __global float *restrict r_out,\n"
    "                         const int cols, const int flip) {\n"
    "    const int row = get_global_id(0);\n"
    "    const float r = r_in[flip ? (int)get_global_size(0) - 1 - row : row];\n"
    "    float m = -INFINITY;\n"
    "    for (int j = 0; j < cols; j++) m = fmax(m, r + x[row * cols + j]);\n"
    "    r_out[row] = m;\n"
    "}\n";

static cl_program g_hand_program;

void hand_build(void) {
    cl_int err = CL_SUCCESS;
    const char *src = g_hand_src;
    g_hand_program = clCreateProgramWithSource(g_context, 1, &src, NULL, &err);
    cl_need(err, "clCreateProgramWithSource (hand-written kernels)");
    err = clBuildProgram(g_hand_program, 1, &g_device, "-cl-std=CL1.2", NULL, NULL);
    if (err != CL_SUCCESS) {
        char log[16384];
        log[0] = '\0';
        clGetProgramBuildInfo(g_hand_program, g_device, CL_PROGRAM_BUILD_LOG, sizeof log, log,
                              NULL);
        die("the hand-written kernels do not build (%d):\n%s", (int)err, log);
    }
}

void hand_release_all(void) {
    if (g_hand_program != NULL) clReleaseProgram(g_hand_program);
    g_hand_program = NULL;
}

cl_kernel hand_kernel(const char *name) {
    cl_int err = CL_SUCCESS;
    cl_kernel k = clCreateKernel(g_hand_program, name, &err);
    cl_need(err, name);
    return k;
}

static void set_arg(cl_kernel k, cl_uint i, size_t size, const void *value) {
    cl_need(clSetKernelArg(k, i, size, value), "clSetKernelArg");
}

static void launch(cl_kernel k, size_t global, size_t local) {
    size_t g = local > 0 ? (global + local - 1) / local * local : global;
    cl_need(
        clEnqueueNDRangeKernel(g_queue, k, 1, NULL, &g, local > 0 ? &local : NULL, 0, NULL, NULL),
        "clEnqueueNDRangeKernel");
}

typedef enum { H_ELEMENTWISE, H_REDUCE, H_NORM } hand_kind;

struct hand {
    hand_kind kind;
    cl_kernel k[2]; /* elementwise: the two designs; reduce: stage 1 (and 2); norm: one */
    int design;     /* elementwise: 0 a work item per element, 1 contiguous chunks */
    cl_mem out, partial;
    long n, len;      /* reduce: elements, chunk (or row) length */
    size_t items;     /* work items (chunks, rows) */
    size_t local;     /* 0: the driver's choice */
    size_t max_local; /* the kernel's largest work-group */
    size_t out_n;
    char about[160];
};

/* The launch: kernels enqueued, then clFinish. */
void hand_run(void *p) {
    hand *h = (hand *)p;
    switch (h->kind) {
    case H_ELEMENTWISE:
        launch(h->k[h->design], h->design == 0 ? (size_t)h->n : h->items, h->local);
        break;
    case H_REDUCE:
        set_arg(h->k[0], 2, sizeof(long), &h->n);
        set_arg(h->k[0], 3, sizeof(long), &h->len);
        if (h->partial != NULL) {
            long n2 = (long)h->items;
            set_arg(h->k[0], 1, sizeof(cl_mem), &h->partial);
            launch(h->k[0], h->items, h->local);
            set_arg(h->k[1], 2, sizeof(long), &n2);
            set_arg(h->k[1], 3, sizeof(long), &n2);
            launch(h->k[1], 1, 1);
        } else {
            launch(h->k[0], h->items, h->local);
        }
        break;
    default:
        launch(h->k[0], h->items, h->local);
        break;
    }
    finish();
}

/* Runs each candidate once (warm-up) and times it twice (three times in a full run): the
   setting with the fastest time stays. `set` applies candidate i. */
typedef void (*apply_fn)(hand *h, int i);

static void tune(hand *h, apply_fn set, int count) {
    double best = INFINITY;
    int i, k, best_i = 0;
    for (i = 0; i < count; i++) {
        set(h, i);
        if (h->local > h->max_local) continue;
        hand_run(h);
        for (k = 0; k < (g_quick ? 2 : 3); k++) {
            double t = time_once(hand_run, h);
            if (t < best) {
                best = t;
                best_i = i;
            }
        }
    }
    set(h, best_i);
}

static hand *hand_new(hand_kind kind, size_t out_n) {
    hand *h = (hand *)calloc(1, sizeof *h);
    if (h == NULL) die("out of memory");
    h->kind = kind;
    h->out_n = out_n;
    h->out = cl_buffer(out_n * sizeof(float));
    h->max_local = 1;
    return h;
}

static void limit_local(hand *h) {
    cl_need(clGetKernelWorkGroupInfo(h->k[0], g_device, CL_KERNEL_WORK_GROUP_SIZE,
                                     sizeof h->max_local, &h->max_local, NULL),
            "clGetKernelWorkGroupInfo");
}

/* ---- elementwise: chain8 and add ---- */

static const size_t g_elem_locals[] = {0, 64, 256, 1024, 4096};
#define ELEM_LOCALS   5
#define CHUNK_FACTORS 5

static void elem_apply(hand *h, int i) {
    static const size_t factors[CHUNK_FACTORS] = {1, 4, 16, 64, 256};
    if (i < ELEM_LOCALS) {
        h->design = 0;
        h->local = g_elem_locals[i];
        h->items = 0;
    } else {
        h->design = 1;
        h->local = 1;
        h->items = (size_t)g_threads * factors[i - ELEM_LOCALS];
    }
}

hand *hand_elementwise(int add, cl_mem x, cl_mem y, int64_t n) {
    hand *h = hand_new(H_ELEMENTWISE, (size_t)n);
    int d;
    h->n = (long)n;
    h->k[0] = hand_kernel(add ? "add_items" : "chain8_items");
    h->k[1] = hand_kernel(add ? "add_chunks" : "chain8_chunks");
    for (d = 0; d < 2; d++) {
        cl_uint a = 0;
        set_arg(h->k[d], a++, sizeof(cl_mem), &x);
        if (add) set_arg(h->k[d], a++, sizeof(cl_mem), &y);
        set_arg(h->k[d], a++, sizeof(cl_mem), &h->out);
        set_arg(h->k[d], a, sizeof(long), &h->n);
    }
    limit_local(h);
    tune(h, elem_apply, ELEM_LOCALS + CHUNK_FACTORS);
    if (h->design == 0) {
        snprintf(h->about, sizeof h->about, "a work item per element, local size %zu%s", h->local,
                 h->local == 0 ? " (the driver's choice)" : "");
    } else {
        snprintf(h->about, sizeof h->about, "%zu work items on contiguous float16 chunks",
                 h->items);
    }
    return h;
}

/* ---- reductions ---- */

/* about `factor` chunks per thread, each a multiple of 16 elements, every one non-empty */
static void reduce_apply_full(hand *h, int i) {
    static const size_t factors[6] = {1, 2, 4, 16, 64, 256};
    size_t want = (size_t)g_threads * factors[i];
    h->len = (long)(((size_t)h->n + 16 * want - 1) / (16 * want) * 16);
    h->items = ((size_t)h->n + (size_t)h->len - 1) / (size_t)h->len;
    h->local = 1;
}

/* a work item per row (no row is split): local sizes that divide the rows */
static void reduce_apply_rows(hand *h, int i) {
    static const size_t locals[3] = {1, 4, 0};
    h->local = locals[i];
    if (h->local > 1 && h->items % h->local != 0) h->local = 1;
}

hand *hand_reduce(int max, cl_mem x, int64_t n, int64_t rows) {
    hand *h = hand_new(H_REDUCE, rows > 0 ? (size_t)rows : 1);
    const char *name = max ? "reduce_max" : "reduce_sum";
    h->n = (long)n;
    h->k[0] = hand_kernel(name);
    set_arg(h->k[0], 0, sizeof(cl_mem), &x);
    set_arg(h->k[0], 1, sizeof(cl_mem), &h->out);
    limit_local(h);
    if (rows > 0) {
        h->items = (size_t)rows;
        h->len = (long)(n / rows);
        tune(h, reduce_apply_rows, 3);
        snprintf(h->about, sizeof h->about, "a work item per row, local size %zu%s", h->local,
                 h->local == 0 ? " (the driver's choice)" : "");
    } else {
        h->k[1] = hand_kernel(name);
        h->partial = cl_buffer((size_t)g_threads * 256 * sizeof(float));
        set_arg(h->k[1], 0, sizeof(cl_mem), &h->partial);
        set_arg(h->k[1], 1, sizeof(cl_mem), &h->out);
        tune(h, reduce_apply_full, 6);
        snprintf(h->about, sizeof h->about,
                 "%zu work items on contiguous chunks of %ld, then one work item", h->items,
                 h->len);
    }
    return h;
}

/* ---- softmax and layer norm over rows ---- */

hand *hand_norm(int layer_norm, cl_mem x, cl_mem w, cl_mem b, int64_t rows, int64_t cols,
                float eps) {
    hand *h = hand_new(H_NORM, (size_t)(rows * cols));
    long c = (long)cols;
    cl_uint a = 0;
    h->k[0] = hand_kernel(layer_norm ? "layer_norm_rows" : "softmax_rows");
    h->items = (size_t)rows;
    set_arg(h->k[0], a++, sizeof(cl_mem), &x);
    if (layer_norm) {
        set_arg(h->k[0], a++, sizeof(cl_mem), &w);
        set_arg(h->k[0], a++, sizeof(cl_mem), &b);
    }
    set_arg(h->k[0], a++, sizeof(cl_mem), &h->out);
    set_arg(h->k[0], a++, sizeof(long), &c);
    if (layer_norm) set_arg(h->k[0], a, sizeof(float), &eps);
    limit_local(h);
    tune(h, reduce_apply_rows, 3);
    snprintf(h->about, sizeof h->about, "a work item per row, local size %zu%s", h->local,
             h->local == 0 ? " (the driver's choice)" : "");
    return h;
}

float *hand_result(hand *h, size_t *n) {
    *n = h->out_n;
    return cl_read(h->out, h->out_n);
}

cl_mem hand_out(hand *h) {
    return h->out;
}

const char *hand_label(const hand *h) {
    return h->kind == H_REDUCE && h->partial != NULL ? "hand_2stage" : "hand_kernel";
}

const char *hand_about(const hand *h) {
    return h->about;
}

void hand_free(hand *h) {
    int i;
    if (h == NULL) return;
    for (i = 0; i < 2; i++)
        if (h->k[i] != NULL) clReleaseKernel(h->k[i]);
    clReleaseMemObject(h->out);
    if (h->partial != NULL) clReleaseMemObject(h->partial);
    free(h);
}
