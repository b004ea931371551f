/* ===========================================================================================
   Native backend: what its parts share: the thread pool (native_pool.c), the runtime's types and
   the functions one part uses of another.
   =========================================================================================== */
#include "../../impl_begin.h"

#if defined(TB__HAVE_NATIVE)

/* a kernel's entry: work items [lo, hi) with its arguments */
typedef void (*tb__native_fn)(void *const *args, long lo, long hi);
typedef struct tb__native_pool tb__native_pool;

/* a pool of `threads` threads besides the caller's (NULL when none could start) */
static tb__native_pool *tb__native_pool_new(size_t threads);
static void tb__native_pool_free(tb__native_pool *p);
/* runs fn over work items [0, total) on the pool and the caller; `work` (bytes and
   operations) small: on the caller alone */
static void tb__native_run(tb__native_pool *p, tb__native_fn fn, void *const *args, int64_t total,
                           double work);

/* ---- what the parts of the backend share: native_runtime.c, native_programs.c, native.c ---- */

/* A host buffer, 64-byte aligned at k.mem (the payload of a native tb_backend_data with
   memory); k.dev is the runtime. A borrowed one is a caller's array (base NULL), given back by
   release(context) rather than kept for reuse. */
typedef struct tb__native_buf {
    tb_kit_buffer k;
    void *base; /* what was allocated */
    bool borrowed;
    void (*release)(void *context);
    void *context;
} tb__native_buf;

/* A loaded shared object, shared by every computation whose source is the same. */
typedef struct tb__native_prog {
    tb__kit_prog base; /* in the runtime's list */
    void *handle;
} tb__native_prog;

typedef struct tb__native_rt {
    tb__kit_proc proc; /* first: its count is the backend's reference, plus one per buffer and
                          computation alive */
    tb_device_info info;
    /* the compiler: its command words ($CC split at blanks, every word kept), the path of the
       first, its options (as one text for the cache key, and as words), its identity (the
       file it is) and the CPU's; a compile may take timeout_s seconds (0: no limit) */
    char *cc_command, *cc_text, **cc_argv, cc_path[4096];
    size_t cc_argc;
    char *options, *options_text, **opt_argv;
    size_t opt_argc;
    double timeout_s;
    /* the vector shape the programs are compiled for (tb__native_shape, at the first compile):
       what both the CPU and the compiler's target have */
    bool shaped;
    tb__host_shape shape;
    char cc_macros[24]; /* a hash of the compiler's predefined macros: its version and target */
    char cc_id[4200 + 64];
    char cpu[512];
    uint64_t l2_bytes; /* a core's L2 cache as the C library reports it; 0: unknown */
    tb__native_pool *pool;
    /* the caching allocator: free buffers, oldest first */
    tb__native_buf **cache;
    size_t cache_count, cache_cap;
    tb__kit_prog *programs;
    tb_kit_stats stats;
    int32_t cache_dir_reported; /* atomic: why the cache folder is not used was said */
} tb__native_rt;

/* Guards the runtime, its allocator and its program cache (never held while the compiler
   runs), and serialises runs (one job in the pool at a time): the device's lock. */
static tb__mutex tb__native_mutex = TB__MUTEX_INIT;
static tb__kit_proc *tb__native_current; /* a tb__native_rt */

#define TB__NATIVE_MAX_PROGRAMS 256

static const tb__disk_format tb__native_disk_format = {"native", "TBNATIVE", 1u, ".so"};

/* The bits of a program key that count (all: the in-memory cache confirms hits by source). */
static const uint64_t tb__native_key_mask = ~(uint64_t)0;

/* native_runtime.c */
static void tb__native_prog_free(tb__native_prog *prog);
/* splits text at blanks into *words (pointers into text, which is changed) */
static bool tb__native_split_words(char *text, char ***words, size_t *count);
static tb__native_rt *tb__native_rt_get(void);
static void tb__native_rt_unref(tb__native_rt *rt);
/* the runtime of device `ordinal`, or NULL with the error set (func names the caller) */
static tb__native_rt *tb__native_device(int32_t ordinal, const char *func);
static void tb__native_buf_destroy(tb__native_buf *b);
static void tb__native_cache_trim(tb__native_rt *rt, uint64_t keep);
static tb_status tb__native_buf_alloc(tb__native_rt *rt, size_t size, tb__native_buf **out);
static void tb__native_buf_free(tb__native_rt *rt, tb__native_buf *b);
/* native_programs.c */
static void tb__native_shape(tb__native_rt *rt);
static void tb__native_prog_unref(tb__native_rt *rt, tb__native_prog *prog);
static void tb__native_progs_trim(tb__native_rt *rt, size_t keep);
/* the loaded program of a source (from memory, the disk cache or the compiler), holding every
   function of fns; *from_disk set when the disk cache had it */
static tb_status tb__native_get_program(tb__native_rt *rt, const char *src, size_t len,
                                        const char *const *fns, size_t num_fns, bool *from_disk,
                                        tb__native_prog **out);

#endif /* TB__HAVE_NATIVE */
