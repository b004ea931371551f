/* ===========================================================================================
   Native backend: its runtime. The compiler it runs (found, probed, its options), the device
   it makes of the host CPU, and host memory: 64-byte aligned buffers from a caching allocator.
   =========================================================================================== */
#include "../../impl_begin.h"

#if defined(TB__HAVE_NATIVE)

#include <sys/wait.h>

/* ---- the runtime: the compiler, the device, memory, programs ---- */

#include <poll.h>
#include <signal.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

extern char **environ;
/* kill is POSIX's: under a strict -std, with a system header included before our feature
   macro, the C library hides it (C++ compilers define the macros that show it). */
#if !defined(__cplusplus) && defined(__STRICT_ANSI__) &&                                           \
    (!defined(__GLIBC__) || !defined(__USE_POSIX))
extern int kill(pid_t pid, int sig);
#endif

static void tb__native_prog_free(tb__native_prog *prog) {
    if (prog->handle != NULL) dlclose(prog->handle);
    tb__free(prog->base.source);
    tb__free(prog);
}

static void tb__native_rt_destroy(tb__kit_proc *p) {
    tb__native_rt *rt = (tb__native_rt *)p;
    tb__kit_prog *prog, *next;
    size_t i;
    tb__native_pool_free(rt->pool);
    for (prog = rt->programs; prog != NULL; prog = next) {
        next = prog->next;
        tb__native_prog_free((tb__native_prog *)prog);
    }
    for (i = 0; i < rt->cache_count; i++) {
        tb__free(rt->cache[i]->base);
        tb__free(rt->cache[i]);
    }
    tb__free(rt->cache);
    tb__free(rt->cc_command);
    tb__free(rt->cc_text);
    tb__free(rt->cc_argv);
    tb__free(rt->options);
    tb__free(rt->options_text);
    tb__free(rt->opt_argv);
    tb__free(rt);
}

static void tb__native_rt_unref(tb__native_rt *rt) {
    if (rt != NULL) tb__kit_proc_unref(&rt->proc);
}

/* Whether `name` is an executable file, found on $PATH when it has no slash; its path in
   `found` (of 4096 bytes). */
static bool tb__native_find_program(const char *name, char *found) {
    const char *path = tb__getenv("PATH"), *p;
    char buf[4096];
    if (name == NULL || name[0] == '\0') return false;
    if (strchr(name, '/') != NULL) {
        snprintf(found, 4096, "%s", name);
        return access(name, X_OK) == 0;
    }
    if (path == NULL) path = "/usr/bin:/bin";
    for (p = path; *p != '\0';) {
        const char *end = strchr(p, ':');
        size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
        if (n > 0 && n + strlen(name) + 2 <= sizeof buf) {
            memcpy(buf, p, n);
            buf[n] = '/';
            strcpy(buf + n + 1, name);
            if (access(buf, X_OK) == 0) {
                memcpy(found, buf, sizeof buf);
                return true;
            }
        }
        p += n;
        if (*p == ':') p++;
    }
    return false;
}

/* The CPU's model and features (the compiled code is for this CPU: -march=native). */
static void tb__native_read_cpu(tb__native_rt *rt) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[4096];
    bool model = false, flags = false;
    uint64_t h = 0x637075ull;
    snprintf(rt->info.name, sizeof rt->info.name, "host CPU");
    if (f == NULL) return;
    while ((!model || !flags) && fgets(line, sizeof line, f) != NULL) {
        char *colon = strchr(line, ':');
        size_t n;
        if (colon == NULL) continue;
        n = strlen(colon + 1);
        while (n > 0 && (colon[n] == '\n' || colon[n] == ' '))
            colon[n--] = '\0';
        if (!model && strncmp(line, "model name", 10) == 0) {
            snprintf(rt->info.name, sizeof rt->info.name, "%s", colon + 2);
            model = true;
        } else if (!flags &&
                   (strncmp(line, "flags", 5) == 0 || strncmp(line, "Features", 8) == 0)) {
            h = tb__hash_bytes(h, colon + 1, strlen(colon + 1));
            flags = true;
        }
    }
    fclose(f);
    snprintf(rt->cpu, sizeof rt->cpu, "%s; features %016llx", rt->info.name, (unsigned long long)h);
}

