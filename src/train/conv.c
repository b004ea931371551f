/* ===========================================================================================
   Convolution and pooling, recorded from tb_window, tb_pad and tb_matmul (their gradients
   come from the ops' rules; the window's is the fold in autograd.c).
   =========================================================================================== */
#include "../impl_begin.h"

/* The per-dim arguments of one call, defaults filled in. */
typedef struct tb__conv_args {
    const char *fn;
    int32_t n;                                    /* spatial dims: 1 or 2 */
    int64_t k[2], s[2], p[2], d[2], op[2], lo[2]; /* lo: input sizes */
    int64_t out[2], right[2];                     /* output sizes, right padding */
} tb__conv_args;

static bool tb__conv_fill(const char *fn, const char *what, const int64_t *v, int32_t n,
                          int64_t dflt, int64_t min, int64_t *out) {
    int32_t i;
    for (i = 0; i < n; i++) {
        out[i] = v != NULL ? v[i] : dflt;
        if (out[i] < min) {
            tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s %lld (spatial dim %d) must be >= %lld", fn,
                      what, (long long)out[i], (int)i, (long long)min);
            return false;
        }
    }
    return true;
}

/* x float, of rank n + 1 or n + 2; false with the error set otherwise. */
static bool tb__conv_input(const char *fn, const char *name, tb_tensor *x, int32_t n) {
    tb_shape s;
    char t[96];
    if (x == NULL) {
        tb__null_input(fn, name);
        return false;
    }
    s = tb_tensor_shape(x);
    tb__shape_text(&s, t);
    if (!tb_dtype_is_float(s.dtype)) {
        tb__error(TB_ERR_DTYPE, "%s: %s is %s; it must be floating point", fn, name, t);
        return false;
    }
    if (s.rank != n + 1 && s.rank != n + 2) {
        tb__error(TB_ERR_SHAPE, "%s: %s is %s; [N, C, %s] or [C, %s] is needed", fn, name, t,
                  n == 1 ? "L" : "H, W", n == 1 ? "L" : "H, W");
        return false;
    }
    return true;
}

/* The output size of sliding windows over a padded axis (PyTorch's rule, ceil_mode's last
   window starting inside the input or its left padding) and the right padding the windows
   need; false with the error set when no window fits. */
static bool tb__conv_out_size(tb__conv_args *c, int32_t i, bool ceil_mode) {
    int64_t span, room, o, need;
    if (!tb__muladd_i64(c->d[i], c->k[i] - 1, 1, &span) ||
        !tb__muladd_i64(c->p[i], 2, c->lo[i], &room)) {
        tb__error(TB_ERR_OVERFLOW,
                  "%s: kernel %lld, dilation %lld and padding %lld overflow along spatial dim %d",
                  c->fn, (long long)c->k[i], (long long)c->d[i], (long long)c->p[i], (int)i);
        return false;
    }
    if (room < span) {
        tb__error(TB_ERR_SHAPE,
                  "%s: the kernel spans %lld (size %lld, dilation %lld) but the padded input "
                  "has %lld along spatial dim %d",
                  c->fn, (long long)span, (long long)c->k[i], (long long)c->d[i], (long long)room,
                  (int)i);
        return false;
    }
    o = (room - span) / c->s[i] + 1;
    if (ceil_mode && (room - span) % c->s[i] != 0) {
        o++;
        if ((o - 1) * c->s[i] >= c->lo[i] + c->p[i]) o--;
    }
    need = (o - 1) * c->s[i] + span;
    c->out[i] = o;
    c->right[i] = need - c->lo[i] - c->p[i] > c->p[i] ? need - c->lo[i] - c->p[i] : c->p[i];
    return true;
}

/* x padded by (p, right) on each spatial axis with `value`, then its windows. */
static tb_tensor *tb__conv_windows(tb__ag *a, const tb__conv_args *c, tb_tensor *x, double value) {
    int64_t pads[4] = {0, 0, 0, 0};
    bool any = false;
    int32_t i;
    tb_tensor *t = x;
    for (i = 0; i < c->n; i++) {
        pads[2 * (c->n - 1 - i)] = c->p[i];
        pads[2 * (c->n - 1 - i) + 1] = c->right[i];
        any = any || c->p[i] > 0 || c->right[i] > 0;
    }
    if (any) t = tb__ag_keep(a, tb_pad(x, pads, 2 * (size_t)c->n, value));
    return t != NULL ? tb__ag_keep(a, tb_window(t, (size_t)c->n, c->k, c->s, c->d)) : NULL;
}

/* The arguments every form checks: the input's spatial sizes, stride, padding, dilation. */
static bool tb__conv_common(tb__conv_args *c, tb_tensor *x, const int64_t *kernel,
                            const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                            bool pool) {
    tb_shape s = tb_tensor_shape(x);
    int32_t i;
    for (i = 0; i < c->n; i++)
        c->lo[i] = s.dims[s.rank - c->n + i];
    if (kernel != NULL && !tb__conv_fill(c->fn, "kernel size", kernel, c->n, 1, 1, c->k))
        return false;
    if (!tb__conv_fill(c->fn, "stride", pool && stride == NULL ? c->k : stride, c->n, 1, 1, c->s))
        return false;
    if (!tb__conv_fill(c->fn, "padding", padding, c->n, 0, 0, c->p)) return false;
    if (!tb__conv_fill(c->fn, "dilation", dilation, c->n, 1, 1, c->d)) return false;
    for (i = 0; pool && i < c->n; i++) {
        if (c->p[i] > c->k[i] / 2) {
            tb__error(TB_ERR_INVALID_ARGUMENT,
                      "%s: padding %lld is more than half the kernel size %lld (spatial dim %d)",
                      c->fn, (long long)c->p[i], (long long)c->k[i], (int)i);
            return false;
        }
    }
    return true;
}

/* ---- convolution ---- */

/* Checks weight (and bias) against x for a convolution: weight [O, C / groups, K..] (or, for
   the transposed one, [C, O / groups, K..]); the output channels. */
