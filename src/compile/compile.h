/* ===========================================================================================
   The internal contract of the compiled backends (OpenCL, native): what the planner, the index
   arithmetic, the code generator and the disk cache give the parts after them. The types are
   defined here and the functions declared; each is defined in the part named above it.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* ---- diskcache.c: the disk cache of compiled programs ---- */

#define TB__DISK_MAX_PARTS 12

/* What a program depends on, as texts: the source, the compiler or driver and its options,
   the device, this library's version. Equal keys, interchangeable programs. */
typedef struct tb__disk_key {
    const char *parts[TB__DISK_MAX_PARTS];
    size_t lens[TB__DISK_MAX_PARTS];
    size_t count;
} tb__disk_key;

/* A kind of entry: the backend naming it in messages, its magic (8 bytes), format version and
   file name suffix. */
typedef struct tb__disk_format {
    const char *who;
    const char *magic;
    uint32_t version;
    const char *suffix;
} tb__disk_format;

/* adds a part (a NUL-terminated text when len is (size_t)-1); false when the key is full */
static bool tb__disk_key_add(tb__disk_key *key, const char *part, size_t len);
/* a 128-bit hash of the key's parts, masked by `mask` */
static void tb__disk_key_hash(const tb__disk_key *key, uint64_t mask, uint64_t out[2]);
/* the cache folder's path (caller frees), or NULL when the cache is off */
static char *tb__disk_cache_path(void);
/* the payload of the entry of `key` (caller frees) or NULL; then *save_dir is the folder to
   write the program to (caller frees; NULL when the cache is off or not usable), *path the
   entry's path (caller frees) and *why what is wrong with a file that is there */
static unsigned char *tb__disk_lookup(const tb__disk_format *fmt, const tb__disk_key *key,
                                      const uint64_t hash[2], int32_t *reported, size_t *size,
                                      char **save_dir, char **path, const char **why);
/* removes an entry that cannot be used */
static void tb__disk_reject(const char *path);
/* writes `payload` as the entry of `key` in the folder `dir` */
static void tb__disk_store(const tb__disk_format *fmt, const char *dir, const tb__disk_key *key,
                           const uint64_t hash[2], int32_t *reported, const unsigned char *payload,
                           size_t n);

/* ---- planner.c: the kernel plan ---- */

/* The numbers that shape kernels for a class of device. A backend picks the table of its
   device and may hand the planner a copy with changes (tests, experiments). */
typedef struct tb__tuning {
    const char *name;
    /* reductions and norms over rows */
    int32_t reduce_lanes;     /* independent accumulators per work item and row (1: one) */
    int32_t max_group;        /* largest work-group for one row; 1: a work item per row always */
    int64_t group_min_len;    /* rows shorter than this get one work item each */
    int32_t item_rows_per_cu; /* from this many rows per compute unit, a work item per row */
    int32_t gpu_rows;         /* GPUs: one item per row when rows >= compute units x this and
                                 the row is not contiguous (neighbours read neighbours); 0: off */
    /* split reductions: few outputs over many elements */
    int64_t split_min_len;       /* rows shorter than this are not split */
    int64_t split_min_chunk;     /* elements per chunk at least */
    int32_t split_chunks_per_cu; /* outputs x chunks wanted per compute unit */
    int32_t split_max_chunks;
    /* matmul */
    int32_t mm_kind;     /* TB__MM_PACKED (registers as fallback) or TB__MM_TILES */
    int32_t mm_reg_rows; /* register block of the unpacked kernel: rows x columns */
    int32_t mm_reg_cols;
    int32_t mm_small_n;     /* up to this many columns: one register block of all of them */
    int32_t mm_reg_accs;    /* f32: the vector accumulators its block may keep at most */
    int32_t mm_reg_group_x; /* its work-group */
    int32_t mm_reg_group_y;
    int32_t mm_panel_rows;     /* packed: rows of A per panel and per work item, at most */
    int32_t mm_panel_rows_min; /* and at least: each matmul takes the count that pads M least */
    int32_t mm_vec_f32;        /* packed: columns of B per panel (a row of vectors) for f32 */
    int32_t mm_vec_f64;        /* and f64 */
    int32_t mm_wide_rows;      /* packed f32: a second block, fewer rows (below the minimum) */
    int32_t mm_wide_cols;      /* by more columns, where it pads the output no more; 0: none */
    bool mm_wide_in_place;     /* the wide block only where the matmul reads B in place */
    int32_t mm_pack_rows;      /* pack kernels: rows of a panel per work item */
    int32_t mm_pack_group_k;   /* pack kernels: work items per work-group */
    int64_t mm_pack_min_work;  /* M x N x K below this: not packed */
    int64_t mm_own_b_bytes;    /* packed: the private buffer of a matmul's work item that packs
                                  its own column panel of B, this panel's rows at a time (0:
                                  never), */
    int64_t mm_own_b_rows;     /* where the matmul has at most this many rows */
    int64_t mm_own_b_tile;     /* and the bytes of accumulators an item of it keeps at most: as
                                  many column panels as they hold, each item (0: one) */
    int64_t mm_cache_bytes;    /* packed: a core's own data cache (L2) where the target does not
                                  say (an OpenCL device reports only its last-level cache) */
    double mm_group_caches;    /* packed: the column panels one sweep over the row panels reuses
                                  fill this share of those caches at most (a fraction: the
                                  panels of A the sweep streams need the rest) */
    bool mm_prefetch_a;        /* packed: an item prefetches the next row panel of A (packed
                                  A) into the outer caches as it reads its own */
    int64_t mm_prefetch_b;     /* packed, B read in place through a table of its rows'
                                  offsets: each step of the depth fetches the row this many
                                  vector FMAs of the block ahead into the first-level cache
                                  (0: none) */
    int32_t mm_tile_group;     /* tiles: work-group side (halved on small devices) */
    int32_t mm_tile_block;     /* tiles: outputs per work item along each side */
    int32_t mm_tile_k;         /* tiles: depth of a tile */
    /* budgets of one kernel's code */
    int64_t values_per_kernel;  /* values a kernel computes per output element */
    int32_t positions_per_node; /* positions one node is evaluated at in one kernel */
    int32_t nesting;            /* pad, concat and gather nested in one kernel */
    /* launch */
    int32_t item_group; /* preferred work-group of kernels launched over items */
    /* rows read in order: f32 elements per vector (a work item's row loop reads that many at
       once); 0: no vectors (rows are spread over a work-group instead) */
    int32_t vec_width;
    /* scalar elementwise kernels: a work item per row of the last axis (1) or per element (0) */
    int32_t elem_row_loops;
    /* reductions with vectors: from this many bytes per accumulator, each accumulator reads its
       own part of the range (a core's prefetchers follow several streams at once) */
    int64_t stream_min_bytes;
    /* reductions with vectors: vector accumulators per work item (each its own part of the
       range from stream_min_bytes on) */
    int32_t red_vec_lanes;
    /* norms with vectors over contiguous rows: the second pass over a row (read from the
       cache) prefetches the next row's x, so memory works while the row is computed */
    bool row_prefetch;
    /* norms with vectors: an output of at least this many bytes is written with non-temporal
       stores (no read of its lines before the write, no eviction of what the caches hold);
       0: never */
    int64_t stream_store_min_bytes;
    /* elementwise kernels with vectors stream such outputs too (the backend fences once per
       range of work items; OpenCL has no such point without a barrier) */
    bool stream_elementwise;
    /* a softmax over rows with a streamed output: a work item's private buffer for two rows
       of exponentials may take this many bytes (0: no such buffer), and a work item then
       takes a chunk of rows, about pipe_items_per_cu items per compute unit */
    int64_t row_scratch_bytes;
    int32_t pipe_items_per_cu;
    int64_t pack_split_rows; /* a pack's runs of rows this long or longer are split at the pads'
                                edges (tb__cg_pack_lane_runs) */
    int64_t pack_lane_rows;  /* a pack whose runs of lanes are short (fewer than 8) goes lane by
                                lane where its runs of rows are this long or longer, and at least
                                twice its runs of lanes (tb__cg_pack_panel) */
} tb__tuning;

