/* ===========================================================================================
   Lazy tensors, ops, executor, metrics
   Ownership: every function that returns a tb_tensor * returns a new reference that the caller
   releases with tb_tensor_release (or leaves to a scope: tb_scope_begin). Tensors given as
   arguments are borrowed (never consumed). A function given a NULL tensor returns NULL and
   keeps the first error, so a chain of ops can be checked once at the end.
   =========================================================================================== */

/* ---- creation ---- */

/* A tensor holding a copy of the contiguous host array `data` (tb_shape_nbytes bytes) on
   `device` (NULL: the current device). The copy happens now. */
TBDEF tb_tensor *tb_tensor_from_host(const void *data, const tb_shape *shape,
                                     const tb_device *device);
/* Like tb_tensor_from_host, but on a device that keeps host memory (the cpu backend; native,
   for data aligned to 64 bytes) the tensor borrows `data` without copying: the caller keeps it
   alive and unchanged until the last reference to the tensor (and to tensors computed from it)
   is released. The library never writes into it (tb_assign gives the tensor a new buffer).
   Other devices, and unaligned data on native, copy. */
TBDEF tb_tensor *tb_tensor_from_host_borrowed(const void *data, const tb_shape *shape,
                                              const tb_device *device);
/* A rank-0 tensor whose value is a parameter of the graph (changing it does not recompile).
   Used as an operand it follows PyTorch's rules for wrapped numbers: it does not promote a
   tensor of the same category (f32 tensor + f64 scalar stays f32). */
TBDEF tb_tensor *tb_scalar_tensor(tb_scalar value, const tb_device *device);
TBDEF tb_tensor *tb_full(const tb_shape *shape, double value, const tb_device *device);
TBDEF tb_tensor *tb_zeros(const tb_shape *shape, const tb_device *device);
TBDEF tb_tensor *tb_ones(const tb_shape *shape, const tb_device *device);
/* [start, end) by step as PyTorch's arange; step 0 or a count that overflows is an error. */
TBDEF tb_tensor *tb_arange(double start, double end, double step, tb_dtype dtype,
                           const tb_device *device);
/* n x m identity (m = n when m < 0). */
TBDEF tb_tensor *tb_eye(int64_t n, int64_t m, tb_dtype dtype, const tb_device *device);
/* Uniform [0, 1) and standard normal, f32 or f64, from the Philox 4x32-10 stream of the current
   seed (tb_manual_seed; 67280421310721, PyTorch's default, until then). Every backend gives the
   same values for the same seed, call order and shape. The algorithm, exactly:
   each call takes the global offset and advances it by ceil(numel / 2). block(c) is the four
   32-bit words w[0..3] of Random123's philox4x32_10 with counter (c mod 2^64 low word, high
   word, 0, 0) and key (seed low word, seed high word); U53(a, b) = ((a << 21) | (b >> 11)) * 2^-53
   (64-bit integer, then exact scaling, in double). For element i in row-major order:
     rand f32:  value = (float)(block(offset + i/4)[i % 4] >> 8) * 2^-24
     rand f64:  w = block(offset + i/2); value = U53(w[2*(i%2)], w[2*(i%2) + 1])
     randn:     w = block(offset + i/2); u1 = U53(w[0], w[1]); u2 = U53(w[2], w[3]);
                r = sqrt(-2.0 * log(1.0 - u1)); t = 6.283185307179586 * u2;
                value = (i even ? r * cos(t) : r * sin(t)), computed in double, then rounded to
                the dtype (also for f32).
   rand is integer arithmetic and exact scaling: every backend gives identical bits. randn needs
   double precision (a device without fp64 runs it on the reference backend) and its bits agree
   with the host's wherever the device's log, cos and sin agree with the C library's: always for
   the correctly rounded steps, and for f32 results unless a double lands within one ulp of an
   f32 rounding boundary. */
