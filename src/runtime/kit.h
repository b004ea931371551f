/* ===========================================================================================
   The compiled-backend kit: what every backend that compiles the planner's kernels shares
   (kit.c), over a small table a runtime fills (OpenCL: opencl.c; native: native.c). The kit owns
   the backend's entries: data in and out, plan and render, program and kernel lookup, the launch
   loop with its buffers (lifetimes, donation, kept panels, the error flag, the scalar table),
   profiling and metrics. A runtime gives devices, memory, program builds, kernel lookup, launch
   and fence.
   =========================================================================================== */
#include "../impl_begin.h"

/* A buffer of a compiled backend: the payload of its tb_backend_data. A runtime's own buffer
   type starts with one. `mem` is what a kernel argument passes (a host address, a cl_mem); a
   scalar made by data_from_scalar has none (NULL) until a kernel reads it from memory, its
   value in tb_backend_data.scalar. */
typedef struct tb__kbuf {
    void *mem;
    void *dev;    /* the runtime's device */
    size_t size;  /* bytes asked for */
    size_t cap;   /* bytes it holds: the size class */
    uint64_t gen; /* tb__next_generation when it was handed out or last written */
    /* a scalar's buffer (the kit's, holding a reference on the device): `real` is the runtime's
       buffer that gives it memory once a kernel reads it as an array (mem is then real's) */
    bool shell;
    struct tb__kbuf *real;
} tb__kbuf;

/* A kernel argument, in the plan's order after the output (which is args[0], a buffer). */
typedef struct tb__karg {
    int32_t kind;           /* TB__ARG_BUF (the output too), _SCALAR, _TABLE or _ERR */
    void *mem;              /* a buffer's, the table's or the error flag's tb__kbuf.mem */
    size_t size;            /* a scalar's bytes */
    unsigned char value[8]; /* a scalar's value as the kernel declares it */
    int64_t at;             /* the table: the kernel's first entry */
} tb__karg;

/* A kernel the runtime found in a program: its handle and a number of its own (OpenCL: the
   work-group size of a kernel launched over items). */
typedef struct tb__kkernel {
    void *handle;
    size_t aux;
} tb__kkernel;

/* The counters every compiled backend reports (a device's; guarded by its lock, or atomic). */
typedef struct tb__kit_stats {
    uint64_t bytes_in_use, peak_bytes, cached_bytes;
    uint64_t cache_limit; /* the most bytes the buffer cache keeps */
    uint64_t builds, disk_hits, disk_misses, disk_rejected, launches;
} tb__kit_stats;

/* A runtime. `dev` is the runtime's device; entries marked (locked) are called between lock
   and unlock of that device, the others without its lock. */
typedef struct tb__kit_runtime {
    const char *name;         /* the backend's name */
    const char *metric;       /* its metrics' prefix ("OpenCL": "OpenCL::KernelLaunch") */
    const char *build_metric; /* the name of its builds counter ("ProgramBuild") */
    /* the driver compiles a kernel at its first launch: the first run reports progress */
    bool lazy_build;
    /* the devices (0 and *why set when there are none) */
    size_t (*devices)(tb_device *out, size_t cap, char *why, size_t why_cap);
    /* device `ordinal` with a reference on the runtime, ready for work unless `bare` (no
       context or queue made: facts and counters only); NULL with the error set */
    void *(*open)(int32_t ordinal, const char *func, bool bare);
    void (*close)(void *dev);
    bool (*alive)(void *dev); /* false once the backend exited */
    int32_t (*ordinal)(void *dev);
    void (*info)(void *dev, bool full, tb_device_info *out); /* full: facts that take time too */
    tb__kit_stats *(*stats)(void *dev);
    /* what the planner and the code generator need of the device */
    void (*target)(void *dev, tb__tuning *tuning, tb__target *target, tb__dialect *dialect);
    void (*lock)(void *dev);
    void (*unlock)(void *dev);
    /* memory (locked); `release` gives a buffer back (the kit locks its device) */
    tb_status (*alloc)(void *dev, size_t bytes, tb__kbuf **out);
    void (*release)(tb__kbuf *b);
    tb_status (*write)(void *dev, tb__kbuf *b, const void *host, size_t bytes);
    tb_status (*read)(void *dev, const tb__kbuf *b, void *host, size_t bytes);
    tb_status (*copy)(void *dev, const tb__kbuf *from, tb__kbuf *to, size_t bytes);
    /* (locked, optional) the buffer in the host's address space, NULL where it cannot be;
       unmap ends that */
    void *(*map)(void *dev, tb__kbuf *b, size_t bytes, bool write);
    tb_status (*unmap)(void *dev, tb__kbuf *b, void *host);
    /* programs: the built program of a plan's source (reporting progress), its kernels, and
       (locked) its release */
    tb_status (*build)(void *dev, const tb__plan *plan, const char *src, size_t len,
                       void **program);
    tb_status (*kernel)(void *dev, void *program, const tb__plan_kernel *k, tb__kkernel *out);
    void (*kernel_release)(void *dev, tb__kkernel *kern); /* (optional) */
    void (*drop)(void *dev, void *program);
    /* (locked) a launch of kernel k with its arguments; `event` non-NULL: a token for
       `elapsed` after `finish` */
    tb_status (*launch)(void *dev, const tb__kkernel *kern, const tb__plan_kernel *k,
                        const tb__karg *args, size_t num_args, uint64_t *event);
    void (*finish)(void *dev);                    /* (locked) waits for the work enqueued */
    double (*elapsed)(void *dev, uint64_t event); /* (locked) ns of a launch; frees the token */
    /* (locked, optional) after each successful run, with the work done (a first run's program
       may be worth saving now); after a run's last launch (submit what is enqueued) */
    void (*ran)(void *dev, void *program);
    void (*flush)(void *dev);
    void (*report)(void *dev, tb__str *s); /* (locked, optional) more lines of its metrics */
    bool (*supports)(const tb_node *node); /* (optional) a node it cannot lower */
    void (*exit)(void);                    /* drops every cache: the backend is going away */
} tb__kit_runtime;

/* the backend entries of a runtime (impl->user_data is the runtime); the runtime sets its own
   after (default devices and the like) */
static void tb__kit_impl(const tb__kit_runtime *R, tb_backend_impl *impl);
/* the device memory of a data (a host scalar gets its memory now); NULL with the error set.
   Call with dev locked. */
static void *tb__kit_data_mem(const tb__kit_runtime *R, void *dev, tb_backend_data *data);
/* the value of a scalar as the bytes of `dtype` */
static void tb__kit_scalar_bytes(tb_dtype dtype, tb_scalar s, unsigned char out[8]);
