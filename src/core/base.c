/* ===========================================================================================
   Base: errors, allocation, logging, setup, hashing, strings, mutexes, time
   =========================================================================================== */
#include "../impl_begin.h"

#if !defined(_WIN32)
#include <sched.h>    /* sched_yield */
#include <sys/time.h> /* gettimeofday: the clock when clock_gettime is not declared */
#endif

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
    if (fmt != NULL) {
        tb__error_v(status, fmt, ap);
    } else {
        tb__error(status, "%s", tb_status_string(status)); /* never an empty message */
    }
    va_end(ap);
    if (tb__plugin_parent != NULL) tb__plugin_parent->set_error(status, tb__err_message);
    return status;
}

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

#if defined(__linux__)
static TB__UNUSED bool tb__affinity_calls(void *self, tb__affinity_fn *get, tb__affinity_fn *set) {
    void *g, *s;
    g = dlsym(self, "pthread_getaffinity_np");
    s = dlsym(self, "pthread_setaffinity_np");
    if (g == NULL || s == NULL) return false;
    /* ISO C has no cast from an object pointer to a function pointer; POSIX guarantees the
       representations match */
    memcpy(get, &g, sizeof g);
    memcpy(set, &s, sizeof s);
    return true;
}
#endif

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
    /* Later layers first (the wiring's order); they may still allocate, log and read the desc
       meanwhile. Nothing after this point allocates. */
    {
        const tb__wiring_table *w = tb__wiring();
        size_t i;
        for (i = 0; i < w->num_teardown; i++)
            w->teardown[i]();
    }
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

/* The capacity a caching allocator gives a request of `size` bytes. Small requests round up to
   256 bytes; from 1 MiB on, to a quarter of the enclosing power of
   two (at most 25% slack), so that buffers of similar sizes are reused. */
static TB__UNUSED size_t tb__size_class(size_t size) {
    size_t p = 1, step;
    if (size <= 256) return 256;
    if (size <= ((size_t)1 << 20)) return (size + 255) & ~(size_t)255;
    while (p <= size / 2)
        p <<= 1; /* the largest power of two <= size */
    step = p / 4;
    if (size > SIZE_MAX - step) return size;
    return (size + step - 1) / step * step;
}

/* Process-wide generations for buffers: a buffer takes a new one whenever its contents may
   change (handed out by an allocator, written), so that what was derived from it (packed
   matmul panels) can tell whether it still holds. Never 0. Thread-safe. */
static uint64_t tb__generation_counter = 0;

static TB__UNUSED uint64_t tb__next_generation(void) {
    return (uint64_t)TB__ATOMIC_ADD(&tb__generation_counter, 1);
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
