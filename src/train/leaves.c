/* ===========================================================================================
   Leaves of autograd: tb_set_requires_grad, tb_requires_grad, tb_detach, and tb_assign with
   what a tensor holds across an assignment that may have to be undone (tb__held, which the
   optimizers use).
   =========================================================================================== */
#include "../impl_begin.h"

/* ---- requires_grad, detach, assign ---- */

/* x's node behind an identity the walk does not pass (stop_grad), flagged as asked. */
static tb_node *tb__ag_leaf_node(const char *fn, tb_node *x, bool requires_grad) {
    tb_node *node = tb__emit(fn, TB_OP_RESHAPE, &x->shape, &x->device, &x, 1, x->shape.dims,
                             (size_t)x->shape.rank, NULL);
    if (node == NULL) return NULL;
    node->stop_grad = true;
    node->requires_grad = requires_grad;
    return node;
}

/* A fresh device-data node over the tensor's data, flagged as asked. */
static tb_node *tb__ag_data_node(tb_backend_data *data, bool requires_grad) {
    tb_node *node = tb__node_device_data(data);
    if (node != NULL) node->requires_grad = requires_grad;
    return node;
}

TBDEF tb_tensor *tb_detach(tb_tensor *x) {
    const char *fn = "tb_detach";
    tb_tensor *t;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (x->data != NULL) {
        tb__data_retain(x->data);
        return tb__tensor_from_data(x->data);
    }
    t = tb__tensor_from_node(tb__ag_leaf_node(fn, x->node, false));
    return t;
}

TBDEF bool tb_requires_grad(const tb_tensor *tensor) {
    if (tensor == NULL) return false;
    if (tensor->requires_grad) return true;
    if (tensor->node != NULL) return tensor->node->requires_grad;
    return tensor->history != NULL;
}

