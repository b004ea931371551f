/* ===========================================================================================
   IR: the op table, custom ops, nodes and shape inference
   =========================================================================================== */
#include "../impl_begin.h"

/* ---- the op table ---- */

typedef struct tb__op_info {
    const char *name;
    tb_op_kind kind;
    int32_t arity;
} tb__op_info;

static const tb__op_info tb__op_table[TB_OP_BUILTIN_COUNT] = {
#define TB__OP_INFO(e, name, kind, arity) {name, kind, arity},
    TB_OP_LIST(TB__OP_INFO)
#undef TB__OP_INFO
};

/* A registered custom op. Entries are allocated one by one so that the pointers handed out by
   tb_op_name and tb_op_custom_desc stay put while the table grows. */
typedef struct tb__custom_op {
    tb_custom_op_desc desc;
    char name[TB_MAX_NAME + 1];
    char *opencl_expr;
} tb__custom_op;

static tb__mutex tb__ops_mutex = TB__MUTEX_INIT;
static tb__custom_op **tb__custom_ops;
static size_t tb__custom_count;
static size_t tb__custom_cap;

static bool tb__op_is_builtin(tb_op op) {
    return op >= 0 && op < (tb_op)TB_OP_BUILTIN_COUNT;
}

static const tb__custom_op *tb__custom_get(tb_op op) {
    const tb__custom_op *entry = NULL;
    if (op < (tb_op)TB_OP_BUILTIN_COUNT) return NULL;
    tb__mutex_lock(&tb__ops_mutex);
    if ((size_t)(op - (tb_op)TB_OP_BUILTIN_COUNT) < tb__custom_count) {
        entry = tb__custom_ops[op - (tb_op)TB_OP_BUILTIN_COUNT];
    }
    tb__mutex_unlock(&tb__ops_mutex);
    return entry;
}

TBDEF const char *tb_op_name(tb_op op) {
    const tb__custom_op *entry;
    if (tb__op_is_builtin(op)) return tb__op_table[op].name;
    entry = tb__custom_get(op);
    return entry != NULL ? entry->name : NULL;
}

TBDEF tb_op_kind tb_op_get_kind(tb_op op) {
    if (tb__op_is_builtin(op)) return tb__op_table[op].kind;
    return tb__custom_get(op) != NULL ? TB_KIND_CUSTOM : TB_KIND_INVALID;
}

TBDEF int32_t tb_op_arity(tb_op op) {
    const tb__custom_op *entry;
    if (tb__op_is_builtin(op)) return tb__op_table[op].arity;
    entry = tb__custom_get(op);
    return entry != NULL ? entry->desc.num_inputs : -1;
}

/* A name as backends and ops take them: [A-Za-z_][A-Za-z0-9_]*, 1..TB_MAX_NAME bytes. */
static bool tb__ir_name_ok(const char *name) {
    size_t i;
    if (name == NULL || name[0] == '\0') return false;
    for (i = 0; name[i] != '\0'; i++) {
        char c = name[i];
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
        bool digit = c >= '0' && c <= '9';
        if (i >= TB_MAX_NAME) return false;
        if (!alpha && !(digit && i > 0)) return false;
    }
    return true;
}

static bool tb__builtin_lookup(const char *name, tb_op *out) {
    int32_t i;
    for (i = 0; i < (int32_t)TB_OP_BUILTIN_COUNT; i++) {
        if (strcmp(tb__op_table[i].name, name) == 0) {
            *out = i;
            return true;
        }
    }
    return false;
}

/* Under tb__ops_mutex. */
static bool tb__custom_lookup_locked(const char *name, tb_op *out) {
    size_t i;
    for (i = 0; i < tb__custom_count; i++) {
        if (strcmp(tb__custom_ops[i]->name, name) == 0) {
            *out = (tb_op)TB_OP_BUILTIN_COUNT + (tb_op)i;
            return true;
        }
    }
    return false;
}

TBDEF tb_status tb_op_lookup(const char *name, tb_op *out) {
    tb_op found;
    bool ok;
    if (name == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_op_lookup: name is NULL");
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_op_lookup: out is NULL");
    ok = tb__builtin_lookup(name, &found);
    if (!ok) {
        tb__mutex_lock(&tb__ops_mutex);
        ok = tb__custom_lookup_locked(name, &found);
        tb__mutex_unlock(&tb__ops_mutex);
    }
    if (!ok) return tb__error(TB_ERR_NOT_FOUND, "tb_op_lookup: unknown op '%s'", name);
    *out = found;
    return TB_OK;
}

TBDEF tb_status tb_op_register(const tb_custom_op_desc *desc, tb_op *out) {
    tb__custom_op *entry;
    tb_op existing;
    tb_status st;
    tb__ensure_setup();
    if (desc == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_op_register: desc is NULL");
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_op_register: out is NULL");
    if (desc->name == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_op_register: desc->name is NULL");
    }
    if (!tb__ir_name_ok(desc->name)) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_op_register: bad name '%.64s' (1..%d bytes of [A-Za-z0-9_], not "
                         "starting with a digit)",
                         desc->name, TB_MAX_NAME);
    }
    if (tb__builtin_lookup(desc->name, &existing)) {
        return tb__error(TB_ERR_DUPLICATE, "tb_op_register: duplicate name: %s is a built-in op",
                         desc->name);
    }
    if (desc->num_inputs < 1 || desc->num_inputs > 8) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_op_register: op '%s': num_inputs %d is out of range (1..8)",
                         desc->name, (int)desc->num_inputs);
    }
    if (desc->reference == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_op_register: op '%s': the reference function is required", desc->name);
    }
    entry = (tb__custom_op *)tb__calloc(1, sizeof *entry);
    if (entry == NULL) return TB_ERR_OUT_OF_MEMORY;
    entry->desc = *desc;
    memcpy(entry->name, desc->name, strlen(desc->name) + 1);
    entry->desc.name = entry->name;
    if (desc->opencl_expr != NULL) {
        entry->opencl_expr = tb__strdup(desc->opencl_expr);
        if (entry->opencl_expr == NULL) {
            tb__free(entry);
            return TB_ERR_OUT_OF_MEMORY;
        }
    }
    entry->desc.opencl_expr = entry->opencl_expr;

    tb__mutex_lock(&tb__ops_mutex);
    if (tb__custom_lookup_locked(desc->name, &existing)) {
        st = tb__error(TB_ERR_DUPLICATE, "tb_op_register: duplicate name: %s", desc->name);
    } else if (tb__custom_count >= (size_t)(INT32_MAX - (int32_t)TB_OP_BUILTIN_COUNT)) {
        st = tb__error(TB_ERR_OVERFLOW, "tb_op_register: too many custom ops");
    } else {
        st = tb__grow((void **)&tb__custom_ops, &tb__custom_cap, tb__custom_count + 1,
                      sizeof *tb__custom_ops);
    }
    if (st == TB_OK) {
        tb__custom_ops[tb__custom_count] = entry;
        *out = (tb_op)TB_OP_BUILTIN_COUNT + (tb_op)tb__custom_count;
        tb__custom_count++;
    }
    tb__mutex_unlock(&tb__ops_mutex);
    if (st != TB_OK) {
        tb__free(entry->opencl_expr);
        tb__free(entry);
    }
    return st;
}

TBDEF const tb_custom_op_desc *tb_op_custom_desc(tb_op op) {
    const tb__custom_op *entry = tb__custom_get(op);
    return entry != NULL ? &entry->desc : NULL;
}

