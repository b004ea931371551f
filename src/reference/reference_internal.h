/* ===========================================================================================
   The internal contract of the reference interpreter's parts (reference_elementwise.c, then
   reference.c): values as views over refcounted buffers, the buffer pool of a graph run, the
   strided N-d iterator, and the functions the first part gives the second, each defined in the
   part named above it.
   =========================================================================================== */
#include "../impl_begin.h"

/* operands of one iterator: an output and up to three inputs */
#define TB__REF_MAX_OPS 4

/* Large buffers freed during a graph run are kept in a small pool and reused by the next
   allocations: a fresh multi-megabyte malloc is an mmap whose page faults cost more than the
   elementwise work itself. The pool is the running graph's (thread-local; nested runs, e.g. from
   a custom op, save and restore it). */
#define TB__REF_POOL_SLOTS 8
#define TB__REF_POOL_MIN   (64u * 1024u) /* smaller blocks are cheap to malloc */

typedef struct tb__ref_pool {
    char *data[TB__REF_POOL_SLOTS];
    size_t cap[TB__REF_POOL_SLOTS];
    uint32_t count;
} tb__ref_pool;

static TB__THREAD_LOCAL tb__ref_pool *tb__ref_current_pool = NULL;

typedef struct tb__rbuf {
    int32_t refs;
    bool owned; /* false: a caller's array (parameters), never freed or written */
    char *data;
    size_t cap; /* bytes allocated (owned buffers) */
} tb__rbuf;

typedef struct tb__rview {
    tb__rbuf *buf;                /* NULL: no value */
    int64_t offset;               /* elements */
    int64_t strides[TB_MAX_RANK]; /* elements; 0 for broadcast axes, negative for flipped ones */
    tb_shape shape;
} tb__rview;

/* The strided N-d iterator (reference_elementwise.c). A run function gets n elements along
   the innermost axis: each operand's first element (ptrs) and its stride along the run, in
   elements. */
typedef tb_status (*tb__run_fn)(void *ctx, int64_t n, char *const *ptrs, const int64_t *strides);

typedef struct tb__iter {
    int32_t nops;
    int32_t rank;
    int64_t dims[TB_MAX_RANK];
    int64_t strides[TB__REF_MAX_OPS][TB_MAX_RANK];
    int64_t offset[TB__REF_MAX_OPS];
    char *base[TB__REF_MAX_OPS];
    int64_t esize[TB__REF_MAX_OPS];
} tb__iter;

/* ---- reference_elementwise.c: buffers and views ---- */

/* frees the blocks a pool holds */
static void tb__ref_pool_drain(tb__ref_pool *pool);
static int64_t tb__ref_esize(tb_dtype dtype); /* bytes per element */
/* element count of a validated shape (fits in int64: the size rule of shapes) */
static int64_t tb__ref_numel(const tb_shape *s);
/* row-major strides (a 0 dim counts as 1) */
static void tb__ref_contig_strides(const tb_shape *s, int64_t *strides);
/* a new contiguous view of `shape` over a fresh buffer */
static tb_status tb__rview_alloc(tb__rview *v, const tb_shape *shape);
/* a contiguous view over a caller's array (not copied) */
static tb_status tb__rview_borrow(tb__rview *v, const tb_shape *shape, const void *data);
static void tb__rview_share(tb__rview *dst, const tb__rview *src); /* one more reference */
static void tb__rview_clear(tb__rview *v);      /* drops the view's reference: no value */
static char *tb__rview_ptr(const tb__rview *v); /* the view's first element */

/* ---- reference_elementwise.c: scalar conversions (no UB on NaN or out-of-range values) ---- */

/* truncation toward zero, saturating at the int64 range; NaN gives 0 */
static int64_t tb__ref_f2i(double v);
/* the element of dtype `dt` at `p` as a double or an int64; stores a value into one */
static double tb__ld_f(tb_dtype dt, const char *p);
static int64_t tb__ld_i(tb_dtype dt, const char *p);
static void tb__st_f(tb_dtype dt, char *p, double v);
static void tb__st_i(tb_dtype dt, char *p, int64_t v);
/* one element of dtype `sd` at `a` converted to `dd` at `o` (CAST's rules) */
static void tb__ref_convert(tb_dtype dd, char *o, tb_dtype sd, const char *a);
static double tb__ref_maxf(double a, double b); /* NaN wins */

/* ---- reference_elementwise.c: the iterator, copies, elementwise ops ---- */

static void tb__iter_begin(tb__iter *it, int32_t rank, const int64_t *dims);
/* adds an operand: its base pointer, offset and strides in elements over the iterator's dims */
static void tb__iter_add(tb__iter *it, char *base, int64_t offset, const int64_t *strides,
                         int64_t esize);
/* calls `fn` on every run of the iteration space */
static tb_status tb__iter_run(tb__iter *it, tb__run_fn fn, void *ctx);
/* a malformed node: a bug in the layer that built the graph, not the user's doing */
static tb_status tb__ref_malformed(const tb_node *node, const tb_shape *operand);
/* dst[...] = src[...] (same dims; src may broadcast), converting the dtype if they differ */
static tb_status tb__ref_copy(const tb__rview *dst, const tb__rview *src);
/* a contiguous view with the same value: the view itself (shared) when it already is one */
static tb_status tb__rview_contig(const tb__rview *src, tb__rview *out);
/* copies a view into a caller's contiguous array of its shape */
static tb_status tb__rview_to_host(const tb__rview *v, void *host);
/* a unary, binary or ternary op's node computed from its operands' values into *out */
static tb_status tb__ref_elementwise(const tb_node *node, const tb__rview *in, tb__rview *out);