TBDEF tb_tensor *tb_rand(const tb_shape *shape, const tb_device *device);
TBDEF tb_tensor *tb_randn(const tb_shape *shape, const tb_device *device);
/* Sets the seed and resets the offset to 0; calls every registered backend's set_rng_seed
   (a backend registered later is not called). All or nothing: on an error (memory ran out
   while the library or its built-in backends were set up) neither the seed nor any backend
   changed. tb_shutdown restores the default seed. Thread-safe. */
TBDEF tb_status tb_manual_seed(uint64_t seed);

/* ---- handles ----
   A tensor holds either a pending graph (its IR node) or a materialised value (backend data);
   a sync turns the first into the second. A tensor may be read from several threads; recording
   ops on it or syncing it from several threads at once needs the caller's lock. */
/* Adds a reference and returns its argument (NULL is returned as is). Thread-safe. */
TBDEF tb_tensor *tb_tensor_retain(tb_tensor *tensor);
/* Drops a reference; the last one frees the tensor. NULL is ignored. Thread-safe. */
TBDEF void tb_tensor_release(tb_tensor *tensor);
/* The shape and device (never syncs). NULL tensor: a zero shape / zero device. */
TBDEF tb_shape tb_tensor_shape(const tb_tensor *tensor);
TBDEF tb_device tb_tensor_device(const tb_tensor *tensor);
/* The pending IR node (NULL once the value is materialised and no graph is pending). */
TBDEF const tb_node *tb_tensor_node(const tb_tensor *tensor);
/* The backend data holding the value, syncing first if needed. Borrowed: valid while the
   tensor lives. NULL on error. */
TBDEF tb_backend_data *tb_tensor_data(tb_tensor *tensor);
/* Copies the value to the contiguous host array `dst` of `size` bytes, which must be exactly
   tb_shape_nbytes ("tb_tensor_to_host: size is 10 bytes but f32[2,3] needs 24"). Syncs the
   tensor first if its value is pending; a failed sync leaves the graph pending. */
TBDEF tb_status tb_tensor_to_host(tb_tensor *tensor, void *dst, size_t size);
/* A new tensor with the same value on `device` (NULL: the current device): syncs, then copies
   through the host. On the tensor's own device the new tensor shares the value. */
TBDEF tb_tensor *tb_to_device(tb_tensor *tensor, const tb_device *device);
/* The value of a one-element tensor as a double (syncs). TB_ERR_SHAPE for other sizes. */
TBDEF tb_status tb_tensor_item(tb_tensor *tensor, double *out);

/* ---- scopes ----
   A scope owns the tensors made while it is open, so that code with many intermediate results
   (a model's forward pass) needs no release for each: tb_scope_end releases them, except those
   passed to tb_scope_keep (TensorFlow.js's tidy and keep; an autorelease pool).

       tb_scope_begin();
       tb_tensor *h = tb_relu(tb_add(tb_matmul(x, w1), b1));
       tb_tensor *y = tb_scope_keep(tb_softmax(tb_matmul(h, w2), -1));
       tb_scope_end();          (releases both matmuls, the add and h; y stays pending)
       ...
       tb_tensor_release(y);    (kept out of every scope: the caller's)

   What a scope owns: the reference that comes with every tensor handle a function returns on
   the calling thread while the scope is that thread's innermost one (ops, creation, transfers,
   loads, tb_detach, tb_grad's gradients, ...). Not the tensors made before it opened, nor
   those a library object keeps for itself (an optimizer's state, a loaded tensor set's
   tensors), nor the references tb_accumulate_grads stores in its acc array (the caller's, like
   acc). tb_dropout when not training hands back its input: that reference goes to the
   calling thread's scope that owns the input, or to the innermost scope when no scope does.
   The scope owns that one reference and nothing else, so:
   - tb_tensor_retain on a handle gives you a reference of your own: tb_scope_end drops only
     the scope's, and the tensor lives until you release yours.
   - Releasing a handle yourself inside its scope is allowed: when that frees the tensor (no
     other reference is left) the scope forgets it; nothing is released twice. A release while
     references other than the scope's remain drops one of those (one you retained). So do not
     release a handle after giving it to something that keeps a reference of its own
     (tb_tensor_set_add): the scope still drops its reference at the end; leave it to the
     scope, or keep the handle and release it after the end.
   A pending tensor released by a scope stays in the graphs of the tensors computed from it
   (IR nodes are counted apart), so kept results still compute after tb_scope_end.
   Threads: each thread has its own scopes, and a scope only owns handles returned on its
   thread. A handle may still be used or released on any thread, as any handle; releasing a
   scope's handle on one thread while another ends that scope is a race as any double release
   is. A thread that exits with scopes open leaves them (and their references) to tb_shutdown.
   tb_shutdown ends every scope still open on every thread, innermost first, releasing their
   references as tb_scope_end would (other references to those tensors become invalid as any
   live tensor does); afterwards no thread has a scope open. */

