/* ===========================================================================================
   Implementation
   =========================================================================================== */
#if defined(TB_IMPLEMENTATION) && !defined(TB_IMPLEMENTATION_DONE)
#define TB_IMPLEMENTATION_DONE

#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) &&                      \
    !defined(_DEFAULT_SOURCE)
/* dlopen, pthread, clock_gettime, strdup-free POSIX calls under -std=c99 */
#define _POSIX_C_SOURCE 200809L
#endif

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <limits.h>
#include <errno.h>
#include <time.h>
#ifndef TB_ASSERT
#include <assert.h>
#define TB_ASSERT(x) assert(x)
#endif

#if defined(_WIN32)
#include <windows.h>
#else
#include <pthread.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <fcntl.h>
#if !defined(TB_NO_PLUGINS) || !defined(TB_NO_OPENCL) || !defined(TB_NO_NATIVE)
#include <dlfcn.h>
#endif
#endif

/* The backends that compile generated programs at run time (they share the planner, the code
   generator and the disk cache): OpenCL, and native where the system has dlopen and fork. */
#if !defined(TB_NO_NATIVE) && !defined(_WIN32)
#define TB__HAVE_NATIVE 1
#endif
#if !defined(TB_NO_OPENCL) || defined(TB__HAVE_NATIVE)
#define TB__HAVE_COMPILED_BACKENDS 1
#endif

/* ---- platform helpers (internal) ---- */

#if defined(__cplusplus) && __cplusplus >= 201103L
#define TB__THREAD_LOCAL thread_local
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__STDC_NO_THREADS__)
#define TB__THREAD_LOCAL _Thread_local
#elif defined(_MSC_VER)
#define TB__THREAD_LOCAL __declspec(thread)
#else
#define TB__THREAD_LOCAL __thread
#endif

#if defined(__GNUC__) || defined(__clang__)
#define TB__UNUSED __attribute__((unused))
#else
#define TB__UNUSED
#endif

/* Atomic add on an int32 refcount; returns the new value. */
#if defined(_MSC_VER) && !defined(__clang__)
#define TB__ATOMIC_ADD(ptr, v) (InterlockedExchangeAdd((volatile LONG *)(ptr), (v)) + (v))
#define TB__ATOMIC_LOAD(ptr)   (*(volatile int32_t *)(ptr))
#else
#define TB__ATOMIC_ADD(ptr, v) __atomic_add_fetch((ptr), (v), __ATOMIC_ACQ_REL)
#define TB__ATOMIC_LOAD(ptr)   __atomic_load_n((ptr), __ATOMIC_ACQUIRE)
#endif

/* A recursive mutex, statically initialisable. POSIX only offers a static recursive initialiser
   under _GNU_SOURCE (not in -std=c99/c11 builds), so recursion is counted by hand: `owner` is
   the address of a thread-local marker of the thread holding it. */
#if defined(_WIN32)
typedef struct tb__mutex {
    INIT_ONCE once;
    CRITICAL_SECTION cs;
} tb__mutex;
#define TB__MUTEX_INIT                                                                             \
    { INIT_ONCE_STATIC_INIT }
#else
typedef struct tb__mutex {
    pthread_mutex_t m;
    uintptr_t owner; /* read and written atomically */
    int32_t depth;   /* touched by the owner only */
} tb__mutex;
#define TB__MUTEX_INIT                                                                             \
    { PTHREAD_MUTEX_INITIALIZER, 0, 0 }
#endif

/* ---- internal contracts between the parts (each defined in the part named) ---- */

