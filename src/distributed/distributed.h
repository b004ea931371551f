/* ===========================================================================================
   Distribution: process groups by name (the `mpi` group built in) and collectives on tensors
   with torch.distributed's semantics. The collectives are lazy like every op: each one records
   a COLLECTIVE node (see ir.h) and returns its pending tensor on the input's device. When the
   graph runs (tb_sync, tb_tensor_to_host, an optimizer step) the executor computes the node's
   input, hands the values to the group from host memory, and puts the result back on the
   device, so that a training step's gradient all-reduce is part of the step's graph.
   =========================================================================================== */

typedef enum tb_reduce_op {
    TB_REDUCE_SUM = 0,
    TB_REDUCE_MEAN, /* the sum divided by the world size (floating dtypes) */
    TB_REDUCE_MAX,
    TB_REDUCE_MIN,
    TB_REDUCE_PRODUCT, /* on bool: logical and; SUM and MAX on bool are logical or */
    TB_REDUCE_OP_COUNT
} tb_reduce_op;

/* "sum", "mean", "max", "min", "product"; "invalid" for anything else. */
TBDEF const char *tb_reduce_op_name(tb_reduce_op op);

typedef struct tb_process_group tb_process_group;

/* What a process group provides: collectives on contiguous host arrays. Every entry is called
   on every rank in the same order with the same sizes (the library checks that first), from one
   thread at a time. Entries return TB_OK or an error set with tb_set_error. */
typedef struct tb_process_group_impl {
    void *user_data;
    /* Joins the group: this process's rank and the number of ranks. Called by the first
       tb_process_group_get of the group (again after a failure, and after tb_shutdown). */
    tb_status (*init)(void *user_data, int32_t *rank, int32_t *size);
    /* recv[i] = op over the ranks of send[i], for `count` values of `dtype` (f32 f64 i32 i64 u8;
       op is SUM MAX MIN or PRODUCT: the library does MEAN, maps bool to u8 and hands f16 and
       bf16 values over as f32). send and recv
       do not overlap. */
    tb_status (*all_reduce)(void *user_data, const void *send, void *recv, size_t count,
                            tb_dtype dtype, tb_reduce_op op);
    /* recv = every rank's `bytes` bytes of send, in rank order (size * bytes). */
    tb_status (*all_gather)(void *user_data, const void *send, void *recv, size_t bytes);
    /* recv = block `rank` (of `count` values) of the reduction of send (size * count values).
       Optional: NULL makes the library reduce everything with all_reduce and keep its block. */
    tb_status (*reduce_scatter)(void *user_data, const void *send, void *recv, size_t count,
                                tb_dtype dtype, tb_reduce_op op);
    /* every rank's buf = root's `bytes` bytes of buf. */
    tb_status (*broadcast)(void *user_data, void *buf, size_t bytes, int32_t root);
    tb_status (*barrier)(void *user_data);
    /* (optional) Leaves the group; called by tb_shutdown when init had succeeded. */
    void (*finalize)(void *user_data);
} tb_process_group_impl;

/* Registers a process group under `name` (1..TB_MAX_NAME bytes, [A-Za-z_][A-Za-z0-9_]*); the
   impl is copied. "mpi" is built in. Errors: NULL or a bad name, a missing entry
   (TB_ERR_INVALID_ARGUMENT), a name already registered (TB_ERR_DUPLICATE). Thread-safe. */
TBDEF tb_status tb_process_group_register(const char *name, const tb_process_group_impl *impl);
/* The group `name`, joined on first use (for "mpi": the MPI library is opened and initialised;
   it must run under the MPI launcher, e.g. `mpirun -np 2 ./prog`, or alone as a group of one).
   Owned by the library until tb_shutdown. NULL on failure: TB_ERR_NOT_FOUND for an unknown name
   (the message lists the registered ones), the init's error otherwise (for "mpi" without an MPI
   library: TB_ERR_UNAVAILABLE naming the libraries tried). Thread-safe. */