static int64_t tb__conv_weight(tb__conv_args *c, tb_tensor *x, tb_tensor *weight, tb_tensor *bias,
                               int64_t groups, bool transposed) {
    tb_shape xs = tb_tensor_shape(x), ws = tb_tensor_shape(weight);
    tb_device dx = tb_tensor_device(x), dw = tb_tensor_device(weight);
    const char *other = "weight";
    int64_t ch = xs.dims[xs.rank - c->n - 1], outc;
    int32_t i;
    char a[96], b[96];
    tb__shape_text(&xs, a);
    tb__shape_text(&ws, b);
    if (tb_device_equal(&dx, &dw) && bias != NULL) {
        dw = tb_tensor_device(bias);
        other = "bias";
    }
    if (!tb_device_equal(&dx, &dw)) {
        char na[64], nb[64];
        tb_device_format(&dx, na, sizeof na);
        tb_device_format(&dw, nb, sizeof nb);
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: x is on %s but %s is on %s", c->fn, na, other, nb);
        return -1;
    }
    if (ws.dtype != xs.dtype || ws.rank != c->n + 2) {
        tb__error(ws.dtype != xs.dtype ? TB_ERR_DTYPE : TB_ERR_SHAPE,
                  "%s: weight %s does not suit x %s (a %s weight of rank %d is needed)", c->fn, b,
                  a, tb_dtype_name(xs.dtype), (int)(c->n + 2));
        return -1;
    }
    if (groups < 1 || ch % groups != 0) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: groups %lld do not divide the %lld channels of %s",
                  c->fn, (long long)groups, (long long)ch, a);
        return -1;
    }
    if (transposed ? ws.dims[0] != ch : ws.dims[1] * groups != ch || ws.dims[0] % groups != 0) {
        tb__error(TB_ERR_SHAPE, "%s: weight %s does not suit x %s with groups %lld (%s is needed)",
                  c->fn, b, a, (long long)groups,
                  transposed ? "[C, O / groups, K..]" : "[O, C / groups, K..], groups dividing O");
        return -1;
    }
    for (i = 0; i < c->n; i++)
        c->k[i] = ws.dims[2 + i];
    outc = transposed ? ws.dims[1] * groups : ws.dims[0];
    if (bias != NULL) {
        tb_shape bs = tb_tensor_shape(bias);
        if (bs.dtype != xs.dtype || bs.rank != 1 || bs.dims[0] != outc) {
            tb__shape_text(&bs, b);
            tb__error(bs.dtype != xs.dtype ? TB_ERR_DTYPE : TB_ERR_SHAPE,
                      "%s: bias %s does not suit %lld output channels of x's dtype %s", c->fn, b,
                      (long long)outc, tb_dtype_name(xs.dtype));
            return -1;
        }
    }
    return outc;
}

/* y [N, O, ..] + bias along axis 1; the batch axis dropped again for an unbatched input. */
static tb_tensor *tb__conv_finish_out(tb__ag *a, tb_tensor *y, tb_tensor *bias, bool batched) {
    if (y != NULL && bias != NULL) {
        tb_shape ys = tb_tensor_shape(y);
        int64_t dims[3] = {-1, 1, 1};
        tb_tensor *b = tb__ag_keep(a, tb_reshape(bias, dims, ys.rank - 1));
        y = b != NULL ? tb__ag_keep(a, tb_add(y, b)) : NULL;
    }
    if (y != NULL && !batched) y = tb__ag_keep(a, tb_squeeze(y, 0));
    return y;
}

/* The largest window a depthwise convolution sums where it is read (the planner's
   TB__PLAN_INLINE_REDUCE: 5 x 5) */
#define TB__CONV_DEPTHWISE_MAX 25

/* Whether a convolution's matmul takes the images' positions side by side as its columns
   (tb__conv_columns): one group, more than one image, and so few positions per image that
   a matmul per image would leave more than an eighth of its last panel of 32 columns (the
   widest CPUs' panel of B: AVX-512's two registers of f32) empty: 7 x 7 outputs fill 49 of
   64, 14 x 14 196 of 224. `oo`: the output positions per image. The Fashion-MNIST CNN's
   second convolution (14 x 14) on an Intel AVX-512 VM, an epoch of 6,400 images: 4.77-4.81 s
   per image, 4.37-4.45 s side by side. */
static bool tb__conv_columns_fit(int64_t oo, int64_t n, int64_t groups) {
    int64_t waste = (oo + 31) / 32 * 32 - oo;
    return groups == 1 && n > 1 && waste * 8 > oo;
}

/* Whether a 2-D convolution takes tb__conv_rows: stride 1, one group, a kernel of more than one
   element, a float input, nothing to differentiate (training keeps the windows whose gradients
   are folds), rows wide enough that the padding columns it also computes cost at most a sixth
   more, and an image's rows that fill the last panel of their matmul as tb__conv_columns_fit
   asks. A 3 x 3 over 14 x 14 (15 columns a row for 14: 210 of 224) takes it, as its matmul
   then reads B's rows in place where the windows' form packs them (ResNet-18's third stage on
   native, a 2-core Intel Xeon with AVX-512: about 8.5 -> 7.2 ms a convolution; on PoCL as
   fast as before); a 3 x 3 over 7 x 7 (8 for 7: 56 of 64) does not, its images side by side
   (tb__conv_columns) were 6% faster with AVX2 code on a Zen 5 VM, as fast with AVX-512 code. */
static bool tb__conv_rows_fit(const tb__conv_args *c, tb_tensor *x, tb_tensor *weight,
                              int64_t groups) {
    tb_shape xs = tb_tensor_shape(x);
    int64_t wp = c->lo[1] + c->right[1]; /* tb__conv_rows' row */
    /* in a backward rule, the gradient of an input: up to a third, where its other form is a
       matmul of K.. times the input's size written and folded back (the Fashion-MNIST CNN's
       second convolution, 5 x 5 over 14 x 14, then 18 columns a row: 24 -> 15 ms a step) */
    return c->n == 2 && c->s[0] == 1 && c->s[1] == 1 && groups == 1 && c->k[0] * c->k[1] > 1 &&
           (xs.dtype == TB_F32 || xs.dtype == TB_F64) &&
           (tb__ag_in_rule() || (!tb_requires_grad(x) && !tb_requires_grad(weight) &&
                                 !tb__conv_columns_fit(c->out[0] * wp, xs.dims[0], 1))) &&
           (wp - c->out[1]) * (tb__ag_in_rule() ? 3 : 6) <= c->out[1];
}

/* A stride-1 2-D convolution over whole padded rows: x padded by its right padding on each row
   (the zeros of a row's right also serve as the next row's left: a window's columns left of
   column 0 read them), one row more at the top and one more at the bottom, and flattened to
   [N, C, Hp * Wp], Wp = W + right; from flat element Wp - left on, window element (c, i, j) of
   output position y * Wp + x' is flat element y * Wp + x' + i * d0 * Wp + j * d1 of channel c.
   Each depth row of the matmul's B is then one contiguous run of the padded input (its packing
   a plain copy, no test of the padding at each read); the matmul computes Wp - W_out columns
   per row (1 for a 3 x 3 with padding 1, where padding both sides of each row made it 2),
   which its stores leave out (the planner's crop, tb__plan_mm_crop: no kernel of its own
   reading the output again). */
