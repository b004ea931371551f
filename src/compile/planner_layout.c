/* ===========================================================================================
   Kernel planner, second half: the kernels of a concat of many operands, the node a kernel
   with more arguments than the device takes is cut at, split reductions, the layout of the
   kernels planner.c formed (vectors along rows, launch geometry, names), the plan of a graph
   from its steps in order, and buffer donation.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* ---- concats of many operands ----
   A concat of more than TB__PLAN_CAT_INLINE operands is one TB__K_CONCAT kernel per run of
   its operands, each writing its slice: buffers of one dtype read through the table of the
   kernel's arguments (arg_table targets), scalars of one dtype from the table of scalars (their
   code does not grow with the run), or others, one leaf each of a balanced tree of tests. */

#define TB__PLAN_CAT_RUN   8    /* operands of a table run, at least */
#define TB__PLAN_CAT_TABLE 2048 /* operands of a table run (entries of its tables), at most */

/* The table form operand o of a concat may be read in: TB__CAT_ARGS a buffer (arg_table
   targets), TB__CAT_SCALARS a view of a scalar parameter (each element the scalar) where
   scalars travel in a table; else TB__CAT_TREE. */
static int32_t tb__plan_cat_class(const tb__pgraph *G, int32_t o) {
    const tb__pnode *oi = &G->info[o];
    if ((oi->param >= 0 && oi->node->op != TB_OP_SCALAR) || oi->root)
        return G->target->arg_table ? TB__CAT_ARGS : TB__CAT_TREE;
    for (; oi->param < 0 && !oi->root && tb_op_get_kind(oi->node->op) == TB_KIND_MOVEMENT &&
           oi->node->num_operands == 1;
         oi = &G->info[o])
        o = tb__plan_operand(G, o, 0);
    return oi->param >= 0 && oi->node->op == TB_OP_SCALAR && G->plan->scalar_table ? TB__CAT_SCALARS
                                                                                   : TB__CAT_TREE;
}

/* The arguments operand o of a concat reads, bounded above (past TB__PLAN_CAT_TREE nodes, an
   estimate: tb__plan_build still cuts a kernel that reads too many): its nodes' leaves, the
   error flag. `stamp` and `stack`: scratch of one int per node; `mark` new for each call. */
static int32_t tb__plan_cat_reads(const tb__pgraph *G, int32_t o, int32_t *stamp, int32_t mark,
                                  int32_t *stack) {
    int32_t sp = 1, count = 0, walked = 0;
    bool fails = false;
    stack[0] = o;
    stamp[o] = mark;
    while (sp > 0) {
        int32_t n = stack[--sp];
        const tb__pnode *in = &G->info[n];
        size_t j;
        if (in->param >= 0 || in->root) {
            count++;
            continue;
        }
        if (++walked > TB__PLAN_CAT_TREE) return count + sp + 1;
        fails = fails || tb__plan_can_fail(in->node);
        for (j = 0; j < in->node->num_operands; j++) {
            int32_t x = tb__plan_operand(G, n, j);
            if (stamp[x] == mark) continue;
            stamp[x] = mark;
            stack[sp++] = x;
        }
    }
    return count + (fails ? 1 : 0);
}

/* The end of the run of concat c's operands from `first` on, its form in *form: a table run
   of TB__PLAN_CAT_RUN operands or more of one form and dtype (tail[j]: how many follow from j),
   else a tree within the target's arguments. `scratch`: tb__plan_cat_reads's, and a mark. */
static int32_t tb__plan_cat_run_end(const tb__pgraph *G, int32_t c, int32_t first,
                                    const int32_t *cls, const int32_t *tail, int32_t *scratch,
                                    int32_t *form) {
    int32_t n = (int32_t)G->info[c].node->num_operands, j = first, args = 0, limit;
    size_t most_args = G->target->max_args < 65536 ? G->target->max_args : 65536;
    limit = most_args > 4 ? (int32_t)most_args - 2 : 2; /* arguments besides the output */
    *form = TB__CAT_TREE;
    if (tail[j] >= TB__PLAN_CAT_RUN) {
        int32_t most =
            cls[j] == TB__CAT_ARGS && limit < TB__PLAN_CAT_TABLE ? limit : TB__PLAN_CAT_TABLE;
        *form = cls[j];
        return j + (tail[j] < most ? tail[j] : most);
    }
    while (j < n && j - first < TB__PLAN_CAT_TREE && (j == first || tail[j] < TB__PLAN_CAT_RUN)) {
        int32_t a = tb__plan_cat_reads(G, tb__plan_operand(G, c, (size_t)j), scratch,
                                       ++scratch[2 * G->n], scratch + G->n);
        if (j > first && args + a > limit - 1) break; /* and the table of scalars */
        args += a;
        j++;
    }
    return j;
}

/* Turns the kernel of each concat of many operands into one TB__K_CONCAT kernel per run of
   its operands (the last the owner of the others and of the nodes they evaluate). */
static tb_status tb__plan_split_concats(tb__pgraph *G) {
    tb__plan *p = G->plan;
    int32_t *scratch = (int32_t *)tb__calloc(2 * G->n + 1, sizeof(int32_t)), *cls = NULL;
    size_t i;
    tb_status st = scratch != NULL ? TB_OK : TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < p->num_kernels && st == TB_OK; i++) {
        int32_t c = p->kernels[i].root, n, j, end, form, runs = 0, r;
        const tb_node *cn = G->info[c].node;
        int64_t at = 0;
        if (p->kernels[i].kind != TB__K_ELEMENTWISE || !tb__plan_cat_many(cn)) continue;
        n = (int32_t)cn->num_operands;
        cls = (int32_t *)tb__calloc(2 * (size_t)n + 2, sizeof(int32_t));
        if (cls == NULL) {
            st = TB_ERR_OUT_OF_MEMORY;
            break;
        }
        for (j = n - 1; j >= 0; j--) { /* cls[n + 1 + j]: the table run from j on */
            const tb_shape *xs = tb__plan_shape(G, tb__plan_operand(G, c, (size_t)j));
            cls[j] = tb__plan_cat_class(G, tb__plan_operand(G, c, (size_t)j));
            cls[n + 1 + j] = cls[j] == TB__CAT_TREE ? 0 : 1;
            if (cls[j] != TB__CAT_TREE && j + 1 < n && cls[j + 1] == cls[j] &&
                tb__plan_shape(G, tb__plan_operand(G, c, (size_t)j + 1))->dtype == xs->dtype)
                cls[n + 1 + j] += cls[n + 2 + j];
        }
        for (j = 0; j < n; j = end, runs++)
            end = tb__plan_cat_run_end(G, c, j, cls, cls + n + 1, scratch, &form);
        if (runs > 1) st = tb__plan_insert_kernels(G, i, (size_t)runs - 1);
        for (j = 0, r = 0; st == TB_OK && j < n; j = end, r++) {
            tb__plan_kernel *k = &p->kernels[i + (size_t)r];
            end = tb__plan_cat_run_end(G, c, j, cls, cls + n + 1, scratch, &form);
            k->kind = TB__K_CONCAT;
            k->root = c;
            k->core = -1;
            k->owner = (int32_t)i + runs - 1;
            k->cat_first = j;
            k->cat_count = end - j;
            k->cat_form = form;
            k->cat_start = at;
            for (k->cat_len = 0; j < end; j++)
                k->cat_len += cn->operands[j]->shape.dims[cn->attrs[0]];
            at += k->cat_len;
        }
        tb__free(cls);
        i += (size_t)runs - 1;
    }
    tb__free(scratch);
    return st;
}

/* ---- vectors along rows ----
   A row kernel whose work item reads its row in order (one item per row, the row contiguous)
   evaluates the row W elements at a time when every node it evaluates along the row can be:
   f32, f16 or bf16 ops of a small set over operands that are aligned with the row (equal dims: W
   consecutive elements), constant along it (one element, or dims of 1 across the row's axes:
   evaluated once per step as scalars) or loads of buffers of the row's dims. */