/* Splits `text` in place at blanks (spaces, tabs, newlines) into its words, every one kept:
 *words (caller frees; NULL-terminated) and *count. False when out of memory. */
static bool tb__native_split_words(char *text, char ***words, size_t *count) {
    size_t n = 0, cap = 1;
    char *p, **out;
    for (p = text; *p != '\0'; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' &&
            (p == text || p[-1] == ' ' || p[-1] == '\t' || p[-1] == '\n'))
            cap++;
    out = (char **)tb__calloc(cap, sizeof *out);
    if (out == NULL) return false;
    for (p = text; *p != '\0';) {
        while (*p == ' ' || *p == '\t' || *p == '\n')
            *p++ = '\0';
        if (*p == '\0') break;
        out[n++] = p;
        while (*p != '\0' && *p != ' ' && *p != '\t' && *p != '\n')
            p++;
    }
    out[n] = NULL;
    *words = out;
    *count = n;
    return true;
}

/* A positive whole number from the environment variable `name`, at most `max`: *out is left
   alone when it is unset or empty, and a bad value is said once (a warning) and ignored; a
   value above `max` is capped, with a warning. */
static void tb__native_env_count(const char *name, long max, uint32_t *out) {
    const char *v = tb__getenv(name);
    char *end = NULL;
    long n;
    if (v == NULL || v[0] == '\0') return;
    errno = 0;
    n = strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 1 || errno != 0) {
        tb_log_message(TB_LOG_WARN, "native: %s='%.64s' is not a whole number >= 1; ignored", name,
                       v);
        return;
    }
    if (n > max) {
        tb_log_message(TB_LOG_WARN, "native: %s=%ld is more than %ld; using %ld", name, n, max,
                       max);
        n = max;
    }
    *out = (uint32_t)n;
}

/* TB_COMPILE_TIMEOUT: the seconds a compile may take (unset or empty: 300; 0: no limit). A bad
   value is said (a warning) and the default kept. */
static double tb__native_env_timeout(void) {
    const char *v = tb__getenv("TB_COMPILE_TIMEOUT");
    char *end = NULL;
    double t;
    if (v == NULL || v[0] == '\0') return 300.0;
    t = strtod(v, &end);
    if (end == v || *end != '\0' || !(t >= 0.0) || t > 1e7) {
        tb_log_message(TB_LOG_WARN,
                       "native: TB_COMPILE_TIMEOUT='%.64s' is not a number of seconds (>= 0; 0: "
                       "no limit); using 300",
                       v);
        return 300.0;
    }
    return t;
}