static tb_tensor *tb__conv_rows(tb__ag *a, const tb__conv_args *c, tb_tensor *x, tb_tensor *weight,
                                int64_t outc) {
    tb_shape xs = tb_tensor_shape(x);
    int64_t n = xs.dims[0], ch = xs.dims[1], wp = c->lo[1] + c->right[1];
    int64_t hp = c->p[0] + 1 + c->lo[0] + c->right[0] + 1, rows = c->out[0] * wp;
    int64_t pads[4] = {0, c->right[1], c->p[0] + 1, c->right[0] + 1};
    int64_t d0 = c->d[0] * wp, dims[4];
    const int32_t swap[4] = {0, 1, 3, 2}, order[5] = {0, 1, 4, 2, 3};
    tb_tensor *t = tb__ag_keep(a, tb_pad(x, pads, 4, 0.0)), *m;
    dims[0] = n;
    dims[1] = ch;
    dims[2] = hp * wp;
    t = t != NULL ? tb__ag_keep(a, tb_reshape(t, dims, 3)) : NULL;
    t = t != NULL ? tb__ag_keep(a, tb_slice(t, 2, wp - c->p[1], hp * wp, 1)) : NULL;
    t = t != NULL ? tb__ag_keep(a, tb_window(t, 1, &c->k[1], NULL, &c->d[1])) : NULL;
    t = t != NULL ? tb__ag_keep(a, tb_permute(t, swap, 4)) : NULL; /* [N, C, K1, L] */
    t = t != NULL ? tb__ag_keep(a, tb_window(t, 1, &c->k[0], NULL, &d0)) : NULL;
    t = t != NULL ? tb__ag_keep(a, tb_permute(t, order, 5)) : NULL; /* [N, C, K0, K1, L] */
    t = t != NULL ? tb__ag_keep(a, tb_slice(t, 4, 0, rows, 1)) : NULL;
    dims[1] = ch * c->k[0] * c->k[1];
    dims[2] = rows;
    t = t != NULL ? tb__ag_keep(a, tb_reshape(t, dims, 3)) : NULL;
    dims[0] = outc;
    m = tb__ag_keep(a, tb_reshape(weight, dims, 2));
    t = t != NULL && m != NULL ? tb__ag_keep(a, tb_matmul(m, t)) : NULL; /* [N, O, H * Wp] */
    dims[0] = n;
    dims[1] = outc;
    dims[2] = c->out[0];
    dims[3] = wp;
    t = t != NULL ? tb__ag_keep(a, tb_reshape(t, dims, 4)) : NULL;
    return t != NULL ? tb__ag_keep(a, tb_slice(t, 3, 0, c->out[1], 1)) : NULL;
}

/* The windows [N, C, O.., K..] of x as one matmul of the weight [O, C * K..] by [C * K..,
   N * O..] (the images' positions side by side), its [O, N, O..] result seen as [N, O, O..]:
   every block of the matmul full where one matmul per image would fill a fraction of its
   last. `kk` and `oo`: the window's elements and the output positions per image. */
static tb_tensor *tb__conv_columns(tb__ag *a, const tb__conv_args *c, tb_tensor *w,
                                   tb_tensor *weight, int64_t n, int64_t ch, int64_t outc,
                                   int64_t kk, int64_t oo) {
    int64_t dims[TB_MAX_RANK];
    int32_t perm[TB_MAX_RANK], i, r = 2 + 2 * c->n;
    tb_tensor *t, *m;
    /* [N, C, O.., K..] -> [C, K.., N, O..] */
    perm[0] = 1;
    for (i = 0; i < c->n; i++) {
        perm[1 + i] = 2 + c->n + i;
        perm[2 + c->n + i] = 2 + i;
    }
    perm[1 + c->n] = 0;
    t = w != NULL ? tb__ag_keep(a, tb_permute(w, perm, r)) : NULL;
    dims[0] = ch * kk;
    dims[1] = n * oo;
    t = t != NULL ? tb__ag_keep(a, tb_reshape(t, dims, 2)) : NULL;
    dims[0] = outc;
    dims[1] = ch * kk;
    m = tb__ag_keep(a, tb_reshape(weight, dims, 2));
    t = t != NULL && m != NULL ? tb__ag_keep(a, tb_matmul(m, t)) : NULL; /* [O, N * O..] */
    dims[0] = outc;
    dims[1] = n;
    for (i = 0; i < c->n; i++)
        dims[2 + i] = c->out[i];
    t = t != NULL ? tb__ag_keep(a, tb_reshape(t, dims, 2 + c->n)) : NULL;
    perm[0] = 1;
    perm[1] = 0;
    for (i = 0; i < c->n; i++)
        perm[2 + i] = 2 + i;
    return t != NULL ? tb__ag_keep(a, tb_permute(t, perm, 2 + c->n)) : NULL;
}

/* Whether a strided 2-D convolution runs as a stride-1 one over its input's phases
   (tb__conv_phases): one group, the same stride s > 1 on both axes, no dilation, a float input,
   nothing to differentiate, a kernel that whole phases (ceil(k / s) * s per axis) make at most
   a third larger (7 x 7 at stride 2: 8 x 8, 31% more; not 3 x 3, which would take 4 x 4), and
   no input past the last window's reach (the phases' padding is then never negative). */
static bool tb__conv_phases_fit(const tb__conv_args *c, tb_tensor *x, tb_tensor *weight,
                                int64_t groups) {
    tb_dtype dt = tb_tensor_shape(x).dtype;
    int64_t s = c->s[0], kp[2];
    int32_t i;
    if (c->n != 2 || groups != 1 || s < 2 || c->s[1] != s || c->d[0] != 1 || c->d[1] != 1 ||
        (dt != TB_F32 && dt != TB_F64) || tb_requires_grad(x) || tb_requires_grad(weight))
        return false;
    for (i = 0; i < 2; i++) {
        kp[i] = (c->k[i] + s - 1) / s;
        if (s * (c->out[i] + kp[i] - 1) < c->p[i] + c->lo[i]) return false;
    }
    return s * kp[0] * s * kp[1] * 3 <= c->k[0] * c->k[1] * 4;
}

/* t [A, B, s * h0, s * w0] after `pads` (tb_pad's order) as its s x s phases [A, B * s * s, h0,
   w0]: element (b, i, j, y, x) is the padded t's (b, s * y + i, s * x + j). */
static tb_tensor *tb__conv_phase_view(tb__ag *a, tb_tensor *t, const int64_t pads[4], int64_t s,
                                      const int64_t h[2]) {
    const int32_t perm[6] = {0, 1, 3, 5, 2, 4};
    tb_shape ts = tb_tensor_shape(t);
    int64_t dims[6];
    dims[0] = ts.dims[0];
    dims[1] = ts.dims[1];
    dims[2] = h[0];
    dims[3] = s;
    dims[4] = h[1];
    dims[5] = s;
    t = tb__ag_keep(a, tb_pad(t, pads, 4, 0.0));
    t = t != NULL ? tb__ag_keep(a, tb_reshape(t, dims, 6)) : NULL;
    t = t != NULL ? tb__ag_keep(a, tb_permute(t, perm, 6)) : NULL; /* [A, B, s, s, h0, w0] */
    dims[1] *= s * s;
    dims[2] = h[0];
    dims[3] = h[1];
    return t != NULL ? tb__ag_keep(a, tb_reshape(t, dims, 4)) : NULL;
}

/* A stride-s convolution as a stride-1 one over the input's s x s phases: x padded to whole
   phases and seen as [N, C * s * s, H / s, W / s] (element (c, i, j, h, w) is x's (c, s * h + i,
   s * w + j)), the weight padded with zeros to whole phases and seen alike as [O, C * s * s,
   ceil(KH / s), ceil(KW / s)]. A window's rows are then runs of the phases, packed as plain
   copies (or read in place by tb__conv_rows), where the strided windows gathered every s-th
   element. ResNet's first convolution (7 x 7 at stride 2 over 3 channels, 8 images of 224 x
   224) on an Intel AVX-512 VM's native backend: 15.0 ms, then 10.0 (the phases 0.7, the matmul
   7.3, the padding columns cut away after it 2.0). Sets *cp to the stride-1 convolution's
   arguments and *weight to its weight; returns the phases, or NULL. */