TBDEF tb_process_group *tb_process_group_get(const char *name);
/* The names of the registered groups, sorted, into names[0..cap) (borrowed); returns how many
   there are (which may exceed cap). */
TBDEF size_t tb_process_group_list(const char **names, size_t cap);
/* This process's rank, the number of ranks, the group's name; -1 / NULL for a NULL group. */
TBDEF int32_t tb_process_group_rank(const tb_process_group *group);
TBDEF int32_t tb_process_group_size(const tb_process_group *group);
TBDEF const char *tb_process_group_name(const tb_process_group *group);

/* ---- collectives: call them on every rank of the group, in the same order ----
   Each one records a node; it runs when a sync needs its value, and every rank must run its
   collectives in the same order: record them alike and sync them alike (the same tensors in
   the same order; a graph's collectives run in its post-order, which is the same on every
   rank for the same graph). Before each one runs the ranks exchange what they are about to do
   (collective, reduce op, dtype, shape, root, a sequence number) and whether they could compute
   its input; when the ranks disagree the sync fails on every rank with TB_ERR_STATE naming both
   sides ("tb_all_reduce: ... rank 0 called #3 all_reduce(sum) f32[10], rank 1 called #3
   broadcast(from 0) f32[10]; no data moved") and no data moves. When a rank could not compute
   the input (its graph failed), or failed earlier in the same sync, it still takes part in the
   exchange of the sync's next collective: its sync fails with its own error, the others' with
   TB_ERR_EXECUTE. A failed collective stays pending, like any node of a failed sync. Errors
   found while recording (NULL group or op/root out of range: TB_ERR_INVALID_ARGUMENT; MEAN of
   an integer: TB_ERR_DTYPE; a bad shape: TB_ERR_SHAPE; a NULL tensor: the first error kept)
   return NULL after this rank took part in an exchange at once, so that the other ranks'
   syncs of that collective fail too. Dtypes: all (f16 and bf16 reduce in f32 on the host and
   round once). tb_grad through all_reduce with SUM or MEAN gives the all_reduce (SUM, MEAN) of
   the gradient, recorded like any collective; other collectives on the path are
   TB_ERR_UNSUPPORTED. A rank that dies or stops calling: the mpi group waits at most
   TB_COLLECTIVE_TIMEOUT seconds (default 300) in any collective, the exchange included; then
   the sync fails with TB_ERR_EXECUTE naming the timeout, every later collective of the group
   fails at once with TB_ERR_STATE, and tb_shutdown leaves MPI_Finalize out (end the process;
   the launcher ends the job). Calls on one group are serialised by a lock, but every rank must
   make them in the same order. */

/* Every rank gets the elementwise reduction of every rank's `x` (same shape and dtype on every
   rank). MEAN on an integer or bool dtype is TB_ERR_DTYPE. */
TBDEF tb_tensor *tb_all_reduce(tb_process_group *group, tb_tensor *x, tb_reduce_op op);
/* Every rank's `x` concatenated along dim 0 in rank order: shape [size * d0, ...]; a rank-0 x
   gives [size]. */
TBDEF tb_tensor *tb_all_gather(tb_process_group *group, tb_tensor *x);
/* The reduction of every rank's `x`, split along dim 0 into `size` blocks; rank r gets block r:
   shape [d0 / size, ...]. d0 must be a multiple of the world size (TB_ERR_SHAPE otherwise) and
   x of rank >= 1. */
TBDEF tb_tensor *tb_reduce_scatter(tb_process_group *group, tb_tensor *x, tb_reduce_op op);
/* Every rank gets rank `root`'s `x` (each rank passes a tensor of the same shape and dtype; its
   values are used only on the root). */
TBDEF tb_tensor *tb_broadcast(tb_process_group *group, tb_tensor *x, int32_t root);
/* Returns once every rank has called it (eager: it runs no pending graph; a pending collective
   recorded before it still runs when its graph is synced). */
TBDEF tb_status tb_barrier(tb_process_group *group);
