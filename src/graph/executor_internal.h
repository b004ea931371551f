/* ===========================================================================================
   The internal contract between the executor (executor.c) and the lazy tensors (tensor.c):
   the walk of a pending graph, the computation cache's entries and what one sync works with.
   =========================================================================================== */
#include "../impl_begin.h"

/* node pointer -> int64, open addressing */
typedef struct tb__exec_map {
    const tb_node **keys;
    int64_t *values;
    size_t cap; /* a power of two, or 0 */
    size_t count;
} tb__exec_map;

typedef struct tb__exec_frame {
    const tb_node *node;
    uint32_t next; /* the next operand to visit */
    bool param;
} tb__exec_frame;

typedef struct tb__exec_walk {
    tb__exec_map pos; /* node -> post-order position; -1 while the node is on the stack */
    const tb_node **order;
    size_t num_order, cap_order;
    const tb_node **params;
    size_t num_params, cap_params;
    tb__exec_frame *stack;
    size_t cap_stack;
    uint64_t hash;
    uint64_t *canon; /* the canonical form (tb__exec_walk_node_canon, tb__exec_graph_make) */
    size_t num_canon, cap_canon;
    size_t canon_nodes; /* the words of the nodes, before those of the results */
    /* non-NULL: nodes this backend does not support are parameters too (graphs that are only
       compiled, for the backend text: the eager fallback would make them device data) */
    const tb_backend_impl *cut;
} tb__exec_walk;

/* A hit on the hash is confirmed by the graph's canonical form, so that two graphs whose hashes
   collide never share a computation. */
typedef struct tb__comp_cache_entry {
    uint64_t key;
    uint64_t graph_hash;
    const uint64_t *canon; /* the graph's canonical form (in the same allocation) */
    size_t num_canon;
    tb_device device;
    const tb_backend *backend;
    void *computation;
    int32_t refcount; /* the cache's reference and the users'; guarded by the cache mutex */
    struct tb__comp_cache_entry *lru_prev; /* most recently used first */
    struct tb__comp_cache_entry *lru_next;
    struct tb__comp_cache_entry *bucket_next;
} tb__comp_cache_entry;

/* What one sync works with. */
typedef struct tb__exec {
    const char *func; /* the public function, for messages */
    tb_device device;
    const tb_backend *backend;
    const tb_backend_impl *vt;
} tb__exec;

static void tb__comp_cache_release(tb__comp_cache_entry *e);
static void tb__comp_cache_shutdown(void);
static void tb__exec_stage_shutdown(void); /* frees the fallback's kept staging array */
/* the kept host staging array: taken (at least `need` bytes, *cap its size; NULL when memory ran
   out) and given back (kept when it is the largest) */
static void *tb__exec_stage_take(size_t need, size_t *cap);
static void tb__exec_stage_give(void *p, size_t cap);
static void tb__exec_call_begin(tb__saved_error *saved);
static tb_status tb__exec_call_failed(const tb__exec *ex, tb_status st, const char *entry);
static tb_status tb__exec_compile(const tb__exec *ex, const tb_graph *graph, const tb__exec_walk *w,
                                  tb__comp_cache_entry **out, bool *hit, uint64_t *compile_ns);
static void tb__exec_device_text(const tb_device *device, char buf[64]);
static void tb__exec_dot_append(tb__str *s, const tb__exec_walk *w, tb_node *const *nodes, size_t n,
                                const int32_t *kernel, const char *const *kernel_names);
static tb_status tb__exec_graph_make(const tb__exec *ex, tb__exec_walk *w, tb_node *const *roots,
                                     size_t n, const int32_t *root_donors, const tb_node ***results,
                                     tb_graph *g);
static void *tb__exec_host_alloc(const tb_shape *shape, size_t *nbytes);
static double tb__exec_host_to_double(const void *in, tb_dtype dtype);
static tb_status tb__exec_init(tb__exec *ex, const char *func, const tb_device *device);
static bool tb__exec_is_param(const tb_node *n);
static void tb__exec_log_dump_compile(const tb__exec *ex, const tb_graph *g, uint64_t compile_ns);
static void tb__exec_map_free(tb__exec_map *m);
static int64_t *tb__exec_map_get(const tb__exec_map *m, const tb_node *key);
static tb_status tb__exec_map_put(tb__exec_map *m, const tb_node *key, int64_t value);
static tb_status tb__exec_walk_values(tb__exec_walk *w, const char *func, tb_node *const *roots,
                                      size_t n, const tb_backend_impl *cut, tb_node ***nodes);
static tb_status tb__exec_materialize(const tb__exec *ex, tb_node *const *roots, size_t n,
                                      tb_backend_data *const *donors, tb_backend_data **out);
static void tb__exec_text_append(tb__str *s, const tb__exec_walk *w, tb_node *const *nodes,
                                 size_t n);
/* tensor.c: the distinct pending nodes of `tensors` (those with a node), checked to share one
   device (collect with `ir` false and `one_device` true, as a sync does; free with
   tb__exec_roots_free) */
typedef struct tb__exec_roots {
    tb_node **nodes;
    size_t count;
    tb__exec_map index; /* node -> index in nodes */
    tb_device device;
} tb__exec_roots;
static tb_status tb__exec_roots_collect(tb__exec_roots *r, const char *func,
                                        tb_tensor *const *tensors, size_t count, bool ir,
                                        bool one_device);
static void tb__exec_roots_free(tb__exec_roots *r);
/* TB_ERR_INVALID_ARGUMENT for a NULL list of count > 0 or a NULL tensor in it ("func: what[i]
   is NULL"; a NULL tensor keeps an earlier error) */
static tb_status tb__exec_check_list(const char *func, const char *what, tb_tensor *const *tensors,
                                     size_t count);
static tb_status tb__exec_walk_add(tb__exec_walk *w, const char *func, tb_node *const *roots,
                                   size_t n);
static void tb__exec_walk_free(tb__exec_walk *w);
static int64_t tb__exec_walk_position(const tb__exec_walk *w, const tb_node *node);
/* the computation cache (executor.c), used by the runs (executor_run.c) */
static uint64_t tb__comp_cache_key(uint64_t graph_hash, const tb_device *device);
/* the cached computation of the graph whose walk is `w` (a new reference), or NULL */
static tb__comp_cache_entry *tb__comp_cache_lookup(uint64_t graph_hash, const tb__exec_walk *w,
                                                   const tb_device *device,
                                                   const tb_backend *backend);
/* puts a new entry (refcount 1, the caller's) in the cache; the entry to use: `e`, or an
   equal one another thread put first (then `e` is destroyed) */
static tb__comp_cache_entry *tb__comp_cache_insert(tb__comp_cache_entry *e);
static void tb__comp_cache_clear(void);
/* whether the backend lowers node n itself (else the eager fallback runs it) */
static bool tb__exec_supported(const tb_backend_impl *vt, const tb_node *n);
static bool tb__exec_walk_is_param(const tb__exec_walk *w, const tb_node *node);
