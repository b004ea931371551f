/* ===========================================================================================
   IR: ops and nodes
   =========================================================================================== */

/* Op kinds, which say how a backend may lower an op. */
typedef enum tb_op_kind {
    TB_KIND_INVALID = -1, /* tb_op_get_kind of an unknown op */
    TB_KIND_LEAF = 0,     /* device data, scalars, generators (arange, eye, rand) */
    TB_KIND_UNARY,        /* elementwise, one operand */
    TB_KIND_BINARY,       /* elementwise with broadcasting, two operands */
    TB_KIND_TERNARY,      /* elementwise with broadcasting, three operands (where, clamp) */
    TB_KIND_REDUCE,       /* reduction over a set of axes */
    TB_KIND_MATMUL,       /* batched matrix product */
    TB_KIND_NORM,         /* softmax, log_softmax, layer_norm: reductions plus elementwise */
    TB_KIND_MOVEMENT,     /* a view: reshape, permute, expand, slice, flip (index arithmetic) */
    TB_KIND_OTHER,        /* concat, pad, gather, index_select, collective */
    TB_KIND_CUSTOM        /* registered by the user */
} tb_op_kind;

/* The built-in ops: X(ENUM, "name", kind, number of operands (-1: variable)).

   NORMAL FORM. The op functions (tb_add, tb_sum, tb_matmul, ...) apply PyTorch's rules (type
   promotion, broadcasting, negative axes, matmul's 1-D cases) and record nodes in the form
   below, inserting CAST, RESHAPE and EXPAND nodes where needed. Shape inference, and so
   tb_call_op, accepts only this form, so a backend may rely on it. T is the output dtype; every
   axis or dim attribute is already non-negative and below the operand's rank; bitmask bit i
   stands for axis i. Attributes are tb_node_attr (int64), fattrs are tb_node_fattr (double; 0
   unless listed). Values follow PyTorch (NaN propagates through MAX/MIN/MAXIMUM/MINIMUM/CLAMP,
   ARGMAX/ARGMIN treat NaN as the extreme, integer division by zero is the backend's matter).

   Leaves (never inferred: built by the creation functions only)
     DEVICE_DATA  no operands; the value is tb_node_data.
     SCALAR       rank 0; the value is tb_node_scalar, a graph parameter (never hashed).
     ARANGE       [n] of T (not bool); fattrs [start, step]; element i = start + i * step
                  (computed in double; for integer T start and step are whole numbers and the
                  element is computed in int64).
     EYE          [n, m] of any T; no attributes; 1 where row == column, else 0.
     RAND RANDN   f32 or f64 of any shape; operands [seed, offset], both i64 SCALARs holding the
                  uint64 values bit for bit (see tb_rand).
   Unary elementwise: one operand of the output's dims; no attributes except CAST.
     EXP LOG SQRT RSQRT SIN COS TANH SIGMOID GELU SILU RECIPROCAL: float T only (the op
       functions cast integer and bool inputs to f32 first; gelu and silu reject them as PyTorch).
     NEG ABS RELU FLOOR CEIL ROUND: T not bool (FLOOR CEIL ROUND of integers are the identity;
       ROUND is half to even).  SIGN: any T (bool: the identity).
     LOGICAL_NOT: bool -> bool (the op function casts other dtypes to bool first).
     CAST: attrs [dtype]; any dtype -> that dtype (float to integer truncates toward zero,
       nonzero to bool is true, bool to number is 0 or 1).
   Binary elementwise: two operands of ONE dtype whose dims broadcast (NumPy rules, aligned at
   the last axis); output the broadcast dims; no attributes.
     ADD MUL MAXIMUM MINIMUM: any T.  SUB POW: T not bool.  DIV: float T only (true division).
     EQ NE LT LE GT GE: operands of any one dtype, output bool.
     LOGICAL_AND LOGICAL_OR: bool operands, output bool.
   Ternary elementwise (the three dims broadcast; no attributes):
     WHERE: [cond (bool), a (T), b (T)] -> T.
     CLAMP: [x, lo, hi], all T (not bool) -> T = min(max(x, lo), hi): hi wins when lo > hi.
   Reductions SUM MEAN MAX MIN PROD: one operand; attrs [axes bitmask, keepdim]; bitmask 0
     reduces nothing (each output element is its one input element); keepdim 1 keeps reduced
     axes as size 1, 0 removes them. Output dtype = operand dtype.
     SUM PROD: T not bool (the op functions cast bool and integers to i64 first); over an empty
       set: 0 and 1.  MEAN: float T only; empty: NaN.  MAX MIN: any T; every reduced axis has
       size >= 1; an optional third attr `first` (0 or 1; 1 needs exactly one reduced axis)
       changes the gradient only: it goes to the first extreme element alone (as a max-pool's
       does in PyTorch) instead of being shared evenly between ties.
   ARGMAX ARGMIN: one operand of rank >= 1, not bool; attrs [axis, keepdim]; dims[axis] >= 1;
     output i64, the index along axis of the first extreme element. (The op functions reshape a
     rank-0 input to [1].)
   MATMUL: [a, b] of one dtype (not bool) and one rank r >= 2 with equal batch dims:
     a [..., n, k] x b [..., k, m] -> [..., n, m]. (tb_matmul turns a 1-D a into [1, k] and a 1-D
     b into [k, 1], RESHAPEs and EXPANDs both to the broadcast batch dims, and RESHAPEs the
     result to drop the added axes.)
   SOFTMAX LOG_SOFTMAX: one float operand of rank >= 1; attrs [axis]; output the same shape.
     (The op functions reshape a rank-0 input to [1].)
   LAYER_NORM: operands [x, weight if has_weight, bias if has_bias]; attrs [normalized_ndim,
     has_weight, has_bias] (flags 0 or 1); fattrs [eps]. x float of rank >= normalized_ndim >= 1;
     weight and bias have x's dtype and exactly the last normalized_ndim dims of x. Output x's
     shape: (x - mean) / sqrt(var + eps) * weight + bias, mean and biased variance taken over the
     last normalized_ndim axes.
   Movement (views; output dtype = operand dtype):
     RESHAPE: attrs = the output dims (one per output axis; none for rank 0); same element count;
       row-major order is kept.
     PERMUTE: attrs = perm, one per axis, a permutation of 0..rank-1; out.dims[i] = dims[perm[i]].
     EXPAND: attrs = the output dims (output rank >= input rank); the input's axes align with the
       trailing output axes, each input dim equal to its output dim or 1 (then repeated).
     SLICE: rank >= 1; attrs [dim, start, end, step] with 0 <= start <= end <= dims[dim] and
       step >= 1; out.dims[dim] = ceil((end - start) / step); element j along dim is input
       element start + j * step.
     FLIP: attrs [axes bitmask]: those axes are reversed.
   Others (copies):
     CONCAT: one or more operands of one dtype and one rank >= 1, equal dims except along dim;
       attrs [dim]; out.dims[dim] is the sum, operands in order.
     PAD: [x, value] with value a rank-0 of x's dtype; attrs [before_0, after_0, before_1,
       after_1, ...]: a pair for EVERY axis of x from axis 0 on (2 * rank attrs), each >= 0;
       out.dims[d] = before_d + dims[d] + after_d; the border holds value.
     GATHER: [x, index], index i32 or i64 of x's rank (>= 1); attrs [dim]; index.dims[d] <=
       x.dims[d] for d != dim; output index's dims and x's dtype: out[p] = x[p with p[dim]
       replaced by index[p]]. An index outside [0, x.dims[dim]) (negative ones included) fails
       at run time (TB_ERR_EXECUTE).
     INDEX_SELECT: [x, index], x rank >= 1, index 1-D i32 or i64; attrs [dim]; output x's dims
       with dims[dim] = index's length: out[p] = x[p with p[dim] replaced by index[p[dim]]].
       Out-of-range indices as GATHER.
   Added later (at the end, so that the ids of the ops above keep their values):
     ERF: unary elementwise, float T only (the op function casts integers and bool to f32 first).
     WINDOW: movement (a view); sliding windows over the last n axes of x (1 <= n <= 3, n <=
       rank, rank + n <= TB_MAX_RANK); attrs [n, then for each of those axes i: out_i, kernel_i,
       stride_i, dilation_i], each >= 1, with (out_i - 1) * stride_i + (kernel_i - 1) *
       dilation_i < dims[i]. Output [..., out_1, ..., out_n, kernel_1, ..., kernel_n]; element
       [..., o, k] is x[..., o_i * stride_i + k_i * dilation_i]. (Padding is a PAD below it.)
       Diagonal form, attrs [n, (out, kernel, stride, dilation) per axis, 1]: x already holds
       the kernel axes, [..., L_1, .., L_n, kernel_1, .., kernel_n] (rank >= 2n, rank <=
       TB_MAX_RANK), the output is [..., out_1, .., out_n, kernel_1, .., kernel_n] and element
       [..., o, k] is x[..., o_i * stride_i + k_i * dilation_i, .., k_i, ..] (the fold of
       windows, tb_fold, sums these over k).
     COLLECTIVE: other; one operand x; attrs [group, collective, reduce op, root, size]: group
       is a process group's index in the registry (tb_process_group_get), collective 1
       all_reduce, 2 all_gather, 3 reduce_scatter, 4 broadcast; reduce op a tb_reduce_op
       (all_reduce and reduce_scatter; 0 otherwise), root a rank (broadcast; 0 otherwise), size
       the group's number of ranks (>= 1). Output x's dtype and dims, except all_gather [size *
       d0, ...] ([size] for a rank-0 x) and reduce_scatter [d0 / size, ...] (x of rank >= 1, d0
       a multiple of size). Recorded by tb_all_reduce, tb_all_gather, tb_reduce_scatter and
       tb_broadcast only (tb_call_op refuses it). No backend lowers it: the executor runs it on
       the host through the group when the graph runs (whatever the backend's supports_node
       says), and the graph below it and the graph above it are computations of their own.
     SOFTPLUS MISH: unary elementwise, float T only (the op functions refuse integers and bool,
       as PyTorch).
   Custom ops: the registered number of operands, as recorded (no CAST is inserted); attrs as
   given to tb_call_op; output from infer_shape, or else the broadcast of the operands with the
   tb_dtype_promote of their dtypes.

   Scalars used by ops (clamp bounds, pad value, x + 2) are SCALAR operands: their values are
   parameters and never enter the hash. */
