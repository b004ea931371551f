/* ===========================================================================================
   Functions: a pending graph recorded as a function of some of its tensors and replayed on new
   inputs (tb_function_create, tb_function_call).
   =========================================================================================== */
#include "executor_internal.h"

/* One node a call makes: the recorded node's op, shape, attributes and flags, and where each
   operand comes from. */
typedef struct tb__fn_step {
    tb_op op;
    tb_shape shape;
    tb_device device;
    uint32_t num_operands;
    uint32_t num_attrs;
    int64_t attrs[TB_MAX_ATTRS];
    double fattrs[2];
    bool stop_grad;     /* a tb_detach or tb_set_requires_grad node: its flag is its own */
    bool requires_grad; /* that flag (for stop_grad nodes only) */
    /* per operand: a value of the call (the inputs first, then the steps' nodes in order), or
       -1: the shared node in consts */
    int64_t *src;
    tb_node **consts; /* per operand: the shared node (an owned reference) where src is -1 */
} tb__fn_step;

struct tb_function {
    size_t num_inputs;
    tb_shape *in_shapes;
    tb_device *in_devices;
    size_t num_steps;
    tb__fn_step *steps;
    size_t max_operands;
    size_t num_outputs;
    int64_t *out_src;        /* a value of the call, or -1: out_const */
    tb_node **out_const;     /* an owned reference where out_src is -1 */
    bool *out_requires_grad; /* the output tensors' own flags (tb_set_requires_grad) */
};

TBDEF void tb_function_release(tb_function *fn) {
    size_t i, j;
    if (fn == NULL) return;
    for (i = 0; i < fn->num_steps; i++) {
        tb__fn_step *s = &fn->steps[i];
        for (j = 0; s->consts != NULL && j < s->num_operands; j++)
            tb__node_release(s->consts[j]);
        tb__free(s->src);
        tb__free(s->consts);
    }
    for (i = 0; fn->out_const != NULL && i < fn->num_outputs; i++)
        tb__node_release(fn->out_const[i]);
    tb__free(fn->steps);
    tb__free(fn->in_shapes);
    tb__free(fn->in_devices);
    tb__free(fn->out_src);
    tb__free(fn->out_const);
    tb__free(fn->out_requires_grad);
    tb__free(fn);
}

TBDEF size_t tb_function_num_inputs(const tb_function *fn) {
    return fn != NULL ? fn->num_inputs : 0;
}

TBDEF size_t tb_function_num_outputs(const tb_function *fn) {
    return fn != NULL ? fn->num_outputs : 0;
}

TBDEF size_t tb_function_num_nodes(const tb_function *fn) {
    size_t i, n;
    if (fn == NULL) return 0;
    n = fn->num_steps;
    for (i = 0; i < fn->num_outputs; i++) {
        if (fn->out_src[i] < 0) n++; /* the call's own node over a shared output */
    }
    return n;
}

/* ---- recording ---- */

#define TB__FN_VISITING (-3) /* on the walk's stack */
#define TB__FN_SHARED   (-2) /* reads no input */

typedef struct tb__fn_frame {
    const tb_node *node;
    uint32_t next;
} tb__fn_frame;

/* What a recording works with. */
typedef struct tb__fn_build {
    tb_function *fn;
    size_t cap_steps;
    /* node -> an input's index, TB__FN_SHARED, TB__FN_VISITING, or its step's value index */
    tb__exec_map codes;
    tb__fn_frame *stack;
    size_t cap_stack;
    tb_backend_data **in_data; /* the inputs' values (NULL: pending), borrowed */
} tb__fn_build;

/* Appends a step of `node`'s op, shape, attributes and flags with no operands yet. */
static tb__fn_step *tb__fn_new_step(tb__fn_build *b, const tb_node *node, uint32_t num_operands) {
    tb_function *fn = b->fn;
    tb__fn_step *s;
    size_t n = num_operands > 0 ? num_operands : 1;
    if (tb__grow((void **)&fn->steps, &b->cap_steps, fn->num_steps + 1, sizeof *fn->steps) !=
        TB_OK) {
        return NULL;
    }
    s = &fn->steps[fn->num_steps];
    memset(s, 0, sizeof *s);
    s->src = (int64_t *)tb__calloc(n, sizeof(int64_t));
    s->consts = (tb_node **)tb__calloc(n, sizeof(tb_node *));
    if (s->src == NULL || s->consts == NULL) {
        tb__free(s->src);
        tb__free(s->consts);
        return NULL;
    }
    fn->num_steps++; /* from here tb_function_release frees it */
    s->op = node->op;
    s->shape = node->shape;
    s->device = node->device;
    s->num_attrs = node->num_attrs;
    memcpy(s->attrs, node->attrs, sizeof s->attrs);
    s->fattrs[0] = node->fattrs[0];
    s->fattrs[1] = node->fattrs[1];
    s->stop_grad = node->stop_grad;
    s->requires_grad = node->requires_grad;
    s->num_operands = num_operands;
    if (num_operands > fn->max_operands) fn->max_operands = num_operands;
    return s;
}

