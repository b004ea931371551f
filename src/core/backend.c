/* ===========================================================================================
   Backend registry and plugins (the backend data are backend_data.c's)
   =========================================================================================== */
#include "../impl_begin.h"

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
    size_t removals;             /* entries removed (a failed init), so that a walk can restart */
    tb_backend *current;         /* NULL until chosen (lazily from the desc) */
    int32_t builtins_done;       /* read atomically */
    const tb_backend *reference; /* tb__registry_set_reference's, NULL before */
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
   was: TB_ERR_PLUGIN, TB_ERR_DUPLICATE when the name is taken, or TB_ERR_OUT_OF_MEMORY when
   memory ran out (in the registration, the plugin's entry or its init). Nothing of the plugin's is
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
            /* memory running out is no fault of the plugin's: the caller may try again */
            return tb__plugin_fail(handle, st == TB_ERR_OUT_OF_MEMORY ? st : TB_ERR_PLUGIN,
                                   "%s: plugin %.400s: %s failed: %s", fn, path,
                                   TB_PLUGIN_ENTRY_NAME, reason);
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
        return tb__plugin_fail(handle, st == TB_ERR_OUT_OF_MEMORY ? st : TB_ERR_PLUGIN,
                               "%s: plugin %.400s: %s", fn, path, reason);
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
   $TB_BACKEND, the reference backend), looked up on first use. A default that names no usable
   backend is an error each time it is used, in the words tb_current_device uses for a bad
   desc.device or $TB_DEVICE; nothing falls back to another backend. */
static const tb_backend *tb__current_backend(const char *fn) {
    tb_backend *b;
    const char *wanted, *source;
    tb__ensure_setup();
    tb__registry_ensure(NULL);
    tb__mutex_lock(&tb__reg_mutex);
    b = tb__reg.current;
    tb__mutex_unlock(&tb__reg_mutex);
    if (b != NULL) return b;

    /* no setting: the reference backend, the first built-in of the wiring */
    wanted = tb__desc()->backend != NULL ? tb__desc()->backend : tb__wiring()->builtins[0].name;
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

/* Asks the backend how many devices it has (filling at most `cap` of `out`): false, with the
   backend's error, when it answers 0 with an error set (memory ran out while it loaded), which
   is no answer at all. */
static bool tb__backend_devices(const tb_backend *b, tb_device *out, size_t cap, size_t *n) {
    tb__saved_error saved;
    tb__error_save(&saved);
    tb_clear_error();
    *n = b->impl.get_backend_devices(b->impl.user_data, out, cap);
    if (*n == 0 && tb_last_status() != TB_OK) return false;
    tb__error_restore(&saved);
    return true;
}

/* The backend's device list: in `stack` when it fits, else in an allocation (*list != stack,
   the caller frees it). Fills the backend name and each ordinal. */
static tb_status tb__device_list(const tb_backend *b, tb_device *stack, size_t stack_cap,
                                 tb_device **list, size_t *count) {
    size_t n, i;
    tb_device *items = stack;
    memset(stack, 0, stack_cap * sizeof *stack);
    if (!tb__backend_devices(b, stack, stack_cap, &n)) return tb_last_status();
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
    if (!tb__backend_devices(b, out, cap, &n)) {
        return tb__error(tb_last_status(), "tb_backend_devices: backend '%s': %s", b->name,
                         tb_last_error());
    }
    for (i = 0; i < n && i < cap; i++) {
        memcpy(out[i].backend, b->name, sizeof out[i].backend);
        out[i].ordinal = (int32_t)i;
    }
    if (count != NULL) *count = n;
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
    tb__reg.reference = NULL;
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
    const tb__wiring_table *w = tb__wiring();
    size_t i;
    for (i = 0; i < w->num_builtins; i++) {
        const tb__builtin_backend *builtin = &w->builtins[i];
        tb_status st;
        if (tb__registered(builtin->name)) continue;
        tb_clear_error();
        st = builtin->register_backend();
        if (st != TB_OK) tb__builtin_failed(why, builtin->name, st);
    }
}

static void tb__registry_set_reference(const tb_backend *backend) {
    tb__mutex_lock(&tb__reg_mutex);
    tb__reg.reference = backend;
    tb__mutex_unlock(&tb__reg_mutex);
}

static const tb_backend *tb__registry_reference(void) {
    const tb_backend *reference;
    tb__mutex_lock(&tb__reg_mutex);
    reference = tb__reg.reference;
    tb__mutex_unlock(&tb__reg_mutex);
    return reference;
}

#undef TB__HAVE_PLUGINS
#undef TB__QUOTE_CAP
