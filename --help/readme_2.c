#define TB_IMPLEMENTATION
#include "torch_backend.h"
#include <stdio.h>

int main(void) {
    tb_shape s = tb_shape_of(TB_F32, 2, 2, 3);
    char text[64];
    tb_shape_format(&s, text, sizeof text);
    printf("shape %s\n", text); /* f32[2,3] */

    tb_metrics_reset();
    for (int step = 0; step < 10; ++step) {
        float x[6] = {0, 1, 2, 3, 4, (float)step};
        tb_tensor *t = tb_tensor_from_host(x, &s, NULL);
        tb_tensor *y = tb_mul_scalar(t, 0.5 * step); /* the scalar is a parameter */
        tb_tensor *z = tb_sum(y, NULL, 0, false);
        double total = 0;
        if (tb_tensor_item(z, &total) != TB_OK) {
            fprintf(stderr, "%s\n", tb_last_error());
            return 1;
        }
        tb_tensor_release(z);
        tb_tensor_release(y);
        tb_tensor_release(t);
    }
    /* compiled once, then found in the cache nine times */
    printf("UncachedCompile %lld, CachedCompile %lld\n",
           (long long)tb_metrics_counter("UncachedCompile"),
           (long long)tb_metrics_counter("CachedCompile"));
    char *report = tb_metrics_report();
    printf("%s", report);
    tb_free(report);
    tb_shutdown();
    return 0;
}