/* Opens a scope on the calling thread, nested in the thread's innermost open scope if any.
   TB_ERR_OUT_OF_MEMORY when its record cannot be allocated: then no scope is opened (and no
   tb_scope_end is due). Thread-safe: it touches the calling thread's scopes only. */
TBDEF tb_status tb_scope_begin(void);
/* Closes the calling thread's innermost scope: drops its reference to every tensor it owns
   (not kept, not freed by a release of its user), then the enclosing scope is innermost again.
   TB_ERR_STATE when no scope is open on this thread ("tb_scope_end: no scope is open on this
   thread (tb_scope_begin opens one)"); on success an earlier error stays as it was.
   Thread-safe: it touches the calling thread's scopes only. */
TBDEF tb_status tb_scope_end(void);
/* Makes `tensor` survive the calling thread's innermost scope: when that scope owns it, the
   references it owns move to the enclosing scope, or to the caller (who then releases them)
   when there is none. A tensor the innermost scope does not own (made outside it, already
   kept, another thread's), or no scope open: nothing changes. Returns `tensor`. NULL: returns
   NULL and keeps the first error (TB_ERR_INVALID_ARGUMENT when there was none), so
   tb_scope_keep(op(...)) is checked once with the rest. Thread-safe. */
TBDEF tb_tensor *tb_scope_keep(tb_tensor *tensor);

/* ---- executor ----
   A graph's computation is cached under a structural hash: ops, attributes, shapes, how the
   nodes connect (x + x differs from x + y) and which leaves are parameters. Data and scalar
   values are parameters, so a step repeated with new values compiles once (UncachedCompile 1,
   CachedCompile for the rest). A node the backend does not support (supports_node) runs on the
   reference interpreter first, its operands synced as a graph of their own, and enters the
   graph as a parameter (counter Fallback::<op>); a collective (tb_all_reduce, ...) runs the
   same way on the host through its process group (counter CollectiveOnHost). Recording an op whose
   pending graph then computes more than desc.max_graph_nodes nodes syncs that tensor at once;
   graphs that reuse subgraphs heavily may be synced from half that size. Where the flush's
   cheap bound on a graph's size passes the limit, it counts the graph's nodes in a walk
   (counter FlushCountWalks): ops on a graph that is far below the limit do not. On any error the
   tensors keep their pending graphs and nothing leaks. TB_DEBUG=1 logs one line per graph run:
   "graph <hash> nodes=N params=P results=R device=D cache=hit|miss compile=Xms run=Yms"; TB_DEBUG=3
   also logs the IR before compiling. */

/* Runs the pending graphs of these tensors as ONE computation on their device (LTC
   SyncTensorsGraph): collect the distinct pending nodes, walk them in post-order (iteratively:
   graphs of any depth), hash, look up the LRU computation cache (desc.cache_size entries),
   lower and compile on a miss, execute, and give each tensor its value. Tensors without a
   pending graph are skipped; all pending ones must be on one device ("tb_sync: tensors on
   cpu:0 and opencl:0 cannot be one graph"). Not thread-safe with other calls on the same
   tensors. */
