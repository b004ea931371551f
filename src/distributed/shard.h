/* ===========================================================================================
   Sharded tensors: one logical tensor over several devices of this process, placed as
   PyTorch's DTensor places it on a one-dimensional mesh: split along an axis (TB_SHARD), a whole
   copy on every device (TB_REPLICATE), or a partial value on every device whose elementwise sum
   is the tensor (TB_PARTIAL: a gradient summed over the devices, a sum over a sharded axis
   before its all-reduce). Ops run per shard (tb_sharded_unary, tb_sharded_binary,
   tb_sharded_map), lazily like every op; a reduction over the sharded axis and a change of
   placement are the collectives (partial to replicate: all-reduce; shard to replicate:
   all-gather; partial to shard: reduce-scatter) between the devices. A collective syncs the
   shards it moves (one tb_sync over every device, so the graphs below it run once each), then
   moves them with tb_to_device (one copy where either side keeps its values in host memory,
   else through one host array the library keeps) and combines them lazily on the receiving
   device: the sums are computed on the first device in shard order and copied to the others,
   so that every replica holds the same bits. A sharded tensor's shards stay the same handles
   once it is made (an optimizer may update their values in place), and it may be read from
   several threads; calls that sync follow tb_sync's rules.
   =========================================================================================== */

typedef enum tb_placement {
    TB_SHARD = 0, /* split along an axis: shard i is rows [lo_i, hi_i) of that axis */
    TB_REPLICATE, /* the whole tensor on every device */
    TB_PARTIAL,   /* every device a tensor of the whole shape; the value is their sum */
    TB_PLACEMENT_COUNT
} tb_placement;

/* "shard", "replicate", "partial"; "invalid" for anything else. */
TBDEF const char *tb_placement_name(tb_placement placement);

typedef struct tb_sharded tb_sharded;

/* x over `count` devices (1..TB_MAX_SHARDS; a device may appear more than once). TB_SHARD
   splits along `axis` (negative counts from the end) as numpy.array_split does: the first
   (d % count) shards get one row more, and a shard may be empty when d < count. TB_REPLICATE
   copies x to every device, a handle of its own on each (on x's own device sharing x's value),
   so that replicas can each require grad or be updated in place; TB_PARTIAL puts x on the
   first device and zeros on the others (DTensor's rule). A pending x is synced once first. `axis`
   is read only for TB_SHARD. x stays the caller's. NULL on error: NULL arguments, count 0 or above
   TB_MAX_SHARDS (TB_ERR_INVALID_ARGUMENT), a bad axis (TB_ERR_SHAPE), an unknown device, a failed
   sync or copy (their errors). */
#define TB_MAX_SHARDS 64
TBDEF tb_sharded *tb_distribute(tb_tensor *x, const tb_device *devices, size_t count,
                                tb_placement placement, int32_t axis);
/* A sharded tensor of per-device tensors the caller already has (each is retained; the caller
   keeps its references). TB_SHARD: the same dtype and rank, equal dims but along `axis`;
   TB_REPLICATE and TB_PARTIAL: equal shapes (TB_ERR_SHAPE names the first that differs). */
TBDEF tb_sharded *tb_sharded_from_tensors(tb_tensor *const *tensors, size_t count,
                                          tb_placement placement, int32_t axis);
/* Frees a sharded tensor and its references to its shards (NULL is ignored). A sharded tensor
   is the caller's whatever scope is open (tb_scope_begin): scopes own tensor handles, and the
   shards a sharded tensor holds are its own; tensors the functions below return (the whole
   tensor of tb_sharded_to_tensor) go to the open scope like any returned handle. */
TBDEF void tb_sharded_release(tb_sharded *s);

TBDEF size_t tb_sharded_count(const tb_sharded *s);           /* 0 for NULL */
TBDEF tb_placement tb_sharded_placement(const tb_sharded *s); /* TB_PLACEMENT_COUNT for NULL */
/* the sharded axis (non-negative) for TB_SHARD, -1 otherwise and for NULL */
TBDEF int32_t tb_sharded_axis(const tb_sharded *s);
/* the whole tensor's shape (TB_SHARD: the shards' dims summed along the axis) */
TBDEF tb_shape tb_sharded_shape(const tb_sharded *s);
/* Shard i (borrowed: valid while s lives; tb_tensor_retain to keep it); NULL out of range. */
TBDEF tb_tensor *tb_sharded_shard(const tb_sharded *s, size_t i);

/* The whole tensor on `device` (NULL: the first shard's): the shards concatenated (TB_SHARD),
   a replica (TB_REPLICATE: the one already there, else a copy of the first), or the partial
   values summed in shard order (TB_PARTIAL). */
TBDEF tb_tensor *tb_sharded_to_tensor(tb_sharded *s, const tb_device *device);
/* The same tensor placed anew on the same devices (`axis` read only for TB_SHARD): partial to
   replicate is an all-reduce (sum), partial to shard a reduce-scatter, shard to replicate an
   all-gather, shard to shard along another axis an all-to-all, replicate to shard a local slice
   (no data moves), replicate or shard to partial keeps the values on the first device and
   zeros elsewhere. The same placement gives a new reference to the same shards. */
TBDEF tb_sharded *tb_sharded_redistribute(tb_sharded *s, tb_placement placement, int32_t axis);
/* The shards taken as one value per device (equal shapes: TB_ERR_SHAPE otherwise), reduced
   elementwise over the devices with `op` (MEAN: the sum over the count; integer MEAN is
   TB_ERR_DTYPE), the result on every device (TB_REPLICATE): torch.distributed.all_reduce with
   a device for a rank. A TB_PARTIAL tensor's SUM is its redistribution to TB_REPLICATE. */