enum { TB__MM_REGISTERS = 0, TB__MM_PACKED = 1, TB__MM_TILES = 2 };
enum { TB__CLASS_CPU, TB__CLASS_GPU, TB__CLASS_HOST };

/* The vector shape of a CPU (or of what a compiler targets on it): the width of its vector
   registers in bytes (64 AVX-512, 32 AVX2, 16 SSE and NEON), how many there are (32 or 16),
   fused multiply-add and 16-bit float conversions, and its class's name. */
typedef struct tb__host_shape {
    int32_t vec_bytes;
    int32_t vec_regs;
    bool fma, f16c, x86;
    char name[16];
} tb__host_shape;

/* What the planner knows of the device. */
typedef struct tb__target {
    const tb__tuning *tuning;
    uint32_t compute_units;
    uint32_t max_group;      /* the device's largest work-group */
    uint64_t max_allocation; /* bytes; 0: unknown */
    size_t max_args;         /* kernel arguments the device takes (8 bytes each) */
    bool f64;                /* double precision is available */
    bool acc_f64;            /* f32 sums accumulate in double (cheap on CPUs with fp64) */
    uint64_t cache_bytes;    /* a compute unit's own data cache (L2) in bytes; 0: unknown */
    uint32_t buffer_align;   /* bytes every buffer's start is aligned to; 0: unknown */
    /* a kernel may read its buffer arguments through a table of them (the dialect's
       TB__CG_ARGS parameter), so that its code does not grow with their number */
    bool arg_table;
} tb__target;

/* ---- the plan ---- */

enum {
    TB__K_ELEMENTWISE,
    TB__K_REDUCE,
    TB__K_MATMUL,
    TB__K_NORM,
    TB__K_PARTIAL, /* first stage of a split reduction: partial results per chunk */
    TB__K_PACK_A,  /* a matmul's left operand copied into row panels */
    TB__K_PACK_B,  /* a matmul's right operand copied into column panels */
    TB__K_CONCAT   /* a run of a concat's operands written into their slice of its output */
};
/* How a TB__K_CONCAT kernel finds the operand of an element: by comparisons in a balanced
   tree (one leaf of code per operand), or by index into a table (no code per operand): of
   the kernel's buffer arguments (target arg_table) or of the scalars (plan scalar_table). */
enum { TB__CAT_TREE, TB__CAT_ARGS, TB__CAT_SCALARS };
enum { TB__SLOT_PARAM, TB__SLOT_RESULT, TB__SLOT_TEMP };
/* a kernel's arguments after its output: buffers, scalars by value, the error flag buffer,
   the table of scalars (graphs with many scalars) */
enum { TB__ARG_BUF, TB__ARG_SCALAR, TB__ARG_ERR, TB__ARG_TABLE };

/* Graphs with more scalar parameters than this pass them in a table (one small buffer written
   before the kernels) rather than as kernel arguments: devices may accept as little as 1024
   bytes of arguments per kernel. */
#define TB__PLAN_MAX_SCALAR_ARGS 16
/* the context of a view that every kernel reading it evaluates itself */
#define TB__CTX_ANY (-3)

typedef struct tb__plan_arg {
    int32_t kind;
    int32_t index; /* a slot for buffers, a parameter for scalars */
} tb__plan_arg;