static tb_tensor *tb__conv_phases(tb__ag *a, const tb__conv_args *c, tb_tensor *x,
                                  tb_tensor **weight, tb__conv_args *cp) {
    int64_t s = c->s[0], kp[2], hs[2], xpads[4], wpads[4];
    int32_t i;
    *cp = *c;
    for (i = 0; i < 2; i++) {
        kp[i] = (c->k[i] + s - 1) / s; /* the kernel per phase */
        hs[i] = c->out[i] + kp[i] - 1; /* the input per phase */
        cp->k[i] = kp[i];
        cp->s[i] = 1;
        cp->p[i] = 0;
        cp->right[i] = 0;
        cp->lo[i] = hs[i];
        /* pads run from the last dim backwards */
        xpads[2 * (1 - i)] = c->p[i];
        xpads[2 * (1 - i) + 1] = s * hs[i] - c->p[i] - c->lo[i];
        wpads[2 * (1 - i)] = 0;
        wpads[2 * (1 - i) + 1] = s * kp[i] - c->k[i];
    }
    *weight = tb__conv_phase_view(a, *weight, wpads, s, kp);
    return *weight != NULL ? tb__conv_phase_view(a, x, xpads, s, hs) : NULL;
}

/* x [N, C, L..] as windows [N, G, C / G * K.., O..] multiplied by the weight [G, O / G, C / G *
   K..] (broadcast over the batch): one matmul per image and group, whose [N, G, O / G, O..]
   result is already the output's layout [N, O, O..] (nothing to transpose after it). */
static tb_tensor *tb__conv_forward(tb__ag *a, const tb__conv_args *c, tb_tensor *x,
                                   tb_tensor *weight, int64_t groups, int64_t outc) {
    tb__conv_args phased;
    tb_shape xs;
    int64_t n, ch, kk = 1, oo = 1, dims[TB_MAX_RANK];
    int32_t perm[TB_MAX_RANK], i, r;
    tb_tensor *w, *t, *m;
    if (tb__conv_phases_fit(c, x, weight, groups)) {
        x = tb__conv_phases(a, c, x, &weight, &phased);
        if (x == NULL) return NULL;
        c = &phased;
    }
    xs = tb_tensor_shape(x);
    n = xs.dims[0];
    ch = xs.dims[1];
    if (tb__conv_rows_fit(c, x, weight, groups)) return tb__conv_rows(a, c, x, weight, outc);
    w = tb__conv_windows(a, c, x, 0.0);
    for (i = 0; i < c->n; i++) {
        kk *= c->k[i];
        oo *= c->out[i];
    }
    if (groups == ch && outc == ch && kk <= TB__CONV_DEPTHWISE_MAX &&
        (xs.dtype == TB_F32 || xs.dtype == TB_F64)) {
        /* depthwise: each channel's windows times its kernel, summed over the window (a few
           elements per output: computed where it is read, fused with what comes before and
           after) rather than a matmul of one row per channel */
        int32_t axes[2];
        dims[0] = 1;
        dims[1] = ch;
        for (i = 0; i < c->n; i++) {
            dims[2 + i] = 1;
            dims[2 + c->n + i] = c->k[i];
            axes[i] = 2 + c->n + i;
        }
        m = tb__ag_keep(a, tb_reshape(weight, dims, 2 + 2 * c->n));
        t = w != NULL && m != NULL ? tb__ag_keep(a, tb_mul(w, m)) : NULL;
        return t != NULL ? tb__ag_keep(a, tb_sum(t, axes, (size_t)c->n, false)) : NULL;
    }
    if (tb__conv_columns_fit(oo, n, groups))
        return tb__conv_columns(a, c, w, weight, n, ch, outc, kk, oo);
    /* [N, C, O.., K..] -> [N, G, C/G, O.., K..] -> [N, G, C/G, K.., O..] */
    dims[0] = n;
    dims[1] = groups;
    dims[2] = ch / groups;
    for (i = 0; i < 2 * c->n; i++)
        dims[3 + i] = i < c->n ? c->out[i] : c->k[i - c->n];
    r = 3 + 2 * c->n;
    t = w != NULL ? tb__ag_keep(a, tb_reshape(w, dims, r)) : NULL;
    for (i = 0; i < 3; i++)
        perm[i] = i;
    for (i = 0; i < c->n; i++) {
        perm[3 + i] = 3 + c->n + i;
        perm[3 + c->n + i] = 3 + i;
    }
    t = t != NULL ? tb__ag_keep(a, tb_permute(t, perm, r)) : NULL;
    dims[0] = n;
    dims[1] = groups;
    dims[2] = ch / groups * kk;
    dims[3] = oo;
    t = t != NULL ? tb__ag_keep(a, tb_reshape(t, dims, 4)) : NULL;
    dims[0] = groups;
    dims[1] = outc / groups;
    dims[2] = ch / groups * kk;
    m = tb__ag_keep(a, tb_reshape(weight, dims, 3));
    t = t != NULL && m != NULL ? tb__ag_keep(a, tb_matmul(m, t)) : NULL;
    /* [N, G, O/G, O..O] -> [N, O, O..] */
    dims[0] = n;
    dims[1] = outc;
    for (i = 0; i < c->n; i++)
        dims[2 + i] = c->out[i];
    return t != NULL ? tb__ag_keep(a, tb_reshape(t, dims, 2 + c->n)) : NULL;
}

/* The checks both convolutions make (x, weight, bias, stride, padding, dilation, groups);
   the output channels, or -1 with the error set. */
static int64_t tb__conv_check(tb__conv_args *c, const char *fn, int32_t n, tb_tensor *x,
                              tb_tensor *weight, tb_tensor *bias, const int64_t *stride,
                              const int64_t *padding, const int64_t *dilation, int64_t groups,
                              bool transposed) {
    tb__ensure_setup();
    memset(c, 0, sizeof *c);
    c->fn = fn;
    c->n = n;
    if (!tb__conv_input(fn, "x", x, n)) return -1;
    if (weight == NULL) {
        tb__null_input(fn, "weight");
        return -1;
    }
    if (!tb__conv_common(c, x, NULL, stride, padding, dilation, false)) return -1;
    return tb__conv_weight(c, x, weight, bias, groups, transposed);
}

typedef tb_tensor *(*tb__conv_body)(tb__ag *a, const tb__conv_args *c, tb_tensor *x,
                                    tb_tensor *weight, int64_t groups, int64_t outc);

/* Records a checked convolution: an unbatched x gets its batch axis for the body and loses it
   again after the bias. */
static tb_tensor *tb__conv_record(const tb__conv_args *c, tb__conv_body body, tb_tensor *x,
                                  tb_tensor *weight, tb_tensor *bias, int64_t groups,
                                  int64_t outc) {
    tb__ag a;
    tb_tensor *y;
    bool batched = tb_tensor_shape(x).rank == c->n + 2;
    tb__ag_init(&a, c->fn);
    a.device = tb_tensor_device(x);
    if (!batched) x = tb__ag_keep(&a, tb_unsqueeze(x, 0));
    y = x != NULL ? body(&a, c, x, weight, groups, outc) : NULL;
    return tb__nn_finish(&a, tb__conv_finish_out(&a, y, bias, batched));
}