TBDEF tb_status tb_sync(tb_tensor *const *tensors, size_t count);
/* LTC MarkStep: syncs every live tensor that has a pending graph, one graph per device, and
   counts MarkStep. Returns the first error (the other devices still run). Call it while no
   other thread records ops or syncs. */
TBDEF tb_status tb_mark_step(void);
/* Drops every cached computation (backends release them once no sync uses them). Thread-safe. */
TBDEF void tb_computation_cache_clear(void);
/* The computations in the cache. Thread-safe. */
TBDEF size_t tb_computation_cache_size(void);

/* ---- functions ----
   A function is a pending graph recorded once as a function of some of its tensors, its inputs,
   and replayed on new inputs: tb_function_call makes the same nodes over the new inputs in one
   call, without the op calls, their checks and their shape inference (what torch.jit.trace does
   for a model, done here for the lazy graph). A forward pass that runs many times with inputs of
   one shape records its ops once and then costs one call to rebuild its graph. What the graph
   computes from anything other than the inputs (parameters, constants, subgraphs that read no
   input) is shared: the function keeps a reference to those nodes, every call's graph uses
   them, and a sync still computes them as part of that graph (sync them first to compute them
   once).

       tb_tensor *y = tb_relu(tb_matmul(x, w));          (pending)
       tb_function *f = tb_function_create(&x, 1, &y, 1);
       tb_tensor *y2;
       tb_function_call(f, &x2, 1, &y2, 1);             (y2: relu(x2 @ w), pending)
       tb_function_release(f);

   Calls are as the op calls they stand for: the outputs are new pending tensors (owned by the
   calling thread's innermost scope, if any) with the flags the recorded ones had, gradients flow
   through them (an input that requires grad makes the outputs require it), the backend sees
   each node made (on_node_created), a graph that grows past desc.max_graph_nodes is flushed
   where the ops would flush it, and the executor's cache serves the call's graph once it has
   compiled it. A function holds no tensor and no value of its inputs; it is immutable, so calls
   may run on several threads at once. Their graphs share the nodes that read no input: syncing
   two calls' outputs on two threads at once is safe unless such a shared node runs through the
   eager fallback (a node the backend does not support), which stores its value in the node.
   What a function records is the graph as it stands at tb_function_create: record it right
   after the ops. A sync between the inputs and the outputs (a tb_sync of an intermediate, the
   automatic flush of a graph past desc.max_graph_nodes) cuts the graph there, and what it
   computed becomes a shared value; tb_set_requires_grad or tb_assign on an input after the
   outputs read it gives the input a new node that those outputs do not read. (A sync of an
   input itself is recognised: its old node stands for it.) Release functions before
   tb_shutdown, as tensors. */
typedef struct tb_function tb_function;
/* Records the pending graphs of `outputs` as a function of `inputs` (NULL: no inputs when
   num_inputs is 0). Inputs are any tensors, pending or not, each at most once; the graph is cut
   at them. Every output must have a pending graph, and none may be an input itself
   (TB_ERR_INVALID_ARGUMENT; a synced output is TB_ERR_STATE: record before syncing). A graph
   that draws random numbers (tb_rand, tb_randn, tb_dropout when training) is TB_ERR_UNSUPPORTED
   (each call would draw the same numbers again), and so is a collective (ranks record theirs
   with the ops, in step). Inputs the outputs do not read are allowed (a call checks them and
   ignores them). NULL on error; nothing the arguments hold changes. Release with
   tb_function_release. */
TBDEF tb_function *tb_function_create(tb_tensor *const *inputs, size_t num_inputs,
                                      tb_tensor *const *outputs, size_t num_outputs);