#define TB_OP_LIST(X)                                                                              \
    X(DEVICE_DATA, "device_data", TB_KIND_LEAF, 0)                                                 \
    X(SCALAR, "scalar", TB_KIND_LEAF, 0)                                                           \
    X(ARANGE, "arange", TB_KIND_LEAF, 0)                                                           \
    X(EYE, "eye", TB_KIND_LEAF, 0)                                                                 \
    X(RAND, "rand", TB_KIND_LEAF, 2)                                                               \
    X(RANDN, "randn", TB_KIND_LEAF, 2)                                                             \
    X(NEG, "neg", TB_KIND_UNARY, 1)                                                                \
    X(ABS, "abs", TB_KIND_UNARY, 1)                                                                \
    X(EXP, "exp", TB_KIND_UNARY, 1)                                                                \
    X(LOG, "log", TB_KIND_UNARY, 1)                                                                \
    X(SQRT, "sqrt", TB_KIND_UNARY, 1)                                                              \
    X(RSQRT, "rsqrt", TB_KIND_UNARY, 1)                                                            \
    X(SIN, "sin", TB_KIND_UNARY, 1)                                                                \
    X(COS, "cos", TB_KIND_UNARY, 1)                                                                \
    X(TANH, "tanh", TB_KIND_UNARY, 1)                                                              \
    X(SIGMOID, "sigmoid", TB_KIND_UNARY, 1)                                                        \
    X(RELU, "relu", TB_KIND_UNARY, 1)                                                              \
    X(GELU, "gelu", TB_KIND_UNARY, 1)                                                              \
    X(SILU, "silu", TB_KIND_UNARY, 1)                                                              \
    X(RECIPROCAL, "reciprocal", TB_KIND_UNARY, 1)                                                  \
    X(FLOOR, "floor", TB_KIND_UNARY, 1)                                                            \
    X(CEIL, "ceil", TB_KIND_UNARY, 1)                                                              \
    X(ROUND, "round", TB_KIND_UNARY, 1)                                                            \
    X(SIGN, "sign", TB_KIND_UNARY, 1)                                                              \
    X(LOGICAL_NOT, "logical_not", TB_KIND_UNARY, 1)                                                \
    X(CAST, "cast", TB_KIND_UNARY, 1)                                                              \
    X(ADD, "add", TB_KIND_BINARY, 2)                                                               \
    X(SUB, "sub", TB_KIND_BINARY, 2)                                                               \
    X(MUL, "mul", TB_KIND_BINARY, 2)                                                               \
    X(DIV, "div", TB_KIND_BINARY, 2)                                                               \
    X(POW, "pow", TB_KIND_BINARY, 2)                                                               \
    X(MAXIMUM, "maximum", TB_KIND_BINARY, 2)                                                       \
    X(MINIMUM, "minimum", TB_KIND_BINARY, 2)                                                       \
    X(EQ, "eq", TB_KIND_BINARY, 2)                                                                 \
    X(NE, "ne", TB_KIND_BINARY, 2)                                                                 \
    X(LT, "lt", TB_KIND_BINARY, 2)                                                                 \
    X(LE, "le", TB_KIND_BINARY, 2)                                                                 \
    X(GT, "gt", TB_KIND_BINARY, 2)                                                                 \
    X(GE, "ge", TB_KIND_BINARY, 2)                                                                 \
    X(LOGICAL_AND, "logical_and", TB_KIND_BINARY, 2)                                               \
    X(LOGICAL_OR, "logical_or", TB_KIND_BINARY, 2)                                                 \
    X(WHERE, "where", TB_KIND_TERNARY, 3)                                                          \
    X(CLAMP, "clamp", TB_KIND_TERNARY, 3)                                                          \
    X(SUM, "sum", TB_KIND_REDUCE, 1)                                                               \
    X(MEAN, "mean", TB_KIND_REDUCE, 1)                                                             \
    X(MAX, "max", TB_KIND_REDUCE, 1)                                                               \
    X(MIN, "min", TB_KIND_REDUCE, 1)                                                               \
    X(PROD, "prod", TB_KIND_REDUCE, 1)                                                             \
    X(ARGMAX, "argmax", TB_KIND_REDUCE, 1)                                                         \
    X(ARGMIN, "argmin", TB_KIND_REDUCE, 1)                                                         \
    X(MATMUL, "matmul", TB_KIND_MATMUL, 2)                                                         \
    X(SOFTMAX, "softmax", TB_KIND_NORM, 1)                                                         \
    X(LOG_SOFTMAX, "log_softmax", TB_KIND_NORM, 1)                                                 \
    X(LAYER_NORM, "layer_norm", TB_KIND_NORM, -1)                                                  \
    X(RESHAPE, "reshape", TB_KIND_MOVEMENT, 1)                                                     \
    X(PERMUTE, "permute", TB_KIND_MOVEMENT, 1)                                                     \
    X(EXPAND, "expand", TB_KIND_MOVEMENT, 1)                                                       \
    X(SLICE, "slice", TB_KIND_MOVEMENT, 1)                                                         \
    X(FLIP, "flip", TB_KIND_MOVEMENT, 1)                                                           \
    X(CONCAT, "concat", TB_KIND_OTHER, -1)                                                         \
    X(PAD, "pad", TB_KIND_OTHER, 2)                                                                \
    X(GATHER, "gather", TB_KIND_OTHER, 2)                                                          \
    X(INDEX_SELECT, "index_select", TB_KIND_OTHER, 2)                                              \
    X(ERF, "erf", TB_KIND_UNARY, 1)                                                                \
    X(WINDOW, "window", TB_KIND_MOVEMENT, 1)                                                       \
    X(COLLECTIVE, "collective", TB_KIND_OTHER, 1)                                                  \
    X(SOFTPLUS, "softplus", TB_KIND_UNARY, 1)                                                      \
    X(MISH, "mish", TB_KIND_UNARY, 1)