#define TB__PLAN_VEC_NODES 256 /* nodes of a subtree evaluated as vectors, at most */

/* The dtypes a vector holds: f32, and the 16-bit floats (loaded to f32 lanes, every op's
   result rounded to them, stored rounded). */
static bool tb__plan_vec_dtype(tb_dtype dtype) {
    return dtype == TB_F32 || dtype == TB_F16 || dtype == TB_BF16;
}

static bool tb__plan_vec_op(const tb_node *n) {
    if (!tb__plan_vec_dtype(n->shape.dtype)) return false;
    switch (n->op) {
    case TB_OP_CAST: /* between the vector dtypes: a rounding at most */
        return tb__plan_vec_dtype(n->operands[0]->shape.dtype);
    case TB_OP_RESHAPE: /* to the same dims (tb_detach, a leaf), or to others with the same
                           last dim (a row's W elements are consecutive in both): the operand */
        return tb__plan_same_dims(&n->shape, &n->operands[0]->shape) ||
               (n->shape.rank >= 1 && n->operands[0]->shape.rank >= 1 &&
                n->shape.dims[n->shape.rank - 1] ==
                    n->operands[0]->shape.dims[n->operands[0]->shape.rank - 1]);
    case TB_OP_ADD:
    case TB_OP_SUB:
    case TB_OP_MUL:
    case TB_OP_DIV:
    case TB_OP_NEG:
    case TB_OP_ABS:
    case TB_OP_MAXIMUM:
    case TB_OP_MINIMUM:
    case TB_OP_RELU:
    case TB_OP_CLAMP: /* its bounds are scalars, constant along the row */
        return true;
    case TB_OP_WHERE: /* a condition of bytes read from a buffer (tb__plan_vec_subtree) */
        return n->operands[0]->shape.dtype == TB_BOOL || n->operands[0]->shape.dtype == TB_U8;
    default: { /* a math op of ops_table.h with a vector form */
        const tb__math_code *c = tb__math_code_of(n->op);
        return c != NULL && c->vec != NULL;
    }
    }
}

/* How operand dims `os` run along the row of a node with dims `ds` (the last `row_axes` axes):
   TB__ROW_ALIGNED when its dims there equal the node's (W consecutive elements: it is
   broadcast along the leading axes at most), TB__ROW_CONSTANT when they are 1 or absent (one
   value for the whole row), else TB__ROW_OTHER. */
static int32_t tb__plan_row_relation(const tb_shape *ds, const tb_shape *os, int32_t row_axes) {
    int32_t a, off = ds->rank - os->rank;
    bool aligned = true, constant = true;
    for (a = ds->rank - row_axes; a < ds->rank; a++) {
        int32_t oa = a - off;
        int64_t od = oa >= 0 ? os->dims[oa] : 1;
        if (od != ds->dims[a]) aligned = false;
        if (od != 1) constant = false;
    }
    if (aligned && tb__plan_numel(os) > 1) return TB__ROW_ALIGNED;
    return constant ? TB__ROW_CONSTANT : TB__ROW_OTHER;
}

/* Whether the nodes kernel k evaluates from `start` (aligned with the row, whose last
   `row_axes` axes run along it) can all be evaluated as vectors; `stop`, when >= 0, is a node
   whose vector the kernel has already (the core under an epilogue). */
static bool tb__plan_vec_subtree(const tb__pgraph *G, const tb__plan_kernel *k, int32_t start,
                                 int32_t stop, int32_t row_axes) {
    int32_t stack[TB__PLAN_VEC_NODES];
    int32_t sp = 0, seen = 0;
    stack[sp++] = start;
    while (sp > 0) {
        int32_t n = stack[--sp];
        const tb__pnode *in = &G->info[n];
        size_t j;
        if (++seen > TB__PLAN_VEC_NODES) return false;
        if (n == stop) continue;
        if (in->param >= 0 || (in->root && n != k->root)) {
            if (!tb__plan_vec_dtype(in->node->shape.dtype)) return false;
            continue; /* a load of W elements */
        }
        /* its own nodes, and views that every kernel reading them evaluates itself */
        if ((in->ctx != k->owner && in->ctx != TB__CTX_ANY) || !tb__plan_vec_op(in->node))
            return false;
        for (j = 0; j < in->node->num_operands; j++) {
            int32_t o = tb__plan_operand(G, n, j);
            int32_t rel = tb__plan_row_relation(&in->node->shape, tb__plan_shape(G, o), row_axes);
            if (rel == TB__ROW_ALIGNED && in->node->op == TB_OP_WHERE && j == 0) {
                /* W bytes loaded as 0 or 1 each: only a buffer's */
                if (G->info[o].param < 0 && !(G->info[o].root && o != k->root)) return false;
            } else if (rel == TB__ROW_ALIGNED) {
                if (sp >= TB__PLAN_VEC_NODES) return false;
                stack[sp++] = o;
            } else if (rel == TB__ROW_OTHER) {
                return false; /* broadcast along the row: not consecutive elements */
            }
        }
    }
    return true;
}

/* The vector width of a row kernel (0: scalar), after its layout is chosen. */
/* The vector width of kernel k (0: scalar code); *row_axes gets how many trailing axes the
   vectors run along, the count the code generator must use when it sorts operands into
   aligned, constant and other. */
static int32_t tb__plan_vec_width(const tb__pgraph *G, const tb__plan_kernel *k,
                                  int32_t *row_axes) {
    int32_t w = G->target->tuning->vec_width, x, axes;
    const tb_node *cn;
    const tb_shape *xs;
    int64_t len;
    if (w <= 0) return 0;
    if (k->kind == TB__K_ELEMENTWISE) {
        /* blocks of W along the last axis, which W divides (blocks never cross rows) */
        const tb_shape *rs = tb__plan_shape(G, k->root);
        if (!tb__plan_vec_dtype(rs->dtype) || rs->rank < 1 || rs->dims[rs->rank - 1] % w != 0 ||
            tb__plan_numel(rs) < 64 * w || G->info[k->root].param >= 0)
            return 0;
        *row_axes = 1;
        return tb__plan_vec_subtree(G, k, k->root, -1, 1) ? w : 0;
    }
    if (k->group > 1 || !k->suffix) return 0;
    cn = G->info[k->core].node;
    x = tb__plan_operand(G, k->core, 0);
    xs = tb__plan_shape(G, x);
    if (!tb__plan_vec_dtype(xs->dtype)) return 0;
    if (k->kind == TB__K_NORM) {
        size_t j;
        axes = cn->op == TB_OP_LAYER_NORM ? (int32_t)cn->attrs[0] : 1;
        len = 1;
        for (j = (size_t)(xs->rank - axes); j < (size_t)xs->rank; j++)
            len *= xs->dims[j];
        *row_axes = axes;
        if (len < 2 * w || !tb__plan_vec_subtree(G, k, x, -1, axes)) return 0;
        for (j = 1; j < cn->num_operands; j++) /* weight and bias, along the row */
            if (!tb__plan_vec_subtree(G, k, tb__plan_operand(G, k->core, j), -1, axes)) return 0;
        /* the epilogue stores W outputs at once */
        return tb__plan_vec_subtree(G, k, k->root, k->core, axes) ? w : 0;
    }
    if ((k->kind != TB__K_REDUCE && k->kind != TB__K_PARTIAL) ||
        (k->kind == TB__K_REDUCE && k->split > 0))
        return 0;
    if (cn->op != TB_OP_SUM && cn->op != TB_OP_MEAN && cn->op != TB_OP_MAX && cn->op != TB_OP_MIN &&
        cn->op != TB_OP_PROD)
        return 0;
    {
        int64_t n_out, m;
        int32_t a;
        uint64_t mask = (uint64_t)cn->attrs[0];
        tb__plan_reduce_sizes(G, k->core, &n_out, &m);
        if (k->kind == TB__K_PARTIAL) m = (m + k->split - 1) / k->split;
        axes = 0;
        for (a = 0; a < xs->rank; a++)
            if ((mask >> a) & 1u) axes++;
        if (m < 2 * w) return 0;
    }
    *row_axes = axes;
    return tb__plan_vec_subtree(G, k, x, -1, axes) ? w : 0;
}