static void tb__ir_shutdown(void) {
    size_t i;
    tb__mutex_lock(&tb__ops_mutex);
    for (i = 0; i < tb__custom_count; i++) {
        tb__free(tb__custom_ops[i]->opencl_expr);
        tb__free(tb__custom_ops[i]);
    }
    tb__free(tb__custom_ops);
    tb__custom_ops = NULL;
    tb__custom_count = 0;
    tb__custom_cap = 0;
    tb__mutex_unlock(&tb__ops_mutex);
}

/* ---- nodes ---- */

#if defined(_MSC_VER) && !defined(__clang__)
#define TB__ATOMIC_INC64(ptr) ((uint64_t)InterlockedIncrement64((volatile LONG64 *)(ptr)))
#else
#define TB__ATOMIC_INC64(ptr) __atomic_add_fetch((ptr), 1, __ATOMIC_RELAXED)
#endif

static uint64_t tb__node_counter;

#define TB__NODE_HASH_SEED UINT64_C(0x74625f6e6f646521)

static uint64_t tb__hash_shape(uint64_t h, const tb_shape *shape) {
    int32_t i;
    h = tb__hash_u64(h, (uint64_t)shape->dtype);
    h = tb__hash_u64(h, (uint64_t)(uint32_t)shape->rank);
    for (i = 0; i < shape->rank && i < TB_MAX_RANK; i++) {
        h = tb__hash_u64(h, (uint64_t)shape->dims[i]);
    }
    return h;
}

static uint64_t tb__hash_double(uint64_t h, double value) {
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    return tb__hash_u64(h, bits);
}

/* Leaves hash their kind and shape only: their values are parameters, so graphs that differ in
   data alone share one computation. */
static uint64_t tb__leaf_hash(const tb_node *node) {
    uint64_t h = tb__hash_u64(TB__NODE_HASH_SEED, (uint64_t)(uint32_t)node->op);
    h = tb__hash_shape(h, &node->shape);
    return tb__hash_u64(h, node->wrapped_number ? 1u : 0u);
}

static uint64_t tb__node_hash_of(const tb_node *node) {
    uint64_t h;
    uint32_t i;
    if (node->op == TB_OP_DEVICE_DATA || node->op == TB_OP_SCALAR) return tb__leaf_hash(node);
    h = tb__hash_u64(TB__NODE_HASH_SEED, (uint64_t)(uint32_t)node->op);
    h = tb__hash_shape(h, &node->shape);
    h = tb__hash_u64(h, node->num_attrs);
    for (i = 0; i < node->num_attrs; i++)
        h = tb__hash_u64(h, (uint64_t)node->attrs[i]);
    h = tb__hash_double(h, node->fattrs[0]);
    h = tb__hash_double(h, node->fattrs[1]);
    h = tb__hash_u64(h, node->num_operands);
    for (i = 0; i < node->num_operands; i++)
        h = tb__hash_u64(h, node->operands[i]->hash);
    return h;
}

static tb_node *tb__node_alloc(tb_op op, const tb_shape *shape, const tb_device *device) {
    tb_node *node = (tb_node *)tb__calloc(1, sizeof *node);
    if (node == NULL) return NULL;
    node->refcount = 1;
    node->op = op;
    node->shape = *shape;
    if (device != NULL) node->device = *device;
    node->id = TB__ATOMIC_INC64(&tb__node_counter);
    return node;
}

static tb_node *tb__node_new(tb_op op, const tb_shape *shape, const tb_device *device,
                             tb_node *const *operands, size_t num_operands, const int64_t *attrs,
                             size_t num_attrs, const double *fattrs) {
    tb_node *node;
    size_t i;
    if (shape == NULL || num_attrs > TB_MAX_ATTRS || (num_attrs > 0 && attrs == NULL) ||
        (num_operands > 0 && operands == NULL) || (uint64_t)num_operands > UINT32_MAX) {
        tb__error(TB_ERR_INTERNAL, "tb__node_new: bad arguments for op %d", (int)op);
        return NULL;
    }
    for (i = 0; i < num_operands; i++) {
        if (operands[i] == NULL) {
            tb__error(TB_ERR_INTERNAL, "tb__node_new: operand %zu of op %d is NULL", i, (int)op);
            return NULL;
        }
    }
    node = tb__node_alloc(op, shape, device);
    if (node == NULL) return NULL;
    if (num_operands > 0) {
        node->operands = (tb_node **)tb__calloc(num_operands, sizeof *node->operands);
        if (node->operands == NULL) {
            tb__free(node);
            return NULL;
        }
        for (i = 0; i < num_operands; i++) {
            node->operands[i] = operands[i];
            tb__node_retain(operands[i]);
            if (operands[i]->requires_grad) node->requires_grad = true;
        }
        node->num_operands = (uint32_t)num_operands;
    }
    for (i = 0; i < num_attrs; i++)
        node->attrs[i] = attrs[i];
    node->num_attrs = (uint32_t)num_attrs;
    if (fattrs != NULL) {
        node->fattrs[0] = fattrs[0];
        node->fattrs[1] = fattrs[1];
    }
    node->hash = tb__node_hash_of(node);
    return node;
}

static tb_node *tb__node_device_data(tb_backend_data *data) {
    tb_node *node;
    if (data == NULL) {
        tb__error(TB_ERR_INTERNAL, "tb__node_device_data: data is NULL");
        return NULL;
    }
    node = tb__node_alloc(TB_OP_DEVICE_DATA, &data->shape, &data->device);
    if (node == NULL) return NULL;
    tb__data_retain(data);
    node->data = data;
    node->hash = tb__leaf_hash(node);
    return node;
}

static tb_node *tb__node_scalar(tb_scalar value, const tb_device *device, bool wrapped_number) {
    tb_shape shape;
    tb_node *node;
    if (!tb_dtype_is_valid(value.dtype)) {
        tb__error(TB_ERR_DTYPE, "tb__node_scalar: invalid dtype %d", (int)value.dtype);
        return NULL;
    }
    memset(&shape, 0, sizeof shape);
    shape.dtype = value.dtype;
    shape.rank = 0;
    node = tb__node_alloc(TB_OP_SCALAR, &shape, device);
    if (node == NULL) return NULL;
    node->scalar = value;
    node->wrapped_number = wrapped_number;
    node->hash = tb__leaf_hash(node);
    return node;
}

static void tb__node_retain(tb_node *node) {
    if (node != NULL) TB__ATOMIC_ADD(&node->refcount, 1);
}

/* Frees one node whose count reached zero, apart from its operands. */
static void tb__node_free_one(tb_node *node) {
    if (node->data != NULL) tb__data_release(node->data);
    if (node->value != NULL) tb__data_release(node->value);
    tb__free(node->operands);
    tb__free(node);
}

#define TB__RELEASE_LOCAL 64

/* Frees `dead` (count already zero) and every operand whose count drops to zero with it, with an
   explicit stack: a chain of a million nodes must not use a million stack frames. */