typedef struct tb__plan_kernel {
    int32_t kind;
    int32_t root, core; /* node indices; core -1 for elementwise kernels */
    int32_t owner; /* the kernel whose nodes it evaluates: itself, or the kernel it is a stage of
                      (the final stage of a split reduction, a matmul reading panels) */
    int32_t split; /* a split reduction's chunk count (both stages), else 0 */
    int32_t partial_slot; /* the final stage: the partial results it reads */
    int32_t mm;           /* matmul: TB__MM_* */
    int32_t pack_slot[2]; /* a packed matmul: the panels of A and B */
    int32_t pack_param;   /* a pack kernel: the parameter whose buffer alone its panels come
                             from (panels a backend may keep while that buffer holds), or -1 */
    int32_t out_slot;
    /* TB__K_CONCAT: the run of the root concat's operands [cat_first, cat_first + cat_count),
       its slice [cat_start, cat_start + cat_len) along the concat's axis, its form
       (TB__CAT_*); the kernels of one concat share its output (the owner is the last) */
    int32_t cat_first, cat_count, cat_form;
    int64_t cat_start, cat_len;
    char name[64];
    char fn[64]; /* the program's function that runs it: its own name, or the name of an
                    earlier kernel of the program whose code is the same (set by the renderer) */
    tb__plan_arg *args;
    size_t num_args;
    /* graphs with a table of scalars: the parameters this kernel reads from it, which the
       table holds for it at entries [table_at, table_at + num_table_params), in this order (the
       kernel's code names its own entries, so kernels differing only in which scalars they
       read share their code) */
    int32_t *table_params;
    size_t num_table_params;
    int64_t table_at;
    /* where the renderer put its function in the program's text (0, 0 for a kernel that runs
       an earlier kernel's function): after the plan's text_head, which every function uses */
    size_t text_at, text_len;
    /* layout */
    int32_t group;      /* reductions and norms: work items per row (1: one item per row) */
    int32_t lanes;      /* reductions: independent accumulators per item */
    bool lane_parts;    /* reductions with vectors: each accumulator runs over its own part of
                           the item's range (a stream through memory each), else they take turns */
    bool suffix;        /* reductions: the reduced axes are the trailing ones (rows contiguous) */
    bool inline_reduce; /* holds a reduction computed where it is read (planner) */
    int32_t hoists;     /* reductions: the reductions it computes at the start of each row
                           (tb__plan_hoist) */
    tb_dtype acc;       /* reductions, norms: the accumulator dtype */
    int32_t vec;        /* f32 lanes per vector of a row loop or an elementwise block (0: scalar) */
    int32_t vec_axes;   /* the row's trailing axes the vectors run along */
    int32_t col_vec;    /* reductions over leading axes: outputs per work item, a vector (0: no) */
    int64_t row_len;    /* scalar elementwise: a work item per row of this many elements along
                           the last axis (0: per element), so the leading dims' index
                           arithmetic runs once per row */
    int32_t rm, rn;     /* matmul: outputs per work item (rows, columns); packed: rm x vector */
    int64_t crop_wp;    /* matmul read through a reshape that splits its columns into rows of
                           crop_wp and a slice of each: the output keeps columns [crop_at,
                           crop_at + crop_w) of each such row (tb__plan_mm_crop); 0: every column */
    int64_t crop_at, crop_w;
    int32_t mm_group;   /* packed matmul: the work items go over the output in groups of this many
                           column panels, each group row panel by row panel (0: row by row) */
    bool own_b;         /* packed matmul: each work item packs one column panel of B into a
                           private buffer and computes every row panel against it (no pack
                           kernel for B), */
    int64_t own_b_k;    /* own_b_k rows of the panel at a time (K or less: the accumulators of
                           every row panel kept in a private tile between them) */
    int32_t own_b_span; /* with fills of fewer rows than K, this many column panels an item
                           packs and runs in turn for each fill (1: one) */
    bool mm_prefetch_a; /* packed matmul of packed A: each item prefetches the next row panel
                           of A (the items after its own row panel's need it) */
    int32_t mm_prefetch_b; /* packed matmul reading B in place through a table of its rows'
                              offsets (tb_krow): each step of the depth prefetches B's row this
                              many steps ahead (0: none) */
    int32_t tk;            /* matmul in tiles: depth of a tile */
    bool prefetch_rows;    /* norms: the second pass prefetches the next row of x */
    bool stream_out;       /* norms: the last pass stores whole vectors with non-temporal stores
                              (a softmax that keeps its exponentials in out scales them in place,
                              unless chunk_rows pipelines it); elementwise kernels with vectors:
                              every store */
    int64_t chunk_rows;    /* a softmax with stream_out that keeps its exponentials: a work item
                              takes this many consecutive rows (the last item fewer), holds each
                              row's exponentials in a private buffer of two rows and streams the
                              previous row out while it computes the next (0: a row per item) */
    /* launch: `items` work items along dim 0 (group_size[0] == 0: the runtime picks the
       work-group), or fixed work-group sizes and counts */
    uint32_t work_dim;
    uint64_t items;
    size_t group_size[3];
    size_t groups[3];
    bool empty; /* no work item: not emitted, not launched */
    /* a pack kernel whose work items the C dialect's entry point visits panel by panel at each
       block of rows, not block by block along each panel (set by the renderer,
       tb__cg_kernel_pack, which in OpenCL exchanges the groups' dims 0 and 1 instead) */
    bool panels_first;
    double flops, bytes;
} tb__plan_kernel;

typedef struct tb__plan_slot {
    int32_t kind;
    int32_t index; /* parameter or result index */
    tb_shape shape;
    int32_t last_use; /* the last kernel reading or writing it */
} tb__plan_slot;

/* Where a run-time error flag came from (out-of-range gather index, negative integer power). */
typedef struct tb__errsite {
    tb_op op;
    int32_t node;
    int32_t dim;
    int64_t size;
} tb__errsite;

/* A planned graph: what a backend needs to run it besides its code; no node pointers. */
typedef struct tb__plan {
    uint64_t graph_hash;
    size_t num_params, num_results;
    int32_t *param_scalar; /* 1: passed by value (SCALAR); 0: a buffer */
    tb_dtype *param_dtype;
    int32_t *result_slot;   /* per result: the slot holding it */
    int32_t *result_source; /* per result: -1, or an earlier result it duplicates */
    int32_t *result_alias;  /* per result: -1, or the parameter whose buffer it is computed into
                               (tb_graph.result_donors: its kernel reads that parameter only at
                               the element it writes, and no later kernel reads it) */
    int32_t first_alias;    /* the first kernel writing into a parameter's buffer, or -1: a run
                               with error sites checks the flag before it (no kernel from there
                               on can fail) */
    tb__plan_slot *slots;
    size_t num_slots, cap_slots;
    tb__plan_kernel *kernels;
    size_t num_kernels, cap_kernels;
    tb__errsite *errsites;
    size_t num_errsites, cap_errsites;
    bool scalar_table; /* scalars in a table buffer (8 bytes each), a run of entries per kernel
                          (tb__plan_kernel.table_at) */
    size_t table_len;  /* the table's entries */
    size_t text_head;  /* the program's text before its first function (the renderer's) */
    /* per graph node (post-order): the kernel computing it, -1 for none (get_node_kernel) */
    int32_t *node_kernel;
    size_t num_nodes;
} tb__plan;

/* ---- the planner's view of a graph (alive while the graph is lowered) ---- */

typedef struct tb__pnode {
    const tb_node *node;
    int32_t first_operand; /* into tb__pgraph.operands */
    int32_t first_user;    /* into tb__pgraph.users */
    int32_t num_users;     /* distinct users */
    int32_t uses;          /* operand slots that name it */
    int32_t param, result, slot;
    int32_t ctx; /* the kernel evaluating it (its own kernel when it is a root) */
    bool root, ident, in_mm, force_root;
    bool hoist; /* a reduction its kernel (a reduction) computes at the start of each row */
    /* a view of a scalar read only by concats of many operands (tb__plan_cat_free): no budget */
    bool cat_free;
    int32_t depth;      /* pad/concat/gather above it in its kernel */
    int32_t keys_first; /* its positions in its kernel: keys[keys_first .. + keys_count] */
    int32_t keys_count;
} tb__pnode;