/* base.c */
static void *tb__alloc(size_t size);                /* NULL + TB_ERR_OUT_OF_MEMORY error */
static void *tb__calloc(size_t count, size_t size); /* zeroed; overflow-checked */
static void tb__free(void *ptr);
/* grows *items (element size `elem`) to hold at least `need`; doubles; keeps content */
static tb_status tb__grow(void **items, size_t *cap, size_t need, size_t elem);
static char *tb__strdup(const char *s);
/* the capacity a caching allocator gives a request (size classes with at most 25% slack) */
static size_t tb__size_class(size_t size);
/* a new buffer generation (buffers whose contents may have changed take one); never 0 */
static uint64_t tb__next_generation(void);
static char *tb__format(const char *fmt, ...) TB_PRINTF_LIKE(1, 2); /* allocated */
static tb_status tb__error(tb_status status, const char *fmt, ...) TB_PRINTF_LIKE(2, 3);
static void tb__mutex_lock(tb__mutex *m);
static void tb__mutex_unlock(tb__mutex *m);
static void tb__ensure_setup(void);   /* implicit setup with a zero desc */
static const tb_desc *tb__desc(void); /* the effective desc (defaults filled) */
/* Progress of a first compile (executor.c; tb_desc.progress): whether this thread is in one
   with a hook set (a backend may then wait for each kernel's first launch); kernels ready of
   the graph's distinct kernels; the program came from the disk cache. */
static bool tb__progress_wanted(void);
static void tb__progress_kernels(size_t done, size_t total);
static void tb__progress_from_disk(void);
static const char *tb__getenv(const char *name); /* NULL when unset or empty */
#if defined(__linux__)
#define TB__CPU_WORDS 16 /* a CPU mask in unsigned longs: 1024 CPUs, as glibc's cpu_set_t */
typedef int (*tb__affinity_fn)(pthread_t thread, size_t size, void *mask);
/* glibc's pthread_getaffinity_np and pthread_setaffinity_np, looked up in `self` (the
   program's dlopen(NULL) handle, which the caller also looks its other calls up in; a strict C
   build does not declare them); false where either is missing */
static bool tb__affinity_calls(void *self, tb__affinity_fn *get, tb__affinity_fn *set);
#endif
static uint64_t tb__now_ns(void); /* monotonic clock */
/* A log line that appears only when something takes long: begin starts a thread that logs the
   message at info level unless end comes within `delay_ms`; end stops the thread and waits for
   it, so a line it logs comes before anything the caller logs next. For TB_DEBUG lines that
   must appear while a long call still runs. Without a thread (none could be started) nothing
   is logged. The struct lives on the caller's stack between begin and end. */
typedef struct tb__slow_notice {
    bool armed; /* a thread runs */
    unsigned delay_ms;
    char message[256];
#if defined(_WIN32)
    HANDLE done;
    HANDLE thread;
#else
    bool done; /* guarded by mutex */
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    pthread_t thread;
#endif
} tb__slow_notice;
static void tb__slow_notice_begin(tb__slow_notice *n, unsigned delay_ms, const char *fmt, ...)
    TB_PRINTF_LIKE(3, 4);
static void tb__slow_notice_end(tb__slow_notice *n);
/* 64-bit hashing: stable across runs and machines */
static uint64_t tb__hash_bytes(uint64_t seed, const void *data, size_t size);
static uint64_t tb__hash_u64(uint64_t seed, uint64_t value);
/* a growable string buffer */
typedef struct tb__str {
    char *data;
    size_t len;
    size_t cap;
    bool failed; /* an allocation failed; the text is incomplete */
} tb__str;
static void tb__str_append(tb__str *s, const char *fmt, ...) TB_PRINTF_LIKE(2, 3);
static char *tb__str_take(tb__str *s); /* the text (caller frees), NULL if failed */
static void tb__str_free(tb__str *s);

#define TB__ERROR_CAP 1024 /* bytes of an error message, NUL included */

/* A copy of the calling thread's error, for calls that must not disturb it. */
typedef struct tb__saved_error {
    tb_status status;
    char message[TB__ERROR_CAP];
} tb__saved_error;
static void tb__error_save(tb__saved_error *saved);
static void tb__error_restore(const tb__saved_error *saved);
static tb_status tb__error_v(tb_status status, const char *fmt, va_list ap);
/* a * b + c without overflow: false (nothing stored) when it would overflow */
static bool tb__muladd_i64(int64_t a, int64_t b, int64_t c, int64_t *out);
static uintptr_t tb__thread_id(void); /* nonzero, distinct per live thread */
static void tb__yield(void);
/* teardown hooks of the layers; tb_shutdown calls them through the wiring, in its order */
static void tb__registry_shutdown(void);
static void tb__ir_shutdown(void);
static void tb__metrics_shutdown(void);
static void tb__executor_shutdown(void);
static void tb__process_group_shutdown(void);