/* Whether B of a matmul is the windows of a stride-1 convolution of one group as tb_conv2d and
   tb_conv1d record them: x, padded alike on both sides or not, its windows [N, C, O.., K..],
   then either a matmul per image (reshaped to [N, 1, C, O.., K..], permuted to [N, 1, C, K..,
   O..] and reshaped to [N, 1, C * K.., O..]; the weight [1, O, C * K..] expanded over the
   batch) or one of the images side by side (permuted to [C, K.., N, O..] and reshaped to [C *
   K.., N * O..]; the weight [O, C * K..]). Sets x's node, the weight's (A's before its
   expand), the windows' node, whether the images are side by side, padding and dilation. */
static bool tb__conv_windows_of(const tb_node *mm, tb_node **x, tb_node **w, const tb_node **window,
                                bool *columns, int64_t pad[2], int64_t dil[2]) {
    const tb_node *b = mm->operands[1], *pm = b->operands[0], *win, *in;
    int32_t n, i, j, r;
    int64_t kk = 1, oo = 1, want;
    if (b->op != TB_OP_RESHAPE || pm->op != TB_OP_PERMUTE) return false;
    *columns = b->shape.rank == 2;
    if (!*columns && (b->shape.rank != 4 || b->shape.dims[1] != 1 ||
                      pm->operands[0]->op != TB_OP_RESHAPE || pm->shape.dims[1] != 1))
        return false;
    win = *columns ? pm->operands[0] : pm->operands[0]->operands[0];
    if (win->op != TB_OP_WINDOW || win->num_attrs < 1) return false;
    n = (int32_t)win->attrs[0];
    in = win->operands[0];
    r = pm->shape.rank;
    if (n < 1 || n > 2 || win->num_attrs != 1 + 4 * (size_t)n || in->shape.rank != 2 + n ||
        r != (*columns ? 2 : 3) + 2 * n)
        return false;
    for (j = 0; j < r; j++) {
        if (*columns) { /* [1, 2 + n.., 0, 2..] */
            want = j == 0 ? 1 : (j <= n ? 1 + n + j : (j == 1 + n ? 0 : j - n));
        } else { /* [0, 1, 2, 3 + n.., 3..] */
            want = j < 3 ? j : (j < 3 + n ? j + n : j - n);
        }
        if (pm->attrs[j] != want) return false;
    }
    for (i = 0; i < n; i++) {
        if (win->attrs[3 + 4 * i] != 1) return false; /* stride */
        oo *= win->attrs[1 + 4 * i];
        kk *= win->attrs[2 + 4 * i];
        dil[i] = win->attrs[4 + 4 * i];
        pad[i] = 0;
    }
    if (*columns ? b->shape.dims[0] != in->shape.dims[1] * kk ||
                       b->shape.dims[1] != in->shape.dims[0] * oo
                 : b->shape.dims[2] != in->shape.dims[1] * kk || b->shape.dims[3] != oo)
        return false;
    if (in->op == TB_OP_PAD) {
        for (i = 0; i < 4; i++)
            if (in->attrs[i] != 0) return false; /* the batch and channel axes */
        for (i = 0; i < n; i++) {
            pad[i] = in->attrs[2 * (2 + i)];
            if (in->attrs[2 * (2 + i) + 1] != pad[i] ||
                pad[i] > dil[i] * (win->attrs[2 + 4 * i] - 1))
                return false;
        }
        in = in->operands[0];
    }
    *x = (tb_node *)in;
    *window = win;
    *w = mm->operands[0]->op == TB_OP_EXPAND ? mm->operands[0]->operands[0] : mm->operands[0];
    r = (*w)->shape.rank;
    for (i = 0; i < r - 2; i++)
        if ((*w)->shape.dims[i] != 1) return false;
    return r >= 2 && (*w)->shape.dims[r - 1] == in->shape.dims[1] * kk &&
           (*w)->shape.dims[r - 2] == mm->shape.dims[*columns ? 0 : 2];
}

/* g of a convolution's matmul of the images side by side, [O, N * O..], where it is the
   gradient of the convolution's output [N, O, O..] seen through the permute and reshape the
   convolution recorded (`dims`: [O, N, O..]): that gradient itself (no view of a view for the
   kernels to index through). NULL otherwise. */
static tb_tensor *tb__conv_columns_grad(tb__ag *a, tb_tensor *g, const int64_t *dims, int32_t r) {
    const tb_node *gn = tb__tensor_ir(g), *pm, *y;
    int32_t i;
    if (gn == NULL || gn->op != TB_OP_RESHAPE || gn->operands[0]->op != TB_OP_PERMUTE) return NULL;
    pm = gn->operands[0];
    y = pm->operands[0];
    if (pm->shape.rank != r || y->shape.rank != r || pm->attrs[0] != 1 || pm->attrs[1] != 0)
        return NULL;
    for (i = 0; i < r; i++)
        if (pm->shape.dims[i] != dims[i] || (i >= 2 && pm->attrs[i] != i)) return NULL;
    return tb__ag_node(a, (tb_node *)y);
}

/* The gradient of a stride-1 convolution's input (tb__conv_windows_of), given past the
   windows to x: a convolution of g by the weight transposed and flipped, padded by dilation *
   (k - 1) - padding (recorded inside the rule, so over whole rows where they add at most a
   third: tb__conv_rows_fit), rather than A^T g (K.. times x's size, written and read again)
   folded back onto x. NULL where the matmul is not that shape. The matmul's backward finds it
   through tb__ag_set_conv_grad, set whenever a convolution is recorded. */
static tb_tensor *tb__conv_input_grad(tb__ag *a, const tb_node *mm, tb_tensor *gv, tb_node **x) {
    const tb_node *win;
    tb_node *w;
    int64_t pad[2], dil[2], one[2] = {1, 1}, dims[TB_MAX_RANK], outc;
    int32_t n, i, perm[4] = {1, 0, 2, 3}, spatial[2] = {2, 3};
    bool columns;
    tb_tensor *wt, *g;
    if (!tb__conv_windows_of(mm, x, &w, &win, &columns, pad, dil)) return NULL;
    n = (*x)->shape.rank - 2;
    outc = mm->shape.dims[columns ? 0 : 2];
    dims[0] = outc;
    dims[1] = (*x)->shape.dims[1];
    for (i = 0; i < n; i++) {
        dims[2 + i] = win->attrs[2 + 4 * i];
        pad[i] = dil[i] * (dims[2 + i] - 1) - pad[i];
    }
    wt = tb__ag_keep(a, tb_reshape(tb__ag_node(a, w), dims, 2 + n)); /* [O, C, K..] */
    wt = wt != NULL ? tb__ag_keep(a, tb_permute(wt, perm, 2 + n)) : NULL;
    wt = wt != NULL ? tb__ag_keep(a, tb_flip(wt, spatial, (size_t)n)) : NULL; /* [C, O, K..] */
    dims[0] = columns ? outc : (*x)->shape.dims[0];
    dims[1] = columns ? (*x)->shape.dims[0] : outc;
    for (i = 0; i < n; i++)
        dims[2 + i] = win->attrs[1 + 4 * i];
    g = columns ? tb__conv_columns_grad(a, gv, dims, 2 + n) : NULL; /* [N, O, O..] */
    if (g == NULL) {
        g = tb__ag_keep(a, tb_reshape(gv, dims, 2 + n)); /* [N, O, O..], or [O, N, O..] */
        if (columns && g != NULL) g = tb__ag_keep(a, tb_permute(g, perm, 2 + n));
    }
    if (wt == NULL || g == NULL) return NULL;
    return tb__ag_keep(a, n == 2 ? tb_conv2d(g, wt, NULL, one, pad, dil, 1)
                                 : tb_conv1d(g, wt, NULL, one, pad, dil, 1));
}

