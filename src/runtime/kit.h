/* ===========================================================================================
   Compiled backends: the kit
   A backend that runs the library's generated kernels on its own device registers a runtime
   table with tb_kit_register. The kit gives it everything between the graph and the launch,
   as the built-in "opencl" and "native" backends (which are made this way) get it: fusion and
   the kernel plan, code generation in C99 or OpenCL C for the device's facts, the computation
   cache, buffer lifetimes and donation, kept matmul panels, run-time error reports, TB_DEBUG
   profiling, metrics, TB_CHECK. The runtime gives devices, memory, program builds, kernel
   lookup, launch and fence.

   The contract. `dev` is the runtime's device object as `open` returns it: the same pointer for
   the same ordinal every time (the kit compares them), and the `device` of every buffer that
   alloc makes there. Entries marked (locked) are called between the runtime's lock and unlock
   of that device (one lock for all devices is fine); (unlocked) entries without it; (any)
   entries either way, so they must not take the lock. Work on a device happens in the order
   the kit asks for it (launches, copies, reads, writes), as on an in-order queue: `read`
   returns once the bytes are in host memory, `write` is done with `host` when it returns, and
   `release` may come while launches that use the buffer are still queued (the memory must stay
   valid for them). `build` and `kernel` may run on several threads at once. An entry that
   fails sets the error with tb_set_error (a status and a message the user sees) and leaves its
   out-parameters NULL. After `shutdown` the kit may still call lock, unlock, alive, release,
   drop, kernel_release and close (buffers and computations the user still holds). The table
   is kept by pointer: it must outlive the backend (a static table), one table per backend.

   The kernels: a program is the source of one graph's kernels; each kernel is one function of
   it (tb_kit_kernel.function). A launch passes the arguments of tb_kit_arg in order, the
   output first. In OpenCL C a kernel is a __kernel function: a buffer argument is its cl_mem, a
   scalar its bytes, a table its buffer followed by the kernel's first entry as a long. In C99
   (GNU C: vector extensions, <tgmath.h>; built with -std=gnu99 -ffp-contract=off, as a shared
   object) a kernel is `void NAME(void *const *args, long lo, long hi)` running work items
   [lo, hi) of its tb_kit_work_items: args[i] is a buffer's address, the address of a scalar's
   bytes (tb_kit_arg.value.bytes: the arguments live until launch returns), or a table's
   address plus 8 * at; work items may be split among threads as the runtime likes.
   =========================================================================================== */

/* A buffer of a compiled backend (the payload of its data): a runtime's own buffer type starts
   with one, which its `alloc` fills (mem, device, size, cap; the rest zero). `mem` is never NULL
   in a buffer alloc made, even of 0 bytes. */
typedef struct tb_kit_buffer {
    void *mem;    /* what a kernel argument passes: an address, a cl_mem, a handle */
    void *device; /* the runtime's device */
    size_t size;  /* bytes asked for */
    size_t cap;   /* bytes it holds (at least size) */
    /* the kit's own (its generation, a scalar's state): alloc leaves them zero */
    uint64_t gen;
    bool shell;
    struct tb_kit_buffer *real;
} tb_kit_buffer;

typedef enum tb_kit_arg_kind {
    TB_KIT_ARG_BUFFER = 0, /* a buffer (the output is one) */
    TB_KIT_ARG_SCALAR = 1, /* a value passed by value */
    TB_KIT_ARG_ERROR = 2,  /* the run's error flag: a buffer of 32 bytes */
    TB_KIT_ARG_TABLE = 3   /* the run's scalar table (8 bytes an entry) and the kernel's first */
} tb_kit_arg_kind;

/* A kernel argument. */
typedef struct tb_kit_arg {
    int32_t kind; /* tb_kit_arg_kind */
    void *mem;    /* a buffer's, the error flag's or the table's tb_kit_buffer.mem */
    size_t size;  /* a scalar's bytes (1 to 8) */
    union {
        unsigned char bytes[8]; /* a scalar's value as the kernel declares it (8-aligned) */
        int64_t i;
        double f;
    } value;
    int64_t at; /* a table: the kernel's first entry */
} tb_kit_arg;