/* The wiring: what an earlier layer needs of later ones without naming them. The last part of
   the implementation (wiring.c) fills one table with the later layers' hooks; earlier layers
   reach them only through tb__wiring(). */
typedef struct tb__builtin_backend {
    const char *name;
    tb_status (*register_backend)(void); /* registers the backend under `name` */
} tb__builtin_backend;
typedef struct tb__wiring_table {
    /* tb_shutdown: each layer's teardown, later layers first and the metrics last */
    void (*const *teardown)(void);
    size_t num_teardown;
    /* the backends built into the library, in registration order (the reference first) */
    const tb__builtin_backend *builtins;
    size_t num_builtins;
    /* the executor's host step for a COLLECTIVE node (distributed.c): `in` holds the operand's
       values (a contiguous host array). `dest` not NULL: the node's values go there (the
       result's own memory, mapped into the host); else on success *out is a host array of the
       node's values that stays valid until release(*context) is called (once: when the data
       that borrowed it lets go, or after copying it). local != TB_OK: this rank could not
       compute its operand (in, dest and out NULL); it still takes part in the ranks' exchange,
       so that every rank gets an error instead of waiting, and returns an error. */
    tb_status (*collective)(const tb_node *node, tb_status local, const void *in, void *dest,
                            void **out, void (**release)(void *context), void **context);
} tb__wiring_table;
static const tb__wiring_table *tb__wiring(void);

/* rng.c: Philox 4x32-10 */
static void tb__philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);
/* the value of element `index` of rand (uniform [0,1)) / randn for a seed and offset */
static double tb__rng_uniform(tb_dtype dtype, uint64_t seed, uint64_t offset, uint64_t index);
static double tb__rng_normal(tb_dtype dtype, uint64_t seed, uint64_t offset, uint64_t index);
/* the seed and first counter for a call of `numel` elements (the operands of RAND/RANDN); the
   global offset advances by ceil(numel / 2). Thread-safe. */
static void tb__rng_reserve(uint64_t numel, uint64_t *seed, uint64_t *offset);
static void tb__rng_set_seed(uint64_t seed); /* and offset 0 (tb_manual_seed) */
static void tb__rng_reset(void);             /* the default seed, offset 0 (shutdown) */

/* shape.c */
static size_t tb__shape_text(const tb_shape *shape, char buf[96]); /* cut with "...]" if long */
static tb_status tb__shape_check(const char *fn, const tb_shape *shape); /* valid, naming fn */
static bool tb__shape_has_zero(const tb_shape *shape);
static int64_t tb__shape_numel(const tb_shape *shape); /* of a valid shape */
static bool tb__shape_size_ok(const tb_shape *shape);  /* within the size rule of shapes */

/* device.c: splits "backend" or "backend:ordinal" (no lookup); messages name `fn` */
static tb_status tb__device_text_split(const char *fn, const char *text, char name[TB_MAX_NAME + 1],
                                       int32_t *ordinal);
/* writes one element of `dtype` holding the value (C conversions; out-of-range floats saturate) */
static void tb__scalar_store(tb_scalar value, tb_dtype dtype, void *out);
/* a double as an f32 (IEEE rounding, no undefined behaviour out of range), and as or from the
   bits of f16 or bf16 (through f32) */
static float tb__f64_to_f32(double d);
static uint16_t tb__f64_to_half(tb_dtype dtype, double d);
static double tb__half_to_f64(tb_dtype dtype, uint16_t bits);

/* backend.c: backend data and the registry */
/* 1..TB_MAX_NAME bytes of [A-Za-z_][A-Za-z0-9_]* (the names of backends and process groups) */
static bool tb__name_valid(const char *name);
static tb_backend *tb__backend_for_device(const tb_device *device); /* error if unknown */
static const tb_backend_impl *tb__backend_vtable(const tb_backend *backend);
/* a new data (refcount 1, payload NULL) for a device of `backend` */
static tb_backend_data *tb__data_new(const tb_backend *backend, const tb_device *device,
                                     const tb_shape *shape);
static void tb__data_retain(tb_backend_data *data);
static void tb__data_release(tb_backend_data *data); /* frees the payload at 0 */
/* copies a host array into a new data on `device` (TransferToDeviceTime) */
static tb_backend_data *tb__data_from_host(const tb_device *device, const tb_shape *shape,
                                           const void *host);