/* Makes the recorded graph over new inputs and writes one new tensor per output. The counts
   must be the function's (TB_ERR_INVALID_ARGUMENT), and each input must have the recorded
   input's dtype (TB_ERR_DTYPE), dims (TB_ERR_SHAPE) and device (TB_ERR_INVALID_ARGUMENT). The
   same tensor may be given as several inputs. On error every outputs[i] is NULL and nothing
   leaks. */
TBDEF tb_status tb_function_call(const tb_function *fn, tb_tensor *const *inputs, size_t num_inputs,
                                 tb_tensor **outputs, size_t num_outputs);
/* The number of inputs and of outputs (0 for NULL), and of the nodes a call makes (one for
   each node that reads an input, and one for each output that reads none). */
TBDEF size_t tb_function_num_inputs(const tb_function *fn);
TBDEF size_t tb_function_num_outputs(const tb_function *fn);
TBDEF size_t tb_function_num_nodes(const tb_function *fn);
/* Frees the function and drops its references to the shared nodes. NULL is ignored. */
TBDEF void tb_function_release(tb_function *fn);

/* ---- dumps (free the strings with tb_free; NULL on error) ----
   The graph behind the tensors (their pending graphs, or their values as device data), never
   syncing. Nodes are numbered in post-order. */
/* One line per node:
       %0 = device_data f32[2,3] (param 0)
       %1 = scalar f32[] (param 1, value 2)
       %2 = mul(%0, %1) f32[2,3] (result 0)
       %3 = sum(%2) f32[] attrs=[3, 0] (result 1)
   "(result i)" marks the node of tensors[i] (a node may carry several); values computed by
   the eager fallback or saved by tb_sync_for_grad show as "(param i, computed apart)". The
   tensors may be on different devices. */
TBDEF char *tb_ir_text(tb_tensor *const *tensors, size_t count);
/* Graphviz DOT of the same graph: one box per node labelled with its number, op and shape,
   an edge per operand (fused kernels as clusters where a backend groups nodes). */
TBDEF char *tb_ir_dot(tb_tensor *const *tensors, size_t count);
/* The backend's own text of the computation a sync of these tensors would run (e.g. OpenCL C),
   "" for a backend without one or when nothing is pending. Compiles it into the computation
   cache if needed; executes nothing (nodes the backend does not support count as parameters,
   as they will after the eager fallback). */
TBDEF char *tb_ir_backend_text(tb_tensor *const *tensors, size_t count);

/* ---- metrics (LTC names) ----
   Counters: CachedCompile, UncachedCompile, MarkStep, CreateDataHandles, Fallback::<op>, and any a
   backend adds. Timings (ns): CompileTime, ExecuteTime, TransferToDeviceTime,
   TransferFromDeviceTime. Sizes: TensorsGraphSize (nodes per synced graph). Thread-safe. */
/* The report in LTC's format, metrics then counters, each sorted by name:
       Metric: CompileTime
         TotalSamples: 2
         Accumulator: 12.345ms
         Mean: 6.173ms
         Min: 1.000ms
         Max: 11.345ms
         Percentiles: 1%=1.000ms; 5%=1.000ms; ...; 99%=11.345ms
       Counter: CachedCompile
         Value: 99
   Metrics whose names end in "Time" hold nanoseconds and show with units (ns, us, ms, s); the
   percentiles are over the latest 64 samples. Free with tb_free. */
TBDEF char *tb_metrics_report(void);
/* A counter's value, or for a metric its number of samples; 0 if it never fired. */
TBDEF int64_t tb_metrics_counter(const char *name);
/* A metric's sum of samples (ns for times), or a counter's value; 0 if it never fired. */
TBDEF double tb_metrics_total(const char *name);
/* Forgets every counter and metric. */
TBDEF void tb_metrics_reset(void);
/* Adds to a counter (for backends). Names are 1..255 bytes. */
TBDEF void tb_metrics_add(const char *name, int64_t delta);
/* Records a sample of a metric (for backends); NaN is refused. */
TBDEF void tb_metrics_sample(const char *name, double value);