static void tb__node_destroy(tb_node *dead) {
    tb_node *local[TB__RELEASE_LOCAL];
    tb_node **stack = local;
    size_t cap = TB__RELEASE_LOCAL;
    size_t count = 0;
    stack[count++] = dead;
    while (count > 0) {
        tb_node *node = stack[--count];
        uint32_t i;
        for (i = 0; i < node->num_operands; i++) {
            tb_node *operand = node->operands[i];
            if (TB__ATOMIC_ADD(&operand->refcount, -1) != 0) continue;
            if (count == cap) {
                /* Releasing must not disturb the caller's error, even when memory runs out. */
                tb__saved_error saved;
                tb_node **bigger;
                tb__error_save(&saved);
                bigger = cap <= SIZE_MAX / (2 * sizeof *stack)
                             ? (tb_node **)tb__alloc(2 * cap * sizeof *stack)
                             : NULL;
                tb__error_restore(&saved);
                if (bigger == NULL) {
                    /* Out of memory: recurse for this one operand instead (depth grows only
                       while allocations keep failing). */
                    tb__node_destroy(operand);
                    continue;
                }
                memcpy(bigger, stack, count * sizeof *stack);
                if (stack != local) tb__free(stack);
                stack = bigger;
                cap *= 2;
            }
            stack[count++] = operand;
        }
        tb__node_free_one(node);
    }
    if (stack != local) tb__free(stack);
}

#undef TB__RELEASE_LOCAL

static void tb__node_release(tb_node *node) {
    if (node == NULL) return;
    if (TB__ATOMIC_ADD(&node->refcount, -1) != 0) return;
    tb__node_destroy(node);
}

/* ---- node accessors ---- */

TBDEF tb_op tb_node_op(const tb_node *node) {
    return node != NULL ? node->op : -1;
}

TBDEF const tb_shape *tb_node_shape(const tb_node *node) {
    return node != NULL ? &node->shape : NULL;
}

TBDEF size_t tb_node_num_operands(const tb_node *node) {
    return node != NULL ? node->num_operands : 0;
}

TBDEF const tb_node *tb_node_operand(const tb_node *node, size_t index) {
    if (node == NULL || index >= node->num_operands) return NULL;
    return node->operands[index];
}

TBDEF size_t tb_node_num_attrs(const tb_node *node) {
    return node != NULL ? node->num_attrs : 0;
}

TBDEF int64_t tb_node_attr(const tb_node *node, size_t index) {
    if (node == NULL || index >= node->num_attrs || index >= TB_MAX_ATTRS) return 0;
    return node->attrs[index];
}

TBDEF double tb_node_fattr(const tb_node *node, size_t index) {
    if (node == NULL || index >= 2) return 0.0;
    return node->fattrs[index];
}

TBDEF uint64_t tb_node_hash(const tb_node *node) {
    return node != NULL ? node->hash : 0;
}

TBDEF uint64_t tb_node_id(const tb_node *node) {
    return node != NULL ? node->id : 0;
}

TBDEF tb_backend_data *tb_node_data(const tb_node *node) {
    if (node == NULL || node->op != TB_OP_DEVICE_DATA) return NULL;
    return node->data;
}

TBDEF tb_status tb_node_scalar(const tb_node *node, tb_scalar *out) {
    if (node == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_node_scalar: node is NULL");
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_node_scalar: out is NULL");
    if (node->op != TB_OP_SCALAR) {
        const char *name = tb_op_name(node->op);
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_node_scalar: node %llu is a %s node, not "
                         "a scalar",
                         (unsigned long long)node->id, name != NULL ? name : "custom");
    }
    *out = node->scalar;
    return TB_OK;
}

/* ---- shape inference ----
   Every check names the op (or the public function, through `fn`) and the shapes involved.
   The layouts accepted here are the normal form documented above TB_OP_LIST in ir.h. */

static const char *tb__st(const tb_shape *shape, tb__shape_buf *buf) {
    tb__shape_text(shape, buf->text);
    return buf->text;
}

/* Dims >= 0 and the size rule of shapes (tb__dims_extent): element counts, strides and byte
   offsets fit. */
static bool tb__shape_fits(const tb_shape *shape) {
    int32_t i;
    if (!tb_dtype_is_valid(shape->dtype) || shape->rank < 0 || shape->rank > TB_MAX_RANK)
        return false;
    for (i = 0; i < shape->rank; i++) {
        if (shape->dims[i] < 0) return false;
    }
    return tb__shape_size_ok(shape);
}

static tb_status tb__check_fits(const char *fn, const tb_shape *shape) {
    tb__shape_buf b;
    if (tb__shape_fits(shape)) return TB_OK;
    if (tb__shape_has_zero(shape)) {
        return tb__error(TB_ERR_OVERFLOW,
                         "%s: the result %s is too large (empty, but with its 0 dims read as 1 "
                         "its size overflows; empty shapes obey the same limit)",
                         fn, tb__st(shape, &b));
    }
    return tb__error(TB_ERR_OVERFLOW, "%s: the result %s is too large (its size overflows)", fn,
                     tb__st(shape, &b));
}

static tb_status tb__want_inputs(const char *fn, size_t got, size_t want) {
    if (got == want) return TB_OK;
    return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: expected %zu operand%s, got %zu", fn, want,
                     want == 1 ? "" : "s", got);
}

static tb_status tb__want_attrs(const char *fn, size_t got, size_t want, const char *layout) {
    if (got == want) return TB_OK;
    return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: expected %zu attribute%s %s, got %zu", fn, want,
                     want == 1 ? "" : "s", layout, got);
}

static tb_status tb__need_float(const char *fn, const tb_shape *shape) {
    tb__shape_buf b;
    if (tb_dtype_is_float(shape->dtype)) return TB_OK;
    return tb__error(TB_ERR_DTYPE, "%s: expected a float tensor, got %s", fn, tb__st(shape, &b));
}

static tb_status tb__need_not_bool(const char *fn, const tb_shape *shape) {
    tb__shape_buf b;
    if (shape->dtype != TB_BOOL) return TB_OK;
    return tb__error(TB_ERR_DTYPE, "%s: bool tensors are not supported, got %s", fn,
                     tb__st(shape, &b));
}

static tb_status tb__need_bool(const char *fn, const char *what, const tb_shape *shape) {
    tb__shape_buf b;
    if (shape->dtype == TB_BOOL) return TB_OK;
    return tb__error(TB_ERR_DTYPE, "%s: %s must be bool, got %s", fn, what, tb__st(shape, &b));
}

static tb_status tb__need_index(const char *fn, const tb_shape *shape) {
    tb__shape_buf b;
    if (shape->dtype == TB_I32 || shape->dtype == TB_I64) return TB_OK;
    return tb__error(TB_ERR_DTYPE, "%s: index must be i32 or i64, got %s", fn, tb__st(shape, &b));
}

static tb_status tb__same_dtype(const char *fn, const tb_shape *inputs, size_t n) {
    size_t i;
    for (i = 1; i < n; i++) {
        if (inputs[i].dtype != inputs[0].dtype) {
            tb__shape_buf a, b;
            return tb__error(TB_ERR_DTYPE, "%s: operands %s and %s have different dtypes", fn,
                             tb__st(&inputs[0], &a), tb__st(&inputs[i], &b));
        }
    }
    return TB_OK;
}

/* "f32[2], f32[3] and f32[4]" */
static void tb__shapes_list(const tb_shape *inputs, size_t n, char *buf, size_t cap) {
    size_t i, len = 0;
    buf[0] = '\0';
    for (i = 0; i < n && len < cap; i++) {
        tb__shape_buf b;
        const char *sep = i == 0 ? "" : (i + 1 == n ? " and " : ", ");
        int w = snprintf(buf + len, cap - len, "%s%s", sep, tb__st(&inputs[i], &b));
        if (w < 0) break;
        len += (size_t)w;
    }
}

