/* The convolution cases: tb_conv2d forward (conv2d_*) and forward plus the gradients of x and
   the weight (conv2d_*_bwd) on a ResNet-like layer and a LeNet-like one. Beside ours: PyTorch's
   F.conv2d (and its autograd), OpenBLAS on the host (im2col, then one sgemm per image: the
   bound of the forward rows) and, as the anchor, the library's own tb_matmul on an im2col made
   beforehand (the ratio shows what reading the windows in place costs). The anchor alternates
   between two copies of the im2col, as a network's im2col changes at every step: with one, the
   backends would keep its packed panels from the call before and the anchor would time the
   multiply alone, no read of its operand at all. tb_conv2d alternates between two copies of
   its input for the same reason. GFLOP/s count the
   convolution's multiply-adds (forward 2 N O P C K K; with the gradients three times that). */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct conv_shape {
    int64_t n, c, o, h, w, k, pad, oh, ow;
} conv_shape;

typedef struct conv_ctx {
    const bench_backend *be;
    conv_shape s;
    tb_tensor *x[2], *w, *r, *cols[2], *wm;
    int backward, flip, xflip;
    /* OpenBLAS */
    const float *hx, *hw;
    float *hcols, *hy;
} conv_ctx;

static tb_tensor *conv_forward(const conv_ctx *c) {
    const int64_t pad[2] = {c->s.pad, c->s.pad};
    return tb_conv2d(c->x[c->xflip], c->w, NULL, NULL, pad, NULL, 1);
}

static void conv_ours(void *p) {
    conv_ctx *c = (conv_ctx *)p;
    tb_tensor *y = need(conv_forward(c), "tb_conv2d");
    if (c->backward) {
        tb_tensor *ins[2] = {c->x[c->xflip], c->w}, *g[2] = {NULL, NULL};
        tb_tensor *yr = need(tb_mul(y, c->r), "tb_mul");
        tb_tensor *l = need(tb_sum(yr, NULL, 0, false), "tb_sum");
        need_ok(tb_grad(l, NULL, ins, 2, g), "tb_grad");
        need_ok(tb_sync(g, 2), "tb_sync");
        sync_on(g[0], c->be);
        tb_tensor_release(g[0]);
        tb_tensor_release(g[1]);
        tb_tensor_release(l);
        tb_tensor_release(yr);
    } else {
        sync_on(y, c->be);
    }
    tb_tensor_release(y);
    c->xflip ^= 1;
}

/* The anchor: [O, CKK] @ [N, CKK, P] on an im2col made beforehand. */
static void conv_own_matmul(void *p) {
    conv_ctx *c = (conv_ctx *)p;
    tb_tensor *y = need(tb_matmul(c->wm, c->cols[c->flip]), "tb_matmul");
    c->flip ^= 1;
    sync_on(y, c->be);
    tb_tensor_release(y);
}

/* im2col of image i: [C K K, OH OW], zeros where the window leaves the input. */
static void im2col(const conv_shape *s, const float *x, float *cols) {
    int64_t ch, kh, kw, oy, ox;
    for (ch = 0; ch < s->c; ch++)
        for (kh = 0; kh < s->k; kh++)
            for (kw = 0; kw < s->k; kw++) {
                float *row = cols + ((ch * s->k + kh) * s->k + kw) * s->oh * s->ow;
                for (oy = 0; oy < s->oh; oy++) {
                    int64_t iy = oy + kh - s->pad;
                    for (ox = 0; ox < s->ow; ox++) {
                        int64_t ix = ox + kw - s->pad;
                        row[oy * s->ow + ox] = iy >= 0 && iy < s->h && ix >= 0 && ix < s->w
                                                   ? x[(ch * s->h + iy) * s->w + ix]
                                                   : 0.0f;
                    }
                }
            }
}

static void conv_openblas(void *p) {
    conv_ctx *c = (conv_ctx *)p;
    const conv_shape *s = &c->s;
    int64_t i, ckk = s->c * s->k * s->k, pp = s->oh * s->ow;
    for (i = 0; i < s->n; i++) {
        im2col(s, c->hx + i * s->c * s->h * s->w, c->hcols);
        openblas_sgemm((int)s->o, (int)pp, (int)ckk, c->hw, c->hcols, 0.0f, c->hy + i * s->o * pp);
    }
}

