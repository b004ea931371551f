/* ---- src/header_begin.h ---- */
/* torch_backend.h - v0.1.0 - a lazy-tensor backend layer with an OpenCL execution path, in C.
   Public domain-style single-file library; BSD-3-Clause, see the end of README.md and LICENSE.

   WHAT IT IS
     The C form of PyTorch's Lazy Tensor Core backend layer and of torch._dynamo's backend
     registry: a registry of backends, devices, shapes, an IR of lazy tensor nodes, an executor with
     a computation cache, a CPU reference backend that is always present, and an OpenCL backend
     that lowers IR graphs to generated OpenCL C kernels.

   USAGE
     Do this:
         #define TB_IMPLEMENTATION
     before you include this file in *one* C or C++ file to create the implementation:

         #include ...
         #define TB_IMPLEMENTATION

     Every other file includes "torch_backend.h" without the define. Link with -ldl -lpthread -lm
     where the C library needs them. No OpenCL SDK is needed: the ICD loader (libOpenCL.so.1) is
     opened at run time.

   CONFIGURATION MACROS (define before the implementation include)
     TB_STATIC              make every public function static to the including file (with gcc
                            and clang one weak symbol stays external, tb_plugin_attach_host,
                            through which a host passes its error hook to a plugin's copy)
     TB_OPENCL_LINKED       call the OpenCL entry points directly (link with -lOpenCL) instead of
                            opening the ICD loader at run time
     TB_NO_OPENCL           leave the OpenCL backend out entirely
     TB_NO_PLUGINS          leave plugin loading (dlopen) out
     TB_ASSERT(x)           your own assert for internal invariants (default: assert.h)

   ENVIRONMENT VARIABLES
     TB_BACKEND          the default backend (default "cpu"; desc.backend overrides it)
     TB_DEVICE           the default device, as "backend:ordinal", e.g. "opencl:0" (desc.device
                         overrides it). A bad TB_BACKEND or TB_DEVICE is an error wherever the
                         default is used ("TB_BACKEND='x' is not a usable backend: ..."), never
                         a fallback
     TB_BACKEND_PATH     ':'-separated folders searched for plugins libtb_backend_<name>.so
     TB_CACHE_DIR        folder for the OpenCL program binary cache, created 0700 (a folder
                         others may write to is not used); "off" disables it
     TB_OPENCL_LIBRARY   path of the OpenCL ICD loader (default libOpenCL.so.1; ignored with
                         TB_OPENCL_LINKED)
     TB_OPENCL_BUILD_OPTIONS  extra options for every OpenCL program build (part of the disk
                         cache key), e.g. "-cl-fast-relaxed-math"
     TB_DEBUG            1: one line per graph compile/run, and one while a compile is still
                         running after 1 s; 2: also one line per kernel with time, GB/s,
                         GFLOP/s; 3: also the IR and the generated OpenCL C
     TB_CHECK            1: run every graph on the reference backend too and log the first node
                         whose value differs; 2: also fail that sync (TB_ERR_EXECUTE); desc.check
                         overrides it

   ERRORS
     Functions return a tb_status (TB_OK is 0) or, for functions returning a handle, NULL. The
     reason is in tb_last_error() (thread-local). An op given a NULL input returns NULL and keeps
     the first error, so a chain of ops can be checked once at the end.

   LISTS AND TEXTS INTO CALLER ARRAYS
     Functions that fill an array of `cap` entries (tb_backend_list, tb_backend_list_plugins,
     tb_backend_devices, tb_shape_format, tb_device_format) return or store the full count (or
   length) whatever `cap` is, and write at most `cap` entries. A NULL array asks for the count
   alone: `cap` is then ignored, and the count is the same as with an array.

   THREAD SAFETY
     The registry, the op table, the metrics and the computation cache are guarded by locks. A
     tensor may be read from several threads; building graphs on the same tensors from several
     threads at once needs the caller's own lock. Each function's comment says more where needed.

   VERSION
     0.1.0 (TB_VERSION_MAJOR/MINOR/PATCH); plugin API version TB_API_VERSION.
*/
#ifndef TORCH_BACKEND_H
#define TORCH_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define TB_VERSION_MAJOR  0
#define TB_VERSION_MINOR  1
#define TB_VERSION_PATCH  0
#define TB_VERSION_STRING "0.1.0"
/* The binary contract between the library and a backend plugin; bumped whenever
   tb_backend_impl, tb_backend_data or tb_plugin_desc change layout. */
#define TB_API_VERSION 1

#ifndef TBDEF
#ifdef TB_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define TBDEF static __attribute__((unused))
#else
#define TBDEF static
#endif
#else
#define TBDEF extern
#endif
#endif

#if defined(__GNUC__) || defined(__clang__)
#define TB_PRINTF_LIKE(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define TB_PRINTF_LIKE(fmt, args)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- src/base.h ---- */
/* ===========================================================================================
   Base: status codes, errors, allocation and logging hooks, setup
   =========================================================================================== */

/* Result of every fallible function. 0 is success. */
typedef enum tb_status {
    TB_OK = 0,
    TB_ERR_INVALID_ARGUMENT, /* NULL pointer, bad value, malformed text */
    TB_ERR_DTYPE,            /* a dtype the operation does not accept */
    TB_ERR_SHAPE,            /* shapes that do not match or do not broadcast, bad rank or axis */
    TB_ERR_OVERFLOW,         /* a size that does not fit in 64 bits or in size_t */
    TB_ERR_OUT_OF_MEMORY,    /* host or device allocation failed */
    TB_ERR_NOT_FOUND,        /* unknown backend, device, op, counter or file */
    TB_ERR_DUPLICATE,        /* a name registered twice */
    TB_ERR_UNSUPPORTED,      /* a valid request this backend or build cannot serve */
    TB_ERR_UNAVAILABLE,      /* a backend or device that cannot be used here (no driver, ...) */
    TB_ERR_COMPILE,          /* lowering or program build failed; the build log is in the message */
    TB_ERR_EXECUTE,          /* a computation failed while running */
    TB_ERR_IO,               /* a file could not be read or written */
    TB_ERR_FORMAT,           /* a malformed file or a file that lies about its contents */
    TB_ERR_PLUGIN,           /* a plugin without the entry symbol, of another API version, or
                                whose init failed */
    TB_ERR_STATE,            /* a call in the wrong order (setup twice, ...) */
    TB_ERR_INTERNAL,         /* a broken invariant inside the library: a bug, please report */
    TB_STATUS_COUNT
} tb_status;

/* A constant, human-readable name of a status ("TB_ERR_SHAPE: shape mismatch").
   Unknown values give "unknown status". Thread-safe. */
TBDEF const char *tb_status_string(tb_status status);

/* The message of the last error on the calling thread, naming the function and the offending
   values, e.g. "tb_add: shapes f32[2,3] and f32[4] do not broadcast". "" when no error happened
   since the last tb_clear_error(). The pointer stays valid until the next failing call on this
   thread. Thread-safe (the message is thread-local). */
TBDEF const char *tb_last_error(void);

/* The status of the last error on the calling thread (TB_OK when none). Thread-safe. */
TBDEF tb_status tb_last_status(void);

/* Forgets the calling thread's last error. Thread-safe. */
TBDEF void tb_clear_error(void);

/* Records an error for the calling thread and returns `status`, for backends and custom ops that
   want to report a reason: `return tb_set_error(TB_ERR_EXECUTE, "mydev: queue lost");`.
   Messages longer than 1023 bytes are cut. In a plugin's own copy of the library (TB_STATIC)
   loaded by a host, the error is also set in the host (see "plugins" below). Thread-safe. */
TBDEF tb_status tb_set_error(tb_status status, const char *fmt, ...) TB_PRINTF_LIKE(2, 3);

typedef enum tb_log_level {
    TB_LOG_ERROR = 0,
    TB_LOG_WARN = 1,
    TB_LOG_INFO = 2,
    TB_LOG_DEBUG = 3
} tb_log_level;

/* Memory hooks. Either both functions are set or neither (then malloc and free are used).
   `free` is never called with NULL. Every allocation the library makes goes through them. */
typedef struct tb_allocator {
    void *(*alloc)(size_t size, void *user_data);
    void (*free)(void *ptr, void *user_data);
    void *user_data;
} tb_allocator;

/* Log hook. NULL: messages at or below the level given by TB_DEBUG go to stderr (errors and
   warnings always). `message` has no trailing newline. It is called on the thread that logs;
   at TB_DEBUG >= 1 that may be a short-lived thread of the library's, which says that a compile
   is still running after a second while the thread that started the compile waits in it. */
typedef struct tb_logger {
    void (*func)(tb_log_level level, const char *message, void *user_data);
    void *user_data;
} tb_logger;

/* Setup options. Zero-initialise it; every 0 field means "the default".
       tb_desc desc = {0};
       desc.cache_size = 64;
       tb_setup(&desc);                                                                     */
typedef struct tb_desc {
    tb_allocator allocator;
    tb_logger logger;
    const char *backend;    /* default backend; NULL: $TB_BACKEND, else "cpu" */
    const char *device;     /* default device "backend:ordinal"; NULL: $TB_DEVICE */
    size_t cache_size;      /* computations kept in the LRU computation cache; 0: 1024 */
    size_t max_graph_nodes; /* a pending graph larger than this is flushed; 0: 100000 */
    int debug;              /* 0: $TB_DEBUG; 1..3 as TB_DEBUG; -1: off whatever $TB_DEBUG says */
    int check;              /* 0: $TB_CHECK; 1: check every graph on the reference backend
                               and log the first node that differs; 2: also fail the sync
                               (TB_ERR_EXECUTE); -1: off */
} tb_desc;

/* Optional: configures the library. Any other function called first sets the library up with a
   zero desc. Calling it while already set up is TB_ERR_STATE (call tb_shutdown first). The desc
   is copied. Not thread-safe: call it before other threads use the library. */
TBDEF tb_status tb_setup(const tb_desc *desc);

/* Releases everything the library holds: backends (prepare_to_exit is called), plugins, caches,
   metrics and the op registry. Tensors still alive become invalid: release them first. The
   library may be set up again afterwards. Not thread-safe. */
TBDEF void tb_shutdown(void);

/* True between a (possibly implicit) setup and tb_shutdown. */
TBDEF bool tb_is_setup(void);

/* The configured debug level (desc.debug or $TB_DEBUG), 0..3. */
TBDEF int tb_debug_level(void);

/* Frees memory the library returned to the caller (strings from tb_ir_text, tb_ir_dot, ...).
   NULL is ignored. Thread-safe. */
TBDEF void tb_free(void *ptr);

/* Sends a message through the logger. Thread-safe. */
TBDEF void tb_log_message(tb_log_level level, const char *fmt, ...) TB_PRINTF_LIKE(2, 3);

/* ---- src/shape.h ---- */
/* ===========================================================================================
   Dtypes, scalars and shapes
   =========================================================================================== */

typedef enum tb_dtype {
    TB_F32 = 0,
    TB_F64,
    TB_I32,
    TB_I64,
    TB_U8,
    TB_BOOL,
    TB_DTYPE_COUNT
} tb_dtype;

#define TB_MAX_RANK 8

/* A dtype and its dims. rank 0 is a scalar (numel 1). Dims are >= 0. */
typedef struct tb_shape {
    tb_dtype dtype;
    int32_t rank;
    int64_t dims[TB_MAX_RANK];
} tb_shape;

/* A typed host value: `f` for floating dtypes, `i` for integer and bool dtypes. */
typedef struct tb_scalar {
    tb_dtype dtype;
    double f;
    int64_t i;
} tb_scalar;

/* "f32", "f64", "i32", "i64", "u8", "bool"; "invalid" for anything else. */
TBDEF const char *tb_dtype_name(tb_dtype dtype);
/* Bytes per element (bool is 1 byte); 0 for an invalid dtype. */
TBDEF size_t tb_dtype_size(tb_dtype dtype);
/* Parses a dtype name ("f32", also "float32", "float", "int64", ...). */
TBDEF tb_status tb_dtype_parse(const char *text, tb_dtype *out);
TBDEF bool tb_dtype_is_valid(tb_dtype dtype);
TBDEF bool tb_dtype_is_float(tb_dtype dtype);
TBDEF bool tb_dtype_is_integer(tb_dtype dtype); /* i32 i64 u8 (not bool) */
/* PyTorch's promotion of two tensor dtypes: bool < u8 < i32 < i64 < f32 < f64, with
   u8 combined with a signed type giving the signed type (u8 + i32 = i32). */
TBDEF tb_dtype tb_dtype_promote(tb_dtype a, tb_dtype b);

/* Scalars of each kind. */
TBDEF tb_scalar tb_scalar_f(tb_dtype dtype, double value);
TBDEF tb_scalar tb_scalar_i(tb_dtype dtype, int64_t value);
/* The value as a double / as an int64 (truncating), whatever its dtype. */
TBDEF double tb_scalar_as_double(tb_scalar s);
TBDEF int64_t tb_scalar_as_int(tb_scalar s);

/* Builds a shape, checking dtype, rank (0..TB_MAX_RANK), dims >= 0 and the size rule: the byte
   size must fit in int64 and in size_t (TB_ERR_OVERFLOW otherwise). An empty shape obeys the
   same rule with its 0 dims read as 1, so that its strides fit too: f32[3,2^63-1,0] is rejected
   (as in PyTorch) and so is f32[0,3,2^63-1] (which PyTorch accepts with overflowing strides).
   `dims` may be NULL when rank is 0. On error *out is untouched. */
TBDEF tb_status tb_shape_make(tb_shape *out, tb_dtype dtype, int32_t rank, const int64_t *dims);
/* Convenience for literals: tb_shape_of(TB_F32, 2, 3, 4) is f32[3,4]. The dims are read as
   `int` (the type of a literal): pass int values, and use tb_shape_make for dims above INT_MAX
   or for int64_t variables. Checks as tb_shape_make; on error it returns a shape of rank -1
   (which every function rejects) and sets the error. */
TBDEF tb_shape tb_shape_of(tb_dtype dtype, int32_t rank, ...);

/* Element count; TB_ERR_OVERFLOW for a shape that breaks the size rule of tb_shape_make. */
TBDEF tb_status tb_shape_numel(const tb_shape *shape, int64_t *out);
/* Byte size; TB_ERR_OVERFLOW for a shape that breaks the size rule of tb_shape_make. */
TBDEF tb_status tb_shape_nbytes(const tb_shape *shape, size_t *out);
/* Same dtype, rank and dims. NULL equals nothing. */
TBDEF bool tb_shape_equal(const tb_shape *a, const tb_shape *b);
/* Checks a shape as tb_shape_make does (for shapes built by hand). */
TBDEF tb_status tb_shape_validate(const tb_shape *shape);
/* NumPy/PyTorch broadcasting of the dims; the result's dtype is tb_dtype_promote of both.
   Error: "tb_shape_broadcast: shapes f32[2,3] and f32[4] do not broadcast". */
TBDEF tb_status tb_shape_broadcast(const tb_shape *a, const tb_shape *b, tb_shape *out);
/* Row-major element strides of a contiguous tensor of this shape. */
TBDEF tb_status tb_shape_strides(const tb_shape *shape, int64_t strides[TB_MAX_RANK]);
/* Writes "f32[2,3]" ("f32[]" for rank 0) like snprintf: returns the length the full text needs
   (without the NUL), writes at most `cap` bytes including the NUL. `buf` NULL: just the
   length (`cap` is ignored). */
TBDEF size_t tb_shape_format(const tb_shape *shape, char *buf, size_t cap);
/* Parses the text form back ("f32[2,3]", "i64[]", spaces allowed around numbers).
   Bad text is TB_ERR_INVALID_ARGUMENT with the position; a valid text with too large dims is
   TB_ERR_OVERFLOW. On error *out is untouched. */
TBDEF tb_status tb_shape_parse(const char *text, tb_shape *out);

/* ---- src/device.h ---- */
/* ===========================================================================================
   Devices
   =========================================================================================== */

typedef enum tb_device_type {
    TB_DEVICE_CPU = 0,
    TB_DEVICE_GPU,
    TB_DEVICE_ACCELERATOR,
    TB_DEVICE_TYPE_COUNT
} tb_device_type;

#define TB_MAX_NAME 31 /* longest backend or op name, in bytes */

/* A device of a backend: the backend's name, the device type and an ordinal among that
   backend's devices. A zero-initialised tb_device means "the current device" wherever a device
   is taken as an argument. Text form: "opencl:1", "cpu:0". */
typedef struct tb_device {
    char backend[TB_MAX_NAME + 1];
    tb_device_type type;
    int32_t ordinal;
} tb_device;

/* Facts about a device, filled by the backend (fields it does not know stay zero/empty). */
typedef struct tb_device_info {
    tb_device device;
    char name[128];
    char vendor[128];
    char driver_version[64];
    char language_version[64]; /* e.g. "OpenCL C 1.2" */
    uint64_t global_memory;    /* bytes */
    uint64_t local_memory;     /* bytes */
    uint64_t max_allocation;   /* bytes */
    uint32_t compute_units;
    uint32_t max_work_group_size;
    bool unified_memory; /* the device shares host memory (zero-copy transfers) */
    bool supports_f64;
    char extensions[1024]; /* space-separated, cut to fit */
} tb_device_info;

/* "CPU", "GPU", "ACCELERATOR"; "invalid" otherwise. */
TBDEF const char *tb_device_type_name(tb_device_type type);
/* Parses "cpu", "gpu", "accelerator" (any case). */
TBDEF tb_status tb_device_type_parse(const char *text, tb_device_type *out);

/* Builds a device of a registered backend by ordinal, asking the backend for its type.
   Errors: unknown backend (the message lists those that exist), ordinal out of range (the
   message gives the device count). */
TBDEF tb_status tb_device_make(const char *backend, int32_t ordinal, tb_device *out);
/* Writes "opencl:1" like snprintf (see tb_shape_format). */
TBDEF size_t tb_device_format(const tb_device *device, char *buf, size_t cap);
/* Parses "backend:ordinal" or "backend" (ordinal 0) and resolves it as tb_device_make does. */
TBDEF tb_status tb_device_parse(const char *text, tb_device *out);
/* Same backend and ordinal. */
TBDEF bool tb_device_equal(const tb_device *a, const tb_device *b);

/* The current device of the calling thread: the innermost device guard's, else the default
   device (desc.device / $TB_DEVICE), else the current backend's default device. A default that
   names no usable device or backend is an error that says which setting holds it:
   "tb_current_device: TB_DEVICE='opencl:7' is not a usable device: ...",
   "tb_current_device: TB_BACKEND='nope' is not a usable backend: ...". */
TBDEF tb_status tb_current_device(tb_device *out);

/* Device guard: makes `device` current on this thread until tb_device_guard_end, which restores
   the previous one. Guards nest; end them in reverse order.
       tb_device_guard g;
       tb_device_guard_begin(&g, &dev);  ...  tb_device_guard_end(&g);                      */
typedef struct tb_device_guard {
    tb_device previous;
    bool had_previous;
    bool active;
} tb_device_guard;
TBDEF tb_status tb_device_guard_begin(tb_device_guard *guard, const tb_device *device);
TBDEF void tb_device_guard_end(tb_device_guard *guard);

/* ---- src/backend.h ---- */
/* ===========================================================================================
   Backend interface and registry
   The C form of LTC's BackendImplInterface (torch/csrc/lazy/backend/backend_interface.h) and of
   torch._dynamo's backend registry.
   =========================================================================================== */

typedef struct tb_node tb_node;       /* an IR node (see the IR section) */
typedef struct tb_backend tb_backend; /* a registered backend (owned by the registry) */

/* A backend's handle to one array on one device: LTC's BackendData. The library allocates the
   struct, fills `device` and `shape`, and hands it to the backend, which sets `payload` (its own
   buffer object) in data_from_host / data_from_scalar / execute and frees it in data_release.
   A placeholder is a data whose payload is still NULL: execute fills it (LTC's Assign). */
typedef struct tb_backend_data {
    tb_device device;
    tb_shape shape;
    void *payload;    /* the backend's buffer; NULL while a placeholder has no value */
    bool is_scalar;   /* made from a scalar (tb_scalar) */
    tb_scalar scalar; /* the value when is_scalar */
    /* Owned by the library; backends leave these alone. */
    int32_t tb__refcount;
    const tb_backend *tb__backend;
} tb_backend_data;

/* What a backend lowers: the nodes of one graph in post-order (operands before their users),
   the parameters (leaves whose values arrive at execution: device data and scalars, in the
   order the execute arguments come), and the results (nodes whose values execute returns, in
   the order of the result placeholders). Every pointer is valid during the call only, except
   that nodes are retained by the library for as long as the computation lives. */
typedef struct tb_graph {
    const tb_node *const *nodes;
    size_t num_nodes;
    const tb_node *const *parameters;
    size_t num_parameters;
    const tb_node *const *results;
    size_t num_results;
    uint64_t hash; /* structural hash of the graph: equal hashes, same computation */
    tb_device device;
} tb_graph;

/* The backend vtable. `user_data` is handed to every entry. Entries marked (optional) may be NULL
   and then behave as described. The registry copies the struct. */
typedef struct tb_backend_impl {
    void *user_data;

    /* (optional) Called once when the backend is registered; an error rejects the
       registration (the backend is not registered). */
    tb_status (*init)(void *user_data);
    /* (optional) LTC PrepareToExit: called once by tb_shutdown, after the library released
       every computation and data it held (the cache, the IR) and before a plugin is unloaded.
       Release queues, contexts, caches. */
    void (*prepare_to_exit)(void *user_data);
    /* (optional) LTC SetRngSeed: called by tb_manual_seed. Backends that generate random numbers
       themselves must produce the library's Philox stream (see tb_rand). */
    void (*set_rng_seed)(void *user_data, uint64_t seed);

    /* IR builder hooks (LTC GetIrBuilder). (optional) on_node_created: called for every node
       recorded on a device of this backend; an error rejects the op (the op returns NULL).
       (optional) supports_node: false makes the executor run that node on the reference
       backend (eager fallback, counted in the metrics); NULL: every node is supported. */
    tb_status (*on_node_created)(void *user_data, const tb_node *node);
    bool (*supports_node)(void *user_data, const tb_node *node);

    /* LTC MakeComputationDataFromTensor: `data` has device and shape set; copy the contiguous
       host array `host` (tb_shape_nbytes bytes) to the device and set data->payload. Required. */
    tb_status (*data_from_host)(void *user_data, tb_backend_data *data, const void *host);
    /* (optional) LTC MakeComputationDataFromScalar: `data` is rank 0 of the scalar's dtype.
       NULL: the scalar is converted on the host and handed to data_from_host. */
    tb_status (*data_from_scalar)(void *user_data, tb_backend_data *data, tb_scalar value);
    /* (optional) LTC CreateDataPlaceholder: prepare a data without a value (payload may stay
       NULL; execute fills it). NULL: nothing to prepare. */
    tb_status (*create_placeholder)(void *user_data, tb_backend_data *data);
    /* (optional) LTC GetComputationDataFromNode: the data a node stands for, or NULL.
       NULL: the library answers for device-data nodes (tb_node_data). */
    tb_backend_data *(*get_node_data)(void *user_data, const tb_node *node);
    /* LTC MakeTensorFromComputationData: copy the value to the contiguous host array `host`
       (tb_shape_nbytes(&data->shape) bytes). Required. */
    tb_status (*data_to_host)(void *user_data, const tb_backend_data *data, void *host);
    /* Free data->payload (never called for a NULL payload). Required. */
    void (*data_release)(void *user_data, tb_backend_data *data);

    /* LTC CreateLoweringContext + Lower + Build: lower every node of `graph` into a
       backend-owned context. Required. */
    tb_status (*create_lowering_context)(void *user_data, const tb_graph *graph, void **context);
    /* (optional) frees a lowering context; called after compile, success or not. */
    void (*release_lowering_context)(void *user_data, void *context);
    /* (optional) LTC GetCompilationDevices: the devices a computation for `device` is compiled
       for; returns how many exist, fills at most `cap`. NULL: just `device`. */
    size_t (*get_compilation_devices)(void *user_data, const tb_device *device, tb_device *out,
                                      size_t cap);
    /* LTC Compile: turn a lowering context into a runnable computation. Required. */
    tb_status (*compile)(void *user_data, void *context, void **computation);
    /* LTC ExecuteComputation: run with the parameter values `arguments` (graph parameter order)
       and fill the payloads of the `results` placeholders (graph result order; device and shape
       set). Required. */
    tb_status (*execute)(void *user_data, void *computation, tb_backend_data *const *arguments,
                         size_t num_arguments, tb_backend_data *const *results, size_t num_results);
    /* Frees a computation (when it leaves the computation cache). Required. */
    void (*release_computation)(void *user_data, void *computation);
    /* (optional) LTC GetComputationBackendText: the computation as the backend sees it (the
       OpenCL C of its program, ...); owned by the computation. NULL without an error: no text;
       NULL with an error set (host->set_error, tb_set_error): the text could not be made, and
       tb_ir_backend_text fails with that error. */
    const char *(*computation_backend_text)(void *user_data, const void *computation);

    /* LTC GetBackendDevices: how many devices exist; fills at most `cap` of `out` with their
       type and ordinal (the library fills the backend name). `out` is NULL only with `cap`
       0. Required; may return 0. */
    size_t (*get_backend_devices)(void *user_data, tb_device *out, size_t cap);
    /* (optional) LTC GetBackendDevice(ordinal). NULL: looked up in get_backend_devices. */
    tb_status (*get_backend_device)(void *user_data, int32_t ordinal, tb_device *out);
    /* (optional) device facts for tb_backend_device_info. NULL: only the device is filled. */
    tb_status (*get_device_info)(void *user_data, int32_t ordinal, tb_device_info *out);
    /* (optional) LTC Get/SetDefaultDeviceType and Get/SetDefaultDeviceOrdinal. NULL: the
       library keeps the default itself (type of device 0, ordinal 0). A set hook may refuse. */
    tb_device_type (*get_default_device_type)(void *user_data);
    tb_status (*set_default_device_type)(void *user_data, tb_device_type type);
    int32_t (*get_default_device_ordinal)(void *user_data);
    tb_status (*set_default_device_ordinal)(void *user_data, int32_t ordinal);
    /* (optional) LTC EagerFallbackDeviceType. NULL: TB_DEVICE_CPU. */
    tb_device_type (*eager_fallback_device_type)(void *user_data);
    /* (optional) LTC CreateMetricsReport: snprintf-like, returns the full length. NULL: "".
       Returning 0 with an error set (memory ran out) fails tb_backend_metrics_report. */
    size_t (*create_metrics_report)(void *user_data, char *buf, size_t cap);
    /* (optional) Which kernel of `computation` computes node `node_index` of the post-order
       (tb_graph.nodes) of the graph it was compiled from: the kernel's index, and its name in
       *kernel_name (owned by the computation; may be NULL). -1 for parameters and for nodes no
       kernel computes; a folded view counts as part of the kernel that reads it when the
       backend knows which one, else -1. tb_ir_dot draws each kernel as a cluster.
       NULL: no clusters. */
    int32_t (*get_node_kernel)(void *user_data, const void *computation, size_t node_index,
                               const char **kernel_name);
} tb_backend_impl;

/* Registers a backend under `name` (1..TB_MAX_NAME bytes, [A-Za-z_][A-Za-z0-9_]*), with
   comma-separated `tags` (may be NULL or ""; each tag an identifier). The impl is copied; its
   init entry runs first and its failure rejects the registration. Errors: NULL or bad name,
   missing required entries, TB_ERR_DUPLICATE "duplicate name: X", and the cause when the
   built-in backends (registered on first use) could not be registered first. Thread-safe. */
TBDEF tb_status tb_backend_register(const char *name, const tb_backend_impl *impl,
                                    const char *tags);
/* Looks a backend up. On a miss it searches $TB_BACKEND_PATH for libtb_backend_<name>.so and
   loads it as a plugin. Still missing: NULL and TB_ERR_NOT_FOUND
   "unknown backend 'x'; available: cpu, opencl". A built-in backend whose registration failed
   (memory ran out) gives that cause instead, and the next call registers it again. The handle
   lives until tb_shutdown. Thread-safe. */
TBDEF tb_backend *tb_backend_lookup(const char *name);
/* True if a backend of that name is registered or loadable as a plugin. Does not set an error
   when the answer is false. Thread-safe. */
TBDEF bool tb_has_backend(const char *name);
/* Sorted names of the registered backends, hiding those tagged "debug" or "experimental" unless
   `include_hidden`. Returns how many there are and fills at most `cap` of `names` (pointers
   valid until tb_shutdown). `names` NULL: just the count (`cap` is ignored). Thread-safe. */
TBDEF size_t tb_backend_list(const char **names, size_t cap, bool include_hidden);
TBDEF const char *tb_backend_name(const tb_backend *backend);
/* The tags as registered ("" when none). */
TBDEF const char *tb_backend_tags(const tb_backend *backend);
TBDEF bool tb_backend_has_tag(const tb_backend *backend, const char *tag);
/* The registered vtable (a copy owned by the registry). */
TBDEF const tb_backend_impl *tb_backend_get_impl(const tb_backend *backend);

/* The current backend: new tensors without an explicit device go there. Default: desc.backend,
   else $TB_BACKEND, else "cpu", looked up on first use (a plugin is loaded then).
   tb_set_backend: an unknown name is TB_ERR_NOT_FOUND and changes nothing.
   tb_get_backend returns the current backend's name (valid until tb_shutdown), or NULL when
   the default names no usable backend: the error then says which setting holds the bad name,
   e.g. "tb_get_backend: TB_BACKEND='nope' is not a usable backend: unknown backend 'nope';
   available: cpu, opencl". Every use of the default fails the same way (tb_current_device,
   and with it every new tensor without a device) until tb_set_backend picks one; nothing falls
   back to "cpu". Thread-safe (process-wide). */
TBDEF tb_status tb_set_backend(const char *name);
TBDEF const char *tb_get_backend(void);

/* The devices of a backend: fills at most `cap`, *count (may be NULL) gets how many exist.
   `out` NULL: just the count (`cap` is ignored). */
TBDEF tb_status tb_backend_devices(const char *backend, tb_device *out, size_t cap, size_t *count);
/* Facts about one device. */
TBDEF tb_status tb_backend_device_info(const tb_device *device, tb_device_info *out);
/* LTC's default device type and ordinal, per backend. */
TBDEF tb_status tb_backend_get_default_device_type(const char *backend, tb_device_type *out);
TBDEF tb_status tb_backend_set_default_device_type(const char *backend, tb_device_type type);
TBDEF tb_status tb_backend_get_default_device_ordinal(const char *backend, int32_t *out);
TBDEF tb_status tb_backend_set_default_device_ordinal(const char *backend, int32_t ordinal);
/* The device of the backend's default type and ordinal. */
TBDEF tb_status tb_backend_default_device(const char *backend, tb_device *out);
TBDEF tb_status tb_backend_eager_fallback_device_type(const char *backend, tb_device_type *out);
/* The backend's own metrics report; free it with tb_free. NULL on error. */
TBDEF char *tb_backend_metrics_report(const char *backend);

/* ---- plugins ----
   A plugin is a shared object libtb_backend_<name>.so that exports
       tb_status tb_backend_plugin_entry(const tb_plugin_host *host, tb_plugin_desc *out);
   which fills `out` (api_version = TB_API_VERSION, name = <name>, tags, impl). The library
   checks the API version and the name, then registers the impl (init runs). Any failure leaves
   the registry as it was and unloads the object.
   Errors: a plugin reports a reason with host->set_error, or with tb_set_error when it builds
   its own copy of the library (TB_STATIC + TB_IMPLEMENTATION, with gcc or clang): that copy
   exports tb_plugin_attach_host (TB_PLUGIN_ATTACH_NAME), which the host calls with its
   services before the entry, and from then on the copy's tb_set_error also sets the host's
   error. Only tb_set_error is passed on: another function of the copy that fails keeps its
   error in the copy (return tb_set_error(st, "%s", tb_last_error()) passes it on). */
#define TB_PLUGIN_ENTRY_NAME  "tb_backend_plugin_entry"
#define TB_PLUGIN_ATTACH_NAME "tb_plugin_attach_host"

/* The host's services for a plugin. The struct stays valid while the plugin is loaded, so a
   plugin may keep the pointer it is given. alloc and free are the host's allocator hooks. */
typedef struct tb_plugin_host {
    uint32_t api_version;
    tb_status (*set_error)(tb_status status, const char *message);
    void (*log)(tb_log_level level, const char *message);
    void *(*alloc)(size_t size);
    void (*free)(void *ptr);
} tb_plugin_host;

typedef struct tb_plugin_desc {
    uint32_t api_version;
    const char *name;
    const char *tags;
    tb_backend_impl impl;
} tb_plugin_desc;

typedef tb_status (*tb_plugin_entry_fn)(const tb_plugin_host *host, tb_plugin_desc *out);
typedef void (*tb_plugin_attach_fn)(const tb_plugin_host *host);

/* The backend names that $TB_BACKEND_PATH offers as plugins: every regular file
   libtb_backend_<name>.so in its folders whose <name> is a valid backend name, sorted, each name
   once, registered or not. Nothing is loaded (tb_backend_lookup loads one, and says why one
   does not load). Returns how many there are and copies at most `cap` of them into `names`;
   `names` NULL: just the count (`cap` is ignored). Folders that cannot be read are skipped;
   0 without TB_BACKEND_PATH and in builds without plugins. Thread-safe. */
TBDEF size_t tb_backend_list_plugins(char (*names)[TB_MAX_NAME + 1], size_t cap);

/* Loads a plugin from an explicit path (the name comes from the plugin's desc).
   Errors: TB_ERR_IO (cannot open), TB_ERR_PLUGIN (no entry symbol, wrong API version, entry or
   init failed, name mismatch), TB_ERR_DUPLICATE. Thread-safe. */
TBDEF tb_status tb_backend_load_plugin(const char *path);

/* ---- src/ir.h ---- */
/* ===========================================================================================
   IR: ops and nodes
   =========================================================================================== */

/* Op kinds, which say how a backend may lower an op. */
typedef enum tb_op_kind {
    TB_KIND_INVALID = -1, /* tb_op_get_kind of an unknown op */
    TB_KIND_LEAF = 0,     /* device data, scalars, generators (arange, eye, rand) */
    TB_KIND_UNARY,        /* elementwise, one operand */
    TB_KIND_BINARY,       /* elementwise with broadcasting, two operands */
    TB_KIND_TERNARY,      /* elementwise with broadcasting, three operands (where, clamp) */
    TB_KIND_REDUCE,       /* reduction over a set of axes */
    TB_KIND_MATMUL,       /* batched matrix product */
    TB_KIND_NORM,         /* softmax, log_softmax, layer_norm: reductions plus elementwise */
    TB_KIND_MOVEMENT,     /* a view: reshape, permute, expand, slice, flip (index arithmetic) */
    TB_KIND_OTHER,        /* concat, pad, gather, index_select */
    TB_KIND_CUSTOM        /* registered by the user */
} tb_op_kind;

/* The built-in ops: X(ENUM, "name", kind, number of operands (-1: variable)).

   NORMAL FORM. The op functions (tb_add, tb_sum, tb_matmul, ...) apply PyTorch's rules (type
   promotion, broadcasting, negative axes, matmul's 1-D cases) and record nodes in the form
   below, inserting CAST, RESHAPE and EXPAND nodes where needed. Shape inference, and so
   tb_call_op, accepts only this form, so a backend may rely on it. T is the output dtype; every
   axis or dim attribute is already non-negative and below the operand's rank; bitmask bit i
   stands for axis i. Attributes are tb_node_attr (int64), fattrs are tb_node_fattr (double; 0
   unless listed). Values follow PyTorch (NaN propagates through MAX/MIN/MAXIMUM/MINIMUM/CLAMP,
   ARGMAX/ARGMIN treat NaN as the extreme, integer division by zero is the backend's matter).

   Leaves (never inferred: built by the creation functions only)
     DEVICE_DATA  no operands; the value is tb_node_data.
     SCALAR       rank 0; the value is tb_node_scalar, a graph parameter (never hashed).
     ARANGE       [n] of T (not bool); fattrs [start, step]; element i = start + i * step
                  (computed in double; for integer T start and step are whole numbers and the
                  element is computed in int64).
     EYE          [n, m] of any T; no attributes; 1 where row == column, else 0.
     RAND RANDN   f32 or f64 of any shape; operands [seed, offset], both i64 SCALARs holding the
                  uint64 values bit for bit (see tb_rand).
   Unary elementwise: one operand of the output's dims; no attributes except CAST.
     EXP LOG SQRT RSQRT SIN COS TANH SIGMOID GELU SILU RECIPROCAL: float T only (the op
       functions cast integer and bool inputs to f32 first; gelu and silu reject them as PyTorch).
     NEG ABS RELU FLOOR CEIL ROUND: T not bool (FLOOR CEIL ROUND of integers are the identity;
       ROUND is half to even).  SIGN: any T (bool: the identity).
     LOGICAL_NOT: bool -> bool (the op function casts other dtypes to bool first).
     CAST: attrs [dtype]; any dtype -> that dtype (float to integer truncates toward zero,
       nonzero to bool is true, bool to number is 0 or 1).
   Binary elementwise: two operands of ONE dtype whose dims broadcast (NumPy rules, aligned at
   the last axis); output the broadcast dims; no attributes.
     ADD MUL MAXIMUM MINIMUM: any T.  SUB POW: T not bool.  DIV: float T only (true division).
     EQ NE LT LE GT GE: operands of any one dtype, output bool.
     LOGICAL_AND LOGICAL_OR: bool operands, output bool.
   Ternary elementwise (the three dims broadcast; no attributes):
     WHERE: [cond (bool), a (T), b (T)] -> T.
     CLAMP: [x, lo, hi], all T (not bool) -> T = min(max(x, lo), hi): hi wins when lo > hi.
   Reductions SUM MEAN MAX MIN PROD: one operand; attrs [axes bitmask, keepdim]; bitmask 0
     reduces nothing (each output element is its one input element); keepdim 1 keeps reduced
     axes as size 1, 0 removes them. Output dtype = operand dtype.
     SUM PROD: T not bool (the op functions cast bool and integers to i64 first); over an empty
       set: 0 and 1.  MEAN: float T only; empty: NaN.  MAX MIN: any T; every reduced axis has
       size >= 1.
   ARGMAX ARGMIN: one operand of rank >= 1, not bool; attrs [axis, keepdim]; dims[axis] >= 1;
     output i64, the index along axis of the first extreme element. (The op functions reshape a
     rank-0 input to [1].)
   MATMUL: [a, b] of one dtype (not bool) and one rank r >= 2 with equal batch dims:
     a [..., n, k] x b [..., k, m] -> [..., n, m]. (tb_matmul turns a 1-D a into [1, k] and a 1-D
     b into [k, 1], RESHAPEs and EXPANDs both to the broadcast batch dims, and RESHAPEs the
     result to drop the added axes.)
   SOFTMAX LOG_SOFTMAX: one float operand of rank >= 1; attrs [axis]; output the same shape.
     (The op functions reshape a rank-0 input to [1].)
   LAYER_NORM: operands [x, weight if has_weight, bias if has_bias]; attrs [normalized_ndim,
     has_weight, has_bias] (flags 0 or 1); fattrs [eps]. x float of rank >= normalized_ndim >= 1;
     weight and bias have x's dtype and exactly the last normalized_ndim dims of x. Output x's
     shape: (x - mean) / sqrt(var + eps) * weight + bias, mean and biased variance taken over the
     last normalized_ndim axes.
   Movement (views; output dtype = operand dtype):
     RESHAPE: attrs = the output dims (one per output axis; none for rank 0); same element count;
       row-major order is kept.
     PERMUTE: attrs = perm, one per axis, a permutation of 0..rank-1; out.dims[i] = dims[perm[i]].
     EXPAND: attrs = the output dims (output rank >= input rank); the input's axes align with the
       trailing output axes, each input dim equal to its output dim or 1 (then repeated).
     SLICE: rank >= 1; attrs [dim, start, end, step] with 0 <= start <= end <= dims[dim] and
       step >= 1; out.dims[dim] = ceil((end - start) / step); element j along dim is input
       element start + j * step.
     FLIP: attrs [axes bitmask]: those axes are reversed.
   Others (copies):
     CONCAT: one or more operands of one dtype and one rank >= 1, equal dims except along dim;
       attrs [dim]; out.dims[dim] is the sum, operands in order.
     PAD: [x, value] with value a rank-0 of x's dtype; attrs [before_0, after_0, before_1,
       after_1, ...]: a pair for EVERY axis of x from axis 0 on (2 * rank attrs), each >= 0;
       out.dims[d] = before_d + dims[d] + after_d; the border holds value.
     GATHER: [x, index], index i32 or i64 of x's rank (>= 1); attrs [dim]; index.dims[d] <=
       x.dims[d] for d != dim; output index's dims and x's dtype: out[p] = x[p with p[dim]
       replaced by index[p]]. An index outside [0, x.dims[dim]) (negative ones included) fails
       at run time (TB_ERR_EXECUTE).
     INDEX_SELECT: [x, index], x rank >= 1, index 1-D i32 or i64; attrs [dim]; output x's dims
       with dims[dim] = index's length: out[p] = x[p with p[dim] replaced by index[p[dim]]].
       Out-of-range indices as GATHER.
   Custom ops: the registered number of operands, as recorded (no CAST is inserted); attrs as
   given to tb_call_op; output from infer_shape, or else the broadcast of the operands with the
   tb_dtype_promote of their dtypes.

   Scalars used by ops (clamp bounds, pad value, x + 2) are SCALAR operands: their values are
   parameters and never enter the hash. */
#define TB_OP_LIST(X)                                                                              \
    X(DEVICE_DATA, "device_data", TB_KIND_LEAF, 0)                                                 \
    X(SCALAR, "scalar", TB_KIND_LEAF, 0)                                                           \
    X(ARANGE, "arange", TB_KIND_LEAF, 0)                                                           \
    X(EYE, "eye", TB_KIND_LEAF, 0)                                                                 \
    X(RAND, "rand", TB_KIND_LEAF, 2)                                                               \
    X(RANDN, "randn", TB_KIND_LEAF, 2)                                                             \
    X(NEG, "neg", TB_KIND_UNARY, 1)                                                                \
    X(ABS, "abs", TB_KIND_UNARY, 1)                                                                \
    X(EXP, "exp", TB_KIND_UNARY, 1)                                                                \
    X(LOG, "log", TB_KIND_UNARY, 1)                                                                \
    X(SQRT, "sqrt", TB_KIND_UNARY, 1)                                                              \
    X(RSQRT, "rsqrt", TB_KIND_UNARY, 1)                                                            \
    X(SIN, "sin", TB_KIND_UNARY, 1)                                                                \
    X(COS, "cos", TB_KIND_UNARY, 1)                                                                \
    X(TANH, "tanh", TB_KIND_UNARY, 1)                                                              \
    X(SIGMOID, "sigmoid", TB_KIND_UNARY, 1)                                                        \
    X(RELU, "relu", TB_KIND_UNARY, 1)                                                              \
    X(GELU, "gelu", TB_KIND_UNARY, 1)                                                              \
    X(SILU, "silu", TB_KIND_UNARY, 1)                                                              \
    X(RECIPROCAL, "reciprocal", TB_KIND_UNARY, 1)                                                  \
    X(FLOOR, "floor", TB_KIND_UNARY, 1)                                                            \
    X(CEIL, "ceil", TB_KIND_UNARY, 1)                                                              \
    X(ROUND, "round", TB_KIND_UNARY, 1)                                                            \
    X(SIGN, "sign", TB_KIND_UNARY, 1)                                                              \
    X(LOGICAL_NOT, "logical_not", TB_KIND_UNARY, 1)                                                \
    X(CAST, "cast", TB_KIND_UNARY, 1)                                                              \
    X(ADD, "add", TB_KIND_BINARY, 2)                                                               \
    X(SUB, "sub", TB_KIND_BINARY, 2)                                                               \
    X(MUL, "mul", TB_KIND_BINARY, 2)                                                               \
    X(DIV, "div", TB_KIND_BINARY, 2)                                                               \
    X(POW, "pow", TB_KIND_BINARY, 2)                                                               \
    X(MAXIMUM, "maximum", TB_KIND_BINARY, 2)                                                       \
    X(MINIMUM, "minimum", TB_KIND_BINARY, 2)                                                       \
    X(EQ, "eq", TB_KIND_BINARY, 2)                                                                 \
    X(NE, "ne", TB_KIND_BINARY, 2)                                                                 \
    X(LT, "lt", TB_KIND_BINARY, 2)                                                                 \
    X(LE, "le", TB_KIND_BINARY, 2)                                                                 \
    X(GT, "gt", TB_KIND_BINARY, 2)                                                                 \
    X(GE, "ge", TB_KIND_BINARY, 2)                                                                 \
    X(LOGICAL_AND, "logical_and", TB_KIND_BINARY, 2)                                               \
    X(LOGICAL_OR, "logical_or", TB_KIND_BINARY, 2)                                                 \
    X(WHERE, "where", TB_KIND_TERNARY, 3)                                                          \
    X(CLAMP, "clamp", TB_KIND_TERNARY, 3)                                                          \
    X(SUM, "sum", TB_KIND_REDUCE, 1)                                                               \
    X(MEAN, "mean", TB_KIND_REDUCE, 1)                                                             \
    X(MAX, "max", TB_KIND_REDUCE, 1)                                                               \
    X(MIN, "min", TB_KIND_REDUCE, 1)                                                               \
    X(PROD, "prod", TB_KIND_REDUCE, 1)                                                             \
    X(ARGMAX, "argmax", TB_KIND_REDUCE, 1)                                                         \
    X(ARGMIN, "argmin", TB_KIND_REDUCE, 1)                                                         \
    X(MATMUL, "matmul", TB_KIND_MATMUL, 2)                                                         \
    X(SOFTMAX, "softmax", TB_KIND_NORM, 1)                                                         \
    X(LOG_SOFTMAX, "log_softmax", TB_KIND_NORM, 1)                                                 \
    X(LAYER_NORM, "layer_norm", TB_KIND_NORM, -1)                                                  \
    X(RESHAPE, "reshape", TB_KIND_MOVEMENT, 1)                                                     \
    X(PERMUTE, "permute", TB_KIND_MOVEMENT, 1)                                                     \
    X(EXPAND, "expand", TB_KIND_MOVEMENT, 1)                                                       \
    X(SLICE, "slice", TB_KIND_MOVEMENT, 1)                                                         \
    X(FLIP, "flip", TB_KIND_MOVEMENT, 1)                                                           \
    X(CONCAT, "concat", TB_KIND_OTHER, -1)                                                         \
    X(PAD, "pad", TB_KIND_OTHER, 2)                                                                \
    X(GATHER, "gather", TB_KIND_OTHER, 2)                                                          \
    X(INDEX_SELECT, "index_select", TB_KIND_OTHER, 2)

/* An op id: a built-in TB_OP_* or an id returned by tb_op_register. */
typedef int32_t tb_op;

enum tb_op_id {
#define TB__OP_ENUM(e, name, kind, arity) TB_OP_##e,
    TB_OP_LIST(TB__OP_ENUM)
#undef TB__OP_ENUM
        TB_OP_BUILTIN_COUNT
};

#define TB_MAX_ATTRS 20 /* int64 attributes a node can carry */

/* The op's name ("add"), kind and number of operands (-1: variable). NULL / TB_KIND_INVALID / -1
   for an unknown op (no error is set). A custom op's name stays valid until tb_shutdown.
   Thread-safe. */
TBDEF const char *tb_op_name(tb_op op);
TBDEF tb_op_kind tb_op_get_kind(tb_op op);
TBDEF int32_t tb_op_arity(tb_op op);
/* Finds an op by name, built-in or custom. TB_ERR_NOT_FOUND when none; *out is untouched on
   error. Thread-safe. */
TBDEF tb_status tb_op_lookup(const char *name, tb_op *out);

/* ---- nodes ----
   Nodes are immutable once recorded and owned by the tensors that use them (refcounted inside
   the library). The accessors below read them; they are safe from any thread. A NULL node gives
   -1 / NULL / 0 (tb_node_scalar: TB_ERR_INVALID_ARGUMENT). */
TBDEF tb_op tb_node_op(const tb_node *node);
TBDEF const tb_shape *tb_node_shape(const tb_node *node);
TBDEF size_t tb_node_num_operands(const tb_node *node);
TBDEF const tb_node *tb_node_operand(const tb_node *node, size_t index); /* NULL out of range */
TBDEF size_t tb_node_num_attrs(const tb_node *node);
TBDEF int64_t tb_node_attr(const tb_node *node, size_t index); /* 0 out of range */
TBDEF double tb_node_fattr(const tb_node *node, size_t index); /* index 0 or 1; 0.0 otherwise */
/* The DAG hash: op, attributes, shape and the operands' hashes. Device data and scalar values
   never enter it: two graphs that differ only in data share one hash. */
TBDEF uint64_t tb_node_hash(const tb_node *node);
/* A process-unique id, increasing in creation order (for dumps). */
TBDEF uint64_t tb_node_id(const tb_node *node);
/* The data behind a DEVICE_DATA node (NULL for other ops). Borrowed. */
TBDEF tb_backend_data *tb_node_data(const tb_node *node);
/* The value of a SCALAR node. TB_ERR_INVALID_ARGUMENT for other ops. */
TBDEF tb_status tb_node_scalar(const tb_node *node, tb_scalar *out);

/* ---- custom ops ---- */

/* Output shape of a custom op from its inputs' shapes and the attributes. */
typedef tb_status (*tb_custom_shape_fn)(const tb_shape *inputs, size_t num_inputs,
                                        const int64_t *attrs, size_t num_attrs, tb_shape *out,
                                        void *user_data);
/* Reference implementation on contiguous host arrays (the output is allocated by the library). */
typedef tb_status (*tb_custom_reference_fn)(const void *const *inputs, const tb_shape *input_shapes,
                                            size_t num_inputs, void *output,
                                            const tb_shape *output_shape, const int64_t *attrs,
                                            size_t num_attrs, void *user_data);

typedef struct tb_custom_op_desc {
    const char *name;   /* an identifier, not a built-in op's name */
    int32_t num_inputs; /* 1..8 */
    /* NULL: the op is elementwise; the output is the broadcast of the inputs with the promoted
       dtype. */
    tb_custom_shape_fn infer_shape;
    tb_custom_reference_fn reference; /* required */
    /* (optional, elementwise ops only) an OpenCL C expression for one output element, in terms
       of x0, x1, ... (the inputs' elements, already converted to the output's type T, which is
       also defined), e.g. "x0 * x1 + (T)1". Ops without it fall back to the reference. */
    const char *opencl_expr;
    void *user_data;
} tb_custom_op_desc;

/* Registers a custom op and writes its id (TB_OP_BUILTIN_COUNT and up, in registration order)
   to *out. The name is checked as backend names are (1..TB_MAX_NAME bytes,
   [A-Za-z_][A-Za-z0-9_]*); num_inputs must be 1..8 and reference set (TB_ERR_INVALID_ARGUMENT).
   A name already registered or a built-in op's name is TB_ERR_DUPLICATE. The desc and its
   strings are copied. The op lives until tb_shutdown. Thread-safe. */
TBDEF tb_status tb_op_register(const tb_custom_op_desc *desc, tb_op *out);
/* The desc a custom op was registered with, as copied (NULL for built-ins and unknown ids; no
   error is set). Valid until tb_shutdown. Thread-safe. */
TBDEF const tb_custom_op_desc *tb_op_custom_desc(tb_op op);

/* ---- src/tensor.h ---- */
/* ===========================================================================================
   Lazy tensors, ops, executor, metrics
   Ownership: every function that returns a tb_tensor * returns a new reference that the caller
   releases with tb_tensor_release. Tensors given as arguments are borrowed (never consumed).
   A function given a NULL tensor returns NULL and keeps the first error, so a chain of ops can
   be checked once at the end.
   =========================================================================================== */

typedef struct tb_tensor tb_tensor;

/* ---- creation ---- */

/* A tensor holding a copy of the contiguous host array `data` (tb_shape_nbytes bytes) on
   `device` (NULL: the current device). The copy happens now. */
TBDEF tb_tensor *tb_tensor_from_host(const void *data, const tb_shape *shape,
                                     const tb_device *device);
/* Like tb_tensor_from_host, but on a device that shares host memory (the cpu backend) the
   tensor borrows `data` without copying: the caller keeps it alive and unchanged until the last
   reference to the tensor (and to tensors computed from it) is released. Other devices copy. */
TBDEF tb_tensor *tb_tensor_from_host_borrowed(const void *data, const tb_shape *shape,
                                              const tb_device *device);
/* A rank-0 tensor whose value is a parameter of the graph (changing it does not recompile).
   Used as an operand it follows PyTorch's rules for wrapped numbers: it does not promote a
   tensor of the same category (f32 tensor + f64 scalar stays f32). */
TBDEF tb_tensor *tb_scalar_tensor(tb_scalar value, const tb_device *device);
TBDEF tb_tensor *tb_full(const tb_shape *shape, double value, const tb_device *device);
TBDEF tb_tensor *tb_zeros(const tb_shape *shape, const tb_device *device);
TBDEF tb_tensor *tb_ones(const tb_shape *shape, const tb_device *device);
/* [start, end) by step as PyTorch's arange; step 0 or a count that overflows is an error. */
TBDEF tb_tensor *tb_arange(double start, double end, double step, tb_dtype dtype,
                           const tb_device *device);
/* n x m identity (m = n when m < 0). */
TBDEF tb_tensor *tb_eye(int64_t n, int64_t m, tb_dtype dtype, const tb_device *device);
/* Uniform [0, 1) and standard normal, f32 or f64, from the Philox 4x32-10 stream of the current
   seed (tb_manual_seed; 67280421310721, PyTorch's default, until then). Every backend gives the
   same values for the same seed, call order and shape. The algorithm, exactly:
   each call takes the global offset and advances it by ceil(numel / 2). block(c) is the four
   32-bit words w[0..3] of Random123's philox4x32_10 with counter (c mod 2^64 low word, high
   word, 0, 0) and key (seed low word, seed high word); U53(a, b) = ((a << 21) | (b >> 11)) * 2^-53
   (64-bit integer, then exact scaling, in double). For element i in row-major order:
     rand f32:  value = (float)(block(offset + i/4)[i % 4] >> 8) * 2^-24
     rand f64:  w = block(offset + i/2); value = U53(w[2*(i%2)], w[2*(i%2) + 1])
     randn:     w = block(offset + i/2); u1 = U53(w[0], w[1]); u2 = U53(w[2], w[3]);
                r = sqrt(-2.0 * log(1.0 - u1)); t = 6.283185307179586 * u2;
                value = (i even ? r * cos(t) : r * sin(t)), computed in double, then rounded to
                the dtype (also for f32).
   rand is integer arithmetic and exact scaling: every backend gives identical bits. randn needs
   double precision (a device without fp64 runs it on the reference backend) and its bits agree
   with the host's wherever the device's log, cos and sin agree with the C library's: always for
   the correctly rounded steps, and for f32 results unless a double lands within one ulp of an
   f32 rounding boundary. */
TBDEF tb_tensor *tb_rand(const tb_shape *shape, const tb_device *device);
TBDEF tb_tensor *tb_randn(const tb_shape *shape, const tb_device *device);
/* Sets the seed and resets the offset to 0; calls every registered backend's set_rng_seed
   (a backend registered later is not called). All or nothing: on an error (memory ran out
   while the library or its built-in backends were set up) neither the seed nor any backend
   changed. tb_shutdown restores the default seed. Thread-safe. */
TBDEF tb_status tb_manual_seed(uint64_t seed);

/* ---- handles ----
   A tensor holds either a pending graph (its IR node) or a materialised value (backend data);
   a sync turns the first into the second. A tensor may be read from several threads; recording
   ops on it or syncing it from several threads at once needs the caller's lock. */
/* Adds a reference and returns its argument (NULL is returned as is). Thread-safe. */
TBDEF tb_tensor *tb_tensor_retain(tb_tensor *tensor);
/* Drops a reference; the last one frees the tensor. NULL is ignored. Thread-safe. */
TBDEF void tb_tensor_release(tb_tensor *tensor);
/* The shape and device (never syncs). NULL tensor: a zero shape / zero device. */
TBDEF tb_shape tb_tensor_shape(const tb_tensor *tensor);
TBDEF tb_device tb_tensor_device(const tb_tensor *tensor);
/* The pending IR node (NULL once the value is materialised and no graph is pending). */
TBDEF const tb_node *tb_tensor_node(const tb_tensor *tensor);
/* The backend data holding the value, syncing first if needed. Borrowed: valid while the
   tensor lives. NULL on error. */
TBDEF tb_backend_data *tb_tensor_data(tb_tensor *tensor);
/* Copies the value to the contiguous host array `dst` of `size` bytes, which must be exactly
   tb_shape_nbytes ("tb_tensor_to_host: size is 10 bytes but f32[2,3] needs 24"). Syncs the
   tensor first if its value is pending; a failed sync leaves the graph pending. */
TBDEF tb_status tb_tensor_to_host(tb_tensor *tensor, void *dst, size_t size);
/* A new tensor with the same value on `device` (NULL: the current device): syncs, then copies
   through the host. On the tensor's own device the new tensor shares the value. */
TBDEF tb_tensor *tb_to_device(tb_tensor *tensor, const tb_device *device);
/* The value of a one-element tensor as a double (syncs). TB_ERR_SHAPE for other sizes. */
TBDEF tb_status tb_tensor_item(tb_tensor *tensor, double *out);

/* ---- executor ----
   A graph's computation is cached under a structural hash: ops, attributes, shapes, how the
   nodes connect (x + x differs from x + y) and which leaves are parameters. Data and scalar
   values are parameters, so a step repeated with new values compiles once (UncachedCompile 1,
   CachedCompile for the rest). A node the backend does not support (supports_node) runs on the
   reference interpreter first, its operands synced as a graph of their own, and enters the
   graph as a parameter (counter Fallback::<op>). Recording an op whose pending graph then
   computes more than desc.max_graph_nodes nodes syncs that tensor at once; graphs that reuse
   subgraphs heavily may be synced from half that size. On any error the tensors keep their
   pending graphs and nothing leaks. TB_DEBUG=1 logs one line per graph run:
   "graph <hash> nodes=N params=P results=R device=D cache=hit|miss compile=Xms run=Yms";
   TB_DEBUG=3 also logs the IR before compiling. */

/* Runs the pending graphs of these tensors as ONE computation on their device (LTC
   SyncTensorsGraph): collect the distinct pending nodes, walk them in post-order (iteratively:
   graphs of any depth), hash, look up the LRU computation cache (desc.cache_size entries),
   lower and compile on a miss, execute, and give each tensor its value. Tensors without a
   pending graph are skipped; all pending ones must be on one device ("tb_sync: tensors on
   cpu:0 and opencl:0 cannot be one graph"). Not thread-safe with other calls on the same
   tensors. */
TBDEF tb_status tb_sync(tb_tensor *const *tensors, size_t count);
/* LTC MarkStep: syncs every live tensor that has a pending graph, one graph per device, and
   counts MarkStep. Returns the first error (the other devices still run). Call it while no
   other thread records ops or syncs. */
TBDEF tb_status tb_mark_step(void);
/* Drops every cached computation (backends release them once no sync uses them). Thread-safe. */
TBDEF void tb_computation_cache_clear(void);
/* The computations in the cache. Thread-safe. */
TBDEF size_t tb_computation_cache_size(void);

/* ---- dumps (free the strings with tb_free; NULL on error) ----
   The graph behind the tensors (their pending graphs, or their values as device data), never
   syncing. Nodes are numbered in post-order. */
/* One line per node:
       %0 = device_data f32[2,3] (param 0)
       %1 = scalar f32[] (param 1, value 2)
       %2 = mul(%0, %1) f32[2,3] (result 0)
       %3 = sum(%2) f32[] attrs=[3, 0] (result 1)
   "(result i)" marks the node of tensors[i] (a node may carry several); values
   computed by the eager fallback show as "(param i, computed apart)". The tensors may be on
   different devices. */
TBDEF char *tb_ir_text(tb_tensor *const *tensors, size_t count);
/* Graphviz DOT of the same graph: one box per node labelled with its number, op and shape,
   an edge per operand (fused kernels as clusters where a backend groups nodes). */
TBDEF char *tb_ir_dot(tb_tensor *const *tensors, size_t count);
/* The backend's own text of the computation a sync of these tensors would run (e.g. OpenCL C),
   "" for a backend without one or when nothing is pending. Compiles it into the computation
   cache if needed; executes nothing (nodes the backend does not support count as parameters,
   as they will after the eager fallback). */
TBDEF char *tb_ir_backend_text(tb_tensor *const *tensors, size_t count);

/* ---- metrics (LTC names) ----
   Counters: CachedCompile, UncachedCompile, MarkStep, CreateDataHandles, Fallback::<op>, and any a
   backend adds. Timings (ns): CompileTime, ExecuteTime, TransferToDeviceTime,
   TransferFromDeviceTime. Sizes: TensorsGraphSize (nodes per synced graph). Thread-safe. */
/* The report in LTC's format, metrics then counters, each sorted by name:
       Metric: CompileTime
         TotalSamples: 2
         Accumulator: 12.345ms
         Mean: 6.173ms
         Min: 1.000ms
         Max: 11.345ms
         Percentiles: 1%=1.000ms; 5%=1.000ms; ...; 99%=11.345ms
       Counter: CachedCompile
         Value: 99
   Metrics whose names end in "Time" hold nanoseconds and show with units (ns, us, ms, s); the
   percentiles are over the latest 64 samples. Free with tb_free. */
TBDEF char *tb_metrics_report(void);
/* A counter's value, or for a metric its number of samples; 0 if it never fired. */
TBDEF int64_t tb_metrics_counter(const char *name);
/* A metric's sum of samples (ns for times), or a counter's value; 0 if it never fired. */
TBDEF double tb_metrics_total(const char *name);
/* Forgets every counter and metric. */
TBDEF void tb_metrics_reset(void);
/* Adds to a counter (for backends). Names are 1..255 bytes. */
TBDEF void tb_metrics_add(const char *name, int64_t delta);
/* Records a sample of a metric (for backends); NaN is refused. */
TBDEF void tb_metrics_sample(const char *name, double value);

/* ---- ops ----
   Each records a node and returns a new tensor; nothing is computed until a sync. Operands must
   be on the same device (rank-0 tensors from tb_scalar_tensor excepted). Errors name the op and the
   shapes. */

/* unary (float ops on integer inputs compute in f32, as PyTorch) */
TBDEF tb_tensor *tb_neg(tb_tensor *x);
TBDEF tb_tensor *tb_abs(tb_tensor *x);
TBDEF tb_tensor *tb_exp(tb_tensor *x);
TBDEF tb_tensor *tb_log(tb_tensor *x);
TBDEF tb_tensor *tb_sqrt(tb_tensor *x);
TBDEF tb_tensor *tb_rsqrt(tb_tensor *x);
TBDEF tb_tensor *tb_sin(tb_tensor *x);
TBDEF tb_tensor *tb_cos(tb_tensor *x);
TBDEF tb_tensor *tb_tanh(tb_tensor *x);
TBDEF tb_tensor *tb_sigmoid(tb_tensor *x);
TBDEF tb_tensor *tb_relu(tb_tensor *x);
TBDEF tb_tensor *tb_gelu(tb_tensor *x); /* the exact (erf) form */
TBDEF tb_tensor *tb_silu(tb_tensor *x);
TBDEF tb_tensor *tb_reciprocal(tb_tensor *x);
TBDEF tb_tensor *tb_floor(tb_tensor *x);
TBDEF tb_tensor *tb_ceil(tb_tensor *x);
TBDEF tb_tensor *tb_round(tb_tensor *x); /* half to even, as PyTorch */
TBDEF tb_tensor *tb_sign(tb_tensor *x);
TBDEF tb_tensor *tb_logical_not(tb_tensor *x);
TBDEF tb_tensor *tb_cast(tb_tensor *x, tb_dtype dtype);

/* binary, with broadcasting and PyTorch's type promotion (div of integers gives f32;
   comparisons and logical ops give bool) */
TBDEF tb_tensor *tb_add(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_sub(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_mul(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_div(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_pow(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_maximum(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_minimum(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_eq(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_ne(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_lt(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_le(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_gt(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_ge(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_logical_and(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_logical_or(tb_tensor *a, tb_tensor *b);
/* with a host number (a SCALAR parameter: new values do not recompile) */
TBDEF tb_tensor *tb_add_scalar(tb_tensor *a, double b);
TBDEF tb_tensor *tb_sub_scalar(tb_tensor *a, double b);
TBDEF tb_tensor *tb_mul_scalar(tb_tensor *a, double b);
TBDEF tb_tensor *tb_div_scalar(tb_tensor *a, double b);
TBDEF tb_tensor *tb_pow_scalar(tb_tensor *a, double b);
/* cond ? a : b, broadcasting all three; cond must be bool */
TBDEF tb_tensor *tb_where(tb_tensor *cond, tb_tensor *a, tb_tensor *b);
/* min(max(x, lo), hi) with host bounds (parameters) */
TBDEF tb_tensor *tb_clamp(tb_tensor *x, double lo, double hi);

/* reductions over `axes` (negative counts from the end; num_axes 0: all axes) */
TBDEF tb_tensor *tb_sum(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim);
TBDEF tb_tensor *tb_mean(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim);
TBDEF tb_tensor *tb_max(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim);
TBDEF tb_tensor *tb_min(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim);
TBDEF tb_tensor *tb_prod(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim);
/* index (i64) of the first max/min along `axis`; of the flattened tensor when flatten is true */
TBDEF tb_tensor *tb_argmax(tb_tensor *x, int32_t axis, bool keepdim);
TBDEF tb_tensor *tb_argmin(tb_tensor *x, int32_t axis, bool keepdim);

/* PyTorch's matmul: 1-D x 1-D dot, 2-D x 2-D, 1-D promoted and removed, batched with
   broadcasting of the batch dims */
TBDEF tb_tensor *tb_matmul(tb_tensor *a, tb_tensor *b);
TBDEF tb_tensor *tb_softmax(tb_tensor *x, int32_t axis);
TBDEF tb_tensor *tb_log_softmax(tb_tensor *x, int32_t axis);
/* over the last `normalized_ndim` dims; weight and bias may be NULL (else of those dims) */
TBDEF tb_tensor *tb_layer_norm(tb_tensor *x, int32_t normalized_ndim, tb_tensor *weight,
                               tb_tensor *bias, double eps);

/* movement (views: never copies) */
/* one dim may be -1 (inferred) */
TBDEF tb_tensor *tb_reshape(tb_tensor *x, const int64_t *dims, int32_t rank);
TBDEF tb_tensor *tb_permute(tb_tensor *x, const int32_t *perm, int32_t rank);
TBDEF tb_tensor *tb_transpose(tb_tensor *x, int32_t dim0, int32_t dim1);
/* dims of -1 keep the input's size; new leading dims may be added */
TBDEF tb_tensor *tb_expand(tb_tensor *x, const int64_t *dims, int32_t rank);
/* removes dim `dim` (must be size 1) */
TBDEF tb_tensor *tb_squeeze(tb_tensor *x, int32_t dim);
TBDEF tb_tensor *tb_unsqueeze(tb_tensor *x, int32_t dim);
/* Python slicing x[start:end:step] on `dim` (negative start/end count from the end and are
   clamped, step >= 1) */
TBDEF tb_tensor *tb_slice(tb_tensor *x, int32_t dim, int64_t start, int64_t end, int64_t step);
TBDEF tb_tensor *tb_flip(tb_tensor *x, const int32_t *dims, size_t num_dims);
/* copies (new arrays) */
TBDEF tb_tensor *tb_concat(tb_tensor *const *tensors, size_t count, int32_t dim);
/* torch.nn.functional.pad's constant mode: pads = (before_last, after_last, before_2nd_last, ...),
   2*num_dims values, non-negative */
TBDEF tb_tensor *tb_pad(tb_tensor *x, const int64_t *pads, size_t num_pads, double value);
/* torch.gather: index (i32/i64) of the same rank as x */
TBDEF tb_tensor *tb_gather(tb_tensor *x, int32_t dim, tb_tensor *index);
/* torch.index_select: index 1-D (i32/i64) */
TBDEF tb_tensor *tb_index_select(tb_tensor *x, int32_t dim, tb_tensor *index);

/* A custom op (tb_op_register) or any built-in by id with explicit attributes. */
TBDEF tb_tensor *tb_call_op(tb_op op, tb_tensor *const *inputs, size_t num_inputs,
                            const int64_t *attrs, size_t num_attrs);

/* ---- src/print.h ---- */
/* ===========================================================================================
   Printing tensors
   The layout is PyTorch's repr with its default print options (precision 4, line width 80,
   summarised past 1000 elements with 3 edge items), followed by the device and the dtype:
       tensor([[ 1.0000, -2.5000],
               [ 3.0000,  4.0000]], device='cpu:0', dtype=f32)
       tensor([0, 1, 2,  ..., 7, 8, 9], device='cpu:0', dtype=i64)
       tensor([], size=(0, 3), device='cpu:0', dtype=bool)
   Floats print as PyTorch chooses: fixed point with 4 decimals, integers as "1.", or
   scientific ("1.0000e+09") when the magnitudes span more than 1000x, pass 1e8 or fall below
   1e-4; integers in full; bool as True/False.
   =========================================================================================== */

/* Writes the text of the tensor's value (see above) into `buf` like snprintf: at most `cap`
   bytes including the terminating NUL, and *needed (may be NULL) is the length of the whole
   text without the NUL, so the text was cut when *needed >= cap. `buf` may be NULL when `cap`
   is 0 (ask for the length first, then allocate *needed + 1). Syncs this tensor only (its
   pending graph, as tb_tensor_to_host does) and copies its value to the host.
   Errors: NULL tensor (a NULL tensor from a failed op keeps that op's error), NULL buf with
   cap > 0, a failed sync, out of memory; on error *needed is 0 and buf (if cap > 0) holds "".
   Not thread-safe with other calls that record ops on or sync the same tensor. */
TBDEF tb_status tb_tensor_format(tb_tensor *tensor, char *buf, size_t cap, size_t *needed);
/* Prints the text of tb_tensor_format and a newline to the C library's stdout (a log hook does
   not see it). Errors as tb_tensor_format, and TB_ERR_IO when stdout cannot be written. Thread
   safety as tb_tensor_format; lines printed from several threads may interleave. */
TBDEF tb_status tb_tensor_print(tb_tensor *tensor);

/* ---- src/opencl.h ---- */
/* ===========================================================================================
   OpenCL backend: availability and native objects
   The "opencl" backend is registered by default (unless built with TB_NO_OPENCL) and used
   through the generic API (tb_device_make("opencl", 0, &dev), tb_set_backend("opencl"), ...).
   These functions reach below it, for programs that mix their own OpenCL code with the library.
   OpenCL objects are given as void * (cast them to cl_platform_id, cl_context, cl_mem, ...):
   no OpenCL type appears in this header and no SDK is needed to include it.
   Environment: TB_OPENCL_LIBRARY (the ICD loader to open, default libOpenCL.so.1; not used
   when built with TB_OPENCL_LINKED),
   TB_OPENCL_BUILD_OPTIONS (appended to the options every program is built with, e.g.
   "-cl-mad-enable"; part of the program cache key), TB_CACHE_DIR (the program binary cache,
   default $XDG_CACHE_HOME/torch_backend or ~/.cache/torch_backend, created 0700; a folder
   others may write to is not used; "off" disables it).
   =========================================================================================== */

/* The OpenCL objects behind one device of the "opencl" backend. They are owned by the library:
   do not release them; they stay valid until tb_shutdown. */
typedef struct tb_opencl_native {
    void *platform; /* cl_platform_id */
    void *device;   /* cl_device_id */
    void *context;  /* cl_context: this device only */
    void *queue;    /* cl_command_queue: in order, profiling enabled; the library's kernels for
                       this device run on it, so work enqueued there is ordered with them */
} tb_opencl_native;

/* TB_OK when the OpenCL backend can run here: the ICD loader (libOpenCL.so.1, or
   $TB_OPENCL_LIBRARY) opens, exports every entry point the backend uses, and lists at least
   one usable device. Otherwise TB_ERR_UNAVAILABLE with the reason in tb_last_error(), e.g.
   "opencl: cannot open libOpenCL.so.1: ...". Built with TB_NO_OPENCL: TB_ERR_UNSUPPORTED.
   The answer is decided at the first use after each setup. Thread-safe. */
TBDEF tb_status tb_opencl_available(void);

/* Fills *out with the native objects of `device`, an "opencl" device (NULL: the backend's
   default device), creating its context and queue if needed. Errors: a device of another
   backend or out of range (TB_ERR_INVALID_ARGUMENT / TB_ERR_NOT_FOUND), the backend unavailable
   (TB_ERR_UNAVAILABLE with the reason); *out is untouched on error. Thread-safe. */
TBDEF tb_status tb_opencl_native_device(const tb_device *device, tb_opencl_native *out);

/* The cl_mem holding a tensor's value, syncing the tensor first; *size gets the value's size
   in bytes (the buffer may be larger). The buffer stays owned by the tensor and holds this
   value as long as the tensor does: read or write it on the device's queue
   (tb_opencl_native_device). Errors: NULL arguments, a tensor that is not on an "opencl"
   device. Not thread-safe with other calls on the same tensor. */
TBDEF tb_status tb_opencl_tensor_buffer(tb_tensor *tensor, void **mem, size_t *size);

/* Releases the device memory that the caching allocator keeps for reuse on `device` (NULL:
   every opencl device). Memory in use by tensors is not touched. Thread-safe. */
TBDEF tb_status tb_opencl_trim_cache(const tb_device *device);

/* ---- src/interop.h ---- */
/* ===========================================================================================
   Interop: .npy files
   =========================================================================================== */

/* Reads a .npy file (format 1.0 to 3.0, C order, f4 f8 i4 i8 u1 b1, little or big endian) into a
   new tensor on `device` (NULL: current). Fortran order, other dtypes, truncated files, headers
   that lie and shapes that overflow are TB_ERR_FORMAT with the reason. */
TBDEF tb_tensor *tb_npy_load(const char *path, const tb_device *device);
/* Writes the tensor's value (syncing it) as .npy 1.0 (2.0 if the header needs it), through a
   temporary file and a rename. */
TBDEF tb_status tb_npy_save(const char *path, tb_tensor *tensor);

/* ===========================================================================================
   Interop: DLPack
   The structs below are the C ABI of DLPack (github.com/dmlc/dlpack), field for field and value
   for value, under this library's prefix: tb_dl_managed_tensor is DLPack's DLManagedTensor
   (v0.8, what numpy's and PyTorch's __dlpack__ capsules named "dltensor" hold) and
   tb_dl_managed_tensor_versioned is DLManagedTensorVersioned (v1.0 and later), so a pointer to
   one may be cast to the other library's type and back.
   =========================================================================================== */

#define TB_DLPACK_VERSION       80 /* DLPack's DLPACK_VERSION of tb_dl_managed_tensor (v0.8) */
#define TB_DLPACK_ABI_VERSION   1  /* DLPack's DLPACK_ABI_VERSION of the same */
#define TB_DLPACK_MAJOR_VERSION 1  /* the version written into tb_dl_managed_tensor_versioned */
#define TB_DLPACK_MINOR_VERSION 0
/* tb_dl_managed_tensor_versioned.flags (DLPACK_FLAG_BITMASK_READ_ONLY, _IS_COPIED) */
#define TB_DLPACK_FLAG_READ_ONLY ((uint64_t)1 << 0)
#define TB_DLPACK_FLAG_IS_COPIED ((uint64_t)1 << 1)

/* DLDeviceType (kDLCPU = 1, kDLCUDA = 2, ...). */
typedef enum tb_dl_device_type {
    TB_DL_CPU = 1,
    TB_DL_CUDA = 2,
    TB_DL_CUDA_HOST = 3,
    TB_DL_OPENCL = 4,
    TB_DL_VULKAN = 7,
    TB_DL_METAL = 8,
    TB_DL_VPI = 9,
    TB_DL_ROCM = 10,
    TB_DL_ROCM_HOST = 11,
    TB_DL_EXT_DEV = 12,
    TB_DL_CUDA_MANAGED = 13,
    TB_DL_ONEAPI = 14,
    TB_DL_WEBGPU = 15,
    TB_DL_HEXAGON = 16
} tb_dl_device_type;

/* DLDataTypeCode (kDLInt = 0, kDLUInt = 1, kDLFloat = 2, ...). */
typedef enum tb_dl_data_type_code {
    TB_DL_INT = 0,
    TB_DL_UINT = 1,
    TB_DL_FLOAT = 2,
    TB_DL_OPAQUE_HANDLE = 3,
    TB_DL_BFLOAT = 4,
    TB_DL_COMPLEX = 5,
    TB_DL_BOOL = 6
} tb_dl_data_type_code;

/* DLDevice. device_type holds a tb_dl_device_type (4 bytes, as DLPack's enum). */
typedef struct tb_dl_device {
    int32_t device_type;
    int32_t device_id;
} tb_dl_device;

/* DLDataType: code (a tb_dl_data_type_code), bits per lane, lanes. The library's dtypes are
   f32 (FLOAT, 32), f64 (FLOAT, 64), i32 (INT, 32), i64 (INT, 64), u8 (UINT, 8) and bool
   (BOOL, 8, one byte per element as numpy and PyTorch store it), all with lanes 1. */
typedef struct tb_dl_data_type {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} tb_dl_data_type;

/* DLTensor. shape and strides have ndim entries; strides count elements, not bytes, and NULL
   strides mean C-contiguous. The first element is at (char *)data + byte_offset. */
typedef struct tb_dl_tensor {
    void *data;
    tb_dl_device device;
    int32_t ndim;
    tb_dl_data_type dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} tb_dl_tensor;

/* DLManagedTensor: the consumer calls deleter(self) once when it no longer needs the tensor
   (deleter may be NULL: nothing to release). */
typedef struct tb_dl_managed_tensor {
    tb_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct tb_dl_managed_tensor *self);
} tb_dl_managed_tensor;

/* DLPackVersion and DLManagedTensorVersioned. */
typedef struct tb_dl_pack_version {
    uint32_t major;
    uint32_t minor;
} tb_dl_pack_version;

typedef struct tb_dl_managed_tensor_versioned {
    tb_dl_pack_version version;
    void *manager_ctx;
    void (*deleter)(struct tb_dl_managed_tensor_versioned *self);
    uint64_t flags; /* TB_DLPACK_FLAG_* */
    tb_dl_tensor dl_tensor;
} tb_dl_managed_tensor_versioned;

/* Hands the tensor's value to a DLPack consumer. Syncs the tensor first. On a device that
   shares host memory (the cpu backend) nothing is copied: the managed tensor points at the
   tensor's own buffer and holds a reference to that buffer (the tensor's backend data), so the
   tensor may be released first. On any other device the value is copied to a new host buffer
   that the deleter frees. Either way the device is {TB_DL_CPU, 0} (the consumer gets host
   memory), byte_offset is 0, and shape and strides (always set, in elements, C order) live in
   the managed tensor. The consumer must not write through `data` (a tensor's value never
   changes) and calls deleter(*out) exactly once, from any thread, before tb_shutdown. Errors:
   NULL arguments (a NULL tensor keeps the error of the op that produced it), a failed sync, out
   of memory; *out is untouched on error. Not thread-safe with other calls on the same tensor.
   Python: wrap *out in a PyCapsule named "dltensor" to hand it to numpy.from_dlpack and the
   like (tests/dlpack_numpy.py shows it through ctypes). */
TBDEF tb_status tb_dlpack_export(tb_tensor *tensor, tb_dl_managed_tensor **out);

/* A new tensor on `device` (NULL: the current device) holding the value of a DLPack tensor.
   Accepted: device type TB_DL_CPU (host memory), lanes 1, the library's six dtypes (see
   tb_dl_data_type), ndim 0..TB_MAX_RANK, non-negative dims, any strides (NULL: C-contiguous)
   and byte_offset. On success the library owns `managed`:
     - on a device that shares host memory (the cpu backend), a C-contiguous, suitably aligned
       tensor (and, for bool, one holding only 0 and 1 bytes) is used in place, without a copy;
       managed->deleter runs exactly once, when the last reference to the buffer is dropped
       (possibly on another thread): the tensors using it, pending graphs that read it, and a
       cached computation compiled with it as an input (tb_computation_cache_clear drops
       those). The producer must keep the data alive and unchanged until then.
     - otherwise the value is copied (strided tensors into C order) and managed->deleter runs
       before this function returns.
   On ANY error NULL is returned, the deleter is not called and the caller still owns
   `managed` (it may call the deleter itself). Errors: NULL `managed`, a device type other than
   TB_DL_CPU ("tb_dlpack_import: device type 2 (CUDA) is not supported; only CPU (1) memory"),
   an unsupported dtype or lanes != 1 (TB_ERR_DTYPE), ndim outside 0..8 or negative dims
   (TB_ERR_SHAPE), a NULL data pointer for a non-empty tensor, sizes that overflow. */
TBDEF tb_tensor *tb_dlpack_import(tb_dl_managed_tensor *managed, const tb_device *device);

/* tb_dlpack_export with the versioned struct: version {TB_DLPACK_MAJOR_VERSION,
   TB_DLPACK_MINOR_VERSION}; flags TB_DLPACK_FLAG_READ_ONLY when the buffer is the tensor's own,
   TB_DLPACK_FLAG_IS_COPIED when it is a copy the consumer may write to. */
TBDEF tb_status tb_dlpack_export_versioned(tb_tensor *tensor, tb_dl_managed_tensor_versioned **out);
/* tb_dlpack_import with the versioned struct. A major version other than
   TB_DLPACK_MAJOR_VERSION is TB_ERR_UNSUPPORTED (the deleter is not called: DLPack allows the
   caller to call it). The flags need no action: the library never writes to the buffer. */
TBDEF tb_tensor *tb_dlpack_import_versioned(tb_dl_managed_tensor_versioned *managed,
                                            const tb_device *device);

/* ---- src/files.h ---- */
/* ===========================================================================================
   Model files: tensor sets, safetensors and .npz
   A tensor set is an ordered list of named tensors (what a model file holds) plus string
   metadata (safetensors' "__metadata__"). Names are unique, non-empty and at most
   TB_TENSOR_SET_MAX_NAME bytes; any bytes but NUL are allowed (safetensors needs UTF-8).
   Ownership: the set holds one reference to each tensor it lists and copies every string it is
   given; tb_tensor_set_free drops them. A tensor or string read from a set is borrowed: valid
   while the set lives, or longer if the caller retains the tensor (tb_tensor_retain).
   Thread safety: a set may be read from several threads; changing it (add, set_metadata, free)
   needs the caller's lock against every other use of the same set.
   =========================================================================================== */

#define TB_TENSOR_SET_MAX_NAME 4096 /* longest tensor name or metadata key, in bytes */

typedef struct tb_tensor_set tb_tensor_set;

/* A new, empty set; free it with tb_tensor_set_free. NULL only when out of memory. */
TBDEF tb_tensor_set *tb_tensor_set_new(void);
/* Releases the set's references and strings, then the set. NULL is ignored. Tensors loaded from
   a file that the caller retained stay valid (a memory-mapped file stays mapped until the last
   tensor using it is released). */
TBDEF void tb_tensor_set_free(tb_tensor_set *set);
/* Appends `tensor` under `name` (copied) and retains it; the caller keeps its own reference.
   Errors: NULL set, name or tensor (a NULL tensor from a failed op keeps that op's error), an
   empty name or one longer than TB_TENSOR_SET_MAX_NAME (TB_ERR_INVALID_ARGUMENT), a name
   already in the set (TB_ERR_DUPLICATE), out of memory. On error the set is unchanged. */
TBDEF tb_status tb_tensor_set_add(tb_tensor_set *set, const char *name, tb_tensor *tensor);
/* The number of tensors (0 for NULL). */
TBDEF size_t tb_tensor_set_count(const tb_tensor_set *set);
/* The name / the tensor at `index` (in the order added or stored in the file), borrowed. NULL
   and TB_ERR_INVALID_ARGUMENT for a NULL set or an index past the end. */
TBDEF const char *tb_tensor_set_name(const tb_tensor_set *set, size_t index);
TBDEF tb_tensor *tb_tensor_set_tensor(const tb_tensor_set *set, size_t index);
/* The tensor named `name`, borrowed; NULL and TB_ERR_NOT_FOUND (the message lists some of the
   names the set has) when there is none. */
TBDEF tb_tensor *tb_tensor_set_get(const tb_tensor_set *set, const char *name);
/* Sets metadata `key` to `value` (both copied), replacing an earlier value of the key. Errors:
   NULL arguments, an empty key or one longer than TB_TENSOR_SET_MAX_NAME, out of memory. */
TBDEF tb_status tb_tensor_set_set_metadata(tb_tensor_set *set, const char *key, const char *value);
/* The value of metadata `key`, borrowed; NULL (TB_ERR_NOT_FOUND) when the key is not set. */
TBDEF const char *tb_tensor_set_metadata(const tb_tensor_set *set, const char *key);
/* The number of metadata entries, and the key at `index` (borrowed; NULL past the end). */
TBDEF size_t tb_tensor_set_metadata_count(const tb_tensor_set *set);
TBDEF const char *tb_tensor_set_metadata_key(const tb_tensor_set *set, size_t index);

/* Reads a safetensors file (github.com/huggingface/safetensors: an 8-byte little-endian header
   length, a JSON header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, optional
   "__metadata__": {string: string}}, then the data) into a new set on `device` (NULL: the
   current device), tensors in the header's order. Dtypes F32 F64 I32 I64 U8 BOOL load as
   f32 f64 i32 i64 u8 bool; F16 and BF16 load widened to f32 (exactly: every value is kept).
   The file is memory-mapped; on a device that shares host memory (the cpu backend) each
   suitably aligned tensor uses the mapping in place, without a copy, and the mapping lives
   until the last such tensor is released (the set may be freed first). Do not truncate or
   rewrite the file in place while those tensors live (replacing it, as tb_safetensors_save
   does through a rename, is safe). Other devices get copies and the file is closed on return.
   The whole file is checked before any tensor is made, as the reference implementation does:
   errors are TB_ERR_IO / TB_ERR_NOT_FOUND (cannot open or read), TB_ERR_FORMAT with the reason
   (a header length past the end of the file or above 100 MB, bad JSON or UTF-8, nesting
   deeper than 64, a duplicate name or key, missing or mistyped fields, offsets that are out of
   range, overlap, leave gaps or do not match the dtype and shape), TB_ERR_DTYPE (a dtype the
   library does not have, e.g. I16), TB_ERR_UNSUPPORTED (more than TB_MAX_RANK dims). No
   allocation is larger than the file. On error NULL is returned and nothing stays mapped.
   Thread-safe with other loads. */
TBDEF tb_tensor_set *tb_safetensors_load(const char *path, const tb_device *device);
/* Writes the set as a safetensors file (through a temporary file and a rename): the metadata
   as "__metadata__", each tensor's value (syncing the pending ones, one graph per device)
   with its dtype (F32 F64 I32 I64 U8 BOOL). Data are laid out 8-byte types first, so that
   every tensor starts aligned for its dtype (as the reference writer does). Errors: NULL
   arguments, a name or metadata string that is not valid UTF-8 or a tensor named
   "__metadata__" (TB_ERR_INVALID_ARGUMENT), a failed sync, TB_ERR_IO. Not thread-safe with
   changes to the set or ops on its tensors. */
TBDEF tb_status tb_safetensors_save(const char *path, const tb_tensor_set *set);

/* Reads a NumPy .npz file (a zip of .npy files, what numpy.savez and numpy.savez_compressed
   write) into a new set on `device` (NULL: current), one tensor per "<name>.npy" entry in the
   zip's order, named without ".npy". Entries may be stored or deflated (inflated by the
   library itself, no zlib needed) and may use zip64; CRC-32s are checked. Each .npy holds
   what tb_npy_load accepts (f4 f8 i4 i8 u1 b1, C order). Stored entries in a memory-mapped
   file are used in place on the cpu backend where aligned, as in tb_safetensors_load. Errors:
   TB_ERR_IO / TB_ERR_NOT_FOUND, TB_ERR_FORMAT with the reason (no end of central directory,
   a central directory or entry outside the file, overlapping entries, names that differ
   between the directory and the entry, an entry not ending in ".npy", duplicate names,
   encryption, a compression other than stored or deflate, a size that deflate cannot produce
   from the compressed size, corrupt deflate data, a CRC mismatch, a malformed .npy), and the
   errors of tb_npy_load for an entry's dtype. No allocation is larger than the file, or for a
   deflated entry than its claimed size (at most 1032 times its compressed size, deflate's
   limit). On error NULL is returned. Thread-safe with other loads. */
TBDEF tb_tensor_set *tb_npz_load(const char *path, const tb_device *device);
/* Writes the set as an .npz (stored entries "<name>.npy", zip64 where sizes need it) through
   a temporary file and a rename; numpy.load reads it. The metadata is not written (.npz has no
   place for it). Errors: NULL arguments, a name holding '/' or '\\' (TB_ERR_INVALID_ARGUMENT:
   numpy would read it as a folder), a failed sync, TB_ERR_IO. Thread safety as
   tb_safetensors_save. */
TBDEF tb_status tb_npz_save(const char *path, const tb_tensor_set *set);

/* ---- src/header_end.h ---- */
#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TORCH_BACKEND_H */

/* ---- src/impl_begin.h ---- */
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
#if !defined(TB_NO_PLUGINS) || !defined(TB_NO_OPENCL)
#include <dlfcn.h>
#endif
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
static char *tb__format(const char *fmt, ...) TB_PRINTF_LIKE(1, 2); /* allocated */
static tb_status tb__error(tb_status status, const char *fmt, ...) TB_PRINTF_LIKE(2, 3);
static void tb__mutex_lock(tb__mutex *m);
static void tb__mutex_unlock(tb__mutex *m);
static void tb__ensure_setup(void);              /* implicit setup with a zero desc */
static const tb_desc *tb__desc(void);            /* the effective desc (defaults filled) */
static const char *tb__getenv(const char *name); /* NULL when unset or empty */
static uint64_t tb__now_ns(void);                /* monotonic clock */
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
/* teardown hooks of later layers, called by tb_shutdown in reverse layer order */
static void tb__registry_shutdown(void);
static void tb__ir_shutdown(void);
static void tb__metrics_shutdown(void);
static void tb__executor_shutdown(void);

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
/* writes one element of `dtype` holding the value (C conversions; out-of-range floats saturate) */
static void tb__scalar_store(tb_scalar value, tb_dtype dtype, void *out);

/* backend.c: backend data and the registry */
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
/* a cpu data using `host` in place (no copy); NULL without an error when the device's backend
   cannot borrow host memory: copy with tb__data_from_host instead */
static tb_backend_data *tb__data_borrow_host(const tb_device *device, const tb_shape *shape,
                                             const void *host);
/* the host array of a cpu backend data (payload tb__host_buffer, defined in backend.c);
   NULL for another backend's data or a placeholder */
static void *tb__host_data(const tb_backend_data *data);
/* arms a release callback on a cpu data that borrows `host` (tb__data_borrow_host): called
   once, when the data's buffer is freed. false (nothing set) when `data` is not such a data
   or already has a callback */
static bool tb__data_set_host_release(tb_backend_data *data, const void *host,
                                      void (*release)(void *context), void *context);
/* the device `ordinal` of a backend, its type asked from the backend; messages name `fn`
   (unknown backend: lists those that exist; bad ordinal: gives the device count) */
static tb_status tb__backend_device(const char *fn, const char *backend, int32_t ordinal,
                                    tb_device *out);
/* the current backend (tb_set_backend's, else the default of desc.backend / $TB_BACKEND /
   "cpu", looked up); NULL with an error naming `fn` and the setting that holds a bad name */
static const tb_backend *tb__current_backend(const char *fn);
/* cpu, opencl: those not registered yet (the registry calls it until all are) */
struct tb__builtin_failure;
static void tb__register_builtin_backends(struct tb__builtin_failure *why);

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
    /* the executor's bound on the computed (non-parameter) nodes of this node's graph, for the
       automatic flush; tb__node_new sets it to 0 and only tensor.c writes it */
    uint64_t graph_size;
};
static tb_node *tb__node_new(tb_op op, const tb_shape *shape, const tb_device *device,
                             tb_node *const *operands, size_t num_operands, const int64_t *attrs,
                             size_t num_attrs, const double *fattrs);
static tb_node *tb__node_device_data(tb_backend_data *data); /* retains data */
static tb_node *tb__node_scalar(tb_scalar value, const tb_device *device, bool wrapped_number);
static void tb__node_retain(tb_node *node);
static void tb__node_release(tb_node *node); /* iterative: deep chains do not recurse */
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

/* reference.c: the reference interpreter. A graph's parameter values and results are
   contiguous host arrays of the nodes' shapes. */
static tb_status tb__ref_run_graph(const tb_graph *graph, const void *const *parameters,
                                   void *const *results);
/* one node from contiguous host arrays of its operands */
static tb_status tb__ref_eval_node(const tb_node *node, const void *const *operands, void *output);

/* cpu_backend.c: the "cpu" backend's vtable (registered by backend.c) */
static void tb__cpu_backend_impl(tb_backend_impl *out);

/* opencl.c */
#if !defined(TB_NO_OPENCL)
/* registers the "opencl" backend (called by tb__register_builtin_backends) */
static tb_status tb__opencl_register(void);
#endif

/* ---- src/base.c ---- */
/* ===========================================================================================
   Base: errors, allocation, logging, setup, hashing, strings, mutexes, time
   =========================================================================================== */

#if !defined(_WIN32)
#include <sched.h>    /* sched_yield */
#include <sys/time.h> /* gettimeofday: the clock when clock_gettime is not declared */
#endif

#define TB__ERROR_CAP 1024

/* The calling thread's last error. */
static TB__THREAD_LOCAL tb_status tb__err_status = TB_OK;
static TB__THREAD_LOCAL char tb__err_message[TB__ERROR_CAP];

/* Process-wide configuration. `ready` is read without the lock (atomically) so that the
   common case of tb__ensure_setup costs one load. */
typedef struct tb__state {
    int32_t ready;
    tb_desc desc;               /* the effective desc: defaults filled, strings owned */
    const char *device_source;  /* "desc.device" or "TB_DEVICE": where desc.device came from */
    const char *backend_source; /* "desc.backend", "TB_BACKEND", or NULL for the default cpu */
    tb_allocator allocator;     /* copied out of desc so the hooks outlive tb_shutdown's frees */
} tb__state;

static tb__state tb__g;
static tb__mutex tb__setup_mutex = TB__MUTEX_INIT;

/* ---- mutex ---- */

#if defined(_WIN32)
static BOOL CALLBACK tb__mutex_init_once(PINIT_ONCE once, PVOID param, PVOID *context) {
    (void)once;
    (void)context;
    InitializeCriticalSection(&((tb__mutex *)param)->cs);
    return TRUE;
}

static void tb__mutex_lock(tb__mutex *m) {
    InitOnceExecuteOnce(&m->once, tb__mutex_init_once, m, NULL);
    EnterCriticalSection(&m->cs);
}

static void tb__mutex_unlock(tb__mutex *m) {
    LeaveCriticalSection(&m->cs);
}

/* An id of the calling thread, never 0. */
static TB__UNUSED uintptr_t tb__thread_id(void) {
    return (uintptr_t)GetCurrentThreadId() + 1;
}

static TB__UNUSED void tb__yield(void) {
    SwitchToThread();
}
#else
/* Each thread's marker: its address identifies the thread as a mutex owner. */
static TB__THREAD_LOCAL char tb__thread_marker;

static void tb__mutex_lock(tb__mutex *m) {
    uintptr_t self = (uintptr_t)&tb__thread_marker;
    /* Only this thread ever stores `self`, so seeing it means we already hold the lock. */
    if (__atomic_load_n(&m->owner, __ATOMIC_RELAXED) == self) {
        m->depth++;
        return;
    }
    pthread_mutex_lock(&m->m);
    __atomic_store_n(&m->owner, self, __ATOMIC_RELAXED);
    m->depth = 1;
}

static void tb__mutex_unlock(tb__mutex *m) {
    if (--m->depth > 0) return;
    __atomic_store_n(&m->owner, (uintptr_t)0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&m->m);
}

/* An id of the calling thread, never 0. */
static TB__UNUSED uintptr_t tb__thread_id(void) {
    return (uintptr_t)&tb__thread_marker;
}

static TB__UNUSED void tb__yield(void) {
    sched_yield();
}
#endif

/* ---- status and errors ---- */

TBDEF const char *tb_status_string(tb_status status) {
    switch (status) {
    case TB_OK:
        return "TB_OK: success";
    case TB_ERR_INVALID_ARGUMENT:
        return "TB_ERR_INVALID_ARGUMENT: invalid argument";
    case TB_ERR_DTYPE:
        return "TB_ERR_DTYPE: unsupported dtype";
    case TB_ERR_SHAPE:
        return "TB_ERR_SHAPE: shape mismatch";
    case TB_ERR_OVERFLOW:
        return "TB_ERR_OVERFLOW: size overflow";
    case TB_ERR_OUT_OF_MEMORY:
        return "TB_ERR_OUT_OF_MEMORY: out of memory";
    case TB_ERR_NOT_FOUND:
        return "TB_ERR_NOT_FOUND: not found";
    case TB_ERR_DUPLICATE:
        return "TB_ERR_DUPLICATE: duplicate name";
    case TB_ERR_UNSUPPORTED:
        return "TB_ERR_UNSUPPORTED: unsupported";
    case TB_ERR_UNAVAILABLE:
        return "TB_ERR_UNAVAILABLE: unavailable";
    case TB_ERR_COMPILE:
        return "TB_ERR_COMPILE: compilation failed";
    case TB_ERR_EXECUTE:
        return "TB_ERR_EXECUTE: execution failed";
    case TB_ERR_IO:
        return "TB_ERR_IO: input/output error";
    case TB_ERR_FORMAT:
        return "TB_ERR_FORMAT: malformed data";
    case TB_ERR_PLUGIN:
        return "TB_ERR_PLUGIN: plugin error";
    case TB_ERR_STATE:
        return "TB_ERR_STATE: wrong call order";
    case TB_ERR_INTERNAL:
        return "TB_ERR_INTERNAL: internal error";
    case TB_STATUS_COUNT:
        break;
    }
    return "unknown status";
}

TBDEF const char *tb_last_error(void) {
    return tb__err_message;
}

TBDEF tb_status tb_last_status(void) {
    return tb__err_status;
}

TBDEF void tb_clear_error(void) {
    tb__err_status = TB_OK;
    tb__err_message[0] = '\0';
}

static tb_status tb__error_v(tb_status status, const char *fmt, va_list ap) {
    /* Formatted apart first: the arguments may point into the current message. */
    char text[TB__ERROR_CAP];
    if (fmt == NULL) {
        text[0] = '\0';
    } else if (vsnprintf(text, sizeof text, fmt, ap) < 0) {
        text[0] = '\0';
    }
    memcpy(tb__err_message, text, sizeof text);
    tb__err_status = status;
    return status;
}

static tb_status tb__error(tb_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tb__error_v(status, fmt, ap);
    va_end(ap);
    return status;
}

/* In a plugin's own copy of the library (TB_STATIC), the services of the host that loaded it
   (set through tb_plugin_attach_host, backend.c): tb_set_error passes each error on to the
   host, whose tb_last_error the user reads. NULL everywhere else. Written once, before the
   plugin's entry runs; read afterwards. */
static const tb_plugin_host *tb__plugin_parent = NULL;

TBDEF tb_status tb_set_error(tb_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tb__error_v(status, fmt, ap);
    va_end(ap);
    if (tb__plugin_parent != NULL) tb__plugin_parent->set_error(status, tb__err_message);
    return status;
}

/* A copy of the calling thread's error, for calls that must not disturb it. */
typedef struct tb__saved_error {
    tb_status status;
    char message[TB__ERROR_CAP];
} tb__saved_error;

static TB__UNUSED void tb__error_save(tb__saved_error *saved) {
    saved->status = tb__err_status;
    memcpy(saved->message, tb__err_message, sizeof saved->message);
}

static TB__UNUSED void tb__error_restore(const tb__saved_error *saved) {
    tb__err_status = saved->status;
    memcpy(tb__err_message, saved->message, sizeof saved->message);
}

/* ---- checked arithmetic ----
   Dims, strides, element offsets and byte sizes that a caller, a file or a foreign producer can
   push past the range of int64 are computed through these, and nowhere by hand. Each stores the
   exact result and returns true, or returns false and leaves *out untouched when the result does
   not fit. The compiler's overflow builtins are used where they exist; the portable forms check
   before they compute and are kept (and tested) everywhere. */

#if defined(__has_builtin)
#if __has_builtin(__builtin_add_overflow) && __has_builtin(__builtin_mul_overflow) &&              \
    __has_builtin(__builtin_sub_overflow)
#define TB__OVERFLOW_BUILTINS 1
#endif
#elif defined(__GNUC__) && __GNUC__ >= 5
#define TB__OVERFLOW_BUILTINS 1
#endif

static TB__UNUSED bool tb__add_i64_portable(int64_t a, int64_t b, int64_t *out) {
    if (b > 0 ? a > INT64_MAX - b : a < INT64_MIN - b) return false;
    *out = a + b;
    return true;
}

static TB__UNUSED bool tb__sub_i64_portable(int64_t a, int64_t b, int64_t *out) {
    if (b < 0 ? a > INT64_MAX + b : a < INT64_MIN + b) return false;
    *out = a - b;
    return true;
}

static TB__UNUSED bool tb__mul_i64_portable(int64_t a, int64_t b, int64_t *out) {
    if (a > 0) {
        if (b > 0 ? a > INT64_MAX / b : b < INT64_MIN / a) return false;
    } else if (a < 0) {
        if (b > 0 ? a < INT64_MIN / b : (b < 0 && a < INT64_MAX / b)) return false;
    }
    *out = a * b;
    return true;
}

static TB__UNUSED bool tb__add_size_portable(size_t a, size_t b, size_t *out) {
    if (a > SIZE_MAX - b) return false;
    *out = a + b;
    return true;
}

static TB__UNUSED bool tb__mul_size_portable(size_t a, size_t b, size_t *out) {
    if (b != 0 && a > SIZE_MAX / b) return false;
    *out = a * b;
    return true;
}

#if defined(TB__OVERFLOW_BUILTINS)
#define TB__CHECKED(name, type, builtin)                                                           \
    static TB__UNUSED bool name(type a, type b, type *out) {                                       \
        type r;                                                                                    \
        if (builtin(a, b, &r)) return false;                                                       \
        *out = r;                                                                                  \
        return true;                                                                               \
    }
TB__CHECKED(tb__add_i64, int64_t, __builtin_add_overflow)
TB__CHECKED(tb__sub_i64, int64_t, __builtin_sub_overflow)
TB__CHECKED(tb__mul_i64, int64_t, __builtin_mul_overflow)
TB__CHECKED(tb__add_size, size_t, __builtin_add_overflow)
TB__CHECKED(tb__mul_size, size_t, __builtin_mul_overflow)
#undef TB__CHECKED
#else
#define TB__CHECKED(name, type)                                                                    \
    static TB__UNUSED bool name(type a, type b, type *out) {                                       \
        return name##_portable(a, b, out);                                                         \
    }
TB__CHECKED(tb__add_i64, int64_t)
TB__CHECKED(tb__sub_i64, int64_t)
TB__CHECKED(tb__mul_i64, int64_t)
TB__CHECKED(tb__add_size, size_t)
TB__CHECKED(tb__mul_size, size_t)
#undef TB__CHECKED
#endif
#undef TB__OVERFLOW_BUILTINS

/* a * b + c */
static TB__UNUSED bool tb__muladd_i64(int64_t a, int64_t b, int64_t c, int64_t *out) {
    int64_t p;
    return tb__mul_i64(a, b, &p) && tb__add_i64(p, c, out);
}

/* A non-negative int64 as a size_t. */
static TB__UNUSED bool tb__i64_to_size(int64_t v, size_t *out) {
    if (v < 0 || (uint64_t)v > (uint64_t)SIZE_MAX) return false;
    *out = (size_t)v;
    return true;
}

/* The most bytes a tensor may span: its byte size and every byte offset inside it fit in both
   int64 and size_t (PyTorch's storage_max). */
#define TB__MAX_BYTES ((uint64_t)SIZE_MAX < (uint64_t)INT64_MAX ? (int64_t)SIZE_MAX : INT64_MAX)

/* ---- allocation ---- */

/* The hooks without error reporting (logging must not overwrite the caller's error). */
static void *tb__raw_alloc(size_t size) {
    if (size == 0) size = 1;
    if (tb__g.allocator.alloc != NULL)
        return tb__g.allocator.alloc(size, tb__g.allocator.user_data);
    return malloc(size);
}

static void tb__free(void *ptr) {
    if (ptr == NULL) return;
    if (tb__g.allocator.free != NULL) {
        tb__g.allocator.free(ptr, tb__g.allocator.user_data);
    } else {
        free(ptr);
    }
}

static TB__UNUSED void *tb__alloc(size_t size) {
    void *p = tb__raw_alloc(size);
    if (p == NULL) tb__error(TB_ERR_OUT_OF_MEMORY, "tb: out of memory allocating %zu bytes", size);
    return p;
}

static TB__UNUSED void *tb__calloc(size_t count, size_t size) {
    void *p;
    if (size != 0 && count > SIZE_MAX / size) {
        tb__error(TB_ERR_OVERFLOW, "tb: allocation of %zu x %zu bytes overflows size_t", count,
                  size);
        return NULL;
    }
    p = tb__alloc(count * size);
    if (p != NULL) memset(p, 0, count * size == 0 ? 1 : count * size);
    return p;
}

static TB__UNUSED tb_status tb__grow(void **items, size_t *cap, size_t need, size_t elem) {
    size_t new_cap;
    void *p;
    if (need <= *cap) return TB_OK;
    if (elem == 0) return tb__error(TB_ERR_INTERNAL, "tb__grow: element size 0");
    new_cap = *cap < 8 ? 8 : *cap;
    while (new_cap < need) {
        if (new_cap > SIZE_MAX / 2) {
            new_cap = need;
            break;
        }
        new_cap *= 2;
    }
    if (new_cap > SIZE_MAX / elem) {
        return tb__error(TB_ERR_OVERFLOW, "tb: array of %zu x %zu bytes overflows size_t", need,
                         elem);
    }
    p = tb__alloc(new_cap * elem);
    if (p == NULL) return TB_ERR_OUT_OF_MEMORY;
    if (*items != NULL) {
        memcpy(p, *items, *cap * elem);
        tb__free(*items);
    }
    *items = p;
    *cap = new_cap;
    return TB_OK;
}

/* NULL gives NULL without an error (optional strings). */
static TB__UNUSED char *tb__strdup(const char *s) {
    size_t n;
    char *p;
    if (s == NULL) return NULL;
    n = strlen(s);
    p = (char *)tb__alloc(n + 1);
    if (p != NULL) memcpy(p, s, n + 1);
    return p;
}

static char *tb__format_v(const char *fmt, va_list ap) {
    va_list ap2;
    int n;
    char *p;
    va_copy(ap2, ap);
    n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        tb__error(TB_ERR_INTERNAL, "tb: bad format string '%s'", fmt);
        return NULL;
    }
    p = (char *)tb__alloc((size_t)n + 1);
    if (p != NULL) vsnprintf(p, (size_t)n + 1, fmt, ap);
    return p;
}

static TB__UNUSED char *tb__format(const char *fmt, ...) {
    va_list ap;
    char *p;
    va_start(ap, fmt);
    p = tb__format_v(fmt, ap);
    va_end(ap);
    return p;
}

TBDEF void tb_free(void *ptr) {
    tb__free(ptr);
}

/* ---- growable strings ---- */

static TB__UNUSED void tb__str_append(tb__str *s, const char *fmt, ...) {
    va_list ap;
    int n;
    size_t need;
    if (s->failed) return;
    va_start(ap, fmt);
    n = vsnprintf(s->data != NULL ? s->data + s->len : NULL, s->data != NULL ? s->cap - s->len : 0,
                  fmt, ap);
    va_end(ap);
    if (n < 0) {
        s->failed = true;
        return;
    }
    if (s->data != NULL && (size_t)n < s->cap - s->len) {
        s->len += (size_t)n;
        return;
    }
    if ((size_t)n > SIZE_MAX - s->len - 1) {
        s->failed = true;
        tb__error(TB_ERR_OVERFLOW, "tb: text longer than size_t");
        return;
    }
    need = s->len + (size_t)n + 1;
    {
        void *items = s->data;
        if (tb__grow(&items, &s->cap, need < 256 ? 256 : need, 1) != TB_OK) {
            s->failed = true;
            return;
        }
        s->data = (char *)items;
    }
    va_start(ap, fmt);
    vsnprintf(s->data + s->len, s->cap - s->len, fmt, ap);
    va_end(ap);
    s->len += (size_t)n;
}

static TB__UNUSED char *tb__str_take(tb__str *s) {
    char *p;
    if (s->failed) {
        tb__str_free(s);
        return NULL;
    }
    if (s->data == NULL) {
        p = (char *)tb__alloc(1);
        if (p != NULL) p[0] = '\0';
    } else {
        p = s->data;
    }
    s->data = NULL;
    s->len = 0;
    s->cap = 0;
    s->failed = false;
    return p;
}

static TB__UNUSED void tb__str_free(tb__str *s) {
    tb__free(s->data);
    s->data = NULL;
    s->len = 0;
    s->cap = 0;
    s->failed = false;
}

/* ---- environment ---- */

static TB__UNUSED const char *tb__getenv(const char *name) {
    const char *v = getenv(name);
    return (v != NULL && v[0] != '\0') ? v : NULL;
}

/* ---- logging ---- */

static const char *tb__log_level_name(tb_log_level level) {
    switch (level) {
    case TB_LOG_ERROR:
        return "error";
    case TB_LOG_WARN:
        return "warn";
    case TB_LOG_INFO:
        return "info";
    case TB_LOG_DEBUG:
        return "debug";
    }
    return "log";
}

static int tb__debug_value(void) {
    return tb__g.desc.debug < 0 ? 0 : tb__g.desc.debug;
}

/* Errors and warnings always; info from debug level 1, debug from level 2. */
static bool tb__log_enabled(tb_log_level level) {
    if ((int)level <= (int)TB_LOG_WARN) return true;
    if (level == TB_LOG_INFO) return tb__debug_value() >= 1;
    return tb__debug_value() >= 2;
}

static void tb__log_emit(tb_log_level level, const char *message) {
    if (tb__g.desc.logger.func != NULL) {
        tb__g.desc.logger.func(level, message, tb__g.desc.logger.user_data);
    } else {
        fprintf(stderr, "tb: %s: %s\n", tb__log_level_name(level), message);
    }
}

/* Logs without setting the library up (setup itself logs through this). */
static void tb__log_v(tb_log_level level, const char *fmt, va_list ap) {
    char small[512];
    va_list ap2;
    int n;
    if (!tb__log_enabled(level) || fmt == NULL) return;
    va_copy(ap2, ap);
    n = vsnprintf(small, sizeof small, fmt, ap2);
    va_end(ap2);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        tb__log_emit(level, small);
    } else {
        char *big = (char *)tb__raw_alloc((size_t)n + 1);
        if (big == NULL) {
            tb__log_emit(level, small); /* cut, rather than nothing */
            return;
        }
        vsnprintf(big, (size_t)n + 1, fmt, ap);
        tb__log_emit(level, big);
        tb__free(big);
    }
}

static void tb__log_internal(tb_log_level level, const char *fmt, ...) TB_PRINTF_LIKE(2, 3);
static void tb__log_internal(tb_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tb__log_v(level, fmt, ap);
    va_end(ap);
}

TBDEF void tb_log_message(tb_log_level level, const char *fmt, ...) {
    va_list ap;
    tb__ensure_setup();
    va_start(ap, fmt);
    tb__log_v(level, fmt, ap);
    va_end(ap);
}

/* ---- setup ---- */

/* An environment switch as a level: unset or empty gives 0; a bad value logs a warning. */
static int tb__env_level(const char *name, int max) {
    const char *v = tb__getenv(name);
    if (v == NULL) return 0;
    if (v[0] >= '0' && v[0] <= '9' && v[1] == '\0' && v[0] - '0' <= max) return v[0] - '0';
    tb__log_internal(TB_LOG_WARN, "%s='%.64s' is not a number in 0..%d; using 0", name, v, max);
    return 0;
}

static void tb__free_desc_strings(void) {
    tb__free((void *)tb__g.desc.backend);
    tb__free((void *)tb__g.desc.device);
    tb__g.desc.backend = NULL;
    tb__g.desc.device = NULL;
}

/* Called with tb__setup_mutex held and the library not set up. */
static tb_status tb__do_setup(const tb_desc *user) {
    tb_desc d;
    const char *backend, *device, *device_source = NULL, *backend_source = NULL;
    if (user != NULL) {
        d = *user;
    } else {
        memset(&d, 0, sizeof d);
    }
    if ((d.allocator.alloc == NULL) != (d.allocator.free == NULL)) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_setup: allocator needs both alloc and free (alloc %s, free %s)",
                         d.allocator.alloc != NULL ? "set" : "NULL",
                         d.allocator.free != NULL ? "set" : "NULL");
    }
    if (d.debug < -1 || d.debug > 3) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_setup: debug %d out of range -1..3", d.debug);
    }
    if (d.check < -1 || d.check > 2) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_setup: check %d out of range -1..2", d.check);
    }
    /* The hooks and the debug level first: everything below may allocate or log. */
    tb__g.allocator = d.allocator;
    tb__g.desc.logger = d.logger;
    tb__g.desc.debug = 0;
    if (d.debug == 0) d.debug = tb__env_level("TB_DEBUG", 3);
    if (d.debug < 0) d.debug = 0;
    tb__g.desc.debug = d.debug;
    if (d.check == 0) d.check = tb__env_level("TB_CHECK", 2);
    if (d.check < 0) d.check = 0;
    if (d.cache_size == 0) d.cache_size = 1024;
    if (d.max_graph_nodes == 0) d.max_graph_nodes = 100000;

    backend = d.backend;
    if (backend != NULL) {
        backend_source = "desc.backend";
    } else {
        backend = tb__getenv("TB_BACKEND");
        if (backend != NULL) backend_source = "TB_BACKEND";
    }
    if (backend == NULL) backend = "cpu";
    device = d.device;
    if (device != NULL) {
        device_source = "desc.device";
    } else {
        device = tb__getenv("TB_DEVICE");
        if (device != NULL) device_source = "TB_DEVICE";
    }
    d.backend = tb__strdup(backend);
    d.device = tb__strdup(device);
    if (d.backend == NULL || (device != NULL && d.device == NULL)) {
        tb__free((void *)d.backend);
        tb__free((void *)d.device);
        memset(&tb__g.allocator, 0, sizeof tb__g.allocator);
        memset(&tb__g.desc, 0, sizeof tb__g.desc);
        return tb__error(TB_ERR_OUT_OF_MEMORY, "tb_setup: out of memory");
    }
    tb__g.desc = d;
    tb__g.device_source = device_source;
    tb__g.backend_source = backend_source;
    TB__ATOMIC_ADD(&tb__g.ready, 1);
    return TB_OK;
}

TBDEF tb_status tb_setup(const tb_desc *desc) {
    tb_status st;
    tb__mutex_lock(&tb__setup_mutex);
    if (TB__ATOMIC_LOAD(&tb__g.ready) != 0) {
        tb__mutex_unlock(&tb__setup_mutex);
        return tb__error(TB_ERR_STATE,
                         "tb_setup: the library is already set up (call tb_shutdown first)");
    }
    st = tb__do_setup(desc);
    tb__mutex_unlock(&tb__setup_mutex);
    return st;
}

static void tb__ensure_setup(void) {
    if (TB__ATOMIC_LOAD(&tb__g.ready) != 0) return;
    tb__mutex_lock(&tb__setup_mutex);
    if (TB__ATOMIC_LOAD(&tb__g.ready) == 0) {
        /* A zero desc only fails when memory runs out; the next call tries again. */
        tb__saved_error saved;
        tb__error_save(&saved);
        if (tb__do_setup(NULL) == TB_OK) tb__error_restore(&saved);
    }
    tb__mutex_unlock(&tb__setup_mutex);
}

static TB__UNUSED const tb_desc *tb__desc(void) {
    tb__ensure_setup();
    return &tb__g.desc;
}

TBDEF void tb_shutdown(void) {
    tb__mutex_lock(&tb__setup_mutex);
    if (TB__ATOMIC_LOAD(&tb__g.ready) == 0) {
        tb__mutex_unlock(&tb__setup_mutex);
        return;
    }
    /* Later layers first; they may still allocate, log and read the desc meanwhile. The
       metrics go last of all: every layer records them, the backends too (in prepare_to_exit
       and while their buffers are released), and a metric recorded after the table was freed
       would outlive the allocator hooks. Nothing after this point allocates. */
    tb__executor_shutdown();
    tb__ir_shutdown();
    tb__registry_shutdown();
    tb__metrics_shutdown();
    tb__free_desc_strings();
    memset(&tb__g.desc, 0, sizeof tb__g.desc);
    tb__g.device_source = NULL;
    tb__g.backend_source = NULL;
    memset(&tb__g.allocator, 0, sizeof tb__g.allocator);
    TB__ATOMIC_ADD(&tb__g.ready, -1);
    tb__mutex_unlock(&tb__setup_mutex);
}

TBDEF bool tb_is_setup(void) {
    return TB__ATOMIC_LOAD(&tb__g.ready) != 0;
}

TBDEF int tb_debug_level(void) {
    tb__ensure_setup();
    return tb__debug_value();
}

/* ---- hashing: XXH64, reading bytes little-endian so the value is the same everywhere ---- */

#define TB__P1 UINT64_C(0x9E3779B185EBCA87)
#define TB__P2 UINT64_C(0xC2B2AE3D27D4EB4F)
#define TB__P3 UINT64_C(0x165667B19E3779F9)
#define TB__P4 UINT64_C(0x85EBCA77C2B2AE63)
#define TB__P5 UINT64_C(0x27D4EB2F165667C5)

static uint64_t tb__rotl64(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

static uint64_t tb__read64(const unsigned char *p) {
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) |
           ((uint64_t)p[3] << 24) | ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40) |
           ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}

static uint64_t tb__read32(const unsigned char *p) {
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) | ((uint64_t)p[3] << 24);
}

static uint64_t tb__xxh_round(uint64_t acc, uint64_t input) {
    acc += input * TB__P2;
    acc = tb__rotl64(acc, 31);
    return acc * TB__P1;
}

static uint64_t tb__xxh_merge(uint64_t acc, uint64_t val) {
    acc ^= tb__xxh_round(0, val);
    return acc * TB__P1 + TB__P4;
}

static uint64_t tb__xxh_avalanche(uint64_t h) {
    h ^= h >> 33;
    h *= TB__P2;
    h ^= h >> 29;
    h *= TB__P3;
    h ^= h >> 32;
    return h;
}

static TB__UNUSED uint64_t tb__hash_bytes(uint64_t seed, const void *data, size_t size) {
    static const unsigned char empty = 0;
    const unsigned char *p = data != NULL ? (const unsigned char *)data : &empty;
    const unsigned char *end;
    uint64_t h;
    if (data == NULL) size = 0;
    end = p + size;
    if (size >= 32) {
        const unsigned char *limit = end - 32;
        uint64_t v1 = seed + TB__P1 + TB__P2, v2 = seed + TB__P2, v3 = seed, v4 = seed - TB__P1;
        do {
            v1 = tb__xxh_round(v1, tb__read64(p));
            v2 = tb__xxh_round(v2, tb__read64(p + 8));
            v3 = tb__xxh_round(v3, tb__read64(p + 16));
            v4 = tb__xxh_round(v4, tb__read64(p + 24));
            p += 32;
        } while (p <= limit);
        h = tb__rotl64(v1, 1) + tb__rotl64(v2, 7) + tb__rotl64(v3, 12) + tb__rotl64(v4, 18);
        h = tb__xxh_merge(h, v1);
        h = tb__xxh_merge(h, v2);
        h = tb__xxh_merge(h, v3);
        h = tb__xxh_merge(h, v4);
    } else {
        h = seed + TB__P5;
    }
    h += (uint64_t)size;
    while (end - p >= 8) {
        h ^= tb__xxh_round(0, tb__read64(p));
        h = tb__rotl64(h, 27) * TB__P1 + TB__P4;
        p += 8;
    }
    if (end - p >= 4) {
        h ^= tb__read32(p) * TB__P1;
        h = tb__rotl64(h, 23) * TB__P2 + TB__P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * TB__P5;
        h = tb__rotl64(h, 11) * TB__P1;
        p++;
    }
    return tb__xxh_avalanche(h);
}

/* Equals tb__hash_bytes of the 8 little-endian bytes of `value`. */
static TB__UNUSED uint64_t tb__hash_u64(uint64_t seed, uint64_t value) {
    uint64_t h = seed + TB__P5 + 8;
    h ^= tb__xxh_round(0, value);
    h = tb__rotl64(h, 27) * TB__P1 + TB__P4;
    return tb__xxh_avalanche(h);
}

#undef TB__P1
#undef TB__P2
#undef TB__P3
#undef TB__P4
#undef TB__P5

/* ---- time ---- */

static TB__UNUSED uint64_t tb__now_ns(void) {
#if defined(_WIN32)
    static LARGE_INTEGER freq; /* benign race: every thread writes the same value */
    LARGE_INTEGER now;
    if (freq.QuadPart == 0) QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&now);
    return (uint64_t)((double)now.QuadPart * 1e9 / (double)freq.QuadPart);
#elif defined(CLOCK_MONOTONIC)
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
#else
    /* A strict -std=c99/c11 build where a system header came before our _POSIX_C_SOURCE: the
       POSIX clock is not declared, the wall clock is. */
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * UINT64_C(1000000000) + (uint64_t)tv.tv_usec * 1000u;
#endif
}

/* ---- slow notices: a line that appears while a long call still runs ---- */

#if defined(_WIN32)
static DWORD WINAPI tb__slow_notice_thread(LPVOID arg) {
    tb__slow_notice *n = (tb__slow_notice *)arg;
    if (WaitForSingleObject(n->done, n->delay_ms) == WAIT_TIMEOUT) {
        tb__log_internal(TB_LOG_INFO, "%s", n->message);
    }
    return 0;
}
#else
static void *tb__slow_notice_thread(void *arg) {
    tb__slow_notice *n = (tb__slow_notice *)arg;
    struct timespec deadline;
    bool fire;
    /* pthread_cond_timedwait takes a wall-clock deadline */
#if defined(CLOCK_REALTIME)
    clock_gettime(CLOCK_REALTIME, &deadline);
#else
    {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        deadline.tv_sec = tv.tv_sec;
        deadline.tv_nsec = (long)tv.tv_usec * 1000L;
    }
#endif
    deadline.tv_sec += (time_t)(n->delay_ms / 1000u);
    deadline.tv_nsec += (long)(n->delay_ms % 1000u) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&n->mutex);
    while (!n->done) {
        if (pthread_cond_timedwait(&n->cond, &n->mutex, &deadline) == ETIMEDOUT) break;
    }
    fire = !n->done;
    pthread_mutex_unlock(&n->mutex);
    if (fire) tb__log_internal(TB_LOG_INFO, "%s", n->message);
    return NULL;
}
#endif

static TB__UNUSED void tb__slow_notice_begin(tb__slow_notice *n, unsigned delay_ms, const char *fmt,
                                             ...) {
    va_list ap;
    n->armed = false;
    n->delay_ms = delay_ms;
    va_start(ap, fmt);
    if (vsnprintf(n->message, sizeof n->message, fmt, ap) < 0) n->message[0] = '\0';
    va_end(ap);
#if defined(_WIN32)
    n->done = CreateEventA(NULL, TRUE, FALSE, NULL);
    if (n->done == NULL) return;
    n->thread = CreateThread(NULL, 0, tb__slow_notice_thread, n, 0, NULL);
    if (n->thread == NULL) {
        CloseHandle(n->done);
        return;
    }
#else
    n->done = false;
    if (pthread_mutex_init(&n->mutex, NULL) != 0) return;
    if (pthread_cond_init(&n->cond, NULL) != 0) {
        pthread_mutex_destroy(&n->mutex);
        return;
    }
    if (pthread_create(&n->thread, NULL, tb__slow_notice_thread, n) != 0) {
        pthread_cond_destroy(&n->cond);
        pthread_mutex_destroy(&n->mutex);
        return;
    }
#endif
    n->armed = true;
}

static TB__UNUSED void tb__slow_notice_end(tb__slow_notice *n) {
    if (!n->armed) return;
#if defined(_WIN32)
    SetEvent(n->done);
    WaitForSingleObject(n->thread, INFINITE);
    CloseHandle(n->thread);
    CloseHandle(n->done);
#else
    pthread_mutex_lock(&n->mutex);
    n->done = true;
    pthread_cond_signal(&n->cond);
    pthread_mutex_unlock(&n->mutex);
    pthread_join(n->thread, NULL);
    pthread_cond_destroy(&n->cond);
    pthread_mutex_destroy(&n->mutex);
#endif
    n->armed = false;
}

/* ---- src/rng.c ---- */
/* ===========================================================================================
   RNG: Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC11), the
   same counter-based generator on every backend, so that a seed gives the same bits everywhere.
   =========================================================================================== */

#define TB__PHILOX_M0 0xD2511F53u
#define TB__PHILOX_M1 0xCD9E8D57u
#define TB__PHILOX_W0 0x9E3779B9u
#define TB__PHILOX_W1 0xBB67AE85u

/* PyTorch's default CPU generator seed, so that an unseeded program behaves the same on every
   run. */
#define TB__RNG_DEFAULT_SEED 67280421310721ull

static void tb__philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    int round;
    for (round = 0; round < 10; round++) {
        uint64_t p0, p1;
        if (round > 0) {
            k0 += TB__PHILOX_W0;
            k1 += TB__PHILOX_W1;
        }
        p0 = (uint64_t)TB__PHILOX_M0 * c0;
        p1 = (uint64_t)TB__PHILOX_M1 * c2;
        c0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        c1 = (uint32_t)p1;
        c2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c3 = (uint32_t)p0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The four words of counter `offset + block` under `seed`. */
static void tb__rng_block(uint64_t seed, uint64_t offset, uint64_t block, uint32_t out[4]) {
    uint64_t c = offset + block; /* wraps modulo 2^64 by design */
    uint32_t counter[4];
    uint32_t key[2];
    counter[0] = (uint32_t)c;
    counter[1] = (uint32_t)(c >> 32);
    counter[2] = 0;
    counter[3] = 0;
    key[0] = (uint32_t)seed;
    key[1] = (uint32_t)(seed >> 32);
    tb__philox4x32_10(counter, key, out);
}

/* A 53-bit uniform in [0, 1) from two words; integer arithmetic, then one exact scaling. */
static double tb__rng_u53(uint32_t hi, uint32_t lo) {
    uint64_t bits = ((uint64_t)hi << 21) | (uint64_t)(lo >> 11);
    return (double)bits / 9007199254740992.0; /* 2^53 */
}

static double tb__rng_uniform(tb_dtype dtype, uint64_t seed, uint64_t offset, uint64_t index) {
    uint32_t w[4];
    if (dtype == TB_F64) {
        unsigned pair = (unsigned)(index % 2u);
        tb__rng_block(seed, offset, index / 2u, w);
        return tb__rng_u53(w[2 * pair], w[2 * pair + 1]);
    }
    tb__rng_block(seed, offset, index / 4u, w);
    /* 24 bits fit a float's significand: the float and double paths give the same value */
    return (double)(w[index % 4u] >> 8) / 16777216.0; /* 2^24 */
}

static double tb__rng_normal(tb_dtype dtype, uint64_t seed, uint64_t offset, uint64_t index) {
    uint32_t w[4];
    double u1, u2, r, t, z;
    tb__rng_block(seed, offset, index / 2u, w);
    u1 = tb__rng_u53(w[0], w[1]);
    u2 = tb__rng_u53(w[2], w[3]);
    /* 1 - u1 is exact and lies in (0, 1], so the log is finite */
    r = sqrt(-2.0 * log(1.0 - u1));
    t = 6.283185307179586 * u2;
    z = (index % 2u == 0) ? r * cos(t) : r * sin(t);
    if (dtype == TB_F64) return z;
    return (double)(float)z;
}

static tb__mutex tb__rng_mutex = TB__MUTEX_INIT;
static uint64_t tb__rng_seed = TB__RNG_DEFAULT_SEED;
static uint64_t tb__rng_offset = 0;

static void tb__rng_reserve(uint64_t numel, uint64_t *seed, uint64_t *offset) {
    tb__mutex_lock(&tb__rng_mutex);
    *seed = tb__rng_seed;
    *offset = tb__rng_offset;
    tb__rng_offset += numel / 2u + numel % 2u;
    tb__mutex_unlock(&tb__rng_mutex);
}

static void tb__rng_set_seed(uint64_t seed) {
    tb__mutex_lock(&tb__rng_mutex);
    tb__rng_seed = seed;
    tb__rng_offset = 0;
    tb__mutex_unlock(&tb__rng_mutex);
}

static void tb__rng_reset(void) {
    tb__rng_set_seed(TB__RNG_DEFAULT_SEED);
}

#undef TB__PHILOX_M0
#undef TB__PHILOX_M1
#undef TB__PHILOX_W0
#undef TB__PHILOX_W1

/* ---- src/shape.c ---- */
/* ===========================================================================================
   Dtypes, scalars and shapes
   =========================================================================================== */

TBDEF bool tb_dtype_is_valid(tb_dtype dtype) {
    return (int)dtype >= 0 && (int)dtype < (int)TB_DTYPE_COUNT;
}

TBDEF const char *tb_dtype_name(tb_dtype dtype) {
    switch (dtype) {
    case TB_F32:
        return "f32";
    case TB_F64:
        return "f64";
    case TB_I32:
        return "i32";
    case TB_I64:
        return "i64";
    case TB_U8:
        return "u8";
    case TB_BOOL:
        return "bool";
    case TB_DTYPE_COUNT:
        break;
    }
    return "invalid";
}

TBDEF size_t tb_dtype_size(tb_dtype dtype) {
    switch (dtype) {
    case TB_F32:
        return 4;
    case TB_F64:
        return 8;
    case TB_I32:
        return 4;
    case TB_I64:
        return 8;
    case TB_U8:
        return 1;
    case TB_BOOL:
        return 1;
    case TB_DTYPE_COUNT:
        break;
    }
    return 0;
}

TBDEF tb_status tb_dtype_parse(const char *text, tb_dtype *out) {
    static const struct {
        const char *name;
        tb_dtype dtype;
    } names[] = {{"f32", TB_F32},     {"float32", TB_F32}, {"float", TB_F32}, {"f64", TB_F64},
                 {"float64", TB_F64}, {"double", TB_F64},  {"i32", TB_I32},   {"int32", TB_I32},
                 {"int", TB_I32},     {"i64", TB_I64},     {"int64", TB_I64}, {"long", TB_I64},
                 {"u8", TB_U8},       {"uint8", TB_U8},    {"bool", TB_BOOL}};
    size_t i;
    if (text == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_dtype_parse: %s is NULL",
                         text == NULL ? "text" : "out");
    }
    for (i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(text, names[i].name) == 0) {
            *out = names[i].dtype;
            return TB_OK;
        }
    }
    return tb__error(TB_ERR_INVALID_ARGUMENT,
                     "tb_dtype_parse: unknown dtype '%.64s' (expected f32, f64, i32, i64, u8 or "
                     "bool)",
                     text);
}

TBDEF bool tb_dtype_is_float(tb_dtype dtype) {
    return dtype == TB_F32 || dtype == TB_F64;
}

TBDEF bool tb_dtype_is_integer(tb_dtype dtype) {
    return dtype == TB_I32 || dtype == TB_I64 || dtype == TB_U8;
}

/* Position in the promotion lattice, which is a chain for these dtypes. */
static int tb__dtype_rank(tb_dtype dtype) {
    switch (dtype) {
    case TB_BOOL:
        return 0;
    case TB_U8:
        return 1;
    case TB_I32:
        return 2;
    case TB_I64:
        return 3;
    case TB_F32:
        return 4;
    case TB_F64:
        return 5;
    case TB_DTYPE_COUNT:
        break;
    }
    return -1;
}

TBDEF tb_dtype tb_dtype_promote(tb_dtype a, tb_dtype b) {
    if (!tb_dtype_is_valid(a) || !tb_dtype_is_valid(b)) {
        tb__error(TB_ERR_DTYPE, "tb_dtype_promote: invalid dtype %d",
                  tb_dtype_is_valid(a) ? (int)b : (int)a);
        return TB_DTYPE_COUNT;
    }
    return tb__dtype_rank(a) >= tb__dtype_rank(b) ? a : b;
}

/* ---- scalars ---- */

/* double -> int64 without undefined behaviour: truncates, saturates, NaN gives 0. */
static int64_t tb__double_to_i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

/* An integer brought into an integer dtype's range the way a C cast does (wrapping). */
static int64_t tb__wrap_int(tb_dtype dtype, int64_t v) {
    switch (dtype) {
    case TB_I32: {
        uint32_t u = (uint32_t)(uint64_t)v;
        return u <= (uint32_t)INT32_MAX ? (int64_t)u : (int64_t)u - (int64_t)4294967296LL;
    }
    case TB_U8:
        return (int64_t)(uint8_t)(uint64_t)v;
    case TB_BOOL:
        return v != 0;
    default:
        return v;
    }
}

TBDEF tb_scalar tb_scalar_f(tb_dtype dtype, double value) {
    tb_scalar s;
    s.dtype = dtype;
    if (!tb_dtype_is_valid(dtype)) {
        tb__error(TB_ERR_DTYPE, "tb_scalar_f: invalid dtype %d", (int)dtype);
        s.f = value;
        s.i = 0;
    } else if (tb_dtype_is_float(dtype)) {
        s.f = value;
        s.i = tb__double_to_i64(value);
    } else if (dtype == TB_BOOL) {
        s.i = value != 0.0;
        s.f = (double)s.i;
    } else {
        s.i = tb__wrap_int(dtype, tb__double_to_i64(value));
        s.f = (double)s.i;
    }
    return s;
}

TBDEF tb_scalar tb_scalar_i(tb_dtype dtype, int64_t value) {
    tb_scalar s;
    s.dtype = dtype;
    if (!tb_dtype_is_valid(dtype)) {
        tb__error(TB_ERR_DTYPE, "tb_scalar_i: invalid dtype %d", (int)dtype);
        s.i = value;
        s.f = 0.0;
    } else if (tb_dtype_is_float(dtype)) {
        s.f = (double)value;
        s.i = value;
    } else {
        s.i = tb__wrap_int(dtype, value);
        s.f = (double)s.i;
    }
    return s;
}

TBDEF double tb_scalar_as_double(tb_scalar s) {
    return tb_dtype_is_float(s.dtype) ? s.f : (double)s.i;
}

TBDEF int64_t tb_scalar_as_int(tb_scalar s) {
    return tb_dtype_is_float(s.dtype) ? tb__double_to_i64(s.f) : s.i;
}

/* Writes one element of `dtype` holding the scalar's value (C conversion rules, with
   out-of-range floats saturating instead of being undefined). */
static TB__UNUSED void tb__scalar_store(tb_scalar value, tb_dtype dtype, void *out) {
    switch (dtype) {
    case TB_F32: {
        /* Out of float range the cast is undefined in C; round as IEEE does instead:
           below FLT_MAX + half an ulp (2^103) to FLT_MAX, beyond it to infinity. */
        double d = tb_scalar_as_double(value);
        double limit = (double)FLT_MAX + ldexp(1.0, 103);
        float f;
        if (d > (double)FLT_MAX) {
            f = d < limit ? FLT_MAX : HUGE_VALF;
        } else if (d < -(double)FLT_MAX) {
            f = d > -limit ? -FLT_MAX : -HUGE_VALF;
        } else {
            f = (float)d;
        }
        memcpy(out, &f, sizeof f);
        break;
    }
    case TB_F64: {
        double d = tb_scalar_as_double(value);
        memcpy(out, &d, sizeof d);
        break;
    }
    case TB_I32: {
        int32_t v = (int32_t)tb__wrap_int(TB_I32, tb_scalar_as_int(value));
        memcpy(out, &v, sizeof v);
        break;
    }
    case TB_I64: {
        int64_t v = tb_scalar_as_int(value);
        memcpy(out, &v, sizeof v);
        break;
    }
    case TB_U8: {
        uint8_t v = (uint8_t)tb__wrap_int(TB_U8, tb_scalar_as_int(value));
        memcpy(out, &v, sizeof v);
        break;
    }
    case TB_BOOL: {
        uint8_t v = (uint8_t)(tb_dtype_is_float(value.dtype) ? value.f != 0.0 : value.i != 0);
        memcpy(out, &v, sizeof v);
        break;
    }
    case TB_DTYPE_COUNT:
        break;
    }
}

/* ---- shapes ---- */

/* "f32[2,3]", cut with "...]" in the (absurd) case it does not fit 96 bytes. */
static TB__UNUSED size_t tb__shape_text(const tb_shape *shape, char buf[96]) {
    char big[320];
    size_t n = tb_shape_format(shape, big, sizeof big);
    if (n >= sizeof big) n = sizeof big - 1;
    if (n > 95) {
        memcpy(buf, big, 91);
        memcpy(buf + 91, "...]", 5);
        return 95;
    }
    memcpy(buf, big, n + 1);
    return n;
}

/* The size rule of every shape, empty or not: the product of the dims with each 0 read as 1
   (the element count of the shape's contiguous strides), times the element size, fits in
   TB__MAX_BYTES. So an element count, a contiguous stride and a byte offset inside any valid
   shape fit in int64 and size_t whatever the order of the dims, and the arithmetic on them
   cannot overflow. PyTorch makes the same check ("Storage size calculation overflowed") but
   stops at the first overflowing partial product, so it rejects f32[3,2^63-1,0] yet accepts
   f32[0,3,2^63-1], whose strides then overflow; here both are rejected.
   Sets *extent to that product and returns 0, or returns 1 when the product does not fit in
   int64, 2 when the byte size does not fit. The dims must be >= 0. */
static int tb__dims_extent(int32_t rank, const int64_t *dims, tb_dtype dtype, int64_t *extent) {
    int64_t n = 1, bytes;
    int32_t i;
    for (i = 0; i < rank; i++) {
        if (!tb__mul_i64(n, dims[i] == 0 ? 1 : dims[i], &n)) return 1;
    }
    if (!tb__mul_i64(n, (int64_t)tb_dtype_size(dtype), &bytes) || bytes > TB__MAX_BYTES) return 2;
    *extent = n;
    return 0;
}

static bool tb__shape_has_zero(const tb_shape *shape) {
    int32_t i;
    for (i = 0; i < shape->rank; i++) {
        if (shape->dims[i] == 0) return true;
    }
    return false;
}

/* The checks of tb_shape_make on a filled shape; messages start with `fn`. */
static tb_status tb__shape_check(const char *fn, const tb_shape *shape) {
    int32_t i;
    int64_t extent;
    int why;
    char text[96];
    if (shape == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: shape is NULL", fn);
    if (!tb_dtype_is_valid(shape->dtype)) {
        return tb__error(TB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)shape->dtype);
    }
    if (shape->rank < 0 || shape->rank > TB_MAX_RANK) {
        return tb__error(TB_ERR_SHAPE, "%s: rank %d out of range 0..%d", fn, (int)shape->rank,
                         TB_MAX_RANK);
    }
    for (i = 0; i < shape->rank; i++) {
        if (shape->dims[i] < 0) {
            return tb__error(TB_ERR_SHAPE, "%s: dim %d is %lld (dims must be >= 0)", fn, (int)i,
                             (long long)shape->dims[i]);
        }
    }
    why = tb__dims_extent(shape->rank, shape->dims, shape->dtype, &extent);
    if (why == 0) return TB_OK;
    tb__shape_text(shape, text);
    if (tb__shape_has_zero(shape)) {
        return tb__error(TB_ERR_OVERFLOW,
                         "%s: %s is empty, but with its 0 dims read as 1 its %s (empty shapes "
                         "obey the same limit, so that their strides fit)",
                         fn, text,
                         why == 1 ? "element count does not fit in int64"
                                  : "byte size does not fit in int64 and size_t");
    }
    if (why == 1) {
        return tb__error(TB_ERR_OVERFLOW, "%s: %s has more elements than fit in int64", fn, text);
    }
    return tb__error(TB_ERR_OVERFLOW, "%s: the byte size of %s does not fit in int64 and size_t",
                     fn, text);
}

/* Whether a shape with valid dtype, rank and dims >= 0 obeys the size rule (no error set). */
static TB__UNUSED bool tb__shape_size_ok(const tb_shape *shape) {
    int64_t extent;
    return tb__dims_extent(shape->rank, shape->dims, shape->dtype, &extent) == 0;
}

/* The element count of a shape that passed tb__shape_check (so it cannot overflow; a broken
   shape saturates rather than wrap). */
static int64_t tb__shape_numel(const tb_shape *shape) {
    int64_t n = 1;
    int32_t i;
    for (i = 0; i < shape->rank; i++) {
        if (!tb__mul_i64(n, shape->dims[i], &n)) return INT64_MAX;
    }
    return n;
}

TBDEF tb_status tb_shape_make(tb_shape *out, tb_dtype dtype, int32_t rank, const int64_t *dims) {
    tb_shape s;
    tb_status st;
    int32_t i;
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_make: out is NULL");
    if (rank > 0 && rank <= TB_MAX_RANK && dims == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_make: dims is NULL for rank %d",
                         (int)rank);
    }
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    s.rank = rank;
    if (rank > 0 && rank <= TB_MAX_RANK) {
        for (i = 0; i < rank; i++)
            s.dims[i] = dims[i];
    }
    st = tb__shape_check("tb_shape_make", &s);
    if (st != TB_OK) return st;
    *out = s;
    return TB_OK;
}

TBDEF tb_shape tb_shape_of(tb_dtype dtype, int32_t rank, ...) {
    tb_shape s;
    va_list ap;
    int32_t i;
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    s.rank = rank;
    if (rank > 0 && rank <= TB_MAX_RANK) {
        va_start(ap, rank);
        for (i = 0; i < rank; i++)
            s.dims[i] = (int64_t)va_arg(ap, int);
        va_end(ap);
    }
    if (tb__shape_check("tb_shape_of", &s) != TB_OK) {
        memset(s.dims, 0, sizeof s.dims);
        s.rank = -1;
    }
    return s;
}

TBDEF tb_status tb_shape_validate(const tb_shape *shape) {
    return tb__shape_check("tb_shape_validate", shape);
}

TBDEF tb_status tb_shape_numel(const tb_shape *shape, int64_t *out) {
    tb_status st;
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_numel: out is NULL");
    st = tb__shape_check("tb_shape_numel", shape);
    if (st != TB_OK) return st;
    *out = tb__shape_numel(shape);
    return TB_OK;
}

TBDEF tb_status tb_shape_nbytes(const tb_shape *shape, size_t *out) {
    tb_status st;
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_nbytes: out is NULL");
    st = tb__shape_check("tb_shape_nbytes", shape);
    if (st != TB_OK) return st;
    /* fits: the size rule bounds it by TB__MAX_BYTES */
    *out = (size_t)tb__shape_numel(shape) * tb_dtype_size(shape->dtype);
    return TB_OK;
}

TBDEF bool tb_shape_equal(const tb_shape *a, const tb_shape *b) {
    int32_t i, rank;
    if (a == NULL || b == NULL) return false;
    if (a->dtype != b->dtype || a->rank != b->rank) return false;
    rank = a->rank < 0 ? 0 : (a->rank > TB_MAX_RANK ? TB_MAX_RANK : a->rank);
    for (i = 0; i < rank; i++) {
        if (a->dims[i] != b->dims[i]) return false;
    }
    return true;
}

TBDEF tb_status tb_shape_broadcast(const tb_shape *a, const tb_shape *b, tb_shape *out) {
    tb_shape r;
    tb_status st;
    int32_t i;
    if (a == NULL || b == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_broadcast: %s is NULL",
                         a == NULL ? "a" : (b == NULL ? "b" : "out"));
    }
    st = tb__shape_check("tb_shape_broadcast", a);
    if (st == TB_OK) st = tb__shape_check("tb_shape_broadcast", b);
    if (st != TB_OK) return st;
    memset(&r, 0, sizeof r);
    r.dtype = tb_dtype_promote(a->dtype, b->dtype);
    r.rank = a->rank > b->rank ? a->rank : b->rank;
    for (i = 0; i < r.rank; i++) {
        /* aligned from the last dim; a missing dim counts as 1 */
        int32_t ia = a->rank - r.rank + i, ib = b->rank - r.rank + i;
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da == db || db == 1) {
            r.dims[i] = da;
        } else if (da == 1) {
            r.dims[i] = db;
        } else {
            char ta[96], tb[96];
            tb__shape_text(a, ta);
            tb__shape_text(b, tb);
            return tb__error(TB_ERR_SHAPE, "tb_shape_broadcast: shapes %s and %s do not broadcast",
                             ta, tb);
        }
    }
    st = tb__shape_check("tb_shape_broadcast", &r);
    if (st != TB_OK) return st;
    *out = r;
    return TB_OK;
}

TBDEF tb_status tb_shape_strides(const tb_shape *shape, int64_t strides[TB_MAX_RANK]) {
    int64_t s[TB_MAX_RANK], acc = 1;
    int32_t i;
    tb_status st;
    if (strides == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_strides: strides is NULL");
    }
    st = tb__shape_check("tb_shape_strides", shape);
    if (st != TB_OK) return st;
    memset(s, 0, sizeof s);
    /* As PyTorch: a dim of size 0 counts as 1, so strides stay meaningful for empty tensors. The
       size rule makes every product fit; the check only guards against a broken invariant. */
    for (i = shape->rank - 1; i >= 0; i--) {
        s[i] = acc;
        if (!tb__mul_i64(acc, shape->dims[i] == 0 ? 1 : shape->dims[i], &acc)) {
            char text[96];
            tb__shape_text(shape, text);
            return tb__error(TB_ERR_OVERFLOW, "tb_shape_strides: the strides of %s overflow int64",
                             text);
        }
    }
    memcpy(strides, s, sizeof s);
    return TB_OK;
}

TBDEF size_t tb_shape_format(const tb_shape *shape, char *buf, size_t cap) {
    char text[320];
    int n = 0;
    int32_t i;
    size_t len;
    if (shape == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_format: shape is NULL");
        text[0] = '\0';
    } else if (shape->rank < 0 || shape->rank > TB_MAX_RANK) {
        n = snprintf(text, sizeof text, "%s[rank %d]", tb_dtype_name(shape->dtype),
                     (int)shape->rank);
    } else {
        n = snprintf(text, sizeof text, "%s[", tb_dtype_name(shape->dtype));
        for (i = 0; i < shape->rank; i++) {
            n += snprintf(text + n, sizeof text - (size_t)n, i == 0 ? "%lld" : ",%lld",
                          (long long)shape->dims[i]);
        }
        n += snprintf(text + n, sizeof text - (size_t)n, "]");
    }
    len = n < 0 ? 0 : (size_t)n;
    if (buf != NULL && cap > 0) {
        size_t c = len < cap ? len : cap - 1;
        memcpy(buf, text, c);
        buf[c] = '\0';
    }
    return len;
}

static bool tb__is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

TBDEF tb_status tb_shape_parse(const char *text, tb_shape *out) {
    tb_shape s;
    tb_status st;
    char name[16];
    size_t pos = 0, n = 0;
    if (text == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_shape_parse: %s is NULL",
                         text == NULL ? "text" : "out");
    }
    memset(&s, 0, sizeof s);
    while ((text[pos] >= 'a' && text[pos] <= 'z') || (text[pos] >= '0' && text[pos] <= '9')) {
        if (n + 1 >= sizeof name) break;
        name[n++] = text[pos++];
    }
    name[n] = '\0';
    if (n == 0 || tb_dtype_parse(name, &s.dtype) != TB_OK) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_shape_parse: bad shape text '%.100s': unknown dtype at position 0",
                         text);
    }
    if (text[pos] != '[') {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_shape_parse: bad shape text '%.100s': expected '[' at position %zu",
                         text, pos);
    }
    pos++;
    while (tb__is_space(text[pos]))
        pos++;
    if (text[pos] != ']') {
        for (;;) {
            int64_t v = 0;
            bool too_big = false;
            while (tb__is_space(text[pos]))
                pos++;
            if (text[pos] < '0' || text[pos] > '9') {
                return tb__error(TB_ERR_INVALID_ARGUMENT,
                                 "tb_shape_parse: bad shape text '%.100s': expected a dim (a "
                                 "number >= 0) at position %zu",
                                 text, pos);
            }
            if (s.rank == TB_MAX_RANK) {
                return tb__error(TB_ERR_INVALID_ARGUMENT,
                                 "tb_shape_parse: bad shape text '%.100s': more than %d dims at "
                                 "position %zu",
                                 text, TB_MAX_RANK, pos);
            }
            while (text[pos] >= '0' && text[pos] <= '9') {
                int64_t digit = text[pos] - '0';
                if (!too_big && !tb__muladd_i64(v, 10, digit, &v)) too_big = true;
                pos++;
            }
            if (too_big) {
                return tb__error(TB_ERR_OVERFLOW,
                                 "tb_shape_parse: dim %d of '%.100s' does not fit in int64",
                                 (int)s.rank, text);
            }
            s.dims[s.rank++] = v;
            while (tb__is_space(text[pos]))
                pos++;
            if (text[pos] == ']') break;
            if (text[pos] != ',') {
                return tb__error(TB_ERR_INVALID_ARGUMENT,
                                 "tb_shape_parse: bad shape text '%.100s': expected ',' or ']' at "
                                 "position %zu",
                                 text, pos);
            }
            pos++;
        }
    }
    pos++; /* the ']' */
    if (text[pos] != '\0') {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_shape_parse: bad shape text '%.100s': unexpected text at position %zu",
                         text, pos);
    }
    st = tb__shape_check("tb_shape_parse", &s);
    if (st != TB_OK) return st;
    *out = s;
    return TB_OK;
}

/* ---- src/device.c ---- */
/* ===========================================================================================
   Devices: text form, resolution through the registry, the per-thread device guard
   =========================================================================================== */

/* The calling thread's innermost guarded device. */
static TB__THREAD_LOCAL tb_device tb__guard_device;
static TB__THREAD_LOCAL bool tb__guard_active = false;

TBDEF const char *tb_device_type_name(tb_device_type type) {
    switch (type) {
    case TB_DEVICE_CPU:
        return "CPU";
    case TB_DEVICE_GPU:
        return "GPU";
    case TB_DEVICE_ACCELERATOR:
        return "ACCELERATOR";
    case TB_DEVICE_TYPE_COUNT:
        break;
    }
    return "invalid";
}

static bool tb__ascii_iequal(const char *a, const char *b) {
    for (; *a != '\0' && *b != '\0'; a++, b++) {
        char ca = (*a >= 'A' && *a <= 'Z') ? (char)(*a - 'A' + 'a') : *a;
        char cb = (*b >= 'A' && *b <= 'Z') ? (char)(*b - 'A' + 'a') : *b;
        if (ca != cb) return false;
    }
    return *a == *b;
}

TBDEF tb_status tb_device_type_parse(const char *text, tb_device_type *out) {
    int t;
    if (text == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_device_type_parse: %s is NULL",
                         text == NULL ? "text" : "out");
    }
    for (t = 0; t < (int)TB_DEVICE_TYPE_COUNT; t++) {
        if (tb__ascii_iequal(text, tb_device_type_name((tb_device_type)t))) {
            *out = (tb_device_type)t;
            return TB_OK;
        }
    }
    return tb__error(TB_ERR_INVALID_ARGUMENT,
                     "tb_device_type_parse: unknown device type '%.64s' (expected cpu, gpu or "
                     "accelerator)",
                     text);
}

TBDEF tb_status tb_device_make(const char *backend, int32_t ordinal, tb_device *out) {
    if (backend == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_device_make: %s is NULL",
                         backend == NULL ? "backend" : "out");
    }
    tb__ensure_setup();
    return tb__backend_device("tb_device_make", backend, ordinal, out);
}

TBDEF size_t tb_device_format(const tb_device *device, char *buf, size_t cap) {
    char text[TB_MAX_NAME + 32];
    int n;
    size_t len;
    if (device == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_device_format: device is NULL");
        n = 0;
        text[0] = '\0';
    } else if (device->backend[0] == '\0') {
        n = snprintf(text, sizeof text, "current");
    } else {
        n = snprintf(text, sizeof text, "%.*s:%d", TB_MAX_NAME, device->backend,
                     (int)device->ordinal);
    }
    len = n < 0 ? 0 : (size_t)n;
    if (buf != NULL && cap > 0) {
        size_t c = len < cap ? len : cap - 1;
        memcpy(buf, text, c);
        buf[c] = '\0';
    }
    return len;
}

/* Splits "backend[:ordinal]" without consulting the registry. */
static tb_status tb__device_text_split(const char *fn, const char *text, char name[TB_MAX_NAME + 1],
                                       int32_t *ordinal) {
    size_t n = 0;
    const char *p = text;
    int64_t v = 0;
    while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' ||
           (n > 0 && *p >= '0' && *p <= '9')) {
        if (n == TB_MAX_NAME) {
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: bad device '%.64s': backend name longer than %d bytes", fn, text,
                             TB_MAX_NAME);
        }
        name[n++] = *p++;
    }
    name[n] = '\0';
    if (n == 0) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: bad device '%.64s': expected 'backend' or 'backend:ordinal'", fn,
                         text);
    }
    *ordinal = 0;
    if (*p == '\0') return TB_OK;
    if (*p != ':') {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: bad device '%.64s': unexpected '%c' at position %d (expected "
                         "'backend' or 'backend:ordinal')",
                         fn, text, *p, (int)(p - text));
    }
    p++;
    if (*p < '0' || *p > '9') {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: bad device '%.64s': the ordinal must be a number >= 0", fn, text);
    }
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v > INT32_MAX) {
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: bad device '%.64s': ordinal larger than %d", fn, text,
                             (int)INT32_MAX);
        }
        p++;
    }
    if (*p != '\0') {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: bad device '%.64s': unexpected '%c' at position %d", fn, text, *p,
                         (int)(p - text));
    }
    *ordinal = (int32_t)v;
    return TB_OK;
}

static tb_status tb__device_parse(const char *fn, const char *text, tb_device *out) {
    char name[TB_MAX_NAME + 1];
    int32_t ordinal;
    tb_status st = tb__device_text_split(fn, text, name, &ordinal);
    if (st != TB_OK) return st;
    return tb__backend_device(fn, name, ordinal, out);
}

TBDEF tb_status tb_device_parse(const char *text, tb_device *out) {
    if (text == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_device_parse: %s is NULL",
                         text == NULL ? "text" : "out");
    }
    tb__ensure_setup();
    return tb__device_parse("tb_device_parse", text, out);
}

TBDEF bool tb_device_equal(const tb_device *a, const tb_device *b) {
    if (a == NULL || b == NULL) return false;
    return a->ordinal == b->ordinal && strncmp(a->backend, b->backend, sizeof a->backend) == 0;
}

TBDEF tb_status tb_current_device(tb_device *out) {
    const tb_desc *desc;
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_current_device: out is NULL");
    if (tb__guard_active) {
        *out = tb__guard_device;
        return TB_OK;
    }
    desc = tb__desc();
    if (desc->device != NULL) {
        tb_device d;
        tb_status st = tb__device_parse("tb_current_device", desc->device, &d);
        if (st != TB_OK) {
            /* Keep the reason, and say which setting holds the bad value. */
            static const char prefix[] = "tb_current_device: ";
            char reason[TB__ERROR_CAP];
            const char *source = tb__g.device_source != NULL ? tb__g.device_source : "TB_DEVICE";
            const char *r = tb_last_error();
            if (strncmp(r, prefix, sizeof prefix - 1) == 0) r += sizeof prefix - 1;
            snprintf(reason, sizeof reason, "%s", r);
            return tb__error(st, "tb_current_device: %s='%.64s' is not a usable device: %s", source,
                             desc->device, reason);
        }
        *out = d;
        return TB_OK;
    }
    {
        const tb_backend *b = tb__current_backend("tb_current_device");
        if (b == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_NOT_FOUND;
        return tb_backend_default_device(tb_backend_name(b), out);
    }
}

TBDEF tb_status tb_device_guard_begin(tb_device_guard *guard, const tb_device *device) {
    tb_device d;
    tb_status st;
    if (guard == NULL || device == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_device_guard_begin: %s is NULL",
                         guard == NULL ? "guard" : "device");
    }
    tb__ensure_setup();
    if (device->backend[0] == '\0') {
        st = tb_current_device(&d);
    } else {
        char name[TB_MAX_NAME + 1];
        memcpy(name, device->backend, TB_MAX_NAME);
        name[TB_MAX_NAME] = '\0';
        st = tb__backend_device("tb_device_guard_begin", name, device->ordinal, &d);
    }
    if (st != TB_OK) return st;
    guard->previous = tb__guard_device;
    guard->had_previous = tb__guard_active;
    guard->active = true;
    tb__guard_device = d;
    tb__guard_active = true;
    return TB_OK;
}

TBDEF void tb_device_guard_end(tb_device_guard *guard) {
    if (guard == NULL || !guard->active) return;
    tb__guard_device = guard->previous;
    tb__guard_active = guard->had_previous;
    guard->active = false;
}

/* ---- src/backend.c ---- */
/* ===========================================================================================
   Backend registry, plugins and backend data
   =========================================================================================== */

#if !defined(TB_NO_PLUGINS) && !defined(_WIN32)
#define TB__HAVE_PLUGINS 1
#include <dirent.h> /* tb_backend_list_plugins */
#else
#define TB__HAVE_PLUGINS 0
#endif

/* A registered backend. Entries are separate allocations so that handles stay valid while the
   registry's array grows; they live until tb_shutdown. */
struct tb_backend {
    char name[TB_MAX_NAME + 1];
    char *tags;
    tb_backend_impl impl;
    bool ready;            /* false while its init runs: lookups wait, the name is taken */
    uintptr_t init_thread; /* the thread running init (whose own lookups do not wait) */
    bool defaults_set;     /* default_type/default_ordinal hold the backend's defaults */
    tb_device_type default_type;
    int32_t default_ordinal;
    void *plugin; /* the shared object it came from (closed at shutdown), or NULL */
};

typedef struct tb__registry {
    tb_backend **items;
    size_t count, cap;
    size_t removals;       /* entries removed (a failed init), so that a walk can restart */
    tb_backend *current;   /* NULL until chosen (lazily from the desc) */
    int32_t builtins_done; /* read atomically */
    const tb_backend *cpu; /* the reference backend, whose payloads are tb__host_buffer */
} tb__registry;

static tb__registry tb__reg;
static tb__mutex tb__reg_mutex = TB__MUTEX_INIT;
/* Held while the built-in backends register (one thread does it, the others wait). */
static tb__mutex tb__builtin_mutex = TB__MUTEX_INIT;
/* Set on the thread registering the built-ins, whose registrations re-enter the registry. */
static TB__THREAD_LOCAL bool tb__builtin_thread = false;

/* ---- names and tags ---- */

static bool tb__ident_char(char c, bool first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           (!first && c >= '0' && c <= '9');
}

/* 1..TB_MAX_NAME bytes of [A-Za-z_][A-Za-z0-9_]* */
static bool tb__name_valid(const char *name) {
    size_t i;
    if (name == NULL || name[0] == '\0') return false;
    for (i = 0; name[i] != '\0'; i++) {
        if (i >= TB_MAX_NAME || !tb__ident_char(name[i], i == 0)) return false;
    }
    return true;
}

static tb_status tb__name_check(const char *fn, const char *what, const char *name) {
    if (name == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s name is NULL", fn, what);
    if (tb__name_valid(name)) return TB_OK;
    if (strlen(name) > TB_MAX_NAME) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s name '%.64s' is longer than %d bytes", fn,
                         what, name, TB_MAX_NAME);
    }
    return tb__error(TB_ERR_INVALID_ARGUMENT,
                     "%s: bad %s name '%.64s' (expected [A-Za-z_][A-Za-z0-9_]*, 1..%d bytes)", fn,
                     what, name, TB_MAX_NAME);
}

/* Room for a quoted foreign string: 64 bytes, "..." and the NUL. */
#define TB__QUOTE_CAP 68

/* Copies at most 64 bytes of `src` (a caller's or a plugin's string) into `dst` for a message:
   bytes outside printable ASCII become '?', and "..." marks a cut. Reads at most 65 bytes. */
static void tb__quote(char dst[TB__QUOTE_CAP], const char *src) {
    size_t i;
    for (i = 0; i < 64 && src[i] != '\0'; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = c >= 0x20 && c <= 0x7e ? (char)c : '?';
    }
    if (i == 64 && src[i] != '\0') {
        memcpy(dst + i, "...", 3);
        i += 3;
    }
    dst[i] = '\0';
}

/* Walks comma-separated tags; spaces around a tag are ignored. Returns false on a bad list. */
static bool tb__tags_next(const char **cursor, const char **tag, size_t *len) {
    const char *p = *cursor;
    while (*p == ' ')
        p++;
    *tag = p;
    while (tb__ident_char(*p, p == *tag))
        p++;
    *len = (size_t)(p - *tag);
    while (*p == ' ')
        p++;
    if (*len == 0) return false;
    if (*p == ',') {
        p++;
        if (*p == '\0') return false; /* a trailing comma */
    } else if (*p != '\0') {
        return false;
    }
    *cursor = p;
    return true;
}

static bool tb__tags_valid(const char *tags) {
    const char *cursor = tags, *tag;
    size_t len;
    while (*cursor != '\0') {
        if (!tb__tags_next(&cursor, &tag, &len)) return false;
    }
    return true;
}

static bool tb__tags_have(const char *tags, const char *wanted) {
    const char *cursor = tags, *tag;
    size_t len;
    if (tags == NULL || wanted == NULL) return false;
    while (*cursor != '\0') {
        if (!tb__tags_next(&cursor, &tag, &len)) return false;
        if (strlen(wanted) == len && strncmp(tag, wanted, len) == 0) return true;
    }
    return false;
}

/* ---- the registry ---- */

/* Why a built-in backend is missing after tb__registry_ensure. */
typedef struct tb__builtin_failure {
    tb_status status;           /* TB_OK: every built-in backend is registered */
    char name[TB_MAX_NAME + 1]; /* the first one that could not be */
    char reason[TB__ERROR_CAP];
} tb__builtin_failure;

/* Registers the built-in backends that are not registered yet. A failure (memory ran out) is
   not remembered: the next call tries again, so a transient failure does not disable a
   backend for the rest of the process. The caller's error is kept; the first failure is
   described in `why` (may be NULL). */
static void tb__registry_ensure(tb__builtin_failure *why) {
    tb__builtin_failure local;
    if (why == NULL) why = &local;
    why->status = TB_OK;
    why->name[0] = '\0';
    why->reason[0] = '\0';
    if (TB__ATOMIC_LOAD(&tb__reg.builtins_done) != 0 || tb__builtin_thread) return;
    tb__mutex_lock(&tb__builtin_mutex);
    if (TB__ATOMIC_LOAD(&tb__reg.builtins_done) == 0) {
        tb__saved_error saved;
        tb__error_save(&saved);
        tb__builtin_thread = true;
        tb__register_builtin_backends(why);
        tb__builtin_thread = false;
        tb__error_restore(&saved);
        if (why->status == TB_OK) TB__ATOMIC_ADD(&tb__reg.builtins_done, 1);
    }
    tb__mutex_unlock(&tb__builtin_mutex);
}

/* Any entry of that name, ready or not. Called with the lock held. */
static tb_backend *tb__find_locked(const char *name) {
    size_t i;
    for (i = 0; i < tb__reg.count; i++) {
        if (strcmp(tb__reg.items[i]->name, name) == 0) return tb__reg.items[i];
    }
    return NULL;
}

/* A registered backend of that name. One whose init is running on another thread is waited
   for (inits are short and rare), so that a lookup racing a registration sees its outcome. */
static tb_backend *tb__find_ready(const char *name) {
    for (;;) {
        tb_backend *b;
        bool pending = false;
        tb__mutex_lock(&tb__reg_mutex);
        b = tb__find_locked(name);
        if (b != NULL && !b->ready) {
            pending = b->init_thread != tb__thread_id();
            b = NULL;
        }
        tb__mutex_unlock(&tb__reg_mutex);
        if (!pending) return b;
        tb__yield();
    }
}

static void tb__remove_entry(tb_backend *b) {
    size_t i;
    tb__mutex_lock(&tb__reg_mutex);
    for (i = 0; i < tb__reg.count; i++) {
        if (tb__reg.items[i] == b) {
            memmove(tb__reg.items + i, tb__reg.items + i + 1,
                    (tb__reg.count - i - 1) * sizeof *tb__reg.items);
            tb__reg.count--;
            tb__reg.removals++;
            break;
        }
    }
    tb__mutex_unlock(&tb__reg_mutex);
}

static void tb__entry_free(tb_backend *b) {
    if (b == NULL) return;
    tb__free(b->tags);
    tb__free(b);
}

/* Keeps a backend entry's own message after it failed, or writes one when it gave none.
   The caller cleared the error before the call. */
static tb_status tb__backend_failed(tb_status st, const tb_backend *b, const char *entry) {
    if (tb_last_status() == TB_OK || tb_last_error()[0] == '\0') {
        return tb__error(st, "backend '%s': %s failed (%s)", b->name, entry, tb_status_string(st));
    }
    tb__err_status = st;
    return st;
}

static const char *const tb__required_entries[] = {
    "data_from_host", "data_to_host", "data_release",        "create_lowering_context",
    "compile",        "execute",      "release_computation", "get_backend_devices"};

/* The name of the first required entry the vtable lacks, or NULL. */
static const char *tb__missing_entry(const tb_backend_impl *impl) {
    bool present[8];
    size_t i;
    present[0] = impl->data_from_host != NULL;
    present[1] = impl->data_to_host != NULL;
    present[2] = impl->data_release != NULL;
    present[3] = impl->create_lowering_context != NULL;
    present[4] = impl->compile != NULL;
    present[5] = impl->execute != NULL;
    present[6] = impl->release_computation != NULL;
    present[7] = impl->get_backend_devices != NULL;
    for (i = 0; i < 8; i++) {
        if (!present[i]) return tb__required_entries[i];
    }
    return NULL;
}

/* Registers a backend. The name is reserved before init runs (outside the lock, so init may
   call the library), which makes a concurrent registration of the same name fail with
   TB_ERR_DUPLICATE; an init failure releases the name again. */
static tb_status tb__backend_register(const char *fn, const char *name, const tb_backend_impl *impl,
                                      const char *tags, void *plugin, tb_backend **out) {
    tb_backend *b;
    const char *missing;
    tb_status st;
    st = tb__name_check(fn, "backend", name);
    if (st != TB_OK) return st;
    if (impl == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: impl is NULL", fn);
    missing = tb__missing_entry(impl);
    if (missing != NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: backend '%s' lacks the required entry %s",
                         fn, name, missing);
    }
    if (tags == NULL) tags = "";
    if (!tb__tags_valid(tags)) {
        char quoted[TB__QUOTE_CAP];
        tb__quote(quoted, tags);
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: bad tags '%s' for backend '%s' (expected comma-separated "
                         "identifiers)",
                         fn, quoted, name);
    }
    b = (tb_backend *)tb__calloc(1, sizeof *b);
    if (b == NULL) return tb_last_status();
    memcpy(b->name, name, strlen(name) + 1);
    b->tags = tb__strdup(tags);
    if (b->tags == NULL) {
        tb__free(b);
        return tb_last_status();
    }
    b->impl = *impl;
    b->plugin = plugin;
    b->init_thread = tb__thread_id();

    tb__mutex_lock(&tb__reg_mutex);
    if (tb__find_locked(name) != NULL) {
        tb__mutex_unlock(&tb__reg_mutex);
        tb__entry_free(b);
        return tb__error(TB_ERR_DUPLICATE, "%s: duplicate name: %s", fn, name);
    }
    {
        void *items = tb__reg.items;
        st = tb__grow(&items, &tb__reg.cap, tb__reg.count + 1, sizeof *tb__reg.items);
        tb__reg.items = (tb_backend **)items;
    }
    if (st != TB_OK) {
        tb__mutex_unlock(&tb__reg_mutex);
        tb__entry_free(b);
        return st;
    }
    tb__reg.items[tb__reg.count++] = b;
    tb__mutex_unlock(&tb__reg_mutex);

    if (impl->init != NULL) {
        tb__saved_error saved;
        tb__error_save(&saved);
        tb_clear_error();
        st = impl->init(impl->user_data);
        if (st != TB_OK) {
            char reason[TB__ERROR_CAP];
            snprintf(reason, sizeof reason, "%s",
                     tb_last_error()[0] != '\0' ? tb_last_error() : tb_status_string(st));
            tb__remove_entry(b);
            tb__entry_free(b);
            return tb__error(st, "%s: init of backend '%s' failed: %s", fn, name, reason);
        }
        tb__error_restore(&saved);
    }
    tb__mutex_lock(&tb__reg_mutex);
    b->ready = true;
    tb__mutex_unlock(&tb__reg_mutex);
    if (out != NULL) *out = b;
    return TB_OK;
}

TBDEF tb_status tb_backend_register(const char *name, const tb_backend_impl *impl,
                                    const char *tags) {
    tb__builtin_failure why;
    tb__ensure_setup();
    /* the built-in names are the built-ins' own: none is taken while one is missing */
    tb__registry_ensure(&why);
    if (why.status != TB_OK) {
        return tb__error(why.status,
                         "tb_backend_register: cannot register the built-in backend "
                         "'%s' first: %s",
                         why.name, why.reason);
    }
    return tb__backend_register("tb_backend_register", name, impl, tags, NULL, NULL);
}

/* The ready names, sorted, as "a, b, c" (for messages). */
static void tb__available_names(char *buf, size_t cap) {
    const char *prev = NULL;
    size_t len = 0;
    buf[0] = '\0';
    tb__mutex_lock(&tb__reg_mutex);
    for (;;) {
        const char *next = NULL;
        size_t i;
        int n;
        for (i = 0; i < tb__reg.count; i++) {
            const char *nm = tb__reg.items[i]->name;
            if (!tb__reg.items[i]->ready) continue;
            if (prev != NULL && strcmp(nm, prev) <= 0) continue;
            if (next == NULL || strcmp(nm, next) < 0) next = nm;
        }
        if (next == NULL) break;
        n = snprintf(buf + len, cap - len, "%s%s", prev != NULL ? ", " : "", next);
        if (n < 0 || (size_t)n >= cap - len) break;
        len += (size_t)n;
        prev = next;
    }
    tb__mutex_unlock(&tb__reg_mutex);
    if (buf[0] == '\0') snprintf(buf, cap, "(none)");
}

/* ---- plugins ---- */

/* A plugin carries its own copy of the library (TB_STATIC + TB_IMPLEMENTATION), with its own
   thread-local error. The host finds this function in the plugin's object and calls it with
   its services before the plugin's entry runs, so that the copy's tb_set_error reaches the
   host's tb_last_error too. Weak, so that several TB_STATIC copies link into one object (the
   first one found is attached); the one external symbol of a TB_STATIC build. */
#if defined(TB_STATIC) && !defined(_WIN32) && (defined(__GNUC__) || defined(__clang__))
#ifdef __cplusplus
extern "C" {
#endif
__attribute__((weak, visibility("default"))) void tb_plugin_attach_host(const tb_plugin_host *host);
__attribute__((weak, visibility("default"))) void
tb_plugin_attach_host(const tb_plugin_host *host) {
    if (host != NULL && host->api_version == TB_API_VERSION && host->set_error != NULL) {
        tb__plugin_parent = host;
    }
}
#ifdef __cplusplus
}
#endif
#endif

#if TB__HAVE_PLUGINS
static tb_status tb__host_set_error(tb_status status, const char *message) {
    return tb__error(status, "%s", message != NULL ? message : "");
}

static void tb__host_log(tb_log_level level, const char *message) {
    tb_log_message(level, "%s", message != NULL ? message : "");
}

static void *tb__host_alloc(size_t size) {
    return tb__alloc(size);
}

static void tb__host_free(void *ptr) {
    tb__free(ptr);
}

/* Static: plugins keep the pointer for as long as they are loaded. */
static const tb_plugin_host tb__plugin_host = {TB_API_VERSION, tb__host_set_error, tb__host_log,
                                               tb__host_alloc, tb__host_free};

/* Sets the error, then unloads the object: the message may quote the plugin's strings, which
   are gone once it is closed, so every failure after dlopen goes through here. */
static tb_status tb__plugin_fail(void *handle, tb_status status, const char *fmt, ...)
    TB_PRINTF_LIKE(3, 4);
static tb_status tb__plugin_fail(void *handle, tb_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tb__error_v(status, fmt, ap);
    va_end(ap);
    dlclose(handle);
    return status;
}

/* Why a plugin's backend name is unusable, in `buf` (quoting at most 64 bytes of it, printable
   ASCII only); false when the name is good. */
static bool tb__plugin_name_problem(const char *name, char *buf, size_t cap) {
    char quoted[TB__QUOTE_CAP];
    size_t len;
    if (name == NULL) {
        snprintf(buf, cap, "gives no backend name (NULL)");
        return true;
    }
    if (tb__name_valid(name)) return false;
    for (len = 0; len <= TB_MAX_NAME && name[len] != '\0'; len++) {
    }
    tb__quote(quoted, name);
    if (len == 0) {
        snprintf(buf, cap, "gives an empty backend name");
    } else if (len > TB_MAX_NAME) {
        snprintf(buf, cap, "gives a backend name longer than %d bytes ('%s')", TB_MAX_NAME, quoted);
    } else {
        snprintf(buf, cap, "gives a bad backend name '%s' (expected [A-Za-z_][A-Za-z0-9_]*)",
                 quoted);
    }
    return true;
}

/* Loads the shared object at `path` and registers the backend it describes; `expected` is the
   name it must give (NULL: any). Every failure closes the object and leaves the registry as it
   was: TB_ERR_PLUGIN, or TB_ERR_DUPLICATE when the name is taken. Nothing of the plugin's is
   read after it is closed: on success its strings were copied by the registration. */
static tb_status tb__plugin_load(const char *fn, const char *path, const char *expected,
                                 tb_backend **out) {
    void *handle, *sym;
    tb_plugin_entry_fn entry;
    tb_plugin_desc desc;
    tb_status st;
    char reason[TB__ERROR_CAP];
    const char *err;

    dlerror();
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        err = dlerror();
        return tb__error(TB_ERR_PLUGIN, "%s: cannot load plugin %.400s: %.400s", fn, path,
                         err != NULL ? err : "unknown reason");
    }
    sym = dlsym(handle, TB_PLUGIN_ENTRY_NAME);
    if (sym == NULL) {
        return tb__plugin_fail(handle, TB_ERR_PLUGIN, "%s: plugin %.400s does not export %s", fn,
                               path, TB_PLUGIN_ENTRY_NAME);
    }
    /* ISO C has no cast from an object pointer to a function pointer; POSIX guarantees the
       representations match. */
    memcpy(&entry, &sym, sizeof entry);
    /* a plugin with its own copy of the library: that copy's tb_set_error reaches us too */
    sym = dlsym(handle, TB_PLUGIN_ATTACH_NAME);
    if (sym != NULL) {
        tb_plugin_attach_fn attach;
        memcpy(&attach, &sym, sizeof attach);
        attach(&tb__plugin_host);
    }

    memset(&desc, 0, sizeof desc);
    {
        tb__saved_error saved;
        tb__error_save(&saved);
        tb_clear_error();
        st = entry(&tb__plugin_host, &desc);
        if (st != TB_OK) {
            snprintf(reason, sizeof reason, "%s",
                     tb_last_error()[0] != '\0' ? tb_last_error() : tb_status_string(st));
            return tb__plugin_fail(handle, TB_ERR_PLUGIN, "%s: plugin %.400s: %s failed: %s", fn,
                                   path, TB_PLUGIN_ENTRY_NAME, reason);
        }
        tb__error_restore(&saved);
    }
    if (desc.api_version != TB_API_VERSION) {
        return tb__plugin_fail(handle, TB_ERR_PLUGIN,
                               "%s: plugin %.400s was built for API version %u, this library has "
                               "%u",
                               fn, path, (unsigned)desc.api_version, (unsigned)TB_API_VERSION);
    }
    if (tb__plugin_name_problem(desc.name, reason, sizeof reason)) {
        return tb__plugin_fail(handle, TB_ERR_PLUGIN, "%s: plugin %.400s %s", fn, path, reason);
    }
    if (expected != NULL && strcmp(desc.name, expected) != 0) {
        return tb__plugin_fail(handle, TB_ERR_PLUGIN,
                               "%s: plugin %.400s registers backend '%s', expected '%s'", fn, path,
                               desc.name, expected);
    }
    st = tb__backend_register(fn, desc.name, &desc.impl, desc.tags, handle, out);
    if (st != TB_OK) {
        /* the registration's message may quote the plugin's strings: it is our copy already */
        snprintf(reason, sizeof reason, "%s", tb_last_error());
        if (st == TB_ERR_DUPLICATE) return tb__plugin_fail(handle, st, "%s", reason);
        return tb__plugin_fail(handle, TB_ERR_PLUGIN, "%s: plugin %.400s: %s", fn, path, reason);
    }
    return TB_OK;
}

static bool tb__is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Why `path` is not a regular file, for "cannot open PATH: REASON"; NULL when it is one. The
   errno of the failed stat is read at once, before any other call can change it. */
static const char *tb__file_problem(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        int err = errno;
        return err != 0 ? strerror(err) : "stat failed";
    }
    if (S_ISDIR(st.st_mode)) return "it is a directory";
    if (!S_ISREG(st.st_mode)) return "not a regular file";
    return NULL;
}

/* Searches $TB_BACKEND_PATH for libtb_backend_<name>.so and loads the first one found.
   NULL with *found false: no such file (no error set); NULL with *found true: it failed. */
static tb_backend *tb__plugin_search(const char *fn, const char *name, bool *found) {
    const char *dirs = tb__getenv("TB_BACKEND_PATH");
    const char *p = dirs;
    *found = false;
    while (p != NULL && *p != '\0') {
        const char *end = strchr(p, ':');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        if (len > 0) {
            char *path = tb__format("%.*s/libtb_backend_%s.so", (int)len, p, name);
            if (path == NULL) {
                *found = true;
                return NULL;
            }
            if (tb__is_file(path)) {
                tb_backend *b = NULL;
                tb_status st;
                *found = true;
                st = tb__plugin_load(fn, path, name, &b);
                tb__free(path);
                if (st == TB_OK) return b;
                /* another thread loaded it meanwhile */
                if (st == TB_ERR_DUPLICATE) return tb__find_ready(name);
                return NULL;
            }
            tb__free(path);
        }
        p = end != NULL ? end + 1 : NULL;
    }
    return NULL;
}
#endif

/* Lookup with messages naming `fn`; loads a plugin on a miss. */
static tb_backend *tb__lookup(const char *fn, const char *name) {
    tb_backend *b;
    tb__builtin_failure why;
    char available[512];
    if (name == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: backend name is NULL", fn);
        return NULL;
    }
    tb__ensure_setup();
    tb__registry_ensure(&why);
    b = tb__find_ready(name);
    if (b != NULL) return b;
    if (why.status != TB_OK && strcmp(why.name, name) == 0) {
        /* the real cause, not "unknown backend": the next call tries again */
        tb__error(why.status, "%s: cannot register the built-in backend '%s': %s", fn, name,
                  why.reason);
        return NULL;
    }
#if TB__HAVE_PLUGINS
    if (tb__name_valid(name)) {
        bool found;
        b = tb__plugin_search(fn, name, &found);
        if (b != NULL || found) return b;
    }
#endif
    tb__available_names(available, sizeof available);
    tb__error(TB_ERR_NOT_FOUND, "%s: unknown backend '%.64s'; available: %s", fn, name, available);
    return NULL;
}

TBDEF tb_backend *tb_backend_lookup(const char *name) {
    return tb__lookup("tb_backend_lookup", name);
}

TBDEF bool tb_has_backend(const char *name) {
    tb__saved_error saved;
    tb_backend *b;
    if (name == NULL) return false;
    tb__error_save(&saved);
    b = tb__lookup("tb_has_backend", name);
    tb__error_restore(&saved);
    return b != NULL;
}

static bool tb__hidden(const tb_backend *b) {
    return tb__tags_have(b->tags, "debug") || tb__tags_have(b->tags, "experimental");
}

TBDEF size_t tb_backend_list(const char **names, size_t cap, bool include_hidden) {
    const char *prev = NULL;
    size_t n = 0;
    if (names == NULL) cap = 0; /* the count alone, whatever cap says */
    tb__ensure_setup();
    tb__registry_ensure(NULL);
    tb__mutex_lock(&tb__reg_mutex);
    /* Selection by "next larger name": no allocation, and the lists are short. */
    for (;;) {
        const char *next = NULL;
        size_t i;
        for (i = 0; i < tb__reg.count; i++) {
            const tb_backend *b = tb__reg.items[i];
            if (!b->ready || (!include_hidden && tb__hidden(b))) continue;
            if (prev != NULL && strcmp(b->name, prev) <= 0) continue;
            if (next == NULL || strcmp(b->name, next) < 0) next = b->name;
        }
        if (next == NULL) break;
        if (n < cap) names[n] = next;
        n++;
        prev = next;
    }
    tb__mutex_unlock(&tb__reg_mutex);
    return n;
}

TBDEF const char *tb_backend_name(const tb_backend *backend) {
    if (backend == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_backend_name: backend is NULL");
        return NULL;
    }
    return backend->name;
}

TBDEF const char *tb_backend_tags(const tb_backend *backend) {
    if (backend == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_backend_tags: backend is NULL");
        return NULL;
    }
    return backend->tags;
}

TBDEF bool tb_backend_has_tag(const tb_backend *backend, const char *tag) {
    if (backend == NULL || tag == NULL) return false;
    return tb__tags_have(backend->tags, tag);
}

TBDEF const tb_backend_impl *tb_backend_get_impl(const tb_backend *backend) {
    if (backend == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_backend_get_impl: backend is NULL");
        return NULL;
    }
    return &backend->impl;
}

static TB__UNUSED const tb_backend_impl *tb__backend_vtable(const tb_backend *backend) {
    return &backend->impl;
}

/* ---- the current backend ---- */

TBDEF tb_status tb_set_backend(const char *name) {
    tb_backend *b = tb__lookup("tb_set_backend", name);
    if (b == NULL) return tb_last_status();
    tb__mutex_lock(&tb__reg_mutex);
    tb__reg.current = b;
    tb__mutex_unlock(&tb__reg_mutex);
    return TB_OK;
}

/* The current backend: the one tb_set_backend chose, else the default (desc.backend,
   $TB_BACKEND, "cpu"), looked up on first use. A default that names no usable backend is an
   error each time it is used, in the words tb_current_device uses for a bad desc.device or
   $TB_DEVICE; nothing falls back to another backend. */
static const tb_backend *tb__current_backend(const char *fn) {
    tb_backend *b;
    const char *wanted, *source;
    tb__ensure_setup();
    tb__registry_ensure(NULL);
    tb__mutex_lock(&tb__reg_mutex);
    b = tb__reg.current;
    tb__mutex_unlock(&tb__reg_mutex);
    if (b != NULL) return b;

    wanted = tb__desc()->backend != NULL ? tb__desc()->backend : "cpu";
    source = tb__g.backend_source;
    b = tb__lookup(fn, wanted);
    if (b == NULL) {
        char reason[TB__ERROR_CAP];
        const char *r = tb_last_error();
        size_t n = strlen(fn);
        tb_status st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_NOT_FOUND;
        if (source == NULL) return NULL; /* the reference backend itself: its own error */
        /* keep the reason, and say which setting holds the bad value */
        if (strncmp(r, fn, n) == 0 && strncmp(r + n, ": ", 2) == 0) r += n + 2;
        snprintf(reason, sizeof reason, "%s", r);
        tb__error(st, "%s: %s='%.64s' is not a usable backend: %s", fn, source, wanted, reason);
        return NULL;
    }
    tb__mutex_lock(&tb__reg_mutex);
    if (tb__reg.current == NULL) tb__reg.current = b;
    b = tb__reg.current;
    tb__mutex_unlock(&tb__reg_mutex);
    return b;
}

TBDEF const char *tb_get_backend(void) {
    const tb_backend *b = tb__current_backend("tb_get_backend");
    return b != NULL ? b->name : NULL;
}

/* ---- devices ---- */

/* The backend's device list: in `stack` when it fits, else in an allocation (*list != stack,
   the caller frees it). Fills the backend name and each ordinal. */
static tb_status tb__device_list(const tb_backend *b, tb_device *stack, size_t stack_cap,
                                 tb_device **list, size_t *count) {
    size_t n, i;
    tb_device *items = stack;
    memset(stack, 0, stack_cap * sizeof *stack);
    n = b->impl.get_backend_devices(b->impl.user_data, stack, stack_cap);
    if (n > stack_cap) {
        size_t m;
        items = (tb_device *)tb__calloc(n, sizeof *items);
        if (items == NULL) return tb_last_status();
        m = b->impl.get_backend_devices(b->impl.user_data, items, n);
        if (m < n) n = m;
    }
    for (i = 0; i < n; i++) {
        memcpy(items[i].backend, b->name, sizeof items[i].backend);
        items[i].ordinal = (int32_t)i;
    }
    *list = items;
    *count = n;
    return TB_OK;
}

/* The device `ordinal` of backend `b`. Messages name `fn`. */
static tb_status tb__device_of(const char *fn, const tb_backend *b, int32_t ordinal,
                               tb_device *out) {
    tb_device stack[16], *list = NULL, d;
    size_t count = 0;
    tb_status st;
    if (ordinal < 0) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: device ordinal %d is negative", fn,
                         (int)ordinal);
    }
    st = tb__device_list(b, stack, 16, &list, &count);
    if (st != TB_OK) return st;
    if (count == 0) {
        if (list != stack) tb__free(list);
        /* A backend with no devices may know why (no driver, no platform): ask it. */
        if (b->impl.get_backend_device != NULL) {
            tb_clear_error();
            st = b->impl.get_backend_device(b->impl.user_data, ordinal, &d);
            if (st != TB_OK && tb_last_error()[0] != '\0') {
                return tb__error(TB_ERR_UNAVAILABLE, "%s: backend '%s' has no devices: %s", fn,
                                 b->name, tb_last_error());
            }
        }
        return tb__error(TB_ERR_UNAVAILABLE, "%s: backend '%s' has no devices", fn, b->name);
    }
    if ((size_t)ordinal >= count) {
        if (list != stack) tb__free(list);
        return tb__error(TB_ERR_NOT_FOUND,
                         "%s: device ordinal %d out of range: backend '%s' has %zu device%s", fn,
                         (int)ordinal, b->name, count, count == 1 ? "" : "s");
    }
    d = list[ordinal];
    if (list != stack) tb__free(list);
    if (b->impl.get_backend_device != NULL) {
        tb__saved_error saved;
        tb__error_save(&saved);
        tb_clear_error();
        st = b->impl.get_backend_device(b->impl.user_data, ordinal, &d);
        if (st != TB_OK) return tb__backend_failed(st, b, "get_backend_device");
        tb__error_restore(&saved);
        memcpy(d.backend, b->name, sizeof d.backend);
        d.ordinal = ordinal;
    }
    if (!((int)d.type >= 0 && (int)d.type < (int)TB_DEVICE_TYPE_COUNT)) {
        return tb__error(TB_ERR_INTERNAL, "%s: backend '%s' gives device %d the invalid type %d",
                         fn, b->name, (int)ordinal, (int)d.type);
    }
    *out = d;
    return TB_OK;
}

static TB__UNUSED tb_status tb__backend_device(const char *fn, const char *backend, int32_t ordinal,
                                               tb_device *out) {
    tb_backend *b = tb__lookup(fn, backend);
    if (b == NULL) return tb_last_status();
    return tb__device_of(fn, b, ordinal, out);
}

TBDEF tb_status tb_backend_devices(const char *backend, tb_device *out, size_t cap, size_t *count) {
    tb_backend *b;
    size_t n, i;
    if (out == NULL) cap = 0; /* the count alone, whatever cap says */
    b = tb__lookup("tb_backend_devices", backend);
    if (b == NULL) return tb_last_status();
    if (cap > 0) memset(out, 0, cap * sizeof *out);
    n = b->impl.get_backend_devices(b->impl.user_data, out, cap);
    for (i = 0; i < n && i < cap; i++) {
        memcpy(out[i].backend, b->name, sizeof out[i].backend);
        out[i].ordinal = (int32_t)i;
    }
    if (count != NULL) *count = n;
    return TB_OK;
}

TBDEF tb_status tb_backend_device_info(const tb_device *device, tb_device_info *out) {
    tb_device d;
    tb_status st;
    tb_backend *b;
    if (device == NULL || out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_backend_device_info: %s is NULL",
                         device == NULL ? "device" : "out");
    }
    if (device->backend[0] == '\0') {
        st = tb_current_device(&d);
    } else {
        char name[TB_MAX_NAME + 1];
        memcpy(name, device->backend, TB_MAX_NAME);
        name[TB_MAX_NAME] = '\0';
        st = tb__backend_device("tb_backend_device_info", name, device->ordinal, &d);
    }
    if (st != TB_OK) return st;
    b = tb__lookup("tb_backend_device_info", d.backend);
    if (b == NULL) return tb_last_status();
    memset(out, 0, sizeof *out);
    out->device = d;
    if (b->impl.get_device_info != NULL) {
        tb__saved_error saved;
        tb__error_save(&saved);
        tb_clear_error();
        st = b->impl.get_device_info(b->impl.user_data, d.ordinal, out);
        if (st != TB_OK) return tb__backend_failed(st, b, "get_device_info");
        tb__error_restore(&saved);
        out->device = d;
        /* whatever the backend wrote, the strings end inside their arrays */
        out->name[sizeof out->name - 1] = '\0';
        out->vendor[sizeof out->vendor - 1] = '\0';
        out->driver_version[sizeof out->driver_version - 1] = '\0';
        out->language_version[sizeof out->language_version - 1] = '\0';
        out->extensions[sizeof out->extensions - 1] = '\0';
    }
    return TB_OK;
}

/* Fills the library-kept defaults from device 0 the first time they are needed. */
static void tb__defaults_init(tb_backend *b) {
    tb_device stack[16], *list = NULL;
    size_t count = 0;
    tb_device_type type = TB_DEVICE_CPU;
    bool set;
    tb__mutex_lock(&tb__reg_mutex);
    set = b->defaults_set;
    tb__mutex_unlock(&tb__reg_mutex);
    if (set) return;
    if (tb__device_list(b, stack, 16, &list, &count) == TB_OK) {
        if (count > 0) type = list[0].type;
        if (list != stack) tb__free(list);
    }
    tb__mutex_lock(&tb__reg_mutex);
    if (!b->defaults_set) {
        b->default_type = type;
        b->default_ordinal = 0;
        b->defaults_set = true;
    }
    tb__mutex_unlock(&tb__reg_mutex);
}

TBDEF tb_status tb_backend_get_default_device_type(const char *backend, tb_device_type *out) {
    tb_backend *b;
    if (out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_backend_get_default_device_type: out is NULL");
    }
    b = tb__lookup("tb_backend_get_default_device_type", backend);
    if (b == NULL) return tb_last_status();
    if (b->impl.get_default_device_type != NULL) {
        *out = b->impl.get_default_device_type(b->impl.user_data);
        return TB_OK;
    }
    tb__defaults_init(b);
    tb__mutex_lock(&tb__reg_mutex);
    *out = b->default_type;
    tb__mutex_unlock(&tb__reg_mutex);
    return TB_OK;
}

TBDEF tb_status tb_backend_get_default_device_ordinal(const char *backend, int32_t *out) {
    tb_backend *b;
    if (out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_backend_get_default_device_ordinal: out is NULL");
    }
    b = tb__lookup("tb_backend_get_default_device_ordinal", backend);
    if (b == NULL) return tb_last_status();
    if (b->impl.get_default_device_ordinal != NULL) {
        *out = b->impl.get_default_device_ordinal(b->impl.user_data);
        return TB_OK;
    }
    tb__defaults_init(b);
    tb__mutex_lock(&tb__reg_mutex);
    *out = b->default_ordinal;
    tb__mutex_unlock(&tb__reg_mutex);
    return TB_OK;
}

/* Without hooks the library keeps the default as a device: setting a type moves the default
   to the first device of that type (unless the current default already has it), setting an
   ordinal takes that device's type. */
TBDEF tb_status tb_backend_set_default_device_type(const char *backend, tb_device_type type) {
    static const char fn[] = "tb_backend_set_default_device_type";
    tb_backend *b;
    tb_device stack[16], *list = NULL;
    size_t count = 0, i;
    tb_status st;
    int32_t ordinal;
    if (!((int)type >= 0 && (int)type < (int)TB_DEVICE_TYPE_COUNT)) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: invalid device type %d", fn, (int)type);
    }
    b = tb__lookup(fn, backend);
    if (b == NULL) return tb_last_status();
    if (b->impl.set_default_device_type != NULL) {
        tb__saved_error saved;
        tb__error_save(&saved);
        tb_clear_error();
        st = b->impl.set_default_device_type(b->impl.user_data, type);
        if (st != TB_OK) return tb__backend_failed(st, b, "set_default_device_type");
        tb__error_restore(&saved);
        tb__defaults_init(b);
        tb__mutex_lock(&tb__reg_mutex);
        b->default_type = type;
        tb__mutex_unlock(&tb__reg_mutex);
        return TB_OK;
    }
    tb__defaults_init(b);
    st = tb__device_list(b, stack, 16, &list, &count);
    if (st != TB_OK) return st;
    tb__mutex_lock(&tb__reg_mutex);
    ordinal = b->default_ordinal;
    tb__mutex_unlock(&tb__reg_mutex);
    if (ordinal < 0 || (size_t)ordinal >= count || list[ordinal].type != type) {
        ordinal = -1;
        for (i = 0; i < count; i++) {
            if (list[i].type == type) {
                ordinal = (int32_t)i;
                break;
            }
        }
    }
    if (list != stack) tb__free(list);
    if (ordinal < 0) {
        return tb__error(TB_ERR_NOT_FOUND, "%s: backend '%s' has no %s device", fn, b->name,
                         tb_device_type_name(type));
    }
    tb__mutex_lock(&tb__reg_mutex);
    b->default_type = type;
    b->default_ordinal = ordinal;
    tb__mutex_unlock(&tb__reg_mutex);
    return TB_OK;
}

TBDEF tb_status tb_backend_set_default_device_ordinal(const char *backend, int32_t ordinal) {
    static const char fn[] = "tb_backend_set_default_device_ordinal";
    tb_backend *b;
    tb_device d;
    tb_status st;
    b = tb__lookup(fn, backend);
    if (b == NULL) return tb_last_status();
    if (b->impl.set_default_device_ordinal != NULL) {
        tb__saved_error saved;
        if (ordinal < 0) {
            return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: device ordinal %d is negative", fn,
                             (int)ordinal);
        }
        tb__error_save(&saved);
        tb_clear_error();
        st = b->impl.set_default_device_ordinal(b->impl.user_data, ordinal);
        if (st != TB_OK) return tb__backend_failed(st, b, "set_default_device_ordinal");
        tb__error_restore(&saved);
        tb__defaults_init(b);
        tb__mutex_lock(&tb__reg_mutex);
        b->default_ordinal = ordinal;
        tb__mutex_unlock(&tb__reg_mutex);
        return TB_OK;
    }
    st = tb__device_of(fn, b, ordinal, &d);
    if (st != TB_OK) return st;
    tb__defaults_init(b);
    tb__mutex_lock(&tb__reg_mutex);
    b->default_ordinal = ordinal;
    b->default_type = d.type;
    tb__mutex_unlock(&tb__reg_mutex);
    return TB_OK;
}

TBDEF tb_status tb_backend_default_device(const char *backend, tb_device *out) {
    static const char fn[] = "tb_backend_default_device";
    tb_backend *b;
    int32_t ordinal;
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    b = tb__lookup(fn, backend);
    if (b == NULL) return tb_last_status();
    if (b->impl.get_default_device_ordinal != NULL) {
        ordinal = b->impl.get_default_device_ordinal(b->impl.user_data);
    } else {
        tb__defaults_init(b);
        tb__mutex_lock(&tb__reg_mutex);
        ordinal = b->default_ordinal;
        tb__mutex_unlock(&tb__reg_mutex);
    }
    return tb__device_of(fn, b, ordinal, out);
}

TBDEF tb_status tb_backend_eager_fallback_device_type(const char *backend, tb_device_type *out) {
    tb_backend *b;
    if (out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_backend_eager_fallback_device_type: out is NULL");
    }
    b = tb__lookup("tb_backend_eager_fallback_device_type", backend);
    if (b == NULL) return tb_last_status();
    *out = b->impl.eager_fallback_device_type != NULL
               ? b->impl.eager_fallback_device_type(b->impl.user_data)
               : TB_DEVICE_CPU;
    return TB_OK;
}

TBDEF char *tb_backend_metrics_report(const char *backend) {
    tb_backend *b = tb__lookup("tb_backend_metrics_report", backend);
    char small[512], *heap = NULL;
    size_t cap = sizeof small, n;
    int attempt;
    tb__saved_error saved;
    if (b == NULL) return NULL;
    if (b->impl.create_metrics_report == NULL) return tb__strdup("");
    tb__error_save(&saved);
    /* the report may grow between the call that measures it and the call that fills it */
    for (attempt = 0;; attempt++) {
        char *buf = heap != NULL ? heap : small;
        buf[0] = '\0';
        tb_clear_error();
        n = b->impl.create_metrics_report(b->impl.user_data, buf, cap);
        if (n == 0 && tb_last_status() != TB_OK) {
            /* an empty report would pass for the answer */
            tb__backend_failed(tb_last_status(), b, "create_metrics_report");
            tb__free(heap);
            return NULL;
        }
        tb__error_restore(&saved);
        if (n < cap || attempt == 3) break;
        tb__free(heap);
        heap = NULL;
        if (n == SIZE_MAX) {
            tb__error(TB_ERR_OVERFLOW,
                      "tb_backend_metrics_report: backend '%s' gives a report of SIZE_MAX bytes",
                      b->name);
            return NULL;
        }
        cap = n + 1;
        heap = (char *)tb__alloc(cap);
        if (heap == NULL) return NULL;
    }
    if (n >= cap) n = cap - 1;
    if (heap != NULL) {
        heap[n] = '\0';
        return heap;
    }
    small[n] = '\0';
    return tb__strdup(small);
}

TBDEF tb_status tb_backend_load_plugin(const char *path) {
    if (path == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_backend_load_plugin: path is NULL");
    }
    tb__ensure_setup();
    tb__registry_ensure(NULL);
#if TB__HAVE_PLUGINS
    {
        const char *problem = tb__file_problem(path);
        if (problem != NULL) {
            return tb__error(TB_ERR_IO, "tb_backend_load_plugin: cannot open %.400s: %s", path,
                             problem);
        }
    }
    return tb__plugin_load("tb_backend_load_plugin", path, NULL, NULL);
#else
    return tb__error(TB_ERR_UNSUPPORTED,
                     "tb_backend_load_plugin: plugins are not available in this build (%.400s)",
                     path);
#endif
}

#if TB__HAVE_PLUGINS
/* The backend name in a plugin file name libtb_backend_<name>.so, in `name`; false when the
   file name is not of that form or <name> is not a valid backend name. */
static bool tb__plugin_file_name(const char *file, char name[TB_MAX_NAME + 1]) {
    static const char prefix[] = "libtb_backend_", suffix[] = ".so";
    size_t len = strlen(file), n;
    if (len <= sizeof prefix - 1 + sizeof suffix - 1) return false;
    if (strncmp(file, prefix, sizeof prefix - 1) != 0) return false;
    if (strcmp(file + len - (sizeof suffix - 1), suffix) != 0) return false;
    n = len - (sizeof prefix - 1) - (sizeof suffix - 1);
    if (n > TB_MAX_NAME) return false;
    memcpy(name, file + sizeof prefix - 1, n);
    name[n] = '\0';
    return tb__name_valid(name);
}

/* The smallest plugin name on $TB_BACKEND_PATH that sorts after `after` ("" for the first), in
   `next`; false when there is none. Reads the folders again for every name: no allocation,
   and plugin folders are small. */
static bool tb__plugin_next_name(const char *after, char next[TB_MAX_NAME + 1]) {
    const char *p = tb__getenv("TB_BACKEND_PATH");
    bool found = false;
    while (p != NULL && *p != '\0') {
        const char *end = strchr(p, ':');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        char path[4096];
        DIR *dir;
        struct dirent *entry;
        if (len > 0 && len < sizeof path - TB_MAX_NAME - 32) {
            memcpy(path, p, len);
            path[len] = '\0';
            dir = opendir(path);
            while (dir != NULL && (entry = readdir(dir)) != NULL) {
                char name[TB_MAX_NAME + 1];
                if (!tb__plugin_file_name(entry->d_name, name)) continue;
                if (strcmp(name, after) <= 0 || (found && strcmp(name, next) >= 0)) continue;
                snprintf(path + len, sizeof path - len, "/%s", entry->d_name);
                if (tb__is_file(path)) {
                    memcpy(next, name, strlen(name) + 1);
                    found = true;
                }
                path[len] = '\0';
            }
            if (dir != NULL) closedir(dir);
        }
        p = end != NULL ? end + 1 : NULL;
    }
    return found;
}
#endif

TBDEF size_t tb_backend_list_plugins(char (*names)[TB_MAX_NAME + 1], size_t cap) {
    size_t n = 0;
#if TB__HAVE_PLUGINS
    char prev[TB_MAX_NAME + 1] = "", next[TB_MAX_NAME + 1];
    if (names == NULL) cap = 0; /* the count alone, whatever cap says */
    while (tb__plugin_next_name(prev, next)) {
        if (n < cap) memcpy(names[n], next, strlen(next) + 1);
        n++;
        memcpy(prev, next, strlen(next) + 1);
    }
#else
    (void)names;
    (void)cap;
#endif
    return n;
}

static TB__UNUSED tb_backend *tb__backend_for_device(const tb_device *device) {
    char name[TB_MAX_NAME + 1];
    if (device == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb: device is NULL");
        return NULL;
    }
    if (device->backend[0] == '\0') {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb: a device without a backend name (resolve the "
                                           "current device first)");
        return NULL;
    }
    memcpy(name, device->backend, TB_MAX_NAME);
    name[TB_MAX_NAME] = '\0';
    return tb__lookup("tb_backend_lookup", name);
}

/* Calls every ready backend's set_rng_seed. Allocates nothing, so it cannot stop half-way.
   Entries live until tb_shutdown, but a failed registration removes its entry and shifts the
   array: the walk then starts again (a backend told twice hears the same seed). */
static void tb__registry_set_rng_seed(uint64_t seed) {
    size_t i = 0, removals;
    tb__mutex_lock(&tb__reg_mutex);
    removals = tb__reg.removals;
    tb__mutex_unlock(&tb__reg_mutex);
    for (;;) {
        tb_backend *b = NULL;
        bool ready = false;
        tb__mutex_lock(&tb__reg_mutex);
        if (tb__reg.removals != removals) {
            removals = tb__reg.removals;
            i = 0;
        }
        if (i < tb__reg.count) {
            b = tb__reg.items[i];
            ready = b->ready;
        }
        tb__mutex_unlock(&tb__reg_mutex);
        if (b == NULL) break;
        if (ready && b->impl.set_rng_seed != NULL) b->impl.set_rng_seed(b->impl.user_data, seed);
        i++;
    }
}

/* Called by tb_shutdown after the executor and the IR let go of their data, before the
   metrics (which backends may still record while they exit). */
static void tb__registry_shutdown(void) {
    tb_backend **items;
    size_t count, i;
    /* prepare_to_exit first, with the registry intact: a backend may still look things up */
    for (i = 0;; i++) {
        tb_backend *b;
        tb__mutex_lock(&tb__reg_mutex);
        b = i < tb__reg.count ? tb__reg.items[i] : NULL;
        tb__mutex_unlock(&tb__reg_mutex);
        if (b == NULL) break;
        if (b->ready && b->impl.prepare_to_exit != NULL) b->impl.prepare_to_exit(b->impl.user_data);
    }
    tb__mutex_lock(&tb__reg_mutex);
    items = tb__reg.items;
    count = tb__reg.count;
    tb__reg.items = NULL;
    tb__reg.count = 0;
    tb__reg.cap = 0;
    tb__reg.current = NULL;
    tb__reg.cpu = NULL;
    tb__mutex_unlock(&tb__reg_mutex);
    /* entries first, then the objects their strings and functions came from */
    for (i = 0; i < count; i++) {
        void *plugin = items[i]->plugin;
        tb__entry_free(items[i]);
#if TB__HAVE_PLUGINS
        if (plugin != NULL) dlclose(plugin);
#else
        (void)plugin;
#endif
    }
    tb__free(items);
    if (TB__ATOMIC_LOAD(&tb__reg.builtins_done) != 0) TB__ATOMIC_ADD(&tb__reg.builtins_done, -1);
}

/* ---- backend data ---- */

/* The cpu backend's payload: a host array, owned or borrowed from the caller. A borrowed array
   may carry a release callback, called once when the buffer is freed (DLPack's deleter). */
typedef struct tb__host_buffer {
    void *data;
    size_t size;
    bool borrowed;
    void (*release)(void *context);
    void *release_context;
} tb__host_buffer;

/* An owned host buffer of `size` bytes (uninitialised). */
static TB__UNUSED tb__host_buffer *tb__host_buffer_new(size_t size) {
    tb__host_buffer *hb = (tb__host_buffer *)tb__alloc(sizeof *hb);
    if (hb == NULL) return NULL;
    hb->data = tb__alloc(size);
    if (hb->data == NULL) {
        tb__free(hb);
        return NULL;
    }
    hb->size = size;
    hb->borrowed = false;
    hb->release = NULL;
    hb->release_context = NULL;
    return hb;
}

static TB__UNUSED void tb__host_buffer_free(tb__host_buffer *hb) {
    if (hb == NULL) return;
    if (!hb->borrowed) tb__free(hb->data);
    if (hb->borrowed && hb->release != NULL) hb->release(hb->release_context);
    tb__free(hb);
}

static TB__UNUSED void *tb__host_data(const tb_backend_data *data) {
    const tb_backend *cpu;
    if (data == NULL || data->payload == NULL) return NULL;
    tb__mutex_lock(&tb__reg_mutex);
    cpu = tb__reg.cpu;
    tb__mutex_unlock(&tb__reg_mutex);
    if (data->tb__backend != cpu) return NULL;
    return ((const tb__host_buffer *)data->payload)->data;
}

static TB__UNUSED tb_backend_data *tb__data_new(const tb_backend *backend, const tb_device *device,
                                                const tb_shape *shape) {
    tb_backend_data *d = (tb_backend_data *)tb__calloc(1, sizeof *d);
    if (d == NULL) return NULL;
    d->device = *device;
    d->shape = *shape;
    d->tb__refcount = 1;
    d->tb__backend = backend;
    return d;
}

static TB__UNUSED void tb__data_retain(tb_backend_data *data) {
    if (data != NULL) TB__ATOMIC_ADD(&data->tb__refcount, 1);
}

static TB__UNUSED void tb__data_release(tb_backend_data *data) {
    if (data == NULL) return;
    if (TB__ATOMIC_ADD(&data->tb__refcount, -1) != 0) return;
    if (data->payload != NULL && data->tb__backend != NULL) {
        const tb_backend_impl *impl = &data->tb__backend->impl;
        impl->data_release(impl->user_data, data);
    }
    tb__free(data);
}

/* Frees a data that never left this file after its backend entry failed. */
static void tb__data_discard(tb_backend_data *data) {
    tb__saved_error saved;
    tb__error_save(&saved);
    tb__data_release(data);
    tb__error_restore(&saved);
}

static TB__UNUSED tb_backend_data *tb__data_from_host(const tb_device *device,
                                                      const tb_shape *shape, const void *host) {
    tb_backend *b;
    tb_backend_data *d;
    size_t nbytes = 0;
    uint64_t t0;
    tb_status st;
    tb__saved_error saved;
    if (tb__shape_check("tb_tensor_from_host", shape) != TB_OK) return NULL;
    tb_shape_nbytes(shape, &nbytes);
    if (host == NULL && nbytes > 0) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_from_host: data is NULL");
        return NULL;
    }
    b = tb__backend_for_device(device);
    if (b == NULL) return NULL;
    d = tb__data_new(b, device, shape);
    if (d == NULL) return NULL;
    tb__error_save(&saved);
    tb_clear_error();
    t0 = tb__now_ns();
    st = b->impl.data_from_host(b->impl.user_data, d, host);
    if (st != TB_OK) {
        tb__backend_failed(st, b, "data_from_host");
        tb__data_discard(d);
        return NULL;
    }
    tb__error_restore(&saved);
    tb__metric_sample("TransferToDeviceTime", (double)(tb__now_ns() - t0));
    tb__metric_count("CreateDataHandles", 1);
    return d;
}

/* A rank-0 data holding a scalar (LTC MakeComputationDataFromScalar); without a
   data_from_scalar entry the value is converted on the host and copied. */
static TB__UNUSED tb_backend_data *tb__data_from_scalar(const tb_device *device, tb_scalar value) {
    tb_backend *b;
    tb_backend_data *d;
    tb_shape shape;
    uint64_t t0;
    tb_status st;
    tb__saved_error saved;
    if (!tb_dtype_is_valid(value.dtype)) {
        tb__error(TB_ERR_DTYPE, "tb_scalar: invalid dtype %d", (int)value.dtype);
        return NULL;
    }
    b = tb__backend_for_device(device);
    if (b == NULL) return NULL;
    memset(&shape, 0, sizeof shape);
    shape.dtype = value.dtype;
    d = tb__data_new(b, device, &shape);
    if (d == NULL) return NULL;
    d->is_scalar = true;
    d->scalar = value;
    tb__error_save(&saved);
    tb_clear_error();
    t0 = tb__now_ns();
    if (b->impl.data_from_scalar != NULL) {
        st = b->impl.data_from_scalar(b->impl.user_data, d, value);
    } else {
        unsigned char bytes[8];
        tb__scalar_store(value, value.dtype, bytes);
        st = b->impl.data_from_host(b->impl.user_data, d, bytes);
    }
    if (st != TB_OK) {
        tb__backend_failed(
            st, b, b->impl.data_from_scalar != NULL ? "data_from_scalar" : "data_from_host");
        tb__data_discard(d);
        return NULL;
    }
    tb__error_restore(&saved);
    tb__metric_sample("TransferToDeviceTime", (double)(tb__now_ns() - t0));
    tb__metric_count("CreateDataHandles", 1);
    return d;
}

/* A cpu data that uses `host` in place. NULL without an error when the device's backend cannot
   borrow host memory (the caller copies instead, which also reports any error). */
static TB__UNUSED tb_backend_data *tb__data_borrow_host(const tb_device *device,
                                                        const tb_shape *shape, const void *host) {
    tb_backend *b;
    tb_backend_data *d;
    tb__host_buffer *hb;
    size_t nbytes = 0;
    const tb_backend *cpu;
    tb__saved_error saved;
    if (device == NULL || shape == NULL || host == NULL) return NULL;
    if (strncmp(device->backend, "cpu", sizeof device->backend) != 0) return NULL;
    tb__error_save(&saved);
    b = tb__backend_for_device(device);
    tb__mutex_lock(&tb__reg_mutex);
    cpu = tb__reg.cpu;
    tb__mutex_unlock(&tb__reg_mutex);
    if (b == NULL || b != cpu || tb_shape_nbytes(shape, &nbytes) != TB_OK) {
        tb__error_restore(&saved);
        return NULL;
    }
    hb = (tb__host_buffer *)tb__alloc(sizeof *hb);
    d = hb != NULL ? tb__data_new(b, device, shape) : NULL;
    if (d == NULL) {
        tb__free(hb);
        tb__error_restore(&saved);
        return NULL;
    }
    /* The caller promised the array outlives the data; the const is given back on read. */
    memcpy(&hb->data, &host, sizeof hb->data);
    hb->size = nbytes;
    hb->borrowed = true;
    hb->release = NULL;
    hb->release_context = NULL;
    d->payload = hb;
    tb__metric_count("CreateDataHandles", 1);
    return d;
}

static TB__UNUSED bool tb__data_set_host_release(tb_backend_data *data, const void *host,
                                                 void (*release)(void *context), void *context) {
    tb__host_buffer *hb;
    if (tb__host_data(data) == NULL || host == NULL) return false;
    hb = (tb__host_buffer *)data->payload;
    if (!hb->borrowed || hb->data != host || hb->release != NULL) return false;
    hb->release = release;
    hb->release_context = context;
    return true;
}

static TB__UNUSED tb_status tb__data_to_host(const tb_backend_data *data, void *host) {
    const tb_backend *b;
    size_t nbytes = 0;
    uint64_t t0;
    tb_status st;
    tb__saved_error saved;
    if (data == NULL || data->tb__backend == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_to_host: data is NULL");
    }
    b = data->tb__backend;
    st = tb__shape_check("tb_tensor_to_host", &data->shape);
    if (st != TB_OK) return st;
    tb_shape_nbytes(&data->shape, &nbytes);
    if (host == NULL && nbytes > 0) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_to_host: destination is NULL");
    }
    if (data->payload == NULL) {
        return tb__error(TB_ERR_STATE,
                         "tb_tensor_to_host: the data on backend '%s' has no value "
                         "yet (a placeholder)",
                         b->name);
    }
    tb__error_save(&saved);
    tb_clear_error();
    t0 = tb__now_ns();
    st = b->impl.data_to_host(b->impl.user_data, data, host);
    if (st != TB_OK) return tb__backend_failed(st, b, "data_to_host");
    tb__error_restore(&saved);
    tb__metric_sample("TransferFromDeviceTime", (double)(tb__now_ns() - t0));
    return TB_OK;
}

/* ---- built-in backends ---- */

/* Whether an entry of that name exists (ready or not). */
static bool tb__registered(const char *name) {
    bool found;
    tb__mutex_lock(&tb__reg_mutex);
    found = tb__find_locked(name) != NULL;
    tb__mutex_unlock(&tb__reg_mutex);
    return found;
}

/* Keeps the first failure of a built-in's registration (its message is the thread's error). */
static void tb__builtin_failed(tb__builtin_failure *why, const char *name, tb_status st) {
    tb_log_message(TB_LOG_DEBUG,
                   "the %s backend is not registered (tried again at the next use): %s", name,
                   tb_last_error());
    if (why->status != TB_OK) return;
    why->status = st;
    snprintf(why->name, sizeof why->name, "%s", name);
    snprintf(why->reason, sizeof why->reason, "%s",
             tb_last_error()[0] != '\0' ? tb_last_error() : tb_status_string(st));
}

static void tb__register_builtin_backends(tb__builtin_failure *why) {
    tb_status st;
    if (!tb__registered("cpu")) {
        tb_backend_impl impl;
        tb_backend *cpu = NULL;
        tb__cpu_backend_impl(&impl);
        tb_clear_error();
        st = tb__backend_register("tb_backend_register", "cpu", &impl, "", NULL, &cpu);
        if (st == TB_OK) {
            tb__mutex_lock(&tb__reg_mutex);
            tb__reg.cpu = cpu;
            tb__mutex_unlock(&tb__reg_mutex);
        } else {
            tb__builtin_failed(why, "cpu", st);
        }
    }
#if !defined(TB_NO_OPENCL)
    if (!tb__registered("opencl")) {
        tb_clear_error();
        st = tb__opencl_register();
        if (st != TB_OK) tb__builtin_failed(why, "opencl", st);
    }
#endif
}

#undef TB__HAVE_PLUGINS
#undef TB__QUOTE_CAP

/* ---- src/ir.c ---- */
/* ===========================================================================================
   IR: the op table, custom ops, nodes and shape inference
   =========================================================================================== */

/* ---- the op table ---- */

typedef struct tb__op_info {
    const char *name;
    tb_op_kind kind;
    int32_t arity;
} tb__op_info;

static const tb__op_info tb__op_table[TB_OP_BUILTIN_COUNT] = {
#define TB__OP_INFO(e, name, kind, arity) {name, kind, arity},
    TB_OP_LIST(TB__OP_INFO)
#undef TB__OP_INFO
};

/* A registered custom op. Entries are allocated one by one so that the pointers handed out by
   tb_op_name and tb_op_custom_desc stay put while the table grows. */
typedef struct tb__custom_op {
    tb_custom_op_desc desc;
    char name[TB_MAX_NAME + 1];
    char *opencl_expr;
} tb__custom_op;

static tb__mutex tb__ops_mutex = TB__MUTEX_INIT;
static tb__custom_op **tb__custom_ops;
static size_t tb__custom_count;
static size_t tb__custom_cap;

static bool tb__op_is_builtin(tb_op op) {
    return op >= 0 && op < (tb_op)TB_OP_BUILTIN_COUNT;
}

static const tb__custom_op *tb__custom_get(tb_op op) {
    const tb__custom_op *entry = NULL;
    if (op < (tb_op)TB_OP_BUILTIN_COUNT) return NULL;
    tb__mutex_lock(&tb__ops_mutex);
    if ((size_t)(op - (tb_op)TB_OP_BUILTIN_COUNT) < tb__custom_count) {
        entry = tb__custom_ops[op - (tb_op)TB_OP_BUILTIN_COUNT];
    }
    tb__mutex_unlock(&tb__ops_mutex);
    return entry;
}

TBDEF const char *tb_op_name(tb_op op) {
    const tb__custom_op *entry;
    if (tb__op_is_builtin(op)) return tb__op_table[op].name;
    entry = tb__custom_get(op);
    return entry != NULL ? entry->name : NULL;
}

TBDEF tb_op_kind tb_op_get_kind(tb_op op) {
    if (tb__op_is_builtin(op)) return tb__op_table[op].kind;
    return tb__custom_get(op) != NULL ? TB_KIND_CUSTOM : TB_KIND_INVALID;
}

TBDEF int32_t tb_op_arity(tb_op op) {
    const tb__custom_op *entry;
    if (tb__op_is_builtin(op)) return tb__op_table[op].arity;
    entry = tb__custom_get(op);
    return entry != NULL ? entry->desc.num_inputs : -1;
}

/* A name as backends and ops take them: [A-Za-z_][A-Za-z0-9_]*, 1..TB_MAX_NAME bytes. */
static bool tb__ir_name_ok(const char *name) {
    size_t i;
    if (name == NULL || name[0] == '\0') return false;
    for (i = 0; name[i] != '\0'; i++) {
        char c = name[i];
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
        bool digit = c >= '0' && c <= '9';
        if (i >= TB_MAX_NAME) return false;
        if (!alpha && !(digit && i > 0)) return false;
    }
    return true;
}

static bool tb__builtin_lookup(const char *name, tb_op *out) {
    int32_t i;
    for (i = 0; i < (int32_t)TB_OP_BUILTIN_COUNT; i++) {
        if (strcmp(tb__op_table[i].name, name) == 0) {
            *out = i;
            return true;
        }
    }
    return false;
}

/* Under tb__ops_mutex. */
static bool tb__custom_lookup_locked(const char *name, tb_op *out) {
    size_t i;
    for (i = 0; i < tb__custom_count; i++) {
        if (strcmp(tb__custom_ops[i]->name, name) == 0) {
            *out = (tb_op)TB_OP_BUILTIN_COUNT + (tb_op)i;
            return true;
        }
    }
    return false;
}

TBDEF tb_status tb_op_lookup(const char *name, tb_op *out) {
    tb_op found;
    bool ok;
    if (name == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_op_lookup: name is NULL");
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_op_lookup: out is NULL");
    ok = tb__builtin_lookup(name, &found);
    if (!ok) {
        tb__mutex_lock(&tb__ops_mutex);
        ok = tb__custom_lookup_locked(name, &found);
        tb__mutex_unlock(&tb__ops_mutex);
    }
    if (!ok) return tb__error(TB_ERR_NOT_FOUND, "tb_op_lookup: unknown op '%s'", name);
    *out = found;
    return TB_OK;
}

TBDEF tb_status tb_op_register(const tb_custom_op_desc *desc, tb_op *out) {
    tb__custom_op *entry;
    tb_op existing;
    tb_status st;
    tb__ensure_setup();
    if (desc == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_op_register: desc is NULL");
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_op_register: out is NULL");
    if (desc->name == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_op_register: desc->name is NULL");
    }
    if (!tb__ir_name_ok(desc->name)) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_op_register: bad name '%.64s' (1..%d bytes of [A-Za-z0-9_], not "
                         "starting with a digit)",
                         desc->name, TB_MAX_NAME);
    }
    if (tb__builtin_lookup(desc->name, &existing)) {
        return tb__error(TB_ERR_DUPLICATE, "tb_op_register: duplicate name: %s is a built-in op",
                         desc->name);
    }
    if (desc->num_inputs < 1 || desc->num_inputs > 8) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_op_register: op '%s': num_inputs %d is out of range (1..8)",
                         desc->name, (int)desc->num_inputs);
    }
    if (desc->reference == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_op_register: op '%s': the reference function is required", desc->name);
    }
    entry = (tb__custom_op *)tb__calloc(1, sizeof *entry);
    if (entry == NULL) return TB_ERR_OUT_OF_MEMORY;
    entry->desc = *desc;
    memcpy(entry->name, desc->name, strlen(desc->name) + 1);
    entry->desc.name = entry->name;
    if (desc->opencl_expr != NULL) {
        entry->opencl_expr = tb__strdup(desc->opencl_expr);
        if (entry->opencl_expr == NULL) {
            tb__free(entry);
            return TB_ERR_OUT_OF_MEMORY;
        }
    }
    entry->desc.opencl_expr = entry->opencl_expr;

    tb__mutex_lock(&tb__ops_mutex);
    if (tb__custom_lookup_locked(desc->name, &existing)) {
        st = tb__error(TB_ERR_DUPLICATE, "tb_op_register: duplicate name: %s", desc->name);
    } else if (tb__custom_count >= (size_t)(INT32_MAX - (int32_t)TB_OP_BUILTIN_COUNT)) {
        st = tb__error(TB_ERR_OVERFLOW, "tb_op_register: too many custom ops");
    } else {
        st = tb__grow((void **)&tb__custom_ops, &tb__custom_cap, tb__custom_count + 1,
                      sizeof *tb__custom_ops);
    }
    if (st == TB_OK) {
        tb__custom_ops[tb__custom_count] = entry;
        *out = (tb_op)TB_OP_BUILTIN_COUNT + (tb_op)tb__custom_count;
        tb__custom_count++;
    }
    tb__mutex_unlock(&tb__ops_mutex);
    if (st != TB_OK) {
        tb__free(entry->opencl_expr);
        tb__free(entry);
    }
    return st;
}

TBDEF const tb_custom_op_desc *tb_op_custom_desc(tb_op op) {
    const tb__custom_op *entry = tb__custom_get(op);
    return entry != NULL ? &entry->desc : NULL;
}

static void tb__ir_shutdown(void) {
    size_t i;
    tb__mutex_lock(&tb__ops_mutex);
    for (i = 0; i < tb__custom_count; i++) {
        tb__free(tb__custom_ops[i]->opencl_expr);
        tb__free(tb__custom_ops[i]);
    }
    tb__free(tb__custom_ops);
    tb__custom_ops = NULL;
    tb__custom_count = 0;
    tb__custom_cap = 0;
    tb__mutex_unlock(&tb__ops_mutex);
}

/* ---- nodes ---- */

#if defined(_MSC_VER) && !defined(__clang__)
#define TB__ATOMIC_INC64(ptr) ((uint64_t)InterlockedIncrement64((volatile LONG64 *)(ptr)))
#else
#define TB__ATOMIC_INC64(ptr) __atomic_add_fetch((ptr), 1, __ATOMIC_RELAXED)
#endif

static uint64_t tb__node_counter;

#define TB__NODE_HASH_SEED UINT64_C(0x74625f6e6f646521)

static uint64_t tb__hash_shape(uint64_t h, const tb_shape *shape) {
    int32_t i;
    h = tb__hash_u64(h, (uint64_t)shape->dtype);
    h = tb__hash_u64(h, (uint64_t)(uint32_t)shape->rank);
    for (i = 0; i < shape->rank && i < TB_MAX_RANK; i++) {
        h = tb__hash_u64(h, (uint64_t)shape->dims[i]);
    }
    return h;
}

static uint64_t tb__hash_double(uint64_t h, double value) {
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    return tb__hash_u64(h, bits);
}

/* Leaves hash their kind and shape only: their values are parameters, so graphs that differ in
   data alone share one computation. */
static uint64_t tb__leaf_hash(const tb_node *node) {
    uint64_t h = tb__hash_u64(TB__NODE_HASH_SEED, (uint64_t)(uint32_t)node->op);
    h = tb__hash_shape(h, &node->shape);
    return tb__hash_u64(h, node->wrapped_number ? 1u : 0u);
}

static uint64_t tb__node_hash_of(const tb_node *node) {
    uint64_t h;
    uint32_t i;
    if (node->op == TB_OP_DEVICE_DATA || node->op == TB_OP_SCALAR) return tb__leaf_hash(node);
    h = tb__hash_u64(TB__NODE_HASH_SEED, (uint64_t)(uint32_t)node->op);
    h = tb__hash_shape(h, &node->shape);
    h = tb__hash_u64(h, node->num_attrs);
    for (i = 0; i < node->num_attrs; i++)
        h = tb__hash_u64(h, (uint64_t)node->attrs[i]);
    h = tb__hash_double(h, node->fattrs[0]);
    h = tb__hash_double(h, node->fattrs[1]);
    h = tb__hash_u64(h, node->num_operands);
    for (i = 0; i < node->num_operands; i++)
        h = tb__hash_u64(h, node->operands[i]->hash);
    return h;
}

static tb_node *tb__node_alloc(tb_op op, const tb_shape *shape, const tb_device *device) {
    tb_node *node = (tb_node *)tb__calloc(1, sizeof *node);
    if (node == NULL) return NULL;
    node->refcount = 1;
    node->op = op;
    node->shape = *shape;
    if (device != NULL) node->device = *device;
    node->id = TB__ATOMIC_INC64(&tb__node_counter);
    return node;
}

static tb_node *tb__node_new(tb_op op, const tb_shape *shape, const tb_device *device,
                             tb_node *const *operands, size_t num_operands, const int64_t *attrs,
                             size_t num_attrs, const double *fattrs) {
    tb_node *node;
    size_t i;
    if (shape == NULL || num_attrs > TB_MAX_ATTRS || (num_attrs > 0 && attrs == NULL) ||
        (num_operands > 0 && operands == NULL) || (uint64_t)num_operands > UINT32_MAX) {
        tb__error(TB_ERR_INTERNAL, "tb__node_new: bad arguments for op %d", (int)op);
        return NULL;
    }
    for (i = 0; i < num_operands; i++) {
        if (operands[i] == NULL) {
            tb__error(TB_ERR_INTERNAL, "tb__node_new: operand %zu of op %d is NULL", i, (int)op);
            return NULL;
        }
    }
    node = tb__node_alloc(op, shape, device);
    if (node == NULL) return NULL;
    if (num_operands > 0) {
        node->operands = (tb_node **)tb__calloc(num_operands, sizeof *node->operands);
        if (node->operands == NULL) {
            tb__free(node);
            return NULL;
        }
        for (i = 0; i < num_operands; i++) {
            node->operands[i] = operands[i];
            tb__node_retain(operands[i]);
        }
        node->num_operands = (uint32_t)num_operands;
    }
    for (i = 0; i < num_attrs; i++)
        node->attrs[i] = attrs[i];
    node->num_attrs = (uint32_t)num_attrs;
    if (fattrs != NULL) {
        node->fattrs[0] = fattrs[0];
        node->fattrs[1] = fattrs[1];
    }
    node->hash = tb__node_hash_of(node);
    return node;
}

static tb_node *tb__node_device_data(tb_backend_data *data) {
    tb_node *node;
    if (data == NULL) {
        tb__error(TB_ERR_INTERNAL, "tb__node_device_data: data is NULL");
        return NULL;
    }
    node = tb__node_alloc(TB_OP_DEVICE_DATA, &data->shape, &data->device);
    if (node == NULL) return NULL;
    tb__data_retain(data);
    node->data = data;
    node->hash = tb__leaf_hash(node);
    return node;
}

static tb_node *tb__node_scalar(tb_scalar value, const tb_device *device, bool wrapped_number) {
    tb_shape shape;
    tb_node *node;
    if (!tb_dtype_is_valid(value.dtype)) {
        tb__error(TB_ERR_DTYPE, "tb__node_scalar: invalid dtype %d", (int)value.dtype);
        return NULL;
    }
    memset(&shape, 0, sizeof shape);
    shape.dtype = value.dtype;
    shape.rank = 0;
    node = tb__node_alloc(TB_OP_SCALAR, &shape, device);
    if (node == NULL) return NULL;
    node->scalar = value;
    node->wrapped_number = wrapped_number;
    node->hash = tb__leaf_hash(node);
    return node;
}

static void tb__node_retain(tb_node *node) {
    if (node != NULL) TB__ATOMIC_ADD(&node->refcount, 1);
}

/* Frees one node whose count reached zero, apart from its operands. */
static void tb__node_free_one(tb_node *node) {
    if (node->data != NULL) tb__data_release(node->data);
    if (node->value != NULL) tb__data_release(node->value);
    tb__free(node->operands);
    tb__free(node);
}

#define TB__RELEASE_LOCAL 64

/* Frees `dead` (count already zero) and every operand whose count drops to zero with it, with an
   explicit stack: a chain of a million nodes must not use a million stack frames. */
static void tb__node_destroy(tb_node *dead) {
    tb_node *local[TB__RELEASE_LOCAL];
    tb_node **stack = local;
    size_t cap = TB__RELEASE_LOCAL;
    size_t count = 0;
    stack[count++] = dead;
    while (count > 0) {
        tb_node *node = stack[--count];
        uint32_t i;
        for (i = 0; i < node->num_operands; i++) {
            tb_node *operand = node->operands[i];
            if (TB__ATOMIC_ADD(&operand->refcount, -1) != 0) continue;
            if (count == cap) {
                /* Releasing must not disturb the caller's error, even when memory runs out. */
                tb__saved_error saved;
                tb_node **bigger;
                tb__error_save(&saved);
                bigger = cap <= SIZE_MAX / (2 * sizeof *stack)
                             ? (tb_node **)tb__alloc(2 * cap * sizeof *stack)
                             : NULL;
                tb__error_restore(&saved);
                if (bigger == NULL) {
                    /* Out of memory: recurse for this one operand instead (depth grows only
                       while allocations keep failing). */
                    tb__node_destroy(operand);
                    continue;
                }
                memcpy(bigger, stack, count * sizeof *stack);
                if (stack != local) tb__free(stack);
                stack = bigger;
                cap *= 2;
            }
            stack[count++] = operand;
        }
        tb__node_free_one(node);
    }
    if (stack != local) tb__free(stack);
}

#undef TB__RELEASE_LOCAL

static void tb__node_release(tb_node *node) {
    if (node == NULL) return;
    if (TB__ATOMIC_ADD(&node->refcount, -1) != 0) return;
    tb__node_destroy(node);
}

/* ---- node accessors ---- */

TBDEF tb_op tb_node_op(const tb_node *node) {
    return node != NULL ? node->op : -1;
}

TBDEF const tb_shape *tb_node_shape(const tb_node *node) {
    return node != NULL ? &node->shape : NULL;
}

TBDEF size_t tb_node_num_operands(const tb_node *node) {
    return node != NULL ? node->num_operands : 0;
}

TBDEF const tb_node *tb_node_operand(const tb_node *node, size_t index) {
    if (node == NULL || index >= node->num_operands) return NULL;
    return node->operands[index];
}

TBDEF size_t tb_node_num_attrs(const tb_node *node) {
    return node != NULL ? node->num_attrs : 0;
}

TBDEF int64_t tb_node_attr(const tb_node *node, size_t index) {
    if (node == NULL || index >= node->num_attrs || index >= TB_MAX_ATTRS) return 0;
    return node->attrs[index];
}

TBDEF double tb_node_fattr(const tb_node *node, size_t index) {
    if (node == NULL || index >= 2) return 0.0;
    return node->fattrs[index];
}

TBDEF uint64_t tb_node_hash(const tb_node *node) {
    return node != NULL ? node->hash : 0;
}

TBDEF uint64_t tb_node_id(const tb_node *node) {
    return node != NULL ? node->id : 0;
}

TBDEF tb_backend_data *tb_node_data(const tb_node *node) {
    if (node == NULL || node->op != TB_OP_DEVICE_DATA) return NULL;
    return node->data;
}

TBDEF tb_status tb_node_scalar(const tb_node *node, tb_scalar *out) {
    if (node == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_node_scalar: node is NULL");
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_node_scalar: out is NULL");
    if (node->op != TB_OP_SCALAR) {
        const char *name = tb_op_name(node->op);
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_node_scalar: node %llu is a %s node, not "
                         "a scalar",
                         (unsigned long long)node->id, name != NULL ? name : "custom");
    }
    *out = node->scalar;
    return TB_OK;
}

/* ---- shape inference ----
   Every check names the op (or the public function, through `fn`) and the shapes involved.
   The layouts accepted here are the normal form documented above TB_OP_LIST in ir.h. */

typedef struct tb__shape_buf {
    char text[96];
} tb__shape_buf;

static const char *tb__st(const tb_shape *shape, tb__shape_buf *buf) {
    tb__shape_text(shape, buf->text);
    return buf->text;
}

/* Dims >= 0 and the size rule of shapes (tb__dims_extent): element counts, strides and byte
   offsets fit. */
static bool tb__shape_fits(const tb_shape *shape) {
    int32_t i;
    if (!tb_dtype_is_valid(shape->dtype) || shape->rank < 0 || shape->rank > TB_MAX_RANK)
        return false;
    for (i = 0; i < shape->rank; i++) {
        if (shape->dims[i] < 0) return false;
    }
    return tb__shape_size_ok(shape);
}

static tb_status tb__check_fits(const char *fn, const tb_shape *shape) {
    tb__shape_buf b;
    if (tb__shape_fits(shape)) return TB_OK;
    if (tb__shape_has_zero(shape)) {
        return tb__error(TB_ERR_OVERFLOW,
                         "%s: the result %s is too large (empty, but with its 0 dims read as 1 "
                         "its size overflows; empty shapes obey the same limit)",
                         fn, tb__st(shape, &b));
    }
    return tb__error(TB_ERR_OVERFLOW, "%s: the result %s is too large (its size overflows)", fn,
                     tb__st(shape, &b));
}

static tb_status tb__want_inputs(const char *fn, size_t got, size_t want) {
    if (got == want) return TB_OK;
    return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: expected %zu operand%s, got %zu", fn, want,
                     want == 1 ? "" : "s", got);
}

static tb_status tb__want_attrs(const char *fn, size_t got, size_t want, const char *layout) {
    if (got == want) return TB_OK;
    return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: expected %zu attribute%s %s, got %zu", fn, want,
                     want == 1 ? "" : "s", layout, got);
}

static tb_status tb__need_float(const char *fn, const tb_shape *shape) {
    tb__shape_buf b;
    if (tb_dtype_is_float(shape->dtype)) return TB_OK;
    return tb__error(TB_ERR_DTYPE, "%s: expected a float tensor, got %s", fn, tb__st(shape, &b));
}

static tb_status tb__need_not_bool(const char *fn, const tb_shape *shape) {
    tb__shape_buf b;
    if (shape->dtype != TB_BOOL) return TB_OK;
    return tb__error(TB_ERR_DTYPE, "%s: bool tensors are not supported, got %s", fn,
                     tb__st(shape, &b));
}

static tb_status tb__need_bool(const char *fn, const char *what, const tb_shape *shape) {
    tb__shape_buf b;
    if (shape->dtype == TB_BOOL) return TB_OK;
    return tb__error(TB_ERR_DTYPE, "%s: %s must be bool, got %s", fn, what, tb__st(shape, &b));
}

static tb_status tb__need_index(const char *fn, const tb_shape *shape) {
    tb__shape_buf b;
    if (shape->dtype == TB_I32 || shape->dtype == TB_I64) return TB_OK;
    return tb__error(TB_ERR_DTYPE, "%s: index must be i32 or i64, got %s", fn, tb__st(shape, &b));
}

static tb_status tb__same_dtype(const char *fn, const tb_shape *inputs, size_t n) {
    size_t i;
    for (i = 1; i < n; i++) {
        if (inputs[i].dtype != inputs[0].dtype) {
            tb__shape_buf a, b;
            return tb__error(TB_ERR_DTYPE, "%s: operands %s and %s have different dtypes", fn,
                             tb__st(&inputs[0], &a), tb__st(&inputs[i], &b));
        }
    }
    return TB_OK;
}

/* "f32[2], f32[3] and f32[4]" */
static void tb__shapes_list(const tb_shape *inputs, size_t n, char *buf, size_t cap) {
    size_t i, len = 0;
    buf[0] = '\0';
    for (i = 0; i < n && len < cap; i++) {
        tb__shape_buf b;
        const char *sep = i == 0 ? "" : (i + 1 == n ? " and " : ", ");
        int w = snprintf(buf + len, cap - len, "%s%s", sep, tb__st(&inputs[i], &b));
        if (w < 0) break;
        len += (size_t)w;
    }
}

/* NumPy broadcasting of the dims of `n` shapes; the dtype of out is left to the caller. */
static tb_status tb__broadcast_dims(const char *fn, const tb_shape *inputs, size_t n,
                                    tb_shape *out) {
    int32_t rank = 0, axis;
    size_t i;
    for (i = 0; i < n; i++) {
        if (inputs[i].rank > rank) rank = inputs[i].rank;
    }
    out->rank = rank;
    for (axis = 0; axis < rank; axis++) {
        int64_t d = 1;
        for (i = 0; i < n; i++) {
            int32_t k = inputs[i].rank - rank + axis;
            int64_t v;
            if (k < 0) continue;
            v = inputs[i].dims[k];
            if (v == 1) continue;
            if (d == 1) {
                d = v;
            } else if (d != v) {
                char list[400];
                tb__shapes_list(inputs, n, list, sizeof list);
                return tb__error(TB_ERR_SHAPE, "%s: shapes %s do not broadcast", fn, list);
            }
        }
        out->dims[axis] = d;
    }
    return TB_OK;
}

/* A bitmask over the axes of `shape`: no bits at or beyond its rank. */
static tb_status tb__check_mask(const char *fn, int64_t mask, const tb_shape *shape) {
    tb__shape_buf b;
    if (mask < 0 || (mask >> shape->rank) != 0) {
        return tb__error(TB_ERR_SHAPE, "%s: axes bitmask 0x%llx names axes beyond %s", fn,
                         (unsigned long long)mask, tb__st(shape, &b));
    }
    return TB_OK;
}

static tb_status tb__check_flag(const char *fn, const char *what, int64_t value) {
    if (value == 0 || value == 1) return TB_OK;
    return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s must be 0 or 1, got %lld", fn, what,
                     (long long)value);
}

static tb_status tb__check_axis(const char *fn, const char *what, int64_t axis,
                                const tb_shape *shape) {
    tb__shape_buf b;
    if (axis >= 0 && axis < shape->rank) return TB_OK;
    return tb__error(TB_ERR_SHAPE, "%s: %s %lld is out of range for %s", fn, what, (long long)axis,
                     tb__st(shape, &b));
}

static tb_status tb__check_rank1(const char *fn, const tb_shape *shape) {
    tb__shape_buf b;
    if (shape->rank >= 1) return TB_OK;
    return tb__error(TB_ERR_SHAPE, "%s: expected a tensor of rank >= 1, got %s", fn,
                     tb__st(shape, &b));
}

static tb_status tb__infer_unary(const char *fn, tb_op op, const tb_shape *x) {
    switch (op) {
    case TB_OP_EXP:
    case TB_OP_LOG:
    case TB_OP_SQRT:
    case TB_OP_RSQRT:
    case TB_OP_SIN:
    case TB_OP_COS:
    case TB_OP_TANH:
    case TB_OP_SIGMOID:
    case TB_OP_GELU:
    case TB_OP_SILU:
    case TB_OP_RECIPROCAL:
        return tb__need_float(fn, x);
    case TB_OP_NEG:
    case TB_OP_ABS:
    case TB_OP_RELU:
    case TB_OP_FLOOR:
    case TB_OP_CEIL:
    case TB_OP_ROUND:
        return tb__need_not_bool(fn, x);
    case TB_OP_LOGICAL_NOT:
        return tb__need_bool(fn, "the operand", x);
    default:
        return TB_OK; /* SIGN */
    }
}

static tb_status tb__infer_binary(const char *fn, tb_op op, const tb_shape *in, tb_shape *out) {
    tb_status st = tb__same_dtype(fn, in, 2);
    if (st != TB_OK) return st;
    switch (op) {
    case TB_OP_SUB:
    case TB_OP_POW:
        st = tb__need_not_bool(fn, &in[0]);
        break;
    case TB_OP_DIV:
        st = tb__need_float(fn, &in[0]);
        break;
    case TB_OP_LOGICAL_AND:
    case TB_OP_LOGICAL_OR:
        st = tb__need_bool(fn, "operands", &in[0]);
        break;
    default:
        break;
    }
    if (st != TB_OK) return st;
    st = tb__broadcast_dims(fn, in, 2, out);
    if (st != TB_OK) return st;
    switch (op) {
    case TB_OP_EQ:
    case TB_OP_NE:
    case TB_OP_LT:
    case TB_OP_LE:
    case TB_OP_GT:
    case TB_OP_GE:
    case TB_OP_LOGICAL_AND:
    case TB_OP_LOGICAL_OR:
        out->dtype = TB_BOOL;
        break;
    default:
        out->dtype = in[0].dtype;
        break;
    }
    return TB_OK;
}

static tb_status tb__infer_reduce(const char *fn, tb_op op, const tb_shape *x, const int64_t *attrs,
                                  size_t num_attrs, tb_shape *out) {
    tb_status st = tb__want_attrs(fn, num_attrs, 2, "[axes bitmask, keepdim]");
    int64_t mask;
    int32_t i;
    if (st != TB_OK) return st;
    mask = attrs[0];
    if ((st = tb__check_mask(fn, mask, x)) != TB_OK) return st;
    if ((st = tb__check_flag(fn, "keepdim", attrs[1])) != TB_OK) return st;
    if (op == TB_OP_SUM || op == TB_OP_PROD) st = tb__need_not_bool(fn, x);
    if (op == TB_OP_MEAN) st = tb__need_float(fn, x);
    if (st != TB_OK) return st;
    if (op == TB_OP_MAX || op == TB_OP_MIN) {
        for (i = 0; i < x->rank; i++) {
            if (((mask >> i) & 1) != 0 && x->dims[i] == 0) {
                tb__shape_buf b;
                return tb__error(TB_ERR_SHAPE,
                                 "%s: cannot reduce over axis %d of size 0 in %s (the result "
                                 "would have no value)",
                                 fn, (int)i, tb__st(x, &b));
            }
        }
    }
    out->dtype = x->dtype;
    out->rank = 0;
    for (i = 0; i < x->rank; i++) {
        if (((mask >> i) & 1) == 0) {
            out->dims[out->rank++] = x->dims[i];
        } else if (attrs[1] != 0) {
            out->dims[out->rank++] = 1;
        }
    }
    return TB_OK;
}

static tb_status tb__infer_arg(const char *fn, const tb_shape *x, const int64_t *attrs,
                               size_t num_attrs, tb_shape *out) {
    tb_status st = tb__want_attrs(fn, num_attrs, 2, "[axis, keepdim]");
    int32_t i, axis;
    if (st != TB_OK) return st;
    if ((st = tb__check_rank1(fn, x)) != TB_OK) return st;
    if ((st = tb__check_axis(fn, "axis", attrs[0], x)) != TB_OK) return st;
    if ((st = tb__check_flag(fn, "keepdim", attrs[1])) != TB_OK) return st;
    if ((st = tb__need_not_bool(fn, x)) != TB_OK) return st;
    axis = (int32_t)attrs[0];
    if (x->dims[axis] == 0) {
        tb__shape_buf b;
        return tb__error(TB_ERR_SHAPE, "%s: cannot reduce over axis %d of size 0 in %s", fn,
                         (int)axis, tb__st(x, &b));
    }
    out->dtype = TB_I64;
    out->rank = 0;
    for (i = 0; i < x->rank; i++) {
        if (i != axis) {
            out->dims[out->rank++] = x->dims[i];
        } else if (attrs[1] != 0) {
            out->dims[out->rank++] = 1;
        }
    }
    return TB_OK;
}

static tb_status tb__infer_matmul(const char *fn, const tb_shape *in, tb_shape *out) {
    const tb_shape *a = &in[0], *b = &in[1];
    tb__shape_buf sa, sb;
    int32_t r = a->rank, i;
    tb_status st = tb__same_dtype(fn, in, 2);
    if (st != TB_OK) return st;
    if ((st = tb__need_not_bool(fn, a)) != TB_OK) return st;
    if (a->rank < 2 || a->rank != b->rank) {
        return tb__error(TB_ERR_SHAPE,
                         "%s: operands %s and %s must have one rank >= 2 (the matmul node form)",
                         fn, tb__st(a, &sa), tb__st(b, &sb));
    }
    for (i = 0; i < r - 2; i++) {
        if (a->dims[i] != b->dims[i]) {
            return tb__error(TB_ERR_SHAPE, "%s: batch dims of %s and %s differ", fn, tb__st(a, &sa),
                             tb__st(b, &sb));
        }
    }
    if (a->dims[r - 1] != b->dims[r - 2]) {
        return tb__error(TB_ERR_SHAPE, "%s: shapes %s and %s do not match (%lld != %lld)", fn,
                         tb__st(a, &sa), tb__st(b, &sb), (long long)a->dims[r - 1],
                         (long long)b->dims[r - 2]);
    }
    *out = *a;
    out->dims[r - 1] = b->dims[r - 1];
    return TB_OK;
}

static tb_status tb__infer_layer_norm(const char *fn, const tb_shape *in, size_t n,
                                      const int64_t *attrs, size_t num_attrs, tb_shape *out) {
    tb_status st = tb__want_attrs(fn, num_attrs, 3, "[normalized_ndim, has_weight, has_bias]");
    const tb_shape *x = &in[0];
    int64_t nd;
    size_t want, k;
    tb__shape_buf b;
    if (st != TB_OK) return st;
    if ((st = tb__check_flag(fn, "has_weight", attrs[1])) != TB_OK) return st;
    if ((st = tb__check_flag(fn, "has_bias", attrs[2])) != TB_OK) return st;
    want = 1 + (size_t)attrs[1] + (size_t)attrs[2];
    if ((st = tb__want_inputs(fn, n, want)) != TB_OK) return st;
    if ((st = tb__need_float(fn, x)) != TB_OK) return st;
    nd = attrs[0];
    if (nd < 1 || nd > x->rank) {
        return tb__error(TB_ERR_SHAPE, "%s: normalized_ndim %lld is out of range for %s (1..%d)",
                         fn, (long long)nd, tb__st(x, &b), (int)x->rank);
    }
    for (k = 1; k < n; k++) {
        const tb_shape *p = &in[k];
        const char *what = (k == 1 && attrs[1] != 0) ? "weight" : "bias";
        bool ok = p->rank == nd && p->dtype == x->dtype;
        int32_t i;
        for (i = 0; ok && i < p->rank; i++) {
            ok = p->dims[i] == x->dims[x->rank - nd + i];
        }
        if (!ok) {
            tb__shape_buf c;
            return tb__error(p->dtype == x->dtype ? TB_ERR_SHAPE : TB_ERR_DTYPE,
                             "%s: %s %s does not match the last %lld dims of %s", fn, what,
                             tb__st(p, &c), (long long)nd, tb__st(x, &b));
        }
    }
    *out = *x;
    return TB_OK;
}

static tb_status tb__infer_reshape(const char *fn, const tb_shape *x, const int64_t *attrs,
                                   size_t num_attrs, tb_shape *out) {
    int64_t in_numel, out_numel;
    int32_t i;
    tb__shape_buf b;
    if (num_attrs > TB_MAX_RANK) {
        return tb__error(TB_ERR_SHAPE, "%s: %zu output dims exceed the maximum rank %d", fn,
                         num_attrs, TB_MAX_RANK);
    }
    for (i = 0; i < (int32_t)num_attrs; i++) {
        if (attrs[i] < 0) {
            return tb__error(TB_ERR_SHAPE, "%s: output dim %d is negative (%lld)", fn, (int)i,
                             (long long)attrs[i]);
        }
    }
    out->dtype = x->dtype;
    out->rank = (int32_t)num_attrs;
    for (i = 0; i < out->rank; i++)
        out->dims[i] = attrs[i];
    if (!tb__shape_fits(out)) return tb__check_fits(fn, out);
    in_numel = tb__shape_numel(x);
    out_numel = tb__shape_numel(out);
    if (in_numel != out_numel) {
        tb__shape_buf c;
        return tb__error(TB_ERR_SHAPE, "%s: cannot reshape %s (%lld elements) to %s", fn,
                         tb__st(x, &b), (long long)in_numel, tb__st(out, &c));
    }
    return TB_OK;
}

static tb_status tb__infer_permute(const char *fn, const tb_shape *x, const int64_t *attrs,
                                   size_t num_attrs, tb_shape *out) {
    bool seen[TB_MAX_RANK];
    int32_t i;
    tb__shape_buf b;
    if (num_attrs != (size_t)x->rank) {
        return tb__error(TB_ERR_SHAPE, "%s: permutation of %zu axes for %s", fn, num_attrs,
                         tb__st(x, &b));
    }
    memset(seen, 0, sizeof seen);
    out->dtype = x->dtype;
    out->rank = x->rank;
    for (i = 0; i < x->rank; i++) {
        int64_t p = attrs[i];
        if (p < 0 || p >= x->rank || seen[p]) {
            return tb__error(TB_ERR_SHAPE,
                             "%s: entry %d (%lld) of the permutation for %s is out "
                             "of range or repeated",
                             fn, (int)i, (long long)p, tb__st(x, &b));
        }
        seen[p] = true;
        out->dims[i] = x->dims[p];
    }
    return TB_OK;
}

static tb_status tb__infer_expand(const char *fn, const tb_shape *x, const int64_t *attrs,
                                  size_t num_attrs, tb_shape *out) {
    int32_t i, lead;
    tb__shape_buf b, c;
    if (num_attrs > TB_MAX_RANK || (int32_t)num_attrs < x->rank) {
        return tb__error(TB_ERR_SHAPE, "%s: cannot expand %s to %zu dims (%d..%d)", fn,
                         tb__st(x, &b), num_attrs, (int)x->rank, TB_MAX_RANK);
    }
    out->dtype = x->dtype;
    out->rank = (int32_t)num_attrs;
    for (i = 0; i < out->rank; i++) {
        if (attrs[i] < 0) {
            return tb__error(TB_ERR_SHAPE, "%s: output dim %d is negative (%lld)", fn, (int)i,
                             (long long)attrs[i]);
        }
        out->dims[i] = attrs[i];
    }
    lead = out->rank - x->rank;
    for (i = 0; i < x->rank; i++) {
        if (x->dims[i] != 1 && x->dims[i] != out->dims[lead + i]) {
            return tb__error(TB_ERR_SHAPE, "%s: cannot expand %s to %s (dim %d: %lld to %lld)", fn,
                             tb__st(x, &b), tb__st(out, &c), (int)i, (long long)x->dims[i],
                             (long long)out->dims[lead + i]);
        }
    }
    return tb__check_fits(fn, out);
}

static tb_status tb__infer_slice(const char *fn, const tb_shape *x, const int64_t *attrs,
                                 size_t num_attrs, tb_shape *out) {
    tb_status st = tb__want_attrs(fn, num_attrs, 4, "[dim, start, end, step]");
    int64_t dim, start, end, step;
    tb__shape_buf b;
    if (st != TB_OK) return st;
    if ((st = tb__check_rank1(fn, x)) != TB_OK) return st;
    if ((st = tb__check_axis(fn, "dim", attrs[0], x)) != TB_OK) return st;
    dim = attrs[0];
    start = attrs[1];
    end = attrs[2];
    step = attrs[3];
    if (step < 1) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: step %lld must be >= 1", fn,
                         (long long)step);
    }
    if (start < 0 || start > end || end > x->dims[dim]) {
        return tb__error(TB_ERR_SHAPE,
                         "%s: range [%lld, %lld) is not within dim %lld of %s (0 <= start <= "
                         "end <= size)",
                         fn, (long long)start, (long long)end, (long long)dim, tb__st(x, &b));
    }
    *out = *x;
    out->dims[dim] = end == start ? 0 : 1 + (end - start - 1) / step;
    return TB_OK;
}

static tb_status tb__infer_concat(const char *fn, const tb_shape *in, size_t n,
                                  const int64_t *attrs, size_t num_attrs, tb_shape *out) {
    tb_status st = tb__want_attrs(fn, num_attrs, 1, "[dim]");
    int64_t dim, total;
    size_t k;
    if (st != TB_OK) return st;
    if (n < 1) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: no operands", fn);
    if ((st = tb__check_rank1(fn, &in[0])) != TB_OK) return st;
    if ((st = tb__check_axis(fn, "dim", attrs[0], &in[0])) != TB_OK) return st;
    if ((st = tb__same_dtype(fn, in, n)) != TB_OK) return st;
    dim = attrs[0];
    total = 0;
    for (k = 0; k < n; k++) {
        int32_t i;
        bool ok = in[k].rank == in[0].rank;
        for (i = 0; ok && i < in[0].rank; i++) {
            ok = i == dim || in[k].dims[i] == in[0].dims[i];
        }
        if (!ok) {
            tb__shape_buf a, b;
            return tb__error(TB_ERR_SHAPE,
                             "%s: shapes %s (operand 0) and %s (operand %zu) differ outside dim "
                             "%lld",
                             fn, tb__st(&in[0], &a), tb__st(&in[k], &b), k, (long long)dim);
        }
        if (!tb__add_i64(total, in[k].dims[dim], &total)) {
            return tb__error(TB_ERR_OVERFLOW, "%s: the concatenated dim %lld overflows", fn,
                             (long long)dim);
        }
    }
    *out = in[0];
    out->dims[dim] = total;
    return tb__check_fits(fn, out);
}

static tb_status tb__infer_pad(const char *fn, const tb_shape *in, const int64_t *attrs,
                               size_t num_attrs, tb_shape *out) {
    const tb_shape *x = &in[0];
    tb__shape_buf b, c;
    int32_t i;
    if (in[1].rank != 0 || in[1].dtype != x->dtype) {
        return tb__error(TB_ERR_SHAPE, "%s: the pad value must be a rank-0 %s, got %s", fn,
                         tb_dtype_name(x->dtype), tb__st(&in[1], &c));
    }
    if (num_attrs != 2 * (size_t)x->rank) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "%s: expected %d attributes [before, after] per axis of %s, got %zu", fn,
                         2 * (int)x->rank, tb__st(x, &b), num_attrs);
    }
    *out = *x;
    for (i = 0; i < x->rank; i++) {
        int64_t before = attrs[2 * i], after = attrs[2 * i + 1];
        if (before < 0 || after < 0) {
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: negative padding (%lld, %lld) on axis "
                             "%d",
                             fn, (long long)before, (long long)after, (int)i);
        }
        if (!tb__add_i64(before, x->dims[i], &out->dims[i]) ||
            !tb__add_i64(out->dims[i], after, &out->dims[i])) {
            return tb__error(TB_ERR_OVERFLOW, "%s: padding axis %d of %s overflows", fn, (int)i,
                             tb__st(x, &b));
        }
    }
    return tb__check_fits(fn, out);
}

static tb_status tb__infer_gather(const char *fn, tb_op op, const tb_shape *in,
                                  const int64_t *attrs, size_t num_attrs, tb_shape *out) {
    const tb_shape *x = &in[0], *index = &in[1];
    tb_status st = tb__want_attrs(fn, num_attrs, 1, "[dim]");
    tb__shape_buf a, b;
    int64_t dim;
    int32_t i;
    if (st != TB_OK) return st;
    if ((st = tb__check_rank1(fn, x)) != TB_OK) return st;
    if ((st = tb__check_axis(fn, "dim", attrs[0], x)) != TB_OK) return st;
    if ((st = tb__need_index(fn, index)) != TB_OK) return st;
    dim = attrs[0];
    if (op == TB_OP_INDEX_SELECT) {
        if (index->rank != 1) {
            return tb__error(TB_ERR_SHAPE, "%s: index must be 1-D, got %s", fn, tb__st(index, &b));
        }
        *out = *x;
        out->dims[dim] = index->dims[0];
        return tb__check_fits(fn, out);
    }
    if (index->rank != x->rank) {
        return tb__error(TB_ERR_SHAPE, "%s: index %s must have the rank of %s", fn,
                         tb__st(index, &b), tb__st(x, &a));
    }
    for (i = 0; i < x->rank; i++) {
        if (i != dim && index->dims[i] > x->dims[i]) {
            return tb__error(TB_ERR_SHAPE,
                             "%s: index %s is larger than %s in dim %d (only dim %lld may be)", fn,
                             tb__st(index, &b), tb__st(x, &a), (int)i, (long long)dim);
        }
    }
    *out = *index;
    out->dtype = x->dtype;
    return TB_OK;
}

/* The output dtype and shape of a custom op. */
static tb_status tb__infer_custom(const char *fn, const tb__custom_op *entry, const tb_shape *in,
                                  size_t n, const int64_t *attrs, size_t num_attrs, tb_shape *out) {
    tb_status st;
    tb__shape_buf b;
    size_t k;
    int32_t i;
    if ((st = tb__want_inputs(fn, n, (size_t)entry->desc.num_inputs)) != TB_OK) return st;
    if (entry->desc.infer_shape == NULL) {
        tb_shape shape;
        memset(&shape, 0, sizeof shape);
        if ((st = tb__broadcast_dims(fn, in, n, &shape)) != TB_OK) return st;
        shape.dtype = in[0].dtype;
        for (k = 1; k < n; k++)
            shape.dtype = tb_dtype_promote(shape.dtype, in[k].dtype);
        if ((st = tb__check_fits(fn, &shape)) != TB_OK) return st;
        *out = shape;
        return TB_OK;
    } else {
        tb__saved_error before;
        tb_shape shape;
        bool ok;
        memset(&shape, 0, sizeof shape);
        tb__error_save(&before);
        st = entry->desc.infer_shape(in, n, attrs, num_attrs, &shape, entry->desc.user_data);
        if (st != TB_OK) {
            bool changed =
                tb_last_status() != TB_OK &&
                (tb_last_status() != before.status || strcmp(tb_last_error(), before.message) != 0);
            if (st < TB_OK || st >= TB_STATUS_COUNT) st = TB_ERR_SHAPE;
            if (changed) return tb__error(st, "%s: infer_shape failed: %s", fn, tb_last_error());
            return tb__error(st, "%s: infer_shape failed (%s)", fn, tb_status_string(st));
        }
        ok = tb_dtype_is_valid(shape.dtype) && shape.rank >= 0 && shape.rank <= TB_MAX_RANK;
        for (i = 0; ok && i < shape.rank; i++)
            ok = shape.dims[i] >= 0;
        if (!ok) {
            return tb__error(TB_ERR_SHAPE,
                             "%s: infer_shape gave an invalid shape (dtype %d, "
                             "rank %d)",
                             fn, (int)shape.dtype, (int)shape.rank);
        }
        if (!tb__shape_fits(&shape)) {
            return tb__error(TB_ERR_OVERFLOW, "%s: infer_shape gave %s, which is too large", fn,
                             tb__st(&shape, &b));
        }
        *out = shape;
        return TB_OK;
    }
}

/* Shape inference with `fn` as the name that starts every message. */
static tb_status tb__infer_shape_as(const char *fn, tb_op op, const tb_shape *inputs,
                                    size_t num_inputs, const int64_t *attrs, size_t num_attrs,
                                    tb_shape *out) {
    tb_shape result;
    tb_status st;
    int32_t arity;
    size_t k;
    if (num_inputs > 0 && inputs == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: inputs is NULL", fn);
    }
    if (num_attrs > 0 && attrs == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: attrs is NULL", fn);
    }
    if (num_attrs > TB_MAX_ATTRS) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %zu attributes (at most %d)", fn, num_attrs,
                         TB_MAX_ATTRS);
    }
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    for (k = 0; k < num_inputs; k++) {
        const tb_shape *s = &inputs[k];
        if (!tb__shape_fits(s)) {
            return tb__error(TB_ERR_SHAPE,
                             "%s: operand %zu has an invalid shape (dtype %d, rank "
                             "%d)",
                             fn, k, (int)s->dtype, (int)s->rank);
        }
    }
    if (!tb__op_is_builtin(op)) {
        const tb__custom_op *entry = tb__custom_get(op);
        if (entry == NULL) return tb__error(TB_ERR_NOT_FOUND, "%s: unknown op %d", fn, (int)op);
        return tb__infer_custom(fn, entry, inputs, num_inputs, attrs, num_attrs, out);
    }
    if (tb__op_table[op].kind == TB_KIND_LEAF) {
        return tb__error(TB_ERR_UNSUPPORTED,
                         "%s: '%s' is a leaf op; it is created by its own function (tb_%s, ...), "
                         "not inferred",
                         fn, tb__op_table[op].name,
                         op == TB_OP_DEVICE_DATA ? "tensor_from_host" : tb__op_table[op].name);
    }
    arity = tb__op_table[op].arity;
    if (arity >= 0) {
        if ((st = tb__want_inputs(fn, num_inputs, (size_t)arity)) != TB_OK) return st;
    } else if (num_inputs < 1) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: expected at least 1 operand, got 0", fn);
    }
    memset(&result, 0, sizeof result);
    switch (tb__op_table[op].kind) {
    case TB_KIND_UNARY:
        if (op == TB_OP_CAST) {
            if ((st = tb__want_attrs(fn, num_attrs, 1, "[dtype]")) != TB_OK) return st;
            if (attrs[0] < 0 || attrs[0] >= (int64_t)TB_DTYPE_COUNT) {
                return tb__error(TB_ERR_DTYPE, "%s: invalid dtype %lld", fn, (long long)attrs[0]);
            }
            result = inputs[0];
            result.dtype = (tb_dtype)attrs[0];
            break;
        }
        if ((st = tb__want_attrs(fn, num_attrs, 0, "")) != TB_OK) return st;
        if ((st = tb__infer_unary(fn, op, &inputs[0])) != TB_OK) return st;
        result = inputs[0];
        if (op == TB_OP_LOGICAL_NOT) result.dtype = TB_BOOL;
        break;
    case TB_KIND_BINARY:
        if ((st = tb__want_attrs(fn, num_attrs, 0, "")) != TB_OK) return st;
        if ((st = tb__infer_binary(fn, op, inputs, &result)) != TB_OK) return st;
        break;
    case TB_KIND_TERNARY:
        if ((st = tb__want_attrs(fn, num_attrs, 0, "")) != TB_OK) return st;
        if (op == TB_OP_WHERE) {
            if ((st = tb__need_bool(fn, "the condition", &inputs[0])) != TB_OK) return st;
            if ((st = tb__same_dtype(fn, inputs + 1, 2)) != TB_OK) return st;
            result.dtype = inputs[1].dtype;
        } else {
            if ((st = tb__same_dtype(fn, inputs, 3)) != TB_OK) return st;
            if ((st = tb__need_not_bool(fn, &inputs[0])) != TB_OK) return st;
            result.dtype = inputs[0].dtype;
        }
        if ((st = tb__broadcast_dims(fn, inputs, 3, &result)) != TB_OK) return st;
        break;
    case TB_KIND_REDUCE:
        if (op == TB_OP_ARGMAX || op == TB_OP_ARGMIN) {
            st = tb__infer_arg(fn, &inputs[0], attrs, num_attrs, &result);
        } else {
            st = tb__infer_reduce(fn, op, &inputs[0], attrs, num_attrs, &result);
        }
        if (st != TB_OK) return st;
        break;
    case TB_KIND_MATMUL:
        if ((st = tb__want_attrs(fn, num_attrs, 0, "")) != TB_OK) return st;
        if ((st = tb__infer_matmul(fn, inputs, &result)) != TB_OK) return st;
        break;
    case TB_KIND_NORM:
        if (op == TB_OP_LAYER_NORM) {
            st = tb__infer_layer_norm(fn, inputs, num_inputs, attrs, num_attrs, &result);
            if (st != TB_OK) return st;
            break;
        }
        if ((st = tb__want_attrs(fn, num_attrs, 1, "[axis]")) != TB_OK) return st;
        if ((st = tb__need_float(fn, &inputs[0])) != TB_OK) return st;
        if ((st = tb__check_rank1(fn, &inputs[0])) != TB_OK) return st;
        if ((st = tb__check_axis(fn, "axis", attrs[0], &inputs[0])) != TB_OK) return st;
        result = inputs[0];
        break;
    case TB_KIND_MOVEMENT:
        switch (op) {
        case TB_OP_RESHAPE:
            st = tb__infer_reshape(fn, &inputs[0], attrs, num_attrs, &result);
            break;
        case TB_OP_PERMUTE:
            st = tb__infer_permute(fn, &inputs[0], attrs, num_attrs, &result);
            break;
        case TB_OP_EXPAND:
            st = tb__infer_expand(fn, &inputs[0], attrs, num_attrs, &result);
            break;
        case TB_OP_SLICE:
            st = tb__infer_slice(fn, &inputs[0], attrs, num_attrs, &result);
            break;
        default: /* FLIP */
            st = tb__want_attrs(fn, num_attrs, 1, "[axes bitmask]");
            if (st == TB_OK) st = tb__check_mask(fn, attrs[0], &inputs[0]);
            result = inputs[0];
            break;
        }
        if (st != TB_OK) return st;
        break;
    default: /* TB_KIND_OTHER */
        switch (op) {
        case TB_OP_CONCAT:
            st = tb__infer_concat(fn, inputs, num_inputs, attrs, num_attrs, &result);
            break;
        case TB_OP_PAD:
            st = tb__infer_pad(fn, inputs, attrs, num_attrs, &result);
            break;
        default: /* GATHER, INDEX_SELECT */
            st = tb__infer_gather(fn, op, inputs, attrs, num_attrs, &result);
            break;
        }
        if (st != TB_OK) return st;
        break;
    }
    if ((st = tb__check_fits(fn, &result)) != TB_OK) return st;
    *out = result;
    return TB_OK;
}

static TB__UNUSED tb_status tb__op_infer_shape(tb_op op, const tb_shape *inputs, size_t num_inputs,
                                               const int64_t *attrs, size_t num_attrs,
                                               tb_shape *out) {
    const char *name = tb_op_name(op);
    return tb__infer_shape_as(name != NULL ? name : "tb__op_infer_shape", op, inputs, num_inputs,
                              attrs, num_attrs, out);
}

#undef TB__NODE_HASH_SEED
#undef TB__ATOMIC_INC64

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

/* ---- src/metrics.c ---- */
/* ===========================================================================================
   Metrics: LTC's counters and metrics (torch/csrc/lazy/core/metrics.h), by name
   =========================================================================================== */

#define TB__METRIC_RECENT   64  /* samples kept per metric for the percentiles */
#define TB__METRIC_NAME_MAX 255 /* longest name in bytes */

typedef struct tb__metric {
    char *name;
    int64_t value; /* a counter's value; a metric's number of samples */
    double sum;
    double min;
    double max;
    double recent[TB__METRIC_RECENT]; /* a ring of the latest samples */
} tb__metric;

typedef struct tb__metric_table {
    tb__metric **items; /* sorted by name */
    size_t count;
    size_t cap;
} tb__metric_table;

static tb__mutex tb__metrics_mutex = TB__MUTEX_INIT;
static tb__metric_table tb__metric_counters;
static tb__metric_table tb__metric_samples;

/* The index of `name`, or where it would go (*found false). */
static size_t tb__metric_find(const tb__metric_table *table, const char *name, bool *found) {
    size_t lo = 0, hi = table->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(table->items[mid]->name, name);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    *found = false;
    return lo;
}

/* The entry of `name`, created when missing; NULL when out of memory. Recording is best
   effort: a metric that cannot be created is dropped, and the caller's error (its operation
   succeeded) stays as it was. Caller holds the lock. */
static tb__metric *tb__metric_get(tb__metric_table *table, const char *name) {
    bool found;
    size_t at = tb__metric_find(table, name, &found);
    tb__metric *m;
    tb__saved_error saved;
    if (found) return table->items[at];
    tb__error_save(&saved);
    if (tb__grow((void **)&table->items, &table->cap, table->count + 1, sizeof(tb__metric *)) !=
        TB_OK) {
        tb__error_restore(&saved);
        return NULL;
    }
    m = (tb__metric *)tb__calloc(1, sizeof(tb__metric));
    if (m == NULL) {
        tb__error_restore(&saved);
        return NULL;
    }
    m->name = tb__strdup(name);
    if (m->name == NULL) {
        tb__free(m);
        tb__error_restore(&saved);
        return NULL;
    }
    memmove(table->items + at + 1, table->items + at, (table->count - at) * sizeof(tb__metric *));
    table->items[at] = m;
    table->count++;
    return m;
}

static const tb__metric *tb__metric_peek(const tb__metric_table *table, const char *name) {
    bool found;
    size_t at = tb__metric_find(table, name, &found);
    return found ? table->items[at] : NULL;
}

static void tb__metric_table_free(tb__metric_table *table) {
    size_t i;
    for (i = 0; i < table->count; i++) {
        tb__free(table->items[i]->name);
        tb__free(table->items[i]);
    }
    tb__free(table->items);
    table->items = NULL;
    table->count = 0;
    table->cap = 0;
}

static void tb__metric_count(const char *name, int64_t delta) {
    tb__metric *m;
    tb__mutex_lock(&tb__metrics_mutex);
    m = tb__metric_get(&tb__metric_counters, name);
    if (m != NULL) m->value += delta;
    tb__mutex_unlock(&tb__metrics_mutex);
}

static void tb__metric_sample(const char *name, double value) {
    tb__metric *m;
    tb__mutex_lock(&tb__metrics_mutex);
    m = tb__metric_get(&tb__metric_samples, name);
    if (m != NULL) {
        if (m->value == 0 || value < m->min) m->min = value;
        if (m->value == 0 || value > m->max) m->max = value;
        m->recent[(uint64_t)m->value % TB__METRIC_RECENT] = value;
        m->sum += value;
        m->value++;
    }
    tb__mutex_unlock(&tb__metrics_mutex);
}

static void tb__metrics_shutdown(void) {
    tb__mutex_lock(&tb__metrics_mutex);
    tb__metric_table_free(&tb__metric_counters);
    tb__metric_table_free(&tb__metric_samples);
    tb__mutex_unlock(&tb__metrics_mutex);
}

static bool tb__metric_name_ok(const char *func, const char *name) {
    size_t n;
    if (name == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: name is NULL", func);
        return false;
    }
    n = strlen(name);
    if (n == 0 || n > TB__METRIC_NAME_MAX) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: name '%.40s' has %lu bytes (1..%d allowed)", func,
                  name, (unsigned long)n, TB__METRIC_NAME_MAX);
        return false;
    }
    return true;
}

TBDEF int64_t tb_metrics_counter(const char *name) {
    const tb__metric *m;
    int64_t value = 0;
    if (!tb__metric_name_ok("tb_metrics_counter", name)) return 0;
    tb__ensure_setup();
    tb__mutex_lock(&tb__metrics_mutex);
    m = tb__metric_peek(&tb__metric_counters, name);
    if (m == NULL) m = tb__metric_peek(&tb__metric_samples, name);
    if (m != NULL) value = m->value;
    tb__mutex_unlock(&tb__metrics_mutex);
    return value;
}

TBDEF double tb_metrics_total(const char *name) {
    const tb__metric *m;
    double total = 0.0;
    if (!tb__metric_name_ok("tb_metrics_total", name)) return 0.0;
    tb__ensure_setup();
    tb__mutex_lock(&tb__metrics_mutex);
    m = tb__metric_peek(&tb__metric_samples, name);
    if (m != NULL) {
        total = m->sum;
    } else {
        m = tb__metric_peek(&tb__metric_counters, name);
        if (m != NULL) total = (double)m->value;
    }
    tb__mutex_unlock(&tb__metrics_mutex);
    return total;
}

TBDEF void tb_metrics_reset(void) {
    tb__ensure_setup();
    tb__metrics_shutdown();
}

TBDEF void tb_metrics_add(const char *name, int64_t delta) {
    if (!tb__metric_name_ok("tb_metrics_add", name)) return;
    tb__ensure_setup();
    tb__metric_count(name, delta);
}

TBDEF void tb_metrics_sample(const char *name, double value) {
    if (!tb__metric_name_ok("tb_metrics_sample", name)) return;
    if (value != value) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_metrics_sample: %s: the value is NaN", name);
        return;
    }
    tb__ensure_setup();
    tb__metric_sample(name, value);
}

/* Times are in nanoseconds and shown in the largest unit below them, as LTC does. */
static void tb__metric_value_text(tb__str *s, bool is_time, double v) {
    double a = fabs(v);
    if (is_time) {
        if (a < 1e3) {
            tb__str_append(s, "%.0fns", v);
        } else if (a < 1e6) {
            tb__str_append(s, "%.3fus", v / 1e3);
        } else if (a < 1e9) {
            tb__str_append(s, "%.3fms", v / 1e6);
        } else {
            tb__str_append(s, "%.3fs", v / 1e9);
        }
    } else if (a < 1e15 && v == floor(v)) {
        tb__str_append(s, "%.0f", v);
    } else {
        tb__str_append(s, "%.6g", v);
    }
}

static int tb__metric_compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void tb__metric_report(tb__str *s, const tb__metric *m) {
    static const int percentiles[] = {1, 5, 10, 20, 50, 80, 90, 95, 99};
    size_t name_len = strlen(m->name);
    bool is_time = name_len >= 4 && strcmp(m->name + name_len - 4, "Time") == 0;
    double sorted[TB__METRIC_RECENT];
    size_t n = m->value < TB__METRIC_RECENT ? (size_t)m->value : TB__METRIC_RECENT;
    size_t i;
    tb__str_append(s, "Metric: %s\n  TotalSamples: %lld\n  Accumulator: ", m->name,
                   (long long)m->value);
    tb__metric_value_text(s, is_time, m->sum);
    tb__str_append(s, "\n  Mean: ");
    tb__metric_value_text(s, is_time, m->value > 0 ? m->sum / (double)m->value : 0.0);
    tb__str_append(s, "\n  Min: ");
    tb__metric_value_text(s, is_time, m->min);
    tb__str_append(s, "\n  Max: ");
    tb__metric_value_text(s, is_time, m->max);
    memcpy(sorted, m->recent, n * sizeof(double));
    qsort(sorted, n, sizeof(double), tb__metric_compare_double);
    tb__str_append(s, "\n  Percentiles: ");
    for (i = 0; i < sizeof(percentiles) / sizeof(percentiles[0]); i++) {
        size_t at = (size_t)((double)percentiles[i] / 100.0 * (double)(n - 1) + 0.5);
        tb__str_append(s, "%s%d%%=", i > 0 ? "; " : "", percentiles[i]);
        tb__metric_value_text(s, is_time, sorted[at]);
    }
    tb__str_append(s, "\n");
}

TBDEF char *tb_metrics_report(void) {
    tb__str s;
    size_t i;
    memset(&s, 0, sizeof(s));
    tb__ensure_setup();
    tb__mutex_lock(&tb__metrics_mutex);
    for (i = 0; i < tb__metric_samples.count; i++) {
        tb__metric_report(&s, tb__metric_samples.items[i]);
    }
    for (i = 0; i < tb__metric_counters.count; i++) {
        tb__str_append(&s, "Counter: %s\n  Value: %lld\n", tb__metric_counters.items[i]->name,
                       (long long)tb__metric_counters.items[i]->value);
    }
    tb__mutex_unlock(&tb__metrics_mutex);
    if (s.data == NULL && !s.failed) return tb__strdup("");
    return tb__str_take(&s);
}

#undef TB__METRIC_RECENT
#undef TB__METRIC_NAME_MAX

/* ---- src/tensor.c ---- */
/* ===========================================================================================
   Lazy tensors and the executor: the C form of LTC's LazyTensor and LazyGraphExecutor
   (torch/csrc/lazy/core/lazy_graph_executor.cpp): a tensor holds either a pending IR node or a
   materialised backend data; a sync walks the pending graph, looks its hash up in the
   computation cache, compiles on a miss, executes, and gives each tensor its result.
   =========================================================================================== */

struct tb_tensor {
    int32_t refcount;
    tb_device device;
    tb_shape shape;
    tb_node *node;         /* the pending IR (owned), NULL once materialised */
    tb_backend_data *data; /* the materialised value (owned), NULL while pending */
    tb_node *data_node;    /* a DEVICE_DATA node over `data` for use as an operand (owned) */
    tb_tensor *live_prev;  /* the list of live tensors that tb_mark_step syncs */
    tb_tensor *live_next;
    bool live_linked;
};

static tb__mutex tb__tensor_live_mutex = TB__MUTEX_INIT;
static tb_tensor *tb__tensor_live_head = NULL;

/* ---- small helpers ---- */

static void tb__exec_device_text(const tb_device *device, char buf[64]) {
    tb_device_format(device, buf, 64);
}

/* The error for a NULL tensor argument: the first error of a chain stays. */
static void tb__tensor_null_error(const char *func, const char *what) {
    if (tb_last_status() == TB_OK) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", func, what);
    }
}

/* Adds one to a refcount unless it already dropped to 0 (a tensor being destroyed). */
static bool tb__tensor_retain_if_alive(int32_t *refcount) {
#if defined(_MSC_VER) && !defined(__clang__)
    LONG seen = *(volatile LONG *)refcount;
    while (seen > 0) {
        LONG prev = InterlockedCompareExchange((volatile LONG *)refcount, seen + 1, seen);
        if (prev == seen) return true;
        seen = prev;
    }
    return false;
#else
    int32_t seen = __atomic_load_n(refcount, __ATOMIC_ACQUIRE);
    while (seen > 0) {
        if (__atomic_compare_exchange_n(refcount, &seen, seen + 1, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            return true;
        }
    }
    return false;
#endif
}

/* One host element of `dtype` as a double. */
static double tb__exec_host_to_double(const void *in, tb_dtype dtype) {
    switch (dtype) {
    case TB_F32: {
        float v;
        memcpy(&v, in, sizeof(v));
        return (double)v;
    }
    case TB_F64: {
        double v;
        memcpy(&v, in, sizeof(v));
        return v;
    }
    case TB_I32: {
        int32_t v;
        memcpy(&v, in, sizeof(v));
        return (double)v;
    }
    case TB_I64: {
        int64_t v;
        memcpy(&v, in, sizeof(v));
        return (double)v;
    }
    case TB_U8:
        return (double)*(const uint8_t *)in;
    case TB_BOOL:
        return *(const uint8_t *)in != 0 ? 1.0 : 0.0;
    default:
        return 0.0;
    }
}

/* A host buffer for `shape` (at least one byte, so that empty tensors need no special case). */
static void *tb__exec_host_alloc(const tb_shape *shape, size_t *nbytes) {
    size_t n = 0;
    if (tb_shape_nbytes(shape, &n) != TB_OK) return NULL;
    if (nbytes != NULL) *nbytes = n;
    return tb__alloc(n > 0 ? n : 1);
}

/* ---- tensors ---- */

static tb_tensor *tb__tensor_new(const tb_device *device, const tb_shape *shape) {
    tb_tensor *t = (tb_tensor *)tb__calloc(1, sizeof(tb_tensor));
    if (t == NULL) return NULL;
    t->refcount = 1;
    t->device = *device;
    t->shape = *shape;
    tb__mutex_lock(&tb__tensor_live_mutex);
    t->live_next = tb__tensor_live_head;
    if (tb__tensor_live_head != NULL) tb__tensor_live_head->live_prev = t;
    tb__tensor_live_head = t;
    t->live_linked = true;
    tb__mutex_unlock(&tb__tensor_live_mutex);
    return t;
}

static void tb__tensor_destroy(tb_tensor *t) {
    tb__mutex_lock(&tb__tensor_live_mutex);
    if (t->live_linked) {
        if (t->live_prev != NULL) {
            t->live_prev->live_next = t->live_next;
        } else {
            tb__tensor_live_head = t->live_next;
        }
        if (t->live_next != NULL) t->live_next->live_prev = t->live_prev;
    }
    tb__mutex_unlock(&tb__tensor_live_mutex);
    if (t->node != NULL) tb__node_release(t->node);
    if (t->data_node != NULL) tb__node_release(t->data_node);
    if (t->data != NULL) tb__data_release(t->data);
    tb__free(t);
}

static tb_tensor *tb__tensor_from_data(tb_backend_data *data) {
    tb_tensor *t;
    if (data == NULL) return NULL;
    t = tb__tensor_new(&data->device, &data->shape);
    if (t == NULL) {
        tb__data_release(data);
        return NULL;
    }
    t->data = data;
    return t;
}

static tb_node *tb__tensor_ir(tb_tensor *tensor) {
    if (tensor == NULL) return NULL;
    if (tensor->node != NULL) return tensor->node;
    if (tensor->data_node == NULL) {
        if (tensor->data == NULL) {
            tb__error(TB_ERR_INTERNAL, "tb__tensor_ir: a tensor with neither IR nor data");
            return NULL;
        }
        tensor->data_node = tb__node_device_data(tensor->data);
    }
    return tensor->data_node;
}

static tb_status tb__resolve_device(const tb_device *device, tb_device *out) {
    tb_device made;
    tb_status st;
    if (device == NULL || device->backend[0] == '\0') return tb_current_device(out);
    if (memchr(device->backend, '\0', sizeof(device->backend)) == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_device: the backend name is not NUL-terminated within %d bytes",
                         TB_MAX_NAME + 1);
    }
    st = tb_device_make(device->backend, device->ordinal, &made);
    if (st != TB_OK) return st;
    *out = made;
    return TB_OK;
}

TBDEF tb_tensor *tb_tensor_retain(tb_tensor *tensor) {
    if (tensor != NULL) TB__ATOMIC_ADD(&tensor->refcount, 1);
    return tensor;
}

TBDEF void tb_tensor_release(tb_tensor *tensor) {
    if (tensor == NULL) return;
    if (TB__ATOMIC_ADD(&tensor->refcount, -1) == 0) tb__tensor_destroy(tensor);
}

TBDEF tb_shape tb_tensor_shape(const tb_tensor *tensor) {
    tb_shape s;
    if (tensor != NULL) return tensor->shape;
    memset(&s, 0, sizeof(s));
    return s;
}

TBDEF tb_device tb_tensor_device(const tb_tensor *tensor) {
    tb_device d;
    if (tensor != NULL) return tensor->device;
    memset(&d, 0, sizeof(d));
    return d;
}

TBDEF const tb_node *tb_tensor_node(const tb_tensor *tensor) {
    return tensor != NULL ? tensor->node : NULL;
}

/* ---- node sets: node pointer -> int64, open addressing ---- */

typedef struct tb__exec_map {
    const tb_node **keys;
    int64_t *values;
    size_t cap; /* a power of two, or 0 */
    size_t count;
} tb__exec_map;

static size_t tb__exec_map_slot(const tb__exec_map *m, const tb_node *key) {
    uint64_t h = (uint64_t)(uintptr_t)key;
    size_t mask = m->cap - 1, i;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    i = (size_t)h & mask;
    while (m->keys[i] != NULL && m->keys[i] != key)
        i = (i + 1) & mask;
    return i;
}

static int64_t *tb__exec_map_get(const tb__exec_map *m, const tb_node *key) {
    size_t i;
    if (m->cap == 0) return NULL;
    i = tb__exec_map_slot(m, key);
    return m->keys[i] != NULL ? &m->values[i] : NULL;
}

static tb_status tb__exec_map_put(tb__exec_map *m, const tb_node *key, int64_t value) {
    size_t i;
    if ((m->count + 1) * 2 > m->cap) {
        tb__exec_map bigger;
        size_t j;
        bigger.cap = m->cap > 0 ? m->cap * 2 : 64;
        bigger.count = m->count;
        bigger.keys = (const tb_node **)tb__calloc(bigger.cap, sizeof(const tb_node *));
        bigger.values = (int64_t *)tb__calloc(bigger.cap, sizeof(int64_t));
        if (bigger.keys == NULL || bigger.values == NULL) {
            tb__free((void *)bigger.keys);
            tb__free(bigger.values);
            return TB_ERR_OUT_OF_MEMORY;
        }
        for (j = 0; j < m->cap; j++) {
            if (m->keys[j] != NULL) {
                size_t k = tb__exec_map_slot(&bigger, m->keys[j]);
                bigger.keys[k] = m->keys[j];
                bigger.values[k] = m->values[j];
            }
        }
        tb__free((void *)m->keys);
        tb__free(m->values);
        *m = bigger;
    }
    i = tb__exec_map_slot(m, key);
    if (m->keys[i] == NULL) {
        m->keys[i] = key;
        m->count++;
    }
    m->values[i] = value;
    return TB_OK;
}

static void tb__exec_map_free(tb__exec_map *m) {
    tb__free((void *)m->keys);
    tb__free(m->values);
    memset(m, 0, sizeof(*m));
}

/* ---- the post-order walk (LTC's Util::ComputePostOrder, without recursion) ---- */

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

static void tb__exec_walk_free(tb__exec_walk *w) {
    tb__exec_map_free(&w->pos);
    tb__free((void *)w->order);
    tb__free((void *)w->params);
    tb__free(w->stack);
    tb__free(w->canon);
    memset(w, 0, sizeof(*w));
}

/* Leaves whose values arrive at execution: device data, scalars and nodes computed apart. */
static bool tb__exec_is_param(const tb_node *n) {
    return n->op == TB_OP_DEVICE_DATA || n->op == TB_OP_SCALAR || n->value != NULL;
}

static bool tb__exec_supported(const tb_backend_impl *vt, const tb_node *n) {
    return vt->supports_node == NULL || vt->supports_node(vt->user_data, n);
}

/* The canonical form of a graph: per node in post-order the words below, then the results.
   Two graphs with the same form are the same computation; the graph's hash is a hash of it,
   and a cache hit on the hash is confirmed by comparing forms. */
enum {
    TB__CANON_NODE = 1,   /* a computed node: op, shape, attributes, operand positions */
    TB__CANON_DATA = 2,   /* a parameter of device data, or of a value computed apart */
    TB__CANON_SCALAR = 3, /* a scalar parameter (wrapped number or not) */
    TB__CANON_RESULTS = 4
};

/* Appends the canonical words of the node the walk is placing next: its structure, with
   operands named by their positions (x + x and x + y differ) and parameters by their index
   (values never enter). Mixes the words into the walk's hash. */
static tb_status tb__exec_walk_node_canon(tb__exec_walk *w, const tb_node *n, bool param) {
    size_t need = w->num_canon + 16 + TB_MAX_RANK + TB_MAX_ATTRS + n->num_operands;
    uint64_t *c, *start, h = 0x7462677261706802ull;
    int32_t d;
    uint32_t i;
    if (tb__grow((void **)&w->canon, &w->cap_canon, need, sizeof *w->canon) != TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    start = c = w->canon + w->num_canon;
    if (param) {
        /* device data and values computed apart are the same kind of input for a backend */
        if (n->op == TB_OP_SCALAR) {
            *c++ = TB__CANON_SCALAR;
            *c++ = n->wrapped_number ? 1u : 0u;
        } else {
            *c++ = TB__CANON_DATA;
        }
    } else {
        *c++ = TB__CANON_NODE;
        *c++ = (uint64_t)(uint32_t)n->op;
    }
    *c++ = (uint64_t)n->shape.dtype;
    *c++ = (uint64_t)(uint32_t)n->shape.rank;
    for (d = 0; d < n->shape.rank && d < TB_MAX_RANK; d++)
        *c++ = (uint64_t)n->shape.dims[d];
    if (param) {
        *c++ = (uint64_t)w->num_params;
    } else {
        *c++ = n->num_attrs;
        for (i = 0; i < n->num_attrs && i < TB_MAX_ATTRS; i++)
            *c++ = (uint64_t)n->attrs[i];
        for (i = 0; i < 2; i++) {
            uint64_t bits;
            memcpy(&bits, &n->fattrs[i], sizeof(bits));
            *c++ = bits;
        }
        *c++ = n->num_operands;
        for (i = 0; i < n->num_operands; i++) {
            const int64_t *p = tb__exec_map_get(&w->pos, n->operands[i]);
            *c++ = p != NULL ? (uint64_t)*p : ~(uint64_t)0;
        }
    }
    w->num_canon += (size_t)(c - start);
    w->canon_nodes = w->num_canon;
    for (; start < c; start++)
        h = tb__hash_u64(h, *start);
    w->hash = tb__hash_u64(w->hash, h);
    return TB_OK;
}

static tb_status tb__exec_walk_push(tb__exec_walk *w, size_t *sp, const tb_node *n) {
    tb_status st;
    if (tb__grow((void **)&w->stack, &w->cap_stack, *sp + 1, sizeof(tb__exec_frame)) != TB_OK) {
        return TB_ERR_OUT_OF_MEMORY;
    }
    st = tb__exec_map_put(&w->pos, n, -1);
    if (st != TB_OK) return st;
    w->stack[*sp].node = n;
    w->stack[*sp].next = 0;
    w->stack[*sp].param =
        tb__exec_is_param(n) || (w->cut != NULL && !tb__exec_supported(w->cut, n));
    (*sp)++;
    return TB_OK;
}

/* Adds the graphs of `roots` to the walk: every node once, operands first. */
static tb_status tb__exec_walk_add(tb__exec_walk *w, const char *func, tb_node *const *roots,
                                   size_t n) {
    size_t r, sp = 0;
    for (r = 0; r < n; r++) {
        if (tb__exec_map_get(&w->pos, roots[r]) != NULL) continue;
        if (tb__exec_walk_push(w, &sp, roots[r]) != TB_OK) return TB_ERR_OUT_OF_MEMORY;
        while (sp > 0) {
            tb__exec_frame *f = &w->stack[sp - 1];
            const tb_node *node = f->node;
            int64_t *p;
            if (!f->param && f->next < node->num_operands) {
                const tb_node *operand = node->operands[f->next++];
                if (operand == NULL) {
                    return tb__error(TB_ERR_INTERNAL, "%s: node %llu (%s) has a NULL operand", func,
                                     (unsigned long long)node->id, tb_op_name(node->op));
                }
                p = tb__exec_map_get(&w->pos, operand);
                if (p != NULL) {
                    if (*p < 0) {
                        return tb__error(TB_ERR_INTERNAL,
                                         "%s: the graph has a loop through node %llu (%s)", func,
                                         (unsigned long long)operand->id, tb_op_name(operand->op));
                    }
                    continue;
                }
                if (tb__exec_walk_push(w, &sp, operand) != TB_OK) return TB_ERR_OUT_OF_MEMORY;
                continue;
            }
            if (tb__grow((void **)&w->order, &w->cap_order, w->num_order + 1,
                         sizeof(const tb_node *)) != TB_OK) {
                return TB_ERR_OUT_OF_MEMORY;
            }
            if (f->param && tb__grow((void **)&w->params, &w->cap_params, w->num_params + 1,
                                     sizeof(const tb_node *)) != TB_OK) {
                return TB_ERR_OUT_OF_MEMORY;
            }
            if (tb__exec_walk_node_canon(w, node, f->param) != TB_OK) {
                return TB_ERR_OUT_OF_MEMORY;
            }
            p = tb__exec_map_get(&w->pos, node);
            *p = (int64_t)w->num_order;
            w->order[w->num_order++] = node;
            if (f->param) w->params[w->num_params++] = node;
            sp--;
        }
    }
    return TB_OK;
}

static int64_t tb__exec_walk_position(const tb__exec_walk *w, const tb_node *node) {
    const int64_t *p = tb__exec_map_get(&w->pos, node);
    return p != NULL ? *p : -1;
}

static bool tb__exec_walk_is_param(const tb__exec_walk *w, const tb_node *node) {
    /* parameters are exactly the nodes the walk did not descend into */
    size_t lo = 0, hi = w->num_params;
    int64_t at = tb__exec_walk_position(w, node);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int64_t p = tb__exec_walk_position(w, w->params[mid]);
        if (p == at) return true;
        if (p < at) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return false;
}

/* ---- dumps of a walked graph ---- */

/* Which tensor's node sits where: (post-order position, tensor index), sorted, so that a dump
   marks results in one pass however many tensors there are. */
typedef struct tb__exec_mark {
    int64_t pos;
    size_t index;
} tb__exec_mark;

static int tb__exec_mark_compare(const void *a, const void *b) {
    const tb__exec_mark *x = (const tb__exec_mark *)a, *y = (const tb__exec_mark *)b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static tb__exec_mark *tb__exec_marks(const tb__exec_walk *w, tb_node *const *nodes, size_t n) {
    tb__exec_mark *marks = (tb__exec_mark *)tb__calloc(n + 1, sizeof(tb__exec_mark));
    size_t i;
    if (marks == NULL) return NULL;
    for (i = 0; i < n; i++) {
        marks[i].pos = tb__exec_walk_position(w, nodes[i]);
        marks[i].index = i;
    }
    qsort(marks, n, sizeof(tb__exec_mark), tb__exec_mark_compare);
    marks[n].pos = -1; /* an end that matches no position */
    return marks;
}

/* `nodes[i]` is the node of result i (tensors[i] for a dump). */
static void tb__exec_text_append(tb__str *s, const tb__exec_walk *w, tb_node *const *nodes,
                                 size_t n) {
    size_t i, next_param = 0, next_mark = 0;
    tb__exec_mark *marks = tb__exec_marks(w, nodes, n);
    if (marks == NULL) {
        s->failed = true;
        return;
    }
    for (i = 0; i < w->num_order; i++) {
        const tb_node *node = w->order[i];
        char shape[96];
        uint32_t k;
        bool param = next_param < w->num_params && w->params[next_param] == node;
        tb__shape_text(&node->shape, shape);
        tb__str_append(s, "%%%lu = %s", (unsigned long)i, tb_op_name(node->op));
        if (!param && node->num_operands > 0) {
            tb__str_append(s, "(");
            for (k = 0; k < node->num_operands; k++) {
                tb__str_append(s, "%s%%%lld", k > 0 ? ", " : "",
                               (long long)tb__exec_walk_position(w, node->operands[k]));
            }
            tb__str_append(s, ")");
        }
        tb__str_append(s, " %s", shape);
        if (!param && node->num_attrs > 0) {
            tb__str_append(s, " attrs=[");
            for (k = 0; k < node->num_attrs && k < TB_MAX_ATTRS; k++) {
                tb__str_append(s, "%s%lld", k > 0 ? ", " : "", (long long)node->attrs[k]);
            }
            tb__str_append(s, "]");
        }
        if (!param && (node->fattrs[0] != 0.0 || node->fattrs[1] != 0.0)) {
            tb__str_append(s, " fattrs=[%.17g, %.17g]", node->fattrs[0], node->fattrs[1]);
        }
        if (param) {
            tb__str_append(s, " (param %lu", (unsigned long)next_param);
            if (node->op == TB_OP_SCALAR) {
                tb__str_append(s, ", value %.17g", tb_scalar_as_double(node->scalar));
            } else if (node->op != TB_OP_DEVICE_DATA) {
                tb__str_append(s, "%s",
                               node->value != NULL ? ", computed apart" : ", not supported");
            }
            tb__str_append(s, ")");
            next_param++;
        }
        for (; marks[next_mark].pos == (int64_t)i; next_mark++) {
            tb__str_append(s, " (result %lu)", (unsigned long)marks[next_mark].index);
        }
        tb__str_append(s, "\n");
    }
    tb__free(marks);
}

/* One node of a DOT dump: its id, label and style. */
static void tb__exec_dot_node(tb__str *s, const tb__exec_walk *w, size_t i, bool param,
                              size_t param_index, const tb__exec_mark *marks, size_t next_mark,
                              const char *indent) {
    const tb_node *node = w->order[i];
    char shape[96];
    tb__shape_text(&node->shape, shape);
    tb__str_append(s, "%sn%lu [label=\"%%%lu %s\\n%s", indent, (unsigned long)i, (unsigned long)i,
                   tb_op_name(node->op), shape);
    if (param) tb__str_append(s, "\\nparam %lu", (unsigned long)param_index);
    for (; marks[next_mark].pos == (int64_t)i; next_mark++) {
        tb__str_append(s, "\\nresult %lu", (unsigned long)marks[next_mark].index);
    }
    tb__str_append(s, "\"%s];\n", param ? ", style=rounded" : "");
}

/* `kernel` (NULL: no clusters): per walk position, the kernel computing the node or -1, and
   `kernel_names` its name; the nodes of each kernel are drawn inside "subgraph cluster_k". */
static void tb__exec_dot_append(tb__str *s, const tb__exec_walk *w, tb_node *const *nodes, size_t n,
                                const int32_t *kernel, const char *const *kernel_names) {
    size_t i, next_param = 0, next_mark = 0, num_clustered = 0;
    tb__exec_mark *marks = tb__exec_marks(w, nodes, n);
    tb__exec_mark *clustered = NULL;
    size_t *param_index = NULL, *mark_start = NULL;
    if (marks == NULL) {
        s->failed = true;
        return;
    }
    tb__str_append(s, "digraph tb {\n  node [shape=box, fontname=\"monospace\"];\n");
    if (kernel != NULL) {
        /* clusters first, so that every node is declared before an edge names it */
        clustered = (tb__exec_mark *)tb__calloc(w->num_order + 1, sizeof(tb__exec_mark));
        param_index = (size_t *)tb__calloc(w->num_order + 1, sizeof(size_t));
        mark_start = (size_t *)tb__calloc(w->num_order + 1, sizeof(size_t));
        if (clustered == NULL || param_index == NULL || mark_start == NULL) {
            s->failed = true;
        } else {
            for (i = 0; i < w->num_order; i++) {
                bool param = next_param < w->num_params && w->params[next_param] == w->order[i];
                param_index[i] = next_param;
                mark_start[i] = next_mark;
                while (marks[next_mark].pos == (int64_t)i)
                    next_mark++;
                if (param) next_param++;
                if (kernel[i] >= 0) {
                    clustered[num_clustered].pos = kernel[i];
                    clustered[num_clustered].index = i;
                    num_clustered++;
                }
            }
            qsort(clustered, num_clustered, sizeof(tb__exec_mark), tb__exec_mark_compare);
            for (i = 0; i < num_clustered; i++) {
                size_t at = clustered[i].index;
                bool param =
                    param_index[at] < w->num_params && w->params[param_index[at]] == w->order[at];
                if (i == 0 || clustered[i - 1].pos != clustered[i].pos) {
                    const char *name = kernel_names[at] != NULL ? kernel_names[at] : "";
                    tb__str_append(s, "  subgraph cluster_%lld {\n    label=\"",
                                   (long long)clustered[i].pos);
                    for (; *name != '\0'; name++) {
                        if (*name != '"' && *name != '\\') tb__str_append(s, "%c", *name);
                    }
                    tb__str_append(s, "\";\n");
                }
                tb__exec_dot_node(s, w, at, param, param_index[at], marks, mark_start[at], "    ");
                if (i + 1 == num_clustered || clustered[i + 1].pos != clustered[i].pos) {
                    tb__str_append(s, "  }\n");
                }
            }
        }
        next_param = 0;
        next_mark = 0;
    }
    for (i = 0; i < w->num_order; i++) {
        const tb_node *node = w->order[i];
        bool param = next_param < w->num_params && w->params[next_param] == node;
        if (kernel == NULL || kernel[i] < 0) {
            tb__exec_dot_node(s, w, i, param, next_param, marks, next_mark, "  ");
        }
        while (marks[next_mark].pos == (int64_t)i)
            next_mark++;
        if (param) {
            next_param++;
        } else {
            uint32_t k;
            for (k = 0; k < node->num_operands; k++) {
                tb__str_append(s, "  n%lld -> n%lu;\n",
                               (long long)tb__exec_walk_position(w, node->operands[k]),
                               (unsigned long)i);
            }
        }
    }
    tb__str_append(s, "}\n");
    tb__free(clustered);
    tb__free(param_index);
    tb__free(mark_start);
    tb__free(marks);
}

/* ---- the computation cache (LTC's ComputationCache: an LRU keyed by the graph hash) ---- */

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

static tb__mutex tb__comp_cache_mutex = TB__MUTEX_INIT;
static tb__comp_cache_entry **tb__comp_cache_buckets = NULL;
static size_t tb__comp_cache_num_buckets = 0;
static size_t tb__comp_cache_count = 0;
static tb__comp_cache_entry *tb__comp_cache_lru_head = NULL;
static tb__comp_cache_entry *tb__comp_cache_lru_tail = NULL;

static uint64_t tb__comp_cache_key(uint64_t graph_hash, const tb_device *device) {
    uint64_t h = tb__hash_bytes(graph_hash, device->backend, strlen(device->backend));
    return tb__hash_u64(h, (uint64_t)(uint32_t)device->ordinal);
}

static void tb__comp_cache_entry_destroy(tb__comp_cache_entry *e) {
    const tb_backend_impl *vt = tb__backend_vtable(e->backend);
    if (vt != NULL) vt->release_computation(vt->user_data, e->computation);
    tb__free(e);
}

/* Drops a reference; returns the entry when the caller must destroy it (outside the lock). */
static tb__comp_cache_entry *tb__comp_cache_unref_locked(tb__comp_cache_entry *e) {
    e->refcount--;
    return e->refcount == 0 ? e : NULL;
}

static void tb__comp_cache_release(tb__comp_cache_entry *e) {
    tb__comp_cache_entry *dead;
    if (e == NULL) return;
    tb__mutex_lock(&tb__comp_cache_mutex);
    dead = tb__comp_cache_unref_locked(e);
    tb__mutex_unlock(&tb__comp_cache_mutex);
    if (dead != NULL) tb__comp_cache_entry_destroy(dead);
}

static void tb__comp_cache_unlink_locked(tb__comp_cache_entry *e) {
    tb__comp_cache_entry **link =
        &tb__comp_cache_buckets[e->key & (tb__comp_cache_num_buckets - 1)];
    while (*link != e)
        link = &(*link)->bucket_next;
    *link = e->bucket_next;
    if (e->lru_prev != NULL) {
        e->lru_prev->lru_next = e->lru_next;
    } else {
        tb__comp_cache_lru_head = e->lru_next;
    }
    if (e->lru_next != NULL) {
        e->lru_next->lru_prev = e->lru_prev;
    } else {
        tb__comp_cache_lru_tail = e->lru_prev;
    }
    e->lru_prev = NULL;
    e->lru_next = NULL;
    e->bucket_next = NULL;
    tb__comp_cache_count--;
}

static void tb__comp_cache_push_front_locked(tb__comp_cache_entry *e) {
    e->lru_prev = NULL;
    e->lru_next = tb__comp_cache_lru_head;
    if (tb__comp_cache_lru_head != NULL) tb__comp_cache_lru_head->lru_prev = e;
    tb__comp_cache_lru_head = e;
    if (tb__comp_cache_lru_tail == NULL) tb__comp_cache_lru_tail = e;
}

/* The entry of the graph, or NULL; `*collided` tells whether an entry had the graph's hash but
   another structure. */
static tb__comp_cache_entry *tb__comp_cache_find_locked(uint64_t key, uint64_t graph_hash,
                                                        const tb_device *device,
                                                        const tb_backend *backend,
                                                        const uint64_t *canon, size_t num_canon,
                                                        bool *collided) {
    tb__comp_cache_entry *e;
    *collided = false;
    if (tb__comp_cache_num_buckets == 0) return NULL;
    for (e = tb__comp_cache_buckets[key & (tb__comp_cache_num_buckets - 1)]; e != NULL;
         e = e->bucket_next) {
        if (e->key == key && e->graph_hash == graph_hash && e->backend == backend &&
            tb_device_equal(&e->device, device)) {
            if (e->num_canon == num_canon &&
                memcmp(e->canon, canon, num_canon * sizeof *canon) == 0) {
                return e;
            }
            *collided = true;
        }
    }
    return NULL;
}

/* The cached computation of the graph whose walk is `w` (a new reference, moved to the
   front), or NULL. */
static tb__comp_cache_entry *tb__comp_cache_lookup(uint64_t graph_hash, const tb__exec_walk *w,
                                                   const tb_device *device,
                                                   const tb_backend *backend) {
    uint64_t key = tb__comp_cache_key(graph_hash, device);
    tb__comp_cache_entry *e;
    bool collided;
    tb__mutex_lock(&tb__comp_cache_mutex);
    e = tb__comp_cache_find_locked(key, graph_hash, device, backend, w->canon, w->num_canon,
                                   &collided);
    if (e != NULL) {
        e->refcount++;
        if (tb__comp_cache_lru_head != e) {
            e->lru_prev->lru_next = e->lru_next;
            if (e->lru_next != NULL) {
                e->lru_next->lru_prev = e->lru_prev;
            } else {
                tb__comp_cache_lru_tail = e->lru_prev;
            }
            tb__comp_cache_push_front_locked(e);
        }
    }
    tb__mutex_unlock(&tb__comp_cache_mutex);
    if (collided && e == NULL) tb__metric_count("GraphHashCollision", 1);
    return e;
}

/* Puts a new entry (refcount 1, the caller's) in the cache, evicting the least recently used
   ones beyond the capacity. Returns the entry the caller should use: `e`, or an equal one that
   another thread put first (then `e` is destroyed). */
static tb__comp_cache_entry *tb__comp_cache_insert(tb__comp_cache_entry *e) {
    size_t capacity = tb__desc()->cache_size > 0 ? tb__desc()->cache_size : 1024;
    tb__comp_cache_entry *evicted = NULL, *existing;
    bool collided;
    tb__mutex_lock(&tb__comp_cache_mutex);
    if (tb__comp_cache_num_buckets == 0) {
        size_t nb = 16;
        while (nb < capacity && nb < ((size_t)1 << 20))
            nb *= 2;
        tb__saved_error saved;
        tb__error_save(&saved);
        tb__comp_cache_buckets =
            (tb__comp_cache_entry **)tb__calloc(nb, sizeof(tb__comp_cache_entry *));
        if (tb__comp_cache_buckets == NULL) {
            /* uncached: the computation lives as long as the caller's reference, and the
               caller's operation goes on, its error untouched */
            tb__error_restore(&saved);
            tb__mutex_unlock(&tb__comp_cache_mutex);
            return e;
        }
        tb__comp_cache_num_buckets = nb;
    }
    existing = tb__comp_cache_find_locked(e->key, e->graph_hash, &e->device, e->backend, e->canon,
                                          e->num_canon, &collided);
    if (existing != NULL) {
        existing->refcount++;
        tb__mutex_unlock(&tb__comp_cache_mutex);
        tb__comp_cache_entry_destroy(e);
        return existing;
    }
    e->refcount++; /* the cache's reference */
    e->bucket_next = tb__comp_cache_buckets[e->key & (tb__comp_cache_num_buckets - 1)];
    tb__comp_cache_buckets[e->key & (tb__comp_cache_num_buckets - 1)] = e;
    tb__comp_cache_push_front_locked(e);
    tb__comp_cache_count++;
    while (tb__comp_cache_count > capacity) {
        tb__comp_cache_entry *victim = tb__comp_cache_lru_tail;
        tb__comp_cache_unlink_locked(victim);
        if (tb__comp_cache_unref_locked(victim) != NULL) {
            victim->lru_next = evicted; /* a private list of entries to destroy */
            evicted = victim;
        }
    }
    tb__mutex_unlock(&tb__comp_cache_mutex);
    while (evicted != NULL) {
        tb__comp_cache_entry *next = evicted->lru_next;
        tb__comp_cache_entry_destroy(evicted);
        evicted = next;
    }
    return e;
}

static void tb__comp_cache_clear(void) {
    tb__comp_cache_entry *dead = NULL;
    tb__mutex_lock(&tb__comp_cache_mutex);
    while (tb__comp_cache_lru_head != NULL) {
        tb__comp_cache_entry *e = tb__comp_cache_lru_head;
        tb__comp_cache_unlink_locked(e);
        if (tb__comp_cache_unref_locked(e) != NULL) {
            e->lru_next = dead;
            dead = e;
        }
    }
    tb__mutex_unlock(&tb__comp_cache_mutex);
    while (dead != NULL) {
        tb__comp_cache_entry *next = dead->lru_next;
        tb__comp_cache_entry_destroy(dead);
        dead = next;
    }
}

TBDEF void tb_computation_cache_clear(void) {
    tb__ensure_setup();
    tb__comp_cache_clear();
}

TBDEF size_t tb_computation_cache_size(void) {
    size_t n;
    tb__ensure_setup();
    tb__mutex_lock(&tb__comp_cache_mutex);
    n = tb__comp_cache_count;
    tb__mutex_unlock(&tb__comp_cache_mutex);
    return n;
}

/* ---- the executor ---- */

/* What one sync works with. */
typedef struct tb__exec {
    const char *func; /* the public function, for messages */
    tb_device device;
    const tb_backend *backend;
    const tb_backend_impl *vt;
} tb__exec;

/* A backend entry starts with a clean error so that the reason of a failure is the backend's;
   a success gives the caller's error back. */
static void tb__exec_call_begin(tb__saved_error *saved) {
    tb__error_save(saved);
    tb_clear_error();
}

static tb_status tb__exec_call_failed(const tb__exec *ex, tb_status st, const char *entry) {
    if (st == TB_OK) st = TB_ERR_INTERNAL;
    if (tb_last_status() == TB_OK || tb_last_error()[0] == '\0') {
        return tb__error(st, "%s: backend '%s': %s failed (%s)", ex->func, ex->device.backend,
                         entry, tb_status_string(st));
    }
    return tb__error(st, "%s: backend '%s': %s: %s", ex->func, ex->device.backend, entry,
                     tb_last_error());
}

/* The data a DEVICE_DATA node or a node computed apart stands for (borrowed). */
static tb_backend_data *tb__exec_param_data(const tb__exec *ex, const tb_node *node) {
    tb_backend_data *d = NULL;
    if (node->value != NULL) return node->value;
    if (ex->vt->get_node_data != NULL) d = ex->vt->get_node_data(ex->vt->user_data, node);
    if (d == NULL) d = node->data;
    if (d == NULL) {
        tb__error(TB_ERR_INTERNAL, "%s: device data node %llu has no data", ex->func,
                  (unsigned long long)node->id);
    }
    return d;
}

/* A new data on the device holding a SCALAR node's value in the node's dtype. */
static tb_backend_data *tb__exec_scalar_data(const tb__exec *ex, const tb_node *node) {
    tb_scalar value;
    if (tb_dtype_is_float(node->shape.dtype)) {
        value = tb_scalar_f(node->shape.dtype, tb_scalar_as_double(node->scalar));
    } else {
        value = tb_scalar_i(node->shape.dtype, tb_scalar_as_int(node->scalar));
    }
    return tb__data_from_scalar(&ex->device, value);
}

/* The value of a parameter node: a new reference. */
static tb_backend_data *tb__exec_param_value(const tb__exec *ex, const tb_node *node) {
    tb_backend_data *d;
    if (node->op == TB_OP_SCALAR && node->value == NULL) return tb__exec_scalar_data(ex, node);
    d = tb__exec_param_data(ex, node);
    if (d != NULL) tb__data_retain(d);
    return d;
}

/* TB_DEBUG=1: a compile still running after this long logs a line saying so. */
#define TB__SLOW_COMPILE_MS 1000u

/* A computation for the graph (made from the walk `w`): from the cache, else lowered and
   compiled (and cached). */
static tb_status tb__exec_compile(const tb__exec *ex, const tb_graph *graph, const tb__exec_walk *w,
                                  tb__comp_cache_entry **out, bool *hit, uint64_t *compile_ns) {
    tb__comp_cache_entry *e = tb__comp_cache_lookup(graph->hash, w, &ex->device, ex->backend);
    void *context = NULL, *computation = NULL;
    tb__saved_error saved;
    tb__slow_notice notice;
    uint64_t t0;
    tb_status st;
    *compile_ns = 0;
    if (e != NULL) {
        tb__metric_count("CachedCompile", 1);
        *hit = true;
        *out = e;
        return TB_OK;
    }
    *hit = false;
    notice.armed = false;
    if (tb_debug_level() >= 1) {
        /* the graph's own line comes once the compile is done: a compile that takes seconds
           (a large OpenCL program) says so while it runs, from a thread of its own */
        char device[64];
        tb__exec_device_text(&ex->device, device);
        tb__slow_notice_begin(&notice, TB__SLOW_COMPILE_MS,
                              "graph %016llx: compiling %lu nodes on %s ... (still running after "
                              "%u s)",
                              (unsigned long long)graph->hash, (unsigned long)graph->num_nodes,
                              device, TB__SLOW_COMPILE_MS / 1000u);
    }
    t0 = tb__now_ns();
    tb__exec_call_begin(&saved);
    st = ex->vt->create_lowering_context(ex->vt->user_data, graph, &context);
    if (st != TB_OK) {
        tb__slow_notice_end(&notice);
        return tb__exec_call_failed(ex, st, "create_lowering_context");
    }
    st = ex->vt->compile(ex->vt->user_data, context, &computation);
    if (st != TB_OK) st = tb__exec_call_failed(ex, st, "compile");
    if (ex->vt->release_lowering_context != NULL) {
        ex->vt->release_lowering_context(ex->vt->user_data, context);
    }
    tb__slow_notice_end(&notice);
    if (st != TB_OK) return st;
    tb__error_restore(&saved);
    *compile_ns = tb__now_ns() - t0;
    tb__metric_count("UncachedCompile", 1);
    tb__metric_sample("CompileTime", (double)*compile_ns);
    e = w->num_canon > (SIZE_MAX - sizeof *e) / sizeof *w->canon
            ? NULL
            : (tb__comp_cache_entry *)tb__calloc(1, sizeof *e + w->num_canon * sizeof *w->canon);
    if (e == NULL) {
        ex->vt->release_computation(ex->vt->user_data, computation);
        return TB_ERR_OUT_OF_MEMORY;
    }
    e->key = tb__comp_cache_key(graph->hash, &ex->device);
    e->graph_hash = graph->hash;
    memcpy(e + 1, w->canon, w->num_canon * sizeof *w->canon);
    e->canon = (const uint64_t *)(void *)(e + 1);
    e->num_canon = w->num_canon;
    e->device = ex->device;
    e->backend = ex->backend;
    e->computation = computation;
    e->refcount = 1;
    *out = tb__comp_cache_insert(e);
    return TB_OK;
}

static tb_status tb__exec_materialize(const tb__exec *ex, tb_node *const *roots, size_t n,
                                      tb_backend_data **out);

/* LTC's eager fallback: runs one node the backend does not support on the reference
   interpreter, from its operands' values, and keeps the result on the device in node->value. */
static tb_status tb__exec_fallback(const tb__exec *ex, tb_node *node) {
    size_t k = node->num_operands, i, num_pending = 0;
    void **host = NULL;
    tb_node **pending = NULL;
    tb_backend_data **computed = NULL;
    void *result = NULL;
    tb_backend_data *value = NULL;
    tb_status st = TB_ERR_OUT_OF_MEMORY;
    char name[64];

    host = (void **)tb__calloc(k + 1, sizeof(void *));
    pending = (tb_node **)tb__calloc(k + 1, sizeof(tb_node *));
    computed = (tb_backend_data **)tb__calloc(k + 1, sizeof(tb_backend_data *));
    if (host == NULL || pending == NULL || computed == NULL) goto done;
    /* operands still pending become a graph of their own, whose results are those operands */
    for (i = 0; i < k; i++) {
        size_t j;
        bool seen = false;
        if (tb__exec_is_param(node->operands[i])) continue;
        for (j = 0; j < num_pending; j++)
            seen = seen || pending[j] == node->operands[i];
        if (!seen) pending[num_pending++] = node->operands[i];
    }
    if (num_pending > 0) {
        st = tb__exec_materialize(ex, pending, num_pending, computed);
        if (st != TB_OK) goto done;
    }
    for (i = 0; i < k; i++) {
        const tb_node *operand = node->operands[i];
        const tb_backend_data *d = NULL;
        host[i] = tb__exec_host_alloc(&operand->shape, NULL);
        if (host[i] == NULL) {
            st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
            goto done;
        }
        if (operand->op == TB_OP_SCALAR && operand->value == NULL) {
            tb__scalar_store(operand->scalar, operand->shape.dtype, host[i]);
            continue;
        }
        if (tb__exec_is_param(operand)) {
            d = tb__exec_param_data(ex, operand);
        } else {
            size_t j;
            for (j = 0; j < num_pending; j++) {
                if (pending[j] == operand) d = computed[j];
            }
        }
        if (d == NULL) {
            st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
            goto done;
        }
        st = tb__data_to_host(d, host[i]);
        if (st != TB_OK) goto done;
    }
    result = tb__exec_host_alloc(&node->shape, NULL);
    if (result == NULL) {
        st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    st = tb__ref_eval_node(node, (const void *const *)host, result);
    if (st != TB_OK) goto done;
    value = tb__data_from_host(&ex->device, &node->shape, result);
    if (value == NULL) {
        st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    node->value = value;
    snprintf(name, sizeof(name), "Fallback::%s", tb_op_name(node->op));
    tb__metric_count(name, 1);
    st = TB_OK;
done:
    if (host != NULL) {
        for (i = 0; i < k; i++)
            tb__free(host[i]);
    }
    if (computed != NULL) {
        for (i = 0; i < num_pending; i++) {
            if (computed[i] != NULL) tb__data_release(computed[i]);
        }
    }
    tb__free(host);
    tb__free(pending);
    tb__free(computed);
    tb__free(result);
    return st;
}

/* Runs the eager fallback for every node of the walked graph the backend does not support.
   Returns whether any ran (the walk is then stale). */
static tb_status tb__exec_run_fallbacks(const tb__exec *ex, const tb__exec_walk *w, bool *ran) {
    size_t i, next_param = 0;
    *ran = false;
    if (ex->vt->supports_node == NULL) return TB_OK;
    for (i = 0; i < w->num_order; i++) {
        tb_node *node = (tb_node *)w->order[i];
        tb_status st;
        if (next_param < w->num_params && w->params[next_param] == node) {
            next_param++;
            continue;
        }
        /* post-order: every unsupported node below this one already has its value, so the
           operands' graph needs no fallback of its own */
        if (tb__exec_supported(ex->vt, node)) continue;
        st = tb__exec_fallback(ex, node);
        if (st != TB_OK) return st;
        *ran = true;
    }
    return TB_OK;
}

static void tb__exec_log_graph(const tb__exec *ex, const tb_graph *g, bool hit, uint64_t compile_ns,
                               uint64_t run_ns) {
    char device[64];
    tb__exec_device_text(&ex->device, device);
    tb_log_message(
        TB_LOG_INFO,
        "graph %016llx nodes=%lu params=%lu results=%lu device=%s cache=%s compile=%.3fms "
        "run=%.3fms",
        (unsigned long long)g->hash, (unsigned long)g->num_nodes, (unsigned long)g->num_parameters,
        (unsigned long)g->num_results, device, hit ? "hit" : "miss", (double)compile_ns / 1e6,
        (double)run_ns / 1e6);
}

/* The TB_DEBUG=1 line of a compile that a dump (tb_ir_backend_text, tb_ir_dot) started: the
   same fields as a run's line, so that a later run's "cache=hit compile=0.000ms" has its
   compile in the log. */
static void tb__exec_log_dump_compile(const tb__exec *ex, const tb_graph *g, uint64_t compile_ns) {
    char device[64];
    tb__exec_device_text(&ex->device, device);
    tb_log_message(TB_LOG_INFO,
                   "graph %016llx nodes=%lu params=%lu results=%lu device=%s cache=miss "
                   "compile=%.3fms (compiled by %s, not run)",
                   (unsigned long long)g->hash, (unsigned long)g->num_nodes,
                   (unsigned long)g->num_parameters, (unsigned long)g->num_results, device,
                   (double)compile_ns / 1e6, ex->func);
}

/* The bits of a graph's hash that count: tests keep fewer to force hash collisions. */
static uint64_t tb__exec_hash_mask = ~(uint64_t)0;

/* Builds the graph of the walk for the non-parameter roots, and ends the walk's canonical
   form with them. */
static tb_status tb__exec_graph_make(const tb__exec *ex, tb__exec_walk *w, tb_node *const *roots,
                                     size_t n, const tb_node ***results, tb_graph *g) {
    size_t i, num_results = 0;
    uint64_t h = w->hash;
    *results = (const tb_node **)tb__calloc(n + 1, sizeof(const tb_node *));
    if (*results == NULL) return TB_ERR_OUT_OF_MEMORY;
    w->num_canon = w->canon_nodes; /* a graph made again from the same walk */
    if (tb__grow((void **)&w->canon, &w->cap_canon, w->num_canon + n + 3, sizeof *w->canon) !=
        TB_OK) {
        tb__free((void *)*results);
        *results = NULL;
        return TB_ERR_OUT_OF_MEMORY;
    }
    w->canon[w->num_canon++] = TB__CANON_RESULTS;
    for (i = 0; i < n; i++) {
        uint64_t at;
        if (tb__exec_walk_is_param(w, roots[i])) continue;
        (*results)[num_results++] = roots[i];
        at = (uint64_t)tb__exec_walk_position(w, roots[i]);
        w->canon[w->num_canon++] = at;
        h = tb__hash_u64(h, at);
    }
    w->canon[w->num_canon++] = num_results;
    w->canon[w->num_canon++] = w->num_params;
    memset(g, 0, sizeof(*g));
    g->nodes = w->order;
    g->num_nodes = w->num_order;
    g->parameters = w->params;
    g->num_parameters = w->num_params;
    g->results = *results;
    g->num_results = num_results;
    g->hash = tb__hash_u64(tb__hash_u64(h, num_results), w->num_params) & tb__exec_hash_mask;
    g->device = ex->device;
    return TB_OK;
}

/* Runs a compiled graph: parameter values in, placeholders filled. On success out_results[i]
   gets a new reference to the value of g->results[i]. */
static tb_status tb__exec_run(const tb__exec *ex, const tb_graph *g, void *computation,
                              tb_backend_data **out_results, uint64_t *run_ns) {
    tb_backend_data **args;
    size_t i;
    tb_status st = TB_OK;
    tb__saved_error saved;
    uint64_t t0;
    args = (tb_backend_data **)tb__calloc(g->num_parameters + 1, sizeof(tb_backend_data *));
    if (args == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < g->num_parameters && st == TB_OK; i++) {
        args[i] = tb__exec_param_value(ex, g->parameters[i]);
        if (args[i] == NULL) {
            st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
        } else if (!tb_device_equal(&args[i]->device, &ex->device)) {
            char a[64], b[64];
            tb__exec_device_text(&args[i]->device, a);
            tb__exec_device_text(&ex->device, b);
            st = tb__error(TB_ERR_INVALID_ARGUMENT,
                           "%s: parameter %lu of the graph is on %s but the graph runs on %s",
                           ex->func, (unsigned long)i, a, b);
        }
    }
    for (i = 0; i < g->num_results && st == TB_OK; i++) {
        out_results[i] = tb__data_new(ex->backend, &ex->device, &g->results[i]->shape);
        if (out_results[i] == NULL) {
            st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
        } else if (ex->vt->create_placeholder != NULL) {
            tb__exec_call_begin(&saved);
            st = ex->vt->create_placeholder(ex->vt->user_data, out_results[i]);
            if (st != TB_OK) {
                st = tb__exec_call_failed(ex, st, "create_placeholder");
            } else {
                tb__error_restore(&saved);
            }
        }
    }
    if (st == TB_OK) {
        t0 = tb__now_ns();
        tb__exec_call_begin(&saved);
        st = ex->vt->execute(ex->vt->user_data, computation, args, g->num_parameters, out_results,
                             g->num_results);
        *run_ns = tb__now_ns() - t0;
        tb__metric_sample("ExecuteTime", (double)*run_ns);
        if (st != TB_OK) {
            st = tb__exec_call_failed(ex, st, "execute");
        } else {
            tb__error_restore(&saved);
        }
    }
    for (i = 0; i < g->num_parameters; i++) {
        if (args[i] != NULL) tb__data_release(args[i]);
    }
    tb__free(args);
    if (st != TB_OK) {
        for (i = 0; i < g->num_results; i++) {
            if (out_results[i] != NULL) tb__data_release(out_results[i]);
            out_results[i] = NULL;
        }
    }
    return st;
}

/* ---- TB_CHECK: every graph also on the reference interpreter ---- */

/* Whether a backend value and a reference value of one element agree: integers and bool
   exactly; floats within a tolerance that allows for a device's own exp/log/division. */
static bool tb__check_close(tb_dtype dtype, const unsigned char *a, const unsigned char *b,
                            double *va, double *vb) {
    switch (dtype) {
    case TB_F32: {
        float x, y;
        memcpy(&x, a, sizeof x);
        memcpy(&y, b, sizeof y);
        *va = x;
        *vb = y;
        break;
    }
    case TB_F64:
        memcpy(va, a, sizeof *va);
        memcpy(vb, b, sizeof *vb);
        break;
    default: {
        size_t size = tb_dtype_size(dtype);
        int64_t x = 0, y = 0;
        if (dtype == TB_I32) {
            int32_t u, v;
            memcpy(&u, a, sizeof u);
            memcpy(&v, b, sizeof v);
            x = u;
            y = v;
        } else if (dtype == TB_I64) {
            memcpy(&x, a, sizeof x);
            memcpy(&y, b, sizeof y);
        } else {
            x = a[0];
            y = b[0];
        }
        *va = (double)x;
        *vb = (double)y;
        return memcmp(a, b, size) == 0;
    }
    }
    if (*va != *va || *vb != *vb) return (*va != *va) && (*vb != *vb);
    if (*va == *vb) return true; /* equal infinities too */
    {
        double tol = dtype == TB_F32 ? 1e-5 + 1e-4 * fabs(*vb) : 1e-10 + 1e-8 * fabs(*vb);
        return fabs(*va - *vb) <= tol;
    }
}

/* Runs `g` again on its backend with every computed node as a result, runs the same graph on
   the reference interpreter, and reports the first node (in post-order) whose values differ.
   At check level 1 purely diagnostic: the caller's error stays as it was and TB_OK comes back.
   At level 2 a node that differs, or a graph that could not be checked, is an error of the
   sync: TB_ERR_EXECUTE (or the reason the check failed) with the report as its message. */
static tb_status tb__exec_check(const tb__exec *ex, const tb__exec_walk *w, const tb_graph *g) {
    tb_graph cg = *g;
    const tb_node **computed = NULL;
    tb_backend_data **device_values = NULL;
    void **param_host = NULL, **ref_host = NULL;
    void *context = NULL, *computation = NULL;
    unsigned char *backend_host = NULL;
    size_t i, m = 0;
    uint64_t run_ns = 0;
    tb__saved_error saved;
    tb_status st = TB_OK, verdict = TB_OK;
    char report[TB__ERROR_CAP];
    tb__slow_notice notice;

    if (strcmp(tb_backend_name(ex->backend), "cpu") == 0) return TB_OK; /* it is the reference */
    report[0] = '\0';
    tb__error_save(&saved);
    tb_clear_error(); /* a reason below is the check's own */
    computed = (const tb_node **)tb__calloc(g->num_nodes + 1, sizeof *computed);
    param_host = (void **)tb__calloc(g->num_parameters + 1, sizeof *param_host);
    if (computed == NULL || param_host == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
    } else {
        for (i = 0; i < g->num_nodes; i++) {
            if (!tb__exec_walk_is_param(w, g->nodes[i])) computed[m++] = g->nodes[i];
        }
        device_values = (tb_backend_data **)tb__calloc(m + 1, sizeof *device_values);
        ref_host = (void **)tb__calloc(m + 1, sizeof *ref_host);
        if (device_values == NULL || ref_host == NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    cg.results = computed;
    cg.num_results = m;
    /* the backend's values of every node: an uncached computation of its own (not counted as
       a compile of the program's, but a slow one says so like any other) */
    notice.armed = false;
    if (st == TB_OK && tb_debug_level() >= 1) {
        char device[64];
        tb__exec_device_text(&ex->device, device);
        tb__slow_notice_begin(&notice, TB__SLOW_COMPILE_MS,
                              "graph %016llx: TB_CHECK: compiling %lu nodes on %s ... (still "
                              "running after %u s)",
                              (unsigned long long)g->hash, (unsigned long)g->num_nodes, device,
                              TB__SLOW_COMPILE_MS / 1000u);
    }
    if (st == TB_OK) st = ex->vt->create_lowering_context(ex->vt->user_data, &cg, &context);
    if (st == TB_OK) st = ex->vt->compile(ex->vt->user_data, context, &computation);
    if (context != NULL && ex->vt->release_lowering_context != NULL)
        ex->vt->release_lowering_context(ex->vt->user_data, context);
    tb__slow_notice_end(&notice);
    if (st == TB_OK) st = tb__exec_run(ex, &cg, computation, device_values, &run_ns);
    /* the reference's values, from the same parameter values */
    for (i = 0; i < g->num_parameters && st == TB_OK; i++) {
        size_t nbytes = 0;
        tb_backend_data *d = tb__exec_param_value(ex, g->parameters[i]);
        st = d == NULL ? TB_ERR_INTERNAL : tb_shape_nbytes(&d->shape, &nbytes);
        if (st == TB_OK) {
            param_host[i] = tb__alloc(nbytes ? nbytes : 1);
            st = param_host[i] == NULL ? TB_ERR_OUT_OF_MEMORY : tb__data_to_host(d, param_host[i]);
        }
        if (d != NULL) tb__data_release(d);
    }
    for (i = 0; i < m && st == TB_OK; i++) {
        size_t nbytes = 0;
        st = tb_shape_nbytes(&computed[i]->shape, &nbytes);
        if (st == TB_OK) {
            ref_host[i] = tb__alloc(nbytes ? nbytes : 1);
            if (ref_host[i] == NULL) st = TB_ERR_OUT_OF_MEMORY;
        }
    }
    if (st == TB_OK) st = tb__ref_run_graph(&cg, (const void *const *)param_host, ref_host);
    for (i = 0; i < m && st == TB_OK; i++) {
        const tb_shape *shape = &computed[i]->shape;
        size_t nbytes = 0, size = tb_dtype_size(shape->dtype), k, count;
        st = tb_shape_nbytes(shape, &nbytes);
        if (st != TB_OK) break;
        tb__free(backend_host);
        backend_host = (unsigned char *)tb__alloc(nbytes ? nbytes : 1);
        if (backend_host == NULL) {
            st = TB_ERR_OUT_OF_MEMORY;
            break;
        }
        st = tb__data_to_host(device_values[i], backend_host);
        count = size ? nbytes / size : 0;
        for (k = 0; k < count && st == TB_OK; k++) {
            double va, vb;
            if (!tb__check_close(shape->dtype, backend_host + k * size,
                                 (const unsigned char *)ref_host[i] + k * size, &va, &vb)) {
                char text[96], where[64];
                tb__shape_text(shape, text);
                tb_device_format(&ex->device, where, sizeof where);
                tb__metric_count("CheckMismatch", 1);
                snprintf(report, sizeof report,
                         "TB_CHECK: graph %016llx: node %%%lld %s %s (node %lu of %lu in "
                         "post-order) differs at element %lu: %s gives %.9g, the reference "
                         "gives %.9g",
                         (unsigned long long)g->hash,
                         (long long)tb__exec_walk_position(w, computed[i]),
                         tb_op_name(computed[i]->op), text, (unsigned long)i, (unsigned long)m,
                         (unsigned long)k, where, va, vb);
                verdict = TB_ERR_EXECUTE;
                goto done;
            }
        }
    }
    if (st == TB_OK) {
        tb__metric_count("CheckedGraphs", 1);
    } else {
        snprintf(report, sizeof report, "TB_CHECK: graph %016llx could not be checked: %.900s",
                 (unsigned long long)g->hash,
                 tb_last_error()[0] != '\0' ? tb_last_error() : tb_status_string(st));
        verdict = st;
    }
done:
    if (computation != NULL) ex->vt->release_computation(ex->vt->user_data, computation);
    for (i = 0; device_values != NULL && i < m; i++) {
        if (device_values[i] != NULL) tb__data_release(device_values[i]);
    }
    for (i = 0; param_host != NULL && i < g->num_parameters; i++)
        tb__free(param_host[i]);
    for (i = 0; ref_host != NULL && i < m; i++)
        tb__free(ref_host[i]);
    tb__free(backend_host);
    tb__free(device_values);
    tb__free(param_host);
    tb__free(ref_host);
    tb__free((void *)computed);
    tb__error_restore(&saved);
    if (verdict == TB_OK) return TB_OK;
    tb_log_message(TB_LOG_WARN, "%s", report);
    if (tb__desc()->check < 2) return TB_OK;
    return tb__error(verdict, "%s: %s", ex->func, report);
}

#undef TB__SLOW_COMPILE_MS

/* The values of `roots` (distinct nodes on ex->device): out[i] gets a new reference. On error
   out is all NULL and no node changed except for values the eager fallback computed. */
static tb_status tb__exec_materialize(const tb__exec *ex, tb_node *const *roots, size_t n,
                                      tb_backend_data **out) {
    tb__exec_walk w;
    tb_graph g;
    const tb_node **results = NULL;
    tb_backend_data **values = NULL;
    tb__comp_cache_entry *entry = NULL;
    bool ran = false, hit = false;
    uint64_t compile_ns = 0, run_ns = 0;
    size_t i, r;
    tb_status st;

    memset(&w, 0, sizeof(w));
    memset(out, 0, n * sizeof(tb_backend_data *));
    st = tb__exec_walk_add(&w, ex->func, roots, n);
    if (st == TB_OK) st = tb__exec_run_fallbacks(ex, &w, &ran);
    if (st == TB_OK && ran) {
        tb__exec_walk_free(&w);
        st = tb__exec_walk_add(&w, ex->func, roots, n);
    }
    if (st == TB_OK) st = tb__exec_graph_make(ex, &w, roots, n, &results, &g);
    if (st != TB_OK) goto done;

    if (g.num_results > 0) {
        values = (tb_backend_data **)tb__calloc(g.num_results, sizeof(tb_backend_data *));
        if (values == NULL) {
            st = TB_ERR_OUT_OF_MEMORY;
            goto done;
        }
        tb__metric_sample("TensorsGraphSize", (double)g.num_nodes);
        if (tb_debug_level() >= 3) {
            tb__str text;
            memset(&text, 0, sizeof(text));
            tb__exec_text_append(&text, &w, roots, n);
            tb_log_message(TB_LOG_DEBUG, "graph %016llx IR:\n%s", (unsigned long long)g.hash,
                           text.data != NULL ? text.data : "");
            tb__str_free(&text);
        }
        st = tb__exec_compile(ex, &g, &w, &entry, &hit, &compile_ns);
        if (st == TB_OK) st = tb__exec_run(ex, &g, entry->computation, values, &run_ns);
        if (st != TB_OK) goto done;
        if (tb_debug_level() >= 1) tb__exec_log_graph(ex, &g, hit, compile_ns, run_ns);
        /* at check level 2 a failed check fails the sync: the results are released below */
        if (tb__desc()->check > 0) st = tb__exec_check(ex, &w, &g);
    }
    /* roots that are parameters need no computation: their values are at hand */
    for (i = 0, r = 0; i < n; i++) {
        if (r < g.num_results && results[r] == roots[i]) {
            out[i] = values[r++];
            continue;
        }
        out[i] = tb__exec_param_value(ex, roots[i]);
        if (out[i] == NULL) {
            st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
            break;
        }
    }
    if (st != TB_OK) {
        for (i = 0; i < n; i++) {
            if (out[i] != NULL) tb__data_release(out[i]);
            out[i] = NULL;
        }
        /* results not yet handed to out */
        for (; r < g.num_results; r++)
            tb__data_release(values[r]);
    }
done:
    tb__comp_cache_release(entry);
    tb__free(values);
    tb__free((void *)results);
    tb__exec_walk_free(&w);
    return st;
}

/* The executor of `device` for `func`. */
static tb_status tb__exec_init(tb__exec *ex, const char *func, const tb_device *device) {
    ex->func = func;
    ex->device = *device;
    ex->backend = tb__backend_for_device(device);
    if (ex->backend == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_NOT_FOUND;
    ex->vt = tb__backend_vtable(ex->backend);
    if (ex->vt == NULL) return tb__error(TB_ERR_INTERNAL, "%s: a backend without a vtable", func);
    return TB_OK;
}

/* The distinct pending nodes of `tensors` (those with a node), checked to share one device. */
typedef struct tb__exec_roots {
    tb_node **nodes;
    size_t count;
    tb__exec_map index; /* node -> index in nodes */
    tb_device device;
} tb__exec_roots;

static void tb__exec_roots_free(tb__exec_roots *r) {
    size_t i;
    for (i = 0; i < r->count; i++)
        tb__node_release(r->nodes[i]);
    tb__free(r->nodes);
    tb__exec_map_free(&r->index);
    memset(r, 0, sizeof(*r));
}

/* `ir`: take every tensor's operand node (dumps) rather than only pending ones (sync).
   `one_device`: the tensors must share a device (a graph to run); text dumps take any. */
static tb_status tb__exec_roots_collect(tb__exec_roots *r, const char *func,
                                        tb_tensor *const *tensors, size_t count, bool ir,
                                        bool one_device) {
    size_t i;
    const tb_tensor *first = NULL;
    memset(r, 0, sizeof(*r));
    if (count > 0) {
        r->nodes = (tb_node **)tb__calloc(count, sizeof(tb_node *));
        if (r->nodes == NULL) return TB_ERR_OUT_OF_MEMORY;
    }
    for (i = 0; i < count; i++) {
        tb_tensor *t = tensors[i];
        tb_node *node = ir ? tb__tensor_ir(t) : t->node;
        if (node == NULL) {
            if (ir) {
                tb__exec_roots_free(r);
                return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
            }
            continue;
        }
        if (first == NULL) {
            first = t;
            r->device = t->device;
        } else if (one_device && !tb_device_equal(&first->device, &t->device)) {
            char a[64], b[64];
            tb__exec_device_text(&first->device, a);
            tb__exec_device_text(&t->device, b);
            tb__exec_roots_free(r);
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: tensors on %s and %s cannot be one graph (move them with "
                             "tb_to_device)",
                             func, a, b);
        }
        if (tb__exec_map_get(&r->index, node) != NULL) continue;
        if (tb__exec_map_put(&r->index, node, (int64_t)r->count) != TB_OK) {
            tb__exec_roots_free(r);
            return TB_ERR_OUT_OF_MEMORY;
        }
        tb__node_retain(node);
        r->nodes[r->count++] = node;
    }
    return TB_OK;
}

static tb_status tb__exec_check_list(const char *func, tb_tensor *const *tensors, size_t count) {
    size_t i;
    if (tensors == NULL && count > 0) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: tensors is NULL (count %lu)", func,
                         (unsigned long)count);
    }
    for (i = 0; i < count; i++) {
        if (tensors[i] == NULL) {
            if (tb_last_status() == TB_OK) {
                tb__error(TB_ERR_INVALID_ARGUMENT, "%s: tensors[%lu] is NULL", func,
                          (unsigned long)i);
            }
            return TB_ERR_INVALID_ARGUMENT;
        }
    }
    return TB_OK;
}

/* LTC's SyncTensorsGraph for tensors on one device. */
static tb_status tb__exec_sync(tb_tensor *const *tensors, size_t count, const char *func) {
    tb__exec_roots roots;
    tb__exec ex;
    tb_backend_data **values = NULL;
    tb_tensor **first = NULL; /* the first tensor given each root's value */
    size_t i;
    tb_status st = tb__exec_roots_collect(&roots, func, tensors, count, false, true);
    if (st != TB_OK) return st;
    if (roots.count == 0) {
        tb__exec_roots_free(&roots);
        return TB_OK;
    }
    st = tb__exec_init(&ex, func, &roots.device);
    if (st == TB_OK) {
        values = (tb_backend_data **)tb__calloc(roots.count, sizeof(tb_backend_data *));
        first = (tb_tensor **)tb__calloc(roots.count, sizeof(tb_tensor *));
        if (values == NULL || first == NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    if (st == TB_OK) st = tb__exec_materialize(&ex, roots.nodes, roots.count, values);
    if (st == TB_OK) {
        /* LTC assigns each result to its tensors and replaces their IR by device data */
        for (i = 0; i < count; i++) {
            tb_tensor *t = tensors[i];
            const int64_t *at;
            size_t k;
            if (t->node == NULL) continue; /* materialised, or listed twice */
            at = tb__exec_map_get(&roots.index, t->node);
            if (at == NULL) continue;
            k = (size_t)*at;
            tb__data_retain(values[k]);
            t->data = values[k];
            tb__node_release(t->node);
            t->node = NULL;
            /* tensors that shared a node share its device data node: one parameter later */
            if (first[k] == NULL) {
                first[k] = t;
            } else {
                tb_node *dn = tb__tensor_ir(first[k]);
                if (dn != NULL) {
                    tb__node_retain(dn);
                    t->data_node = dn;
                }
            }
        }
        /* a graph recorded earlier that still uses these nodes reads the values, not
           recomputing them */
        for (i = 0; i < roots.count; i++) {
            tb_node *node = roots.nodes[i];
            if (!tb__exec_is_param(node)) {
                tb__data_retain(values[i]);
                node->value = values[i];
            }
        }
    }
    if (values != NULL) {
        for (i = 0; i < roots.count; i++) {
            if (values[i] != NULL) tb__data_release(values[i]);
        }
    }
    tb__free(values);
    tb__free(first);
    tb__exec_roots_free(&roots);
    return st;
}

TBDEF tb_status tb_sync(tb_tensor *const *tensors, size_t count) {
    tb_status st;
    tb__ensure_setup();
    st = tb__exec_check_list("tb_sync", tensors, count);
    if (st != TB_OK) return st;
    return tb__exec_sync(tensors, count, "tb_sync");
}

TBDEF tb_status tb_mark_step(void) {
    tb_tensor **live = NULL;
    size_t n = 0, cap = 0, i, done = 0;
    tb_status result = TB_OK, st = TB_OK;
    tb_tensor *t;
    tb__ensure_setup();
    tb__metric_count("MarkStep", 1);
    tb__mutex_lock(&tb__tensor_live_mutex);
    for (t = tb__tensor_live_head; t != NULL; t = t->live_next) {
        if (t->node == NULL) continue;
        if (tb__grow((void **)&live, &cap, n + 1, sizeof(tb_tensor *)) != TB_OK) {
            st = TB_ERR_OUT_OF_MEMORY;
            break;
        }
        if (tb__tensor_retain_if_alive(&t->refcount)) live[n++] = t;
    }
    tb__mutex_unlock(&tb__tensor_live_mutex);
    if (st != TB_OK) {
        for (i = 0; i < n; i++)
            tb_tensor_release(live[i]);
        tb__free(live);
        return st;
    }
    /* one graph per device: gather the tensors of the first device left, in order */
    while (done < n) {
        size_t m = 0;
        tb_device device = live[done]->device;
        for (i = done; i < n; i++) {
            if (tb_device_equal(&live[i]->device, &device)) {
                tb_tensor *tmp = live[i];
                live[i] = live[done + m];
                live[done + m] = tmp;
                m++;
            }
        }
        st = tb__exec_sync(live + done, m, "tb_mark_step");
        if (st != TB_OK && result == TB_OK) result = st;
        done += m;
    }
    for (i = 0; i < n; i++)
        tb_tensor_release(live[i]);
    tb__free(live);
    return result;
}

/* ---- the graph size estimate and the automatic flush ---- */

/* The number of computed (non-parameter) nodes in the pending graph of `node`: a walk. */
static tb_status tb__exec_graph_count(tb_node *node, uint64_t *out) {
    tb__exec_walk w;
    tb_status st;
    memset(&w, 0, sizeof(w));
    st = tb__exec_walk_add(&w, "tb_sync", &node, 1);
    *out = w.num_order - w.num_params;
    tb__exec_walk_free(&w);
    return st;
}

/* The automatic flush. Each node keeps an upper bound of its graph's computed nodes: 1 + the
   operands' bounds (exact for chains; a subgraph reached through two operands counts twice).
   Only a bound above the limit costs a walk, and the walk's exact count replaces the bound.
   Flushing already when the exact count is above half the limit keeps graphs that share
   subgraphs heavily (x = x + x) from walking at every op once they come near the limit. */
static tb_status tb__tensor_auto_flush(tb_tensor *t) {
    tb_node *node = t->node;
    uint64_t bound = 1, limit, exact = 0;
    uint32_t i;
    tb_status st;
    for (i = 0; i < node->num_operands; i++) {
        const tb_node *operand = node->operands[i];
        uint64_t s;
        if (tb__exec_is_param(operand)) continue;
        s = operand->graph_size > 0 ? operand->graph_size : 1;
        bound = bound + s < bound ? UINT64_MAX : bound + s;
    }
    node->graph_size = bound;
    limit = tb__desc()->max_graph_nodes > 0 ? (uint64_t)tb__desc()->max_graph_nodes : 100000u;
    if (bound <= limit) return TB_OK;
    st = tb__exec_graph_count(node, &exact);
    if (st != TB_OK) return st;
    node->graph_size = exact;
    if (exact > limit / 2) {
        tb_tensor *list[1];
        char func[48];
        list[0] = t;
        snprintf(func, sizeof(func), "tb_%s", tb_op_name(node->op));
        st = tb__exec_sync(list, 1, func);
    }
    return st;
}

static tb_tensor *tb__tensor_from_node(tb_node *node) {
    tb_tensor *t;
    if (node == NULL) return NULL;
    t = tb__tensor_new(&node->device, &node->shape);
    if (t == NULL) {
        tb__node_release(node);
        return NULL;
    }
    t->node = node;
    if (!tb__exec_is_param(node) && tb__tensor_auto_flush(t) != TB_OK) {
        tb_tensor_release(t);
        return NULL;
    }
    return t;
}

/* ---- creation, reading back ---- */

static tb_tensor *tb__tensor_from_host(const char *func, const void *data, const tb_shape *shape,
                                       const tb_device *device, bool borrow) {
    tb_device dev;
    size_t nbytes = 0;
    tb_backend_data *d = NULL;
    tb_status st;
    tb__ensure_setup();
    if (shape == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: shape is NULL", func);
        return NULL;
    }
    st = tb_shape_validate(shape);
    if (st == TB_OK) st = tb_shape_nbytes(shape, &nbytes);
    if (st != TB_OK) return NULL;
    if (data == NULL && nbytes > 0) {
        char text[96];
        tb__shape_text(shape, text);
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: data is NULL for %s (%lu bytes)", func, text,
                  (unsigned long)nbytes);
        return NULL;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    /* NULL from the borrow: this device cannot use host memory in place; copy */
    if (borrow) d = tb__data_borrow_host(&dev, shape, data);
    if (d == NULL) d = tb__data_from_host(&dev, shape, data);
    return tb__tensor_from_data(d);
}

TBDEF tb_tensor *tb_tensor_from_host(const void *data, const tb_shape *shape,
                                     const tb_device *device) {
    return tb__tensor_from_host("tb_tensor_from_host", data, shape, device, false);
}

TBDEF tb_tensor *tb_tensor_from_host_borrowed(const void *data, const tb_shape *shape,
                                              const tb_device *device) {
    return tb__tensor_from_host("tb_tensor_from_host_borrowed", data, shape, device, true);
}

/* Syncs one tensor if its value is pending. */
static tb_status tb__tensor_materialize(tb_tensor *t, const char *func) {
    tb_tensor *list[1];
    if (t->node == NULL) return TB_OK;
    list[0] = t;
    return tb__exec_sync(list, 1, func);
}

TBDEF tb_backend_data *tb_tensor_data(tb_tensor *tensor) {
    tb__ensure_setup();
    if (tensor == NULL) {
        tb__tensor_null_error("tb_tensor_data", "tensor");
        return NULL;
    }
    if (tb__tensor_materialize(tensor, "tb_tensor_data") != TB_OK) return NULL;
    return tensor->data;
}

TBDEF tb_status tb_tensor_to_host(tb_tensor *tensor, void *dst, size_t size) {
    size_t nbytes = 0;
    tb_status st;
    tb__ensure_setup();
    if (tensor == NULL) {
        tb__tensor_null_error("tb_tensor_to_host", "tensor");
        return TB_ERR_INVALID_ARGUMENT;
    }
    st = tb_shape_nbytes(&tensor->shape, &nbytes);
    if (st != TB_OK) return st;
    if (size != nbytes) {
        char text[96];
        tb__shape_text(&tensor->shape, text);
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_tensor_to_host: size is %lu bytes but %s needs %lu",
                         (unsigned long)size, text, (unsigned long)nbytes);
    }
    if (dst == NULL && nbytes > 0) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_to_host: dst is NULL");
    }
    st = tb__tensor_materialize(tensor, "tb_tensor_to_host");
    if (st != TB_OK) return st;
    if (nbytes == 0) return TB_OK;
    return tb__data_to_host(tensor->data, dst);
}

TBDEF tb_tensor *tb_to_device(tb_tensor *tensor, const tb_device *device) {
    tb_device dev;
    void *host;
    tb_backend_data *d;
    tb__ensure_setup();
    if (tensor == NULL) {
        tb__tensor_null_error("tb_to_device", "tensor");
        return NULL;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    if (tb__tensor_materialize(tensor, "tb_to_device") != TB_OK) return NULL;
    if (tb_device_equal(&dev, &tensor->device)) {
        tb_tensor *t;
        tb_node *dn = tb__tensor_ir(tensor);
        if (dn == NULL) return NULL;
        tb__data_retain(tensor->data);
        t = tb__tensor_from_data(tensor->data);
        if (t != NULL) {
            /* one device data node for both: the same value is one parameter of a graph */
            tb__node_retain(dn);
            t->data_node = dn;
        }
        return t;
    }
    host = tb__exec_host_alloc(&tensor->shape, NULL);
    if (host == NULL) return NULL;
    d = NULL;
    if (tb__data_to_host(tensor->data, host) == TB_OK) {
        d = tb__data_from_host(&dev, &tensor->shape, host);
    }
    tb__free(host);
    return tb__tensor_from_data(d);
}

TBDEF tb_status tb_tensor_item(tb_tensor *tensor, double *out) {
    int64_t numel = 0;
    unsigned char host[16];
    tb_status st;
    tb__ensure_setup();
    if (tensor == NULL) {
        tb__tensor_null_error("tb_tensor_item", "tensor");
        return TB_ERR_INVALID_ARGUMENT;
    }
    if (out == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_item: out is NULL");
    st = tb_shape_numel(&tensor->shape, &numel);
    if (st != TB_OK) return st;
    if (numel != 1) {
        char text[96];
        tb__shape_text(&tensor->shape, text);
        return tb__error(TB_ERR_SHAPE, "tb_tensor_item: %s has %lld elements, not 1", text,
                         (long long)numel);
    }
    st = tb__tensor_materialize(tensor, "tb_tensor_item");
    if (st != TB_OK) return st;
    st = tb__data_to_host(tensor->data, host);
    if (st != TB_OK) return st;
    *out = tb__exec_host_to_double(host, tensor->shape.dtype);
    return TB_OK;
}

/* ---- dumps ---- */

/* For tb_ir_dot: per position of the dump's walk `w`, the kernel that computes the node in the
   computation a sync of `roots` would run (-1: none), when the backend of the tensors' device
   says so. The computation stays referenced in *entry while the names are in use. A graph
   that cannot have clusters (mixed devices, a backend without get_node_kernel, a graph that
   does not compile) gives false and leaves the caller's error as it was: the dump is drawn
   without clusters. Memory running out is an error of the dump (*failed true, the error set):
   a dump without its clusters would pass for the complete one. */
static bool tb__exec_dump_kernels(const char *func, tb_tensor *const *tensors, size_t count,
                                  const tb__exec_roots *roots, const tb__exec_walk *w,
                                  int32_t **kernel, const char ***names,
                                  tb__comp_cache_entry **entry, bool *failed) {
    tb__exec ex;
    tb__exec_walk cw;
    tb_graph g;
    const tb_node **results = NULL;
    tb__saved_error saved;
    bool hit, ok = false;
    uint64_t compile_ns;
    size_t i;
    tb_status st;
    *kernel = NULL;
    *names = NULL;
    *entry = NULL;
    *failed = false;
    if (roots->count == 0 || w->num_order == 0) return false;
    for (i = 0; i < count; i++) {
        if (!tb_device_equal(&tensors[i]->device, &roots->device)) return false;
    }
    tb__error_save(&saved);
    memset(&cw, 0, sizeof(cw));
    st = tb__exec_init(&ex, func, &roots->device);
    if (st == TB_OK && ex.vt->get_node_kernel == NULL) st = TB_ERR_UNSUPPORTED;
    if (st == TB_OK) {
        /* the graph a sync would compile once the eager fallback has run (tb_ir_backend_text) */
        cw.cut = ex.vt;
        st = tb__exec_walk_add(&cw, func, roots->nodes, roots->count);
    }
    if (st == TB_OK) st = tb__exec_graph_make(&ex, &cw, roots->nodes, roots->count, &results, &g);
    if (st == TB_OK && g.num_results == 0) st = TB_ERR_NOT_FOUND;
    if (st == TB_OK) st = tb__exec_compile(&ex, &g, &cw, entry, &hit, &compile_ns);
    if (st == TB_OK && !hit && tb_debug_level() >= 1)
        tb__exec_log_dump_compile(&ex, &g, compile_ns);
    if (st == TB_OK) {
        *kernel = (int32_t *)tb__calloc(w->num_order + 1, sizeof(int32_t));
        *names = (const char **)tb__calloc(w->num_order + 1, sizeof(const char *));
        if (*kernel == NULL || *names == NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    if (st == TB_OK) {
        for (i = 0; i < w->num_order; i++)
            (*kernel)[i] = -1;
        for (i = 0; i < cw.num_order; i++) {
            const char *name = NULL;
            int32_t k = ex.vt->get_node_kernel(ex.vt->user_data, (*entry)->computation, i, &name);
            int64_t at = tb__exec_walk_position(w, cw.order[i]);
            if (k < 0 || at < 0 || (size_t)at >= w->num_order) continue;
            (*kernel)[at] = k;
            (*names)[at] = name;
        }
        ok = true;
    }
    if (!ok) {
        tb__free(*kernel);
        tb__free((void *)*names);
        tb__comp_cache_release(*entry);
        *kernel = NULL;
        *names = NULL;
        *entry = NULL;
    }
    tb__free((void *)results);
    tb__exec_walk_free(&cw);
    if (!ok && (st == TB_ERR_OUT_OF_MEMORY || st == TB_ERR_OVERFLOW)) {
        *failed = true; /* the error stays: the dump fails with it */
    } else {
        tb__error_restore(&saved);
    }
    return ok;
}

/* tb_ir_text and tb_ir_dot: the graph behind the tensors, results marked per tensor. */
static char *tb__exec_dump(const char *func, tb_tensor *const *tensors, size_t count, bool dot) {
    tb__exec_roots roots;
    tb__exec_walk w;
    tb__str s;
    tb_node **nodes = NULL;
    int32_t *kernel = NULL;
    const char **names = NULL;
    tb__comp_cache_entry *entry = NULL;
    char *text = NULL;
    size_t i;
    tb_status st;
    tb__ensure_setup();
    memset(&s, 0, sizeof(s));
    memset(&w, 0, sizeof(w));
    memset(&roots, 0, sizeof(roots));
    st = tb__exec_check_list(func, tensors, count);
    if (st == TB_OK) st = tb__exec_roots_collect(&roots, func, tensors, count, true, false);
    if (st == TB_OK) st = tb__exec_walk_add(&w, func, roots.nodes, roots.count);
    if (st == TB_OK) {
        nodes = (tb_node **)tb__calloc(count + 1, sizeof(tb_node *));
        if (nodes == NULL) st = TB_ERR_OUT_OF_MEMORY;
    }
    if (st == TB_OK) {
        /* every tensor has its operand node now: the roots were collected from them */
        for (i = 0; i < count; i++)
            nodes[i] = tb__tensor_ir(tensors[i]);
        bool failed = false;
        if (dot) {
            tb__exec_dump_kernels(func, tensors, count, &roots, &w, &kernel, &names, &entry,
                                  &failed);
            if (!failed) tb__exec_dot_append(&s, &w, nodes, count, kernel, names);
        } else {
            tb__exec_text_append(&s, &w, nodes, count);
        }
        if (!failed) text = tb__str_take(&s);
    }
    tb__free(kernel);
    tb__free((void *)names);
    tb__comp_cache_release(entry);
    tb__free(nodes);
    tb__str_free(&s);
    tb__exec_walk_free(&w);
    tb__exec_roots_free(&roots);
    return text;
}

TBDEF char *tb_ir_text(tb_tensor *const *tensors, size_t count) {
    return tb__exec_dump("tb_ir_text", tensors, count, false);
}

TBDEF char *tb_ir_dot(tb_tensor *const *tensors, size_t count) {
    return tb__exec_dump("tb_ir_dot", tensors, count, true);
}

TBDEF char *tb_ir_backend_text(tb_tensor *const *tensors, size_t count) {
    tb__exec_roots roots;
    tb__exec_walk w;
    tb__exec ex;
    tb_graph g;
    const tb_node **results = NULL;
    tb__comp_cache_entry *entry = NULL;
    char *text = NULL;
    bool hit;
    uint64_t compile_ns;
    tb_status st;
    tb__ensure_setup();
    memset(&w, 0, sizeof(w));
    st = tb__exec_check_list("tb_ir_backend_text", tensors, count);
    if (st == TB_OK) {
        st = tb__exec_roots_collect(&roots, "tb_ir_backend_text", tensors, count, true, true);
    } else {
        memset(&roots, 0, sizeof(roots));
    }
    if (st == TB_OK && roots.count == 0) {
        tb__exec_roots_free(&roots);
        return tb__strdup("");
    }
    if (st == TB_OK) st = tb__exec_init(&ex, "tb_ir_backend_text", &roots.device);
    if (st == TB_OK) {
        /* the graph a sync would compile once the eager fallback has run */
        w.cut = ex.vt;
        st = tb__exec_walk_add(&w, ex.func, roots.nodes, roots.count);
    }
    if (st == TB_OK) st = tb__exec_graph_make(&ex, &w, roots.nodes, roots.count, &results, &g);
    if (st == TB_OK && g.num_results == 0) {
        text = tb__strdup("");
    } else if (st == TB_OK) {
        st = tb__exec_compile(&ex, &g, &w, &entry, &hit, &compile_ns);
        if (st == TB_OK && !hit && tb_debug_level() >= 1) {
            tb__exec_log_dump_compile(&ex, &g, compile_ns);
        }
        if (st == TB_OK) {
            const char *backend_text = NULL;
            if (ex.vt->computation_backend_text != NULL) {
                /* NULL is "no text" only without an error: with one, the text could not be
                   made (memory ran out), and an empty text would pass for the answer */
                tb__saved_error saved;
                tb__exec_call_begin(&saved);
                backend_text =
                    ex.vt->computation_backend_text(ex.vt->user_data, entry->computation);
                if (backend_text == NULL && tb_last_status() != TB_OK) {
                    st = tb__exec_call_failed(&ex, tb_last_status(), "computation_backend_text");
                } else {
                    tb__error_restore(&saved);
                }
            }
            if (st == TB_OK) text = tb__strdup(backend_text != NULL ? backend_text : "");
        }
    }
    tb__comp_cache_release(entry);
    tb__free((void *)results);
    tb__exec_walk_free(&w);
    tb__exec_roots_free(&roots);
    return text;
}

/* ---- seeding, shutdown ---- */

TBDEF tb_status tb_manual_seed(uint64_t seed) {
    tb__builtin_failure why;
    tb__ensure_setup();
    if (!tb_is_setup()) return tb_last_status(); /* memory ran out setting the library up */
    /* Every backend that exists is registered first, so that either all of them hear of the
       seed or nothing changes; from there on nothing allocates, nothing can fail. */
    tb__registry_ensure(&why);
    if (why.status != TB_OK) {
        return tb__error(why.status,
                         "tb_manual_seed: cannot register the built-in backend '%s': %s", why.name,
                         why.reason);
    }
    tb__rng_set_seed(seed);
    /* the registry lives in an earlier layer than the generator state: tell the backends here */
    tb__registry_set_rng_seed(seed);
    return TB_OK;
}

static void tb__executor_shutdown(void) {
    tb_tensor *t;
    tb__comp_cache_clear();
    tb__mutex_lock(&tb__comp_cache_mutex);
    tb__free(tb__comp_cache_buckets);
    tb__comp_cache_buckets = NULL;
    tb__comp_cache_num_buckets = 0;
    tb__mutex_unlock(&tb__comp_cache_mutex);
    /* tensors still alive are invalid from now on; forget them so a new setup starts clean */
    tb__mutex_lock(&tb__tensor_live_mutex);
    t = tb__tensor_live_head;
    while (t != NULL) {
        tb_tensor *next = t->live_next;
        t->live_prev = NULL;
        t->live_next = NULL;
        t->live_linked = false;
        t = next;
    }
    tb__tensor_live_head = NULL;
    tb__mutex_unlock(&tb__tensor_live_mutex);
    tb__rng_reset();
}

/* ---- src/ops.c ---- */
/* ===========================================================================================
   Ops: the tensor functions that record IR nodes with PyTorch's semantics (type promotion,
   broadcasting, negative axes), and the creation functions. The nodes follow the normal form
   documented above TB_OP_LIST in ir.h.
   =========================================================================================== */

/* ---- plumbing ---- */

/* An op given a NULL tensor keeps the first error of the chain. */
static tb_tensor *tb__null_input(const char *fn, const char *what) {
    if (tb_last_status() == TB_OK) tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
    return NULL;
}

/* A user or backend callback failed with `st`: its own message, if it set one, is kept after
   ours. */
static tb_status tb__callback_failed(tb_status st, const tb__saved_error *before, const char *fn,
                                     const char *what) {
    bool changed = tb_last_status() != TB_OK && (tb_last_status() != before->status ||
                                                 strcmp(tb_last_error(), before->message) != 0);
    if (st <= TB_OK || st >= TB_STATUS_COUNT) st = TB_ERR_UNSUPPORTED;
    if (changed) return tb__error(st, "%s: %s: %s", fn, what, tb_last_error());
    return tb__error(st, "%s: %s (%s)", fn, what, tb_status_string(st));
}

/* Tells the device's backend about a new node (LTC's IR builder hook); it may refuse it. */
static tb_status tb__announce(const char *fn, const tb_node *node) {
    const tb_backend *backend = tb__backend_for_device(&node->device);
    const tb_backend_impl *impl;
    tb__saved_error before;
    tb_status st;
    char what[128];
    if (backend == NULL) {
        if (tb_last_status() != TB_OK) return tb_last_status();
        return tb__error(TB_ERR_NOT_FOUND, "%s: no backend for the device '%s'", fn,
                         node->device.backend);
    }
    impl = tb__backend_vtable(backend);
    if (impl == NULL || impl->on_node_created == NULL) return TB_OK;
    tb__error_save(&before);
    st = impl->on_node_created(impl->user_data, node);
    if (st == TB_OK) {
        tb__error_restore(&before);
        return TB_OK;
    }
    snprintf(what, sizeof what, "backend '%s' rejected the %s node", tb_backend_name(backend),
             tb_op_name(node->op) != NULL ? tb_op_name(node->op) : "custom");
    return tb__callback_failed(st, &before, fn, what);
}

/* Creates and announces a node of a known shape; an owned reference or NULL. */
static tb_node *tb__emit(const char *fn, tb_op op, const tb_shape *shape, const tb_device *device,
                         tb_node *const *operands, size_t num_operands, const int64_t *attrs,
                         size_t num_attrs, const double *fattrs) {
    tb_node *node =
        tb__node_new(op, shape, device, operands, num_operands, attrs, num_attrs, fattrs);
    if (node == NULL) return NULL;
    if (tb__announce(fn, node) != TB_OK) {
        tb__node_release(node);
        return NULL;
    }
    return node;
}

/* Infers the shape, then creates and announces the node. */
static tb_node *tb__record(const char *fn, tb_op op, const tb_device *device,
                           tb_node *const *operands, size_t num_operands, const int64_t *attrs,
                           size_t num_attrs, const double *fattrs) {
    tb_shape local[4];
    tb_shape *shapes = local;
    tb_shape out;
    tb_status st;
    size_t i;
    memset(local, 0, sizeof local);
    if (num_operands > 4) {
        shapes = (tb_shape *)tb__calloc(num_operands, sizeof *shapes);
        if (shapes == NULL) return NULL;
    }
    for (i = 0; i < num_operands; i++)
        shapes[i] = operands[i]->shape;
    memset(&out, 0, sizeof out);
    st = tb__infer_shape_as(fn, op, shapes, num_operands, attrs, num_attrs, &out);
    if (shapes != local) tb__free(shapes);
    if (st != TB_OK) return NULL;
    return tb__emit(fn, op, &out, device, operands, num_operands, attrs, num_attrs, fattrs);
}

static tb_tensor *tb__finish(tb_node *node) {
    return node != NULL ? tb__tensor_from_node(node) : NULL;
}

/* x converted to `dtype` (x itself, retained, when it already has it). */
static tb_node *tb__cast_node(const char *fn, tb_node *x, tb_dtype dtype) {
    int64_t attr = (int64_t)dtype;
    if (x->shape.dtype == dtype) {
        tb__node_retain(x);
        return x;
    }
    return tb__record(fn, TB_OP_CAST, &x->device, &x, 1, &attr, 1, NULL);
}

static bool tb__dims_equal(const tb_shape *shape, int32_t rank, const int64_t *dims) {
    int32_t i;
    if (shape->rank != rank) return false;
    for (i = 0; i < rank; i++) {
        if (shape->dims[i] != dims[i]) return false;
    }
    return true;
}

/* x reshaped (RESHAPE) or expanded (EXPAND) to `dims`; x itself, retained, when it has them. */
static tb_node *tb__view_node(const char *fn, tb_op op, tb_node *x, int32_t rank,
                              const int64_t *dims) {
    if (tb__dims_equal(&x->shape, rank, dims)) {
        tb__node_retain(x);
        return x;
    }
    return tb__record(fn, op, &x->device, &x, 1, dims, (size_t)rank, NULL);
}

/* Like tb__view_node but consumes the caller's reference to x. */
static tb_node *tb__view_take(const char *fn, tb_op op, tb_node *x, int32_t rank,
                              const int64_t *dims) {
    tb_node *r;
    if (x == NULL) return NULL;
    r = tb__view_node(fn, op, x, rank, dims);
    tb__node_release(x);
    return r;
}

/* "[2,-1,3]" */
static void tb__dims_text(const int64_t *dims, int32_t rank, char *buf, size_t cap) {
    size_t len = 0;
    int32_t i;
    int w = snprintf(buf, cap, "[");
    if (w > 0) len = (size_t)w;
    for (i = 0; i < rank && len < cap; i++) {
        w = snprintf(buf + len, cap - len, "%s%lld", i == 0 ? "" : ",", (long long)dims[i]);
        if (w < 0) return;
        len += (size_t)w;
    }
    if (len < cap) snprintf(buf + len, cap - len, "]");
}

static size_t tb__device_text(const tb_device *device, char *buf, size_t cap) {
    return tb_device_format(device, buf, cap);
}

/* ---- operands ---- */

/* An operand of an op: an owned reference to its node, with what type promotion needs. */
typedef struct tb__arg {
    tb_node *node;
    tb_shape shape;
    bool wrapped; /* a SCALAR made from a host number: weakest in promotion */
} tb__arg;

static void tb__args_release(tb__arg *args, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        tb__node_release(args[i].node);
        args[i].node = NULL;
    }
}

static void tb__arg_set(tb__arg *arg, tb_node *node) {
    arg->node = node;
    arg->shape = node->shape;
    arg->wrapped = node->op == TB_OP_SCALAR && node->wrapped_number;
}

/* Reads the operand nodes of `n` non-NULL tensors and picks the device the op runs on: that of
   the first operand that is not a scalar. Scalars (tb_scalar) on another device are made again
   on that one; any other device mismatch is an error. */
static tb_status tb__args_get(const char *fn, tb_tensor *const *tensors, size_t n, tb__arg *args,
                              tb_device *device) {
    size_t i, lead = 0;
    for (i = 0; i < n; i++)
        args[i].node = NULL;
    for (i = 0; i < n; i++) {
        tb_node *node = tb__tensor_ir(tensors[i]);
        if (node == NULL) {
            tb__args_release(args, i);
            if (tb_last_status() != TB_OK) return tb_last_status();
            return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: operand %zu has no value", fn, i);
        }
        tb__node_retain(node);
        tb__arg_set(&args[i], node);
    }
    for (i = 0; i < n; i++) {
        if (args[i].node->op != TB_OP_SCALAR) {
            lead = i;
            break;
        }
    }
    *device = args[lead].node->device;
    for (i = 0; i < n; i++) {
        tb_node *node = args[i].node, *moved;
        if (tb_device_equal(&node->device, device)) continue;
        if (node->op != TB_OP_SCALAR) {
            char da[64], db[64];
            tb__device_text(device, da, sizeof da);
            tb__device_text(&node->device, db, sizeof db);
            tb__args_release(args, n);
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: operands on different devices: %s (operand %zu) and %s "
                             "(operand %zu)",
                             fn, da, lead, db, i);
        }
        moved = tb__node_scalar(node->scalar, device, node->wrapped_number);
        if (moved != NULL && tb__announce(fn, moved) != TB_OK) {
            tb__node_release(moved);
            moved = NULL;
        }
        if (moved == NULL) {
            tb__args_release(args, n);
            return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
        }
        tb__node_release(node);
        tb__arg_set(&args[i], moved);
    }
    return TB_OK;
}

/* ---- type promotion (PyTorch's result_type) ----
   Operands fall in three categories: tensors with dims, rank-0 tensors, and wrapped host
   numbers (whose float values count as the default dtype f32). A lower category only raises the
   result when it is of a higher kind (bool < integer < float) than the categories above. */

static void tb__promote_into(bool *has, tb_dtype *acc, tb_dtype d) {
    *acc = *has ? tb_dtype_promote(*acc, d) : d;
    *has = true;
}

static int tb__dtype_kind(tb_dtype d) {
    if (d == TB_BOOL) return 0;
    return tb_dtype_is_float(d) ? 2 : 1;
}

static void tb__combine_categories(bool has_hi, tb_dtype hi, bool has_lo, tb_dtype lo,
                                   bool *has_out, tb_dtype *out) {
    if (!has_hi) {
        *has_out = has_lo;
        *out = lo;
    } else if (has_lo && tb__dtype_kind(lo) > tb__dtype_kind(hi)) {
        *has_out = true;
        *out = tb_dtype_promote(hi, lo);
    } else {
        *has_out = true;
        *out = hi;
    }
}

static tb_dtype tb__result_type(const tb__arg *args, size_t n) {
    bool has[3] = {false, false, false};
    tb_dtype res[3] = {TB_BOOL, TB_BOOL, TB_BOOL};
    bool has_low;
    tb_dtype low, out;
    size_t i;
    for (i = 0; i < n; i++) {
        tb_dtype d = args[i].shape.dtype;
        int cat = args[i].shape.rank > 0 ? 0 : (args[i].wrapped ? 2 : 1);
        if (cat == 2 && tb_dtype_is_float(d)) d = TB_F32;
        tb__promote_into(&has[cat], &res[cat], d);
    }
    tb__combine_categories(has[1], res[1], has[2], res[2], &has_low, &low);
    tb__combine_categories(has[0], res[0], has_low, low, &has_low, &out);
    return out;
}

/* What a wrapped host double looks like to type promotion. */
static tb__arg tb__wrapped_probe(void) {
    tb__arg probe;
    memset(&probe, 0, sizeof probe);
    probe.shape.dtype = TB_F64;
    probe.shape.rank = 0;
    probe.wrapped = true;
    return probe;
}

/* ---- host values ---- */

static bool tb__is_finite(double v) {
    return fabs(v) <= DBL_MAX;
}

/* A scalar of a float dtype (the integer field set only where it is representable). */
static tb_scalar tb__float_scalar(tb_dtype dtype, double v) {
    tb_scalar s;
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    s.f = v;
    if (v > -9223372036854775808.0 && v < 9223372036854775808.0) s.i = (int64_t)v;
    return s;
}

/* A host double as a value of `dtype`, as PyTorch's fill: integers truncate toward zero, values
   that do not fit are an error, bool is v != 0. */
static tb_status tb__scalar_from_double(const char *fn, double v, tb_dtype dtype, tb_scalar *out) {
    tb_scalar s;
    double t, lo, hi;
    if (tb_dtype_is_float(dtype)) {
        *out = tb__float_scalar(dtype, v);
        return TB_OK;
    }
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    if (dtype == TB_BOOL) {
        s.i = v != 0.0 ? 1 : 0; /* NaN is true, as in PyTorch */
        s.f = (double)s.i;
        *out = s;
        return TB_OK;
    }
    switch (dtype) {
    case TB_I32:
        lo = -2147483648.0;
        hi = 2147483647.0;
        break;
    case TB_U8:
        lo = 0.0;
        hi = 255.0;
        break;
    default:
        lo = -9223372036854775808.0;
        hi = 9223372036854775807.0;
        break;
    }
    t = v != v ? v : (v < 0 ? ceil(v) : floor(v));
    if (!(t >= lo && t <= hi) || (dtype == TB_I64 && t >= 9223372036854775808.0)) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: value %g does not fit in %s", fn, v,
                         tb_dtype_name(dtype));
    }
    s.i = (int64_t)t;
    s.f = (double)s.i;
    *out = s;
    return TB_OK;
}

/* Checks a shape given by the user (tb_full, tb_rand, ...). */
static tb_status tb__check_user_shape(const char *fn, const tb_shape *shape) {
    int32_t i;
    if (shape == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: shape is NULL", fn);
    if (!tb_dtype_is_valid(shape->dtype)) {
        return tb__error(TB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)shape->dtype);
    }
    if (shape->rank < 0 || shape->rank > TB_MAX_RANK) {
        return tb__error(TB_ERR_SHAPE, "%s: rank %d is out of range (0..%d)", fn, (int)shape->rank,
                         TB_MAX_RANK);
    }
    for (i = 0; i < shape->rank; i++) {
        if (shape->dims[i] < 0) {
            return tb__error(TB_ERR_SHAPE, "%s: dim %d is negative (%lld)", fn, (int)i,
                             (long long)shape->dims[i]);
        }
    }
    return tb__check_fits(fn, shape);
}

/* An axis in [-rank, rank) made non-negative; a rank-0 tensor takes 0 and -1, as PyTorch. */
static tb_status tb__norm_axis(const char *fn, const char *what, int64_t axis, int32_t rank,
                               const tb_shape *shape, int32_t *out) {
    int32_t r = rank > 0 ? rank : 1;
    *out = 0; /* defined on every path, so optimisers see no uninitialised use */
    if (axis < -(int64_t)r || axis >= (int64_t)r) {
        tb__shape_buf b;
        return tb__error(TB_ERR_SHAPE, "%s: %s %lld is out of range for %s (expected %d..%d)", fn,
                         what, (long long)axis, tb__st(shape, &b), (int)-r, (int)(r - 1));
    }
    *out = (int32_t)(axis < 0 ? axis + r : axis);
    return TB_OK;
}

/* ---- unary ---- */

static bool tb__op_is_float_only(tb_op op) {
    switch (op) {
    case TB_OP_EXP:
    case TB_OP_LOG:
    case TB_OP_SQRT:
    case TB_OP_RSQRT:
    case TB_OP_SIN:
    case TB_OP_COS:
    case TB_OP_TANH:
    case TB_OP_SIGMOID:
    case TB_OP_GELU:
    case TB_OP_SILU:
    case TB_OP_RECIPROCAL:
        return true;
    default:
        return false;
    }
}

static tb_tensor *tb__unary(const char *fn, tb_op op, tb_tensor *x) {
    tb__arg arg;
    tb_device device;
    tb_node *in, *node;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (tb__op_is_float_only(op) && !tb_dtype_is_float(arg.shape.dtype)) {
        if (op == TB_OP_GELU || op == TB_OP_SILU) {
            /* PyTorch has no integer kernels for these (and does not promote) */
            tb__need_float(fn, &arg.shape);
            tb__args_release(&arg, 1);
            return NULL;
        }
        in = tb__cast_node(fn, arg.node, TB_F32);
    } else if (op == TB_OP_LOGICAL_NOT) {
        in = tb__cast_node(fn, arg.node, TB_BOOL);
    } else {
        in = arg.node;
        tb__node_retain(in);
    }
    tb__args_release(&arg, 1);
    if (in == NULL) return NULL;
    node = tb__record(fn, op, &device, &in, 1, NULL, 0, NULL);
    tb__node_release(in);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_neg(tb_tensor *x) {
    return tb__unary("tb_neg", TB_OP_NEG, x);
}
TBDEF tb_tensor *tb_abs(tb_tensor *x) {
    return tb__unary("tb_abs", TB_OP_ABS, x);
}
TBDEF tb_tensor *tb_exp(tb_tensor *x) {
    return tb__unary("tb_exp", TB_OP_EXP, x);
}
TBDEF tb_tensor *tb_log(tb_tensor *x) {
    return tb__unary("tb_log", TB_OP_LOG, x);
}
TBDEF tb_tensor *tb_sqrt(tb_tensor *x) {
    return tb__unary("tb_sqrt", TB_OP_SQRT, x);
}
TBDEF tb_tensor *tb_rsqrt(tb_tensor *x) {
    return tb__unary("tb_rsqrt", TB_OP_RSQRT, x);
}
TBDEF tb_tensor *tb_sin(tb_tensor *x) {
    return tb__unary("tb_sin", TB_OP_SIN, x);
}
TBDEF tb_tensor *tb_cos(tb_tensor *x) {
    return tb__unary("tb_cos", TB_OP_COS, x);
}
TBDEF tb_tensor *tb_tanh(tb_tensor *x) {
    return tb__unary("tb_tanh", TB_OP_TANH, x);
}
TBDEF tb_tensor *tb_sigmoid(tb_tensor *x) {
    return tb__unary("tb_sigmoid", TB_OP_SIGMOID, x);
}
TBDEF tb_tensor *tb_relu(tb_tensor *x) {
    return tb__unary("tb_relu", TB_OP_RELU, x);
}
TBDEF tb_tensor *tb_gelu(tb_tensor *x) {
    return tb__unary("tb_gelu", TB_OP_GELU, x);
}
TBDEF tb_tensor *tb_silu(tb_tensor *x) {
    return tb__unary("tb_silu", TB_OP_SILU, x);
}
TBDEF tb_tensor *tb_reciprocal(tb_tensor *x) {
    return tb__unary("tb_reciprocal", TB_OP_RECIPROCAL, x);
}
TBDEF tb_tensor *tb_floor(tb_tensor *x) {
    return tb__unary("tb_floor", TB_OP_FLOOR, x);
}
TBDEF tb_tensor *tb_ceil(tb_tensor *x) {
    return tb__unary("tb_ceil", TB_OP_CEIL, x);
}
TBDEF tb_tensor *tb_round(tb_tensor *x) {
    return tb__unary("tb_round", TB_OP_ROUND, x);
}
TBDEF tb_tensor *tb_sign(tb_tensor *x) {
    return tb__unary("tb_sign", TB_OP_SIGN, x);
}
TBDEF tb_tensor *tb_logical_not(tb_tensor *x) {
    return tb__unary("tb_logical_not", TB_OP_LOGICAL_NOT, x);
}

TBDEF tb_tensor *tb_cast(tb_tensor *x, tb_dtype dtype) {
    const char *fn = "tb_cast";
    tb__arg arg;
    tb_device device;
    tb_node *node;
    int64_t attr = (int64_t)dtype;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (!tb_dtype_is_valid(dtype)) {
        tb__error(TB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)dtype);
        return NULL;
    }
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    node = tb__record(fn, TB_OP_CAST, &device, &arg.node, 1, &attr, 1, NULL);
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

/* ---- binary ---- */

/* The node of a binary op on two operands (promoted, cast, checked). */
static tb_node *tb__binary_node(const char *fn, tb_op op, tb__arg *args, const tb_device *device) {
    tb_dtype t = tb__result_type(args, 2);
    tb_shape shapes[2], out;
    tb_node *operands[2], *node;
    shapes[0] = args[0].shape;
    shapes[1] = args[1].shape;
    memset(&out, 0, sizeof out);
    /* the shapes as the caller gave them, before any cast, in the message */
    if (tb__broadcast_dims(fn, shapes, 2, &out) != TB_OK) return NULL;
    switch (op) {
    case TB_OP_SUB:
    case TB_OP_POW:
        if (t == TB_BOOL) {
            tb__shape_buf a, b;
            tb__error(TB_ERR_DTYPE, "%s: not supported on two bool operands (%s and %s)", fn,
                      tb__st(&shapes[0], &a), tb__st(&shapes[1], &b));
            return NULL;
        }
        break;
    case TB_OP_DIV:
        if (!tb_dtype_is_float(t)) t = TB_F32; /* true division */
        break;
    case TB_OP_LOGICAL_AND:
    case TB_OP_LOGICAL_OR:
        t = TB_BOOL;
        break;
    default:
        break;
    }
    operands[0] = tb__cast_node(fn, args[0].node, t);
    if (operands[0] == NULL) return NULL;
    operands[1] = tb__cast_node(fn, args[1].node, t);
    if (operands[1] == NULL) {
        tb__node_release(operands[0]);
        return NULL;
    }
    node = tb__record(fn, op, device, operands, 2, NULL, 0, NULL);
    tb__node_release(operands[0]);
    tb__node_release(operands[1]);
    return node;
}

static tb_tensor *tb__binary(const char *fn, tb_op op, tb_tensor *a, tb_tensor *b) {
    tb_tensor *tensors[2];
    tb__arg args[2];
    tb_device device;
    tb_node *node;
    tb__ensure_setup();
    if (a == NULL) return tb__null_input(fn, "a");
    if (b == NULL) return tb__null_input(fn, "b");
    tensors[0] = a;
    tensors[1] = b;
    if (tb__args_get(fn, tensors, 2, args, &device) != TB_OK) return NULL;
    node = tb__binary_node(fn, op, args, &device);
    tb__args_release(args, 2);
    return tb__finish(node);
}

/* A wrapped SCALAR node of `dtype` holding the host number v, announced. */
static tb_node *tb__wrapped_scalar(const char *fn, tb_scalar value, const tb_device *device) {
    tb_node *node = tb__node_scalar(value, device, true);
    if (node != NULL && tb__announce(fn, node) != TB_OK) {
        tb__node_release(node);
        node = NULL;
    }
    return node;
}

static tb_tensor *tb__binary_scalar(const char *fn, tb_op op, tb_tensor *a, double b) {
    tb__arg args[2];
    tb_device device;
    tb_node *node, *scalar;
    tb_dtype t;
    tb__ensure_setup();
    if (a == NULL) return tb__null_input(fn, "a");
    if (tb__args_get(fn, &a, 1, args, &device) != TB_OK) return NULL;
    args[1] = tb__wrapped_probe();
    t = tb__result_type(args, 2); /* always a float dtype: b is a Python float */
    scalar = tb__wrapped_scalar(fn, tb__float_scalar(t, b), &device);
    if (scalar == NULL) {
        tb__args_release(args, 1);
        return NULL;
    }
    tb__arg_set(&args[1], scalar);
    node = tb__binary_node(fn, op, args, &device);
    tb__args_release(args, 2);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_add(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_add", TB_OP_ADD, a, b);
}
TBDEF tb_tensor *tb_sub(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_sub", TB_OP_SUB, a, b);
}
TBDEF tb_tensor *tb_mul(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_mul", TB_OP_MUL, a, b);
}
TBDEF tb_tensor *tb_div(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_div", TB_OP_DIV, a, b);
}
TBDEF tb_tensor *tb_pow(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_pow", TB_OP_POW, a, b);
}
TBDEF tb_tensor *tb_maximum(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_maximum", TB_OP_MAXIMUM, a, b);
}
TBDEF tb_tensor *tb_minimum(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_minimum", TB_OP_MINIMUM, a, b);
}
TBDEF tb_tensor *tb_eq(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_eq", TB_OP_EQ, a, b);
}
TBDEF tb_tensor *tb_ne(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_ne", TB_OP_NE, a, b);
}
TBDEF tb_tensor *tb_lt(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_lt", TB_OP_LT, a, b);
}
TBDEF tb_tensor *tb_le(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_le", TB_OP_LE, a, b);
}
TBDEF tb_tensor *tb_gt(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_gt", TB_OP_GT, a, b);
}
TBDEF tb_tensor *tb_ge(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_ge", TB_OP_GE, a, b);
}
TBDEF tb_tensor *tb_logical_and(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_logical_and", TB_OP_LOGICAL_AND, a, b);
}
TBDEF tb_tensor *tb_logical_or(tb_tensor *a, tb_tensor *b) {
    return tb__binary("tb_logical_or", TB_OP_LOGICAL_OR, a, b);
}

TBDEF tb_tensor *tb_add_scalar(tb_tensor *a, double b) {
    return tb__binary_scalar("tb_add_scalar", TB_OP_ADD, a, b);
}
TBDEF tb_tensor *tb_sub_scalar(tb_tensor *a, double b) {
    return tb__binary_scalar("tb_sub_scalar", TB_OP_SUB, a, b);
}
TBDEF tb_tensor *tb_mul_scalar(tb_tensor *a, double b) {
    return tb__binary_scalar("tb_mul_scalar", TB_OP_MUL, a, b);
}
TBDEF tb_tensor *tb_div_scalar(tb_tensor *a, double b) {
    return tb__binary_scalar("tb_div_scalar", TB_OP_DIV, a, b);
}
TBDEF tb_tensor *tb_pow_scalar(tb_tensor *a, double b) {
    return tb__binary_scalar("tb_pow_scalar", TB_OP_POW, a, b);
}

/* ---- ternary ---- */

TBDEF tb_tensor *tb_where(tb_tensor *cond, tb_tensor *a, tb_tensor *b) {
    const char *fn = "tb_where";
    tb_tensor *tensors[3];
    tb__arg args[3];
    tb_device device;
    tb_shape shapes[3], out;
    tb_node *operands[3], *node = NULL;
    tb_dtype t;
    int i;
    tb__ensure_setup();
    if (cond == NULL) return tb__null_input(fn, "cond");
    if (a == NULL) return tb__null_input(fn, "a");
    if (b == NULL) return tb__null_input(fn, "b");
    tensors[0] = cond;
    tensors[1] = a;
    tensors[2] = b;
    if (tb__args_get(fn, tensors, 3, args, &device) != TB_OK) return NULL;
    for (i = 0; i < 3; i++)
        shapes[i] = args[i].shape;
    memset(&out, 0, sizeof out);
    if (tb__need_bool(fn, "the condition", &shapes[0]) != TB_OK ||
        tb__broadcast_dims(fn, shapes, 3, &out) != TB_OK) {
        tb__args_release(args, 3);
        return NULL;
    }
    t = tb__result_type(args + 1, 2);
    operands[0] = args[0].node;
    operands[1] = tb__cast_node(fn, args[1].node, t);
    operands[2] = operands[1] != NULL ? tb__cast_node(fn, args[2].node, t) : NULL;
    if (operands[2] != NULL)
        node = tb__record(fn, TB_OP_WHERE, &device, operands, 3, NULL, 0, NULL);
    tb__node_release(operands[1]);
    tb__node_release(operands[2]);
    tb__args_release(args, 3);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_clamp(tb_tensor *x, double lo, double hi) {
    const char *fn = "tb_clamp";
    tb__arg args[3];
    tb_device device;
    tb_node *operands[3], *node = NULL;
    tb_dtype t;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, args, &device) != TB_OK) return NULL;
    args[1] = tb__wrapped_probe();
    args[2] = tb__wrapped_probe();
    t = tb__result_type(args, 3);
    operands[0] = tb__cast_node(fn, args[0].node, t);
    operands[1] =
        operands[0] != NULL ? tb__wrapped_scalar(fn, tb__float_scalar(t, lo), &device) : NULL;
    operands[2] =
        operands[1] != NULL ? tb__wrapped_scalar(fn, tb__float_scalar(t, hi), &device) : NULL;
    if (operands[2] != NULL)
        node = tb__record(fn, TB_OP_CLAMP, &device, operands, 3, NULL, 0, NULL);
    tb__node_release(operands[0]);
    tb__node_release(operands[1]);
    tb__node_release(operands[2]);
    tb__args_release(args, 1);
    return tb__finish(node);
}

/* ---- reductions ---- */

/* The bitmask of `axes` over x (all axes when num_axes is 0); repeated axes are an error. */
static tb_status tb__axes_mask(const char *fn, const tb_shape *x, const int32_t *axes,
                               size_t num_axes, int64_t *mask) {
    int64_t seen = 0;
    size_t i;
    tb_status st;
    if (num_axes == 0) {
        *mask = ((int64_t)1 << x->rank) - 1;
        return TB_OK;
    }
    if (axes == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: axes is NULL", fn);
    for (i = 0; i < num_axes; i++) {
        int32_t a;
        if ((st = tb__norm_axis(fn, "axis", axes[i], x->rank, x, &a)) != TB_OK) return st;
        if (((seen >> a) & 1) != 0) {
            tb__shape_buf b;
            return tb__error(TB_ERR_SHAPE, "%s: axis %d appears more than once in the axes of %s",
                             fn, (int)axes[i], tb__st(x, &b));
        }
        seen |= (int64_t)1 << a;
    }
    *mask = x->rank > 0 ? seen : 0;
    return TB_OK;
}

static tb_tensor *tb__reduce(const char *fn, tb_op op, tb_tensor *x, const int32_t *axes,
                             size_t num_axes, bool keepdim) {
    tb__arg arg;
    tb_device device;
    tb_node *in, *node;
    int64_t attrs[2];
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (tb__axes_mask(fn, &arg.shape, axes, num_axes, &attrs[0]) != TB_OK) {
        tb__args_release(&arg, 1);
        return NULL;
    }
    attrs[1] = keepdim ? 1 : 0;
    if ((op == TB_OP_SUM || op == TB_OP_PROD) && !tb_dtype_is_float(arg.shape.dtype)) {
        in = tb__cast_node(fn, arg.node, TB_I64); /* PyTorch accumulates integers in int64 */
    } else {
        in = arg.node;
        tb__node_retain(in);
    }
    tb__args_release(&arg, 1);
    if (in == NULL) return NULL;
    node = tb__record(fn, op, &device, &in, 1, attrs, 2, NULL);
    tb__node_release(in);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_sum(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim) {
    return tb__reduce("tb_sum", TB_OP_SUM, x, axes, num_axes, keepdim);
}
TBDEF tb_tensor *tb_mean(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim) {
    return tb__reduce("tb_mean", TB_OP_MEAN, x, axes, num_axes, keepdim);
}
TBDEF tb_tensor *tb_max(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim) {
    return tb__reduce("tb_max", TB_OP_MAX, x, axes, num_axes, keepdim);
}
TBDEF tb_tensor *tb_min(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim) {
    return tb__reduce("tb_min", TB_OP_MIN, x, axes, num_axes, keepdim);
}
TBDEF tb_tensor *tb_prod(tb_tensor *x, const int32_t *axes, size_t num_axes, bool keepdim) {
    return tb__reduce("tb_prod", TB_OP_PROD, x, axes, num_axes, keepdim);
}

static const int64_t tb__one_dim[1] = {1};

static tb_tensor *tb__arg_reduce(const char *fn, tb_op op, tb_tensor *x, int32_t axis,
                                 bool keepdim) {
    tb__arg arg;
    tb_device device;
    tb_node *in, *node;
    int64_t attrs[2];
    int32_t a;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (tb__need_not_bool(fn, &arg.shape) != TB_OK ||
        tb__norm_axis(fn, "axis", axis, arg.shape.rank, &arg.shape, &a) != TB_OK) {
        tb__args_release(&arg, 1);
        return NULL;
    }
    attrs[0] = a;
    attrs[1] = keepdim ? 1 : 0;
    if (arg.shape.rank == 0) {
        /* the node form has rank >= 1; the result of a rank-0 input is rank 0 either way */
        in = tb__view_node(fn, TB_OP_RESHAPE, arg.node, 1, tb__one_dim);
        attrs[1] = 0;
    } else {
        in = arg.node;
        tb__node_retain(in);
    }
    tb__args_release(&arg, 1);
    if (in == NULL) return NULL;
    node = tb__record(fn, op, &device, &in, 1, attrs, 2, NULL);
    tb__node_release(in);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_argmax(tb_tensor *x, int32_t axis, bool keepdim) {
    return tb__arg_reduce("tb_argmax", TB_OP_ARGMAX, x, axis, keepdim);
}
TBDEF tb_tensor *tb_argmin(tb_tensor *x, int32_t axis, bool keepdim) {
    return tb__arg_reduce("tb_argmin", TB_OP_ARGMIN, x, axis, keepdim);
}

/* ---- matmul, softmax, layer_norm ---- */

TBDEF tb_tensor *tb_matmul(tb_tensor *a, tb_tensor *b) {
    const char *fn = "tb_matmul";
    tb_tensor *tensors[2];
    tb__arg args[2];
    tb_device device;
    tb_shape sa, sb, ba, bb, batch;
    tb__shape_buf ta, tb;
    int64_t adims[TB_MAX_RANK], bdims[TB_MAX_RANK], full[TB_MAX_RANK], outdims[TB_MAX_RANK];
    int32_t ra, rb, r, nb, i, out_rank;
    int64_t n, k, k2, m;
    tb_node *operands[2] = {NULL, NULL}, *node = NULL;
    tb__ensure_setup();
    if (a == NULL) return tb__null_input(fn, "a");
    if (b == NULL) return tb__null_input(fn, "b");
    tensors[0] = a;
    tensors[1] = b;
    if (tb__args_get(fn, tensors, 2, args, &device) != TB_OK) return NULL;
    sa = args[0].shape;
    sb = args[1].shape;
    ra = sa.rank;
    rb = sb.rank;
    if (ra == 0 || rb == 0) {
        tb__error(TB_ERR_SHAPE, "%s: both operands need at least 1 dim, got %s and %s", fn,
                  tb__st(&sa, &ta), tb__st(&sb, &tb));
        goto done;
    }
    if (sa.dtype != sb.dtype) {
        tb__error(TB_ERR_DTYPE, "%s: operands %s and %s have different dtypes", fn,
                  tb__st(&sa, &ta), tb__st(&sb, &tb));
        goto done;
    }
    if (tb__need_not_bool(fn, &sa) != TB_OK) goto done;
    /* a 1-D a is a row [1, k]; a 1-D b is a column [k, 1] */
    k = sa.dims[ra - 1];
    n = ra >= 2 ? sa.dims[ra - 2] : 1;
    k2 = rb >= 2 ? sb.dims[rb - 2] : sb.dims[0];
    m = rb >= 2 ? sb.dims[rb - 1] : 1;
    if (k != k2) {
        tb__error(TB_ERR_SHAPE, "%s: shapes %s and %s do not match (%lld != %lld)", fn,
                  tb__st(&sa, &ta), tb__st(&sb, &tb), (long long)k, (long long)k2);
        goto done;
    }
    memset(&ba, 0, sizeof ba);
    memset(&bb, 0, sizeof bb);
    memset(&batch, 0, sizeof batch);
    ba.rank = ra > 2 ? ra - 2 : 0;
    bb.rank = rb > 2 ? rb - 2 : 0;
    for (i = 0; i < ba.rank; i++)
        ba.dims[i] = sa.dims[i];
    for (i = 0; i < bb.rank; i++)
        bb.dims[i] = sb.dims[i];
    {
        tb_shape pair[2];
        pair[0] = ba;
        pair[1] = bb;
        if (tb__broadcast_dims(fn, pair, 2, &batch) != TB_OK) {
            tb__error(TB_ERR_SHAPE, "%s: the batch dims of %s and %s do not broadcast", fn,
                      tb__st(&sa, &ta), tb__st(&sb, &tb));
            goto done;
        }
    }
    nb = batch.rank;
    r = nb + 2;
    /* a: [1.., n, k] then expanded to [batch.., n, k]; b likewise with [k, m] */
    for (i = 0; i < r; i++)
        adims[i] = 1;
    for (i = 0; i < ba.rank; i++)
        adims[nb - ba.rank + i] = ba.dims[i];
    adims[r - 2] = n;
    adims[r - 1] = k;
    for (i = 0; i < r; i++)
        bdims[i] = 1;
    for (i = 0; i < bb.rank; i++)
        bdims[nb - bb.rank + i] = bb.dims[i];
    bdims[r - 2] = k;
    bdims[r - 1] = m;
    for (i = 0; i < nb; i++)
        full[i] = batch.dims[i];
    full[r - 2] = n;
    full[r - 1] = k;
    operands[0] = tb__view_node(fn, TB_OP_RESHAPE, args[0].node, r, adims);
    operands[0] = tb__view_take(fn, TB_OP_EXPAND, operands[0], r, full);
    if (operands[0] == NULL) goto done;
    full[r - 2] = k;
    full[r - 1] = m;
    operands[1] = tb__view_node(fn, TB_OP_RESHAPE, args[1].node, r, bdims);
    operands[1] = tb__view_take(fn, TB_OP_EXPAND, operands[1], r, full);
    if (operands[1] == NULL) goto done;
    node = tb__record(fn, TB_OP_MATMUL, &device, operands, 2, NULL, 0, NULL);
    /* drop the axes that 1-D operands added */
    out_rank = 0;
    for (i = 0; i < nb; i++)
        outdims[out_rank++] = batch.dims[i];
    if (ra >= 2) outdims[out_rank++] = n;
    if (rb >= 2) outdims[out_rank++] = m;
    if (node != NULL) node = tb__view_take(fn, TB_OP_RESHAPE, node, out_rank, outdims);
done:
    tb__node_release(operands[0]);
    tb__node_release(operands[1]);
    tb__args_release(args, 2);
    return tb__finish(node);
}

static tb_tensor *tb__softmax(const char *fn, tb_op op, tb_tensor *x, int32_t axis) {
    tb__arg arg;
    tb_device device;
    tb_node *in, *node;
    int64_t attr;
    int32_t a;
    bool scalar;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (tb__need_float(fn, &arg.shape) != TB_OK ||
        tb__norm_axis(fn, "axis", axis, arg.shape.rank, &arg.shape, &a) != TB_OK) {
        tb__args_release(&arg, 1);
        return NULL;
    }
    attr = a;
    scalar = arg.shape.rank == 0;
    in = tb__view_node(fn, TB_OP_RESHAPE, arg.node, scalar ? 1 : arg.shape.rank,
                       scalar ? tb__one_dim : arg.shape.dims);
    tb__args_release(&arg, 1);
    if (in == NULL) return NULL;
    node = tb__record(fn, op, &device, &in, 1, &attr, 1, NULL);
    tb__node_release(in);
    if (scalar) node = tb__view_take(fn, TB_OP_RESHAPE, node, 0, NULL);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_softmax(tb_tensor *x, int32_t axis) {
    return tb__softmax("tb_softmax", TB_OP_SOFTMAX, x, axis);
}
TBDEF tb_tensor *tb_log_softmax(tb_tensor *x, int32_t axis) {
    return tb__softmax("tb_log_softmax", TB_OP_LOG_SOFTMAX, x, axis);
}

TBDEF tb_tensor *tb_layer_norm(tb_tensor *x, int32_t normalized_ndim, tb_tensor *weight,
                               tb_tensor *bias, double eps) {
    const char *fn = "tb_layer_norm";
    tb_tensor *tensors[3];
    tb__arg args[3];
    tb_node *operands[3];
    tb_device device;
    int64_t attrs[3];
    double fattrs[2];
    size_t n = 0, i;
    tb_node *node = NULL;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    tensors[n++] = x;
    if (weight != NULL) tensors[n++] = weight;
    if (bias != NULL) tensors[n++] = bias;
    if (tb__args_get(fn, tensors, n, args, &device) != TB_OK) return NULL;
    if (tb__need_float(fn, &args[0].shape) != TB_OK) goto done;
    if (normalized_ndim < 1 || normalized_ndim > args[0].shape.rank) {
        tb__shape_buf b;
        tb__error(TB_ERR_SHAPE, "%s: normalized_ndim %d is out of range for %s (1..%d)", fn,
                  (int)normalized_ndim, tb__st(&args[0].shape, &b), (int)args[0].shape.rank);
        goto done;
    }
    attrs[0] = normalized_ndim;
    attrs[1] = weight != NULL ? 1 : 0;
    attrs[2] = bias != NULL ? 1 : 0;
    fattrs[0] = eps;
    fattrs[1] = 0.0;
    for (i = 0; i < n; i++)
        operands[i] = args[i].node;
    node = tb__record(fn, TB_OP_LAYER_NORM, &device, operands, n, attrs, 3, fattrs);
done:
    tb__args_release(args, n);
    return tb__finish(node);
}

/* ---- movement ---- */

TBDEF tb_tensor *tb_reshape(tb_tensor *x, const int64_t *dims, int32_t rank) {
    const char *fn = "tb_reshape";
    tb__arg arg;
    tb_device device;
    int64_t out[TB_MAX_RANK];
    int64_t numel, known = 1;
    int32_t i, infer = -1;
    tb_node *node = NULL;
    char want[256];
    tb__shape_buf b;
    bool zero_known = false;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (rank < 0 || rank > TB_MAX_RANK) {
        tb__error(TB_ERR_SHAPE, "%s: rank %d is out of range (0..%d)", fn, (int)rank, TB_MAX_RANK);
        return NULL;
    }
    if (rank > 0 && dims == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: dims is NULL", fn);
        return NULL;
    }
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    tb__dims_text(dims, rank, want, sizeof want);
    for (i = 0; i < rank; i++) {
        out[i] = dims[i];
        if (dims[i] == -1 && infer < 0) {
            infer = i;
        } else if (dims[i] < 0) {
            tb__error(TB_ERR_SHAPE, "%s: cannot reshape %s to %s (%s)", fn, tb__st(&arg.shape, &b),
                      want, dims[i] == -1 ? "only one dim may be -1" : "negative dim");
            goto done;
        } else if (dims[i] == 0) {
            zero_known = true;
        } else if (!zero_known) {
            if (!tb__mul_i64(known, dims[i], &known)) {
                tb__error(TB_ERR_OVERFLOW, "%s: the size of %s overflows", fn, want);
                goto done;
            }
        }
    }
    numel = tb__shape_numel(&arg.shape);
    if (infer >= 0) {
        if (zero_known) {
            tb__error(TB_ERR_SHAPE,
                      "%s: cannot reshape %s to %s: the -1 is ambiguous next to a 0 dim", fn,
                      tb__st(&arg.shape, &b), want);
            goto done;
        }
        if (numel % known != 0) {
            tb__error(TB_ERR_SHAPE, "%s: cannot reshape %s (%lld elements) to %s", fn,
                      tb__st(&arg.shape, &b), (long long)numel, want);
            goto done;
        }
        out[infer] = numel / known;
    } else if ((zero_known ? 0 : known) != numel) {
        tb__error(TB_ERR_SHAPE, "%s: cannot reshape %s (%lld elements) to %s", fn,
                  tb__st(&arg.shape, &b), (long long)numel, want);
        goto done;
    }
    node = tb__record(fn, TB_OP_RESHAPE, &device, &arg.node, 1, out, (size_t)rank, NULL);
done:
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

/* A PERMUTE of x by the already normalised `perm`. */
static tb_tensor *tb__permute_arg(const char *fn, tb__arg *arg, const tb_device *device,
                                  const int64_t *perm) {
    tb_node *node =
        tb__record(fn, TB_OP_PERMUTE, device, &arg->node, 1, perm, (size_t)arg->shape.rank, NULL);
    tb__args_release(arg, 1);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_permute(tb_tensor *x, const int32_t *perm, int32_t rank) {
    const char *fn = "tb_permute";
    tb__arg arg;
    tb_device device;
    int64_t p[TB_MAX_RANK];
    int32_t i, seen = 0;
    tb__shape_buf b;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (rank != arg.shape.rank) {
        tb__error(TB_ERR_SHAPE, "%s: a permutation of %d axes for %s", fn, (int)rank,
                  tb__st(&arg.shape, &b));
        tb__args_release(&arg, 1);
        return NULL;
    }
    if (rank > 0 && perm == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: perm is NULL", fn);
        tb__args_release(&arg, 1);
        return NULL;
    }
    for (i = 0; i < rank; i++) {
        int32_t a;
        if (tb__norm_axis(fn, "axis", perm[i], rank, &arg.shape, &a) != TB_OK) {
            tb__args_release(&arg, 1);
            return NULL;
        }
        if (((seen >> a) & 1) != 0) {
            tb__error(TB_ERR_SHAPE, "%s: axis %d appears more than once in the permutation of %s",
                      fn, (int)perm[i], tb__st(&arg.shape, &b));
            tb__args_release(&arg, 1);
            return NULL;
        }
        seen |= 1 << a;
        p[i] = a;
    }
    return tb__permute_arg(fn, &arg, &device, p);
}

TBDEF tb_tensor *tb_transpose(tb_tensor *x, int32_t dim0, int32_t dim1) {
    const char *fn = "tb_transpose";
    tb__arg arg;
    tb_device device;
    int64_t p[TB_MAX_RANK];
    int32_t i, a0, a1;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (tb__norm_axis(fn, "dim0", dim0, arg.shape.rank, &arg.shape, &a0) != TB_OK ||
        tb__norm_axis(fn, "dim1", dim1, arg.shape.rank, &arg.shape, &a1) != TB_OK) {
        tb__args_release(&arg, 1);
        return NULL;
    }
    for (i = 0; i < arg.shape.rank; i++)
        p[i] = i;
    if (arg.shape.rank > 0) {
        p[a0] = a1;
        p[a1] = a0;
    }
    return tb__permute_arg(fn, &arg, &device, p);
}

TBDEF tb_tensor *tb_expand(tb_tensor *x, const int64_t *dims, int32_t rank) {
    const char *fn = "tb_expand";
    tb__arg arg;
    tb_device device;
    int64_t out[TB_MAX_RANK];
    int32_t i, lead;
    tb_node *node = NULL;
    tb__shape_buf b;
    char want[256];
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (rank > 0 && dims == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: dims is NULL", fn);
        return NULL;
    }
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (rank < arg.shape.rank || rank > TB_MAX_RANK) {
        tb__error(TB_ERR_SHAPE, "%s: cannot expand %s to %d dims (%d..%d)", fn,
                  tb__st(&arg.shape, &b), (int)rank, (int)arg.shape.rank, TB_MAX_RANK);
        goto done;
    }
    tb__dims_text(dims, rank, want, sizeof want);
    lead = rank - arg.shape.rank;
    for (i = 0; i < rank; i++) {
        out[i] = dims[i];
        if (dims[i] == -1 && i >= lead) {
            out[i] = arg.shape.dims[i - lead];
        } else if (dims[i] < 0) {
            tb__error(TB_ERR_SHAPE, "%s: cannot expand %s to %s (dim %d: %s)", fn,
                      tb__st(&arg.shape, &b), want, (int)i,
                      dims[i] == -1 ? "-1 is not allowed for a new leading dim" : "negative");
            goto done;
        } else if (i >= lead && arg.shape.dims[i - lead] != 1 &&
                   arg.shape.dims[i - lead] != dims[i]) {
            tb__error(TB_ERR_SHAPE,
                      "%s: cannot expand %s to %s (dim %d: %lld must be 1 or stay %lld)", fn,
                      tb__st(&arg.shape, &b), want, (int)i, (long long)arg.shape.dims[i - lead],
                      (long long)arg.shape.dims[i - lead]);
            goto done;
        }
    }
    node = tb__record(fn, TB_OP_EXPAND, &device, &arg.node, 1, out, (size_t)rank, NULL);
done:
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_squeeze(tb_tensor *x, int32_t dim) {
    const char *fn = "tb_squeeze";
    tb__arg arg;
    tb_device device;
    int64_t out[TB_MAX_RANK];
    int32_t i, d, r = 0;
    tb_node *node = NULL;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (tb__norm_axis(fn, "dim", dim, arg.shape.rank, &arg.shape, &d) != TB_OK) goto done;
    if (arg.shape.rank > 0 && arg.shape.dims[d] != 1) {
        tb__shape_buf b;
        tb__error(TB_ERR_SHAPE, "%s: dim %d of %s has size %lld, not 1", fn, (int)dim,
                  tb__st(&arg.shape, &b), (long long)arg.shape.dims[d]);
        goto done;
    }
    for (i = 0; i < arg.shape.rank; i++) {
        if (i != d) out[r++] = arg.shape.dims[i];
    }
    node = tb__record(fn, TB_OP_RESHAPE, &device, &arg.node, 1, out, (size_t)r, NULL);
done:
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_unsqueeze(tb_tensor *x, int32_t dim) {
    const char *fn = "tb_unsqueeze";
    tb__arg arg;
    tb_device device;
    int64_t out[TB_MAX_RANK];
    int32_t i, d, r = 0;
    tb_node *node = NULL;
    tb__shape_buf b;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (arg.shape.rank >= TB_MAX_RANK) {
        tb__error(TB_ERR_SHAPE, "%s: %s already has the largest rank (%d)", fn,
                  tb__st(&arg.shape, &b), TB_MAX_RANK);
        goto done;
    }
    if (dim < -(arg.shape.rank + 1) || dim > arg.shape.rank) {
        tb__error(TB_ERR_SHAPE, "%s: dim %d is out of range for %s (expected %d..%d)", fn, (int)dim,
                  tb__st(&arg.shape, &b), (int)-(arg.shape.rank + 1), (int)arg.shape.rank);
        goto done;
    }
    d = dim < 0 ? dim + arg.shape.rank + 1 : dim;
    for (i = 0; i <= arg.shape.rank; i++) {
        if (i == d) out[r++] = 1;
        if (i < arg.shape.rank) out[r++] = arg.shape.dims[i];
    }
    node = tb__record(fn, TB_OP_RESHAPE, &device, &arg.node, 1, out, (size_t)r, NULL);
done:
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_slice(tb_tensor *x, int32_t dim, int64_t start, int64_t end, int64_t step) {
    const char *fn = "tb_slice";
    tb__arg arg;
    tb_device device;
    int64_t attrs[4], size;
    int32_t d;
    tb_node *node = NULL;
    tb__shape_buf b;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (arg.shape.rank == 0) {
        tb__error(TB_ERR_SHAPE, "%s: cannot slice a rank-0 tensor %s", fn, tb__st(&arg.shape, &b));
        goto done;
    }
    if (tb__norm_axis(fn, "dim", dim, arg.shape.rank, &arg.shape, &d) != TB_OK) goto done;
    if (step < 1) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: step %lld must be >= 1 (slicing %s)", fn,
                  (long long)step, tb__st(&arg.shape, &b));
        goto done;
    }
    size = arg.shape.dims[d];
    /* Python's rules: negative bounds count from the end, then both are clamped */
    if (start < 0) start = start + size < 0 ? 0 : start + size;
    if (start > size) start = size;
    if (end < 0) end = end + size < 0 ? 0 : end + size;
    if (end > size) end = size;
    if (end < start) end = start;
    attrs[0] = d;
    attrs[1] = start;
    attrs[2] = end;
    attrs[3] = step;
    node = tb__record(fn, TB_OP_SLICE, &device, &arg.node, 1, attrs, 4, NULL);
done:
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_flip(tb_tensor *x, const int32_t *dims, size_t num_dims) {
    const char *fn = "tb_flip";
    tb__arg arg;
    tb_device device;
    int64_t seen = 0, mask;
    size_t i;
    tb_node *node = NULL;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (num_dims > 0 && dims == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: dims is NULL", fn);
        return NULL;
    }
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    for (i = 0; i < num_dims; i++) {
        int32_t a;
        if (tb__norm_axis(fn, "dim", dims[i], arg.shape.rank, &arg.shape, &a) != TB_OK) goto done;
        if (((seen >> a) & 1) != 0) {
            tb__shape_buf b;
            tb__error(TB_ERR_SHAPE, "%s: dim %d appears more than once in the dims of %s", fn,
                      (int)dims[i], tb__st(&arg.shape, &b));
            goto done;
        }
        seen |= (int64_t)1 << a;
    }
    mask = arg.shape.rank > 0 ? seen : 0;
    node = tb__record(fn, TB_OP_FLIP, &device, &arg.node, 1, &mask, 1, NULL);
done:
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

/* ---- copies ---- */

TBDEF tb_tensor *tb_concat(tb_tensor *const *tensors, size_t count, int32_t dim) {
    const char *fn = "tb_concat";
    tb__arg *args = NULL;
    tb_node **operands = NULL;
    tb_device device;
    size_t i, n = 0, ref;
    bool any_kept = false;
    tb_dtype t;
    int32_t d, j;
    int64_t attr;
    tb_node *node = NULL;
    tb__ensure_setup();
    if (tensors == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: tensors is NULL", fn);
        return NULL;
    }
    if (count == 0) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: no tensors to concatenate (count 0)", fn);
        return NULL;
    }
    for (i = 0; i < count; i++) {
        if (tensors[i] == NULL) {
            char what[48];
            snprintf(what, sizeof what, "tensors[%zu]", i);
            return tb__null_input(fn, what);
        }
    }
    args = (tb__arg *)tb__calloc(count, sizeof *args);
    operands = (tb_node **)tb__calloc(count, sizeof *operands);
    if (args == NULL || operands == NULL) goto fail_alloc;
    if (tb__args_get(fn, tensors, count, args, &device) != TB_OK) goto fail_alloc;
    t = args[0].shape.dtype;
    for (i = 0; i < count; i++) {
        tb__shape_buf b;
        if (args[i].shape.rank == 0) {
            tb__error(TB_ERR_SHAPE, "%s: tensors[%zu] %s has rank 0 and cannot be concatenated", fn,
                      i, tb__st(&args[i].shape, &b));
            goto done;
        }
        t = tb_dtype_promote(t, args[i].shape.dtype);
    }
    /* PyTorch skips 1-D empty tensors whatever the other shapes are (legacy behaviour) */
    for (i = 0; i < count; i++) {
        if (!(args[i].shape.rank == 1 && args[i].shape.dims[0] == 0)) any_kept = true;
    }
    ref = 0;
    for (i = 0; i < count && any_kept; i++) {
        if (!(args[i].shape.rank == 1 && args[i].shape.dims[0] == 0)) {
            ref = i;
            break;
        }
    }
    if (tb__norm_axis(fn, "dim", dim, args[ref].shape.rank, &args[ref].shape, &d) != TB_OK) {
        goto done;
    }
    for (i = 0; i < count; i++) {
        const tb_shape *s = &args[i].shape, *r0 = &args[ref].shape;
        bool ok = s->rank == r0->rank;
        if (any_kept && s->rank == 1 && s->dims[0] == 0) continue;
        for (j = 0; ok && j < s->rank; j++)
            ok = j == d || s->dims[j] == r0->dims[j];
        if (!ok) {
            tb__shape_buf a, b;
            tb__error(TB_ERR_SHAPE,
                      "%s: shapes %s (tensors[%zu]) and %s (tensors[%zu]) differ outside dim %d",
                      fn, tb__st(r0, &a), ref, tb__st(s, &b), i, (int)d);
            goto done;
        }
        operands[n] = tb__cast_node(fn, args[i].node, t);
        if (operands[n] == NULL) goto done;
        n++;
    }
    attr = d;
    node = tb__record(fn, TB_OP_CONCAT, &device, operands, n, &attr, 1, NULL);
done:
    for (i = 0; i < n; i++)
        tb__node_release(operands[i]);
    tb__args_release(args, count);
    tb__free(operands);
    tb__free(args);
    return tb__finish(node);
fail_alloc:
    tb__free(operands);
    tb__free(args);
    return NULL;
}

TBDEF tb_tensor *tb_pad(tb_tensor *x, const int64_t *pads, size_t num_pads, double value) {
    const char *fn = "tb_pad";
    tb__arg arg;
    tb_device device;
    int64_t attrs[2 * TB_MAX_RANK];
    tb_node *operands[2] = {NULL, NULL}, *node = NULL;
    tb_scalar s;
    tb__shape_buf b;
    size_t i;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (num_pads > 0 && pads == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: pads is NULL", fn);
        return NULL;
    }
    if (tb__args_get(fn, &x, 1, &arg, &device) != TB_OK) return NULL;
    if (num_pads % 2 != 0) {
        tb__error(TB_ERR_INVALID_ARGUMENT,
                  "%s: %zu pad values for %s; a (before, after) pair "
                  "per dim is needed",
                  fn, num_pads, tb__st(&arg.shape, &b));
        goto done;
    }
    if (num_pads / 2 > (size_t)arg.shape.rank) {
        tb__error(TB_ERR_SHAPE, "%s: %zu pad values pad %zu dims but %s has rank %d", fn, num_pads,
                  num_pads / 2, tb__st(&arg.shape, &b), (int)arg.shape.rank);
        goto done;
    }
    memset(attrs, 0, sizeof attrs);
    for (i = 0; i < num_pads; i++) {
        /* pads run from the last dim backwards, as F.pad; attrs run from dim 0 */
        size_t axis = (size_t)arg.shape.rank - 1 - i / 2;
        if (pads[i] < 0) {
            tb__error(TB_ERR_INVALID_ARGUMENT, "%s: pad value %zu is negative (%lld) for %s", fn, i,
                      (long long)pads[i], tb__st(&arg.shape, &b));
            goto done;
        }
        attrs[2 * axis + i % 2] = pads[i];
    }
    if (tb__scalar_from_double(fn, value, arg.shape.dtype, &s) != TB_OK) goto done;
    operands[0] = arg.node;
    operands[1] = tb__wrapped_scalar(fn, s, &device);
    if (operands[1] == NULL) goto done;
    node = tb__record(fn, TB_OP_PAD, &device, operands, 2, attrs, 2 * (size_t)arg.shape.rank, NULL);
done:
    tb__node_release(operands[1]);
    tb__args_release(&arg, 1);
    return tb__finish(node);
}

/* GATHER or INDEX_SELECT; rank-0 operands are viewed as [1] (the node form) and the result
   reshaped back, as PyTorch treats them. */
static tb_tensor *tb__gather(const char *fn, tb_op op, tb_tensor *x, int32_t dim,
                             tb_tensor *index) {
    tb_tensor *tensors[2];
    tb__arg args[2];
    tb_device device;
    tb_node *operands[2] = {NULL, NULL}, *node = NULL;
    tb_shape *sx, *si;
    tb__shape_buf a, b;
    int64_t attr;
    int32_t d, out_rank = -1;
    tb__ensure_setup();
    if (x == NULL) return tb__null_input(fn, "x");
    if (index == NULL) return tb__null_input(fn, "index");
    tensors[0] = x;
    tensors[1] = index;
    if (tb__args_get(fn, tensors, 2, args, &device) != TB_OK) return NULL;
    sx = &args[0].shape;
    si = &args[1].shape;
    if (tb__need_index(fn, si) != TB_OK) goto done;
    if (tb__norm_axis(fn, "dim", dim, sx->rank, sx, &d) != TB_OK) goto done;
    if (op == TB_OP_GATHER) {
        int32_t rx = sx->rank > 0 ? sx->rank : 1, ri = si->rank > 0 ? si->rank : 1;
        if (rx != ri) {
            tb__error(TB_ERR_SHAPE, "%s: index %s must have the rank of %s", fn, tb__st(si, &b),
                      tb__st(sx, &a));
            goto done;
        }
        if (si->rank == 0) out_rank = 0;
    } else {
        if (si->rank > 1) {
            tb__error(TB_ERR_SHAPE, "%s: index must be 1-D, got %s", fn, tb__st(si, &b));
            goto done;
        }
        if (sx->rank == 0) {
            if (si->rank == 1 && si->dims[0] != 1) {
                tb__error(TB_ERR_SHAPE, "%s: index %s for the rank-0 %s must have one element", fn,
                          tb__st(si, &b), tb__st(sx, &a));
                goto done;
            }
            out_rank = 0;
        }
    }
    operands[0] = tb__view_node(fn, TB_OP_RESHAPE, args[0].node, sx->rank > 0 ? sx->rank : 1,
                                sx->rank > 0 ? sx->dims : tb__one_dim);
    if (operands[0] == NULL) goto done;
    operands[1] = tb__view_node(fn, TB_OP_RESHAPE, args[1].node, si->rank > 0 ? si->rank : 1,
                                si->rank > 0 ? si->dims : tb__one_dim);
    if (operands[1] == NULL) goto done;
    attr = d;
    node = tb__record(fn, op, &device, operands, 2, &attr, 1, NULL);
    if (out_rank == 0) node = tb__view_take(fn, TB_OP_RESHAPE, node, 0, NULL);
done:
    tb__node_release(operands[0]);
    tb__node_release(operands[1]);
    tb__args_release(args, 2);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_gather(tb_tensor *x, int32_t dim, tb_tensor *index) {
    return tb__gather("tb_gather", TB_OP_GATHER, x, dim, index);
}
TBDEF tb_tensor *tb_index_select(tb_tensor *x, int32_t dim, tb_tensor *index) {
    return tb__gather("tb_index_select", TB_OP_INDEX_SELECT, x, dim, index);
}

/* ---- any op by id ---- */

TBDEF tb_tensor *tb_call_op(tb_op op, tb_tensor *const *inputs, size_t num_inputs,
                            const int64_t *attrs, size_t num_attrs) {
    char fn[TB_MAX_NAME + 16];
    const char *name;
    tb__arg *args;
    tb_node **operands;
    tb_device device;
    tb_node *node = NULL;
    size_t i;
    tb__ensure_setup();
    name = tb_op_name(op);
    if (name == NULL) {
        tb__error(TB_ERR_NOT_FOUND, "tb_call_op: unknown op %d", (int)op);
        return NULL;
    }
    snprintf(fn, sizeof fn, "tb_call_op(%s)", name);
    if (op < (tb_op)TB_OP_BUILTIN_COUNT && tb_op_get_kind(op) == TB_KIND_LEAF) {
        tb__error(TB_ERR_UNSUPPORTED, "%s: a leaf op is created by its own function", fn);
        return NULL;
    }
    if (num_inputs == 0 || inputs == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: no inputs (inputs %s, num_inputs %zu)", fn,
                  inputs == NULL ? "NULL" : "given", num_inputs);
        return NULL;
    }
    if (num_attrs > TB_MAX_ATTRS) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %zu attributes (at most %d)", fn, num_attrs,
                  TB_MAX_ATTRS);
        return NULL;
    }
    if (num_attrs > 0 && attrs == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: attrs is NULL", fn);
        return NULL;
    }
    for (i = 0; i < num_inputs; i++) {
        if (inputs[i] == NULL) {
            char what[48];
            snprintf(what, sizeof what, "inputs[%zu]", i);
            return tb__null_input(fn, what);
        }
    }
    args = (tb__arg *)tb__calloc(num_inputs, sizeof *args);
    operands = (tb_node **)tb__calloc(num_inputs, sizeof *operands);
    if (args != NULL && operands != NULL &&
        tb__args_get(fn, inputs, num_inputs, args, &device) == TB_OK) {
        for (i = 0; i < num_inputs; i++)
            operands[i] = args[i].node;
        node = tb__record(fn, op, &device, operands, num_inputs, attrs, num_attrs, NULL);
        tb__args_release(args, num_inputs);
    }
    tb__free(operands);
    tb__free(args);
    return tb__finish(node);
}

/* ---- creation ---- */

/* A new leaf node on `device`, announced, as a tensor. */
static tb_tensor *tb__leaf_tensor(const char *fn, tb_node *node) {
    if (node != NULL && tb__announce(fn, node) != TB_OK) {
        tb__node_release(node);
        node = NULL;
    }
    return tb__finish(node);
}

TBDEF tb_tensor *tb_scalar_tensor(tb_scalar value, const tb_device *device) {
    const char *fn = "tb_scalar_tensor";
    tb_device dev;
    tb__ensure_setup();
    if (!tb_dtype_is_valid(value.dtype)) {
        tb__error(TB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)value.dtype);
        return NULL;
    }
    if (tb_dtype_is_float(value.dtype)) {
        value = tb__float_scalar(value.dtype, value.f);
    } else if (value.dtype == TB_BOOL) {
        value.i = value.i != 0 ? 1 : 0;
        value.f = (double)value.i;
    } else {
        bool fits = value.dtype == TB_I64 ||
                    (value.dtype == TB_I32 && value.i >= INT32_MIN && value.i <= INT32_MAX) ||
                    (value.dtype == TB_U8 && value.i >= 0 && value.i <= 255);
        if (!fits) {
            tb__error(TB_ERR_INVALID_ARGUMENT, "%s: value %lld does not fit in %s", fn,
                      (long long)value.i, tb_dtype_name(value.dtype));
            return NULL;
        }
        value.f = (double)value.i;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    return tb__leaf_tensor(fn, tb__node_scalar(value, &dev, false));
}

/* A SCALAR of the shape's dtype viewed as [1,...,1] and expanded: one parameter, no data. */
static tb_tensor *tb__full(const char *fn, const tb_shape *shape, double value,
                           const tb_device *device) {
    tb_scalar s;
    tb_device dev;
    tb_node *node;
    int64_t ones[TB_MAX_RANK];
    int32_t i;
    tb__ensure_setup();
    if (tb__check_user_shape(fn, shape) != TB_OK) return NULL;
    if (tb__scalar_from_double(fn, value, shape->dtype, &s) != TB_OK) return NULL;
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    node = tb__node_scalar(s, &dev, false);
    if (node != NULL && tb__announce(fn, node) != TB_OK) {
        tb__node_release(node);
        node = NULL;
    }
    if (node != NULL && shape->rank > 0) {
        for (i = 0; i < shape->rank; i++)
            ones[i] = 1;
        node = tb__view_take(fn, TB_OP_RESHAPE, node, shape->rank, ones);
        node = tb__view_take(fn, TB_OP_EXPAND, node, shape->rank, shape->dims);
    }
    return tb__finish(node);
}

TBDEF tb_tensor *tb_full(const tb_shape *shape, double value, const tb_device *device) {
    return tb__full("tb_full", shape, value, device);
}
TBDEF tb_tensor *tb_zeros(const tb_shape *shape, const tb_device *device) {
    return tb__full("tb_zeros", shape, 0.0, device);
}
TBDEF tb_tensor *tb_ones(const tb_shape *shape, const tb_device *device) {
    return tb__full("tb_ones", shape, 1.0, device);
}

TBDEF tb_tensor *tb_arange(double start, double end, double step, tb_dtype dtype,
                           const tb_device *device) {
    const char *fn = "tb_arange";
    tb_shape shape;
    tb_device dev;
    double size, fattrs[2];
    tb__ensure_setup();
    if (!tb_dtype_is_valid(dtype) || dtype == TB_BOOL) {
        tb__error(TB_ERR_DTYPE, "%s: dtype %s is not supported (a number dtype is needed)", fn,
                  tb_dtype_name(dtype));
        return NULL;
    }
    if (!tb__is_finite(start) || !tb__is_finite(end) || !tb__is_finite(step)) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: start %g, end %g and step %g must be finite", fn,
                  start, end, step);
        return NULL;
    }
    if (!tb_dtype_is_float(dtype)) {
        if (fabs(start) >= 9223372036854775808.0 || fabs(end) >= 9223372036854775808.0 ||
            fabs(step) >= 9223372036854775808.0) {
            tb__error(TB_ERR_OVERFLOW, "%s: start %g, end %g or step %g does not fit in int64", fn,
                      start, end, step);
            return NULL;
        }
        /* integer ranges run on whole numbers, as PyTorch's int64 arange */
        start = start < 0 ? ceil(start) : floor(start);
        end = end < 0 ? ceil(end) : floor(end);
        step = step < 0 ? ceil(step) : floor(step);
    }
    if (step == 0.0) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: step must be nonzero (start %g, end %g)", fn, start,
                  end);
        return NULL;
    }
    if ((step > 0 && end < start) || (step < 0 && end > start)) {
        tb__error(TB_ERR_INVALID_ARGUMENT,
                  "%s: end %g lies on the wrong side of start %g for step %g", fn, end, start,
                  step);
        return NULL;
    }
    size = ceil((end - start) / step);
    if (!(size >= 0.0 && size < 9223372036854775808.0)) {
        tb__error(TB_ERR_OVERFLOW, "%s: [%g, %g) by %g has too many elements", fn, start, end,
                  step);
        return NULL;
    }
    memset(&shape, 0, sizeof shape);
    shape.dtype = dtype;
    shape.rank = 1;
    shape.dims[0] = (int64_t)size;
    if (tb__check_fits(fn, &shape) != TB_OK) return NULL;
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    fattrs[0] = start;
    fattrs[1] = step;
    return tb__finish(tb__emit(fn, TB_OP_ARANGE, &shape, &dev, NULL, 0, NULL, 0, fattrs));
}

TBDEF tb_tensor *tb_eye(int64_t n, int64_t m, tb_dtype dtype, const tb_device *device) {
    const char *fn = "tb_eye";
    tb_shape shape;
    tb_device dev;
    tb__ensure_setup();
    if (!tb_dtype_is_valid(dtype)) {
        tb__error(TB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)dtype);
        return NULL;
    }
    if (n < 0) {
        tb__error(TB_ERR_SHAPE, "%s: n must be >= 0, got %lld", fn, (long long)n);
        return NULL;
    }
    if (m < 0) m = n;
    memset(&shape, 0, sizeof shape);
    shape.dtype = dtype;
    shape.rank = 2;
    shape.dims[0] = n;
    shape.dims[1] = m;
    if (tb__check_fits(fn, &shape) != TB_OK) return NULL;
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    return tb__finish(tb__emit(fn, TB_OP_EYE, &shape, &dev, NULL, 0, NULL, 0, NULL));
}

/* The uint64 bits as an int64 (two's complement), without implementation-defined casts. */
static int64_t tb__u64_bits(uint64_t v) {
    if (v <= (uint64_t)INT64_MAX) return (int64_t)v;
    return -(int64_t)(~v) - 1;
}

static tb_node *tb__i64_scalar_node(const char *fn, uint64_t bits, const tb_device *device) {
    tb_scalar s;
    tb_node *node;
    memset(&s, 0, sizeof s);
    s.dtype = TB_I64;
    s.i = tb__u64_bits(bits);
    s.f = (double)s.i;
    node = tb__node_scalar(s, device, false);
    if (node != NULL && tb__announce(fn, node) != TB_OK) {
        tb__node_release(node);
        node = NULL;
    }
    return node;
}

static tb_tensor *tb__random(const char *fn, tb_op op, const tb_shape *shape,
                             const tb_device *device) {
    tb_device dev;
    tb_node *operands[2] = {NULL, NULL}, *node = NULL;
    uint64_t seed = 0, offset = 0, numel = 1;
    int32_t i;
    tb__ensure_setup();
    if (tb__check_user_shape(fn, shape) != TB_OK) return NULL;
    if (!tb_dtype_is_float(shape->dtype)) {
        tb__shape_buf b;
        tb__error(TB_ERR_DTYPE, "%s: %s is not a float shape (f32 or f64)", fn, tb__st(shape, &b));
        return NULL;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    for (i = 0; i < shape->rank; i++)
        numel *= (uint64_t)shape->dims[i]; /* fits: checked */
    tb__rng_reserve(numel, &seed, &offset);
    operands[0] = tb__i64_scalar_node(fn, seed, &dev);
    operands[1] = operands[0] != NULL ? tb__i64_scalar_node(fn, offset, &dev) : NULL;
    if (operands[1] != NULL) node = tb__emit(fn, op, shape, &dev, operands, 2, NULL, 0, NULL);
    tb__node_release(operands[0]);
    tb__node_release(operands[1]);
    return tb__finish(node);
}

TBDEF tb_tensor *tb_rand(const tb_shape *shape, const tb_device *device) {
    return tb__random("tb_rand", TB_OP_RAND, shape, device);
}
TBDEF tb_tensor *tb_randn(const tb_shape *shape, const tb_device *device) {
    return tb__random("tb_randn", TB_OP_RANDN, shape, device);
}

/* ---- src/reference.c ---- */
/* ===========================================================================================
   Reference interpreter: every op in plain C on host arrays. The cpu backend executes graphs
   with it, the executor runs eager fallbacks with it and TB_CHECK compares against it.
   Values are views (a refcounted buffer, an element offset and element strides), so movement
   ops never copy; kernels walk strided views with one N-d iterator.
   =========================================================================================== */

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

/* ---- buffers and views ---- */

static void tb__ref_pool_drain(tb__ref_pool *pool) {
    uint32_t i;
    for (i = 0; i < pool->count; i++)
        tb__free(pool->data[i]);
    pool->count = 0;
}

/* A pooled block of at least `nbytes` and not more than twice that, or NULL. */
static char *tb__ref_pool_take(size_t nbytes, size_t *cap) {
    tb__ref_pool *pool = tb__ref_current_pool;
    uint32_t i, best = UINT32_MAX;
    char *data;
    if (!pool || nbytes < TB__REF_POOL_MIN) return NULL;
    for (i = 0; i < pool->count; i++)
        if (pool->cap[i] >= nbytes && pool->cap[i] / 2u <= nbytes &&
            (best == UINT32_MAX || pool->cap[i] < pool->cap[best]))
            best = i;
    if (best == UINT32_MAX) return NULL;
    data = pool->data[best];
    *cap = pool->cap[best];
    pool->count--;
    pool->data[best] = pool->data[pool->count];
    pool->cap[best] = pool->cap[pool->count];
    return data;
}

static void tb__ref_pool_give(char *data, size_t cap) {
    tb__ref_pool *pool = tb__ref_current_pool;
    if (!pool || cap < TB__REF_POOL_MIN) {
        tb__free(data);
        return;
    }
    if (pool->count == TB__REF_POOL_SLOTS) {
        /* full: the oldest block goes */
        tb__free(pool->data[0]);
        memmove(pool->data, pool->data + 1, (TB__REF_POOL_SLOTS - 1) * sizeof(char *));
        memmove(pool->cap, pool->cap + 1, (TB__REF_POOL_SLOTS - 1) * sizeof(size_t));
        pool->count--;
    }
    pool->data[pool->count] = data;
    pool->cap[pool->count] = cap;
    pool->count++;
}

static tb__rbuf *tb__rbuf_new(size_t nbytes) {
    tb__rbuf *b = (tb__rbuf *)tb__alloc(sizeof(tb__rbuf));
    if (!b) return NULL;
    /* one byte at least: empty tensors still get a valid pointer */
    if (nbytes == 0) nbytes = 1;
    b->data = tb__ref_pool_take(nbytes, &b->cap);
    if (!b->data) {
        b->data = (char *)tb__alloc(nbytes);
        b->cap = nbytes;
    }
    if (!b->data) {
        tb__free(b);
        return NULL;
    }
    b->refs = 1;
    b->owned = true;
    return b;
}

static tb__rbuf *tb__rbuf_borrow(const void *data) {
    tb__rbuf *b = (tb__rbuf *)tb__alloc(sizeof(tb__rbuf));
    if (!b) return NULL;
    b->data = (char *)data;
    b->cap = 0;
    b->refs = 1;
    b->owned = false;
    return b;
}

static void tb__rbuf_release(tb__rbuf *b) {
    if (!b) return;
    if (--b->refs == 0) {
        if (b->owned) tb__ref_pool_give(b->data, b->cap);
        tb__free(b);
    }
}

static void tb__rview_clear(tb__rview *v) {
    tb__rbuf_release(v->buf);
    v->buf = NULL;
}

static int64_t tb__ref_esize(tb_dtype dtype) {
    return (int64_t)tb_dtype_size(dtype);
}

/* Element count of a validated shape (fits in int64: the size rule of shapes). */
static int64_t tb__ref_numel(const tb_shape *s) {
    return tb__shape_numel(s);
}

/* Row-major strides (a 0 dim counts as 1). They fit for every valid shape, empty ones included
   (the size rule of shapes); a broken shape saturates instead of overflowing. */
static void tb__ref_contig_strides(const tb_shape *s, int64_t *strides) {
    int64_t acc = 1;
    int32_t d;
    for (d = s->rank - 1; d >= 0; d--) {
        strides[d] = acc;
        if (s->dims[d] > 1 && !tb__mul_i64(acc, s->dims[d], &acc)) acc = INT64_MAX;
    }
}

static tb_status tb__ref_nbytes(const tb_shape *shape, size_t *out) {
    tb_status st = tb_shape_nbytes(shape, out);
    if (st != TB_OK) {
        char text[96];
        tb__shape_text(shape, text);
        return tb__error(TB_ERR_OVERFLOW, "reference: the size of %s does not fit in memory", text);
    }
    return TB_OK;
}

/* A new contiguous view of `shape` over a fresh buffer. */
static tb_status tb__rview_alloc(tb__rview *v, const tb_shape *shape) {
    size_t nbytes = 0;
    tb_status st = tb__ref_nbytes(shape, &nbytes);
    if (st != TB_OK) return st;
    memset(v, 0, sizeof(*v));
    v->buf = tb__rbuf_new(nbytes);
    if (!v->buf) return TB_ERR_OUT_OF_MEMORY;
    v->shape = *shape;
    v->offset = 0;
    tb__ref_contig_strides(shape, v->strides);
    return TB_OK;
}

/* A contiguous view over a caller's array (not copied). */
static tb_status tb__rview_borrow(tb__rview *v, const tb_shape *shape, const void *data) {
    memset(v, 0, sizeof(*v));
    if (!data) {
        char text[96];
        tb__shape_text(shape, text);
        return tb__error(TB_ERR_INTERNAL, "reference: no host array for a value of %s", text);
    }
    v->buf = tb__rbuf_borrow(data);
    if (!v->buf) return TB_ERR_OUT_OF_MEMORY;
    v->shape = *shape;
    tb__ref_contig_strides(shape, v->strides);
    return TB_OK;
}

static void tb__rview_share(tb__rview *dst, const tb__rview *src) {
    *dst = *src;
    dst->buf->refs++;
}

static char *tb__rview_ptr(const tb__rview *v) {
    return v->buf->data + v->offset * tb__ref_esize(v->shape.dtype);
}

/* Whether the elements lie in row-major order from the offset on (size-1 axes do not count). */
static bool tb__rview_is_contig(const tb__rview *v) {
    int64_t expect = 1;
    int32_t d;
    if (tb__ref_numel(&v->shape) == 0) return true;
    for (d = v->shape.rank - 1; d >= 0; d--) {
        if (v->shape.dims[d] == 1) continue;
        if (v->strides[d] != expect) return false;
        expect *= v->shape.dims[d];
    }
    return true;
}

/* ---- scalar conversions (defined for every input: no UB on NaN or out-of-range values) ---- */

/* Truncation toward zero, saturating at the int64 range; NaN gives 0. */
static int64_t tb__ref_f2i(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775808.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

static double tb__ld_f(tb_dtype dt, const char *p) {
    switch (dt) {
    case TB_F32:
        return (double)*(const float *)p;
    case TB_F64:
        return *(const double *)p;
    case TB_I32:
        return (double)*(const int32_t *)p;
    case TB_I64:
        return (double)*(const int64_t *)p;
    case TB_U8:
        return (double)*(const uint8_t *)p;
    case TB_BOOL:
        return *(const uint8_t *)p ? 1.0 : 0.0;
    default:
        return 0.0;
    }
}

static int64_t tb__ld_i(tb_dtype dt, const char *p) {
    switch (dt) {
    case TB_F32:
        return tb__ref_f2i((double)*(const float *)p);
    case TB_F64:
        return tb__ref_f2i(*(const double *)p);
    case TB_I32:
        return (int64_t)(*(const int32_t *)p);
    case TB_I64:
        return *(const int64_t *)p;
    case TB_U8:
        return (int64_t)(*(const uint8_t *)p);
    case TB_BOOL:
        return *(const uint8_t *)p ? 1 : 0;
    default:
        return 0;
    }
}

/* Truth value as PyTorch's bool(): nonzero (NaN included) is true. */
static bool tb__ld_b(tb_dtype dt, const char *p) {
    switch (dt) {
    case TB_F32:
        return *(const float *)p != 0.0f;
    case TB_F64:
        return *(const double *)p != 0.0;
    case TB_I32:
        return *(const int32_t *)p != 0;
    case TB_I64:
        return *(const int64_t *)p != 0;
    default:
        return *(const uint8_t *)p != 0;
    }
}

static void tb__st_f(tb_dtype dt, char *p, double v) {
    switch (dt) {
    case TB_F32:
        *(float *)p = (float)v;
        break;
    case TB_F64:
        *(double *)p = v;
        break;
    case TB_I32:
        *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)tb__ref_f2i(v);
        break;
    case TB_I64:
        *(int64_t *)p = tb__ref_f2i(v);
        break;
    case TB_U8:
        *(uint8_t *)p = (uint8_t)(uint64_t)tb__ref_f2i(v);
        break;
    case TB_BOOL:
        *(uint8_t *)p = (uint8_t)(v != 0.0);
        break;
    default:
        break;
    }
}

static void tb__st_i(tb_dtype dt, char *p, int64_t v) {
    switch (dt) {
    case TB_F32:
        *(float *)p = (float)v;
        break;
    case TB_F64:
        *(double *)p = (double)v;
        break;
    case TB_I32:
        *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)v;
        break;
    case TB_I64:
        *(int64_t *)p = v;
        break;
    case TB_U8:
        *(uint8_t *)p = (uint8_t)(uint64_t)v;
        break;
    case TB_BOOL:
        *(uint8_t *)p = (uint8_t)(v != 0);
        break;
    default:
        break;
    }
}

/* One element of dtype `sd` at `a` converted to `dd` at `o` (CAST's rules). */
static void tb__ref_convert(tb_dtype dd, char *o, tb_dtype sd, const char *a) {
    if (tb_dtype_is_float(sd))
        tb__st_f(dd, o, tb__ld_f(sd, a));
    else
        tb__st_i(dd, o, tb__ld_i(sd, a));
}

/* ---- the strided N-d iterator ----
   Operand 0 is usually the output. Every operand has strides over the same dims (0 where it is
   broadcast). Axes of size 1 are dropped and adjacent axes that are contiguous for every operand
   are merged, so contiguous work becomes one long run. */

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

static void tb__iter_begin(tb__iter *it, int32_t rank, const int64_t *dims) {
    memset(it, 0, sizeof(*it));
    it->rank = rank;
    if (rank > 0) memcpy(it->dims, dims, (size_t)rank * sizeof(int64_t));
}

static void tb__iter_add(tb__iter *it, char *base, int64_t offset, const int64_t *strides,
                         int64_t esize) {
    int32_t k = it->nops++;
    it->base[k] = base;
    it->offset[k] = offset;
    it->esize[k] = esize;
    if (it->rank > 0) memcpy(it->strides[k], strides, (size_t)it->rank * sizeof(int64_t));
}

/* A malformed node: a bug in the layer that built the graph, not the user's doing. */
static tb_status tb__ref_malformed(const tb_node *node, const tb_shape *operand) {
    char a[96], b[96];
    const char *name = tb_op_name(node->op);
    tb__shape_text(operand, a);
    tb__shape_text(&node->shape, b);
    return tb__error(TB_ERR_INTERNAL, "reference: malformed %s node (operand %s, output %s)",
                     name ? name : "custom", a, b);
}

/* Adds a view, broadcasting it (NumPy rules, aligned at the last axis) to the iterator's dims. */
static tb_status tb__iter_add_view(tb__iter *it, const tb__rview *v) {
    int64_t strides[TB_MAX_RANK];
    int32_t d, shift = it->rank - v->shape.rank;
    bool ok = shift >= 0;
    for (d = 0; d < it->rank && ok; d++) {
        int32_t j = d - shift;
        if (j < 0 || v->shape.dims[j] == 1)
            strides[d] = 0;
        else if (v->shape.dims[j] == it->dims[d])
            strides[d] = v->strides[j];
        else
            ok = false;
    }
    if (!ok) {
        char a[96], b[96];
        tb_shape s = v->shape;
        tb__shape_text(&s, a);
        s.rank = it->rank;
        if (it->rank > 0) memcpy(s.dims, it->dims, (size_t)it->rank * sizeof(int64_t));
        tb__shape_text(&s, b);
        return tb__error(TB_ERR_INTERNAL, "reference: operand %s does not broadcast to %s", a, b);
    }
    tb__iter_add(it, v->buf->data, v->offset, strides, tb__ref_esize(v->shape.dtype));
    return TB_OK;
}

static tb_status tb__iter_run(tb__iter *it, tb__run_fn fn, void *ctx) {
    int64_t dims[TB_MAX_RANK], strides[TB__REF_MAX_OPS][TB_MAX_RANK];
    int64_t idx[TB_MAX_RANK], off[TB__REF_MAX_OPS], inner[TB__REF_MAX_OPS];
    char *ptrs[TB__REF_MAX_OPS];
    int32_t r = 0, d, k, nops = it->nops;
    for (d = 0; d < it->rank; d++)
        if (it->dims[d] == 0) return TB_OK;
    for (d = 0; d < it->rank; d++) {
        bool merge = r > 0;
        if (it->dims[d] == 1) continue;
        for (k = 0; k < nops && merge; k++) {
            int64_t span;
            merge = tb__mul_i64(it->strides[k][d], it->dims[d], &span) && strides[k][r - 1] == span;
        }
        if (merge) {
            dims[r - 1] *= it->dims[d];
            for (k = 0; k < nops; k++)
                strides[k][r - 1] = it->strides[k][d];
        } else {
            dims[r] = it->dims[d];
            for (k = 0; k < nops; k++)
                strides[k][r] = it->strides[k][d];
            r++;
        }
    }
    if (r == 0) {
        dims[0] = 1;
        for (k = 0; k < nops; k++)
            strides[k][0] = 0;
        r = 1;
    }
    for (k = 0; k < nops; k++) {
        off[k] = it->offset[k];
        inner[k] = strides[k][r - 1];
    }
    memset(idx, 0, sizeof(idx));
    for (;;) {
        tb_status st;
        for (k = 0; k < nops; k++)
            ptrs[k] = it->base[k] + off[k] * it->esize[k];
        st = fn(ctx, dims[r - 1], ptrs, inner);
        if (st != TB_OK) return st;
        for (d = r - 2; d >= 0; d--) {
            idx[d]++;
            for (k = 0; k < nops; k++)
                off[k] += strides[k][d];
            if (idx[d] < dims[d]) break;
            for (k = 0; k < nops; k++)
                off[k] -= strides[k][d] * dims[d];
            idx[d] = 0;
        }
        if (d < 0) break;
    }
    return TB_OK;
}

/* ---- copies ---- */

static tb_status tb__ref_copy_run(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    int64_t es = *(const int64_t *)ctx, i;
    if (s[0] == 1 && s[1] == 1) {
        memcpy(p[0], p[1], (size_t)(n * es));
        return TB_OK;
    }
    /* fixed-size memcpy compiles to one load and store, without breaking aliasing rules */
    switch (es) {
    case 1:
        for (i = 0; i < n; i++)
            p[0][i * s[0]] = p[1][i * s[1]];
        break;
    case 4:
        for (i = 0; i < n; i++)
            memcpy(p[0] + i * s[0] * 4, p[1] + i * s[1] * 4, 4);
        break;
    case 8:
        for (i = 0; i < n; i++)
            memcpy(p[0] + i * s[0] * 8, p[1] + i * s[1] * 8, 8);
        break;
    default:
        for (i = 0; i < n; i++)
            memcpy(p[0] + i * s[0] * es, p[1] + i * s[1] * es, (size_t)es);
        break;
    }
    return TB_OK;
}

typedef struct tb__conv_ctx {
    tb_dtype sd, dd;
} tb__conv_ctx;

#define TB__TOI_FLOAT(x) tb__ref_f2i((double)(x))
#define TB__TOI_INT(x)   ((int64_t)(x))
#define TB__TOI_BOOL(x)  ((int64_t)((x) != 0))
#define TB__TOF_NUM(x)   ((double)(x))
#define TB__TOF_BOOL(x)  ((double)((x) != 0))
#define TB__CONV_LOOP(TD, EXPR)                                                                    \
    do {                                                                                           \
        TD *o_ = (TD *)p[0];                                                                       \
        for (i = 0; i < n; i++)                                                                    \
            o_[i * s[0]] = (TD)(EXPR);                                                             \
    } while (0)
#define TB__CONV_SWITCH(TS, TOI, TOF)                                                              \
    do {                                                                                           \
        const TS *a_ = (const TS *)p[1];                                                           \
        switch (dd) {                                                                              \
        case TB_F32:                                                                               \
            TB__CONV_LOOP(float, TOF(a_[i * s[1]]));                                               \
            break;                                                                                 \
        case TB_F64:                                                                               \
            TB__CONV_LOOP(double, TOF(a_[i * s[1]]));                                              \
            break;                                                                                 \
        case TB_I32:                                                                               \
            TB__CONV_LOOP(int32_t, (uint32_t)(uint64_t)TOI(a_[i * s[1]]));                         \
            break;                                                                                 \
        case TB_I64:                                                                               \
            TB__CONV_LOOP(int64_t, TOI(a_[i * s[1]]));                                             \
            break;                                                                                 \
        case TB_U8:                                                                                \
            TB__CONV_LOOP(uint8_t, (uint64_t)TOI(a_[i * s[1]]));                                   \
            break;                                                                                 \
        case TB_BOOL:                                                                              \
            TB__CONV_LOOP(uint8_t, a_[i * s[1]] != 0);                                             \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

static tb_status tb__ref_conv_run(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const tb__conv_ctx *c = (const tb__conv_ctx *)ctx;
    tb_dtype dd = c->dd;
    int64_t i;
    switch (c->sd) {
    case TB_F32:
        TB__CONV_SWITCH(float, TB__TOI_FLOAT, TB__TOF_NUM);
        break;
    case TB_F64:
        TB__CONV_SWITCH(double, TB__TOI_FLOAT, TB__TOF_NUM);
        break;
    case TB_I32:
        TB__CONV_SWITCH(int32_t, TB__TOI_INT, TB__TOF_NUM);
        break;
    case TB_I64:
        TB__CONV_SWITCH(int64_t, TB__TOI_INT, TB__TOF_NUM);
        break;
    case TB_U8:
        TB__CONV_SWITCH(uint8_t, TB__TOI_INT, TB__TOF_NUM);
        break;
    case TB_BOOL:
        TB__CONV_SWITCH(uint8_t, TB__TOI_BOOL, TB__TOF_BOOL);
        break;
    default:
        break;
    }
    return TB_OK;
}

#undef TB__TOI_FLOAT
#undef TB__TOI_INT
#undef TB__TOI_BOOL
#undef TB__TOF_NUM
#undef TB__TOF_BOOL
#undef TB__CONV_LOOP
#undef TB__CONV_SWITCH

/* dst[...] = src[...] (same dims; src may broadcast), converting the dtype if they differ. */
static tb_status tb__ref_copy(const tb__rview *dst, const tb__rview *src) {
    tb__iter it;
    tb_status st;
    tb__iter_begin(&it, dst->shape.rank, dst->shape.dims);
    tb__iter_add(&it, dst->buf->data, dst->offset, dst->strides, tb__ref_esize(dst->shape.dtype));
    st = tb__iter_add_view(&it, src);
    if (st != TB_OK) return st;
    if (src->shape.dtype == dst->shape.dtype) {
        int64_t es = tb__ref_esize(dst->shape.dtype);
        return tb__iter_run(&it, tb__ref_copy_run, &es);
    } else {
        tb__conv_ctx c;
        c.sd = src->shape.dtype;
        c.dd = dst->shape.dtype;
        return tb__iter_run(&it, tb__ref_conv_run, &c);
    }
}

/* A contiguous view with the same value: the view itself (shared) when it already is one. */
static tb_status tb__rview_contig(const tb__rview *src, tb__rview *out) {
    tb_status st;
    if (tb__rview_is_contig(src)) {
        tb__rview_share(out, src);
        tb__ref_contig_strides(&out->shape, out->strides);
        return TB_OK;
    }
    st = tb__rview_alloc(out, &src->shape);
    if (st != TB_OK) return st;
    st = tb__ref_copy(out, src);
    if (st != TB_OK) tb__rview_clear(out);
    return st;
}

/* Copies a view into a caller's contiguous array of its shape. */
static tb_status tb__rview_to_host(const tb__rview *v, void *host) {
    tb__rview dst;
    tb_status st;
    size_t nbytes = 0;
    st = tb__ref_nbytes(&v->shape, &nbytes);
    if (st != TB_OK) return st;
    if (nbytes == 0) return TB_OK;
    if (tb__rview_is_contig(v)) {
        memcpy(host, tb__rview_ptr(v), nbytes);
        return TB_OK;
    }
    st = tb__rview_borrow(&dst, &v->shape, host);
    if (st != TB_OK) return st;
    st = tb__ref_copy(&dst, v);
    tb__rview_clear(&dst);
    return st;
}

/* ---- elementwise ops ---- */

#define TB__REF_SQRT1_2 0.70710678118654752440

static double tb__ref_sigmoid(double x) {
    /* exp of a negative argument only: no overflow for large |x| */
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    {
        double e = exp(x);
        return e / (1.0 + e);
    }
}

static double tb__ref_maxf(double a, double b) {
    if (a != a) return a;
    if (b != b) return b;
    return a > b ? a : b;
}

static double tb__ref_minf(double a, double b) {
    if (a != a) return a;
    if (b != b) return b;
    return a < b ? a : b;
}

static double tb__ref_unary_f(tb_op op, double x) {
    switch (op) {
    case TB_OP_NEG:
        return -x;
    case TB_OP_ABS:
        return fabs(x);
    case TB_OP_EXP:
        return exp(x);
    case TB_OP_LOG:
        return log(x);
    case TB_OP_SQRT:
        return sqrt(x);
    case TB_OP_RSQRT:
        return 1.0 / sqrt(x);
    case TB_OP_SIN:
        return sin(x);
    case TB_OP_COS:
        return cos(x);
    case TB_OP_TANH:
        return tanh(x);
    case TB_OP_SIGMOID:
        return tb__ref_sigmoid(x);
    case TB_OP_RELU:
        return x < 0 ? 0.0 : x; /* NaN stays NaN */
    case TB_OP_GELU:
        return 0.5 * x * (1.0 + erf(x * TB__REF_SQRT1_2));
    case TB_OP_SILU:
        return x * tb__ref_sigmoid(x);
    case TB_OP_RECIPROCAL:
        return 1.0 / x;
    case TB_OP_FLOOR:
        return floor(x);
    case TB_OP_CEIL:
        return ceil(x);
    case TB_OP_ROUND:
        return nearbyint(x); /* half to even under the default rounding mode */
    case TB_OP_SIGN:
        return (double)((x > 0) - (x < 0)); /* PyTorch: sign(NaN) = 0 */
    case TB_OP_LOGICAL_NOT:
        return x == 0 ? 1.0 : 0.0;
    default:
        return x;
    }
}

static int64_t tb__ref_unary_i(tb_op op, int64_t x) {
    switch (op) {
    case TB_OP_NEG:
        return (int64_t)(0u - (uint64_t)x); /* wraps as PyTorch's integers do */
    case TB_OP_ABS:
        return x < 0 ? (int64_t)(0u - (uint64_t)x) : x;
    case TB_OP_RELU:
        return x < 0 ? 0 : x;
    case TB_OP_SIGN:
        return (int64_t)((x > 0) - (x < 0));
    case TB_OP_LOGICAL_NOT:
        return x == 0;
    default:
        return x; /* FLOOR CEIL ROUND of integers */
    }
}

/* Ops that are exact on integers; the others compute in double even for integer T. */
static bool tb__ref_unary_has_int(tb_op op) {
    switch (op) {
    case TB_OP_NEG:
    case TB_OP_ABS:
    case TB_OP_RELU:
    case TB_OP_SIGN:
    case TB_OP_FLOOR:
    case TB_OP_CEIL:
    case TB_OP_ROUND:
    case TB_OP_LOGICAL_NOT:
        return true;
    default:
        return false;
    }
}

static double tb__ref_binary_f(tb_op op, double a, double b) {
    switch (op) {
    case TB_OP_ADD:
        return a + b;
    case TB_OP_SUB:
        return a - b;
    case TB_OP_MUL:
        return a * b;
    case TB_OP_DIV:
        return a / b;
    case TB_OP_POW:
        return pow(a, b);
    case TB_OP_MAXIMUM:
        return tb__ref_maxf(a, b);
    case TB_OP_MINIMUM:
        return tb__ref_minf(a, b);
    case TB_OP_EQ:
        return a == b;
    case TB_OP_NE:
        return a != b;
    case TB_OP_LT:
        return a < b;
    case TB_OP_LE:
        return a <= b;
    case TB_OP_GT:
        return a > b;
    case TB_OP_GE:
        return a >= b;
    default:
        return 0.0;
    }
}

static tb_status tb__ref_ipow(int64_t base, int64_t e, int64_t *out) {
    uint64_t r = 1, b = (uint64_t)base;
    if (e < 0)
        return tb__error(TB_ERR_EXECUTE,
                         "tb_pow: integers to negative integer powers are not allowed (%lld ** "
                         "%lld)",
                         (long long)base, (long long)e);
    while (e > 0) {
        if (e & 1) r *= b;
        e >>= 1;
        if (e > 0) b *= b;
    }
    *out = (int64_t)r;
    return TB_OK;
}

static tb_status tb__ref_binary_i(tb_op op, int64_t a, int64_t b, int64_t *out) {
    switch (op) {
    /* unsigned arithmetic: overflow wraps instead of being undefined */
    case TB_OP_ADD:
        *out = (int64_t)((uint64_t)a + (uint64_t)b);
        break;
    case TB_OP_SUB:
        *out = (int64_t)((uint64_t)a - (uint64_t)b);
        break;
    case TB_OP_MUL:
        *out = (int64_t)((uint64_t)a * (uint64_t)b);
        break;
    case TB_OP_DIV:
        if (b == 0)
            return tb__error(TB_ERR_EXECUTE, "tb_div: integer division by zero (%lld / 0)",
                             (long long)a);
        *out = (a == INT64_MIN && b == -1) ? INT64_MIN : a / b;
        break;
    case TB_OP_POW:
        return tb__ref_ipow(a, b, out);
    case TB_OP_MAXIMUM:
        *out = a > b ? a : b;
        break;
    case TB_OP_MINIMUM:
        *out = a < b ? a : b;
        break;
    case TB_OP_EQ:
        *out = a == b;
        break;
    case TB_OP_NE:
        *out = a != b;
        break;
    case TB_OP_LT:
        *out = a < b;
        break;
    case TB_OP_LE:
        *out = a <= b;
        break;
    case TB_OP_GT:
        *out = a > b;
        break;
    case TB_OP_GE:
        *out = a >= b;
        break;
    default:
        *out = 0;
        break;
    }
    return TB_OK;
}

/* How the generic elementwise loop computes one element. */
typedef enum tb__ew_mode {
    TB__EW_CAST,
    TB__EW_NOT,
    TB__EW_UNARY_F,
    TB__EW_UNARY_I,
    TB__EW_BINARY_F,
    TB__EW_BINARY_I,
    TB__EW_LOGIC,
    TB__EW_WHERE,
    TB__EW_CLAMP_F,
    TB__EW_CLAMP_I
} tb__ew_mode;

typedef struct tb__ew_ctx {
    tb_op op;
    tb__ew_mode mode;
    int32_t nops; /* output + operands */
    tb_dtype dt[TB__REF_MAX_OPS];
    int64_t es[TB__REF_MAX_OPS];
} tb__ew_ctx;

static tb_status tb__ref_ew_generic_run(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const tb__ew_ctx *c = (const tb__ew_ctx *)ctx;
    const char *x[TB__REF_MAX_OPS];
    tb_dtype od = c->dt[0];
    int64_t i;
    int32_t k;
    for (i = 0; i < n; i++) {
        char *o = p[0] + i * s[0] * c->es[0];
        for (k = 1; k < c->nops; k++)
            x[k] = p[k] + i * s[k] * c->es[k];
        switch (c->mode) {
        case TB__EW_CAST:
            tb__ref_convert(od, o, c->dt[1], x[1]);
            break;
        case TB__EW_NOT:
            tb__st_i(od, o, !tb__ld_b(c->dt[1], x[1]));
            break;
        case TB__EW_UNARY_F:
            tb__st_f(od, o, tb__ref_unary_f(c->op, tb__ld_f(c->dt[1], x[1])));
            break;
        case TB__EW_UNARY_I:
            tb__st_i(od, o, tb__ref_unary_i(c->op, tb__ld_i(c->dt[1], x[1])));
            break;
        case TB__EW_BINARY_F:
            tb__st_f(od, o,
                     tb__ref_binary_f(c->op, tb__ld_f(c->dt[1], x[1]), tb__ld_f(c->dt[2], x[2])));
            break;
        case TB__EW_BINARY_I: {
            int64_t r = 0;
            tb_status st =
                tb__ref_binary_i(c->op, tb__ld_i(c->dt[1], x[1]), tb__ld_i(c->dt[2], x[2]), &r);
            if (st != TB_OK) return st;
            tb__st_i(od, o, r);
            break;
        }
        case TB__EW_LOGIC: {
            bool a = tb__ld_b(c->dt[1], x[1]), b = tb__ld_b(c->dt[2], x[2]);
            tb__st_i(od, o, c->op == TB_OP_LOGICAL_AND ? (a && b) : (a || b));
            break;
        }
        case TB__EW_WHERE:
            if (tb__ld_b(c->dt[1], x[1]))
                tb__ref_convert(od, o, c->dt[2], x[2]);
            else
                tb__ref_convert(od, o, c->dt[3], x[3]);
            break;
        case TB__EW_CLAMP_F: {
            double v = tb__ref_maxf(tb__ld_f(c->dt[1], x[1]), tb__ld_f(c->dt[2], x[2]));
            tb__st_f(od, o, tb__ref_minf(v, tb__ld_f(c->dt[3], x[3])));
            break;
        }
        case TB__EW_CLAMP_I: {
            int64_t v = tb__ld_i(c->dt[1], x[1]), lo = tb__ld_i(c->dt[2], x[2]),
                    hi = tb__ld_i(c->dt[3], x[3]);
            v = v < lo ? lo : v;
            tb__st_i(od, o, v > hi ? hi : v);
            break;
        }
        }
    }
    return TB_OK;
}

/* Typed loops for f32 and f64, the dtypes that carry the bulk of the work. Float ops compute in
   double and round once; + - * / are done in T, which rounds the same way. */
#define TB__UN_LOOP(T, EXPR)                                                                       \
    do {                                                                                           \
        T *o_ = (T *)p[0];                                                                         \
        const T *a_ = (const T *)p[1];                                                             \
        if (s[0] == 1 && s[1] == 1) {                                                              \
            for (i = 0; i < n; i++) {                                                              \
                double x = (double)a_[i];                                                          \
                o_[i] = (T)(EXPR);                                                                 \
            }                                                                                      \
        } else {                                                                                   \
            for (i = 0; i < n; i++) {                                                              \
                double x = (double)a_[i * s[1]];                                                   \
                o_[i * s[0]] = (T)(EXPR);                                                          \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#define TB__UN_FUNC(NAME, T)                                                                       \
    static tb_status NAME(void *ctx, int64_t n, char *const *p, const int64_t *s) {                \
        int64_t i;                                                                                 \
        switch (((const tb__ew_ctx *)ctx)->op) {                                                   \
        case TB_OP_NEG:                                                                            \
            TB__UN_LOOP(T, -x);                                                                    \
            break;                                                                                 \
        case TB_OP_ABS:                                                                            \
            TB__UN_LOOP(T, fabs(x));                                                               \
            break;                                                                                 \
        case TB_OP_EXP:                                                                            \
            TB__UN_LOOP(T, exp(x));                                                                \
            break;                                                                                 \
        case TB_OP_LOG:                                                                            \
            TB__UN_LOOP(T, log(x));                                                                \
            break;                                                                                 \
        case TB_OP_SQRT:                                                                           \
            TB__UN_LOOP(T, sqrt(x));                                                               \
            break;                                                                                 \
        case TB_OP_RSQRT:                                                                          \
            TB__UN_LOOP(T, 1.0 / sqrt(x));                                                         \
            break;                                                                                 \
        case TB_OP_SIN:                                                                            \
            TB__UN_LOOP(T, sin(x));                                                                \
            break;                                                                                 \
        case TB_OP_COS:                                                                            \
            TB__UN_LOOP(T, cos(x));                                                                \
            break;                                                                                 \
        case TB_OP_TANH:                                                                           \
            TB__UN_LOOP(T, tanh(x));                                                               \
            break;                                                                                 \
        case TB_OP_RELU:                                                                           \
            TB__UN_LOOP(T, x < 0 ? 0.0 : x);                                                       \
            break;                                                                                 \
        case TB_OP_RECIPROCAL:                                                                     \
            TB__UN_LOOP(T, 1.0 / x);                                                               \
            break;                                                                                 \
        case TB_OP_FLOOR:                                                                          \
            TB__UN_LOOP(T, floor(x));                                                              \
            break;                                                                                 \
        case TB_OP_CEIL:                                                                           \
            TB__UN_LOOP(T, ceil(x));                                                               \
            break;                                                                                 \
        default:                                                                                   \
            TB__UN_LOOP(T, tb__ref_unary_f(((const tb__ew_ctx *)ctx)->op, x));                     \
            break;                                                                                 \
        }                                                                                          \
        return TB_OK;                                                                              \
    }

TB__UN_FUNC(tb__ref_unary_f32_run, float)
TB__UN_FUNC(tb__ref_unary_f64_run, double)

/* Binary loops with the common stride patterns spelled out so that they vectorise. */
#define TB__BIN_LOOP(T, TO, EXPR)                                                                  \
    do {                                                                                           \
        TO *o_ = (TO *)p[0];                                                                       \
        const T *a_ = (const T *)p[1];                                                             \
        const T *b_ = (const T *)p[2];                                                             \
        if (s[0] == 1 && s[1] == 1 && s[2] == 1) {                                                 \
            for (i = 0; i < n; i++) {                                                              \
                T a = a_[i], b = b_[i];                                                            \
                o_[i] = (TO)(EXPR);                                                                \
            }                                                                                      \
        } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {                                          \
            T b = b_[0];                                                                           \
            for (i = 0; i < n; i++) {                                                              \
                T a = a_[i];                                                                       \
                o_[i] = (TO)(EXPR);                                                                \
            }                                                                                      \
        } else if (s[0] == 1 && s[1] == 0 && s[2] == 1) {                                          \
            T a = a_[0];                                                                           \
            for (i = 0; i < n; i++) {                                                              \
                T b = b_[i];                                                                       \
                o_[i] = (TO)(EXPR);                                                                \
            }                                                                                      \
        } else {                                                                                   \
            for (i = 0; i < n; i++) {                                                              \
                T a = a_[i * s[1]], b = b_[i * s[2]];                                              \
                o_[i * s[0]] = (TO)(EXPR);                                                         \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#define TB__BIN_FUNC(NAME, T)                                                                      \
    static tb_status NAME(void *ctx, int64_t n, char *const *p, const int64_t *s) {                \
        int64_t i;                                                                                 \
        switch (((const tb__ew_ctx *)ctx)->op) {                                                   \
        case TB_OP_ADD:                                                                            \
            TB__BIN_LOOP(T, T, a + b);                                                             \
            break;                                                                                 \
        case TB_OP_SUB:                                                                            \
            TB__BIN_LOOP(T, T, a - b);                                                             \
            break;                                                                                 \
        case TB_OP_MUL:                                                                            \
            TB__BIN_LOOP(T, T, a *b);                                                              \
            break;                                                                                 \
        case TB_OP_DIV:                                                                            \
            TB__BIN_LOOP(T, T, a / b);                                                             \
            break;                                                                                 \
        case TB_OP_POW:                                                                            \
            TB__BIN_LOOP(T, T, pow((double)a, (double)b));                                         \
            break;                                                                                 \
        case TB_OP_MAXIMUM:                                                                        \
            TB__BIN_LOOP(T, T, tb__ref_maxf((double)a, (double)b));                                \
            break;                                                                                 \
        case TB_OP_MINIMUM:                                                                        \
            TB__BIN_LOOP(T, T, tb__ref_minf((double)a, (double)b));                                \
            break;                                                                                 \
        case TB_OP_EQ:                                                                             \
            TB__BIN_LOOP(T, uint8_t, a == b);                                                      \
            break;                                                                                 \
        case TB_OP_NE:                                                                             \
            TB__BIN_LOOP(T, uint8_t, a != b);                                                      \
            break;                                                                                 \
        case TB_OP_LT:                                                                             \
            TB__BIN_LOOP(T, uint8_t, a < b);                                                       \
            break;                                                                                 \
        case TB_OP_LE:                                                                             \
            TB__BIN_LOOP(T, uint8_t, a <= b);                                                      \
            break;                                                                                 \
        case TB_OP_GT:                                                                             \
            TB__BIN_LOOP(T, uint8_t, a > b);                                                       \
            break;                                                                                 \
        case TB_OP_GE:                                                                             \
            TB__BIN_LOOP(T, uint8_t, a >= b);                                                      \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
        return TB_OK;                                                                              \
    }

TB__BIN_FUNC(tb__ref_binary_f32_run, float)
TB__BIN_FUNC(tb__ref_binary_f64_run, double)

#undef TB__UN_LOOP
#undef TB__UN_FUNC
#undef TB__BIN_LOOP
#undef TB__BIN_FUNC

static bool tb__ref_is_compare(tb_op op) {
    return op == TB_OP_EQ || op == TB_OP_NE || op == TB_OP_LT || op == TB_OP_LE || op == TB_OP_GT ||
           op == TB_OP_GE;
}

static tb_status tb__ref_elementwise(const tb_node *node, const tb__rview *in, tb__rview *out) {
    tb__ew_ctx c;
    tb__iter it;
    tb__run_fn fn = tb__ref_ew_generic_run;
    tb__conv_ctx conv;
    void *ctx = &c;
    tb_dtype od = node->shape.dtype;
    int32_t k, nin = (int32_t)node->num_operands;
    tb_status st;
    bool any_float = false;
    memset(&c, 0, sizeof(c));
    c.op = node->op;
    c.nops = nin + 1;
    c.dt[0] = od;
    c.es[0] = tb__ref_esize(od);
    for (k = 0; k < nin; k++) {
        c.dt[k + 1] = in[k].shape.dtype;
        c.es[k + 1] = tb__ref_esize(in[k].shape.dtype);
        any_float = any_float || tb_dtype_is_float(in[k].shape.dtype);
    }
    switch (node->op) {
    case TB_OP_CAST:
        c.mode = TB__EW_CAST;
        conv.sd = c.dt[1];
        conv.dd = od;
        fn = tb__ref_conv_run;
        ctx = &conv;
        break;
    case TB_OP_LOGICAL_NOT:
        c.mode = TB__EW_NOT;
        break;
    case TB_OP_LOGICAL_AND:
    case TB_OP_LOGICAL_OR:
        c.mode = TB__EW_LOGIC;
        break;
    case TB_OP_WHERE:
        c.mode = TB__EW_WHERE;
        break;
    case TB_OP_CLAMP:
        c.mode = tb_dtype_is_float(od) ? TB__EW_CLAMP_F : TB__EW_CLAMP_I;
        break;
    default:
        if (nin == 1) {
            bool as_int = !tb_dtype_is_float(od) && !tb_dtype_is_float(c.dt[1]) &&
                          tb__ref_unary_has_int(node->op);
            c.mode = as_int ? TB__EW_UNARY_I : TB__EW_UNARY_F;
            if (c.dt[1] == od && od == TB_F32) fn = tb__ref_unary_f32_run;
            if (c.dt[1] == od && od == TB_F64) fn = tb__ref_unary_f64_run;
        } else {
            bool cmp = tb__ref_is_compare(node->op);
            bool as_float = cmp ? any_float : tb_dtype_is_float(od);
            tb_dtype want = cmp ? TB_BOOL : c.dt[1];
            c.mode = as_float ? TB__EW_BINARY_F : TB__EW_BINARY_I;
            if (c.dt[1] == c.dt[2] && od == want && c.dt[1] == TB_F32) fn = tb__ref_binary_f32_run;
            if (c.dt[1] == c.dt[2] && od == want && c.dt[1] == TB_F64) fn = tb__ref_binary_f64_run;
        }
        break;
    }
    st = tb__rview_alloc(out, &node->shape);
    if (st != TB_OK) return st;
    tb__iter_begin(&it, node->shape.rank, node->shape.dims);
    tb__iter_add(&it, out->buf->data, 0, out->strides, c.es[0]);
    for (k = 0; k < nin && st == TB_OK; k++)
        st = tb__iter_add_view(&it, &in[k]);
    if (st == TB_OK) st = tb__iter_run(&it, fn, ctx);
    if (st != TB_OK) tb__rview_clear(out);
    return st;
}

/* ---- reductions ---- */

typedef struct tb__red_ctx {
    tb_op op;
    tb_dtype dt;
    int64_t es;
} tb__red_ctx;

#define TB__RED_BODY(LOAD)                                                                         \
    do {                                                                                           \
        switch (c->op) {                                                                           \
        case TB_OP_PROD:                                                                           \
            if (s[0] == 0) {                                                                       \
                double t = acc[0];                                                                 \
                for (i = 0; i < n; i++)                                                            \
                    t *= (double)(LOAD);                                                           \
                acc[0] = t;                                                                        \
            } else {                                                                               \
                for (i = 0; i < n; i++)                                                            \
                    acc[i * s[0]] *= (double)(LOAD);                                               \
            }                                                                                      \
            break;                                                                                 \
        case TB_OP_MAX:                                                                            \
            for (i = 0; i < n; i++) {                                                              \
                double v = (double)(LOAD), t = acc[i * s[0]];                                      \
                if (v > t || v != v) acc[i * s[0]] = v;                                            \
            }                                                                                      \
            break;                                                                                 \
        case TB_OP_MIN:                                                                            \
            for (i = 0; i < n; i++) {                                                              \
                double v = (double)(LOAD), t = acc[i * s[0]];                                      \
                if (v < t || v != v) acc[i * s[0]] = v;                                            \
            }                                                                                      \
            break;                                                                                 \
        default: /* SUM MEAN */                                                                    \
            if (s[0] == 0) {                                                                       \
                double t = acc[0];                                                                 \
                for (i = 0; i < n; i++)                                                            \
                    t += (double)(LOAD);                                                           \
                acc[0] = t;                                                                        \
            } else {                                                                               \
                for (i = 0; i < n; i++)                                                            \
                    acc[i * s[0]] += (double)(LOAD);                                               \
            }                                                                                      \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

/* Float reductions accumulate in double: a sum of millions of f32 stays accurate. */
static tb_status tb__ref_reduce_f_run(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const tb__red_ctx *c = (const tb__red_ctx *)ctx;
    double *acc = (double *)p[0];
    int64_t i;
    if (c->dt == TB_F32) {
        const float *x = (const float *)p[1];
        TB__RED_BODY(x[i * s[1]]);
    } else if (c->dt == TB_F64) {
        const double *x = (const double *)p[1];
        TB__RED_BODY(x[i * s[1]]);
    } else {
        TB__RED_BODY(tb__ld_f(c->dt, p[1] + i * s[1] * c->es));
    }
    return TB_OK;
}

#undef TB__RED_BODY

/* Integer reductions accumulate in int64 with wrapping arithmetic. */
static tb_status tb__ref_reduce_i_run(void *ctx, int64_t n, char *const *p, const int64_t *s) {
    const tb__red_ctx *c = (const tb__red_ctx *)ctx;
    int64_t *acc = (int64_t *)p[0];
    int64_t i;
    for (i = 0; i < n; i++) {
        int64_t v = tb__ld_i(c->dt, p[1] + i * s[1] * c->es);
        int64_t *a = &acc[i * s[0]];
        switch (c->op) {
        case TB_OP_PROD:
            *a = (int64_t)((uint64_t)*a * (uint64_t)v);
            break;
        case TB_OP_MAX:
            *a = v > *a ? v : *a;
            break;
        case TB_OP_MIN:
            *a = v < *a ? v : *a;
            break;
        default:
            *a = (int64_t)((uint64_t)*a + (uint64_t)v);
            break;
        }
    }
    return TB_OK;
}

static bool tb__ref_mask_has(int64_t mask, int32_t axis) {
    return (((uint64_t)mask >> axis) & 1u) != 0;
}

static tb_status tb__ref_reduce(const tb_node *node, const tb__rview *x, tb__rview *out) {
    int64_t mask = node->num_attrs > 0 ? node->attrs[0] : 0;
    const tb_shape *xs = &x->shape;
    int64_t ast[TB_MAX_RANK], kept = 1, count = 1, onumel, i;
    int32_t d;
    bool facc = tb_dtype_is_float(xs->dtype) || tb_dtype_is_float(node->shape.dtype);
    char *acc;
    tb__iter it;
    tb__red_ctx c;
    tb_status st;
    /* accumulator strides over x's axes: kept axes contiguous, reduced axes 0 */
    for (d = xs->rank - 1; d >= 0; d--) {
        if (tb__ref_mask_has(mask, d)) {
            ast[d] = 0;
            count *= xs->dims[d];
        } else {
            ast[d] = kept;
            kept *= xs->dims[d];
        }
    }
    onumel = tb__ref_numel(&node->shape);
    if (onumel != kept || ((uint64_t)mask >> xs->rank) != 0)
        return tb__error(TB_ERR_INTERNAL, "reference: %s node with a malformed axes mask",
                         tb_op_name(node->op));
    if ((uint64_t)onumel > SIZE_MAX / 8u)
        return tb__error(TB_ERR_OVERFLOW, "reference: %s accumulator too large",
                         tb_op_name(node->op));
    acc = (char *)tb__alloc((size_t)(onumel ? onumel : 1) * 8u);
    if (!acc) return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < onumel; i++) {
        if (facc) {
            double v = 0.0;
            if (node->op == TB_OP_PROD) v = 1.0;
            if (node->op == TB_OP_MAX) v = -HUGE_VAL;
            if (node->op == TB_OP_MIN) v = HUGE_VAL;
            ((double *)acc)[i] = v;
        } else {
            int64_t v = 0;
            if (node->op == TB_OP_PROD) v = 1;
            if (node->op == TB_OP_MAX) v = INT64_MIN;
            if (node->op == TB_OP_MIN) v = INT64_MAX;
            ((int64_t *)acc)[i] = v;
        }
    }
    c.op = node->op;
    c.dt = xs->dtype;
    c.es = tb__ref_esize(xs->dtype);
    tb__iter_begin(&it, xs->rank, xs->dims);
    tb__iter_add(&it, acc, 0, ast, 8);
    tb__iter_add(&it, x->buf->data, x->offset, x->strides, c.es);
    st = tb__iter_run(&it, facc ? tb__ref_reduce_f_run : tb__ref_reduce_i_run, &c);
    if (st == TB_OK) st = tb__rview_alloc(out, &node->shape);
    if (st == TB_OK) {
        tb_dtype od = node->shape.dtype;
        int64_t oes = tb__ref_esize(od);
        char *o = out->buf->data;
        for (i = 0; i < onumel; i++) {
            if (!facc) {
                tb__st_i(od, o + i * oes, ((int64_t *)acc)[i]);
            } else if (node->op == TB_OP_MEAN) {
                double sum = ((double *)acc)[i];
                tb__st_f(od, o + i * oes, count > 0 ? sum / (double)count : NAN);
            } else {
                tb__st_f(od, o + i * oes, ((double *)acc)[i]);
            }
        }
    }
    tb__free(acc);
    return st;
}

/* ARGMAX/ARGMIN: the first extreme element along one axis; NaN counts as the extreme. */
static tb_status tb__ref_argminmax(const tb_node *node, const tb__rview *x, tb__rview *out) {
    const tb_shape *xs = &x->shape;
    int32_t axis = node->num_attrs > 0 ? (int32_t)node->attrs[0] : 0;
    int64_t len, stride, onumel, o;
    int64_t idx[TB_MAX_RANK];
    int64_t off;
    int64_t es = tb__ref_esize(xs->dtype);
    int32_t d;
    bool is_max = node->op == TB_OP_ARGMAX, as_float = tb_dtype_is_float(xs->dtype);
    tb_status st;
    if (xs->rank < 1 || axis < 0 || axis >= xs->rank || xs->dims[axis] < 1)
        return tb__error(TB_ERR_INTERNAL, "reference: %s node with a malformed axis",
                         tb_op_name(node->op));
    len = xs->dims[axis];
    stride = x->strides[axis];
    st = tb__rview_alloc(out, &node->shape);
    if (st != TB_OK) return st;
    onumel = tb__ref_numel(&node->shape);
    memset(idx, 0, sizeof(idx));
    off = x->offset;
    for (o = 0; o < onumel; o++) {
        const char *p = x->buf->data + off * es;
        int64_t best = 0, k;
        if (as_float) {
            double bv = tb__ld_f(xs->dtype, p);
            for (k = 1; k < len && bv == bv; k++) {
                double v = tb__ld_f(xs->dtype, p + k * stride * es);
                if (v != v || (is_max ? v > bv : v < bv)) {
                    bv = v;
                    best = k;
                }
            }
        } else {
            int64_t bv = tb__ld_i(xs->dtype, p);
            for (k = 1; k < len; k++) {
                int64_t v = tb__ld_i(xs->dtype, p + k * stride * es);
                if (is_max ? v > bv : v < bv) {
                    bv = v;
                    best = k;
                }
            }
        }
        tb__st_i(node->shape.dtype, out->buf->data + o * tb__ref_esize(node->shape.dtype), best);
        /* next position over the other axes, row-major */
        for (d = xs->rank - 1; d >= 0; d--) {
            if (d == axis) continue;
            idx[d]++;
            off += x->strides[d];
            if (idx[d] < xs->dims[d]) break;
            off -= x->strides[d] * xs->dims[d];
            idx[d] = 0;
        }
    }
    return TB_OK;
}

/* ---- matmul ---- */

#define TB__MM_KC 256 /* depth of a block: a 4-column panel of b (8 KiB) stays in L1 */
#define TB__MM_MC 128 /* rows of a block: the packed block of a (256 KiB) stays in L2 */

/* Packs the [rows, cols] matrix at element `off` of `v` (strides rs, cs) into a double or int64
   array, row-major. */
static void tb__ref_mm_pack(const tb__rview *v, int64_t off, int64_t rows, int64_t cols, int64_t rs,
                            int64_t cs, bool as_float, void *dst) {
    tb_dtype dt = v->shape.dtype;
    int64_t es = tb__ref_esize(dt), r, k;
    const char *base = v->buf->data;
    if (as_float && dt == TB_F32) {
        const float *a = (const float *)base + off;
        double *o = (double *)dst;
        for (r = 0; r < rows; r++)
            for (k = 0; k < cols; k++)
                o[r * cols + k] = (double)a[r * rs + k * cs];
    } else if (as_float) {
        double *o = (double *)dst;
        for (r = 0; r < rows; r++)
            for (k = 0; k < cols; k++)
                o[r * cols + k] = tb__ld_f(dt, base + (off + r * rs + k * cs) * es);
    } else {
        int64_t *o = (int64_t *)dst;
        for (r = 0; r < rows; r++)
            for (k = 0; k < cols; k++)
                o[r * cols + k] = tb__ld_i(dt, base + (off + r * rs + k * cs) * es);
    }
}

/* c[4,4] += ap[kc,4]^T bp[kc,4] (both panels k-major); the 16 sums stay in registers. Only
   rows x cols of the tile are real (the panels are zero-padded). */
static void tb__ref_mm_tile(const double *ap, const double *bp, int64_t kc, double *c, int64_t ldc,
                            int64_t rows, int64_t cols) {
    double c00 = 0, c01 = 0, c02 = 0, c03 = 0, c10 = 0, c11 = 0, c12 = 0, c13 = 0;
    double c20 = 0, c21 = 0, c22 = 0, c23 = 0, c30 = 0, c31 = 0, c32 = 0, c33 = 0;
    double t[16];
    int64_t k, r, j;
    for (k = 0; k < kc; k++) {
        const double *av = ap + 4 * k, *bv = bp + 4 * k;
        double a0 = av[0], a1 = av[1], a2 = av[2], a3 = av[3];
        double b0 = bv[0], b1 = bv[1], b2 = bv[2], b3 = bv[3];
        c00 += a0 * b0;
        c01 += a0 * b1;
        c02 += a0 * b2;
        c03 += a0 * b3;
        c10 += a1 * b0;
        c11 += a1 * b1;
        c12 += a1 * b2;
        c13 += a1 * b3;
        c20 += a2 * b0;
        c21 += a2 * b1;
        c22 += a2 * b2;
        c23 += a2 * b3;
        c30 += a3 * b0;
        c31 += a3 * b1;
        c32 += a3 * b2;
        c33 += a3 * b3;
    }
    t[0] = c00, t[1] = c01, t[2] = c02, t[3] = c03;
    t[4] = c10, t[5] = c11, t[6] = c12, t[7] = c13;
    t[8] = c20, t[9] = c21, t[10] = c22, t[11] = c23;
    t[12] = c30, t[13] = c31, t[14] = c32, t[15] = c33;
    for (r = 0; r < rows; r++)
        for (j = 0; j < cols; j++)
            c[r * ldc + j] += t[r * 4 + j];
}

/* c[M,N] = a[M,K] b[K,N] in double (a and b packed row-major), blocked for the caches as
   GotoBLAS does: a K block of b in 4-column panels, an M block of a in 4-row panels, 4x4 tiles.
   `work` holds TB__MM_KC * (N + 3) + TB__MM_MC * TB__MM_KC + M * N doubles. */
static void tb__ref_mm_f(const double *a, const double *b, double *work, int64_t M, int64_t K,
                         int64_t N, tb_dtype od, char *out) {
    int64_t npan = (N + 3) / 4, kb, ib, ip, jp, k, r, j;
    double *bpan = work, *apan = bpan + TB__MM_KC * npan * 4, *c = apan + TB__MM_MC * TB__MM_KC;
    int64_t oes = tb__ref_esize(od);
    for (j = 0; j < M * N; j++)
        c[j] = 0.0;
    for (kb = 0; kb < K; kb += TB__MM_KC) {
        int64_t kc = K - kb < TB__MM_KC ? K - kb : TB__MM_KC;
        for (jp = 0; jp < npan; jp++)
            for (k = 0; k < kc; k++)
                for (j = 0; j < 4; j++)
                    bpan[(jp * kc + k) * 4 + j] =
                        jp * 4 + j < N ? b[(kb + k) * N + jp * 4 + j] : 0.0;
        for (ib = 0; ib < M; ib += TB__MM_MC) {
            int64_t mc = M - ib < TB__MM_MC ? M - ib : TB__MM_MC, mpan = (mc + 3) / 4;
            for (ip = 0; ip < mpan; ip++)
                for (k = 0; k < kc; k++)
                    for (r = 0; r < 4; r++)
                        apan[(ip * kc + k) * 4 + r] =
                            ip * 4 + r < mc ? a[(ib + ip * 4 + r) * K + kb + k] : 0.0;
            for (jp = 0; jp < npan; jp++)
                for (ip = 0; ip < mpan; ip++) {
                    int64_t rows = mc - ip * 4 < 4 ? mc - ip * 4 : 4;
                    int64_t cols = N - jp * 4 < 4 ? N - jp * 4 : 4;
                    tb__ref_mm_tile(apan + ip * kc * 4, bpan + jp * kc * 4, kc,
                                    c + (ib + ip * 4) * N + jp * 4, N, rows, cols);
                }
        }
    }
    if (od == TB_F32) {
        float *o = (float *)out;
        for (j = 0; j < M * N; j++)
            o[j] = (float)c[j];
    } else if (od == TB_F64) {
        memcpy(out, c, (size_t)(M * N) * sizeof(double));
    } else {
        for (j = 0; j < M * N; j++)
            tb__st_f(od, out + j * oes, c[j]);
    }
}

static void tb__ref_mm_i(const int64_t *a, const int64_t *b, int64_t M, int64_t K, int64_t N,
                         tb_dtype od, char *out) {
    int64_t i, k, j, oes = tb__ref_esize(od);
    for (i = 0; i < M; i++) {
        char *orow = out + i * N * oes;
        for (j = 0; j < N; j++)
            tb__st_i(od, orow + j * oes, 0);
        if (od == TB_I64) {
            int64_t *o = (int64_t *)orow;
            for (k = 0; k < K; k++) {
                uint64_t av = (uint64_t)a[i * K + k];
                const int64_t *brow = b + k * N;
                for (j = 0; j < N; j++)
                    o[j] = (int64_t)((uint64_t)o[j] + av * (uint64_t)brow[j]);
            }
        } else {
            for (j = 0; j < N; j++) {
                uint64_t t = 0;
                for (k = 0; k < K; k++)
                    t += (uint64_t)a[i * K + k] * (uint64_t)b[k * N + j];
                tb__st_i(od, orow + j * oes, (int64_t)t);
            }
        }
    }
}

static tb_status tb__ref_matmul(const tb_node *node, const tb__rview *a, const tb__rview *b,
                                tb__rview *out) {
    const tb_shape *os = &node->shape;
    int32_t r = os->rank, d;
    int64_t M, K, N, batch = 1, bi, aoff, boff, last_aoff = -1, last_boff = -1;
    int64_t idx[TB_MAX_RANK];
    bool as_float = tb_dtype_is_float(os->dtype);
    void *pa = NULL, *pb = NULL;
    double *work = NULL;
    int64_t oes = tb__ref_esize(os->dtype);
    tb_status st = TB_OK;
    if (r < 2 || a->shape.rank != r || b->shape.rank != r)
        return tb__ref_malformed(node, &a->shape);
    M = os->dims[r - 2];
    N = os->dims[r - 1];
    K = a->shape.dims[r - 1];
    if (a->shape.dims[r - 2] != M || b->shape.dims[r - 2] != K || b->shape.dims[r - 1] != N)
        return tb__ref_malformed(node, &a->shape);
    for (d = 0; d < r - 2; d++) {
        if ((a->shape.dims[d] != os->dims[d] && a->shape.dims[d] != 1) ||
            (b->shape.dims[d] != os->dims[d] && b->shape.dims[d] != 1))
            return tb__ref_malformed(node, &a->shape);
        batch *= os->dims[d];
    }
    st = tb__rview_alloc(out, os);
    if (st != TB_OK) return st;
    if (batch == 0 || M == 0 || N == 0) return TB_OK;
    /* M*K and K*N are element counts of the operands, so they fit; 8 bytes each might not */
    if ((uint64_t)(M * K) > SIZE_MAX / 8u - 1u || (uint64_t)(K * N) > SIZE_MAX / 8u - 1u) {
        st = tb__error(TB_ERR_OVERFLOW, "reference: matmul operands too large to pack");
        goto done;
    }
    /* the output's element count fits, and N + 3 panels of TB__MM_KC doubles are small */
    if ((uint64_t)(M * N) >
        SIZE_MAX / 8u - (uint64_t)(TB__MM_KC * (N + 3) + TB__MM_MC * TB__MM_KC)) {
        st = tb__error(TB_ERR_OVERFLOW, "reference: matmul result too large");
        goto done;
    }
    pa = tb__alloc((size_t)(M * K + 1) * 8u);
    pb = tb__alloc((size_t)(K * N + 1) * 8u);
    if (as_float)
        work = (double *)tb__alloc((size_t)(TB__MM_KC * (N + 3) + TB__MM_MC * TB__MM_KC + M * N) *
                                   sizeof(double));
    if (!pa || !pb || (as_float && !work)) {
        st = TB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    memset(idx, 0, sizeof(idx));
    aoff = a->offset;
    boff = b->offset;
    for (bi = 0; bi < batch; bi++) {
        char *o = out->buf->data + bi * M * N * oes;
        /* operands broadcast over the batch (stride 0) are packed once */
        if (aoff != last_aoff)
            tb__ref_mm_pack(a, aoff, M, K, a->strides[r - 2], a->strides[r - 1], as_float, pa);
        if (boff != last_boff)
            tb__ref_mm_pack(b, boff, K, N, b->strides[r - 2], b->strides[r - 1], as_float, pb);
        last_aoff = aoff;
        last_boff = boff;
        if (as_float)
            tb__ref_mm_f((const double *)pa, (const double *)pb, work, M, K, N, os->dtype, o);
        else
            tb__ref_mm_i((const int64_t *)pa, (const int64_t *)pb, M, K, N, os->dtype, o);
        for (d = r - 3; d >= 0; d--) {
            int64_t as_ = a->shape.dims[d] == 1 ? 0 : a->strides[d];
            int64_t bs_ = b->shape.dims[d] == 1 ? 0 : b->strides[d];
            idx[d]++;
            aoff += as_;
            boff += bs_;
            if (idx[d] < os->dims[d]) break;
            aoff -= as_ * os->dims[d];
            boff -= bs_ * os->dims[d];
            idx[d] = 0;
        }
    }
done:
    tb__free(pa);
    tb__free(pb);
    tb__free(work);
    if (st != TB_OK) tb__rview_clear(out);
    return st;
}

#undef TB__MM_KC
#undef TB__MM_MC

/* ---- softmax, log_softmax, layer_norm ---- */

/* Reads n elements (stride in elements) into doubles. */
static void tb__ref_load_row(tb_dtype dt, const char *p, int64_t stride, int64_t n, double *dst) {
    int64_t i, es = tb__ref_esize(dt);
    if (dt == TB_F32) {
        const float *a = (const float *)p;
        for (i = 0; i < n; i++)
            dst[i] = (double)a[i * stride];
    } else if (dt == TB_F64) {
        const double *a = (const double *)p;
        for (i = 0; i < n; i++)
            dst[i] = a[i * stride];
    } else {
        for (i = 0; i < n; i++)
            dst[i] = tb__ld_f(dt, p + i * stride * es);
    }
}

static void tb__ref_store_row(tb_dtype dt, char *p, int64_t stride, int64_t n, const double *src) {
    int64_t i, es = tb__ref_esize(dt);
    if (dt == TB_F32) {
        float *a = (float *)p;
        for (i = 0; i < n; i++)
            a[i * stride] = (float)src[i];
    } else if (dt == TB_F64) {
        double *a = (double *)p;
        for (i = 0; i < n; i++)
            a[i * stride] = src[i];
    } else {
        for (i = 0; i < n; i++)
            tb__st_f(dt, p + i * stride * es, src[i]);
    }
}

static tb_status tb__ref_alloc_row(int64_t n, double **row) {
    if ((uint64_t)n > SIZE_MAX / sizeof(double) - 1u)
        return tb__error(TB_ERR_OVERFLOW, "reference: a row of %lld elements is too large",
                         (long long)n);
    *row = (double *)tb__alloc((size_t)(n + 1) * sizeof(double));
    return *row ? TB_OK : TB_ERR_OUT_OF_MEMORY;
}

static tb_status tb__ref_softmax(const tb_node *node, const tb__rview *x, tb__rview *out) {
    int32_t axis = node->num_attrs > 0 ? (int32_t)node->attrs[0] : 0, d;
    const tb_shape *xs = &x->shape;
    int64_t outer = 1, len, inner = 1, o, in, l, es = tb__ref_esize(xs->dtype);
    bool log_form = node->op == TB_OP_LOG_SOFTMAX;
    tb__rview xc;
    double *row = NULL;
    tb_status st;
    if (xs->rank < 1 || axis < 0 || axis >= xs->rank)
        return tb__error(TB_ERR_INTERNAL, "reference: %s node with a malformed axis",
                         tb_op_name(node->op));
    for (d = 0; d < axis; d++)
        outer *= xs->dims[d];
    for (d = axis + 1; d < xs->rank; d++)
        inner *= xs->dims[d];
    len = xs->dims[axis];
    st = tb__rview_contig(x, &xc);
    if (st != TB_OK) return st;
    st = tb__ref_alloc_row(len, &row);
    if (st == TB_OK) st = tb__rview_alloc(out, &node->shape);
    if (st == TB_OK) {
        const char *src = tb__rview_ptr(&xc);
        char *dst = out->buf->data;
        tb_dtype od = node->shape.dtype;
        int64_t oes = tb__ref_esize(od);
        for (o = 0; o < outer; o++) {
            for (in = 0; in < inner; in++) {
                int64_t base = o * len * inner + in;
                double m = -HUGE_VAL, sum = 0.0;
                tb__ref_load_row(xs->dtype, src + base * es, inner, len, row);
                /* subtracting the max keeps exp in range; NaN propagates, and a row of -inf
                   gives NaN (-inf - -inf) as PyTorch */
                for (l = 0; l < len; l++)
                    m = tb__ref_maxf(m, row[l]);
                for (l = 0; l < len; l++)
                    sum += exp(row[l] - m);
                if (log_form) {
                    double lse = log(sum);
                    for (l = 0; l < len; l++)
                        row[l] = row[l] - m - lse;
                } else {
                    for (l = 0; l < len; l++)
                        row[l] = exp(row[l] - m) / sum;
                }
                tb__ref_store_row(od, dst + base * oes, inner, len, row);
            }
        }
    }
    tb__free(row);
    tb__rview_clear(&xc);
    return st;
}

static tb_status tb__ref_layer_norm(const tb_node *node, const tb__rview *in, tb__rview *out) {
    int32_t nd = node->num_attrs > 0 ? (int32_t)node->attrs[0] : 1, d;
    bool has_w = node->num_attrs > 1 && node->attrs[1] != 0;
    bool has_b = node->num_attrs > 2 && node->attrs[2] != 0;
    double eps = node->fattrs[0];
    const tb_shape *xs = &in[0].shape;
    int64_t len = 1, rows = 1, r, l;
    tb__rview xc, wc, bc;
    double *row = NULL, *w = NULL, *b = NULL;
    tb_status st = TB_OK;
    uint32_t need = 1u + (has_w ? 1u : 0u) + (has_b ? 1u : 0u);
    memset(&xc, 0, sizeof(xc));
    memset(&wc, 0, sizeof(wc));
    memset(&bc, 0, sizeof(bc));
    if (nd < 1 || nd > xs->rank || node->num_operands != need)
        return tb__error(TB_ERR_INTERNAL, "reference: malformed layer_norm node");
    for (d = 0; d < xs->rank; d++) {
        if (d < xs->rank - nd)
            rows *= xs->dims[d];
        else
            len *= xs->dims[d];
    }
    st = tb__rview_contig(&in[0], &xc);
    if (st == TB_OK && has_w) st = tb__rview_contig(&in[1], &wc);
    if (st == TB_OK && has_b) st = tb__rview_contig(&in[has_w ? 2 : 1], &bc);
    if (st == TB_OK) st = tb__ref_alloc_row(len, &row);
    if (st == TB_OK && has_w) st = tb__ref_alloc_row(len, &w);
    if (st == TB_OK && has_b) st = tb__ref_alloc_row(len, &b);
    if (st == TB_OK &&
        ((has_w && tb__ref_numel(&wc.shape) != len) || (has_b && tb__ref_numel(&bc.shape) != len)))
        st = tb__error(TB_ERR_INTERNAL, "reference: layer_norm weight or bias of the wrong size");
    if (st == TB_OK) st = tb__rview_alloc(out, &node->shape);
    if (st == TB_OK) {
        const char *src = tb__rview_ptr(&xc);
        int64_t es = tb__ref_esize(xs->dtype), oes = tb__ref_esize(node->shape.dtype);
        if (has_w) tb__ref_load_row(wc.shape.dtype, tb__rview_ptr(&wc), 1, len, w);
        if (has_b) tb__ref_load_row(bc.shape.dtype, tb__rview_ptr(&bc), 1, len, b);
        for (r = 0; r < rows; r++) {
            double mean = 0.0, var = 0.0, rstd;
            tb__ref_load_row(xs->dtype, src + r * len * es, 1, len, row);
            /* two passes: the variance of large values with a small spread stays exact */
            for (l = 0; l < len; l++)
                mean += row[l];
            mean /= (double)len;
            for (l = 0; l < len; l++)
                var += (row[l] - mean) * (row[l] - mean);
            var /= (double)len;
            rstd = 1.0 / sqrt(var + eps);
            for (l = 0; l < len; l++) {
                double y = (row[l] - mean) * rstd;
                if (has_w) y *= w[l];
                if (has_b) y += b[l];
                row[l] = y;
            }
            tb__ref_store_row(node->shape.dtype, out->buf->data + r * len * oes, 1, len, row);
        }
    }
    tb__free(row);
    tb__free(w);
    tb__free(b);
    tb__rview_clear(&xc);
    tb__rview_clear(&wc);
    tb__rview_clear(&bc);
    return st;
}

/* ---- movement ops: views, no copies ---- */

/* Strides that let a view of dims/strides be read with new dims without copying, as NumPy's
   attempt_nocopy_reshape; false when the memory layout does not allow it. */
static bool tb__ref_reshape_strides(const tb__rview *v, const tb_shape *ns, int64_t *nstrides) {
    int64_t od[TB_MAX_RANK], ost[TB_MAX_RANK];
    int32_t oldnd = 0, newnd = ns->rank, d;
    int32_t oi = 0, oj = 1, ni = 0, nj = 1, ok, nk;
    for (d = 0; d < v->shape.rank; d++) {
        if (v->shape.dims[d] != 1) {
            od[oldnd] = v->shape.dims[d];
            ost[oldnd] = v->strides[d];
            oldnd++;
        }
    }
    while (ni < newnd && oi < oldnd) {
        int64_t np = ns->dims[ni], op = od[oi];
        while (np != op) {
            if (np < op) {
                if (nj >= newnd) return false;
                np *= ns->dims[nj++];
            } else {
                if (oj >= oldnd) return false;
                op *= od[oj++];
            }
        }
        for (ok = oi; ok < oj - 1; ok++)
            if (ost[ok] != od[ok + 1] * ost[ok + 1]) return false;
        nstrides[nj - 1] = ost[oj - 1];
        for (nk = nj - 1; nk > ni; nk--)
            nstrides[nk - 1] = nstrides[nk] * ns->dims[nk];
        ni = nj++;
        oi = oj++;
    }
    /* trailing axes of size 1: any stride will do */
    for (nk = ni; nk < newnd; nk++)
        nstrides[nk] = 1;
    return true;
}

static tb_status tb__ref_movement(const tb_node *node, const tb__rview *x, tb__rview *out) {
    const tb_shape *xs = &x->shape, *os = &node->shape;
    int32_t d;
    tb_status st;
    if (os->dtype != xs->dtype) return tb__ref_malformed(node, xs);
    switch (node->op) {
    case TB_OP_RESHAPE: {
        int64_t ns[TB_MAX_RANK];
        if (tb__ref_numel(xs) != tb__ref_numel(os)) return tb__ref_malformed(node, xs);
        if (tb__ref_reshape_strides(x, os, ns)) {
            tb__rview_share(out, x);
            out->shape = *os;
            memcpy(out->strides, ns, sizeof(ns));
            return TB_OK;
        }
        st = tb__rview_contig(x, out);
        if (st != TB_OK) return st;
        out->shape = *os;
        tb__ref_contig_strides(os, out->strides);
        return TB_OK;
    }
    case TB_OP_PERMUTE: {
        uint32_t seen = 0;
        if (os->rank != xs->rank || (int64_t)node->num_attrs != os->rank)
            return tb__ref_malformed(node, xs);
        tb__rview_share(out, x);
        out->shape = *os;
        for (d = 0; d < os->rank; d++) {
            int64_t p = node->attrs[d];
            if (p < 0 || p >= xs->rank || ((seen >> p) & 1u) || xs->dims[p] != os->dims[d]) {
                tb__rview_clear(out);
                return tb__ref_malformed(node, xs);
            }
            seen |= 1u << p;
            out->strides[d] = x->strides[p];
        }
        return TB_OK;
    }
    case TB_OP_EXPAND: {
        int32_t shift = os->rank - xs->rank;
        if (shift < 0) return tb__ref_malformed(node, xs);
        for (d = 0; d < os->rank; d++) {
            int32_t j = d - shift;
            if (j >= 0 && xs->dims[j] != os->dims[d] && xs->dims[j] != 1)
                return tb__ref_malformed(node, xs);
        }
        tb__rview_share(out, x);
        out->shape = *os;
        for (d = 0; d < os->rank; d++) {
            int32_t j = d - shift;
            out->strides[d] = (j < 0 || xs->dims[j] != os->dims[d]) ? 0 : x->strides[j];
        }
        return TB_OK;
    }
    case TB_OP_SLICE: {
        int64_t dim, start, step, last;
        if (node->num_attrs < 4 || os->rank != xs->rank) return tb__ref_malformed(node, xs);
        dim = node->attrs[0];
        start = node->attrs[1];
        step = node->attrs[3];
        if (dim < 0 || dim >= xs->rank || start < 0 || step < 1) return tb__ref_malformed(node, xs);
        for (d = 0; d < os->rank; d++)
            if (d != dim && os->dims[d] != xs->dims[d]) return tb__ref_malformed(node, xs);
        if (start > xs->dims[dim]) return tb__ref_malformed(node, xs);
        /* the last element read must exist (the output is not empty here) */
        if (os->dims[dim] > 0 &&
            (!tb__muladd_i64(os->dims[dim] - 1, step, start, &last) || last >= xs->dims[dim]))
            return tb__ref_malformed(node, xs);
        tb__rview_share(out, x);
        out->shape = *os;
        /* Inside the operand: both fit. A step only scales the stride where the output has two
           or more elements along dim (then step < dims[dim]); a step as large as 2^62 over one
           element leaves the stride alone. */
        if (os->dims[dim] > 0) out->offset += start * x->strides[dim];
        if (os->dims[dim] > 1 && !tb__mul_i64(x->strides[dim], step, &out->strides[dim])) {
            tb__rview_clear(out);
            return tb__ref_malformed(node, xs);
        }
        return TB_OK;
    }
    case TB_OP_FLIP: {
        int64_t mask = node->num_attrs > 0 ? node->attrs[0] : 0;
        if (!tb_shape_equal(xs, os) || ((uint64_t)mask >> xs->rank) != 0)
            return tb__ref_malformed(node, xs);
        tb__rview_share(out, x);
        for (d = 0; d < xs->rank; d++) {
            if (tb__ref_mask_has(mask, d)) {
                out->offset += (xs->dims[d] - 1) * x->strides[d];
                out->strides[d] = -x->strides[d];
            }
        }
        return TB_OK;
    }
    default:
        break;
    }
    return tb__ref_malformed(node, xs);
}

/* ---- concat, pad, gather, index_select ---- */

static tb_status tb__ref_concat(const tb_node *node, const tb__rview *in, tb__rview *out) {
    int32_t dim = node->num_attrs > 0 ? (int32_t)node->attrs[0] : 0, d;
    const tb_shape *os = &node->shape;
    int64_t at = 0;
    uint32_t k;
    tb_status st;
    if (dim < 0 || dim >= os->rank || node->num_operands < 1) goto bad;
    for (k = 0; k < node->num_operands; k++) {
        if (in[k].shape.rank != os->rank) goto bad;
        for (d = 0; d < os->rank; d++)
            if (d != dim && in[k].shape.dims[d] != os->dims[d]) goto bad;
        if (!tb__add_i64(at, in[k].shape.dims[dim], &at)) goto bad;
    }
    if (at != os->dims[dim]) goto bad;
    st = tb__rview_alloc(out, os);
    if (st != TB_OK) return st;
    at = 0;
    for (k = 0; k < node->num_operands && st == TB_OK; k++) {
        tb__rview dst = *out;
        dst.shape.dims[dim] = in[k].shape.dims[dim];
        if (dst.shape.dims[dim] == 0 || tb__ref_numel(&dst.shape) == 0) continue;
        dst.offset = at * out->strides[dim];
        at += in[k].shape.dims[dim];
        st = tb__ref_copy(&dst, &in[k]);
    }
    if (st != TB_OK) tb__rview_clear(out);
    return st;
bad:
    return tb__ref_malformed(node, &in[0].shape);
}

/* Fills a contiguous view with one element's bytes. */
static void tb__ref_fill(tb__rview *v, const char *elem) {
    int64_t n = tb__ref_numel(&v->shape), es = tb__ref_esize(v->shape.dtype), i;
    char *p = tb__rview_ptr(v);
    for (i = 0; i < n; i++)
        memcpy(p + i * es, elem, (size_t)es);
}

static tb_status tb__ref_pad(const tb_node *node, const tb__rview *in, tb__rview *out) {
    const tb__rview *x = &in[0];
    const tb_shape *os = &node->shape;
    char value[8];
    tb__rview dst, src;
    int32_t d;
    tb_status st;
    if (os->rank != x->shape.rank || (int64_t)node->num_attrs != 2 * (int64_t)os->rank ||
        tb__ref_numel(&in[1].shape) != 1)
        goto bad;
    for (d = 0; d < os->rank; d++) {
        int64_t before = node->attrs[2 * d], after = node->attrs[2 * d + 1];
        int64_t size;
        if (before < 0 || after < 0 || !tb__add_i64(before, x->shape.dims[d], &size) ||
            !tb__add_i64(size, after, &size) || size != os->dims[d])
            goto bad;
    }
    st = tb__rview_alloc(out, os);
    if (st != TB_OK) return st;
    memset(value, 0, sizeof(value));
    tb__ref_convert(os->dtype, value, in[1].shape.dtype, tb__rview_ptr(&in[1]));
    tb__ref_fill(out, value);
    if (tb__ref_numel(&x->shape) == 0) return TB_OK;
    dst = *out;
    src = *x;
    dst.shape = x->shape;
    dst.shape.dtype = os->dtype;
    for (d = 0; d < os->rank; d++)
        dst.offset += node->attrs[2 * d] * out->strides[d];
    st = tb__ref_copy(&dst, &src);
    if (st != TB_OK) tb__rview_clear(out);
    return st;
bad:
    return tb__ref_malformed(node, &in[0].shape);
}

static tb_status tb__ref_index_error(const tb_node *node, int64_t index, int32_t dim,
                                     int64_t size) {
    return tb__error(TB_ERR_EXECUTE, "tb_%s: index %lld is out of range for dim %d of size %lld",
                     tb_op_name(node->op), (long long)index, (int)dim, (long long)size);
}

static tb_status tb__ref_gather(const tb_node *node, const tb__rview *in, tb__rview *out) {
    const tb__rview *x = &in[0], *ix = &in[1];
    const tb_shape *os = &node->shape;
    int32_t dim = node->num_attrs > 0 ? (int32_t)node->attrs[0] : 0, d;
    int64_t idx[TB_MAX_RANK], xoff, ioff, n, o;
    int64_t es = tb__ref_esize(x->shape.dtype), ies = tb__ref_esize(ix->shape.dtype);
    tb_status st;
    if (x->shape.rank < 1 || ix->shape.rank != x->shape.rank || os->rank != x->shape.rank ||
        dim < 0 || dim >= os->rank || os->dtype != x->shape.dtype)
        goto bad;
    for (d = 0; d < os->rank; d++)
        if (ix->shape.dims[d] != os->dims[d] || (d != dim && os->dims[d] > x->shape.dims[d]))
            goto bad;
    st = tb__rview_alloc(out, os);
    if (st != TB_OK) return st;
    n = tb__ref_numel(os);
    memset(idx, 0, sizeof(idx));
    xoff = x->offset;
    ioff = ix->offset;
    for (o = 0; o < n; o++) {
        int64_t i = tb__ld_i(ix->shape.dtype, ix->buf->data + ioff * ies);
        if (i < 0 || i >= x->shape.dims[dim]) {
            tb__rview_clear(out);
            return tb__ref_index_error(node, i, dim, x->shape.dims[dim]);
        }
        memcpy(out->buf->data + o * es, x->buf->data + (xoff + i * x->strides[dim]) * es,
               (size_t)es);
        for (d = os->rank - 1; d >= 0; d--) {
            int64_t xs_ = d == dim ? 0 : x->strides[d];
            idx[d]++;
            xoff += xs_;
            ioff += ix->strides[d];
            if (idx[d] < os->dims[d]) break;
            xoff -= xs_ * os->dims[d];
            ioff -= ix->strides[d] * os->dims[d];
            idx[d] = 0;
        }
    }
    return TB_OK;
bad:
    return tb__ref_malformed(node, &in[0].shape);
}

static tb_status tb__ref_index_select(const tb_node *node, const tb__rview *in, tb__rview *out) {
    const tb__rview *x = &in[0], *ix = &in[1];
    const tb_shape *os = &node->shape;
    int32_t dim = node->num_attrs > 0 ? (int32_t)node->attrs[0] : 0, d;
    int64_t len, i, ies = tb__ref_esize(ix->shape.dtype);
    tb_status st = TB_OK;
    if (x->shape.rank < 1 || ix->shape.rank != 1 || os->rank != x->shape.rank || dim < 0 ||
        dim >= os->rank || os->dtype != x->shape.dtype)
        goto bad;
    len = ix->shape.dims[0];
    for (d = 0; d < os->rank; d++)
        if (os->dims[d] != (d == dim ? len : x->shape.dims[d])) goto bad;
    /* every index is checked first, so a bad one fails before any work */
    for (i = 0; i < len; i++) {
        int64_t v =
            tb__ld_i(ix->shape.dtype, ix->buf->data + (ix->offset + i * ix->strides[0]) * ies);
        if (v < 0 || v >= x->shape.dims[dim])
            return tb__ref_index_error(node, v, dim, x->shape.dims[dim]);
    }
    st = tb__rview_alloc(out, os);
    if (st != TB_OK) return st;
    if (tb__ref_numel(os) == 0) return TB_OK;
    for (i = 0; i < len && st == TB_OK; i++) {
        int64_t v =
            tb__ld_i(ix->shape.dtype, ix->buf->data + (ix->offset + i * ix->strides[0]) * ies);
        tb__rview src = *x, dst = *out;
        src.shape.dims[dim] = 1;
        src.offset += v * x->strides[dim];
        dst.shape.dims[dim] = 1;
        dst.offset = i * out->strides[dim];
        st = tb__ref_copy(&dst, &src);
    }
    if (st != TB_OK) tb__rview_clear(out);
    return st;
bad:
    return tb__ref_malformed(node, &in[0].shape);
}

/* ---- leaves and generators ---- */

static tb_status tb__ref_leaf(const tb_node *node, tb__rview *out) {
    const tb_shape *os = &node->shape;
    int64_t n = tb__ref_numel(os), i, es = tb__ref_esize(os->dtype);
    tb_status st = tb__rview_alloc(out, os);
    char *o;
    if (st != TB_OK) return st;
    o = out->buf->data;
    switch (node->op) {
    case TB_OP_DEVICE_DATA:
        if (!node->data) {
            st = tb__error(TB_ERR_INTERNAL, "reference: device data node without data");
            break;
        }
        if (n > 0) st = tb__data_to_host(node->data, o);
        break;
    case TB_OP_SCALAR:
        if (tb_dtype_is_float(node->scalar.dtype))
            tb__st_f(os->dtype, o, node->scalar.f);
        else
            tb__st_i(os->dtype, o, node->scalar.i);
        break;
    case TB_OP_ARANGE: {
        double start = node->fattrs[0], step = node->fattrs[1];
        if (tb_dtype_is_float(os->dtype)) {
            for (i = 0; i < n; i++)
                tb__st_f(os->dtype, o + i * es, start + (double)i * step);
        } else {
            /* whole start and step: exact in int64 (wrapping, never undefined) */
            int64_t s0 = tb__ref_f2i(start), s1 = tb__ref_f2i(step);
            for (i = 0; i < n; i++)
                tb__st_i(os->dtype, o + i * es,
                         (int64_t)((uint64_t)s0 + (uint64_t)i * (uint64_t)s1));
        }
        break;
    }
    case TB_OP_EYE: {
        int64_t rows, cols;
        if (os->rank != 2) {
            st = tb__error(TB_ERR_INTERNAL, "reference: eye node of rank %d", (int)os->rank);
            break;
        }
        rows = os->dims[0];
        cols = os->dims[1];
        if (n > 0) memset(o, 0, (size_t)(n * es));
        for (i = 0; i < rows && i < cols; i++)
            tb__st_i(os->dtype, o + (i * cols + i) * es, 1);
        break;
    }
    default:
        st = tb__error(TB_ERR_INTERNAL, "reference: %s is not a leaf", tb_op_name(node->op));
        break;
    }
    if (st != TB_OK) tb__rview_clear(out);
    return st;
}

static tb_status tb__ref_random(const tb_node *node, const tb__rview *in, tb__rview *out) {
    const tb_shape *os = &node->shape;
    int64_t n = tb__ref_numel(os), i, es = tb__ref_esize(os->dtype);
    uint64_t seed, offset;
    tb_status st;
    if (tb__ref_numel(&in[0].shape) != 1 || tb__ref_numel(&in[1].shape) != 1)
        return tb__error(TB_ERR_INTERNAL, "reference: %s seed and offset must be scalars",
                         tb_op_name(node->op));
    /* i64 scalars holding the uint64 values bit for bit */
    seed = (uint64_t)tb__ld_i(in[0].shape.dtype, tb__rview_ptr(&in[0]));
    offset = (uint64_t)tb__ld_i(in[1].shape.dtype, tb__rview_ptr(&in[1]));
    st = tb__rview_alloc(out, os);
    if (st != TB_OK) return st;
    for (i = 0; i < n; i++) {
        double v = node->op == TB_OP_RAND ? tb__rng_uniform(os->dtype, seed, offset, (uint64_t)i)
                                          : tb__rng_normal(os->dtype, seed, offset, (uint64_t)i);
        tb__st_f(os->dtype, out->buf->data + i * es, v);
    }
    return TB_OK;
}

/* ---- custom ops ---- */

static tb_status tb__ref_custom(const tb_node *node, const tb__rview *in, tb__rview *out) {
    const tb_custom_op_desc *desc = tb_op_custom_desc(node->op);
    uint32_t n = node->num_operands, k;
    tb__rview *views = NULL;
    const void **ptrs = NULL;
    tb_shape *shapes = NULL;
    char before[1024];
    tb_status st = TB_OK;
    if (!desc || !desc->reference)
        return tb__error(TB_ERR_INTERNAL, "reference: unknown op %d", (int)node->op);
    views = (tb__rview *)tb__calloc(n + 1u, sizeof(tb__rview));
    ptrs = (const void **)tb__calloc(n + 1u, sizeof(void *));
    shapes = (tb_shape *)tb__calloc(n + 1u, sizeof(tb_shape));
    if (!views || !ptrs || !shapes) st = TB_ERR_OUT_OF_MEMORY;
    for (k = 0; k < n && st == TB_OK; k++) {
        st = tb__rview_contig(&in[k], &views[k]);
        if (st == TB_OK) {
            ptrs[k] = tb__rview_ptr(&views[k]);
            shapes[k] = in[k].shape;
        }
    }
    if (st == TB_OK) st = tb__rview_alloc(out, &node->shape);
    if (st == TB_OK) {
        /* the op may report its own reason; give one when it did not */
        snprintf(before, sizeof(before), "%s", tb_last_error());
        st = desc->reference(ptrs, shapes, n, out->buf->data, &node->shape, node->attrs,
                             node->num_attrs, desc->user_data);
        if (st != TB_OK) {
            if (tb_last_status() == TB_OK || strcmp(before, tb_last_error()) == 0) {
                tb_status code = st;
                if (code <= TB_OK || code >= TB_STATUS_COUNT) code = TB_ERR_EXECUTE;
                st = tb__error(code, "%s: the custom op's reference failed (%s)", desc->name,
                               tb_status_string(code));
            }
            tb__rview_clear(out);
        }
    }
    if (views)
        for (k = 0; k < n; k++)
            tb__rview_clear(&views[k]);
    tb__free(views);
    tb__free((void *)ptrs);
    tb__free(shapes);
    return st;
}

/* ---- one node ---- */

static tb_status tb__ref_check_arity(const tb_node *node) {
    int32_t arity = tb_op_arity(node->op);
    if (node->op == TB_OP_LAYER_NORM || node->op == TB_OP_CONCAT) return TB_OK;
    if (node->op >= TB_OP_BUILTIN_COUNT) {
        const tb_custom_op_desc *desc = tb_op_custom_desc(node->op);
        arity = desc ? desc->num_inputs : -1;
    }
    if (arity < 0 || (uint32_t)arity != node->num_operands)
        return tb__error(TB_ERR_INTERNAL, "reference: %s node with %u operands",
                         tb_op_name(node->op) ? tb_op_name(node->op) : "unknown",
                         (unsigned)node->num_operands);
    return TB_OK;
}

/* Computes `node` from its operands' values into *out (a new view holding a reference). */
static tb_status tb__ref_compute(const tb_node *node, const tb__rview *in, tb__rview *out) {
    tb_status st;
    uint32_t k;
    memset(out, 0, sizeof(*out));
    st = tb__ref_check_arity(node);
    if (st != TB_OK) return st;
    for (k = 0; k < node->num_operands; k++)
        if (!in[k].buf) return tb__error(TB_ERR_INTERNAL, "reference: an operand has no value");
    /* an empty result needs no work (and no index checks, as in PyTorch) */
    if (tb__ref_numel(&node->shape) == 0 && node->op != TB_OP_DEVICE_DATA)
        return tb__rview_alloc(out, &node->shape);
    if (node->op >= TB_OP_BUILTIN_COUNT) return tb__ref_custom(node, in, out);
    switch (tb_op_get_kind(node->op)) {
    case TB_KIND_UNARY:
    case TB_KIND_BINARY:
    case TB_KIND_TERNARY:
        return tb__ref_elementwise(node, in, out);
    case TB_KIND_MOVEMENT:
        return tb__ref_movement(node, &in[0], out);
    default:
        break;
    }
    switch (node->op) {
    case TB_OP_DEVICE_DATA:
    case TB_OP_SCALAR:
    case TB_OP_ARANGE:
    case TB_OP_EYE:
        return tb__ref_leaf(node, out);
    case TB_OP_RAND:
    case TB_OP_RANDN:
        return tb__ref_random(node, in, out);
    case TB_OP_SUM:
    case TB_OP_MEAN:
    case TB_OP_MAX:
    case TB_OP_MIN:
    case TB_OP_PROD:
        return tb__ref_reduce(node, &in[0], out);
    case TB_OP_ARGMAX:
    case TB_OP_ARGMIN:
        return tb__ref_argminmax(node, &in[0], out);
    case TB_OP_MATMUL:
        return tb__ref_matmul(node, &in[0], &in[1], out);
    case TB_OP_SOFTMAX:
    case TB_OP_LOG_SOFTMAX:
        return tb__ref_softmax(node, &in[0], out);
    case TB_OP_LAYER_NORM:
        return tb__ref_layer_norm(node, in, out);
    case TB_OP_CONCAT:
        return tb__ref_concat(node, in, out);
    case TB_OP_PAD:
        return tb__ref_pad(node, in, out);
    case TB_OP_GATHER:
        return tb__ref_gather(node, in, out);
    case TB_OP_INDEX_SELECT:
        return tb__ref_index_select(node, in, out);
    default:
        break;
    }
    return tb__error(TB_ERR_INTERNAL, "reference: no implementation of op %d", (int)node->op);
}

TB__UNUSED static tb_status tb__ref_eval_node(const tb_node *node, const void *const *operands,
                                              void *output) {
    tb__rview *in = NULL, out;
    uint32_t n, k;
    tb_status st = TB_OK;
    if (!node || (node->num_operands > 0 && !operands))
        return tb__error(TB_ERR_INTERNAL, "reference: eval_node without a node or operands");
    n = node->num_operands;
    in = (tb__rview *)tb__calloc(n + 1u, sizeof(tb__rview));
    if (!in) return TB_ERR_OUT_OF_MEMORY;
    for (k = 0; k < n && st == TB_OK; k++)
        st = tb__rview_borrow(&in[k], &node->operands[k]->shape, operands[k]);
    if (st == TB_OK) st = tb__ref_compute(node, in, &out);
    if (st == TB_OK) {
        if (!output && tb__ref_numel(&node->shape) > 0)
            st = tb__error(TB_ERR_INTERNAL, "reference: eval_node without an output array");
        else if (output)
            st = tb__rview_to_host(&out, output);
        tb__rview_clear(&out);
    }
    for (k = 0; k < n; k++)
        tb__rview_clear(&in[k]);
    tb__free(in);
    return st;
}

/* ---- whole graphs ---- */

typedef struct tb__ref_slot {
    const tb_node *node;
    tb__rview value;
    int64_t uses;   /* operand uses by needed nodes not yet run */
    int64_t param;  /* index in graph->parameters, -1 when computed */
    int64_t result; /* first index in graph->results, -1 when none */
    bool needed;
} tb__ref_slot;

typedef struct tb__ref_map {
    const tb_node **keys;
    size_t *vals;
    size_t mask;
} tb__ref_map;

static size_t tb__ref_ptr_hash(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

static tb_status tb__ref_map_init(tb__ref_map *m, size_t count) {
    size_t cap = 16;
    while (cap < count * 2u) {
        if (cap > SIZE_MAX / 4u) return tb__error(TB_ERR_OVERFLOW, "reference: graph too large");
        cap *= 2u;
    }
    m->mask = cap - 1u;
    m->keys = (const tb_node **)tb__calloc(cap, sizeof(tb_node *));
    m->vals = (size_t *)tb__calloc(cap, sizeof(size_t));
    if (!m->keys || !m->vals) return TB_ERR_OUT_OF_MEMORY;
    return TB_OK;
}

static void tb__ref_map_free(tb__ref_map *m) {
    tb__free((void *)m->keys);
    tb__free(m->vals);
}

/* The slot of `node`, or SIZE_MAX. */
static size_t tb__ref_map_get(const tb__ref_map *m, const tb_node *node) {
    size_t h = tb__ref_ptr_hash(node) & m->mask;
    while (m->keys[h]) {
        if (m->keys[h] == node) return m->vals[h];
        h = (h + 1u) & m->mask;
    }
    return SIZE_MAX;
}

/* Inserts unless present; returns the node's slot. */
static size_t tb__ref_map_put(tb__ref_map *m, const tb_node *node, size_t slot) {
    size_t h = tb__ref_ptr_hash(node) & m->mask;
    while (m->keys[h]) {
        if (m->keys[h] == node) return m->vals[h];
        h = (h + 1u) & m->mask;
    }
    m->keys[h] = node;
    m->vals[h] = slot;
    return slot;
}

TB__UNUSED static tb_status tb__ref_run_graph(const tb_graph *graph, const void *const *parameters,
                                              void *const *results) {
    tb__ref_slot *slots = NULL;
    int64_t *next_result = NULL;
    tb__rview *in = NULL;
    size_t in_cap = 0, nslots = 0, i, total;
    tb__ref_map map;
    tb__ref_pool pool, *outer_pool = tb__ref_current_pool;
    tb_status st = TB_OK;
    memset(&map, 0, sizeof(map));
    memset(&pool, 0, sizeof(pool));
    if (!graph || (graph->num_nodes > 0 && !graph->nodes) ||
        (graph->num_parameters > 0 && !parameters) ||
        (graph->num_parameters > 0 && !graph->parameters) ||
        (graph->num_results > 0 && (!results || !graph->results)))
        return tb__error(TB_ERR_INTERNAL, "reference: malformed graph");
    if (graph->num_nodes > SIZE_MAX / 4u - graph->num_parameters)
        return tb__error(TB_ERR_OVERFLOW, "reference: graph too large");
    total = graph->num_nodes + graph->num_parameters;
    slots = (tb__ref_slot *)tb__calloc(total + 1u, sizeof(tb__ref_slot));
    next_result = (int64_t *)tb__calloc(graph->num_results + 1u, sizeof(int64_t));
    if (!slots || !next_result) {
        st = TB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    st = tb__ref_map_init(&map, total);
    if (st != TB_OK) goto done;
    tb__ref_current_pool = &pool;

    /* slots: the nodes in post-order, then parameters the node list lacks */
    for (i = 0; i < graph->num_nodes; i++) {
        const tb_node *node = graph->nodes[i];
        if (!node) {
            st = tb__error(TB_ERR_INTERNAL, "reference: NULL node in the graph");
            goto done;
        }
        if (tb__ref_map_put(&map, node, nslots) == nslots) {
            slots[nslots].node = node;
            slots[nslots].param = -1;
            slots[nslots].result = -1;
            nslots++;
        }
    }
    for (i = 0; i < graph->num_parameters; i++) {
        const tb_node *node = graph->parameters[i];
        size_t s;
        if (!node) {
            st = tb__error(TB_ERR_INTERNAL, "reference: NULL parameter in the graph");
            goto done;
        }
        s = tb__ref_map_put(&map, node, nslots);
        if (s == nslots) {
            slots[nslots].node = node;
            slots[nslots].result = -1;
            nslots++;
        }
        slots[s].param = (int64_t)i;
    }
    for (i = graph->num_results; i-- > 0;) {
        size_t s = graph->results[i] ? tb__ref_map_get(&map, graph->results[i]) : SIZE_MAX;
        if (s == SIZE_MAX) {
            st = tb__error(TB_ERR_INTERNAL, "reference: result %zu is not a node of the graph", i);
            goto done;
        }
        next_result[i] = slots[s].result;
        slots[s].result = (int64_t)i;
        slots[s].needed = true;
    }
    /* what the results need, and how often each value is used (consumers come after their
       operands, so a backward walk sees every consumer first) */
    for (i = nslots; i-- > 0;) {
        tb__ref_slot *sl = &slots[i];
        uint32_t k;
        if (!sl->needed || sl->param >= 0) continue;
        if (sl->node->num_operands > 0 && !sl->node->operands) {
            st = tb__error(TB_ERR_INTERNAL, "reference: node without its operands");
            goto done;
        }
        for (k = 0; k < sl->node->num_operands; k++) {
            size_t s = tb__ref_map_get(&map, sl->node->operands[k]);
            if (s == SIZE_MAX || s >= i) {
                st = tb__error(TB_ERR_INTERNAL,
                               "reference: an operand of a %s node is not before it in the graph",
                               tb_op_name(sl->node->op) ? tb_op_name(sl->node->op) : "custom");
                goto done;
            }
            slots[s].needed = true;
            slots[s].uses++;
        }
        if (sl->node->num_operands > in_cap) in_cap = sl->node->num_operands;
    }
    in = (tb__rview *)tb__calloc(in_cap + 1u, sizeof(tb__rview));
    if (!in) {
        st = TB_ERR_OUT_OF_MEMORY;
        goto done;
    }

    /* parameters first: nodes that are not in the node list come after it */
    for (i = 0; i < nslots; i++) {
        tb__ref_slot *sl = &slots[i];
        if (sl->needed && sl->param >= 0) {
            st = tb__rview_borrow(&sl->value, &sl->node->shape, parameters[sl->param]);
            if (st != TB_OK) goto done;
        }
    }
    for (i = 0; i < nslots; i++) {
        tb__ref_slot *sl = &slots[i];
        int64_t r;
        uint32_t k;
        if (!sl->needed) continue;
        if (sl->param < 0) {
            for (k = 0; k < sl->node->num_operands; k++)
                in[k] = slots[tb__ref_map_get(&map, sl->node->operands[k])].value;
            st = tb__ref_compute(sl->node, in, &sl->value);
            if (st != TB_OK) goto done;
            /* operands whose last user this was are freed now: memory stays bounded */
            for (k = 0; k < sl->node->num_operands; k++) {
                tb__ref_slot *op = &slots[tb__ref_map_get(&map, sl->node->operands[k])];
                if (--op->uses == 0) tb__rview_clear(&op->value);
            }
        }
        for (r = sl->result; r >= 0; r = next_result[r]) {
            st = tb__rview_to_host(&sl->value, results[r]);
            if (st != TB_OK) goto done;
        }
        if (sl->uses == 0) tb__rview_clear(&sl->value);
    }

done:
    if (slots)
        for (i = 0; i < nslots; i++)
            tb__rview_clear(&slots[i].value);
    tb__ref_current_pool = outer_pool;
    tb__ref_pool_drain(&pool);
    tb__free(slots);
    tb__free(next_result);
    tb__free(in);
    tb__ref_map_free(&map);
    return st;
}

#undef TB__REF_MAX_OPS
#undef TB__REF_POOL_SLOTS
#undef TB__REF_POOL_MIN
#undef TB__REF_SQRT1_2

/* ---- src/cpu_backend.c ---- */
/* ===========================================================================================
   The "cpu" backend: host memory plus the reference interpreter. Always present, needs
   nothing but the C library; the eager fallback and the correctness oracle of the others.
   =========================================================================================== */

/* A graph kept for execution: a detached copy of its structure, so that a cached computation
   holds no tensor's value (parameters arrive as execute arguments). */
typedef struct tb__cpu_program {
    tb__detached_graph detached;
    char *text; /* computation_backend_text, built on first use */
} tb__cpu_program;

/* The lowering context owns a program until compile moves it into the computation. */
typedef struct tb__cpu_context {
    tb__cpu_program *program;
} tb__cpu_context;

static void tb__cpu_program_free(tb__cpu_program *p) {
    if (p == NULL) return;
    tb__graph_detached_free(&p->detached);
    tb__free(p->text);
    tb__free(p);
}

static tb_status tb__cpu_data_from_host(void *user_data, tb_backend_data *data, const void *host) {
    size_t nbytes = 0;
    tb__host_buffer *hb;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &nbytes);
    if (st != TB_OK) return st;
    hb = tb__host_buffer_new(nbytes);
    if (hb == NULL) return tb_last_status();
    if (nbytes > 0) memcpy(hb->data, host, nbytes);
    data->payload = hb;
    return TB_OK;
}

static tb_status tb__cpu_data_from_scalar(void *user_data, tb_backend_data *data, tb_scalar value) {
    size_t size = tb_dtype_size(data->shape.dtype);
    tb__host_buffer *hb;
    (void)user_data;
    if (size == 0) {
        return tb__error(TB_ERR_DTYPE, "cpu: data_from_scalar: invalid dtype %d",
                         (int)data->shape.dtype);
    }
    hb = tb__host_buffer_new(size);
    if (hb == NULL) return tb_last_status();
    tb__scalar_store(value, data->shape.dtype, hb->data);
    data->payload = hb;
    return TB_OK;
}

static tb_status tb__cpu_data_to_host(void *user_data, const tb_backend_data *data, void *host) {
    const tb__host_buffer *hb = (const tb__host_buffer *)data->payload;
    size_t nbytes = 0;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &nbytes);
    if (st != TB_OK) return st;
    if (hb == NULL || hb->size < nbytes) {
        return tb__error(TB_ERR_INTERNAL,
                         "cpu: data_to_host: the buffer holds %zu bytes, %zu "
                         "wanted",
                         hb != NULL ? hb->size : (size_t)0, nbytes);
    }
    if (nbytes > 0) memcpy(host, hb->data, nbytes);
    return TB_OK;
}

static void tb__cpu_data_release(void *user_data, tb_backend_data *data) {
    (void)user_data;
    tb__host_buffer_free((tb__host_buffer *)data->payload);
    data->payload = NULL;
}

static tb_status tb__cpu_create_lowering_context(void *user_data, const tb_graph *graph,
                                                 void **context) {
    tb__cpu_context *ctx;
    tb__cpu_program *p;
    tb_status st;
    (void)user_data;
    if (graph == NULL || context == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "cpu: create_lowering_context: %s is NULL",
                         graph == NULL ? "graph" : "context");
    }
    if ((graph->num_nodes > 0 && graph->nodes == NULL) ||
        (graph->num_parameters > 0 && graph->parameters == NULL) ||
        (graph->num_results > 0 && graph->results == NULL)) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "cpu: create_lowering_context: a node array "
                                                  "of the graph is NULL");
    }
    ctx = (tb__cpu_context *)tb__calloc(1, sizeof *ctx);
    p = ctx != NULL ? (tb__cpu_program *)tb__calloc(1, sizeof *p) : NULL;
    if (p == NULL) {
        tb__free(ctx);
        return tb_last_status();
    }
    st = tb__graph_detach(graph, &p->detached);
    if (st != TB_OK) {
        if (tb_last_status() == TB_OK) tb__error(st, "cpu: create_lowering_context: out of memory");
        tb__free(p);
        tb__free(ctx);
        return st;
    }
    ctx->program = p;
    *context = ctx;
    return TB_OK;
}

static void tb__cpu_release_lowering_context(void *user_data, void *context) {
    tb__cpu_context *ctx = (tb__cpu_context *)context;
    (void)user_data;
    if (ctx == NULL) return;
    tb__cpu_program_free(ctx->program); /* NULL once compile took it */
    tb__free(ctx);
}

/* The position of `node` among nodes[0..count): the detached copies were made in post-order,
   so their ids increase along the array. */
static size_t tb__cpu_position(const tb_node *const *nodes, size_t count, const tb_node *node) {
    size_t lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (nodes[mid]->id < node->id) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < count && nodes[lo] == node ? lo : count;
}

/* "cpu reference computation: ..." then one line per node in post-order, named by position. */
static char *tb__cpu_program_text(const tb__cpu_program *p) {
    const tb_graph *g = &p->detached.graph;
    tb__str s;
    size_t i, j;
    memset(&s, 0, sizeof s);
    tb__str_append(&s,
                   "cpu reference computation: hash 0x%016llx, %zu nodes, %zu parameters, %zu "
                   "results\n",
                   (unsigned long long)g->hash, g->num_nodes, g->num_parameters, g->num_results);
    for (i = 0; i < g->num_nodes; i++) {
        const tb_node *n = g->nodes[i];
        const char *name = tb_op_name(n->op);
        char text[96];
        tb__shape_text(&n->shape, text);
        tb__str_append(&s, "  %%%zu = %s(", i, name != NULL ? name : "?");
        for (j = 0; j < n->num_operands; j++) {
            tb__str_append(&s, j == 0 ? "%%%zu" : ", %%%zu",
                           tb__cpu_position(g->nodes, i, n->operands[j]));
        }
        tb__str_append(&s, ") %s\n", text);
    }
    return tb__str_take(&s);
}

static tb_status tb__cpu_compile(void *user_data, void *context, void **computation) {
    tb__cpu_context *ctx = (tb__cpu_context *)context;
    (void)user_data;
    if (ctx == NULL || ctx->program == NULL || computation == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "cpu: compile: no lowering context");
    }
    /* nothing to compile: the interpreter runs the detached graph */
    *computation = ctx->program;
    ctx->program = NULL;
    return TB_OK;
}

static tb_status tb__cpu_execute(void *user_data, void *computation,
                                 tb_backend_data *const *arguments, size_t num_arguments,
                                 tb_backend_data *const *results, size_t num_results) {
    tb__cpu_program *p = (tb__cpu_program *)computation;
    const void **params = NULL;
    void **outs = NULL;
    tb__host_buffer **buffers = NULL;
    tb_status st = TB_OK;
    size_t i;
    (void)user_data;
    if (p == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "cpu: execute: computation is NULL");
    if (num_arguments != p->detached.graph.num_parameters ||
        num_results != p->detached.graph.num_results) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "cpu: execute: %zu arguments and %zu results given, the computation "
                         "takes %zu and gives %zu",
                         num_arguments, num_results, p->detached.graph.num_parameters,
                         p->detached.graph.num_results);
    }
    params = (const void **)tb__calloc(num_arguments + 1, sizeof *params);
    outs = (void **)tb__calloc(num_results + 1, sizeof *outs);
    buffers = (tb__host_buffer **)tb__calloc(num_results + 1, sizeof *buffers);
    if (params == NULL || outs == NULL || buffers == NULL) {
        st = tb_last_status();
        goto done;
    }
    for (i = 0; i < num_arguments; i++) {
        const tb__host_buffer *hb =
            arguments[i] != NULL ? (const tb__host_buffer *)arguments[i]->payload : NULL;
        if (hb == NULL) {
            st = tb__error(TB_ERR_INVALID_ARGUMENT, "cpu: execute: argument %zu has no value", i);
            goto done;
        }
        params[i] = hb->data;
    }
    for (i = 0; i < num_results; i++) {
        size_t nbytes = 0;
        if (results[i] == NULL) {
            st = tb__error(TB_ERR_INVALID_ARGUMENT, "cpu: execute: result %zu is NULL", i);
            goto done;
        }
        st = tb_shape_nbytes(&results[i]->shape, &nbytes);
        if (st != TB_OK) goto done;
        buffers[i] = tb__host_buffer_new(nbytes);
        if (buffers[i] == NULL) {
            st = tb_last_status();
            goto done;
        }
        outs[i] = buffers[i]->data;
    }
    st = tb__ref_run_graph(&p->detached.graph, params, outs);
    if (st != TB_OK) goto done;
    for (i = 0; i < num_results; i++) {
        /* LTC's Assign: a placeholder that already had a value gets the new one */
        tb__host_buffer_free((tb__host_buffer *)results[i]->payload);
        results[i]->payload = buffers[i];
        buffers[i] = NULL;
    }
done:
    if (buffers != NULL) {
        for (i = 0; i < num_results; i++)
            tb__host_buffer_free(buffers[i]);
    }
    tb__free(buffers);
    tb__free(outs);
    tb__free((void *)params);
    return st;
}

static void tb__cpu_release_computation(void *user_data, void *computation) {
    (void)user_data;
    tb__cpu_program_free((tb__cpu_program *)computation);
}

/* Built on first use (most computations are never printed), under a lock since a cached
   computation may be printed from several threads. */
static tb__mutex tb__cpu_text_mutex = TB__MUTEX_INIT;

static const char *tb__cpu_backend_text(void *user_data, const void *computation) {
    tb__cpu_program *p;
    const char *text;
    (void)user_data;
    if (computation == NULL) return NULL;
    memcpy(&p, &computation, sizeof p); /* the cache is ours to fill */
    tb__mutex_lock(&tb__cpu_text_mutex);
    if (p->text == NULL) p->text = tb__cpu_program_text(p);
    text = p->text;
    tb__mutex_unlock(&tb__cpu_text_mutex);
    return text;
}

static size_t tb__cpu_get_backend_devices(void *user_data, tb_device *out, size_t cap) {
    (void)user_data;
    if (out != NULL && cap > 0) {
        memset(&out[0], 0, sizeof out[0]);
        memcpy(out[0].backend, "cpu", 4);
        out[0].type = TB_DEVICE_CPU;
        out[0].ordinal = 0;
    }
    return 1;
}

static uint64_t tb__cpu_physical_memory(void) {
#if defined(_WIN32)
    MEMORYSTATUSEX status;
    status.dwLength = sizeof status;
    return GlobalMemoryStatusEx(&status) ? (uint64_t)status.ullTotalPhys : 0;
#elif defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
#else
    return 0;
#endif
}

static uint32_t tb__cpu_count(void) {
#if defined(_WIN32)
    SYSTEM_INFO info;
    GetSystemInfo(&info);
    return (uint32_t)info.dwNumberOfProcessors;
#elif defined(_SC_NPROCESSORS_ONLN)
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (uint32_t)n : 1;
#else
    return 1;
#endif
}

static tb_status tb__cpu_get_device_info(void *user_data, int32_t ordinal, tb_device_info *out) {
    (void)user_data;
    if (ordinal != 0) {
        return tb__error(TB_ERR_NOT_FOUND, "cpu: device ordinal %d out of range: 1 device",
                         (int)ordinal);
    }
    snprintf(out->name, sizeof out->name, "reference");
    snprintf(out->vendor, sizeof out->vendor, "torch_backend.h");
    snprintf(out->driver_version, sizeof out->driver_version, "%s", TB_VERSION_STRING);
    snprintf(out->language_version, sizeof out->language_version, "C");
    out->global_memory = tb__cpu_physical_memory();
    out->max_allocation = out->global_memory;
    out->compute_units = tb__cpu_count();
    out->max_work_group_size = 1;
    out->unified_memory = true;
    out->supports_f64 = true;
    out->extensions[0] = '\0';
    return TB_OK;
}

static tb_device_type tb__cpu_eager_fallback(void *user_data) {
    (void)user_data;
    return TB_DEVICE_CPU;
}

static size_t tb__cpu_metrics_report(void *user_data, char *buf, size_t cap) {
    (void)user_data;
    if (buf != NULL && cap > 0) buf[0] = '\0';
    return 0;
}

static void tb__cpu_backend_impl(tb_backend_impl *out) {
    memset(out, 0, sizeof *out);
    out->data_from_host = tb__cpu_data_from_host;
    out->data_from_scalar = tb__cpu_data_from_scalar;
    out->data_to_host = tb__cpu_data_to_host;
    out->data_release = tb__cpu_data_release;
    out->create_lowering_context = tb__cpu_create_lowering_context;
    out->release_lowering_context = tb__cpu_release_lowering_context;
    out->compile = tb__cpu_compile;
    out->execute = tb__cpu_execute;
    out->release_computation = tb__cpu_release_computation;
    out->computation_backend_text = tb__cpu_backend_text;
    out->get_backend_devices = tb__cpu_get_backend_devices;
    out->get_device_info = tb__cpu_get_device_info;
    out->eager_fallback_device_type = tb__cpu_eager_fallback;
    out->create_metrics_report = tb__cpu_metrics_report;
}

/* ---- src/print.c ---- */
/* ===========================================================================================
   Printing tensors: PyTorch's repr (torch/_tensor_str.py) with its default print options
   =========================================================================================== */

#define TB__PRINT_THRESHOLD 1000 /* more elements than this: summarise */
#define TB__PRINT_EDGE      3    /* elements shown at each end of a summarised dim */
#define TB__PRINT_LINE      80   /* line width */
#define TB__PRINT_INDENT    7    /* strlen("tensor(") */
#define TB__PRINT_TEXT      400  /* room for any element's text (%.4f of DBL_MAX: 314) */

/* The value being printed and PyTorch's _Formatter state for it. */
typedef struct tb__printer {
    tb_shape shape;
    const unsigned char *data;
    int64_t strides[TB_MAX_RANK];
    bool summarize;
    bool floating;
    bool int_mode;
    bool sci_mode;
    bool any_finite; /* a finite non-zero value was seen */
    double min_abs, max_abs;
    int width;
    tb__str *out;
} tb__printer;

static double tb__print_float_at(const tb__printer *p, int64_t index) {
    if (p->shape.dtype == TB_F32) {
        float f;
        memcpy(&f, p->data + (size_t)index * 4, 4);
        return (double)f;
    } else {
        double v;
        memcpy(&v, p->data + (size_t)index * 8, 8);
        return v;
    }
}

static int64_t tb__print_int_at(const tb__printer *p, int64_t index) {
    int32_t i32;
    int64_t i64;
    switch (p->shape.dtype) {
    case TB_I32:
        memcpy(&i32, p->data + (size_t)index * 4, 4);
        return i32;
    case TB_I64:
        memcpy(&i64, p->data + (size_t)index * 8, 8);
        return i64;
    default: /* u8 and bool: one byte */
        return p->data[index];
    }
}

/* Python's '{:.4f}' / '{:.0f}' / '{:.4e}' of a double (mode 'f', '0', 'e'); non-finite values
   as Python writes them ("nan" never has a sign). Returns the length. */
static int tb__print_float_text(char *buf, size_t cap, double v, char mode) {
    if (v != v) return snprintf(buf, cap, "nan");
    if (v > DBL_MAX) return snprintf(buf, cap, "inf");
    if (v < -DBL_MAX) return snprintf(buf, cap, "-inf");
    if (mode == 'e') return snprintf(buf, cap, "%.4e", v);
    if (mode == '0') return snprintf(buf, cap, "%.0f", v);
    return snprintf(buf, cap, "%.4f", v);
}

/* One element as _Formatter.format writes it, padded on the left to the common width. */
static void tb__print_element(const tb__printer *p, int64_t index, char *buf, size_t cap) {
    char text[TB__PRINT_TEXT];
    int n, pad;
    if (p->floating) {
        double v = tb__print_float_at(p, index);
        if (p->sci_mode) {
            n = tb__print_float_text(text, sizeof text, v, 'e');
        } else if (p->int_mode) {
            n = tb__print_float_text(text, sizeof text, v, '0');
            if (v == v && v <= DBL_MAX && v >= -DBL_MAX) {
                text[n++] = '.';
                text[n] = '\0';
            }
        } else {
            n = tb__print_float_text(text, sizeof text, v, 'f');
        }
    } else if (p->shape.dtype == TB_BOOL) {
        n = snprintf(text, sizeof text, "%s", tb__print_int_at(p, index) ? "True" : "False");
    } else {
        n = snprintf(text, sizeof text, "%lld", (long long)tb__print_int_at(p, index));
    }
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof text) n = (int)sizeof text - 1;
    pad = p->width > n ? p->width - n : 0;
    if ((size_t)(pad + n) >= cap) pad = 0; /* never: widths come from these same texts */
    memset(buf, ' ', (size_t)pad);
    memcpy(buf + pad, text, (size_t)n);
    buf[pad + n] = '\0';
}

/* Calls `fn` on the flat index of every element shown (all, or the edges when summarised), in
   row-major order. */
static void tb__print_visit(tb__printer *p, int32_t dim, int64_t offset,
                            void (*fn)(tb__printer *p, int64_t index)) {
    int64_t n, i;
    if (dim == p->shape.rank) {
        fn(p, offset);
        return;
    }
    n = p->shape.dims[dim];
    for (i = 0; i < n; ++i) {
        if (p->summarize && n > 2 * TB__PRINT_EDGE && i == TB__PRINT_EDGE) i = n - TB__PRINT_EDGE;
        tb__print_visit(p, dim + 1, offset + i * p->strides[dim], fn);
    }
}

/* First pass of _Formatter: the range of the finite non-zero floats and whether all are
   integers. */
static void tb__print_scan(tb__printer *p, int64_t index) {
    double v, a;
    if (!p->floating) return;
    v = tb__print_float_at(p, index);
    if (v != v || v > DBL_MAX || v < -DBL_MAX || v == 0) return;
    a = fabs(v);
    if (!p->any_finite || a < p->min_abs) p->min_abs = a;
    if (!p->any_finite || a > p->max_abs) p->max_abs = a;
    p->any_finite = true;
    if (v != ceil(v)) p->int_mode = false;
}

/* Second pass: the widest element. */
static void tb__print_measure(tb__printer *p, int64_t index) {
    char text[TB__PRINT_TEXT];
    int n;
    if (p->floating) {
        double v = tb__print_float_at(p, index);
        if (v != v || v > DBL_MAX || v < -DBL_MAX || v == 0) return;
        if (p->sci_mode)
            n = tb__print_float_text(text, sizeof text, v, 'e');
        else if (p->int_mode)
            n = tb__print_float_text(text, sizeof text, v, '0') + 1;
        else
            n = tb__print_float_text(text, sizeof text, v, 'f');
    } else {
        tb__print_element(p, index, text, sizeof text); /* width is 1 here: no padding */
        n = (int)strlen(text);
    }
    if (n > p->width) p->width = n;
}

static void tb__print_formatter(tb__printer *p) {
    p->floating = tb_dtype_is_float(p->shape.dtype);
    p->int_mode = true;
    p->sci_mode = false;
    p->any_finite = false;
    p->width = 1;
    tb__print_visit(p, 0, 0, tb__print_scan);
    if (p->floating && !p->any_finite) return;
    if (p->floating) {
        bool wide = p->max_abs / p->min_abs > 1000.0 || p->max_abs > 1.0e8;
        p->sci_mode = p->int_mode ? wide : (wide || p->min_abs < 1.0e-4);
    }
    tb__print_visit(p, 0, 0, tb__print_measure);
}

static void tb__print_spaces(tb__str *s, int count) {
    if (count > 0) tb__str_append(s, "%*s", count, "");
}

/* _tensor_str_with_formatter for the sub-tensor at `dim` starting at flat index `offset`. */
static void tb__print_emit(tb__printer *p, int32_t dim, int64_t offset, int indent) {
    char text[TB__PRINT_TEXT];
    int64_t n, i;
    int32_t rank = p->shape.rank, k;
    bool cut;
    if (rank == 0) {
        tb__print_element(p, 0, text, sizeof text);
        tb__str_append(p->out, "%s", text);
        return;
    }
    n = p->shape.dims[dim];
    cut = p->summarize && n > 2 * TB__PRINT_EDGE;
    tb__str_append(p->out, "[");
    if (dim == rank - 1) {
        int per_line = (TB__PRINT_LINE - indent) / (p->width + 2);
        int64_t item = 0;
        if (per_line < 1) per_line = 1;
        for (i = 0; i < n; ++i, ++item) {
            if (item > 0) {
                if (item % per_line == 0) {
                    tb__str_append(p->out, ",\n");
                    tb__print_spaces(p->out, indent + 1);
                } else {
                    tb__str_append(p->out, ", ");
                }
            }
            if (cut && i == TB__PRINT_EDGE) {
                tb__str_append(p->out, " ...");
                i = n - TB__PRINT_EDGE - 1;
                continue;
            }
            tb__print_element(p, offset + i * p->strides[dim], text, sizeof text);
            tb__str_append(p->out, "%s", text);
        }
    } else {
        for (i = 0; i < n; ++i) {
            if (i > 0) {
                tb__str_append(p->out, ",");
                for (k = 0; k < rank - dim - 1; ++k)
                    tb__str_append(p->out, "\n");
                tb__print_spaces(p->out, indent + 1);
            }
            if (cut && i == TB__PRINT_EDGE) {
                tb__str_append(p->out, "...");
                i = n - TB__PRINT_EDGE - 1;
                continue;
            }
            tb__print_emit(p, dim + 1, offset + i * p->strides[dim], indent + 1);
        }
    }
    tb__str_append(p->out, "]");
}

/* _add_suffixes: ", suffix", or a new line indented under the value when the line would pass
   the line width. `last_line` carries PyTorch's count (including its off-by-two start). */
static void tb__print_suffix(tb__str *s, size_t *last_line, const char *suffix) {
    size_t len = strlen(suffix);
    if (*last_line + len + 2 > TB__PRINT_LINE) {
        tb__str_append(s, ",\n%*s%s", TB__PRINT_INDENT, "", suffix);
        *last_line = TB__PRINT_INDENT + len;
    } else {
        tb__str_append(s, ", %s", suffix);
        *last_line += len + 2;
    }
}

/* The whole text into `s` (which the caller frees). */
static tb_status tb__print_tensor(const char *fn, tb_tensor *tensor, tb__str *s) {
    tb__printer p;
    tb_device device;
    char text[128], device_text[64];
    size_t nbytes = 0, last_line, i;
    int64_t numel = 0;
    void *host;
    tb_status st;
    tb__ensure_setup();
    if (tensor == NULL) {
        if (tb_last_status() != TB_OK) return tb_last_status();
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: tensor is NULL", fn);
    }
    memset(&p, 0, sizeof p);
    p.shape = tb_tensor_shape(tensor);
    device = tb_tensor_device(tensor);
    st = tb_shape_numel(&p.shape, &numel);
    if (st == TB_OK) st = tb_shape_nbytes(&p.shape, &nbytes);
    if (st != TB_OK) return st;
    host = tb__alloc(nbytes ? nbytes : 1);
    if (host == NULL) return tb_last_status();
    st = tb_tensor_to_host(tensor, host, nbytes);
    if (st != TB_OK) {
        tb__free(host);
        return st;
    }
    p.data = (const unsigned char *)host;
    p.out = s;
    tb_shape_strides(&p.shape, p.strides);
    tb__str_append(s, "tensor(");
    if (numel == 0) {
        tb__str_append(s, "[]");
    } else {
        p.summarize = numel > TB__PRINT_THRESHOLD;
        tb__print_formatter(&p);
        tb__print_emit(&p, 0, 0, TB__PRINT_INDENT);
    }
    tb__free(host);
    if (s->failed) return tb__error(TB_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (i = s->len; i > 0 && s->data[i - 1] != '\n'; --i)
        ;
    last_line = s->len - i + 2; /* PyTorch's len - rfind('\n') + 1 */
    tb_device_format(&device, device_text, sizeof device_text);
    snprintf(text, sizeof text, "device='%s'", device_text);
    tb__print_suffix(s, &last_line, text);
    if (numel == 0 && p.shape.rank != 1) {
        size_t n = (size_t)snprintf(text, sizeof text, "size=(");
        int32_t d;
        for (d = 0; d < p.shape.rank; ++d)
            n += (size_t)snprintf(text + n, sizeof text - n, "%s%lld", d ? ", " : "",
                                  (long long)p.shape.dims[d]);
        snprintf(text + n, sizeof text - n, ")");
        tb__print_suffix(s, &last_line, text);
    }
    snprintf(text, sizeof text, "dtype=%s", tb_dtype_name(p.shape.dtype));
    tb__print_suffix(s, &last_line, text);
    tb__str_append(s, ")");
    if (s->failed) return tb__error(TB_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    return TB_OK;
}

TBDEF tb_status tb_tensor_format(tb_tensor *tensor, char *buf, size_t cap, size_t *needed) {
    tb__str s;
    tb_status st;
    if (needed != NULL) *needed = 0;
    if (buf != NULL && cap > 0) buf[0] = '\0';
    if (buf == NULL && cap > 0) {
        tb__ensure_setup();
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_format: buf is NULL but cap is %lu",
                         (unsigned long)cap);
    }
    memset(&s, 0, sizeof s);
    st = tb__print_tensor("tb_tensor_format", tensor, &s);
    if (st == TB_OK) {
        if (cap > 0) {
            size_t n = s.len < cap - 1 ? s.len : cap - 1;
            memcpy(buf, s.data, n);
            buf[n] = '\0';
        }
        if (needed != NULL) *needed = s.len;
    }
    tb__str_free(&s);
    return st;
}

TBDEF tb_status tb_tensor_print(tb_tensor *tensor) {
    tb__str s;
    tb_status st;
    memset(&s, 0, sizeof s);
    st = tb__print_tensor("tb_tensor_print", tensor, &s);
    if (st == TB_OK && (fwrite(s.data, 1, s.len, stdout) != s.len || fputc('\n', stdout) == EOF ||
                        fflush(stdout) != 0))
        st = tb__error(TB_ERR_IO, "tb_tensor_print: cannot write to stdout: %s", strerror(errno));
    tb__str_free(&s);
    return st;
}

#undef TB__PRINT_THRESHOLD
#undef TB__PRINT_EDGE
#undef TB__PRINT_LINE
#undef TB__PRINT_INDENT
#undef TB__PRINT_TEXT

/* ---- src/opencl_kernels.cl ---- */
#ifndef TB_NO_OPENCL
// clang-format off
static const char *const tb__cl_opencl_kernels[] = {
    "/* torch_backend.h: helpers at the top of every generated OpenCL program (OpenCL C 1.2). */\n",
    "#ifdef cl_khr_fp64\n",
    "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n",
    "#endif\n",
    "/* a * b + c stays two roundings, as in the reference interpreter */\n",
    "#pragma OPENCL FP_CONTRACT OFF\n",
    "\n",
    "/* Float to integer as the reference converts: toward zero, saturating at the int64 range,\n",
    "   NaN gives 0; the caller wraps the result to narrower types. */\n",
    "long tb_f2i_f32(float x) {\n",
    "    if (isnan(x)) return 0;\n",
    "    if (x >= 9223372036854775808.0f) return LONG_MAX;\n",
    "    if (x <= -9223372036854775808.0f) return LONG_MIN;\n",
    "    return (long)x;\n",
    "}\n",
    "\n",
    "#ifdef cl_khr_fp64\n",
    "long tb_f2i_f64(double x) {\n",
    "    if (isnan(x)) return 0;\n",
    "    if (x >= 9223372036854775808.0) return LONG_MAX;\n",
    "    if (x <= -9223372036854775808.0) return LONG_MIN;\n",
    "    return (long)x;\n",
    "}\n",
    "#endif\n",
    "\n",
    "/* Integer power by squaring with wrapping products; the caller reports negative exponents. */\n",
    "long tb_ipow(long base, long e) {\n",
    "    ulong r = 1, b = (ulong)base;\n",
    "    if (e < 0) return 0;\n",
    "    while (e > 0) {\n",
    "        if (e & 1) r *= b;\n",
    "        e >>= 1;\n",
    "        if (e > 0) b *= b;\n",
    "    }\n",
    "    return (long)r;\n",
    "}\n",
    "\n",
    "/* Philox 4x32-10 of counter offset + block under seed: the library's random stream. */\n",
    "uint4 tb_philox(ulong seed, ulong offset, ulong block) {\n",
    "    ulong c = offset + block;\n",
    "    uint c0 = (uint)c, c1 = (uint)(c >> 32), c2 = 0, c3 = 0;\n",
    "    uint k0 = (uint)seed, k1 = (uint)(seed >> 32);\n",
    "    for (int round = 0; round < 10; round++) {\n",
    "        if (round > 0) {\n",
    "            k0 += 0x9E3779B9u;\n",
    "            k1 += 0xBB67AE85u;\n",
    "        }\n",
    "        ulong p0 = (ulong)0xD2511F53u * (ulong)c0;\n",
    "        ulong p1 = (ulong)0xCD9E8D57u * (ulong)c2;\n",
    "        c0 = (uint)(p1 >> 32) ^ c1 ^ k0;\n",
    "        c1 = (uint)p1;\n",
    "        c2 = (uint)(p0 >> 32) ^ c3 ^ k1;\n",
    "        c3 = (uint)p0;\n",
    "    }\n",
    "    return (uint4)(c0, c1, c2, c3);\n",
    "}\n",
    "\n",
    "/* Uniform [0, 1) with 24 random bits: exact in float. */\n",
    "float tb_rand_f32(ulong seed, ulong offset, ulong index) {\n",
    "    uint4 w = tb_philox(seed, offset, index / 4);\n",
    "    uint sel = (uint)(index % 4);\n",
    "    uint x = sel == 0 ? w.x : (sel == 1 ? w.y : (sel == 2 ? w.z : w.w));\n",
    "    return (float)(x >> 8) / 16777216.0f;\n",
    "}\n",
    "\n",
    "#ifdef cl_khr_fp64\n",
    "double tb_u53(uint hi, uint lo) {\n",
    "    ulong bits = ((ulong)hi << 21) | (ulong)(lo >> 11);\n",
    "    return (double)bits / 9007199254740992.0;\n",
    "}\n",
    "\n",
    "double tb_rand_f64(ulong seed, ulong offset, ulong index) {\n",
    "    uint4 w = tb_philox(seed, offset, index / 2);\n",
    "    return (index % 2 == 0) ? tb_u53(w.x, w.y) : tb_u53(w.z, w.w);\n",
    "}\n",
    "\n",
    "/* Box-Muller on the pair of uniforms of block index / 2: cos for even, sin for odd. */\n",
    "double tb_randn_f64(ulong seed, ulong offset, ulong index) {\n",
    "    uint4 w = tb_philox(seed, offset, index / 2);\n",
    "    double u1 = tb_u53(w.x, w.y), u2 = tb_u53(w.z, w.w);\n",
    "    double r = sqrt(-2.0 * log(1.0 - u1));\n",
    "    double t = 6.283185307179586 * u2;\n",
    "    return (index % 2 == 0) ? r * cos(t) : r * sin(t);\n",
    "}\n",
    "\n",
    "float tb_randn_f32(ulong seed, ulong offset, ulong index) {\n",
    "    return (float)tb_randn_f64(seed, offset, index);\n",
    "}\n",
    "#endif\n",
    0
};
static const size_t tb__cl_opencl_kernels_count = 89;
// clang-format on
#endif

/* ---- src/opencl.c ---- */
/* ===========================================================================================
   OpenCL backend ("opencl")
   The ICD loader is opened at run time (no SDK, no -lOpenCL) unless TB_OPENCL_LINKED is defined.
   Devices of every platform; one context and one in-order profiling queue per device; a caching
   buffer allocator; zero-copy transfers where the device shares host memory; a lowering that
   partitions a graph into fused kernels (elementwise chains, reductions with their elementwise
   producers, matmul with an elementwise epilogue, movement ops as index arithmetic), all kernels
   of a graph in one program, an in-memory program cache and an on-disk binary cache.
   =========================================================================================== */
#ifndef TB_NO_OPENCL

/* ---- the part of the OpenCL API we use, declared here so that no SDK is needed ---- */

#ifdef TB_OPENCL_LINKED
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#ifndef CL_USE_DEPRECATED_OPENCL_1_2_APIS
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#endif
#if defined(__APPLE__)
#include <OpenCL/opencl.h>
#else
#include <CL/cl.h>
#endif
typedef cl_int tb__cl_int;
typedef cl_uint tb__cl_uint;
typedef cl_ulong tb__cl_ulong;
typedef cl_bool tb__cl_bool;
typedef cl_bitfield tb__cl_bitfield;
typedef cl_platform_id tb__cl_platform_id;
typedef cl_device_id tb__cl_device_id;
typedef cl_context tb__cl_context;
typedef cl_command_queue tb__cl_command_queue;
typedef cl_mem tb__cl_mem;
typedef cl_program tb__cl_program;
typedef cl_kernel tb__cl_kernel;
typedef cl_event tb__cl_event;
typedef cl_context_properties tb__cl_context_properties;
#define TB__CL_CALL     CL_API_CALL
#define TB__CL_CALLBACK CL_CALLBACK
#else
typedef int32_t tb__cl_int;
typedef uint32_t tb__cl_uint;
typedef uint64_t tb__cl_ulong;
typedef uint32_t tb__cl_bool;
typedef uint64_t tb__cl_bitfield;
typedef struct tb__cl_platform_st *tb__cl_platform_id;
typedef struct tb__cl_device_st *tb__cl_device_id;
typedef struct tb__cl_context_st *tb__cl_context;
typedef struct tb__cl_queue_st *tb__cl_command_queue;
typedef struct tb__cl_mem_st *tb__cl_mem;
typedef struct tb__cl_program_st *tb__cl_program;
typedef struct tb__cl_kernel_st *tb__cl_kernel;
typedef struct tb__cl_event_st *tb__cl_event;
typedef intptr_t tb__cl_context_properties;
#if defined(_WIN32)
#define TB__CL_CALL     __stdcall
#define TB__CL_CALLBACK __stdcall
#else
#define TB__CL_CALL
#define TB__CL_CALLBACK
#endif
#endif

/* Values from the Khronos headers (CL/cl.h). */
#define TB__CL_SUCCESS                                   0
#define TB__CL_DEVICE_NOT_FOUND                          (-1)
#define TB__CL_MEM_OBJECT_ALLOCATION_FAILURE             (-4)
#define TB__CL_OUT_OF_RESOURCES                          (-5)
#define TB__CL_OUT_OF_HOST_MEMORY                        (-6)
#define TB__CL_BUILD_PROGRAM_FAILURE                     (-11)
#define TB__CL_INVALID_BUFFER_SIZE                       (-61)
#define TB__CL_PLATFORM_NOT_FOUND_KHR                    (-1001)
#define TB__CL_TRUE                                      1u
#define TB__CL_FALSE                                     0u
#define TB__CL_PLATFORM_VERSION                          0x0901u
#define TB__CL_PLATFORM_NAME                             0x0902u
#define TB__CL_PLATFORM_VENDOR                           0x0903u
#define TB__CL_DEVICE_TYPE                               0x1000u
#define TB__CL_DEVICE_MAX_COMPUTE_UNITS                  0x1002u
#define TB__CL_DEVICE_MAX_WORK_GROUP_SIZE                0x1004u
#define TB__CL_DEVICE_MAX_CLOCK_FREQUENCY                0x100Cu
#define TB__CL_DEVICE_MAX_MEM_ALLOC_SIZE                 0x1010u
#define TB__CL_DEVICE_MAX_PARAMETER_SIZE                 0x1017u
#define TB__CL_DEVICE_MEM_BASE_ADDR_ALIGN                0x1019u
#define TB__CL_DEVICE_SINGLE_FP_CONFIG                   0x101Bu
#define TB__CL_DEVICE_GLOBAL_MEM_SIZE                    0x101Fu
#define TB__CL_DEVICE_LOCAL_MEM_SIZE                     0x1023u
#define TB__CL_DEVICE_AVAILABLE                          0x1027u
#define TB__CL_DEVICE_COMPILER_AVAILABLE                 0x1028u
#define TB__CL_DEVICE_NAME                               0x102Bu
#define TB__CL_DEVICE_VENDOR                             0x102Cu
#define TB__CL_DRIVER_VERSION                            0x102Du
#define TB__CL_DEVICE_VERSION                            0x102Fu
#define TB__CL_DEVICE_EXTENSIONS                         0x1030u
#define TB__CL_DEVICE_DOUBLE_FP_CONFIG                   0x1032u
#define TB__CL_DEVICE_HOST_UNIFIED_MEMORY                0x1035u
#define TB__CL_DEVICE_OPENCL_C_VERSION                   0x103Du
#define TB__CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT          (1u << 7)
#define TB__CL_DEVICE_TYPE_CPU                           (1u << 1)
#define TB__CL_DEVICE_TYPE_GPU                           (1u << 2)
#define TB__CL_DEVICE_TYPE_ACCELERATOR                   (1u << 3)
#define TB__CL_DEVICE_TYPE_ALL                           0xFFFFFFFFu
#define TB__CL_CONTEXT_PLATFORM                          0x1084
#define TB__CL_QUEUE_PROFILING_ENABLE                    (1u << 1)
#define TB__CL_MEM_READ_WRITE                            (1u << 0)
#define TB__CL_MEM_ALLOC_HOST_PTR                        (1u << 4)
#define TB__CL_MAP_READ                                  (1u << 0)
#define TB__CL_MAP_WRITE                                 (1u << 1)
#define TB__CL_PROGRAM_BINARY_SIZES                      0x1165u
#define TB__CL_PROGRAM_BINARIES                          0x1166u
#define TB__CL_PROGRAM_BUILD_LOG                         0x1183u
#define TB__CL_KERNEL_WORK_GROUP_SIZE                    0x11B0u
#define TB__CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE 0x11B3u
#define TB__CL_PROFILING_COMMAND_START                   0x1282u
#define TB__CL_PROFILING_COMMAND_END                     0x1283u

/* The entry points, resolved once. */
typedef struct tb__cl_api {
    tb__cl_int(TB__CL_CALL *GetPlatformIDs)(tb__cl_uint, tb__cl_platform_id *, tb__cl_uint *);
    tb__cl_int(TB__CL_CALL *GetPlatformInfo)(tb__cl_platform_id, tb__cl_uint, size_t, void *,
                                             size_t *);
    tb__cl_int(TB__CL_CALL *GetDeviceIDs)(tb__cl_platform_id, tb__cl_bitfield, tb__cl_uint,
                                          tb__cl_device_id *, tb__cl_uint *);
    tb__cl_int(TB__CL_CALL *GetDeviceInfo)(tb__cl_device_id, tb__cl_uint, size_t, void *, size_t *);
    tb__cl_context(TB__CL_CALL *CreateContext)(
        const tb__cl_context_properties *, tb__cl_uint, const tb__cl_device_id *,
        void(TB__CL_CALLBACK *)(const char *, const void *, size_t, void *), void *, tb__cl_int *);
    tb__cl_int(TB__CL_CALL *ReleaseContext)(tb__cl_context);
    tb__cl_command_queue(TB__CL_CALL *CreateCommandQueue)(tb__cl_context, tb__cl_device_id,
                                                          tb__cl_bitfield, tb__cl_int *);
    tb__cl_int(TB__CL_CALL *ReleaseCommandQueue)(tb__cl_command_queue);
    tb__cl_mem(TB__CL_CALL *CreateBuffer)(tb__cl_context, tb__cl_bitfield, size_t, void *,
                                          tb__cl_int *);
    tb__cl_int(TB__CL_CALL *ReleaseMemObject)(tb__cl_mem);
    tb__cl_int(TB__CL_CALL *EnqueueReadBuffer)(tb__cl_command_queue, tb__cl_mem, tb__cl_bool,
                                               size_t, size_t, void *, tb__cl_uint,
                                               const tb__cl_event *, tb__cl_event *);
    tb__cl_int(TB__CL_CALL *EnqueueWriteBuffer)(tb__cl_command_queue, tb__cl_mem, tb__cl_bool,
                                                size_t, size_t, const void *, tb__cl_uint,
                                                const tb__cl_event *, tb__cl_event *);
    tb__cl_int(TB__CL_CALL *EnqueueCopyBuffer)(tb__cl_command_queue, tb__cl_mem, tb__cl_mem, size_t,
                                               size_t, size_t, tb__cl_uint, const tb__cl_event *,
                                               tb__cl_event *);
    void *(TB__CL_CALL *EnqueueMapBuffer)(tb__cl_command_queue, tb__cl_mem, tb__cl_bool,
                                          tb__cl_bitfield, size_t, size_t, tb__cl_uint,
                                          const tb__cl_event *, tb__cl_event *, tb__cl_int *);
    tb__cl_int(TB__CL_CALL *EnqueueUnmapMemObject)(tb__cl_command_queue, tb__cl_mem, void *,
                                                   tb__cl_uint, const tb__cl_event *,
                                                   tb__cl_event *);
    tb__cl_program(TB__CL_CALL *CreateProgramWithSource)(tb__cl_context, tb__cl_uint, const char **,
                                                         const size_t *, tb__cl_int *);
    tb__cl_program(TB__CL_CALL *CreateProgramWithBinary)(tb__cl_context, tb__cl_uint,
                                                         const tb__cl_device_id *, const size_t *,
                                                         const unsigned char **, tb__cl_int *,
                                                         tb__cl_int *);
    tb__cl_int(TB__CL_CALL *BuildProgram)(tb__cl_program, tb__cl_uint, const tb__cl_device_id *,
                                          const char *,
                                          void(TB__CL_CALLBACK *)(tb__cl_program, void *), void *);
    tb__cl_int(TB__CL_CALL *GetProgramBuildInfo)(tb__cl_program, tb__cl_device_id, tb__cl_uint,
                                                 size_t, void *, size_t *);
    tb__cl_int(TB__CL_CALL *GetProgramInfo)(tb__cl_program, tb__cl_uint, size_t, void *, size_t *);
    tb__cl_int(TB__CL_CALL *ReleaseProgram)(tb__cl_program);
    tb__cl_kernel(TB__CL_CALL *CreateKernel)(tb__cl_program, const char *, tb__cl_int *);
    tb__cl_int(TB__CL_CALL *ReleaseKernel)(tb__cl_kernel);
    tb__cl_int(TB__CL_CALL *SetKernelArg)(tb__cl_kernel, tb__cl_uint, size_t, const void *);
    tb__cl_int(TB__CL_CALL *GetKernelWorkGroupInfo)(tb__cl_kernel, tb__cl_device_id, tb__cl_uint,
                                                    size_t, void *, size_t *);
    tb__cl_int(TB__CL_CALL *EnqueueNDRangeKernel)(tb__cl_command_queue, tb__cl_kernel, tb__cl_uint,
                                                  const size_t *, const size_t *, const size_t *,
                                                  tb__cl_uint, const tb__cl_event *,
                                                  tb__cl_event *);
    tb__cl_int(TB__CL_CALL *Finish)(tb__cl_command_queue);
    tb__cl_int(TB__CL_CALL *Flush)(tb__cl_command_queue);
    tb__cl_int(TB__CL_CALL *WaitForEvents)(tb__cl_uint, const tb__cl_event *);
    tb__cl_int(TB__CL_CALL *GetEventProfilingInfo)(tb__cl_event, tb__cl_uint, size_t, void *,
                                                   size_t *);
    tb__cl_int(TB__CL_CALL *ReleaseEvent)(tb__cl_event);
} tb__cl_api;

/* Symbol names in the order of the struct's members (every member is one function pointer). */
static const char *const tb__cl_symbols[] = {"clGetPlatformIDs",
                                             "clGetPlatformInfo",
                                             "clGetDeviceIDs",
                                             "clGetDeviceInfo",
                                             "clCreateContext",
                                             "clReleaseContext",
                                             "clCreateCommandQueue",
                                             "clReleaseCommandQueue",
                                             "clCreateBuffer",
                                             "clReleaseMemObject",
                                             "clEnqueueReadBuffer",
                                             "clEnqueueWriteBuffer",
                                             "clEnqueueCopyBuffer",
                                             "clEnqueueMapBuffer",
                                             "clEnqueueUnmapMemObject",
                                             "clCreateProgramWithSource",
                                             "clCreateProgramWithBinary",
                                             "clBuildProgram",
                                             "clGetProgramBuildInfo",
                                             "clGetProgramInfo",
                                             "clReleaseProgram",
                                             "clCreateKernel",
                                             "clReleaseKernel",
                                             "clSetKernelArg",
                                             "clGetKernelWorkGroupInfo",
                                             "clEnqueueNDRangeKernel",
                                             "clFinish",
                                             "clFlush",
                                             "clWaitForEvents",
                                             "clGetEventProfilingInfo",
                                             "clReleaseEvent"};

static const char *tb__cl_error_name(tb__cl_int err) {
    switch (err) {
    case 0:
        return "CL_SUCCESS";
    case -1:
        return "CL_DEVICE_NOT_FOUND";
    case -2:
        return "CL_DEVICE_NOT_AVAILABLE";
    case -3:
        return "CL_COMPILER_NOT_AVAILABLE";
    case -4:
        return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case -5:
        return "CL_OUT_OF_RESOURCES";
    case -6:
        return "CL_OUT_OF_HOST_MEMORY";
    case -7:
        return "CL_PROFILING_INFO_NOT_AVAILABLE";
    case -11:
        return "CL_BUILD_PROGRAM_FAILURE";
    case -12:
        return "CL_MAP_FAILURE";
    case -14:
        return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    case -30:
        return "CL_INVALID_VALUE";
    case -31:
        return "CL_INVALID_DEVICE_TYPE";
    case -32:
        return "CL_INVALID_PLATFORM";
    case -33:
        return "CL_INVALID_DEVICE";
    case -34:
        return "CL_INVALID_CONTEXT";
    case -35:
        return "CL_INVALID_QUEUE_PROPERTIES";
    case -36:
        return "CL_INVALID_COMMAND_QUEUE";
    case -37:
        return "CL_INVALID_HOST_PTR";
    case -38:
        return "CL_INVALID_MEM_OBJECT";
    case -42:
        return "CL_INVALID_BINARY";
    case -43:
        return "CL_INVALID_BUILD_OPTIONS";
    case -44:
        return "CL_INVALID_PROGRAM";
    case -45:
        return "CL_INVALID_PROGRAM_EXECUTABLE";
    case -46:
        return "CL_INVALID_KERNEL_NAME";
    case -47:
        return "CL_INVALID_KERNEL_DEFINITION";
    case -48:
        return "CL_INVALID_KERNEL";
    case -49:
        return "CL_INVALID_ARG_INDEX";
    case -50:
        return "CL_INVALID_ARG_VALUE";
    case -51:
        return "CL_INVALID_ARG_SIZE";
    case -52:
        return "CL_INVALID_KERNEL_ARGS";
    case -53:
        return "CL_INVALID_WORK_DIMENSION";
    case -54:
        return "CL_INVALID_WORK_GROUP_SIZE";
    case -55:
        return "CL_INVALID_WORK_ITEM_SIZE";
    case -56:
        return "CL_INVALID_GLOBAL_OFFSET";
    case -57:
        return "CL_INVALID_EVENT_WAIT_LIST";
    case -58:
        return "CL_INVALID_EVENT";
    case -59:
        return "CL_INVALID_OPERATION";
    case -61:
        return "CL_INVALID_BUFFER_SIZE";
    case -63:
        return "CL_INVALID_GLOBAL_WORK_SIZE";
    case -1001:
        return "CL_PLATFORM_NOT_FOUND_KHR";
    }
    return "unknown OpenCL error";
}

static bool tb__cl_is_oom(tb__cl_int err) {
    return err == TB__CL_MEM_OBJECT_ALLOCATION_FAILURE || err == TB__CL_OUT_OF_RESOURCES ||
           err == TB__CL_OUT_OF_HOST_MEMORY;
}

/* ---- runtime: the loaded library, its devices and their state ---- */

struct tb__ocl_runtime;
struct tb__ocl_device;

/* A device buffer: the payload of every opencl tb_backend_data. `mem` is NULL for a scalar made
   by data_from_scalar (its value lives in tb_backend_data.scalar until a kernel needs it in
   memory). */
typedef struct tb__ocl_buffer {
    struct tb__ocl_device *dev;
    tb__cl_mem mem;
    size_t size; /* bytes asked for */
    size_t cap;  /* bytes the cl_mem holds: the size class */
} tb__ocl_buffer;

/* A built program shared by every computation whose source is the same. */
typedef struct tb__ocl_program {
    struct tb__ocl_program *next;
    uint64_t key[2]; /* tb__ocl_program_key */
    char *source;    /* confirms a hit on the key */
    size_t source_len;
    tb__cl_program program;
    int32_t refcount; /* computations using it, plus one while it is in the cache */
    /* the disk cache folder to write the binary to after the first run: some drivers (PoCL)
       add the machine code of the kernels launched so far to the binary, so a later process
       skips that compile too; NULL when written, or when the disk cache is off */
    char *save_dir;
} tb__ocl_program;

typedef struct tb__ocl_device {
    struct tb__ocl_runtime *rt;
    int32_t ordinal;
    tb__cl_platform_id platform;
    tb__cl_device_id id;
    tb_device_info info;
    char platform_name[128];
    char platform_version[128];
    char device_version[128];
    uint64_t max_alloc;
    size_t max_parameter_size; /* bytes of kernel arguments */
    uint32_t clock_mhz;
    bool correct_divide_sqrt;
    char build_options[512];
    /* created on first use */
    tb__cl_context ctx;
    tb__cl_command_queue queue;
    /* the caching allocator: free buffers, oldest first */
    tb__ocl_buffer **cache;
    size_t cache_count, cache_cap;
    uint64_t cached_bytes, cache_limit;
    uint64_t bytes_in_use, peak_bytes;
    uint64_t buffers_created, buffers_reused, cache_trims;
    /* programs and statistics */
    tb__ocl_program *programs;
    uint64_t program_builds, disk_hits, disk_misses, disk_rejected, kernels_launched, kernel_ns;
} tb__ocl_device;

typedef struct tb__ocl_runtime {
    int32_t refcount; /* the backend's reference, plus one per buffer and computation alive */
    bool exited;      /* prepare_to_exit ran: nothing is cached any more */
    void *lib;
    tb__cl_api api;
    tb__ocl_device *devices;
    size_t num_devices;
    int32_t default_ordinal;
    tb_status status; /* TB_OK, or why the backend cannot be used */
    char reason[512];
    bool cache_dir_reported; /* why the disk cache folder is not used was said */
} tb__ocl_runtime;

static tb__mutex tb__ocl_mutex = TB__MUTEX_INIT;
static tb__ocl_runtime *tb__ocl_current;

#define TB__OCL_CALL(rt, fn) ((rt)->api.fn)

static void tb__ocl_program_unref(tb__ocl_device *dev, tb__ocl_program *p);
static void tb__ocl_program_save(tb__ocl_device *dev, tb__ocl_program *p);
static void tb__ocl_cache_trim(tb__ocl_device *dev, uint64_t keep);

static void tb__ocl_runtime_destroy(tb__ocl_runtime *rt) {
    size_t i;
    for (i = 0; i < rt->num_devices; i++) {
        tb__ocl_device *dev = &rt->devices[i];
        tb__ocl_program *p = dev->programs, *next;
        for (; p != NULL; p = next) {
            next = p->next;
            tb__ocl_program_save(dev, p);
            if (p->program != NULL) TB__OCL_CALL(rt, ReleaseProgram)(p->program);
            tb__free(p->source);
            tb__free(p);
        }
        dev->programs = NULL;
        tb__free(dev->cache);
        if (dev->queue != NULL) TB__OCL_CALL(rt, ReleaseCommandQueue)(dev->queue);
        if (dev->ctx != NULL) TB__OCL_CALL(rt, ReleaseContext)(dev->ctx);
    }
    tb__free(rt->devices);
    /* The ICD loader stays loaded (rt->lib is not closed): drivers keep threads and state past
       the release of their last object, and some crash when unloaded. Opening it again after a
       new setup gives the same handle. */
    tb__free(rt);
}

static void tb__ocl_runtime_unref(tb__ocl_runtime *rt) {
    if (rt != NULL && --rt->refcount == 0) tb__ocl_runtime_destroy(rt);
}

static void tb__ocl_unavailable(tb__ocl_runtime *rt, tb_status status, const char *fmt, ...)
    TB_PRINTF_LIKE(3, 4);
static void tb__ocl_unavailable(tb__ocl_runtime *rt, tb_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rt->reason, sizeof rt->reason, fmt, ap);
    va_end(ap);
    rt->status = status;
}

/* Opens the ICD loader and resolves every entry point; on failure the runtime says why. */
static bool tb__ocl_load_library(tb__ocl_runtime *rt) {
#if defined(TB_OPENCL_LINKED)
    rt->api.GetPlatformIDs = clGetPlatformIDs;
    rt->api.GetPlatformInfo = clGetPlatformInfo;
    rt->api.GetDeviceIDs = clGetDeviceIDs;
    rt->api.GetDeviceInfo = clGetDeviceInfo;
    rt->api.CreateContext = clCreateContext;
    rt->api.ReleaseContext = clReleaseContext;
    rt->api.CreateCommandQueue = clCreateCommandQueue;
    rt->api.ReleaseCommandQueue = clReleaseCommandQueue;
    rt->api.CreateBuffer = clCreateBuffer;
    rt->api.ReleaseMemObject = clReleaseMemObject;
    rt->api.EnqueueReadBuffer = clEnqueueReadBuffer;
    rt->api.EnqueueWriteBuffer = clEnqueueWriteBuffer;
    rt->api.EnqueueCopyBuffer = clEnqueueCopyBuffer;
    rt->api.EnqueueMapBuffer = clEnqueueMapBuffer;
    rt->api.EnqueueUnmapMemObject = clEnqueueUnmapMemObject;
    rt->api.CreateProgramWithSource = clCreateProgramWithSource;
    rt->api.CreateProgramWithBinary = clCreateProgramWithBinary;
    rt->api.BuildProgram = clBuildProgram;
    rt->api.GetProgramBuildInfo = clGetProgramBuildInfo;
    rt->api.GetProgramInfo = clGetProgramInfo;
    rt->api.ReleaseProgram = clReleaseProgram;
    rt->api.CreateKernel = clCreateKernel;
    rt->api.ReleaseKernel = clReleaseKernel;
    rt->api.SetKernelArg = clSetKernelArg;
    rt->api.GetKernelWorkGroupInfo = clGetKernelWorkGroupInfo;
    rt->api.EnqueueNDRangeKernel = clEnqueueNDRangeKernel;
    rt->api.Finish = clFinish;
    rt->api.Flush = clFlush;
    rt->api.WaitForEvents = clWaitForEvents;
    rt->api.GetEventProfilingInfo = clGetEventProfilingInfo;
    rt->api.ReleaseEvent = clReleaseEvent;
    return true;
#else
    const size_t count = sizeof tb__cl_symbols / sizeof tb__cl_symbols[0];
    const char *path = tb__getenv("TB_OPENCL_LIBRARY");
    size_t i;
    if (path == NULL) {
#if defined(_WIN32)
        path = "OpenCL.dll";
#elif defined(__APPLE__)
        path = "/System/Library/Frameworks/OpenCL.framework/OpenCL";
#else
        path = "libOpenCL.so.1";
#endif
    }
    if (sizeof(tb__cl_api) != count * sizeof(void *)) {
        tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE,
                            "opencl: function pointers and data pointers differ in size here");
        return false;
    }
#if defined(_WIN32)
    rt->lib = (void *)LoadLibraryA(path);
    if (rt->lib == NULL) {
        tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE, "opencl: cannot open %s: error %lu", path,
                            (unsigned long)GetLastError());
        return false;
    }
#else
    rt->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (rt->lib == NULL) {
        const char *why = dlerror();
        tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE, "opencl: cannot open %s: %s", path,
                            why != NULL ? why : "unknown reason");
        return false;
    }
#endif
    for (i = 0; i < count; i++) {
        void *sym;
#if defined(_WIN32)
        FARPROC proc = GetProcAddress((HMODULE)rt->lib, tb__cl_symbols[i]);
        memcpy(&sym, &proc, sizeof sym);
#else
        sym = dlsym(rt->lib, tb__cl_symbols[i]);
#endif
        if (sym == NULL) {
            tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE, "opencl: %s does not export %s", path,
                                tb__cl_symbols[i]);
            return false;
        }
        memcpy((char *)&rt->api + i * sizeof(void *), &sym, sizeof sym);
    }
    return true;
#endif
}

/* A device info string, cut to fit and trimmed of trailing blanks. */
static void tb__ocl_info_string(tb__ocl_runtime *rt, tb__cl_device_id id, tb__cl_uint param,
                                char *out, size_t cap) {
    size_t need = 0, n;
    char *tmp;
    out[0] = '\0';
    if (TB__OCL_CALL(rt, GetDeviceInfo)(id, param, 0, NULL, &need) != TB__CL_SUCCESS || need == 0)
        return;
    tmp = (char *)tb__alloc(need + 1);
    if (tmp == NULL) return;
    if (TB__OCL_CALL(rt, GetDeviceInfo)(id, param, need, tmp, NULL) == TB__CL_SUCCESS) {
        tmp[need] = '\0';
        n = strlen(tmp);
        while (n > 0 && (tmp[n - 1] == ' ' || tmp[n - 1] == '\n'))
            tmp[--n] = '\0';
        if (n >= cap) n = cap - 1;
        memcpy(out, tmp, n);
        out[n] = '\0';
    }
    tb__free(tmp);
}

static void tb__ocl_platform_string(tb__ocl_runtime *rt, tb__cl_platform_id id, tb__cl_uint param,
                                    char *out, size_t cap) {
    size_t need = 0, n;
    char *tmp;
    out[0] = '\0';
    if (TB__OCL_CALL(rt, GetPlatformInfo)(id, param, 0, NULL, &need) != TB__CL_SUCCESS || need == 0)
        return;
    tmp = (char *)tb__alloc(need + 1);
    if (tmp == NULL) return;
    if (TB__OCL_CALL(rt, GetPlatformInfo)(id, param, need, tmp, NULL) == TB__CL_SUCCESS) {
        tmp[need] = '\0';
        n = strlen(tmp);
        if (n >= cap) n = cap - 1;
        memcpy(out, tmp, n);
        out[n] = '\0';
    }
    tb__free(tmp);
}

static uint64_t tb__ocl_info_u64(tb__ocl_runtime *rt, tb__cl_device_id id, tb__cl_uint param) {
    tb__cl_ulong v = 0;
    if (TB__OCL_CALL(rt, GetDeviceInfo)(id, param, sizeof v, &v, NULL) != TB__CL_SUCCESS) return 0;
    return (uint64_t)v;
}

static uint32_t tb__ocl_info_u32(tb__ocl_runtime *rt, tb__cl_device_id id, tb__cl_uint param) {
    tb__cl_uint v = 0;
    if (TB__OCL_CALL(rt, GetDeviceInfo)(id, param, sizeof v, &v, NULL) != TB__CL_SUCCESS) return 0;
    return (uint32_t)v;
}

static size_t tb__ocl_info_size(tb__ocl_runtime *rt, tb__cl_device_id id, tb__cl_uint param) {
    size_t v = 0;
    if (TB__OCL_CALL(rt, GetDeviceInfo)(id, param, sizeof v, &v, NULL) != TB__CL_SUCCESS) return 0;
    return v;
}

/* "OpenCL C 1.2 ..." -> 102; 0 when unreadable. */
static int tb__ocl_c_version(const char *text) {
    const char *p = strstr(text, "OpenCL C ");
    int major = 0, minor = 0;
    if (p == NULL) return 0;
    p += 9;
    while (*p >= '0' && *p <= '9')
        major = major * 10 + (*p++ - '0');
    if (*p == '.') {
        p++;
        while (*p >= '0' && *p <= '9')
            minor = minor * 10 + (*p++ - '0');
    }
    return major * 100 + minor;
}

static bool tb__ocl_has_extension(const char *list, const char *name) {
    size_t n = strlen(name);
    const char *p = list;
    while ((p = strstr(p, name)) != NULL) {
        if ((p == list || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' ')) return true;
        p += n;
    }
    return false;
}

static void tb__ocl_fill_device(tb__ocl_runtime *rt, tb__ocl_device *dev) {
    tb_device_info *info = &dev->info;
    uint64_t type = tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_TYPE);
    char extensions[4096];
    size_t n;
    memset(info, 0, sizeof *info);
    strcpy(info->device.backend, "opencl");
    info->device.ordinal = dev->ordinal;
    if (type & TB__CL_DEVICE_TYPE_GPU) {
        info->device.type = TB_DEVICE_GPU;
    } else if (type & TB__CL_DEVICE_TYPE_ACCELERATOR) {
        info->device.type = TB_DEVICE_ACCELERATOR;
    } else {
        info->device.type = TB_DEVICE_CPU;
    }
    tb__ocl_info_string(rt, dev->id, TB__CL_DEVICE_NAME, info->name, sizeof info->name);
    tb__ocl_info_string(rt, dev->id, TB__CL_DEVICE_VENDOR, info->vendor, sizeof info->vendor);
    tb__ocl_info_string(rt, dev->id, TB__CL_DRIVER_VERSION, info->driver_version,
                        sizeof info->driver_version);
    tb__ocl_info_string(rt, dev->id, TB__CL_DEVICE_OPENCL_C_VERSION, info->language_version,
                        sizeof info->language_version);
    tb__ocl_info_string(rt, dev->id, TB__CL_DEVICE_VERSION, dev->device_version,
                        sizeof dev->device_version);
    tb__ocl_info_string(rt, dev->id, TB__CL_DEVICE_EXTENSIONS, extensions, sizeof extensions);
    tb__ocl_platform_string(rt, dev->platform, TB__CL_PLATFORM_NAME, dev->platform_name,
                            sizeof dev->platform_name);
    tb__ocl_platform_string(rt, dev->platform, TB__CL_PLATFORM_VERSION, dev->platform_version,
                            sizeof dev->platform_version);
    n = strlen(extensions);
    if (n >= sizeof info->extensions) {
        /* cut at a space so that no extension name appears half */
        n = sizeof info->extensions - 1;
        while (n > 0 && extensions[n] != ' ')
            n--;
    }
    memcpy(info->extensions, extensions, n);
    info->extensions[n] = '\0';
    info->global_memory = tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_GLOBAL_MEM_SIZE);
    info->local_memory = tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_LOCAL_MEM_SIZE);
    info->max_allocation = tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_MAX_MEM_ALLOC_SIZE);
    info->compute_units = tb__ocl_info_u32(rt, dev->id, TB__CL_DEVICE_MAX_COMPUTE_UNITS);
    info->max_work_group_size =
        (uint32_t)tb__ocl_info_size(rt, dev->id, TB__CL_DEVICE_MAX_WORK_GROUP_SIZE);
    info->unified_memory = tb__ocl_info_u32(rt, dev->id, TB__CL_DEVICE_HOST_UNIFIED_MEMORY) != 0;
    info->supports_f64 = tb__ocl_has_extension(extensions, "cl_khr_fp64") &&
                         tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_DOUBLE_FP_CONFIG) != 0;
    if (info->compute_units == 0) info->compute_units = 1;
    if (info->max_work_group_size == 0) info->max_work_group_size = 1;
    dev->clock_mhz = tb__ocl_info_u32(rt, dev->id, TB__CL_DEVICE_MAX_CLOCK_FREQUENCY);
    dev->max_parameter_size = tb__ocl_info_size(rt, dev->id, TB__CL_DEVICE_MAX_PARAMETER_SIZE);
    if (dev->max_parameter_size < 256) dev->max_parameter_size = 256; /* the spec's minimum */
    dev->max_alloc = info->max_allocation;
    if (dev->max_alloc == 0) dev->max_alloc = (uint64_t)128 << 20; /* the spec's minimum */
    dev->correct_divide_sqrt = (tb__ocl_info_u64(rt, dev->id, TB__CL_DEVICE_SINGLE_FP_CONFIG) &
                                TB__CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
    /* Division and square root as the reference computes them (correctly rounded), no
       contraction of a * b + c (the kernels say FP_CONTRACT OFF). */
    snprintf(dev->build_options, sizeof dev->build_options, "%s%s%s%s",
             tb__ocl_c_version(info->language_version) >= 102 ? "-cl-std=CL1.2" : "",
             dev->correct_divide_sqrt ? " -cl-fp32-correctly-rounded-divide-sqrt" : "",
             tb__getenv("TB_OPENCL_BUILD_OPTIONS") != NULL ? " " : "",
             tb__getenv("TB_OPENCL_BUILD_OPTIONS") != NULL ? tb__getenv("TB_OPENCL_BUILD_OPTIONS")
                                                           : "");
    dev->cache_limit = info->global_memory / 4;
    if (dev->cache_limit < ((uint64_t)64 << 20)) dev->cache_limit = (uint64_t)64 << 20;
    if (dev->cache_limit > ((uint64_t)4 << 30)) dev->cache_limit = (uint64_t)4 << 30;
}

/* Platform order, then device order; devices that are not available or have no compiler are
   left out (they cannot run generated kernels). */
static void tb__ocl_enumerate(tb__ocl_runtime *rt) {
    tb__cl_uint num_platforms = 0, p;
    tb__cl_platform_id *platforms = NULL;
    tb__cl_int err = TB__OCL_CALL(rt, GetPlatformIDs)(0, NULL, &num_platforms);
    size_t total = 0;
    bool oom = false;
    if (err != TB__CL_SUCCESS || num_platforms == 0) {
        tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE,
                            "opencl: no OpenCL platform is installed (clGetPlatformIDs: %s)",
                            err != TB__CL_SUCCESS ? tb__cl_error_name(err) : "0 platforms");
        return;
    }
    platforms = (tb__cl_platform_id *)tb__calloc(num_platforms, sizeof *platforms);
    if (platforms == NULL) {
        tb__ocl_unavailable(rt, TB_ERR_OUT_OF_MEMORY, "opencl: %s", tb_last_error());
        return;
    }
    if (TB__OCL_CALL(rt, GetPlatformIDs)(num_platforms, platforms, NULL) != TB__CL_SUCCESS) {
        tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE, "opencl: cannot list the OpenCL platforms");
        tb__free(platforms);
        return;
    }
    for (p = 0; p < num_platforms && !oom; p++) {
        tb__cl_uint nd = 0, d;
        tb__cl_device_id *ids;
        if (TB__OCL_CALL(rt, GetDeviceIDs)(platforms[p], TB__CL_DEVICE_TYPE_ALL, 0, NULL, &nd) !=
                TB__CL_SUCCESS ||
            nd == 0)
            continue;
        ids = (tb__cl_device_id *)tb__calloc(nd, sizeof *ids);
        if (ids == NULL) {
            oom = true;
            break;
        }
        if (TB__OCL_CALL(rt, GetDeviceIDs)(platforms[p], TB__CL_DEVICE_TYPE_ALL, nd, ids, NULL) ==
            TB__CL_SUCCESS) {
            for (d = 0; d < nd; d++) {
                tb__ocl_device *grown;
                if (tb__ocl_info_u32(rt, ids[d], TB__CL_DEVICE_AVAILABLE) == 0 ||
                    tb__ocl_info_u32(rt, ids[d], TB__CL_DEVICE_COMPILER_AVAILABLE) == 0)
                    continue;
                grown = (tb__ocl_device *)tb__calloc(total + 1, sizeof *grown);
                if (grown == NULL) {
                    oom = true;
                    break;
                }
                if (total > 0) memcpy(grown, rt->devices, total * sizeof *grown);
                tb__free(rt->devices);
                rt->devices = grown;
                rt->devices[total].rt = rt;
                rt->devices[total].ordinal = (int32_t)total;
                rt->devices[total].platform = platforms[p];
                rt->devices[total].id = ids[d];
                tb__ocl_fill_device(rt, &rt->devices[total]);
                total++;
            }
        }
        tb__free(ids);
    }
    tb__free(platforms);
    rt->num_devices = total;
    if (oom) {
        /* not "no device": a list cut short would stay so for the whole session */
        tb__ocl_unavailable(rt, TB_ERR_OUT_OF_MEMORY, "opencl: %s", tb_last_error());
        return;
    }
    if (total == 0) {
        tb__ocl_unavailable(rt, TB_ERR_UNAVAILABLE,
                            "opencl: no usable OpenCL device (%u platform%s, none with an "
                            "available device and compiler)",
                            (unsigned)num_platforms, num_platforms == 1 ? "" : "s");
        return;
    }
    /* the first GPU, else the first accelerator, else the first device */
    {
        size_t i;
        int32_t gpu = -1, acc = -1;
        for (i = 0; i < total; i++) {
            if (rt->devices[i].info.device.type == TB_DEVICE_GPU && gpu < 0) gpu = (int32_t)i;
            if (rt->devices[i].info.device.type == TB_DEVICE_ACCELERATOR && acc < 0)
                acc = (int32_t)i;
        }
        rt->default_ordinal = gpu >= 0 ? gpu : (acc >= 0 ? acc : 0);
    }
}

/* The runtime, loaded on first use. Call with tb__ocl_mutex held. NULL (the error set) when
   memory ran out: nothing is kept, and the next call tries again. An unusable runtime has
   status != TB_OK and no devices. */
static tb__ocl_runtime *tb__ocl_runtime_get(void) {
    tb__ocl_runtime *rt = tb__ocl_current;
    if (rt != NULL) return rt;
    rt = (tb__ocl_runtime *)tb__calloc(1, sizeof *rt);
    if (rt == NULL) return NULL;
    rt->refcount = 1;
    rt->status = TB_OK;
    if (tb__ocl_load_library(rt)) tb__ocl_enumerate(rt);
    if (rt->status == TB_ERR_OUT_OF_MEMORY) {
        tb__error(rt->status, "%s", rt->reason);
        tb__ocl_runtime_destroy(rt);
        return NULL;
    }
    if (rt->status != TB_OK) tb_log_message(TB_LOG_INFO, "%s", rt->reason);
    tb__ocl_current = rt;
    return rt;
}

/* The device of an ordinal, with its context and queue created. Call with the mutex held. */
static tb__ocl_device *tb__ocl_device_get(int32_t ordinal, const char *func) {
    tb__ocl_runtime *rt = tb__ocl_runtime_get();
    tb__ocl_device *dev;
    tb__cl_int err = TB__CL_SUCCESS;
    if (rt == NULL) return NULL;
    if (rt->status != TB_OK) {
        tb__error(rt->status, "%s", rt->reason);
        return NULL;
    }
    if (ordinal < 0 || (size_t)ordinal >= rt->num_devices) {
        tb__error(TB_ERR_NOT_FOUND, "%s: no device opencl:%d (%zu device%s)", func, (int)ordinal,
                  rt->num_devices, rt->num_devices == 1 ? "" : "s");
        return NULL;
    }
    dev = &rt->devices[ordinal];
    if (dev->ctx == NULL) {
        tb__cl_context_properties props[3];
        props[0] = (tb__cl_context_properties)TB__CL_CONTEXT_PLATFORM;
        props[1] = (tb__cl_context_properties)dev->platform;
        props[2] = 0;
        dev->ctx = TB__OCL_CALL(rt, CreateContext)(props, 1, &dev->id, NULL, NULL, &err);
        if (dev->ctx == NULL || err != TB__CL_SUCCESS) {
            dev->ctx = NULL;
            tb__error(TB_ERR_UNAVAILABLE, "%s: opencl:%d (%s): clCreateContext failed: %s (%d)",
                      func, (int)ordinal, dev->info.name, tb__cl_error_name(err), (int)err);
            return NULL;
        }
    }
    if (dev->queue == NULL) {
        dev->queue = TB__OCL_CALL(rt, CreateCommandQueue)(dev->ctx, dev->id,
                                                          TB__CL_QUEUE_PROFILING_ENABLE, &err);
        if (dev->queue == NULL || err != TB__CL_SUCCESS) {
            dev->queue = NULL;
            tb__error(TB_ERR_UNAVAILABLE,
                      "%s: opencl:%d (%s): clCreateCommandQueue failed: %s (%d)", func,
                      (int)ordinal, dev->info.name, tb__cl_error_name(err), (int)err);
            return NULL;
        }
    }
    return dev;
}

/* ---- the caching allocator ---- */

/* Small requests round up to 256 bytes; from 1 MiB on, to a quarter of the enclosing power of
   two (at most 25% slack), so that buffers of similar sizes are reused. */
static size_t tb__ocl_size_class(size_t size) {
    size_t p = 1, step;
    if (size <= 256) return 256;
    if (size <= ((size_t)1 << 20)) return (size + 255) & ~(size_t)255;
    while (p <= size / 2)
        p <<= 1; /* the largest power of two <= size */
    step = p / 4;
    if (size > SIZE_MAX - step) return size;
    return (size + step - 1) / step * step;
}

static void tb__ocl_metric(tb__ocl_device *dev, const char *name, int64_t delta) {
    if (!dev->rt->exited) tb__metric_count(name, delta);
}

static void tb__ocl_buffer_destroy(tb__ocl_buffer *buf) {
    tb__ocl_runtime *rt = buf->dev->rt;
    if (buf->mem != NULL) TB__OCL_CALL(rt, ReleaseMemObject)(buf->mem);
    tb__free(buf);
    tb__ocl_runtime_unref(rt);
}

/* Releases cached buffers, oldest first, until at most `keep` bytes stay cached. */
static void tb__ocl_cache_trim(tb__ocl_device *dev, uint64_t keep) {
    size_t i = 0, n;
    if (dev->cached_bytes <= keep) return;
    while (i < dev->cache_count && dev->cached_bytes > keep) {
        tb__ocl_buffer *buf = dev->cache[i++];
        dev->cached_bytes -= buf->cap;
        tb__ocl_metric(dev, "OpenCL::BytesCached", -(int64_t)buf->cap);
        tb__ocl_buffer_destroy(buf);
    }
    n = dev->cache_count - i;
    memmove(dev->cache, dev->cache + i, n * sizeof *dev->cache);
    dev->cache_count = n;
}

/* A buffer of at least `size` bytes. Call with the mutex held and the device ready. */
static tb_status tb__ocl_buffer_alloc(tb__ocl_device *dev, size_t size, tb__ocl_buffer **out) {
    tb__ocl_runtime *rt = dev->rt;
    size_t cap = tb__ocl_size_class(size), i;
    tb__cl_bitfield flags = TB__CL_MEM_READ_WRITE;
    tb__cl_mem mem;
    tb__cl_int err = TB__CL_SUCCESS;
    tb__ocl_buffer *buf;
    *out = NULL;
    if ((uint64_t)size > dev->max_alloc) {
        return tb__error(TB_ERR_OUT_OF_MEMORY,
                         "opencl:%d: an allocation of %zu bytes is larger than the device "
                         "allows (CL_DEVICE_MAX_MEM_ALLOC_SIZE %llu bytes)",
                         (int)dev->ordinal, size, (unsigned long long)dev->max_alloc);
    }
    if ((uint64_t)cap > dev->max_alloc) cap = size;
    for (i = dev->cache_count; i-- > 0;) {
        if (dev->cache[i]->cap == cap) {
            buf = dev->cache[i];
            memmove(dev->cache + i, dev->cache + i + 1,
                    (dev->cache_count - i - 1) * sizeof *dev->cache);
            dev->cache_count--;
            dev->cached_bytes -= cap;
            dev->buffers_reused++;
            buf->size = size;
            dev->bytes_in_use += cap;
            if (dev->bytes_in_use > dev->peak_bytes) dev->peak_bytes = dev->bytes_in_use;
            tb__ocl_metric(dev, "OpenCL::BytesCached", -(int64_t)cap);
            tb__ocl_metric(dev, "OpenCL::BytesInUse", (int64_t)cap);
            tb__ocl_metric(dev, "OpenCL::BufferReuse", 1);
            *out = buf;
            return TB_OK;
        }
    }
    buf = (tb__ocl_buffer *)tb__calloc(1, sizeof *buf);
    if (buf == NULL) return TB_ERR_OUT_OF_MEMORY;
    if (dev->info.unified_memory) flags |= TB__CL_MEM_ALLOC_HOST_PTR;
    mem = TB__OCL_CALL(rt, CreateBuffer)(dev->ctx, flags, cap, NULL, &err);
    if ((mem == NULL || err != TB__CL_SUCCESS) && dev->cache_count > 0) {
        /* memory held by the cache may be what is missing */
        dev->cache_trims++;
        tb__ocl_metric(dev, "OpenCL::CacheTrim", 1);
        tb__ocl_cache_trim(dev, 0);
        err = TB__CL_SUCCESS;
        mem = TB__OCL_CALL(rt, CreateBuffer)(dev->ctx, flags, cap, NULL, &err);
    }
    if (mem == NULL || err != TB__CL_SUCCESS) {
        tb__free(buf);
        return tb__error(TB_ERR_OUT_OF_MEMORY,
                         "opencl:%d: clCreateBuffer of %zu bytes failed: %s (%d); %llu bytes in "
                         "use, device memory %llu bytes",
                         (int)dev->ordinal, cap, tb__cl_error_name(err), (int)err,
                         (unsigned long long)dev->bytes_in_use,
                         (unsigned long long)dev->info.global_memory);
    }
    buf->dev = dev;
    buf->mem = mem;
    buf->size = size;
    buf->cap = cap;
    rt->refcount++;
    dev->buffers_created++;
    dev->bytes_in_use += cap;
    if (dev->bytes_in_use > dev->peak_bytes) dev->peak_bytes = dev->bytes_in_use;
    tb__ocl_metric(dev, "OpenCL::BytesInUse", (int64_t)cap);
    tb__ocl_metric(dev, "OpenCL::BufferCreate", 1);
    *out = buf;
    return TB_OK;
}

/* Gives a buffer back: cached for reuse while the cache has room, else released. Work already
   enqueued on the device's in-order queue that uses it still runs before any reuse. */
static void tb__ocl_buffer_free(tb__ocl_buffer *buf) {
    tb__ocl_device *dev;
    if (buf == NULL) return;
    dev = buf->dev;
    if (buf->mem == NULL) {
        tb__ocl_buffer_destroy(buf);
        return;
    }
    dev->bytes_in_use -= buf->cap;
    tb__ocl_metric(dev, "OpenCL::BytesInUse", -(int64_t)buf->cap);
    if (dev->rt->exited || (uint64_t)buf->cap > dev->cache_limit ||
        tb__grow((void **)&dev->cache, &dev->cache_cap, dev->cache_count + 1, sizeof *dev->cache) !=
            TB_OK) {
        tb__ocl_buffer_destroy(buf);
        return;
    }
    dev->cache[dev->cache_count++] = buf;
    dev->cached_bytes += buf->cap;
    tb__ocl_metric(dev, "OpenCL::BytesCached", (int64_t)buf->cap);
    tb__ocl_cache_trim(dev, dev->cache_limit);
}

/* ---- transfers ---- */

static tb_status tb__ocl_write(tb__ocl_device *dev, tb__ocl_buffer *buf, const void *host,
                               size_t size) {
    tb__ocl_runtime *rt = dev->rt;
    tb__cl_int err = TB__CL_SUCCESS;
    if (size == 0) return TB_OK;
    if (dev->info.unified_memory) {
        void *p = TB__OCL_CALL(rt, EnqueueMapBuffer)(
            dev->queue, buf->mem, TB__CL_TRUE, TB__CL_MAP_WRITE, 0, size, 0, NULL, NULL, &err);
        if (p != NULL && err == TB__CL_SUCCESS) {
            memcpy(p, host, size);
            err = TB__OCL_CALL(rt, EnqueueUnmapMemObject)(dev->queue, buf->mem, p, 0, NULL, NULL);
            if (err == TB__CL_SUCCESS) return TB_OK;
        }
        /* fall through to an explicit write */
    }
    err = TB__OCL_CALL(rt, EnqueueWriteBuffer)(dev->queue, buf->mem, TB__CL_TRUE, 0, size, host, 0,
                                               NULL, NULL);
    if (err != TB__CL_SUCCESS) {
        return tb__error(tb__cl_is_oom(err) ? TB_ERR_OUT_OF_MEMORY : TB_ERR_EXECUTE,
                         "opencl:%d: writing %zu bytes to the device failed: %s (%d)",
                         (int)dev->ordinal, size, tb__cl_error_name(err), (int)err);
    }
    return TB_OK;
}

static tb_status tb__ocl_read(tb__ocl_device *dev, const tb__ocl_buffer *buf, void *host,
                              size_t size) {
    tb__ocl_runtime *rt = dev->rt;
    tb__cl_int err = TB__CL_SUCCESS;
    if (size == 0) return TB_OK;
    if (dev->info.unified_memory) {
        void *p = TB__OCL_CALL(rt, EnqueueMapBuffer)(dev->queue, buf->mem, TB__CL_TRUE,
                                                     TB__CL_MAP_READ, 0, size, 0, NULL, NULL, &err);
        if (p != NULL && err == TB__CL_SUCCESS) {
            memcpy(host, p, size);
            err = TB__OCL_CALL(rt, EnqueueUnmapMemObject)(dev->queue, buf->mem, p, 0, NULL, NULL);
            if (err == TB__CL_SUCCESS) return TB_OK;
        }
    }
    err = TB__OCL_CALL(rt, EnqueueReadBuffer)(dev->queue, buf->mem, TB__CL_TRUE, 0, size, host, 0,
                                              NULL, NULL);
    if (err != TB__CL_SUCCESS) {
        return tb__error(TB_ERR_EXECUTE,
                         "opencl:%d: reading %zu bytes from the device failed: %s (%d)",
                         (int)dev->ordinal, size, tb__cl_error_name(err), (int)err);
    }
    return TB_OK;
}

/* A scalar's value as the bytes of its dtype, converted as the reference backend converts
   it (tb__scalar_store: NaN and out-of-range values are defined, never a C cast's undefined
   behaviour), so that a kernel sees the value the cpu backend computes with. */
static void tb__ocl_scalar_bytes(tb_dtype dtype, tb_scalar s, unsigned char out[8]) {
    memset(out, 0, 8);
    tb__scalar_store(s, dtype, out);
}

/* ---- backend entries: devices ---- */

static size_t tb__ocl_get_backend_devices(void *user_data, tb_device *out, size_t cap) {
    tb__ocl_runtime *rt;
    size_t i, n = 0;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt != NULL && rt->status == TB_OK) {
        n = rt->num_devices;
        for (i = 0; i < n && i < cap; i++)
            out[i] = rt->devices[i].info.device;
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return n;
}

static tb_status tb__ocl_get_backend_device(void *user_data, int32_t ordinal, tb_device *out) {
    tb__ocl_runtime *rt;
    tb_status st = TB_OK;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
    } else if (rt->status != TB_OK) {
        st = tb__error(rt->status, "%s", rt->reason);
    } else if (ordinal < 0 || (size_t)ordinal >= rt->num_devices) {
        st = tb__error(TB_ERR_NOT_FOUND, "opencl: no device with ordinal %d (%zu device%s)",
                       (int)ordinal, rt->num_devices, rt->num_devices == 1 ? "" : "s");
    } else {
        *out = rt->devices[ordinal].info.device;
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

static tb_status tb__ocl_get_device_info(void *user_data, int32_t ordinal, tb_device_info *out) {
    tb_device dev;
    tb_status st = tb__ocl_get_backend_device(user_data, ordinal, &dev);
    if (st != TB_OK) return st;
    tb__mutex_lock(&tb__ocl_mutex);
    *out = tb__ocl_current->devices[ordinal].info;
    tb__mutex_unlock(&tb__ocl_mutex);
    return TB_OK;
}

static tb_device_type tb__ocl_get_default_device_type(void *user_data) {
    tb__ocl_runtime *rt;
    tb_device_type type = TB_DEVICE_GPU;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt != NULL && rt->status == TB_OK) type = rt->devices[rt->default_ordinal].info.device.type;
    tb__mutex_unlock(&tb__ocl_mutex);
    return type;
}

static int32_t tb__ocl_get_default_device_ordinal(void *user_data) {
    tb__ocl_runtime *rt;
    int32_t ordinal = 0;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt != NULL && rt->status == TB_OK) ordinal = rt->default_ordinal;
    tb__mutex_unlock(&tb__ocl_mutex);
    return ordinal;
}

/* The default becomes the first device of that type. */
static tb_status tb__ocl_set_default_device_type(void *user_data, tb_device_type type) {
    tb__ocl_runtime *rt;
    tb_status st = TB_OK;
    size_t i;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
    } else if (rt->status != TB_OK) {
        st = tb__error(rt->status, "%s", rt->reason);
    } else {
        for (i = 0; i < rt->num_devices; i++)
            if (rt->devices[i].info.device.type == type) break;
        if (i == rt->num_devices) {
            st = tb__error(TB_ERR_NOT_FOUND, "opencl: no device of type %s (%zu device%s)",
                           tb_device_type_name(type), rt->num_devices,
                           rt->num_devices == 1 ? "" : "s");
        } else {
            rt->default_ordinal = (int32_t)i;
        }
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

static tb_status tb__ocl_set_default_device_ordinal(void *user_data, int32_t ordinal) {
    tb_device dev;
    tb_status st = tb__ocl_get_backend_device(user_data, ordinal, &dev);
    if (st != TB_OK) return st;
    tb__mutex_lock(&tb__ocl_mutex);
    tb__ocl_current->default_ordinal = ordinal;
    tb__mutex_unlock(&tb__ocl_mutex);
    return TB_OK;
}

static tb_device_type tb__ocl_eager_fallback_device_type(void *user_data) {
    (void)user_data;
    return TB_DEVICE_CPU;
}

static size_t tb__ocl_metrics_report(void *user_data, char *buf, size_t cap) {
    tb__str s;
    tb__ocl_runtime *rt;
    size_t i, n;
    char *text;
    (void)user_data;
    memset(&s, 0, sizeof s);
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt == NULL || rt->status != TB_OK) {
        tb__str_append(&s, "OpenCL: unavailable: %s\n", rt != NULL ? rt->reason : "out of memory");
    } else {
        for (i = 0; i < rt->num_devices; i++) {
            const tb__ocl_device *d = &rt->devices[i];
            tb__str_append(&s, "Device: opencl:%zu (%s, %s)\n", i, d->info.name,
                           tb_device_type_name(d->info.device.type));
            tb__str_append(&s, "  OpenCL::BytesInUse: %llu\n", (unsigned long long)d->bytes_in_use);
            tb__str_append(&s, "  OpenCL::PeakBytesInUse: %llu\n",
                           (unsigned long long)d->peak_bytes);
            tb__str_append(&s, "  OpenCL::BytesCached: %llu\n",
                           (unsigned long long)d->cached_bytes);
            tb__str_append(&s, "  OpenCL::BufferCreate: %llu\n",
                           (unsigned long long)d->buffers_created);
            tb__str_append(&s, "  OpenCL::BufferReuse: %llu\n",
                           (unsigned long long)d->buffers_reused);
            tb__str_append(&s, "  OpenCL::CacheTrim: %llu\n", (unsigned long long)d->cache_trims);
            tb__str_append(&s, "  OpenCL::ProgramBuild: %llu\n",
                           (unsigned long long)d->program_builds);
            tb__str_append(&s, "  OpenCL::DiskCacheHit: %llu\n", (unsigned long long)d->disk_hits);
            tb__str_append(&s, "  OpenCL::DiskCacheMiss: %llu\n",
                           (unsigned long long)d->disk_misses);
            tb__str_append(&s, "  OpenCL::DiskCacheRejected: %llu\n",
                           (unsigned long long)d->disk_rejected);
            tb__str_append(&s, "  OpenCL::KernelLaunch: %llu\n",
                           (unsigned long long)d->kernels_launched);
        }
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    text = tb__str_take(&s);
    if (text == NULL) {
        if (cap > 0) buf[0] = '\0';
        return 0;
    }
    n = strlen(text);
    if (cap > 0) {
        size_t k = n < cap - 1 ? n : cap - 1;
        memcpy(buf, text, k);
        buf[k] = '\0';
    }
    tb__free(text);
    return n;
}

/* ---- backend entries: data ---- */

static tb_status tb__ocl_data_from_host(void *user_data, tb_backend_data *data, const void *host) {
    tb__ocl_device *dev;
    tb__ocl_buffer *buf = NULL;
    size_t size;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &size);
    if (st != TB_OK) return st;
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(data->device.ordinal, "opencl");
    if (dev == NULL) {
        tb__mutex_unlock(&tb__ocl_mutex);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    }
    st = tb__ocl_buffer_alloc(dev, size, &buf);
    if (st == TB_OK) {
        st = tb__ocl_write(dev, buf, host, size);
        if (st != TB_OK) {
            tb__ocl_buffer_free(buf);
            buf = NULL;
        }
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    if (st == TB_OK) data->payload = buf;
    return st;
}

/* The value stays on the host (kernels take scalars as arguments); device memory is made only
   if a kernel reads it as an array. */
static tb_status tb__ocl_data_from_scalar(void *user_data, tb_backend_data *data, tb_scalar value) {
    tb__ocl_device *dev;
    tb__ocl_buffer *buf;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(data->device.ordinal, "opencl");
    if (dev == NULL) {
        tb__mutex_unlock(&tb__ocl_mutex);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    }
    buf = (tb__ocl_buffer *)tb__calloc(1, sizeof *buf);
    if (buf == NULL) {
        tb__mutex_unlock(&tb__ocl_mutex);
        return TB_ERR_OUT_OF_MEMORY;
    }
    buf->dev = dev;
    dev->rt->refcount++;
    tb__mutex_unlock(&tb__ocl_mutex);
    data->is_scalar = true;
    data->scalar = value;
    data->payload = buf;
    return TB_OK;
}

static tb_status tb__ocl_data_to_host(void *user_data, const tb_backend_data *data, void *host) {
    tb__ocl_buffer *buf = (tb__ocl_buffer *)data->payload;
    size_t size;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &size);
    if (st != TB_OK) return st;
    if (buf == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "opencl: data_to_host of a data without a value");
    }
    if (buf->mem == NULL) {
        unsigned char bytes[8];
        tb__ocl_scalar_bytes(data->shape.dtype, data->scalar, bytes);
        memcpy(host, bytes, size < 8 ? size : 8);
        return TB_OK;
    }
    tb__mutex_lock(&tb__ocl_mutex);
    if (buf->dev->rt->exited) {
        st = tb__error(TB_ERR_STATE, "opencl: the backend was shut down");
    } else {
        st = tb__ocl_read(buf->dev, buf, host, size);
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

static void tb__ocl_data_release(void *user_data, tb_backend_data *data) {
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    tb__ocl_buffer_free((tb__ocl_buffer *)data->payload);
    tb__mutex_unlock(&tb__ocl_mutex);
    data->payload = NULL;
}

/* Device memory for a data that may hold a host scalar; NULL with the error set. */
static tb__cl_mem tb__ocl_data_mem(tb__ocl_device *dev, tb_backend_data *data) {
    tb__ocl_buffer *buf = (tb__ocl_buffer *)data->payload;
    if (buf == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "opencl: an argument has no value");
        return NULL;
    }
    if (buf->dev != dev) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "opencl: an argument lives on opencl:%d, not opencl:%d",
                  (int)buf->dev->ordinal, (int)dev->ordinal);
        return NULL;
    }
    if (buf->mem == NULL) {
        /* a host scalar that a kernel reads as an array: give it device memory now */
        unsigned char bytes[8];
        tb__ocl_buffer *mem_buf = NULL;
        size_t size = tb_dtype_size(data->shape.dtype);
        tb__ocl_scalar_bytes(data->shape.dtype, data->scalar, bytes);
        if (tb__ocl_buffer_alloc(dev, size, &mem_buf) != TB_OK) return NULL;
        if (tb__ocl_write(dev, mem_buf, bytes, size) != TB_OK) {
            tb__ocl_buffer_free(mem_buf);
            return NULL;
        }
        buf->mem = mem_buf->mem;
        buf->size = mem_buf->size;
        buf->cap = mem_buf->cap;
        mem_buf->mem = NULL;
        tb__ocl_buffer_destroy(mem_buf);
    }
    return buf->mem;
}

/* ===========================================================================================
   Lowering: the graph is partitioned into kernels. Every node is either materialised (a
   parameter, or the output of a kernel: a "root") or inlined into the one kernel that uses it.
   Inlined nodes are evaluated at a position: an affine map from the kernel's index variables to
   the node's element (a flat offset and/or one affine form per dim). Movement ops transform
   positions, so they never copy; an input is read at offset + sum(var * stride).
   =========================================================================================== */

enum {
    TB__OCL_K_ELEMENTWISE,
    TB__OCL_K_REDUCE,
    TB__OCL_K_MATMUL,
    TB__OCL_K_NORM,
    TB__OCL_K_PARTIAL, /* first stage of a split reduction: partial results per chunk */
    TB__OCL_K_PACK_A,  /* a matmul's left operand copied into row panels (CPU devices) */
    TB__OCL_K_PACK_B   /* a matmul's right operand copied into column panels (CPU devices) */
};
/* the context of a view that every kernel reading it evaluates itself */
#define TB__OCL_CTX_ANY (-3)
enum { TB__OCL_SLOT_PARAM, TB__OCL_SLOT_RESULT, TB__OCL_SLOT_TEMP };
enum { TB__OCL_ARG_OUT, TB__OCL_ARG_BUF, TB__OCL_ARG_SCALAR, TB__OCL_ARG_ERR, TB__OCL_ARG_TABLE };

/* Graphs with more scalar parameters than this pass them in a table (one small buffer written
   before the kernels) rather than as kernel arguments: devices may accept as little as 1024
   bytes of arguments per kernel. */
#define TB__OCL_MAX_SCALAR_ARGS 16

typedef struct tb__ocl_arg {
    int32_t kind;
    int32_t index; /* a slot for buffers, a parameter for scalars */
} tb__ocl_arg;

typedef struct tb__ocl_kernel {
    int32_t kind;
    int32_t root, core; /* node indices (lowering only); core -1 for elementwise kernels */
    int32_t owner; /* the kernel whose nodes it evaluates: itself, or the kernel it is a stage of
                      (the final stage of a split reduction, a matmul reading panels) */
    int32_t split; /* a split reduction's chunk count (both stages), else 0 */
    int32_t partial_slot; /* the final stage: the partial results it reads */
    bool packed;          /* a matmul reading its operands from the two pack kernels before it */
    int32_t pack_slot[2]; /* those kernels' outputs */
    int32_t out_slot;
    char name[64];
    tb__ocl_arg *args;
    size_t num_args, cap_args;
    /* launch: `items` work items along dim 0 (E kernels, and reductions with one item per
       output), or fixed local sizes and group counts (group_size[0] > 0) */
    uint32_t work_dim;
    uint64_t items;
    size_t group_size[3];
    size_t groups[3];
    double flops, bytes;
} tb__ocl_kernel;

typedef struct tb__ocl_slot {
    int32_t kind;
    int32_t index; /* parameter or result index */
    tb_shape shape;
    int32_t last_use; /* last kernel reading or writing it */
} tb__ocl_slot;

/* Where a run-time error flag came from (out-of-range gather index, negative integer power). */
typedef struct tb__ocl_errsite {
    tb_op op;
    int32_t dim;
    int64_t size;
} tb__ocl_errsite;

/* A lowered graph: what compile and execute need; no node pointers. */
typedef struct tb__ocl_plan {
    int32_t ordinal;
    uint64_t graph_hash;
    size_t num_params, num_results;
    int32_t *param_scalar; /* 1: passed by value (SCALAR); 0: a buffer */
    tb_dtype *param_dtype;
    int32_t *result_slot;   /* per result: the slot holding it */
    int32_t *result_source; /* per result: -1, or an earlier result it duplicates */
    tb__ocl_slot *slots;
    size_t num_slots;
    tb__ocl_kernel *kernels;
    size_t num_kernels, cap_kernels;
    tb__ocl_errsite *errsites;
    size_t num_errsites;
    bool scalar_table; /* scalars in a table buffer (8 bytes each, by parameter index) */
    char *source;
    size_t source_len;
    /* compile */
    tb__ocl_runtime *rt;
    tb__ocl_program *program;
    tb__cl_kernel *cl;
    size_t *local; /* per kernel: work-group size for item-launched kernels */
    /* per graph node (post-order): the kernel computing it, -1 for none (get_node_kernel) */
    int32_t *node_kernel;
    size_t num_nodes;
} tb__ocl_plan;

typedef struct tb__ocl_ninfo {
    const tb_node *node;
    int32_t first_operand; /* into tb__ocl_lower.operands */
    int32_t first_user;    /* into tb__ocl_lower.users */
    int32_t num_users;     /* distinct users */
    int32_t uses;          /* operand slots that name it */
    int32_t param, result, slot;
    int32_t ctx; /* the kernel evaluating it (its own kernel when it is a root) */
    bool root, ident, in_mm, force_root;
} tb__ocl_ninfo;

typedef struct tb__ocl_lower {
    const tb_graph *graph;
    tb__ocl_device *dev;
    size_t n;
    tb__ocl_ninfo *info;
    int32_t *operands;
    int32_t *users;
    /* node pointer -> index */
    const tb_node **map_keys;
    int32_t *map_vals;
    size_t map_cap;
    tb__ocl_plan *plan;
    bool restart;
} tb__ocl_lower;

static void tb__ocl_plan_free(tb__ocl_plan *p) {
    size_t i;
    if (p == NULL) return;
    for (i = 0; i < p->num_kernels; i++)
        tb__free(p->kernels[i].args);
    tb__free(p->kernels);
    tb__free(p->slots);
    tb__free(p->param_scalar);
    tb__free(p->param_dtype);
    tb__free(p->result_slot);
    tb__free(p->result_source);
    tb__free(p->errsites);
    tb__free(p->source);
    tb__free(p->local);
    tb__free(p->node_kernel);
    tb__free(p);
}

static const char *tb__ocl_ctype(tb_dtype dtype) {
    switch (dtype) {
    case TB_F32:
        return "float";
    case TB_F64:
        return "double";
    case TB_I32:
        return "int";
    case TB_I64:
        return "long";
    default:
        return "uchar"; /* u8 and bool (0 or 1) */
    }
}

/* The unsigned type integer arithmetic wraps in. */
static const char *tb__ocl_utype(tb_dtype dtype) {
    switch (dtype) {
    case TB_I32:
        return "uint";
    case TB_I64:
        return "ulong";
    default:
        return "uint";
    }
}

static bool tb__ocl_same_dims(const tb_shape *a, const tb_shape *b) {
    int32_t i;
    if (a->rank != b->rank) return false;
    for (i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

static int64_t tb__ocl_numel(const tb_shape *s) {
    int64_t n = 1;
    int32_t i;
    for (i = 0; i < s->rank; i++)
        n *= s->dims[i];
    return n;
}

static const tb_custom_op_desc *tb__ocl_custom(tb_op op) {
    return op >= TB_OP_BUILTIN_COUNT ? tb_op_custom_desc(op) : NULL;
}

/* Elementwise ops: their operands are read at the same (broadcast) position. */
static bool tb__ocl_is_elementwise(tb_op op) {
    tb_op_kind kind = tb_op_get_kind(op);
    if (kind == TB_KIND_UNARY || kind == TB_KIND_BINARY || kind == TB_KIND_TERNARY) return true;
    if (kind == TB_KIND_CUSTOM) {
        const tb_custom_op_desc *d = tb__ocl_custom(op);
        return d != NULL && d->opencl_expr != NULL && d->infer_shape == NULL;
    }
    return false;
}

/* Ops computed where they are used. */
static bool tb__ocl_is_inlinable(tb_op op) {
    tb_op_kind kind = tb_op_get_kind(op);
    if (tb__ocl_is_elementwise(op)) return true;
    if (kind == TB_KIND_MOVEMENT || kind == TB_KIND_OTHER) return true;
    return op == TB_OP_ARANGE || op == TB_OP_EYE || op == TB_OP_RAND || op == TB_OP_RANDN;
}

/* Ops a matmul tile loader may read through without a copy (index arithmetic only). */
static bool tb__ocl_is_view_like(tb_op op) {
    return tb_op_get_kind(op) == TB_KIND_MOVEMENT || op == TB_OP_CAST;
}

static int32_t tb__ocl_core_kind(tb_op op) {
    switch (tb_op_get_kind(op)) {
    case TB_KIND_REDUCE:
        return TB__OCL_K_REDUCE;
    case TB_KIND_MATMUL:
        return TB__OCL_K_MATMUL;
    case TB_KIND_NORM:
        return TB__OCL_K_NORM;
    default:
        return -1;
    }
}

static size_t tb__ocl_ptr_hash(const void *p, size_t cap) {
    uint64_t h = tb__hash_u64(0x6f70656e636c6d61ull, (uint64_t)(uintptr_t)p);
    return (size_t)(h & (uint64_t)(cap - 1));
}

static int32_t tb__ocl_index_of(const tb__ocl_lower *L, const tb_node *node) {
    size_t i = tb__ocl_ptr_hash(node, L->map_cap);
    while (L->map_keys[i] != NULL) {
        if (L->map_keys[i] == node) return L->map_vals[i];
        i = (i + 1) & (L->map_cap - 1);
    }
    return -1;
}

/* Node table, operand and user lists, parameters and results. */
static tb_status tb__ocl_lower_init(tb__ocl_lower *L) {
    const tb_graph *g = L->graph;
    size_t i, k, total_ops = 0;
    int32_t *fill;
    L->n = g->num_nodes;
    L->info = (tb__ocl_ninfo *)tb__calloc(L->n + 1, sizeof *L->info);
    L->map_cap = 16;
    while (L->map_cap < 2 * L->n + 2)
        L->map_cap *= 2;
    L->map_keys = (const tb_node **)tb__calloc(L->map_cap, sizeof *L->map_keys);
    L->map_vals = (int32_t *)tb__calloc(L->map_cap, sizeof *L->map_vals);
    if (L->info == NULL || L->map_keys == NULL || L->map_vals == NULL) return TB_ERR_OUT_OF_MEMORY;
    if (L->n > (size_t)INT32_MAX / 2) {
        return tb__error(TB_ERR_UNSUPPORTED, "opencl: a graph of %zu nodes is too large", L->n);
    }
    for (i = 0; i < L->n; i++) {
        const tb_node *node = g->nodes[i];
        size_t h = tb__ocl_ptr_hash(node, L->map_cap);
        while (L->map_keys[h] != NULL)
            h = (h + 1) & (L->map_cap - 1);
        L->map_keys[h] = node;
        L->map_vals[h] = (int32_t)i;
        L->info[i].node = node;
        L->info[i].param = -1;
        L->info[i].result = -1;
        L->info[i].slot = -1;
        L->info[i].ctx = -1;
        total_ops += node->num_operands;
    }
    L->operands = (int32_t *)tb__calloc(total_ops + 1, sizeof *L->operands);
    L->users = (int32_t *)tb__calloc(total_ops + 1, sizeof *L->users);
    fill = (int32_t *)tb__calloc(L->n + 1, sizeof *fill);
    if (L->operands == NULL || L->users == NULL || fill == NULL) {
        tb__free(fill);
        return TB_ERR_OUT_OF_MEMORY;
    }
    for (i = 0; i < g->num_parameters; i++) {
        int32_t p = tb__ocl_index_of(L, g->parameters[i]);
        if (p < 0) {
            tb__free(fill);
            return tb__error(TB_ERR_INTERNAL, "opencl: parameter %zu is not in the graph", i);
        }
        L->info[p].param = (int32_t)i;
    }
    for (i = 0; i < g->num_results; i++) {
        int32_t r = tb__ocl_index_of(L, g->results[i]);
        if (r < 0) {
            tb__free(fill);
            return tb__error(TB_ERR_INTERNAL, "opencl: result %zu is not in the graph", i);
        }
        if (L->info[r].result < 0) L->info[r].result = (int32_t)i;
    }
    /* operands (parameters are leaves: their operands are not part of this graph's work) */
    total_ops = 0;
    for (i = 0; i < L->n; i++) {
        const tb_node *node = L->info[i].node;
        L->info[i].first_operand = (int32_t)total_ops;
        if (L->info[i].param >= 0) continue;
        for (k = 0; k < node->num_operands; k++) {
            int32_t o = tb__ocl_index_of(L, node->operands[k]);
            if (o < 0 || (size_t)o >= i) {
                tb__free(fill);
                return tb__error(TB_ERR_INTERNAL,
                                 "opencl: the graph is not in post-order (node %zu, operand %zu)",
                                 i, k);
            }
            L->operands[total_ops++] = o;
            L->info[o].uses++;
        }
    }
    /* distinct users, grouped per node */
    for (i = 0; i < L->n; i++) {
        const tb_node *node = L->info[i].node;
        if (L->info[i].param >= 0) continue;
        for (k = 0; k < node->num_operands; k++) {
            int32_t o = L->operands[L->info[i].first_operand + (int32_t)k];
            size_t j;
            bool seen = false;
            for (j = 0; j < k; j++)
                seen = seen || L->operands[L->info[i].first_operand + (int32_t)j] == o;
            if (!seen) L->info[o].num_users++;
        }
    }
    {
        int32_t at = 0;
        for (i = 0; i < L->n; i++) {
            L->info[i].first_user = at;
            at += L->info[i].num_users;
        }
    }
    for (i = 0; i < L->n; i++) {
        const tb_node *node = L->info[i].node;
        if (L->info[i].param >= 0) continue;
        for (k = 0; k < node->num_operands; k++) {
            int32_t o = L->operands[L->info[i].first_operand + (int32_t)k];
            size_t j;
            bool seen = false;
            for (j = 0; j < k; j++)
                seen = seen || L->operands[L->info[i].first_operand + (int32_t)j] == o;
            if (!seen) L->users[L->info[o].first_user + fill[o]++] = (int32_t)i;
        }
    }
    tb__free(fill);
    return TB_OK;
}

static int32_t tb__ocl_operand(const tb__ocl_lower *L, int32_t node, size_t k) {
    return L->operands[L->info[node].first_operand + (int32_t)k];
}

static tb_status tb__ocl_add_kernel(tb__ocl_lower *L, int32_t kind, int32_t root, int32_t core,
                                    int32_t *out) {
    tb__ocl_plan *p = L->plan;
    tb__ocl_kernel *k;
    if (tb__grow((void **)&p->kernels, &p->cap_kernels, p->num_kernels + 1,
                 sizeof(tb__ocl_kernel)) != TB_OK)
        return TB_ERR_OUT_OF_MEMORY;
    k = &p->kernels[p->num_kernels];
    memset(k, 0, sizeof *k);
    k->kind = kind;
    k->root = root;
    k->core = core;
    k->out_slot = -1;
    *out = (int32_t)p->num_kernels++;
    return TB_OK;
}

/* Orders kernels by their roots (producers first) and renumbers the contexts. */
static tb_status tb__ocl_sort_kernels(tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    size_t nk = p->num_kernels, i, j;
    int32_t *remap;
    tb__ocl_kernel *sorted;
    if (nk == 0) return TB_OK;
    remap = (int32_t *)tb__calloc(nk, sizeof *remap);
    sorted = (tb__ocl_kernel *)tb__calloc(nk, sizeof *sorted);
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
            return tb__error(TB_ERR_INTERNAL, "opencl: kernels out of order");
        }
    }
    memcpy(p->kernels, sorted, nk * sizeof *sorted);
    for (i = 0; i < L->n; i++)
        if (L->info[i].ctx >= 0) L->info[i].ctx = remap[L->info[i].ctx];
    tb__free(remap);
    tb__free(sorted);
    return TB_OK;
}

/* Code generation as for a GPU whatever the device (a test hook: the GPU variants of matmul
   and of the reductions then run on a CPU device too). */
static int tb__ocl_codegen_as_gpu = 0;

static bool tb__ocl_codegen_cpu(const tb__ocl_device *dev) {
    return dev->info.device.type == TB_DEVICE_CPU && !tb__ocl_codegen_as_gpu;
}

static bool tb__ocl_fast_f64(const tb__ocl_device *dev) {
    return dev->info.supports_f64 && dev->info.device.type == TB_DEVICE_CPU;
}

/* The reduced element count and output count of a reduction node. */
static void tb__ocl_reduce_sizes(const tb__ocl_lower *L, int32_t core, int64_t *n_out, int64_t *m) {
    const tb_node *c = L->info[core].node;
    const tb_shape *xs = &L->info[tb__ocl_operand(L, core, 0)].node->shape;
    *n_out = tb__ocl_numel(&c->shape);
    *m = *n_out > 0 ? tb__ocl_numel(xs) / *n_out : 0;
}

/* The dtype a reduction accumulates in (the partial results of a split reduction). */
static tb_dtype tb__ocl_reduce_acc_dtype(const tb__ocl_lower *L, int32_t core) {
    const tb_node *c = L->info[core].node;
    tb_dtype od = c->shape.dtype;
    if (c->op == TB_OP_MAX || c->op == TB_OP_MIN)
        return L->info[tb__ocl_operand(L, core, 0)].node->shape.dtype;
    if (tb_dtype_is_float(od)) return od == TB_F32 && tb__ocl_fast_f64(L->dev) ? TB_F64 : od;
    return od == TB_I64 ? TB_I64 : TB_I32; /* the wrapping ulong / uint accumulators */
}

/* How many chunks a reduction with few outputs over many elements is split into, so that
   every compute unit gets work; 1: not split. */
static int64_t tb__ocl_split_count(const tb__ocl_device *dev, int64_t n_out, int64_t m) {
    int64_t want = (int64_t)dev->info.compute_units * (tb__ocl_codegen_cpu(dev) ? 64 : 16);
    int64_t chunks;
    if (n_out <= 0 || m < 16384 || n_out >= want) return 1;
    chunks = (want + n_out - 1) / n_out;
    if (chunks > m / 4096) chunks = m / 4096;
    if (chunks > 1024) chunks = 1024;
    return chunks >= 2 ? chunks : 1;
}

/* Splits reductions with few outputs into a partial stage (chunks of each row in parallel)
   and a final stage (combines the chunks, then the epilogue). */
static tb_status tb__ocl_split_reductions(tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    size_t i, j;
    for (i = 0; i < p->num_kernels; i++)
        p->kernels[i].owner = (int32_t)i;
    for (i = 0; i < p->num_kernels; i++) {
        tb__ocl_kernel *k = &p->kernels[i];
        const tb_node *c;
        int64_t n_out, m, chunks;
        if (k->kind != TB__OCL_K_REDUCE) continue;
        c = L->info[k->core].node;
        if (c->op == TB_OP_ARGMAX || c->op == TB_OP_ARGMIN) continue;
        tb__ocl_reduce_sizes(L, k->core, &n_out, &m);
        chunks = tb__ocl_split_count(L->dev, n_out, m);
        if (chunks <= 1) continue;
        if (tb__grow((void **)&p->kernels, &p->cap_kernels, p->num_kernels + 1,
                     sizeof(tb__ocl_kernel)) != TB_OK)
            return TB_ERR_OUT_OF_MEMORY;
        memmove(&p->kernels[i + 1], &p->kernels[i], (p->num_kernels - i) * sizeof(tb__ocl_kernel));
        p->num_kernels++;
        memset(&p->kernels[i], 0, sizeof(tb__ocl_kernel));
        p->kernels[i].kind = TB__OCL_K_PARTIAL;
        p->kernels[i].root = p->kernels[i + 1].root;
        p->kernels[i].core = p->kernels[i + 1].core;
        p->kernels[i].split = (int32_t)chunks;
        p->kernels[i].out_slot = -1;
        p->kernels[i + 1].split = (int32_t)chunks;
        for (j = 0; j < L->n; j++)
            if (L->info[j].ctx >= (int32_t)i) L->info[j].ctx++;
        for (j = i + 1; j < p->num_kernels; j++)
            p->kernels[j].owner = (int32_t)j;
        p->kernels[i].owner = (int32_t)i + 1;
        i++;
    }
    return TB_OK;
}

/* Matmuls on CPU devices read panels: rows of A, TB__OCL_MM_ROWS at a time, and columns of B,
   one vector width at a time, each laid out contiguously along K. The panels keep the inner
   loop on consecutive addresses (row strides of a power of two otherwise map every row to the
   same cache sets) and evaluate fused producers of the operands once. */
#define TB__OCL_MM_ROWS      16
#define TB__OCL_PACK_GROUP_K 8 /* work-group of a pack kernel: vector width x this */

/* A matmul core's sizes: batch (the product of the leading dims), M, N and K. */
typedef struct tb__ocl_mm {
    int64_t batch, m, n, k;
} tb__ocl_mm;

static tb__ocl_mm tb__ocl_mm_of(const tb__ocl_lower *L, int32_t core) {
    const tb_shape *cs = &L->info[core].node->shape;
    const tb_shape *as = &L->info[tb__ocl_operand(L, core, 0)].node->shape;
    tb__ocl_mm mm;
    int32_t d;
    mm.batch = 1;
    for (d = 0; d + 2 < cs->rank; d++)
        mm.batch *= cs->dims[d];
    mm.m = cs->dims[cs->rank - 2];
    mm.n = cs->dims[cs->rank - 1];
    mm.k = as->dims[as->rank - 1];
    return mm;
}

static int64_t tb__ocl_mm_width(tb_dtype dtype) {
    return dtype == TB_F64 ? 8 : 16;
}

/* Whether a matmul kernel is worth packing: a float matmul with some work in it. */
static bool tb__ocl_mm_packs(const tb__ocl_lower *L, const tb__ocl_kernel *k) {
    const tb_node *c = L->info[k->core].node;
    const tb_shape *cs = &c->shape;
    int32_t r = cs->rank;
    tb_dtype od = cs->dtype;
    const tb_shape *as = &L->info[tb__ocl_operand(L, k->core, 0)].node->shape;
    const tb_shape *bs = &L->info[tb__ocl_operand(L, k->core, 1)].node->shape;
    tb__ocl_mm mm = tb__ocl_mm_of(L, k->core);
    int64_t M = mm.m, N = mm.n, K = mm.k;
    if (!tb__ocl_codegen_cpu(L->dev) || (od != TB_F32 && od != TB_F64)) return false;
    if (as->dtype != od || bs->dtype != od || as->rank != r || bs->rank != r) return false;
    if (od == TB_F64 && !L->dev->info.supports_f64) return false;
    if (M < 4 || N < 16 || K < 16 || (double)M * (double)N * (double)K < 262144.0) return false;
    {
        /* the panels of the bigger operand (batch included) within half the device's largest
           allocation */
        double elems = (double)(M > N ? M + TB__OCL_MM_ROWS : N + 16) * (double)K;
        elems *= (double)mm.batch;
        if (L->dev->info.max_allocation > 0 &&
            elems * (double)tb_dtype_size(od) > (double)L->dev->info.max_allocation / 2)
            return false;
    }
    return true;
}

/* Puts the two pack kernels in front of every matmul kernel that packs. */
static tb_status tb__ocl_pack_matmuls(tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    size_t i, j;
    for (i = 0; i < p->num_kernels; i++) {
        tb__ocl_kernel *k = &p->kernels[i];
        if (k->kind != TB__OCL_K_MATMUL || !tb__ocl_mm_packs(L, k)) continue;
        if (tb__grow((void **)&p->kernels, &p->cap_kernels, p->num_kernels + 2,
                     sizeof(tb__ocl_kernel)) != TB_OK)
            return TB_ERR_OUT_OF_MEMORY;
        memmove(&p->kernels[i + 2], &p->kernels[i], (p->num_kernels - i) * sizeof(tb__ocl_kernel));
        p->num_kernels += 2;
        for (j = 0; j < L->n; j++)
            if (L->info[j].ctx >= (int32_t)i) L->info[j].ctx += 2;
        for (j = 0; j < p->num_kernels; j++)
            if ((j < i || j >= i + 2) && p->kernels[j].owner >= (int32_t)i)
                p->kernels[j].owner += 2;
        for (j = 0; j < 2; j++) {
            tb__ocl_kernel *pk = &p->kernels[i + j];
            memset(pk, 0, sizeof *pk);
            pk->kind = j == 0 ? TB__OCL_K_PACK_A : TB__OCL_K_PACK_B;
            pk->root = p->kernels[i + 2].root;
            pk->core = p->kernels[i + 2].core;
            pk->owner = (int32_t)i + 2;
            pk->out_slot = -1;
        }
        p->kernels[i + 2].packed = true;
        i += 2;
    }
    return TB_OK;
}

/* Roots and contexts. Users come before their operands (reverse post-order), so a node knows
   the kernels of all its users when its turn comes: it is inlined when they all share one
   kernel (and, under a matmul, when it is index arithmetic), else it becomes a root. A
   reduction, matmul or norm whose only user is an elementwise node evaluated at the kernel's
   output position becomes that kernel's core, and the elementwise nodes above it its
   epilogue. */
static tb_status tb__ocl_partition(tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    int32_t i, k;
    size_t j;
    tb_status st;
    for (j = 0; j < p->num_kernels; j++)
        tb__free(p->kernels[j].args);
    p->num_kernels = 0;
    for (j = 0; j < L->n; j++) {
        L->info[j].root = false;
        L->info[j].ident = false;
        L->info[j].in_mm = false;
        L->info[j].ctx = -1;
        L->info[j].slot = -1;
    }
    for (i = (int32_t)L->n - 1; i >= 0; i--) {
        tb__ocl_ninfo *in = &L->info[i];
        const tb_node *node = in->node;
        bool must_root = in->result >= 0 || in->force_root || in->num_users == 0;
        int32_t core_kind = tb__ocl_core_kind(node->op);
        if (in->param >= 0) {
            if (in->result >= 0) {
                /* a parameter returned as a result: a copy */
                st = tb__ocl_add_kernel(L, TB__OCL_K_ELEMENTWISE, i, -1, &k);
                if (st != TB_OK) return st;
                in->root = true;
                in->ctx = k;
                in->ident = true;
            }
            continue;
        }
        if (core_kind >= 0) {
            if (!must_root && in->num_users == 1 && in->uses == 1) {
                int32_t u = L->users[in->first_user];
                const tb__ocl_ninfo *ui = &L->info[u];
                if (ui->ident && ui->ctx >= 0 && p->kernels[ui->ctx].core < 0 &&
                    tb__ocl_is_elementwise(ui->node->op) &&
                    tb__ocl_same_dims(&ui->node->shape, &node->shape)) {
                    p->kernels[ui->ctx].core = i;
                    p->kernels[ui->ctx].kind = core_kind;
                    in->ctx = ui->ctx;
                    in->ident = true;
                    continue;
                }
            }
            st = tb__ocl_add_kernel(L, core_kind, i, i, &k);
            if (st != TB_OK) return st;
            in->root = true;
            in->ctx = k;
            in->ident = true;
            continue;
        }
        if (!tb__ocl_is_inlinable(node->op)) {
            const char *name = tb_op_name(node->op);
            return tb__error(TB_ERR_UNSUPPORTED, "opencl: op '%s' cannot be lowered",
                             name != NULL ? name : "?");
        }
        if (!must_root) {
            int32_t common = -2, u = -1, e;
            bool ok = true, in_mm = false, movement = tb_op_get_kind(node->op) == TB_KIND_MOVEMENT;
            for (e = 0; e < in->num_users; e++) {
                const tb__ocl_ninfo *ui;
                u = L->users[in->first_user + e];
                ui = &L->info[u];
                if (common == -2) {
                    common = ui->ctx;
                } else if (common != ui->ctx) {
                    ok = false;
                }
                if (ui->node->op == TB_OP_MATMUL || (ui->in_mm && !ui->root)) in_mm = true;
            }
            if (common < 0) ok = false;
            if (ok && in_mm && !tb__ocl_is_view_like(node->op)) ok = false;
            if (!ok && movement && (common >= 0 || common == TB__OCL_CTX_ANY)) {
                /* a view read by several kernels: each reads through it (index arithmetic),
                   whatever is below it is materialised once */
                in->ctx = TB__OCL_CTX_ANY;
                continue;
            }
            if (ok) {
                in->ctx = common;
                in->in_mm = in_mm;
                if (in->num_users == 1 && in->uses == 1) {
                    const tb__ocl_ninfo *ui = &L->info[u];
                    in->ident = ui->ident && tb__ocl_is_elementwise(ui->node->op) &&
                                tb__ocl_same_dims(&ui->node->shape, &node->shape);
                }
                continue;
            }
        }
        st = tb__ocl_add_kernel(L, TB__OCL_K_ELEMENTWISE, i, -1, &k);
        if (st != TB_OK) return st;
        in->root = true;
        in->ctx = k;
        in->ident = true;
    }
    st = tb__ocl_sort_kernels(L);
    if (st == TB_OK) st = tb__ocl_split_reductions(L);
    if (st == TB_OK) st = tb__ocl_pack_matmuls(L);
    return st;
}

static tb_status tb__ocl_add_slot(tb__ocl_plan *p, size_t *cap, int32_t kind, int32_t index,
                                  const tb_shape *shape, int32_t *out) {
    tb__ocl_slot *s;
    if (tb__grow((void **)&p->slots, cap, p->num_slots + 1, sizeof(tb__ocl_slot)) != TB_OK)
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

/* The sizes of a packing matmul: batch, rows, columns, depth, and the panel count and width
   of the operand a pack kernel copies. */
static void tb__ocl_pack_sizes(const tb__ocl_lower *L, const tb__ocl_kernel *k, bool is_a,
                               int64_t sizes[6]) {
    tb__ocl_mm mm = tb__ocl_mm_of(L, k->core);
    int64_t width = is_a ? TB__OCL_MM_ROWS : tb__ocl_mm_width(L->info[k->core].node->shape.dtype);
    int64_t len = is_a ? mm.m : mm.n;
    sizes[0] = mm.batch;
    sizes[1] = mm.m;
    sizes[2] = mm.n;
    sizes[3] = mm.k;
    sizes[4] = (len + width - 1) / width;
    sizes[5] = width;
}

static int64_t tb__ocl_pack_numel(const tb__ocl_lower *L, const tb__ocl_kernel *k) {
    int64_t z[6];
    tb__ocl_pack_sizes(L, k, k->kind == TB__OCL_K_PACK_A, z);
    return z[0] * z[4] * z[3] * z[5];
}

/* Buffers: one per array parameter and one per kernel output. */
static tb_status tb__ocl_assign_slots(tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    size_t cap = 0, i;
    int32_t s;
    tb_status st;
    tb__free(p->slots);
    p->slots = NULL;
    p->num_slots = 0;
    for (i = 0; i < L->n; i++) {
        tb__ocl_ninfo *in = &L->info[i];
        if (in->param < 0 || in->node->op == TB_OP_SCALAR) continue;
        st = tb__ocl_add_slot(p, &cap, TB__OCL_SLOT_PARAM, in->param, &in->node->shape, &s);
        if (st != TB_OK) return st;
        in->slot = s;
    }
    for (i = 0; i < p->num_kernels; i++) {
        tb__ocl_kernel *k = &p->kernels[i];
        tb__ocl_ninfo *in = &L->info[k->root];
        if (k->owner != (int32_t)i) {
            /* a stage of another kernel (partial results, operand panels): a temporary only
               that kernel reads */
            tb__ocl_kernel *o = &p->kernels[k->owner];
            tb_shape ps;
            memset(&ps, 0, sizeof ps);
            ps.rank = 1;
            if (k->kind == TB__OCL_K_PARTIAL) {
                int64_t n_out, m;
                tb__ocl_reduce_sizes(L, k->core, &n_out, &m);
                ps.dtype = tb__ocl_reduce_acc_dtype(L, k->core);
                ps.dims[0] = n_out * k->split;
            } else {
                ps.dtype = L->info[k->core].node->shape.dtype;
                ps.dims[0] = tb__ocl_pack_numel(L, k);
            }
            st = tb__ocl_add_slot(p, &cap, TB__OCL_SLOT_TEMP, -1, &ps, &s);
            if (st != TB_OK) return st;
            k->out_slot = s;
            p->slots[s].last_use = k->owner;
            if (k->kind == TB__OCL_K_PARTIAL)
                o->partial_slot = s;
            else
                o->pack_slot[k->kind == TB__OCL_K_PACK_A ? 0 : 1] = s;
            continue;
        }
        if (in->result >= 0) {
            st = tb__ocl_add_slot(p, &cap, TB__OCL_SLOT_RESULT, in->result, &in->node->shape, &s);
        } else {
            st = tb__ocl_add_slot(p, &cap, TB__OCL_SLOT_TEMP, -1, &in->node->shape, &s);
        }
        if (st != TB_OK) return st;
        k->out_slot = s;
        p->slots[s].last_use = (int32_t)i;
        if (in->param < 0) in->slot = s;
    }
    for (i = 0; i < p->num_results; i++) {
        int32_t r = tb__ocl_index_of(L, L->graph->results[i]);
        size_t kk;
        p->result_slot[i] = -1;
        p->result_source[i] = -1;
        if (L->info[r].result != (int32_t)i) {
            p->result_source[i] = L->info[r].result;
            continue;
        }
        for (kk = 0; kk < p->num_kernels; kk++)
            if (p->kernels[kk].root == r && p->kernels[kk].owner == (int32_t)kk)
                p->result_slot[i] = p->kernels[kk].out_slot;
        if (p->result_slot[i] < 0)
            return tb__error(TB_ERR_INTERNAL, "opencl: result without kernel");
    }
    return TB_OK;
}

/* ---- code generation: linear forms and positions ---- */

#define TB__LF_MAX        8
#define TB__CG_BUCKETS    4096
#define TB__CG_MAX_DEPTH  64
#define TB__CG_MAX_VALUES 60000 /* values one kernel may compute before sharing is forced */

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

enum { TB__MEMO_VALUE = 1, TB__MEMO_UNRAVEL = 2 };

typedef struct tb__cg_memo {
    uint64_t key;
    int32_t kind, a, b;
    uint64_t extra;
    int32_t value;
    int32_t next;
} tb__cg_memo;

typedef struct tb__cg_undo {
    int32_t pos;
    int32_t form; /* 1: flat was added, 2: multi was added */
} tb__cg_undo;

typedef struct tb__cg_scope {
    size_t memo, undo;
} tb__cg_scope;

typedef struct tb__cg_frame {
    int32_t node, pos, state, vbase;
} tb__cg_frame;

typedef struct tb__cg_var {
    int64_t lo, hi;
} tb__cg_var;

/* Names in generated kernels: one namespace, split by form so that no two kinds can meet.
   - Numbered names are exactly one kind letter and a decimal number, and nothing else has that
     form: v<n> values and i<n> index variables (numbered by this kernel's counters), b<slot>
     buffer and s<param> scalar arguments (numbered by the plan), x<k> a custom op's operands.
     A kind's numbers are unique, and the letters differ, so numbered names never collide.
   - Every other name is a fixed word of a kernel template (out, acc, mean, row0, tb_err, ...)
     and is never one letter followed by digits, so it cannot meet a numbered name whatever
     the graph; fixed names are the same in every kernel of a kind, so a test of that kind
     shows a collision among them.
   The text of a kernel goes into one builder (body) whose failure is sticky and checked once,
   after the kernel; a helper that builds text elsewhere folds its failure into g->status. */
typedef struct tb__cg {
    tb__ocl_lower *L;
    int32_t kernel;
    tb__str body;
    int indent;
    bool fast_f64; /* f32 transcendental functions computed in double (CPU devices with fp64) */
    /* index variables i<n> (long) with their ranges */
    tb__cg_var *vars;
    size_t num_vars, cap_vars;
    /* values v<n> with their dtypes */
    tb_dtype *val_dtype;
    size_t num_vals, cap_vals;
    tb__pos *pos;
    size_t num_pos, cap_pos;
    int32_t pos_head[TB__CG_BUCKETS];
    tb__cg_memo *memo;
    size_t num_memo, cap_memo;
    int32_t memo_head[TB__CG_BUCKETS];
    tb__cg_undo *undo;
    size_t num_undo, cap_undo;
    tb__cg_scope *scopes;
    size_t num_scopes, cap_scopes;
    tb__cg_frame *frames;
    size_t num_frames, cap_frames;
    int32_t *stack;
    size_t num_stack, cap_stack;
    int depth;
    /* evaluations of each node in this kernel (a node evaluated at many positions is
       recomputed each time: past a budget it is materialised instead) */
    int32_t *evals;
    int32_t *touched;
    size_t num_touched;
    double ops; /* operations per output element, for the GFLOP/s estimate */
    tb_status status;
} tb__cg;

static tb_status tb__cg_fail(tb__cg *g, tb_status st) {
    if (g->status == TB_OK) g->status = st;
    return st;
}

static void tb__cg_line(tb__cg *g, const char *fmt, ...) TB_PRINTF_LIKE(2, 3);
static void tb__cg_line(tb__cg *g, const char *fmt, ...) {
    char small[512];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        g->body.failed = true; /* a line left out is a wrong kernel: fail the whole body */
        return;
    }
    tb__str_append(&g->body, "%*s", g->indent * 4, "");
    if ((size_t)n < sizeof small) {
        tb__str_append(&g->body, "%s\n", small);
    } else {
        char *big = (char *)tb__alloc((size_t)n + 1);
        if (big == NULL) {
            g->body.failed = true;
            return;
        }
        va_start(ap, fmt);
        vsnprintf(big, (size_t)n + 1, fmt, ap);
        va_end(ap);
        tb__str_append(&g->body, "%s\n", big);
        tb__free(big);
    }
}

static int64_t tb__sat_add(int64_t a, int64_t b) {
    if (b > 0 && a > INT64_MAX - b) return INT64_MAX;
    if (b < 0 && a < INT64_MIN - b) return INT64_MIN;
    return a + b;
}

static int64_t tb__sat_mul(int64_t a, int64_t b) {
    if (a == 0 || b == 0) return 0;
    if (a > 0 ? (b > 0 ? a > INT64_MAX / b : b < INT64_MIN / a)
              : (b > 0 ? a < INT64_MIN / b : a < INT64_MAX / b))
        return ((a > 0) == (b > 0)) ? INT64_MAX : INT64_MIN;
    return a * b;
}

static int32_t tb__cg_new_var(tb__cg *g, int64_t lo, int64_t hi) {
    if (tb__grow((void **)&g->vars, &g->cap_vars, g->num_vars + 1, sizeof(tb__cg_var)) != TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    g->vars[g->num_vars].lo = lo;
    g->vars[g->num_vars].hi = hi;
    return (int32_t)g->num_vars++;
}

static int32_t tb__cg_new_val(tb__cg *g, tb_dtype dtype) {
    if (tb__grow((void **)&g->val_dtype, &g->cap_vals, g->num_vals + 1, sizeof(tb_dtype)) !=
        TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    g->val_dtype[g->num_vals] = dtype;
    return (int32_t)g->num_vals++;
}

static void tb__lf_const(tb__lf *lf, int64_t c) {
    memset(lf, 0, sizeof *lf);
    lf->c = c;
}

static bool tb__lf_add_term(tb__lf *lf, int32_t var, int64_t coef) {
    int32_t i, j;
    if (coef == 0) return true;
    for (i = 0; i < lf->n; i++) {
        if (lf->var[i] == var) {
            lf->coef[i] += coef;
            if (lf->coef[i] == 0) {
                for (j = i; j + 1 < lf->n; j++) {
                    lf->var[j] = lf->var[j + 1];
                    lf->coef[j] = lf->coef[j + 1];
                }
                lf->n--;
                lf->var[lf->n] = 0;
                lf->coef[lf->n] = 0;
            }
            return true;
        }
        if (lf->var[i] > var) break;
    }
    if (lf->n == TB__LF_MAX) return false;
    for (j = lf->n; j > i; j--) {
        lf->var[j] = lf->var[j - 1];
        lf->coef[j] = lf->coef[j - 1];
    }
    lf->var[i] = var;
    lf->coef[i] = coef;
    lf->n++;
    return true;
}

static void tb__cg_lf_range(const tb__cg *g, const tb__lf *lf, int64_t *lo, int64_t *hi) {
    int32_t i;
    *lo = lf->c;
    *hi = lf->c;
    for (i = 0; i < lf->n; i++) {
        int64_t a = tb__sat_mul(lf->coef[i], g->vars[lf->var[i]].lo);
        int64_t b = tb__sat_mul(lf->coef[i], g->vars[lf->var[i]].hi);
        *lo = tb__sat_add(*lo, a < b ? a : b);
        *hi = tb__sat_add(*hi, a < b ? b : a);
    }
}

/* The form as OpenCL C (a long expression). */
static void tb__cg_lf_text(const tb__lf *lf, char *buf, size_t cap) {
    size_t len = 0;
    int32_t i;
    buf[0] = '\0';
    for (i = 0; i < lf->n; i++) {
        int64_t c = lf->coef[i];
        const char *sign = (c < 0) ? (len == 0 ? "-" : " - ") : (len == 0 ? "" : " + ");
        uint64_t mag = c < 0 ? (uint64_t)0 - (uint64_t)c : (uint64_t)c;
        int n;
        if (mag == 1) {
            n = snprintf(buf + len, cap - len, "%si%d", sign, (int)lf->var[i]);
        } else {
            n = snprintf(buf + len, cap - len, "%si%d * %llu%s", sign, (int)lf->var[i],
                         (unsigned long long)mag, mag > 2147483647u ? "L" : "");
        }
        if (n < 0 || (size_t)n >= cap - len) return;
        len += (size_t)n;
    }
    if (lf->c != 0 || len == 0) {
        uint64_t mag = lf->c < 0 ? (uint64_t)0 - (uint64_t)lf->c : (uint64_t)lf->c;
        const char *sign = lf->c < 0 ? (len == 0 ? "-" : " - ") : (len == 0 ? "" : " + ");
        snprintf(buf + len, cap - len, "%s%llu%s", sign, (unsigned long long)mag,
                 mag > 2147483647u ? "L" : "");
    }
}

#define TB__LF_TEXT 640

/* A new variable holding the form's value. */
static int32_t tb__cg_spill(tb__cg *g, const tb__lf *lf) {
    char text[TB__LF_TEXT];
    int64_t lo, hi;
    int32_t v;
    if (lf->n == 1 && lf->c == 0 && lf->coef[0] == 1) return lf->var[0];
    tb__cg_lf_range(g, lf, &lo, &hi);
    v = tb__cg_new_var(g, lo, hi);
    if (v < 0) return -1;
    tb__cg_lf_text(lf, text, sizeof text);
    tb__cg_line(g, "const long i%d = %s;", (int)v, text);
    return v;
}

/* dst += scale * src, spilling into variables when the terms do not fit. */
static bool tb__cg_lf_addmul(tb__cg *g, tb__lf *dst, const tb__lf *src, int64_t scale) {
    int32_t i;
    tb__lf s = *src;
    if (scale == 0) return true;
    dst->c += s.c * scale;
    for (i = 0; i < s.n; i++) {
        if (!tb__lf_add_term(dst, s.var[i], s.coef[i] * scale)) {
            int32_t v = tb__cg_spill(g, dst);
            if (v < 0) return false;
            tb__lf_const(dst, 0);
            tb__lf_add_term(dst, v, 1);
            tb__lf_add_term(dst, s.var[i], s.coef[i] * scale);
        }
    }
    return true;
}

static void tb__cg_contig(int32_t rank, const int64_t *dims, int64_t *strides) {
    int64_t s = 1;
    int32_t i;
    for (i = rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= dims[i] > 0 ? dims[i] : 1;
    }
}

static void tb__cg_pos_init(tb__pos *p, const tb_shape *shape) {
    memset(p, 0, sizeof *p);
    p->rank = shape->rank;
    memcpy(p->dims, shape->dims, (size_t)shape->rank * sizeof(int64_t));
}

static uint64_t tb__cg_pos_hash(const tb__pos *p) {
    uint64_t h = tb__hash_u64(0x706f736974696f6eull, (uint64_t)(uint32_t)p->rank);
    h = tb__hash_bytes(h, p->dims, sizeof p->dims);
    h = tb__hash_u64(h, (uint64_t)p->key_flat);
    if (p->key_flat) return tb__hash_bytes(h, &p->flat, sizeof p->flat);
    return tb__hash_bytes(h, p->dim, sizeof p->dim);
}

static bool tb__cg_pos_same(const tb__pos *a, const tb__pos *b) {
    if (a->rank != b->rank || a->key_flat != b->key_flat) return false;
    if (memcmp(a->dims, b->dims, sizeof a->dims) != 0) return false;
    if (a->key_flat) return memcmp(&a->flat, &b->flat, sizeof a->flat) == 0;
    return memcmp(a->dim, b->dim, sizeof a->dim) == 0;
}

/* Canonical form (dims of size 1 are at index 0; arrays of 0 or 1 element at offset 0), then
   the id of the equal interned position. */
static int32_t tb__cg_intern(tb__cg *g, tb__pos *p) {
    int64_t numel = 1;
    int32_t i, id;
    size_t b;
    for (i = 0; i < p->rank; i++)
        numel *= p->dims[i];
    if (numel <= 1) {
        tb__lf_const(&p->flat, 0);
        for (i = 0; i < p->rank; i++)
            tb__lf_const(&p->dim[i], 0);
        p->has_flat = p->has_multi = 1;
        p->key_flat = 1;
    } else {
        if (p->has_multi) {
            for (i = 0; i < p->rank; i++)
                if (p->dims[i] == 1) tb__lf_const(&p->dim[i], 0);
        }
        p->key_flat = p->has_flat ? 1 : 0;
    }
    if (!p->has_flat) tb__lf_const(&p->flat, 0);
    if (!p->has_multi) {
        for (i = 0; i < TB_MAX_RANK; i++)
            tb__lf_const(&p->dim[i], 0);
    }
    for (i = p->rank; i < TB_MAX_RANK; i++) {
        p->dims[i] = 0;
        tb__lf_const(&p->dim[i], 0);
    }
    p->hash = tb__cg_pos_hash(p);
    b = (size_t)(p->hash & (TB__CG_BUCKETS - 1));
    for (id = g->pos_head[b]; id >= 0; id = g->pos[id].next) {
        if (g->pos[id].hash == p->hash && tb__cg_pos_same(&g->pos[id], p)) return id;
    }
    if (tb__grow((void **)&g->pos, &g->cap_pos, g->num_pos + 1, sizeof(tb__pos)) != TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    id = (int32_t)g->num_pos++;
    g->pos[id] = *p;
    g->pos[id].next = g->pos_head[b];
    g->pos_head[b] = id;
    return id;
}

static uint64_t tb__cg_memo_key(int32_t kind, int32_t a, int32_t b, uint64_t extra) {
    uint64_t h = tb__hash_u64(0x6d656d6f00000001ull, (uint64_t)(uint32_t)kind);
    h = tb__hash_u64(h, (uint64_t)(uint32_t)a);
    h = tb__hash_u64(h, (uint64_t)(uint32_t)b);
    return tb__hash_u64(h, extra);
}

static int32_t tb__cg_memo_find(const tb__cg *g, int32_t kind, int32_t a, int32_t b,
                                uint64_t extra) {
    uint64_t key = tb__cg_memo_key(kind, a, b, extra);
    int32_t e;
    for (e = g->memo_head[key & (TB__CG_BUCKETS - 1)]; e >= 0; e = g->memo[e].next) {
        const tb__cg_memo *m = &g->memo[e];
        if (m->key == key && m->kind == kind && m->a == a && m->b == b && m->extra == extra)
            return m->value;
    }
    return -1;
}

static void tb__cg_memo_add(tb__cg *g, int32_t kind, int32_t a, int32_t b, uint64_t extra,
                            int32_t value) {
    uint64_t key = tb__cg_memo_key(kind, a, b, extra);
    size_t bucket = (size_t)(key & (TB__CG_BUCKETS - 1));
    tb__cg_memo *m;
    if (tb__grow((void **)&g->memo, &g->cap_memo, g->num_memo + 1, sizeof(tb__cg_memo)) != TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return;
    }
    m = &g->memo[g->num_memo];
    m->key = key;
    m->kind = kind;
    m->a = a;
    m->b = b;
    m->extra = extra;
    m->value = value;
    m->next = g->memo_head[bucket];
    g->memo_head[bucket] = (int32_t)g->num_memo++;
}

static void tb__cg_undo_push(tb__cg *g, int32_t pos, int32_t form) {
    if (g->num_scopes == 0) return; /* the kernel's outermost scope never closes */
    if (tb__grow((void **)&g->undo, &g->cap_undo, g->num_undo + 1, sizeof(tb__cg_undo)) != TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return;
    }
    g->undo[g->num_undo].pos = pos;
    g->undo[g->num_undo].form = form;
    g->num_undo++;
}

/* `{` with a memo scope: values and variables made inside are forgotten at the `}`. */
static void tb__cg_open(tb__cg *g, const char *head) {
    if (tb__grow((void **)&g->scopes, &g->cap_scopes, g->num_scopes + 1, sizeof(tb__cg_scope)) !=
        TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return;
    }
    g->scopes[g->num_scopes].memo = g->num_memo;
    g->scopes[g->num_scopes].undo = g->num_undo;
    g->num_scopes++;
    tb__cg_line(g, "%s{", head);
    g->indent++;
}

static void tb__cg_close(tb__cg *g, const char *tail) {
    tb__cg_scope sc;
    if (g->num_scopes == 0) return;
    sc = g->scopes[--g->num_scopes];
    while (g->num_memo > sc.memo) {
        tb__cg_memo *m = &g->memo[--g->num_memo];
        g->memo_head[m->key & (TB__CG_BUCKETS - 1)] = m->next;
    }
    while (g->num_undo > sc.undo) {
        tb__cg_undo *u = &g->undo[--g->num_undo];
        if (u->form == 1) {
            g->pos[u->pos].has_flat = 0;
            tb__lf_const(&g->pos[u->pos].flat, 0);
        } else {
            int32_t i;
            g->pos[u->pos].has_multi = 0;
            for (i = 0; i < TB_MAX_RANK; i++)
                tb__lf_const(&g->pos[u->pos].dim[i], 0);
        }
    }
    g->indent--;
    tb__cg_line(g, "}%s", tail);
}

/* Makes sure the position has its flat form (sum of dim * contiguous stride). */
static bool tb__cg_need_flat(tb__cg *g, int32_t id) {
    int64_t strides[TB_MAX_RANK];
    tb__lf flat;
    tb__pos p;
    int32_t i;
    if (g->pos[id].has_flat) return true;
    p = g->pos[id];
    tb__cg_contig(p.rank, p.dims, strides);
    tb__lf_const(&flat, 0);
    for (i = 0; i < p.rank; i++) {
        if (!tb__cg_lf_addmul(g, &flat, &p.dim[i], strides[i])) return false;
    }
    g->pos[id].flat = flat;
    g->pos[id].has_flat = 1;
    tb__cg_undo_push(g, id, 1);
    return g->status == TB_OK;
}

/* Splits a flat form into per-dim affine forms when no term carries across a digit (merged
   or contiguous dims); false when it cannot. */
static bool tb__cg_affine_split(const tb__cg *g, const tb__lf *flat, int32_t rank,
                                const int64_t *dims, tb__lf *out) {
    int64_t strides[TB_MAX_RANK], numel = 1, lo, hi;
    int32_t i, j;
    tb__cg_contig(rank, dims, strides);
    for (i = 0; i < rank; i++)
        numel *= dims[i];
    if (flat->c < 0 || flat->c >= numel) return false;
    for (j = 0; j < rank; j++)
        tb__lf_const(&out[j], dims[j] > 1 ? (flat->c / strides[j]) % dims[j] : 0);
    for (i = 0; i < flat->n; i++) {
        int64_t f = flat->coef[i];
        for (j = 0; j < rank; j++) {
            if (dims[j] > 1 && f % strides[j] == 0) break;
        }
        if (j == rank) return false;
        if (!tb__lf_add_term(&out[j], flat->var[i], f / strides[j])) return false;
    }
    for (j = 0; j < rank; j++) {
        tb__cg_lf_range(g, &out[j], &lo, &hi);
        if (lo < 0 || hi >= dims[j]) return false;
    }
    return true;
}

/* Makes sure the position has its per-dim form: an affine split of the flat form, else
   division and remainder by the contiguous strides. */
static bool tb__cg_need_multi(tb__cg *g, int32_t id) {
    tb__pos p;
    tb__lf dims_lf[TB_MAX_RANK];
    int32_t i;
    if (g->pos[id].has_multi) return true;
    p = g->pos[id];
    if (!tb__cg_affine_split(g, &p.flat, p.rank, p.dims, dims_lf)) {
        int64_t strides[TB_MAX_RANK];
        uint64_t extra = tb__hash_bytes(tb__hash_bytes(0x756e726176656cull, &p.flat, sizeof p.flat),
                                        p.dims, sizeof p.dims);
        int32_t first = tb__cg_memo_find(g, TB__MEMO_UNRAVEL, p.rank, 0, extra), t, leading = 1;
        tb__cg_contig(p.rank, p.dims, strides);
        if (first < 0) {
            t = tb__cg_spill(g, &p.flat);
            if (t < 0) return false;
            first = (int32_t)g->num_vars;
            for (i = 0; i < p.rank; i++) {
                int32_t v = tb__cg_new_var(g, 0, p.dims[i] > 0 ? p.dims[i] - 1 : 0);
                if (v < 0) return false;
                if (p.dims[i] <= 1) {
                    tb__cg_line(g, "const long i%d = 0;", (int)v);
                } else if (leading) {
                    tb__cg_line(g, "const long i%d = i%d / %lldL;", (int)v, (int)t,
                                (long long)strides[i]);
                } else if (strides[i] == 1) {
                    tb__cg_line(g, "const long i%d = i%d %% %lldL;", (int)v, (int)t,
                                (long long)p.dims[i]);
                } else {
                    tb__cg_line(g, "const long i%d = (i%d / %lldL) %% %lldL;", (int)v, (int)t,
                                (long long)strides[i], (long long)p.dims[i]);
                }
                if (p.dims[i] > 1) leading = 0;
            }
            tb__cg_memo_add(g, TB__MEMO_UNRAVEL, p.rank, 0, extra, first);
        }
        for (i = 0; i < p.rank; i++) {
            tb__lf_const(&dims_lf[i], 0);
            if (p.dims[i] > 1) tb__lf_add_term(&dims_lf[i], first + i, 1);
        }
    }
    for (i = 0; i < p.rank; i++)
        g->pos[id].dim[i] = dims_lf[i];
    g->pos[id].has_multi = 1;
    tb__cg_undo_push(g, id, 2);
    return g->status == TB_OK;
}

/* A position over `shape` with the given per-dim forms. */
static int32_t tb__cg_pos_multi(tb__cg *g, const tb_shape *shape, const tb__lf *dims) {
    tb__pos q;
    int32_t i;
    tb__cg_pos_init(&q, shape);
    for (i = 0; i < shape->rank; i++)
        q.dim[i] = dims[i];
    q.has_multi = 1;
    return tb__cg_intern(g, &q);
}

static int32_t tb__cg_pos_flat(tb__cg *g, const tb_shape *shape, const tb__lf *flat) {
    tb__pos q;
    tb__cg_pos_init(&q, shape);
    q.flat = *flat;
    q.has_flat = 1;
    return tb__cg_intern(g, &q);
}

/* ---- code generation: values ---- */

static const tb__ocl_plan *tb__cg_plan(const tb__cg *g) {
    return g->L->plan;
}

static tb__ocl_kernel *tb__cg_kernel(const tb__cg *g) {
    return &g->L->plan->kernels[g->kernel];
}

/* A floating literal of the dtype (a float literal carries the f suffix). */
static void tb__cg_flit(tb_dtype dtype, double v, char *buf, size_t cap) {
    bool f32 = dtype != TB_F64;
    if (v != v) {
        snprintf(buf, cap, "%s", f32 ? "NAN" : "((double)NAN)");
    } else if (v > DBL_MAX || v < -DBL_MAX) {
        snprintf(buf, cap, "%s%s", v < 0 ? "-" : "", f32 ? "INFINITY" : "((double)INFINITY)");
    } else {
        char tmp[40]; /* "%.17g" needs at most 24 bytes; the rest leaves room for ".0" */
        snprintf(tmp, sizeof tmp, f32 ? "%.9g" : "%.17g", f32 ? (double)(float)v : v);
        if (strchr(tmp, '.') == NULL && strchr(tmp, 'e') == NULL) strcat(tmp, ".0");
        snprintf(buf, cap, "%s%s", tmp, f32 ? "f" : "");
    }
}

static int32_t tb__cg_arg(tb__cg *g, int32_t kind, int32_t index) {
    tb__ocl_kernel *k = tb__cg_kernel(g);
    size_t i;
    for (i = 0; i < k->num_args; i++)
        if (k->args[i].kind == kind && k->args[i].index == index) return (int32_t)i;
    if (tb__grow((void **)&k->args, &k->cap_args, k->num_args + 1, sizeof(tb__ocl_arg)) != TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    k->args[k->num_args].kind = kind;
    k->args[k->num_args].index = index;
    if (kind == TB__OCL_ARG_BUF) {
        tb__ocl_slot *s = &g->L->plan->slots[index];
        if (s->last_use < g->kernel) s->last_use = g->kernel;
    }
    return (int32_t)k->num_args++;
}

/* A run-time error site: the code a kernel writes to tb_err[0]. */
static int32_t tb__cg_errsite(tb__cg *g, tb_op op, int32_t dim, int64_t size) {
    tb__ocl_plan *p = g->L->plan;
    tb__ocl_errsite *grown;
    if (tb__cg_arg(g, TB__OCL_ARG_ERR, 0) < 0) return -1;
    grown = (tb__ocl_errsite *)tb__calloc(p->num_errsites + 1, sizeof *grown);
    if (grown == NULL) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    if (p->num_errsites > 0) memcpy(grown, p->errsites, p->num_errsites * sizeof *grown);
    tb__free(p->errsites);
    p->errsites = grown;
    grown[p->num_errsites].op = op;
    grown[p->num_errsites].dim = dim;
    grown[p->num_errsites].size = size;
    return (int32_t)++p->num_errsites;
}

static bool tb__cg_push_frame(tb__cg *g, int32_t node, int32_t pos) {
    if (tb__grow((void **)&g->frames, &g->cap_frames, g->num_frames + 1, sizeof(tb__cg_frame)) !=
        TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return false;
    }
    g->frames[g->num_frames].node = node;
    g->frames[g->num_frames].pos = pos;
    g->frames[g->num_frames].state = 0;
    g->frames[g->num_frames].vbase = 0;
    g->num_frames++;
    return true;
}

static bool tb__cg_push_value(tb__cg *g, int32_t v) {
    if (tb__grow((void **)&g->stack, &g->cap_stack, g->num_stack + 1, sizeof(int32_t)) != TB_OK) {
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return false;
    }
    g->stack[g->num_stack++] = v;
    return true;
}

/* The position of operand k of an elementwise or movement node at position `pos`. */
static int32_t tb__cg_operand_pos(tb__cg *g, int32_t node, int32_t pos, size_t k) {
    const tb_node *n = g->L->info[node].node;
    const tb_node *c = g->L->info[tb__ocl_operand(g->L, node, k)].node;
    const tb_shape *ns = &n->shape, *cs = &c->shape;
    tb__lf dims[TB_MAX_RANK];
    int32_t i, off;
    tb__pos p;
    if (n->op == TB_OP_RAND || n->op == TB_OP_RANDN) {
        tb__lf zero;
        tb__lf_const(&zero, 0);
        return tb__cg_pos_flat(g, cs, &zero);
    }
    if (n->op == TB_OP_RESHAPE) {
        if (!tb__cg_need_flat(g, pos)) return -1;
        return tb__cg_pos_flat(g, cs, &g->pos[pos].flat);
    }
    if (tb__ocl_is_elementwise(n->op) && tb__ocl_same_dims(ns, cs)) return pos;
    if (tb__ocl_numel(cs) <= 1 && n->op != TB_OP_PAD && n->op != TB_OP_CONCAT) {
        tb__lf zero;
        tb__lf_const(&zero, 0);
        return tb__cg_pos_flat(g, cs, &zero);
    }
    if (!tb__cg_need_multi(g, pos)) return -1;
    p = g->pos[pos];
    switch (n->op) {
    case TB_OP_PERMUTE:
        for (i = 0; i < ns->rank; i++)
            dims[n->attrs[i]] = p.dim[i];
        break;
    case TB_OP_SLICE: {
        int32_t d = (int32_t)n->attrs[0];
        for (i = 0; i < cs->rank; i++)
            dims[i] = p.dim[i];
        tb__lf_const(&dims[d], n->attrs[1]);
        if (!tb__cg_lf_addmul(g, &dims[d], &p.dim[d], n->attrs[3])) return -1;
        break;
    }
    case TB_OP_FLIP:
        for (i = 0; i < cs->rank; i++) {
            if (((uint64_t)n->attrs[0] >> i) & 1u) {
                tb__lf_const(&dims[i], cs->dims[i] - 1);
                if (!tb__cg_lf_addmul(g, &dims[i], &p.dim[i], -1)) return -1;
            } else {
                dims[i] = p.dim[i];
            }
        }
        break;
    default: /* EXPAND and broadcasting elementwise operands: aligned at the last axis */
        off = ns->rank - cs->rank;
        for (i = 0; i < cs->rank; i++) {
            if (cs->dims[i] == 1 || i + off < 0) {
                tb__lf_const(&dims[i], 0);
            } else {
                dims[i] = p.dim[i + off];
            }
        }
        break;
    }
    return tb__cg_pos_multi(g, cs, dims);
}

static int32_t tb__cg_eval(tb__cg *g, int32_t node, int32_t pos);

/* Counts an evaluation of `node`. Past the kernel's budget (a DAG that reads its values at
   ever more positions, so that recomputation grows exponentially), every inlined node
   evaluated more than once becomes a root and the lowering starts over. */
static bool tb__cg_count(tb__cg *g, int32_t node) {
    size_t i;
    if (g->evals[node]++ == 0) g->touched[g->num_touched++] = node;
    if (g->num_vals <= TB__CG_MAX_VALUES) return true;
    for (i = 0; i < g->num_touched; i++) {
        tb__ocl_ninfo *in = &g->L->info[g->touched[i]];
        if (g->evals[g->touched[i]] > 1 && !in->root && in->param < 0) {
            in->force_root = true;
            g->L->restart = true;
        }
    }
    if (!g->L->restart) tb__cg_fail(g, tb__error(TB_ERR_UNSUPPORTED, "opencl: a kernel too large"));
    return false;
}

/* Reads element `pos` of a buffer slot. */
static int32_t tb__cg_read_slot(tb__cg *g, int32_t slot, tb_dtype dtype, int32_t pos) {
    char text[TB__LF_TEXT];
    int32_t v;
    if (tb__cg_arg(g, TB__OCL_ARG_BUF, slot) < 0) return -1;
    if (!tb__cg_need_flat(g, pos)) return -1;
    tb__cg_lf_text(&g->pos[pos].flat, text, sizeof text);
    v = tb__cg_new_val(g, dtype);
    if (v < 0) return -1;
    tb__cg_line(g, "const %s v%d = b%d[%s];", tb__ocl_ctype(dtype), (int)v, (int)slot, text);
    return v;
}

static const char *tb__cg_scalar_ctype(const tb__cg *g, tb_dtype dtype) {
    if (dtype == TB_F64 && !g->L->dev->info.supports_f64) return "float";
    return tb__ocl_ctype(dtype);
}

static bool tb__cg_enter(tb__cg *g, int32_t node) {
    if (++g->depth > TB__CG_MAX_DEPTH) {
        /* nested too deep for the code generator's recursion: materialise this node */
        g->L->info[node].force_root = true;
        g->L->restart = true;
        g->depth--;
        return false;
    }
    return true;
}

static int32_t tb__cg_pad(tb__cg *g, int32_t node, int32_t pos) {
    const tb_node *n = g->L->info[node].node;
    int32_t x = tb__ocl_operand(g->L, node, 0), val = tb__ocl_operand(g->L, node, 1);
    const tb_shape *xs = &g->L->info[x].node->shape;
    tb__lf zero, dims[TB_MAX_RANK];
    tb__str cond;
    int32_t vv, v, vx, i, qp;
    tb__pos p;
    tb__lf_const(&zero, 0);
    vv = tb__cg_eval(g, val, tb__cg_pos_flat(g, &g->L->info[val].node->shape, &zero));
    if (vv < 0) return -1;
    v = tb__cg_new_val(g, n->shape.dtype);
    if (v < 0) return -1;
    tb__cg_line(g, "%s v%d = (%s)v%d;", tb__ocl_ctype(n->shape.dtype), (int)v,
                tb__ocl_ctype(n->shape.dtype), (int)vv);
    if (tb__ocl_numel(xs) == 0) return v;
    if (!tb__cg_need_multi(g, pos)) return -1;
    p = g->pos[pos];
    /* the whole head in one builder, checked once: a head that lost its condition to a failed
       allocation would copy x into the padding */
    memset(&cond, 0, sizeof cond);
    for (i = 0; i < xs->rank; i++) {
        int64_t before = n->attrs[2 * i], after = n->attrs[2 * i + 1];
        dims[i] = p.dim[i];
        dims[i].c -= before;
        if (before > 0 || after > 0) {
            char text[TB__LF_TEXT];
            tb__cg_lf_text(&p.dim[i], text, sizeof text);
            tb__str_append(&cond, "%s(%s) >= %lldL && (%s) < %lldL", cond.len > 0 ? " && " : "if (",
                           text, (long long)before, text, (long long)(before + xs->dims[i]));
        }
    }
    if (cond.len > 0) tb__str_append(&cond, ") ");
    if (cond.failed) {
        tb__str_free(&cond);
        tb__cg_fail(g, TB_ERR_OUT_OF_MEMORY);
        return -1;
    }
    tb__cg_open(g, cond.len > 0 ? cond.data : "");
    tb__str_free(&cond);
    qp = tb__cg_pos_multi(g, xs, dims);
    vx = qp >= 0 ? tb__cg_eval(g, x, qp) : -1;
    if (vx >= 0) tb__cg_line(g, "v%d = v%d;", (int)v, (int)vx);
    tb__cg_close(g, "");
    return vx >= 0 ? v : -1;
}

static int32_t tb__cg_concat(tb__cg *g, int32_t node, int32_t pos) {
    const tb_node *n = g->L->info[node].node;
    int32_t dim = (int32_t)n->attrs[0], v, i;
    int64_t start = 0, last_nonempty = -1;
    char text[TB__LF_TEXT];
    tb__pos p;
    v = tb__cg_new_val(g, n->shape.dtype);
    if (v < 0) return -1;
    tb__cg_line(g, "%s v%d = 0;", tb__ocl_ctype(n->shape.dtype), (int)v);
    if (!tb__cg_need_multi(g, pos)) return -1;
    p = g->pos[pos];
    tb__cg_lf_text(&p.dim[dim], text, sizeof text);
    for (i = 0; i < (int32_t)n->num_operands; i++)
        if (g->L->info[tb__ocl_operand(g->L, node, (size_t)i)].node->shape.dims[dim] > 0)
            last_nonempty = i;
    for (i = 0; i < (int32_t)n->num_operands; i++) {
        int32_t x = tb__ocl_operand(g->L, node, (size_t)i), qp, vx;
        const tb_shape *xs = &g->L->info[x].node->shape;
        tb__lf dims[TB_MAX_RANK];
        char head[TB__LF_TEXT + 64];
        int32_t d;
        memset(dims, 0, sizeof dims); /* only rank entries are used; optimisers cannot tell */
        if (xs->dims[dim] == 0) continue;
        if (i == last_nonempty) {
            snprintf(head, sizeof head, "%s", start == 0 ? "" : "else ");
        } else {
            snprintf(head, sizeof head, "%sif ((%s) < %lldL) ", start == 0 ? "" : "else ", text,
                     (long long)(start + xs->dims[dim]));
        }
        tb__cg_open(g, head);
        for (d = 0; d < xs->rank; d++)
            dims[d] = p.dim[d];
        dims[dim].c -= start;
        qp = tb__cg_pos_multi(g, xs, dims);
        vx = qp >= 0 ? tb__cg_eval(g, x, qp) : -1;
        if (vx >= 0) tb__cg_line(g, "v%d = v%d;", (int)v, (int)vx);
        tb__cg_close(g, "");
        if (vx < 0) return -1;
        start += xs->dims[dim];
    }
    return v;
}

/* GATHER and INDEX_SELECT: the index becomes a variable of the operand's position. */
static int32_t tb__cg_gather(tb__cg *g, int32_t node, int32_t pos) {
    const tb_node *n = g->L->info[node].node;
    int32_t x = tb__ocl_operand(g->L, node, 0), ix = tb__ocl_operand(g->L, node, 1);
    const tb_shape *xs = &g->L->info[x].node->shape, *is = &g->L->info[ix].node->shape;
    int32_t dim = (int32_t)n->attrs[0], vi, t, code, qp, d;
    int64_t size = xs->dims[dim];
    tb__lf dims[TB_MAX_RANK];
    tb__pos p;
    if (n->op == TB_OP_GATHER) {
        vi = tb__cg_eval(g, ix, pos);
    } else {
        if (!tb__cg_need_multi(g, pos)) return -1;
        vi = tb__cg_eval(g, ix, tb__cg_pos_multi(g, is, &g->pos[pos].dim[dim]));
    }
    if (vi < 0) return -1;
    t = tb__cg_new_var(g, 0, size > 0 ? size - 1 : 0);
    code = tb__cg_errsite(g, n->op, dim, size);
    if (t < 0 || code < 0) return -1;
    tb__cg_line(g, "long i%d = (long)v%d;", (int)t, (int)vi);
    tb__cg_line(g, "if (i%d < 0 || i%d >= %lldL) { tb_err[0] = %d; tb_err[1] = i%d; i%d = 0; }",
                (int)t, (int)t, (long long)size, (int)code, (int)t, (int)t);
    if (!tb__cg_need_multi(g, pos)) return -1;
    p = g->pos[pos];
    for (d = 0; d < xs->rank; d++) {
        if (d == dim) {
            tb__lf_const(&dims[d], 0);
            tb__lf_add_term(&dims[d], t, 1);
        } else {
            dims[d] = p.dim[d];
        }
    }
    qp = tb__cg_pos_multi(g, xs, dims);
    if (qp < 0) return -1;
    return tb__cg_eval(g, x, qp);
}

static int32_t tb__cg_generator(tb__cg *g, int32_t node, int32_t pos) {
    const tb_node *n = g->L->info[node].node;
    tb_dtype od = n->shape.dtype;
    const char *t = tb__ocl_ctype(od);
    char a[TB__LF_TEXT], b[TB__LF_TEXT];
    int32_t v;
    if (!tb__cg_need_multi(g, pos)) return -1;
    tb__cg_lf_text(&g->pos[pos].dim[0], a, sizeof a);
    v = tb__cg_new_val(g, od);
    if (v < 0) return -1;
    if (n->op == TB_OP_EYE) {
        tb__cg_lf_text(&g->pos[pos].dim[1], b, sizeof b);
        tb__cg_line(g, "const %s v%d = (%s)((%s) == (%s));", t, (int)v, t, a, b);
    } else if (tb_dtype_is_float(od)) {
        char s0[64], s1[64];
        tb__cg_flit(TB_F64, n->fattrs[0], s0, sizeof s0);
        tb__cg_flit(TB_F64, n->fattrs[1], s1, sizeof s1);
        tb__cg_line(g, "const %s v%d = (%s)(%s + (double)(%s) * %s);", t, (int)v, t, s0, a, s1);
    } else {
        double s = n->fattrs[0], st = n->fattrs[1];
        long long s0 = (s != s) ? 0 : (long long)s, s1 = (st != st) ? 0 : (long long)st;
        tb__cg_line(g, "const %s v%d = (%s)((ulong)%lldL + (ulong)(%s) * (ulong)%lldL);", t, (int)v,
                    t, s0, a, s1);
    }
    return v;
}

/* Nodes that are not computed from operand values at the same kind of position: leaves,
   other kernels' outputs and the ops with their own control flow. */
static int32_t tb__cg_special(tb__cg *g, int32_t node, int32_t pos, bool *handled) {
    const tb__ocl_ninfo *in = &g->L->info[node];
    const tb__ocl_kernel *k = tb__cg_kernel(g);
    int32_t v;
    *handled = true;
    if (in->param >= 0) {
        if (in->node->op == TB_OP_SCALAR && tb__cg_plan(g)->scalar_table) {
            tb_dtype dt = in->node->shape.dtype;
            const char *ct = tb__ocl_ctype(dt);
            if (tb__cg_arg(g, TB__OCL_ARG_TABLE, 0) < 0) return -1;
            v = tb__cg_new_val(g, dt);
            if (v < 0) return -1;
            if (dt == TB_F32 || (dt == TB_F64 && !g->L->dev->info.supports_f64)) {
                tb__cg_line(g, "const %s v%d = (%s)as_float((uint)tb_sc[%d]);", ct, (int)v, ct,
                            (int)in->param);
            } else if (dt == TB_F64) {
                tb__cg_line(g, "const double v%d = as_double(tb_sc[%d]);", (int)v, (int)in->param);
            } else {
                tb__cg_line(g, "const %s v%d = (%s)tb_sc[%d];", ct, (int)v, ct, (int)in->param);
            }
            return v;
        }
        if (in->node->op == TB_OP_SCALAR) {
            if (tb__cg_arg(g, TB__OCL_ARG_SCALAR, in->param) < 0) return -1;
            v = tb__cg_new_val(g, in->node->shape.dtype);
            if (v < 0) return -1;
            tb__cg_line(g, "const %s v%d = (%s)s%d;", tb__ocl_ctype(in->node->shape.dtype), (int)v,
                        tb__ocl_ctype(in->node->shape.dtype), (int)in->param);
            return v;
        }
        return tb__cg_read_slot(g, in->slot, in->node->shape.dtype, pos);
    }
    if (node == k->core) {
        tb__cg_fail(g, tb__error(TB_ERR_INTERNAL, "opencl: a kernel's core read at another "
                                                  "position than its output"));
        return -1;
    }
    if (in->root && node != k->root)
        return tb__cg_read_slot(g, in->slot, in->node->shape.dtype, pos);
    if (in->ctx != k->owner && in->ctx != TB__OCL_CTX_ANY) {
        tb__cg_fail(g, tb__error(TB_ERR_INTERNAL,
                                 "opencl: node %d evaluated in kernel %d, "
                                 "planned for kernel %d",
                                 (int)node, (int)g->kernel, (int)in->ctx));
        return -1;
    }
    switch (in->node->op) {
    case TB_OP_PAD:
    case TB_OP_CONCAT:
    case TB_OP_GATHER:
    case TB_OP_INDEX_SELECT:
        if (!tb__cg_enter(g, node)) return -1;
        if (in->node->op == TB_OP_PAD) {
            v = tb__cg_pad(g, node, pos);
        } else if (in->node->op == TB_OP_CONCAT) {
            v = tb__cg_concat(g, node, pos);
        } else {
            v = tb__cg_gather(g, node, pos);
        }
        g->depth--;
        return v;
    case TB_OP_ARANGE:
    case TB_OP_EYE:
        return tb__cg_generator(g, node, pos);
    default:
        *handled = false;
        return -1;
    }
}

/* The type sums of a float dtype accumulate in: double for f32 on CPU devices with fp64 (as the
   reference accumulates, at little cost there), else the dtype itself. Elementwise math
   (exp, log, ...) runs in the dtype itself. */
static const char *tb__cg_acc_type(const tb__cg *g, tb_dtype dtype) {
    if (dtype == TB_F32 && g->fast_f64) return "double";
    return tb__ocl_ctype(dtype);
}

static int32_t tb__cg_emit_custom(tb__cg *g, const tb_node *n, const int32_t *ops, size_t nops) {
    const tb_custom_op_desc *d = tb__ocl_custom(n->op);
    const char *t = tb__ocl_ctype(n->shape.dtype);
    int32_t v = tb__cg_new_val(g, n->shape.dtype);
    size_t i;
    if (v < 0 || d == NULL || d->opencl_expr == NULL) {
        return v < 0 ? -1 : (tb__cg_fail(g, TB_ERR_INTERNAL), -1);
    }
    tb__cg_line(g, "%s v%d;", t, (int)v);
    tb__cg_open(g, "");
    tb__str_append(&g->body, "#define T %s\n", t);
    for (i = 0; i < nops; i++)
        tb__cg_line(g, "const T x%zu = (T)v%d;", i, (int)ops[i]);
    tb__cg_line(g, "v%d = (T)(%s);", (int)v, d->opencl_expr);
    tb__str_append(&g->body, "#undef T\n");
    tb__cg_close(g, "");
    return v;
}

/* One elementwise op (or RAND/RANDN) from its operands' values. */
static int32_t tb__cg_emit_op(tb__cg *g, int32_t node, int32_t pos, const int32_t *ops,
                              size_t nops) {
    const tb_node *n = g->L->info[node].node;
    tb_dtype od = n->shape.dtype, ad = nops > 0 ? g->val_dtype[ops[0]] : od;
    const char *t = tb__ocl_ctype(od), *u = tb__ocl_utype(od);
    const char *m = t;
    bool fl = tb_dtype_is_float(od), afl = tb_dtype_is_float(ad);
    char e[1024], a[16], b[16], c[16];
    int32_t v;
    e[0] = '\0';
    snprintf(a, sizeof a, "v%d", nops > 0 ? (int)ops[0] : 0);
    snprintf(b, sizeof b, "v%d", nops > 1 ? (int)ops[1] : 0);
    snprintf(c, sizeof c, "v%d", nops > 2 ? (int)ops[2] : 0);
    if (tb_op_get_kind(n->op) == TB_KIND_MOVEMENT) return ops[0]; /* the position did it all */
    g->ops += 1;
    if (n->op >= TB_OP_BUILTIN_COUNT) return tb__cg_emit_custom(g, n, ops, nops);
    switch (n->op) {
    case TB_OP_NEG:
        if (fl) {
            snprintf(e, sizeof e, "-%s", a);
        } else if (od == TB_BOOL) {
            snprintf(e, sizeof e, "%s", a);
        } else {
            snprintf(e, sizeof e, "(%s)((%s)0 - (%s)%s)", t, u, u, a);
        }
        break;
    case TB_OP_ABS:
        if (fl) {
            snprintf(e, sizeof e, "fabs(%s)", a);
        } else if (od == TB_U8 || od == TB_BOOL) {
            snprintf(e, sizeof e, "%s", a);
        } else {
            snprintf(e, sizeof e, "(%s)(%s < 0 ? (%s)0 - (%s)%s : (%s)%s)", t, a, u, u, a, u, a);
        }
        break;
    case TB_OP_EXP:
    case TB_OP_LOG:
    case TB_OP_SIN:
    case TB_OP_COS:
    case TB_OP_TANH: {
        const char *f = n->op == TB_OP_EXP   ? "exp"
                        : n->op == TB_OP_LOG ? "log"
                        : n->op == TB_OP_SIN ? "sin"
                        : n->op == TB_OP_COS ? "cos"
                                             : "tanh";
        snprintf(e, sizeof e, "(%s)%s((%s)%s)", t, f, m, a);
        break;
    }
    case TB_OP_SQRT:
        snprintf(e, sizeof e, "sqrt(%s)", a);
        break;
    case TB_OP_RSQRT:
        snprintf(e, sizeof e, "(%s)((%s)1 / sqrt((%s)%s))", t, m, m, a);
        break;
    case TB_OP_SIGMOID:
    case TB_OP_SILU: {
        /* exp of a negative argument only, as the reference */
        char x[64], sg[512];
        snprintf(x, sizeof x, "((%s)%s)", m, a);
        snprintf(sg, sizeof sg,
                 "(%s >= 0 ? (%s)1 / ((%s)1 + exp(-%s)) : exp(%s) / ((%s)1 + exp(%s)))", x, m, m, x,
                 x, m, x);
        if (n->op == TB_OP_SILU) {
            snprintf(e, sizeof e, "(%s)(%s * %s)", t, x, sg);
        } else {
            snprintf(e, sizeof e, "(%s)%s", t, sg);
        }
        break;
    }
    case TB_OP_RELU:
        if (od == TB_U8 || od == TB_BOOL) {
            snprintf(e, sizeof e, "%s", a);
        } else {
            snprintf(e, sizeof e, "(%s < (%s)0 ? (%s)0 : %s)", a, t, t, a);
        }
        break;
    case TB_OP_GELU: {
        char half[32], r2[32];
        tb__cg_flit(od == TB_F32 && !g->fast_f64 ? TB_F32 : TB_F64, 0.5, half, sizeof half);
        tb__cg_flit(od == TB_F32 && !g->fast_f64 ? TB_F32 : TB_F64, 0.70710678118654752440, r2,
                    sizeof r2);
        snprintf(e, sizeof e, "(%s)(%s * (%s)%s * ((%s)1 + erf((%s)%s * %s)))", t, half, m, a, m, m,
                 a, r2);
        break;
    }
    case TB_OP_RECIPROCAL:
        snprintf(e, sizeof e, "(%s)1 / %s", t, a);
        break;
    case TB_OP_FLOOR:
    case TB_OP_CEIL:
    case TB_OP_ROUND:
        if (fl) {
            snprintf(e, sizeof e, "%s(%s)",
                     n->op == TB_OP_FLOOR ? "floor" : (n->op == TB_OP_CEIL ? "ceil" : "rint"), a);
        } else {
            snprintf(e, sizeof e, "%s", a);
        }
        break;
    case TB_OP_SIGN:
        if (od == TB_BOOL) {
            snprintf(e, sizeof e, "%s", a);
        } else {
            snprintf(e, sizeof e, "(%s)((%s > (%s)0) - (%s < (%s)0))", t, a, t, a, t);
        }
        break;
    case TB_OP_LOGICAL_NOT:
        snprintf(e, sizeof e, "(uchar)(%s == 0)", a);
        break;
    case TB_OP_CAST:
        if (od == TB_BOOL) {
            snprintf(e, sizeof e, "(uchar)(%s != 0)", a);
        } else if (afl && !fl) {
            /* truncation toward zero saturating at the int64 range, NaN 0, then wrapping */
            snprintf(e, sizeof e, "(%s)tb_f2i_%s(%s)", t, ad == TB_F64 ? "f64" : "f32", a);
        } else {
            snprintf(e, sizeof e, "(%s)%s", t, a);
        }
        break;
    case TB_OP_ADD:
    case TB_OP_SUB:
    case TB_OP_MUL: {
        const char *op = n->op == TB_OP_ADD ? "+" : (n->op == TB_OP_SUB ? "-" : "*");
        if (fl) {
            snprintf(e, sizeof e, "%s %s %s", a, op, b);
        } else if (od == TB_BOOL) {
            snprintf(e, sizeof e, "(uchar)((%s %s %s) != 0)", a, op, b);
        } else {
            snprintf(e, sizeof e, "(%s)((%s)%s %s (%s)%s)", t, u, a, op, u, b);
        }
        break;
    }
    case TB_OP_DIV:
        snprintf(e, sizeof e, "%s / %s", a, b);
        break;
    case TB_OP_POW:
        if (fl) {
            snprintf(e, sizeof e, "(%s)pow((%s)%s, (%s)%s)", t, m, a, m, b);
        } else {
            int32_t code = tb__cg_errsite(g, TB_OP_POW, 0, 0);
            if (code < 0) return -1;
            tb__cg_line(g,
                        "if (%s < 0) { tb_err[0] = %d; tb_err[1] = (long)%s; tb_err[2] = "
                        "(long)%s; }",
                        b, (int)code, a, b);
            snprintf(e, sizeof e, "(%s)tb_ipow((long)%s, (long)%s)", t, a, b);
        }
        break;
    case TB_OP_MAXIMUM:
    case TB_OP_MINIMUM: {
        const char *cmp = n->op == TB_OP_MAXIMUM ? ">" : "<";
        if (fl) {
            snprintf(e, sizeof e, "((%s %s %s || isnan(%s)) ? %s : %s)", a, cmp, b, a, a, b);
        } else {
            snprintf(e, sizeof e, "(%s %s %s ? %s : %s)", a, cmp, b, a, b);
        }
        break;
    }
    case TB_OP_EQ:
    case TB_OP_NE:
    case TB_OP_LT:
    case TB_OP_LE:
    case TB_OP_GT:
    case TB_OP_GE: {
        const char *cmp = n->op == TB_OP_EQ   ? "=="
                          : n->op == TB_OP_NE ? "!="
                          : n->op == TB_OP_LT ? "<"
                          : n->op == TB_OP_LE ? "<="
                          : n->op == TB_OP_GT ? ">"
                                              : ">=";
        snprintf(e, sizeof e, "(uchar)(%s %s %s)", a, cmp, b);
        break;
    }
    case TB_OP_LOGICAL_AND:
        snprintf(e, sizeof e, "(uchar)(%s != 0 && %s != 0)", a, b);
        break;
    case TB_OP_LOGICAL_OR:
        snprintf(e, sizeof e, "(uchar)(%s != 0 || %s != 0)", a, b);
        break;
    case TB_OP_WHERE:
        snprintf(e, sizeof e, "(%s != 0 ? %s : %s)", a, b, c);
        break;
    case TB_OP_CLAMP: {
        int32_t lo = tb__cg_new_val(g, od);
        if (lo < 0) return -1;
        if (fl) {
            tb__cg_line(g, "const %s v%d = ((%s > %s || isnan(%s)) ? %s : %s);", t, (int)lo, a, b,
                        a, a, b);
            snprintf(e, sizeof e, "((v%d < %s || isnan(v%d)) ? v%d : %s)", (int)lo, c, (int)lo,
                     (int)lo, c);
        } else {
            tb__cg_line(g, "const %s v%d = (%s < %s ? %s : %s);", t, (int)lo, a, b, b, a);
            snprintf(e, sizeof e, "(v%d > %s ? %s : v%d)", (int)lo, c, c, (int)lo);
        }
        break;
    }
    case TB_OP_RAND:
    case TB_OP_RANDN: {
        char flat[TB__LF_TEXT];
        if (!tb__cg_need_flat(g, pos)) return -1;
        tb__cg_lf_text(&g->pos[pos].flat, flat, sizeof flat);
        snprintf(e, sizeof e, "tb_%s_%s((ulong)%s, (ulong)%s, (ulong)(%s))",
                 n->op == TB_OP_RAND ? "rand" : "randn", od == TB_F64 ? "f64" : "f32", a, b, flat);
        break;
    }
    default:
        tb__cg_fail(g, tb__error(TB_ERR_INTERNAL, "opencl: no code for op %s",
                                 tb_op_name(n->op) != NULL ? tb_op_name(n->op) : "?"));
        return -1;
    }
    v = tb__cg_new_val(g, od);
    if (v < 0) return -1;
    tb__cg_line(g, "const %s v%d = %s;", t, (int)v, e);
    return v;
}

/* The value of `node` at `pos`: operands first (an explicit stack, so chains of any length do
   not recurse), each (node, position) emitted once per scope. */
static int32_t tb__cg_eval(tb__cg *g, int32_t node, int32_t pos) {
    size_t fbase = g->num_frames, sbase = g->num_stack;
    int32_t v;
    if (pos < 0 || g->status != TB_OK) return -1;
    if (!tb__cg_push_frame(g, node, pos)) return -1;
    while (g->num_frames > fbase) {
        tb__cg_frame *f = &g->frames[g->num_frames - 1];
        int32_t fnode = f->node, fpos = f->pos;
        const tb_node *n = g->L->info[fnode].node;
        if (g->status != TB_OK || g->L->restart) goto fail;
        if (f->state == 0) {
            v = tb__cg_memo_find(g, TB__MEMO_VALUE, fnode, fpos, 0);
            if (v < 0) {
                bool handled = false;
                v = tb__cg_special(g, fnode, fpos, &handled);
                if (!handled) {
                    f->state = 1;
                    f->vbase = (int32_t)g->num_stack;
                    continue;
                }
                if (v < 0) goto fail;
                tb__cg_memo_add(g, TB__MEMO_VALUE, fnode, fpos, 0, v);
                if (!tb__cg_count(g, fnode)) goto fail;
            }
            g->num_frames--;
            if (!tb__cg_push_value(g, v)) goto fail;
            continue;
        }
        if ((uint32_t)(f->state - 1) < n->num_operands) {
            size_t k = (size_t)(f->state - 1);
            int32_t cp;
            f->state++;
            cp = tb__cg_operand_pos(g, fnode, fpos, k);
            if (cp < 0) goto fail;
            if (!tb__cg_push_frame(g, tb__ocl_operand(g->L, fnode, k), cp)) goto fail;
            continue;
        }
        v = tb__cg_emit_op(g, fnode, fpos, &g->stack[f->vbase], n->num_operands);
        if (v < 0 || !tb__cg_count(g, fnode)) goto fail;
        g->num_stack = (size_t)g->frames[g->num_frames - 1].vbase;
        tb__cg_memo_add(g, TB__MEMO_VALUE, fnode, fpos, 0, v);
        g->num_frames--;
        if (!tb__cg_push_value(g, v)) goto fail;
    }
    v = g->stack[--g->num_stack];
    return v;
fail:
    g->num_frames = fbase;
    g->num_stack = sbase;
    if (g->status == TB_OK && !g->L->restart) tb__cg_fail(g, TB_ERR_INTERNAL);
    return -1;
}

/* ---- code generation: kernels ---- */

static void tb__cg_reset(tb__cg *g, int32_t kernel) {
    tb__str_free(&g->body);
    memset(&g->body, 0, sizeof g->body);
    g->kernel = kernel;
    g->indent = 1;
    g->num_vars = g->num_vals = g->num_pos = g->num_memo = g->num_undo = 0;
    g->num_scopes = g->num_frames = g->num_stack = 0;
    g->depth = 0;
    g->ops = 0;
    while (g->num_touched > 0)
        g->evals[g->touched[--g->num_touched]] = 0;
    memset(g->pos_head, 0xff, sizeof g->pos_head);
    memset(g->memo_head, 0xff, sizeof g->memo_head);
}

static void tb__cg_free(tb__cg *g) {
    tb__str_free(&g->body);
    tb__free(g->vars);
    tb__free(g->val_dtype);
    tb__free(g->pos);
    tb__free(g->memo);
    tb__free(g->undo);
    tb__free(g->scopes);
    tb__free(g->frames);
    tb__free(g->stack);
    tb__free(g->evals);
    tb__free(g->touched);
}

/* Work-group size for a kernel with one group per row of `len` elements, or 1 for one work
   item per row. `inner`: the row is contiguous in memory (lanes of a group read neighbours). */
static int64_t tb__cg_pick_group(const tb__cg *g, int64_t rows, int64_t len, bool inner) {
    const tb_device_info *d = &g->L->dev->info;
    int64_t maxg = d->max_work_group_size < 256 ? (int64_t)d->max_work_group_size : 256, n = 1;
    if (len < 32) return 1;
    if (tb__ocl_codegen_cpu(g->L->dev)) {
        if (rows >= (int64_t)d->compute_units * 4) return 1;
        if (maxg > 64) maxg = 64;
    } else if (!inner && rows >= (int64_t)d->compute_units * 256) {
        return 1; /* neighbouring work items read neighbouring elements already */
    }
    while (n * 2 <= maxg && n * 2 <= len)
        n *= 2;
    return n;
}

static void tb__cg_local_reduce(tb__cg *g, int64_t groups, const char *var, const char *type,
                                const char *combine) {
    tb__cg_line(g, "red[lid] = %s;", var);
    tb__cg_line(g, "barrier(CLK_LOCAL_MEM_FENCE);");
    tb__cg_line(g, "for (int s = %d; s > 0; s >>= 1) {", (int)(groups / 2));
    tb__cg_line(g, "    if (lid < s) {");
    tb__cg_line(g, "        const %s a = red[lid], b = red[lid + s];", type);
    tb__cg_line(g, "        red[lid] = %s;", combine);
    tb__cg_line(g, "    }");
    tb__cg_line(g, "    barrier(CLK_LOCAL_MEM_FENCE);");
    tb__cg_line(g, "}");
    tb__cg_line(g, "%s = red[0];", var);
    tb__cg_line(g, "barrier(CLK_LOCAL_MEM_FENCE);");
}

/* The kernel's row index i<v> (one work item or one group per row). */
static int32_t tb__cg_row_header(tb__cg *g, tb__ocl_kernel *k, int64_t rows, int64_t group) {
    int32_t v = tb__cg_new_var(g, 0, rows > 0 ? rows - 1 : 0);
    if (v < 0) return -1;
    k->work_dim = 1;
    if (group == 1) {
        k->items = (uint64_t)rows;
        tb__cg_line(g, "const long i%d = (long)get_global_id(0);", (int)v);
        tb__cg_line(g, "if (i%d >= %lldL) return;", (int)v, (long long)rows);
    } else {
        k->group_size[0] = (size_t)group;
        k->group_size[1] = k->group_size[2] = 1;
        k->groups[0] = (size_t)rows;
        k->groups[1] = k->groups[2] = 1;
        tb__cg_line(g, "const long i%d = (long)get_group_id(0);", (int)v);
        tb__cg_line(g, "const int lid = (int)get_local_id(0);");
    }
    return v;
}

static int32_t tb__cg_var_pos_flat(tb__cg *g, const tb_shape *shape, int32_t var, int64_t scale,
                                   int32_t var2) {
    tb__lf lf;
    tb__lf_const(&lf, 0);
    tb__lf_add_term(&lf, var, scale);
    if (var2 >= 0) tb__lf_add_term(&lf, var2, 1);
    return tb__cg_pos_flat(g, shape, &lf);
}

static tb_status tb__cg_kernel_elementwise(tb__cg *g, tb__ocl_kernel *k) {
    const tb_node *root = g->L->info[k->root].node;
    int64_t n = tb__ocl_numel(&root->shape);
    int32_t i0, v;
    i0 = tb__cg_row_header(g, k, n, 1);
    if (i0 < 0) return g->status;
    v = tb__cg_eval(g, k->root, tb__cg_var_pos_flat(g, &root->shape, i0, 1, -1));
    if (v < 0) return g->status;
    tb__cg_line(g, "out[i%d] = v%d;", (int)i0, (int)v);
    k->flops = g->ops * (double)n;
    return TB_OK;
}

/* The operand's position of a reduction or norm: the output's dims for the kept axes, the
   loop's index for the reduced ones. */
static int32_t tb__cg_split_pos(tb__cg *g, const tb_shape *xs, uint64_t mask, bool keepdim,
                                int32_t out_pos, const tb__lf *red) {
    tb__lf dims[TB_MAX_RANK];
    const tb__pos *p = &g->pos[out_pos];
    int32_t a, oi = 0, ri = 0;
    for (a = 0; a < xs->rank; a++) {
        if ((mask >> a) & 1u) {
            dims[a] = red[ri++];
            if (keepdim) oi++;
        } else {
            dims[a] = p->dim[oi++];
        }
    }
    return tb__cg_pos_multi(g, xs, dims);
}

/* Independent accumulators per work item of a CPU reduction loop. */
#define TB__CG_LANES 8

/* What a reduction loop reads: the operand x at (output row, reduction index). */
typedef struct tb__cg_red {
    int32_t x, row, out_pos;
    const tb_shape *xs, *red;
    uint64_t mask;
    bool keepdim, suffix;
    int64_t m;
    tb_op op;
    tb_dtype xd;
    const char *acc_t;
} tb__cg_red;

/* The value of x at reduction index i<r> + lane of the current row. */
static int32_t tb__cg_red_value(tb__cg *g, const tb__cg_red *rd, int32_t r, int64_t lane) {
    tb__lf lf;
    int32_t xp;
    tb__lf_const(&lf, lane);
    if (rd->suffix) {
        tb__lf_add_term(&lf, rd->row, rd->m);
        tb__lf_add_term(&lf, r, 1);
        xp = tb__cg_pos_flat(g, rd->xs, &lf);
    } else {
        tb__lf rl[TB_MAX_RANK];
        int32_t rp;
        tb__lf_add_term(&lf, r, 1);
        rp = tb__cg_pos_flat(g, rd->red, &lf);
        if (rp < 0 || !tb__cg_need_multi(g, rp)) return -1;
        memcpy(rl, g->pos[rp].dim, sizeof rl);
        xp = tb__cg_split_pos(g, rd->xs, rd->mask, rd->keepdim, rd->out_pos, rl);
    }
    if (xp < 0) return -1;
    return tb__cg_eval(g, rd->x, xp);
}

/* Accumulator `lane` of a reduction loop: acc, acc1, acc2, ... */
static void tb__cg_acc_name(char *buf, size_t cap, int32_t lane) {
    if (lane == 0)
        snprintf(buf, cap, "acc");
    else
        snprintf(buf, cap, "acc%d", (int)lane);
}

/* Folds value v<vx> (at reduction index i<r>) into the accumulator named `acc`. */
static void tb__cg_red_step(tb__cg *g, const tb__cg_red *rd, int32_t vx, int32_t r,
                            const char *acc) {
    bool is_max = rd->op == TB_OP_MAX || rd->op == TB_OP_ARGMAX;
    const char *cmp = is_max ? ">" : "<";
    switch (rd->op) {
    case TB_OP_SUM:
    case TB_OP_MEAN:
        tb__cg_line(g, "%s += (%s)v%d;", acc, rd->acc_t, (int)vx);
        break;
    case TB_OP_PROD:
        tb__cg_line(g, "%s *= (%s)v%d;", acc, rd->acc_t, (int)vx);
        break;
    case TB_OP_MAX:
    case TB_OP_MIN:
        if (tb_dtype_is_float(rd->xd)) {
            tb__cg_line(g, "if (v%d %s %s || isnan(v%d)) %s = v%d;", (int)vx, cmp, acc, (int)vx,
                        acc, (int)vx);
        } else {
            tb__cg_line(g, "if (v%d %s %s) %s = v%d;", (int)vx, cmp, acc, acc, (int)vx);
        }
        break;
    default:
        if (tb_dtype_is_float(rd->xd)) {
            tb__cg_line(g,
                        "if (bi < 0 || v%d %s best || (isnan(v%d) && !isnan(best))) { best = v%d; "
                        "bi = i%d; }",
                        (int)vx, cmp, (int)vx, (int)vx, (int)r);
        } else {
            tb__cg_line(g, "if (bi < 0 || v%d %s best) { best = v%d; bi = i%d; }", (int)vx, cmp,
                        (int)vx, (int)r);
        }
        break;
    }
}

/* A reduction: one work item or one work-group per output, or, when the reduction is split,
   the partial stage (one per chunk of a row, raw accumulators out) or the final stage
   (combines the chunks of its row, then finishes and runs the epilogue). */
static tb_status tb__cg_kernel_reduce(tb__cg *g, tb__ocl_kernel *k) {
    tb__ocl_lower *L = g->L;
    const tb_node *cn = L->info[k->core].node;
    int32_t x = tb__ocl_operand(L, k->core, 0);
    const tb_shape *xs = &L->info[x].node->shape, *cs = &cn->shape;
    bool is_arg = cn->op == TB_OP_ARGMAX || cn->op == TB_OP_ARGMIN;
    bool is_max = cn->op == TB_OP_MAX || cn->op == TB_OP_ARGMAX;
    bool partial = k->kind == TB__OCL_K_PARTIAL, final = !partial && k->split > 0;
    uint64_t mask = is_arg ? ((uint64_t)1 << cn->attrs[0]) : (uint64_t)cn->attrs[0];
    bool keepdim = cn->attrs[1] != 0, suffix = true, seen = false;
    int64_t n_out = tb__ocl_numel(cs), m = 1, group, rows, chunk = 0;
    tb_dtype xd = xs->dtype, od = cs->dtype;
    const char *xt = tb__ocl_ctype(xd), *t = tb__ocl_ctype(od), *acc_t;
    const char *combine_local = "a + b";
    tb_shape red;
    int32_t a, i0, row, r, out_pos, vx, vf, vr, ci = -1;
    char head[384], from[64], to[96];
    memset(&red, 0, sizeof red);
    red.dtype = xd;
    for (a = 0; a < xs->rank; a++) {
        if ((mask >> a) & 1u) {
            red.dims[red.rank++] = xs->dims[a];
            m *= xs->dims[a];
            seen = true;
        } else if (seen) {
            suffix = false;
        }
    }
    if (cn->op == TB_OP_SUM || cn->op == TB_OP_MEAN || cn->op == TB_OP_PROD) {
        acc_t = tb_dtype_is_float(od) ? tb__cg_acc_type(g, od) : tb__ocl_utype(od);
    } else {
        acc_t = xt;
    }
    if (cn->op == TB_OP_PROD) combine_local = "a * b";
    if (cn->op == TB_OP_MAX)
        combine_local = tb_dtype_is_float(xd) ? "((b > a || isnan(b)) ? b : a)" : "(b > a ? b : a)";
    if (cn->op == TB_OP_MIN)
        combine_local = tb_dtype_is_float(xd) ? "((b < a || isnan(b)) ? b : a)" : "(b < a ? b : a)";
    rows = n_out;
    if (partial) {
        rows = n_out * k->split;
        chunk = (m + k->split - 1) / k->split;
        group = tb__cg_pick_group(g, rows, chunk, suffix);
    } else {
        group = final ? 1 : tb__cg_pick_group(g, n_out, m, suffix);
    }
    i0 = tb__cg_row_header(g, k, rows, group);
    if (i0 < 0) return g->status;
    if (group > 1) {
        if (is_arg) {
            tb__cg_line(g, "__local %s redv[%d];", xt, (int)group);
            tb__cg_line(g, "__local long redi[%d];", (int)group);
        } else {
            tb__cg_line(g, "__local %s red[%d];", acc_t, (int)group);
        }
    }
    row = i0;
    if (partial) {
        row = tb__cg_new_var(g, 0, n_out - 1);
        ci = tb__cg_new_var(g, 0, k->split - 1);
        if (row < 0 || ci < 0) return g->status;
        tb__cg_line(g, "const long i%d = i%d / %d, i%d = i%d %% %d;", (int)row, (int)i0,
                    (int)k->split, (int)ci, (int)i0, (int)k->split);
    }
    out_pos = tb__cg_var_pos_flat(g, cs, row, 1, -1);
    if (out_pos < 0) return g->status;
    if (!final && !suffix && !tb__cg_need_multi(g, out_pos)) return g->status;
    switch (cn->op) {
    case TB_OP_SUM:
    case TB_OP_MEAN:
        tb__cg_line(g, "%s acc = 0;", acc_t);
        break;
    case TB_OP_PROD:
        tb__cg_line(g, "%s acc = 1;", acc_t);
        break;
    case TB_OP_MAX:
    case TB_OP_MIN: {
        const char *init;
        if (tb_dtype_is_float(xd)) {
            init = is_max ? "-INFINITY" : "INFINITY";
        } else if (xd == TB_I32) {
            init = is_max ? "INT_MIN" : "INT_MAX";
        } else if (xd == TB_I64) {
            init = is_max ? "LONG_MIN" : "LONG_MAX";
        } else {
            init = is_max ? "0" : "255";
        }
        tb__cg_line(g, "%s acc = %s;", acc_t, init);
        break;
    }
    default:
        tb__cg_line(g, "%s best = 0;", xt);
        tb__cg_line(g, "long bi = -1;");
        break;
    }
    if (final) {
        /* the partial results of this row, in chunk order */
        if (tb__cg_arg(g, TB__OCL_ARG_BUF, k->partial_slot) < 0) return g->status;
        tb__cg_line(g, "for (int c = 0; c < %d; c++) {", (int)k->split);
        tb__cg_line(g, "    const %s b = (%s)b%d[i%d * %d + c];", acc_t, acc_t,
                    (int)k->partial_slot, (int)i0, (int)k->split);
        tb__cg_line(g, "    const %s a = acc;", acc_t);
        tb__cg_line(g, "    acc = %s;", combine_local);
        tb__cg_line(g, "}");
    } else {
        tb__cg_red rd;
        int32_t lanes = 1;
        rd.x = x;
        rd.xs = xs;
        rd.red = &red;
        rd.mask = mask;
        rd.keepdim = keepdim;
        rd.suffix = suffix;
        rd.row = row;
        rd.m = m;
        rd.out_pos = out_pos;
        rd.op = cn->op;
        rd.xd = xd;
        rd.acc_t = acc_t;
        /* one work item per row or chunk on a CPU: independent accumulators, so the loop is
           not one long chain of dependent adds (or compares) */
        if (group == 1 && !is_arg && tb__ocl_codegen_cpu(L->dev) && m >= 4 * TB__CG_LANES)
            lanes = TB__CG_LANES;
        if (partial) {
            snprintf(from, sizeof from, "i%d * %lldL", (int)ci, (long long)chunk);
            snprintf(to, sizeof to, "min((i%d + 1) * %lldL, %lldL)", (int)ci, (long long)chunk,
                     (long long)m);
        } else {
            snprintf(from, sizeof from, "0L");
            snprintf(to, sizeof to, "%lldL", (long long)m);
        }
        if (lanes == 1) {
            r = tb__cg_new_var(g, 0, m > 0 ? m - 1 : 0);
            if (r < 0) return g->status;
            if (group == 1) {
                snprintf(head, sizeof head, "for (long i%d = %s; i%d < %s; i%d++) ", (int)r, from,
                         (int)r, to, (int)r);
            } else {
                snprintf(head, sizeof head, "for (long i%d = %s + lid; i%d < %s; i%d += %d) ",
                         (int)r, from, (int)r, to, (int)r, (int)group);
            }
            tb__cg_open(g, head);
            vx = tb__cg_red_value(g, &rd, r, 0);
            if (vx < 0) return g->status;
            tb__cg_red_step(g, &rd, vx, r, "acc");
            tb__cg_close(g, "");
        } else {
            int32_t lane, rt;
            tb__cg_open(g, "");
            for (lane = 1; lane < lanes; lane++)
                tb__cg_line(g, "%s acc%d = acc;", acc_t, (int)lane);
            tb__cg_line(g, "const long rs = %s, re = %s, rm = rs + ((re - rs) & ~%dL);", from, to,
                        (int)lanes - 1);
            r = tb__cg_new_var(g, 0, m - lanes);
            if (r < 0) return g->status;
            snprintf(head, sizeof head, "for (long i%d = rs; i%d < rm; i%d += %d) ", (int)r, (int)r,
                     (int)r, (int)lanes);
            tb__cg_open(g, head);
            for (lane = 0; lane < lanes; lane++) {
                char name[16];
                tb__cg_acc_name(name, sizeof name, lane);
                vx = tb__cg_red_value(g, &rd, r, lane);
                if (vx < 0) return g->status;
                tb__cg_red_step(g, &rd, vx, r, name);
            }
            tb__cg_close(g, "");
            rt = tb__cg_new_var(g, 0, m - 1);
            if (rt < 0) return g->status;
            snprintf(head, sizeof head, "for (long i%d = rm; i%d < re; i%d++) ", (int)rt, (int)rt,
                     (int)rt);
            tb__cg_open(g, head);
            vx = tb__cg_red_value(g, &rd, rt, 0);
            if (vx < 0) return g->status;
            tb__cg_red_step(g, &rd, vx, rt, "acc");
            tb__cg_close(g, "");
            /* pairwise: acc_j with acc_(j + half), halving */
            for (lane = lanes / 2; lane >= 1; lane /= 2) {
                int32_t j;
                for (j = 0; j < lane; j++) {
                    char dst[16], src[16];
                    tb__cg_acc_name(dst, sizeof dst, j);
                    tb__cg_acc_name(src, sizeof src, j + lane);
                    tb__cg_line(g, "{ const %s a = %s, b = %s; %s = %s; }", acc_t, dst, src, dst,
                                combine_local);
                }
            }
            tb__cg_close(g, "");
        }
    }
    if (group > 1) {
        if (is_arg) {
            const char *cmp = is_max ? ">" : "<";
            tb__cg_line(g, "redv[lid] = best;");
            tb__cg_line(g, "redi[lid] = bi;");
            tb__cg_line(g, "barrier(CLK_LOCAL_MEM_FENCE);");
            tb__cg_line(g, "for (int s = %d; s > 0; s >>= 1) {", (int)(group / 2));
            tb__cg_line(g, "    if (lid < s) {");
            tb__cg_line(g, "        const %s ov = redv[lid + s], cv = redv[lid];", xt);
            tb__cg_line(g, "        const long oi = redi[lid + s], ci = redi[lid];");
            if (tb_dtype_is_float(xd)) {
                tb__cg_line(g,
                            "        if (oi >= 0 && (ci < 0 || (isnan(ov) ? (!isnan(cv) || oi < "
                            "ci) : (!isnan(cv) && (ov %s cv || (ov == cv && oi < ci)))))) {",
                            cmp);
            } else {
                tb__cg_line(g,
                            "        if (oi >= 0 && (ci < 0 || ov %s cv || (ov == cv && oi < "
                            "ci))) {",
                            cmp);
            }
            tb__cg_line(g, "            redv[lid] = ov;");
            tb__cg_line(g, "            redi[lid] = oi;");
            tb__cg_line(g, "        }");
            tb__cg_line(g, "    }");
            tb__cg_line(g, "    barrier(CLK_LOCAL_MEM_FENCE);");
            tb__cg_line(g, "}");
            tb__cg_line(g, "bi = redi[0];");
        } else {
            tb__cg_local_reduce(g, group, "acc", acc_t, combine_local);
        }
        tb__cg_open(g, "if (lid == 0) ");
    }
    if (partial) {
        tb__cg_line(g, "out[i%d] = (%s)acc;", (int)i0,
                    tb__ocl_ctype(tb__cg_plan(g)->slots[k->out_slot].shape.dtype));
    } else {
        vf = tb__cg_new_val(g, od);
        if (vf < 0) return g->status;
        if (cn->op == TB_OP_MEAN) {
            tb__cg_line(g, "const %s v%d = (%s)(acc / (%s)%lld);", t, (int)vf, t, acc_t,
                        (long long)m);
        } else if (is_arg) {
            tb__cg_line(g, "const %s v%d = (%s)bi;", t, (int)vf, t);
        } else {
            tb__cg_line(g, "const %s v%d = (%s)acc;", t, (int)vf, t);
        }
        tb__cg_memo_add(g, TB__MEMO_VALUE, k->core, out_pos, 0, vf);
        vr = tb__cg_eval(g, k->root, out_pos);
        if (vr < 0) return g->status;
        tb__cg_line(g, "out[i%d] = v%d;", (int)i0, (int)vr);
    }
    if (group > 1) tb__cg_close(g, "");
    k->flops = final ? (double)k->split * (double)n_out : (g->ops + 1) * (double)m * (double)n_out;
    return TB_OK;
}

static tb_status tb__cg_kernel_norm(tb__cg *g, tb__ocl_kernel *k) {
    tb__ocl_lower *L = g->L;
    const tb_node *cn = L->info[k->core].node;
    int32_t x = tb__ocl_operand(L, k->core, 0), w = -1, b = -1;
    const tb_shape *xs = &L->info[x].node->shape, *cs = &cn->shape;
    bool layer = cn->op == TB_OP_LAYER_NORM;
    int32_t axis = layer ? xs->rank - 1 : (int32_t)cn->attrs[0], a, i0, pass;
    int64_t len = 1, rows, group, numel = tb__ocl_numel(xs);
    bool trailing = layer || axis == xs->rank - 1;
    tb_shape rowshape, inner;
    tb_dtype od = cs->dtype;
    const char *t = tb__ocl_ctype(od), *ct = tb__cg_acc_type(g, od);
    int32_t row_pos = -1;
    memset(&rowshape, 0, sizeof rowshape);
    memset(&inner, 0, sizeof inner);
    inner.dtype = rowshape.dtype = xs->dtype;
    if (layer) {
        int32_t nd = (int32_t)cn->attrs[0], next = 1;
        for (a = xs->rank - nd; a < xs->rank; a++) {
            len *= xs->dims[a];
            inner.dims[inner.rank++] = xs->dims[a];
        }
        if (cn->attrs[1] != 0) w = tb__ocl_operand(L, k->core, (size_t)next++);
        if (cn->attrs[2] != 0) b = tb__ocl_operand(L, k->core, (size_t)next++);
    } else {
        len = xs->dims[axis];
        for (a = 0; a < xs->rank; a++)
            if (a != axis) rowshape.dims[rowshape.rank++] = xs->dims[a];
    }
    rows = len > 0 ? numel / len : 0;
    group = tb__cg_pick_group(g, rows, len, trailing);
    i0 = tb__cg_row_header(g, k, rows, group);
    if (i0 < 0) return g->status;
    if (group > 1) tb__cg_line(g, "__local %s red[%d];", ct, (int)group);
    if (!trailing) {
        row_pos = tb__cg_var_pos_flat(g, &rowshape, i0, 1, -1);
        if (row_pos < 0 || !tb__cg_need_multi(g, row_pos)) return g->status;
    }
    if (layer) {
        tb__cg_line(g, "%s sum = 0, sqdev = 0;", ct);
    } else {
        tb__cg_line(g, "%s mx = -INFINITY, sm = 0;", ct);
    }
    for (pass = 0; pass < 3; pass++) {
        char head[128];
        int32_t j = tb__cg_new_var(g, 0, len > 0 ? len - 1 : 0), xp, vx;
        if (j < 0) return g->status;
        if (group == 1) {
            snprintf(head, sizeof head, "for (long i%d = 0; i%d < %lldL; i%d++) ", (int)j, (int)j,
                     (long long)len, (int)j);
        } else {
            snprintf(head, sizeof head, "for (long i%d = lid; i%d < %lldL; i%d += %d) ", (int)j,
                     (int)j, (long long)len, (int)j, (int)group);
        }
        tb__cg_open(g, head);
        if (trailing) {
            xp = tb__cg_var_pos_flat(g, xs, i0, len, j);
        } else {
            tb__lf dims[TB_MAX_RANK];
            int32_t ri = 0;
            for (a = 0; a < xs->rank; a++) {
                if (a == axis) {
                    tb__lf_const(&dims[a], 0);
                    tb__lf_add_term(&dims[a], j, 1);
                } else {
                    dims[a] = g->pos[row_pos].dim[ri++];
                }
            }
            xp = tb__cg_pos_multi(g, xs, dims);
        }
        vx = tb__cg_eval(g, x, xp);
        if (vx < 0) return g->status;
        if (pass == 0) {
            if (layer) {
                tb__cg_line(g, "sum += (%s)v%d;", ct, (int)vx);
            } else {
                tb__cg_line(g, "if ((%s)v%d > mx || isnan(v%d)) mx = (%s)v%d;", ct, (int)vx,
                            (int)vx, ct, (int)vx);
            }
        } else if (pass == 1) {
            if (layer) {
                tb__cg_line(g, "const %s dv = (%s)v%d - mean;", ct, ct, (int)vx);
                tb__cg_line(g, "sqdev += dv * dv;");
            } else {
                tb__cg_line(g, "sm += (%s)exp(v%d - (%s)mx);", ct, (int)vx, t);
            }
        } else {
            int32_t vf = tb__cg_new_val(g, od), vr;
            char flat[TB__LF_TEXT];
            if (vf < 0) return g->status;
            if (layer) {
                tb__cg_line(g, "%s y = ((%s)v%d - mean) * rstd;", ct, ct, (int)vx);
                if (w >= 0) {
                    int32_t vw = tb__cg_eval(
                        g, w, tb__cg_var_pos_flat(g, &L->info[w].node->shape, j, 1, -1));
                    if (vw < 0) return g->status;
                    tb__cg_line(g, "y = y * (%s)v%d;", ct, (int)vw);
                }
                if (b >= 0) {
                    int32_t vb = tb__cg_eval(
                        g, b, tb__cg_var_pos_flat(g, &L->info[b].node->shape, j, 1, -1));
                    if (vb < 0) return g->status;
                    tb__cg_line(g, "y = y + (%s)v%d;", ct, (int)vb);
                }
                tb__cg_line(g, "const %s v%d = (%s)y;", t, (int)vf, t);
            } else if (cn->op == TB_OP_SOFTMAX) {
                tb__cg_line(g, "const %s v%d = (%s)((%s)exp(v%d - (%s)mx) / sm);", t, (int)vf, t,
                            ct, (int)vx, t);
            } else {
                tb__cg_line(g, "const %s v%d = (%s)((%s)v%d - mx - lse);", t, (int)vf, t, ct,
                            (int)vx);
            }
            tb__cg_memo_add(g, TB__MEMO_VALUE, k->core, xp, 0, vf);
            vr = tb__cg_eval(g, k->root, xp);
            if (vr < 0 || !tb__cg_need_flat(g, xp)) return g->status;
            tb__cg_lf_text(&g->pos[xp].flat, flat, sizeof flat);
            tb__cg_line(g, "out[%s] = v%d;", flat, (int)vr);
        }
        tb__cg_close(g, "");
        if (pass == 0) {
            if (group > 1) {
                if (layer) {
                    tb__cg_local_reduce(g, group, "sum", ct, "a + b");
                } else {
                    tb__cg_local_reduce(g, group, "mx", ct, "((b > a || isnan(b)) ? b : a)");
                }
            }
            if (layer) tb__cg_line(g, "const %s mean = sum / (%s)%lld;", ct, ct, (long long)len);
        } else if (pass == 1) {
            char eps[64];
            if (group > 1) tb__cg_local_reduce(g, group, layer ? "sqdev" : "sm", ct, "a + b");
            if (layer) {
                tb__cg_flit(strcmp(ct, "double") == 0 ? TB_F64 : TB_F32, cn->fattrs[0], eps,
                            sizeof eps);
                tb__cg_line(g, "const %s rstd = (%s)1 / sqrt(sqdev / (%s)%lld + %s);", ct, ct, ct,
                            (long long)len, eps);
            } else if (cn->op == TB_OP_LOG_SOFTMAX) {
                tb__cg_line(g, "const %s lse = log(sm);", ct);
            }
        }
    }
    k->flops = (g->ops + 8) * (double)numel;
    return TB_OK;
}

/* Matmul for CPU devices: no local memory (the caches tile), each work item an RM x RN block
   of the output from registers, operands read at clamped rows and columns (always in bounds;
   the epilogue writes only the real ones). */
/* The store of one accumulator acc[ii][jj] of a matmul kernel at row gr, column gc (the caller
   has emitted both and opened the bounds check): the kernel's fused consumers run on the value
   and the result goes to out. Shared by the CPU and GPU matmul kernels. False when code
   generation stopped (g->status says why, if it failed). */
static bool tb__cg_matmul_store(tb__cg *g, tb__ocl_kernel *k, const tb__lf *bdims) {
    const tb_shape *cs = &g->L->info[k->core].node->shape;
    int32_t r = cs->rank, nb = r - 2, d;
    int64_t M = cs->dims[r - 2], N = cs->dims[r - 1];
    tb_dtype od = cs->dtype;
    const char *t = tb__ocl_ctype(od);
    tb__lf dims[TB_MAX_RANK];
    char flat[TB__LF_TEXT];
    int32_t vr = tb__cg_new_var(g, 0, M - 1), vc = tb__cg_new_var(g, 0, N - 1), p, vf, v;
    if (vr < 0 || vc < 0) return false;
    tb__cg_line(g, "const long i%d = gr, i%d = gc;", (int)vr, (int)vc);
    for (d = 0; d < nb; d++)
        dims[d] = bdims[d];
    tb__lf_const(&dims[r - 2], 0);
    tb__lf_add_term(&dims[r - 2], vr, 1);
    tb__lf_const(&dims[r - 1], 0);
    tb__lf_add_term(&dims[r - 1], vc, 1);
    p = tb__cg_pos_multi(g, cs, dims);
    vf = tb__cg_new_val(g, od);
    if (p < 0 || vf < 0) return false;
    tb__cg_line(g, "const %s v%d = (%s)acc[ii][jj];", t, (int)vf, t);
    tb__cg_memo_add(g, TB__MEMO_VALUE, k->core, p, 0, vf);
    v = tb__cg_eval(g, k->root, p);
    if (v < 0 || !tb__cg_need_flat(g, p)) return false;
    tb__cg_lf_text(&g->pos[p].flat, flat, sizeof flat);
    tb__cg_line(g, "out[%s] = v%d;", flat, (int)v);
    return true;
}

/* The batch index variable of a matmul kernel's output (i<var> given) as per-dim forms of
   the batch dims, in bdims. */
static bool tb__cg_batch_dims(tb__cg *g, const tb_shape *cs, int32_t var, tb__lf *bdims) {
    tb_shape bshape;
    int32_t d, bpos;
    if (cs->rank <= 2) return true;
    memset(&bshape, 0, sizeof bshape);
    bshape.dtype = cs->dtype;
    for (d = 0; d + 2 < cs->rank; d++)
        bshape.dims[bshape.rank++] = cs->dims[d];
    bpos = tb__cg_var_pos_flat(g, &bshape, var, 1, -1);
    if (bpos < 0 || !tb__cg_need_multi(g, bpos)) return false;
    memcpy(bdims, g->pos[bpos].dim, sizeof(tb__lf) * TB_MAX_RANK);
    return true;
}

static tb_status tb__cg_kernel_matmul_cpu(tb__cg *g, tb__ocl_kernel *k) {
    tb__ocl_lower *L = g->L;
    const tb_node *cn = L->info[k->core].node;
    int32_t ia = tb__ocl_operand(L, k->core, 0), ib = tb__ocl_operand(L, k->core, 1);
    const tb_shape *as = &L->info[ia].node->shape, *bs = &L->info[ib].node->shape;
    const tb_shape *cs = &cn->shape;
    int32_t r = cs->rank, d, i0, nb = r - 2, kv, i, j;
    int32_t rows[8], cols[8], va[8], vb[8];
    tb__ocl_mm mm = tb__ocl_mm_of(L, k->core);
    int64_t M = mm.m, N = mm.n, K = mm.k, batch = mm.batch;
    int rm = M < 8 ? (int)M : 8, rn = N < 8 ? (int)N : 8, lx = 8, ly = 4;
    tb_dtype od = cs->dtype;
    const char *t = tb__ocl_ctype(od);
    const char *acc_t = tb_dtype_is_float(od) ? t : tb__ocl_utype(od);
    tb__lf bdims[TB_MAX_RANK];
    char head[160];
    if (rm < 1) rm = 1;
    if (rn < 1) rn = 1;
    k->work_dim = 3;
    k->group_size[0] = (size_t)lx;
    k->group_size[1] = (size_t)ly;
    k->group_size[2] = 1;
    k->groups[0] = (size_t)(((N + rn - 1) / rn + lx - 1) / lx);
    k->groups[1] = (size_t)(((M + rm - 1) / rm + ly - 1) / ly);
    k->groups[2] = (size_t)batch;
    tb__cg_line(
        g, "const long col0 = (long)get_global_id(0) * %d, row0 = (long)get_global_id(1) * %d;", rn,
        rm);
    i0 = tb__cg_new_var(g, 0, batch > 0 ? batch - 1 : 0);
    if (i0 < 0) return g->status;
    tb__cg_line(g, "const long i%d = (long)get_global_id(2);", (int)i0);
    if (!tb__cg_batch_dims(g, cs, i0, bdims)) return g->status;
    for (i = 0; i < rm; i++) {
        rows[i] = tb__cg_new_var(g, 0, M - 1);
        if (rows[i] < 0) return g->status;
        tb__cg_line(g, "const long i%d = min(row0 + %d, %lldL);", (int)rows[i], i,
                    (long long)(M - 1));
    }
    for (j = 0; j < rn; j++) {
        cols[j] = tb__cg_new_var(g, 0, N - 1);
        if (cols[j] < 0) return g->status;
        tb__cg_line(g, "const long i%d = min(col0 + %d, %lldL);", (int)cols[j], j,
                    (long long)(N - 1));
    }
    tb__cg_line(g, "%s acc[%d][%d];", acc_t, rm, rn);
    tb__cg_line(g, "for (int ii = 0; ii < %d; ii++)", rm);
    tb__cg_line(g, "    for (int jj = 0; jj < %d; jj++) acc[ii][jj] = 0;", rn);
    kv = tb__cg_new_var(g, 0, K > 0 ? K - 1 : 0);
    if (kv < 0) return g->status;
    snprintf(head, sizeof head, "for (long i%d = 0; i%d < %lldL; i%d++) ", (int)kv, (int)kv,
             (long long)K, (int)kv);
    tb__cg_open(g, head);
    for (j = 0; j < rn; j++) {
        tb__lf dims[TB_MAX_RANK];
        for (d = 0; d < nb; d++)
            dims[d] = bdims[d];
        tb__lf_const(&dims[r - 2], 0);
        tb__lf_add_term(&dims[r - 2], kv, 1);
        tb__lf_const(&dims[r - 1], 0);
        tb__lf_add_term(&dims[r - 1], cols[j], 1);
        vb[j] = tb__cg_eval(g, ib, tb__cg_pos_multi(g, bs, dims));
        if (vb[j] < 0) return g->status;
    }
    for (i = 0; i < rm; i++) {
        tb__lf dims[TB_MAX_RANK];
        for (d = 0; d < nb; d++)
            dims[d] = bdims[d];
        tb__lf_const(&dims[r - 2], 0);
        tb__lf_add_term(&dims[r - 2], rows[i], 1);
        tb__lf_const(&dims[r - 1], 0);
        tb__lf_add_term(&dims[r - 1], kv, 1);
        va[i] = tb__cg_eval(g, ia, tb__cg_pos_multi(g, as, dims));
        if (va[i] < 0) return g->status;
    }
    for (i = 0; i < rm; i++) {
        for (j = 0; j < rn; j++) {
            if (tb_dtype_is_float(od)) {
                tb__cg_line(g, "acc[%d][%d] += v%d * v%d;", i, j, (int)va[i], (int)vb[j]);
            } else {
                tb__cg_line(g, "acc[%d][%d] += (%s)v%d * (%s)v%d;", i, j, acc_t, (int)va[i], acc_t,
                            (int)vb[j]);
            }
        }
    }
    tb__cg_close(g, "");
    snprintf(head, sizeof head, "for (int ii = 0; ii < %d; ii++) for (int jj = 0; jj < %d; jj++) ",
             rm, rn);
    tb__cg_open(g, head);
    tb__cg_line(g, "const long gr = row0 + ii, gc = col0 + jj;");
    snprintf(head, sizeof head, "if (gr < %lldL && gc < %lldL) ", (long long)M, (long long)N);
    tb__cg_open(g, head);
    if (!tb__cg_matmul_store(g, k, bdims)) return g->status;
    tb__cg_close(g, "");
    tb__cg_close(g, "");
    k->flops = 2.0 * (double)M * (double)N * (double)K * (double)batch;
    return TB_OK;
}

/* A pack kernel: one work item per element of the panels. Element (b, panel, k, lane) is the
   operand at batch b, depth k and row (A) or column (B) panel * width + lane, clamped to the
   last one (the matmul never stores what the padding computes). */
static tb_status tb__cg_kernel_pack(tb__cg *g, tb__ocl_kernel *k) {
    tb__ocl_lower *L = g->L;
    bool is_a = k->kind == TB__OCL_K_PACK_A;
    int32_t x = tb__ocl_operand(L, k->core, is_a ? 0 : 1);
    const tb_shape *xs = &L->info[x].node->shape, *cs = &L->info[k->core].node->shape;
    int32_t r = cs->rank, d, i0, ib, ik, il, v;
    int64_t z[6], len, K, blocks, width;
    tb__lf bdims[TB_MAX_RANK], dims[TB_MAX_RANK];
    tb__ocl_pack_sizes(L, k, is_a, z);
    K = z[3];
    blocks = z[4];
    width = z[5];
    len = is_a ? z[1] : z[2];
    /* lanes along dim 0 (neighbouring work items write neighbouring elements), K along dim
       1, batch x panels along dim 2 */
    k->work_dim = 3;
    k->group_size[0] = (size_t)width;
    k->group_size[1] = TB__OCL_PACK_GROUP_K;
    k->group_size[2] = 1;
    k->groups[0] = 1;
    k->groups[1] = (size_t)((K + TB__OCL_PACK_GROUP_K - 1) / TB__OCL_PACK_GROUP_K);
    k->groups[2] = (size_t)(z[0] * blocks);
    i0 = tb__cg_new_var(g, 0, z[0] * blocks - 1);
    ib = tb__cg_new_var(g, 0, z[0] - 1);
    ik = tb__cg_new_var(g, 0, K - 1);
    il = tb__cg_new_var(g, 0, len - 1);
    if (i0 < 0 || ib < 0 || ik < 0 || il < 0) return g->status;
    tb__cg_line(g, "const long lane = (long)get_global_id(0), i%d = (long)get_global_id(1);",
                (int)ik);
    tb__cg_line(g, "if (i%d >= %lldL) return;", (int)ik, (long long)K);
    tb__cg_line(g, "const long i%d = (long)get_global_id(2);", (int)i0);
    tb__cg_line(g, "const long i%d = i%d / %lldL;", (int)ib, (int)i0, (long long)blocks);
    tb__cg_line(g, "const long i%d = min(i%d %% %lldL * %lldL + lane, %lldL);", (int)il, (int)i0,
                (long long)blocks, (long long)width, (long long)(len - 1));
    if (!tb__cg_batch_dims(g, cs, ib, bdims)) return g->status;
    for (d = 0; d + 2 < r; d++)
        dims[d] = bdims[d];
    tb__lf_const(&dims[r - 2], 0);
    tb__lf_add_term(&dims[r - 2], is_a ? il : ik, 1);
    tb__lf_const(&dims[r - 1], 0);
    tb__lf_add_term(&dims[r - 1], is_a ? ik : il, 1);
    v = tb__cg_eval(g, x, tb__cg_pos_multi(g, xs, dims));
    if (v < 0) return g->status;
    tb__cg_line(g, "out[(i%d * %lldL + i%d) * %lldL + lane] = v%d;", (int)i0, (long long)K, (int)ik,
                (long long)width, (int)v);
    k->flops = g->ops * (double)(z[0] * blocks * K * width);
    return TB_OK;
}

/* Matmul from the panels of the two pack kernels before it (CPU devices): each work item a
   TB__OCL_MM_ROWS x width block of the output, one vector accumulator per row; the inner loop
   reads one vector of B and TB__OCL_MM_ROWS consecutive values of A per step of K. */
static tb_status tb__cg_kernel_matmul_packed(tb__cg *g, tb__ocl_kernel *k) {
    tb__ocl_lower *L = g->L;
    const tb_shape *cs = &L->info[k->core].node->shape;
    int64_t za[6], zb[6], K;
    int rm = TB__OCL_MM_ROWS, vw, i;
    const char *t = tb__ocl_ctype(cs->dtype);
    char tv[16], head[160];
    int32_t ib;
    tb__lf bdims[TB_MAX_RANK];
    tb__ocl_pack_sizes(L, k, true, za);
    tb__ocl_pack_sizes(L, k, false, zb);
    K = za[3];
    vw = (int)zb[5];
    snprintf(tv, sizeof tv, "%s%d", t, vw);
    if (tb__cg_arg(g, TB__OCL_ARG_BUF, k->pack_slot[0]) < 0 ||
        tb__cg_arg(g, TB__OCL_ARG_BUF, k->pack_slot[1]) < 0)
        return g->status;
    k->work_dim = 3;
    k->group_size[0] = k->group_size[1] = k->group_size[2] = 1;
    k->groups[0] = (size_t)zb[4];
    k->groups[1] = (size_t)za[4];
    k->groups[2] = (size_t)za[0];
    ib = tb__cg_new_var(g, 0, za[0] - 1);
    if (ib < 0) return g->status;
    tb__cg_line(g, "const long pc = (long)get_global_id(0), pr = (long)get_global_id(1);");
    tb__cg_line(g, "const long i%d = (long)get_global_id(2);", (int)ib);
    tb__cg_line(g, "const long col0 = pc * %d, row0 = pr * %d;", vw, rm);
    tb__cg_line(g, "__global const %s *ap = b%d + (i%d * %lldL + pr) * %lldL;", t,
                (int)k->pack_slot[0], (int)ib, (long long)za[4], (long long)(K * rm));
    tb__cg_line(g, "__global const %s *bp = b%d + (i%d * %lldL + pc) * %lldL;", t,
                (int)k->pack_slot[1], (int)ib, (long long)zb[4], (long long)(K * vw));
    for (i = 0; i < rm; i++)
        tb__cg_line(g, "%s accv%d = 0;", tv, i);
    snprintf(head, sizeof head, "for (long kk = 0; kk < %lldL; kk++) ", (long long)K);
    tb__cg_open(g, head);
    tb__cg_line(g, "const %s bv = vload%d(kk, bp);", tv, vw);
    tb__cg_line(g, "__global const %s *ak = ap + kk * %d;", t, rm);
    for (i = 0; i < rm; i++)
        tb__cg_line(g, "accv%d += (%s)(ak[%d]) * bv;", i, tv, i);
    tb__cg_close(g, "");
    tb__cg_line(g, "%s acc[%d][%d];", t, rm, vw);
    for (i = 0; i < rm; i++)
        tb__cg_line(g, "vstore%d(accv%d, 0, acc[%d]);", vw, i, i);
    if (!tb__cg_batch_dims(g, cs, ib, bdims)) return g->status;
    snprintf(head, sizeof head, "for (int ii = 0; ii < %d; ii++) for (int jj = 0; jj < %d; jj++) ",
             rm, vw);
    tb__cg_open(g, head);
    tb__cg_line(g, "const long gr = row0 + ii, gc = col0 + jj;");
    snprintf(head, sizeof head, "if (gr < %lldL && gc < %lldL) ", (long long)za[1],
             (long long)za[2]);
    tb__cg_open(g, head);
    if (!tb__cg_matmul_store(g, k, bdims)) return g->status;
    tb__cg_close(g, "");
    tb__cg_close(g, "");
    k->flops = 2.0 * (double)za[1] * (double)za[2] * (double)K * (double)za[0];
    return TB_OK;
}

/* Matmul for GPUs: local-memory tiles. */
static tb_status tb__cg_kernel_matmul_gpu(tb__cg *g, tb__ocl_kernel *k) {
    tb__ocl_lower *L = g->L;
    const tb_node *cn = L->info[k->core].node;
    int32_t ia = tb__ocl_operand(L, k->core, 0), ib = tb__ocl_operand(L, k->core, 1);
    const tb_shape *as = &L->info[ia].node->shape, *bs = &L->info[ib].node->shape;
    const tb_shape *cs = &cn->shape;
    int32_t r = cs->rank, d, i0, nb = r - 2;
    tb__ocl_mm mm = tb__ocl_mm_of(L, k->core);
    int64_t M = mm.m, N = mm.n, K = mm.k, batch = mm.batch;
    int wx = 16, wy = 16, rm = 4, rn = 4, tk = 16, tm, tn;
    tb_dtype od = cs->dtype;
    const char *t = tb__ocl_ctype(od);
    const char *acc_t = tb_dtype_is_float(od) ? t : tb__ocl_utype(od);
    tb__lf bdims[TB_MAX_RANK];
    if (g->L->dev->info.max_work_group_size < 256) wx = wy = 8;
    if (M * N < 64 * 64 || M < 32 || N < 32) rm = rn = 1;
    tm = wy * rm;
    tn = wx * rn;
    k->work_dim = 3;
    k->group_size[0] = (size_t)wx;
    k->group_size[1] = (size_t)wy;
    k->group_size[2] = 1;
    k->groups[0] = (size_t)((N + tn - 1) / tn);
    k->groups[1] = (size_t)((M + tm - 1) / tm);
    k->groups[2] = (size_t)batch;
    tb__cg_line(g, "__local %s As[%d][%d];", t, tk, tm);
    tb__cg_line(g, "__local %s Bs[%d][%d];", t, tk, tn);
    tb__cg_line(g, "const int lx = (int)get_local_id(0), ly = (int)get_local_id(1);");
    tb__cg_line(g,
                "const long row0 = (long)get_group_id(1) * %d, col0 = (long)get_group_id(0) * %d;",
                tm, tn);
    i0 = tb__cg_new_var(g, 0, batch > 0 ? batch - 1 : 0);
    if (i0 < 0) return g->status;
    tb__cg_line(g, "const long i%d = (long)get_group_id(2);", (int)i0);
    if (!tb__cg_batch_dims(g, cs, i0, bdims)) return g->status;
    tb__cg_line(g, "%s acc[%d][%d];", acc_t, rm, rn);
    tb__cg_line(g, "for (int ii = 0; ii < %d; ii++)", rm);
    tb__cg_line(g, "    for (int jj = 0; jj < %d; jj++) acc[ii][jj] = 0;", rn);
    {
        char head[160];
        int side;
        snprintf(head, sizeof head, "for (long kt = 0; kt < %lldL; kt += %d) ", (long long)K, tk);
        tb__cg_open(g, head);
        for (side = 0; side < 2; side++) {
            const tb_shape *os = side == 0 ? as : bs;
            int32_t operand = side == 0 ? ia : ib, vr, vc, p, v;
            tb__lf dims[TB_MAX_RANK];
            int tile_rows = side == 0 ? tm : tk, tile_cols = side == 0 ? tk : tn;
            snprintf(head, sizeof head, "for (int l = ly * %d + lx; l < %d; l += %d) ", wx,
                     tile_rows * tile_cols, wx * wy);
            tb__cg_open(g, head);
            tb__cg_line(g, "const int lr = l / %d, lc = l %% %d;", tile_cols, tile_cols);
            if (side == 0) {
                tb__cg_line(g, "const long gr = row0 + lr, gc = kt + lc;");
            } else {
                tb__cg_line(g, "const long gr = kt + lr, gc = col0 + lc;");
            }
            tb__cg_line(g, "%s e = 0;", t);
            snprintf(head, sizeof head, "if (gr < %lldL && gc < %lldL) ",
                     (long long)(side == 0 ? M : K), (long long)(side == 0 ? K : N));
            tb__cg_open(g, head);
            vr = tb__cg_new_var(g, 0, (side == 0 ? M : K) - 1);
            vc = tb__cg_new_var(g, 0, (side == 0 ? K : N) - 1);
            if (vr < 0 || vc < 0) return g->status;
            tb__cg_line(g, "const long i%d = gr, i%d = gc;", (int)vr, (int)vc);
            for (d = 0; d < nb; d++)
                dims[d] = bdims[d];
            tb__lf_const(&dims[r - 2], 0);
            tb__lf_add_term(&dims[r - 2], vr, 1);
            tb__lf_const(&dims[r - 1], 0);
            tb__lf_add_term(&dims[r - 1], vc, 1);
            p = tb__cg_pos_multi(g, os, dims);
            v = tb__cg_eval(g, operand, p);
            if (v < 0) return g->status;
            tb__cg_line(g, "e = v%d;", (int)v);
            tb__cg_close(g, "");
            if (side == 0) {
                tb__cg_line(g, "As[lc][lr] = e;");
            } else {
                tb__cg_line(g, "Bs[lr][lc] = e;");
            }
            tb__cg_close(g, "");
        }
        tb__cg_line(g, "barrier(CLK_LOCAL_MEM_FENCE);");
        tb__cg_line(g, "for (int kk = 0; kk < %d; kk++) {", tk);
        tb__cg_line(g, "    %s ra[%d], rb[%d];", t, rm, rn);
        tb__cg_line(g, "    for (int ii = 0; ii < %d; ii++) ra[ii] = As[kk][ly + ii * %d];", rm,
                    wy);
        tb__cg_line(g, "    for (int jj = 0; jj < %d; jj++) rb[jj] = Bs[kk][lx + jj * %d];", rn,
                    wx);
        tb__cg_line(g, "    for (int ii = 0; ii < %d; ii++)", rm);
        if (tb_dtype_is_float(od)) {
            tb__cg_line(
                g, "        for (int jj = 0; jj < %d; jj++) acc[ii][jj] += ra[ii] * rb[jj];", rn);
        } else {
            tb__cg_line(g,
                        "        for (int jj = 0; jj < %d; jj++) acc[ii][jj] += (%s)ra[ii] * "
                        "(%s)rb[jj];",
                        rn, acc_t, acc_t);
        }
        tb__cg_line(g, "}");
        tb__cg_line(g, "barrier(CLK_LOCAL_MEM_FENCE);");
        tb__cg_close(g, "");
        snprintf(head, sizeof head,
                 "for (int ii = 0; ii < %d; ii++) for (int jj = 0; jj < %d; jj++) ", rm, rn);
        tb__cg_open(g, head);
        tb__cg_line(g, "const long gr = row0 + ly + ii * %d, gc = col0 + lx + jj * %d;", wy, wx);
        snprintf(head, sizeof head, "if (gr < %lldL && gc < %lldL) ", (long long)M, (long long)N);
        tb__cg_open(g, head);
        if (!tb__cg_matmul_store(g, k, bdims)) return g->status;
        tb__cg_close(g, "");
        tb__cg_close(g, "");
    }
    k->flops = 2.0 * (double)M * (double)N * (double)K * (double)batch;
    return TB_OK;
}

static tb_status tb__cg_kernel_matmul(tb__cg *g, tb__ocl_kernel *k) {
    if (k->packed) return tb__cg_kernel_matmul_packed(g, k);
    if (tb__ocl_codegen_cpu(g->L->dev)) return tb__cg_kernel_matmul_cpu(g, k);
    return tb__cg_kernel_matmul_gpu(g, k);
}

/* A kernel with no work item (its output has no element): not launched, not emitted. */
static bool tb__ocl_kernel_empty(const tb__ocl_kernel *k) {
    if (k->group_size[0] > 0) return k->groups[0] == 0 || k->groups[1] == 0 || k->groups[2] == 0;
    return k->items == 0;
}

/* Appends the kernel's signature and body to the program. */
static void tb__cg_emit_kernel(tb__cg *g, tb__ocl_kernel *k, tb__str *src) {
    const tb__ocl_plan *p = tb__cg_plan(g);
    const tb_shape *os = &p->slots[k->out_slot].shape;
    size_t i;
    tb__str_append(src, "__kernel ");
    if (k->group_size[0] > 0) {
        tb__str_append(src, "__attribute__((reqd_work_group_size(%zu, %zu, %zu))) ",
                       k->group_size[0], k->group_size[1] > 0 ? k->group_size[1] : 1,
                       k->group_size[2] > 0 ? k->group_size[2] : 1);
    }
    tb__str_append(src, "void %s(__global %s *restrict out", k->name, tb__ocl_ctype(os->dtype));
    for (i = 0; i < k->num_args; i++) {
        const tb__ocl_arg *a = &k->args[i];
        if (a->kind == TB__OCL_ARG_BUF) {
            tb__str_append(src, ",\n    __global const %s *restrict b%d",
                           tb__ocl_ctype(p->slots[a->index].shape.dtype), (int)a->index);
        } else if (a->kind == TB__OCL_ARG_SCALAR) {
            tb__str_append(src, ",\n    const %s s%d",
                           tb__cg_scalar_ctype(g, p->param_dtype[a->index]), (int)a->index);
        } else if (a->kind == TB__OCL_ARG_TABLE) {
            tb__str_append(src, ",\n    __global const ulong *restrict tb_sc");
        } else {
            tb__str_append(src, ",\n    __global long *restrict tb_err");
        }
    }
    tb__str_append(src, ") {\n%s}\n\n", g->body.data != NULL ? g->body.data : "");
}

static void tb__ocl_kernel_name(tb__ocl_plan *p, size_t index, const tb__ocl_lower *L) {
    tb__ocl_kernel *k = &p->kernels[index];
    const tb_node *root = L->info[k->root].node;
    char base[48];
    size_t i;
    int dup = 0;
    if (k->kind == TB__OCL_K_MATMUL) {
        tb__ocl_mm mm = tb__ocl_mm_of(L, k->core);
        snprintf(base, sizeof base, "MM_%lld_%lld_%lld", (long long)mm.m, (long long)mm.n,
                 (long long)mm.k);
        if (mm.batch != 1) {
            size_t n = strlen(base);
            snprintf(base + n, sizeof base - n, "_b%lld", (long long)mm.batch);
        }
    } else if (k->kind == TB__OCL_K_PACK_A || k->kind == TB__OCL_K_PACK_B) {
        /* panels of the matmul's operand: count x depth x width */
        int64_t z[6];
        tb__ocl_pack_sizes(L, k, k->kind == TB__OCL_K_PACK_A, z);
        snprintf(base, sizeof base, "P%s_%lld_%lld_%lld", k->kind == TB__OCL_K_PACK_A ? "A" : "B",
                 (long long)(z[0] * z[4]), (long long)z[3], (long long)z[5]);
    } else if (k->kind == TB__OCL_K_REDUCE || k->kind == TB__OCL_K_PARTIAL) {
        int64_t n_out, m;
        tb__ocl_reduce_sizes(L, k->core, &n_out, &m);
        if (k->kind == TB__OCL_K_PARTIAL) {
            /* chunks of rows: n_out * split outputs of (at most) m / split elements */
            snprintf(base, sizeof base, "R_%lld_%lld", (long long)(n_out * k->split),
                     (long long)((m + k->split - 1) / k->split));
        } else if (k->split > 0) {
            snprintf(base, sizeof base, "R_%lld_%lld", (long long)n_out, (long long)k->split);
        } else {
            snprintf(base, sizeof base, "R_%lld_%lld", (long long)n_out, (long long)m);
        }
    } else if (k->kind == TB__OCL_K_NORM) {
        const tb_node *c = L->info[k->core].node;
        const tb_shape *xs = &L->info[tb__ocl_operand(L, k->core, 0)].node->shape;
        int64_t len = 1, numel = tb__ocl_numel(xs);
        int32_t a;
        if (c->op == TB_OP_LAYER_NORM) {
            for (a = xs->rank - (int32_t)c->attrs[0]; a < xs->rank; a++)
                len *= xs->dims[a];
        } else {
            len = xs->dims[c->attrs[0]];
        }
        snprintf(base, sizeof base, "S_%lld_%lld", (long long)(len > 0 ? numel / len : 0),
                 (long long)len);
    } else {
        snprintf(base, sizeof base, "E_%lld", (long long)tb__ocl_numel(&root->shape));
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
static double tb__ocl_kernel_bytes(const tb__ocl_plan *p, const tb__ocl_kernel *k) {
    size_t i, n = 0;
    double bytes = 0;
    if (tb_shape_nbytes(&p->slots[k->out_slot].shape, &n) == TB_OK) bytes += (double)n;
    for (i = 0; i < k->num_args; i++) {
        if (k->args[i].kind != TB__OCL_ARG_BUF) continue;
        if (tb_shape_nbytes(&p->slots[k->args[i].index].shape, &n) == TB_OK) bytes += (double)n;
    }
    return bytes;
}

/* The kernel of every node, for get_node_kernel. Parameters, views read through by several
   kernels and nodes of kernels with nothing to compute belong to none. */
static tb_status tb__ocl_record_node_kernels(const tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    size_t i;
    p->node_kernel = (int32_t *)tb__calloc(L->n + 1, sizeof(int32_t));
    if (p->node_kernel == NULL) return TB_ERR_OUT_OF_MEMORY;
    p->num_nodes = L->n;
    for (i = 0; i < L->n; i++) {
        int32_t k = L->info[i].ctx;
        if (L->info[i].param >= 0 || k < 0 || (size_t)k >= p->num_kernels ||
            p->kernels[k].name[0] == '\0')
            k = -1;
        p->node_kernel[i] = k;
    }
    return TB_OK;
}

/* Partitions, then generates every kernel; a kernel that asks for a node to be materialised
   makes the whole lowering start over with that node as a root. */
static tb_status tb__ocl_lower_graph(tb__ocl_lower *L) {
    tb__ocl_plan *p = L->plan;
    tb__cg *g;
    tb__str src;
    size_t i, attempt;
    tb_status st = TB_OK;
    g = (tb__cg *)tb__calloc(1, sizeof *g);
    if (g == NULL) return TB_ERR_OUT_OF_MEMORY;
    g->L = L;
    g->fast_f64 = tb__ocl_fast_f64(L->dev);
    g->evals = (int32_t *)tb__calloc(L->n + 1, sizeof(int32_t));
    g->touched = (int32_t *)tb__calloc(L->n + 1, sizeof(int32_t));
    if (g->evals == NULL || g->touched == NULL) {
        tb__cg_free(g);
        tb__free(g);
        return TB_ERR_OUT_OF_MEMORY;
    }
    memset(&src, 0, sizeof src);
    for (attempt = 0; attempt < 64; attempt++) {
        L->restart = false;
        tb__free(p->errsites);
        p->errsites = NULL;
        p->num_errsites = 0;
        tb__str_free(&src);
        memset(&src, 0, sizeof src);
        st = tb__ocl_partition(L);
        if (st == TB_OK) st = tb__ocl_assign_slots(L);
        if (st != TB_OK) break;
        for (i = 0; i < tb__cl_opencl_kernels_count; i++)
            tb__str_append(&src, "%s", tb__cl_opencl_kernels[i]);
        tb__str_append(&src, "\n");
        for (i = 0; i < p->num_kernels && st == TB_OK && !L->restart; i++) {
            tb__ocl_kernel *k = &p->kernels[i];
            tb__cg_reset(g, (int32_t)i);
            g->status = TB_OK;
            tb__ocl_kernel_name(p, i, L);
            switch (k->kind) {
            case TB__OCL_K_REDUCE:
            case TB__OCL_K_PARTIAL:
                st = tb__cg_kernel_reduce(g, k);
                break;
            case TB__OCL_K_MATMUL:
                st = tb__cg_kernel_matmul(g, k);
                break;
            case TB__OCL_K_PACK_A:
            case TB__OCL_K_PACK_B:
                st = tb__cg_kernel_pack(g, k);
                break;
            case TB__OCL_K_NORM:
                st = tb__cg_kernel_norm(g, k);
                break;
            default:
                st = tb__cg_kernel_elementwise(g, k);
                break;
            }
            if (st == TB_OK) st = g->status;
            if (L->restart) {
                st = TB_OK;
                break;
            }
            if (st == TB_OK && g->body.failed) st = TB_ERR_OUT_OF_MEMORY;
            if (st != TB_OK) break;
            k->bytes = tb__ocl_kernel_bytes(p, k);
            {
                /* every argument as 8 bytes: pointers and the widest scalars */
                size_t arg_bytes = 8 * (k->num_args + 1);
                if (arg_bytes > L->dev->max_parameter_size) {
                    st = tb__error(TB_ERR_UNSUPPORTED,
                                   "opencl:%d: kernel %s reads %zu arrays and scalars, more than "
                                   "the %zu bytes of arguments the device takes",
                                   (int)L->dev->ordinal, k->name, k->num_args,
                                   L->dev->max_parameter_size);
                    break;
                }
            }
            if (!tb__ocl_kernel_empty(k)) {
                tb__cg_emit_kernel(g, k, &src);
            } else {
                k->name[0] = '\0'; /* nothing to compute: the output is empty */
            }
        }
        if (st != TB_OK || !L->restart) break;
    }
    if (st == TB_OK && L->restart) {
        st = tb__error(TB_ERR_INTERNAL, "opencl: the lowering did not settle");
    }
    if (st == TB_OK) st = tb__ocl_record_node_kernels(L);
    if (st == TB_OK) {
        if (src.failed) {
            st = TB_ERR_OUT_OF_MEMORY;
        } else {
            p->source_len = src.len;
            p->source = tb__str_take(&src);
            if (p->source == NULL) st = TB_ERR_OUT_OF_MEMORY;
        }
    }
    tb__str_free(&src);
    tb__cg_free(g);
    tb__free(g);
    return st;
}

static void tb__ocl_lower_free(tb__ocl_lower *L) {
    tb__free(L->info);
    tb__free(L->operands);
    tb__free(L->users);
    tb__free((void *)L->map_keys);
    tb__free(L->map_vals);
}

/* ---- programs: in-memory cache, on-disk binary cache, build ---- */

/* An entry of the disk cache, <folder>/<key hash as 32 hex digits>.clbin:
     0  "TBOCLBIN"         8 .. 11  format version   12 .. 15  header size
    16  key hash (2 x 8)  32  key size K           40  binary size N
    48  XXH64 of the key and the binary (finds torn and damaged files)    56  zero
    64  the key (K bytes): tb__ocl_program_key_bytes, the source included
    64 + K  the program binary (N bytes)
   Numbers are little-endian. A reader compares the whole key, not only its hash: an entry for
   another source, device, driver, option set or library version is not used. */
#define TB__OCL_BIN_MAGIC    "TBOCLBIN"
#define TB__OCL_BIN_VERSION  2u
#define TB__OCL_BIN_HEADER   64u
#define TB__OCL_BIN_MAX      ((uint64_t)1 << 30) /* no binary of ours is bigger */
#define TB__OCL_BIN_SEED     0x636c62696e617279ull
#define TB__OCL_MAX_PROGRAMS 256
#define TB__OCL_TMP_TRIES    16

/* The disk cache opens its files without following links (O_NOFOLLOW, POSIX 2008). glibc
   hides the name under a strict -std when the feature macros come after its first header (our
   own public part includes <stdint.h>), but always defines the value under another name.
   Without it the cache is off. */
#if defined(O_NOFOLLOW)
#define TB__OCL_O_NOFOLLOW O_NOFOLLOW
#elif defined(__O_NOFOLLOW)
#define TB__OCL_O_NOFOLLOW __O_NOFOLLOW
#endif
#if defined(O_CLOEXEC)
#define TB__OCL_O_CLOEXEC O_CLOEXEC
#elif defined(__O_CLOEXEC)
#define TB__OCL_O_CLOEXEC __O_CLOEXEC
#else
#define TB__OCL_O_CLOEXEC 0
#endif
#if !defined(_WIN32) && defined(TB__OCL_O_NOFOLLOW) && defined(O_NONBLOCK)
#define TB__OCL_DISK_CACHE 1
#else
#define TB__OCL_DISK_CACHE 0
#endif

/* The bits of a program key that count: tests keep fewer to force key collisions. */
static uint64_t tb__ocl_program_key_mask = ~(uint64_t)0;

/* Names temporary files of the disk cache apart; guarded by tb__ocl_mutex. */
static TB__UNUSED unsigned tb__ocl_disk_counter = 0;

static uint64_t tb__ocl_hash_text(uint64_t h, const char *s, size_t n) {
    h = tb__hash_u64(h, (uint64_t)n);
    return tb__hash_bytes(h, s, n);
}

/* The parts of what a program binary depends on besides its source: the options, the device
   and its driver, the platform and this library's version. */
static void tb__ocl_program_parts(const tb__ocl_device *dev, const char *parts[7]) {
    parts[0] = dev->build_options;
    parts[1] = dev->info.name;
    parts[2] = dev->info.driver_version;
    parts[3] = dev->device_version;
    parts[4] = dev->platform_name;
    parts[5] = dev->platform_version;
    parts[6] = TB_VERSION_STRING;
}

/* A 128-bit hash of what a program binary depends on: the in-memory cache's key (a hit is
   confirmed by the source) and the name of the disk cache's entry. */
static void tb__ocl_program_key(const tb__ocl_device *dev, const char *src, size_t len,
                                uint64_t key[2]) {
    const char *parts[7];
    uint64_t seeds[2] = {0x746270726f677231ull, 0x746270726f677232ull};
    int i, s;
    tb__ocl_program_parts(dev, parts);
    for (s = 0; s < 2; s++) {
        uint64_t h = tb__ocl_hash_text(seeds[s], src, len);
        for (i = 0; i < 7; i++)
            h = tb__ocl_hash_text(h, parts[i], strlen(parts[i]));
        key[s] = h & tb__ocl_program_key_mask;
    }
}

static void tb__ocl_put64(unsigned char *p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t tb__ocl_get64(const unsigned char *p) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

#if TB__OCL_DISK_CACHE

/* The full key a disk cache entry stores: each part of tb__ocl_program_parts, then the
   source, each as its length (8 bytes) and its bytes. NULL when out of memory. */
static unsigned char *tb__ocl_program_key_bytes(const tb__ocl_device *dev, const char *src,
                                                size_t len, size_t *size) {
    const char *parts[8];
    size_t lens[8], total = 0, i;
    unsigned char *out, *at;
    tb__ocl_program_parts(dev, parts);
    parts[7] = src;
    for (i = 0; i < 8; i++) {
        lens[i] = i == 7 ? len : strlen(parts[i]);
        if (lens[i] > SIZE_MAX / 2 - total - 8) return NULL;
        total += 8 + lens[i];
    }
    out = (unsigned char *)tb__alloc(total);
    if (out == NULL) return NULL;
    for (at = out, i = 0; i < 8; i++) {
        tb__ocl_put64(at, (uint64_t)lens[i]);
        memcpy(at + 8, parts[i], lens[i]);
        at += 8 + lens[i];
    }
    *size = total;
    return out;
}

static uint64_t tb__ocl_disk_checksum(const unsigned char *key, size_t key_size,
                                      const unsigned char *bin, size_t n) {
    return tb__hash_bytes(tb__hash_bytes(TB__OCL_BIN_SEED, key, key_size), bin, n);
}

static bool tb__ocl_read_all(int fd, void *buf, size_t n) {
    unsigned char *p = (unsigned char *)buf;
    while (n > 0) {
        ssize_t got = read(fd, p, n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return false;
        p += got;
        n -= (size_t)got;
    }
    return true;
}

static bool tb__ocl_write_all(int fd, const void *buf, size_t n) {
    const unsigned char *p = (const unsigned char *)buf;
    while (n > 0) {
        ssize_t put = write(fd, p, n);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) return false;
        p += put;
        n -= (size_t)put;
    }
    return true;
}

/* The cache folder's path (not yet created or checked), or NULL when the cache is off. */
static char *tb__ocl_cache_path(void) {
    const char *env = tb__getenv("TB_CACHE_DIR");
    if (env != NULL) {
        if (strcmp(env, "off") == 0 || env[0] == '\0') return NULL;
        return tb__strdup(env);
    }
    if (tb__getenv("XDG_CACHE_HOME") != NULL && tb__getenv("XDG_CACHE_HOME")[0] != '\0')
        return tb__format("%s/torch_backend", tb__getenv("XDG_CACHE_HOME"));
    if (tb__getenv("HOME") != NULL && tb__getenv("HOME")[0] != '\0')
        return tb__format("%s/.cache/torch_backend", tb__getenv("HOME"));
    return NULL;
}

/* Whether the cache folder `dir` may be used, creating it and its missing parents private
   (0700). A folder that is not ours or that others may write to is not used: they could put a
   binary there that we would run. Why a folder is not used is said once per runtime (at
   TB_DEBUG for a folder that is not private, as a warning when it cannot be made). Entries
   are checked one by one too (tb__ocl_disk_read: a regular file of ours, holding our whole
   key), so a folder swapped after this check gives nothing that we did not write ourselves.
   The caller holds tb__ocl_mutex. */
static bool tb__ocl_cache_usable(tb__ocl_runtime *rt, const char *dir) {
    char *copy = tb__strdup(dir), *p;
    struct stat st;
    if (copy == NULL) return false;
    for (p = copy + 1; *p != '\0'; p++) {
        if (*p != '/') continue;
        *p = '\0';
        (void)mkdir(copy, 0700);
        *p = '/';
    }
    (void)mkdir(copy, 0700);
    tb__free(copy);
    /* a link to the folder itself is followed: a user may keep the cache elsewhere */
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        const char *why = stat(dir, &st) != 0 ? strerror(errno) : "not a folder";
        if (!rt->cache_dir_reported) {
            tb_log_message(TB_LOG_WARN, "opencl: the program cache folder %s is not usable: %s",
                           dir, why);
            rt->cache_dir_reported = true;
        }
        return false;
    }
    if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        if (!rt->cache_dir_reported && tb_debug_level() >= 1) {
            tb_log_message(
                TB_LOG_WARN,
                "opencl: the program cache folder %s is not used: %s (make it yours "
                "with mode 0700, or set TB_CACHE_DIR)",
                dir, st.st_uid != geteuid() ? "another user owns it" : "it is writable by others");
        }
        rt->cache_dir_reported = true;
        return false;
    }
    return true;
}

/* The binary of the entry at `path` if it holds the key `kb`, else NULL; then `*why` says what
   is wrong with the file there, or is NULL when there is none. The file is opened without
   following a link or waiting on a FIFO, and read only if it is a regular file of ours whose
   size is that of an entry for this key. */
static unsigned char *tb__ocl_disk_read(const char *path, const uint64_t key[2],
                                        const unsigned char *kb, size_t kn, size_t *size,
                                        const char **why) {
    unsigned char header[TB__OCL_BIN_HEADER];
    unsigned char *stored = NULL, *payload = NULL;
    uint64_t n = 0, size_of_entry;
    struct stat st;
    int fd = open(path, O_RDONLY | TB__OCL_O_NOFOLLOW | O_NONBLOCK | TB__OCL_O_CLOEXEC | O_NOCTTY);
    *why = NULL;
    if (fd < 0) {
        if (errno != ENOENT) *why = errno == ELOOP ? "a symbolic link" : strerror(errno);
        return NULL;
    }
    if (fstat(fd, &st) != 0) {
        *why = strerror(errno);
    } else if (!S_ISREG(st.st_mode)) {
        *why = "not a regular file";
    } else if (st.st_uid != geteuid()) {
        *why = "owned by another user";
    } else if (st.st_size < 0 || (uint64_t)st.st_size <= (uint64_t)TB__OCL_BIN_HEADER + kn ||
               (uint64_t)st.st_size > (uint64_t)TB__OCL_BIN_HEADER + kn + TB__OCL_BIN_MAX) {
        *why = "not the size of an entry for this key";
    } else if (!tb__ocl_read_all(fd, header, sizeof header)) {
        *why = "truncated";
    } else {
        size_of_entry = (uint64_t)st.st_size;
        n = tb__ocl_get64(header + 40);
        if (memcmp(header, TB__OCL_BIN_MAGIC, 8) != 0 ||
            tb__ocl_get64(header + 8) !=
                ((uint64_t)TB__OCL_BIN_VERSION | ((uint64_t)TB__OCL_BIN_HEADER << 32))) {
            *why = "not an entry of this format";
        } else if (tb__ocl_get64(header + 16) != key[0] || tb__ocl_get64(header + 24) != key[1] ||
                   tb__ocl_get64(header + 32) != (uint64_t)kn) {
            *why = "an entry for another key";
        } else if (n == 0 || n != size_of_entry - TB__OCL_BIN_HEADER - kn) {
            *why = "truncated";
        } else if ((stored = (unsigned char *)tb__alloc(kn)) == NULL ||
                   (payload = (unsigned char *)tb__alloc((size_t)n)) == NULL) {
            *why = "out of memory";
        } else if (!tb__ocl_read_all(fd, stored, kn) || !tb__ocl_read_all(fd, payload, (size_t)n)) {
            *why = "truncated";
        } else if (memcmp(stored, kb, kn) != 0) {
            *why = "an entry for another key";
        } else if (tb__ocl_disk_checksum(stored, kn, payload, (size_t)n) !=
                   tb__ocl_get64(header + 48)) {
            *why = "damaged (checksum)";
        }
    }
    close(fd);
    tb__free(stored);
    if (*why != NULL) {
        tb__free(payload);
        return NULL;
    }
    *size = (size_t)n;
    return payload;
}

/* Writes the entry `name` of the folder `dir`: into a new temporary file of the folder (O_EXCL:
   never through a link nor into a file that is there), in full, then renamed over the entry,
   so that a reader sees the old entry, no entry or the whole new one. The caller holds
   tb__ocl_mutex. */
static void tb__ocl_disk_write(const char *dir, const char *name, const uint64_t key[2],
                               const unsigned char *kb, size_t kn, const unsigned char *payload,
                               size_t n) {
    unsigned char header[TB__OCL_BIN_HEADER];
    char *tmp = NULL, *path;
    int fd = -1, tries;
    bool ok;
    int err;
    memset(header, 0, sizeof header);
    memcpy(header, TB__OCL_BIN_MAGIC, 8);
    tb__ocl_put64(header + 8, (uint64_t)TB__OCL_BIN_VERSION | ((uint64_t)TB__OCL_BIN_HEADER << 32));
    tb__ocl_put64(header + 16, key[0]);
    tb__ocl_put64(header + 24, key[1]);
    tb__ocl_put64(header + 32, (uint64_t)kn);
    tb__ocl_put64(header + 40, (uint64_t)n);
    tb__ocl_put64(header + 48, tb__ocl_disk_checksum(kb, kn, payload, n));
    path = tb__format("%s/%s", dir, name);
    if (path == NULL) return;
    for (tries = 0; tries < TB__OCL_TMP_TRIES && fd < 0; tries++) {
        tb__free(tmp);
        tmp = tb__format("%s/.%016llx%016llx.%ld.%u.tmp", dir, (unsigned long long)key[0],
                         (unsigned long long)key[1], (long)getpid(), tb__ocl_disk_counter++);
        if (tmp == NULL) break;
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | TB__OCL_O_CLOEXEC | O_NOCTTY, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        if (tmp != NULL) {
            tb_log_message(TB_LOG_WARN, "opencl: cannot write the program cache file %s: %s", tmp,
                           strerror(errno));
        }
        tb__free(tmp);
        tb__free(path);
        return;
    }
    /* errno is read at the call that failed (close and rename may change it on success, and a
       short write need not set it) */
    errno = 0;
    ok = tb__ocl_write_all(fd, header, sizeof header) && tb__ocl_write_all(fd, kb, kn) &&
         tb__ocl_write_all(fd, payload, n);
    err = ok ? 0 : (errno != 0 ? errno : EIO);
    if (close(fd) != 0 && ok) {
        ok = false;
        err = errno != 0 ? errno : EIO;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        err = errno != 0 ? errno : EIO;
    }
    if (!ok) {
        tb_log_message(TB_LOG_WARN, "opencl: cannot write the program cache file %s: %s", path,
                       strerror(err));
        (void)unlink(tmp);
    }
    tb__free(tmp);
    tb__free(path);
}

#endif /* TB__OCL_DISK_CACHE */

static char *tb__ocl_build_log(tb__ocl_device *dev, tb__cl_program prog) {
    size_t n = 0;
    char *log;
    if (TB__OCL_CALL(dev->rt, GetProgramBuildInfo)(prog, dev->id, TB__CL_PROGRAM_BUILD_LOG, 0, NULL,
                                                   &n) != TB__CL_SUCCESS)
        return NULL;
    log = (char *)tb__alloc(n + 1);
    if (log == NULL) return NULL;
    if (TB__OCL_CALL(dev->rt, GetProgramBuildInfo)(prog, dev->id, TB__CL_PROGRAM_BUILD_LOG, n, log,
                                                   NULL) != TB__CL_SUCCESS)
        n = 0;
    log[n] = '\0';
    return log;
}

static tb__cl_program tb__ocl_build_binary(tb__ocl_device *dev, const unsigned char *bin,
                                           size_t n) {
    tb__ocl_runtime *rt = dev->rt;
    tb__cl_int err = TB__CL_SUCCESS, status = TB__CL_SUCCESS;
    const unsigned char *bins[1];
    tb__cl_program prog;
    bins[0] = bin;
    prog =
        TB__OCL_CALL(rt, CreateProgramWithBinary)(dev->ctx, 1, &dev->id, &n, bins, &status, &err);
    if (prog == NULL || err != TB__CL_SUCCESS || status != TB__CL_SUCCESS) {
        if (prog != NULL) TB__OCL_CALL(rt, ReleaseProgram)(prog);
        return NULL;
    }
    if (TB__OCL_CALL(rt, BuildProgram)(prog, 1, &dev->id, dev->build_options, NULL, NULL) !=
        TB__CL_SUCCESS) {
        TB__OCL_CALL(rt, ReleaseProgram)(prog);
        return NULL;
    }
    return prog;
}

static unsigned char *tb__ocl_program_binary(tb__ocl_device *dev, tb__cl_program prog,
                                             size_t *size) {
    size_t n = 0;
    unsigned char *bin, *ptrs[1];
    if (TB__OCL_CALL(dev->rt, GetProgramInfo)(prog, TB__CL_PROGRAM_BINARY_SIZES, sizeof n, &n,
                                              NULL) != TB__CL_SUCCESS ||
        n == 0)
        return NULL;
    bin = (unsigned char *)tb__alloc(n);
    if (bin == NULL) return NULL;
    ptrs[0] = bin;
    if (TB__OCL_CALL(dev->rt, GetProgramInfo)(prog, TB__CL_PROGRAM_BINARIES, sizeof ptrs, ptrs,
                                              NULL) != TB__CL_SUCCESS) {
        tb__free(bin);
        return NULL;
    }
    *size = n;
    return bin;
}

static void tb__ocl_entry_name(const uint64_t key[2], char name[48]) {
    snprintf(name, 48, "%016llx%016llx.clbin", (unsigned long long)key[0],
             (unsigned long long)key[1]);
}

/* Writes a program's binary to the disk cache once, if that is still to do. The binary is
   read only now: PoCL, for one, serialises it at the first request, with the kernels compiled
   by then. */
static void tb__ocl_program_save(tb__ocl_device *dev, tb__ocl_program *p) {
#if TB__OCL_DISK_CACHE
    if (p->save_dir != NULL) {
        size_t n = 0, kn = 0;
        unsigned char *bin = tb__ocl_program_binary(dev, p->program, &n), *kb = NULL;
        if (bin != NULL) kb = tb__ocl_program_key_bytes(dev, p->source, p->source_len, &kn);
        if (kb != NULL && tb__ocl_cache_usable(dev->rt, p->save_dir)) {
            char name[48];
            tb__ocl_entry_name(p->key, name);
            tb__ocl_disk_write(p->save_dir, name, p->key, kb, kn, bin, n);
        }
        tb__free(kb);
        tb__free(bin);
    }
#else
    (void)dev;
#endif
    tb__free(p->save_dir);
    p->save_dir = NULL;
}

static void tb__ocl_program_unref(tb__ocl_device *dev, tb__ocl_program *p) {
    tb__ocl_program **link;
    if (p == NULL || --p->refcount > 0) return;
    for (link = &dev->programs; *link != NULL; link = &(*link)->next) {
        if (*link == p) {
            *link = p->next;
            break;
        }
    }
    tb__ocl_program_save(dev, p);
    if (p->program != NULL) TB__OCL_CALL(dev->rt, ReleaseProgram)(p->program);
    tb__free(p->source);
    tb__free(p);
}

/* Drops cached programs no computation uses, oldest first, until at most `keep` remain. */
static void tb__ocl_programs_trim(tb__ocl_device *dev, size_t keep) {
    size_t count = 0;
    tb__ocl_program *p;
    for (p = dev->programs; p != NULL; p = p->next)
        count++;
    while (count > keep) {
        tb__ocl_program *oldest = NULL;
        for (p = dev->programs; p != NULL; p = p->next)
            if (p->refcount == 1) oldest = p; /* the list is newest first */
        if (oldest == NULL) break;
        tb__ocl_program_unref(dev, oldest);
        count--;
    }
}

/* The program from the disk cache, or NULL (then *save_dir is the folder to write it to after
   its first run, or NULL when the disk cache is off or not usable). An entry that is there but
   cannot be used (another key, damaged, not a regular file of ours, a binary the driver does
   not take) is removed and counted: the program built now takes its place. */
static tb__cl_program tb__ocl_disk_load(tb__ocl_device *dev, const char *src, size_t len,
                                        const uint64_t key[2], char **save_dir) {
    tb__cl_program prog = NULL;
#if TB__OCL_DISK_CACHE
    char *dir = tb__ocl_cache_path(), *path, name[48];
    unsigned char *kb = NULL, *bin = NULL;
    size_t kn = 0, n = 0;
    const char *why = NULL;
    *save_dir = NULL;
    if (dir == NULL) return NULL;
    tb__ocl_entry_name(key, name);
    path = tb__ocl_cache_usable(dev->rt, dir) ? tb__format("%s/%s", dir, name) : NULL;
    if (path == NULL) {
        tb__free(dir);
        return NULL;
    }
    kb = tb__ocl_program_key_bytes(dev, src, len, &kn);
    if (kb != NULL) bin = tb__ocl_disk_read(path, key, kb, kn, &n, &why);
    if (bin != NULL) {
        prog = tb__ocl_build_binary(dev, bin, n);
        if (prog == NULL) why = "a binary the driver does not load";
    }
    if (prog != NULL) {
        dev->disk_hits++;
        tb__ocl_metric(dev, "OpenCL::DiskCacheHit", 1);
        tb__free(dir);
    } else {
        dev->disk_misses++;
        tb__ocl_metric(dev, "OpenCL::DiskCacheMiss", 1);
        if (why != NULL) {
            if (tb_debug_level() >= 1) {
                tb_log_message(TB_LOG_INFO, "opencl:%d: program cache file %s not used: %s",
                               (int)dev->ordinal, path, why);
            }
            (void)unlink(path); /* a link itself, never what it points to */
            dev->disk_rejected++;
            tb__ocl_metric(dev, "OpenCL::DiskCacheRejected", 1);
        }
        *save_dir = dir;
    }
    tb__free(bin);
    tb__free(kb);
    tb__free(path);
#else
    (void)dev, (void)src, (void)len, (void)key;
    *save_dir = NULL;
#endif
    return prog;
}

/* The built program for a source: from memory, from the disk cache, or built now. */
static tb_status tb__ocl_get_program(tb__ocl_device *dev, const char *src, size_t len,
                                     tb__ocl_program **out) {
    tb__ocl_runtime *rt = dev->rt;
    uint64_t key[2];
    tb__ocl_program *p;
    tb__cl_program prog;
    char *save_dir = NULL, *source;
    tb__cl_int err = TB__CL_SUCCESS;
    tb__ocl_program_key(dev, src, len, key);
    for (p = dev->programs; p != NULL; p = p->next) {
        if (p->key[0] != key[0] || p->key[1] != key[1]) continue;
        if (p->source_len != len || memcmp(p->source, src, len) != 0) {
            tb__ocl_metric(dev, "OpenCL::ProgramKeyCollision", 1);
            continue;
        }
        p->refcount++;
        tb__ocl_metric(dev, "OpenCL::ProgramCacheHit", 1);
        *out = p;
        return TB_OK;
    }
    source = (char *)tb__alloc(len + 1);
    if (source == NULL) return TB_ERR_OUT_OF_MEMORY;
    memcpy(source, src, len);
    source[len] = '\0';
    prog = tb__ocl_disk_load(dev, src, len, key, &save_dir);
    if (prog == NULL) {
        const char *srcs[1];
        srcs[0] = src;
        prog = TB__OCL_CALL(rt, CreateProgramWithSource)(dev->ctx, 1, srcs, &len, &err);
        if (prog == NULL || err != TB__CL_SUCCESS) {
            tb__free(save_dir);
            tb__free(source);
            return tb__error(TB_ERR_COMPILE, "opencl:%d: clCreateProgramWithSource failed: %s (%d)",
                             (int)dev->ordinal, tb__cl_error_name(err), (int)err);
        }
        dev->program_builds++;
        tb__ocl_metric(dev, "OpenCL::ProgramBuild", 1);
        err = TB__OCL_CALL(rt, BuildProgram)(prog, 1, &dev->id, dev->build_options, NULL, NULL);
        if (err != TB__CL_SUCCESS) {
            char *log = tb__ocl_build_log(dev, prog);
            tb_status st;
            if (log != NULL && tb_debug_level() >= 1) {
                tb_log_message(TB_LOG_ERROR, "opencl:%d: build log:\n%s", (int)dev->ordinal, log);
            }
            st = tb__error(TB_ERR_COMPILE,
                           "opencl:%d (%s): the program does not build: %s (%d); "
                           "build log:\n%.800s",
                           (int)dev->ordinal, dev->info.name, tb__cl_error_name(err), (int)err,
                           log != NULL ? log : "(none)");
            tb__free(log);
            TB__OCL_CALL(rt, ReleaseProgram)(prog);
            tb__free(save_dir);
            tb__free(source);
            return st;
        }
    }
    p = (tb__ocl_program *)tb__calloc(1, sizeof *p);
    if (p == NULL) {
        TB__OCL_CALL(rt, ReleaseProgram)(prog);
        tb__free(save_dir);
        tb__free(source);
        return TB_ERR_OUT_OF_MEMORY;
    }
    p->key[0] = key[0];
    p->key[1] = key[1];
    p->source = source;
    p->source_len = len;
    p->program = prog;
    p->save_dir = save_dir; /* written after the first run (tb__ocl_program_save) */
    p->refcount = 2;        /* the cache and the caller */
    p->next = dev->programs;
    dev->programs = p;
    tb__ocl_programs_trim(dev, TB__OCL_MAX_PROGRAMS);
    *out = p;
    return TB_OK;
}

/* ---- backend entries: lowering, compile, execute ---- */

typedef struct tb__ocl_context {
    tb__ocl_plan *plan; /* moves to the computation on a successful compile */
} tb__ocl_context;

static void tb__ocl_plan_release(tb__ocl_plan *p) {
    size_t i;
    tb__ocl_runtime *rt;
    if (p == NULL) return;
    rt = p->rt;
    if (rt != NULL) {
        tb__ocl_device *dev =
            (size_t)p->ordinal < rt->num_devices ? &rt->devices[p->ordinal] : NULL;
        if (p->cl != NULL) {
            for (i = 0; i < p->num_kernels; i++)
                if (p->cl[i] != NULL) TB__OCL_CALL(rt, ReleaseKernel)(p->cl[i]);
        }
        if (dev != NULL && p->program != NULL) tb__ocl_program_unref(dev, p->program);
    }
    tb__free(p->cl);
    tb__ocl_plan_free(p);
    tb__ocl_runtime_unref(rt);
}

static tb_status tb__ocl_create_lowering_context(void *user_data, const tb_graph *graph,
                                                 void **context) {
    tb__ocl_device *dev;
    tb__ocl_plan *p;
    tb__ocl_context *ctx;
    tb__ocl_lower L;
    tb_status st;
    size_t i;
    (void)user_data;
    *context = NULL;
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(graph->device.ordinal, "opencl");
    if (dev == NULL) {
        tb__mutex_unlock(&tb__ocl_mutex);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    }
    ctx = (tb__ocl_context *)tb__calloc(1, sizeof *ctx);
    p = (tb__ocl_plan *)tb__calloc(1, sizeof *p);
    if (ctx == NULL || p == NULL) {
        tb__free(ctx);
        tb__free(p);
        tb__mutex_unlock(&tb__ocl_mutex);
        return TB_ERR_OUT_OF_MEMORY;
    }
    p->rt = dev->rt;
    dev->rt->refcount++;
    p->ordinal = dev->ordinal;
    p->graph_hash = graph->hash;
    p->num_params = graph->num_parameters;
    p->num_results = graph->num_results;
    p->param_scalar = (int32_t *)tb__calloc(p->num_params + 1, sizeof(int32_t));
    p->param_dtype = (tb_dtype *)tb__calloc(p->num_params + 1, sizeof(tb_dtype));
    p->result_slot = (int32_t *)tb__calloc(p->num_results + 1, sizeof(int32_t));
    p->result_source = (int32_t *)tb__calloc(p->num_results + 1, sizeof(int32_t));
    memset(&L, 0, sizeof L);
    L.graph = graph;
    L.dev = dev;
    L.plan = p;
    if (p->param_scalar == NULL || p->param_dtype == NULL || p->result_slot == NULL ||
        p->result_source == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
    } else {
        size_t scalars = 0;
        for (i = 0; i < p->num_params; i++) {
            p->param_scalar[i] = graph->parameters[i]->op == TB_OP_SCALAR ? 1 : 0;
            p->param_dtype[i] = graph->parameters[i]->shape.dtype;
            scalars += (size_t)p->param_scalar[i];
        }
        p->scalar_table = scalars > TB__OCL_MAX_SCALAR_ARGS;
        st = tb__ocl_lower_init(&L);
        if (st == TB_OK) st = tb__ocl_lower_graph(&L);
    }
    tb__ocl_lower_free(&L);
    if (st != TB_OK) {
        tb__ocl_plan_release(p);
        tb__free(ctx);
    } else {
        ctx->plan = p;
        *context = ctx;
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

static void tb__ocl_release_lowering_context(void *user_data, void *context) {
    tb__ocl_context *ctx = (tb__ocl_context *)context;
    (void)user_data;
    if (ctx == NULL) return;
    tb__mutex_lock(&tb__ocl_mutex);
    tb__ocl_plan_release(ctx->plan);
    tb__mutex_unlock(&tb__ocl_mutex);
    tb__free(ctx);
}

/* A work-group size for a kernel launched over `items` work items: a multiple of the preferred
   multiple, small enough that every compute unit gets a group. */
static size_t tb__ocl_pick_local(tb__ocl_device *dev, tb__cl_kernel kern, uint64_t items) {
    size_t kmax = 0, pref = 0, wg;
    uint64_t cu = dev->info.compute_units;
    if (TB__OCL_CALL(dev->rt, GetKernelWorkGroupInfo)(kern, dev->id, TB__CL_KERNEL_WORK_GROUP_SIZE,
                                                      sizeof kmax, &kmax, NULL) != TB__CL_SUCCESS ||
        kmax == 0)
        kmax = dev->info.max_work_group_size;
    if (TB__OCL_CALL(dev->rt, GetKernelWorkGroupInfo)(
            kern, dev->id, TB__CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE, sizeof pref, &pref,
            NULL) != TB__CL_SUCCESS ||
        pref == 0)
        pref = 1;
    wg = dev->info.device.type == TB_DEVICE_CPU ? 128 : 256;
    if (wg > kmax) wg = kmax;
    if (wg >= pref) wg -= wg % pref;
    while (wg > pref && (items + wg - 1) / wg < cu) {
        wg /= 2;
        if (wg >= pref) wg -= wg % pref;
    }
    return wg > 0 ? wg : 1;
}

static tb_status tb__ocl_compile(void *user_data, void *context, void **computation) {
    tb__ocl_context *ctx = (tb__ocl_context *)context;
    tb__ocl_plan *p = ctx != NULL ? ctx->plan : NULL;
    tb__ocl_device *dev;
    tb_status st = TB_OK;
    size_t i, launched = 0;
    (void)user_data;
    *computation = NULL;
    if (p == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "opencl: compile without a context");
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(p->ordinal, "opencl");
    if (dev == NULL || dev->rt != p->rt) {
        tb__mutex_unlock(&tb__ocl_mutex);
        if (dev != NULL) return tb__error(TB_ERR_STATE, "opencl: the backend was restarted");
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    }
    if (tb_debug_level() >= 3) {
        tb_log_message(TB_LOG_DEBUG, "opencl:%d: program of graph %016llx:\n%s", (int)p->ordinal,
                       (unsigned long long)p->graph_hash, p->source);
    }
    p->cl = (tb__cl_kernel *)tb__calloc(p->num_kernels + 1, sizeof(tb__cl_kernel));
    p->local = (size_t *)tb__calloc(p->num_kernels + 1, sizeof(size_t));
    if (p->cl == NULL || p->local == NULL) st = TB_ERR_OUT_OF_MEMORY;
    if (st == TB_OK) st = tb__ocl_get_program(dev, p->source, p->source_len, &p->program);
    for (i = 0; i < p->num_kernels && st == TB_OK; i++) {
        tb__ocl_kernel *k = &p->kernels[i];
        tb__cl_int err = TB__CL_SUCCESS;
        if (k->name[0] == '\0') continue;
        p->cl[i] = TB__OCL_CALL(dev->rt, CreateKernel)(p->program->program, k->name, &err);
        if (p->cl[i] == NULL || err != TB__CL_SUCCESS) {
            p->cl[i] = NULL;
            st = tb__error(TB_ERR_COMPILE, "opencl:%d: clCreateKernel(%s) failed: %s (%d)",
                           (int)p->ordinal, k->name, tb__cl_error_name(err), (int)err);
            break;
        }
        if (k->group_size[0] == 0) p->local[i] = tb__ocl_pick_local(dev, p->cl[i], k->items);
        launched++;
    }
    if (st == TB_OK && tb_debug_level() >= 1) {
        tb__str names;
        memset(&names, 0, sizeof names);
        for (i = 0; i < p->num_kernels; i++)
            if (p->kernels[i].name[0] != '\0')
                tb__str_append(&names, "%s%s", names.len > 0 ? " " : "", p->kernels[i].name);
        tb_log_message(TB_LOG_INFO, "opencl:%d: graph %016llx: %zu kernel%s: %s", (int)p->ordinal,
                       (unsigned long long)p->graph_hash, launched, launched == 1 ? "" : "s",
                       names.data != NULL ? names.data : "");
        tb__str_free(&names);
    }
    if (st == TB_OK) {
        *computation = p;
        ctx->plan = NULL;
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

static void tb__ocl_release_computation(void *user_data, void *computation) {
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    tb__ocl_plan_release((tb__ocl_plan *)computation);
    tb__mutex_unlock(&tb__ocl_mutex);
}

static const char *tb__ocl_backend_text(void *user_data, const void *computation) {
    (void)user_data;
    return computation != NULL ? ((const tb__ocl_plan *)computation)->source : NULL;
}

static int32_t tb__ocl_get_node_kernel(void *user_data, const void *computation, size_t node_index,
                                       const char **kernel_name) {
    const tb__ocl_plan *p = (const tb__ocl_plan *)computation;
    int32_t k;
    (void)user_data;
    if (kernel_name != NULL) *kernel_name = NULL;
    if (p == NULL || p->node_kernel == NULL || node_index >= p->num_nodes) return -1;
    k = p->node_kernel[node_index];
    if (k >= 0 && kernel_name != NULL) *kernel_name = p->kernels[k].name;
    return k;
}

static tb__cl_int tb__ocl_launch(tb__ocl_device *dev, const tb__ocl_plan *p, size_t i,
                                 tb__cl_event *event) {
    const tb__ocl_kernel *k = &p->kernels[i];
    size_t gws[3], lws[3];
    tb__cl_uint dims;
    if (k->group_size[0] > 0) {
        int d;
        for (d = 0; d < 3; d++) {
            lws[d] = k->group_size[d];
            gws[d] = k->groups[d] * k->group_size[d];
        }
        dims = 3;
    } else {
        lws[0] = p->local[i];
        gws[0] = (size_t)((k->items + lws[0] - 1) / lws[0] * lws[0]);
        dims = 1;
    }
    return TB__OCL_CALL(dev->rt, EnqueueNDRangeKernel)(dev->queue, p->cl[i], dims, NULL, gws, lws,
                                                       0, NULL, event);
}

/* The bytes of a scalar argument as the kernel declares it. */
static size_t tb__ocl_scalar_arg(tb__ocl_device *dev, tb_dtype dtype, const tb_backend_data *data,
                                 unsigned char out[8]) {
    tb_scalar v;
    if (data->is_scalar) {
        v = data->scalar;
    } else {
        /* a scalar parameter given as an array (not made by data_from_scalar) */
        unsigned char raw[8];
        memset(raw, 0, sizeof raw);
        if (tb__ocl_read(dev, (const tb__ocl_buffer *)data->payload, raw, tb_dtype_size(dtype)) !=
            TB_OK)
            return 0;
        if (dtype == TB_F32) {
            float f;
            memcpy(&f, raw, sizeof f);
            v = tb_scalar_f(TB_F32, f);
        } else if (dtype == TB_F64) {
            double f;
            memcpy(&f, raw, sizeof f);
            v = tb_scalar_f(TB_F64, f);
        } else if (dtype == TB_I32) {
            int32_t x;
            memcpy(&x, raw, sizeof x);
            v = tb_scalar_i(TB_I32, x);
        } else if (dtype == TB_I64) {
            int64_t x;
            memcpy(&x, raw, sizeof x);
            v = tb_scalar_i(TB_I64, x);
        } else {
            v = tb_scalar_i(dtype, raw[0]);
        }
    }
    if (dtype == TB_F64 && !dev->info.supports_f64) {
        tb__ocl_scalar_bytes(TB_F32, v, out);
        return 4;
    }
    tb__ocl_scalar_bytes(dtype, v, out);
    return tb_dtype_size(dtype);
}

static tb_status tb__ocl_run_error(const tb__ocl_plan *p, const int64_t flag[4]) {
    const tb__ocl_errsite *e;
    if (flag[0] <= 0 || (size_t)flag[0] > p->num_errsites) {
        return tb__error(TB_ERR_EXECUTE, "opencl: a kernel reported error %lld",
                         (long long)flag[0]);
    }
    e = &p->errsites[flag[0] - 1];
    if (e->op == TB_OP_POW) {
        return tb__error(TB_ERR_EXECUTE,
                         "tb_pow: integers to negative integer powers are not allowed (%lld ** "
                         "%lld)",
                         (long long)flag[1], (long long)flag[2]);
    }
    return tb__error(TB_ERR_EXECUTE, "tb_%s: index %lld is out of range for dim %d of size %lld",
                     tb_op_name(e->op), (long long)flag[1], (int)e->dim, (long long)e->size);
}

static tb_status tb__ocl_execute(void *user_data, void *computation,
                                 tb_backend_data *const *arguments, size_t num_arguments,
                                 tb_backend_data *const *results, size_t num_results) {
    static const int64_t zeros[4] = {0, 0, 0, 0};
    tb__ocl_plan *p = (tb__ocl_plan *)computation;
    tb__ocl_device *dev;
    tb__ocl_runtime *rt;
    tb__ocl_buffer **owned = NULL, *err_buf = NULL, *table_buf = NULL;
    tb__cl_mem *mems = NULL;
    tb__cl_event *events = NULL;
    tb_status st = TB_OK;
    size_t i, j;
    bool profile = tb_debug_level() >= 2;
    (void)user_data;
    if (p == NULL || num_arguments != p->num_params || num_results != p->num_results) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "opencl: execute with %zu arguments and %zu results, the computation has "
                         "%zu and %zu",
                         num_arguments, num_results, p != NULL ? p->num_params : 0,
                         p != NULL ? p->num_results : 0);
    }
    tb__mutex_lock(&tb__ocl_mutex);
    rt = p->rt;
    if (rt != tb__ocl_current || rt->exited) {
        tb__mutex_unlock(&tb__ocl_mutex);
        return tb__error(TB_ERR_STATE, "opencl: the computation outlived the backend");
    }
    dev = &rt->devices[p->ordinal];
    owned = (tb__ocl_buffer **)tb__calloc(p->num_slots + 1, sizeof *owned);
    mems = (tb__cl_mem *)tb__calloc(p->num_slots + 1, sizeof *mems);
    events = (tb__cl_event *)tb__calloc(p->num_kernels + 1, sizeof *events);
    if (owned == NULL || mems == NULL || events == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (i = 0; i < p->num_slots && st == TB_OK; i++) {
        const tb__ocl_slot *s = &p->slots[i];
        if (s->kind != TB__OCL_SLOT_PARAM) continue;
        mems[i] = tb__ocl_data_mem(dev, arguments[s->index]);
        if (mems[i] == NULL) st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    }
    if (st == TB_OK && p->num_errsites > 0) {
        tb__cl_int err;
        st = tb__ocl_buffer_alloc(dev, sizeof zeros, &err_buf);
        if (st == TB_OK) {
            err = TB__OCL_CALL(rt, EnqueueWriteBuffer)(dev->queue, err_buf->mem, TB__CL_FALSE, 0,
                                                       sizeof zeros, zeros, 0, NULL, NULL);
            if (err != TB__CL_SUCCESS) {
                st = tb__error(TB_ERR_EXECUTE, "opencl:%d: clEnqueueWriteBuffer failed: %s (%d)",
                               (int)p->ordinal, tb__cl_error_name(err), (int)err);
            }
        }
    }
    if (st == TB_OK && p->scalar_table) {
        size_t bytes = (p->num_params + 1) * 8;
        unsigned char *table = (unsigned char *)tb__calloc(p->num_params + 1, 8);
        if (table == NULL) st = TB_ERR_OUT_OF_MEMORY;
        for (i = 0; i < p->num_params && st == TB_OK; i++) {
            if (p->param_scalar[i] &&
                tb__ocl_scalar_arg(dev, p->param_dtype[i], arguments[i], table + 8 * i) == 0)
                st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_EXECUTE;
        }
        if (st == TB_OK) st = tb__ocl_buffer_alloc(dev, bytes, &table_buf);
        if (st == TB_OK) st = tb__ocl_write(dev, table_buf, table, bytes);
        tb__free(table);
    }
    for (i = 0; i < p->num_kernels && st == TB_OK; i++) {
        const tb__ocl_kernel *k = &p->kernels[i];
        const tb__ocl_slot *os = &p->slots[k->out_slot];
        tb__cl_int err = TB__CL_SUCCESS;
        tb__cl_uint a = 0;
        if (mems[k->out_slot] == NULL) {
            size_t size = 0;
            st = tb_shape_nbytes(&os->shape, &size);
            if (st == TB_OK) st = tb__ocl_buffer_alloc(dev, size, &owned[k->out_slot]);
            if (st != TB_OK) break;
            mems[k->out_slot] = owned[k->out_slot]->mem;
        }
        if (p->cl[i] != NULL) {
            err = TB__OCL_CALL(rt, SetKernelArg)(p->cl[i], a++, sizeof(tb__cl_mem),
                                                 &mems[k->out_slot]);
            for (j = 0; j < k->num_args && err == TB__CL_SUCCESS; j++) {
                const tb__ocl_arg *arg = &k->args[j];
                if (arg->kind == TB__OCL_ARG_BUF) {
                    err = TB__OCL_CALL(rt, SetKernelArg)(p->cl[i], a++, sizeof(tb__cl_mem),
                                                         &mems[arg->index]);
                } else if (arg->kind == TB__OCL_ARG_SCALAR) {
                    unsigned char bytes[8];
                    size_t n = tb__ocl_scalar_arg(dev, p->param_dtype[arg->index],
                                                  arguments[arg->index], bytes);
                    if (n == 0) {
                        st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_EXECUTE;
                        break;
                    }
                    err = TB__OCL_CALL(rt, SetKernelArg)(p->cl[i], a++, n, bytes);
                } else if (arg->kind == TB__OCL_ARG_TABLE) {
                    err = TB__OCL_CALL(rt, SetKernelArg)(p->cl[i], a++, sizeof(tb__cl_mem),
                                                         &table_buf->mem);
                } else {
                    err = TB__OCL_CALL(rt, SetKernelArg)(p->cl[i], a++, sizeof(tb__cl_mem),
                                                         &err_buf->mem);
                }
            }
            if (st != TB_OK) break;
            if (err == TB__CL_SUCCESS) {
                err = tb__ocl_launch(dev, p, i, profile ? &events[i] : NULL);
                if (tb__cl_is_oom(err) && dev->cache_count > 0) {
                    /* memory the cache holds may be what the launch is missing */
                    dev->cache_trims++;
                    tb__ocl_metric(dev, "OpenCL::CacheTrim", 1);
                    tb__ocl_cache_trim(dev, 0);
                    err = tb__ocl_launch(dev, p, i, profile ? &events[i] : NULL);
                }
            }
            if (err != TB__CL_SUCCESS) {
                st = tb__error(tb__cl_is_oom(err) ? TB_ERR_OUT_OF_MEMORY : TB_ERR_EXECUTE,
                               "opencl:%d: kernel %s: %s (%d)", (int)p->ordinal, k->name,
                               tb__cl_error_name(err), (int)err);
                break;
            }
            dev->kernels_launched++;
            tb__ocl_metric(dev, "OpenCL::KernelLaunch", 1);
        }
        /* temporaries nobody reads any more go back to the cache (the queue is in order) */
        for (j = 0; j < p->num_slots; j++) {
            if (p->slots[j].kind == TB__OCL_SLOT_TEMP && owned[j] != NULL &&
                p->slots[j].last_use <= (int32_t)i) {
                tb__ocl_buffer_free(owned[j]);
                owned[j] = NULL;
            }
        }
    }
    for (i = 0; i < p->num_results && st == TB_OK; i++) {
        int32_t src = p->result_source[i];
        size_t size = 0;
        tb__ocl_buffer *copy = NULL;
        tb__cl_int err;
        if (src < 0) continue;
        st = tb_shape_nbytes(&p->slots[p->result_slot[src]].shape, &size);
        if (st == TB_OK) st = tb__ocl_buffer_alloc(dev, size, &copy);
        if (st != TB_OK) break;
        err = size == 0 ? TB__CL_SUCCESS
                        : TB__OCL_CALL(rt, EnqueueCopyBuffer)(dev->queue, mems[p->result_slot[src]],
                                                              copy->mem, 0, 0, size, 0, NULL, NULL);
        if (err != TB__CL_SUCCESS) {
            tb__ocl_buffer_free(copy);
            st = tb__error(TB_ERR_EXECUTE, "opencl:%d: clEnqueueCopyBuffer failed: %s (%d)",
                           (int)p->ordinal, tb__cl_error_name(err), (int)err);
            break;
        }
        results[i]->payload = copy;
    }
    if (st == TB_OK && p->program->save_dir != NULL) {
        /* the first run of a program built here: once its kernels ran, its binary is worth
           the most to the disk cache */
        TB__OCL_CALL(rt, Finish)(dev->queue);
        tb__ocl_program_save(dev, p->program);
    }
    if (st == TB_OK && err_buf != NULL) {
        int64_t flag[4];
        st = tb__ocl_read(dev, err_buf, flag, sizeof flag);
        if (st == TB_OK && flag[0] != 0) st = tb__ocl_run_error(p, flag);
    }
    if (st == TB_OK && profile) {
        TB__OCL_CALL(rt, Finish)(dev->queue);
        for (i = 0; i < p->num_kernels; i++) {
            tb__cl_ulong t0 = 0, t1 = 0;
            double ns;
            if (events[i] == NULL) continue;
            TB__OCL_CALL(rt, GetEventProfilingInfo)
            (events[i], TB__CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
            TB__OCL_CALL(rt, GetEventProfilingInfo)
            (events[i], TB__CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
            ns = t1 > t0 ? (double)(t1 - t0) : 1.0;
            dev->kernel_ns += (uint64_t)ns;
            tb_log_message(TB_LOG_DEBUG, "opencl:%d %-24s %10.3f ms %9.2f GB/s %9.2f GFLOP/s",
                           (int)p->ordinal, p->kernels[i].name, ns / 1e6, p->kernels[i].bytes / ns,
                           p->kernels[i].flops / ns);
        }
    }
    if (st == TB_OK) {
        for (i = 0; i < p->num_results; i++) {
            if (p->result_source[i] >= 0) continue;
            results[i]->payload = owned[p->result_slot[i]];
            owned[p->result_slot[i]] = NULL;
        }
        TB__OCL_CALL(rt, Flush)(dev->queue);
    } else {
        for (i = 0; i < p->num_results; i++) {
            if (p->result_source[i] >= 0 && results[i]->payload != NULL) {
                tb__ocl_buffer_free((tb__ocl_buffer *)results[i]->payload);
                results[i]->payload = NULL;
            }
        }
    }
done:
    if (owned != NULL) {
        for (i = 0; i < p->num_slots; i++)
            tb__ocl_buffer_free(owned[i]);
    }
    if (events != NULL) {
        for (i = 0; i < p->num_kernels; i++)
            if (events[i] != NULL) TB__OCL_CALL(rt, ReleaseEvent)(events[i]);
    }
    tb__ocl_buffer_free(err_buf);
    tb__ocl_buffer_free(table_buf);
    tb__free(owned);
    tb__free(mems);
    tb__free(events);
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

/* ---- backend entries: IR hooks, lifetime, registration ---- */

static bool tb__ocl_float_only_unary(tb_op op) {
    switch (op) {
    case TB_OP_EXP:
    case TB_OP_LOG:
    case TB_OP_SQRT:
    case TB_OP_RSQRT:
    case TB_OP_SIN:
    case TB_OP_COS:
    case TB_OP_TANH:
    case TB_OP_SIGMOID:
    case TB_OP_GELU:
    case TB_OP_SILU:
    case TB_OP_RECIPROCAL:
    case TB_OP_DIV:
        return true;
    default:
        return false;
    }
}

static bool tb__ocl_supports_node(void *user_data, const tb_node *node) {
    tb__ocl_runtime *rt;
    bool fp64 = false, known = false;
    bool uses_f64;
    uint32_t i;
    tb_op op = node->op;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt != NULL && rt->status == TB_OK && node->device.ordinal >= 0 &&
        (size_t)node->device.ordinal < rt->num_devices) {
        fp64 = rt->devices[node->device.ordinal].info.supports_f64;
        known = true;
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    if (!known) return true; /* nothing runs there anyway */
    if (op == TB_OP_DEVICE_DATA || op == TB_OP_SCALAR) return true;
    uses_f64 = node->shape.dtype == TB_F64;
    for (i = 0; i < node->num_operands; i++)
        uses_f64 = uses_f64 || node->operands[i]->shape.dtype == TB_F64;
    if (uses_f64 && !fp64) return false;
    if (op >= TB_OP_BUILTIN_COUNT) {
        const tb_custom_op_desc *d = tb__ocl_custom(op);
        return d != NULL && d->opencl_expr != NULL && d->infer_shape == NULL;
    }
    if (op < 0) return false;
    /* randn uses log, sin and cos in double: bit-identical f64 output would need the C
       library's exact functions, so f64 runs on the reference */
    if (op == TB_OP_RANDN) return fp64 && node->shape.dtype == TB_F32;
    if (op == TB_OP_ARANGE && tb_dtype_is_float(node->shape.dtype)) return fp64;
    if (tb__ocl_float_only_unary(op) && !tb_dtype_is_float(node->shape.dtype)) return false;
    return true;
}

static void tb__ocl_prepare_to_exit(void *user_data) {
    tb__ocl_runtime *rt;
    size_t i;
    (void)user_data;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_current;
    if (rt != NULL) {
        for (i = 0; i < rt->num_devices; i++) {
            tb__ocl_cache_trim(&rt->devices[i], 0);
            tb__ocl_programs_trim(&rt->devices[i], 0);
        }
        rt->exited = true;
        tb__ocl_current = NULL;
        tb__ocl_runtime_unref(rt);
    }
    tb__mutex_unlock(&tb__ocl_mutex);
}

static tb_status tb__opencl_register(void) {
    tb_backend_impl impl;
    memset(&impl, 0, sizeof impl);
    impl.prepare_to_exit = tb__ocl_prepare_to_exit;
    impl.supports_node = tb__ocl_supports_node;
    impl.data_from_host = tb__ocl_data_from_host;
    impl.data_from_scalar = tb__ocl_data_from_scalar;
    impl.data_to_host = tb__ocl_data_to_host;
    impl.data_release = tb__ocl_data_release;
    impl.create_lowering_context = tb__ocl_create_lowering_context;
    impl.release_lowering_context = tb__ocl_release_lowering_context;
    impl.compile = tb__ocl_compile;
    impl.execute = tb__ocl_execute;
    impl.release_computation = tb__ocl_release_computation;
    impl.computation_backend_text = tb__ocl_backend_text;
    impl.get_node_kernel = tb__ocl_get_node_kernel;
    impl.get_backend_devices = tb__ocl_get_backend_devices;
    impl.get_backend_device = tb__ocl_get_backend_device;
    impl.get_device_info = tb__ocl_get_device_info;
    impl.get_default_device_type = tb__ocl_get_default_device_type;
    impl.set_default_device_type = tb__ocl_set_default_device_type;
    impl.get_default_device_ordinal = tb__ocl_get_default_device_ordinal;
    impl.set_default_device_ordinal = tb__ocl_set_default_device_ordinal;
    impl.eager_fallback_device_type = tb__ocl_eager_fallback_device_type;
    impl.create_metrics_report = tb__ocl_metrics_report;
    return tb_backend_register("opencl", &impl, "");
}

/* ---- public API (opencl.h) ---- */

/* The device's ordinal, checking that it is an opencl device (NULL: the default device). */
static tb_status tb__ocl_public_ordinal(const char *fn, const tb_device *device, int32_t *out) {
    tb__ensure_setup();
    (void)tb_has_backend("opencl"); /* registers the built-in backends */
    if (device == NULL) {
        *out = tb__ocl_get_default_device_ordinal(NULL);
        return TB_OK;
    }
    if (strcmp(device->backend, "opencl") != 0) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: device %s:%d is not an opencl device", fn,
                         device->backend[0] != '\0' ? device->backend : "(none)",
                         (int)device->ordinal);
    }
    *out = device->ordinal;
    return TB_OK;
}

TBDEF tb_status tb_opencl_available(void) {
    tb__ocl_runtime *rt;
    tb_status st = TB_OK;
    tb__ensure_setup();
    (void)tb_has_backend("opencl");
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt == NULL) {
        st = tb__error(TB_ERR_OUT_OF_MEMORY, "tb_opencl_available: out of memory");
    } else if (rt->status != TB_OK) {
        st = tb__error(rt->status, "%s", rt->reason);
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

TBDEF tb_status tb_opencl_native_device(const tb_device *device, tb_opencl_native *out) {
    tb__ocl_device *dev;
    int32_t ordinal = 0;
    tb_status st;
    if (out == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_opencl_native_device: out is NULL");
    }
    st = tb__ocl_public_ordinal("tb_opencl_native_device", device, &ordinal);
    if (st != TB_OK) return st;
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(ordinal, "tb_opencl_native_device");
    if (dev != NULL) {
        out->platform = (void *)dev->platform;
        out->device = (void *)dev->id;
        out->context = (void *)dev->ctx;
        out->queue = (void *)dev->queue;
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    if (dev == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    return TB_OK;
}

TBDEF tb_status tb_opencl_tensor_buffer(tb_tensor *tensor, void **mem, size_t *size) {
    tb_backend_data *data;
    tb__ocl_device *dev;
    tb__cl_mem m = NULL;
    size_t n = 0;
    tb_status st;
    if (tensor == NULL || mem == NULL || size == NULL) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_opencl_tensor_buffer: %s is NULL",
                         tensor == NULL ? "tensor" : (mem == NULL ? "mem" : "size"));
    }
    data = tb_tensor_data(tensor);
    if (data == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    if (strcmp(data->device.backend, "opencl") != 0) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_opencl_tensor_buffer: the tensor is on %s:%d, not an opencl device",
                         data->device.backend, (int)data->device.ordinal);
    }
    st = tb_shape_nbytes(&data->shape, &n);
    if (st != TB_OK) return st;
    tb__mutex_lock(&tb__ocl_mutex);
    dev = tb__ocl_device_get(data->device.ordinal, "tb_opencl_tensor_buffer");
    if (dev != NULL) m = tb__ocl_data_mem(dev, data);
    tb__mutex_unlock(&tb__ocl_mutex);
    if (m == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    *mem = (void *)m;
    *size = n;
    return TB_OK;
}

TBDEF tb_status tb_opencl_trim_cache(const tb_device *device) {
    tb__ocl_runtime *rt;
    int32_t ordinal = 0;
    tb_status st = TB_OK;
    size_t i;
    if (device != NULL) {
        st = tb__ocl_public_ordinal("tb_opencl_trim_cache", device, &ordinal);
        if (st != TB_OK) return st;
    } else {
        tb__ensure_setup();
        (void)tb_has_backend("opencl");
    }
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
    } else if (rt->status != TB_OK) {
        st = tb__error(rt->status, "%s", rt->reason);
    } else if (device != NULL && (ordinal < 0 || (size_t)ordinal >= rt->num_devices)) {
        st = tb__error(TB_ERR_NOT_FOUND, "tb_opencl_trim_cache: no device opencl:%d (%zu device%s)",
                       (int)ordinal, rt->num_devices, rt->num_devices == 1 ? "" : "s");
    } else {
        for (i = 0; i < rt->num_devices; i++) {
            if (device != NULL && (int32_t)i != ordinal) continue;
            if (rt->devices[i].cache_count > 0) {
                rt->devices[i].cache_trims++;
                tb__ocl_metric(&rt->devices[i], "OpenCL::CacheTrim", 1);
            }
            tb__ocl_cache_trim(&rt->devices[i], 0);
        }
    }
    tb__mutex_unlock(&tb__ocl_mutex);
    return st;
}

#else /* TB_NO_OPENCL */

TBDEF tb_status tb_opencl_available(void) {
    return tb__error(TB_ERR_UNSUPPORTED, "tb_opencl_available: built with TB_NO_OPENCL");
}

TBDEF tb_status tb_opencl_native_device(const tb_device *device, tb_opencl_native *out) {
    (void)device;
    (void)out;
    return tb__error(TB_ERR_UNSUPPORTED, "tb_opencl_native_device: built with TB_NO_OPENCL");
}

TBDEF tb_status tb_opencl_tensor_buffer(tb_tensor *tensor, void **mem, size_t *size) {
    (void)tensor;
    (void)mem;
    (void)size;
    return tb__error(TB_ERR_UNSUPPORTED, "tb_opencl_tensor_buffer: built with TB_NO_OPENCL");
}

TBDEF tb_status tb_opencl_trim_cache(const tb_device *device) {
    (void)device;
    return tb__error(TB_ERR_UNSUPPORTED, "tb_opencl_trim_cache: built with TB_NO_OPENCL");
}

#endif /* TB_NO_OPENCL */

/* ---- src/interop.c ---- */
/* ===========================================================================================
   Interop: .npy files
   =========================================================================================== */

#define TB__NPY_MAGIC_LEN 6
static const char tb__npy_magic[TB__NPY_MAGIC_LEN] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

static bool tb__host_is_little_endian(void) {
    const uint16_t probe = 1;
    unsigned char first;
    memcpy(&first, &probe, 1);
    return first == 1;
}

static void tb__swap_bytes(unsigned char *data, size_t count, size_t width) {
    for (size_t i = 0; i < count; ++i) {
        unsigned char *p = data + i * width;
        for (size_t a = 0, b = width - 1; a < b; ++a, --b) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
    }
}

/* The parsed header of a .npy file. */
typedef struct tb__npy_header {
    tb_dtype dtype;
    bool big_endian;
    bool fortran_order;
    int32_t rank;
    int64_t dims[TB_MAX_RANK];
    bool has_descr, has_order, has_shape;
} tb__npy_header;

typedef struct tb__npy_parser {
    const char *text;
    size_t len;
    size_t pos;
    const char *path;
} tb__npy_parser;

static void tb__npy_skip_space(tb__npy_parser *p) {
    while (p->pos < p->len && (p->text[p->pos] == ' ' || p->text[p->pos] == '\t' ||
                               p->text[p->pos] == '\n' || p->text[p->pos] == '\r'))
        p->pos++;
}

static bool tb__npy_accept(tb__npy_parser *p, char c) {
    tb__npy_skip_space(p);
    if (p->pos < p->len && p->text[p->pos] == c) {
        p->pos++;
        return true;
    }
    return false;
}

static tb_status tb__npy_bad(tb__npy_parser *p, const char *what) {
    return tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: malformed header at byte %u: %s", p->path,
                     (unsigned)p->pos, what);
}

/* A Python string literal in single or double quotes, without escapes (numpy writes none). */
static tb_status tb__npy_string(tb__npy_parser *p, char *out, size_t cap) {
    tb__npy_skip_space(p);
    if (p->pos >= p->len || (p->text[p->pos] != '\'' && p->text[p->pos] != '"'))
        return tb__npy_bad(p, "expected a quoted string");
    char quote = p->text[p->pos++];
    size_t n = 0;
    while (p->pos < p->len && p->text[p->pos] != quote) {
        if (p->text[p->pos] == '\\' || n + 1 >= cap) return tb__npy_bad(p, "unexpected string");
        out[n++] = p->text[p->pos++];
    }
    if (p->pos >= p->len) return tb__npy_bad(p, "unterminated string");
    p->pos++;
    out[n] = '\0';
    return TB_OK;
}

static tb_status tb__npy_descr(tb__npy_parser *p, tb__npy_header *h) {
    char descr[16];
    tb_status st = tb__npy_string(p, descr, sizeof descr);
    if (st != TB_OK) return st;
    static const struct {
        const char *code;
        tb_dtype dtype;
    } table[] = {{"f4", TB_F32}, {"f8", TB_F64}, {"i4", TB_I32},
                 {"i8", TB_I64}, {"u1", TB_U8},  {"b1", TB_BOOL}};
    char order = descr[0];
    if (order != '<' && order != '>' && order != '|' && order != '=')
        return tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: unsupported dtype '%s'", p->path, descr);
    for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i) {
        if (strcmp(descr + 1, table[i].code) == 0) {
            h->dtype = table[i].dtype;
            h->big_endian = order == '>' || (order == '=' && !tb__host_is_little_endian());
            h->has_descr = true;
            return TB_OK;
        }
    }
    return tb__error(TB_ERR_FORMAT,
                     "tb_npy_load: %s: unsupported dtype '%s' (supported: f4 f8 i4 i8 u1 b1)",
                     p->path, descr);
}

static tb_status tb__npy_shape(tb__npy_parser *p, tb__npy_header *h) {
    if (!tb__npy_accept(p, '(')) return tb__npy_bad(p, "expected '(' for the shape");
    h->rank = 0;
    for (;;) {
        if (tb__npy_accept(p, ')')) break;
        tb__npy_skip_space(p);
        if (p->pos >= p->len || p->text[p->pos] < '0' || p->text[p->pos] > '9')
            return tb__npy_bad(p, "expected a dimension");
        int64_t value = 0;
        while (p->pos < p->len && p->text[p->pos] >= '0' && p->text[p->pos] <= '9') {
            int64_t digit = p->text[p->pos++] - '0';
            if (!tb__muladd_i64(value, 10, digit, &value))
                return tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: a dimension overflows int64",
                                 p->path);
        }
        if (h->rank >= TB_MAX_RANK)
            return tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: more than %d dimensions", p->path,
                             TB_MAX_RANK);
        h->dims[h->rank++] = value;
        if (tb__npy_accept(p, ')')) break;
        if (!tb__npy_accept(p, ',')) return tb__npy_bad(p, "expected ',' or ')' in the shape");
    }
    h->has_shape = true;
    return TB_OK;
}

static tb_status tb__npy_parse_header(const char *text, size_t len, const char *path,
                                      tb__npy_header *h) {
    tb__npy_parser p;
    p.text = text;
    p.len = len;
    p.pos = 0;
    p.path = path;
    memset(h, 0, sizeof *h);
    if (!tb__npy_accept(&p, '{')) return tb__npy_bad(&p, "expected '{'");
    while (!tb__npy_accept(&p, '}')) {
        char key[32];
        tb_status st = tb__npy_string(&p, key, sizeof key);
        if (st != TB_OK) return st;
        if (!tb__npy_accept(&p, ':')) return tb__npy_bad(&p, "expected ':'");
        if (strcmp(key, "descr") == 0 && !h->has_descr) {
            st = tb__npy_descr(&p, h);
        } else if (strcmp(key, "fortran_order") == 0 && !h->has_order) {
            tb__npy_skip_space(&p);
            if (p.len - p.pos >= 4 && memcmp(p.text + p.pos, "True", 4) == 0) {
                h->fortran_order = true;
                p.pos += 4;
            } else if (p.len - p.pos >= 5 && memcmp(p.text + p.pos, "False", 5) == 0) {
                p.pos += 5;
            } else {
                return tb__npy_bad(&p, "fortran_order must be True or False");
            }
            h->has_order = true;
        } else if (strcmp(key, "shape") == 0 && !h->has_shape) {
            st = tb__npy_shape(&p, h);
        } else {
            return tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: unexpected or repeated key '%s'",
                             path, key);
        }
        if (st != TB_OK) return st;
        if (!tb__npy_accept(&p, ',')) {
            if (!tb__npy_accept(&p, '}')) return tb__npy_bad(&p, "expected ',' or '}'");
            break;
        }
    }
    if (!h->has_descr || !h->has_order || !h->has_shape)
        return tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: header lacks %s", path,
                         !h->has_descr   ? "'descr'"
                         : !h->has_order ? "'fortran_order'"
                                         : "'shape'");
    if (h->fortran_order)
        return tb__error(TB_ERR_FORMAT,
                         "tb_npy_load: %s: Fortran-order arrays are not supported; save it in C "
                         "order (numpy.ascontiguousarray)",
                         path);
    return TB_OK;
}

/* How many bytes the stream holds from its position on, through fseek and ftell (standard C,
   so no file descriptor is needed): false when that is unknown (a pipe; a file beyond what a
   long counts). The position is left where it was. */
static bool tb__stream_left(FILE *f, int64_t *left) {
    long here = ftell(f), end;
    if (here < 0 || fseek(f, 0, SEEK_END) != 0) return false;
    end = ftell(f);
    if (fseek(f, here, SEEK_SET) != 0 || end < here) return false;
    *left = (int64_t)end - (int64_t)here;
    return true;
}

#define TB__READ_CHUNK ((size_t)1 << 16)

/* Reads `size` bytes into a new buffer with one NUL byte after them, never allocating much more
   than the stream really holds: when `known`, `left` (the bytes the stream holds) is checked
   first; otherwise the buffer grows as the bytes arrive, doubling from 64 KiB. TB_ERR_FORMAT
   when the stream ends first (*got: the bytes that were there), TB_ERR_OUT_OF_MEMORY. The
   error message is the caller's to write; nothing is allocated on error. */
static tb_status tb__read_bounded(FILE *f, size_t size, bool known, int64_t left,
                                  unsigned char **out, size_t *got) {
    unsigned char *buf, *bigger;
    size_t have = 0, cap, n;
    *got = 0;
    if (known && (uint64_t)left < (uint64_t)size) {
        *got = (size_t)left;
        return TB_ERR_FORMAT;
    }
    if (size == SIZE_MAX) return TB_ERR_OUT_OF_MEMORY; /* no room for the NUL */
    cap = known || size < TB__READ_CHUNK ? size : TB__READ_CHUNK;
    buf = (unsigned char *)tb__alloc(cap + 1);
    if (buf == NULL) return TB_ERR_OUT_OF_MEMORY;
    while (have < size) {
        if (have == cap) {
            cap = cap > (size - cap) ? size : 2 * cap;
            bigger = (unsigned char *)tb__alloc(cap + 1);
            if (bigger == NULL) {
                tb__free(buf);
                return TB_ERR_OUT_OF_MEMORY;
            }
            memcpy(bigger, buf, have);
            tb__free(buf);
            buf = bigger;
        }
        n = fread(buf + have, 1, cap - have, f);
        have += n;
        if (n == 0) {
            tb__free(buf);
            *got = have;
            return TB_ERR_FORMAT;
        }
    }
    buf[size] = '\0';
    *out = buf;
    *got = size;
    return TB_OK;
}

#undef TB__READ_CHUNK

/* tb_npy_load on an open stream; `path` names it in messages. */
static tb_tensor *tb__npy_load_stream(FILE *f, const char *path, const tb_device *device) {
    tb_tensor *result = NULL;
    unsigned char *header_text = NULL, *data = NULL;
    unsigned char preamble[12];
    tb__npy_header h;
    tb_shape shape;
    size_t nbytes = 0, got = 0, preamble_len, header_len = 0;
    unsigned major;
    int64_t left = 0;
    bool known;
    tb_status st;
    if (fread(preamble, 1, 8, f) != 8 || memcmp(preamble, tb__npy_magic, TB__NPY_MAGIC_LEN)) {
        tb__error(TB_ERR_FORMAT, "tb_npy_load: %s is not a .npy file (bad magic)", path);
        return NULL;
    }
    major = preamble[6];
    if (major != 1 && major != 2 && major != 3) {
        tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: unsupported format version %u.%u", path, major,
                  (unsigned)preamble[7]);
        return NULL;
    }
    preamble_len = major == 1 ? 10 : 12;
    if (fread(preamble + 8, 1, preamble_len - 8, f) != preamble_len - 8) {
        tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: truncated header", path);
        return NULL;
    }
    header_len = (size_t)preamble[8] | ((size_t)preamble[9] << 8);
    if (major != 1) header_len |= ((size_t)preamble[10] << 16) | ((size_t)preamble[11] << 24);
    if (header_len > ((size_t)1 << 24)) {
        tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: header of %lu bytes is not plausible", path,
                  (unsigned long)header_len);
        return NULL;
    }
    known = tb__stream_left(f, &left);
    st = tb__read_bounded(f, header_len, known, left, &header_text, &got);
    if (st == TB_ERR_FORMAT) {
        tb__error(TB_ERR_FORMAT,
                  "tb_npy_load: %s: truncated header (%lu bytes promised, %lu in the file)", path,
                  (unsigned long)header_len, (unsigned long)got);
    }
    if (st != TB_OK) return NULL;
    if (known) left -= (int64_t)header_len;
    if (tb__npy_parse_header((const char *)header_text, header_len, path, &h) != TB_OK) goto done;
    if (tb_shape_make(&shape, h.dtype, h.rank, h.dims) != TB_OK ||
        tb_shape_nbytes(&shape, &nbytes) != TB_OK) {
        tb__error(TB_ERR_FORMAT, "tb_npy_load: %s: the shape in the header is too large (%s)", path,
                  tb_last_error());
        goto done;
    }
    /* What the header claims is checked against what the file holds before anything of that
       size is allocated. */
    if (known && (uint64_t)left > (uint64_t)nbytes) {
        tb__error(TB_ERR_FORMAT,
                  "tb_npy_load: %s: data continues past the %lu bytes the header describes (the "
                  "file holds %lld)",
                  path, (unsigned long)nbytes, (long long)left);
        goto done;
    }
    st = tb__read_bounded(f, nbytes, known, left, &data, &got);
    if (st == TB_ERR_FORMAT) {
        tb__error(TB_ERR_FORMAT,
                  "tb_npy_load: %s: truncated: the header promises %lu bytes of data, the file "
                  "holds %lu",
                  path, (unsigned long)nbytes, (unsigned long)got);
    }
    if (st != TB_OK) goto done;
    if (!known && fgetc(f) != EOF) {
        tb__error(TB_ERR_FORMAT,
                  "tb_npy_load: %s: data continues past the %lu bytes the header describes", path,
                  (unsigned long)nbytes);
        goto done;
    }
    if (h.big_endian == tb__host_is_little_endian() && tb_dtype_size(h.dtype) > 1)
        tb__swap_bytes(data, nbytes / tb_dtype_size(h.dtype), tb_dtype_size(h.dtype));
    if (h.dtype == TB_BOOL) {
        for (size_t i = 0; i < nbytes; ++i)
            data[i] = data[i] != 0;
    }
    result = tb_tensor_from_host(data, &shape, device);
done:
    tb__free(header_text);
    tb__free(data);
    return result;
}

TBDEF tb_tensor *tb_npy_load(const char *path, const tb_device *device) {
    tb_tensor *result;
    FILE *f;
    tb__ensure_setup();
    if (path == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_npy_load: path is NULL");
        return NULL;
    }
    f = fopen(path, "rb");
    if (f == NULL) {
        tb__error(errno == ENOENT ? TB_ERR_NOT_FOUND : TB_ERR_IO, "tb_npy_load: cannot open %s: %s",
                  path, strerror(errno));
        return NULL;
    }
    result = tb__npy_load_stream(f, path, device);
    fclose(f);
    return result;
}

/* numpy's header text, padded with spaces so the data starts on a 64-byte boundary. */
static char *tb__npy_header_text(const tb_shape *shape, size_t *len, unsigned *major) {
    static const char *const codes[TB_DTYPE_COUNT] = {"<f4", "<f8", "<i4", "<i8", "|u1", "|b1"};
    tb__str s;
    memset(&s, 0, sizeof s);
    tb__str_append(&s, "{'descr': '%s', 'fortran_order': False, 'shape': (", codes[shape->dtype]);
    for (int32_t i = 0; i < shape->rank; ++i)
        tb__str_append(&s, "%lld%s", (long long)shape->dims[i],
                       shape->rank == 1 ? "," : (i + 1 < shape->rank ? ", " : ""));
    tb__str_append(&s, "), }");
    if (s.failed) {
        tb__str_free(&s);
        return NULL;
    }
    size_t body = s.len + 1; /* + '\n' */
    *major = body + 10 > 65535 ? 2 : 1;
    size_t preamble = *major == 1 ? 10 : 12;
    size_t padded = (preamble + body + 63) / 64 * 64 - preamble;
    while (s.len + 1 < padded)
        tb__str_append(&s, " ");
    tb__str_append(&s, "\n");
    *len = s.len;
    return tb__str_take(&s);
}

TBDEF tb_status tb_npy_save(const char *path, tb_tensor *tensor) {
    tb__ensure_setup();
    if (path == NULL || tensor == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_npy_save: %s is NULL",
                         path == NULL ? "path" : "tensor");
    tb_shape shape = tb_tensor_shape(tensor);
    size_t nbytes = 0;
    tb_status st = tb_shape_nbytes(&shape, &nbytes);
    if (st != TB_OK) return st;
    void *data = tb__alloc(nbytes ? nbytes : 1);
    if (data == NULL) return TB_ERR_OUT_OF_MEMORY;
    st = tb_tensor_to_host(tensor, data, nbytes);
    if (st != TB_OK) {
        tb__free(data);
        return st;
    }
    if (!tb__host_is_little_endian() && tb_dtype_size(shape.dtype) > 1)
        tb__swap_bytes((unsigned char *)data, nbytes / tb_dtype_size(shape.dtype),
                       tb_dtype_size(shape.dtype));
    size_t header_len = 0;
    unsigned major = 1;
    char *header = tb__npy_header_text(&shape, &header_len, &major);
    char *tmp = tb__format("%s.tmp%lu", path, (unsigned long)tb__now_ns());
    if (header == NULL || tmp == NULL) {
        tb__free(data);
        tb__free(header);
        tb__free(tmp);
        return TB_ERR_OUT_OF_MEMORY;
    }
    unsigned char preamble[12];
    memcpy(preamble, tb__npy_magic, TB__NPY_MAGIC_LEN);
    preamble[6] = (unsigned char)major;
    preamble[7] = 0;
    size_t preamble_len = major == 1 ? 10 : 12;
    for (size_t i = 8; i < preamble_len; ++i)
        preamble[i] = (unsigned char)((header_len >> (8 * (i - 8))) & 0xff);
    /* errno is read at the call that failed (fclose and rename may change it on success, and a
       short write need not set it) */
    errno = 0;
    FILE *f = fopen(tmp, "wb");
    bool ok = f != NULL;
    int err = ok ? 0 : errno;
    if (ok) {
        ok = fwrite(preamble, 1, preamble_len, f) == preamble_len &&
             fwrite(header, 1, header_len, f) == header_len &&
             (nbytes == 0 || fwrite(data, 1, nbytes, f) == nbytes);
        if (!ok) err = errno;
        if (fclose(f) != 0 && ok) {
            ok = false;
            err = errno;
        }
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        st = tb__error(TB_ERR_IO, "tb_npy_save: cannot write %s: %s", path,
                       strerror(err != 0 ? err : EIO));
        remove(tmp);
    }
    tb__free(data);
    tb__free(header);
    tb__free(tmp);
    return st;
}

#undef TB__NPY_MAGIC_LEN

/* ===========================================================================================
   Interop: DLPack
   =========================================================================================== */

/* DLPack consumers compile against their own copy of the structs: the layout must match
   DLPack's, checked here where pointers are 8 bytes. */
typedef char
    tb__dl_layout_check[(sizeof(void *) != 8 ||
                         (sizeof(tb_dl_tensor) == 48 && offsetof(tb_dl_tensor, dtype) == 20 &&
                          offsetof(tb_dl_tensor, byte_offset) == 40 &&
                          sizeof(tb_dl_managed_tensor) == 64 &&
                          offsetof(tb_dl_managed_tensor_versioned, flags) == 24 &&
                          sizeof(tb_dl_managed_tensor_versioned) == 80))
                            ? 1
                            : -1];

static bool tb__dl_from_dtype(tb_dtype dtype, tb_dl_data_type *out) {
    static const uint8_t codes[TB_DTYPE_COUNT] = {TB_DL_FLOAT, TB_DL_FLOAT, TB_DL_INT,
                                                  TB_DL_INT,   TB_DL_UINT,  TB_DL_BOOL};
    if (!tb_dtype_is_valid(dtype)) return false;
    out->code = codes[dtype];
    out->bits = (uint8_t)(8 * tb_dtype_size(dtype));
    out->lanes = 1;
    return true;
}

static bool tb__dl_to_dtype(tb_dl_data_type type, tb_dtype *out) {
    int d;
    for (d = 0; d < (int)TB_DTYPE_COUNT; ++d) {
        tb_dl_data_type ours;
        tb__dl_from_dtype((tb_dtype)d, &ours);
        if (ours.code == type.code && ours.bits == type.bits) {
            *out = (tb_dtype)d;
            return true;
        }
    }
    return false;
}

static const char *tb__dl_device_type_name(int32_t type) {
    switch (type) {
    case TB_DL_CPU:
        return "CPU";
    case TB_DL_CUDA:
        return "CUDA";
    case TB_DL_CUDA_HOST:
        return "CUDAHost";
    case TB_DL_OPENCL:
        return "OpenCL";
    case TB_DL_VULKAN:
        return "Vulkan";
    case TB_DL_METAL:
        return "Metal";
    case TB_DL_VPI:
        return "VPI";
    case TB_DL_ROCM:
        return "ROCM";
    case TB_DL_ROCM_HOST:
        return "ROCMHost";
    case TB_DL_EXT_DEV:
        return "ExtDev";
    case TB_DL_CUDA_MANAGED:
        return "CUDAManaged";
    case TB_DL_ONEAPI:
        return "OneAPI";
    case TB_DL_WEBGPU:
        return "WebGPU";
    case TB_DL_HEXAGON:
        return "Hexagon";
    default:
        return "unknown";
    }
}

static const char *tb__dl_code_name(uint8_t code) {
    switch (code) {
    case TB_DL_INT:
        return "int";
    case TB_DL_UINT:
        return "uint";
    case TB_DL_FLOAT:
        return "float";
    case TB_DL_OPAQUE_HANDLE:
        return "opaque handle";
    case TB_DL_BFLOAT:
        return "bfloat";
    case TB_DL_COMPLEX:
        return "complex";
    case TB_DL_BOOL:
        return "bool";
    default:
        return "unknown";
    }
}

/* ---- export ---- */

/* One allocation per export: the managed struct handed out (one of the two), what keeps the
   buffer alive, and the shape and strides the struct points at. */
typedef struct tb__dl_export {
    tb_dl_managed_tensor managed;
    tb_dl_managed_tensor_versioned versioned;
    tb_backend_data *lent; /* the tensor's own buffer (a reference), or NULL */
    void *copy;            /* a host copy (owned), or NULL */
    int64_t shape[TB_MAX_RANK];
    int64_t strides[TB_MAX_RANK];
} tb__dl_export;

static void tb__dl_export_free(tb__dl_export *e) {
    tb__data_release(e->lent);
    tb__free(e->copy);
    tb__free(e);
}

static void tb__dl_export_deleter(tb_dl_managed_tensor *self) {
    if (self != NULL) tb__dl_export_free((tb__dl_export *)self->manager_ctx);
}

static void tb__dl_export_deleter_versioned(tb_dl_managed_tensor_versioned *self) {
    if (self != NULL) tb__dl_export_free((tb__dl_export *)self->manager_ctx);
}

/* Syncs the tensor and fills e->managed.dl_tensor (shared by both export forms). */
static tb_status tb__dl_export_begin(const char *fn, tb_tensor *tensor, tb__dl_export **out) {
    tb_shape shape;
    tb_dl_data_type type;
    tb_backend_data *data;
    tb__dl_export *e;
    tb_dl_tensor *dl;
    void *host;
    size_t nbytes = 0;
    tb_status st;
    tb__ensure_setup();
    if (tensor == NULL) {
        /* keep the first error of a chain of ops that ends here */
        if (tb_last_status() != TB_OK) return tb_last_status();
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: tensor is NULL", fn);
    }
    shape = tb_tensor_shape(tensor);
    if (!tb__dl_from_dtype(shape.dtype, &type))
        return tb__error(TB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)shape.dtype);
    st = tb_shape_nbytes(&shape, &nbytes);
    if (st != TB_OK) return st;
    data = tb_tensor_data(tensor);
    if (data == NULL) {
        st = tb_last_status();
        return st != TB_OK ? st : tb__error(TB_ERR_INTERNAL, "%s: the tensor has no value", fn);
    }
    e = (tb__dl_export *)tb__calloc(1, sizeof *e);
    if (e == NULL) return tb_last_status();
    host = tb__host_data(data);
    if (host != NULL) {
        tb__data_retain(data);
        e->lent = data;
    } else {
        e->copy = tb__alloc(nbytes ? nbytes : 1);
        st = e->copy != NULL ? tb_tensor_to_host(tensor, e->copy, nbytes) : tb_last_status();
        if (st != TB_OK) {
            tb__dl_export_free(e);
            return st;
        }
        host = e->copy;
    }
    tb_shape_strides(&shape, e->strides);
    memcpy(e->shape, shape.dims, sizeof e->shape);
    dl = &e->managed.dl_tensor;
    dl->data = host;
    dl->device.device_type = TB_DL_CPU;
    dl->device.device_id = 0;
    dl->ndim = shape.rank;
    dl->dtype = type;
    dl->shape = e->shape;
    dl->strides = e->strides;
    dl->byte_offset = 0;
    *out = e;
    return TB_OK;
}

TBDEF tb_status tb_dlpack_export(tb_tensor *tensor, tb_dl_managed_tensor **out) {
    tb__dl_export *e = NULL;
    tb_status st;
    if (out == NULL) {
        tb__ensure_setup();
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_dlpack_export: out is NULL");
    }
    st = tb__dl_export_begin("tb_dlpack_export", tensor, &e);
    if (st != TB_OK) return st;
    e->managed.manager_ctx = e;
    e->managed.deleter = tb__dl_export_deleter;
    *out = &e->managed;
    return TB_OK;
}

TBDEF tb_status tb_dlpack_export_versioned(tb_tensor *tensor,
                                           tb_dl_managed_tensor_versioned **out) {
    tb__dl_export *e = NULL;
    tb_status st;
    if (out == NULL) {
        tb__ensure_setup();
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_dlpack_export_versioned: out is NULL");
    }
    st = tb__dl_export_begin("tb_dlpack_export_versioned", tensor, &e);
    if (st != TB_OK) return st;
    e->versioned.version.major = TB_DLPACK_MAJOR_VERSION;
    e->versioned.version.minor = TB_DLPACK_MINOR_VERSION;
    e->versioned.manager_ctx = e;
    e->versioned.deleter = tb__dl_export_deleter_versioned;
    e->versioned.flags = e->lent != NULL ? TB_DLPACK_FLAG_READ_ONLY : TB_DLPACK_FLAG_IS_COPIED;
    e->versioned.dl_tensor = e->managed.dl_tensor;
    *out = &e->versioned;
    return TB_OK;
}

/* ---- import ---- */

static void tb__dl_call_deleter(void *context) {
    tb_dl_managed_tensor *managed = (tb_dl_managed_tensor *)context;
    if (managed->deleter != NULL) managed->deleter(managed);
}

static void tb__dl_call_deleter_versioned(void *context) {
    tb_dl_managed_tensor_versioned *managed = (tb_dl_managed_tensor_versioned *)context;
    if (managed->deleter != NULL) managed->deleter(managed);
}

/* Copies a strided array of `shape` into the contiguous `dst`. Its extent passed
   tb__dl_check_extent: every partial sum of the offsets lies inside it, so none overflows. */
static void tb__dl_gather(const tb_shape *shape, const unsigned char *base, const int64_t *strides,
                          unsigned char *dst) {
    size_t width = tb_dtype_size(shape->dtype);
    int64_t numel = tb__shape_numel(shape), index[TB_MAX_RANK], i;
    int32_t d;
    for (d = 0; d < shape->rank; ++d)
        index[d] = 0;
    for (i = 0; i < numel; ++i) {
        int64_t offset = 0;
        for (d = 0; d < shape->rank; ++d)
            offset += index[d] * strides[d];
        memcpy(dst + (size_t)i * width, base + (ptrdiff_t)offset * (ptrdiff_t)width, width);
        for (d = shape->rank - 1; d >= 0; --d) {
            if (++index[d] < shape->dims[d]) break;
            index[d] = 0;
        }
    }
}

/* Checks, before anything touches the data, that every element a DLPack tensor describes lies at
   a byte offset from `data` that fits in int64 (strides of any sign, byte_offset included) and
   that adding those offsets to the address does not wrap around. The producer vouches for the
   memory itself; what is checked here keeps the arithmetic on it defined. */
static tb_status tb__dl_check_extent(const char *fn, const tb_dl_tensor *dl, const tb_shape *shape,
                                     size_t width) {
    int64_t lo, hi, strides[TB_MAX_RANK];
    uintptr_t address = (uintptr_t)dl->data;
    int32_t d;
    if (dl->byte_offset > (uint64_t)INT64_MAX) {
        return tb__error(TB_ERR_OVERFLOW, "%s: byte_offset %llu does not fit in int64", fn,
                         (unsigned long long)dl->byte_offset);
    }
    lo = hi = (int64_t)dl->byte_offset;
    if (tb__shape_numel(shape) > 0) {
        if (dl->strides == NULL) {
            if (tb_shape_strides(shape, strides) != TB_OK) return tb_last_status();
        } else {
            memcpy(strides, dl->strides, (size_t)shape->rank * sizeof *strides);
        }
        for (d = 0; d < shape->rank; ++d) {
            int64_t span;
            if (shape->dims[d] == 1) continue; /* any stride: never multiplied by a nonzero index */
            if (!tb__mul_i64(shape->dims[d] - 1, strides[d], &span) ||
                !tb__mul_i64(span, (int64_t)width, &span)) {
                return tb__error(TB_ERR_OVERFLOW,
                                 "%s: stride %lld of dimension %d overflows (the byte offset of "
                                 "element %lld along it does not fit in int64)",
                                 fn, (long long)strides[d], (int)d,
                                 (long long)(shape->dims[d] - 1));
            }
            if (!tb__add_i64(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi)) {
                return tb__error(TB_ERR_OVERFLOW,
                                 "%s: the strides overflow: with stride %lld of dimension %d the "
                                 "byte offset of the %s element does not fit in int64",
                                 fn, (long long)strides[d], (int)d, span < 0 ? "first" : "last");
            }
        }
        if (!tb__add_i64(hi, (int64_t)width, &hi)) {
            return tb__error(TB_ERR_OVERFLOW,
                             "%s: the strides overflow: the end of the last element does not fit "
                             "in int64",
                             fn);
        }
    }
    /* The addresses data + lo .. data + hi, without wrapping around. */
    if ((lo < 0 && address < (uintptr_t)(0 - (uint64_t)lo)) ||
        (hi > 0 && (uint64_t)hi > (uint64_t)(UINTPTR_MAX - address))) {
        return tb__error(TB_ERR_OVERFLOW,
                         "%s: data %p with byte_offset %llu and these strides reaches bytes "
                         "%lld..%lld, outside the address space",
                         fn, dl->data, (unsigned long long)dl->byte_offset, (long long)lo,
                         (long long)hi);
    }
    return TB_OK;
}

/* The tensor of a DLPack tensor. `release(context)` runs the producer's deleter: once the last
   use of a borrowed buffer ends, or before returning after a copy; never on error. */
static tb_tensor *tb__dl_import(const char *fn, const tb_dl_tensor *dl, const tb_device *device,
                                void (*release)(void *context), void *context) {
    tb_shape shape;
    tb_dtype dtype;
    size_t nbytes = 0, width, i;
    const unsigned char *base;
    bool contiguous = true, in_place;
    tb_tensor *t;
    int64_t expected = 1;
    int32_t d;
    char text[96];
    if (dl->device.device_type != TB_DL_CPU) {
        tb__error(TB_ERR_UNSUPPORTED,
                  "%s: device type %d (%s) is not supported; only CPU (1) memory is imported", fn,
                  (int)dl->device.device_type, tb__dl_device_type_name(dl->device.device_type));
        return NULL;
    }
    if (dl->dtype.lanes != 1) {
        tb__error(TB_ERR_DTYPE, "%s: dtype with %u lanes is not supported (lanes must be 1)", fn,
                  (unsigned)dl->dtype.lanes);
        return NULL;
    }
    if (!tb__dl_to_dtype(dl->dtype, &dtype)) {
        tb__error(TB_ERR_DTYPE,
                  "%s: dtype code %u (%s) with %u bits is not supported (supported: float 32 "
                  "and 64, int 32 and 64, uint 8, bool 8)",
                  fn, (unsigned)dl->dtype.code, tb__dl_code_name(dl->dtype.code),
                  (unsigned)dl->dtype.bits);
        return NULL;
    }
    if (dl->ndim < 0 || dl->ndim > TB_MAX_RANK) {
        tb__error(TB_ERR_SHAPE, "%s: ndim %d is outside 0..%d", fn, (int)dl->ndim, TB_MAX_RANK);
        return NULL;
    }
    if (dl->ndim > 0 && dl->shape == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: shape is NULL for ndim %d", fn, (int)dl->ndim);
        return NULL;
    }
    for (d = 0; d < dl->ndim; ++d) {
        if (dl->shape[d] < 0) {
            tb__error(TB_ERR_SHAPE, "%s: dimension %d is %lld", fn, (int)d,
                      (long long)dl->shape[d]);
            return NULL;
        }
    }
    if (tb_shape_make(&shape, dtype, dl->ndim, dl->shape) != TB_OK ||
        tb_shape_nbytes(&shape, &nbytes) != TB_OK) {
        tb__error(TB_ERR_OVERFLOW, "%s: the tensor's size overflows (ndim %d)", fn, (int)dl->ndim);
        return NULL;
    }
    if (nbytes > 0 && dl->data == NULL) {
        tb__shape_text(&shape, text);
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: data is NULL for %s", fn, text);
        return NULL;
    }
    width = tb_dtype_size(dtype);
    if (tb__dl_check_extent(fn, dl, &shape, width) != TB_OK) return NULL;
    base = (const unsigned char *)dl->data;
    if (base != NULL) base += (size_t)dl->byte_offset; /* checked: no wrap */
    /* Dims of size 1 may have any stride (PyTorch exports such); empty arrays are contiguous. */
    if (dl->strides != NULL && nbytes > 0) {
        for (d = shape.rank - 1; d >= 0; --d) {
            if (shape.dims[d] != 1 && dl->strides[d] != expected) contiguous = false;
            expected *= shape.dims[d]; /* fits: the size rule of shapes */
        }
    }
    in_place = contiguous && ((uintptr_t)base % width) == 0;
    /* The library's bool tensors hold 0 or 1 per byte: other bytes need the copy's fix-up. */
    for (i = 0; in_place && dtype == TB_BOOL && i < nbytes; ++i)
        in_place = base[i] <= 1;
    if (in_place) {
        t = tb_tensor_from_host_borrowed(base, &shape, device);
        if (t == NULL) return NULL;
        /* Not a cpu device: the tensor holds a copy and the producer's buffer is free now. */
        if (nbytes == 0 || !tb__data_set_host_release(tb_tensor_data(t), base, release, context))
            release(context);
        return t;
    } else {
        unsigned char *copy = (unsigned char *)tb__alloc(nbytes ? nbytes : 1);
        if (copy == NULL) return NULL;
        if (contiguous)
            memcpy(copy, base, nbytes);
        else
            tb__dl_gather(&shape, base, dl->strides, copy);
        if (dtype == TB_BOOL)
            for (i = 0; i < nbytes; ++i)
                copy[i] = copy[i] != 0;
        t = tb_tensor_from_host(copy, &shape, device);
        tb__free(copy);
        if (t == NULL) return NULL;
        release(context);
        return t;
    }
}

TBDEF tb_tensor *tb_dlpack_import(tb_dl_managed_tensor *managed, const tb_device *device) {
    tb__ensure_setup();
    if (managed == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_dlpack_import: managed is NULL");
        return NULL;
    }
    return tb__dl_import("tb_dlpack_import", &managed->dl_tensor, device, tb__dl_call_deleter,
                         managed);
}

TBDEF tb_tensor *tb_dlpack_import_versioned(tb_dl_managed_tensor_versioned *managed,
                                            const tb_device *device) {
    tb__ensure_setup();
    if (managed == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_dlpack_import_versioned: managed is NULL");
        return NULL;
    }
    if (managed->version.major != TB_DLPACK_MAJOR_VERSION) {
        tb__error(TB_ERR_UNSUPPORTED,
                  "tb_dlpack_import_versioned: DLPack major version %u is not supported (this "
                  "library reads version %d)",
                  (unsigned)managed->version.major, TB_DLPACK_MAJOR_VERSION);
        return NULL;
    }
    return tb__dl_import("tb_dlpack_import_versioned", &managed->dl_tensor, device,
                         tb__dl_call_deleter_versioned, managed);
}

/* ---- src/files.c ---- */
/* ===========================================================================================
   Model files: tensor sets, safetensors and .npz
   =========================================================================================== */

#if !defined(_WIN32)
#include <sys/mman.h>
#endif

/* ---- tensor sets ---- */

typedef struct tb__set_entry {
    char *name;
    tb_tensor *tensor; /* one reference */
} tb__set_entry;

typedef struct tb__meta_entry {
    char *key;
    char *value;
} tb__meta_entry;

struct tb_tensor_set {
    tb__set_entry *entries;
    size_t count, cap;
    size_t *slots;     /* open addressing on the names: entry index + 1, 0 = empty */
    size_t slot_count; /* a power of two above twice the count; 0 before the first add */
    tb__meta_entry *meta;
    size_t meta_count, meta_cap;
};

#define TB__SET_NONE ((size_t)-1)

static size_t tb__set_slot_of(const char *name, size_t slot_count) {
    return (size_t)tb__hash_bytes(0x7e5e7, name, strlen(name)) & (slot_count - 1);
}

static size_t tb__set_find(const tb_tensor_set *set, const char *name) {
    size_t i;
    if (set->slot_count == 0) return TB__SET_NONE;
    for (i = tb__set_slot_of(name, set->slot_count); set->slots[i] != 0;
         i = (i + 1) & (set->slot_count - 1)) {
        if (strcmp(set->entries[set->slots[i] - 1].name, name) == 0) return set->slots[i] - 1;
    }
    return TB__SET_NONE;
}

/* Makes room in the index for `need` names (rebuilding it larger when needed). */
static tb_status tb__set_reserve_index(tb_tensor_set *set, size_t need) {
    size_t count = set->slot_count ? set->slot_count : 16, i, *slots;
    if (need <= set->slot_count / 2) return TB_OK;
    while (count / 2 < need)
        count *= 2;
    slots = (size_t *)tb__calloc(count, sizeof *slots);
    if (slots == NULL) return tb_last_status();
    for (i = 0; i < set->count; ++i) {
        size_t s = tb__set_slot_of(set->entries[i].name, count);
        while (slots[s] != 0)
            s = (s + 1) & (count - 1);
        slots[s] = i + 1;
    }
    tb__free(set->slots);
    set->slots = slots;
    set->slot_count = count;
    return TB_OK;
}

/* The length of `name` if it is a valid name (1..TB_TENSOR_SET_MAX_NAME bytes), else 0. */
static size_t tb__set_name_length(const char *name) {
    size_t n = 0;
    while (n <= TB_TENSOR_SET_MAX_NAME && name[n] != '\0')
        ++n;
    return n <= TB_TENSOR_SET_MAX_NAME ? n : 0;
}

/* Appends `tensor` under `name`, taking over the caller's reference (released on error). */
static tb_status tb__set_add_owned(const char *fn, tb_tensor_set *set, const char *name,
                                   tb_tensor *tensor) {
    char *copy;
    tb_status st;
    if (tb__set_name_length(name) == 0) {
        tb_tensor_release(tensor);
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: a tensor name must be 1 to %d bytes", fn,
                         TB_TENSOR_SET_MAX_NAME);
    }
    if (tb__set_find(set, name) != TB__SET_NONE) {
        tb_tensor_release(tensor);
        return tb__error(TB_ERR_DUPLICATE, "%s: the set already has a tensor named '%s'", fn, name);
    }
    st = tb__grow((void **)&set->entries, &set->cap, set->count + 1, sizeof *set->entries);
    if (st == TB_OK) st = tb__set_reserve_index(set, set->count + 1);
    copy = st == TB_OK ? tb__strdup(name) : NULL;
    if (copy == NULL) {
        tb_tensor_release(tensor);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
    }
    set->entries[set->count].name = copy;
    set->entries[set->count].tensor = tensor;
    {
        size_t s = tb__set_slot_of(copy, set->slot_count);
        while (set->slots[s] != 0)
            s = (s + 1) & (set->slot_count - 1);
        set->slots[s] = set->count + 1;
    }
    set->count++;
    return TB_OK;
}

TBDEF tb_tensor_set *tb_tensor_set_new(void) {
    tb__ensure_setup();
    return (tb_tensor_set *)tb__calloc(1, sizeof(tb_tensor_set));
}

TBDEF void tb_tensor_set_free(tb_tensor_set *set) {
    size_t i;
    if (set == NULL) return;
    for (i = 0; i < set->count; ++i) {
        tb_tensor_release(set->entries[i].tensor);
        tb__free(set->entries[i].name);
    }
    for (i = 0; i < set->meta_count; ++i) {
        tb__free(set->meta[i].key);
        tb__free(set->meta[i].value);
    }
    tb__free(set->entries);
    tb__free(set->slots);
    tb__free(set->meta);
    tb__free(set);
}

TBDEF tb_status tb_tensor_set_add(tb_tensor_set *set, const char *name, tb_tensor *tensor) {
    tb__ensure_setup();
    if (set == NULL || name == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_add: %s is NULL",
                         set == NULL ? "set" : "name");
    if (tensor == NULL) {
        if (tb_last_status() != TB_OK) return tb_last_status();
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_add: tensor is NULL");
    }
    return tb__set_add_owned("tb_tensor_set_add", set, name, tb_tensor_retain(tensor));
}

TBDEF size_t tb_tensor_set_count(const tb_tensor_set *set) {
    return set != NULL ? set->count : 0;
}

static bool tb__set_index_ok(const char *fn, const tb_tensor_set *set, size_t index) {
    tb__ensure_setup();
    if (set == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: set is NULL", fn);
        return false;
    }
    if (index >= set->count) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: index %lu is past the set's %lu tensors", fn,
                  (unsigned long)index, (unsigned long)set->count);
        return false;
    }
    return true;
}

TBDEF const char *tb_tensor_set_name(const tb_tensor_set *set, size_t index) {
    return tb__set_index_ok("tb_tensor_set_name", set, index) ? set->entries[index].name : NULL;
}

TBDEF tb_tensor *tb_tensor_set_tensor(const tb_tensor_set *set, size_t index) {
    return tb__set_index_ok("tb_tensor_set_tensor", set, index) ? set->entries[index].tensor : NULL;
}

TBDEF tb_tensor *tb_tensor_set_get(const tb_tensor_set *set, const char *name) {
    size_t i;
    tb__str known;
    tb__ensure_setup();
    if (set == NULL || name == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_get: %s is NULL",
                  set == NULL ? "set" : "name");
        return NULL;
    }
    i = tb__set_find(set, name);
    if (i != TB__SET_NONE) return set->entries[i].tensor;
    memset(&known, 0, sizeof known);
    for (i = 0; i < set->count && i < 8; ++i)
        tb__str_append(&known, "%s'%.64s'", i ? ", " : "", set->entries[i].name);
    if (set->count > 8) tb__str_append(&known, ", ...");
    tb__error(TB_ERR_NOT_FOUND, "tb_tensor_set_get: no tensor named '%.200s' (the set has %lu%s%s)",
              name, (unsigned long)set->count, set->count ? ": " : "",
              known.data != NULL && !known.failed ? known.data : "");
    tb__str_free(&known);
    return NULL;
}

static size_t tb__set_meta_find(const tb_tensor_set *set, const char *key) {
    size_t i;
    for (i = 0; i < set->meta_count; ++i)
        if (strcmp(set->meta[i].key, key) == 0) return i;
    return TB__SET_NONE;
}

TBDEF tb_status tb_tensor_set_set_metadata(tb_tensor_set *set, const char *key, const char *value) {
    size_t i;
    char *k = NULL, *v;
    tb__ensure_setup();
    if (set == NULL || key == NULL || value == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_set_metadata: %s is NULL",
                         set == NULL   ? "set"
                         : key == NULL ? "key"
                                       : "value");
    if (tb__set_name_length(key) == 0)
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_tensor_set_set_metadata: a key must be 1 to %d bytes",
                         TB_TENSOR_SET_MAX_NAME);
    i = tb__set_meta_find(set, key);
    v = tb__strdup(value);
    if (v == NULL) return tb_last_status();
    if (i != TB__SET_NONE) {
        tb__free(set->meta[i].value);
        set->meta[i].value = v;
        return TB_OK;
    }
    if (tb__grow((void **)&set->meta, &set->meta_cap, set->meta_count + 1, sizeof *set->meta) !=
            TB_OK ||
        (k = tb__strdup(key)) == NULL) {
        tb__free(v);
        return tb_last_status();
    }
    set->meta[set->meta_count].key = k;
    set->meta[set->meta_count].value = v;
    set->meta_count++;
    return TB_OK;
}

TBDEF const char *tb_tensor_set_metadata(const tb_tensor_set *set, const char *key) {
    size_t i;
    tb__ensure_setup();
    if (set == NULL || key == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_metadata: %s is NULL",
                  set == NULL ? "set" : "key");
        return NULL;
    }
    i = tb__set_meta_find(set, key);
    if (i == TB__SET_NONE) {
        tb__error(TB_ERR_NOT_FOUND, "tb_tensor_set_metadata: no metadata key '%.200s'", key);
        return NULL;
    }
    return set->meta[i].value;
}

TBDEF size_t tb_tensor_set_metadata_count(const tb_tensor_set *set) {
    return set != NULL ? set->meta_count : 0;
}

TBDEF const char *tb_tensor_set_metadata_key(const tb_tensor_set *set, size_t index) {
    tb__ensure_setup();
    if (set == NULL || index >= set->meta_count) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_metadata_key: %s",
                  set == NULL ? "set is NULL" : "index is past the end");
        return NULL;
    }
    return set->meta[index].key;
}

/* Syncs the set's pending tensors, one graph per device (so that a model's tensors computed
   together compile once). */
static tb_status tb__set_sync(const tb_tensor_set *set) {
    tb_tensor **group;
    size_t i, j, n;
    tb_status st = TB_OK;
    if (set->count == 0) return TB_OK;
    group = (tb_tensor **)tb__calloc(set->count, sizeof *group);
    if (group == NULL) return tb_last_status();
    for (i = 0; i < set->count && st == TB_OK; ++i) {
        tb_device dev = tb_tensor_device(set->entries[i].tensor);
        bool first = true;
        if (tb_tensor_node(set->entries[i].tensor) == NULL) continue;
        for (j = 0; j < i && first; ++j) { /* this device was synced with an earlier tensor */
            tb_device other = tb_tensor_device(set->entries[j].tensor);
            if (tb_device_equal(&dev, &other)) first = false;
        }
        if (!first) continue;
        for (n = 0, j = i; j < set->count; ++j) {
            tb_device other = tb_tensor_device(set->entries[j].tensor);
            if (tb_device_equal(&dev, &other)) group[n++] = set->entries[j].tensor;
        }
        st = tb_sync(group, n);
    }
    tb__free(group);
    return st;
}

/* ---- a file's bytes, shared by the tensors that use them in place ---- */

typedef struct tb__blob {
    int32_t refcount;
    unsigned char *data;
    size_t size;
    bool mapped; /* munmap, else tb__free */
} tb__blob;

static void tb__blob_release(void *context) {
    tb__blob *b = (tb__blob *)context;
    if (b == NULL || TB__ATOMIC_ADD(&b->refcount, -1) != 0) return;
#if !defined(_WIN32)
    if (b->mapped) {
        munmap(b->data, b->size);
        b->data = NULL;
    }
#endif
    tb__free(b->data);
    tb__free(b);
}

/* A blob owning `data` (from tb__alloc; freed here on error). */
static tb__blob *tb__blob_owning(unsigned char *data, size_t size) {
    tb__blob *b = (tb__blob *)tb__calloc(1, sizeof *b);
    if (b == NULL) {
        tb__free(data);
        return NULL;
    }
    b->refcount = 1;
    b->data = data;
    b->size = size;
    return b;
}

/* The whole file: memory-mapped where the system allows, else read into memory. */
static tb_status tb__blob_open(const char *fn, const char *path, tb__blob **out) {
    unsigned char *data = NULL;
    size_t size = 0;
#if !defined(_WIN32)
    struct stat st;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return tb__error(errno == ENOENT ? TB_ERR_NOT_FOUND : TB_ERR_IO, "%s: cannot open %s: %s",
                         fn, path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 ||
        (uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        int e = errno;
        close(fd);
        return tb__error(TB_ERR_IO, "%s: %s is not a regular file that can be read%s%s", fn, path,
                         e ? ": " : "", e ? strerror(e) : "");
    }
    size = (size_t)st.st_size;
    if (size > 0) {
        void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map != MAP_FAILED) {
            tb__blob *b;
            close(fd);
            b = (tb__blob *)tb__calloc(1, sizeof *b);
            if (b == NULL) {
                munmap(map, size);
                return tb_last_status();
            }
            b->refcount = 1;
            b->data = (unsigned char *)map;
            b->size = size;
            b->mapped = true;
            *out = b;
            return TB_OK;
        }
        data = (unsigned char *)tb__alloc(size);
        if (data == NULL) {
            close(fd);
            return tb_last_status();
        }
        {
            size_t got = 0;
            while (got < size) {
                ssize_t n = read(fd, data + got, size - got);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) {
                    int e = n < 0 ? errno : 0;
                    close(fd);
                    tb__free(data);
                    return tb__error(TB_ERR_IO, "%s: cannot read %s: %s", fn, path,
                                     e ? strerror(e) : "the file shrank while being read");
                }
                got += (size_t)n;
            }
        }
    }
    close(fd);
#else
    FILE *f = fopen(path, "rb");
    long end;
    if (f == NULL)
        return tb__error(errno == ENOENT ? TB_ERR_NOT_FOUND : TB_ERR_IO, "%s: cannot open %s: %s",
                         fn, path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (end = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return tb__error(TB_ERR_IO, "%s: cannot read %s", fn, path);
    }
    size = (size_t)end;
    if (size > 0) {
        data = (unsigned char *)tb__alloc(size);
        if (data == NULL || fread(data, 1, size, f) != size) {
            fclose(f);
            tb__free(data);
            return data == NULL ? tb_last_status()
                                : tb__error(TB_ERR_IO, "%s: cannot read %s", fn, path);
        }
    }
    fclose(f);
#endif
    *out = tb__blob_owning(data, size);
    return *out != NULL ? TB_OK : tb_last_status();
}

/* A tensor of `shape` whose elements are the bytes at `bytes` inside `blob`, little-endian
   unless `big_endian`. On a device that shares host memory it uses them in place when they are
   aligned for the dtype, in the host's byte order and (for bool) all 0 or 1; the tensor's
   buffer then holds a reference to the blob. Otherwise the tensor gets a converted copy. */
static tb_tensor *tb__blob_tensor(tb__blob *blob, const unsigned char *bytes, const tb_shape *shape,
                                  bool big_endian, const tb_device *device) {
    size_t nbytes = 0, width = tb_dtype_size(shape->dtype), i;
    bool in_place;
    unsigned char *copy;
    tb_tensor *t;
    if (tb_shape_nbytes(shape, &nbytes) != TB_OK) return NULL;
    if (nbytes == 0) return tb_tensor_from_host(NULL, shape, device);
    in_place =
        (uintptr_t)bytes % width == 0 && (width == 1 || big_endian != tb__host_is_little_endian());
    for (i = 0; in_place && shape->dtype == TB_BOOL && i < nbytes; ++i)
        in_place = bytes[i] <= 1;
    if (in_place) {
        t = tb_tensor_from_host_borrowed(bytes, shape, device);
        if (t == NULL) return NULL;
        TB__ATOMIC_ADD(&blob->refcount, 1);
        /* a device that copied: the blob is not needed by this tensor */
        if (!tb__data_set_host_release(tb_tensor_data(t), bytes, tb__blob_release, blob))
            tb__blob_release(blob);
        return t;
    }
    if ((width == 1 || big_endian != tb__host_is_little_endian()) && shape->dtype != TB_BOOL)
        return tb_tensor_from_host(bytes, shape, device); /* only misaligned: one copy */
    copy = (unsigned char *)tb__alloc(nbytes);
    if (copy == NULL) return NULL;
    memcpy(copy, bytes, nbytes);
    if (width > 1 && big_endian == tb__host_is_little_endian())
        tb__swap_bytes(copy, nbytes / width, width);
    if (shape->dtype == TB_BOOL)
        for (i = 0; i < nbytes; ++i)
            copy[i] = copy[i] != 0;
    t = tb_tensor_from_host(copy, shape, device);
    tb__free(copy);
    return t;
}

static uint16_t tb__le16(const unsigned char *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t tb__le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t tb__le64(const unsigned char *p) {
    return (uint64_t)tb__le32(p) | ((uint64_t)tb__le32(p + 4) << 32);
}

/* Whether `n` bytes are well-formed UTF-8 (no overlong forms, surrogates or values past
   U+10FFFF). */
static bool tb__utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len, k;
        uint32_t cp;
        if (c < 0x80) {
            ++i;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (n - i < len) return false;
        for (k = 1; k < len; ++k) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += len;
    }
    return true;
}

/* Writes a file through a temporary one and a rename. */
typedef struct tb__out_file {
    FILE *f;
    char *tmp;
    const char *path;
    uint64_t written;
    bool failed;
} tb__out_file;

static tb_status tb__out_open(const char *fn, const char *path, tb__out_file *o) {
    memset(o, 0, sizeof *o);
    o->path = path;
    o->tmp = tb__format("%s.tmp%lu", path, (unsigned long)tb__now_ns());
    if (o->tmp == NULL) return tb_last_status();
    o->f = fopen(o->tmp, "wb");
    if (o->f == NULL) {
        tb_status st = tb__error(TB_ERR_IO, "%s: cannot write %s: %s", fn, o->tmp, strerror(errno));
        tb__free(o->tmp);
        o->tmp = NULL;
        return st;
    }
    return TB_OK;
}

static void tb__out_write(tb__out_file *o, const void *data, size_t size) {
    if (o->failed || size == 0) return;
    if (fwrite(data, 1, size, o->f) != size)
        o->failed = true;
    else
        o->written += size;
}

/* Closes the file and renames it into place when `ok` and every write worked; removes it
   otherwise. Returns the error of a failed write. */
static tb_status tb__out_close(const char *fn, tb__out_file *o, bool ok) {
    tb_status st = TB_OK;
    int saved = 0;
    if (o->f != NULL) {
        if (fclose(o->f) != 0) o->failed = true;
        o->f = NULL;
    }
    if (ok && o->failed) saved = errno;
    if (ok && !o->failed && rename(o->tmp, o->path) != 0) {
        saved = errno;
        o->failed = true;
    }
    if (ok && o->failed)
        st = tb__error(TB_ERR_IO, "%s: cannot write %s: %s", fn, o->path,
                       saved ? strerror(saved) : "write failed");
    if (!ok || o->failed) remove(o->tmp);
    tb__free(o->tmp);
    o->tmp = NULL;
    return st;
}

/* The value of a synced tensor as contiguous host bytes, little-endian: the tensor's own buffer
   on the cpu backend (and a little-endian host), else a copy in *copy that the caller frees. */
static tb_status tb__tensor_le_bytes(tb_tensor *t, const unsigned char **bytes, size_t *nbytes,
                                     unsigned char **copy) {
    tb_shape shape = tb_tensor_shape(t);
    tb_backend_data *data;
    void *host;
    tb_status st = tb_shape_nbytes(&shape, nbytes);
    size_t width = tb_dtype_size(shape.dtype);
    *copy = NULL;
    if (st != TB_OK) return st;
    data = tb_tensor_data(t);
    if (data == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    host = tb__host_data(data);
    if (host != NULL && (width == 1 || tb__host_is_little_endian())) {
        *bytes = (const unsigned char *)host;
        return TB_OK;
    }
    *copy = (unsigned char *)tb__alloc(*nbytes ? *nbytes : 1);
    if (*copy == NULL) return tb_last_status();
    st = tb_tensor_to_host(t, *copy, *nbytes);
    if (st != TB_OK) {
        tb__free(*copy);
        *copy = NULL;
        return st;
    }
    if (width > 1 && !tb__host_is_little_endian()) tb__swap_bytes(*copy, *nbytes / width, width);
    *bytes = *copy;
    return TB_OK;
}

/* ---- safetensors ---- */

#define TB__ST_MAX_HEADER  100000000u /* the reference implementation's limit, in bytes */
#define TB__JSON_MAX_DEPTH 64

/* A JSON text (the safetensors header) being read; errors name the byte in the file. */
typedef struct tb__json {
    const char *text;
    size_t len;
    size_t pos;
    const char *fn;
    const char *path;
} tb__json;

static tb_status tb__json_fail(const tb__json *j, const char *what) {
    return tb__error(TB_ERR_FORMAT, "%s: %s: bad JSON header at byte %lu: %s", j->fn, j->path,
                     (unsigned long)(8 + j->pos), what);
}

static void tb__json_space(tb__json *j) {
    while (j->pos < j->len && (j->text[j->pos] == ' ' || j->text[j->pos] == '\t' ||
                               j->text[j->pos] == '\n' || j->text[j->pos] == '\r'))
        j->pos++;
}

static bool tb__json_accept(tb__json *j, char c) {
    tb__json_space(j);
    if (j->pos < j->len && j->text[j->pos] == c) {
        j->pos++;
        return true;
    }
    return false;
}

static int tb__json_hex4(const char *s) {
    int v = 0, i;
    for (i = 0; i < 4; ++i) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* A string, decoded into a new allocation *out (its length in *out_len; it may hold NUL bytes
   from \u0000), or only checked when out is NULL. The text was checked to be UTF-8. */
static tb_status tb__json_string(tb__json *j, char **out, size_t *out_len) {
    size_t end, n = 0;
    char *buf = NULL;
    tb__json_space(j);
    if (j->pos >= j->len || j->text[j->pos] != '"') return tb__json_fail(j, "expected a string");
    end = ++j->pos;
    while (end < j->len && j->text[end] != '"')
        end += j->text[end] == '\\' ? 2 : 1;
    if (end >= j->len) return tb__json_fail(j, "unterminated string");
    if (out != NULL) {
        buf = (char *)tb__alloc(end - j->pos + 1); /* decoding never lengthens the text */
        if (buf == NULL) return tb_last_status();
    }
    while (j->pos < end) {
        unsigned char c = (unsigned char)j->text[j->pos];
        uint32_t cp;
        if (c < 0x20) {
            tb__free(buf);
            return tb__json_fail(j, "control character in a string");
        }
        if (c != '\\') {
            if (buf != NULL) buf[n] = (char)c;
            n++;
            j->pos++;
            continue;
        }
        c = (unsigned char)j->text[++j->pos]; /* before `end`: the scan skipped escapes */
        switch (c) {
        case '"':
        case '\\':
        case '/':
            cp = c;
            break;
        case 'b':
            cp = 8;
            break;
        case 'f':
            cp = 12;
            break;
        case 'n':
            cp = 10;
            break;
        case 'r':
            cp = 13;
            break;
        case 't':
            cp = 9;
            break;
        case 'u': {
            int hi = j->pos + 4 < end ? tb__json_hex4(j->text + j->pos + 1) : -1;
            if (hi < 0) {
                tb__free(buf);
                return tb__json_fail(j, "\\u needs four hex digits");
            }
            cp = (uint32_t)hi;
            j->pos += 4;
            if (cp >= 0xdc00 && cp <= 0xdfff) {
                tb__free(buf);
                return tb__json_fail(j, "lone low surrogate");
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                int lo =
                    j->pos + 6 < end && j->text[j->pos + 1] == '\\' && j->text[j->pos + 2] == 'u'
                        ? tb__json_hex4(j->text + j->pos + 3)
                        : -1;
                if (lo < 0xdc00 || lo > 0xdfff) {
                    tb__free(buf);
                    return tb__json_fail(j, "high surrogate without a low one");
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
                j->pos += 6;
            }
            break;
        }
        default:
            tb__free(buf);
            return tb__json_fail(j, "bad escape in a string");
        }
        j->pos++;
        if (buf != NULL) { /* UTF-8 of cp: never longer than its escape */
            if (cp < 0x80) {
                buf[n] = (char)cp;
            } else if (cp < 0x800) {
                buf[n] = (char)(0xc0 | (cp >> 6));
                buf[++n] = (char)(0x80 | (cp & 0x3f));
            } else if (cp < 0x10000) {
                buf[n] = (char)(0xe0 | (cp >> 12));
                buf[++n] = (char)(0x80 | ((cp >> 6) & 0x3f));
                buf[++n] = (char)(0x80 | (cp & 0x3f));
            } else {
                buf[n] = (char)(0xf0 | (cp >> 18));
                buf[++n] = (char)(0x80 | ((cp >> 12) & 0x3f));
                buf[++n] = (char)(0x80 | ((cp >> 6) & 0x3f));
                buf[++n] = (char)(0x80 | (cp & 0x3f));
            }
        } else {
            n += cp < 0x80 ? 0 : cp < 0x800 ? 1 : cp < 0x10000 ? 2 : 3;
        }
        n++;
    }
    j->pos = end + 1;
    if (buf != NULL) {
        buf[n] = '\0';
        *out = buf;
    }
    if (out_len != NULL) *out_len = n;
    return TB_OK;
}

/* A non-negative integer up to INT64_MAX, without fraction or exponent. */
static tb_status tb__json_uint(tb__json *j, uint64_t *out) {
    uint64_t v = 0;
    size_t start;
    tb__json_space(j);
    start = j->pos;
    if (j->pos < j->len && j->text[j->pos] == '-') return tb__json_fail(j, "negative number");
    while (j->pos < j->len && j->text[j->pos] >= '0' && j->text[j->pos] <= '9') {
        unsigned d = (unsigned)(j->text[j->pos] - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10) return tb__json_fail(j, "number too large");
        v = v * 10 + d;
        j->pos++;
    }
    if (j->pos == start) return tb__json_fail(j, "expected a non-negative integer");
    if (j->pos - start > 1 && j->text[start] == '0') return tb__json_fail(j, "leading zero");
    if (j->pos < j->len &&
        (j->text[j->pos] == '.' || j->text[j->pos] == 'e' || j->text[j->pos] == 'E'))
        return tb__json_fail(j, "expected an integer, not a fraction");
    *out = v;
    return TB_OK;
}

/* Checks and skips any JSON value; `depth` counts the containers around it (a container may
   be opened while fewer than TB__JSON_MAX_DEPTH are open). */
static tb_status tb__json_skip(tb__json *j, int depth) {
    tb_status st;
    char c;
    tb__json_space(j);
    if (j->pos >= j->len) return tb__json_fail(j, "expected a value");
    c = j->text[j->pos];
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        if (depth >= TB__JSON_MAX_DEPTH) return tb__json_fail(j, "nested deeper than 64 levels");
        j->pos++;
        if (tb__json_accept(j, close)) return TB_OK;
        for (;;) {
            if (c == '{') {
                st = tb__json_string(j, NULL, NULL);
                if (st != TB_OK) return st;
                if (!tb__json_accept(j, ':')) return tb__json_fail(j, "expected ':'");
            }
            st = tb__json_skip(j, depth + 1);
            if (st != TB_OK) return st;
            if (tb__json_accept(j, close)) return TB_OK;
            if (!tb__json_accept(j, ','))
                return tb__json_fail(j, "expected ',' or a closing bracket");
        }
    }
    if (c == '"') return tb__json_string(j, NULL, NULL);
    if (c == 't' || c == 'f' || c == 'n') {
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t n = strlen(word);
        if (j->len - j->pos < n || memcmp(j->text + j->pos, word, n) != 0)
            return tb__json_fail(j, "expected a value");
        j->pos += n;
        return TB_OK;
    }
    if (c == '-' || (c >= '0' && c <= '9')) { /* JSON's number grammar */
        size_t digits;
        if (c == '-') j->pos++;
        for (digits = 0; j->pos < j->len && j->text[j->pos] >= '0' && j->text[j->pos] <= '9';
             ++digits)
            j->pos++;
        if (digits == 0) return tb__json_fail(j, "bad number");
        if (digits > 1 && j->text[j->pos - digits] == '0') return tb__json_fail(j, "leading zero");
        if (j->pos < j->len && j->text[j->pos] == '.') {
            j->pos++;
            for (digits = 0; j->pos < j->len && j->text[j->pos] >= '0' && j->text[j->pos] <= '9';
                 ++digits)
                j->pos++;
            if (digits == 0) return tb__json_fail(j, "bad number");
        }
        if (j->pos < j->len && (j->text[j->pos] == 'e' || j->text[j->pos] == 'E')) {
            j->pos++;
            if (j->pos < j->len && (j->text[j->pos] == '+' || j->text[j->pos] == '-')) j->pos++;
            for (digits = 0; j->pos < j->len && j->text[j->pos] >= '0' && j->text[j->pos] <= '9';
                 ++digits)
                j->pos++;
            if (digits == 0) return tb__json_fail(j, "bad number");
        }
        return TB_OK;
    }
    return tb__json_fail(j, "expected a value");
}

/* The safetensors dtypes the library reads; F16 and BF16 are widened to f32. */
typedef struct tb__st_dtype {
    const char *name;
    tb_dtype dtype;
    uint8_t width; /* bytes per element in the file */
} tb__st_dtype;

static const tb__st_dtype tb__st_dtypes[] = {
    {"F64", TB_F64, 8}, {"F32", TB_F32, 4}, {"F16", TB_F32, 2}, {"BF16", TB_F32, 2},
    {"I64", TB_I64, 8}, {"I32", TB_I32, 4}, {"U8", TB_U8, 1},   {"BOOL", TB_BOOL, 1},
};
#define TB__ST_F16  2
#define TB__ST_BF16 3

/* The safetensors name of a library dtype; NULL for one it cannot hold. */
static const char *tb__st_dtype_name(tb_dtype dtype) {
    switch (dtype) {
    case TB_F32:
        return "F32";
    case TB_F64:
        return "F64";
    case TB_I32:
        return "I32";
    case TB_I64:
        return "I64";
    case TB_U8:
        return "U8";
    case TB_BOOL:
        return "BOOL";
    default:
        return NULL;
    }
}

/* One tensor of the header. The shape is parsed again (from shape_pos) when the tensor is made,
   which keeps this small: the entries never take more memory than the header's text. */
typedef struct tb__st_entry {
    char *name;
    size_t shape_pos;
    uint64_t begin, end;
    uint8_t dtype; /* index in tb__st_dtypes */
} tb__st_entry;

/* "[d0, d1, ...]" into dims; more than TB_MAX_RANK dims is TB_ERR_UNSUPPORTED. */
static tb_status tb__st_shape(tb__json *j, const char *name, int64_t dims[TB_MAX_RANK],
                              int32_t *rank) {
    *rank = 0;
    if (!tb__json_accept(j, '[')) return tb__json_fail(j, "'shape' must be a list of integers");
    if (tb__json_accept(j, ']')) return TB_OK;
    for (;;) {
        uint64_t d;
        tb_status st = tb__json_uint(j, &d);
        if (st != TB_OK) return st;
        if (*rank == TB_MAX_RANK)
            return tb__error(TB_ERR_UNSUPPORTED,
                             "%s: %s: tensor '%.200s' has more than %d dimensions, the most the "
                             "library supports",
                             j->fn, j->path, name, TB_MAX_RANK);
        dims[(*rank)++] = (int64_t)d;
        if (tb__json_accept(j, ']')) return TB_OK;
        if (!tb__json_accept(j, ',')) return tb__json_fail(j, "expected ',' or ']' in 'shape'");
    }
}

/* One tensor's object: dtype, shape, data_offsets (other keys are skipped, as the reference
   implementation does), checked against each other. */
static tb_status tb__st_tensor_entry(tb__json *j, tb__st_entry *e) {
    bool has_dtype = false, has_shape = false, has_offsets = false;
    int64_t dims[TB_MAX_RANK];
    int32_t rank = 0, d;
    uint64_t numel = 1, need;
    tb_status st = TB_OK;
    if (!tb__json_accept(j, '{')) return tb__json_fail(j, "a tensor's entry must be an object");
    if (!tb__json_accept(j, '}')) {
        for (;;) {
            char *key = NULL;
            st = tb__json_string(j, &key, NULL);
            if (st != TB_OK) return st;
            if (!tb__json_accept(j, ':')) {
                tb__free(key);
                return tb__json_fail(j, "expected ':'");
            }
            if ((strcmp(key, "dtype") == 0 && has_dtype) ||
                (strcmp(key, "shape") == 0 && has_shape) ||
                (strcmp(key, "data_offsets") == 0 && has_offsets)) {
                st = tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s' has '%s' twice", j->fn,
                               j->path, e->name, key);
            } else if (strcmp(key, "dtype") == 0) {
                char *name = NULL;
                size_t i, n = sizeof tb__st_dtypes / sizeof tb__st_dtypes[0];
                has_dtype = true;
                st = tb__json_string(j, &name, NULL);
                for (i = 0; st == TB_OK && i < n && strcmp(name, tb__st_dtypes[i].name) != 0; ++i)
                    ;
                if (st == TB_OK && i == n)
                    st = tb__error(TB_ERR_DTYPE,
                                   "%s: %s: tensor '%.200s' has dtype '%.32s', which the library "
                                   "does not read (it reads F32 F64 I32 I64 U8 BOOL, and F16 BF16 "
                                   "widened to f32)",
                                   j->fn, j->path, e->name, name);
                e->dtype = (uint8_t)i;
                tb__free(name);
            } else if (strcmp(key, "shape") == 0) {
                has_shape = true;
                tb__json_space(j);
                e->shape_pos = j->pos;
                st = tb__st_shape(j, e->name, dims, &rank);
            } else if (strcmp(key, "data_offsets") == 0) {
                has_offsets = true;
                if (!tb__json_accept(j, '['))
                    st = tb__json_fail(j, "'data_offsets' must be [begin, end]");
                if (st == TB_OK) st = tb__json_uint(j, &e->begin);
                if (st == TB_OK && !tb__json_accept(j, ','))
                    st = tb__json_fail(j, "'data_offsets' must be [begin, end]");
                if (st == TB_OK) st = tb__json_uint(j, &e->end);
                if (st == TB_OK && !tb__json_accept(j, ']'))
                    st = tb__json_fail(j, "'data_offsets' must be [begin, end]");
            } else {
                st = tb__json_skip(j, 2); /* inside the header's and the tensor's objects */
            }
            tb__free(key);
            if (st != TB_OK) return st;
            if (tb__json_accept(j, '}')) break;
            if (!tb__json_accept(j, ',')) return tb__json_fail(j, "expected ',' or '}'");
        }
    }
    if (!has_dtype || !has_shape || !has_offsets)
        return tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s' lacks '%s'", j->fn, j->path,
                         e->name,
                         !has_dtype   ? "dtype"
                         : !has_shape ? "shape"
                                      : "data_offsets");
    if (e->begin > e->end)
        return tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s' has data_offsets [%llu, %llu]",
                         j->fn, j->path, e->name, (unsigned long long)e->begin,
                         (unsigned long long)e->end);
    for (d = 0; d < rank; ++d) {
        if (dims[d] != 0 && numel > (uint64_t)INT64_MAX / 8 / (uint64_t)dims[d])
            return tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s': the shape's size overflows",
                             j->fn, j->path, e->name);
        numel *= (uint64_t)dims[d];
    }
    need = numel * tb__st_dtypes[e->dtype].width;
    if (need != e->end - e->begin)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: tensor '%.200s': data_offsets [%llu, %llu] hold %llu bytes but "
                         "%s of %llu elements needs %llu",
                         j->fn, j->path, e->name, (unsigned long long)e->begin,
                         (unsigned long long)e->end, (unsigned long long)(e->end - e->begin),
                         tb__st_dtypes[e->dtype].name, (unsigned long long)numel,
                         (unsigned long long)need);
    return TB_OK;
}

/* "__metadata__": null or an object of strings, into the set. */
static tb_status tb__st_metadata(tb__json *j, tb_tensor_set *set) {
    tb__json_space(j);
    if (j->len - j->pos >= 4 && memcmp(j->text + j->pos, "null", 4) == 0) {
        j->pos += 4;
        return TB_OK;
    }
    if (!tb__json_accept(j, '{')) return tb__json_fail(j, "'__metadata__' must be an object");
    if (tb__json_accept(j, '}')) return TB_OK;
    for (;;) {
        char *key = NULL, *value = NULL;
        size_t key_len = 0, value_len = 0;
        tb_status st = tb__json_string(j, &key, &key_len);
        if (st == TB_OK && !tb__json_accept(j, ':')) st = tb__json_fail(j, "expected ':'");
        tb__json_space(j);
        if (st == TB_OK && (j->pos >= j->len || j->text[j->pos] != '"'))
            st = tb__json_fail(j, "'__metadata__' values must be strings");
        if (st == TB_OK) st = tb__json_string(j, &value, &value_len);
        if (st == TB_OK && (key_len != strlen(key) || value_len != strlen(value)))
            st = tb__error(TB_ERR_FORMAT, "%s: %s: a metadata string holds a NUL character", j->fn,
                           j->path);
        if (st == TB_OK && tb__set_meta_find(set, key) != TB__SET_NONE)
            st = tb__error(TB_ERR_FORMAT, "%s: %s: metadata key '%.200s' appears twice", j->fn,
                           j->path, key);
        if (st == TB_OK && tb_tensor_set_set_metadata(set, key, value) != TB_OK)
            st = tb__error(tb_last_status() == TB_ERR_OUT_OF_MEMORY ? TB_ERR_OUT_OF_MEMORY
                                                                    : TB_ERR_FORMAT,
                           "%s: %s: metadata key '%.200s' is empty or longer than %d bytes", j->fn,
                           j->path, key, TB_TENSOR_SET_MAX_NAME);
        tb__free(key);
        tb__free(value);
        if (st != TB_OK) return st;
        if (tb__json_accept(j, '}')) return TB_OK;
        if (!tb__json_accept(j, ',')) return tb__json_fail(j, "expected ',' or '}'");
    }
}

/* Counts the members of the header's top-level object, checking the JSON as a whole. */
static tb_status tb__st_count(tb__json *j, size_t *count) {
    tb_status st;
    *count = 0;
    if (!tb__json_accept(j, '{')) return tb__json_fail(j, "the header must be a JSON object");
    while (!tb__json_accept(j, '}')) {
        st = tb__json_string(j, NULL, NULL);
        if (st != TB_OK) return st;
        if (!tb__json_accept(j, ':')) return tb__json_fail(j, "expected ':'");
        st = tb__json_skip(j, 1);
        if (st != TB_OK) return st;
        ++*count;
        if (tb__json_accept(j, '}')) break;
        if (!tb__json_accept(j, ',')) return tb__json_fail(j, "expected ',' or '}'");
        tb__json_space(j);
        if (j->pos < j->len && j->text[j->pos] == '}') return tb__json_fail(j, "expected a string");
    }
    tb__json_space(j);
    if (j->pos != j->len) return tb__json_fail(j, "text after the header's object");
    return TB_OK;
}

static int tb__st_by_name(const void *a, const void *b) {
    return strcmp((*(tb__st_entry *const *)a)->name, (*(tb__st_entry *const *)b)->name);
}

static int tb__st_by_offset(const void *a, const void *b) {
    const tb__st_entry *x = *(tb__st_entry *const *)a, *y = *(tb__st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Names unique; the tensors' data tile [0, data_len) without gaps or overlaps. */
static tb_status tb__st_check_layout(const char *path, tb__st_entry *entries, size_t count,
                                     uint64_t data_len) {
    tb__st_entry **order;
    uint64_t expected = 0;
    size_t i;
    tb_status st = TB_OK;
    if (count == 0) {
        if (data_len == 0) return TB_OK;
        return tb__error(TB_ERR_FORMAT,
                         "tb_safetensors_load: %s: %llu bytes of data follow a header that "
                         "lists no tensor",
                         path, (unsigned long long)data_len);
    }
    order = (tb__st_entry **)tb__calloc(count, sizeof *order);
    if (order == NULL) return tb_last_status();
    for (i = 0; i < count; ++i)
        order[i] = &entries[i];
    qsort(order, count, sizeof *order, tb__st_by_name);
    for (i = 1; i < count && st == TB_OK; ++i)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0)
            st = tb__error(TB_ERR_FORMAT, "tb_safetensors_load: %s: tensor '%.200s' appears twice",
                           path, order[i]->name);
    qsort(order, count, sizeof *order, tb__st_by_offset);
    for (i = 0; i < count && st == TB_OK; ++i) {
        if (order[i]->begin != expected)
            st = tb__error(TB_ERR_FORMAT,
                           "tb_safetensors_load: %s: tensor '%.200s' starts at data byte %llu "
                           "where %llu was expected (%s)",
                           path, order[i]->name, (unsigned long long)order[i]->begin,
                           (unsigned long long)expected,
                           order[i]->begin < expected ? "it overlaps another tensor"
                                                      : "a gap between tensors");
        expected = order[i]->end;
    }
    if (st == TB_OK && expected != data_len)
        st = tb__error(TB_ERR_FORMAT,
                       "tb_safetensors_load: %s: the tensors end at data byte %llu but the file "
                       "holds %llu bytes of data",
                       path, (unsigned long long)expected, (unsigned long long)data_len);
    tb__free(order);
    return st;
}

static float tb__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
    float f;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        exp = 113;
        while ((mant & 0x400) == 0) {
            mant <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
}

/* An F16 or BF16 tensor widened to f32 (a copy). */
static tb_tensor *tb__st_widen(const unsigned char *bytes, const tb_shape *shape, bool bf16,
                               const tb_device *device) {
    int64_t numel = 0, i;
    float *values;
    tb_tensor *t;
    if (tb_shape_numel(shape, &numel) != TB_OK) return NULL;
    values = (float *)tb__alloc(numel ? (size_t)numel * 4 : 1);
    if (values == NULL) return NULL;
    for (i = 0; i < numel; ++i) {
        uint16_t h = tb__le16(bytes + 2 * i);
        if (bf16) {
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&values[i], &bits, 4);
        } else {
            values[i] = tb__f16_to_f32(h);
        }
    }
    t = tb_tensor_from_host(values, shape, device);
    tb__free(values);
    return t;
}

TBDEF tb_tensor_set *tb_safetensors_load(const char *path, const tb_device *device) {
    static const char fn[] = "tb_safetensors_load";
    tb__blob *blob = NULL;
    tb_tensor_set *set = NULL;
    tb__st_entry *entries = NULL;
    size_t count = 0, parsed = 0, i;
    uint64_t header_len;
    bool seen_metadata = false;
    tb__json j;
    tb_device dev;
    tb_status st;
    tb__ensure_setup();
    if (path == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: path is NULL", fn);
        return NULL;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    st = tb__blob_open(fn, path, &blob);
    if (st != TB_OK) return NULL;
    if (blob->size < 8) {
        tb__error(TB_ERR_FORMAT, "%s: %s is %lu bytes, shorter than the 8-byte header length", fn,
                  path, (unsigned long)blob->size);
        goto fail;
    }
    header_len = tb__le64(blob->data);
    if (header_len > blob->size - 8 || header_len > TB__ST_MAX_HEADER) {
        tb__error(TB_ERR_FORMAT, "%s: %s: the header claims %llu bytes but %s", fn, path,
                  (unsigned long long)header_len,
                  header_len > blob->size - 8 ? "the file is shorter"
                                              : "safetensors allows at most 100000000");
        goto fail;
    }
    memset(&j, 0, sizeof j);
    j.text = (const char *)blob->data + 8;
    j.len = (size_t)header_len;
    j.fn = fn;
    j.path = path;
    if (!tb__utf8_valid(blob->data + 8, j.len)) {
        tb__error(TB_ERR_FORMAT, "%s: %s: the header is not valid UTF-8", fn, path);
        goto fail;
    }
    if (tb__st_count(&j, &count) != TB_OK) goto fail;
    set = tb_tensor_set_new();
    entries = (tb__st_entry *)tb__calloc(count ? count : 1, sizeof *entries);
    if (set == NULL || entries == NULL) goto fail;
    j.pos = 0;
    tb__json_accept(&j, '{');
    for (i = 0; i < count; ++i) {
        char *key = NULL;
        size_t key_len = 0;
        if (i > 0) tb__json_accept(&j, ',');
        if (tb__json_string(&j, &key, &key_len) != TB_OK) goto fail;
        tb__json_accept(&j, ':');
        if (strcmp(key, "__metadata__") == 0 && key_len == 12) {
            tb__free(key);
            if (seen_metadata) {
                tb__error(TB_ERR_FORMAT, "%s: %s: '__metadata__' appears twice", fn, path);
                goto fail;
            }
            seen_metadata = true;
            if (tb__st_metadata(&j, set) != TB_OK) goto fail;
            continue;
        }
        entries[parsed].name = key;
        parsed++;
        if (key_len != strlen(key) || key_len == 0 || key_len > TB_TENSOR_SET_MAX_NAME) {
            tb__error(TB_ERR_FORMAT,
                      "%s: %s: a tensor name is empty, longer than %d bytes or "
                      "holds a NUL character",
                      fn, path, TB_TENSOR_SET_MAX_NAME);
            goto fail;
        }
        if (tb__st_tensor_entry(&j, &entries[parsed - 1]) != TB_OK) goto fail;
    }
    if (tb__st_check_layout(path, entries, parsed, blob->size - 8 - header_len) != TB_OK) goto fail;
    for (i = 0; i < parsed; ++i) {
        const tb__st_entry *e = &entries[i];
        const unsigned char *bytes = blob->data + 8 + header_len + e->begin;
        int64_t dims[TB_MAX_RANK];
        int32_t rank = 0;
        tb_shape shape;
        tb_tensor *t;
        j.pos = e->shape_pos;
        tb__st_shape(&j, e->name, dims, &rank);
        if (tb_shape_make(&shape, tb__st_dtypes[e->dtype].dtype, rank, dims) != TB_OK) {
            tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s' is too large for this machine", fn,
                      path, e->name);
            goto fail;
        }
        if (e->dtype == TB__ST_F16 || e->dtype == TB__ST_BF16)
            t = tb__st_widen(bytes, &shape, e->dtype == TB__ST_BF16, &dev);
        else
            t = tb__blob_tensor(blob, bytes, &shape, false, &dev);
        if (t == NULL || tb__set_add_owned(fn, set, e->name, t) != TB_OK) goto fail;
    }
    for (i = 0; i < parsed; ++i)
        tb__free(entries[i].name);
    tb__free(entries);
    tb__blob_release(blob);
    return set;
fail:
    for (i = 0; i < parsed; ++i)
        tb__free(entries[i].name);
    tb__free(entries);
    tb_tensor_set_free(set);
    tb__blob_release(blob);
    return NULL;
}

/* A JSON string literal of `s` (the caller checked it is UTF-8). */
static void tb__json_append_string(tb__str *out, const char *s) {
    tb__str_append(out, "\"");
    for (; *s != '\0'; ++s) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            tb__str_append(out, "\\%c", (char)c);
        else if (c < 0x20)
            tb__str_append(out, "\\u%04x", (unsigned)c);
        else
            tb__str_append(out, "%c", (char)c);
    }
    tb__str_append(out, "\"");
}

static bool tb__utf8_string(const char *s) {
    return tb__utf8_valid((const unsigned char *)s, strlen(s));
}

TBDEF tb_status tb_safetensors_save(const char *path, const tb_tensor_set *set) {
    static const char fn[] = "tb_safetensors_save";
    static const size_t widths[4] = {8, 4, 2, 1};
    size_t *order = NULL, n = 0, i, w;
    uint64_t *begin = NULL, offset = 0;
    unsigned char length[8];
    tb__str header;
    tb__out_file out;
    tb_status st = TB_OK;
    tb__ensure_setup();
    if (path == NULL || set == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         path == NULL ? "path" : "set");
    for (i = 0; i < set->count; ++i) {
        tb_shape shape = tb_tensor_shape(set->entries[i].tensor);
        if (!tb__utf8_string(set->entries[i].name) ||
            strcmp(set->entries[i].name, "__metadata__") == 0)
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: tensor name '%.200s' is not valid UTF-8 or is the reserved "
                             "'__metadata__'",
                             fn, set->entries[i].name);
        if (tb__st_dtype_name(shape.dtype) == NULL)
            return tb__error(TB_ERR_DTYPE,
                             "%s: tensor '%.200s' has dtype %s, which safetensors "
                             "cannot hold here",
                             fn, set->entries[i].name, tb_dtype_name(shape.dtype));
    }
    for (i = 0; i < set->meta_count; ++i)
        if (!tb__utf8_string(set->meta[i].key) || !tb__utf8_string(set->meta[i].value))
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: metadata key '%.200s' or its value is not valid UTF-8", fn,
                             set->meta[i].key);
    st = tb__set_sync(set);
    if (st != TB_OK) return st;
    order = (size_t *)tb__calloc(set->count ? set->count : 1, sizeof *order);
    begin = (uint64_t *)tb__calloc(set->count ? set->count : 1, sizeof *begin);
    if (order == NULL || begin == NULL) {
        tb__free(order);
        tb__free(begin);
        return tb_last_status();
    }
    /* the data: widest dtypes first, each group in the set's order, so all stay aligned */
    for (w = 0; w < 4; ++w) {
        for (i = 0; i < set->count; ++i) {
            tb_shape shape = tb_tensor_shape(set->entries[i].tensor);
            size_t nbytes = 0;
            if (tb_dtype_size(shape.dtype) != widths[w]) continue;
            tb_shape_nbytes(&shape, &nbytes);
            order[n++] = i;
            begin[i] = offset;
            offset += nbytes;
        }
    }
    memset(&header, 0, sizeof header);
    tb__str_append(&header, "{");
    if (set->meta_count > 0) {
        tb__str_append(&header, "\"__metadata__\":{");
        for (i = 0; i < set->meta_count; ++i) {
            if (i > 0) tb__str_append(&header, ",");
            tb__json_append_string(&header, set->meta[i].key);
            tb__str_append(&header, ":");
            tb__json_append_string(&header, set->meta[i].value);
        }
        tb__str_append(&header, "}");
    }
    for (i = 0; i < set->count; ++i) {
        tb_shape shape = tb_tensor_shape(set->entries[i].tensor);
        size_t nbytes = 0;
        int32_t d;
        tb_shape_nbytes(&shape, &nbytes);
        if (i > 0 || set->meta_count > 0) tb__str_append(&header, ",");
        tb__json_append_string(&header, set->entries[i].name);
        tb__str_append(&header, ":{\"dtype\":\"%s\",\"shape\":[", tb__st_dtype_name(shape.dtype));
        for (d = 0; d < shape.rank; ++d)
            tb__str_append(&header, "%s%lld", d ? "," : "", (long long)shape.dims[d]);
        tb__str_append(&header, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)begin[i],
                       (unsigned long long)(begin[i] + nbytes));
    }
    tb__str_append(&header, "}");
    while (!header.failed && (8 + header.len) % 8 != 0)
        tb__str_append(&header, " ");
    if (header.failed) {
        st = tb__error(TB_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    } else {
        for (i = 0; i < 8; ++i)
            length[i] = (unsigned char)(((uint64_t)header.len >> (8 * i)) & 0xff);
        st = tb__out_open(fn, path, &out);
    }
    if (st == TB_OK) {
        tb__out_write(&out, length, 8);
        tb__out_write(&out, header.data, header.len);
        for (i = 0; i < n && st == TB_OK && !out.failed; ++i) {
            const unsigned char *bytes = NULL;
            unsigned char *copy = NULL;
            size_t nbytes = 0;
            st = tb__tensor_le_bytes(set->entries[order[i]].tensor, &bytes, &nbytes, &copy);
            if (st == TB_OK) tb__out_write(&out, bytes, nbytes);
            tb__free(copy);
        }
        if (st == TB_OK)
            st = tb__out_close(fn, &out, true);
        else
            tb__out_close(fn, &out, false);
    }
    tb__str_free(&header);
    tb__free(order);
    tb__free(begin);
    return st;
}

#undef TB__ST_F16
#undef TB__ST_BF16

/* ---- .npz: CRC-32, inflate, zip ---- */

/* CRC-32 (zip's, reflected 0xedb88320), eight bytes per step ("slicing by 8"). */
typedef struct tb__crc32_tables {
    uint32_t t[8][256];
} tb__crc32_tables;

static void tb__crc32_init(tb__crc32_tables *c) {
    uint32_t n, k, v;
    for (n = 0; n < 256; ++n) {
        for (v = n, k = 0; k < 8; ++k)
            v = (v & 1) ? 0xedb88320u ^ (v >> 1) : v >> 1;
        c->t[0][n] = v;
    }
    for (k = 1; k < 8; ++k)
        for (n = 0; n < 256; ++n)
            c->t[k][n] = (c->t[k - 1][n] >> 8) ^ c->t[0][c->t[k - 1][n] & 0xff];
}

static uint32_t tb__crc32(const tb__crc32_tables *c, uint32_t crc, const unsigned char *p,
                          size_t n) {
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = crc ^ tb__le32(p), hi = tb__le32(p + 4);
        crc = c->t[7][lo & 0xff] ^ c->t[6][(lo >> 8) & 0xff] ^ c->t[5][(lo >> 16) & 0xff] ^
              c->t[4][lo >> 24] ^ c->t[3][hi & 0xff] ^ c->t[2][(hi >> 8) & 0xff] ^
              c->t[1][(hi >> 16) & 0xff] ^ c->t[0][hi >> 24];
    }
    while (n-- > 0)
        crc = c->t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* Deflate (RFC 1951) into a buffer of known size. Huffman codes decode through a table for codes
   up to TB__HUFF_FAST bits and bit by bit (canonical order) for longer ones. */
#define TB__HUFF_FAST 9

typedef struct tb__huff {
    uint16_t fast[1 << TB__HUFF_FAST]; /* symbol | length << 9; 0: a longer code */
    uint16_t count[16];                /* codes of each length */
    uint16_t symbol[288];              /* symbols in canonical order */
} tb__huff;

typedef struct tb__inflater {
    const unsigned char *in;
    size_t in_len, in_pos;
    uint64_t bits;
    int nbits;
    int pad; /* zero bytes added past the end of the input */
    unsigned char *out;
    size_t out_len, out_pos;
} tb__inflater;

static void tb__inf_refill(tb__inflater *s) {
    while (s->nbits <= 56) {
        if (s->in_pos < s->in_len)
            s->bits |= (uint64_t)s->in[s->in_pos++] << s->nbits;
        else
            s->pad++;
        s->nbits += 8;
    }
}

static uint32_t tb__inf_bits(tb__inflater *s, int n) {
    uint32_t v;
    if (s->nbits < n) tb__inf_refill(s);
    v = (uint32_t)(s->bits & ((1u << n) - 1));
    s->bits >>= n;
    s->nbits -= n;
    return v;
}

/* Whether the decoder read past the end of the input. */
static bool tb__inf_overrun(const tb__inflater *s) {
    return s->nbits < 8 * s->pad;
}

static bool tb__huff_build(tb__huff *h, const uint8_t *lengths, int n) {
    uint16_t offs[16];
    int len, sym, left = 1, index = 0;
    uint32_t code = 0;
    memset(h->count, 0, sizeof h->count);
    memset(h->fast, 0, sizeof h->fast);
    for (sym = 0; sym < n; ++sym)
        h->count[lengths[sym]]++;
    h->count[0] = 0;
    for (len = 1; len <= 15; ++len) {
        left = (left << 1) - h->count[len];
        if (left < 0) return false; /* over-subscribed */
    }
    offs[1] = 0;
    for (len = 1; len < 15; ++len)
        offs[len + 1] = (uint16_t)(offs[len] + h->count[len]);
    for (sym = 0; sym < n; ++sym)
        if (lengths[sym] != 0) h->symbol[offs[lengths[sym]]++] = (uint16_t)sym;
    for (len = 1; len <= TB__HUFF_FAST; ++len, code <<= 1) {
        int k;
        for (k = 0; k < h->count[len]; ++k, ++code, ++index) {
            uint32_t rev = 0, r;
            int b;
            for (b = 0; b < len; ++b)
                rev |= ((code >> b) & 1u) << (len - 1 - b);
            for (r = rev; r < (1u << TB__HUFF_FAST); r += 1u << len)
                h->fast[r] = (uint16_t)(h->symbol[index] | (len << 9));
        }
    }
    return true;
}

/* The next symbol, or -1 for a code the table does not have. */
static int tb__huff_decode(tb__inflater *s, const tb__huff *h) {
    int len, code = 0, first = 0, index = 0;
    uint16_t e;
    if (s->nbits < 16) tb__inf_refill(s);
    e = h->fast[s->bits & ((1u << TB__HUFF_FAST) - 1)];
    if (e != 0) {
        s->bits >>= e >> 9;
        s->nbits -= e >> 9;
        return e & 511;
    }
    for (len = 1; len <= 15; ++len) {
        int count = h->count[len];
        code |= (int)(s->bits & 1);
        s->bits >>= 1;
        s->nbits--;
        if (code - count < first) return h->symbol[index + (code - first)];
        index += count;
        first = (first + count) << 1;
        code <<= 1;
    }
    return -1;
}

static const uint16_t tb__inf_len_base[29] = {3,  4,  5,  6,   7,   8,   9,   10,  11, 13,
                                              15, 17, 19, 23,  27,  31,  35,  43,  51, 59,
                                              67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t tb__inf_len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                              2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t tb__inf_dist_base[30] = {
    1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
    193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
static const uint8_t tb__inf_dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                               6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

/* One block's symbols until its end code. NULL on success, else the reason. */
static const char *tb__inf_codes(tb__inflater *s, const tb__huff *lit, const tb__huff *dist) {
    for (;;) {
        int sym = tb__huff_decode(s, lit);
        if (sym < 0) return "a literal/length code that the block's table does not have";
        if (tb__inf_overrun(s)) return "the compressed data end in the middle of a block";
        if (sym < 256) {
            if (s->out_pos >= s->out_len) return "more data than the entry's size";
            s->out[s->out_pos++] = (unsigned char)sym;
        } else if (sym == 256) {
            return NULL;
        } else {
            size_t len, d, k;
            int dsym;
            sym -= 257;
            if (sym >= 29) return "an invalid length code";
            len = tb__inf_len_base[sym] + tb__inf_bits(s, tb__inf_len_extra[sym]);
            dsym = tb__huff_decode(s, dist);
            if (dsym < 0 || dsym >= 30) return "an invalid distance code";
            d = tb__inf_dist_base[dsym] + tb__inf_bits(s, tb__inf_dist_extra[dsym]);
            if (tb__inf_overrun(s)) return "the compressed data end in the middle of a block";
            if (d > s->out_pos) return "a distance before the start of the data";
            if (len > s->out_len - s->out_pos) return "more data than the entry's size";
            if (d >= len) { /* no overlap */
                memcpy(s->out + s->out_pos, s->out + s->out_pos - d, len);
                s->out_pos += len;
            } else {
                for (k = 0; k < len; ++k, ++s->out_pos)
                    s->out[s->out_pos] = s->out[s->out_pos - d];
            }
        }
    }
}

static const char *tb__inf_stored(tb__inflater *s) {
    uint32_t len, nlen;
    tb__inf_bits(s, s->nbits % 8);
    len = tb__inf_bits(s, 16);
    nlen = tb__inf_bits(s, 16);
    if (tb__inf_overrun(s)) return "the compressed data end in a stored block's header";
    if (len != (~nlen & 0xffffu)) return "a stored block whose length check fails";
    if (len > s->out_len - s->out_pos) return "more data than the entry's size";
    while (len > 0 && s->nbits >= 8) {
        s->out[s->out_pos++] = (unsigned char)tb__inf_bits(s, 8);
        len--;
    }
    if (tb__inf_overrun(s)) return "the compressed data end in a stored block";
    if (len > s->in_len - s->in_pos) return "the compressed data end in a stored block";
    memcpy(s->out + s->out_pos, s->in + s->in_pos, len);
    s->out_pos += len;
    s->in_pos += len;
    return NULL;
}

static const char *tb__inf_dynamic(tb__inflater *s, tb__huff *lit, tb__huff *dist) {
    static const uint8_t order[19] = {16, 17, 18, 0, 8,  7, 9,  6, 10, 5,
                                      11, 4,  12, 3, 13, 2, 14, 1, 15};
    uint8_t lengths[320];
    int nlen, ndist, ncode, i = 0, k;
    nlen = (int)tb__inf_bits(s, 5) + 257;
    ndist = (int)tb__inf_bits(s, 5) + 1;
    ncode = (int)tb__inf_bits(s, 4) + 4;
    if (nlen > 286 || ndist > 30) return "a block with too many codes";
    memset(lengths, 0, sizeof lengths);
    for (k = 0; k < ncode; ++k)
        lengths[order[k]] = (uint8_t)tb__inf_bits(s, 3);
    if (!tb__huff_build(lit, lengths, 19)) return "an over-subscribed code length code";
    while (i < nlen + ndist) {
        int sym = tb__huff_decode(s, lit), repeat;
        uint8_t value = 0;
        if (sym < 0) return "a code length code that the table does not have";
        if (tb__inf_overrun(s)) return "the compressed data end in a block's code lengths";
        if (sym < 16) {
            lengths[i++] = (uint8_t)sym;
            continue;
        }
        if (sym == 16) {
            if (i == 0) return "a repeated code length with none before it";
            value = lengths[i - 1];
            repeat = 3 + (int)tb__inf_bits(s, 2);
        } else if (sym == 17) {
            repeat = 3 + (int)tb__inf_bits(s, 3);
        } else {
            repeat = 11 + (int)tb__inf_bits(s, 7);
        }
        if (i + repeat > nlen + ndist) return "code lengths that run past the codes";
        while (repeat-- > 0)
            lengths[i++] = value;
    }
    if (lengths[256] == 0) return "a block without an end code";
    if (!tb__huff_build(lit, lengths, nlen)) return "an over-subscribed literal/length code";
    if (!tb__huff_build(dist, lengths + nlen, ndist)) return "an over-subscribed distance code";
    return NULL;
}

/* Inflates all of s->in into exactly s->out_len bytes. NULL on success, else the reason. */
static const char *tb__inflate(tb__inflater *s) {
    tb__huff lit, dist;
    uint32_t final;
    do {
        const char *why = NULL;
        uint32_t type;
        final = tb__inf_bits(s, 1);
        type = tb__inf_bits(s, 2);
        if (tb__inf_overrun(s)) return "the compressed data end before the last block";
        if (type == 0) {
            why = tb__inf_stored(s);
        } else if (type == 1) {
            uint8_t lengths[288];
            int i;
            for (i = 0; i < 288; ++i)
                lengths[i] = (uint8_t)(i < 144 ? 8 : i < 256 ? 9 : i < 280 ? 7 : 8);
            tb__huff_build(&lit, lengths, 288);
            for (i = 0; i < 30; ++i)
                lengths[i] = 5;
            tb__huff_build(&dist, lengths, 30);
            why = tb__inf_codes(s, &lit, &dist);
        } else if (type == 2) {
            why = tb__inf_dynamic(s, &lit, &dist);
            if (why == NULL) why = tb__inf_codes(s, &lit, &dist);
        } else {
            why = "an invalid block type";
        }
        if (why != NULL) return why;
    } while (!final);
    if (s->out_pos != s->out_len) return "less data than the entry's size";
    return NULL;
}

#undef TB__HUFF_FAST

/* One file of a zip's central directory. 40 bytes: never more than the 46 bytes of the record
   it comes from, so the directory's size bounds the memory. */
typedef struct tb__zip_entry {
    const unsigned char *name; /* inside the file's bytes, not NUL-terminated */
    uint64_t local_offset;
    uint64_t comp_size;
    uint64_t size;
    uint32_t crc;
    uint16_t method;
    uint16_t name_len;
} tb__zip_entry;

#define TB__ZIP_MAX32 0xffffffffu
#define TB__ZIP_MAX16 0xffffu

/* The central directory's place and size, from the end records (zip64 where present). */
static tb_status tb__zip_find_directory(const char *path, const tb__blob *blob, uint64_t *cd_offset,
                                        uint64_t *cd_size, uint64_t *count, uint64_t *cd_limit) {
    static const char fn[] = "tb_npz_load";
    const unsigned char *d = blob->data, *e = NULL;
    size_t pos, lowest;
    if (blob->size < 22)
        return tb__error(TB_ERR_FORMAT, "%s: %s is too short to be a zip file", fn, path);
    lowest = blob->size > 22 + 65535 ? blob->size - 22 - 65535 : 0;
    for (pos = blob->size - 22;; --pos) {
        if (memcmp(d + pos, "PK\5\6", 4) == 0 && pos + 22 + tb__le16(d + pos + 20) <= blob->size) {
            e = d + pos;
            break;
        }
        if (pos == lowest) break;
    }
    if (e == NULL)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s is not a zip file (no end of central directory record)", fn, path);
    if (tb__le16(e + 4) != 0 || tb__le16(e + 6) != 0 || tb__le16(e + 8) != tb__le16(e + 10))
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: zip files split over several disks are not "
                         "supported",
                         fn, path);
    *count = tb__le16(e + 10);
    *cd_size = tb__le32(e + 12);
    *cd_offset = tb__le32(e + 16);
    *cd_limit = pos;
    if (pos >= 20 && memcmp(d + pos - 20, "PK\6\7", 4) == 0) {
        uint64_t z = tb__le64(d + pos - 20 + 8);
        const unsigned char *r;
        if (z > pos - 20 || pos - 20 - z < 56 || memcmp(d + z, "PK\6\6", 4) != 0)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: the zip64 end of central directory record is missing or "
                             "out of place",
                             fn, path);
        r = d + z;
        if (tb__le32(r + 16) != 0 || tb__le32(r + 20) != 0 || tb__le64(r + 24) != tb__le64(r + 32))
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: zip files split over several disks are not supported", fn,
                             path);
        *count = tb__le64(r + 32);
        *cd_size = tb__le64(r + 40);
        *cd_offset = tb__le64(r + 48);
        *cd_limit = z;
    }
    if (*cd_offset > *cd_limit || *cd_size > *cd_limit - *cd_offset)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: the central directory (%llu bytes at offset %llu) lies outside "
                         "the file",
                         fn, path, (unsigned long long)*cd_size, (unsigned long long)*cd_offset);
    if (*count > *cd_size / 46)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: the zip claims %llu entries but its central directory of %llu "
                         "bytes holds at most %llu",
                         fn, path, (unsigned long long)*count, (unsigned long long)*cd_size,
                         (unsigned long long)(*cd_size / 46));
    return TB_OK;
}

/* The central directory's records into `entries` (`count` of them). */
static tb_status tb__zip_read_directory(const char *path, const tb__blob *blob, uint64_t cd_offset,
                                        uint64_t cd_size, tb__zip_entry *entries, size_t count) {
    static const char fn[] = "tb_npz_load";
    const unsigned char *p = blob->data + cd_offset, *end = p + cd_size;
    size_t i;
    for (i = 0; i < count; ++i) {
        tb__zip_entry *z = &entries[i];
        size_t name_len, extra_len, comment_len;
        const unsigned char *extra, *x;
        uint16_t flags;
        bool need_size, need_comp, need_offset;
        if (end - p < 46 || memcmp(p, "PK\1\2", 4) != 0)
            return tb__error(TB_ERR_FORMAT, "%s: %s: central directory record %lu is malformed", fn,
                             path, (unsigned long)i);
        flags = tb__le16(p + 8);
        z->method = tb__le16(p + 10);
        z->crc = tb__le32(p + 16);
        z->comp_size = tb__le32(p + 20);
        z->size = tb__le32(p + 24);
        name_len = tb__le16(p + 28);
        extra_len = tb__le16(p + 30);
        comment_len = tb__le16(p + 32);
        z->local_offset = tb__le32(p + 42);
        if ((size_t)(end - p) - 46 < name_len + extra_len + comment_len)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: central directory record %lu runs past the directory", fn,
                             path, (unsigned long)i);
        z->name = p + 46;
        z->name_len = (uint16_t)name_len;
        if (flags & 0x41)
            return tb__error(TB_ERR_FORMAT, "%s: %s: entry '%.*s' is encrypted", fn, path,
                             (int)name_len, (const char *)z->name);
        if (z->method != 0 && z->method != 8)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: entry '%.*s' uses compression method %u (only stored and "
                             "deflate are read)",
                             fn, path, (int)name_len, (const char *)z->name, (unsigned)z->method);
        /* zip64: the fields at their maximum are in the extra field, in this order */
        need_size = z->size == TB__ZIP_MAX32;
        need_comp = z->comp_size == TB__ZIP_MAX32;
        need_offset = z->local_offset == TB__ZIP_MAX32;
        extra = p + 46 + name_len;
        for (x = extra; x + 4 <= extra + extra_len;) {
            size_t id = tb__le16(x), len = tb__le16(x + 2);
            const unsigned char *v = x + 4;
            if (len > (size_t)(extra + extra_len - v)) break;
            if (id == 1) {
                const unsigned char *vend = v + len;
                uint64_t *fields[3];
                bool *needs[3];
                int f;
                fields[0] = &z->size;
                fields[1] = &z->comp_size;
                fields[2] = &z->local_offset;
                needs[0] = &need_size;
                needs[1] = &need_comp;
                needs[2] = &need_offset;
                for (f = 0; f < 3; ++f) {
                    if (!*needs[f] || vend - v < 8) continue;
                    *fields[f] = tb__le64(v);
                    *needs[f] = false;
                    v += 8;
                }
            }
            x += 4 + len;
        }
        if (need_size || need_comp || need_offset)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: entry '%.*s' lacks the zip64 sizes its record refers to", fn,
                             path, (int)name_len, (const char *)z->name);
        p += 46 + name_len + extra_len + comment_len;
    }
    return TB_OK;
}

/* Where an entry's data start (after its local header); 0 when the header is not there. */
static uint64_t tb__zip_data_offset(const tb__blob *blob, const tb__zip_entry *z,
                                    uint64_t cd_offset) {
    const unsigned char *h;
    if (z->local_offset > cd_offset || cd_offset - z->local_offset < 30) return 0;
    h = blob->data + z->local_offset;
    if (memcmp(h, "PK\3\4", 4) != 0) return 0;
    return z->local_offset + 30 + tb__le16(h + 26) + tb__le16(h + 28);
}

static int tb__zip_by_offset(const void *a, const void *b) {
    const tb__zip_entry *x = *(const tb__zip_entry *const *)a;
    const tb__zip_entry *y = *(const tb__zip_entry *const *)b;
    return x->local_offset < y->local_offset ? -1 : x->local_offset > y->local_offset ? 1 : 0;
}

/* Every entry's local header is where the directory says, names the same file, and its data
   lie before the directory without overlapping another entry. */
static tb_status tb__zip_check_entries(const char *path, const tb__blob *blob,
                                       tb__zip_entry *entries, size_t count, uint64_t cd_offset) {
    static const char fn[] = "tb_npz_load";
    tb__zip_entry **order;
    uint64_t previous_end = 0;
    size_t i;
    tb_status st = TB_OK;
    order = (tb__zip_entry **)tb__calloc(count ? count : 1, sizeof *order);
    if (order == NULL) return tb_last_status();
    for (i = 0; i < count; ++i)
        order[i] = &entries[i];
    qsort(order, count, sizeof *order, tb__zip_by_offset);
    for (i = 0; i < count && st == TB_OK; ++i) {
        const tb__zip_entry *z = order[i];
        uint64_t data = tb__zip_data_offset(blob, z, cd_offset);
        const unsigned char *h = blob->data + z->local_offset;
        if (data == 0 || data > cd_offset || z->comp_size > cd_offset - data)
            st = tb__error(TB_ERR_FORMAT,
                           "%s: %s: entry '%.*s' (local header at %llu, %llu bytes) is not "
                           "inside the file's data",
                           fn, path, (int)z->name_len, (const char *)z->name,
                           (unsigned long long)z->local_offset, (unsigned long long)z->comp_size);
        else if (tb__le16(h + 26) != z->name_len || memcmp(h + 30, z->name, z->name_len) != 0)
            st = tb__error(TB_ERR_FORMAT,
                           "%s: %s: entry '%.*s' has another name in its local header", fn, path,
                           (int)z->name_len, (const char *)z->name);
        else if (z->local_offset < previous_end)
            st = tb__error(TB_ERR_FORMAT, "%s: %s: entry '%.*s' overlaps the entry before it", fn,
                           path, (int)z->name_len, (const char *)z->name);
        previous_end = data + z->comp_size;
    }
    tb__free(order);
    return st;
}

/* The tensor of one .npy held in `bytes` (inside `blob`). */
static tb_tensor *tb__npz_npy(const char *label, tb__blob *blob, const unsigned char *bytes,
                              size_t size, const tb_device *device) {
    static const char fn[] = "tb_npz_load";
    size_t preamble, header_len, nbytes = 0;
    tb__npy_header h;
    tb_shape shape;
    if (size < 10 || memcmp(bytes, tb__npy_magic, 6) != 0) {
        tb__error(TB_ERR_FORMAT, "%s: %s is not a .npy file (bad magic)", fn, label);
        return NULL;
    }
    if (bytes[6] == 1) {
        preamble = 10;
        header_len = tb__le16(bytes + 8);
    } else if ((bytes[6] == 2 || bytes[6] == 3) && size >= 12) {
        preamble = 12;
        header_len = tb__le32(bytes + 8);
    } else {
        tb__error(TB_ERR_FORMAT, "%s: %s: unsupported .npy format version %u.%u", fn, label,
                  (unsigned)bytes[6], (unsigned)bytes[7]);
        return NULL;
    }
    if (header_len > size - preamble) {
        tb__error(TB_ERR_FORMAT, "%s: %s: the .npy header of %lu bytes runs past the entry", fn,
                  label, (unsigned long)header_len);
        return NULL;
    }
    if (tb__npy_parse_header((const char *)bytes + preamble, header_len, label, &h) != TB_OK) {
        /* the .npy parser names tb_npy_load: name this function instead */
        char message[1024];
        tb_status st = tb_last_status();
        const char *text = tb_last_error();
        snprintf(message, sizeof message, "%s",
                 strncmp(text, "tb_npy_load: ", 13) == 0 ? text + 13 : text);
        tb__error(st, "%s: %s", fn, message);
        return NULL;
    }
    if (tb_shape_make(&shape, h.dtype, h.rank, h.dims) != TB_OK ||
        tb_shape_nbytes(&shape, &nbytes) != TB_OK) {
        tb__error(TB_ERR_FORMAT, "%s: %s: the shape in the .npy header is too large", fn, label);
        return NULL;
    }
    if (nbytes != size - preamble - header_len) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: the .npy holds %lu bytes of data but its header describes %lu", fn,
                  label, (unsigned long)(size - preamble - header_len), (unsigned long)nbytes);
        return NULL;
    }
    return tb__blob_tensor(blob, bytes + preamble + header_len, &shape, h.big_endian, device);
}

/* One entry of the zip as a tensor, into the set under its name without ".npy". */
static tb_status tb__npz_entry(const char *path, tb__blob *blob, const tb__zip_entry *z,
                               uint64_t cd_offset, const tb__crc32_tables *tables,
                               const tb_device *device, tb_tensor_set *set) {
    static const char fn[] = "tb_npz_load";
    char *label, *name;
    const unsigned char *compressed = blob->data + tb__zip_data_offset(blob, z, cd_offset);
    tb__blob *inflated = NULL;
    const unsigned char *bytes = compressed;
    tb_tensor *t = NULL;
    tb_status st = TB_OK;
    if (z->name_len <= 4 || memcmp(z->name + z->name_len - 4, ".npy", 4) != 0 ||
        memchr(z->name, '\0', z->name_len) != NULL || z->name_len - 4 > TB_TENSOR_SET_MAX_NAME)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: entry '%.*s' is not a .npy file named '<name>.npy'", fn, path,
                         (int)z->name_len, (const char *)z->name);
    label = tb__format("%s[%.*s]", path, (int)z->name_len, (const char *)z->name);
    name = tb__format("%.*s", (int)z->name_len - 4, (const char *)z->name);
    if (label == NULL || name == NULL) {
        tb__free(label);
        tb__free(name);
        return tb_last_status();
    }
    if (tb__set_find(set, name) != TB__SET_NONE) {
        st = tb__error(TB_ERR_FORMAT, "%s: %s: two entries are named '%.*s'", fn, path,
                       (int)z->name_len, (const char *)z->name);
    } else if (z->method == 0 && z->comp_size != z->size) {
        st = tb__error(TB_ERR_FORMAT, "%s: %s: a stored entry of %llu bytes claims %llu", fn, label,
                       (unsigned long long)z->comp_size, (unsigned long long)z->size);
    } else if (z->method == 8 && z->size / 1032 > z->comp_size) {
        st = tb__error(TB_ERR_FORMAT,
                       "%s: %s: %llu compressed bytes cannot inflate to the %llu claimed (deflate "
                       "gives at most 1032 times its input)",
                       fn, label, (unsigned long long)z->comp_size, (unsigned long long)z->size);
    } else if (z->size > (uint64_t)SIZE_MAX) {
        st = tb__error(TB_ERR_FORMAT, "%s: %s: the entry is too large for this machine", fn, label);
    } else if (z->method == 8) {
        unsigned char *out = (unsigned char *)tb__alloc(z->size ? (size_t)z->size : 1);
        inflated = out != NULL ? tb__blob_owning(out, (size_t)z->size) : NULL;
        if (inflated == NULL) {
            st = tb_last_status();
        } else {
            tb__inflater s;
            const char *why;
            memset(&s, 0, sizeof s);
            s.in = compressed;
            s.in_len = (size_t)z->comp_size;
            s.out = out;
            s.out_len = (size_t)z->size;
            why = tb__inflate(&s);
            if (why != NULL)
                st = tb__error(TB_ERR_FORMAT, "%s: %s: corrupt deflate data: %s", fn, label, why);
            bytes = out;
        }
    }
    if (st == TB_OK && tb__crc32(tables, 0, bytes, (size_t)z->size) != z->crc)
        st = tb__error(TB_ERR_FORMAT, "%s: %s: CRC-32 mismatch: the entry's data are corrupt", fn,
                       label);
    if (st == TB_OK) {
        t = tb__npz_npy(label, inflated != NULL ? inflated : blob, bytes, (size_t)z->size, device);
        st = t != NULL ? tb__set_add_owned(fn, set, name, t) : tb_last_status();
    }
    tb__blob_release(inflated);
    tb__free(label);
    tb__free(name);
    return st;
}

TBDEF tb_tensor_set *tb_npz_load(const char *path, const tb_device *device) {
    static const char fn[] = "tb_npz_load";
    tb__blob *blob = NULL;
    tb_tensor_set *set = NULL;
    tb__zip_entry *entries = NULL;
    uint64_t cd_offset = 0, cd_size = 0, count = 0, cd_limit = 0;
    tb__crc32_tables *crc = NULL;
    size_t i;
    tb_device dev;
    tb__ensure_setup();
    if (path == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: path is NULL", fn);
        return NULL;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    if (tb__blob_open(fn, path, &blob) != TB_OK) return NULL;
    if (tb__zip_find_directory(path, blob, &cd_offset, &cd_size, &count, &cd_limit) != TB_OK)
        goto fail;
    entries = (tb__zip_entry *)tb__calloc(count ? (size_t)count : 1, sizeof *entries);
    set = tb_tensor_set_new();
    if (entries == NULL || set == NULL) goto fail;
    if (tb__zip_read_directory(path, blob, cd_offset, cd_size, entries, (size_t)count) != TB_OK ||
        tb__zip_check_entries(path, blob, entries, (size_t)count, cd_offset) != TB_OK)
        goto fail;
    crc = (tb__crc32_tables *)tb__alloc(sizeof *crc);
    if (crc == NULL) goto fail;
    tb__crc32_init(crc);
    for (i = 0; i < (size_t)count; ++i)
        if (tb__npz_entry(path, blob, &entries[i], cd_offset, crc, &dev, set) != TB_OK) goto fail;
    tb__free(crc);
    tb__free(entries);
    tb__blob_release(blob);
    return set;
fail:
    tb__free(crc);
    tb__free(entries);
    tb_tensor_set_free(set);
    tb__blob_release(blob);
    return NULL;
}

/* Test hook: write zip64 records even where the sizes do not need them. */
static bool tb__npz_force_zip64 = false;

static unsigned char *tb__put16(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v & 0xff);
    p[1] = (unsigned char)((v >> 8) & 0xff);
    return p + 2;
}

static unsigned char *tb__put32(unsigned char *p, uint32_t v) {
    return tb__put16(tb__put16(p, v & 0xffff), v >> 16);
}

static unsigned char *tb__put64(unsigned char *p, uint64_t v) {
    return tb__put32(tb__put32(p, (uint32_t)(v & 0xffffffffu)), (uint32_t)(v >> 32));
}

/* The general purpose flags of an entry: bit 11 says the name is UTF-8 (else readers take it
   as code page 437). */
static uint32_t tb__npz_name_flags(const char *name) {
    for (; *name != '\0'; ++name)
        if ((unsigned char)*name >= 0x80) return 0x800;
    return 0;
}

/* What the directory needs to know of an entry written. */
typedef struct tb__npz_written {
    uint64_t offset, size;
    uint32_t crc;
} tb__npz_written;

/* One stored entry: local header, then the .npy (preamble, header text, data). */
static tb_status tb__npz_write_entry(tb__out_file *out, const char *name, tb_tensor *tensor,
                                     const tb__crc32_tables *tables, tb__npz_written *w) {
    tb_shape shape = tb_tensor_shape(tensor);
    const unsigned char *bytes = NULL;
    unsigned char *copy = NULL, preamble[12], local[30 + 20], *p;
    size_t nbytes = 0, header_len = 0, preamble_len, name_len = strlen(name) + 4, i;
    unsigned major = 1;
    char *header;
    bool zip64;
    uint32_t crc;
    tb_status st = tb__tensor_le_bytes(tensor, &bytes, &nbytes, &copy);
    if (st != TB_OK) return st;
    header = tb__npy_header_text(&shape, &header_len, &major);
    if (header == NULL) {
        tb__free(copy);
        return tb__error(TB_ERR_OUT_OF_MEMORY, "tb_npz_save: out of memory");
    }
    memcpy(preamble, tb__npy_magic, 6);
    preamble[6] = (unsigned char)major;
    preamble[7] = 0;
    preamble_len = major == 1 ? 10 : 12;
    for (i = 8; i < preamble_len; ++i)
        preamble[i] = (unsigned char)((header_len >> (8 * (i - 8))) & 0xff);
    w->offset = out->written;
    w->size = (uint64_t)preamble_len + header_len + nbytes;
    crc = tb__crc32(tables, 0, preamble, preamble_len);
    crc = tb__crc32(tables, crc, (const unsigned char *)header, header_len);
    w->crc = tb__crc32(tables, crc, bytes, nbytes);
    zip64 = w->size >= TB__ZIP_MAX32 || tb__npz_force_zip64;
    p = tb__put32(local, 0x04034b50u);
    p = tb__put16(p, zip64 ? 45 : 20); /* version needed */
    p = tb__put16(p, tb__npz_name_flags(name));
    p = tb__put16(p, 0);                       /* stored */
    p = tb__put16(p, 0);                       /* time 00:00 */
    p = tb__put16(p, (0 << 9) | (1 << 5) | 1); /* date 1980-01-01 */
    p = tb__put32(p, w->crc);
    p = tb__put32(p, zip64 ? TB__ZIP_MAX32 : (uint32_t)w->size);
    p = tb__put32(p, zip64 ? TB__ZIP_MAX32 : (uint32_t)w->size);
    p = tb__put16(p, (uint32_t)name_len);
    p = tb__put16(p, zip64 ? 20 : 0);
    tb__out_write(out, local, 30);
    tb__out_write(out, name, name_len - 4);
    tb__out_write(out, ".npy", 4);
    if (zip64) {
        p = tb__put16(local, 1);
        p = tb__put16(p, 16);
        p = tb__put64(p, w->size);
        tb__put64(p, w->size);
        tb__out_write(out, local, 20);
    }
    tb__out_write(out, preamble, preamble_len);
    tb__out_write(out, header, header_len);
    tb__out_write(out, bytes, nbytes);
    tb__free(header);
    tb__free(copy);
    return TB_OK;
}

TBDEF tb_status tb_npz_save(const char *path, const tb_tensor_set *set) {
    static const char fn[] = "tb_npz_save";
    tb__npz_written *written;
    tb__crc32_tables *tables;
    unsigned char record[56 + 20 + 22], *p;
    uint64_t cd_offset, cd_size;
    tb__out_file out;
    size_t i;
    bool zip64_end;
    tb_status st;
    tb__ensure_setup();
    if (path == NULL || set == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         path == NULL ? "path" : "set");
    for (i = 0; i < set->count; ++i) {
        tb_shape shape = tb_tensor_shape(set->entries[i].tensor);
        if (tb__st_dtype_name(shape.dtype) == NULL || strlen(set->entries[i].name) + 4 > 65535)
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: tensor '%.200s': its dtype has no .npy code or its name is "
                             "too long for a zip entry",
                             fn, set->entries[i].name);
    }
    st = tb__set_sync(set);
    if (st != TB_OK) return st;
    written = (tb__npz_written *)tb__calloc(set->count ? set->count : 1, sizeof *written);
    tables = (tb__crc32_tables *)tb__alloc(sizeof *tables);
    if (written == NULL || tables == NULL) {
        tb__free(written);
        tb__free(tables);
        return tb_last_status();
    }
    tb__crc32_init(tables);
    st = tb__out_open(fn, path, &out);
    for (i = 0; i < set->count && st == TB_OK && !out.failed; ++i)
        st = tb__npz_write_entry(&out, set->entries[i].name, set->entries[i].tensor, tables,
                                 &written[i]);
    cd_offset = out.written;
    for (i = 0; i < set->count && st == TB_OK && !out.failed; ++i) {
        const tb__npz_written *w = &written[i];
        size_t name_len = strlen(set->entries[i].name) + 4;
        bool big = w->size >= TB__ZIP_MAX32 || tb__npz_force_zip64;
        bool far = w->offset >= TB__ZIP_MAX32 || tb__npz_force_zip64;
        unsigned char head[46], extra[4 + 24], *x;
        p = tb__put32(head, 0x02014b50u);
        p = tb__put16(p, (3 << 8) | 45); /* made by: unix, zip 4.5 */
        p = tb__put16(p, big || far ? 45 : 20);
        p = tb__put16(p, tb__npz_name_flags(set->entries[i].name));
        p = tb__put16(p, 0);
        p = tb__put16(p, 0);
        p = tb__put16(p, (0 << 9) | (1 << 5) | 1);
        p = tb__put32(p, w->crc);
        p = tb__put32(p, big ? TB__ZIP_MAX32 : (uint32_t)w->size);
        p = tb__put32(p, big ? TB__ZIP_MAX32 : (uint32_t)w->size);
        p = tb__put16(p, (uint32_t)name_len);
        x = extra + 4;
        if (big) x = tb__put64(tb__put64(x, w->size), w->size);
        if (far) x = tb__put64(x, w->offset);
        tb__put16(tb__put16(extra, 1), (uint32_t)(x - extra - 4));
        p = tb__put16(p, x == extra + 4 ? 0 : (uint32_t)(x - extra));
        p = tb__put16(p, 0);              /* comment */
        p = tb__put16(p, 0);              /* disk */
        p = tb__put16(p, 0);              /* internal attributes */
        p = tb__put32(p, 0100644u << 16); /* a regular file, rw-r--r-- */
        tb__put32(p, far ? TB__ZIP_MAX32 : (uint32_t)w->offset);
        tb__out_write(&out, head, 46);
        tb__out_write(&out, set->entries[i].name, name_len - 4);
        tb__out_write(&out, ".npy", 4);
        if (x != extra + 4) tb__out_write(&out, extra, (size_t)(x - extra));
    }
    cd_size = out.written - cd_offset;
    zip64_end = set->count >= TB__ZIP_MAX16 || cd_offset >= TB__ZIP_MAX32 ||
                cd_size >= TB__ZIP_MAX32 || tb__npz_force_zip64;
    p = record;
    if (zip64_end) {
        uint64_t end_offset = out.written;
        p = tb__put32(p, 0x06064b50u);
        p = tb__put64(p, 44);
        p = tb__put16(p, (3 << 8) | 45);
        p = tb__put16(p, 45);
        p = tb__put32(p, 0);
        p = tb__put32(p, 0);
        p = tb__put64(p, set->count);
        p = tb__put64(p, set->count);
        p = tb__put64(p, cd_size);
        p = tb__put64(p, cd_offset);
        p = tb__put32(p, 0x07064b50u);
        p = tb__put32(p, 0);
        p = tb__put64(p, end_offset);
        p = tb__put32(p, 1);
    }
    p = tb__put32(p, 0x06054b50u);
    p = tb__put16(p, 0);
    p = tb__put16(p, 0);
    p = tb__put16(p, zip64_end ? TB__ZIP_MAX16 : (uint32_t)set->count);
    p = tb__put16(p, zip64_end ? TB__ZIP_MAX16 : (uint32_t)set->count);
    p = tb__put32(p, zip64_end ? TB__ZIP_MAX32 : (uint32_t)cd_size);
    p = tb__put32(p, zip64_end ? TB__ZIP_MAX32 : (uint32_t)cd_offset);
    p = tb__put16(p, 0);
    if (st == TB_OK) {
        tb__out_write(&out, record, (size_t)(p - record));
        st = tb__out_close(fn, &out, true);
    } else if (out.f != NULL) {
        tb__out_close(fn, &out, false);
    }
    tb__free(written);
    tb__free(tables);
    return st;
}

#undef TB__ZIP_MAX32
#undef TB__ZIP_MAX16
#undef TB__SET_NONE

/* ---- src/impl_end.h ---- */
#endif /* TB_IMPLEMENTATION */
