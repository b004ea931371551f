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

/* A runtime just loaded with `status` (TB_OK, or why it cannot be used: `reason`): false (the
   error set) when memory ran out, so that nothing is kept and the next use tries again; true
   otherwise, the reason logged where the backend is unavailable. */
static bool tb__kit_loaded(tb_status status, const char *reason);

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