/* An op id: a built-in TB_OP_* or an id returned by tb_op_register. */
typedef int32_t tb_op;

enum tb_op_id {
#define TB__OP_ENUM(e, name, kind, arity) TB_OP_##e,
    TB_OP_LIST(TB__OP_ENUM)
#undef TB__OP_ENUM
        TB_OP_BUILTIN_COUNT
};

#define TB_MAX_ATTRS 20 /* int64 attributes a node can carry */

/* The op's name ("add"), kind and number of operands (-1: variable). NULL / TB_KIND_INVALID / -1
   for an unknown op (no error is set). A custom op's name stays valid until tb_shutdown.
   Thread-safe. */
TBDEF const char *tb_op_name(tb_op op);
TBDEF tb_op_kind tb_op_get_kind(tb_op op);
TBDEF int32_t tb_op_arity(tb_op op);
/* Finds an op by name, built-in or custom. TB_ERR_NOT_FOUND when none; *out is untouched on
   error. Thread-safe. */
TBDEF tb_status tb_op_lookup(const char *name, tb_op *out);

/* ---- nodes ----
   Nodes are immutable once recorded and owned by the tensors that use them (refcounted inside
   the library). The accessors below read them; they are safe from any thread. A NULL node gives
   -1 / NULL / 0 (tb_node_scalar: TB_ERR_INVALID_ARGUMENT). */