/* NumPy broadcasting of the dims of `n` shapes; the dtype of out is left to the caller. */
static tb_status tb__broadcast_dims(const char *fn, const tb_shape *inputs, size_t n,
                                    tb_shape *out) {
    int32_t rank = 0, axis;
    size_t i;
    for (i = 0; i < n; i++) {
        if (inputs[i].rank > rank) rank = inputs[i].rank;
    }
    out->rank = rank;
    for (axis = 0; axis < rank; axis++) {
        int64_t d = 1;
        for (i = 0; i < n; i++) {
            int32_t k = inputs[i].rank - rank + axis;
            int64_t v;
            if (k < 0) continue;
            v = inputs[i].dims[k];
            if (v == 1) continue;
            if (d == 1) {
                d = v;
            } else if (d != v) {
                char list[400];
                tb__shapes_list(inputs, n, list, sizeof list);
                return tb__error(TB_ERR_SHAPE, "%s: shapes %s do not broadcast", fn, list);
            }
        }
        out->dims[axis] = d;
    }
    return TB_OK;
}

/* A bitmask over the axes of `shape`: no bits at or beyond its rank. */
static tb_status tb__check_mask(const char *fn, int64_t mask, const tb_shape *shape) {
    tb__shape_buf b;
    if (mask < 0 || (mask >> shape->rank) != 0) {
        return tb__error(TB_ERR_SHAPE, "%s: axes bitmask 0x%llx names axes beyond %s", fn,
                         (unsigned long long)mask, tb__st(shape, &b));
    }
    return TB_OK;
}

static tb_status tb__check_flag(const char *fn, const char *what, int64_t value) {
    if (value == 0 || value == 1) return TB_OK;
    return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s must be 0 or 1, got %lld", fn, what,
                     (long long)value);
}

static tb_status tb__check_axis(const char *fn, const char *what, int64_t axis,
                                const tb_shape *shape) {
    tb__shape_buf b;
    if (axis >= 0 && axis < shape->rank) return TB_OK;
    return tb__error(TB_ERR_SHAPE, "%s: %s %lld is out of range for %s", fn, what, (long long)axis,
                     tb__st(shape, &b));
}

static tb_status tb__check_rank1(const char *fn, const tb_shape *shape) {
    tb__shape_buf b;
    if (shape->rank >= 1) return TB_OK;
    return tb__error(TB_ERR_SHAPE, "%s: expected a tensor of rank >= 1, got %s", fn,
                     tb__st(shape, &b));
}

static bool tb__op_float_only(tb_op op) {
    return tb__math_code_of(op) != NULL; /* the rows of ops_table.h */
}

static tb_status tb__infer_unary(const char *fn, tb_op op, const tb_shape *x) {
    if (tb__op_float_only(op)) return tb__need_float(fn, x);
    switch (op) {
    case TB_OP_NEG:
    case TB_OP_ABS:
    case TB_OP_RELU:
    case TB_OP_FLOOR:
    case TB_OP_CEIL:
    case TB_OP_ROUND:
        return tb__need_not_bool(fn, x);
    case TB_OP_LOGICAL_NOT:
        return tb__need_bool(fn, "the operand", x);
    default:
        return TB_OK; /* SIGN */
    }
}

static tb_status tb__infer_binary(const char *fn, tb_op op, const tb_shape *in, tb_shape *out) {
    tb_status st = tb__same_dtype(fn, in, 2);
    if (st != TB_OK) return st;
    switch (op) {
    case TB_OP_SUB:
    case TB_OP_POW:
        st = tb__need_not_bool(fn, &in[0]);
        break;
    case TB_OP_DIV:
        st = tb__need_float(fn, &in[0]);
        break;
    case TB_OP_LOGICAL_AND:
    case TB_OP_LOGICAL_OR:
        st = tb__need_bool(fn, "operands", &in[0]);
        break;
    default:
        break;
    }
    if (st != TB_OK) return st;
    st = tb__broadcast_dims(fn, in, 2, out);
    if (st != TB_OK) return st;
    switch (op) {
    case TB_OP_EQ:
    case TB_OP_NE:
    case TB_OP_LT:
    case TB_OP_LE:
    case TB_OP_GT:
    case TB_OP_GE:
    case TB_OP_LOGICAL_AND:
    case TB_OP_LOGICAL_OR:
        out->dtype = TB_BOOL;
        break;
    default:
        out->dtype = in[0].dtype;
        break;
    }
    return TB_OK;
}

static tb_status tb__infer_reduce(const char *fn, tb_op op, const tb_shape *x, const int64_t *attrs,
                                  size_t num_attrs, tb_shape *out) {
    bool first = (op == TB_OP_MAX || op == TB_OP_MIN) && num_attrs == 3;
    tb_status st =
        tb__want_attrs(fn, num_attrs, first ? 3 : 2,
                       first ? "[axes bitmask, keepdim, first]" : "[axes bitmask, keepdim]");
    int64_t mask;
    int32_t i;
    if (st != TB_OK) return st;
    mask = attrs[0];
    if (first && ((st = tb__check_flag(fn, "first", attrs[2])) != TB_OK)) return st;
    if (first && attrs[2] != 0 && (mask <= 0 || (mask & (mask - 1)) != 0))
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: `first` needs exactly one reduced axis (mask %lld)", fn,
                         (long long)mask);
    if ((st = tb__check_mask(fn, mask, x)) != TB_OK) return st;
    if ((st = tb__check_flag(fn, "keepdim", attrs[1])) != TB_OK) return st;
    if (op == TB_OP_SUM || op == TB_OP_PROD) st = tb__need_not_bool(fn, x);
    if (op == TB_OP_MEAN) st = tb__need_float(fn, x);
    if (st != TB_OK) return st;
    if (op == TB_OP_MAX || op == TB_OP_MIN) {
        for (i = 0; i < x->rank; i++) {
            if (((mask >> i) & 1) != 0 && x->dims[i] == 0) {
                tb__shape_buf b;
                return tb__error(TB_ERR_SHAPE,
                                 "%s: cannot reduce over axis %d of size 0 in %s (the result "
                                 "would have no value)",
                                 fn, (int)i, tb__st(x, &b));
            }
        }
    }
    out->dtype = x->dtype;
    out->rank = 0;
    for (i = 0; i < x->rank; i++) {
        if (((mask >> i) & 1) == 0) {
            out->dims[out->rank++] = x->dims[i];
        } else if (attrs[1] != 0) {
            out->dims[out->rank++] = 1;
        }
    }
    return TB_OK;
}

static tb_status tb__infer_arg(const char *fn, const tb_shape *x, const int64_t *attrs,
                               size_t num_attrs, tb_shape *out) {
    tb_status st = tb__want_attrs(fn, num_attrs, 2, "[axis, keepdim]");
    int32_t i, axis;
    if (st != TB_OK) return st;
    if ((st = tb__check_rank1(fn, x)) != TB_OK) return st;
    if ((st = tb__check_axis(fn, "axis", attrs[0], x)) != TB_OK) return st;
    if ((st = tb__check_flag(fn, "keepdim", attrs[1])) != TB_OK) return st;
    if ((st = tb__need_not_bool(fn, x)) != TB_OK) return st;
    axis = (int32_t)attrs[0];
    if (x->dims[axis] == 0) {
        tb__shape_buf b;
        return tb__error(TB_ERR_SHAPE, "%s: cannot reduce over axis %d of size 0 in %s", fn,
                         (int)axis, tb__st(x, &b));
    }
    out->dtype = TB_I64;
    out->rank = 0;
    for (i = 0; i < x->rank; i++) {
        if (i != axis) {
            out->dims[out->rank++] = x->dims[i];
        } else if (attrs[1] != 0) {
            out->dims[out->rank++] = 1;
        }
    }
    return TB_OK;
}