static tb_status tb__data_to_host(const tb_backend_data *data, void *host); /* FromDevice time */
/* a rank-0 data of the scalar's dtype (the backend's data_from_scalar, else via the host) */
static tb_backend_data *tb__data_from_scalar(const tb_device *device, tb_scalar value);
/* a data using `host` in place (no copy), when the device's backend can borrow host memory
   (tb_backend_impl.data_borrow_host): release(context) is then the data's to call when it no
   longer needs the memory. NULL without an error and nothing called when it cannot: copy with
   tb__data_from_host instead, and release the memory yourself */
static tb_backend_data *tb__data_borrow_host(const tb_device *device, const tb_shape *shape,
                                             const void *host, void (*release)(void *context),
                                             void *context);
/* the host array of a data whose backend keeps it in host memory (data_host_pointer); NULL
   for other data and placeholders */
static void *tb__host_data(const tb_backend_data *data);
/* the values of a data in host memory for one host step, read only (data_map_host), ended by
   tb__data_unmap_host; NULL without an error when the backend would need a copy */
static void *tb__data_map_host(tb_backend_data *data);
static tb_status tb__data_unmap_host(tb_backend_data *data, void *host);
/* a new data whose values the caller writes at *host, then tb__data_unmap_host (data_map_host
   with `write`); NULL without an error when the backend would need a copy */
static tb_backend_data *tb__data_new_mapped(const tb_device *device, const tb_shape *shape,
                                            void **host);
/* registers a backend (tb_backend_register's work, messages naming `fn`); `plugin` is the
   shared object it came from or NULL; *out (may be NULL) gets the entry */
static tb_status tb__backend_register(const char *fn, const char *name, const tb_backend_impl *impl,
                                      const char *tags, void *plugin, tb_backend **out);
/* the device `ordinal` of a backend, its type asked from the backend; messages name `fn`
   (unknown backend: lists those that exist; bad ordinal: gives the device count) */
static tb_status tb__backend_device(const char *fn, const char *backend, int32_t ordinal,
                                    tb_device *out);
/* the current backend (tb_set_backend's, else the default of desc.backend / $TB_BACKEND /
   "cpu", looked up); NULL with an error naming `fn` and the setting that holds a bad name */
static const tb_backend *tb__current_backend(const char *fn);
/* the built-in backends of the wiring not registered yet (the registry calls it until all
   are); the first failure is kept in `why` */
/* Why a built-in backend is missing after tb__registry_ensure. */
typedef struct tb__builtin_failure {
    tb_status status;           /* TB_OK: every built-in backend is registered */
    char name[TB_MAX_NAME + 1]; /* the first one that could not be */
    char reason[TB__ERROR_CAP];
} tb__builtin_failure;
static void tb__register_builtin_backends(tb__builtin_failure *why);
/* registers every built-in backend not registered yet; `why` (may be NULL) gets the first
   failure */
static void tb__registry_ensure(tb__builtin_failure *why);
static void tb__registry_set_rng_seed(uint64_t seed); /* every registered backend's */
/* the backend named `name` (loaded as a plugin if need be); NULL with an error naming `fn` */
static tb_backend *tb__lookup(const char *fn, const char *name);
/* the error of a backend entry that failed with `st`, naming the backend and the entry */
static tb_status tb__backend_failed(tb_status st, const tb_backend *b, const char *entry);
/* the reference backend: the one whose values every other is checked against and which runs
   the eager fallback. Its built-in registration names it (tb__registry_set_reference); NULL
   until then. */
static void tb__registry_set_reference(const tb_backend *backend);
static const tb_backend *tb__registry_reference(void);