typedef struct tb__pgraph {
    const tb_graph *graph;
    const tb__target *target;
    size_t n;
    tb__pnode *info;
    int32_t *operands;
    int32_t *users;
    /* node pointer -> index */
    const tb_node **map_keys;
    int32_t *map_vals;
    size_t map_cap;
    tb__plan *plan;
    /* positions of the partition under way */
    uint64_t *keys;
    size_t num_keys, cap_keys;
    int64_t *kernel_values; /* per kernel: values it computes per output element */
    size_t cap_kernel_values;
} tb__pgraph;

/* A matmul core's sizes: batch (the product of the leading dims), M, N and K. */
typedef struct tb__plan_mm {
    int64_t batch, m, n, k;
} tb__plan_mm;

/* the tuning table of a device class (TB__CLASS_*) */
static void tb__tuning_of(int32_t device_class, tb__tuning *t);
/* a CPU table fitted to the CPU's vector shape (tuning.c) */
static void tb__tuning_fit(tb__tuning *t, const tb__host_shape *shape);
/* plans `graph` for `target`: *out the plan (tb__plan_free), G the graph view the renderer
   reads (tb__pgraph_free once the code is emitted) */
static tb_status tb__plan_build(const tb_graph *graph, const tb__target *target, tb__pgraph *G,
                                tb__plan **out);
static void tb__plan_free(tb__plan *p);
static void tb__pgraph_free(tb__pgraph *G);
/* how an operand's dims run along a node's row (its last row_axes axes) */
enum { TB__ROW_ALIGNED, TB__ROW_CONSTANT, TB__ROW_OTHER };
static int32_t tb__plan_row_relation(const tb_shape *ds, const tb_shape *os, int32_t row_axes);
/* the desc of a custom op (NULL for built-ins) */
static const tb_custom_op_desc *tb__plan_custom(tb_op op);
/* what the renderer asks of a planned graph */
static int32_t tb__plan_operand(const tb__pgraph *G, int32_t node, size_t k);
static const tb_shape *tb__plan_shape(const tb__pgraph *G, int32_t node);
static int64_t tb__plan_numel(const tb_shape *s);
static bool tb__plan_same_dims(const tb_shape *a, const tb_shape *b);
static bool tb__plan_is_elementwise(tb_op op);
/* a reduction computed where it is read (unrolled): its elements per output, else 0 */
static int64_t tb__plan_inline_reduce(const tb_node *n);
static tb__plan_mm tb__plan_mm_of(const tb__pgraph *G, int32_t core);
/* the lanes of an f32 register matmul's vectors for a block row of rn columns */
static int32_t tb__plan_mm_reg_lanes(const tb__tuning *t, int32_t rn);
/* batch (1: an A shared by every batch index), M, N, K, panel count and panel width of a
   packed matmul's operand */
static void tb__plan_pack_sizes(const tb__pgraph *G, int32_t core, bool is_a, int64_t sizes[6]);
/* the node whose buffer a packed matmul reads A from in place (no panels of A), or -1; the
   same of B */
static int32_t tb__plan_mm_a_buffer(const tb__pgraph *G, int32_t core);
static int32_t tb__plan_mm_b_buffer(const tb__pgraph *G, int32_t core);
/* a packed matmul's bytes of one value of its panels, and the lanes of one register of its
   block */
static double tb__plan_pack_bytes(const tb__pgraph *G, const tb__plan_kernel *k);
static int32_t tb__plan_mm_reg_width(const tb__pgraph *G, const tb__plan_kernel *k);
/* the error code a failing node writes (1 + its errsite), -1 for none */
static int32_t tb__plan_errsite_code(const tb__plan *p, int32_t node);
/* the steps of planning (planner.c) that planner_layout.c runs in order */
static tb_status tb__pgraph_init(tb__pgraph *G);
static int32_t tb__plan_index_of(const tb__pgraph *G, const tb_node *node);
static tb_status tb__plan_partition(tb__pgraph *G);
static tb_status tb__plan_pack_matmuls(tb__pgraph *G);
/* what the concats' step (planner_layout.c) asks of planner.c: whether a node can fail at run
   time, whether a concat takes kernels of its own, and room for kernels at a position */
static bool tb__plan_can_fail(const tb_node *n);
static bool tb__plan_cat_many(const tb_node *n);
static tb_status tb__plan_insert_kernels(tb__pgraph *G, size_t at, size_t count);
static tb_status tb__plan_assign_slots(tb__pgraph *G);
static tb_status tb__plan_args(tb__pgraph *G, int32_t *over);
static void tb__plan_reduce_sizes(const tb__pgraph *G, int32_t core, int64_t *n_out, int64_t *m);
static tb_dtype tb__plan_reduce_acc(const tb__pgraph *G, int32_t core);
/* the accumulators of the loop of a reduction hoisted into a reduction's kernel (tb__plan_hoist):
   TB__HOIST_LANES where it is long, else 1 */
#define TB__HOIST_LANES 4
static int32_t tb__plan_hoist_lanes(const tb_node *n);
static tb_dtype tb__plan_pack_dtype(tb_dtype dtype);

/* ---- index.c: index arithmetic and the text of a kernel ---- */

#define TB__LF_MAX     8
#define TB__IX_BUCKETS 4096

/* c + sum(coef[i] * var[i]), terms sorted by var, unused entries zero (so memcmp works). */
typedef struct tb__lf {
    int64_t c;
    int32_t n;
    int32_t var[TB__LF_MAX];
    int64_t coef[TB__LF_MAX];
} tb__lf;

/* Which element of an array of `dims` a kernel is at: its flat (row-major) offset, its index
   along each dim, or both. Interned, so equal positions share an id; the form a position was
   made with identifies it, the other is added when needed. */
typedef struct tb__pos {
    int32_t rank;
    int32_t has_flat, has_multi, key_flat;
    int64_t dims[TB_MAX_RANK];
    tb__lf flat;
    tb__lf dim[TB_MAX_RANK];
    uint64_t hash;
    int32_t next;
} tb__pos;

