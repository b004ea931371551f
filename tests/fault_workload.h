/* A workload that touches every public area of the library, for the fault-injection tests
   (tests/test_alloc_faults*.c, tests/test_opencl_faults.c): the registry (list, lookup, a
   backend registered from a copy of the cpu vtable, a plugin from TB_BACKEND_PATH, the current
   backend), devices, every op family (unary, cast, binary with broadcasting, host scalars,
   where and clamp, reductions and arg-reductions, matmul, softmax, log_softmax, layer_norm),
   views (reshape, permute, transpose, expand, squeeze, unsqueeze, slice, flip), concat, pad,
   gather, index_select, generators and random numbers, custom ops (one with an OpenCL
   expression, one that falls back), the dumps (tb_ir_text, tb_ir_dot, tb_ir_backend_text),
   sync, mark step, transfers between devices, sharded tensors over two devices (distribute,
   ops per shard, an all-reduce, an all-gather, the data-parallel gradient), .npy save and load,
   DLPack export and import
   (plain and versioned), printing, metrics.

   wl_run runs it on one device and stops at the first call that fails, recording what failed
   and the error. Everything it computes (tensor values, dump texts, printed text) is appended
   to a byte record, so that two runs can be compared byte for byte: a run that completes must
   give exactly the record of a clean run. It only uses the public API. Every tensor it makes
   is released before it returns, whatever happened.

   Also here, for every fault-injection test: the byte record, an allocator hook that counts
   blocks and refuses the n-th call, and the list of problems a sweep found. */
#ifndef TB_FAULT_WORKLOAD_H
#define TB_FAULT_WORKLOAD_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* rmdir */

#if defined(__GNUC__) || defined(__clang__)
#define WL_UNUSED __attribute__((unused)) /* a test may use only some of what is here */
#else
#define WL_UNUSED
#endif

/* ---- the record ---- */

typedef struct wl_record {
    unsigned char *bytes; /* malloc'd by the test, never through the library's hooks */
    size_t size, cap;
} wl_record;

static WL_UNUSED void wl_record_free(wl_record *r) {
    free(r->bytes);
    memset(r, 0, sizeof *r);
}

static WL_UNUSED void wl_append(wl_record *r, const void *data, size_t size) {
    if (r->size + size > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->size + size)
            cap *= 2;
        r->bytes = (unsigned char *)realloc(r->bytes, cap);
        if (r->bytes == NULL) {
            fprintf(stderr, "fault workload: out of test memory\n");
            abort();
        }
        r->cap = cap;
    }
    if (size > 0) memcpy(r->bytes + r->size, data, size);
    r->size += size;
}

/* A label, then `size` bytes: a difference shows where it is. */
static WL_UNUSED void wl_put(wl_record *r, const char *label, const void *data, size_t size) {
    uint64_t n = (uint64_t)size;
    wl_append(r, label, strlen(label) + 1);
    wl_append(r, &n, sizeof n);
    wl_append(r, data, size);
}

/* The label of the entry of `a` in which a and b first differ ("" when they are equal). */
static WL_UNUSED const char *wl_first_difference(const wl_record *a, const wl_record *b) {
    size_t pos = 0;
    static char where[160];
    while (pos < a->size && pos < b->size) {
        const char *label = (const char *)a->bytes + pos;
        size_t len = strlen(label) + 1;
        uint64_t n;
        if (pos + len + sizeof n > a->size || pos + len + sizeof n > b->size) break;
        memcpy(&n, a->bytes + pos + len, sizeof n);
        if (memcmp(a->bytes + pos, b->bytes + pos, len + sizeof n) != 0 ||
            pos + len + sizeof n + n > b->size ||
            memcmp(a->bytes + pos + len + sizeof n, b->bytes + pos + len + sizeof n, (size_t)n) !=
                0) {
            snprintf(where, sizeof where, "entry '%s'", label);
            return where;
        }
        pos += len + sizeof n + (size_t)n;
    }
    if (a->size != b->size) {
        snprintf(where, sizeof where, "length (%zu and %zu bytes)", a->size, b->size);
        return where;
    }
    return "";
}

/* ---- one run ---- */

/* sum((x W)^2) of one device's rows, for the sharded part of the run */
static WL_UNUSED tb_tensor *wl_shard_loss(void *user, tb_tensor *const *in, size_t index) {
    tb_tensor *m = tb_matmul(in[0], in[1]), *m2 = tb_mul(m, m), *l = tb_sum(m2, NULL, 0, false);
    (void)user, (void)index;
    tb_tensor_release(m);
    tb_tensor_release(m2);
    return l;
}

#define WL_MAX_TENSORS 256

typedef struct wl_config {
    tb_device dev;   /* where the graphs run */
    tb_device other; /* a second device for tb_to_device (any backend) */
    char dir[512];   /* a folder for the .npy files */
    bool plugin;     /* load the "plugin" backend from TB_BACKEND_PATH */
} wl_config;

typedef struct wl_run_state {
    const wl_config *cfg;
    wl_record *rec;
    tb_tensor *kept[WL_MAX_TENSORS];
    size_t num_kept;
    tb_sharded *sharded[16];
    size_t num_sharded;
    /* the first failure */
    tb_status status;
    char step[160];
    char message[1100];
} wl_run_state;

/* DLPack imports made and deleters run (a deleter may run on any thread). */
static WL_UNUSED long wl_dl_made, wl_dl_deleted;

typedef struct wl_dl_producer {
    tb_dl_managed_tensor managed;
    tb_dl_managed_tensor_versioned versioned;
    int64_t shape[2];
    float data[12];
} wl_dl_producer;

static WL_UNUSED void wl_dl_deleter(tb_dl_managed_tensor *self) {
    __atomic_add_fetch(&wl_dl_deleted, 1, __ATOMIC_RELAXED);
    free(self->manager_ctx);
}

static WL_UNUSED void wl_dl_deleter_versioned(tb_dl_managed_tensor_versioned *self) {
    __atomic_add_fetch(&wl_dl_deleted, 1, __ATOMIC_RELAXED);
    free(self->manager_ctx);
}