/* ---- ops ----
   Each records a node and returns a new tensor; nothing is computed until a sync. Operands must
   be on the same device (rank-0 tensors from tb_scalar_tensor excepted). Errors name the op and the
   shapes. */

/* unary (float ops on integer inputs compute in f32, as PyTorch) */
TBDEF tb_tensor *tb_neg(tb_tensor *x);
TBDEF tb_tensor *tb_abs(tb_tensor *x);
TBDEF tb_tensor *tb_exp(tb_tensor *x);
TBDEF tb_tensor *tb_log(tb_tensor *x);
TBDEF tb_tensor *tb_sqrt(tb_tensor *x);
TBDEF tb_tensor *tb_rsqrt(tb_tensor *x);
TBDEF tb_tensor *tb_sin(tb_tensor *x);
TBDEF tb_tensor *tb_cos(tb_tensor *x);
TBDEF tb_tensor *tb_tanh(tb_tensor *x);
TBDEF tb_tensor *tb_sigmoid(tb_tensor *x);
TBDEF tb_tensor *tb_relu(tb_tensor *x);
TBDEF tb_tensor *tb_gelu(tb_tensor *x); /* the exact (erf) form */
TBDEF tb_tensor *tb_erf(tb_tensor *x);  /* the error function */
TBDEF tb_tensor *tb_silu(tb_tensor *x);
/* PyTorch's softplus with its defaults (beta 1, threshold 20): log(1 + exp(x)), x above 20;
   and mish, x tanh(log(1 + exp(x))). Float dtypes only (TB_ERR_DTYPE), as PyTorch. */
TBDEF tb_tensor *tb_softplus(tb_tensor *x);
TBDEF tb_tensor *tb_mish(tb_tensor *x);
TBDEF tb_tensor *tb_reciprocal(tb_tensor *x);
TBDEF tb_tensor *tb_floor(tb_tensor *x);
TBDEF tb_tensor *tb_ceil(tb_tensor *x);
TBDEF tb_tensor *tb_round(tb_tensor *x); /* half to even, as PyTorch */
TBDEF tb_tensor *tb_sign(tb_tensor *x);
TBDEF tb_tensor *tb_logical_not(tb_tensor *x);
TBDEF tb_tensor *tb_cast(tb_tensor *x, tb_dtype dtype);

/* binary, with broadcasting and PyTorch's type promotion (div of integers gives f32;
   comparisons and logical ops give bool) */