/* what the memo holds: a value v<n> of a node at a position (the renderer's), or the first of
   the variables an unravelled flat form was split into */
enum { TB__MEMO_VALUE = 1, TB__MEMO_UNRAVEL = 2, TB__MEMO_VECTOR = 3 };
#define TB__MEMO_HOIST (-2) /* the position of a hoisted reduction's value at the row */

typedef struct tb__ix_memo {
    uint64_t key;
    int32_t kind, a, b;
    uint64_t extra;
    int32_t value;
    int32_t next;
} tb__ix_memo;

typedef struct tb__ix_undo {
    int32_t pos;
    int32_t form; /* 1: flat was added, 2: multi was added */
} tb__ix_undo;

typedef struct tb__ix_scope {
    size_t memo, undo;
} tb__ix_scope;

/* An index variable: its range, and how its line computes it where that is index arithmetic
   (def TB__IX_FORM: the form `form`; TB__IX_DIGIT: (src / q) % d, d 0 for no remainder), so
   that its values can be worked out while the kernel is emitted (tb__ix_value). */
enum { TB__IX_ROOT = 0, TB__IX_FORM = 1, TB__IX_DIGIT = 2 };

typedef struct tb__ix_var {
    int64_t lo, hi;
    int32_t traced; /* derived from the traced variable (see tb__ix.period) */
    int32_t def, src;
    int64_t q, d;
    tb__lf form;
} tb__ix_var;

/* The state of one kernel's code while it is emitted: its text (one builder whose failure is
   sticky and checked once, after the kernel), the indentation, the index variables i<n>
   (`long`, with their ranges), the interned positions, the memo of what was computed in the
   enclosing blocks (values and unravelled positions; a block's entries are forgotten at its
   closing brace) and the first error. `period`: the smallest period of a division or
   remainder taken of a traced variable (0: none), which tells a pack kernel how long a run of
   consecutive lanes stays affine. */
typedef struct tb__ix {
    tb__str body;
    int indent;
    tb__ix_var *vars;
    size_t num_vars, cap_vars;
    tb__pos *pos;
    size_t num_pos, cap_pos;
    int32_t pos_head[TB__IX_BUCKETS];
    tb__ix_memo *memo;
    size_t num_memo, cap_memo;
    int32_t memo_head[TB__IX_BUCKETS];
    tb__ix_undo *undo;
    size_t num_undo, cap_undo;
    tb__ix_scope *scopes;
    size_t num_scopes, cap_scopes;
    int64_t period;
    tb_status status;
} tb__ix;

#define TB__LF_TEXT 640 /* bytes of a form as text */

static void tb__lf_const(tb__lf *lf, int64_t c);
static bool tb__lf_add_term(tb__lf *lf, int32_t var, int64_t coef);
static int64_t tb__lf_coef(const tb__lf *f, int32_t v);
static void tb__lf_text(const tb__lf *lf, char *buf, size_t cap);
static bool tb__ix_split_text(const tb__ix *g, const tb__lf *f, int32_t inner, int slot, char *buf,
                              size_t cap);
/* the least and greatest values of a form over its variables' ranges */
static void tb__ix_lf_range(const tb__ix *g, const tb__lf *lf, int64_t *lo, int64_t *hi);
static int64_t tb__ix_ceil_div(int64_t a, int64_t k); /* the least q, q * k >= a (k > 0) */
static tb_status tb__ix_fail(tb__ix *g, tb_status st);
static void tb__ix_line(tb__ix *g, const char *fmt, ...) TB_PRINTF_LIKE(2, 3);
static int32_t tb__ix_new_var(tb__ix *g, int64_t lo, int64_t hi);
/* Inside a test that form f lies in [lo, hi]: f's variable given the range that follows. */
static int32_t tb__ix_narrow_axis(tb__ix *ix, tb__lf *f, int64_t lo, int64_t hi);
/* The value variable `var` takes where variable `root` is `value`: false where it depends on
   another variable its lines do not compute from root (one declared before root, a loop's, a
   value read from memory). */
static bool tb__ix_value(const tb__ix *g, int32_t var, int32_t root, int64_t value, int64_t *out);
/* Form f as C text (a long expression) in the variables declared before `first` (those of the
   enclosing scopes): later ones are written out from their definitions (a digit of a variable,
   a form of variables), as their lines compute them, so that the same value derived again
   gives the same text. False where one is neither, or is `row` (a value that changes along a
   row), or the text could not be stored. */
static bool tb__ix_form_text(const tb__ix *ix, const tb__lf *f, int32_t first, int32_t row,
                             tb__str *out);
static bool tb__ix_lf_addmul(tb__ix *g, tb__lf *dst, const tb__lf *src, int64_t scale);
static int32_t tb__ix_memo_find(const tb__ix *g, int32_t kind, int32_t a, int32_t b,
                                uint64_t extra);
static void tb__ix_memo_add(tb__ix *g, int32_t kind, int32_t a, int32_t b, uint64_t extra,
                            int32_t value);
static void tb__ix_open(tb__ix *g, const char *head);
static void tb__ix_close(tb__ix *g, const char *tail);
static void tb__ix_drop(tb__ix *g, size_t mark);
static bool tb__ix_need_flat(tb__ix *g, int32_t id);
static bool tb__ix_need_multi(tb__ix *g, int32_t id);
/* the row-major strides of `dims` (a dim of 0 counts as 1) */
static void tb__ix_contig(int32_t rank, const int64_t *dims, int64_t *strides);
static int32_t tb__ix_pos_multi(tb__ix *g, const tb_shape *shape, const tb__lf *dims);
static int32_t tb__ix_pos_flat(tb__ix *g, const tb_shape *shape, const tb__lf *flat);
/* The per-dim forms over `to` of a position over `from` given per dim (a reshape), when the
   dims of the two shapes group into runs of equal size where one side has a single axis of
   size > 1: that axis is unravelled or the run's axes combined, group by group. False (nothing
   written) when the shapes do not group so. */
static bool tb__ix_regroup(tb__ix *g, const tb__lf *dims, const tb_shape *from, const tb_shape *to,
                           tb__lf *out);
static int32_t tb__ix_var_pos_flat(tb__ix *g, const tb_shape *shape, int32_t var, int64_t scale,
                                   int32_t var2);
static void tb__ix_reset(tb__ix *g);
static void tb__ix_free(tb__ix *g);

/* ---- codegen.c, codegen_kernels.c, codegen_program.c: the C-family code generator ---- */