/* The step of `node`, whose operands all have their codes. */
static tb_status tb__fn_add_step(tb__fn_build *b, const tb_node *node) {
    tb__fn_step *s = tb__fn_new_step(b, node, node->num_operands);
    uint32_t j;
    if (s == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (j = 0; j < node->num_operands; j++) {
        int64_t code = *tb__exec_map_get(&b->codes, node->operands[j]);
        s->src[j] = code >= 0 ? code : -1;
        if (code < 0) {
            s->consts[j] = node->operands[j];
            tb__node_retain(node->operands[j]);
        }
    }
    return TB_OK;
}

/* A device-data node over input k's value that is not the input's own node (tb_detach of the
   input, for one) stands for that value with no gradient: an identity that stops gradients,
   over the call's input. */
static tb_status tb__fn_add_alias(tb__fn_build *b, const tb_node *node, size_t k) {
    tb__fn_step *s = tb__fn_new_step(b, node, 1);
    int32_t d;
    if (s == NULL) return TB_ERR_OUT_OF_MEMORY;
    s->op = TB_OP_RESHAPE;
    s->num_attrs = (uint32_t)node->shape.rank;
    for (d = 0; d < node->shape.rank; d++)
        s->attrs[d] = node->shape.dims[d];
    s->stop_grad = true;
    s->src[0] = (int64_t)k;
    return TB_OK;
}

/* What `node` is to the function, once its operands have their codes: shared, or a step. */
static tb_status tb__fn_resolve(tb__fn_build *b, const tb_node *node) {
    tb_function *fn = b->fn;
    uint32_t j;
    size_t k;
    bool reads_input = false;
    if (node->op == TB_OP_RAND || node->op == TB_OP_RANDN) {
        return tb__error(TB_ERR_UNSUPPORTED,
                         "tb_function_create: the graph draws random numbers (%s node %llu); each "
                         "call would draw the same ones again",
                         tb_op_name(node->op), (unsigned long long)node->id);
    }
    if (node->op == TB_OP_COLLECTIVE) {
        return tb__error(TB_ERR_UNSUPPORTED,
                         "tb_function_create: the graph has a collective (node %llu); every rank "
                         "records its collectives with the ops, in step with the others",
                         (unsigned long long)node->id);
    }
    for (j = 0; j < node->num_operands; j++) {
        if (*tb__exec_map_get(&b->codes, node->operands[j]) >= 0) reads_input = true;
    }
    if (node->op == TB_OP_DEVICE_DATA) {
        for (k = 0; k < fn->num_inputs; k++) {
            if (b->in_data[k] == NULL || b->in_data[k] != node->data) continue;
            if (tb__fn_add_alias(b, node, k) != TB_OK) return TB_ERR_OUT_OF_MEMORY;
            return tb__exec_map_put(&b->codes, node, (int64_t)(fn->num_inputs + fn->num_steps - 1));
        }
    }
    if (!reads_input) return tb__exec_map_put(&b->codes, node, TB__FN_SHARED);
    if (tb__fn_add_step(b, node) != TB_OK) return TB_ERR_OUT_OF_MEMORY;
    return tb__exec_map_put(&b->codes, node, (int64_t)(fn->num_inputs + fn->num_steps - 1));
}

/* The input whose value `node` holds (the node an input had before a sync gave the input that
   value: it stands for the input, and nothing below it is walked), or -1. */
static int64_t tb__fn_old_input(const tb__fn_build *b, const tb_node *node) {
    size_t k;
    for (k = 0; node->value != NULL && k < b->fn->num_inputs; k++) {
        if (b->in_data[k] == node->value) return (int64_t)k;
    }
    return -1;
}

/* Walks the graph below `root` in post-order (iteratively), giving each node its code. */
static tb_status tb__fn_walk(tb__fn_build *b, const tb_node *root) {
    size_t sp = 0;
    tb_status st;
    int64_t old;
    if (tb__exec_map_get(&b->codes, root) != NULL) return TB_OK;
    old = tb__fn_old_input(b, root);
    if (old >= 0) return tb__exec_map_put(&b->codes, root, old);
    if (tb__exec_map_put(&b->codes, root, TB__FN_VISITING) != TB_OK ||
        tb__grow((void **)&b->stack, &b->cap_stack, 1, sizeof *b->stack) != TB_OK) {
        return TB_ERR_OUT_OF_MEMORY;
    }
    b->stack[sp].node = root;
    b->stack[sp++].next = 0;
    while (sp > 0) {
        tb__fn_frame *f = &b->stack[sp - 1];
        const tb_node *node = f->node;
        if (f->next < node->num_operands) {
            const tb_node *operand = node->operands[f->next++];
            const int64_t *code = tb__exec_map_get(&b->codes, operand);
            if (code != NULL) {
                if (*code == TB__FN_VISITING) {
                    return tb__error(TB_ERR_INTERNAL,
                                     "tb_function_create: a loop through node %llu",
                                     (unsigned long long)operand->id);
                }
                continue;
            }
            old = tb__fn_old_input(b, operand);
            if (old >= 0) {
                if (tb__exec_map_put(&b->codes, operand, old) != TB_OK) {
                    return TB_ERR_OUT_OF_MEMORY;
                }
                continue;
            }
            if (tb__exec_map_put(&b->codes, operand, TB__FN_VISITING) != TB_OK ||
                tb__grow((void **)&b->stack, &b->cap_stack, sp + 1, sizeof *b->stack) != TB_OK) {
                return TB_ERR_OUT_OF_MEMORY;
            }
            b->stack[sp].node = operand;
            b->stack[sp++].next = 0;
            continue;
        }
        st = tb__fn_resolve(b, node);
        if (st != TB_OK) return st;
        sp--;
    }
    return TB_OK;
}

/* The inputs' codes, their values, and what a call checks of them. */
static tb_status tb__fn_inputs(tb__fn_build *b, tb_tensor *const *inputs) {
    tb_function *fn = b->fn;
    size_t i;
    fn->in_shapes = (tb_shape *)tb__calloc(fn->num_inputs + 1, sizeof(tb_shape));
    fn->in_devices = (tb_device *)tb__calloc(fn->num_inputs + 1, sizeof(tb_device));
    b->in_data = (tb_backend_data **)tb__calloc(fn->num_inputs + 1, sizeof(tb_backend_data *));
    if (fn->in_shapes == NULL || fn->in_devices == NULL || b->in_data == NULL) {
        return TB_ERR_OUT_OF_MEMORY;
    }
    for (i = 0; i < fn->num_inputs; i++) {
        const tb_node *node = tb__tensor_ir(inputs[i]);
        const int64_t *seen;
        if (node == NULL) return tb_last_status();
        seen = tb__exec_map_get(&b->codes, node);
        if (seen != NULL) {
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "tb_function_create: inputs[%lu] is inputs[%lld] again",
                             (unsigned long)i, (long long)*seen);
        }
        if (tb__exec_map_put(&b->codes, node, (int64_t)i) != TB_OK) return TB_ERR_OUT_OF_MEMORY;
        /* a value (never a sync: a tensor with no pending graph holds its value) */
        if (tb_tensor_node(inputs[i]) == NULL) b->in_data[i] = tb_tensor_data(inputs[i]);
        fn->in_shapes[i] = tb_tensor_shape(inputs[i]);
        fn->in_devices[i] = tb_tensor_device(inputs[i]);
    }
    return TB_OK;
}