static tb_tensor *tb__conv(const char *fn, int32_t n, tb_tensor *x, tb_tensor *weight,
                           tb_tensor *bias, const int64_t *stride, const int64_t *padding,
                           const int64_t *dilation, int64_t groups) {
    tb__conv_args c;
    int64_t outc =
        tb__conv_check(&c, fn, n, x, weight, bias, stride, padding, dilation, groups, false);
    int32_t i;
    if (outc < 0) return NULL;
    for (i = 0; i < n; i++)
        if (!tb__conv_out_size(&c, i, false)) return NULL;
    tb__ag_set_conv_grad(tb__conv_input_grad);
    return tb__conv_record(&c, tb__conv_forward, x, weight, bias, groups, outc);
}

TBDEF tb_tensor *tb_conv2d(tb_tensor *x, tb_tensor *weight, tb_tensor *bias, const int64_t *stride,
                           const int64_t *padding, const int64_t *dilation, int64_t groups) {
    return tb__conv("tb_conv2d", 2, x, weight, bias, stride, padding, dilation, groups);
}

TBDEF tb_tensor *tb_conv1d(tb_tensor *x, tb_tensor *weight, tb_tensor *bias, const int64_t *stride,
                           const int64_t *padding, const int64_t *dilation, int64_t groups) {
    return tb__conv("tb_conv1d", 1, x, weight, bias, stride, padding, dilation, groups);
}

/* x [N, C, L..] times the weight [G, O / G * K.., C / G] as [N, G, O / G * K.., L..], folded
   onto the full output (before the padding is cut away). */
static tb_tensor *tb__conv_transpose_forward(tb__ag *a, const tb__conv_args *c, tb_tensor *x,
                                             tb_tensor *weight, int64_t groups, int64_t outc) {
    tb_shape xs = tb_tensor_shape(x);
    int64_t n = xs.dims[0], ch = xs.dims[1], kk = 1, ll = 1, dims[TB_MAX_RANK], full[2];
    int32_t perm[TB_MAX_RANK], i, r;
    tb_tensor *t, *m;
    for (i = 0; i < c->n; i++) {
        kk *= c->k[i];
        ll *= c->lo[i];
        full[i] = c->out[i] + 2 * c->p[i];
    }
    dims[0] = n;
    dims[1] = groups;
    dims[2] = ch / groups;
    dims[3] = ll;
    t = tb__ag_keep(a, tb_reshape(x, dims, 4));
    dims[0] = groups;
    dims[1] = ch / groups;
    dims[2] = outc / groups * kk;
    m = tb__ag_keep(a, tb_reshape(weight, dims, 3));
    m = m != NULL ? tb__ag_keep(a, tb_transpose(m, 1, 2)) : NULL;
    t = t != NULL && m != NULL ? tb__ag_keep(a, tb_matmul(m, t)) : NULL;
    /* [N, G, O/G * K.., L..] -> [N, O, K.., L..] -> [N, O, L.., K..] */
    dims[0] = n;
    dims[1] = outc;
    for (i = 0; i < 2 * c->n; i++)
        dims[2 + i] = i < c->n ? c->k[i] : c->lo[i - c->n];
    r = 2 + 2 * c->n;
    t = t != NULL ? tb__ag_keep(a, tb_reshape(t, dims, r)) : NULL;
    perm[0] = 0;
    perm[1] = 1;
    for (i = 0; i < c->n; i++) {
        perm[2 + i] = 2 + c->n + i;
        perm[2 + c->n + i] = 2 + i;
    }
    t = t != NULL ? tb__ag_keep(a, tb_permute(t, perm, r)) : NULL;
    t = t != NULL ? tb__ag_fold(a, t, c->n, full, c->k, c->s, c->d) : NULL;
    for (i = 0; i < c->n && t != NULL; i++) {
        if (c->p[i] > 0) t = tb__ag_keep(a, tb_slice(t, 2 + i, c->p[i], c->p[i] + c->out[i], 1));
    }
    return t;
}

static tb_tensor *tb__conv_transpose(const char *fn, int32_t n, tb_tensor *x, tb_tensor *weight,
                                     tb_tensor *bias, const int64_t *stride, const int64_t *padding,
                                     const int64_t *output_padding, const int64_t *dilation,
                                     int64_t groups) {
    tb__conv_args c;
    int64_t full,
        outc = tb__conv_check(&c, fn, n, x, weight, bias, stride, padding, dilation, groups, true);
    int32_t i;
    if (outc < 0) return NULL;
    if (!tb__conv_fill(fn, "output_padding", output_padding, n, 0, 0, c.op)) return NULL;
    for (i = 0; i < n; i++) {
        if (c.op[i] >= c.s[i] && c.op[i] >= c.d[i]) {
            tb__error(TB_ERR_INVALID_ARGUMENT,
                      "%s: output_padding %lld must be smaller than the stride %lld or the "
                      "dilation %lld (spatial dim %d)",
                      fn, (long long)c.op[i], (long long)c.s[i], (long long)c.d[i], (int)i);
            return NULL;
        }
        if (c.lo[i] < 1 || !tb__muladd_i64(c.lo[i] - 1, c.s[i], c.op[i] + 1, &full) ||
            !tb__muladd_i64(c.d[i], c.k[i] - 1, full, &full) || full > INT64_MAX / 4) {
            tb__error(TB_ERR_OVERFLOW,
                      "%s: the output size overflows along spatial dim %d (stride %lld, "
                      "dilation %lld)",
                      fn, (int)i, (long long)c.s[i], (long long)c.d[i]);
            return NULL;
        }
        /* full <= INT64_MAX / 4: twice a padding beyond that cannot leave an output */
        if (c.p[i] > INT64_MAX / 4 || full - 2 * c.p[i] < 1) {
            tb__error(TB_ERR_SHAPE,
                      "%s: padding %lld leaves no output along spatial dim %d (%lld before "
                      "padding)",
                      fn, (long long)c.p[i], (int)i, (long long)full);
            return NULL;
        }
        c.out[i] = full - 2 * c.p[i];
    }
    return tb__conv_record(&c, tb__conv_transpose_forward, x, weight, bias, groups, outc);
}

TBDEF tb_tensor *tb_conv_transpose2d(tb_tensor *x, tb_tensor *weight, tb_tensor *bias,
                                     const int64_t *stride, const int64_t *padding,
                                     const int64_t *output_padding, const int64_t *dilation,
                                     int64_t groups) {
    return tb__conv_transpose("tb_conv_transpose2d", 2, x, weight, bias, stride, padding,
                              output_padding, dilation, groups);
}

TBDEF tb_tensor *tb_conv_transpose1d(tb_tensor *x, tb_tensor *weight, tb_tensor *bias,
                                     const int64_t *stride, const int64_t *padding,
                                     const int64_t *output_padding, const int64_t *dilation,
                                     int64_t groups) {
    return tb__conv_transpose("tb_conv_transpose1d", 1, x, weight, bias, stride, padding,
                              output_padding, dilation, groups);
}

