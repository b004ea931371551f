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
   Messages longer than 1023 bytes are cut; a NULL `fmt` gives tb_status_string(status) as the
   message. In a plugin's own copy of the library (TB_STATIC) loaded by a host, the error is
   also set in the host (see "plugins" below). Thread-safe. */
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

/* What a graph's first compile is doing (tb_desc.progress). A graph whose kernels are not yet
   compiled in this process reports TB_PROGRESS_BEGIN, then TB_PROGRESS_KERNELS as its distinct
   kernels become ready (where the backend can tell: native as its compiler processes finish,
   opencl as each kernel's first launch, when the driver compiles it, completes), then
   TB_PROGRESS_END once its first run is done (with the time of both). A graph found in the
   computation cache reports nothing. The hook runs on the thread that runs the graph, which
   waits in it, possibly holding the device's lock: keep it short (print a line, update a bar)
   and call no function of the library's from it except tb_status_string. */
typedef enum tb_progress_stage {
    TB_PROGRESS_BEGIN = 0,
    TB_PROGRESS_KERNELS = 1,
    TB_PROGRESS_END = 2
} tb_progress_stage;

typedef struct tb_progress {
    tb_progress_stage stage;
    const char *device;   /* "native:0", "opencl:1", ... */
    uint64_t graph_hash;  /* as TB_DEBUG's lines name the graph */
    size_t kernels_done;  /* distinct kernels ready so far */
    size_t kernels_total; /* distinct kernels of the graph (0: the backend does not say) */
    bool from_disk;       /* END: the compiled program came from the disk cache */
    double seconds;       /* since TB_PROGRESS_BEGIN */
    tb_status status;     /* END: TB_OK, or why the compile or the first run failed */
} tb_progress;

typedef struct tb_progress_hook {
    void (*func)(const tb_progress *progress, void *user_data);
    void *user_data;
} tb_progress_hook;

/* Setup options. Zero-initialise it; every 0 field means "the default".
       tb_desc desc = {0};
       desc.cache_size = 64;
       tb_setup(&desc);                                                                     */
typedef struct tb_desc {
    tb_allocator allocator;
    tb_logger logger;
    const char *backend;       /* default backend; NULL: $TB_BACKEND, else "cpu" */
    const char *device;        /* default device "backend:ordinal"; NULL: $TB_DEVICE */
    size_t cache_size;         /* computations kept in the LRU computation cache; 0: 1024 */
    size_t max_graph_nodes;    /* a pending graph larger than this is flushed; 0: 100000 */
    int debug;                 /* 0: $TB_DEBUG; 1..3 as TB_DEBUG; -1: off whatever $TB_DEBUG says */
    int check;                 /* 0: $TB_CHECK; 1: check every graph on the reference backend
                                  and log the first node that differs; 2: also fail the sync
                                  (TB_ERR_EXECUTE); -1: off */
    tb_progress_hook progress; /* first compiles as they run (tb_progress); NULL func: none */
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