/* ir.c: nodes. Operands are retained by the node; the node is created with refcount 1. */
struct tb_node {
    int32_t refcount;
    tb_op op;
    tb_shape shape;
    tb_device device;
    uint32_t num_operands;
    tb_node **operands;
    uint32_t num_attrs;
    int64_t attrs[TB_MAX_ATTRS];
    double fattrs[2];
    uint64_t hash;
    uint64_t id;
    tb_backend_data *data; /* DEVICE_DATA: the value (owned reference) */
    tb_scalar scalar;      /* SCALAR: the value (not hashed) */
    bool wrapped_number;   /* SCALAR from a host number: weak in type promotion */
    /* set by the executor when a node's value was computed apart (eager fallback); owned */
    tb_backend_data *value;
    /* the automatic flush's bound on the computed (non-parameter) nodes of this node's pending
       graph (0: none yet), and the lowest id any of them can have; tensor.c sets both as the
       node is made and lowers graph_size on nodes a count walked (relaxed atomic loads and
       stores: the node may be shared by then) */
    uint64_t graph_size;
    uint64_t first_id;
    /* autograd (set when the node is made, before anyone else sees it): requires_grad, the
       value keeps its history across a sync (an operand's flag passes to its users);
       stop_grad, gradients do not pass into the operands (tb_detach, leaves) */
    bool requires_grad;
    bool stop_grad;
};
static tb_node *tb__node_new(tb_op op, const tb_shape *shape, const tb_device *device,
                             tb_node *const *operands, size_t num_operands, const int64_t *attrs,
                             size_t num_attrs, const double *fattrs);
static tb_node *tb__node_device_data(tb_backend_data *data); /* retains data */
static tb_node *tb__node_scalar(tb_scalar value, const tb_device *device, bool wrapped_number);
static void tb__node_retain(tb_node *node);
static void tb__node_release(tb_node *node); /* iterative: deep chains do not recurse */
/* a node with no operands yet (refcount 1), or NULL when there is no memory */
static tb_node *tb__node_alloc(tb_op op, const tb_shape *shape, const tb_device *device);
/* A copy of a graph's structure that holds no values: parameters become leaves without data,
   every other node is copied with its op, shape and attributes. A backend keeps this for a cached
   computation so that the computation does not keep the first run's tensors alive. */
typedef struct tb__detached_graph {
    tb_graph graph;
    tb_node **nodes;
    tb_node **parameters;
    tb_node **results;
} tb__detached_graph;
static tb_status tb__graph_detach(const tb_graph *graph, tb__detached_graph *out);
static void tb__graph_detached_free(tb__detached_graph *detached);
/* shape inference for a built-in or custom op (used by ops.c and tb_call_op) */
static tb_status tb__op_infer_shape(tb_op op, const tb_shape *inputs, size_t num_inputs,
                                    const int64_t *attrs, size_t num_attrs, tb_shape *out);
/* ir.c's shape rules, shared with the ops: messages name `fn` and the shapes involved */
typedef struct tb__shape_buf {
    char text[96];
} tb__shape_buf;
static const char *tb__st(const tb_shape *shape, tb__shape_buf *buf); /* the shape's text */
static tb_status tb__infer_shape_as(const char *fn, tb_op op, const tb_shape *inputs,
                                    size_t num_inputs, const int64_t *attrs, size_t num_attrs,
                                    tb_shape *out);
static tb_status tb__broadcast_dims(const char *fn, const tb_shape *inputs, size_t n,
                                    tb_shape *out);
static tb_status tb__check_fits(const char *fn, const tb_shape *shape);
static tb_status tb__need_bool(const char *fn, const char *what, const tb_shape *shape);
static tb_status tb__need_float(const char *fn, const tb_shape *shape);
/* the unary ops defined on floating dtypes only (exp, log, sqrt, ..., erf) */
static bool tb__op_float_only(tb_op op);
static tb_status tb__need_index(const char *fn, const tb_shape *shape);
static tb_status tb__need_not_bool(const char *fn, const tb_shape *shape);

/* ops.c: NULL for an op given a NULL tensor; the chain's first error is kept, else one naming
   `what` is set */
static tb_tensor *tb__null_input(const char *fn, const char *what);
/* ops.c: creates and announces (on_node_created) a node of a known shape; an owned reference
   or NULL with the error set, naming `fn` */
static tb_node *tb__emit(const char *fn, tb_op op, const tb_shape *shape, const tb_device *device,
                         tb_node *const *operands, size_t num_operands, const int64_t *attrs,
                         size_t num_attrs, const double *fattrs);

/* metrics.c */
static void tb__metric_count(const char *name, int64_t delta);
static void tb__metric_sample(const char *name, double value);

