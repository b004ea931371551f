#define TB_IMPLEMENTATION
#include "torch_backend.h"
#include <stdio.h>

int main(void) {
    /* y = softmax(relu(x @ W + b)) */
    float xv[2 * 3] = {1, 2, 3, -1, 0, 1};
    float wv[3 * 2] = {0.5f, -1, 0.25f, 1, -0.5f, 0.5f};
    float bv[2] = {0.1f, -0.1f};
    tb_shape xs = tb_shape_of(TB_F32, 2, 2, 3), ws = tb_shape_of(TB_F32, 2, 3, 2),
             bs = tb_shape_of(TB_F32, 1, 2);
    tb_tensor *x = tb_tensor_from_host(xv, &xs, NULL);
    tb_tensor *w = tb_tensor_from_host(wv, &ws, NULL);
    tb_tensor *b = tb_tensor_from_host(bv, &bs, NULL);
    tb_tensor *xw = tb_matmul(x, w);
    tb_tensor *h = tb_add(xw, b);
    tb_tensor *r = tb_relu(h);
    tb_tensor *y = tb_softmax(r, -1);
    float out[4];
    if (tb_tensor_to_host(y, out, sizeof out) != TB_OK) {
        fprintf(stderr, "%s\n", tb_last_error());
        return 1;
    }
    printf("%.4f %.4f\n%.4f %.4f\n", out[0], out[1], out[2], out[3]);
    tb_tensor *all[] = {x, w, b, xw, h, r, y};
    for (int i = 0; i < 7; ++i)
        tb_tensor_release(all[i]);
    tb_shutdown();
    return 0;
}
