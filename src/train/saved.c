/* tb_sync_for_grad: a sync that keeps the forward's values a later backward reads (PyTorch's
   saved tensors), chosen from the backward's rules by recording the backward once. */

/* The nodes whose values a backward saved by tb_sync_for_grad reads from buffers. */
typedef struct tb__ag_saved {
    tb__exec_map seen; /* nodes looked at (and the roots, whose values the sync keeps anyway) */
    tb_node **list;
    size_t num, cap;
    tb_node **stack;
    size_t cap_stack;
} tb__ag_saved;

/* Adds the forward node `node` (one of `fwd`'s computed nodes that the backward reads) to the
   saved list. A view (a movement op: reshape, permute, expand, slice, flip, window) is computed
   again from its operand, which is saved in its place: storing a view would copy it, an
   expanded one at its full size. Every other op is saved as it is, elementwise ones too (as
   PyTorch saves tensors): a ResNet's backward that computed its batch norms and ReLUs again
   from the saved convolutions instead ran slower, since the forward writes most of those
   values anyway (the next convolution's input). Generators (arange, rand) are leaves,
   computed again from their attributes to the same values. */
static tb_status tb__ag_save(tb__ag_saved *s, const tb__exec_walk *fwd, tb_node *node) {
    size_t sp = 0;
    if (tb__grow((void **)&s->stack, &s->cap_stack, 1, sizeof *s->stack) != TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    s->stack[sp++] = node;
    while (sp > 0) {
        tb_node *n = s->stack[--sp];
        tb_op_kind kind = tb_op_get_kind(n->op);
        uint32_t k;
        if (tb__exec_is_param(n) || kind == TB_KIND_LEAF || tb__exec_map_get(&s->seen, n) != NULL ||
            tb__exec_map_get(&fwd->pos, n) == NULL)
            continue;
        if (tb__exec_map_put(&s->seen, n, 0) != TB_OK) return TB_ERR_OUT_OF_MEMORY;
        if (kind == TB_KIND_MOVEMENT) {
            if (tb__grow((void **)&s->stack, &s->cap_stack, sp + n->num_operands,
                         sizeof *s->stack) != TB_OK)
                return TB_ERR_OUT_OF_MEMORY;
            for (k = 0; k < n->num_operands; k++)
                s->stack[sp++] = n->operands[k];
            continue;
        }
        if (tb__grow((void **)&s->list, &s->cap, s->num + 1, sizeof *s->list) != TB_OK)
            return TB_ERR_OUT_OF_MEMORY;
        s->list[s->num++] = n;
    }
    return TB_OK;
}

/* The forward nodes that the backward of `out` with respect to `inputs` reads, added to `s`:
   the backward is recorded with a stand-in seed (out itself, detached: no rule treats it as a
   constant), walked, and dropped. */
static tb_status tb__ag_saved_of(tb__ag_saved *s, const char *fn, tb_tensor *out,
                                 tb_tensor *const *inputs, size_t n, const tb__exec_walk *fwd) {
    tb__ag a;
    tb__exec_walk bwd;
    tb_tensor **grads, *seed;
    tb_node **roots;
    size_t i, m = 0;
    uint32_t k;
    tb_status st;
    grads = (tb_tensor **)tb__calloc(n + 1, sizeof *grads);
    roots = (tb_node **)tb__calloc(n + 1, sizeof *roots);
    tb__no_auto_flush++; /* walked only: the flush's exact counts would cost more than it */
    seed = tb_detach(out);
    if (grads == NULL || roots == NULL || seed == NULL) {
        tb__no_auto_flush--;
        tb__free(grads);
        tb__free(roots);
        tb_tensor_release(seed);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
    }
    tb__ag_init(&a, fn);
    a.device = tb_tensor_device(out);
    st = tb__grad(&a, out, seed, inputs, n, grads);
    tb__no_auto_flush--;
    tb__ag_free(&a);
    tb_tensor_release(seed);
    for (i = 0; i < n && st == TB_OK; i++) {
        if (grads[i] != NULL && grads[i]->node != NULL) roots[m++] = grads[i]->node;
    }
    memset(&bwd, 0, sizeof bwd);
    if (st == TB_OK) st = tb__exec_walk_add(&bwd, fn, roots, m);
    /* the forward's computed nodes that the backward's own nodes read */
    for (i = 0; i < bwd.num_order && st == TB_OK; i++) {
        const tb_node *node = bwd.order[i];
        if (tb__exec_map_get(&fwd->pos, node) != NULL || tb__exec_is_param(node)) continue;
        for (k = 0; k < node->num_operands && st == TB_OK; k++) {
            if (tb__exec_map_get(&fwd->pos, node->operands[k]) != NULL)
                st = tb__ag_save(s, fwd, node->operands[k]);
        }
    }
    tb__exec_walk_free(&bwd);
    for (i = 0; i < n; i++)
        tb_tensor_release(grads[i]);
    tb__free(grads);
    tb__free(roots);
    return st;
}

TBDEF tb_status tb_sync_for_grad(tb_tensor *const *tensors, size_t count, tb_tensor *const *inputs,
                                 size_t n) {
    const char *fn = "tb_sync_for_grad";
    tb__ag_saved s;
    tb__exec_walk fwd;
    tb__exec_roots roots;
    size_t i;
    tb_status st;
    tb__ensure_setup();
    st = tb__exec_check_list(fn, "tensors", tensors, count);
    if (st != TB_OK) return st;
    if (n > 0 && inputs == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: inputs is NULL", fn);
    /* the pending nodes, on one device (as the sync will check) */
    st = tb__exec_roots_collect(&roots, fn, tensors, count, false, true);
    if (st != TB_OK) return st;
    for (i = 0; i < n && st == TB_OK; i++) {
        tb_device d;
        char a[64], b[64];
        if (inputs[i] == NULL) {
            st = tb__error(TB_ERR_INVALID_ARGUMENT, "%s: inputs[%zu] is NULL", fn, i);
            break;
        }
        if (!tb_dtype_is_float(inputs[i]->shape.dtype)) {
            st = tb__error(TB_ERR_DTYPE,
                           "%s: inputs[%zu] is %s; only floating-point tensors have gradients", fn,
                           i, tb_dtype_name(inputs[i]->shape.dtype));
            break;
        }
        d = tb_tensor_device(inputs[i]);
        if (roots.count > 0 && !tb_device_equal(&d, &roots.device)) {
            tb__exec_device_text(&roots.device, a);
            tb__exec_device_text(&d, b);
            st = tb__error(TB_ERR_INVALID_ARGUMENT, "%s: inputs[%zu] is on %s, the tensors on %s",
                           fn, i, b, a);
        }
    }
    memset(&s, 0, sizeof s);
    memset(&fwd, 0, sizeof fwd);
    for (i = 0; i < roots.count && st == TB_OK; i++) /* kept by the sync anyway */
        st = tb__exec_map_put(&s.seen, roots.nodes[i], 0);
    if (st == TB_OK && n > 0) st = tb__exec_walk_add(&fwd, fn, roots.nodes, roots.count);
    for (i = 0; i < count && st == TB_OK && n > 0; i++) {
        tb_tensor *t = tensors[i];
        if (t->node != NULL && t->node->requires_grad && !t->node->stop_grad &&
            tb_dtype_is_float(t->shape.dtype))
            st = tb__ag_saved_of(&s, fn, t, inputs, n, &fwd);
    }
    if (st == TB_OK) st = tb__exec_sync_with(tensors, count, s.list, s.num, fn);
    if (st == TB_OK) tb__metric_count("SavedForGrad", (int64_t)s.num);
    tb__exec_roots_free(&roots);
    tb__free(s.list);
    tb__free(s.stack);
    tb__exec_map_free(&s.seen);
    tb__exec_walk_free(&fwd);
    return st;
}