/* tensor.c: tensors and the executor.
   Graphs handed to backends: graph->parameters are the nodes whose values arrive as execute
   arguments, in that order: DEVICE_DATA and SCALAR nodes, and nodes of ANY op whose value was
   computed apart (node->value: the eager fallback, or a node synced earlier). A backend takes
   every node listed in parameters as an input and never lowers it; such a node's operands are
   not in graph->nodes. The executor does not retain graph nodes past the calls: a backend that
   keeps node pointers in a computation retains them (that also keeps their data alive). */
/* a new tensor owning `node` (consumes the caller's reference); NULL node -> NULL */
static tb_tensor *tb__tensor_from_node(tb_node *node);
/* the node standing for the tensor's value as an operand (pending IR or device data); borrowed */
static tb_node *tb__tensor_ir(tb_tensor *tensor);
/* the device to use for a new tensor when the caller gave `device` (NULL: current) */
static tb_status tb__resolve_device(const tb_device *device, tb_device *out);
/* a new tensor holding `data` (consumes the caller's reference); NULL data -> NULL */
static tb_tensor *tb__tensor_from_data(tb_backend_data *data);
/* a tensor over `host` in place where the device's backend can borrow host memory, else over
   a copy. On success release(context) is called exactly once: by the data when it no longer
   needs `host`, or before this returns (the device copied); on failure (NULL) it is not */
static tb_tensor *tb__tensor_borrow(const char *func, const void *host, const tb_shape *shape,
                                    const tb_device *device, void (*release)(void *context),
                                    void *context);
/* scopes (tb_scope_begin): a library object takes over one of the caller's references to t,
   which a scope stops owning when every reference t has was a scope's */
static void tb__scope_disown(tb_tensor *t);
/* a new reference to an existing tensor, returned to the caller: a scope owns it; returns t */
static tb_tensor *tb__scope_claim(tb_tensor *t);
/* the reference a library call just returned on this thread is the caller's, not its scope's */
static void tb__scope_take(tb_tensor *t);
/* tensor.c: syncs tensors on several devices, one graph per device (tb_mark_step's way) */
static tb_status tb__sync_by_device(tb_tensor *const *tensors, size_t n, const char *func);
/* tensor.c: tb__no_auto_flush, while > 0 on a thread, keeps the automatic flush from counting
   or flushing the graphs it records (a graph recorded only to be walked, never run) */
/* tensor.c: sets the automatic flush's bound of a node just made from its operands' (the node
   not yet shared) and returns it; tb__emit sets it for every op's node */
static uint64_t tb__node_flush_bound(tb_node *node);
/* tensor.c: tb_sync of tensors (one device) whose graph also computes the nodes `extra` of
   their history, each value kept in its node for later graphs to read */
static tb_status tb__exec_sync_with(tb_tensor *const *tensors, size_t count, tb_node *const *extra,
                                    size_t n_extra, const char *func);

/* reference.c: the reference interpreter (the cpu backend runs it). A graph's parameter values
   and results are contiguous host arrays of the nodes' shapes. */
static tb_status tb__ref_run_graph(const tb_graph *graph, const void *const *parameters,
                                   void *const *results);

/* the built-in backends' registrations, which the wiring lists */
/* ops.c: max over one axis whose gradient goes to the first largest element alone (PyTorch's
   max-pool), not shared between ties as tb_max's */
static tb_tensor *tb__max_first(tb_tensor *x, int32_t axis, bool keepdim);
/* autograd.c: the arena of tensors a rule makes, released together (nn.c and optim.c build
   on it) */
typedef struct tb__ag {
    const char *fn;
    tb_device device;
    tb_tensor **temps;
    size_t num_temps, cap_temps;
    bool failed; /* a tensor could not be made; the error is set */
} tb__ag;
static void tb__ag_init(tb__ag *a, const char *fn);
static void tb__ag_free(tb__ag *a);
/* t joins the arena (released with it) and is returned; NULL t, or no memory (t released),
   marks the arena failed and gives NULL */
static tb_tensor *tb__ag_keep(tb__ag *a, tb_tensor *t);
static tb_tensor *tb__ag_const(tb__ag *a, tb_dtype dtype, double value);
/* the sums of src's slices (along dim) that index sends to each slice of x's shape: index of
   src's shape (tb_scatter_add's layout), or 1-D along dim (tb_index_add's) */