static WL_UNUSED wl_dl_producer *wl_dl_new(void) {
    wl_dl_producer *p = (wl_dl_producer *)calloc(1, sizeof *p);
    int i;
    if (p == NULL) abort();
    for (i = 0; i < 12; i++)
        p->data[i] = 0.5f * (float)i - 2.0f;
    p->shape[0] = 3;
    p->shape[1] = 4;
    p->managed.dl_tensor.data = p->data;
    p->managed.dl_tensor.device.device_type = TB_DL_CPU;
    p->managed.dl_tensor.ndim = 2;
    p->managed.dl_tensor.dtype.code = TB_DL_FLOAT;
    p->managed.dl_tensor.dtype.bits = 32;
    p->managed.dl_tensor.dtype.lanes = 1;
    p->managed.dl_tensor.shape = p->shape;
    p->managed.manager_ctx = p;
    p->managed.deleter = wl_dl_deleter;
    p->versioned.version.major = TB_DLPACK_MAJOR_VERSION;
    p->versioned.version.minor = TB_DLPACK_MINOR_VERSION;
    p->versioned.manager_ctx = p;
    p->versioned.deleter = wl_dl_deleter_versioned;
    p->versioned.dl_tensor = p->managed.dl_tensor;
    __atomic_add_fetch(&wl_dl_made, 1, __ATOMIC_RELAXED);
    return p;
}

static WL_UNUSED void wl_fail(wl_run_state *w, const char *step, tb_status status) {
    if (w->status != TB_OK) return;
    w->status = status != TB_OK ? status : tb_last_status();
    if (w->status == TB_OK) w->status = TB_ERR_INTERNAL; /* a failure without a status */
    snprintf(w->step, sizeof w->step, "%s", step);
    snprintf(w->message, sizeof w->message, "%s", tb_last_error());
}

static WL_UNUSED void wl_keep(wl_run_state *w, tb_tensor *t) {
    if (w->num_kept == WL_MAX_TENSORS) {
        fprintf(stderr, "fault workload: more than %d tensors\n", WL_MAX_TENSORS);
        abort();
    }
    w->kept[w->num_kept++] = t;
}

/* An operand made inside another call: kept (when not NULL) and passed on; a NULL makes the
   outer op fail with the first error. */
static WL_UNUSED tb_tensor *wl_k(wl_run_state *w, tb_tensor *t) {
    if (t != NULL) wl_keep(w, t);
    return t;
}
#define K(expr) wl_k(w, (expr))

/* T: a call that returns a tensor (kept until the end of the run); S: one that returns a status;
   P: one that returns a pointer that must not be NULL. Each jumps to `out` on failure. */
