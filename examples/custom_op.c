// test: run
// Build: cc -std=c99 -I. examples/custom_op.c -o custom_op -ldl -lpthread -lm
//    or: c++ -x c++ -std=c++11 -I. examples/custom_op.c -o custom_op -ldl -lpthread -lm
//        (both from the repository root)
// Run:   ./custom_op [--show-kernel]
/* A custom elementwise op, softplus_shift(x, s) = log(1 + exp(x)) + s, registered once with
     - a reference implementation in C: what the cpu backend runs, and what any backend falls
       back to when it cannot lower the op;
     - an OpenCL C expression: what the OpenCL backend writes into its generated kernels, fused
       with the built-in elementwise ops around it.
   The program runs the same graph, 0.5 * softplus_shift(x, s) and its row sums, on the cpu
   backend and, when an OpenCL device is there, on OpenCL; it compares both with plain C and
   checks that OpenCL used the expression (no fallback). It exits with status 1 on any failure.
   --show-kernel prints the generated OpenCL C. */
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define ROWS 4
#define COLS 6

/* softplus without overflow for large x: max(x, 0) + log(1 + exp(-|x|)) */
static double softplus(double x) {
    return (x > 0 ? x : 0) + log1p(exp(-fabs(x)));
}

/* The OpenCL expression of the same formula: x0, x1 are the inputs, T the output type. */
static const char softplus_shift_opencl[] = "fmax(x0, (T)0) + log1p(exp(-fabs(x0))) + x1";

static double load(const void *data, tb_dtype dtype, int64_t i) {
    return dtype == TB_F32 ? (double)((const float *)data)[i] : ((const double *)data)[i];
}

/* The reference implementation. The inputs come as contiguous arrays of their own shapes, which
   broadcast to the output's (NumPy rules): an input's axis of size 1 repeats its one element. */
static tb_status softplus_shift_reference(const void *const *inputs, const tb_shape *input_shapes,
                                          size_t num_inputs, void *output,
                                          const tb_shape *output_shape, const int64_t *attrs,
                                          size_t num_attrs, void *user_data) {
    int64_t numel = 1, index[TB_MAX_RANK] = {0}, i;
    int32_t d, k;
    (void)attrs;
    (void)num_attrs;
    (void)user_data;
    if (output_shape->dtype != TB_F32 && output_shape->dtype != TB_F64) {
        return tb_set_error(TB_ERR_DTYPE, "softplus_shift: float inputs only, got %s",
                            tb_dtype_name(output_shape->dtype));
    }
    for (d = 0; d < output_shape->rank; ++d)
        numel *= output_shape->dims[d];
    for (i = 0; i < numel; ++i) {
        double v[2];
        for (k = 0; k < (int32_t)num_inputs; ++k) {
            const tb_shape *s = &input_shapes[k];
            int32_t lead = output_shape->rank - s->rank;
            int64_t offset = 0;
            for (d = 0; d < s->rank; ++d)
                offset = offset * s->dims[d] + (s->dims[d] == 1 ? 0 : index[lead + d]);
            v[k] = load(inputs[k], s->dtype, offset);
        }
        if (output_shape->dtype == TB_F32)
            ((float *)output)[i] = (float)(softplus(v[0]) + v[1]);
        else
            ((double *)output)[i] = softplus(v[0]) + v[1];
        for (d = output_shape->rank - 1; d >= 0; --d) {
            if (++index[d] < output_shape->dims[d]) break;
            index[d] = 0;
        }
    }
    return TB_OK;
}

/* Runs 0.5 * softplus_shift(x, s) and its row sums on `device` and compares with plain C.
   Returns 0 when everything agrees. */
