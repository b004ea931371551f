/* ===========================================================================================
   Optimizers: torch.optim's SGD, Adam and AdamW as lazy updates. A step records the update of
   every parameter and its state from the gradients, assigns the results in place (tb_assign)
   and runs them in one graph with the forward and backward passes the gradients come from.
   Hyperparameters and the step count enter the graph as scalar parameters, so a changed
   learning rate (a schedule) never compiles a new graph.
   =========================================================================================== */

typedef enum tb_optimizer_kind { TB_SGD = 1, TB_ADAM = 2, TB_ADAMW = 3 } tb_optimizer_kind;

/* PyTorch's arguments of the same names. Start from tb_sgd_desc / tb_adam_desc /
   tb_adamw_desc, which set PyTorch's defaults, and change what you need. */
typedef struct tb_optimizer_desc {
    tb_optimizer_kind kind;
    double lr;           /* learning rate (> 0) */
    double momentum;     /* SGD: 0 (plain SGD) or in (0, 1] */
    double dampening;    /* SGD */
    bool nesterov;       /* SGD: needs momentum > 0 and dampening 0 */
    double beta1, beta2; /* Adam, AdamW: in [0, 1) */
    double eps;          /* Adam, AdamW: > 0 */
    double weight_decay; /* SGD, Adam: added to the gradient (L2); AdamW: decoupled */
    bool maximize;       /* ascend instead of descend */
} tb_optimizer_desc;

/* SGD(lr, momentum=0, dampening=0, weight_decay=0, nesterov=False) */
TBDEF tb_optimizer_desc tb_sgd_desc(double lr);
/* Adam(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0) */
TBDEF tb_optimizer_desc tb_adam_desc(double lr);
/* AdamW(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01) */
TBDEF tb_optimizer_desc tb_adamw_desc(double lr);

typedef struct tb_optimizer tb_optimizer;

/* An optimizer over `n` parameters (floating-point tensors; it holds a reference to each and
   updates them in place). Parameters may live on different devices; each one's state lives
   with it. The desc is checked here (TB_ERR_INVALID_ARGUMENT names the bad field). */
TBDEF tb_optimizer *tb_optimizer_new(const tb_optimizer_desc *desc, tb_tensor *const *params,
                                     size_t n);
/* One step: grads[i] is the gradient of params[i] (its shape, dtype and device), or NULL to
   leave that parameter and its state alone this step (PyTorch's grad None). The updated
   parameters and state are computed in one tb_sync, together with the `num_also` tensors of
   `also` (the loss, an accuracy: whatever the caller wants from the same graph; they are
   synced in place as tb_sync does). Before anything is assigned the step checks its
   arguments; when the sync fails (the device ran out of memory, say) every parameter and state
   keeps its old value and the step count does not advance. With `check_finite`
   (tb_optimizer_set_check_finite) a step whose `also` tensors or gradients hold a NaN or an
   infinity is refused with TB_ERR_EXECUTE naming the first one, and nothing is updated. */
TBDEF tb_status tb_optimizer_step(tb_optimizer *opt, tb_tensor *const *grads,
                                  tb_tensor *const *also, size_t num_also);
/* Refuse steps whose loss or gradients are not finite (off by default; it costs one small
   reduction per step and a read of its result). */
TBDEF tb_status tb_optimizer_set_check_finite(tb_optimizer *opt, bool on);
/* Changes the learning rate for later steps (a schedule); no recompilation. */
TBDEF tb_status tb_optimizer_set_lr(tb_optimizer *opt, double lr);
TBDEF double tb_optimizer_lr(const tb_optimizer *opt);
/* Steps taken so far (Adam's bias correction uses it). */
TBDEF int64_t tb_optimizer_steps(const tb_optimizer *opt);
/* The optimizer's state, for resuming training (torch.optim's state_dict): its entries are
   added to `set` (the model's parameters may be in it too; tb_safetensors_save writes both):
   "<prefix>state.<i>.momentum_buffer" (SGD with momentum), "<prefix>state.<i>.exp_avg" and
   "<prefix>state.<i>.exp_avg_sq" (Adam, AdamW) of parameter i's shape and dtype,
   "<prefix>state.<i>.step" (i64 scalar), and the metadata "<prefix>kind" ("sgd", "adam",
   "adamw"), "<prefix>steps" (tb_optimizer_steps) and "<prefix>lr". The state tensors are
   snapshots (later steps do not change them). prefix may be NULL (""). A name already in the
   set is TB_ERR_DUPLICATE and nothing is added. */
TBDEF tb_status tb_optimizer_state_save(const tb_optimizer *opt, tb_tensor_set *set,
                                        const char *prefix);
/* Restores what tb_optimizer_state_save wrote (read back from a file, on any device: tensors
   are moved to their parameter's device) into an optimizer of the same kind over parameters
   of the same shapes and dtypes. Every entry is checked before anything changes: a missing
   or mismatched entry or metadata value is an error naming it, and the optimizer keeps its
   state. The learning rate is restored too (set another one after, if a schedule wants). */
TBDEF tb_status tb_optimizer_state_load(tb_optimizer *opt, const tb_tensor_set *set,
                                        const char *prefix);
/* Frees the optimizer and its state; the parameters stay with their other owners. NULL is
   ignored. */
TBDEF void tb_optimizer_free(tb_optimizer *opt);

/* torch.nn.utils.clip_grad_norm_: scales the gradients in place (tb_assign) so that their
   global L2 norm is at most max_norm (factor min(1, max_norm / (norm + 1e-6))); NULL entries
   are skipped. *total_norm_out (may be NULL) gets the norm before clipping as a lazy f32 or
   f64 scalar tensor (f64 when any gradient is). Everything stays lazy: nothing syncs. */
TBDEF tb_status tb_clip_grad_norm(tb_tensor *const *grads, size_t n, double max_norm,
                                  tb_tensor **total_norm_out);
/* Gradient accumulation: acc[i] += grads[i] in place (tb_assign), for i with both non-NULL;
   acc[i] NULL takes a new reference to grads[i]. Zeroing is releasing: set acc[i] to NULL. */
TBDEF tb_status tb_accumulate_grads(tb_tensor **acc, tb_tensor *const *grads, size_t n);
