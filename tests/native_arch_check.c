/* The native backend on another architecture, without a test framework (it is built with a
   cross compiler and linked statically, then run under user-mode emulation: see
   tools/test_arch.sh): a set of graphs that reaches every kind of kernel and every vector path
   (elementwise chains with exp, reductions, norms over rows and their streamed and pipelined
   forms, packed f32 and f64 matmuls, f16 and bf16 storage, the math functions' vector forms,
   gathers and concats) runs on native:0 and on the cpu backend, and each result must match
   within 1e-5 of its scale (of what a sum adds, for sums).
   Prints one line per graph and "N passed, N failed"; the exit status is 1 on any failure. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

static int g_passed, g_failed;

static float *filled(size_t n, unsigned seed) {
    float *p = (float *)malloc(n * sizeof(float) + 1);
    size_t i;
    for (i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((seed >> 8) % 20000) / 5000.0f - 2.0f;
    }
    return p;
}

/* The graph `which` of x (and y) on `dev`. */
static tb_tensor *graph(int which, tb_tensor *x, tb_tensor *y) {
    int32_t axis = 1;
    tb_tensor *t = NULL, *parts[12];
    int i;
    switch (which) {
    case 0:
        return tb_exp(tb_add_scalar(tb_mul_scalar(x, 0.5), 0.25));
    case 1:
        return tb_sum(x, &axis, 1, false);
    case 2:
        return tb_max(x, &axis, 1, false);
    case 3:
        return tb_softmax(x, 1);
    case 4:
        return tb_log_softmax(x, 1);
    case 5:
        return tb_layer_norm(x, 1, NULL, NULL, 1e-5);
    case 6:
        return tb_matmul(x, y);
    case 7:
        return tb_cast(tb_matmul(tb_cast(x, TB_F64), tb_cast(y, TB_F64)), TB_F32);
    case 8:
        return tb_cast(tb_mul(tb_cast(x, TB_F16), tb_cast(x, TB_F16)), TB_F32);
    case 9:
        return tb_cast(tb_relu(tb_cast(x, TB_BF16)), TB_F32);
    case 10:
        return tb_sum(x, NULL, 0, false);
    case 11: /* the math functions' vector forms; sin's argument past 8192 in some lanes */
        t = tb_add(tb_log(tb_add_scalar(tb_abs(x), 0.5)), tb_softplus(x));
        t = tb_add(tb_add(t, tb_mish(x)), tb_tanh(x));
        return tb_add(tb_add(t, tb_sin(tb_mul_scalar(x, 4500.0))), tb_cos(tb_mul_scalar(x, 3.0)));
    default:
        for (i = 0; i < 12; i++)
            parts[i] = tb_slice(x, 0, i, i + 1, 1);
        t = tb_concat(parts, 12, 0);
        return t;
    }
}

static const char *const g_names[] = {"exp chain",   "row sums",   "row maxima", "softmax",
                                      "log_softmax", "layer_norm", "f32 matmul", "f64 matmul",
                                      "f16 square",  "bf16 relu",  "sum of all", "math functions",
                                      "concat of 12"};

int main(void) {
    static const int64_t shapes[][2] = {{64, 4100}, {96, 4096}, {16, 33}};
    tb_device nat, cpu;
    size_t si;
    int which;
    if (tb_device_parse("native:0", &nat) != TB_OK || tb_device_parse("cpu:0", &cpu) != TB_OK) {
        printf("FAIL native: %s\n0 passed, 1 failed\n", tb_last_error());
        return 1;
    }
    for (si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t r = shapes[si][0], c = shapes[si][1];
        size_t n = (size_t)(r * c);
        float *hx = filled(n, 7u + (unsigned)si), *hy = filled((size_t)(c * r), 11u);
        tb_shape sx, sy;
        tb_shape_make(&sx, TB_F32, 2, (const int64_t[]){r, c});
        tb_shape_make(&sy, TB_F32, 2, (const int64_t[]){c, r});
        for (which = 0; which < 13; which++) {
            tb_tensor *x[2], *y[2], *z[2];
            float *got[2] = {NULL, NULL};
            size_t m = 0, i;
            int64_t count = 0;
            double err = 0, scale = 1e-30;
            int d;
            tb_scope_begin();
            for (d = 0; d < 2; d++) {
                tb_shape zs;
                x[d] = tb_tensor_from_host(hx, &sx, d ? &nat : &cpu);
                y[d] = tb_tensor_from_host(hy, &sy, d ? &nat : &cpu);
                z[d] = graph(which, x[d], y[d]);
                zs = tb_tensor_shape(z[d]);
                if (z[d] != NULL && tb_shape_numel(&zs, &count) == TB_OK) {
                    m = (size_t)count;
                    got[d] = (float *)malloc(m * sizeof(float) + 1);
                    if (tb_tensor_to_host(z[d], got[d], m * sizeof(float)) != TB_OK) {
                        free(got[d]);
                        got[d] = NULL;
                    }
                }
            }
            tb_scope_end();
            if (got[0] == NULL || got[1] == NULL) {
                printf("FAIL %s f32[%lld,%lld]: %s\n", g_names[which], (long long)r, (long long)c,
                       tb_last_error());
                g_failed++;
            } else {
                for (i = 0; i < m; i++) {
                    double a = got[0][i], b = got[1][i];
                    if (fabs(a) > scale) scale = fabs(a);
                    if (a != a || b != b) {
                        if ((a != a) != (b != b)) err = INFINITY;
                    } else if (fabs(a - b) > err) {
                        err = fabs(a - b);
                    }
                }
                /* a sum's error grows with what it adds (|x| <= 2), not with its result */
                if (which == 1) scale = fmax(scale, 2.0 * (double)c);
                if (which == 10) scale = fmax(scale, 2.0 * (double)n);
                if (err / scale <= 1e-5) {
                    printf("ok %s f32[%lld,%lld] (error %.2g of scale)\n", g_names[which],
                           (long long)r, (long long)c, err / scale);
                    g_passed++;
                } else {
                    printf("FAIL %s f32[%lld,%lld]: error %.3g of scale %.3g\n", g_names[which],
                           (long long)r, (long long)c, err / scale, scale);
                    g_failed++;
                }
            }
            free(got[0]);
            free(got[1]);
            tb_clear_error();
        }
        free(hx);
        free(hy);
    }
    tb_shutdown();
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed != 0;
}