/* Facts of the device, the compiler's command and options; an unusable runtime says why. */
static void tb__native_probe(tb__native_rt *rt) {
    const char *cc = tb__getenv("CC"), *extra = tb__getenv("TB_NATIVE_CFLAGS");
    long cores = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    struct stat st;
    tb_device_info *info = &rt->info;
    strcpy(info->device.backend, "native");
    info->device.type = TB_DEVICE_CPU;
    snprintf(info->vendor, sizeof info->vendor, "torch_backend.h");
    snprintf(info->language_version, sizeof info->language_version, "C99");
    snprintf(info->driver_version, sizeof info->driver_version, "%s", TB_VERSION_STRING);
    info->compute_units = cores > 0 ? (uint32_t)cores : 1;
    /* more threads than 16 per core only add switching; the cap keeps a typo harmless */
    tb__native_env_count("TB_NATIVE_THREADS", 16 * (cores > 0 ? cores : 1), &info->compute_units);
    info->global_memory = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    info->max_allocation = info->global_memory;
    info->max_work_group_size = 1;
    info->unified_memory = true;
    info->supports_f64 = true;
    tb__native_read_cpu(rt);
#if defined(_SC_LEVEL2_CACHE_SIZE)
    {
        long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        rt->l2_bytes = l2 > 0 ? (uint64_t)l2 : 0;
    }
#endif
    rt->stats.cache_limit = info->global_memory / 8;
    if (rt->stats.cache_limit < ((uint64_t)64 << 20)) rt->stats.cache_limit = (uint64_t)64 << 20;
    rt->timeout_s = tb__native_env_timeout();
    if (sizeof(long) != 8) {
        rt->proc.status = TB_ERR_UNAVAILABLE;
        snprintf(rt->proc.reason, sizeof rt->proc.reason,
                 "native: needs a 64-bit long (an LP64 system)");
        return;
    }
    rt->cc_command = tb__strdup(cc != NULL ? cc : "cc");
    rt->cc_text = tb__strdup(cc != NULL ? cc : "cc");
    rt->options = tb__format(
        "-std=gnu99 -O3 -march=native -fPIC -shared -ffp-contract=off -fno-math-errno -w%s%s",
        extra != NULL ? " " : "", extra != NULL ? extra : "");
    rt->options_text = rt->options != NULL ? tb__strdup(rt->options) : NULL;
    if (rt->cc_command == NULL || rt->cc_text == NULL || rt->options == NULL ||
        rt->options_text == NULL ||
        !tb__native_split_words(rt->cc_text, &rt->cc_argv, &rt->cc_argc) ||
        !tb__native_split_words(rt->options_text, &rt->opt_argv, &rt->opt_argc)) {
        rt->proc.status = TB_ERR_OUT_OF_MEMORY;
        snprintf(rt->proc.reason, sizeof rt->proc.reason, "native: out of memory");
        return;
    }
    if (rt->cc_argc == 0 || !tb__native_find_program(rt->cc_argv[0], rt->cc_path) ||
        stat(rt->cc_path, &st) != 0) {
        rt->proc.status = TB_ERR_UNAVAILABLE;
        snprintf(rt->proc.reason, sizeof rt->proc.reason,
                 "native: no C compiler: '%.200s' is not an executable on PATH (set CC)",
                 rt->cc_argc > 0 ? rt->cc_argv[0] : (cc != NULL ? cc : "cc"));
        return;
    }
    /* the compiler's identity for the disk cache, beside its whole command: the file it runs
       (a new version is another file, or the same file changed) */
    snprintf(rt->cc_id, sizeof rt->cc_id, "%s (%lld bytes, modified %lld)", rt->cc_path,
             (long long)st.st_size, (long long)st.st_mtime);
}

/* The runtime, made on first use. Call with tb__native_mutex held. NULL (the error set) when
   memory ran out: nothing is kept, and the next call tries again. */
static tb__native_rt *tb__native_rt_get(void) {
    tb__native_rt *rt = (tb__native_rt *)tb__native_current;
    if (rt != NULL) return rt;
    rt = (tb__native_rt *)tb__kit_proc_new(sizeof *rt, tb__native_rt_destroy);
    if (rt == NULL) return NULL;
    tb__native_probe(rt);
    if (rt->proc.status == TB_OK) {
        rt->pool = tb__native_pool_new(rt->info.compute_units > 1 ? rt->info.compute_units - 1 : 0);
        if (rt->pool == NULL) {
            rt->proc.status = TB_ERR_OUT_OF_MEMORY;
            snprintf(rt->proc.reason, sizeof rt->proc.reason, "native: out of memory");
        }
    }
    return (tb__native_rt *)tb__kit_proc_keep(&tb__native_current, &rt->proc);
}

/* The usable runtime for `ordinal`, or NULL with the error set. Call with the mutex held. */
static tb__native_rt *tb__native_device(int32_t ordinal, const char *func) {
    tb__native_rt *rt = tb__native_rt_get();
    if (!tb__kit_proc_usable(rt != NULL ? &rt->proc : NULL)) return NULL;
    if (ordinal != 0) {
        tb__error(TB_ERR_NOT_FOUND, "%s: no device native:%d (1 device)", func, (int)ordinal);
        return NULL;
    }
    return rt;
}