/* Where each output comes from. */
static tb_status tb__fn_outputs(tb__fn_build *b, tb_tensor *const *outputs) {
    tb_function *fn = b->fn;
    size_t i;
    fn->out_src = (int64_t *)tb__calloc(fn->num_outputs, sizeof(int64_t));
    fn->out_const = (tb_node **)tb__calloc(fn->num_outputs, sizeof(tb_node *));
    fn->out_requires_grad = (bool *)tb__calloc(fn->num_outputs, sizeof(bool));
    if (fn->out_src == NULL || fn->out_const == NULL || fn->out_requires_grad == NULL) {
        return TB_ERR_OUT_OF_MEMORY;
    }
    for (i = 0; i < fn->num_outputs; i++) {
        fn->out_requires_grad[i] = outputs[i]->requires_grad;
        tb_node *node = (tb_node *)tb_tensor_node(outputs[i]);
        int64_t code = *tb__exec_map_get(&b->codes, node);
        if (code >= 0 && (size_t)code < fn->num_inputs) {
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "tb_function_create: outputs[%lu] is inputs[%lld] itself",
                             (unsigned long)i, (long long)code);
        }
        fn->out_src[i] = code >= 0 ? code : -1;
        if (code < 0) {
            fn->out_const[i] = node;
            tb__node_retain(node);
        }
    }
    return TB_OK;
}

