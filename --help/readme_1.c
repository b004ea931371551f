#define TB_IMPLEMENTATION
#include "torch_backend.h"
#include <stdio.h>

int main(void) {
    const char *names[8];
    size_t n = tb_backend_list(names, 8, false);
    for (size_t i = 0; i < n && i < 8; ++i)
        printf("%s\n", names[i]);

    const float data[4] = {1, -2, 3, -4};
    tb_shape shape = tb_shape_of(TB_F32, 1, 4);
    tb_tensor *x = tb_tensor_from_host(data, &shape, NULL);
    tb_tensor *y = tb_relu(x); /* recorded, not computed */
    float out[4];
    if (tb_tensor_to_host(y, out, sizeof out) != TB_OK) /* syncs: compiles and runs */
        fprintf(stderr, "%s\n", tb_last_error());
    printf("%g %g %g %g\n", out[0], out[1], out[2], out[3]);
    tb_tensor_release(y);
    tb_tensor_release(x);
    tb_shutdown();
    return 0;
}