static tb_status tb__infer_matmul(const char *fn, const tb_shape *in, tb_shape *out) {
    const tb_shape *a = &in[0], *b = &in[1];
    tb__shape_buf sa, sb;
    int32_t r = a->rank, i;
    tb_status st = tb__same_dtype(fn, in, 2);
    if (st != TB_OK) return st;
    if ((st = tb__need_not_bool(fn, a)) != TB_OK) return st;
    if (a->rank < 2 || a->rank != b->rank) {
        return tb__error(TB_ERR_SHAPE,
                         "%s: operands %s and %s must have one rank >= 2 (the matmul node form)",
                         fn, tb__st(a, &sa), tb__st(b, &sb));
    }
    for (i = 0; i < r - 2; i++) {
        if (a->dims[i] != b->dims[i]) {
            return tb__error(TB_ERR_SHAPE, "%s: batch dims of %s and %s differ", fn, tb__st(a, &sa),
                             tb__st(b, &sb));
        }
    }
    if (a->dims[r - 1] != b->dims[r - 2]) {
        return tb__error(TB_ERR_SHAPE, "%s: shapes %s and %s do not match (%lld != %lld)", fn,
                         tb__st(a, &sa), tb__st(b, &sb), (long long)a->dims[r - 1],
                         (long long)b->dims[r - 2]);
    }
    *out = *a;
    out->dims[r - 1] = b->dims[r - 1];
    return TB_OK;
}

static tb_status tb__infer_layer_norm(const char *fn, const tb_shape *in, size_t n,
                                      const int64_t *attrs, size_t num_attrs, tb_shape *out) {
    tb_status st = tb__want_attrs(fn, num_attrs, 3, "[normalized_ndim, has_weight, has_bias]");
    const tb_shape *x = &in[0];
    int64_t nd;
    size_t want, k;
    tb__shape_buf b;
    if (st != TB_OK) return st;
    if ((st = tb__check_flag(fn, "has_weight", attrs[1])) != TB_OK) return st;
    if ((st = tb__check_flag(fn, "has_bias", attrs[2])) != TB_OK) return st;
    want = 1 + (size_t)attrs[1] + (size_t)attrs[2];
    if ((st = tb__want_inputs(fn, n, want)) != TB_OK) return st;
    if ((st = tb__need_float(fn, x)) != TB_OK) return st;
    nd = attrs[0];
    if (nd < 1 || nd > x->rank) {
        return tb__error(TB_ERR_SHAPE, "%s: normalized_ndim %lld is out of range for %s (1..%d)",
                         fn, (long long)nd, tb__st(x, &b), (int)x->rank);
    }
    for (k = 1; k < n; k++) {
        const tb_shape *p = &in[k];
        const char *what = (k == 1 && attrs[1] != 0) ? "weight" : "bias";
        bool ok = p->rank == nd && p->dtype == x->dtype;
        int32_t i;
        for (i = 0; ok && i < p->rank; i++) {
            ok = p->dims[i] == x->dims[x->rank - nd + i];
        }
        if (!ok) {
            tb__shape_buf c;
            return tb__error(p->dtype == x->dtype ? TB_ERR_SHAPE : TB_ERR_DTYPE,
                             "%s: %s %s does not match the last %lld dims of %s", fn, what,
                             tb__st(p, &c), (long long)nd, tb__st(x, &b));
        }
    }
    *out = *x;
    return TB_OK;
}

static tb_status tb__infer_reshape(const char *fn, const tb_shape *x, const int64_t *attrs,
                                   size_t num_attrs, tb_shape *out) {
    int64_t in_numel, out_numel;
    int32_t i;
    tb__shape_buf b;
    if (num_attrs > TB_MAX_RANK) {
        return tb__error(TB_ERR_SHAPE, "%s: %zu output dims exceed the maximum rank %d", fn,
                         num_attrs, TB_MAX_RANK);
    }
    for (i = 0; i < (int32_t)num_attrs; i++) {
        if (attrs[i] < 0) {
            return tb__error(TB_ERR_SHAPE, "%s: output dim %d is negative (%lld)", fn, (int)i,
                             (long long)attrs[i]);
        }
    }
    out->dtype = x->dtype;
    out->rank = (int32_t)num_attrs;
    for (i = 0; i < out->rank; i++)
        out->dims[i] = attrs[i];
    if (!tb__shape_fits(out)) return tb__check_fits(fn, out);
    in_numel = tb__shape_numel(x);
    out_numel = tb__shape_numel(out);
    if (in_numel != out_numel) {
        tb__shape_buf c;
        return tb__error(TB_ERR_SHAPE, "%s: cannot reshape %s (%lld elements) to %s", fn,
                         tb__st(x, &b), (long long)in_numel, tb__st(out, &c));
    }
    return TB_OK;
}

static tb_status tb__infer_permute(const char *fn, const tb_shape *x, const int64_t *attrs,
                                   size_t num_attrs, tb_shape *out) {
    bool seen[TB_MAX_RANK];
    int32_t i;
    tb__shape_buf b;
    if (num_attrs != (size_t)x->rank) {
        return tb__error(TB_ERR_SHAPE, "%s: permutation of %zu axes for %s", fn, num_attrs,
                         tb__st(x, &b));
    }
    memset(seen, 0, sizeof seen);
    out->dtype = x->dtype;
    out->rank = x->rank;
    for (i = 0; i < x->rank; i++) {
        int64_t p = attrs[i];
        if (p < 0 || p >= x->rank || seen[p]) {
            return tb__error(TB_ERR_SHAPE,
                             "%s: entry %d (%lld) of the permutation for %s is out "
                             "of range or repeated",
                             fn, (int)i, (long long)p, tb__st(x, &b));
        }
        seen[p] = true;
        out->dims[i] = x->dims[p];
    }
    return TB_OK;
}

static tb_status tb__infer_expand(const char *fn, const tb_shape *x, const int64_t *attrs,
                                  size_t num_attrs, tb_shape *out) {
    int32_t i, lead;
    tb__shape_buf b, c;
    if (num_attrs > TB_MAX_RANK || (int32_t)num_attrs < x->rank) {
        return tb__error(TB_ERR_SHAPE, "%s: cannot expand %s to %zu dims (%d..%d)", fn,
                         tb__st(x, &b), num_attrs, (int)x->rank, TB_MAX_RANK);
    }
    out->dtype = x->dtype;
    out->rank = (int32_t)num_attrs;
    for (i = 0; i < out->rank; i++) {
        if (attrs[i] < 0) {
            return tb__error(TB_ERR_SHAPE, "%s: output dim %d is negative (%lld)", fn, (int)i,
                             (long long)attrs[i]);
        }
        out->dims[i] = attrs[i];
    }
    lead = out->rank - x->rank;
    for (i = 0; i < x->rank; i++) {
        if (x->dims[i] != 1 && x->dims[i] != out->dims[lead + i]) {
            return tb__error(TB_ERR_SHAPE, "%s: cannot expand %s to %s (dim %d: %lld to %lld)", fn,
                             tb__st(x, &b), tb__st(out, &c), (int)i, (long long)x->dims[i],
                             (long long)out->dims[lead + i]);
        }
    }
    return tb__check_fits(fn, out);
}

