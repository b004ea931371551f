/* ===========================================================================================
   Layers of real models (torch.nn.functional's): linear, embedding, batch norm, attention,
   masks, the hard activations and interpolation. Each is recorded from the public ops, so it
   fuses with the model, differentiates with tb_grad and runs on every backend.
   =========================================================================================== */

/* torch.nn.functional.linear: x [..., in] times weight [out, in] (PyTorch's layout,
   transposed as a view) plus bias [out] (may be NULL): [..., out]. */
TBDEF tb_tensor *tb_linear(tb_tensor *x, tb_tensor *weight, tb_tensor *bias);
/* torch.nn.functional.embedding: the rows of weight [num, dim] that indices (i32 or i64, any
   shape) name: [indices' dims..., dim]. An index outside [0, num) fails the sync as
   tb_index_select does. The gradient of weight adds each row's gradient at its index
   (tb_index_add), so repeated indices accumulate. */
TBDEF tb_tensor *tb_embedding(tb_tensor *indices, tb_tensor *weight);

/* torch.nn.functional.hardtanh: min(max(x, min_val), max_val); min_val <= max_val. */
TBDEF tb_tensor *tb_hardtanh(tb_tensor *x, double min_val, double max_val);
/* torch.nn.functional.relu6: min(max(x, 0), 6). */
TBDEF tb_tensor *tb_relu6(tb_tensor *x);
/* torch.nn.functional.hardsigmoid: relu6(x + 3) / 6. */
TBDEF tb_tensor *tb_hardsigmoid(tb_tensor *x);
/* torch.nn.functional.hardswish: x * relu6(x + 3) / 6. */
TBDEF tb_tensor *tb_hardswish(tb_tensor *x);

/* torch.tril / torch.triu over the last two dims of x (rank >= 2): tril keeps element [i, j]
   where j - i <= diagonal, triu where j - i >= diagonal; the others are zero. */
TBDEF tb_tensor *tb_tril(tb_tensor *x, int64_t diagonal);
TBDEF tb_tensor *tb_triu(tb_tensor *x, int64_t diagonal);
/* torch.Tensor.masked_fill: value where mask (bool, broadcasting to x's shape) is true, x
   elsewhere; x's shape and dtype. */
TBDEF tb_tensor *tb_masked_fill(tb_tensor *x, tb_tensor *mask, double value);

/* torch.nn.functional.batch_norm over x [N, C, ...] (rank >= 2), per channel C.
   Training: normalised by the batch's mean and biased variance over every axis but 1; when
   running_mean and running_var are given ([C], x's dtype and device) they are updated in place
   (tb_assign, lazy: computed with the graph) to (1 - momentum) * running + momentum * the
   batch's statistic, the variance unbiased (N * ... > 1 values per channel are needed, as
   PyTorch requires). Not training: normalised by running_mean and running_var (required).
   weight and bias ([C]) may be NULL. momentum in [0, 1]; eps > 0. */
TBDEF tb_tensor *tb_batch_norm(tb_tensor *x, tb_tensor *running_mean, tb_tensor *running_var,
                               tb_tensor *weight, tb_tensor *bias, bool training, double momentum,
                               double eps);
/* Batch norm folded into the convolution (or linear layer) before it, for inference:
   conv_weight [C, ...] and conv_bias [C] (may be NULL) become *weight_out = conv_weight * s
   and *bias_out = (conv_bias - running_mean) * s + bn_bias with s = bn_weight /
   sqrt(running_var + eps) per output channel (bn_weight and bn_bias may be NULL: 1 and 0).
   The results are new lazy tensors; on error both are NULL. */
TBDEF tb_status tb_batch_norm_fold(tb_tensor *conv_weight, tb_tensor *conv_bias,
                                   tb_tensor *running_mean, tb_tensor *running_var,
                                   tb_tensor *bn_weight, tb_tensor *bn_bias, double eps,
                                   tb_tensor **weight_out, tb_tensor **bias_out);

/* torch.nn.functional.scaled_dot_product_attention: softmax(q k^T * scale + mask) v for
   q [..., L, E], k [..., S, E] and v [..., S, Ev] (batch dims broadcast): [..., L, Ev].
   scale 0 means 1 / sqrt(E). attn_mask (may be NULL) broadcasts to [..., L, S]: bool (true:
   the position takes part; false: it is left out) or of q's dtype (added to the scores).
   is_causal leaves out the positions j > i (PyTorch's lower-triangular mask of ones(L, S));
   it and attn_mask exclude each other as in PyTorch. dropout_p in [0, 1) drops attention
   weights as tb_dropout does (0: no dropout, as in evaluation). A row whose every position is
   left out gives NaN, as PyTorch's does. */
TBDEF tb_tensor *tb_scaled_dot_product_attention(tb_tensor *q, tb_tensor *k, tb_tensor *v,
                                                 tb_tensor *attn_mask, double dropout_p,
                                                 bool is_causal, double scale);

typedef enum tb_interpolate_mode {
    TB_INTERPOLATE_NEAREST = 0, /* PyTorch's "nearest": source floor(dst * in / out) */
    TB_INTERPOLATE_BILINEAR = 1 /* "bilinear" (4-D x) or "linear" (3-D x) */
} tb_interpolate_mode;
/* torch.nn.functional.interpolate to an output size: x [N, C, L] (size[0]) or [N, C, H, W]
   (size[0], size[1]); align_corners as PyTorch's (bilinear only: false for nearest). The
   gradient flows to x (gathers and weights, so it sums where sources repeat). */
TBDEF tb_tensor *tb_interpolate(tb_tensor *x, const int64_t *size, size_t num_size,
                                tb_interpolate_mode mode, bool align_corners);