static void conv_rows(const char *name, const conv_shape *s, int backward, side *sides, int ns,
                      const int *on, const int *anchor_i, int torch_i, int ob_i, int reps) {
    double flops = 2.0 * (double)(s->n * s->o * s->oh * s->ow) * (double)(s->c * s->k * s->k);
    int b;
    if (backward) flops *= 3.0;
    (void)ns;
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
        if (anchor_i[b] >= 0) {
            snprintf(r.anchor_name, sizeof r.anchor_name, "matmul_on_im2col");
            r.anchor = sides[anchor_i[b]].t;
        }
        snprintf(r.unit, sizeof r.unit, "GFLOP/s");
        r.value = flops / r.ours / 1e9;
        r.flops = flops;
        r.reps = reps;
        add_row(&r);
        if (anchor_i[b] >= 0) {
            note("%s (%s): tb_conv2d %.1f GFLOP/s, tb_matmul on a ready im2col %.1f GFLOP/s "
                 "(%.2f of it)",
                 name, g_backends[b].name, flops / r.ours / 1e9, flops / sides[anchor_i[b]].t / 1e9,
                 sides[anchor_i[b]].t / r.ours);
        }
    }
}

/* One case: forward (backward 0) or forward and the gradients of x and w (backward 1). */
void case_conv(const char *label, int64_t n, int64_t c, int64_t o, int64_t hw, int64_t k,
               int64_t pad, int backward) {
    conv_shape s;
    conv_ctx ctx[NUM_BACKENDS], host;
    side sides[2 * NUM_BACKENDS + 2];
    int on[NUM_BACKENDS], anchor_i[NUM_BACKENDS], ns = 0, b, torch_i = -1, ob_i = -1, reps;
    float *hx, *hwt, *hr, *hcols_all = NULL, cfg[8], *want = NULL, *got;
    torch_input in[4];
    int64_t xd[4], wd[4], yd[4], i, ckk, pp;
    char name[40], what[96];
    size_t ny;
    memset(sides, 0, sizeof sides);
    memset(&host, 0, sizeof host);
    if (g_quick) n = n >= 32 ? n / 8 : n;
    s.n = n, s.c = c, s.o = o, s.h = s.w = hw, s.k = k, s.pad = pad;
    s.oh = s.ow = hw + 2 * pad - k + 1;
    ckk = c * k * k;
    pp = s.oh * s.ow;
    ny = (size_t)(n * o * pp);
    snprintf(name, sizeof name, "conv2d_%s%s", label, backward ? "_bwd" : "");
    seed_rng(11);
    hx = host_random((size_t)(n * c * hw * hw), 1.0f);
    hwt = host_random((size_t)(o * ckk), (float)(1.0 / sqrt((double)ckk)));
    hr = host_random(ny, 1.0f);
    xd[0] = n, xd[1] = c, xd[2] = hw, xd[3] = hw;
    wd[0] = o, wd[1] = c, wd[2] = k, wd[3] = k;
    yd[0] = n, yd[1] = o, yd[2] = s.oh, yd[3] = s.ow;
    /* OpenBLAS's forward: the reference of the forward rows, and their bound */
    host.s = s;
    host.hx = hx;
    host.hw = hwt;
    host.hcols = host_alloc((size_t)(ckk * pp));
    host.hy = host_alloc(ny);
    if (have_openblas()) {
        conv_openblas(&host);
        want = host.hy;
        if (!backward) {
            ob_i = ns;
            sides[ns].name = "openblas";
            sides[ns].run = conv_openblas;
            sides[ns].ctx = &host;
            sides[ns].prime = 1;
            sides[ns++].cooldown = 0.15;
        }
    }
    hcols_all = host_alloc((size_t)(n * ckk * pp));
    for (i = 0; i < n; i++)
        im2col(&s, hx + i * c * hw * hw, hcols_all + i * ckk * pp);
    for (b = 0; b < NUM_BACKENDS; b++) {
        conv_ctx *cx = &ctx[b];
        on[b] = anchor_i[b] = -1;
        if (!g_backends[b].ok) continue;
        memset(cx, 0, sizeof *cx);
        cx->be = &g_backends[b];
        cx->s = s;
        cx->backward = backward;
        cx->x[0] = upload(hx, 4, xd, &g_backends[b].dev);
        cx->x[1] = upload(hx, 4, xd, &g_backends[b].dev);
        cx->w = upload(hwt, 4, wd, &g_backends[b].dev);
        if (backward) {
            cx->r = upload(hr, 4, yd, &g_backends[b].dev);
            need_ok(tb_set_requires_grad(cx->x[0], true), "requires grad");
            need_ok(tb_set_requires_grad(cx->x[1], true), "requires grad");
            need_ok(tb_set_requires_grad(cx->w, true), "requires grad");
        }
        if (want != NULL) {
            tb_tensor *y = need(conv_forward(cx), "tb_conv2d");
            got = to_host(y);
            snprintf(what, sizeof what, "%s (%s vs OpenBLAS)", name, g_backends[b].name);
            check_close(what, got, want, ny, 1e-4, 1e-4);
            free(got);
            tb_tensor_release(y);
        }
        on[b] = ns;
        sides[ns].name = g_backends[b].name;
        sides[ns].run = conv_ours;
        sides[ns].prime = 1;
        sides[ns++].ctx = cx;
        if (!backward) {
            int64_t cd[3] = {n, ckk, pp}, md[2] = {o, ckk};
            cx->cols[0] = upload(hcols_all, 3, cd, &g_backends[b].dev);
            cx->cols[1] = upload(hcols_all, 3, cd, &g_backends[b].dev);
            cx->wm = upload(hwt, 2, md, &g_backends[b].dev);
            anchor_i[b] = ns;
            sides[ns].name = "matmul_on_im2col";
            sides[ns].run = conv_own_matmul;
            sides[ns].prime = 1;
            sides[ns++].ctx = cx;
        }
    }
    cfg[0] = (float)n, cfg[1] = (float)c, cfg[2] = (float)hw, cfg[3] = (float)o;
    cfg[4] = (float)k, cfg[5] = (float)pad, cfg[6] = (float)backward, cfg[7] = 0;
    in[0] = (torch_input){"x", hx, 2, {n, c * hw * hw}};
    in[1] = (torch_input){"w", hwt, 2, {o, ckk}};
    in[2] = (torch_input){"cfg", cfg, 1, {8, 0}};
    in[3] = (torch_input){"r", hr, 2, {n, o * pp}};
    got = torch_setup("conv2d", in, backward ? 4 : 3, ny);
    if (got != NULL) {
        if (want != NULL) {
            snprintf(what, sizeof what, "%s (PyTorch vs OpenBLAS)", name);
            check_close(what, got, want, ny, 1e-4, 1e-4);
        }
        free(got);
        torch_i = ns;
        sides[ns].name = "pytorch";
        sides[ns].timed = torch_timed;
        sides[ns].prime = 1;
        sides[ns++].cooldown = 0.15;
    }
    if (ns > 0) {
        reps = measure(sides, ns, g_quick ? 1 : 0);
        note_faults(name, sides, ns);
        conv_rows(name, &s, backward, sides, ns, on, anchor_i, torch_i, ob_i, reps);
    }
    for (b = 0; b < NUM_BACKENDS; b++) {
        if (on[b] < 0) continue;
        tb_tensor_release(ctx[b].x[0]);
        tb_tensor_release(ctx[b].x[1]);
        tb_tensor_release(ctx[b].w);
        tb_tensor_release(ctx[b].r);
        tb_tensor_release(ctx[b].cols[0]);
        tb_tensor_release(ctx[b].cols[1]);
        tb_tensor_release(ctx[b].wm);
    }
    free(hx);
    free(hwt);
    free(hr);
    free(hcols_all);
    free(host.hcols);
    free(host.hy);
}