static tb_status tb__infer_slice(const char *fn, const tb_shape *x, const int64_t *attrs,
                                 size_t num_attrs, tb_shape *out) {
    tb_status st = tb__want_attrs(fn, num_attrs, 4, "[dim, start, end, step]");
    int64_t dim, start, end, step;
    tb__shape_buf b;
    if (st != TB_OK) return st;
    if ((st = tb__check_rank1(fn, x)) != TB_OK) return st;
    if ((st = tb__check_axis(fn, "dim", attrs[0], x)) != TB_OK) return st;
    dim = attrs[0];
    start = attrs[1];
    end = attrs[2];
    step = attrs[3];
    if (step < 1) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: step %lld must be >= 1", fn,
                         (long long)step);
    }
    if (start < 0 || start > end || end > x->dims[dim]) {
        return tb__error(TB_ERR_SHAPE,
                         "%s: range [%lld, %lld) is not within dim %lld of %s (0 <= start <= "
                         "end <= size)",
                         fn, (long long)start, (long long)end, (long long)dim, tb__st(x, &b));
    }
    *out = *x;
    out->dims[dim] = end == start ? 0 : 1 + (end - start - 1) / step;
    return TB_OK;
}

/* WINDOW: attrs [n, (out, kernel, stride, dilation) for each of the last n axes]. */
static tb_status tb__infer_window(const char *fn, const tb_shape *x, const int64_t *attrs,
                                  size_t num_attrs, tb_shape *out) {
    int64_t n = num_attrs > 0 ? attrs[0] : 0, last;
    int32_t lead, i;
    bool diag = n >= 1 && n <= 3 && num_attrs == 2 + 4 * (size_t)n && attrs[num_attrs - 1] == 1;
    tb__shape_buf b;
    if (num_attrs < 1 || n < 1 || n > 3 || (num_attrs != 1 + 4 * (size_t)n && !diag)) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: %zu attributes; [n, then (out, kernel, stride, dilation) for each "
                         "of the last n axes, 1 <= n <= 3, then 1 for the diagonal form] is "
                         "needed",
                         fn, num_attrs);
    }
    if (diag ? 2 * n > x->rank : n > x->rank || x->rank + n > TB_MAX_RANK) {
        return tb__error(TB_ERR_SHAPE, "%s: windows over %lld axes of %s (rank %d .. %d needed)",
                         fn, (long long)n, tb__st(x, &b), (int)(diag ? 2 * n : n),
                         (int)(diag ? TB_MAX_RANK : TB_MAX_RANK - n));
    }
    lead = x->rank - (int32_t)(diag ? 2 * n : n);
    *out = *x;
    out->rank = diag ? x->rank : x->rank + (int32_t)n;
    for (i = 0; diag && i < (int32_t)n; i++) {
        if (x->dims[lead + n + i] != attrs[2 + 4 * i]) {
            return tb__error(TB_ERR_SHAPE, "%s: axis %d of %s is not the kernel size %lld", fn,
                             (int)(lead + n + i), tb__st(x, &b), (long long)attrs[2 + 4 * i]);
        }
    }
    for (i = 0; i < (int32_t)n; i++) {
        const int64_t *a = &attrs[1 + 4 * i];
        int64_t span;
        if (a[0] < 1 || a[1] < 1 || a[2] < 1 || a[3] < 1) {
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: axis %d: out %lld, kernel %lld, stride %lld and dilation %lld "
                             "must each be >= 1",
                             fn, (int)(lead + i), (long long)a[0], (long long)a[1], (long long)a[2],
                             (long long)a[3]);
        }
        if (!tb__muladd_i64(a[1] - 1, a[3], 0, &span) ||
            !tb__muladd_i64(a[0] - 1, a[2], span, &last) || last >= x->dims[lead + i]) {
            return tb__error(TB_ERR_SHAPE,
                             "%s: %lld windows of %lld (stride %lld, dilation %lld) do not fit "
                             "in axis %d of %s",
                             fn, (long long)a[0], (long long)a[1], (long long)a[2], (long long)a[3],
                             (int)(lead + i), tb__st(x, &b));
        }
        out->dims[lead + i] = a[0];
        out->dims[lead + n + i] = a[1];
    }
    return TB_OK;
}

static tb_status tb__infer_concat(const char *fn, const tb_shape *in, size_t n,
                                  const int64_t *attrs, size_t num_attrs, tb_shape *out) {
    tb_status st = tb__want_attrs(fn, num_attrs, 1, "[dim]");
    int64_t dim, total;
    size_t k;
    if (st != TB_OK) return st;
    if (n < 1) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: no operands", fn);
    if ((st = tb__check_rank1(fn, &in[0])) != TB_OK) return st;
    if ((st = tb__check_axis(fn, "dim", attrs[0], &in[0])) != TB_OK) return st;
    if ((st = tb__same_dtype(fn, in, n)) != TB_OK) return st;
    dim = attrs[0];
    total = 0;
    for (k = 0; k < n; k++) {
        int32_t i;
        bool ok = in[k].rank == in[0].rank;
        for (i = 0; ok && i < in[0].rank; i++) {
            ok = i == dim || in[k].dims[i] == in[0].dims[i];
        }
        if (!ok) {
            tb__shape_buf a, b;
            return tb__error(TB_ERR_SHAPE,
                             "%s: shapes %s (operand 0) and %s (operand %zu) differ outside dim "
                             "%lld",
                             fn, tb__st(&in[0], &a), tb__st(&in[k], &b), k, (long long)dim);
        }
        if (!tb__add_i64(total, in[k].dims[dim], &total)) {
            return tb__error(TB_ERR_OVERFLOW, "%s: the concatenated dim %lld overflows", fn,
                             (long long)dim);
        }
    }
    *out = in[0];
    out->dims[dim] = total;
    return tb__check_fits(fn, out);
}

static tb_status tb__infer_pad(const char *fn, const tb_shape *in, const int64_t *attrs,
                               size_t num_attrs, tb_shape *out) {
    const tb_shape *x = &in[0];
    tb__shape_buf b, c;
    int32_t i;
    if (in[1].rank != 0 || in[1].dtype != x->dtype) {
        return tb__error(TB_ERR_SHAPE, "%s: the pad value must be a rank-0 %s, got %s", fn,
                         tb_dtype_name(x->dtype), tb__st(&in[1], &c));
    }
    if (num_attrs != 2 * (size_t)x->rank) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: expected %d attributes [before, after] per axis of %s, got %zu", fn,
                         2 * (int)x->rank, tb__st(x, &b), num_attrs);
    }
    *out = *x;
    for (i = 0; i < x->rank; i++) {
        int64_t before = attrs[2 * i], after = attrs[2 * i + 1];
        if (before < 0 || after < 0) {
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: negative padding (%lld, %lld) on axis "
                             "%d",
                             fn, (long long)before, (long long)after, (int)i);
        }
        if (!tb__add_i64(before, x->dims[i], &out->dims[i]) ||
            !tb__add_i64(out->dims[i], after, &out->dims[i])) {
            return tb__error(TB_ERR_OVERFLOW, "%s: padding axis %d of %s overflows", fn, (int)i,
                             tb__st(x, &b));
        }
    }
    return tb__check_fits(fn, out);
}