/* The vector width of a reduction over leading axes of x that keeps its last ones (a bias's
   gradient: the sum over the rows of [N, C] or [B, T, C]), as columns of W outputs per work
   item read W at a time along each reduced row; 0 where it does not apply: other reductions,
   a last axis that W does not divide, values or an epilogue that are not vectors. */
static int32_t tb__plan_col_width(const tb__pgraph *G, const tb__plan_kernel *k) {
    int32_t w = G->target->tuning->vec_width, x, p = 0;
    const tb_node *cn = G->info[k->core].node;
    const tb_shape *xs;
    uint64_t mask = (uint64_t)cn->attrs[0];
    if (w <= 0) return 0;
    if (cn->op != TB_OP_SUM && cn->op != TB_OP_MEAN && cn->op != TB_OP_MAX && cn->op != TB_OP_MIN)
        return 0;
    x = tb__plan_operand(G, k->core, 0);
    xs = tb__plan_shape(G, x);
    while (p < xs->rank && ((mask >> p) & 1u))
        p++;
    if (p == 0 || p >= xs->rank || (mask >> p) != 0) return 0; /* a leading run, not all */
    if (!tb__plan_vec_dtype(xs->dtype) || !tb__plan_vec_dtype(cn->shape.dtype) ||
        xs->dims[xs->rank - 1] % w != 0)
        return 0;
    if (!tb__plan_vec_subtree(G, k, x, -1, 1)) return 0;
    return tb__plan_vec_subtree(G, k, k->root, k->core, 1) ? w : 0;
}

/* ---- kernels over the device's arguments ---- */

/* A node of kernel `ki` to materialise so that the kernel reads fewer arguments: the inlined
   node whose operands reach the most distinct arguments while still fitting a kernel of its
   own (at least two, so that the cut saves one). -1 when there is none. */
static tb_status tb__plan_pick_cut(tb__pgraph *G, int32_t ki, int32_t *pick) {
    const tb__plan_kernel *k = &G->plan->kernels[ki];
    size_t nargs = k->num_args, words = (nargs + 63) / 64, i, j, w;
    int32_t owner = k->owner, best = -1, best_count = 1;
    uint64_t *bits = (uint64_t *)tb__calloc(G->n * words + 1, sizeof(uint64_t));
    if (bits == NULL) return TB_ERR_OUT_OF_MEMORY;
    /* nodes are in post-order: operands before users */
    for (i = 0; i < G->n; i++) {
        const tb__pnode *in = &G->info[i];
        uint64_t *mine = bits + i * words;
        int32_t count = 0;
        if (in->ctx != owner || in->param >= 0 || in->root) continue;
        for (j = 0; j < in->node->num_operands; j++) {
            int32_t o = tb__plan_operand(G, (int32_t)i, j);
            const tb__pnode *oi = &G->info[o];
            size_t a;
            if (oi->ctx == owner && oi->param < 0 && !oi->root) {
                for (w = 0; w < words; w++)
                    mine[w] |= bits[(size_t)o * words + w];
                continue;
            }
            for (a = 0; a < nargs; a++) {
                const tb__plan_arg *arg = &k->args[a];
                bool hit = false;
                if (oi->param >= 0 && oi->node->op == TB_OP_SCALAR) {
                    hit = (arg->kind == TB__ARG_SCALAR && arg->index == oi->param) ||
                          arg->kind == TB__ARG_TABLE;
                } else {
                    hit = arg->kind == TB__ARG_BUF && arg->index == oi->slot;
                }
                if (hit) mine[a / 64] |= (uint64_t)1 << (a % 64);
            }
        }
        for (w = 0; w < words; w++) {
            uint64_t v = mine[w];
            while (v != 0) {
                v &= v - 1;
                count++;
            }
        }
        if (count > best_count && (size_t)count + 3 <= G->target->max_args) {
            best = (int32_t)i;
            best_count = count;
        }
    }
    tb__free(bits);
    *pick = best;
    return TB_OK;
}

/* ---- split reductions ---- */

/* How many chunks a reduction with few outputs over many elements is split into, so that
   every compute unit gets work; 1: not split. */
static int64_t tb__plan_split_count(const tb__pgraph *G, int64_t n_out, int64_t m) {
    const tb__tuning *t = G->target->tuning;
    int64_t want = (int64_t)G->target->compute_units * t->split_chunks_per_cu, chunks;
    if (n_out <= 0 || m < t->split_min_len || n_out >= want) return 1;
    chunks = (want + n_out - 1) / n_out;
    if (chunks > m / t->split_min_chunk) chunks = m / t->split_min_chunk;
    if (chunks > t->split_max_chunks) chunks = t->split_max_chunks;
    return chunks >= 2 ? chunks : 1;
}

/* Splits reductions with few outputs into a partial stage (chunks of each row in parallel)
   and a final stage (combines the chunks, then the epilogue). */
static tb_status tb__plan_split_reductions(tb__pgraph *G) {
    tb__plan *p = G->plan;
    size_t i;
    for (i = 0; i < p->num_kernels; i++)
        p->kernels[i].owner = (int32_t)i;
    for (i = 0; i < p->num_kernels; i++) {
        tb__plan_kernel *k = &p->kernels[i];
        const tb_node *c;
        int64_t n_out, m, chunks;
        tb_status st;
        if (k->kind != TB__K_REDUCE || k->hoists > 0) continue;
        c = G->info[k->core].node;
        if (c->op == TB_OP_ARGMAX || c->op == TB_OP_ARGMIN) continue;
        tb__plan_reduce_sizes(G, k->core, &n_out, &m);
        chunks = tb__plan_split_count(G, n_out, m);
        if (chunks <= 1) continue;
        st = tb__plan_insert_kernels(G, i, 1);
        if (st != TB_OK) return st;
        p->kernels[i].kind = TB__K_PARTIAL;
        p->kernels[i].root = p->kernels[i + 1].root;
        p->kernels[i].core = p->kernels[i + 1].core;
        p->kernels[i].split = (int32_t)chunks;
        p->kernels[i].owner = (int32_t)i + 1;
        p->kernels[i + 1].split = (int32_t)chunks;
        i++;
    }
    return TB_OK;
}

/* ---- layouts and launch geometry ---- */

/* Work items per row for a kernel with `rows` rows of `len` elements (1: one work item per
   row). `inner`: the row is contiguous (the items of a group read neighbours). */
static int32_t tb__plan_pick_group(const tb__pgraph *G, int64_t rows, int64_t len, bool inner) {
    const tb__tuning *t = G->target->tuning;
    int64_t maxg = t->max_group, cu = (int64_t)G->target->compute_units, n = 1;
    if (maxg > (int64_t)G->target->max_group) maxg = (int64_t)G->target->max_group;
    if (maxg <= 1 || len < t->group_min_len) return 1;
    if (t->item_rows_per_cu > 0 && rows >= cu * t->item_rows_per_cu) return 1;
    if (t->gpu_rows > 0 && !inner && rows >= cu * t->gpu_rows) return 1;
    while (n * 2 <= maxg && n * 2 <= len)
        n *= 2;
    return (int32_t)n;
}

static void tb__plan_launch_rows(tb__plan_kernel *k, int64_t rows, int32_t group) {
    k->group = group;
    k->work_dim = 1;
    if (group == 1) {
        k->items = (uint64_t)rows;
    } else {
        k->group_size[0] = (size_t)group;
        k->group_size[1] = k->group_size[2] = 1;
        k->groups[0] = (size_t)rows;
        k->groups[1] = k->groups[2] = 1;
    }
}

