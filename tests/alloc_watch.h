/* The largest single allocation the library makes, for the file-format tests: a hostile file
   must be refused before the library allocates what its lying header claims. alloc_watch_setup
   sets the library up with the watching allocator (before anything else sets it up);
   alloc_watch_reset starts a new watch; alloc_watch_check fails the test when a request since
   was larger than `limit` (the file's size for a format without compression) or than
   ALLOC_WATCH_FIXED, the fixed working memory a load may use whatever the file (tables, small
   buffers). Included after cmocka.h and
   torch_backend.h. */
#ifndef TB_TESTS_ALLOC_WATCH_H
#define TB_TESTS_ALLOC_WATCH_H

#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define ALLOC_WATCH_UNUSED __attribute__((unused))
#else
#define ALLOC_WATCH_UNUSED
#endif

static size_t alloc_watch_max;

static void *alloc_watch_alloc(size_t size, void *user_data) {
    (void)user_data;
    if (size > alloc_watch_max) alloc_watch_max = size;
    return malloc(size);
}

static void alloc_watch_free(void *ptr, void *user_data) {
    (void)user_data;
    free(ptr);
}

static ALLOC_WATCH_UNUSED tb_status alloc_watch_setup(void) {
    tb_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = alloc_watch_alloc;
    desc.allocator.free = alloc_watch_free;
    return tb_setup(&desc);
}

static ALLOC_WATCH_UNUSED void alloc_watch_reset(void) {
    alloc_watch_max = 0;
}

#define ALLOC_WATCH_FIXED 16384

static ALLOC_WATCH_UNUSED void alloc_watch_check(size_t limit, const char *what) {
    size_t bound = limit > ALLOC_WATCH_FIXED ? limit : ALLOC_WATCH_FIXED;
    if (alloc_watch_max > bound)
        fail_msg("%s: the load allocated %zu bytes at once, more than its limit of %zu", what,
                 alloc_watch_max, limit);
}

#endif