TBDEF tb_function *tb_function_create(tb_tensor *const *inputs, size_t num_inputs,
                                      tb_tensor *const *outputs, size_t num_outputs) {
    tb__fn_build b;
    size_t i;
    tb_status st;
    if (tb__exec_check_list("tb_function_create", "inputs", inputs, num_inputs) != TB_OK ||
        tb__exec_check_list("tb_function_create", "outputs", outputs, num_outputs) != TB_OK) {
        return NULL;
    }
    if (num_outputs == 0) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_function_create: no outputs");
        return NULL;
    }
    for (i = 0; i < num_outputs; i++) {
        if (tb_tensor_node(outputs[i]) == NULL) {
            tb__error(TB_ERR_STATE,
                      "tb_function_create: outputs[%lu] has no pending graph (it was synced or "
                      "holds data); record the function before syncing",
                      (unsigned long)i);
            return NULL;
        }
    }
    memset(&b, 0, sizeof b);
    b.fn = (tb_function *)tb__calloc(1, sizeof *b.fn);
    if (b.fn == NULL) return NULL;
    b.fn->num_inputs = num_inputs;
    b.fn->num_outputs = num_outputs;
    st = tb__fn_inputs(&b, inputs);
    for (i = 0; st == TB_OK && i < num_outputs; i++)
        st = tb__fn_walk(&b, tb_tensor_node(outputs[i]));
    if (st == TB_OK) st = tb__fn_outputs(&b, outputs);
    tb__exec_map_free(&b.codes);
    tb__free(b.stack);
    tb__free(b.in_data);
    if (st != TB_OK) {
        if (st == TB_ERR_OUT_OF_MEMORY && tb_last_status() != TB_ERR_OUT_OF_MEMORY) {
            tb__error(TB_ERR_OUT_OF_MEMORY, "tb_function_create: out of memory");
        }
        tb_function_release(b.fn);
        return NULL;
    }
    return b.fn;
}

/* ---- calls ---- */

static tb_status tb__fn_check_input(const tb_function *fn, size_t i, tb_tensor *input) {
    tb_shape shape;
    tb_device device;
    tb__shape_buf a, b;
    char da[64], db[64];
    if (input == NULL) {
        if (tb_last_status() == TB_OK) {
            tb__error(TB_ERR_INVALID_ARGUMENT, "tb_function_call: inputs[%lu] is NULL",
                      (unsigned long)i);
        }
        return TB_ERR_INVALID_ARGUMENT;
    }
    shape = tb_tensor_shape(input);
    device = tb_tensor_device(input);
    if (shape.dtype != fn->in_shapes[i].dtype) {
        return tb__error(TB_ERR_DTYPE, "tb_function_call: inputs[%lu] is %s, the function takes %s",
                         (unsigned long)i, tb__st(&shape, &a), tb__st(&fn->in_shapes[i], &b));
    }
    if (!tb_shape_equal(&shape, &fn->in_shapes[i])) {
        return tb__error(TB_ERR_SHAPE, "tb_function_call: inputs[%lu] is %s, the function takes %s",
                         (unsigned long)i, tb__st(&shape, &a), tb__st(&fn->in_shapes[i], &b));
    }
    if (!tb_device_equal(&device, &fn->in_devices[i])) {
        tb__exec_device_text(&device, da);
        tb__exec_device_text(&fn->in_devices[i], db);
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_function_call: inputs[%lu] is on %s, the function's is on %s",
                         (unsigned long)i, da, db);
    }
    return TB_OK;
}

/* What the op calls would do with a node whose graph has grown past the limit: a tensor over it
   that the automatic flush may sync; *node becomes the tensor's operand node (its data node
   after a sync). */