static void tb__plan_launch_groups(tb__plan_kernel *k, size_t gx, size_t gy, size_t nx, size_t ny,
                                   size_t nz) {
    k->work_dim = 3;
    k->group_size[0] = gx;
    k->group_size[1] = gy;
    k->group_size[2] = 1;
    k->groups[0] = nx;
    k->groups[1] = ny;
    k->groups[2] = nz;
}

static void tb__plan_layout_reduce(const tb__pgraph *G, tb__plan_kernel *k) {
    const tb_node *cn = G->info[k->core].node;
    const tb_shape *xs = tb__plan_shape(G, tb__plan_operand(G, k->core, 0));
    bool is_arg = cn->op == TB_OP_ARGMAX || cn->op == TB_OP_ARGMIN, seen = false;
    uint64_t mask = is_arg ? ((uint64_t)1 << cn->attrs[0]) : (uint64_t)cn->attrs[0];
    int64_t n_out, m, rows, len;
    int32_t a, lanes = G->target->tuning->reduce_lanes;
    tb__plan_reduce_sizes(G, k->core, &n_out, &m);
    k->suffix = true;
    for (a = 0; a < xs->rank; a++) {
        if ((mask >> a) & 1u) {
            seen = true;
        } else if (seen) {
            k->suffix = false;
        }
    }
    k->acc = tb__plan_reduce_acc(G, k->core);
    rows = k->kind == TB__K_PARTIAL ? n_out * k->split : n_out;
    len = k->kind == TB__K_PARTIAL ? (m + k->split - 1) / k->split : m;
    if (k->kind == TB__K_REDUCE && k->split > 0) {
        tb__plan_launch_rows(k, rows, 1); /* the final stage: a work item per output */
    } else {
        tb__plan_launch_rows(k, rows, tb__plan_pick_group(G, rows, len, k->suffix));
    }
    k->lanes = (k->group == 1 && !is_arg && lanes > 1 && m >= 4 * lanes) ? lanes : 1;
    k->vec = tb__plan_vec_width(G, k, &k->vec_axes);
    if (k->vec == 0 && !is_arg && k->kind == TB__K_REDUCE && k->split == 0 && k->group == 1 &&
        k->hoists == 0)
        k->col_vec = tb__plan_col_width(G, k);
    if (k->col_vec > 0) {
        k->items = (uint64_t)(n_out / k->col_vec); /* a block of W outputs per work item */
        k->vec_axes = 1;
        k->acc = TB_F32; /* f32 vectors */
        k->lanes = m >= 4 * G->target->tuning->red_vec_lanes ? G->target->tuning->red_vec_lanes : 1;
    }
    if (k->vec > 0) {
        k->acc = tb__plan_shape(G, k->core)->dtype;  /* f32 vectors, several lanes each */
        k->lanes = G->target->tuning->red_vec_lanes; /* vector accumulators */
        k->lane_parts = (double)len * (double)tb_dtype_size(xs->dtype) / k->lanes >=
                        (double)G->target->tuning->stream_min_bytes;
    }
}

/* Whether kernel k (with vectors) may write its output with non-temporal stores: an f32
   output of at least the tuning's size, in buffers whose start is aligned to a vector. */
static bool tb__plan_streams(const tb__pgraph *G, const tb__plan_kernel *k) {
    const tb__tuning *t = G->target->tuning;
    const tb_shape *rs = tb__plan_shape(G, k->root);
    return t->stream_store_min_bytes > 0 && rs->dtype == TB_F32 &&
           G->target->buffer_align >= (uint32_t)k->vec * (uint32_t)sizeof(float) &&
           (double)tb__plan_numel(rs) * 4.0 >= (double)t->stream_store_min_bytes;
}

static void tb__plan_layout_norm(const tb__pgraph *G, tb__plan_kernel *k) {
    const tb_node *cn = G->info[k->core].node;
    const tb_shape *xs = tb__plan_shape(G, tb__plan_operand(G, k->core, 0));
    bool layer = cn->op == TB_OP_LAYER_NORM;
    int64_t len = 1, numel = tb__plan_numel(xs), rows;
    int32_t a;
    if (layer) {
        for (a = xs->rank - (int32_t)cn->attrs[0]; a < xs->rank; a++)
            len *= xs->dims[a];
    } else {
        len = xs->dims[cn->attrs[0]];
    }
    rows = len > 0 ? numel / len : 0;
    k->suffix = layer || cn->attrs[0] == xs->rank - 1;
    k->acc = cn->shape.dtype == TB_F16 || cn->shape.dtype == TB_BF16 ? TB_F32 : cn->shape.dtype;
    if (k->acc == TB_F32 && G->target->acc_f64) k->acc = TB_F64;
    tb__plan_launch_rows(k, rows, tb__plan_pick_group(G, rows, len, k->suffix));
    k->vec = tb__plan_vec_width(G, k, &k->vec_axes);
    if (k->vec > 0) {
        k->acc = TB_F32;
        k->prefetch_rows = G->target->tuning->row_prefetch;
        /* whole vectors at aligned addresses: rows of a multiple of the width (the code
           generator checks each store's offset) */
        k->stream_out = len % k->vec == 0 && tb__plan_streams(G, k);
        if (cn->op == TB_OP_SOFTMAX && k->root == k->core && k->stream_out && k->suffix &&
            len > 0 && 2.0 * (double)len * 4.0 <= (double)G->target->tuning->row_scratch_bytes) {
            int64_t items =
                (int64_t)G->target->compute_units * G->target->tuning->pipe_items_per_cu;
            if (items < 1) items = 1;
            k->chunk_rows = (rows + items - 1) / items;
            k->items = (uint64_t)((rows + k->chunk_rows - 1) / k->chunk_rows);
            /* a work-group of one: the private buffer once per item, whatever the driver's
               work-group loop would make of it */
            tb__plan_launch_groups(k, 1, 1, (size_t)k->items, 1, 1);
        }
    }
}

/* A core's own data cache (L2) in bytes: the target's, else the tuning's. */
static double tb__plan_core_cache(const tb__pgraph *G) {
    return G->target->cache_bytes > 0 ? (double)G->target->cache_bytes
                                      : (double)G->target->tuning->mm_cache_bytes;
}

/* The bytes of one value of a packed matmul's panels (of its pack dtype). */
static double tb__plan_pack_bytes(const tb__pgraph *G, const tb__plan_kernel *k) {
    return (double)tb_dtype_size(tb__plan_pack_dtype(tb__plan_shape(G, k->core)->dtype));
}

/* The column panels of a packed matmul's group (tb__plan_kernel.mm_group): a row panel of A
   is read once per group, the group's panels of B once per row panel, so the group is as wide
   as the caches keep: every panel of B read in one sweep over the rows stays in a core's cache
   (and the last-level cache next to it) until the next row panel reads it again. Without
   groups a sweep reads all of B, which falls out of the caches once B outgrows them (2048 x
   2048 floats: 16 MiB) and then streams from memory for every row panel. 0: one group.
   Where B is read in place (a convolution's windows over whole padded rows), a column panel's
   depth rows are a few runs of the input per channel, each the one before shifted by a value, so
   the panel is a small part of the first-level cache however deep it is: groups of one
   column panel keep it there while every row panel of A passes it, where all of A fits the
   group's share of the cache (a group of several reads each panel of B from the outer cache
   again at each row panel). The ResNet-like convolution of tuning.c (A 64 x 576) on 2 threads
   of a 2-core AMD EPYC Zen 5 VM, medians of three runs: AVX2 code 39.9-40.1 -> 38.4-38.9 ms,
   AVX-512 code about the same (21.0-21.2 -> 20.8-21.1), PoCL's matmul 20.0-20.4 -> 19.4-20.1
   ms; with 128 channels (A 590 KB, more than that share of the 1 MiB cache) it gained
   nothing. */