/* tb__cg_param.role of a table of the kernel's arguments from this parameter's position on
   (`void *const *`; targets with arg_table): the last parameter, in place of those arguments */
#define TB__CG_ARGS (-2)

/* One parameter of a kernel's entry point, as the renderer describes it to the dialect. */
typedef struct tb__cg_param {
    int32_t role;     /* TB__ARG_*, -1 for the output or TB__CG_ARGS */
    const char *type; /* the element type (buffers, tables) or the value type (scalars) */
    char name[16];    /* out, b<slot>, s<param>, tb_sc, tb_err, tb_in */
} tb__cg_param;

#define TB__DIALECT_HEADS 5

/* What differs between the C-family languages the generator writes. */
typedef struct tb__dialect {
    const char *name;
    /* the text before the shared prelude (pragmas, includes, typedefs, helpers), in parts
       (each literal within the length C99 compilers must take), NULL after the last */
    const char *head[TB__DIALECT_HEADS];
    /* f32 lanes of the row vectors (4, 8 or 16): the program starts with "#define TB_VW n",
       and the plan's vector loops must use as many (tuning vec_width) */
    int32_t vec_width;
    /* address space of buffers ("__global " or ""), of work-group memory ("__local "; NULL:
       none, and no plan for this dialect may use work-groups of more than one item) */
    const char *global;
    const char *local;
    const char *barrier; /* a work-group barrier statement */
    /* work-item ids as printf formats of the dimension */
    const char *global_id;
    const char *group_id;
    const char *local_id;
    /* vectors: floatN, intN, uintN (N = 4, 8, 16) and doubleN (2, 4, 8) with vloadN and
       vstoreN, scalar * vector widening the scalar; the row vectors of TB_VW lanes as tb_vf,
       tb_vi and tb_vu with TB_VLD and TB_VST (TB_VW: vec_width, defined before the head); a
       vector of zeros as a format of the vector type */
    const char *vec_zero;
    /* a vector made of listed floats, a printf format of its type (float4, float8, float16)
       and the list (NULL: the register matmul keeps scalar accumulators). OpenCL C has it too:
       PoCL's vectors across a work-group's items read B's row as strided gathers, where a
       vector of the row is one load per step (GPT's batched attention matmuls of 64x32x64 on
       PoCL, 0.40 -> 0.29 ms each) */
    const char *vec_make;
    const char *min_long; /* min of two longs */
    const char *bits_f32; /* the float of 32 bits (uint) */
    const char *bits_f64; /* the double of 64 bits (ulong) */
    /* an expression true for the one work item that changes tb_err[0] from 0 to `code`
       atomically (both uint) */
    const char *err_claim;
    /* the storage of a constant table in a kernel's outermost scope ("__constant ",
       "static const ") */
    const char *constant;
    /* integer abs as a built-in function of the dialect that returns the unsigned type
       (OpenCL's abs), or NULL: a select */
    const char *iabs;
    /* two vectors of N f32 lanes shuffled into one, a printf format of the two vectors, N and
       the list of lanes (0 to 2N - 1), or NULL: none (a pack then copies its lanes one by one
       where it would transpose blocks of them in registers) */
    const char *shuffle;
    bool f64; /* the target has double precision */
    /* the compiler vectorises a work item's own loops (C99 on gcc and clang; OpenCL's CPU
       compilers vectorise across work items instead): a row loop's pads clamp and select,
       and the loop splits at their edges (tb__cg_pad) */
    bool item_loops;
    /* a math function's name for a dtype (exp, log, sin, cos, tanh, sqrt, erf, pow, fabs,
       floor, ceil, rint) */
    const char *(*math)(const char *fn, tb_dtype dtype);
    /* the attribute that keeps a function out of its callers ("__attribute__((noinline))"),
       or NULL: a kernel's code stays in one function (tb__cg.helpers) */
    const char *noinline;
    /* writes one kernel: its entry point around `body`, after `helpers` (tb__cg.helpers: ""
       for none) */
    void (*kernel)(tb__str *src, const tb__plan_kernel *k, const tb__cg_param *params,
                   size_t num_params, const char *helpers, const char *body);
} tb__dialect;

/* Tokens of a kernel's text that the renderer and the dialect replace: the kernel's name (a
   kernel is rendered under it, then emitted under its own or shares an earlier one's code),
   and in a helper function (tb__cg.helpers) the kernel's parameter declarations after the
   work-item ids, and in a call of one the kernel's parameters' names, each after a comma. */
#define TB__CG_FN_TOKEN     "tb_kfn_"
#define TB__CG_PARAMS_TOKEN "tb_kparams_"
#define TB__CG_ARGS_TOKEN   "tb_kargs_"

/* codegen_program.c: renders every kernel of the plan through the dialect as one program
   (caller frees) */
static tb_status tb__cg_render(const tb__pgraph *G, tb__plan *P, const tb__dialect *d, char **out,
                               size_t *len);
/* The error flag of a run (the tb_err argument of the kernels that can fail): TB__ERR_WORDS
   32-bit words, zero before the run. A failing work item claims word 0 atomically (from 0 to
   1 + its errsite), and only the item that claimed it writes the report's two values (words
   1-2 and 3-4, the low word first): a report is one item's, whatever number fail at once. */
#define TB__ERR_WORDS 8
/* the error a run reports from its error flag (word 0 not 0) */
/* the distinct functions of a rendered plan (kernels sharing code count once) */
static size_t tb__plan_functions(const tb__plan *p);
/* whether kernel i is the first of the plan to run its function */
static bool tb__plan_first_of_function(const tb__plan *p, size_t i);
static tb_status tb__cg_run_error(const tb__plan *p, const char *who,
                                  const uint32_t flag[TB__ERR_WORDS]);

/* ---- codegen.c: the values and expressions the kernels of codegen_kernels.c are made of ---- */

typedef struct tb__cg_frame {
    int32_t node, pos, state, vbase;
} tb__cg_frame;

/* The renderer's state for one graph. */
#define TB__CG_ROW_STEP  4 /* a row loop's group of elements of one period, at most */
#define TB__CG_ROW_FORMS 8 /* a run's pad tests on its row, at most (more: not split) */
#define TB__CG_ROW_CASES 4 /* a row loop's cases by a concat's operands, at most */
/* the index variables of its caller that a helper function may read */
#define TB__CG_HELPER_VARS 64