static tb_status tb__fn_flush(tb_node **node) {
    tb_tensor *t;
    tb_node *ir;
    tb__node_retain(*node);
    t = tb__tensor_from_node(*node); /* consumes that reference; flushes where due */
    if (t == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
    ir = tb__tensor_ir(t);
    if (ir == NULL) {
        tb_tensor_release(t);
        return tb_last_status();
    }
    tb__node_retain(ir);
    tb__node_release(*node);
    *node = ir;
    tb_tensor_release(t);
    return TB_OK;
}

/* Makes the steps' nodes into values[num_inputs...] (owned references; *made counts them). */
static tb_status tb__fn_make(const tb_function *fn, tb_node **values, tb_node **operands,
                             size_t *made) {
    uint64_t limit =
        tb__desc()->max_graph_nodes > 0 ? (uint64_t)tb__desc()->max_graph_nodes : 100000u;
    size_t i;
    uint32_t j;
    for (i = 0; i < fn->num_steps; i++) {
        const tb__fn_step *s = &fn->steps[i];
        tb_node *node;
        for (j = 0; j < s->num_operands; j++)
            operands[j] = s->src[j] >= 0 ? values[s->src[j]] : s->consts[j];
        node = tb__emit("tb_function_call", s->op, &s->shape, &s->device, operands, s->num_operands,
                        s->attrs, s->num_attrs, s->fattrs);
        if (node == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
        if (s->stop_grad) {
            node->stop_grad = true;
            node->requires_grad = s->requires_grad;
        }
        values[fn->num_inputs + i] = node;
        (*made)++;
        if (node->graph_size > limit &&
            !s->stop_grad) { /* the ops flush where an op's tensor is made */
            tb_status st = tb__fn_flush(&values[fn->num_inputs + i]);
            if (st != TB_OK) return st;
        }
    }
    return TB_OK;
}

TBDEF tb_status tb_function_call(const tb_function *fn, tb_tensor *const *inputs, size_t num_inputs,
                                 tb_tensor **outputs, size_t num_outputs) {
    tb_node *local_values[64], *local_operands[8];
    tb_node **values = local_values, **operands = local_operands;
    size_t i, made = 0, done = 0, nv;
    tb_status st = TB_OK;
    if (outputs != NULL) {
        for (i = 0; i < num_outputs; i++)
            outputs[i] = NULL;
    }
    if (fn == NULL || outputs == NULL || (inputs == NULL && num_inputs > 0)) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_function_call: %s is NULL",
                         fn == NULL        ? "fn"
                         : outputs == NULL ? "outputs"
                                           : "inputs");
    }
    if (num_inputs != fn->num_inputs || num_outputs != fn->num_outputs) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_function_call: %lu inputs and %lu outputs given, the function has %lu "
                         "and %lu",
                         (unsigned long)num_inputs, (unsigned long)num_outputs,
                         (unsigned long)fn->num_inputs, (unsigned long)fn->num_outputs);
    }
    for (i = 0; i < num_inputs; i++) {
        if (tb__fn_check_input(fn, i, inputs[i]) != TB_OK) return tb_last_status();
    }
    nv = fn->num_inputs + fn->num_steps;
    if (nv > 64) values = (tb_node **)tb__calloc(nv, sizeof(tb_node *));
    if (fn->max_operands > 8)
        operands = (tb_node **)tb__calloc(fn->max_operands, sizeof(tb_node *));
    if (values == NULL || operands == NULL) {
        st = tb__error(TB_ERR_OUT_OF_MEMORY, "tb_function_call: out of memory");
    }
    for (i = 0; st == TB_OK && i < num_inputs; i++) {
        values[i] = tb__tensor_ir(inputs[i]); /* borrowed from the input */
        if (values[i] == NULL) st = tb_last_status();
    }
    if (st == TB_OK) st = tb__fn_make(fn, values, operands, &made);
    for (done = 0; st == TB_OK && done < num_outputs; done++) {
        tb_node *node = fn->out_src[done] >= 0 ? values[fn->out_src[done]] : fn->out_const[done];
        if (fn->out_src[done] >= 0) {
            tb__node_retain(node);
        } else {
            /* a node of the call's own over the shared one: the sync that computes this output
               gives its value to that node, never to the node every call shares */
            node = tb__emit("tb_function_call", TB_OP_RESHAPE, &node->shape, &node->device, &node,
                            1, node->shape.dims, (size_t)node->shape.rank, NULL);
            if (node == NULL) {
                st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
                break;
            }
        }
        outputs[done] = tb__tensor_from_node(node); /* consumes the reference */
        if (outputs[done] == NULL) {
            st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
        } else {
            outputs[done]->requires_grad = fn->out_requires_grad[done];
        }
    }
    if (st != TB_OK) {
        for (i = 0; i < num_outputs; i++) {
            tb_tensor_release(outputs[i]);
            outputs[i] = NULL;
        }
    }
    for (i = 0; i < made; i++)
        tb__node_release(values[fn->num_inputs + i]);
    if (values != local_values) tb__free(values);
    if (operands != local_operands) tb__free(operands);
    return st;
}

#undef TB__FN_VISITING
#undef TB__FN_SHARED