static int32_t tb__plan_mm_group(const tb__pgraph *G, const tb__plan_kernel *k, const int64_t za[6],
                                 const int64_t zb[6]) {
    const tb__tuning *t = G->target->tuning;
    double cache = tb__plan_core_cache(G), share = cache * (double)t->mm_group_caches;
    double size = tb__plan_pack_bytes(G, k);
    double panel = (double)zb[3] * (double)zb[5] * size;
    double width = panel > 0 ? share / panel : (double)zb[4];
    if (zb[4] > 1 && (double)za[3] * (double)za[4] * (double)za[5] * size <= share &&
        tb__plan_mm_b_buffer(G, k->core) >= 0)
        return 1;
    if (width >= (double)zb[4]) return 0;
    return width < 1 ? 1 : (int32_t)width;
}

/* The column panels each work item of a matmul that packs its own panels of B takes in turn,
   one fill of rows at a time (tb__plan_kernel.own_b_span): where A is larger than a core's
   cache, an item of one panel reads all of A from memory, and every item reads it again; an
   item of several reads each fill's rows of A from memory once and from the cache for its
   other panels. So where A outgrows the cache: the panels split between the compute units
   (the items of several batch indices as well), as many as the tuning's tile of accumulators
   holds, and fills of as many rows as keep their rows of A in half the cache (fewer than a
   fill of the buffer where A has many rows or the panels are narrow: AVX2's 16 columns). The
   weight gradient of a 3 x 3 convolution over 56 x 56, 64 channels and 32 images (A: the
   output's gradient, 64 x 100352; one thread of a 2-core AMD EPYC Zen 5 VM with AVX-512):
   its FMAs with A in the cache ran at 202 GFLOP/s, from memory at 110-118. The fill's rows in
   *fill (k->own_b_k on entry). */
static int32_t tb__plan_own_b_span(const tb__pgraph *G, const tb__plan_kernel *k,
                                   const int64_t za[6], const int64_t zb[6], int64_t *fill) {
    const tb__tuning *t = G->target->tuning;
    double cache = tb__plan_core_cache(G);
    double size = tb__plan_pack_bytes(G, k);
    double rows = (double)za[4] * (double)za[5], tile = rows * (double)zb[5] * size;
    int64_t cu = G->target->compute_units > 0 ? (int64_t)G->target->compute_units : 1;
    int64_t split, panels, most, cap, fills;
    *fill = k->own_b_k;
    if (!k->own_b || k->own_b_k >= za[3] || zb[0] < 1 || zb[4] < 2 ||
        rows * (double)za[3] * size <= cache || tile <= 0 || (double)t->mm_own_b_tile < 2 * tile)
        return 1;
    split = (cu + zb[0] - 1) / zb[0];
    /* rows of the depth whose rows of A take half the cache; fewer than a few hundred leave
       each panel's pass too short beside its accumulators' loads and stores */
    cap = (int64_t)(cache / 2 / (rows * size));
    most = (int64_t)((double)t->mm_own_b_tile / tile);
    panels = (zb[4] + split - 1) / split;
    if (panels > most) {
        /* the span that leaves the fewest panels on the busiest compute unit (items of p
           panels, ceil(items / cu) of them on it), from `most` down to half as many (fewer
           would read A from memory twice as often), the largest of equals: 36 panels of which
           12 fill the tile were 3 items, one of two cores idle for a third of the kernel
           (ResNet-18's 128 x 1152 x 6272 weight gradient), and are 4 of 9 */
        int64_t p, cost = -1, c;
        for (p = most; p >= (most + 1) / 2 && p >= 1; p--) {
            c = (zb[0] * ((zb[4] + p - 1) / p) + cu - 1) / cu * p;
            if (cost < 0 || c < cost) {
                cost = c;
                panels = p;
            }
        }
    }
    if (cap < 256 || panels < 2) return 1;
    if (cap < *fill) {
        fills = (za[3] + cap - 1) / cap;
        *fill = (za[3] + fills - 1) / fills;
    }
    return (int32_t)panels;
}

/* Whether a packed matmul's items prefetch the next row panel of A (tb__plan_kernel.
   mm_prefetch_a): A packed by a pack kernel, in more than one row panel, whose panels outgrow
   half a core's cache (the rest holds B's group), so that each row panel comes from memory. */
static bool tb__plan_mm_prefetch_a(const tb__pgraph *G, const tb__plan_kernel *k,
                                   const int64_t za[6]) {
    return G->target->tuning->mm_prefetch_a && !k->own_b && za[4] > 1 &&
           tb__plan_mm_a_buffer(G, k->core) < 0 &&
           (double)za[4] * (double)za[3] * (double)za[5] * tb__plan_pack_bytes(G, k) >
               tb__plan_core_cache(G) / 2;
}

/* The lanes of one register of a packed matmul's block (the block's row is rn / that many
   registers): the device's row vectors' (f64: half as many), at most the block's width and
   dividing it, else the width itself. */
static int32_t tb__plan_mm_reg_width(const tb__pgraph *G, const tb__plan_kernel *k) {
    int32_t rw =
        G->target->tuning->vec_width / (tb__plan_shape(G, k->core)->dtype == TB_F64 ? 2 : 1);
    return rw < 2 || rw > k->rn || k->rn % rw != 0 ? k->rn : rw;
}

/* How many steps of the depth ahead a packed matmul's items prefetch B's rows where they read
   them in place (B not packed) through a table of offsets (tb__plan_kernel.mm_prefetch_b; 0:
   none): the steps whose vector FMAs (the block's rows times its registers of a row) make the
   tuning's mm_prefetch_b, where that is less than the depth, for blocks of 16 vector FMAs a
   step or more. Fewer leave too few cycles a step for the prefetch's own instructions (the table's
   load and one prefetch a line): the ResNet-like convolution of tuning.c with AVX2 code (6 x
   16 blocks: 12 FMAs) on 2 threads of the Zen 5 VM went from 52-53 to 55-56 ms with it. */
static int32_t tb__plan_mm_prefetch_b(const tb__pgraph *G, const tb__plan_kernel *k,
                                      const int64_t za[6]) {
    const tb__tuning *t = G->target->tuning;
    int64_t fmas, steps;
    if (t->mm_prefetch_b <= 0 || k->own_b || k->rm < 1 || k->rn < 1 ||
        tb__plan_mm_b_buffer(G, k->core) < 0)
        return 0;
    fmas = (int64_t)k->rm * (k->rn / tb__plan_mm_reg_width(G, k));
    if (fmas < 16) return 0;
    steps = (t->mm_prefetch_b + fmas - 1) / fmas;
    return steps < za[3] ? (int32_t)steps : 0;
}

/* The vector width of a packed f32 matmul's epilogue (0: scalar stores): where each of the
   block's rows is whole vectors of the row width and every node between the matmul and the
   kernel's output is of the vector set, a row of the block runs through the epilogue W
   columns at once (a call in it, such as exp, would keep a compiler from vectorising the
   scalar loop). The epilogue may see the matmul through a reshape that keeps its last dim. */
static int32_t tb__plan_mm_vec_epilogue(const tb__pgraph *G, const tb__plan_kernel *k) {
    int32_t w = G->target->tuning->vec_width;
    const tb_shape *cs = tb__plan_shape(G, k->core), *rs = tb__plan_shape(G, k->root);
    if (w <= 0 || k->root == k->core || k->crop_wp > 0 || cs->dtype != TB_F32 || k->rn % w != 0 ||
        rs->rank < 1 || rs->dims[rs->rank - 1] != cs->dims[cs->rank - 1] ||
        !tb__plan_vec_dtype(rs->dtype))
        return 0;
    return tb__plan_vec_subtree(G, k, k->root, k->core, 1) ? w : 0;
}

/* The narrowest of 4, 8 or 16 lanes that holds rn, at most the device's row vector (one
   wider than the registers would be kept in memory). */
static int32_t tb__plan_mm_reg_lanes(const tb__tuning *t, int32_t rn) {
    int32_t w = rn <= 4 ? 4 : (rn <= 8 ? 8 : 16);
    return t->vec_width >= 4 && w > t->vec_width ? t->vec_width : w;
}