static tb_status tb__infer_gather(const char *fn, tb_op op, const tb_shape *in,
                                  const int64_t *attrs, size_t num_attrs, tb_shape *out) {
    const tb_shape *x = &in[0], *index = &in[1];
    tb_status st = tb__want_attrs(fn, num_attrs, 1, "[dim]");
    tb__shape_buf a, b;
    int64_t dim;
    int32_t i;
    if (st != TB_OK) return st;
    if ((st = tb__check_rank1(fn, x)) != TB_OK) return st;
    if ((st = tb__check_axis(fn, "dim", attrs[0], x)) != TB_OK) return st;
    if ((st = tb__need_index(fn, index)) != TB_OK) return st;
    dim = attrs[0];
    if (op == TB_OP_INDEX_SELECT) {
        if (index->rank != 1) {
            return tb__error(TB_ERR_SHAPE, "%s: index must be 1-D, got %s", fn, tb__st(index, &b));
        }
        *out = *x;
        out->dims[dim] = index->dims[0];
        return tb__check_fits(fn, out);
    }
    if (index->rank != x->rank) {
        return tb__error(TB_ERR_SHAPE, "%s: index %s must have the rank of %s", fn,
                         tb__st(index, &b), tb__st(x, &a));
    }
    for (i = 0; i < x->rank; i++) {
        if (i != dim && index->dims[i] > x->dims[i]) {
            return tb__error(TB_ERR_SHAPE,
                             "%s: index %s is larger than %s in dim %d (only dim %lld may be)", fn,
                             tb__st(index, &b), tb__st(x, &a), (int)i, (long long)dim);
        }
    }
    *out = *index;
    out->dtype = x->dtype;
    return TB_OK;
}

/* A collective: attrs [group, collective, reduce op, root, size] (see COLLECTIVE in ir.h). */
static tb_status tb__infer_collective(const char *fn, const tb_shape *x, const int64_t *attrs,
                                      size_t num_attrs, tb_shape *out) {
    tb_status st = tb__want_attrs(fn, num_attrs, 5, "[group, collective, reduce op, root, size]");
    int64_t kind, size;
    tb__shape_buf b;
    if (st != TB_OK) return st;
    kind = attrs[1];
    size = attrs[4];
    if (attrs[0] < 0 || kind < 1 || kind > 4 || attrs[2] < 0 || attrs[2] > 4 || size < 1 ||
        attrs[3] < 0 || attrs[3] >= size) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: invalid attributes [%lld, %lld, %lld, %lld, %lld]", fn,
                         (long long)attrs[0], (long long)kind, (long long)attrs[2],
                         (long long)attrs[3], (long long)size);
    }
    *out = *x;
    if (kind == 2 && x->rank == 0) { /* all_gather of scalars */
        out->rank = 1;
        out->dims[0] = size;
    } else if (kind == 2) {
        if (x->dims[0] > INT64_MAX / size) {
            return tb__error(TB_ERR_SHAPE, "%s: %s gathered from %lld ranks is too large", fn,
                             tb__st(x, &b), (long long)size);
        }
        out->dims[0] = x->dims[0] * size;
    } else if (kind == 3) {
        if (x->rank < 1 || x->dims[0] % size != 0) {
            return tb__error(TB_ERR_SHAPE,
                             "%s: %s does not split along dim 0 into %lld equal blocks (one per "
                             "rank)",
                             fn, tb__st(x, &b), (long long)size);
        }
        out->dims[0] = x->dims[0] / size;
    }
    return tb__check_fits(fn, out);
}

/* The output dtype and shape of a custom op. */
static tb_status tb__infer_custom(const char *fn, const tb__custom_op *entry, const tb_shape *in,
                                  size_t n, const int64_t *attrs, size_t num_attrs, tb_shape *out) {
    tb_status st;
    tb__shape_buf b;
    size_t k;
    int32_t i;
    if ((st = tb__want_inputs(fn, n, (size_t)entry->desc.num_inputs)) != TB_OK) return st;
    if (entry->desc.infer_shape == NULL) {
        tb_shape shape;
        memset(&shape, 0, sizeof shape);
        if ((st = tb__broadcast_dims(fn, in, n, &shape)) != TB_OK) return st;
        shape.dtype = in[0].dtype;
        for (k = 1; k < n; k++)
            shape.dtype = tb_dtype_promote(shape.dtype, in[k].dtype);
        if ((st = tb__check_fits(fn, &shape)) != TB_OK) return st;
        *out = shape;
        return TB_OK;
    } else {
        tb__saved_error before;
        tb_shape shape;
        bool ok;
        memset(&shape, 0, sizeof shape);
        tb__error_save(&before);
        st = entry->desc.infer_shape(in, n, attrs, num_attrs, &shape, entry->desc.user_data);
        if (st != TB_OK) {
            bool changed =
                tb_last_status() != TB_OK &&
                (tb_last_status() != before.status || strcmp(tb_last_error(), before.message) != 0);
            if (st < TB_OK || st >= TB_STATUS_COUNT) st = TB_ERR_SHAPE;
            if (changed) return tb__error(st, "%s: infer_shape failed: %s", fn, tb_last_error());
            return tb__error(st, "%s: infer_shape failed (%s)", fn, tb_status_string(st));
        }
        ok = tb_dtype_is_valid(shape.dtype) && shape.rank >= 0 && shape.rank <= TB_MAX_RANK;
        for (i = 0; ok && i < shape.rank; i++)
            ok = shape.dims[i] >= 0;
        if (!ok) {
            return tb__error(TB_ERR_SHAPE,
                             "%s: infer_shape gave an invalid shape (dtype %d, "
                             "rank %d)",
                             fn, (int)shape.dtype, (int)shape.rank);
        }
        if (!tb__shape_fits(&shape)) {
            return tb__error(TB_ERR_OVERFLOW, "%s: infer_shape gave %s, which is too large", fn,
                             tb__st(&shape, &b));
        }
        *out = shape;
        return TB_OK;
    }
}

/* The checks every inference starts with: the arrays are there, the attributes are not too
   many, every operand's shape is valid. */
static tb_status tb__infer_check_args(const char *fn, const tb_shape *inputs, size_t num_inputs,
                                      const int64_t *attrs, size_t num_attrs, const tb_shape *out) {
    size_t k;
    if (num_inputs > 0 && inputs == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: inputs is NULL", fn);
    }
    if (num_attrs > 0 && attrs == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: attrs is NULL", fn);
    }
    if (num_attrs > TB_MAX_ATTRS) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %zu attributes (at most %d)", fn, num_attrs,
                         TB_MAX_ATTRS);
    }
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    for (k = 0; k < num_inputs; k++) {
        const tb_shape *s = &inputs[k];
        if (!tb__shape_fits(s)) {
            return tb__error(TB_ERR_SHAPE,
                             "%s: operand %zu has an invalid shape (dtype %d, rank "
                             "%d)",
                             fn, k, (int)s->dtype, (int)s->rank);
        }
    }
    return TB_OK;
}

/* The result shape of a built-in op that is not a leaf, by its kind (the caller checked the
   operand count and zeroed *result). */
