/* ===========================================================================================
   Native backend: what native.c uses of its thread pool (native_pool.c).
   =========================================================================================== */
#include "impl_begin.h"

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

#endif /* TB__HAVE_NATIVE */