static void tb__plan_layout_matmul(const tb__pgraph *G, tb__plan_kernel *k) {
    const tb__tuning *t = G->target->tuning;
    tb__plan_mm mm = tb__plan_mm_of(G, k->core);
    if (k->mm == TB__MM_PACKED) {
        int64_t za[6], zb[6];
        tb__plan_pack_sizes(G, k->core, true, za);
        tb__plan_pack_sizes(G, k->core, false, zb);
        k->rm = (int32_t)za[5];
        k->rn = (int32_t)zb[5];
        /* an item packing its own panel of B computes every row panel against it */
        k->mm_group = k->own_b ? 0 : tb__plan_mm_group(G, k, za, zb);
        k->own_b_span = tb__plan_own_b_span(G, k, za, zb, &k->own_b_k);
        k->mm_prefetch_a = tb__plan_mm_prefetch_a(G, k, za);
        k->mm_prefetch_b = tb__plan_mm_prefetch_b(G, k, za);
        k->vec = tb__plan_mm_vec_epilogue(G, k);
        if (k->vec > 0) k->vec_axes = 1;
        tb__plan_launch_groups(k, 1, 1, (size_t)((zb[4] + k->own_b_span - 1) / k->own_b_span),
                               k->own_b ? 1 : (size_t)za[4], (size_t)zb[0]);
    } else if (k->mm == TB__MM_REGISTERS) {
        int64_t lx = t->mm_reg_group_x, ly = t->mm_reg_group_y, bx, by;
        k->rm = (int32_t)(mm.m < t->mm_reg_rows ? (mm.m > 0 ? mm.m : 1) : t->mm_reg_rows);
        k->rn = (int32_t)(mm.n < t->mm_reg_cols ? (mm.n > 0 ? mm.n : 1) : t->mm_reg_cols);
        /* few columns (the last layer of a classifier): one block of all of them */
        if (mm.n > t->mm_reg_cols && mm.n <= t->mm_small_n) k->rn = (int32_t)mm.n;
        /* f32 with fewer rows than a block (a batched matrix-vector product, the input
           gradient of a convolution of one channel): as many columns as 8 vector registers
           of accumulators hold (64 at most), whose B values the codegen reads with one load
           per vector where they lie in a row of a buffer; the index arithmetic of a step of
           K is then shared by up to 64 products, and the adds run in independent chains.
           While every compute unit keeps 4 blocks. The input gradient of a LeNet-like
           convolution (256 images, 1 -> 32 channels, 28 x 28, 5 x 5; 1 x 896 x 800 per image)
           on a 2-core Intel Xeon with AVX-512: 56 ms with 8 columns read one by one, 35 read
           as one vector, 7 with 64 columns. Where the block does not divide N, the last block
           is moved left to end at N (the codegen: tb__cg_kernel_matmul_registers). */
        if (tb__plan_shape(G, k->core)->dtype == TB_F32 && mm.m < t->mm_reg_rows && k->rn < 16 &&
            mm.n >= 16) {
            int64_t rn = 16, blocks_m = (mm.m + k->rm - 1) / k->rm;
            int64_t most = t->vec_width >= 4 && t->vec_width < 8 ? 8 * t->vec_width : 64;
            while (rn * 2 * k->rm <= most && rn * 2 <= mm.n &&
                   (mm.n + rn * 2 - 1) / (rn * 2) * blocks_m * mm.batch >=
                       4 * (int64_t)G->target->compute_units)
                rn *= 2;
            k->rn = (int32_t)rn;
        }
        /* f32, all the columns in one block: the loads of B's row at each step of K (made into
           one vector where the dialect has vec_make) are shared by twice the rows where every
           compute unit still gets blocks, and one block per work-group (a CPU driver's loop
           over a group's items shares none of that work). 256x10x512: native 0.068 -> 0.063
           ms, PoCL 0.137 -> 0.108 ms (8 rows and one block per group: 0.128). */
        if (tb__plan_shape(G, k->core)->dtype == TB_F32 && k->rn == mm.n && mm.n > 1) {
            if (mm.m >= 4 * t->mm_reg_rows * (int64_t)G->target->compute_units)
                k->rm = 2 * t->mm_reg_rows;
            lx = ly = 1;
        }
        /* f32 vectors: no more rows than the accumulators fit in */
        if (tb__plan_shape(G, k->core)->dtype == TB_F32 && k->rn > 1) {
            int32_t w = tb__plan_mm_reg_lanes(t, k->rn), nb = (k->rn + w - 1) / w;
            while (k->rm > 1 && k->rm * nb > t->mm_reg_accs)
                k->rm = (k->rm + 1) / 2;
        }
        /* no work-group wider than the blocks there are: padding items would do nothing
           (they return at once) */
        bx = (mm.n + k->rn - 1) / k->rn;
        by = (mm.m + k->rm - 1) / k->rm;
        if (lx > bx) lx = bx > 0 ? bx : 1;
        if (ly > by) ly = by > 0 ? by : 1;
        tb__plan_launch_groups(
            k, (size_t)lx, (size_t)ly, (size_t)(((mm.n + k->rn - 1) / k->rn + lx - 1) / lx),
            (size_t)(((mm.m + k->rm - 1) / k->rm + ly - 1) / ly), (size_t)mm.batch);
    } else {
        int64_t w = t->mm_tile_group, tm, tn;
        if (G->target->max_group < (uint32_t)(w * w)) w /= 2;
        k->rm = k->rn = t->mm_tile_block;
        if (mm.m * mm.n < 64 * 64 || mm.m < 32 || mm.n < 32) k->rm = k->rn = 1;
        k->tk = t->mm_tile_k;
        tm = w * k->rm;
        tn = w * k->rn;
        tb__plan_launch_groups(k, (size_t)w, (size_t)w, (size_t)((mm.n + tn - 1) / tn),
                               (size_t)((mm.m + tm - 1) / tm), (size_t)mm.batch);
    }
    k->flops = 2.0 * (double)mm.m * (double)mm.n * (double)mm.k * (double)mm.batch;
}

/* Pack kernels: a work item per mm_pack_rows rows of a panel, the rows of a panel along dim 0
   (neighbouring items write neighbouring rows), batch x panels along dim 1 (the renderer may
   visit the panels first where that reads memory in order: tb__plan_kernel.panels_first). */
static void tb__plan_layout_pack(const tb__pgraph *G, tb__plan_kernel *k) {
    const tb__tuning *t = G->target->tuning;
    int64_t z[6], rows = t->mm_pack_rows, gk = t->mm_pack_group_k, items;
    tb__plan_pack_sizes(G, k->core, k->kind == TB__K_PACK_A, z);
    items = (z[3] + rows - 1) / rows;
    if (gk > items) gk = items > 0 ? items : 1;
    tb__plan_launch_groups(k, (size_t)gk, 1, (size_t)((items + gk - 1) / gk), (size_t)(z[0] * z[4]),
                           1);
}