TBDEF tb_op tb_node_op(const tb_node *node);
TBDEF const tb_shape *tb_node_shape(const tb_node *node);
TBDEF size_t tb_node_num_operands(const tb_node *node);
TBDEF const tb_node *tb_node_operand(const tb_node *node, size_t index); /* NULL out of range */
TBDEF size_t tb_node_num_attrs(const tb_node *node);
TBDEF int64_t tb_node_attr(const tb_node *node, size_t index); /* 0 out of range */
TBDEF double tb_node_fattr(const tb_node *node, size_t index); /* index 0 or 1; 0.0 otherwise */
/* The DAG hash: op, attributes, shape and the operands' hashes. Device data and scalar values
   never enter it: two graphs that differ only in data share one hash. */
TBDEF uint64_t tb_node_hash(const tb_node *node);
/* A process-unique id, increasing in creation order (for dumps). */
TBDEF uint64_t tb_node_id(const tb_node *node);
/* The data behind a DEVICE_DATA node (NULL for other ops). Borrowed. */
TBDEF tb_backend_data *tb_node_data(const tb_node *node);
/* The value of a SCALAR node. TB_ERR_INVALID_ARGUMENT for other ops. */
TBDEF tb_status tb_node_scalar(const tb_node *node, tb_scalar *out);