TBDEF tb_sharded *tb_sharded_all_reduce(tb_sharded *s, tb_reduce_op op);
/* Several at once: one sync per device for every input's shards, one for the sums. out may be
   in (it is written once every input was read); out[i] is NULL for every i on error. */
TBDEF tb_status tb_sharded_all_reduce_many(tb_sharded *const *in, size_t n, tb_reduce_op op,
                                           tb_sharded **out);

/* ---- ops per shard (lazy; nothing moves unless said) ---- */

/* op(shard) on every shard; the placement stays. op must keep each shard's dims and device (an
   elementwise op, a cast): anything else is TB_ERR_SHAPE (tb_sharded_map takes it). TB_PARTIAL
   is refused unless op is tb_neg: a sum of partial values only commutes with linear ops. */
TBDEF tb_sharded *tb_sharded_unary(tb_tensor *(*op)(tb_tensor *), tb_sharded *x);
/* op(a_i, b_i) shard by shard, for any binary op of the library (tb_add, tb_mul, tb_maximum,
   ...) or of the caller, broadcasting as op does. Placements: shard with shard (the same
   axis, devices and split), shard with replicate (the replica is sliced to each shard's rows
   where its broadcast dims reach the sharded axis with more than one row: a view, no data
   moves), replicate with replicate. The devices must match shard by shard. TB_PARTIAL operands
   are refused: redistribute first. */
TBDEF tb_sharded *tb_sharded_binary(tb_tensor *(*op)(tb_tensor *, tb_tensor *), tb_sharded *a,
                                    tb_sharded *b);
/* A matmul of sharded operands (PyTorch's matmul rules per shard): a sharded along a dim
   other than its last (rows, a batch dim) times a replicated b gives a's sharding; a
   replicated a times b sharded along its last dim gives the columns sharded; a sharded along
   its last dim (the contracted one) times b sharded along the contracted dim gives TB_PARTIAL
   (redistribute it to TB_REPLICATE to all-reduce it); replicate times
   replicate gives replicate. Other combinations: TB_ERR_UNSUPPORTED naming both placements. */
TBDEF tb_sharded *tb_sharded_matmul(tb_sharded *a, tb_sharded *b);
/* Reductions as tb_sum/tb_mean/tb_max/tb_min per shard; one over the sharded axis finishes with
   the all-reduce across the devices (TB_REPLICATE result): a sum of shards, the mean over the
   whole axis, the max or min of the shards' maxima or minima. Reducing other axes keeps the
   sharding (the axis renumbered when keepdim is false). f16 and bf16 sums and means over the
   sharded axis add in f32 and round once. A max or min over the sharded axis skips empty
   shards. A TB_PARTIAL sum or mean stays TB_PARTIAL (both are linear); its max or min, and any
   reduction of a partial bool tensor, are refused (redistribute first). */
TBDEF tb_sharded *tb_sharded_sum(tb_sharded *x, const int32_t *axes, size_t num_axes, bool keepdim);
TBDEF tb_sharded *tb_sharded_mean(tb_sharded *x, const int32_t *axes, size_t num_axes,
                                  bool keepdim);
TBDEF tb_sharded *tb_sharded_max(tb_sharded *x, const int32_t *axes, size_t num_axes, bool keepdim);
TBDEF tb_sharded *tb_sharded_min(tb_sharded *x, const int32_t *axes, size_t num_axes, bool keepdim);

/* Anything else, per shard: fn(user, shard i of every input, i) must return shard i of the
   result (a new reference, such as an op returns, on that shard's device, or NULL with an
   error set; the result keeps it whatever scope is open), which gets
   `placement` (and `axis` for TB_SHARD), checked as tb_sharded_from_tensors checks. Every input
   has the same count of shards; shards of sharded inputs are passed as they are and replicas
   whole, so fn sees what one device holds. */
typedef tb_tensor *(*tb_shard_fn)(void *user, tb_tensor *const *shards, size_t index);
TBDEF tb_sharded *tb_sharded_map(tb_sharded *const *inputs, size_t num_inputs, tb_shard_fn fn,
                                 void *user, tb_placement placement, int32_t axis);

/* Data parallelism's gradient: `loss` is TB_PARTIAL with one element per device (each device's
   share of the loss, computed from its shard of the batch) and params[j] TB_REPLICATE on the
   same devices (each replica requires grad); grads[j] is the gradient of the summed loss with
   respect to the replicated parameter, on every device (TB_REPLICATE): each device's tb_grad,
   then one all-reduce (sum) of them all, as DDP's buckets do. grads[j] is NULL where no
   device's loss depends on params[j] (tb_optimizer_step leaves such a parameter alone); a
   device whose loss does not while another's does contributes zeros. The `num_also` tensors of
   `also` (per-device values of equal shapes: the loss itself, a count of right answers) are summed
   in the same all-reduce into also_out (TB_REPLICATE), so that the sync that computes the gradients
   computes them too (num_also 0: also and also_out may be NULL; n 0: params and grads may be).
   grads may be params and also_out may be also: they are written last. On error grads and also_out
   are all NULL. */
TBDEF tb_status tb_sharded_grad(tb_sharded *loss, tb_sharded *const *params, size_t n,
                                tb_sharded **grads, tb_sharded *const *also, size_t num_also,
                                tb_sharded **also_out);
