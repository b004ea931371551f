#define TB_IMPLEMENTATION
#include "torch_backend.h"
#include <stdio.h>

int main(void) {
    tb_device dev;
    if (tb_device_parse("cpu:0", &dev) != TB_OK)
        return 1;
    tb_device_guard guard; /* new tensors go to `dev` until the guard ends */
    tb_device_guard_begin(&guard, &dev);
    tb_tensor *t = tb_ones(NULL, NULL); /* NULL shape: an error, not a crash */
    printf("%s\n", tb_last_error());
    tb_device_guard_end(&guard);

    if (tb_set_backend("no_such_backend") != TB_OK)
        printf("%s\n", tb_last_error()); /* unknown backend 'no_such_backend'; available: ... */
    tb_tensor_release(t);
    tb_shutdown();
    return 0;
}