/* A helper function being emitted (tb__cg_helper_begin): the caller's text and indent, and
   its first index variable of its own. */
typedef struct tb__cg_helper {
    tb__str body;
    int indent;
    int32_t first;
} tb__cg_helper;

typedef struct tb__cg {
    tb__ix ix; /* the text, index variables and positions of the kernel being emitted */
    /* functions of the kernel being emitted that its body calls (where the dialect has
       noinline), each taking the work-item ids and the kernel's parameters first
       (TB__CG_PARAMS_TOKEN, TB__CG_ARGS_TOKEN) */
    tb__str helpers;
    int32_t num_helpers;
    const tb__pgraph *G;
    tb__plan *P;
    const tb__dialect *d;
    int32_t kernel;
    /* values v<n> with their dtypes */
    tb_dtype *val_dtype;
    size_t num_vals, cap_vals;
    /* the evaluation stack */
    tb__cg_frame *frames;
    size_t num_frames, cap_frames;
    int32_t *stack;
    size_t num_stack, cap_stack;
    int depth; /* pad, concat and gather being evaluated */
    /* the last rounding emitted: v<rounded> is v<unrounded> rounded to rounded_dtype (a 16-bit
       float), -1 if none; a store of v<rounded> stores v<unrounded> (the store rounds too) */
    int32_t rounded, unrounded;
    tb_dtype rounded_dtype;
    /* where set, the next read of a buffer also leaves its slot and flat index here (a matmul
       reading B in place takes the address of a row from it) */
    char *capture;
    int32_t capture_slot;
    tb__lf capture_flat;
    /* an elementwise kernel's loop over a row where the dialect has item_loops: its variable
       (-1: none), and what its pads saw: the interior [row_lo, row_hi) where every pad's test
       on it holds (row_mixed: one the loop cannot be split by). Pads clamp their other axes
       and select. */
    int32_t row_var;
    /* the variable of the innermost loop being emitted where a loop of the kernel's own runs
       along it (a pack's lanes or rows), else -1: a buffer read whose index is that
       variable's term plus terms that do not change along the loop is written as the
       address of the invariant part indexed by the variable's (tb__cg_read_slot) */
    int32_t inner_var;
    bool row_mixed;
    int64_t row_lo, row_hi;
    /* a pack's run of rows (tb__cg_pack_lanes): with row_rt the pads' tests on row_var (forms
       row + terms of the run's other variables) are kept in row_forms for the run's interior,
       computed at run time; row_inside >= 0: the variable of that interior, where a pad skips
       such a test (row_skipped counts them) */
    bool row_rt;
    int32_t row_inside, num_row_forms, row_skipped;
    tb__lf row_forms[TB__CG_ROW_FORMS];
    int64_t row_before[TB__CG_ROW_FORMS], row_end[TB__CG_ROW_FORMS];
    /* an elementwise kernel's rows (tb__cg_row_loops): the row's index i<row_item> (-1: none)
       and a concat whose test is on that index alone (case_text, as tb__ix_form_text writes
       it), which splits the row's loop into cases, one per operand: case c covers the test's
       values [case_at[c], case_at[c + 1]). row_case: the case being emitted, -1 while the
       first loop looks for such a concat (num_cases of them: 0 none found), -2 neither. */
    int32_t row_item, row_case, num_cases;
    int64_t case_at[TB__CG_ROW_CASES + 1];
    char case_text[TB__LF_TEXT];
} tb__cg;

/* the C type of a dtype; of an accumulator dtype chosen by the planner (integers wrap:
   unsigned); of a scalar argument in the kernel (doubles travel as floats where the device has
   no double precision) */
static const char *tb__cg_ctype(tb_dtype dtype);
static const char *tb__cg_acc_ctype(tb_dtype acc);
static const char *tb__cg_scalar_ctype(const tb__cg *g, tb_dtype dtype);
/* 16-bit floats (f16, bf16): values compute in float, buffers hold the bits (ushort); a store
   of v<v> at buf[index] rounding to the dtype; a computed value rounded to the dtype (v itself
   for other dtypes, -1 if failed) */
static bool tb__cg_is_half(tb_dtype dtype);
static const char *tb__cg_btype(tb_dtype dtype);
static void tb__cg_store(tb__cg *g, tb_dtype dtype, const char *buf, const char *index, int32_t v);
static int32_t tb__cg_round(tb__cg *g, tb_dtype dtype, int32_t v);
/* the rounding of v (`vector`: W lanes) to a 16-bit float dtype; the value a store of v as
   `dtype` stores (before v's rounding where v was just rounded) */
static int32_t tb__cg_round_as(tb__cg *g, tb_dtype dtype, int32_t v, bool vector);
static int32_t tb__cg_unrounded(const tb__cg *g, tb_dtype dtype, int32_t v);
/* the same for vectors of W lanes: the store of vector v<v> at `ptr` (f32: past the caches
   when `stream`), a rounding */
static void tb__cg_vstore(tb__cg *g, tb_dtype dtype, int32_t v, const char *ptr, bool stream);
static int32_t tb__cg_vround(tb__cg *g, tb_dtype dtype, int32_t v);
/* the line "const <tv> bv<j> = <the dialect's vector of w lanes>;": lane l < live the text of
   `lane` (a printf format of one int) with ids[l], the others `zero` */
static void tb__cg_vector_of_lanes(tb__cg *g, const char *tv, int32_t j, int32_t w, int32_t live,
                                   const char *lane, const int32_t *ids, const char *zero);
static const tb__plan *tb__cg_plan(const tb__cg *g);      /* the plan being rendered */
static tb__plan_kernel *tb__cg_kernel(const tb__cg *g);   /* the kernel being rendered */
static int32_t tb__cg_new_val(tb__cg *g, tb_dtype dtype); /* a new value v<n>, -1 if failed */
static int32_t tb__cg_new_vec(tb__cg *g); /* a vector value of W f32 lanes (v<n> too) */
/* a math function of the dialect for a dtype */
static const char *tb__cg_math(const tb__cg *g, const char *fn, tb_dtype dtype);
/* a floating literal of the dtype (a float literal carries the f suffix) */
static void tb__cg_flit(tb_dtype dtype, double v, char *buf, size_t cap);
/* checks that the plan gave this kernel the argument (the planner decides them all) */
static bool tb__cg_arg(tb__cg *g, int32_t kind, int32_t index);
/* the id of work item dimension d, as the dialect names it */
static void tb__cg_id(char *buf, size_t cap, const char *fmt, int d);
/* whether c can be a C identifier's character (first: its first); `text` with `repl` in place
   of each `token` in it, appended to src (codegen_program.c) */
