/* ===========================================================================================
   IR: detached graphs (tb__graph_detach): a copy of a graph's structure that holds no values
   (parameters become leaves without data), which a backend can keep beyond the graph.
   =========================================================================================== */
#include "../impl_begin.h"

/* ---- detached graphs ---- */

/* Maps an original node to its position in the post-order (open addressing on the pointer). */
typedef struct tb__node_index {
    const tb_node **keys;
    size_t *values;
    size_t cap;
} tb__node_index;

static size_t tb__node_index_slot(const tb__node_index *index, const tb_node *node) {
    size_t slot = (size_t)(tb__hash_u64(0, (uint64_t)(uintptr_t)node) & (index->cap - 1));
    while (index->keys[slot] != NULL && index->keys[slot] != node)
        slot = (slot + 1) & (index->cap - 1);
    return slot;
}

TB__UNUSED static void tb__graph_detached_free(tb__detached_graph *detached) {
    size_t i;
    if (detached == NULL) return;
    for (i = 0; i < detached->graph.num_nodes; i++)
        tb__node_release(detached->nodes[i]);
    tb__free(detached->nodes);
    tb__free(detached->parameters);
    tb__free(detached->results);
    memset(detached, 0, sizeof *detached);
}

TB__UNUSED static tb_status tb__graph_detach(const tb_graph *graph, tb__detached_graph *out) {
    tb__node_index index;
    size_t i, j, n = graph->num_nodes;
    tb_status status = TB_OK;
    memset(out, 0, sizeof *out);
    memset(&index, 0, sizeof index);
    index.cap = 16;
    while (index.cap < 2 * n + 2)
        index.cap *= 2;
    index.keys = (const tb_node **)tb__calloc(index.cap, sizeof *index.keys);
    index.values = (size_t *)tb__calloc(index.cap, sizeof *index.values);
    out->nodes = (tb_node **)tb__calloc(n + 1, sizeof *out->nodes);
    out->parameters = (tb_node **)tb__calloc(graph->num_parameters + 1, sizeof *out->parameters);
    out->results = (tb_node **)tb__calloc(graph->num_results + 1, sizeof *out->results);
    if (index.keys == NULL || index.values == NULL || out->nodes == NULL ||
        out->parameters == NULL || out->results == NULL) {
        status = TB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (i = 0; i < n; i++) {
        size_t slot = tb__node_index_slot(&index, graph->nodes[i]);
        index.keys[slot] = graph->nodes[i];
        index.values[slot] = i;
    }
    /* Parameters become leaves that hold no value: their values arrive at execution. */
    for (i = 0; i < graph->num_parameters; i++) {
        size_t slot = tb__node_index_slot(&index, graph->parameters[i]);
        if (index.keys[slot] == NULL) {
            status = tb__error(TB_ERR_INTERNAL,
                               "tb__graph_detach: parameter %zu is not a node of "
                               "the graph",
                               i);
            goto done;
        }
        index.values[slot] |= (size_t)1 << (sizeof(size_t) * CHAR_BIT - 1);
    }
    for (i = 0; i < n; i++) {
        const tb_node *node = graph->nodes[i];
        size_t slot = tb__node_index_slot(&index, node);
        bool is_parameter = (index.values[slot] >> (sizeof(size_t) * CHAR_BIT - 1)) != 0;
        tb_node *copy;
        if (is_parameter) {
            copy = tb__node_alloc(node->op == TB_OP_SCALAR ? TB_OP_SCALAR : TB_OP_DEVICE_DATA,
                                  &node->shape, &node->device);
            if (copy != NULL) {
                copy->wrapped_number = node->wrapped_number;
                copy->hash = node->hash;
            }
        } else {
            tb_node *operands[64];
            tb_node **ops = operands;
            if (node->num_operands > 64) {
                ops = (tb_node **)tb__calloc(node->num_operands, sizeof *ops);
                if (ops == NULL) {
                    status = TB_ERR_OUT_OF_MEMORY;
                    goto done;
                }
            }
            for (j = 0; j < node->num_operands; j++) {
                size_t s = tb__node_index_slot(&index, node->operands[j]);
                size_t at = index.values[s] & ~((size_t)1 << (sizeof(size_t) * CHAR_BIT - 1));
                if (index.keys[s] == NULL || at >= i) {
                    if (ops != operands) tb__free(ops);
                    status =
                        tb__error(TB_ERR_INTERNAL,
                                  "tb__graph_detach: an operand of node %zu comes after it", i);
                    goto done;
                }
                ops[j] = out->nodes[at];
            }
            copy = tb__node_new(node->op, &node->shape, &node->device, ops, node->num_operands,
                                node->attrs, node->num_attrs, node->fattrs);
            if (ops != operands) tb__free(ops);
        }
        if (copy == NULL) {
            status = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
            goto done;
        }
        out->nodes[i] = copy;
        out->graph.num_nodes = i + 1;
    }
    for (i = 0; i < graph->num_parameters; i++)
        out->parameters[i] =
            out->nodes[index.values[tb__node_index_slot(&index, graph->parameters[i])] &
                       ~((size_t)1 << (sizeof(size_t) * CHAR_BIT - 1))];
    for (i = 0; i < graph->num_results; i++) {
        size_t slot = tb__node_index_slot(&index, graph->results[i]);
        if (index.keys[slot] == NULL) {
            status = tb__error(TB_ERR_INTERNAL, "tb__graph_detach: result %zu is not a node", i);
            goto done;
        }
        out->results[i] =
            out->nodes[index.values[slot] & ~((size_t)1 << (sizeof(size_t) * CHAR_BIT - 1))];
    }
    out->graph.nodes = (const tb_node *const *)out->nodes;
    out->graph.parameters = (const tb_node *const *)out->parameters;
    out->graph.num_parameters = graph->num_parameters;
    out->graph.results = (const tb_node *const *)out->results;
    out->graph.num_results = graph->num_results;
    out->graph.hash = graph->hash;
    out->graph.device = graph->device;
done:
    tb__free((void *)index.keys);
    tb__free(index.values);
    if (status != TB_OK) tb__graph_detached_free(out);
    return status;
}