static int run_on(const tb_device *device, tb_op op, int show_kernel) {
    float x[ROWS * COLS], s[COLS], y[ROWS * COLS], sums[ROWS];
    double worst = 0;
    int64_t xdims[2] = {ROWS, COLS}, sdims[1] = {COLS};
    int32_t axis = 1;
    tb_shape xshape, sshape;
    tb_tensor *tx, *ts, *shifted, *half, *rows;
    tb_tensor *inputs[2], *outputs[2];
    char name[64], *text;
    int failed = 0, r, c;
    int64_t fallbacks = tb_metrics_counter("Fallback::softplus_shift");

    for (r = 0; r < ROWS * COLS; ++r)
        x[r] = -12.0f + 24.0f * (float)r / (ROWS * COLS - 1); /* large |x| included */
    for (c = 0; c < COLS; ++c)
        s[c] = 0.25f * (float)c - 0.5f;
    tb_shape_make(&xshape, TB_F32, 2, xdims);
    tb_shape_make(&sshape, TB_F32, 1, sdims);
    tb_device_format(device, name, sizeof name);

    /* the custom op between built-in ops: one graph */
    tx = tb_tensor_from_host(x, &xshape, device);
    ts = tb_tensor_from_host(s, &sshape, device);
    inputs[0] = tx;
    inputs[1] = ts; /* [COLS] broadcasts over the rows */
    shifted = tb_call_op(op, inputs, 2, NULL, 0);
    half = tb_mul_scalar(shifted, 0.5);
    rows = tb_sum(half, &axis, 1, false);
    outputs[0] = half;
    outputs[1] = rows;
    text = tb_ir_backend_text(outputs, 2); /* compiles; "" on the cpu backend */
    if (rows == NULL || text == NULL || tb_sync(outputs, 2) != TB_OK ||
        tb_tensor_to_host(half, y, sizeof y) != TB_OK ||
        tb_tensor_to_host(rows, sums, sizeof sums) != TB_OK) {
        fprintf(stderr, "custom_op: %s: %s\n", name, tb_last_error());
        failed = 1;
    }
    for (r = 0; r < ROWS && !failed; ++r) {
        double total = 0;
        for (c = 0; c < COLS; ++c) {
            double want = 0.5 * (softplus(x[r * COLS + c]) + s[c]);
            double err = fabs(y[r * COLS + c] - want) / (1 + fabs(want));
            total += want;
            if (err > worst) worst = err;
        }
        if (fabs(sums[r] - total) / (1 + fabs(total)) > worst)
            worst = fabs(sums[r] - total) / (1 + fabs(total));
    }
    if (!failed) {
        printf("%s: y[0] = %.6f ... y[%d] = %.6f, row sums %.4f %.4f %.4f %.4f, largest relative "
               "difference from plain C %.1e\n",
               name, y[0], ROWS * COLS - 1, y[ROWS * COLS - 1], sums[0], sums[1], sums[2], sums[3],
               worst);
        if (worst > 1e-5) {
            fprintf(stderr, "custom_op: %s: results differ from plain C by %.1e\n", name, worst);
            failed = 1;
        }
    }
    if (!failed && strcmp(device->backend, "opencl") == 0) {
        /* the expression must be in the program, and the op must not have fallen back */
        int inlined = strstr(text, "log1p(exp(-fabs(x0)))") != NULL;
        int64_t fell_back = tb_metrics_counter("Fallback::softplus_shift") - fallbacks;
        printf("%s: the OpenCL program inlines the expression: %s; fallbacks: %lld\n", name,
               inlined ? "yes" : "no", (long long)fell_back);
        if (show_kernel) printf("%s\n", text);
        if (!inlined || fell_back != 0) {
            fprintf(stderr, "custom_op: %s: the op did not run as OpenCL C\n", name);
            failed = 1;
        }
    }
    tb_free(text);
    tb_tensor_release(tx);
    tb_tensor_release(ts);
    tb_tensor_release(shifted);
    tb_tensor_release(half);
    tb_tensor_release(rows);
    return failed;
}

/* Integer inputs reach the reference, which refuses them: the sync fails with its message. */
static int check_refusal(const tb_device *cpu, tb_op op) {
    int32_t values[3] = {1, 2, 3};
    int64_t dims[1] = {3};
    int32_t out[3];
    tb_shape shape;
    tb_tensor *a, *inputs[2], *r;
    int failed = 0;
    tb_shape_make(&shape, TB_I32, 1, dims);
    a = tb_tensor_from_host(values, &shape, cpu);
    inputs[0] = a;
    inputs[1] = a;
    r = tb_call_op(op, inputs, 2, NULL, 0);
    if (r == NULL || tb_tensor_to_host(r, out, sizeof out) == TB_OK ||
        strstr(tb_last_error(), "softplus_shift: float inputs only") == NULL) {
        fprintf(stderr, "custom_op: i32 inputs were not refused as expected (%s)\n",
                tb_last_error());
        failed = 1;
    } else {
        printf("i32 inputs are refused: %s\n", tb_last_error());
    }
    tb_clear_error();
    tb_tensor_release(a);
    tb_tensor_release(r);
    return failed;
}

int main(int argc, char **argv) {
    int show_kernel = argc > 1 && strcmp(argv[1], "--show-kernel") == 0;
    tb_custom_op_desc desc;
    tb_device cpu, ocl;
    tb_op op;
    size_t count = 0;
    int failed = 0;

    memset(&desc, 0, sizeof desc);
    desc.name = "softplus_shift";
    desc.num_inputs = 2;
    desc.infer_shape = NULL; /* elementwise: broadcast shape, promoted dtype */
    desc.reference = softplus_shift_reference;
    desc.opencl_expr = softplus_shift_opencl;
    if (tb_op_register(&desc, &op) != TB_OK || tb_device_make("cpu", 0, &cpu) != TB_OK) {
        fprintf(stderr, "custom_op: %s\n", tb_last_error());
        tb_shutdown();
        return 1;
    }
    printf("registered '%s' as op %d\n", tb_op_name(op), (int)op);

    failed |= run_on(&cpu, op, show_kernel);
    if (tb_opencl_available() == TB_OK && tb_backend_devices("opencl", NULL, 0, &count) == TB_OK &&
        count > 0 && tb_device_make("opencl", 0, &ocl) == TB_OK) {
        failed |= run_on(&ocl, op, show_kernel);
    } else {
        printf("no OpenCL device (%s): ran on the cpu backend only\n", tb_last_error());
        tb_clear_error();
    }
    failed |= check_refusal(&cpu, op);

    tb_shutdown();
    printf("%s\n", failed ? "FAILED" : "ok");
    return failed;
}