static void tb__plan_layout(tb__pgraph *G) {
    tb__plan *p = G->plan;
    double *ops = (double *)tb__calloc(p->num_kernels + 1, sizeof(double));
    size_t i;
    if (ops != NULL) {
        /* values each kernel computes per element, for the GFLOP/s of TB_DEBUG=2 */
        for (i = 0; i < G->n; i++) {
            const tb__pnode *in = &G->info[i];
            if (in->ctx >= 0 && in->param < 0 && tb__plan_is_elementwise(in->node->op))
                ops[in->ctx] += 1;
        }
    }
    for (i = 0; i < p->num_kernels; i++) {
        tb__plan_kernel *k = &p->kernels[i];
        double per = ops != NULL ? ops[k->owner] : 0;
        switch (k->kind) {
        case TB__K_REDUCE:
        case TB__K_PARTIAL: {
            int64_t n_out, m;
            tb__plan_layout_reduce(G, k);
            tb__plan_reduce_sizes(G, k->core, &n_out, &m);
            k->flops = k->split > 0 && k->kind == TB__K_REDUCE
                           ? (double)k->split * (double)n_out
                           : (per + 1) * (double)m * (double)n_out;
            break;
        }
        case TB__K_NORM:
            tb__plan_layout_norm(G, k);
            k->flops = (per + 8) *
                       (double)tb__plan_numel(tb__plan_shape(G, tb__plan_operand(G, k->core, 0)));
            break;
        case TB__K_MATMUL:
            tb__plan_layout_matmul(G, k);
            break;
        case TB__K_PACK_A:
        case TB__K_PACK_B:
            tb__plan_layout_pack(G, k);
            k->flops = per * (double)p->slots[k->out_slot].shape.dims[0];
            break;
        case TB__K_CONCAT: { /* an item per element of its slice */
            const tb_shape *cs = tb__plan_shape(G, k->root);
            int32_t d;
            k->work_dim = 1;
            k->items = (uint64_t)k->cat_len;
            for (d = 0; d < cs->rank; d++)
                if (d != (int32_t)G->info[k->root].node->attrs[0])
                    k->items *= (uint64_t)cs->dims[d];
            break;
        }
        default:
            k->work_dim = 1;
            k->items = (uint64_t)tb__plan_numel(tb__plan_shape(G, k->root));
            k->flops = per * (double)k->items;
            k->vec = tb__plan_vec_width(G, k, &k->vec_axes);
            if (k->vec > 0) {
                k->items /= (uint64_t)k->vec; /* a block of W elements per work item */
                k->stream_out = k->kind == TB__K_ELEMENTWISE &&
                                G->target->tuning->stream_elementwise && tb__plan_streams(G, k);
            } else if (k->kind == TB__K_ELEMENTWISE && G->target->tuning->elem_row_loops) {
                /* (MobileNetV2 on PoCL, batch 2 at 224 x 224, where a reduction is unrolled in
                   the kernel: 16 ms, against 35 with an item per element) */
                const tb_shape *rs = tb__plan_shape(G, k->root);
                int32_t d = rs->rank - 1;
                int64_t len;
                while (d > 0 && rs->dims[d] == 1) /* kept dims of 1 (an argmax's): rows before */
                    d--;
                len = d >= 1 ? rs->dims[d] : 0;
                if (len >= 2 && k->items / (uint64_t)len >= (uint64_t)G->target->compute_units) {
                    k->row_len = len;
                    k->items /= (uint64_t)len;
                }
            }
            break;
        }
        if (k->group_size[0] > 0) {
            k->empty = k->groups[0] == 0 || k->groups[1] == 0 || k->groups[2] == 0;
        } else {
            k->empty = k->items == 0;
        }
    }
    tb__free(ops);
}

/* ---- names ---- */

/* Names that say what a kernel is (tinygrad's habit): E_<elements> elementwise, C_<elements>
   a run of a concat's operands,
   R_<outputs>_<length> reductions (split ones by stage), S_<rows>_<length> softmax and norms,
   MM_<M>_<N>_<K>[_b<batch>] matmuls, PA_/PB_<panels>_<K>_<width> their operand panels; a name
   met before gets _n2, _n3, ... */
static void tb__plan_kernel_name(const tb__pgraph *G, size_t index) {
    tb__plan *p = G->plan;
    tb__plan_kernel *k = &p->kernels[index];
    char base[48];
    size_t i;
    int dup = 0;
    if (k->kind == TB__K_MATMUL) {
        tb__plan_mm mm = tb__plan_mm_of(G, k->core);
        snprintf(base, sizeof base, "MM_%lld_%lld_%lld", (long long)mm.m, (long long)mm.n,
                 (long long)mm.k);
        if (mm.batch != 1) {
            size_t n = strlen(base);
            snprintf(base + n, sizeof base - n, "_b%lld", (long long)mm.batch);
        }
    } else if (k->kind == TB__K_PACK_A || k->kind == TB__K_PACK_B) {
        int64_t z[6];
        tb__plan_pack_sizes(G, k->core, k->kind == TB__K_PACK_A, z);
        snprintf(base, sizeof base, "P%s_%lld_%lld_%lld", k->kind == TB__K_PACK_A ? "A" : "B",
                 (long long)(z[0] * z[4]), (long long)z[3], (long long)z[5]);
    } else if (k->kind == TB__K_REDUCE || k->kind == TB__K_PARTIAL) {
        int64_t n_out, m;
        tb__plan_reduce_sizes(G, k->core, &n_out, &m);
        if (k->kind == TB__K_PARTIAL) {
            snprintf(base, sizeof base, "R_%lld_%lld", (long long)(n_out * k->split),
                     (long long)((m + k->split - 1) / k->split));
        } else if (k->split > 0) {
            snprintf(base, sizeof base, "R_%lld_%lld", (long long)n_out, (long long)k->split);
        } else {
            snprintf(base, sizeof base, "R_%lld_%lld", (long long)n_out, (long long)m);
        }
    } else if (k->kind == TB__K_NORM) {
        const tb_node *c = G->info[k->core].node;
        const tb_shape *xs = tb__plan_shape(G, tb__plan_operand(G, k->core, 0));
        int64_t len = 1, numel = tb__plan_numel(xs);
        int32_t a;
        if (c->op == TB_OP_LAYER_NORM) {
            for (a = xs->rank - (int32_t)c->attrs[0]; a < xs->rank; a++)
                len *= xs->dims[a];
        } else {
            len = xs->dims[c->attrs[0]];
        }
        snprintf(base, sizeof base, "S_%lld_%lld", (long long)(len > 0 ? numel / len : 0),
                 (long long)len);
    } else if (k->kind == TB__K_CONCAT) {
        snprintf(base, sizeof base, "C_%llu", (unsigned long long)k->items);
    } else {
        snprintf(base, sizeof base, "E_%lld",
                 (long long)tb__plan_numel(tb__plan_shape(G, k->root)));
    }
    for (i = 0; i < index; i++) {
        const char *other = p->kernels[i].name;
        size_t n = strlen(base);
        if (strncmp(other, base, n) == 0 && (other[n] == '\0' || other[n] == '_')) {
            if (other[n] == '\0' || (other[n + 1] == 'n')) dup++;
        }
    }
    if (dup > 0) {
        snprintf(k->name, sizeof k->name, "%s_n%d", base, dup + 1);
    } else {
        snprintf(k->name, sizeof k->name, "%s", base);
    }
}

/* Bytes a kernel moves: its output and every buffer it reads. */
static double tb__plan_kernel_bytes(const tb__plan *p, const tb__plan_kernel *k) {
    size_t i, n = 0;
    double bytes = 0;
    if (tb_shape_nbytes(&p->slots[k->out_slot].shape, &n) == TB_OK) /* a concat's: its slice */
        bytes += k->kind == TB__K_CONCAT
                     ? (double)k->items * (double)tb_dtype_size(p->slots[k->out_slot].shape.dtype)
                     : (double)n;
    for (i = 0; i < k->num_args; i++) {
        if (k->args[i].kind != TB__ARG_BUF) continue;
        if (tb_shape_nbytes(&p->slots[k->args[i].index].shape, &n) == TB_OK) bytes += (double)n;
    }
    return bytes;
}

/* ---- the plan of a graph ---- */