static tb_tensor *tb__ag_scatter(tb__ag *a, const tb_shape *xs, int32_t dim, tb_tensor *index,
                                 tb_tensor *src);
static tb_tensor *tb__ag_index_sum(tb__ag *a, const tb_shape *xs, int32_t dim, tb_tensor *index,
                                   tb_tensor *src);
/* a tensor of an IR node, kept by the arena */
static tb_tensor *tb__ag_node(tb__ag *a, tb_node *node);
/* tb_grad's work without its checks: grads_out[i] the gradient of out for inputs[i] (NULL where
   no path), the rules' tensors in the arena `a` (a->device out's device) */
static tb_status tb__grad(tb__ag *a, tb_tensor *out, tb_tensor *seed, tb_tensor *const *inputs,
                          size_t n, tb_tensor **grads_out);
/* the gradient of a stride-1 convolution's input where matmul `mm` reads the windows of x as
   a convolution records them (*x set to x's node), else NULL: conv.c's rule, which it gives
   the matmul's backward when it records a convolution */
typedef tb_tensor *(*tb__ag_conv_grad_fn)(tb__ag *a, const tb_node *mm, tb_tensor *g, tb_node **x);
static void tb__ag_set_conv_grad(tb__ag_conv_grad_fn fn);
/* whether the calling thread records inside a backward rule (conv.c lets a convolution there,
   the gradient of another's input, take the whole rows) */
static bool tb__ag_in_rule(void);
/* the adjoint of tb_window: g [..., O_1, .., O_n, K_1, .., K_n] summed onto [..., sizes] */
static tb_tensor *tb__ag_fold(tb__ag *a, tb_tensor *g, int32_t n, const int64_t *sizes,
                              const int64_t *kernel, const int64_t *stride,
                              const int64_t *dilation);
/* nn.c: the arena's result as a new reference (NULL when the arena failed); frees the arena */
static tb_tensor *tb__nn_finish(tb__ag *a, tb_tensor *result);
/* optim.c: an optimizer's insides, for the saving and loading of its state (files.c) */
typedef struct tb__optim_view {
    tb_optimizer_desc *d;
    size_t n;
    tb_tensor **params;
    tb_tensor **state[2]; /* momentum buffer or exp_avg; exp_avg_sq (NULL arrays when unused) */
    int64_t *steps, *total_steps;
} tb__optim_view;
static tb__optim_view tb__optim_view_of(tb_optimizer *opt);
/* leaves.c: what a tensor holds, kept across assignments that may have to be undone (an optimizer
   step whose sync fails). Holding it does not keep a donation from happening: only live tensors
   count as readers. */
typedef struct tb__held {
    tb_tensor *t;
    tb_node *node, *history, *data_node;
    tb_backend_data *data, *donor;
} tb__held;
static void tb__held_take(tb__held *h, tb_tensor *t);
static tb_tensor *tb__held_guard(const tb__held *h);
static bool tb__held_restore(tb__held *h);
static void tb__held_drop(tb__held *h);

/* cpu_backend.c: registers the "cpu" backend as the registry's reference */
static tb_status tb__cpu_register(void);
#if !defined(TB_NO_OPENCL)
/* opencl.c: registers the "opencl" backend */
static tb_status tb__opencl_register(void);
#endif
#if defined(TB__HAVE_NATIVE)
/* native.c: registers the "native" backend */
static tb_status tb__native_register(void);
#endif

/* interop.c: the .npy header and the byte order, which the model file parts (files.c, npz.c,
   idx.c, ...) share */
/* The parsed header of a .npy file. */
typedef struct tb__npy_header {
    tb_dtype dtype;
    bool big_endian;
    bool fortran_order;
    int32_t rank;
    int64_t dims[TB_MAX_RANK];
    bool has_descr, has_order, has_shape;
} tb__npy_header;
static tb_status tb__npy_parse_header(const char *text, size_t len, const char *path,
                                      tb__npy_header *h);
static char *tb__npy_header_text(const tb_shape *shape, size_t *len, unsigned *major);
static bool tb__host_is_little_endian(void);
static void tb__swap_bytes(unsigned char *data, size_t count, size_t width);