/* ---- custom ops ---- */

/* Output shape of a custom op from its inputs' shapes and the attributes. */
typedef tb_status (*tb_custom_shape_fn)(const tb_shape *inputs, size_t num_inputs,
                                        const int64_t *attrs, size_t num_attrs, tb_shape *out,
                                        void *user_data);
/* Reference implementation on contiguous host arrays (the output is allocated by the library). */
typedef tb_status (*tb_custom_reference_fn)(const void *const *inputs, const tb_shape *input_shapes,
                                            size_t num_inputs, void *output,
                                            const tb_shape *output_shape, const int64_t *attrs,
                                            size_t num_attrs, void *user_data);

typedef struct tb_custom_op_desc {
    const char *name;   /* an identifier, not a built-in op's name */
    int32_t num_inputs; /* 1..8 */
    /* NULL: the op is elementwise; the output is the broadcast of the inputs with the promoted
       dtype. */
    tb_custom_shape_fn infer_shape;
    tb_custom_reference_fn reference; /* required */
    /* (optional, elementwise ops only) an OpenCL C expression for one output element, in terms
       of x0, x1, ... (the inputs' elements, already converted to the output's type T, which is
       also defined), e.g. "x0 * x1 + (T)1". Ops without it fall back to the reference. */
    const char *opencl_expr;
    void *user_data;
    /* (optional) the vector-Jacobian product for tb_grad: given the op's inputs, its output and
       grad_output (the gradient of the output), writes to grad_inputs[i] a new tensor of
       inputs[i]'s shape (or leaves NULL: no gradient) built with the library's ops, and
       returns TB_OK. A custom op without it on a gradient's path makes tb_grad fail. */
    tb_status (*vjp)(tb_tensor *const *inputs, size_t num_inputs, tb_tensor *output,
                     tb_tensor *grad_output, const int64_t *attrs, size_t num_attrs,
                     tb_tensor **grad_inputs, void *user_data);
} tb_custom_op_desc;

/* Registers a custom op and writes its id (TB_OP_BUILTIN_COUNT and up, in registration order)
   to *out. The name is checked as backend names are (1..TB_MAX_NAME bytes,
   [A-Za-z_][A-Za-z0-9_]*); num_inputs must be 1..8 and reference set (TB_ERR_INVALID_ARGUMENT).
   A name already registered or a built-in op's name is TB_ERR_DUPLICATE. The desc and its
   strings are copied. The op lives until tb_shutdown. Thread-safe. */
TBDEF tb_status tb_op_register(const tb_custom_op_desc *desc, tb_op *out);
/* The desc a custom op was registered with, as copied (NULL for built-ins and unknown ids; no
   error is set). Valid until tb_shutdown. Thread-safe. */
TBDEF const tb_custom_op_desc *tb_op_custom_desc(tb_op op);