TBDEF tb_status tb_set_requires_grad(tb_tensor *tensor, bool requires_grad) {
    const char *fn = "tb_set_requires_grad";
    tb_node *node;
    tb__ensure_setup();
    if (tensor == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: tensor is NULL", fn);
    if (requires_grad && !tb_dtype_is_float(tensor->shape.dtype)) {
        return tb__error(TB_ERR_DTYPE,
                         "%s: the tensor is %s; only floating-point tensors can require grad", fn,
                         tb_dtype_name(tensor->shape.dtype));
    }
    if (tensor->data != NULL) {
        node = tb__ag_data_node(tensor->data, requires_grad);
        if (node == NULL)
            return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
        if (tensor->history != NULL) tb__node_release(tensor->history); /* no longer followed */
        tensor->history = NULL;
        if (tensor->data_node != NULL) tb__node_release(tensor->data_node);
        tensor->data_node = node;
    } else {
        node = tb__ag_leaf_node(fn, tensor->node, requires_grad);
        if (node == NULL)
            return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
        tb__node_release(tensor->node);
        tensor->node = node;
    }
    tensor->requires_grad = requires_grad;
    return TB_OK;
}

static void tb__held_take(tb__held *h, tb_tensor *t) {
    h->t = tb_tensor_retain(t);
    h->node = t->node, h->history = t->history, h->data_node = t->data_node;
    h->data = t->data, h->donor = t->donor;
    if (h->node != NULL) tb__node_retain(h->node);
    if (h->history != NULL) tb__node_retain(h->history);
    if (h->data_node != NULL) tb__node_retain(h->data_node);
    if (h->data != NULL) tb__data_retain(h->data);
    if (h->donor != NULL) tb__data_retain(h->donor);
}

static void tb__held_drop(tb__held *h) {
    if (h->node != NULL) tb__node_release(h->node);
    if (h->history != NULL) tb__node_release(h->history);
    if (h->data_node != NULL) tb__node_release(h->data_node);
    if (h->data != NULL) tb__data_release(h->data);
    if (h->donor != NULL) tb__data_release(h->donor);
    if (h->t != NULL) tb_tensor_release(h->t);
    memset(h, 0, sizeof *h);
}

/* Puts back what the tensor held; false when that value's buffer was consumed meanwhile (a
   run that failed after it began to write into donated buffers). */
static bool tb__held_restore(tb__held *h) {
    tb_tensor *t = h->t;
    bool intact =
        !(h->data != NULL && h->data->tb__donated) && !(h->donor != NULL && h->donor->tb__donated);
    if (t == NULL) return true;
    if (t->node != NULL) tb__node_release(t->node);
    if (t->history != NULL) tb__node_release(t->history);
    if (t->data_node != NULL) tb__node_release(t->data_node);
    if (t->data != NULL) tb__data_release(t->data);
    if (t->donor != NULL) tb__data_release(t->donor);
    t->node = h->node, t->history = h->history, t->data_node = h->data_node;
    t->data = h->data, t->donor = h->donor;
    h->node = h->history = h->data_node = NULL;
    h->data = h->donor = NULL;
    tb_tensor_release(t);
    h->t = NULL;
    return intact;
}

/* A live tensor holding what `h` holds as its value: while it lives, that buffer is read by
   someone and cannot be donated. NULL when there is no value (or no memory). */
static tb_tensor *tb__held_guard(const tb__held *h) {
    if (h->data == NULL) return NULL;
    tb__data_retain(h->data);
    return tb__tensor_from_data(h->data);
}

TBDEF tb_status tb_assign(tb_tensor *dst, tb_tensor *value) {
    const char *fn = "tb_assign";
    tb_node *node = NULL, *data_node = NULL, *history = NULL;
    tb_backend_data *data = NULL, *donor = NULL;
    tb__ensure_setup();
    if (dst == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: dst is NULL", fn);
    if (value == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: value is NULL", fn);
    if (!tb_shape_equal(&dst->shape, &value->shape)) {
        char a[96], b[96];
        tb__shape_text(&dst->shape, a);
        tb__shape_text(&value->shape, b);
        return tb__error(TB_ERR_SHAPE, "%s: dst is %s, value is %s (they must be equal)", fn, a, b);
    }
    if (!tb_device_equal(&dst->device, &value->device)) {
        char a[64], b[64];
        tb_device_format(&dst->device, a, sizeof a);
        tb_device_format(&value->device, b, sizeof b);
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: dst is on %s, value on %s", fn, a, b);
    }
    if (dst == value) return TB_OK;
    if (value->data != NULL) {
        data = value->data;
        if (dst->requires_grad || value->history != NULL) {
            /* a leaf either way: dst's own flag, no history (an optimizer's state computed
               from gradients must not keep every earlier step alive) */
            data_node = tb__ag_data_node(data, dst->requires_grad);
            if (data_node == NULL) return tb_last_status();
        } else if (value->data_node != NULL) {
            data_node = value->data_node;
            tb__node_retain(data_node);
        }
        tb__data_retain(data);
    } else if (dst->requires_grad || value->node->requires_grad) {
        node = tb__ag_leaf_node(fn, value->node, dst->requires_grad);
        if (node == NULL) return tb_last_status();
    } else {
        node = value->node;
        tb__node_retain(node);
    }
    if (node != NULL) {
        /* the value dst holds (or the one it held before an assignment not yet synced) is the
           donor: the sync computing the new value may compute it into that buffer */
        donor = dst->data != NULL ? dst->data : dst->donor;
        if (donor != NULL) tb__data_retain(donor);
    }
    if (dst->node != NULL) tb__node_release(dst->node);
    if (dst->history != NULL) tb__node_release(dst->history);
    if (dst->data_node != NULL) tb__node_release(dst->data_node);
    if (dst->data != NULL) tb__data_release(dst->data);
    if (dst->donor != NULL) tb__data_release(dst->donor);
    dst->node = node;
    dst->history = history;
    dst->data_node = data_node;
    dst->data = data;
    dst->donor = donor;
    return TB_OK;
}
