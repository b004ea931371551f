/* ===========================================================================================
   Autograd: reverse-mode gradients over the lazy IR, and in-place assignment
   The recorded IR is the tape: a gradient is more IR, so a forward pass, its backward pass
   and an optimizer's update are one graph that fuses, compiles once and is a cache hit at
   every later step.
   =========================================================================================== */

/* Gradients of `out` with respect to `inputs`: grads_out[i] gets a new lazy tensor of
   inputs[i]'s shape and dtype holding d(sum(seed * out)) / d(inputs[i]), or NULL when no path
   of floating-point ops leads from inputs[i] to `out` (an input used only through tb_detach,
   comparisons, argmax or integer casts has no path; one used only through ops of zero
   derivative, floor or sign, gets zeros). `seed` has out's shape (its dtype is cast to out's);
   NULL seeds 1, and then `out` must have exactly one element. `out` and every input are
   floating point and on one device. Inputs are matched by the value they had when `out` was
   recorded: an input that was assigned (tb_assign) since then has no path. Works after the
   tensors of the forward pass were synced or flushed when they require grad (see
   tb_set_requires_grad), since those keep the history they were computed from; a tensor that
   does not require grad keeps it only until it is synced. Gradients of gradients work where
   the backward rules are themselves differentiable (every built-in op's are). A custom op on a
   path needs a vjp (tb_custom_op_desc.vjp); TB_ERR_UNSUPPORTED names the op otherwise. On
   error grads_out is all NULL. */
TBDEF tb_status tb_grad(tb_tensor *out, tb_tensor *seed, tb_tensor *const *inputs, size_t n,
                        tb_tensor **grads_out);
/* tb_sync of `tensors` ahead of a backward in a graph of its own (PyTorch's saved tensors):
   the sync also keeps on the device the values of the tensors' history that tb_grad of them
   with respect to `inputs` reads, so that the gradients' graph reads those values instead of
   computing the forward pass again. Use it when the forward's outputs must be read before the
   backward is recorded (a loss computed elsewhere, a metric); a step whose forward, backward
   and update are one sync needs nothing saved. What is saved: the value of each op of the
   history that the backward's rules read, except views (reshape, permute, expand, slice, flip,
   window), whose operands are saved instead; values an earlier sync computed, and tensors
   synced already, need nothing saved. The saved values are freed with the history
   that holds them (when the tensors are released); the metric SavedForGrad counts them.
   Tensors that do not require grad, and n == 0, sync as tb_sync. Errors as tb_sync's and
   tb_grad's: inputs must be floating point on the tensors' device, and a history tb_grad
   cannot differentiate (a custom op without a vjp) is refused (TB_ERR_UNSUPPORTED naming the
   op) with nothing synced. */
TBDEF tb_status tb_sync_for_grad(tb_tensor *const *tensors, size_t count, tb_tensor *const *inputs,
                                 size_t n);
/* A new tensor with x's value and no history: gradients do not flow through it. */
TBDEF tb_tensor *tb_detach(tb_tensor *x);
/* Whether the tensor's value keeps its history for tb_grad after a sync (PyTorch's
   requires_grad). Set it on parameters: every tensor computed from a tensor that requires grad
   requires grad too. Setting it makes the tensor a leaf (its value stays, the history it had
   is no longer followed); clearing it is tb_detach in place. Only floating-point tensors can
   require grad (TB_ERR_DTYPE). */
TBDEF tb_status tb_set_requires_grad(tb_tensor *tensor, bool requires_grad);
TBDEF bool tb_requires_grad(const tb_tensor *tensor);
/* dst takes value's value in place (LTC's SetInPlaceIrValue): dst keeps its handle, and what
   was recorded from dst before still reads the old value. Shapes (dtype included) and devices
   must be equal. dst keeps its requires_grad and becomes a leaf holding the new value: no
   gradient flows through an assignment into it (an optimizer's update is not history, and
   state computed from gradients does not keep earlier steps alive). The old value's buffer is freed
   when nothing reads it any more. Buffer donation: when dst is synced and that sync is the last
   reader of the old value (no live tensor holds it, no pending graph left after the sync reads
   it), a compiled backend (opencl, native) computes the new value into the old value's buffer
   wherever its kernel reads the old value only at the element it writes, so an update in
   place needs no second copy (counted in the metric DonatedBuffers). A tensor you still hold
   that was computed from the old value and is not synced with dst keeps the old buffer apart.
   Gradients (tb_grad) through a history that read the overwritten value then fail with
   TB_ERR_INVALID_ARGUMENT, as PyTorch refuses a backward through a value modified in place. */
TBDEF tb_status tb_assign(tb_tensor *dst, tb_tensor *value);

/* ---- composite ops (recorded as built-in ops; differentiable) ---- */

/* torch.Tensor.scatter_add: x plus, for each element of src (index's dims, index of x's rank),
   src added at x's position with `dim` replaced by index's value. Indices outside
   [0, x.dims[dim]) add nothing. index.dims[d] <= x.dims[d] for d != dim. */
TBDEF tb_tensor *tb_scatter_add(tb_tensor *x, int32_t dim, tb_tensor *index, tb_tensor *src);
/* torch.Tensor.index_add: x plus src's slices along dim added at the positions index (1-D)
   names; src has x's dims except dims[dim] = index's length. */
TBDEF tb_tensor *tb_index_add(tb_tensor *x, int32_t dim, tb_tensor *index, tb_tensor *src);
