/* ===========================================================================================
   Kernel planner: turns a graph into a kernel plan, the only interface between scheduling and
   code generation. It knows nothing of OpenCL or of any language: it decides which nodes form
   which kernel (elementwise chains fused; elementwise producers fused into reductions, norms
   and matmul operands as index arithmetic; elementwise consumers as epilogues), which
   reductions are split into a partial and a final stage, which matmuls read packed operand
   panels, which buffers each kernel reads and how long each lives, the launch geometry and the
   kernel names. Every decision is made here, before any code is emitted, within budgets that
   keep each kernel's code small; the renderer (codegen.c, codegen_kernels.c) then emits
   exactly this plan.

   Every node is either materialised (a parameter, or the output of a kernel: a "root") or
   inlined into the one kernel that reads it (views read by several kernels are inlined into
   each: they are index arithmetic only).
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* ---- small helpers ---- */

static bool tb__plan_same_dims(const tb_shape *a, const tb_shape *b) {
    int32_t i;
    if (a->rank != b->rank) return false;
    for (i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

/* Elements of a shape already checked by the IR (no overflow). */
static int64_t tb__plan_numel(const tb_shape *s) {
    int64_t n = 1;
    int32_t i;
    for (i = 0; i < s->rank; i++)
        n *= s->dims[i];
    return n;
}

static const tb_custom_op_desc *tb__plan_custom(tb_op op) {
    return op >= TB_OP_BUILTIN_COUNT ? tb_op_custom_desc(op) : NULL;
}

/* Elementwise ops: their operands are read at the same (broadcast) position. A custom op is
   one when it has a kernel expression and the default (broadcast) shape rule. */
static bool tb__plan_is_elementwise(tb_op op) {
    tb_op_kind kind = tb_op_get_kind(op);
    if (kind == TB_KIND_UNARY || kind == TB_KIND_BINARY || kind == TB_KIND_TERNARY) return true;
    if (kind == TB_KIND_CUSTOM) {
        const tb_custom_op_desc *d = tb__plan_custom(op);
        return d != NULL && d->opencl_expr != NULL && d->infer_shape == NULL;
    }
    return false;
}

/* Ops computed where they are used. */
static bool tb__plan_is_inlinable(tb_op op) {
    tb_op_kind kind = tb_op_get_kind(op);
    if (tb__plan_is_elementwise(op)) return true;
    if (kind == TB_KIND_MOVEMENT || kind == TB_KIND_OTHER) return true;
    return op == TB_OP_ARANGE || op == TB_OP_EYE || op == TB_OP_RAND || op == TB_OP_RANDN;
}

/* Ops a matmul operand may read through without a copy (index arithmetic only). */
static bool tb__plan_is_view_like(tb_op op) {
    return tb_op_get_kind(op) == TB_KIND_MOVEMENT || op == TB_OP_CAST;
}

/* Ops that open a block of their own in a kernel (their operands are evaluated inside it). */
static bool tb__plan_is_nesting(tb_op op) {
    return op == TB_OP_PAD || op == TB_OP_CONCAT || op == TB_OP_GATHER || op == TB_OP_INDEX_SELECT;
}

/* A concat of more operands than one evaluated where it is read may have: materialised by
   kernels of its own (tb__plan_split_concats). */
#define TB__PLAN_CAT_INLINE 8
#define TB__PLAN_CAT_TREE   128 /* operands of a kernel's tree of them, at most */
static bool tb__plan_cat_many(const tb_node *n) {
    return n->op == TB_OP_CONCAT && n->num_operands > TB__PLAN_CAT_INLINE;
}

/* A reduction over at most this many elements per output is computed where it is read, as an
   elementwise op (unrolled; pools and depthwise convolutions up to 5 x 5 windows): a kernel of
   its own would run one short loop per work item. */
#define TB__PLAN_INLINE_REDUCE 25

/* Whether n is a sum, mean, max or min of f32 or f64 over some axes of one operand of its own
   dtype: the reductions that may be computed where they are read, or hoisted. */
static bool tb__plan_float_reduce(const tb_node *n) {
    return (n->op == TB_OP_SUM || n->op == TB_OP_MEAN || n->op == TB_OP_MAX ||
            n->op == TB_OP_MIN) &&
           (n->shape.dtype == TB_F32 || n->shape.dtype == TB_F64) && n->num_operands == 1 &&
           n->operands[0]->shape.dtype == n->shape.dtype && n->attrs[0] != 0;
}

/* The elements per output of a reduction computed where it is read (tb__plan_inline_reduce),
   else 0. */
static int64_t tb__plan_inline_reduce(const tb_node *n) {
    int64_t m = 1;
    int32_t a;
    if (n->op == TB_OP_ARGMAX || n->op == TB_OP_ARGMIN) { /* of a float along one axis */
        const tb_shape *xs = n->num_operands == 1 ? &n->operands[0]->shape : NULL;
        if (xs == NULL || (xs->dtype != TB_F32 && xs->dtype != TB_F64) || n->num_attrs < 2 ||
            n->attrs[0] < 0 || n->attrs[0] >= xs->rank)
            return 0;
        m = xs->dims[n->attrs[0]];
        return m >= 2 && m <= TB__PLAN_INLINE_REDUCE && tb__plan_numel(&n->shape) >= 2 ? m : 0;
    }
    if (!tb__plan_float_reduce(n)) return 0;
    for (a = 0; a < n->operands[0]->shape.rank; a++)
        if (((uint64_t)n->attrs[0] >> a) & 1u) m *= n->operands[0]->shape.dims[a];
    return m >= 2 && m <= TB__PLAN_INLINE_REDUCE && tb__plan_numel(&n->shape) >= 2 ? m : 0;
}

/* The accumulators of a hoisted reduction's loop (tb__plan_hoist): several where it reduces
   more than an inlined one may, else 1 (in order: ties keep the first, as there). */
static int32_t tb__plan_hoist_lanes(const tb_node *n) {
    int64_t out = tb__plan_numel(&n->shape);
    return out > 0 && tb__plan_numel(&n->operands[0]->shape) / out > TB__PLAN_INLINE_REDUCE
               ? TB__HOIST_LANES
               : 1;
}

static int32_t tb__plan_core_kind(const tb_node *n) {
    if (tb__plan_inline_reduce(n) > 0) return -1;
    switch (tb_op_get_kind(n->op)) {
    case TB_KIND_REDUCE:
        return TB__K_REDUCE;
    case TB_KIND_MATMUL:
        return TB__K_MATMUL;
    case TB_KIND_NORM:
        return TB__K_NORM;
    default:
        return -1;
    }
}

static int32_t tb__plan_operand(const tb__pgraph *G, int32_t node, size_t k) {
    return G->operands[G->info[node].first_operand + (int32_t)k];
}

static const tb_shape *tb__plan_shape(const tb__pgraph *G, int32_t node) {
    return &G->info[node].node->shape;
}

static size_t tb__plan_ptr_hash(const void *p, size_t cap) {
    uint64_t h = tb__hash_u64(0x6f70656e636c6d61ull, (uint64_t)(uintptr_t)p);
    return (size_t)(h & (uint64_t)(cap - 1));
}

static int32_t tb__plan_index_of(const tb__pgraph *G, const tb_node *node) {
    size_t i = tb__plan_ptr_hash(node, G->map_cap);
    while (G->map_keys[i] != NULL) {
        if (G->map_keys[i] == node) return G->map_vals[i];
        i = (i + 1) & (G->map_cap - 1);
    }
    return -1;
}

static void tb__plan_free(tb__plan *p) {
    size_t i;
    if (p == NULL) return;
    for (i = 0; i < p->num_kernels; i++) {
        tb__free(p->kernels[i].args);
        tb__free(p->kernels[i].table_params);
    }
    tb__free(p->kernels);
    tb__free(p->slots);
    tb__free(p->param_scalar);
    tb__free(p->param_dtype);
    tb__free(p->result_slot);
    tb__free(p->result_source);
    tb__free(p->result_alias);
    tb__free(p->errsites);
    tb__free(p->node_kernel);
    tb__free(p);
}

static void tb__pgraph_free(tb__pgraph *G) {
    tb__free(G->info);
    tb__free(G->operands);
    tb__free(G->users);
    tb__free((void *)G->map_keys);
    tb__free(G->map_vals);
    tb__free(G->keys);
    tb__free(G->kernel_values);
    memset(G, 0, sizeof *G);
}

/* ---- the graph view: node table, operand and user lists, parameters and results ---- */

static tb_status tb__pgraph_init(tb__pgraph *G) {
    const tb_graph *g = G->graph;
    size_t i, k, pass, total_ops = 0;
    int32_t *fill, *seen, at = 0;
    G->n = g->num_nodes;
    if (G->n > (size_t)INT32_MAX / 2) {
        return tb__error(TB_ERR_UNSUPPORTED, "planner: a graph of %zu nodes is too large", G->n);
    }
    G->info = (tb__pnode *)tb__calloc(G->n + 1, sizeof *G->info);
    G->map_cap = 16;
    while (G->map_cap < 2 * G->n + 2)
        G->map_cap *= 2;
    G->map_keys = (const tb_node **)tb__calloc(G->map_cap, sizeof *G->map_keys);
    G->map_vals = (int32_t *)tb__calloc(G->map_cap, sizeof *G->map_vals);
    if (G->info == NULL || G->map_keys == NULL || G->map_vals == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < G->n; i++) {
        const tb_node *node = g->nodes[i];
        size_t h = tb__plan_ptr_hash(node, G->map_cap);
        while (G->map_keys[h] != NULL)
            h = (h + 1) & (G->map_cap - 1);
        G->map_keys[h] = node;
        G->map_vals[h] = (int32_t)i;
        G->info[i].node = node;
        G->info[i].param = -1;
        G->info[i].result = -1;
        G->info[i].slot = -1;
        G->info[i].ctx = -1;
        total_ops += node->num_operands;
    }
    G->operands = (int32_t *)tb__calloc(total_ops + 1, sizeof *G->operands);
    G->users = (int32_t *)tb__calloc(total_ops + 1, sizeof *G->users);
    fill = (int32_t *)tb__calloc(2 * (G->n + 1), sizeof *fill);
    if (G->operands == NULL || G->users == NULL || fill == NULL) {
        tb__free(fill);
        return TB_ERR_OUT_OF_MEMORY;
    }
    seen = fill + G->n + 1; /* per node: the mark of the last user that counted it */
    for (i = 0; i < g->num_parameters; i++) {
        int32_t p = tb__plan_index_of(G, g->parameters[i]);
        if (p < 0) {
            tb__free(fill);
            return tb__error(TB_ERR_INTERNAL, "planner: parameter %zu is not in the graph", i);
        }
        G->info[p].param = (int32_t)i;
    }
    for (i = 0; i < g->num_results; i++) {
        int32_t r = tb__plan_index_of(G, g->results[i]);
        if (r < 0) {
            tb__free(fill);
            return tb__error(TB_ERR_INTERNAL, "planner: result %zu is not in the graph", i);
        }
        if (G->info[r].result < 0) G->info[r].result = (int32_t)i;
    }
    /* operands (parameters are leaves: their operands are not part of this graph's work) */
    total_ops = 0;
    for (i = 0; i < G->n; i++) {
        const tb_node *node = G->info[i].node;
        G->info[i].first_operand = (int32_t)total_ops;
        if (G->info[i].param >= 0) continue;
        for (k = 0; k < node->num_operands; k++) {
            int32_t o = tb__plan_index_of(G, node->operands[k]);
            if (o < 0 || (size_t)o >= i) {
                tb__free(fill);
                return tb__error(TB_ERR_INTERNAL,
                                 "planner: the graph is not in post-order (node %zu, operand %zu)",
                                 i, k);
            }
            G->operands[total_ops++] = o;
            G->info[o].uses++;
        }
    }
    /* distinct users, grouped per node: counted (pass 0), then filled (pass 1); a node's
       repeats among one user's operands are seen by their mark (a pass over the operands) */
    for (pass = 0; pass < 2; pass++) {
        for (i = 0; i < G->n; i++) {
            const tb_node *node = G->info[i].node;
            int32_t mark = (int32_t)(pass * G->n + i) + 1;
            if (G->info[i].param >= 0) continue;
            for (k = 0; k < node->num_operands; k++) {
                int32_t o = tb__plan_operand(G, (int32_t)i, k);
                if (seen[o] == mark) continue;
                seen[o] = mark;
                if (pass == 0) {
                    G->info[o].num_users++;
                } else {
                    G->users[G->info[o].first_user + fill[o]++] = (int32_t)i;
                }
            }
        }
        for (i = 0; pass == 0 && i < G->n; i++) {
            G->info[i].first_user = at;
            at += G->info[i].num_users;
        }
    }
    tb__free(fill);
    return TB_OK;
}

/* ---- positions and budgets ----
   A node inlined into a kernel is evaluated once per distinct position its users read it at,
   and each evaluation is code. The planner names positions by keys: a user at key q reads an
   operand at q itself when the operand is aligned with it (an elementwise op over equal dims),
   else at a key mixed from q, the user and the operand slot; a kernel's core reads its operands
   at keys of its own (the accumulators of a reduction loop, the passes of a norm, the rows and
   columns of a matmul block). Two keys may name one position: an over-count, which only makes
   the budgets stricter. A node that would break a budget (positions per node, values per
   kernel, nesting of pad/concat/gather) is materialised instead, so that no kernel's code grows
   without bound (a DAG that reads its values through ever more views, a chain of 40,000 ops). */

#define TB__PLAN_KEY_ROOT 0x9e3779b97f4a7c15ull
#define TB__PLAN_KEYSET   256 /* open addressing: 4x the largest positions_per_node */
#define TB__PLAN_MAX_KEYS 64

typedef struct tb__keyset {
    uint64_t slot[TB__PLAN_KEYSET];
    uint64_t list[TB__PLAN_MAX_KEYS];
    int32_t count;
    bool full;
} tb__keyset;

static void tb__keyset_add(tb__keyset *s, uint64_t key, int32_t cap) {
    size_t h = (size_t)(key * 0x9E3779B97F4A7C15ull >> 56) & (TB__PLAN_KEYSET - 1);
    key |= 1; /* 0 marks an empty slot */
    if (s->full) return;
    while (s->slot[h] != 0) {
        if (s->slot[h] == key) return;
        h = (h + 1) & (TB__PLAN_KEYSET - 1);
    }
    if (s->count >= cap || s->count >= TB__PLAN_MAX_KEYS) {
        s->full = true;
        return;
    }
    s->slot[h] = key;
    s->list[s->count++] = key;
}

static uint64_t tb__plan_key_mix(uint64_t q, int32_t user, size_t k, int32_t lane) {
    uint64_t h = tb__hash_u64(q, (uint64_t)(uint32_t)user);
    h = tb__hash_u64(h, (uint64_t)k);
    return tb__hash_u64(h, (uint64_t)(uint32_t)lane);
}

/* How many positions a kernel's core reads operand k at (an upper bound). */
static int32_t tb__plan_core_reads(const tb__pgraph *G, int32_t core, size_t k) {
    const tb__tuning *t = G->target->tuning;
    switch (tb_op_get_kind(G->info[core].node->op)) {
    case TB_KIND_REDUCE:
        return t->reduce_lanes > 1 ? t->reduce_lanes + 1 : 1;
    case TB_KIND_NORM:
        return k == 0 ? 3 : 1; /* x in each of the three passes; weight and bias in the last */
    case TB_KIND_MATMUL:
        if (t->mm_kind == TB__MM_TILES) return 1;
        return k == 0 ? t->mm_reg_rows : t->mm_reg_cols;
    default:
        return 1;
    }
}

static tb_status tb__plan_kernel_values_grow(tb__pgraph *G, size_t kernels) {
    size_t old = G->cap_kernel_values;
    if (kernels <= old) return TB_OK;
    if (tb__grow((void **)&G->kernel_values, &G->cap_kernel_values, kernels, sizeof(int64_t)) !=
        TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    memset(G->kernel_values + old, 0, (G->cap_kernel_values - old) * sizeof(int64_t));
    return TB_OK;
}

/* Stores a node's positions in its kernel. */
/* Appends `count` keys for `node`; `keys` must not point into G->keys (which may move). */
static tb_status tb__plan_keys_store(tb__pgraph *G, int32_t node, const uint64_t *keys,
                                     int32_t count) {
    if (tb__grow((void **)&G->keys, &G->cap_keys, G->num_keys + (size_t)count, sizeof(uint64_t)) !=
        TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    memcpy(G->keys + G->num_keys, keys, (size_t)count * sizeof(uint64_t));
    G->info[node].keys_first = (int32_t)G->num_keys;
    G->info[node].keys_count = count;
    G->num_keys += (size_t)count;
    return TB_OK;
}

/* Whether node i, read by users that are all in kernel `ctx`, fits into that kernel's budgets;
   on true its positions and nesting depth are stored and the kernel's values counted. */
static tb_status tb__plan_fits(tb__pgraph *G, int32_t i, int32_t ctx, bool *fits) {
    const tb__tuning *t = G->target->tuning;
    tb__pnode *in = &G->info[i];
    const tb_shape *is = &in->node->shape;
    tb__keyset *set;
    int32_t e, depth = 0, core = G->plan->kernels[ctx].core;
    int64_t budget = t->values_per_kernel;
    tb_status st;
    *fits = false;
    set = (tb__keyset *)tb__calloc(1, sizeof *set);
    if (set == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (e = 0; e < in->num_users && !set->full; e++) {
        int32_t u = G->users[in->first_user + e];
        const tb__pnode *ui = &G->info[u];
        bool aligned =
            tb__plan_is_elementwise(ui->node->op) && tb__plan_same_dims(&ui->node->shape, is);
        size_t k;
        int32_t d = ui->depth + (tb__plan_is_nesting(ui->node->op) ? 1 : 0);
        if (d > depth) depth = d;
        if (tb__plan_cat_many(ui->node)) { /* a root: one key per operand node, no scan */
            tb__keyset_add(set, tb__plan_key_mix(TB__PLAN_KEY_ROOT, u, (size_t)i, 1),
                           t->positions_per_node);
            continue;
        }
        for (k = 0; k < ui->node->num_operands && !set->full; k++) {
            int32_t lane, q;
            if (tb__plan_operand(G, u, k) != i) continue;
            if (tb__plan_numel(is) <= 1 && ui->node->op != TB_OP_PAD &&
                ui->node->op != TB_OP_CONCAT) {
                tb__keyset_add(set, TB__PLAN_KEY_ROOT ^ 0x5ca1a4ull, t->positions_per_node);
            } else if (u == core) {
                int32_t reads = tb__plan_core_reads(G, u, k);
                for (lane = 0; lane < reads; lane++)
                    tb__keyset_add(set, tb__plan_key_mix(TB__PLAN_KEY_ROOT, u, k, lane),
                                   t->positions_per_node);
            } else {
                /* an inlined reduction reads its operand at m positions per position (a hoisted
                   one at one per accumulator of its loop and one for the rest) */
                int32_t reads = ui->hoist ? tb__plan_hoist_lanes(ui->node) + 1
                                          : (int32_t)tb__plan_inline_reduce(ui->node),
                        r;
                for (q = 0; q < ui->keys_count; q++) {
                    uint64_t key = G->keys[ui->keys_first + q];
                    if (reads > 0) {
                        for (r = 0; r < reads; r++)
                            tb__keyset_add(set, tb__plan_key_mix(key, u, k, r),
                                           t->positions_per_node);
                    } else {
                        tb__keyset_add(set, aligned ? key : tb__plan_key_mix(key, u, k, 0),
                                       t->positions_per_node);
                    }
                }
            }
        }
    }
    /* a concat of many operands is one kernel per run of them (tb__plan_split_concats) */
    if (tb__plan_cat_many(G->info[G->plan->kernels[ctx].root].node))
        budget *=
            1 + (int64_t)G->info[G->plan->kernels[ctx].root].node->num_operands / TB__PLAN_CAT_TREE;
    if (!set->full && depth <= t->nesting && G->kernel_values[ctx] + set->count <= budget) {
        st = tb__plan_keys_store(G, i, set->list, set->count);
        if (st != TB_OK) {
            tb__free(set);
            return st;
        }
        in->depth = depth;
        G->kernel_values[ctx] += set->count;
        *fits = true;
    }
    tb__free(set);
    return TB_OK;
}

/* Whether node i is a view of a scalar parameter (each of its elements is the scalar) read
   only by concats of many operands, directly or through other such views: their kernels read
   the scalar from the table of scalars, or once in a leaf of their tree of operands, so it
   costs no budget. Its users are decided before it. */
static bool tb__plan_cat_free(const tb__pgraph *G, int32_t i) {
    const tb__pnode *in = &G->info[i];
    int32_t e, x = i;
    for (e = 0; e < in->num_users; e++) {
        const tb__pnode *ui = &G->info[G->users[in->first_user + e]];
        if (!tb__plan_cat_many(ui->node) && !ui->cat_free) return false;
    }
    while (G->info[x].param < 0 && tb_op_get_kind(G->info[x].node->op) == TB_KIND_MOVEMENT &&
           G->info[x].node->num_operands == 1)
        x = tb__plan_operand(G, x, 0);
    return x != i && in->num_users > 0 && G->info[x].param >= 0 &&
           G->info[x].node->op == TB_OP_SCALAR;
}

/* ---- partition ---- */

static tb_status tb__plan_add_kernel(tb__pgraph *G, int32_t kind, int32_t root, int32_t core,
                                     int32_t *out) {
    tb__plan *p = G->plan;
    tb__plan_kernel *k;
    if (tb__grow((void **)&p->kernels, &p->cap_kernels, p->num_kernels + 1,
                 sizeof(tb__plan_kernel)) != TB_OK ||
        tb__plan_kernel_values_grow(G, p->num_kernels + 1) != TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    k = &p->kernels[p->num_kernels];
    memset(k, 0, sizeof *k);
    k->kind = kind;
    k->root = root;
    k->core = core;
    k->out_slot = -1;
    k->partial_slot = -1;
    k->pack_slot[0] = k->pack_slot[1] = -1;
    G->kernel_values[p->num_kernels] = 1;
    *out = (int32_t)p->num_kernels++;
    return TB_OK;
}

/* A node becomes the root of a kernel of its own, evaluated at the kernel's output. */
static tb_status tb__plan_make_root(tb__pgraph *G, int32_t i, int32_t kind, int32_t core) {
    static const uint64_t root_key = TB__PLAN_KEY_ROOT;
    tb__pnode *in = &G->info[i];
    int32_t k;
    tb_status st = tb__plan_add_kernel(G, kind, i, core, &k);
    if (st != TB_OK) return st;
    in->root = true;
    in->ctx = k;
    in->ident = true;
    in->depth = 0;
    if (tb__plan_inline_reduce(in->node) > 0) G->plan->kernels[k].inline_reduce = true;
    return tb__plan_keys_store(G, i, &root_key, 1);
}

/* Orders kernels by their roots (producers first) and renumbers the contexts. */
static tb_status tb__plan_sort_kernels(tb__pgraph *G) {
    tb__plan *p = G->plan;
    size_t nk = p->num_kernels, i, j;
    int32_t *remap;
    tb__plan_kernel *sorted;
    if (nk == 0) return TB_OK;
    remap = (int32_t *)tb__calloc(nk, sizeof *remap);
    sorted = (tb__plan_kernel *)tb__calloc(nk, sizeof *sorted);
    if (remap == NULL || sorted == NULL) {
        tb__free(remap);
        tb__free(sorted);
        return TB_ERR_OUT_OF_MEMORY;
    }
    /* kernels were made from the last node to the first: reversing sorts them by root */
    for (i = 0; i < nk; i++) {
        j = nk - 1 - i;
        sorted[i] = p->kernels[j];
        remap[j] = (int32_t)i;
    }
    for (i = 1; i < nk; i++) {
        if (sorted[i - 1].root >= sorted[i].root) {
            tb__free(remap);
            tb__free(sorted);
            return tb__error(TB_ERR_INTERNAL, "planner: kernels out of order");
        }
    }
    memcpy(p->kernels, sorted, nk * sizeof *sorted);
    for (i = 0; i < G->n; i++)
        if (G->info[i].ctx >= 0) G->info[i].ctx = remap[G->info[i].ctx];
    tb__free(remap);
    tb__free(sorted);
    return TB_OK;
}

static bool tb__plan_mm_packs(const tb__pgraph *G, int32_t core);

/* The rules of reductions computed where they are read (tb__plan_inline_reduce), for node i
   about to join kernel `common`:
   - such a reduction joins only where each of its values is read once (elementwise users of
     its own dims, in a kernel over as many elements): a broadcast of it would repeat its work
     at every position it reaches;
   - a computed value under the pad or window such a kernel reads would be computed again at
     every position of each window: it is materialised instead (it then joins the epilogue of
     the matmul or reduction below it). */
static bool tb__plan_inline_fits(const tb__pgraph *G, int32_t i, int32_t common) {
    const tb__pnode *in = &G->info[i];
    const tb_node *node = in->node;
    const tb__plan_kernel *k = &G->plan->kernels[common];
    int32_t e;
    if (tb__plan_inline_reduce(node) > 0) {
        if (tb__plan_numel(tb__plan_shape(G, k->root)) != tb__plan_numel(&node->shape))
            return false;
        for (e = 0; e < in->num_users; e++) {
            const tb_node *un = G->info[G->users[in->first_user + e]].node;
            if (!tb__plan_is_elementwise(un->op) || !tb__plan_same_dims(&un->shape, &node->shape))
                return false;
        }
    }
    if (k->inline_reduce && tb_op_get_kind(node->op) != TB_KIND_MOVEMENT && node->op != TB_OP_PAD) {
        for (e = 0; e < in->num_users; e++) {
            tb_op uop = G->info[G->users[in->first_user + e]].node->op;
            if (uop == TB_OP_PAD || uop == TB_OP_WINDOW) return false;
        }
    }
    return true;
}

/* ---- reductions hoisted into the rows of a reduction ----
   A reduction H that the kernel of a reduction R reads only at the row R is reducing (the max
   under x - max(x) of a log-sum-exp, each step of a chain of row reductions over the last
   one's result) is computed in R's kernel by a loop over H's elements at the start of each of
   R's rows (before R's own loop), not by a kernel of its own: in graphs of small rows most of
   the time is the launches. H is read at the row only where every node between it and R is
   elementwise with R's operand's dims on the axes R keeps (no movement renumbers the rows).
   The loop is scalar (four accumulators) and runs for each of R's rows: only small ones. */

#define TB__PLAN_HOIST_ELEMS 16384 /* elements H reduces in all, at most, */
#define TB__PLAN_HOIST_ROW   256   /* and per value */
#define TB__PLAN_HOIST_MAX   128   /* hoisted reductions of one kernel, at most */
#define TB__PLAN_HOIST_VISIT 64    /* nodes the walk from H to R may visit, at most */

/* Whether shape s has R's operand's rank and its dims on the axes R keeps. */
static bool tb__plan_row_dims(const tb_shape *s, const tb_shape *xs, uint64_t mask) {
    int32_t a;
    if (s->rank != xs->rank) return false;
    for (a = 0; a < xs->rank; a++)
        if (!((mask >> a) & 1u) && s->dims[a] != xs->dims[a]) return false;
    return true;
}

/* Whether node n is evaluated in kernel ctx only at positions of the row its core reduces:
   the core, its epilogue up to the root, a hoisted reduction, or an elementwise node of the
   row's dims whose users all are (false once `visits` run out). */
static bool tb__plan_row_local(const tb__pgraph *G, int32_t n, int32_t ctx, const tb_shape *xs,
                               uint64_t mask, int32_t *visits) {
    const tb__pnode *in = &G->info[n];
    const tb__plan_kernel *k = &G->plan->kernels[ctx];
    int32_t e;
    if (n == k->core || (in->hoist && in->ctx == ctx)) return true;
    if (in->ctx != ctx || in->param >= 0 || --*visits < 0 ||
        !tb__plan_is_elementwise(in->node->op) || !tb__plan_row_dims(&in->node->shape, xs, mask))
        return false;
    if (n == k->root) return true;
    for (e = 0; e < in->num_users; e++)
        if (!tb__plan_row_local(G, G->users[in->first_user + e], ctx, xs, mask, visits))
            return false;
    return true;
}

/* Hoists reduction i into the kernel of a reduction where that applies (*done then true; never
   where it must be a root). */
static tb_status tb__plan_hoist(tb__pgraph *G, int32_t i, bool must_root, bool *done) {
    tb__pnode *in = &G->info[i];
    const tb_node *n = in->node, *cn;
    const tb_shape *xs;
    tb__plan_kernel *k;
    int32_t ctx = -1, e, a, visits = TB__PLAN_HOIST_VISIT;
    int64_t n_out, m, elems;
    uint64_t mask, key = tb__plan_key_mix(TB__PLAN_KEY_ROOT, i, 0, 0);
    tb_status st;
    *done = false;
    if (must_root || !tb__plan_float_reduce(n) || in->num_users == 0) return TB_OK;
    elems = tb__plan_numel(&n->operands[0]->shape);
    if (elems > TB__PLAN_HOIST_ELEMS || elems > TB__PLAN_HOIST_ROW * tb__plan_numel(&n->shape))
        return TB_OK;
    for (e = 0; e < in->num_users; e++) {
        int32_t c = G->info[G->users[in->first_user + e]].ctx;
        if (c < 0 || (ctx >= 0 && c != ctx)) return TB_OK;
        ctx = c;
    }
    k = &G->plan->kernels[ctx];
    if (k->kind != TB__K_REDUCE || k->core < 0 || k->hoists >= TB__PLAN_HOIST_MAX) return TB_OK;
    cn = G->info[k->core].node;
    if (cn->op != TB_OP_SUM && cn->op != TB_OP_MEAN && cn->op != TB_OP_MAX && cn->op != TB_OP_MIN &&
        cn->op != TB_OP_PROD)
        return TB_OK;
    tb__plan_reduce_sizes(G, k->core, &n_out, &m);
    if (m >= G->target->tuning->split_min_len) return TB_OK; /* R may be split into stages */
    xs = tb__plan_shape(G, tb__plan_operand(G, k->core, 0));
    mask = (uint64_t)cn->attrs[0];
    if (!tb__plan_row_dims(&n->shape, xs, mask)) return TB_OK;
    for (a = 0; a < xs->rank; a++) /* one value per row */
        if (((mask >> a) & 1u) && n->shape.dims[a] != 1) return TB_OK;
    for (e = 0; e < in->num_users; e++)
        if (!tb__plan_row_local(G, G->users[in->first_user + e], ctx, xs, mask, &visits))
            return TB_OK;
    /* one position, the row's, however many read it */
    if (G->kernel_values[ctx] >= G->target->tuning->values_per_kernel) return TB_OK;
    st = tb__plan_keys_store(G, i, &key, 1);
    if (st != TB_OK) return st;
    G->kernel_values[ctx]++;
    in->depth = 0;
    in->ctx = ctx;
    in->hoist = true;
    k->hoists++;
    *done = true;
    return TB_OK;
}

/* Whether two shapes have the same dims but for axes of one element. */
static bool tb__plan_same_big_dims(const tb_shape *a, const tb_shape *b) {
    int32_t i = 0, j = 0;
    for (;;) {
        while (i < a->rank && a->dims[i] == 1)
            i++;
        while (j < b->rank && b->dims[j] == 1)
            j++;
        if (i == a->rank || j == b->rank) return i == a->rank && j == b->rank;
        if (a->dims[i++] != b->dims[j++]) return false;
    }
}

/* Whether node s reaches its kernel's output through nodes that each read it at their own
   position: elementwise nodes of its dims and reshapes that add or drop axes of one element
   (an unbatched convolution's), each the only reader of the one before. */
static bool tb__plan_at_output(const tb__pgraph *G, int32_t s) {
    while (!G->info[s].root) {
        const tb__pnode *in = &G->info[s];
        int32_t u = in->num_users == 1 && in->uses == 1 ? G->users[in->first_user] : -1;
        const tb_node *un = u >= 0 ? G->info[u].node : NULL;
        if (un == NULL || G->info[u].ctx != in->ctx ||
            !((tb__plan_is_elementwise(un->op) &&
               tb__plan_same_dims(&un->shape, &in->node->shape)) ||
              (un->op == TB_OP_RESHAPE && tb__plan_same_big_dims(&un->shape, &in->node->shape))))
            return false;
        s = u;
    }
    return true;
}

/* Whether matmul i may be the core of the kernel of its only user u: a reshape that splits the
   matmul's last axis into rows of Wp columns, read only by a slice of each row (step 1) that
   reaches the kernel's output at its own positions (tb__plan_at_output). The kernel then stores, of
   each row of Wp columns, only the columns the slice keeps, its epilogue at the slice's positions:
   a convolution over whole padded rows (tb__conv_rows) cuts its padding columns away in its
   matmul's stores rather than in a kernel of its own that reads and writes the output again.
   Sets the kernel's crop_* when it fits. */
static bool tb__plan_mm_crop(tb__pgraph *G, int32_t i, int32_t u) {
    const tb__pnode *ui = &G->info[u], *si;
    const tb_shape *cs = tb__plan_shape(G, i), *rsh = &ui->node->shape;
    const tb_node *sn;
    tb__plan_kernel *k;
    int32_t r = cs->rank, d, s;
    if (ui->node->op != TB_OP_RESHAPE || ui->ctx < 0 || ui->num_users != 1 || ui->uses != 1 ||
        r < 2 || rsh->rank != r + 1)
        return false;
    k = &G->plan->kernels[ui->ctx];
    s = G->users[ui->first_user];
    si = &G->info[s];
    sn = si->node;
    if (k->core >= 0 || sn->op != TB_OP_SLICE || si->ctx != ui->ctx || !tb__plan_at_output(G, s) ||
        sn->attrs[0] != r || sn->attrs[3] != 1 || sn->attrs[2] <= sn->attrs[1])
        return false;
    for (d = 0; d + 1 < r; d++)
        if (rsh->dims[d] != cs->dims[d]) return false;
    if (rsh->dims[r] < 1 || rsh->dims[r - 1] * rsh->dims[r] != cs->dims[r - 1]) return false;
    k->crop_wp = rsh->dims[r];
    k->crop_at = sn->attrs[1];
    k->crop_w = sn->attrs[2] - sn->attrs[1];
    return true;
}

/* Roots and contexts. Users come before their operands (reverse post-order), so a node knows
   the kernels of all its users when its turn comes: it is inlined when they all share one
   kernel (and, under a matmul, when it is index arithmetic or a pad of a packed operand) and it
   fits that kernel's budgets, else it becomes a root. A reduction, matmul or norm whose only user
   is an elementwise node evaluated at the kernel's output position becomes that kernel's core, and
   the elementwise nodes above it its epilogue. */
static tb_status tb__plan_partition(tb__pgraph *G) {
    tb__plan *p = G->plan;
    int32_t i;
    size_t j;
    tb_status st;
    for (j = 0; j < p->num_kernels; j++) {
        tb__free(p->kernels[j].args);
        tb__free(p->kernels[j].table_params);
    }
    p->num_kernels = 0;
    G->num_keys = 0;
    for (j = 0; j < G->n; j++) {
        tb__pnode *in = &G->info[j];
        in->root = in->ident = in->in_mm = in->cat_free = in->hoist = false;
        in->ctx = -1;
        in->slot = -1;
        in->depth = 0;
        in->keys_count = 0;
    }
    for (i = (int32_t)G->n - 1; i >= 0; i--) {
        tb__pnode *in = &G->info[i];
        const tb_node *node = in->node;
        bool hoisted, must_root = in->result >= 0 || in->force_root || in->num_users == 0 ||
                                  tb__plan_cat_many(node);
        int32_t core_kind = tb__plan_core_kind(node);
        if (in->param >= 0) {
            /* a parameter returned as a result: a copy */
            if (in->result >= 0) {
                st = tb__plan_make_root(G, i, TB__K_ELEMENTWISE, -1);
                if (st != TB_OK) return st;
            }
            continue;
        }
        if ((st = tb__plan_hoist(G, i, must_root, &hoisted)) != TB_OK) return st;
        if (hoisted) continue;
        if (core_kind >= 0) {
            if (!must_root && in->num_users == 1 && in->uses == 1) {
                int32_t u = G->users[in->first_user];
                const tb__pnode *ui = &G->info[u];
                /* a matmul also under a reshape: its stores go to the same flat offsets (or,
                   under a slice of the reshape's rows, to the slice's) */
                if ((ui->ident && ui->ctx >= 0 && p->kernels[ui->ctx].core < 0 &&
                     ((tb__plan_is_elementwise(ui->node->op) &&
                       tb__plan_same_dims(&ui->node->shape, &node->shape)) ||
                      (core_kind == TB__K_MATMUL && ui->node->op == TB_OP_RESHAPE))) ||
                    (core_kind == TB__K_MATMUL && tb__plan_mm_crop(G, i, u))) {
                    p->kernels[ui->ctx].core = i;
                    p->kernels[ui->ctx].kind = core_kind;
                    in->ctx = ui->ctx;
                    in->ident = true;
                    uint64_t key = G->keys[ui->keys_first]; /* copied: G->keys may move */
                    st = tb__plan_keys_store(G, i, &key, 1);
                    if (st != TB_OK) return st;
                    continue;
                }
            }
            st = tb__plan_make_root(G, i, core_kind, i);
            if (st != TB_OK) return st;
            continue;
        }
        if (!tb__plan_is_inlinable(node->op) && tb__plan_inline_reduce(node) == 0) {
            const char *name = tb_op_name(node->op);
            return tb__error(TB_ERR_UNSUPPORTED, "planner: op '%s' cannot be lowered",
                             name != NULL ? name : "?");
        }
        if (!must_root) {
            int32_t common = -2, u = -1, e;
            bool ok = true, in_mm = false, movement = tb_op_get_kind(node->op) == TB_KIND_MOVEMENT;
            for (e = 0; e < in->num_users; e++) {
                const tb__pnode *ui;
                u = G->users[in->first_user + e];
                ui = &G->info[u];
                if (common == -2) {
                    common = ui->ctx;
                } else if (common != ui->ctx) {
                    ok = false;
                }
                if (ui->node->op == TB_OP_MATMUL || (ui->in_mm && !ui->root)) in_mm = true;
            }
            if (common < 0) ok = false;
            /* a pad is a test at each read: a packed operand reads once, so it may pay it,
               unless the pad is read through a reshape (rows merged: the test would need the
               divisions that unravel them, at each read) */
            if (ok && in_mm && !tb__plan_is_view_like(node->op) &&
                !(node->op == TB_OP_PAD && tb__plan_mm_packs(G, p->kernels[common].core) &&
                  G->info[u].node->op != TB_OP_RESHAPE))
                ok = false;
            if (!ok && movement && (common >= 0 || common == TB__CTX_ANY)) {
                /* a view read by several kernels: each reads through it (index arithmetic),
                   whatever is below it is materialised once */
                in->ctx = TB__CTX_ANY;
                continue;
            }
            if (ok && tb__plan_cat_free(G, i)) { /* no positions to count: no code of its own */
                in->ctx = common;
                in->cat_free = true;
                continue;
            }
            if (ok) ok = tb__plan_inline_fits(G, i, common);
            if (ok) {
                st = tb__plan_fits(G, i, common, &ok);
                if (st != TB_OK) return st;
            }
            if (ok) {
                in->ctx = common;
                in->in_mm = in_mm;
                if (tb__plan_inline_reduce(node) > 0) p->kernels[common].inline_reduce = true;
                if (in->num_users == 1 && in->uses == 1) {
                    const tb__pnode *ui = &G->info[u];
                    in->ident = ui->ident && tb__plan_is_elementwise(ui->node->op) &&
                                tb__plan_same_dims(&ui->node->shape, &node->shape);
                }
                continue;
            }
        }
        st = tb__plan_make_root(G, i, TB__K_ELEMENTWISE, -1);
        if (st != TB_OK) return st;
    }
    return tb__plan_sort_kernels(G);
}

/* ---- split reductions and packed matmuls ---- */

/* The reduced element count and output count of a reduction node. */
static void tb__plan_reduce_sizes(const tb__pgraph *G, int32_t core, int64_t *n_out, int64_t *m) {
    const tb_shape *xs = tb__plan_shape(G, tb__plan_operand(G, core, 0));
    *n_out = tb__plan_numel(tb__plan_shape(G, core));
    *m = *n_out > 0 ? tb__plan_numel(xs) / *n_out : 0;
}

/* The dtype a reduction accumulates in (and the partial results of a split one hold): the
   operand's for max and min, the wider float where the target affords it for f32 sums (f32
   for f16 and bf16 ones, as PyTorch), and the wrapping 32- or 64-bit integer for integer sums
   and products. */
static tb_dtype tb__plan_reduce_acc(const tb__pgraph *G, int32_t core) {
    const tb_node *c = G->info[core].node;
    tb_dtype od = c->shape.dtype;
    if (c->op == TB_OP_MAX || c->op == TB_OP_MIN || c->op == TB_OP_ARGMAX || c->op == TB_OP_ARGMIN)
        return tb__plan_shape(G, tb__plan_operand(G, core, 0))->dtype;
    if (od == TB_F16 || od == TB_BF16) od = TB_F32;
    if (tb_dtype_is_float(od)) return od == TB_F32 && G->target->acc_f64 ? TB_F64 : od;
    return od == TB_I64 ? TB_I64 : TB_I32;
}

/* Inserts `count` zeroed kernels at position `at`, keeping contexts and owners pointing at
   the kernels they pointed at. */
static tb_status tb__plan_insert_kernels(tb__pgraph *G, size_t at, size_t count) {
    tb__plan *p = G->plan;
    size_t j;
    if (tb__grow((void **)&p->kernels, &p->cap_kernels, p->num_kernels + count,
                 sizeof(tb__plan_kernel)) != TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    memmove(&p->kernels[at + count], &p->kernels[at],
            (p->num_kernels - at) * sizeof(tb__plan_kernel));
    p->num_kernels += count;
    for (j = 0; j < G->n; j++)
        if (G->info[j].ctx >= (int32_t)at) G->info[j].ctx += (int32_t)count;
    for (j = 0; j < p->num_kernels; j++)
        if ((j < at || j >= at + count) && p->kernels[j].owner >= (int32_t)at)
            p->kernels[j].owner += (int32_t)count;
    for (j = at; j < at + count; j++) {
        memset(&p->kernels[j], 0, sizeof(tb__plan_kernel));
        p->kernels[j].out_slot = -1;
        p->kernels[j].partial_slot = -1;
        p->kernels[j].pack_slot[0] = p->kernels[j].pack_slot[1] = -1;
    }
    return TB_OK;
}

static tb__plan_mm tb__plan_mm_of(const tb__pgraph *G, int32_t core) {
    const tb_shape *cs = tb__plan_shape(G, core);
    const tb_shape *as = tb__plan_shape(G, tb__plan_operand(G, core, 0));
    tb__plan_mm mm;
    int32_t d;
    mm.batch = 1;
    for (d = 0; d + 2 < cs->rank; d++)
        mm.batch *= cs->dims[d];
    mm.m = cs->dims[cs->rank - 2];
    mm.n = cs->dims[cs->rank - 1];
    mm.k = as->dims[as->rank - 1];
    return mm;
}

/* Whether a batched matmul's A is one matrix for every batch index: an expand of a matrix whose
   batch dims are all 1 (a convolution's weight against each image), or a permute of its last
   two dims, whose panels are made once rather than once per batch index. */
static bool tb__plan_mm_a_shared(const tb__pgraph *G, int32_t core) {
    int32_t a = tb__plan_operand(G, core, 0), x, d;
    const tb_shape *cs = tb__plan_shape(G, core), *xs;
    if (cs->rank <= 2) return false;
    while (G->info[a].node->op == TB_OP_PERMUTE && !G->info[a].root) {
        for (d = 0; d < cs->rank - 2; d++)
            if (G->info[a].node->attrs[d] != d) return false;
        a = tb__plan_operand(G, a, 0);
    }
    if (G->info[a].node->op != TB_OP_EXPAND || G->info[a].root) return false;
    x = tb__plan_operand(G, a, 0);
    xs = tb__plan_shape(G, x);
    if (xs->rank != cs->rank) return false;
    for (d = 0; d < xs->rank; d++)
        if (d < xs->rank - 2 ? xs->dims[d] != 1 : xs->dims[d] != tb__plan_shape(G, a)->dims[d])
            return false;
    return true;
}

/* The rows of A per panel for M rows: of the tuning's range, the count that pads M least (the
   larger of equals). */
static int64_t tb__plan_mm_panel_rows(const tb__tuning *t, int64_t m) {
    int64_t best = t->mm_panel_rows, r;
    for (r = best - 1; t->mm_panel_rows_min > 0 && r >= t->mm_panel_rows_min; r--)
        if ((m + r - 1) / r * r < (m + best - 1) / best * best) best = r;
    return best;
}

static int32_t tb__plan_mm_b_buffer(const tb__pgraph *G, int32_t core);

/* A packed matmul's register block: rows of A per panel (block[0]) by columns of B per panel
   (block[1]), the tuning's (tb__plan_mm_panel_rows by mm_vec_f32 or mm_vec_f64) or its wide
   one where that pads the M x N output no more (it reads fewer values per FMA: AVX2's 4 x 24
   loads 7 a step for 12 FMAs, 6 x 16 loads 8; f32 only there), and, with mm_wide_in_place,
   where the matmul reads B in place (tb__plan_mm_b_buffer); `m` is the matmul's sizes
   (tb__plan_mm_of), which its callers have. */
static void tb__plan_mm_block(const tb__pgraph *G, int32_t core, const tb__plan_mm *m,
                              int64_t block[2]) {
    const tb__tuning *t = G->target->tuning;
    bool f64 = tb__plan_shape(G, core)->dtype == TB_F64;
    int64_t r = tb__plan_mm_panel_rows(t, m->m), c = f64 ? t->mm_vec_f64 : t->mm_vec_f32;
    int64_t wr = t->mm_wide_rows, wc = f64 ? 0 : t->mm_wide_cols;
    block[0] = r;
    block[1] = c;
    if (wr > 0 && wc > 0 && (!t->mm_wide_in_place || tb__plan_mm_b_buffer(G, core) >= 0) &&
        (double)((m->m + wr - 1) / wr * wr) * (double)((m->n + wc - 1) / wc * wc) <=
            (double)((m->m + r - 1) / r * r) * (double)((m->n + c - 1) / c * c)) {
        block[0] = wr;
        block[1] = wc;
    }
}

/* The panels of a packed matmul's operand: batch (1 for an A that is the same for every
   batch index), M, N, K, the panel count and the panel width (rows of A per panel, or one
   row of columns of B: tb__plan_mm_block). */
static void tb__plan_pack_sizes(const tb__pgraph *G, int32_t core, bool is_a, int64_t sizes[6]) {
    tb__plan_mm mm = tb__plan_mm_of(G, core);
    int64_t block[2], width, len = is_a ? mm.m : mm.n;
    tb__plan_mm_block(G, core, &mm, block);
    width = block[is_a ? 0 : 1];
    sizes[0] = is_a && tb__plan_mm_a_shared(G, core) ? 1 : mm.batch;
    sizes[1] = mm.m;
    sizes[2] = mm.n;
    sizes[3] = mm.k;
    sizes[4] = (len + width - 1) / width;
    sizes[5] = width;
}

/* The dtype of a matmul's packed panels: 16-bit floats are widened once, by the pack kernels,
   and the matmul computes in f32 as their every kernel does. */
static tb_dtype tb__plan_pack_dtype(tb_dtype dtype) {
    return dtype == TB_F16 || dtype == TB_BF16 ? TB_F32 : dtype;
}

/* Whether a matmul kernel reads packed panels: a float matmul with some work in it whose
   panels fit the device's allocations. */
static bool tb__plan_mm_packs(const tb__pgraph *G, int32_t core) {
    const tb__tuning *t = G->target->tuning;
    const tb_shape *cs = tb__plan_shape(G, core);
    const tb_shape *as = tb__plan_shape(G, tb__plan_operand(G, core, 0));
    const tb_shape *bs = tb__plan_shape(G, tb__plan_operand(G, core, 1));
    tb__plan_mm mm = tb__plan_mm_of(G, core);
    tb_dtype od = cs->dtype, pd = tb__plan_pack_dtype(od);
    double elems;
    if (t->mm_kind != TB__MM_PACKED || (pd != TB_F32 && pd != TB_F64)) return false;
    if (as->dtype != od || bs->dtype != od || as->rank != cs->rank || bs->rank != cs->rank)
        return false;
    if (od == TB_F64 && !G->target->f64) return false;
    if (mm.m < 4 || mm.n < 16 || mm.k < 16 ||
        (double)mm.m * (double)mm.n * (double)mm.k < (double)t->mm_pack_min_work)
        return false;
    /* the panels of the bigger operand (batch included) within half the largest allocation */
    elems = (double)(mm.m > mm.n ? mm.m + t->mm_panel_rows : mm.n + t->mm_vec_f32) * (double)mm.k *
            (double)mm.batch;
    if (G->target->max_allocation > 0 &&
        elems * (double)tb_dtype_size(pd) > (double)G->target->max_allocation / 2)
        return false;
    return true;
}

/* The node whose buffer a packed matmul reads A from in place, or -1 (A is packed): A (or A
   broadcast over the batch by an expand) is the whole output of another kernel of the graph (a
   contiguous buffer: a panel's rows are runs of K values at one stride, read from one address
   per step of K) in the dtype the matmul computes in, and its rows fill whole panels. Packing
   it would cost a pass over A on every run; a parameter's panels are kept by the backends while
   its buffer holds, so parameters are still packed. */
static int32_t tb__plan_mm_a_buffer(const tb__pgraph *G, int32_t core) {
    int32_t a = tb__plan_operand(G, core, 0);
    const tb_shape *cs = tb__plan_shape(G, core), *as;
    tb_dtype od = cs->dtype;
    tb__plan_mm mm;
    int64_t block[2];
    if (G->info[a].node->op == TB_OP_EXPAND && !G->info[a].root) {
        int32_t x = tb__plan_operand(G, a, 0);
        const tb_shape *xs = tb__plan_shape(G, x);
        if (xs->rank != cs->rank ||
            xs->dims[xs->rank - 1] != tb__plan_shape(G, a)->dims[xs->rank - 1] ||
            xs->dims[xs->rank - 2] != tb__plan_shape(G, a)->dims[xs->rank - 2])
            return -1;
        a = x;
    }
    as = tb__plan_shape(G, a);
    mm = tb__plan_mm_of(G, core);
    tb__plan_mm_block(G, core, &mm, block);
    if (!G->info[a].root || G->info[a].param >= 0 || tb__plan_pack_dtype(od) != od ||
        as->dtype != od || mm.m % block[0] != 0)
        return -1;
    return a;
}

/* The dim of x that dim d of view node n reads, with the step it takes there per step of d
   (*coef multiplied by it); -1 where d does not stay one strided dim of x (a reshape, unless it
   keeps the last dim or reads a buffer at its flat index; a flip of d; a broadcast of d). */
static int32_t tb__plan_view_dim(const tb__pgraph *G, int32_t node, int32_t d, int64_t *coef) {
    const tb_node *n = G->info[node].node;
    int32_t x, nsp, lead, off;
    const tb_shape *ns = &n->shape, *xs;
    if (n->num_operands != 1) return -1; /* not a view */
    x = tb__plan_operand(G, node, 0);
    xs = tb__plan_shape(G, x);
    switch (n->op) {
    case TB_OP_RESHAPE:
        if (d != ns->rank - 1) return -1;
        /* a buffer is read at the flat index (stride 1 for the last dim of any shape) */
        if (G->info[x].root) return xs->rank - 1;
        return xs->dims[xs->rank - 1] == ns->dims[d] ? xs->rank - 1 : -1;
    case TB_OP_PERMUTE:
        return (int32_t)n->attrs[d];
    case TB_OP_SLICE:
        if (n->attrs[0] == d) *coef *= n->attrs[3];
        return d;
    case TB_OP_WINDOW:
        nsp = (int32_t)n->attrs[0];
        if (n->num_attrs != 1 + 4 * (size_t)nsp) return -1; /* the diagonal form */
        lead = xs->rank - nsp;
        if (d < lead) return d;
        if (d < lead + nsp) {
            *coef *= n->attrs[3 + 4 * (d - lead)];
            return d;
        }
        *coef *= n->attrs[4 + 4 * (d - lead - nsp)];
        return d - nsp;
    case TB_OP_FLIP:
        return ((uint64_t)n->attrs[0] >> d) & 1u ? -1 : d;
    case TB_OP_EXPAND:
        off = ns->rank - xs->rank;
        return d - off >= 0 && xs->dims[d - off] != 1 ? d - off : -1;
    default:
        return -1;
    }
}

/* The node whose buffer a packed matmul reads B from in place, or -1 (B is packed): B is views
   (reshape, permute, slice, window, flip, expand: index arithmetic) of the whole output of
   another kernel in the dtype the matmul computes in, along which B's last dim (the matmul's
   columns) stays the buffer's last dim at stride 1, so that each depth row of a panel is one
   contiguous run of that buffer, read from one address per step of K, and the views include
   a window (B's rows overlap: each element of the buffer is in several of them). A
   convolution over whole padded rows is such a B: its pack copied runs of the padded input,
   a pass over K times the input through memory on every run, where reading the rows in place
   reads the input from the caches. A B without a window is packed: its panel is the size of
   the buffer, and reading rows one stride apart (a power of two, often) from a wide matrix
   thrashes the cache sets. A parameter's panels are kept by the backends while its buffer
   holds, so parameters are still packed; GPUs stage tiles instead. */
static int32_t tb__plan_mm_b_buffer(const tb__pgraph *G, int32_t core) {
    int32_t x = tb__plan_operand(G, core, 1), d = tb__plan_shape(G, x)->rank - 1;
    tb_dtype od = tb__plan_shape(G, core)->dtype;
    int64_t coef = 1;
    bool window = false;
    if (tb__plan_pack_dtype(od) != od) return -1;
    while (!G->info[x].root && G->info[x].param < 0 && d >= 0) {
        window = window || G->info[x].node->op == TB_OP_WINDOW;
        d = tb__plan_view_dim(G, x, d, &coef);
        x = tb__plan_operand(G, x, 0);
    }
    if (d < 0 || !window || !G->info[x].root || G->info[x].param >= 0 || coef != 1 ||
        d != tb__plan_shape(G, x)->rank - 1 || tb__plan_shape(G, x)->dtype != od)
        return -1;
    return x;
}

/* The rows of B a packed matmul's work item packs at a time where it packs B itself
   (tb__plan_kernel.own_b, own_b_k), else 0 (a pack kernel does): B is computed or the windows of a
   buffer (a convolution's, K x N per image, many times the input it is made of), so that a pack
   kernel would write every panel to memory for the matmul to read back, where a work item can pack
   its one panel into a private buffer that stays in its core's cache while every row panel of A
   passes it (a panel larger than the buffer is packed as many rows at a time as it holds). Not for
   views of a parameter alone (the backends keep those panels while the buffer holds), nor where one
   item per column panel would leave compute units without work, nor for more rows than
   mm_own_b_rows: there the pack kernel's pass is small beside the matmul's work, and an item's
   columns would run down too many rows of the output (the input gradient of the Fashion-MNIST CNN's
   second convolution, 800 x 196 x 64 per image on a 2-core Intel Xeon with AVX-512: 17.5 -> 22.2 ms
   where its panels were its own).
 */
static int64_t tb__plan_mm_own_b_rows(const tb__pgraph *G, int32_t core) {
    const tb__target *T = G->target;
    int32_t x = tb__plan_operand(G, core, 1);
    tb_dtype od = tb__plan_shape(G, core)->dtype;
    int64_t zb[6], fills;
    bool window = false;
    tb__plan_pack_sizes(G, core, false, zb);
    if (T->tuning->mm_own_b_bytes < zb[5] * (int64_t)tb_dtype_size(od) ||
        tb__plan_pack_dtype(od) != od || zb[1] > T->tuning->mm_own_b_rows ||
        zb[0] * zb[4] < 4 * (int64_t)T->compute_units)
        return 0;
    while (!G->info[x].root && G->info[x].param < 0 && G->info[x].node->num_operands == 1) {
        window = window || G->info[x].node->op == TB_OP_WINDOW;
        x = tb__plan_operand(G, x, 0);
    }
    if (!window && G->info[x].param >= 0 && G->info[x].node->num_operands <= 1) return 0;
    /* the fills the buffer takes, then rows as even as they go */
    fills = T->tuning->mm_own_b_bytes / (zb[5] * (int64_t)tb_dtype_size(od));
    fills = (zb[3] + fills - 1) / fills;
    return (zb[3] + fills - 1) / fills;
}

/* Chooses each matmul's kernel and puts the pack kernels in front of those that pack (A's
   unless the matmul reads A in place, B's unless it reads B in place or packs it itself). */
static tb_status tb__plan_pack_matmuls(tb__pgraph *G) {
    tb__plan *p = G->plan;
    size_t i, j;
    for (i = 0; i < p->num_kernels; i++) {
        tb__plan_kernel *k = &p->kernels[i];
        tb_status st;
        size_t packs;
        bool pack_a, pack_b;
        if (k->kind != TB__K_MATMUL) continue;
        if (G->target->tuning->mm_kind == TB__MM_TILES) {
            k->mm = TB__MM_TILES;
            continue;
        }
        k->mm = TB__MM_REGISTERS;
        if (!tb__plan_mm_packs(G, k->core)) continue;
        pack_a = tb__plan_mm_a_buffer(G, k->core) < 0;
        pack_b = tb__plan_mm_b_buffer(G, k->core) < 0;
        k->own_b_k = pack_b ? tb__plan_mm_own_b_rows(G, k->core) : 0;
        k->own_b = k->own_b_k > 0;
        packs = (size_t)pack_a + (pack_b && !k->own_b);
        st = packs > 0 ? tb__plan_insert_kernels(G, i, packs) : TB_OK;
        if (st != TB_OK) return st;
        for (j = 0; j < packs; j++) {
            tb__plan_kernel *pk = &p->kernels[i + j];
            pk->kind = j == 0 && pack_a ? TB__K_PACK_A : TB__K_PACK_B;
            pk->root = p->kernels[i + packs].root;
            pk->core = p->kernels[i + packs].core;
            pk->owner = (int32_t)(i + packs);
        }
        p->kernels[i + packs].mm = TB__MM_PACKED;
        i += packs;
    }
    return TB_OK;
}

/* ---- buffers ---- */

static tb_status tb__plan_add_slot(tb__plan *p, int32_t kind, int32_t index, const tb_shape *shape,
                                   int32_t *out) {
    tb__plan_slot *s;
    if (tb__grow((void **)&p->slots, &p->cap_slots, p->num_slots + 1, sizeof(tb__plan_slot)) !=
        TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    s = &p->slots[p->num_slots];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->index = index;
    s->shape = *shape;
    s->last_use = -1;
    *out = (int32_t)p->num_slots++;
    return TB_OK;
}

/* Buffers: one per array parameter and one per kernel output. */
static tb_status tb__plan_assign_slots(tb__pgraph *G) {
    tb__plan *p = G->plan;
    size_t i;
    int32_t s;
    tb_status st;
    p->num_slots = 0;
    for (i = 0; i < G->n; i++) {
        tb__pnode *in = &G->info[i];
        if (in->param < 0 || in->node->op == TB_OP_SCALAR) continue;
        st = tb__plan_add_slot(p, TB__SLOT_PARAM, in->param, &in->node->shape, &s);
        if (st != TB_OK) return st;
        in->slot = s;
    }
    for (i = 0; i < p->num_kernels; i++) {
        tb__plan_kernel *k = &p->kernels[i];
        tb__pnode *in = &G->info[k->root];
        if (k->owner != (int32_t)i && k->kind == TB__K_CONCAT) continue; /* the owner's */
        if (k->owner != (int32_t)i) {
            /* a stage of another kernel (partial results, operand panels): a temporary only
               that kernel reads */
            tb__plan_kernel *o = &p->kernels[k->owner];
            tb_shape ps;
            memset(&ps, 0, sizeof ps);
            ps.rank = 1;
            if (k->kind == TB__K_PARTIAL) {
                int64_t n_out, m;
                tb__plan_reduce_sizes(G, k->core, &n_out, &m);
                ps.dtype = tb__plan_reduce_acc(G, k->core);
                ps.dims[0] = n_out * k->split;
            } else {
                int64_t z[6];
                tb__plan_pack_sizes(G, k->core, k->kind == TB__K_PACK_A, z);
                ps.dtype = tb__plan_pack_dtype(tb__plan_shape(G, k->core)->dtype);
                ps.dims[0] = z[0] * z[4] * z[3] * z[5];
            }
            st = tb__plan_add_slot(p, TB__SLOT_TEMP, -1, &ps, &s);
            if (st != TB_OK) return st;
            k->out_slot = s;
            p->slots[s].last_use = k->owner;
            if (k->kind == TB__K_PARTIAL)
                o->partial_slot = s;
            else
                o->pack_slot[k->kind == TB__K_PACK_A ? 0 : 1] = s;
            continue;
        }
        if (in->result >= 0) {
            st = tb__plan_add_slot(p, TB__SLOT_RESULT, in->result, &in->node->shape, &s);
        } else {
            st = tb__plan_add_slot(p, TB__SLOT_TEMP, -1, &in->node->shape, &s);
        }
        if (st != TB_OK) return st;
        k->out_slot = s;
        p->slots[s].last_use = (int32_t)i;
        if (in->param < 0) in->slot = s;
    }
    for (i = 0; i < p->num_kernels; i++)
        if (p->kernels[i].kind == TB__K_CONCAT)
            p->kernels[i].out_slot = p->kernels[p->kernels[i].owner].out_slot;
    for (i = 0; i < p->num_results; i++) {
        int32_t r = tb__plan_index_of(G, G->graph->results[i]);
        size_t kk;
        p->result_slot[i] = -1;
        p->result_source[i] = -1;
        if (G->info[r].result != (int32_t)i) {
            p->result_source[i] = G->info[r].result;
            continue;
        }
        for (kk = 0; kk < p->num_kernels; kk++)
            if (p->kernels[kk].root == r && p->kernels[kk].owner == (int32_t)kk)
                p->result_slot[i] = p->kernels[kk].out_slot;
        if (p->result_slot[i] < 0)
            return tb__error(TB_ERR_INTERNAL, "planner: result %zu without a kernel", i);
    }
    return TB_OK;
}

/* ---- what each kernel reads ---- */

/* Whether kernel k evaluates the operands of its core: not the final stage of a split
   reduction (it reads the partial results) nor a matmul reading panels. */
static bool tb__plan_reads_core_operands(const tb__plan_kernel *k) {
    if (k->kind == TB__K_REDUCE && k->split > 0) return false;
    if (k->kind == TB__K_MATMUL && k->mm == TB__MM_PACKED) return false;
    return true;
}

/* The node a kernel's evaluation starts from. */
static int32_t tb__plan_kernel_start(const tb__pgraph *G, const tb__plan_kernel *k) {
    if (k->kind == TB__K_PARTIAL || k->kind == TB__K_PACK_A) return tb__plan_operand(G, k->core, 0);
    if (k->kind == TB__K_PACK_B) return tb__plan_operand(G, k->core, 1);
    return k->root;
}

static tb_status tb__plan_arg_add(tb__plan *p, size_t ki, int32_t kind, int32_t index) {
    tb__plan_kernel *k = &p->kernels[ki];
    size_t i, cap = k->num_args;
    if (kind == TB__ARG_TABLE) { /* one argument; the parameter takes an entry of the table */
        size_t tcap = k->num_table_params;
        for (i = 0; i < k->num_table_params; i++)
            if (k->table_params[i] == index) return TB_OK;
        if (tb__grow((void **)&k->table_params, &tcap, k->num_table_params + 1, sizeof(int32_t)) !=
            TB_OK)
            return TB_ERR_OUT_OF_MEMORY;
        k->table_params[k->num_table_params++] = index;
        index = 0;
    }
    for (i = 0; i < k->num_args; i++)
        if (k->args[i].kind == kind && k->args[i].index == index) return TB_OK;
    if (tb__grow((void **)&k->args, &cap, k->num_args + 1, sizeof(tb__plan_arg)) != TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    k->args[k->num_args].kind = kind;
    k->args[k->num_args].index = index;
    k->num_args++;
    if (kind == TB__ARG_BUF && p->slots[index].last_use < (int32_t)ki)
        p->slots[index].last_use = (int32_t)ki;
    return TB_OK;
}

/* Whether a node can fail at run time (an index out of range, a negative integer power). */
static bool tb__plan_can_fail(const tb_node *n) {
    if (n->op == TB_OP_GATHER || n->op == TB_OP_INDEX_SELECT) return true;
    return n->op == TB_OP_POW && !tb_dtype_is_float(n->shape.dtype);
}

static tb_status tb__plan_errsite_add(tb__pgraph *G, int32_t node) {
    tb__plan *p = G->plan;
    const tb_node *n = G->info[node].node;
    tb__errsite *e;
    if (tb__grow((void **)&p->errsites, &p->cap_errsites, p->num_errsites + 1,
                 sizeof(tb__errsite)) != TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    e = &p->errsites[p->num_errsites++];
    memset(e, 0, sizeof *e);
    e->op = n->op;
    e->node = node;
    if (n->op != TB_OP_POW) {
        e->dim = (int32_t)n->attrs[0];
        e->size = tb__plan_shape(G, tb__plan_operand(G, node, 0))->dims[e->dim];
    }
    return TB_OK;
}

/* The code a kernel writes to its error flag for a failing node: 1 + its errsite. */
static int32_t tb__plan_errsite_code(const tb__plan *p, int32_t node) {
    size_t i;
    for (i = 0; i < p->num_errsites; i++)
        if (p->errsites[i].node == node) return (int32_t)i + 1;
    return -1;
}

/* The arguments of kernel ki in the order its evaluation meets them, the run-time error sites
   it holds, and the last use of every buffer. `stamp` is scratch of one int per node. */
static tb_status tb__plan_kernel_args(tb__pgraph *G, size_t ki, int32_t *stamp, int32_t *stack) {
    tb__plan *p = G->plan;
    tb__plan_kernel *k = &p->kernels[ki];
    size_t sp = 0, j;
    int32_t start = tb__plan_kernel_start(G, k), mark = (int32_t)ki + 1;
    bool errs = false;
    tb_status st = TB_OK;
    k->num_args = k->num_table_params = 0;
    if (k->kind == TB__K_REDUCE && k->split > 0)
        st = tb__plan_arg_add(p, ki, TB__ARG_BUF, k->partial_slot);
    if (st == TB_OK && k->kind == TB__K_MATMUL && k->mm == TB__MM_PACKED) {
        if (k->pack_slot[0] >= 0) st = tb__plan_arg_add(p, ki, TB__ARG_BUF, k->pack_slot[0]);
        if (st == TB_OK && k->pack_slot[1] >= 0)
            st = tb__plan_arg_add(p, ki, TB__ARG_BUF, k->pack_slot[1]);
    }
    stack[sp++] = start;
    stamp[start] = mark;
    while (sp > 0 && st == TB_OK) {
        int32_t n = stack[--sp];
        const tb__pnode *in = &G->info[n];
        size_t nops = in->node->num_operands, first = 0;
        if (in->param >= 0) {
            if (in->node->op != TB_OP_SCALAR) {
                st = tb__plan_arg_add(p, ki, TB__ARG_BUF, in->slot);
            } else if (p->scalar_table) {
                st = tb__plan_arg_add(p, ki, TB__ARG_TABLE, in->param);
            } else {
                st = tb__plan_arg_add(p, ki, TB__ARG_SCALAR, in->param);
            }
            continue;
        }
        if (in->root && n != k->root) {
            st = tb__plan_arg_add(p, ki, TB__ARG_BUF, in->slot);
            continue;
        }
        if (n == k->core && !tb__plan_reads_core_operands(k)) {
            /* a packed matmul without A's (B's) panels reads A (B) itself */
            int32_t side;
            for (side = 1; side >= 0 && k->kind == TB__K_MATMUL; side--) {
                int32_t x = tb__plan_operand(G, n, side);
                if (k->pack_slot[side] < 0 && stamp[x] != mark) {
                    stamp[x] = mark;
                    stack[sp++] = x;
                }
            }
            continue;
        }
        if (tb__plan_can_fail(in->node)) {
            if (tb__plan_errsite_code(p, n) < 0) st = tb__plan_errsite_add(G, n);
            errs = true;
        }
        if (n == start && k->kind == TB__K_CONCAT) { /* its run of the concat's operands */
            first = (size_t)k->cat_first;
            nops = first + (size_t)k->cat_count;
        }
        /* operands pushed last first: they are met in operand order */
        for (j = nops; j > first && st == TB_OK; j--) {
            int32_t o = tb__plan_operand(G, n, j - 1);
            if (stamp[o] == mark) continue;
            stamp[o] = mark;
            stack[sp++] = o;
        }
    }
    if (st == TB_OK && errs) st = tb__plan_arg_add(p, ki, TB__ARG_ERR, 0);
    return st;
}

/* Every kernel's arguments; *over is a kernel with more than the device takes, or -1. */
static tb_status tb__plan_args(tb__pgraph *G, int32_t *over) {
    tb__plan *p = G->plan;
    int32_t *stamp = (int32_t *)tb__calloc(G->n + 1, sizeof(int32_t));
    int32_t *stack = (int32_t *)tb__calloc(G->n + 1, sizeof(int32_t));
    tb_status st = TB_OK;
    size_t i;
    *over = -1;
    p->num_errsites = 0;
    if (stamp == NULL || stack == NULL) st = TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < p->num_kernels && st == TB_OK; i++) {
        st = tb__plan_kernel_args(G, i, stamp, stack);
        /* the output, the arguments, and the start of its run of a table of scalars */
        if (st == TB_OK && *over < 0 &&
            p->kernels[i].num_args + 1 + (p->kernels[i].num_table_params > 0) > G->target->max_args)
            *over = (int32_t)i;
        if (st == TB_OK) {
            /* panels made of one parameter's buffer only (through views): kept by backends */
            tb__plan_kernel *k = &p->kernels[i];
            k->pack_param = -1;
            if ((k->kind == TB__K_PACK_A || k->kind == TB__K_PACK_B) && k->num_args == 1 &&
                k->args[0].kind == TB__ARG_BUF && p->slots[k->args[0].index].kind == TB__SLOT_PARAM)
                k->pack_param = p->slots[k->args[0].index].index;
        }
    }
    for (i = 0, p->table_len = 0; i < p->num_kernels; i++) { /* each kernel's run of the table */
        p->kernels[i].table_at = (int64_t)p->table_len;
        p->table_len += p->kernels[i].num_table_params;
    }
    tb__free(stamp);
    tb__free(stack);
    return st;
}

#endif /* TB__HAVE_COMPILED_BACKENDS */
