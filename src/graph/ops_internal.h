/* ===========================================================================================
   Ops: what the parts of the ops (ops.c, ops_movement.c, ops_create.c) share of ops.c's
   plumbing: recording a node, operands, views, scalars, checks.
   =========================================================================================== */
#include "../impl_begin.h"

/* An operand of an op: an owned reference to its node, with what type promotion needs. */
typedef struct tb__arg {
    tb_node *node;
    tb_shape shape;
    bool wrapped; /* a SCALAR made from a host number: weakest in promotion */
} tb__arg;

/* Tells the device's backend about a new node (LTC's IR builder hook); it may refuse it. */
static tb_status tb__announce(const char *fn, const tb_node *node);
/* Infers the shape, then creates and announces the node. */
static tb_node *tb__record(const char *fn, tb_op op, const tb_device *device,
                           tb_node *const *operands, size_t num_operands, const int64_t *attrs,
                           size_t num_attrs, const double *fattrs);
/* The tensor of a node (consumed; NULL stays NULL). */
static tb_tensor *tb__finish(tb_node *node);
/* x converted to `dtype` (x itself, retained, when it already has it). */
static tb_node *tb__cast_node(const char *fn, tb_node *x, tb_dtype dtype);
/* x reshaped (RESHAPE) or expanded (EXPAND) to `dims`; x itself, retained, when it has them;
   tb__view_take consumes the caller's reference to x. */
static tb_node *tb__view_node(const char *fn, tb_op op, tb_node *x, int32_t rank,
                              const int64_t *dims);
static tb_node *tb__view_take(const char *fn, tb_op op, tb_node *x, int32_t rank,
                              const int64_t *dims);
/* "[2,-1,3]" */
static void tb__dims_text(const int64_t *dims, int32_t rank, char *buf, size_t cap);
/* The operand nodes of `n` non-NULL tensors and the device the op runs on (that of the first
   operand that is not a scalar); tb__args_release drops them. */
static tb_status tb__args_get(const char *fn, tb_tensor *const *tensors, size_t n, tb__arg *args,
                              tb_device *device);
static void tb__args_release(tb__arg *args, size_t n);
/* An axis in [-rank, rank) made non-negative; a rank-0 tensor takes 0 and -1, as PyTorch. */
static tb_status tb__norm_axis(const char *fn, const char *what, int64_t axis, int32_t rank,
                               const tb_shape *shape, int32_t *out);
static bool tb__is_finite(double v);
/* A scalar of a float dtype (the integer field set only where it is representable). */
static tb_scalar tb__float_scalar(tb_dtype dtype, double v);
/* A host double as a value of `dtype`, as PyTorch's fill. */
static tb_status tb__scalar_from_double(const char *fn, double v, tb_dtype dtype, tb_scalar *out);
/* A wrapped SCALAR node of `dtype` holding the host number v, announced. */
static tb_node *tb__wrapped_scalar(const char *fn, tb_scalar value, const tb_device *device);
/* Checks a shape given by the user (tb_full, tb_rand, ...). */
static tb_status tb__check_user_shape(const char *fn, const tb_shape *shape);