/* What a runtime needs to know of a kernel to launch it. */
typedef struct tb_kit_kernel {
    const char *name;     /* for messages and profiles */
    const char *function; /* its function in the program */
    /* group_size[0] > 0: groups[d] work-groups of group_size[d] work items in 3 dimensions (the
       kernel needs that size); else `items` work items in one, in groups of any size */
    size_t group_size[3];
    size_t groups[3];
    uint64_t items;
    double bytes, flops; /* its least traffic and arithmetic (a cost to split work by) */
} tb_kit_kernel;

/* The source of a graph's program: a head every function needs, then the functions, each a
   run of text (function_at[i], function_len[i]: offsets into source) after it; a runtime may
   compile the head with any run of functions apart (the native backend compiles in parts, in
   parallel). Valid during `build` only. */
typedef struct tb_kit_program {
    const char *source; /* NUL-terminated */
    size_t length;
    size_t head; /* bytes of the head */
    size_t num_functions;
    const char *const *functions;
    const size_t *function_at, *function_len;
} tb_kit_program;

typedef enum tb_kit_language {
    TB_KIT_C99 = 0,     /* GNU C99 functions over work items (see above) */
    TB_KIT_OPENCL_C = 1 /* OpenCL C 1.2 */
} tb_kit_language;

/* What code generation needs of a device. Zero is "unknown / none" in every field but
   language and type. */
typedef struct tb_kit_facts {
    tb_kit_language language;
    tb_device_type type;       /* CPU: the CPU tuning (kernels over rows); else the GPU's */
    uint32_t vector_bytes;     /* a CPU's vector registers: 16 (SSE, NEON), 32 (AVX2), 64 */
    uint32_t vector_registers; /* how many (16 or 32) */
    uint32_t compute_units;
    uint32_t max_group; /* the largest work-group (1: no groups, as C99 kernels) */
    uint64_t max_allocation;
    uint64_t cache_bytes;  /* a core's L2 */
    uint32_t max_args;     /* kernel arguments it takes (8 bytes each) */
    uint32_t buffer_align; /* every buffer's start is aligned to this many bytes */
    bool f64;              /* it computes in double */
    bool f64_accumulate;   /* float sums may accumulate in double (fast on CPUs) */
    bool fma; /* a CPU multiplies and adds in one instruction (x86's FMA, CL_FP_FMA): with
                 32-byte vectors its matmul may keep a wider block in 16 registers */
} tb_kit_facts;

/* Counters the kit reports for a device (its metrics report, under `metric`::NAME). The runtime
   keeps bytes_in_use, peak_bytes and cached_bytes under the lock, builds and disk_* with atomic
   adds, and sets cache_limit (0: matmul panels are never kept); the kit counts launches. */
typedef struct tb_kit_stats {
    uint64_t bytes_in_use, peak_bytes, cached_bytes;
    uint64_t cache_limit; /* the most bytes a cache of free buffers keeps: panels kept above it
                             are not */
    uint64_t builds, disk_hits, disk_misses, disk_rejected, launches;
} tb_kit_stats;