static tb_status tb__plan_params(tb__pgraph *G) {
    tb__plan *p = G->plan;
    const tb_graph *g = G->graph;
    size_t i, scalars = 0;
    p->graph_hash = g->hash;
    p->num_params = g->num_parameters;
    p->num_results = g->num_results;
    p->param_scalar = (int32_t *)tb__calloc(p->num_params + 1, sizeof(int32_t));
    p->param_dtype = (tb_dtype *)tb__calloc(p->num_params + 1, sizeof(tb_dtype));
    p->result_slot = (int32_t *)tb__calloc(p->num_results + 1, sizeof(int32_t));
    p->result_source = (int32_t *)tb__calloc(p->num_results + 1, sizeof(int32_t));
    p->result_alias = (int32_t *)tb__calloc(p->num_results + 1, sizeof(int32_t));
    p->node_kernel = (int32_t *)tb__calloc(G->n + 1, sizeof(int32_t));
    if (p->param_scalar == NULL || p->param_dtype == NULL || p->result_slot == NULL ||
        p->result_source == NULL || p->result_alias == NULL || p->node_kernel == NULL)
        return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < p->num_results; i++)
        p->result_alias[i] = -1;
    p->first_alias = -1;
    for (i = 0; i < p->num_params; i++) {
        p->param_scalar[i] = g->parameters[i]->op == TB_OP_SCALAR ? 1 : 0;
        p->param_dtype[i] = g->parameters[i]->shape.dtype;
        scalars += (size_t)p->param_scalar[i];
    }
    p->scalar_table = scalars > TB__PLAN_MAX_SCALAR_ARGS;
    p->num_nodes = G->n;
    return TB_OK;
}

/* ---- buffer donation ---- */

/* Whether user u reads its operand o at the element it is evaluated at (flat, row-major): an
   elementwise op over equal dims, or a reshape. */
static bool tb__plan_same_element(const tb__pgraph *G, int32_t u, int32_t o) {
    const tb_node *un = G->info[u].node;
    if (un->op == TB_OP_RESHAPE) return true;
    return tb__plan_is_elementwise(un->op) && tb__plan_same_dims(&un->shape, tb__plan_shape(G, o));
}

/* Whether every reader of node n in kernel kk is evaluated only at the kernel's output
   element and reads n there; at_root holds the answer for the nodes after n. */
static bool tb__plan_read_at_root(const tb__pgraph *G, int32_t n, int32_t kk, const bool *at_root) {
    int32_t e;
    for (e = 0; e < G->info[n].num_users; e++) {
        int32_t u = G->users[G->info[n].first_user + e];
        if (G->info[u].ctx != kk) continue; /* an earlier kernel: done before this one starts */
        if (!at_root[u] || !tb__plan_same_element(G, u, n)) return false;
    }
    return true;
}

/* Whether result i may be computed into the buffer of parameter `param`: its kernel is
   elementwise, every node of that kernel reading the parameter is evaluated only at the
   kernel's own output element and reads the parameter there, no later kernel reads the
   parameter and no later kernel can fail at run time. Returns the kernel, or -1. */
static int32_t tb__plan_alias_kernel(const tb__pgraph *G, size_t i, int32_t param) {
    const tb__plan *p = G->plan;
    int32_t r, pn, kk = -1, n;
    size_t j, a;
    bool *at_root, ok;
    const tb_shape *ps;
    if (p->result_source[i] >= 0 || param < 0 || (size_t)param >= p->num_params ||
        p->param_scalar[param])
        return -1;
    r = tb__plan_index_of(G, G->graph->results[i]);
    pn = tb__plan_index_of(G, G->graph->parameters[param]);
    if (r < 0 || pn < 0 || G->info[pn].slot < 0) return -1;
    ps = tb__plan_shape(G, pn);
    if (!tb__plan_same_dims(ps, tb__plan_shape(G, r)) || ps->dtype != tb__plan_shape(G, r)->dtype ||
        tb__plan_numel(ps) <= 1)
        return -1;
    for (j = 0; j < p->num_kernels; j++)
        if (p->kernels[j].root == r && p->kernels[j].owner == (int32_t)j) kk = (int32_t)j;
    if (kk < 0 || p->kernels[kk].kind != TB__K_ELEMENTWISE || p->kernels[kk].core >= 0 ||
        p->kernels[kk].empty || p->slots[G->info[pn].slot].last_use > kk)
        return -1;
    at_root = (bool *)tb__calloc(G->n + 1, sizeof(bool));
    if (at_root == NULL) return -1; /* no memory: no donation */
    /* users come after their operands: from the root down */
    at_root[r] = true;
    for (n = r - 1; n >= 0; n--)
        if (G->info[n].ctx == kk && G->info[n].param < 0 && !G->info[n].root)
            at_root[n] = G->info[n].num_users > 0 && tb__plan_read_at_root(G, n, kk, at_root);
    ok = tb__plan_read_at_root(G, pn, kk, at_root);
    tb__free(at_root);
    if (!ok) return -1;
    for (j = (size_t)kk; j < p->num_kernels; j++)
        for (a = 0; a < p->kernels[j].num_args; a++)
            if (p->kernels[j].args[a].kind == TB__ARG_ERR) return -1;
    return kk;
}

/* The results computed into their donors' buffers (tb_graph.result_donors). */
static void tb__plan_aliases(tb__pgraph *G) {
    tb__plan *p = G->plan;
    size_t i, j;
    for (i = 0; G->graph->result_donors != NULL && i < p->num_results; i++) {
        int32_t d = G->graph->result_donors[i], kk;
        bool taken = false;
        for (j = 0; j < i; j++)
            taken = taken || p->result_alias[j] == d;
        if (d < 0 || taken) continue;
        kk = tb__plan_alias_kernel(G, i, d);
        if (kk < 0) continue;
        p->result_alias[i] = d;
        if (p->first_alias < 0 || kk < p->first_alias) p->first_alias = kk;
    }
}

/* Plans `graph` for `target`. On success *out is the plan (free with tb__plan_free) and G is
   the graph view the renderer reads (free with tb__pgraph_free once the code is emitted). A
   kernel with more arguments than the device takes gets producers materialised until it fits;
   if that cannot help (one node reads too many arrays), the error says so. */
static tb_status tb__plan_build(const tb_graph *graph, const tb__target *target, tb__pgraph *G,
                                tb__plan **out) {
    tb__plan *p;
    tb_status st;
    size_t i;
    int32_t over = -1, pick = -1;
    memset(G, 0, sizeof *G);
    *out = NULL;
    G->graph = graph;
    G->target = target;
    p = (tb__plan *)tb__calloc(1, sizeof *p);
    if (p == NULL) return TB_ERR_OUT_OF_MEMORY;
    G->plan = p;
    st = tb__pgraph_init(G);
    if (st == TB_OK) st = tb__plan_params(G);
    while (st == TB_OK) {
        st = tb__plan_partition(G);
        if (st == TB_OK) st = tb__plan_split_reductions(G);
        if (st == TB_OK) st = tb__plan_pack_matmuls(G);
        if (st == TB_OK) st = tb__plan_split_concats(G);
        if (st == TB_OK) st = tb__plan_assign_slots(G);
        if (st == TB_OK) st = tb__plan_args(G, &over);
        if (st != TB_OK || over < 0) break;
        st = tb__plan_pick_cut(G, over, &pick);
        if (st == TB_OK && pick < 0) {
            tb__plan_kernel_name(G, (size_t)over);
            st = tb__error(TB_ERR_UNSUPPORTED,
                           "%s: kernel %s reads %zu arrays and scalars, more than the %zu "
                           "arguments the device takes",
                           target->tuning->name, p->kernels[over].name, p->kernels[over].num_args,
                           target->max_args);
        }
        if (st == TB_OK) G->info[pick].force_root = true;
    }
    if (st == TB_OK) {
        tb__plan_aliases(G);
        tb__plan_layout(G);
        for (i = 0; i < p->num_kernels; i++) {
            tb__plan_kernel_name(G, i);
            p->kernels[i].bytes = tb__plan_kernel_bytes(p, &p->kernels[i]);
        }
        for (i = 0; i < G->n; i++) {
            int32_t k = G->info[i].ctx;
            if (G->info[i].param >= 0 || k < 0 || (size_t)k >= p->num_kernels ||
                p->kernels[k].empty)
                k = -1;
            p->node_kernel[i] = k;
        }
    }
    if (st != TB_OK) {
        tb__pgraph_free(G);
        tb__plan_free(p);
        return st;
    }
    *out = p;
    return TB_OK;
}

#endif /* TB__HAVE_COMPILED_BACKENDS */
