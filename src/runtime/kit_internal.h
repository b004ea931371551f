/* ===========================================================================================
   The compiled-backend kit's contract with the runtimes built on it (opencl.c, native.c): the
   public kit (kit.h) and what the built-in runtimes use beyond it.
   =========================================================================================== */
#include "../impl_begin.h"

#if defined(TB__HAVE_COMPILED_BACKENDS)

/* the backend entries of a runtime (impl->user_data is the runtime); a built-in runtime sets
   its own after (the default device and the like) */
static void tb__kit_impl(const tb_kit_runtime *R, tb_backend_impl *impl);
/* the buffer holding a data's value on dev (a host scalar gets its memory now); NULL with the
   error set. Call with dev locked. */
static tb_kit_buffer *tb__kit_data_buffer(const tb_kit_runtime *R, void *dev,
                                          tb_backend_data *data);

/* What a runtime keeps for the whole process, the first member of its own struct: counted
   (atomically) by the backend and by each buffer, computation and device alive, marked exited
   once tb_shutdown has retired it (nothing is cached after that), and why it cannot be used
   (status != TB_OK: a runtime that cannot be used is kept, with no devices, so that the cause
   is said once). `destroy` frees the whole runtime when the last reference goes. */
typedef struct tb__kit_proc {
    int32_t refcount;
    bool exited;
    tb_status status;
    char reason[512];
    void (*destroy)(struct tb__kit_proc *p);
} tb__kit_proc;

/* A new runtime's memory, `size` bytes zeroed with its tb__kit_proc first (status TB_OK, one
   reference: the backend's, and `destroy`); NULL when memory ran out. */
static void *tb__kit_proc_new(size_t size, void (*destroy)(tb__kit_proc *p));
static void tb__kit_proc_ref(tb__kit_proc *p);
static void tb__kit_proc_unref(tb__kit_proc *p); /* NULL: nothing */
/* A runtime just made (its state p, status and reason filled) becomes *current, the process's;
   where making it ran out of memory it is destroyed instead and NULL returned with the error
   set, so that the next use tries again. A runtime that cannot be used logs why. Call with the
   runtime's mutex held. */
static tb__kit_proc *tb__kit_proc_keep(tb__kit_proc **current, tb__kit_proc *p);
/* Whether the runtime p (NULL: it could not be made, the error is set) can be used; the error
   set with its reason where it cannot. */
static bool tb__kit_proc_usable(const tb__kit_proc *p);
/* tb_shutdown's part of a runtime: under `mutex`, the current one (if any) has its caches
   emptied by `trim`, is marked exited, stops being current and loses the backend's reference
   (its buffers and computations still alive keep it). */
static void tb__kit_proc_retire(tb__mutex *mutex, tb__kit_proc **current,
                                void (*trim)(tb__kit_proc *p));

/* A program in a runtime's in-memory cache (a list, newest first), confirmed by its source: a
   runtime's own program type starts with one. */
typedef struct tb__kit_prog {
    struct tb__kit_prog *next;
    uint64_t key[2];
    char *source;
    size_t source_len;
    int32_t refcount; /* computations using it, plus one while it is in the cache */
} tb__kit_prog;

/* frees a program that left the cache (ctx: the runtime's) */
typedef void (*tb__kit_prog_free_fn)(void *ctx, tb__kit_prog *p);
/* The program of a key and source, with a reference for the caller, or NULL; *collisions
   (optional) counts the entries of that key with another source. */
static tb__kit_prog *tb__kit_prog_find(tb__kit_prog *list, const uint64_t key[2], const char *src,
                                       size_t len, int64_t *collisions);
/* drops a reference: the last one unlinks the program and frees it */
static void tb__kit_prog_unref(tb__kit_prog **list, tb__kit_prog *p, tb__kit_prog_free_fn free_fn,
                               void *ctx);
/* drops cached programs no computation uses, oldest first, until at most `keep` remain */
static void tb__kit_progs_trim(tb__kit_prog **list, size_t keep, tb__kit_prog_free_fn free_fn,
                               void *ctx);

#endif /* TB__HAVE_COMPILED_BACKENDS */