static bool tb__cg_ident_char(char c, bool first);
static void tb__cg_emit_replacing(tb__str *src, const char *text, const char *token,
                                  const char *repl);
/* a helper function of the kernel (where the dialect has noinline): its body is what is emitted
   between begin and end, which puts a call of it in the caller's body (`params`: the helper's
   parameters after the kernel's, `args` their values, each after a comma; `ok`: the body was
   emitted whole) */
static void tb__cg_helper_begin(tb__cg *g, tb__cg_helper *h);
static bool tb__cg_helper_end(tb__cg *g, tb__cg_helper *h, bool ok, const char *params,
                              const char *args);
/* whether an op's result needs no rounding to its 16-bit dtype; the position of operand k of
   an elementwise or movement node at `pos`; an ops_table.h template expanded into buf */
static bool tb__cg_exact(const tb_node *n);
static int32_t tb__cg_operand_pos(tb__cg *g, int32_t node, int32_t pos, size_t k);
static bool tb__cg_template(const tb__cg *g, const char *tpl, tb_dtype dtype, const char *a,
                            char *e, size_t cap);
/* the value of `node` at `pos` (each (node, position) emitted once per scope) */
static int32_t tb__cg_eval(tb__cg *g, int32_t node, int32_t pos);
/* the W consecutive elements of `node` from position `pos` on, as a vector */
static int32_t tb__cg_veval(tb__cg *g, int32_t node, int32_t pos);
/* whether the current kernel reads node from a buffer (b<slot>) at its own flat index */
static bool tb__cg_reads_buffer(const tb__cg *g, int32_t node);
/* a constant table of the kernel (in the dialect's storage for them) named `name`: `count`
   entries `vals` of type `type` */
static void tb__cg_const_table(tb__cg *g, const char *type, const char *name, const int64_t *vals,
                               int32_t count);
/* work-group memory of `count` elements of `type` named `name` */
static void tb__cg_local(tb__cg *g, const char *type, const char *name, int64_t count);

/* ---- codegen_hoist.c, for the reduction kernels of codegen_kernels.c ---- */

/* the position of x (dims xs), reduced over `mask` into an output at position out_pos, at
   reduction index `red` (the reduced axes' forms, in order) */
static int32_t tb__cg_split_pos(tb__cg *g, const tb_shape *xs, uint64_t mask, bool keepdim,
                                int32_t out_pos, const tb__lf *red);
/* the reductions hoisted into the current kernel (a reduction over `mask` whose row's output
   is at out_pos), each computed at the row: what their reads in the row then find */
static bool tb__cg_hoist_row(tb__cg *g, uint64_t mask, bool keepdim, int32_t out_pos);

/* ---- codegen_pack.c, for the matmul kernels of codegen_matmul.c and codegen_tiles.c ---- */

/* the batch index variable of a matmul kernel's output (i<var>) as per-dim forms of its batch
   dims, in bdims (false: failed) */
static bool tb__cg_batch_dims(tb__cg *g, const tb_shape *cs, int32_t var, tb__lf *bdims);
/* the rows pk0..pk1 of one panel of a pack (the kind of k's, or B's for a matmul that packs B
   itself), its first lane pl0 (C variables declared before), into `dst` at panel `panel` (C
   text), row `origin` (C text, or NULL: 0) at the panel's first row */
static bool tb__cg_pack_panel(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                              const char *dst, const char *panel, const char *origin);

/* ---- codegen_matmul.c, for the work-group tile matmul of codegen_tiles.c ---- */
/* the value of a matmul operand (side 0: A, 1: B) at (row var, column var) of its matrix */
static int32_t tb__cg_matmul_operand(tb__cg *g, const tb__plan_kernel *k, int side,
                                     const tb__lf *bdims, int32_t row, int32_t col);
/* the stores of a block of outputs acc[ii][jj] at rows and columns `rows`, `cols` (C text of ii
   and jj), span_r x span_c of them, through the epilogue */
static bool tb__cg_matmul_stores(tb__cg *g, const tb__plan_kernel *k, const tb__lf *bdims,
                                 const char *rows, const char *cols, int32_t span_r,
                                 int32_t span_c);
/* the packed and the register matmul kernels */
static tb_status tb__cg_kernel_matmul_packed(tb__cg *g, const tb__plan_kernel *k);
static tb_status tb__cg_kernel_matmul_registers(tb__cg *g, const tb__plan_kernel *k);

/* ---- codegen_pack.c, codegen_matmul.c, codegen_tiles.c, codegen_kernels.c: the kernels, for
   the program of codegen_program.c ---- */

/* a matmul kernel (packed, registers or tiles, as the plan chose), and a pack kernel */
static tb_status tb__cg_kernel_matmul(tb__cg *g, const tb__plan_kernel *k);
static tb_status tb__cg_kernel_pack(tb__cg *g, const tb__plan_kernel *k);
/* an elementwise kernel, a run of a concat's operands, a reduction (either stage of a split
   one), and a softmax, log_softmax or layer norm */
static tb_status tb__cg_kernel_elementwise(tb__cg *g, const tb__plan_kernel *k);
static tb_status tb__cg_kernel_concat(tb__cg *g, const tb__plan_kernel *k);
static tb_status tb__cg_kernel_reduce(tb__cg *g, const tb__plan_kernel *k);
static tb_status tb__cg_kernel_norm(tb__cg *g, const tb__plan_kernel *k);

/* ---- dialect_c99.c, dialect_opencl.c: the dialects ---- */

/* A kernel's work-item space, its global size per dimension: groups of group_size work items
   in 3 dimensions (group_size[0] > 0), else `items` in one */
static void tb__work_items(const size_t group_size[3], const size_t groups[3], uint64_t items,
                           uint64_t size[3]);
/* C99 (GNU vectors) for row vectors of `vec_width` f32 lanes */
static void tb__dialect_c99(tb__dialect *d, int32_t vec_width);
/* the work-item space of a kernel: its global size per dimension (the entry of a C99 kernel
   runs a range of its flattened items) */
static void tb__c99_global_size(const tb__plan_kernel *k, uint64_t size[3]);
/* OpenCL C 1.2, with double precision or without */
static void tb__dialect_opencl(tb__dialect *d, bool f64);

#endif /* TB__HAVE_COMPILED_BACKENDS */