/* ---- pooling ---- */

/* The windows of x flattened to one last axis of K.. elements: [.., O.., K1 * K2]. */
static tb_tensor *tb__pool_windows(tb__ag *a, const tb__conv_args *c, tb_tensor *x, double value) {
    tb_tensor *w = tb__conv_windows(a, c, x, value);
    tb_shape ws;
    int64_t dims[TB_MAX_RANK];
    int32_t i;
    if (w == NULL) return NULL;
    ws = tb_tensor_shape(w);
    for (i = 0; i < ws.rank - c->n; i++)
        dims[i] = ws.dims[i];
    dims[ws.rank - c->n] = -1;
    return tb__ag_keep(a, tb_reshape(w, dims, ws.rank - c->n + 1));
}

static bool tb__pool_setup(tb__conv_args *c, tb_tensor *x, const int64_t *kernel,
                           const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                           bool ceil_mode) {
    int32_t i;
    tb__ensure_setup();
    if (!tb__conv_input(c->fn, "x", x, c->n)) return false;
    if (kernel == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: kernel is NULL", c->fn);
        return false;
    }
    if (!tb__conv_common(c, x, kernel, stride, padding, dilation, true)) return false;
    for (i = 0; i < c->n; i++)
        if (!tb__conv_out_size(c, i, ceil_mode)) return false;
    return true;
}

static tb_tensor *tb__max_pool(const char *fn, int32_t n, tb_tensor *x, const int64_t *kernel,
                               const int64_t *stride, const int64_t *padding,
                               const int64_t *dilation, bool ceil_mode) {
    tb__conv_args c;
    tb_tensor *w, *y;
    tb__ag a;
    int32_t last;
    memset(&c, 0, sizeof c);
    c.fn = fn;
    c.n = n;
    if (!tb__pool_setup(&c, x, kernel, stride, padding, dilation, ceil_mode)) return NULL;
    tb__ag_init(&a, fn);
    a.device = tb_tensor_device(x);
    w = tb__pool_windows(&a, &c, x, -INFINITY);
    last = w != NULL ? tb_tensor_shape(w).rank - 1 : 0;
    /* the window's max, whose gradient goes to its first largest (or first NaN) element
       alone, as PyTorch's */
    y = w != NULL ? tb__ag_keep(&a, tb__max_first(w, last, false)) : NULL;
    return tb__nn_finish(&a, y);
}

TBDEF tb_tensor *tb_max_pool2d(tb_tensor *x, const int64_t *kernel, const int64_t *stride,
                               const int64_t *padding, const int64_t *dilation, bool ceil_mode) {
    return tb__max_pool("tb_max_pool2d", 2, x, kernel, stride, padding, dilation, ceil_mode);
}

TBDEF tb_tensor *tb_max_pool1d(tb_tensor *x, const int64_t *kernel, const int64_t *stride,
                               const int64_t *padding, const int64_t *dilation, bool ceil_mode) {
    return tb__max_pool("tb_max_pool1d", 1, x, kernel, stride, padding, dilation, ceil_mode);
}

/* PyTorch's divisor of window o along one axis: its extent within the padded input
   (count_include_pad) or within the input. */
static int64_t tb__pool_count(const tb__conv_args *c, int32_t i, int64_t o, bool include_pad) {
    int64_t start = o * c->s[i] - c->p[i], end = start + c->k[i];
    if (end > c->lo[i] + c->p[i]) end = c->lo[i] + c->p[i];
    if (!include_pad) {
        if (start < 0) start = 0;
        if (end > c->lo[i]) end = c->lo[i];
    }
    return end - start;
}

/* A constant of `dtype` on the arena's device from doubles (exact small integers here): made
   in f64 or f32, cast to a 16-bit dtype. Frees nothing of `v`. */
static tb_tensor *tb__conv_constant(tb__ag *a, const double *v, int32_t rank, const int64_t *dims,
                                    tb_dtype dtype) {
    tb_dtype host_dt = dtype == TB_F64 ? TB_F64 : TB_F32;
    int64_t n = 1, i;
    int32_t d;
    tb_shape s;
    tb_tensor *t;
    float *f = NULL;
    for (d = 0; d < rank; d++)
        n *= dims[d];
    if (tb_shape_make(&s, host_dt, rank, dims) != TB_OK) {
        a->failed = true;
        return NULL;
    }
    if (host_dt == TB_F32) {
        f = (float *)tb__calloc((size_t)n, sizeof(float));
        if (f == NULL) {
            a->failed = true;
            return NULL;
        }
        for (i = 0; i < n; i++)
            f[i] = (float)v[i];
    }
    t = tb__ag_keep(
        a, tb_tensor_from_host(f != NULL ? (const void *)f : (const void *)v, &s, &a->device));
    tb__free(f);
    if (t != NULL && dtype != host_dt) t = tb__ag_keep(a, tb_cast(t, dtype));
    return t;
}

/* The divisors of every output position, [O..] of x's dtype, on x's device. */
static tb_tensor *tb__pool_divisors(tb__ag *a, const tb__conv_args *c, tb_dtype dtype,
                                    bool include_pad) {
    int64_t total = c->out[0] * (c->n > 1 ? c->out[1] : 1), o;
    tb_tensor *t;
    double *host = (double *)tb__calloc((size_t)total, sizeof(double));
    if (host == NULL) {
        a->failed = true;
        return NULL;
    }
    for (o = 0; o < total; o++) {
        host[o] = (double)tb__pool_count(c, c->n - 1, o % c->out[c->n - 1], include_pad);
        if (c->n > 1) host[o] *= (double)tb__pool_count(c, 0, o / c->out[1], include_pad);
    }
    t = tb__conv_constant(a, host, c->n, c->out, dtype);
    tb__free(host);
    return t;
}

static tb_tensor *tb__avg_pool(const char *fn, int32_t n, tb_tensor *x, const int64_t *kernel,
                               const int64_t *stride, const int64_t *padding, bool ceil_mode,
                               bool count_include_pad) {
    tb__conv_args c;
    tb_tensor *w, *y, *div;
    tb__ag a;
    int32_t last;
    memset(&c, 0, sizeof c);
    c.fn = fn;
    c.n = n;
    if (!tb__pool_setup(&c, x, kernel, stride, padding, NULL, ceil_mode)) return NULL;
    tb__ag_init(&a, fn);
    a.device = tb_tensor_device(x);
    w = tb__pool_windows(&a, &c, x, 0.0);
    last = w != NULL ? tb_tensor_shape(w).rank - 1 : 0;
    y = w != NULL ? tb__ag_keep(&a, tb_sum(w, &last, 1, false)) : NULL;
    div = y != NULL ? tb__pool_divisors(&a, &c, tb_tensor_shape(x).dtype, count_include_pad) : NULL;
    y = div != NULL ? tb__ag_keep(&a, tb_div(y, div)) : NULL;
    return tb__nn_finish(&a, y);
}

