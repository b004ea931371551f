// test: run
// A first lazy computation: y = relu(x * 2 - 1) + sum(x), recorded, synced once, printed.
// Build: cc -std=c99 -I. examples/hello.c -o hello -ldl -lpthread -lm
//    or: c++ -x c++ -std=c++11 -I. examples/hello.c -o hello -ldl -lpthread -lm
//        (both from the repository root)
// Run:   ./hello            (TB_BACKEND=opencl ./hello to pick the OpenCL backend)
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <stdio.h>
#include <stdlib.h>

/* TB_BACKEND when it is set (NULL with the error when it names no usable backend), else the
   OpenCL backend when a device is there, else the native backend when a C compiler is there,
   else the cpu reference backend. */
static const char *pick_backend(void) {
    size_t count = 0;
    if (getenv("TB_BACKEND") != NULL) return tb_get_backend();
    if (tb_backend_devices("opencl", NULL, 0, &count) == TB_OK && count > 0) return "opencl";
    if (tb_backend_devices("native", NULL, 0, &count) == TB_OK && count > 0) return "native";
    tb_clear_error();
    return "cpu";
}

int main(void) {
    const char *backend = pick_backend();
    if (backend == NULL || tb_set_backend(backend) != TB_OK) {
        fprintf(stderr, "hello: %s\n", tb_last_error());
        return 1;
    }
    tb_device device;
    char device_text[64];
    if (tb_current_device(&device) != TB_OK) {
        fprintf(stderr, "hello: %s\n", tb_last_error());
        return 1;
    }
    tb_device_format(&device, device_text, sizeof device_text);
    printf("backend: %s, device: %s\n", backend, device_text);

    const float data[6] = {-1.0f, 0.0f, 0.5f, 1.0f, 1.5f, 2.0f};
    const int64_t dims[2] = {2, 3};
    tb_shape shape;
    if (tb_shape_make(&shape, TB_F32, 2, dims) != TB_OK) {
        fprintf(stderr, "hello: %s\n", tb_last_error());
        return 1;
    }

    /* Nothing is computed while the graph is recorded. */
    tb_tensor *x = tb_tensor_from_host(data, &shape, NULL);
    tb_tensor *doubled = tb_mul_scalar(x, 2.0);
    tb_tensor *scaled = tb_sub_scalar(doubled, 1.0);
    tb_tensor *r = tb_relu(scaled);
    tb_tensor *total = tb_sum(x, NULL, 0, false);
    tb_tensor *y = tb_add(r, total);

    float out[6];
    if (y == NULL || tb_tensor_to_host(y, out, sizeof out) != TB_OK) {
        fprintf(stderr, "hello: %s\n", tb_last_error());
        return 1;
    }
    for (int i = 0; i < 6; ++i)
        printf("%s%g", i % 3 ? " " : (i ? "\n" : ""), out[i]);
    printf("\n");

    /* Intermediate handles are ours too: release every one. */
    tb_tensor *handles[] = {x, doubled, scaled, r, total, y};
    for (size_t i = 0; i < sizeof handles / sizeof handles[0]; ++i)
        tb_tensor_release(handles[i]);
    tb_shutdown();
    return 0;
}
