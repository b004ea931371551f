/* ===========================================================================================
   Losses and dropout (torch.nn.functional's): recorded from the public ops, so they fuse
   with the model, differentiate with tb_grad and run on every backend.
   =========================================================================================== */

/* How a loss combines its per-element values: their mean (PyTorch's default), their sum, or
   none (the per-element losses, of the target's dims). */
typedef enum tb_reduction {
    TB_REDUCTION_MEAN = 0,
    TB_REDUCTION_SUM = 1,
    TB_REDUCTION_NONE = 2
} tb_reduction;

/* torch.nn.functional.cross_entropy from unnormalised logits. The class axis is axis 1 of
   logits [N, C, d1, ...] (axis 0 of [C]). `target` is either class indices (i32 or i64, of
   logits' dims without the class axis, each in [0, C): an index outside fails the sync as
   tb_gather does) or class probabilities (logits' shape and dtype). label_smoothing in [0, 1]
   mixes the target with the uniform distribution: loss = (1 - s) * nll + s * mean over the
   classes of -log_softmax. */
TBDEF tb_tensor *tb_cross_entropy(tb_tensor *logits, tb_tensor *target, tb_reduction reduction,
                                  double label_smoothing);
/* torch.nn.functional.nll_loss: -log_probs at the class each target names (class axis as in
   tb_cross_entropy; integer targets only). */
TBDEF tb_tensor *tb_nll_loss(tb_tensor *log_probs, tb_tensor *target, tb_reduction reduction);
/* torch.nn.functional.mse_loss: (input - target)^2; input and target of one shape. */
TBDEF tb_tensor *tb_mse_loss(tb_tensor *input, tb_tensor *target, tb_reduction reduction);
/* torch.nn.functional.dropout: when `training`, each element is kept with probability 1 - p
   and scaled by 1 / (1 - p), else zeroed; the mask is tb_rand's stream (uniform u < 1 - p keeps
   the element), so every backend drops the same elements for the same seed and call order.
   Not training (or p = 0): x itself (retained; inside a scope see tb_scope_begin). p must be in [0,
   1]; p = 1 gives zeros. */
TBDEF tb_tensor *tb_dropout(tb_tensor *x, double p, bool training);