TBDEF tb_tensor *tb_avg_pool2d(tb_tensor *x, const int64_t *kernel, const int64_t *stride,
                               const int64_t *padding, bool ceil_mode, bool count_include_pad) {
    return tb__avg_pool("tb_avg_pool2d", 2, x, kernel, stride, padding, ceil_mode,
                        count_include_pad);
}

TBDEF tb_tensor *tb_avg_pool1d(tb_tensor *x, const int64_t *kernel, const int64_t *stride,
                               const int64_t *padding, bool ceil_mode, bool count_include_pad) {
    return tb__avg_pool("tb_avg_pool1d", 1, x, kernel, stride, padding, ceil_mode,
                        count_include_pad);
}

/* The bins of one axis as a 0/1 matrix [L, out] (transposed: [out, L]) and each bin's size. */
static tb_tensor *tb__adaptive_bins(tb__ag *a, tb_dtype dtype, int64_t len, int64_t out,
                                    bool transposed, double *count) {
    int64_t i, j, dims[2];
    tb_tensor *t;
    double *host = (double *)tb__calloc((size_t)len, (size_t)out * sizeof(double));
    if (host == NULL) {
        a->failed = true;
        return NULL;
    }
    for (j = 0; j < out; j++) {
        int64_t start = j * len / out, end = ((j + 1) * len + out - 1) / out;
        count[j] = (double)(end - start);
        for (i = start; i < end; i++)
            host[transposed ? j * len + i : i * out + j] = 1.0;
    }
    dims[0] = transposed ? out : len;
    dims[1] = transposed ? len : out;
    t = tb__conv_constant(a, host, 2, dims, dtype);
    tb__free(host);
    return t;
}

static tb_tensor *tb__adaptive_avg_pool(const char *fn, int32_t n, tb_tensor *x,
                                        const int64_t *output_size) {
    tb_shape xs;
    tb_dtype dt;
    double *counts[2], *host;
    tb_tensor *y, *m, *div;
    tb__ag a;
    int64_t i, cdims[2];
    int32_t d;
    tb__ensure_setup();
    if (!tb__conv_input(fn, "x", x, n)) return NULL;
    if (output_size == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: output_size is NULL", fn);
        return NULL;
    }
    xs = tb_tensor_shape(x);
    dt = xs.dtype;
    for (d = 0; d < n; d++) {
        if (output_size[d] < 1 || output_size[d] > xs.dims[xs.rank - n + d] * 64 + 64) {
            tb__error(TB_ERR_INVALID_ARGUMENT,
                      "%s: output size %lld for an input of %lld along spatial dim %d (at least "
                      "1, at most 64 bins per element)",
                      fn, (long long)output_size[d], (long long)xs.dims[xs.rank - n + d], (int)d);
            return NULL;
        }
    }
    counts[0] = (double *)tb__alloc(sizeof(double) * (size_t)(output_size[0] + output_size[n - 1]));
    if (counts[0] == NULL) {
        tb__error(TB_ERR_OUT_OF_MEMORY, "%s: no memory for the bin sizes", fn);
        return NULL;
    }
    counts[1] = counts[0] + output_size[0];
    tb__ag_init(&a, fn);
    a.device = tb_tensor_device(x);
    /* the last axis: x [.., W] @ [W, OW]; the one before: [OH, H] @ x [.., H, OW] */
    m = tb__adaptive_bins(&a, dt, xs.dims[xs.rank - 1], output_size[n - 1], false, counts[n - 1]);
    y = m != NULL ? tb__ag_keep(&a, tb_matmul(x, m)) : NULL;
    if (n > 1 && y != NULL) {
        m = tb__adaptive_bins(&a, dt, xs.dims[xs.rank - 2], output_size[0], true, counts[0]);
        y = m != NULL ? tb__ag_keep(&a, tb_matmul(m, y)) : NULL;
    }
    cdims[0] = output_size[0];
    cdims[1] = n > 1 ? output_size[1] : 1;
    host = y != NULL ? (double *)tb__calloc((size_t)(cdims[0] * cdims[1]), sizeof(double)) : NULL;
    if (y != NULL && host == NULL) a.failed = true;
    div = NULL;
    if (host != NULL) {
        for (i = 0; i < cdims[0] * cdims[1]; i++)
            host[i] = n > 1 ? counts[0][i / cdims[1]] * counts[1][i % cdims[1]] : counts[0][i];
        div = tb__conv_constant(&a, host, n, output_size, dt);
        tb__free(host);
    }
    y = div != NULL ? tb__ag_keep(&a, tb_div(y, div)) : NULL;
    tb__free(counts[0]);
    return tb__nn_finish(&a, y);
}

TBDEF tb_tensor *tb_adaptive_avg_pool2d(tb_tensor *x, const int64_t *output_size) {
    return tb__adaptive_avg_pool("tb_adaptive_avg_pool2d", 2, x, output_size);
}

TBDEF tb_tensor *tb_adaptive_avg_pool1d(tb_tensor *x, const int64_t *output_size) {
    return tb__adaptive_avg_pool("tb_adaptive_avg_pool1d", 1, x, output_size);
}

/* ---- fold ---- */

TBDEF tb_tensor *tb_fold(tb_tensor *g, size_t num_spatial, const int64_t *sizes,
                         const int64_t *kernel, const int64_t *stride, const int64_t *dilation) {
    const char *fn = "tb_fold";
    int64_t k[3], s[3], d[3];
    tb_shape gs;
    tb__ag a;
    int32_t n = (int32_t)num_spatial, lead, i;
    tb__ensure_setup();
    if (g == NULL) return tb__null_input(fn, "g");
    if (sizes == NULL || kernel == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                  sizes == NULL ? "sizes" : "kernel");
        return NULL;
    }
    if (num_spatial < 1 || num_spatial > 3) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: num_spatial is %zu; 1, 2 or 3 dims are supported",
                  fn, num_spatial);
        return NULL;
    }
    gs = tb_tensor_shape(g);
    lead = gs.rank - 2 * n;
    if (lead < 0) {
        char t[96];
        tb__shape_text(&gs, t);
        tb__error(TB_ERR_SHAPE, "%s: g %s has fewer than %d dims", fn, t, (int)(2 * n));
        return NULL;
    }
    for (i = 0; i < n; i++) {
        int64_t o = gs.dims[lead + i], span, last;
        k[i] = kernel[i];
        s[i] = stride != NULL ? stride[i] : 1;
        d[i] = dilation != NULL ? dilation[i] : 1;
        if (k[i] < 1 || s[i] < 1 || d[i] < 1 || gs.dims[lead + n + i] != k[i] || o < 1 ||
            !tb__muladd_i64(k[i] - 1, d[i], 0, &span) ||
            !tb__muladd_i64(o - 1, s[i], span, &last) || last >= sizes[i]) {
            char t[96];
            tb__shape_text(&gs, t);
            tb__error(TB_ERR_SHAPE,
                      "%s: g %s does not hold windows of %lld (stride %lld, dilation %lld) that "
                      "fit in %lld along spatial dim %d",
                      fn, t, (long long)k[i], (long long)s[i], (long long)d[i], (long long)sizes[i],
                      (int)i);
            return NULL;
        }
    }
    tb__ag_init(&a, fn);
    a.device = tb_tensor_device(g);
    return tb__nn_finish(&a, tb__ag_fold(&a, g, n, sizes, k, s, d));
}