#define WL_S(expr)                                                                                 \
    do {                                                                                           \
        tb_status wl_st_ = (expr);                                                                 \
        if (wl_st_ != TB_OK) {                                                                     \
            wl_fail(w, #expr, wl_st_);                                                             \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)
#define WL_P(var, expr)                                                                            \
    do {                                                                                           \
        (var) = (expr);                                                                            \
        if ((var) == NULL) {                                                                       \
            wl_fail(w, #expr, TB_OK);                                                              \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)
#define WL_T(var, expr)                                                                            \
    do {                                                                                           \
        WL_P(var, expr);                                                                           \
        wl_keep(w, (var));                                                                         \
    } while (0)
/* A broken expectation that is not an error of the library's call: the test reports it. */
#define WL_EXPECT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            tb_set_error(TB_ERR_INTERNAL, "fault workload: expectation broken: %s", #cond);        \
            wl_fail(w, "expectation: " #cond, TB_ERR_INTERNAL);                                    \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* A call that returns a sharded tensor (kept until the end of the run). */
#define WL_SH(var, expr)                                                                           \
    do {                                                                                           \
        WL_P(var, expr);                                                                           \
        w->sharded[w->num_sharded++] = (var);                                                      \
    } while (0)

/* Appends the value of `t` (synced) under `label`. */
static WL_UNUSED bool wl_value(wl_run_state *w, const char *label, tb_tensor *t) {
    tb_shape s = tb_tensor_shape(t);
    size_t nbytes = 0;
    unsigned char *host;
    tb_status st;
    if (tb_shape_nbytes(&s, &nbytes) != TB_OK) {
        wl_fail(w, label, TB_OK);
        return false;
    }
    host = (unsigned char *)malloc(nbytes > 0 ? nbytes : 1);
    if (host == NULL) abort();
    st = tb_tensor_to_host(t, host, nbytes);
    if (st != TB_OK) {
        char step[160];
        snprintf(step, sizeof step, "tb_tensor_to_host(%s)", label);
        wl_fail(w, step, st);
        free(host);
        return false;
    }
    wl_put(w->rec, label, host, nbytes);
    free(host);
    return true;
}

#define WL_V(label, t)                                                                             \
    do {                                                                                           \
        if (!wl_value(w, (label), (t))) goto out;                                                  \
    } while (0)

/* Appends a string the library returned, then frees it. */
static WL_UNUSED void wl_text(wl_run_state *w, const char *label, char *text) {
    wl_put(w->rec, label, text, strlen(text));
    tb_free(text);
}

/* ---- custom ops ---- */

/* x0 * 2 + x1, elementwise with broadcasting (f32). */
static WL_UNUSED tb_status wl_axpy_reference(const void *const *inputs,
                                             const tb_shape *input_shapes, size_t num_inputs,
                                             void *output, const tb_shape *output_shape,
                                             const int64_t *attrs, size_t num_attrs,
                                             void *user_data) {
    int64_t numel = 1, n0 = 1, n1 = 1, i;
    int32_t d;
    (void)num_inputs;
    (void)attrs;
    (void)num_attrs;
    (void)user_data;
    for (d = 0; d < output_shape->rank; d++)
        numel *= output_shape->dims[d];
    for (d = 0; d < input_shapes[0].rank; d++)
        n0 *= input_shapes[0].dims[d];
    for (d = 0; d < input_shapes[1].rank; d++)
        n1 *= input_shapes[1].dims[d];
    for (i = 0; i < numel; i++) {
        /* the workload broadcasts only a trailing vector or a full array */
        float a = ((const float *)inputs[0])[i % n0], b = ((const float *)inputs[1])[i % n1];
        ((float *)output)[i] = a * 2.0f + b;
    }
    return TB_OK;
}

/* Sum over the last axis, keeping it (no OpenCL expression: the opencl backend falls back). */
static WL_UNUSED tb_status wl_rowsum_shape(const tb_shape *inputs, size_t num_inputs,
                                           const int64_t *attrs, size_t num_attrs, tb_shape *out,
                                           void *user_data) {
    (void)num_inputs;
    (void)attrs;
    (void)num_attrs;
    (void)user_data;
    *out = inputs[0];
    if (out->rank < 1) return tb_set_error(TB_ERR_SHAPE, "wl_rowsum: rank 0");
    out->dims[out->rank - 1] = 1;
    return TB_OK;
}

static WL_UNUSED tb_status wl_rowsum_reference(const void *const *inputs,
                                               const tb_shape *input_shapes, size_t num_inputs,
                                               void *output, const tb_shape *output_shape,
                                               const int64_t *attrs, size_t num_attrs,
                                               void *user_data) {
    int64_t rows = 1, cols, r, c;
    int32_t d;
    (void)num_inputs;
    (void)output_shape;
    (void)attrs;
    (void)num_attrs;
    (void)user_data;
    cols = input_shapes[0].dims[input_shapes[0].rank - 1];
    for (d = 0; d + 1 < input_shapes[0].rank; d++)
        rows *= input_shapes[0].dims[d];
    for (r = 0; r < rows; r++) {
        float s = 0;
        for (c = 0; c < cols; c++)
            s += ((const float *)inputs[0])[r * cols + c];
        ((float *)output)[r] = s;
    }
    return TB_OK;
}

/* Looks the op up, registering it the first time in a session. */
static WL_UNUSED tb_status wl_custom_op(const char *name, bool axpy, tb_op *out) {
    tb_custom_op_desc desc;
    if (tb_op_lookup(name, out) == TB_OK) return TB_OK;
    memset(&desc, 0, sizeof desc);
    desc.name = name;
    if (axpy) {
        desc.num_inputs = 2;
        desc.reference = wl_axpy_reference;
        desc.opencl_expr = "x0 * (T)2 + x1";
    } else {
        desc.num_inputs = 1;
        desc.infer_shape = wl_rowsum_shape;
        desc.reference = wl_rowsum_reference;
    }
    return tb_op_register(&desc, out);
}

/* ---- the workload ---- */

static WL_UNUSED void wl_fill(float *v, size_t n, float scale, float offset) {
    size_t i;
    for (i = 0; i < n; i++)
        v[i] = scale * (float)((int)((i * 7 + 3) % 11) - 5) + offset;
}

/* Runs the workload; returns TB_OK or the first failure's status (step and message in *w). */
static WL_UNUSED tb_status wl_run(const wl_config *cfg, wl_record *rec, wl_run_state *w) {
    const tb_device *dev = &cfg->dev;
    float xh[24], wh[30], yh[6], bh[5];
    int64_t gidx[12];
    int32_t sel[3] = {2, 0, 1};
    tb_shape sx, sw, sy, sb, sg, ss;
    tb_tensor *x, *wt, *y, *b, *gi, *si, *t, *u, *v, *z, *p, *q;
    tb_tensor *group[8];
    const char *names[16];
    char *text;
    size_t i, count;
    tb_device devices[8], current;
    tb_device_info info;
    tb_op axpy, rowsum;
    tb_backend *cpu;
    wl_dl_producer *prod = NULL;
    tb_dl_managed_tensor *exported = NULL;
    tb_dl_managed_tensor_versioned *exported_v = NULL;
    char npy_path[600];
    char restore_backend[TB_MAX_NAME + 1] = "";

    memset(w, 0, sizeof *w);
    w->cfg = cfg;
    w->rec = rec;
    tb_clear_error();

    /* ---- registry and devices ---- */
    WL_S(tb_manual_seed(1234));
    (void)tb_backend_list(names, 16, true); /* what it lists depends on the session so far */
    WL_P(cpu, tb_backend_lookup("cpu"));
    if (!tb_has_backend("wl_host")) {
        WL_S(tb_backend_register("wl_host", tb_backend_get_impl(cpu), "debug"));
    }
    WL_EXPECT(tb_has_backend("wl_host"));
    if (cfg->plugin) {
        tb_backend *plugin;
        WL_P(plugin, tb_backend_lookup("plugin"));
        WL_EXPECT(strcmp(tb_backend_name(plugin), "plugin") == 0);
    }
    count = tb_backend_list(names, 16, false);
    for (i = 0; i < count && i < 16; i++) {
        WL_EXPECT(strcmp(names[i], "wl_host") != 0); /* tagged debug: hidden */
    }
    snprintf(restore_backend, sizeof restore_backend, "%s", tb_get_backend());
    WL_S(tb_set_backend("wl_host"));
    WL_S(tb_current_device(&current));
    WL_EXPECT(strcmp(current.backend, "wl_host") == 0);
    WL_S(tb_set_backend(restore_backend));
    WL_S(tb_backend_devices(dev->backend, devices, 8, &count));
    WL_EXPECT(count > (size_t)dev->ordinal);
    WL_S(tb_backend_device_info(dev, &info));
    wl_put(rec, "device name", info.name, strlen(info.name));

    /* ---- inputs ---- */
    wl_fill(xh, 24, 0.375f, 0.125f);
    wl_fill(wh, 30, 0.25f, -0.0625f);
    wl_fill(yh, 6, 0.5f, 0.25f);
    wl_fill(bh, 5, 0.125f, 0.5f);
    for (i = 0; i < 12; i++)
        gidx[i] = (int64_t)((i * 5 + 1) % 6);
    sx = tb_shape_of(TB_F32, 2, 4, 6);
    sw = tb_shape_of(TB_F32, 2, 6, 5);
    sy = tb_shape_of(TB_F32, 1, 6);
    sb = tb_shape_of(TB_F32, 1, 5);
    sg = tb_shape_of(TB_I64, 2, 4, 3);
    ss = tb_shape_of(TB_I32, 1, 3);
    WL_T(x, tb_tensor_from_host(xh, &sx, dev));
    WL_T(wt, tb_tensor_from_host(wh, &sw, dev));
    WL_T(y, tb_tensor_from_host(yh, &sy, dev));
    WL_T(b, tb_tensor_from_host(bh, &sb, dev));
    WL_T(gi, tb_tensor_from_host(gidx, &sg, dev));
    WL_T(si, tb_tensor_from_host(sel, &ss, dev));

    /* ---- mark step: the live pending graphs run ---- */
    WL_T(p, tb_add_scalar(K(tb_mul(x, y)), 1.5));
    WL_T(q, tb_sub(p, y));
    WL_S(tb_mark_step());
    WL_EXPECT(tb_tensor_node(q) == NULL);
    WL_V("mark_step", q);
    (void)tb_metrics_counter("MarkStep"); /* a refused allocation may drop a sample: no check */

    /* ---- unary and cast ---- */
    {
        tb_tensor *a = x;
        tb_tensor *(*const unary[])(tb_tensor *) = {tb_neg,  tb_abs,     tb_sin,  tb_cos,  tb_tanh,
                                                    tb_relu, tb_sigmoid, tb_gelu, tb_silu, tb_floor,
                                                    tb_ceil, tb_round,   tb_sign, tb_exp};
        for (i = 0; i < sizeof unary / sizeof unary[0]; i++) {
            WL_T(t, unary[i](a));
            WL_T(a, tb_add(t, x)); /* a chain: fused on OpenCL */
        }
        WL_T(u, tb_abs(a));
        WL_T(t, tb_add(K(tb_log(K(tb_add_scalar(u, 1.0)))), K(tb_sqrt(u))));
        WL_T(v, tb_mul(K(tb_rsqrt(K(tb_add_scalar(u, 1.0)))),
                       K(tb_reciprocal(K(tb_add_scalar(u, 2.0))))));
        group[0] = a;
        group[1] = t;
        group[2] = v;
        WL_S(tb_sync(group, 3));
        WL_V("unary chain", a);
        WL_V("log sqrt", t);
        WL_V("rsqrt reciprocal", v);
        WL_T(t, tb_cast(x, TB_I32));
        WL_T(u, tb_cast(K(tb_gt(x, y)), TB_U8));
        WL_T(v, tb_logical_not(K(tb_cast(t, TB_BOOL))));
        WL_T(z, tb_cast(K(tb_cast(x, TB_F64)), TB_I64));
        WL_V("cast i32", t);
        WL_V("cast u8", u);
        WL_V("logical_not", v);
        WL_V("cast f64 i64", z);
    }

    /* ---- binary, scalars, where, clamp ---- */
    {
        tb_tensor *(*const binary[])(tb_tensor *, tb_tensor *) = {tb_add, tb_sub,     tb_mul,
                                                                  tb_div, tb_maximum, tb_minimum};
        tb_tensor *(*const compare[])(tb_tensor *, tb_tensor *) = {tb_eq, tb_ne, tb_lt,
                                                                   tb_le, tb_gt, tb_ge};
        tb_tensor *acc = x, *bits;
        for (i = 0; i < sizeof binary / sizeof binary[0]; i++) {
            WL_T(acc, binary[i](acc, y)); /* [4,6] with [6]: broadcast */
        }
        WL_T(t, tb_pow(K(tb_abs(x)), K(tb_add_scalar(K(tb_abs(y)), 0.5))));
        WL_T(u, tb_pow_scalar(K(tb_div_scalar(K(tb_sub_scalar(acc, 0.25)), 3.0)), 2.0));
        WL_T(bits, compare[0](x, y));
        for (i = 1; i < sizeof compare / sizeof compare[0]; i++) {
            WL_T(v, compare[i](x, y));
            WL_T(bits, i % 2 ? tb_logical_or(bits, v) : tb_logical_and(bits, v));
        }
        WL_T(v, tb_where(bits, x, K(tb_clamp(acc, -0.5, 0.75))));
        WL_V("binary chain", acc);
        WL_V("pow", t);
        WL_V("scalar ops", u);
        WL_V("where clamp", v);
    }

    /* ---- reductions, matmul, norms ---- */
    {
        int32_t ax1 = 1, ax0 = 0;
        WL_T(t, tb_sum(x, &ax1, 1, false));
        WL_T(u, tb_mean(x, &ax0, 1, true));
        WL_T(v, tb_max(x, NULL, 0, false));
        WL_T(z, tb_min(x, &ax1, 1, true));
        WL_T(p, tb_prod(K(tb_add_scalar(K(tb_mul_scalar(x, 0.125)), 1.0)), &ax1, 1, false));
        group[0] = t;
        group[1] = u;
        group[2] = v;
        group[3] = z;
        group[4] = p;
        WL_S(tb_sync(group, 5));
        WL_V("sum", t);
        WL_V("mean", u);
        WL_V("max", v);
        WL_V("min", z);
        WL_V("prod", p);
        WL_T(t, tb_argmax(x, 1, false));
        WL_T(u, tb_argmin(x, 0, true));
        WL_V("argmax", t);
        WL_V("argmin", u);
        WL_T(t, tb_matmul(x, wt));         /* [4,5] */
        WL_T(u, tb_relu(K(tb_add(t, b)))); /* epilogue */
        WL_T(v, tb_softmax(u, 1));
        WL_T(z, tb_log_softmax(u, 0));
        WL_T(p, tb_layer_norm(x, 1, y, y, 1e-5));
        WL_T(q, tb_matmul(y, K(tb_transpose(x, 0, 1)))); /* 1-D times 2-D */
        group[0] = v;
        group[1] = z;
        group[2] = p;
        group[3] = q;
        text = tb_ir_text(group, 4);
        if (text == NULL) {
            wl_fail(w, "tb_ir_text", TB_OK);
            goto out;
        }
        wl_text(w, "ir text", text);
        text = tb_ir_dot(group, 4);
        if (text == NULL) {
            wl_fail(w, "tb_ir_dot", TB_OK);
            goto out;
        }
        wl_text(w, "ir dot", text);
        text = tb_ir_backend_text(group, 4);
        if (text == NULL) {
            wl_fail(w, "tb_ir_backend_text", TB_OK);
            goto out;
        }
        wl_text(w, "backend text", text);
        WL_S(tb_sync(group, 4));
        WL_V("softmax", v);
        WL_V("log_softmax", z);
        WL_V("layer_norm", p);
        WL_V("vector matmul", q);
    }

    /* ---- scopes: a forward pass without a release per intermediate ---- */
    {
        tb_status st;
        WL_S(tb_scope_begin());
        t = tb_relu(tb_add(tb_matmul(x, wt), b));
        st = tb_scope_begin();
        if (st == TB_OK) {
            v = tb_scope_keep(tb_mul_scalar(t, 0.5)); /* to the outer scope */
            tb_tensor_release(tb_exp(t));             /* released inside its scope */
            st = tb_scope_end();
        }
        u = st == TB_OK ? tb_scope_keep(tb_softmax(v, 1)) : NULL; /* out of both */
        (void)tb_scope_end(); /* t and v go; u's pending graph still reads them */
        if (st != TB_OK) {
            wl_fail(w, "tb_scope_begin (nested)", st);
            goto out;
        }
        if (u == NULL) {
            wl_fail(w, "tb_scope_keep(tb_softmax(v, 1))", TB_OK);
            goto out;
        }
        wl_keep(w, u);
        WL_V("scoped softmax", u);
    }

    /* ---- views, concat, pad, gather, index_select ---- */
    {
        int64_t dims3[3] = {2, 2, 6}, edims[4] = {4, 3, 2, 2}, pads[4] = {1, 2, 0, 1};
        int32_t perm[3] = {2, 0, 1}, flip_axes[2] = {0, 2};
        tb_tensor *parts[3];
        WL_T(t, tb_reshape(x, dims3, 3));
        WL_T(u, tb_permute(t, perm, 3));                     /* [6,2,2] */
        WL_T(v, tb_flip(u, flip_axes, 2));                   /* reversed views */
        WL_T(z, tb_slice(v, 0, 1, 6, 2));                    /* [3,2,2] */
        WL_T(p, tb_expand(K(tb_unsqueeze(z, 0)), edims, 4)); /* a broadcast view */
        WL_T(q, tb_squeeze(K(tb_slice(p, 0, 0, 1, 1)), 0));
        WL_T(q, tb_add(q, z));
        WL_V("views", q);
        parts[0] = x;
        parts[1] = K(tb_mul_scalar(x, -1.0));
        parts[2] = K(tb_slice(x, 0, 1, 3, 1));
        WL_T(t, tb_concat(parts, 3, 0));    /* [10,6] */
        WL_T(u, tb_pad(x, pads, 4, -3.25)); /* [5,9] */
        WL_T(v, tb_gather(x, 1, gi));       /* [4,3] */
        WL_T(z, tb_index_select(x, 1, si)); /* [4,3] */
        WL_V("concat", t);
        WL_V("pad", u);
        WL_V("gather", v);
        WL_V("index_select", z);
    }

    /* ---- convolution, pooling, windows and their fold ---- */
    {
        int64_t xdims[4] = {1, 1, 4, 6}, flat[1] = {24}, wdims[4] = {2, 1, 3, 3};
        const int64_t pad[2] = {1, 1}, pool[2] = {2, 2}, sizes[2] = {4, 6}, k3[2] = {3, 3};
        WL_T(t, tb_reshape(x, xdims, 4));
        WL_T(u, tb_reshape(K(tb_slice(K(tb_reshape(x, flat, 1)), 0, 0, 18, 1)), wdims, 4));
        WL_T(v, tb_conv2d(t, u, NULL, NULL, pad, NULL, 1));       /* [1,2,4,6] */
        WL_T(z, tb_max_pool2d(v, pool, NULL, NULL, NULL, false)); /* [1,2,2,3] */
        WL_T(p, tb_avg_pool2d(t, k3, NULL, pad, true, false));    /* [1,1,2,2] */
        WL_T(q, tb_fold(K(tb_window(t, 2, k3, NULL, NULL)), 2, sizes, k3, NULL, NULL));
        WL_V("conv2d", v);
        WL_V("max_pool2d", z);
        WL_V("avg_pool2d", p);
        WL_V("fold of windows", q);
    }

    /* ---- generators and random numbers ---- */
    {
        tb_shape s23 = tb_shape_of(TB_F32, 2, 2, 3);
        tb_shape s5 = tb_shape_of(TB_F64, 1, 5);
        WL_T(t, tb_add(K(tb_arange(0, 6, 1, TB_F32, dev)), K(tb_full(&sy, 0.5, dev))));
        WL_T(u, tb_add(K(tb_eye(2, 3, TB_F32, dev)), K(tb_ones(&s23, dev))));
        WL_T(v, tb_sub(K(tb_zeros(&s23, dev)), K(tb_scalar_tensor(tb_scalar_f(TB_F32, 2.5), dev))));
        WL_T(z, tb_rand(&s23, dev));
        WL_T(p, tb_randn(&s5, dev));
        WL_V("arange full", t);
        WL_V("eye ones", u);
        WL_V("zeros scalar", v);
        WL_V("rand", z);
        WL_V("randn", p);
    }

    /* ---- custom ops ---- */
    {
        tb_tensor *in[2];
        WL_S(wl_custom_op("wl_axpy", true, &axpy));
        WL_S(wl_custom_op("wl_rowsum", false, &rowsum));
        in[0] = x;
        in[1] = y;
        WL_T(t, tb_call_op(axpy, in, 2, NULL, 0));
        WL_T(u, tb_mul_scalar(t, 0.5)); /* fused with the expression on OpenCL */
        in[0] = u;
        WL_T(v, tb_call_op(rowsum, in, 1, NULL, 0)); /* a fallback on OpenCL */
        WL_T(z, tb_add(v, b));                       /* [4,1] + [5] */
        WL_V("custom axpy", u);
        WL_V("custom rowsum", z);
    }

    /* ---- transfers ---- */
    {
        tb_device host;
        memset(&host, 0, sizeof host);
        snprintf(host.backend, sizeof host.backend, "wl_host");
        host.type = TB_DEVICE_CPU;
        WL_T(t, tb_exp(K(tb_mul_scalar(x, 0.5))));
        WL_T(u, tb_to_device(t, &cfg->other));
        WL_T(u, tb_to_device(K(tb_neg(u)), &host));
        WL_T(v, tb_to_device(u, dev));
    }
    WL_V("to_device", v);

    /* ---- sharded tensors over dev and the other device ---- */
    {
        tb_device two[2];
        tb_sharded *a, *r, *sum, *all, *rw, *loss, *in2[2], *grad = NULL, *total = NULL;
        int32_t ax0 = 0;
        two[0] = *dev;
        two[1] = cfg->other;
        WL_SH(a, tb_distribute(x, two, 2, TB_SHARD, 0)); /* rows 2 and 2 */
        WL_SH(r, tb_sharded_binary(tb_mul, a, a));
        WL_SH(sum, tb_sharded_sum(r, &ax0, 1, false)); /* an all-reduce */
        WL_V("sharded sum", tb_sharded_shard(sum, 1));
        WL_SH(all, tb_sharded_redistribute(a, TB_REPLICATE, 0)); /* an all-gather */
        WL_V("sharded gather", tb_sharded_shard(all, 1));
        /* the data-parallel gradient of sum((x W)^2) */
        WL_T(t, tb_mul_scalar(wt, 0.5));
        WL_SH(rw, tb_distribute(t, two, 2, TB_REPLICATE, 0));
        WL_S(tb_set_requires_grad(tb_sharded_shard(rw, 0), true));
        WL_S(tb_set_requires_grad(tb_sharded_shard(rw, 1), true));
        in2[0] = a;
        in2[1] = rw;
        WL_SH(loss, tb_sharded_map(in2, 2, wl_shard_loss, NULL, TB_PARTIAL, 0));
        WL_S(tb_sharded_grad(loss, &rw, 1, &grad, &loss, 1, &total));
        w->sharded[w->num_sharded++] = grad;
        w->sharded[w->num_sharded++] = total;
        WL_V("sharded grad", tb_sharded_shard(grad, 1));
        WL_V("sharded loss", tb_sharded_shard(total, 0));
    }

    /* ---- .npy ---- */
    snprintf(npy_path, sizeof npy_path, "%s/wl.npy", cfg->dir);
    WL_T(t, tb_sub(x, y));
    WL_S(tb_npy_save(npy_path, t));
    WL_T(u, tb_npy_load(npy_path, dev));
    WL_V("npy", u);

    /* ---- DLPack ---- */
    WL_T(t, tb_add_scalar(x, 0.75));
    WL_S(tb_dlpack_export(t, &exported));
    wl_put(rec, "dlpack export", exported->dl_tensor.data, sizeof xh);
    exported->deleter(exported);
    exported = NULL;
    WL_T(t, tb_cast(t, TB_I64));
    WL_S(tb_dlpack_export_versioned(t, &exported_v));
    wl_put(rec, "dlpack export versioned", exported_v->dl_tensor.data, 24 * sizeof(int64_t));
    exported_v->deleter(exported_v);
    exported_v = NULL;
    prod = wl_dl_new();
    WL_T(u, tb_dlpack_import(&prod->managed, dev));
    prod = NULL; /* the library owns it */
    prod = wl_dl_new();
    WL_T(v, tb_dlpack_import_versioned(&prod->versioned, dev));
    prod = NULL;
    WL_T(t, tb_mul(u, v));
    WL_V("dlpack import", t);

    /* ---- printing and metrics ---- */
    {
        char buf[2048];
        size_t needed = 0;
        WL_S(tb_tensor_format(z, buf, sizeof buf, &needed));
        WL_EXPECT(needed < sizeof buf);
        wl_put(rec, "format", buf, strlen(buf));
        WL_P(text, tb_metrics_report());
        WL_EXPECT(strstr(text, "Counter: ") != NULL);
        tb_free(text);
        WL_P(text, tb_backend_metrics_report(dev->backend));
        tb_free(text);
    }

out:
    if (prod != NULL) { /* an import failed: the caller still owns the producer */
        if (prod->managed.deleter != NULL) prod->managed.deleter(&prod->managed);
    }
    if (exported != NULL) exported->deleter(exported);
    if (exported_v != NULL) exported_v->deleter(exported_v);
    if (restore_backend[0] != '\0' && strcmp(tb_get_backend(), restore_backend) != 0)
        (void)tb_set_backend(restore_backend);
    for (i = 0; i < w->num_kept; i++)
        tb_tensor_release(w->kept[i]);
    w->num_kept = 0;
    for (i = 0; i < w->num_sharded; i++)
        tb_sharded_release(w->sharded[i]);
    w->num_sharded = 0;
    return w->status;
}

/* ---- the allocator hook ----
   Counts the calls and the live blocks, and refuses the call numbered fail_at (1 for the first
   call after wl_hook_arm; 0: none). Each block carries a header in front, so that a block given
   to the C library's free (or one freed twice) is caught by the address sanitizer. */

#define WL_HOOK_HEADER 32

static WL_UNUSED long wl_hook_calls, wl_hook_fail_at, wl_hook_refused, wl_hook_live;
/* true: every call from fail_at on is refused, not only that one ($TB_TEST_ALLOC_PERSIST=1:
   memory that stays short, so that the error paths themselves find none) */
static WL_UNUSED bool wl_hook_persist;

static WL_UNUSED void *wl_hook_alloc(size_t size, void *user_data) {
    unsigned char *p;
    long call = __atomic_add_fetch(&wl_hook_calls, 1, __ATOMIC_RELAXED);
    (void)user_data;
    long fail_at = __atomic_load_n(&wl_hook_fail_at, __ATOMIC_RELAXED);
    if (call == fail_at || (wl_hook_persist && fail_at > 0 && call > fail_at)) {
        __atomic_add_fetch(&wl_hook_refused, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    p = (unsigned char *)malloc(size + WL_HOOK_HEADER);
    if (p == NULL) return NULL;
    __atomic_add_fetch(&wl_hook_live, 1, __ATOMIC_RELAXED);
    return p + WL_HOOK_HEADER;
}

static WL_UNUSED void wl_hook_free(void *ptr, void *user_data) {
    (void)user_data;
    __atomic_sub_fetch(&wl_hook_live, 1, __ATOMIC_RELAXED);
    free((unsigned char *)ptr - WL_HOOK_HEADER);
}

static WL_UNUSED void wl_hook_arm(long fail_at) {
    __atomic_store_n(&wl_hook_fail_at, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&wl_hook_calls, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&wl_hook_refused, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&wl_hook_fail_at, fail_at, __ATOMIC_RELAXED);
}

/* Sets the library up with the hook (or, `hooked` false, with the default allocator). */
static WL_UNUSED tb_status wl_setup(bool hooked) {
    tb_desc desc;
    memset(&desc, 0, sizeof desc);
    if (hooked) {
        desc.allocator.alloc = wl_hook_alloc;
        desc.allocator.free = wl_hook_free;
    }
    desc.debug = -1;
    desc.check = -1;
    return tb_setup(&desc);
}

/* ---- the sweep ---- */

/* The records of a sweep live here, so that a failed assertion (which leaves the function)
   loses nothing: wl_records_free (in a teardown) frees them. */
static WL_UNUSED wl_record wl_clean_rec, wl_rec_a, wl_rec_b;

static WL_UNUSED void wl_records_free(void) {
    wl_record_free(&wl_clean_rec);
    wl_record_free(&wl_rec_a);
    wl_record_free(&wl_rec_b);
}

typedef struct wl_sweep_stats {
    long allocations; /* in a clean session: setup, one run, shutdown */
    long tried, errors, absorbed;
} wl_sweep_stats;

/* The folder a sweep's runs write their file to (wl_config.dir): made by wl_group_setup,
   removed with that file by wl_group_teardown, which also frees the records. */
static WL_UNUSED char wl_dir[256];

static WL_UNUSED int wl_group_setup(void **state) {
    (void)state;
    snprintf(wl_dir, sizeof wl_dir, "%s/tb_alloc_faults.XXXXXX",
             getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(wl_dir) == NULL ? -1 : 0;
}

static WL_UNUSED int wl_group_teardown(void **state) {
    char path[512];
    (void)state;
    tb_shutdown();
    wl_records_free();
    snprintf(path, sizeof path, "%s/wl.npy", wl_dir);
    remove(path);
    rmdir(wl_dir);
    return 0;
}

/* Problems found by a sweep: each is printed (the first 40), the sweep goes on with the next
   allocation, and the test fails at the end. */
static WL_UNUSED long wl_problems;

static WL_UNUSED void wl_problem(const char *fmt, ...) {
    va_list ap;
    char buf[2048];
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (wl_problems++ < 40) print_error("%s\n", buf);
}

/* Checks what a session left: no block, every imported DLPack tensor given back. Then forgets
   it, so that the next session is judged on its own. */
static WL_UNUSED void wl_check_after_shutdown(const char *when, long n) {
    long live = __atomic_load_n(&wl_hook_live, __ATOMIC_RELAXED);
    long made = __atomic_load_n(&wl_dl_made, __ATOMIC_RELAXED);
    long deleted = __atomic_load_n(&wl_dl_deleted, __ATOMIC_RELAXED);
    if (live != 0)
        wl_problem("allocation %ld refused: %ld blocks live after tb_shutdown (%s)", n, live, when);
    if (made != deleted)
        wl_problem("allocation %ld refused: %ld DLPack imports, %ld deleters run (%s)", n, made,
                   deleted, when);
    __atomic_store_n(&wl_hook_live, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&wl_dl_made, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&wl_dl_deleted, 0, __ATOMIC_RELAXED);
}

/* A clean session: the record every run must give, and how many allocations it makes. */
static WL_UNUSED void wl_clean_session(const wl_config *cfg, wl_record *clean,
                                       wl_sweep_stats *stats) {
    wl_run_state w;
    wl_record *again = &wl_rec_b;
    tb_shutdown();
    wl_record_free(again);
    wl_hook_arm(0);
    if (wl_setup(true) != TB_OK) fail_msg("tb_setup: %s", tb_last_error());
    if (wl_run(cfg, clean, &w) != TB_OK)
        fail_msg("clean run: %s failed: %s: %s", w.step, tb_status_string(w.status), w.message);
    tb_shutdown();
    stats->allocations = __atomic_load_n(&wl_hook_calls, __ATOMIC_RELAXED);
    wl_check_after_shutdown("clean run", 0);
    /* the same session twice gives the same record (else the comparison means nothing) */
    if (wl_setup(true) != TB_OK) fail_msg("tb_setup: %s", tb_last_error());
    if (wl_run(cfg, again, &w) != TB_OK)
        fail_msg("second clean run: %s failed: %s", w.step, w.message);
    if (strcmp(wl_first_difference(clean, again), "") != 0)
        fail_msg("two clean runs differ: %s", wl_first_difference(clean, again));
    wl_record_free(again);
    tb_shutdown();
    wl_check_after_shutdown("second clean run", 0);
}

/* Refuses allocation n of a session: setup, one run, then (failures stopped) a second run in
   the same session, shutdown. Returns whether allocation n happened. */
static WL_UNUSED bool wl_refuse_one(const wl_config *cfg, const wl_record *clean, long n,
                                    wl_sweep_stats *stats) {
    wl_run_state w;
    wl_record *rec = &wl_rec_a;
    tb_status st;
    bool refused;
    tb_shutdown();
    wl_record_free(rec);
    wl_hook_arm(n);
    st = wl_setup(true);
    if (st != TB_OK) {
        __atomic_store_n(&wl_hook_fail_at, 0, __ATOMIC_RELAXED);
        if (wl_hook_refused == 0)
            wl_problem("allocation %ld: tb_setup failed without a refused allocation: %s", n,
                       tb_last_error());
        if (st != TB_ERR_OUT_OF_MEMORY || tb_last_error()[0] == '\0')
            wl_problem("allocation %ld refused: tb_setup gave %s '%s', not TB_ERR_OUT_OF_MEMORY", n,
                       tb_status_string(st), tb_last_error());
        stats->tried++;
        stats->errors++;
        if (tb_is_setup()) wl_problem("allocation %ld refused: tb_setup failed but is set up", n);
        wl_check_after_shutdown("failed tb_setup", n);
        if (wl_setup(true) != TB_OK) fail_msg("tb_setup after a failed one: %s", tb_last_error());
    } else {
        st = wl_run(cfg, rec, &w);
        refused = __atomic_load_n(&wl_hook_refused, __ATOMIC_RELAXED) > 0;
        __atomic_store_n(&wl_hook_fail_at, 0, __ATOMIC_RELAXED);
        if (!refused) {
            if (st != TB_OK)
                wl_problem("no allocation refused, yet %s failed: %s: %s", w.step,
                           tb_status_string(w.status), w.message);
            tb_shutdown();
            wl_record_free(rec);
            wl_check_after_shutdown("run without a refusal", n);
            return false;
        }
        stats->tried++;
        if (st != TB_OK) {
            stats->errors++;
            if (strncmp(w.step, "expectation", 11) == 0)
                wl_problem("allocation %ld refused: %s", n, w.message);
            else if (w.status != TB_ERR_OUT_OF_MEMORY || w.message[0] == '\0')
                wl_problem("allocation %ld refused: %s gave %s '%s', not TB_ERR_OUT_OF_MEMORY", n,
                           w.step, tb_status_string(w.status), w.message);
        } else {
            const char *diff = wl_first_difference(clean, rec);
            stats->absorbed++;
            if (diff[0] != '\0')
                wl_problem("allocation %ld refused: every call succeeded but the results differ "
                           "from a clean run's: %s",
                           n, diff);
        }
        wl_record_free(rec);
    }
    /* failures have stopped: the same session runs the workload right */
    st = wl_run(cfg, rec, &w);
    if (st != TB_OK)
        wl_problem("after allocation %ld was refused, the next run failed: %s: %s: %s", n, w.step,
                   tb_status_string(w.status), w.message);
    else if (wl_first_difference(clean, rec)[0] != '\0')
        wl_problem("after allocation %ld was refused, the next run gives other results: %s", n,
                   wl_first_difference(clean, rec));
    wl_record_free(rec);
    tb_shutdown();
    wl_check_after_shutdown("after the second run", n);
    return true;
}

/* Which allocations to refuse: all ($TB_TEST_ALLOC_SWEEP=full or `full`), or `sample` of them
   ($TB_TEST_ALLOC_SWEEP=<count> overrides it): the first 16, then a spread over the rest. */
static WL_UNUSED void wl_sweep(const wl_config *cfg, bool full, long sample,
                               wl_sweep_stats *stats) {
    wl_record *clean = &wl_clean_rec;
    const char *env = getenv("TB_TEST_ALLOC_SWEEP");
    long n, j;
    wl_records_free();
    wl_problems = 0;
    wl_hook_persist = getenv("TB_TEST_ALLOC_PERSIST") != NULL &&
                      strcmp(getenv("TB_TEST_ALLOC_PERSIST"), "1") == 0;
    memset(stats, 0, sizeof *stats);
    if (env != NULL && strcmp(env, "full") == 0) {
        full = true;
    } else if (env != NULL && atol(env) > 0) {
        full = false;
        sample = atol(env);
    }
    wl_clean_session(cfg, clean, stats);
    if (full || sample >= stats->allocations) {
        /* TB_TEST_ALLOC_SHARD=i/k: only the n with n % k == i (k processes share a sweep) */
        long shard = 0, shards = 1;
        const char *sh = getenv("TB_TEST_ALLOC_SHARD");
        if (sh != NULL && sscanf(sh, "%ld/%ld", &shard, &shards) != 2) shards = 1;
        if (shards < 1 || shard < 0 || shard >= shards) fail_msg("bad TB_TEST_ALLOC_SHARD");
        for (n = 1;; n++) {
            if (n > stats->allocations + 100000) fail_msg("the sweep does not end");
            if (n % shards != shard) continue;
            if (!wl_refuse_one(cfg, clean, n, stats)) break;
        }
    } else {
        uint64_t state = 0x9E3779B97F4A7C15ull;
        for (n = 1; n <= 16 && n <= stats->allocations; n++)
            (void)wl_refuse_one(cfg, clean, n, stats);
        for (j = 16; j < sample; j++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            n = 17 + (long)((state >> 33) % (uint64_t)(stats->allocations - 16));
            (void)wl_refuse_one(cfg, clean, n, stats);
        }
    }
    /* a new session with the default allocator runs it too */
    {
        wl_run_state w;
        wl_record *rec = &wl_rec_a;
        wl_record_free(rec);
        if (wl_setup(false) != TB_OK) fail_msg("tb_setup: %s", tb_last_error());
        if (wl_run(cfg, rec, &w) != TB_OK)
            fail_msg("after the sweep: %s failed: %s", w.step, w.message);
        if (wl_first_difference(clean, rec)[0] != '\0')
            fail_msg("after the sweep, a session with the default allocator gives other "
                     "results: %s",
                     wl_first_difference(clean, rec));
        tb_shutdown();
    }
    wl_records_free();
    if (getenv("TB_TEST_VERBOSE") != NULL)
        print_message("%ld allocations per session; %ld refused: %ld errors, %ld absorbed\n",
                      stats->allocations, stats->tried, stats->errors, stats->absorbed);
    if (wl_problems > 0) {
        long problems = wl_problems;
        wl_problems = 0;
        fail_msg("%ld problems (the first 40 are above)", problems);
    }
}

#undef K
#undef WL_T
#undef WL_S
#undef WL_P
#undef WL_V
#undef WL_EXPECT

#endif /* TB_FAULT_WORKLOAD_H */
