/* ===========================================================================================
   Convolution and pooling (torch.nn.functional's, channels first: [N, C, L] for the 1-D
   forms, [N, C, H, W] for the 2-D ones; the batch axis may be left out as in PyTorch).
   Recorded from tb_window (sliding windows, a view), tb_pad and tb_matmul, so a convolution
   is a matmul that reads its windows straight from the input, and the gradients come from
   the ops' rules (tb_grad covers a CNN). Float dtypes only.

   Arrays of per-dim values have 1 entry for the 1-D forms and 2 (height, width) for the 2-D
   ones; NULL gives PyTorch's default: stride 1 (pooling: the kernel size), padding 0,
   dilation 1, output_padding 0. Bad arguments (a kernel larger than the padded input, groups
   that do not divide the channels, stride < 1, padding < 0) give TB_ERR_INVALID_ARGUMENT or
   TB_ERR_SHAPE with a message.
   =========================================================================================== */

/* torch.nn.functional.conv2d: x [N, C, H, W], weight [O, C / groups, KH, KW], bias [O] or
   NULL; output [N, O, OH, OW] with OH = (H + 2 * padding - dilation * (KH - 1) - 1) / stride +
   1. */
TBDEF tb_tensor *tb_conv2d(tb_tensor *x, tb_tensor *weight, tb_tensor *bias, const int64_t *stride,
                           const int64_t *padding, const int64_t *dilation, int64_t groups);
TBDEF tb_tensor *tb_conv1d(tb_tensor *x, tb_tensor *weight, tb_tensor *bias, const int64_t *stride,
                           const int64_t *padding, const int64_t *dilation, int64_t groups);
/* torch.nn.functional.conv_transpose2d: x [N, C, H, W], weight [C, O / groups, KH, KW];
   output [N, O, OH, OW] with OH = (H - 1) * stride - 2 * padding + dilation * (KH - 1) +
   output_padding + 1 (output_padding < stride or < dilation). The gradient of tb_conv2d with
   respect to its input. */
TBDEF tb_tensor *tb_conv_transpose2d(tb_tensor *x, tb_tensor *weight, tb_tensor *bias,
                                     const int64_t *stride, const int64_t *padding,
                                     const int64_t *output_padding, const int64_t *dilation,
                                     int64_t groups);
TBDEF tb_tensor *tb_conv_transpose1d(tb_tensor *x, tb_tensor *weight, tb_tensor *bias,
                                     const int64_t *stride, const int64_t *padding,
                                     const int64_t *output_padding, const int64_t *dilation,
                                     int64_t groups);
/* torch.nn.functional.max_pool2d: the largest element of each window (padding counts as
   -inf, at most half the kernel); NaN wins as in PyTorch; the gradient goes to the first
   largest element of each window. ceil_mode rounds the output size up (a last window that
   starts inside the input or its left padding). */
TBDEF tb_tensor *tb_max_pool2d(tb_tensor *x, const int64_t *kernel, const int64_t *stride,
                               const int64_t *padding, const int64_t *dilation, bool ceil_mode);
TBDEF tb_tensor *tb_max_pool1d(tb_tensor *x, const int64_t *kernel, const int64_t *stride,
                               const int64_t *padding, const int64_t *dilation, bool ceil_mode);
/* torch.nn.functional.avg_pool2d: the mean of each window; count_include_pad divides by the
   window's extent within the padded input, else by its elements inside the input. */
TBDEF tb_tensor *tb_avg_pool2d(tb_tensor *x, const int64_t *kernel, const int64_t *stride,
                               const int64_t *padding, bool ceil_mode, bool count_include_pad);
TBDEF tb_tensor *tb_avg_pool1d(tb_tensor *x, const int64_t *kernel, const int64_t *stride,
                               const int64_t *padding, bool ceil_mode, bool count_include_pad);
/* torch.nn.functional.adaptive_avg_pool2d: output_size bins per dim, bin i covering [floor(i *
   L / out), ceil((i + 1) * L / out)). */
TBDEF tb_tensor *tb_adaptive_avg_pool2d(tb_tensor *x, const int64_t *output_size);
TBDEF tb_tensor *tb_adaptive_avg_pool1d(tb_tensor *x, const int64_t *output_size);
/* The adjoint of tb_window (torch.nn.functional.fold for num_spatial 2, without its flat
   layout): g [..., O_1, .., O_n, K_1, .., K_n] summed onto [..., sizes]: element [..., o, k]
   adds to [..., o_i * stride_i + k_i * dilation_i]. The windows must fit in sizes. */
TBDEF tb_tensor *tb_fold(tb_tensor *g, size_t num_spatial, const int64_t *sizes,
                         const int64_t *kernel, const int64_t *stride, const int64_t *dilation);
