/* The compiled-backend suite, conv. Convolution and pooling: conv2d, conv_transpose2d, max and
   average pooling and a convolution's gradient (tests/test_conv.c has the rest, against PyTorch).
   Part of tests/backend_suite/suite.c. */

/* ---- convolution and pooling (matmuls over windows, pads; tests/test_conv.c has the rest) ---- */

typedef struct conv_arg {
    int which; /* 0 conv2d (stride, padding, dilation, groups, bias), 1 conv_transpose2d,
                  2 max_pool2d, 3 avg_pool2d, 4 the gradient of sum(conv2d(x, w) * x') wrt x */
} conv_arg;

static tb_tensor *build_conv(tb_tensor **in, const void *arg) {
    static const int64_t one[2] = {1, 1}, two[2] = {2, 2}, k3[2] = {3, 3}, dil[2] = {2, 1};
    int which = ((const conv_arg *)arg)->which;
    switch (which) {
    case 0:
        return tb_conv2d(in[0], in[1], in[2], two, one, dil, 2);
    case 1:
        return tb_conv_transpose2d(in[0], in[1], in[2], two, one, one, one, 1);
    case 2:
        return tb_max_pool2d(in[0], k3, two, one, NULL, true);
    case 3:
        return tb_avg_pool2d(in[0], k3, two, one, false, false);
    default: {
        tb_tensor *x = tb_detach(in[0]), *y, *p, *l, *g = NULL;
        tb_set_requires_grad(x, true);
        y = tb_conv2d(x, in[1], NULL, one, one, NULL, 1);
        p = tb_mul(y, y);
        l = tb_sum(p, NULL, 0, false);
        if (tb_grad(l, NULL, &x, 1, &g) != TB_OK) g = NULL;
        tb_tensor_release(x);
        tb_tensor_release(y);
        tb_tensor_release(p);
        tb_tensor_release(l);
        return g;
    }
    }
}

static void test_conv_pool(void **state) {
    static conv_arg args[5];
    input in[3];
    int i;
    (void)state;
    REQUIRE_OPENCL();
    for (i = 0; i < 5; i++)
        args[i].which = i;
    in[0] = in_of(shp(TB_F32, 4, 2, 4, 9, 8), R_ANY);
    in[1] = in_of(shp(TB_F32, 4, 6, 2, 3, 3), R_ANY);
    in[2] = in_of(shp(TB_F32, 1, 6, 0, 0, 0), R_ANY);
    add_case("conv2d stride 2, padding 1, dilation (2, 1), groups 2, bias", build_conv, &args[0],
             in, 3);
    in[1] = in_of(shp(TB_F32, 4, 4, 3, 3, 3), R_ANY);
    in[2] = in_of(shp(TB_F32, 1, 3, 0, 0, 0), R_ANY);
    add_case("conv_transpose2d stride 2, padding 1, output_padding 1, bias", build_conv, &args[1],
             in, 3);
    in[0].range = R_WHOLE; /* ties */
    add_case("max_pool2d 3x3 stride 2, padding 1, ceil", build_conv, &args[2], in, 1);
    in[0].range = R_ANY;
    add_case("avg_pool2d 3x3 stride 2, padding 1", build_conv, &args[3], in, 1);
    in[1] = in_of(shp(TB_F32, 4, 5, 4, 3, 3), R_ANY);
    add_case("gradient of a conv2d wrt its input", build_conv, &args[4], in, 2);
    flush_cases();
}

/* in the order they run */
static const struct CMUnitTest conv_tests[] = {
    cmocka_unit_test(test_conv_pool),
};