static tb_status tb__infer_by_kind(const char *fn, tb_op op, const tb_shape *inputs,
                                   size_t num_inputs, const int64_t *attrs, size_t num_attrs,
                                   tb_shape *result) {
    tb_status st;
    switch (tb__op_table[op].kind) {
    case TB_KIND_UNARY:
        if (op == TB_OP_CAST) {
            if ((st = tb__want_attrs(fn, num_attrs, 1, "[dtype]")) != TB_OK) return st;
            if (attrs[0] < 0 || attrs[0] >= (int64_t)TB_DTYPE_COUNT) {
                return tb__error(TB_ERR_DTYPE, "%s: invalid dtype %lld", fn, (long long)attrs[0]);
            }
            *result = inputs[0];
            result->dtype = (tb_dtype)attrs[0];
            break;
        }
        if ((st = tb__want_attrs(fn, num_attrs, 0, "")) != TB_OK) return st;
        if ((st = tb__infer_unary(fn, op, &inputs[0])) != TB_OK) return st;
        *result = inputs[0];
        if (op == TB_OP_LOGICAL_NOT) result->dtype = TB_BOOL;
        break;
    case TB_KIND_BINARY:
        if ((st = tb__want_attrs(fn, num_attrs, 0, "")) != TB_OK) return st;
        if ((st = tb__infer_binary(fn, op, inputs, result)) != TB_OK) return st;
        break;
    case TB_KIND_TERNARY:
        if ((st = tb__want_attrs(fn, num_attrs, 0, "")) != TB_OK) return st;
        if (op == TB_OP_WHERE) {
            if ((st = tb__need_bool(fn, "the condition", &inputs[0])) != TB_OK) return st;
            if ((st = tb__same_dtype(fn, inputs + 1, 2)) != TB_OK) return st;
            result->dtype = inputs[1].dtype;
        } else {
            if ((st = tb__same_dtype(fn, inputs, 3)) != TB_OK) return st;
            if ((st = tb__need_not_bool(fn, &inputs[0])) != TB_OK) return st;
            result->dtype = inputs[0].dtype;
        }
        if ((st = tb__broadcast_dims(fn, inputs, 3, result)) != TB_OK) return st;
        break;
    case TB_KIND_REDUCE:
        if (op == TB_OP_ARGMAX || op == TB_OP_ARGMIN) {
            st = tb__infer_arg(fn, &inputs[0], attrs, num_attrs, result);
        } else {
            st = tb__infer_reduce(fn, op, &inputs[0], attrs, num_attrs, result);
        }
        if (st != TB_OK) return st;
        break;
    case TB_KIND_MATMUL:
        if ((st = tb__want_attrs(fn, num_attrs, 0, "")) != TB_OK) return st;
        if ((st = tb__infer_matmul(fn, inputs, result)) != TB_OK) return st;
        break;
    case TB_KIND_NORM:
        if (op == TB_OP_LAYER_NORM) {
            st = tb__infer_layer_norm(fn, inputs, num_inputs, attrs, num_attrs, result);
            if (st != TB_OK) return st;
            break;
        }
        if ((st = tb__want_attrs(fn, num_attrs, 1, "[axis]")) != TB_OK) return st;
        if ((st = tb__need_float(fn, &inputs[0])) != TB_OK) return st;
        if ((st = tb__check_rank1(fn, &inputs[0])) != TB_OK) return st;
        if ((st = tb__check_axis(fn, "axis", attrs[0], &inputs[0])) != TB_OK) return st;
        *result = inputs[0];
        break;
    case TB_KIND_MOVEMENT:
        switch (op) {
        case TB_OP_RESHAPE:
            st = tb__infer_reshape(fn, &inputs[0], attrs, num_attrs, result);
            break;
        case TB_OP_PERMUTE:
            st = tb__infer_permute(fn, &inputs[0], attrs, num_attrs, result);
            break;
        case TB_OP_EXPAND:
            st = tb__infer_expand(fn, &inputs[0], attrs, num_attrs, result);
            break;
        case TB_OP_SLICE:
            st = tb__infer_slice(fn, &inputs[0], attrs, num_attrs, result);
            break;
        case TB_OP_WINDOW:
            st = tb__infer_window(fn, &inputs[0], attrs, num_attrs, result);
            break;
        default: /* FLIP */
            st = tb__want_attrs(fn, num_attrs, 1, "[axes bitmask]");
            if (st == TB_OK) st = tb__check_mask(fn, attrs[0], &inputs[0]);
            *result = inputs[0];
            break;
        }
        if (st != TB_OK) return st;
        break;
    default: /* TB_KIND_OTHER */
        switch (op) {
        case TB_OP_CONCAT:
            st = tb__infer_concat(fn, inputs, num_inputs, attrs, num_attrs, result);
            break;
        case TB_OP_PAD:
            st = tb__infer_pad(fn, inputs, attrs, num_attrs, result);
            break;
        case TB_OP_COLLECTIVE:
            st = tb__infer_collective(fn, &inputs[0], attrs, num_attrs, result);
            break;
        default: /* GATHER, INDEX_SELECT */
            st = tb__infer_gather(fn, op, inputs, attrs, num_attrs, result);
            break;
        }
        if (st != TB_OK) return st;
        break;
    }
    return TB_OK;
}

/* Shape inference with `fn` as the name that starts every message. */
static tb_status tb__infer_shape_as(const char *fn, tb_op op, const tb_shape *inputs,
                                    size_t num_inputs, const int64_t *attrs, size_t num_attrs,
                                    tb_shape *out) {
    tb_shape result;
    tb_status st;
    int32_t arity;
    if ((st = tb__infer_check_args(fn, inputs, num_inputs, attrs, num_attrs, out)) != TB_OK)
        return st;
    if (!tb__op_is_builtin(op)) {
        const tb__custom_op *entry = tb__custom_get(op);
        if (entry == NULL) return tb__error(TB_ERR_NOT_FOUND, "%s: unknown op %d", fn, (int)op);
        return tb__infer_custom(fn, entry, inputs, num_inputs, attrs, num_attrs, out);
    }
    if (tb__op_table[op].kind == TB_KIND_LEAF) {
        return tb__error(TB_ERR_UNSUPPORTED,
                         "%s: '%s' is a leaf op; it is created by its own function (tb_%s, ...), "
                         "not inferred",
                         fn, tb__op_table[op].name,
                         op == TB_OP_DEVICE_DATA ? "tensor_from_host" : tb__op_table[op].name);
    }
    arity = tb__op_table[op].arity;
    if (arity >= 0) {
        if ((st = tb__want_inputs(fn, num_inputs, (size_t)arity)) != TB_OK) return st;
    } else if (num_inputs < 1) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: expected at least 1 operand, got 0", fn);
    }
    memset(&result, 0, sizeof result);
    if ((st = tb__infer_by_kind(fn, op, inputs, num_inputs, attrs, num_attrs, &result)) != TB_OK)
        return st;
    if ((st = tb__check_fits(fn, &result)) != TB_OK) return st;
    *out = result;
    return TB_OK;
}

static TB__UNUSED tb_status tb__op_infer_shape(tb_op op, const tb_shape *inputs, size_t num_inputs,
                                               const int64_t *attrs, size_t num_attrs,
                                               tb_shape *out) {
    const char *name = tb_op_name(op);
    return tb__infer_shape_as(name != NULL ? name : "tb__op_infer_shape", op, inputs, num_inputs,
                              attrs, num_attrs, out);
}

#undef TB__NODE_HASH_SEED
#undef TB__ATOMIC_INC64