TBDEF tb_tensor *tb_add(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_sub(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_mul(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_div(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_pow(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_maximum(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_minimum(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_eq(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_ne(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_lt(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_le(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_gt(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_ge(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_logical_and(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_logical_or(tb_tensor *a, tb_tensor *b);
/* with a host number (a SCALAR parameter: new values do not recompile) */
TBDEF tb_tensor *tb_add_scalar(tb_tensor *a, double b);
TBDEF tb_tensor *tb_sub_scalar(tb_tensor *a, double b);
TBDEF tb_tensor *tb_mul_scalar(tb_tensor *a, double b);
TBDEF tb_tensor *tb_div_scalar(tb_tensor *a, double b);
TBDEF tb_tensor *tb_pow_scalar(tb_tensor *a, double b);
/* cond ? a : b, broadcasting all three; cond must be bool */
TBDEF tb_tensor *tb_where(tb_tensor *cond, tb_tensor *a, tb_tensor *b);
/* min(max(x, lo), hi) with host bounds (parameters) */
TBDEF tb_tensor *tb_clamp(tb_tensor *x, double lo, double hi);

/* reductions over `axes` (negative counts from the end; num_axes 0: all axes) */
TBDEF tb_tensor *tb_sum(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim);
TBDEF tb_tensor *tb_mean(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim);
TBDEF tb_tensor *tb_max(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim);
TBDEF tb_tensor *tb_min(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim);
TBDEF tb_tensor *tb_prod(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim);
/* index (i64) of the first max/min along `axis`; of the flattened tensor when flatten is true */
TBDEF tb_tensor *tb_argmax(tb_tensor *x, int32_t axis, bool keepdim);
TBDEF tb_tensor *tb_argmin(tb_tensor *x, int32_t axis, bool keepdim);

/* PyTorch's matmul: 1-D x 1-D dot, 2-D x 2-D, 1-D promoted and removed, batched with
   broadcasting of the batch dims */
TBDEF tb_tensor *tb_matmul(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_softmax(tb_tensor *x, int32_t axis);
TBDEF tb_tensor *tb_log_softmax(tb_tensor *x, int32_t axis);
/* over the last `normalized_ndim` dims; weight and bias may be NULL (else of those dims) */
TBDEF tb_tensor *tb_layer_norm(tb_tensor *x, int32_t normalized_ndim, tb_tensor *weight,
                               tb_tensor *bias, double eps);

/* movement (views: never copies) */
/* one dim may be -1 (inferred) */
TBDEF tb_tensor *tb_reshape(tb_tensor *x, const int64_t *dims, int32_t rank);
TBDEF tb_tensor *tb_permute(tb_tensor *x, const int32_t *perm, int32_t rank);
TBDEF tb_tensor *tb_transpose(tb_tensor *x, int32_t dim0, int32_t dim1);
/* dims of -1 keep the input's size; new leading dims may be added */
TBDEF tb_tensor *tb_expand(tb_tensor *x, const int64_t *dims, int32_t rank);
/* removes dim `dim` (must be size 1) */
TBDEF tb_tensor *tb_squeeze(tb_tensor *x, int32_t dim);
TBDEF tb_tensor *tb_unsqueeze(tb_tensor *x, int32_t dim);
/* Python slicing x[start:end:step] on `dim` (negative start/end count from the end and are
   clamped, step >= 1) */
TBDEF tb_tensor *tb_slice(tb_tensor *x, int32_t dim, int64_t start, int64_t end, int64_t step);
TBDEF tb_tensor *tb_flip(tb_tensor *x, const int32_t *dims, size_t num_dims);
/* Sliding windows over the last num_spatial (1..3) dims, as torch.Tensor.unfold along each of
   them at once: x [..., L_1, .., L_n] -> [..., O_1, .., O_n, K_1, .., K_n] with element
   [..., o, k] = x[..., o_i * stride_i + k_i * dilation_i] and O_i = (L_i - dilation_i * (K_i -
   1) - 1) / stride_i + 1 (no padding: tb_pad first). kernel is required; stride and dilation
   may be NULL (all 1). A view: a matmul or reduction reads the windows straight from x. */
TBDEF tb_tensor *tb_window(tb_tensor *x, size_t num_spatial, const int64_t *kernel,
                           const int64_t *stride, const int64_t *dilation);
/* copies (new arrays) */
TBDEF tb_tensor *tb_concat(tb_tensor *const *tensors, size_t count, int32_t dim);
/* torch.nn.functional.pad's constant mode: pads = (before_last, after_last, before_2nd_last, ...),
   2*num_dims values, non-negative */
TBDEF tb_tensor *tb_pad(tb_tensor *x, const int64_t *pads, size_t num_pads, double value);
/* torch.gather: index (i32/i64) of the same rank as x */
TBDEF tb_tensor *tb_gather(tb_tensor *x, int32_t dim, tb_tensor *index);
/* torch.index_select: index 1-D (i32/i64) */
TBDEF tb_tensor *tb_index_select(tb_tensor *x, int32_t dim, tb_tensor *index);

/* A custom op (tb_op_register) or any built-in by id with explicit attributes (not a leaf, not
   COLLECTIVE: TB_ERR_UNSUPPORTED). */
TBDEF tb_tensor *tb_call_op(tb_op op, tb_tensor *const *inputs, size_t num_inputs,
                            const int64_t *attrs, size_t num_attrs);