static void tb__native_buf_destroy(tb__native_buf *b) {
    tb__free(b->base);
    tb__free(b);
}

static void tb__native_cache_trim(tb__native_rt *rt, uint64_t keep) {
    while (rt->cache_count > 0 && rt->stats.cached_bytes > keep) {
        tb__native_buf *b = rt->cache[0];
        memmove(rt->cache, rt->cache + 1, (rt->cache_count - 1) * sizeof *rt->cache);
        rt->cache_count--;
        rt->stats.cached_bytes -= b->k.cap;
        tb__native_buf_destroy(b);
        tb__native_rt_unref(rt);
    }
}

/* A buffer of `size` bytes from the cache (the smallest of its size class) or new. Call with
   the mutex held. */
static tb_status tb__native_buf_alloc(tb__native_rt *rt, size_t size, tb__native_buf **out) {
    size_t cap = tb__size_class(size), i;
    tb__native_buf *b;
    for (i = 0; i < rt->cache_count; i++) {
        if (rt->cache[i]->k.cap == cap) {
            b = rt->cache[i];
            memmove(rt->cache + i, rt->cache + i + 1,
                    (rt->cache_count - i - 1) * sizeof *rt->cache);
            rt->cache_count--;
            rt->stats.cached_bytes -= b->k.cap;
            b->k.size = size;
            b->k.gen = tb__next_generation();
            rt->stats.bytes_in_use += b->k.cap;
            if (rt->stats.bytes_in_use > rt->stats.peak_bytes)
                rt->stats.peak_bytes = rt->stats.bytes_in_use;
            *out = b;
            return TB_OK;
        }
    }
    b = (tb__native_buf *)tb__calloc(1, sizeof *b);
    if (b == NULL) return TB_ERR_OUT_OF_MEMORY;
    if (cap > SIZE_MAX - 64 || (b->base = tb__alloc(cap + 64)) == NULL) {
        tb__native_cache_trim(rt, 0); /* what the cache holds may be what is missing */
        b->base = cap > SIZE_MAX - 64 ? NULL : tb__alloc(cap + 64);
        if (b->base == NULL) {
            tb__free(b);
            return tb__error(TB_ERR_OUT_OF_MEMORY, "native: cannot allocate %zu bytes", size);
        }
    }
    b->k.mem = (unsigned char *)b->base + (64 - (uintptr_t)b->base % 64) % 64;
    b->k.device = rt;
    b->k.size = size;
    b->k.cap = cap;
    b->k.gen = tb__next_generation();
    tb__kit_proc_ref(&rt->proc);
    rt->stats.bytes_in_use += cap;
    if (rt->stats.bytes_in_use > rt->stats.peak_bytes)
        rt->stats.peak_bytes = rt->stats.bytes_in_use;
    *out = b;
    return TB_OK;
}

/* Gives a buffer back: cached for reuse while the cache has room; a borrowed one goes back to
   its owner (release, called with the mutex held). Call with the mutex held. */
static void tb__native_buf_free(tb__native_rt *rt, tb__native_buf *b) {
    if (b == NULL) return;
    if (b->borrowed) {
        void (*release)(void *context) = b->release;
        void *context = b->context;
        tb__free(b);
        tb__native_rt_unref(rt);
        if (release != NULL) release(context);
        return;
    }
    rt->stats.bytes_in_use -= b->k.cap;
    if (rt->proc.exited || b->k.cap > rt->stats.cache_limit ||
        tb__grow((void **)&rt->cache, &rt->cache_cap, rt->cache_count + 1, sizeof *rt->cache) !=
            TB_OK) {
        tb__native_buf_destroy(b);
        tb__native_rt_unref(rt);
        return;
    }
    rt->cache[rt->cache_count++] = b;
    rt->stats.cached_bytes += b->k.cap;
    tb__native_cache_trim(rt, rt->stats.cache_limit);
}

#endif /* TB__HAVE_NATIVE */