/* The runtime table. Every entry is required unless marked (optional). */
typedef struct tb_kit_runtime {
    const char *name;         /* the backend's name in messages */
    const char *metric;       /* its metrics' prefix: "Native" gives "Native::KernelLaunch" */
    const char *build_metric; /* the name of its builds counter ("ProgramBuild") */
    bool lazy_build;          /* the driver compiles a kernel at its first launch: first runs report
                                 progress by launches */
    /* (unlocked) the devices: how many, the first cap of them in out; 0 with why filled when
       none */
    size_t (*devices)(tb_device *out, size_t cap, char *why, size_t why_cap);
    /* (unlocked) device `ordinal`, held until close (counted: a thread-safe reference); ready
       for work unless `bare` (facts and counters only); NULL with the error set */
    void *(*open)(int32_t ordinal, const char *func, bool bare);
    void (*close)(void *dev);
    bool (*alive)(void *dev);      /* (locked) false once the backend shut down */
    int32_t (*ordinal)(void *dev); /* (any) */
    /* (unlocked) full: with the facts that take time to learn */
    void (*info)(void *dev, bool full, tb_device_info *out);
    tb_kit_stats *(*stats)(void *dev);           /* (any) */
    void (*facts)(void *dev, tb_kit_facts *out); /* (unlocked) */
    void (*lock)(void *dev);
    void (*unlock)(void *dev);
    /* memory (locked) */
    tb_status (*alloc)(void *dev, size_t bytes, tb_kit_buffer **out);
    void (*release)(tb_kit_buffer *b);
    tb_status (*write)(void *dev, tb_kit_buffer *b, const void *host, size_t bytes);
    tb_status (*read)(void *dev, const tb_kit_buffer *b, void *host, size_t bytes);
    tb_status (*copy)(void *dev, const tb_kit_buffer *from, tb_kit_buffer *to, size_t bytes);
    /* (locked, optional) the buffer in the host's address space, NULL where it cannot be;
       unmap (optional) ends that */
    void *(*map)(void *dev, tb_kit_buffer *b, size_t bytes, bool write);
    tb_status (*unmap)(void *dev, tb_kit_buffer *b, void *host);
    /* programs: the built program of a source; a kernel of it (the handle and a number of the
       runtime's own go back to launch); (locked) the program given back */
    tb_status (*build)(void *dev, const tb_kit_program *source, void **program); /* (unlocked) */
    /* (unlocked) */
    tb_status (*kernel)(void *dev, void *program, const tb_kit_kernel *k, void **handle,
                        size_t *aux);
    void (*kernel_release)(void *dev, void *handle); /* (unlocked, optional) before drop */
    void (*drop)(void *dev, void *program);          /* once per successful build */
    /* (locked) a launch; `event` non-NULL: a token for `elapsed` once `finish` returned */
    tb_status (*launch)(void *dev, void *handle, size_t aux, const tb_kit_kernel *k,
                        const tb_kit_arg *args, size_t num_args, uint64_t *event);
    void (*finish)(void *dev);                    /* (locked) waits for the work launched */
    double (*elapsed)(void *dev, uint64_t event); /* (locked) ns of a launch; ends the token */
    /* (locked, optional) after each successful run, its work done and its error flag read; at
       the end of a run (submit what is queued) */
    void (*ran)(void *dev, void *program);
    void (*flush)(void *dev);
    /* (locked, optional) more lines of its metrics report ("  Name::Counter: 12\n") */
    void (*report)(void *dev, char *buf, size_t cap);
    bool (*supports)(const tb_node *node); /* (optional) false: the node runs on the cpu */
    void (*shutdown)(void);                /* drops every cache: the backend is going away */
} tb_kit_runtime;

/* Registers the compiled backend `name` (tags as tb_backend_register's) over `runtime`, which
   must stay valid as long as anything of the backend lives (a static table). Errors: NULL or
   incomplete tables (a required entry NULL: TB_ERR_INVALID_ARGUMENT, the entry named), and
   those of tb_backend_register. */
TBDEF tb_status tb_kit_register(const char *name, const tb_kit_runtime *runtime, const char *tags);

/* The backend table of a runtime, checked as tb_kit_register checks it, for a plugin's
   descriptor (tb_plugin_desc) or to change entries before registering. */
TBDEF tb_status tb_kit_backend_impl(const tb_kit_runtime *runtime, tb_backend_impl *out);

/* The work-item space of a kernel: its global size in each dimension (items in C99 kernels
   are the flattened product). */
TBDEF void tb_kit_work_items(const tb_kit_kernel *k, uint64_t size[3]);

/* For a runtime whose build takes a while: reports `done` of `total` functions built (the
   library's progress line, shown when stderr is a terminal or TB_DEBUG >= 1). */
TBDEF void tb_kit_progress(size_t done, size_t total);
