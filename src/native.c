/* ===========================================================================================
   Native backend ("native"): the planner's kernels rendered as C99 (codegen.c, codegen_kernels.c),
   compiled at run time by the system C compiler ($CC, else cc) into a shared object, loaded with
   dlopen and run on a pool of threads (one per core: a kernel's work items are split among them).
   Programs are cached on disk as OpenCL's are (diskcache.c), keyed by the source, the compiler, its
   options, the CPU and this library's version. Memory is host memory. Without a compiler the
   backend has no device and says why, as OpenCL without a loader does.
   =========================================================================================== */
#include "impl_begin.h"

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

/* A host buffer, 64-byte aligned (the payload of every native tb_backend_data). */
typedef struct tb__native_buf {
    void *base;
    unsigned char *ptr;
    size_t size;  /* bytes asked for */
    size_t cap;   /* bytes it holds: the size class */
    uint64_t gen; /* tb__next_generation when it was handed out or last written */
} tb__native_buf;

/* A loaded shared object, shared by every computation whose source is the same. */
typedef struct tb__native_prog {
    struct tb__native_prog *next;
    uint64_t key[2];
    char *source; /* confirms a hit on the key */
    size_t source_len;
    void *handle;
    int32_t refcount; /* computations using it, plus one while it is in the cache */
} tb__native_prog;

typedef struct tb__native_rt {
    int32_t refcount; /* the backend's reference, plus one per buffer and computation alive */
    bool exited;
    tb_status status; /* TB_OK, or why the backend cannot be used */
    char reason[512];
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
    uint64_t cached_bytes, cache_limit, bytes_in_use, peak_bytes;
    tb__native_prog *programs;
    uint64_t compiles, disk_hits, disk_misses, disk_rejected, kernels_launched;
    int32_t cache_dir_reported; /* atomic: why the cache folder is not used was said */
} tb__native_rt;

/* Guards the runtime, its allocator and its program cache (never held while the compiler
   runs); runs are serialised by tb__native_run_mutex (one job in the pool at a time). */
static tb__mutex tb__native_mutex = TB__MUTEX_INIT;
static tb__mutex tb__native_run_mutex = TB__MUTEX_INIT;
static tb__native_rt *tb__native_current;

#define TB__NATIVE_MAX_PROGRAMS 256

static const tb__disk_format tb__native_disk_format = {"native", "TBNATIVE", 1u, ".so"};

/* The bits of a program key that count (all: the in-memory cache confirms hits by source). */
static const uint64_t tb__native_key_mask = ~(uint64_t)0;

static void tb__native_prog_free(tb__native_prog *prog) {
    if (prog->handle != NULL) dlclose(prog->handle);
    tb__free(prog->source);
    tb__free(prog);
}

static void tb__native_rt_destroy(tb__native_rt *rt) {
    tb__native_prog *prog, *next;
    size_t i;
    tb__native_pool_free(rt->pool);
    for (prog = rt->programs; prog != NULL; prog = next) {
        next = prog->next;
        tb__native_prog_free(prog);
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
    if (rt != NULL && --rt->refcount == 0) tb__native_rt_destroy(rt);
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
    rt->cache_limit = info->global_memory / 8;
    if (rt->cache_limit < ((uint64_t)64 << 20)) rt->cache_limit = (uint64_t)64 << 20;
    rt->timeout_s = tb__native_env_timeout();
    if (sizeof(long) != 8) {
        rt->status = TB_ERR_UNAVAILABLE;
        snprintf(rt->reason, sizeof rt->reason, "native: needs a 64-bit long (an LP64 system)");
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
        rt->status = TB_ERR_OUT_OF_MEMORY;
        snprintf(rt->reason, sizeof rt->reason, "native: out of memory");
        return;
    }
    if (rt->cc_argc == 0 || !tb__native_find_program(rt->cc_argv[0], rt->cc_path) ||
        stat(rt->cc_path, &st) != 0) {
        rt->status = TB_ERR_UNAVAILABLE;
        snprintf(rt->reason, sizeof rt->reason,
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
    tb__native_rt *rt = tb__native_current;
    if (rt != NULL) return rt;
    rt = (tb__native_rt *)tb__calloc(1, sizeof *rt);
    if (rt == NULL) return NULL;
    rt->refcount = 1;
    tb__native_probe(rt);
    if (rt->status == TB_OK) {
        rt->pool = tb__native_pool_new(rt->info.compute_units > 1 ? rt->info.compute_units - 1 : 0);
        if (rt->pool == NULL) {
            rt->status = TB_ERR_OUT_OF_MEMORY;
            snprintf(rt->reason, sizeof rt->reason, "native: out of memory");
        }
    }
    if (rt->status == TB_ERR_OUT_OF_MEMORY) {
        tb__error(rt->status, "%s", rt->reason);
        tb__native_rt_destroy(rt);
        return NULL;
    }
    if (rt->status != TB_OK) tb_log_message(TB_LOG_INFO, "%s", rt->reason);
    tb__native_current = rt;
    return rt;
}

/* The usable runtime for `ordinal`, or NULL with the error set. Call with the mutex held. */
static tb__native_rt *tb__native_device(int32_t ordinal, const char *func) {
    tb__native_rt *rt = tb__native_rt_get();
    if (rt == NULL) return NULL;
    if (rt->status != TB_OK) {
        tb__error(rt->status, "%s", rt->reason);
        return NULL;
    }
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
    while (rt->cache_count > 0 && rt->cached_bytes > keep) {
        tb__native_buf *b = rt->cache[0];
        memmove(rt->cache, rt->cache + 1, (rt->cache_count - 1) * sizeof *rt->cache);
        rt->cache_count--;
        rt->cached_bytes -= b->cap;
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
        if (rt->cache[i]->cap == cap) {
            b = rt->cache[i];
            memmove(rt->cache + i, rt->cache + i + 1,
                    (rt->cache_count - i - 1) * sizeof *rt->cache);
            rt->cache_count--;
            rt->cached_bytes -= b->cap;
            b->size = size;
            b->gen = tb__next_generation();
            rt->bytes_in_use += b->cap;
            if (rt->bytes_in_use > rt->peak_bytes) rt->peak_bytes = rt->bytes_in_use;
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
    b->ptr = (unsigned char *)b->base + (64 - (uintptr_t)b->base % 64) % 64;
    b->size = size;
    b->cap = cap;
    b->gen = tb__next_generation();
    rt->refcount++;
    rt->bytes_in_use += cap;
    if (rt->bytes_in_use > rt->peak_bytes) rt->peak_bytes = rt->bytes_in_use;
    *out = b;
    return TB_OK;
}

/* Gives a buffer back: cached for reuse while the cache has room. Call with the mutex held. */
static void tb__native_buf_free(tb__native_rt *rt, tb__native_buf *b) {
    if (b == NULL) return;
    rt->bytes_in_use -= b->cap;
    if (rt->exited || b->cap > rt->cache_limit ||
        tb__grow((void **)&rt->cache, &rt->cache_cap, rt->cache_count + 1, sizeof *rt->cache) !=
            TB_OK) {
        tb__native_buf_destroy(b);
        tb__native_rt_unref(rt);
        return;
    }
    rt->cache[rt->cache_count++] = b;
    rt->cached_bytes += b->cap;
    tb__native_cache_trim(rt, rt->cache_limit);
}

/* ---- programs: compile, load, cache ---- */

/* Names temporary folders apart. */
static uint32_t tb__native_tmp_counter = 0;

/* A new private temporary folder (0700) for one program; NULL with the error set. mkdir fails
   on a name that exists, so the folder is ours alone. */
static char *tb__native_tmpdir(void) {
    const char *base = tb__getenv("TMPDIR");
    int tries, err = 0;
    for (tries = 0; tries < 16; tries++) {
        unsigned serial = (unsigned)(TB__ATOMIC_ADD(&tb__native_tmp_counter, 1) - 1);
        char *dir =
            tb__format("%s/tb_native_%ld_%u_%llx", base != NULL ? base : "/tmp", (long)getpid(),
                       serial, (unsigned long long)(tb__now_ns() & 0xffffff));
        if (dir == NULL) return NULL;
        if (mkdir(dir, 0700) == 0) return dir;
        err = errno;
        tb__free(dir);
        if (err != EEXIST) break;
    }
    tb__error(TB_ERR_IO, "native: cannot make a temporary folder in %s: %s",
              base != NULL ? base : "/tmp", strerror(err));
    return NULL;
}

static bool tb__native_write_file(const char *path, const void *data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOCTTY, 0600);
    const unsigned char *p = (const unsigned char *)data;
    bool ok = fd >= 0;
    while (ok && n > 0) {
        ssize_t put = write(fd, p, n);
        if (put < 0 && errno == EINTR) continue;
        if (put == 0) errno = EIO; /* nothing written: no reason of write's own to report */
        if (put <= 0) ok = false;
        if (put > 0) {
            p += put;
            n -= (size_t)put;
        }
    }
    if (fd >= 0 && close(fd) != 0) ok = false;
    return ok;
}

/* The whole file (caller frees; NUL-terminated too), or NULL. */
static unsigned char *tb__native_read_file(const char *path, size_t *size) {
    int fd = open(path, O_RDONLY | O_NOCTTY);
    struct stat st;
    unsigned char *buf = NULL;
    size_t got = 0;
    if (fd < 0) return NULL;
    if (fstat(fd, &st) == 0 && st.st_size >= 0 && (uint64_t)st.st_size < ((uint64_t)1 << 30)) {
        buf = (unsigned char *)tb__alloc((size_t)st.st_size + 1);
        while (buf != NULL && got < (size_t)st.st_size) {
            ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        if (buf != NULL) buf[got] = '\0';
    }
    close(fd);
    if (size != NULL) *size = got;
    return buf;
}

/* What the supervisor of a compile reports (tb__native_spawn). */
typedef struct tb__native_outcome {
    int32_t kind;  /* 'x' exited, 's' killed by a signal, 't' timed out, 'f' could not fork,
                      'u' the compiler's end was not seen (waitpid failed) */
    int32_t value; /* the exit status, the signal, or errno */
} tb__native_outcome;

#define TB__NATIVE_FD_LIMIT 65536

/* Closes every descriptor from `low` up (async-signal-safe: between fork and exec). */
static void tb__native_close_from(int low, long limit) {
    long fd;
    for (fd = low; fd < limit; fd++)
        (void)close((int)fd);
}

/* What the supervisor of a compile needs, made before the fork (after it, only
   async-signal-safe calls): the compiler, its limit, and the files to remove when the
   library's process ends during the compile. */
typedef struct tb__native_job {
    const char *path;
    char *const *argv;
    double timeout_s;
    long fd_limit;
    const char *const *files; /* NULL-terminated; then the folder */
    const char *dir;
} tb__native_job;

/* Waits for the compiler `cc` (a child of the supervisor) to end: until the compiler's tree
   closes `done` (the usual end: at once) or, where something else holds `done` open (a helper
   the compiler started, a program another thread started meanwhile), until waitpid sees it,
   asked at growing intervals up to 50 ms; until `alive` closes (the library's process has
   ended) or the deadline passes. The outcome's kind: 'x' ended, 'k' the process ended, 't'
   timed out. On 'x', *status is the compiler's. */
static int32_t tb__native_await(pid_t cc, double timeout_s, int *status) {
    uint64_t start = tb__now_ns();
    int wait_ms = 1, n;
    bool done_open = true;
    for (;;) {
        struct pollfd fds[2];
        int ms = wait_ms;
        pid_t w = waitpid(cc, status, WNOHANG);
        if (w == cc) return 'x';
        if (w < 0 && errno != EINTR) return 'u';
        if (timeout_s > 0) {
            double left = timeout_s - (double)(tb__now_ns() - start) * 1e-9;
            if (left <= 0) return 't';
            if (left * 1000.0 < (double)ms) ms = (int)(left * 1000.0) + 1;
        }
        fds[0].fd = 4;
        fds[0].events = POLLIN;
        fds[1].fd = done_open ? 6 : -1; /* a negative descriptor is not polled */
        fds[1].events = POLLIN;
        fds[0].revents = fds[1].revents = 0;
        n = poll(fds, 2, ms);
        if (n > 0 && fds[0].revents != 0) return 'k';
        if (n > 0 && fds[1].revents != 0) {
            done_open = false; /* the tree has closed it: waitpid has the end at once */
            wait_ms = 1;
            continue;
        }
        if (wait_ms < 50) wait_ms *= 2;
    }
}

/* The supervisor of one compile, in the child of fork: signals as a new process has them (the
   program's handlers are not ours to run, and a program that ignores SIGCHLD would have the
   compiler reaped for it), then the compiler started in a process group of its own (the
   driver and every compiler it starts), stdin from /dev/null, stdout and stderr into the log;
   the group is killed when the library's process ends or the deadline passes. Reports on
   `report` and exits. Descriptors: 0 /dev/null, 3 log, 4 alive (read end), 5 report (write
   end), 6 done (read end), 7 done (write end). */
static void tb__native_supervise(const tb__native_job *job) {
    static const int terminal[] = {SIGINT, SIGQUIT, SIGHUP, SIGPIPE};
    tb__native_outcome out;
    int status = 0, k;
    size_t f;
    pid_t cc, supervisor;
    for (k = 1; k < 32; k++)
        (void)signal(k, SIG_DFL); /* SIGKILL and SIGSTOP refuse: no matter */
    /* a Ctrl-C or hang-up meant for the program ends the program, and with it the compile */
    for (k = 0; k < 4; k++)
        (void)signal(terminal[k], SIG_IGN);
    supervisor = getpid();
    cc = fork();
    if (cc == 0) {
        for (k = 0; k < 4; k++)
            (void)signal(terminal[k], SIG_DFL);
        (void)setpgid(0, 0);
#if defined(__linux__) && defined(PR_SET_PDEATHSIG)
        /* should the supervisor itself be killed, the compiler goes with it */
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != supervisor) _exit(126);
#endif
        if (dup2(3, 1) < 0 || dup2(3, 2) < 0) _exit(126);
        /* the write end of `done` stays open in the compiler's tree until its last process ends */
        if (dup2(7, 3) < 0) _exit(126);
        tb__native_close_from(4, job->fd_limit);
        (void)execve(job->path, job->argv, environ);
        {
            static const char msg[] = "native: the compiler could not be started (execve)\n";
            ssize_t w = write(2, msg, sizeof msg - 1);
            (void)w;
        }
        _exit(127);
    }
    (void)supervisor;
    (void)close(7);
    out.value = 0;
    if (cc < 0) {
        out.kind = 'f';
        out.value = errno;
    } else {
        (void)setpgid(cc, cc); /* the compiler does so too: whichever runs first */
        out.kind = tb__native_await(cc, job->timeout_s, &status);
        if (out.kind == 't' || out.kind == 'k') {
            (void)kill(-cc, SIGKILL);
            while (waitpid(cc, &status, 0) < 0 && errno == EINTR) {
            }
        }
        if (out.kind == 'k') {
            /* nobody is left to remove the compile's files */
            for (f = 0; job->files[f] != NULL; f++)
                (void)unlink(job->files[f]);
            (void)rmdir(job->dir);
        }
        if (out.kind == 'x' && WIFEXITED(status)) {
            out.value = WEXITSTATUS(status);
        } else if (out.kind == 'x') {
            out.kind = 's';
            out.value = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        }
    }
    {
        const char *p = (const char *)&out;
        size_t left = sizeof out;
        while (left > 0) {
            ssize_t w = write(5, p, left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) break;
            p += w;
            left -= (size_t)w;
        }
    }
    _exit(0);
}

/* Runs the compiler (`argv`, argv[0] found at `path`) with its output into the file `log`,
   under a supervisor process (tb__native_supervise) that ends the compiler's whole process
   group when `timeout_s` seconds pass (0: no limit) or when this process ends, so that no
   compiler outlives it; `files` (NULL-terminated) and `dir` are the compile's, removed by the
   supervisor if this process ends first. Returns the exit status, 128 + the signal that ended
   it, or -1 with the error set (it could not start, or it timed out: TB_ERR_COMPILE saying
   so). */
static int tb__native_spawn(const char *path, char *const *argv, const char *log, double timeout_s,
                            const char *const *files, const char *dir) {
    int logfd, null_fd, alive[2] = {-1, -1}, report[2] = {-1, -1}, done[2] = {-1, -1}, err = 0;
    long fd_limit = sysconf(_SC_OPEN_MAX);
    tb__native_outcome out;
    tb__native_job job;
    size_t got = 0;
    pid_t sup;
    if (fd_limit < 64 || fd_limit > TB__NATIVE_FD_LIMIT) fd_limit = TB__NATIVE_FD_LIMIT;
    job.path = path;
    job.argv = argv;
    job.timeout_s = timeout_s;
    job.fd_limit = fd_limit;
    job.files = files;
    job.dir = dir;
    logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_NOCTTY | TB__DISK_O_CLOEXEC, 0600);
    null_fd = open("/dev/null", O_RDWR | O_NOCTTY | TB__DISK_O_CLOEXEC);
    if (logfd < 0 || null_fd < 0 || pipe(alive) != 0 || pipe(report) != 0 || pipe(done) != 0) {
        err = errno;
        if (logfd >= 0) close(logfd);
        if (null_fd >= 0) close(null_fd);
        if (alive[0] >= 0) close(alive[0]), close(alive[1]);
        if (report[0] >= 0) close(report[0]), close(report[1]);
        tb__error(TB_ERR_IO, "native: cannot start the compiler: %s", strerror(err));
        return -1;
    }
    /* ours stay out of programs that other threads start meanwhile (the supervisor's copies
       lose the flag when it moves them into place) */
    for (got = 0; got < 2; got++) {
        (void)fcntl(alive[got], F_SETFD, FD_CLOEXEC);
        (void)fcntl(report[got], F_SETFD, FD_CLOEXEC);
        (void)fcntl(done[got], F_SETFD, FD_CLOEXEC);
    }
    got = 0;
    sup = fork();
    if (sup == 0) {
        /* the descriptors in the places tb__native_supervise expects, whatever the program had
           open (with stdin, stdout or stderr closed, ours would be 0 to 2), the rest closed (a
           supervisor holding another compile's `alive` would keep that one from seeing us go) */
        int want[6], k;
        want[0] = null_fd, want[1] = logfd, want[2] = alive[0], want[3] = report[1];
        want[4] = done[0], want[5] = done[1];
        for (k = 0; k < 6; k++) {
            int moved = fcntl(want[k], F_DUPFD, 16); /* above 0..7: no collision below */
            if (moved < 0) _exit(1);
            want[k] = moved;
        }
        for (k = 0; k < 3; k++)
            if (dup2(want[0], k) < 0) _exit(1);
        for (k = 1; k < 6; k++)
            if (dup2(want[k], 2 + k) < 0) _exit(1);
        tb__native_close_from(8, fd_limit);
        tb__native_supervise(&job);
    }
    err = errno;
    close(logfd);
    close(null_fd);
    close(alive[0]);
    close(report[1]);
    close(done[0]);
    close(done[1]);
    if (sup < 0) {
        close(alive[1]);
        close(report[0]);
        tb__error(TB_ERR_UNAVAILABLE, "native: cannot start the compiler: %s", strerror(err));
        return -1;
    }
    memset(&out, 0, sizeof out);
    while (got < sizeof out) {
        ssize_t r = read(report[0], (char *)&out + got, sizeof out - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(report[0]);
    /* ECHILD: the program ignores SIGCHLD and the supervisor was reaped for it */
    while (waitpid(sup, NULL, 0) < 0 && errno == EINTR) {
    }
    close(alive[1]);
    if (got != sizeof out) {
        tb__error(TB_ERR_COMPILE, "native: the compiler's supervisor ended without a report");
        return -1;
    }
    switch (out.kind) {
    case 'x':
        return out.value;
    case 's':
        return 128 + out.value;
    case 't':
        tb__error(TB_ERR_COMPILE,
                  "native: the compiler (%s) did not finish within %g s and was stopped "
                  "(TB_COMPILE_TIMEOUT sets the limit; 0 removes it)",
                  argv[0], timeout_s);
        return -1;
    case 'u':
        tb__error(TB_ERR_COMPILE, "native: the end of the compiler (%s) was not seen", argv[0]);
        return -1;
    default:
        tb__error(TB_ERR_UNAVAILABLE, "native: cannot start the compiler: %s", strerror(out.value));
        return -1;
    }
}

/* Removes a temporary folder and the files of ours in it. */
static void tb__native_tmp_clean(const char *dir) {
    static const char *const names[] = {"k.c", "k.so", "k.log"};
    size_t i;
    for (i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *path = tb__format("%s/%s", dir, names[i]);
        if (path != NULL) (void)unlink(path);
        tb__free(path);
    }
    (void)rmdir(dir);
}

/* What a shared object depends on: the compiler and its options, the CPU, this library's
   version and the source. */
static void tb__native_disk_key(const tb__native_rt *rt, const char *src, size_t len,
                                tb__disk_key *key) {
    memset(key, 0, sizeof *key);
    tb__disk_key_add(key, rt->cc_command, (size_t)-1);
    tb__disk_key_add(key, rt->cc_id, (size_t)-1);
    tb__disk_key_add(key, rt->cc_macros, (size_t)-1);
    tb__disk_key_add(key, rt->options, (size_t)-1);
    tb__disk_key_add(key, rt->cpu, (size_t)-1);
    tb__disk_key_add(key, TB_VERSION_STRING, (size_t)-1);
    tb__disk_key_add(key, src, len);
}

/* Loads the shared object `bytes` through a private temporary file. */
static void *tb__native_load_bytes(const unsigned char *bytes, size_t n) {
    char *dir = tb__native_tmpdir(), *path;
    void *handle = NULL;
    if (dir == NULL) return NULL;
    path = tb__format("%s/k.so", dir);
    if (path != NULL && tb__native_write_file(path, bytes, n))
        handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    tb__native_tmp_clean(dir);
    tb__free(path);
    tb__free(dir);
    return handle;
}

/* Compiles `src` into a shared object; its handle, and its bytes in *so (caller frees). */
static tb_status tb__native_compile_source(tb__native_rt *rt, const char *src, size_t len,
                                           void **handle, unsigned char **so, size_t *so_len) {
    char **argv = NULL, *dir, *csrc = NULL, *out = NULL, *log = NULL;
    size_t i = 0, k;
    int rc;
    tb_status st = TB_OK;
    *handle = NULL;
    *so = NULL;
    dir = tb__native_tmpdir();
    if (dir == NULL) return tb_last_status();
    csrc = tb__format("%s/k.c", dir);
    out = tb__format("%s/k.so", dir);
    log = tb__format("%s/k.log", dir);
    argv = (char **)tb__calloc(rt->cc_argc + rt->opt_argc + 6, sizeof *argv);
    if (csrc == NULL || out == NULL || log == NULL || argv == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
    } else if (!tb__native_write_file(csrc, src, len)) {
        st = tb__error(TB_ERR_IO, "native: cannot write %s: %s", csrc, strerror(errno));
    }
    if (st == TB_OK) {
        /* word for word: $CC's words, then the options' */
        for (k = 0; k < rt->cc_argc; k++)
            argv[i++] = rt->cc_argv[k];
        for (k = 0; k < rt->opt_argc; k++)
            argv[i++] = rt->opt_argv[k];
        argv[i++] = (char *)"-o";
        argv[i++] = out;
        argv[i++] = csrc;
        argv[i++] = (char *)"-lm";
        argv[i] = NULL;
        const char *files[4];
        files[0] = csrc, files[1] = out, files[2] = log, files[3] = NULL;
        rc = tb__native_spawn(rt->cc_path, argv, log, rt->timeout_s, files, dir);
        if (rc < 0) {
            st = tb_last_status();
        } else if (rc != 0) {
            char *text = (char *)tb__native_read_file(log, NULL);
            st = tb__error(TB_ERR_COMPILE,
                           "native: the program does not compile (%s exited with %d):\n%.800s",
                           rt->cc_argv[0], rc, text != NULL ? text : "(no output)");
            tb__free(text);
        }
    }
    if (st == TB_OK) {
        *so = tb__native_read_file(out, so_len);
        *handle = dlopen(out, RTLD_NOW | RTLD_LOCAL);
        if (*handle == NULL) {
            const char *why = dlerror();
            st = tb__error(TB_ERR_COMPILE, "native: cannot load the compiled program: %s",
                           why != NULL ? why : "unknown reason");
        }
    }
    tb__native_tmp_clean(dir);
    tb__free(argv);
    tb__free(csrc);
    tb__free(out);
    tb__free(log);
    tb__free(dir);
    if (st != TB_OK) {
        tb__free(*so);
        *so = NULL;
    }
    return st;
}

/* ---- the host's vector shape ---- */

/* What the CPU has, asked of the CPU itself (cpuid on x86-64 through the compiler's builtin,
   which also checks that the system saves the wider registers; NEON is part of AArch64). */
static void tb__native_cpu_shape(tb__host_shape *s) {
    memset(s, 0, sizeof *s);
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    s->x86 = true;
    s->vec_bytes = 16; /* SSE2 is part of x86-64 */
    s->vec_regs = 16;
    if (__builtin_cpu_supports("avx2")) s->vec_bytes = 32;
    if (__builtin_cpu_supports("avx512f")) s->vec_bytes = 64, s->vec_regs = 32;
    s->fma = __builtin_cpu_supports("fma") != 0;
    /* F16C has no name for the builtin in every compiler: AVX2 CPUs have it (Haswell on) */
    s->f16c = s->vec_bytes >= 32;
#elif defined(__aarch64__)
    s->vec_bytes = 16;
    s->vec_regs = 32;
    s->fma = true;
    s->f16c = true;
#else
    s->vec_bytes = 16; /* GNU vectors of 4 floats: the compiler splits them where it must */
    s->vec_regs = 16;
#endif
}

/* What the compiler targets with the backend's options (and the user's): its predefined
   macros, from `cc OPTIONS -dM -E -x c /dev/null`. False when they cannot be read (a compiler
   that does not take these options): then the CPU's shape stands alone. */
static bool tb__native_cc_shape(tb__native_rt *rt, tb__host_shape *s, uint64_t *macros) {
    char *dir = tb__native_tmpdir(), *log = NULL, *text = NULL, **argv = NULL;
    size_t i = 0, k;
    bool ok = false;
    memset(s, 0, sizeof *s);
    if (dir == NULL) return false;
    log = tb__format("%s/k.log", dir);
    argv = (char **)tb__calloc(rt->cc_argc + rt->opt_argc + 8, sizeof *argv);
    if (log != NULL && argv != NULL) {
        for (k = 0; k < rt->cc_argc; k++)
            argv[i++] = rt->cc_argv[k];
        for (k = 0; k < rt->opt_argc; k++)
            if (strcmp(rt->opt_argv[k], "-shared") != 0) argv[i++] = rt->opt_argv[k];
        argv[i++] = (char *)"-dM";
        argv[i++] = (char *)"-E";
        argv[i++] = (char *)"-x";
        argv[i++] = (char *)"c";
        argv[i++] = (char *)"/dev/null";
        argv[i] = NULL;
        const char *files[2];
        files[0] = log, files[1] = NULL;
        if (tb__native_spawn(rt->cc_path, argv, log, rt->timeout_s, files, dir) == 0)
            text = (char *)tb__native_read_file(log, NULL);
    }
    if (text != NULL && strstr(text, "#define __STDC__ ") != NULL) {
        ok = true;
        /* the compiler's version and target as it says them (__VERSION__, __AVX2__, ...) */
        *macros = tb__hash_bytes(0x6d6163726f73ull, text, strlen(text));
        s->x86 = strstr(text, "#define __x86_64__ ") != NULL;
        s->vec_bytes = 16;
        s->vec_regs = 16;
        if (s->x86 && strstr(text, "#define __AVX2__ ") != NULL) s->vec_bytes = 32;
        if (s->x86 && strstr(text, "#define __AVX512F__ ") != NULL)
            s->vec_bytes = 64, s->vec_regs = 32;
        if (strstr(text, "#define __aarch64__ ") != NULL) s->vec_regs = 32;
        s->fma = strstr(text, "#define __FMA__ ") != NULL ||
                 strstr(text, "#define __ARM_FEATURE_FMA ") != NULL;
        s->f16c = strstr(text, "#define __F16C__ ") != NULL ||
                  strstr(text, "#define __aarch64__ ") != NULL;
    }
    tb__free(text);
    tb__free(argv);
    if (log != NULL) (void)unlink(log);
    tb__free(log);
    (void)rmdir(dir);
    tb__free(dir);
    return ok;
}

/* Names a shape's class: "avx512", "avx2", "sse", "neon" or "vec4". */
static void tb__native_shape_name(tb__host_shape *s) {
    const char *name = s->vec_bytes >= 64   ? "avx512"
                       : s->vec_bytes >= 32 ? "avx2"
                       : s->x86             ? "sse"
                       : s->vec_regs >= 32  ? "neon"
                                            : "vec4";
    snprintf(s->name, sizeof s->name, "%s", name);
}

/* The vector shape of the programs, once: what both the CPU and the compiler's target have.
   Where the compiler targets more than the CPU has (it runs on another machine, or under an
   emulator's CPU model), options that take the surplus away follow the user's, so that the
   programs run here. Call with tb__native_mutex held. */
/* The compiler's options replaced by `options` (text and words); false, nothing changed, when
   memory runs out. Before any compile (tb__native_shape). */
static bool tb__native_set_options(tb__native_rt *rt, const char *options) {
    char *copy = tb__strdup(options), *text = tb__strdup(options), **words = NULL;
    size_t count = 0;
    if (copy == NULL || text == NULL || !tb__native_split_words(text, &words, &count)) {
        tb__free(copy);
        tb__free(text);
        return false;
    }
    tb__free(rt->options);
    tb__free(rt->options_text);
    tb__free(rt->opt_argv);
    rt->options = copy;
    rt->options_text = text;
    rt->opt_argv = words;
    rt->opt_argc = count;
    return true;
}

/* The vector shape to plan for instead of the host's (a test hook: the register blocks of
   every class are rendered on any machine; the programs are compiled for the host still). */
static const tb__host_shape *tb__native_shape_override = NULL;

/* Guards the shaping of the runtime, which runs the compiler (tb__native_mutex is never held
   while it runs); every compile waits for it. */
static tb__mutex tb__native_shape_mutex = TB__MUTEX_INIT;

/* What both the CPU and the compiler's target have (the probe of tb__native_cc_shape), and the
   options that keep the compiler within what the CPU has, where it targets more (it runs on
   another machine, or under an emulator's CPU model). A compiler that refuses -march=native (a
   cross compiler) compiles without it: it is dropped only when the probe then succeeds. */
static void tb__native_probe_shape(tb__native_rt *rt) {
    tb__host_shape cpu, cc;
    uint64_t macros = 0;
    char cut[128] = "";
    bool ok;
    tb__native_cpu_shape(&cpu);
    rt->shape = cpu;
    ok = tb__native_cc_shape(rt, &cc, &macros);
    if (!ok && strstr(rt->options, "-march=native") != NULL) {
        char *saved = tb__strdup(rt->options), *at = strstr(rt->options, "-march=native");
        char *without = saved == NULL ? NULL
                                      : tb__format("%.*s%s", (int)(at - rt->options), rt->options,
                                                   at + strlen("-march=native"));
        if (without != NULL && tb__native_set_options(rt, without))
            ok = tb__native_cc_shape(rt, &cc, &macros);
        if (!ok && saved != NULL) {
            (void)tb__native_set_options(rt, saved);
        } else if (ok && tb_debug_level() >= 1) {
            tb_log_message(TB_LOG_INFO, "native: %s takes no -march=native; compiling without it",
                           rt->cc_command);
        }
        tb__free(without);
        tb__free(saved);
    }
    if (ok) {
        if (cpu.x86 && cc.x86) {
            if (cc.vec_bytes > cpu.vec_bytes)
                strcat(cut,
                       cpu.vec_bytes >= 32 ? " -mno-avx512f" : " -mno-avx512f -mno-avx2 -mno-avx");
            if (cc.fma && !cpu.fma) strcat(cut, " -mno-fma");
            if (cc.f16c && !cpu.f16c) strcat(cut, " -mno-f16c");
        }
        if (cc.vec_bytes < rt->shape.vec_bytes) rt->shape.vec_bytes = cc.vec_bytes;
        if (cc.vec_regs < rt->shape.vec_regs) rt->shape.vec_regs = cc.vec_regs;
        rt->shape.fma = cpu.fma && cc.fma;
        rt->shape.f16c = cpu.f16c && cc.f16c;
    }
    snprintf(rt->cc_macros, sizeof rt->cc_macros, "%016llx", (unsigned long long)macros);
    tb__native_shape_name(&rt->shape);
    if (cut[0] != '\0') {
        char *options = tb__format("%s%s", rt->options, cut);
        if (options != NULL) (void)tb__native_set_options(rt, options);
        tb__free(options);
    }
}

/* The vector shape of the programs, once (tb__native_probe_shape). Call without
   tb__native_mutex held: the compiler runs. The caller's error state is kept. */
static void tb__native_shape(tb__native_rt *rt) {
    tb__saved_error saved;
    tb__mutex_lock(&tb__native_shape_mutex);
    if (!rt->shaped) {
        tb__error_save(&saved);
        if (tb__native_shape_override != NULL) {
            rt->shape = *tb__native_shape_override;
        } else {
            tb__native_probe_shape(rt);
        }
        tb__error_restore(&saved);
        if (tb_debug_level() >= 1) {
            tb_log_message(TB_LOG_INFO,
                           "native: vectors of %d bytes, %d registers%s%s (%s); compiler "
                           "options: %s",
                           (int)rt->shape.vec_bytes, (int)rt->shape.vec_regs,
                           rt->shape.fma ? ", FMA" : "", rt->shape.f16c ? ", F16C" : "",
                           rt->shape.name, rt->options);
        }
        rt->shaped = true;
    }
    tb__mutex_unlock(&tb__native_shape_mutex);
}

static void tb__native_prog_unref(tb__native_rt *rt, tb__native_prog *prog) {
    tb__native_prog **link;
    if (prog == NULL || --prog->refcount > 0) return;
    for (link = &rt->programs; *link != NULL; link = &(*link)->next) {
        if (*link == prog) {
            *link = prog->next;
            break;
        }
    }
    tb__native_prog_free(prog);
}

/* Drops cached programs no computation uses, oldest first, until at most `keep` remain. */
static void tb__native_progs_trim(tb__native_rt *rt, size_t keep) {
    size_t count = 0;
    tb__native_prog *prog;
    for (prog = rt->programs; prog != NULL; prog = prog->next)
        count++;
    while (count > keep) {
        tb__native_prog *oldest = NULL;
        for (prog = rt->programs; prog != NULL; prog = prog->next)
            if (prog->refcount == 1) oldest = prog; /* the list is newest first */
        if (oldest == NULL) break;
        tb__native_prog_unref(rt, oldest);
        count--;
    }
}

static tb__native_prog *tb__native_prog_find(tb__native_rt *rt, const uint64_t key[2],
                                             const char *src, size_t len) {
    tb__native_prog *prog;
    for (prog = rt->programs; prog != NULL; prog = prog->next) {
        if (prog->key[0] == key[0] && prog->key[1] == key[1] && prog->source_len == len &&
            memcmp(prog->source, src, len) == 0) {
            prog->refcount++;
            return prog;
        }
    }
    return NULL;
}

/* The first of the functions `fns` that the loaded program lacks, or NULL when it has them
   all. */
static const char *tb__native_missing_kernel(void *handle, const char *const *fns, size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if (dlsym(handle, fns[i]) == NULL) return fns[i];
    return NULL;
}

/* The loaded program of a source: from memory, from the disk cache, or compiled now (the
   compiler runs without any lock held; *from_disk set when the disk cache had it). A program
   is used, and stored on disk, only when it has every function of `fns`: a cache entry
   without them is removed and the source compiled again, and a compile without them is an
   error that leaves no entry. */
static tb_status tb__native_get_program(tb__native_rt *rt, const char *src, size_t len,
                                        const char *const *fns, size_t num_fns, bool *from_disk,
                                        tb__native_prog **out) {
    const char *why = NULL;
    tb__disk_key dkey;
    uint64_t key[2];
    unsigned char *bytes = NULL;
    size_t n = 0;
    char *save_dir = NULL, *path = NULL;
    void *handle = NULL;
    tb__native_prog *prog;
    tb_status st = TB_OK;
    tb__native_disk_key(rt, src, len, &dkey);
    tb__disk_key_hash(&dkey, tb__native_key_mask, key);
    tb__mutex_lock(&tb__native_mutex);
    prog = tb__native_prog_find(rt, key, src, len);
    tb__mutex_unlock(&tb__native_mutex);
    if (prog != NULL) {
        *out = prog;
        return TB_OK;
    }
    bytes = tb__disk_lookup(&tb__native_disk_format, &dkey, key, &rt->cache_dir_reported, &n,
                            &save_dir, &path, &why);
    if (bytes != NULL) {
        handle = tb__native_load_bytes(bytes, n);
        if (handle == NULL || tb__native_missing_kernel(handle, fns, num_fns) != NULL) {
            why = handle == NULL ? "a shared object that does not load"
                                 : "a shared object that lacks a kernel of the program";
            if (handle != NULL) dlclose(handle);
            handle = NULL;
            tb__disk_reject(path);
            save_dir = tb__disk_cache_path();
        }
        tb__free(bytes);
        bytes = NULL;
    }
    if (handle != NULL) {
        (void)TB__ATOMIC_ADD(&rt->disk_hits, 1);
        *from_disk = true;
    } else {
        if (path != NULL) (void)TB__ATOMIC_ADD(&rt->disk_misses, 1);
        if (why != NULL) {
            if (tb_debug_level() >= 1)
                tb_log_message(TB_LOG_INFO, "native: program cache file %s not used: %s", path,
                               why);
            tb__disk_reject(path);
            (void)TB__ATOMIC_ADD(&rt->disk_rejected, 1);
        }
        st = tb__native_compile_source(rt, src, len, &handle, &bytes, &n);
        if (st == TB_OK && tb__native_missing_kernel(handle, fns, num_fns) != NULL) {
            st = tb__error(TB_ERR_COMPILE,
                           "native: the compiled program has no kernel %s (do CC or "
                           "TB_NATIVE_CFLAGS hide or rename its symbols?)",
                           tb__native_missing_kernel(handle, fns, num_fns));
            dlclose(handle);
            handle = NULL;
        }
        if (st == TB_OK) {
            (void)TB__ATOMIC_ADD(&rt->compiles, 1);
            tb__disk_store(&tb__native_disk_format, save_dir, &dkey, key, &rt->cache_dir_reported,
                           bytes, n);
        }
    }
    tb__free(bytes);
    tb__free(save_dir);
    tb__free(path);
    if (st != TB_OK) return st;
    prog = (tb__native_prog *)tb__calloc(1, sizeof *prog);
    if (prog != NULL) prog->source = (char *)tb__alloc(len + 1);
    if (prog == NULL || prog->source == NULL) {
        tb__free(prog);
        dlclose(handle);
        return TB_ERR_OUT_OF_MEMORY;
    }
    memcpy(prog->source, src, len);
    prog->source[len] = '\0';
    prog->source_len = len;
    prog->key[0] = key[0];
    prog->key[1] = key[1];
    prog->handle = handle;
    prog->refcount = 2; /* the cache and the caller */
    tb__mutex_lock(&tb__native_mutex);
    prog->next = rt->programs;
    rt->programs = prog;
    tb__native_progs_trim(rt, TB__NATIVE_MAX_PROGRAMS);
    tb__mutex_unlock(&tb__native_mutex);
    *out = prog;
    return TB_OK;
}

/* ---- backend entries: devices and data ---- */

static size_t tb__native_get_backend_devices(void *user_data, tb_device *out, size_t cap) {
    tb__native_rt *rt;
    size_t n = 0;
    (void)user_data;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_rt_get();
    if (rt != NULL && rt->status == TB_OK) {
        n = 1;
        if (cap > 0) out[0] = rt->info.device;
    }
    tb__mutex_unlock(&tb__native_mutex);
    return n;
}

static tb_status tb__native_get_device_info(void *user_data, int32_t ordinal, tb_device_info *out) {
    tb__native_rt *rt;
    (void)user_data;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(ordinal, "native");
    if (rt != NULL) rt->refcount++;
    tb__mutex_unlock(&tb__native_mutex);
    if (rt == NULL) return tb_last_status();
    /* the class its programs are built for (the compiler is asked once) */
    tb__native_shape(rt);
    tb__mutex_lock(&tb__native_mutex);
    snprintf(rt->info.language_version, sizeof rt->info.language_version,
             "C99, %.8s vectors (%u f32 lanes, %u registers)", rt->shape.name,
             (unsigned)(unsigned char)(rt->shape.vec_bytes / 4),
             (unsigned)(unsigned char)rt->shape.vec_regs);
    *out = rt->info;
    tb__native_rt_unref(rt);
    tb__mutex_unlock(&tb__native_mutex);
    return TB_OK;
}

static tb_status tb__native_data_from_host(void *user_data, tb_backend_data *data,
                                           const void *host) {
    tb__native_rt *rt;
    tb__native_buf *b = NULL;
    size_t size;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &size);
    if (st != TB_OK) return st;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(data->device.ordinal, "native");
    st = rt != NULL ? tb__native_buf_alloc(rt, size, &b) : tb_last_status();
    tb__mutex_unlock(&tb__native_mutex);
    if (st != TB_OK) return st;
    if (size > 0) memcpy(b->ptr, host, size);
    data->payload = b;
    return TB_OK;
}

static tb_status tb__native_data_from_scalar(void *user_data, tb_backend_data *data,
                                             tb_scalar value) {
    unsigned char bytes[8];
    memset(bytes, 0, sizeof bytes);
    tb__scalar_store(value, data->shape.dtype, bytes);
    return tb__native_data_from_host(user_data, data, bytes);
}

static tb_status tb__native_data_to_host(void *user_data, const tb_backend_data *data, void *host) {
    const tb__native_buf *b = (const tb__native_buf *)data->payload;
    size_t size;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &size);
    if (st != TB_OK) return st;
    if (b == NULL || b->size < size) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "native: data_to_host of a data without a value");
    }
    if (size > 0) memcpy(host, b->ptr, size);
    return TB_OK;
}

static void tb__native_data_release(void *user_data, tb_backend_data *data) {
    tb__native_buf *b = (tb__native_buf *)data->payload;
    (void)user_data;
    if (b == NULL) return;
    tb__mutex_lock(&tb__native_mutex);
    if (tb__native_current != NULL) {
        tb__native_buf_free(tb__native_current, b);
    } else {
        tb__native_buf_destroy(b); /* the backend exited: nothing caches it */
    }
    tb__mutex_unlock(&tb__native_mutex);
    data->payload = NULL;
}

/* The buffers are host memory: the library reads and writes them in place (a collective's
   input and result), with nothing to do at the end. */
static void *tb__native_data_map_host(void *user_data, tb_backend_data *data, bool write) {
    tb__native_rt *rt;
    tb__native_buf *b = NULL;
    size_t size;
    (void)user_data;
    if (!write) {
        b = (tb__native_buf *)data->payload;
        return b != NULL ? b->ptr : NULL;
    }
    if (tb_shape_nbytes(&data->shape, &size) != TB_OK) return NULL;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(data->device.ordinal, "native");
    if (rt != NULL && tb__native_buf_alloc(rt, size, &b) != TB_OK) b = NULL;
    tb__mutex_unlock(&tb__native_mutex);
    if (b == NULL) return NULL;
    data->payload = b;
    return b->ptr;
}

/* ---- backend entries: lowering, compile, execute ---- */

/* Panels a pack kernel made of one parameter's buffer, kept while that buffer (the same object,
   of the same generation) comes again. */
typedef struct tb__native_kept {
    const tb__native_buf *src;
    uint64_t gen;
    tb__native_buf *panels;
} tb__native_kept;

/* A compiled graph: its plan, its source, its program and a function per kernel. */
typedef struct tb__native_comp {
    tb__plan *plan;
    char *source;
    size_t source_len;
    tb__native_rt *rt;
    tb__native_prog **progs; /* the program's parts (tb__native_compile_parts) */
    size_t num_progs;
    tb__native_fn *fns;
    tb__native_kept *kept; /* per kernel */
} tb__native_comp;

/* A lowering context: the computation until compile takes it. */
typedef struct tb__native_context {
    tb__native_comp *comp;
} tb__native_context;

static void tb__native_comp_release(tb__native_comp *c) {
    tb__native_rt *rt;
    if (c == NULL) return;
    rt = c->rt;
    tb__mutex_lock(&tb__native_mutex);
    if (rt != NULL && c->progs != NULL) {
        size_t i;
        for (i = 0; i < c->num_progs; i++)
            if (c->progs[i] != NULL) tb__native_prog_unref(rt, c->progs[i]);
    }
    if (rt != NULL && c->kept != NULL) {
        size_t i;
        for (i = 0; i < c->plan->num_kernels; i++)
            if (c->kept[i].panels != NULL) tb__native_buf_free(rt, c->kept[i].panels);
    }
    tb__native_rt_unref(rt);
    tb__mutex_unlock(&tb__native_mutex);
    tb__free(c->kept);
    tb__free(c->fns);
    tb__free(c->progs);
    tb__free(c->source);
    tb__plan_free(c->plan);
    tb__free(c);
}

/* Plans the graph for the host's threads and renders the plan as C99. */
static tb_status tb__native_create_lowering_context(void *user_data, const tb_graph *graph,
                                                    void **context) {
    tb__native_rt *rt;
    tb__native_comp *c;
    tb__native_context *ctx;
    tb__pgraph G;
    tb__tuning tuning;
    tb__target target;
    tb__dialect dialect;
    tb_status st;
    (void)user_data;
    *context = NULL;
    ctx = (tb__native_context *)tb__calloc(1, sizeof *ctx);
    c = (tb__native_comp *)tb__calloc(1, sizeof *c);
    if (ctx == NULL || c == NULL) {
        tb__free(ctx);
        tb__free(c);
        return TB_ERR_OUT_OF_MEMORY;
    }
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(graph->device.ordinal, "native");
    if (rt != NULL) rt->refcount++;
    tb__mutex_unlock(&tb__native_mutex);
    if (rt == NULL) {
        tb__free(c);
        tb__free(ctx);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    }
    tb__native_shape(rt);
    c->rt = rt;
    tb__tuning_of(TB__CLASS_HOST, &tuning);
    tb__tuning_fit(&tuning, &rt->shape);
    memset(&target, 0, sizeof target);
    target.tuning = &tuning;
    target.compute_units = rt->info.compute_units;
    target.max_group = 1;
    target.max_allocation = rt->info.max_allocation;
    target.max_args = 4096;
    target.f64 = true;
    target.acc_f64 = true;
    target.cache_bytes = rt->l2_bytes;
    target.buffer_align = 64; /* tb__native_buf_alloc */
    target.arg_table = true;  /* tb__native_emit_kernel: TB__CG_ARGS */
    tb__native_dialect(&dialect, tuning.vec_width);
    st = tb__plan_build(graph, &target, &G, &c->plan);
    if (st == TB_OK) {
        st = tb__cg_render(&G, c->plan, &dialect, &c->source, &c->source_len);
        tb__pgraph_free(&G);
    }
    if (st != TB_OK) {
        tb__native_comp_release(c);
        tb__free(ctx);
        return st;
    }
    ctx->comp = c;
    *context = ctx;
    return TB_OK;
}

static void tb__native_release_lowering_context(void *user_data, void *context) {
    tb__native_context *ctx = (tb__native_context *)context;
    (void)user_data;
    if (ctx == NULL) return;
    tb__native_comp_release(ctx->comp);
    tb__free(ctx);
}

/* ---- a program in parts, compiled at once ----
   A graph's program of many functions is compiled as several parts, each the program's head
   (the prelude every function uses) and a run of its functions, by one compiler process each,
   one per core (at most TB__NATIVE_MAX_PARTS): a first compile takes about the time of its
   largest part. Each part is cached, in memory and on disk, by its own source. */

#define TB__NATIVE_MAX_PARTS 8
/* functions per part at least: each part pays for the head once */
#define TB__NATIVE_PART_MIN 6

typedef struct tb__native_part {
    tb__native_rt *rt;
    tb__str source;
    const char **fns; /* the functions it defines */
    size_t num_fns;
    bool from_disk;
    tb__native_prog *prog;
    tb_status status;
    char why[TB__ERROR_CAP]; /* the error of a part compiled on a thread of its own */
} tb__native_part;

static void *tb__native_part_main(void *arg) {
    tb__native_part *pt = (tb__native_part *)arg;
    pt->status = tb__native_get_program(pt->rt, pt->source.data, pt->source.len,
                                        (const char *const *)pt->fns, pt->num_fns, &pt->from_disk,
                                        &pt->prog);
    if (pt->status != TB_OK) snprintf(pt->why, sizeof pt->why, "%s", tb_last_error());
    return NULL;
}

/* The parts of c's program: how many, and each one's functions (runs in order, of about
   equal text); one part is the whole source. */
static tb_status tb__native_make_parts(tb__native_comp *c, tb__native_part *parts, size_t n) {
    const tb__plan *p = c->plan;
    size_t i, at = 0, done = 0, total = 0;
    for (i = 0; i < p->num_kernels; i++)
        total += p->kernels[i].text_len;
    for (at = 0; at < n; at++) {
        parts[at].rt = c->rt;
        parts[at].fns = (const char **)tb__calloc(p->num_kernels + 1, sizeof(const char *));
        if (parts[at].fns == NULL) return TB_ERR_OUT_OF_MEMORY;
        if (n > 1) tb__str_append(&parts[at].source, "%.*s", (int)p->text_head, c->source);
    }
    for (i = 0, at = 0; i < p->num_kernels; i++) {
        const tb__plan_kernel *k = &p->kernels[i];
        tb__native_part *pt;
        if (!tb__plan_first_of_function(p, i)) continue;
        /* the next part once this one holds its share of the text */
        if (at + 1 < n && done >= total / n * (at + 1)) at++;
        pt = &parts[at];
        pt->fns[pt->num_fns++] = k->fn;
        if (n > 1) tb__str_append(&pt->source, "%.*s", (int)k->text_len, c->source + k->text_at);
        done += k->text_len;
    }
    if (n == 1) { /* the source as it is (and as the disk cache has known it) */
        tb__str_append(&parts[0].source, "%.*s", (int)c->source_len, c->source);
    }
    for (at = 0; at < n; at++)
        if (parts[at].source.failed) return TB_ERR_OUT_OF_MEMORY;
    return TB_OK;
}

/* Compiles (or finds) the parts of c's program, one compiler process per part at once,
   reporting progress as they are ready; c->progs holds them. */
static tb_status tb__native_compile_parts(tb__native_comp *c) {
    size_t functions = tb__plan_functions(c->plan), n, i, ready = 0;
    tb__native_part *parts;
    pthread_t *threads;
    bool *started, all_disk = true;
    tb_status st;
    n = functions / TB__NATIVE_PART_MIN;
    if (n > c->rt->info.compute_units) n = c->rt->info.compute_units;
    if (n > TB__NATIVE_MAX_PARTS) n = TB__NATIVE_MAX_PARTS;
    if (n < 1) n = 1;
    parts = (tb__native_part *)tb__calloc(n, sizeof *parts);
    threads = (pthread_t *)tb__calloc(n, sizeof *threads);
    started = (bool *)tb__calloc(n, sizeof *started);
    c->progs = (tb__native_prog **)tb__calloc(n, sizeof *c->progs);
    st = parts == NULL || threads == NULL || started == NULL || c->progs == NULL
             ? TB_ERR_OUT_OF_MEMORY
             : tb__native_make_parts(c, parts, n);
    while (st == TB_OK && n > 1 && parts[n - 1].num_fns == 0) { /* a large last function */
        n--;
        tb__str_free(&parts[n].source);
        tb__free(parts[n].fns);
        parts[n].fns = NULL;
    }
    tb__progress_kernels(0, functions);
    for (i = 1; i < n && st == TB_OK; i++)
        started[i] = pthread_create(&threads[i], NULL, tb__native_part_main, &parts[i]) == 0;
    for (i = 0; i < n && st == TB_OK; i++) {
        if (started[i]) {
            (void)pthread_join(threads[i], NULL);
        } else {
            tb__native_part_main(&parts[i]); /* the first on this thread; any that did not start */
        }
        ready += parts[i].num_fns;
        all_disk = all_disk && parts[i].from_disk;
        if (parts[i].status == TB_OK) tb__progress_kernels(ready, functions);
    }
    for (i = 0; parts != NULL && i < n; i++) {
        if (st == TB_OK && parts[i].status != TB_OK)
            st = tb__error(parts[i].status, "%s", parts[i].why);
        if (c->progs != NULL) c->progs[c->num_progs++] = parts[i].prog;
        tb__str_free(&parts[i].source);
        tb__free(parts[i].fns);
    }
    if (st == TB_OK && all_disk) tb__progress_from_disk();
    tb__free(parts);
    tb__free(threads);
    tb__free(started);
    return st;
}

/* Compiles (or finds) the program and looks its kernels up; the computation leaves the
   context. */
static tb_status tb__native_compile(void *user_data, void *context, void **computation) {
    tb__native_context *ctx = (tb__native_context *)context;
    tb__native_comp *c = ctx != NULL ? ctx->comp : NULL;
    tb__plan *p;
    tb_status st;
    size_t i;
    (void)user_data;
    *computation = NULL;
    if (c == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "native: compile without a context");
    p = c->plan;
    if (tb_debug_level() >= 3) {
        tb_log_message(TB_LOG_DEBUG, "native: program of graph %016llx:\n%s",
                       (unsigned long long)p->graph_hash, c->source);
    }
    c->fns = (tb__native_fn *)tb__calloc(p->num_kernels + 1, sizeof(tb__native_fn));
    c->kept = (tb__native_kept *)tb__calloc(p->num_kernels + 1, sizeof(tb__native_kept));
    if (c->fns == NULL || c->kept == NULL) return TB_ERR_OUT_OF_MEMORY;
    st = tb__native_compile_parts(c);
    for (i = 0; i < p->num_kernels && st == TB_OK; i++) {
        void *sym = NULL;
        size_t j;
        if (p->kernels[i].empty) continue;
        for (j = 0; j < c->num_progs && sym == NULL; j++)
            sym = dlsym(c->progs[j]->handle, p->kernels[i].fn);
        if (sym == NULL) {
            st =
                tb__error(TB_ERR_COMPILE, "native: the program has no kernel %s", p->kernels[i].fn);
            break;
        }
        memcpy(&c->fns[i], &sym, sizeof sym);
    }
    if (st == TB_OK && tb_debug_level() >= 1) {
        tb__str names;
        memset(&names, 0, sizeof names);
        for (i = 0; i < p->num_kernels; i++)
            if (!p->kernels[i].empty)
                tb__str_append(&names, "%s%s", names.len > 0 ? " " : "", p->kernels[i].name);
        tb_log_message(TB_LOG_INFO, "native:0: graph %016llx: %s",
                       (unsigned long long)p->graph_hash, names.data != NULL ? names.data : "");
        tb__str_free(&names);
    }
    if (st != TB_OK) return st;
    ctx->comp = NULL;
    *computation = c;
    return TB_OK;
}

static void tb__native_release_computation(void *user_data, void *computation) {
    (void)user_data;
    tb__native_comp_release((tb__native_comp *)computation);
}

static const char *tb__native_backend_text(void *user_data, const void *computation) {
    (void)user_data;
    return computation != NULL ? ((const tb__native_comp *)computation)->source : NULL;
}

static int32_t tb__native_get_node_kernel(void *user_data, const void *computation,
                                          size_t node_index, const char **kernel_name) {
    const tb__native_comp *c = (const tb__native_comp *)computation;
    int32_t k;
    (void)user_data;
    if (kernel_name != NULL) *kernel_name = NULL;
    if (c == NULL || c->plan->node_kernel == NULL || node_index >= c->plan->num_nodes) return -1;
    k = c->plan->node_kernel[node_index];
    if (k >= 0 && kernel_name != NULL) *kernel_name = c->plan->kernels[k].name;
    return k;
}

/* The buffers of a run: the parameters' (borrowed) and the kernels' outputs (owned until they
   are results or freed after their last use). */
typedef struct tb__native_run_state {
    tb__native_buf **owned;
    unsigned char **ptrs;
    void **argv;
    uint32_t err[TB__ERR_WORDS];
} tb__native_run_state;

static tb_status tb__native_run_init(tb__native_comp *c, tb_backend_data *const *arguments,
                                     tb__native_run_state *s, unsigned char **table) {
    const tb__plan *p = c->plan;
    size_t i, most = 1;
    *table = NULL;
    memset(s, 0, sizeof *s);
    for (i = 0; i < p->num_kernels; i++)
        if (p->kernels[i].num_args + 1 > most) most = p->kernels[i].num_args + 1;
    s->owned = (tb__native_buf **)tb__calloc(p->num_slots + 1, sizeof *s->owned);
    s->ptrs = (unsigned char **)tb__calloc(p->num_slots + 1, sizeof *s->ptrs);
    s->argv = (void **)tb__calloc(most, sizeof *s->argv);
    if (s->owned == NULL || s->ptrs == NULL || s->argv == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < p->num_slots; i++) {
        const tb__native_buf *b;
        if (p->slots[i].kind != TB__SLOT_PARAM) continue;
        b = (const tb__native_buf *)arguments[p->slots[i].index]->payload;
        if (b == NULL)
            return tb__error(TB_ERR_INVALID_ARGUMENT, "native: an argument has no value");
        s->ptrs[i] = b->ptr;
    }
    for (i = 0; i < p->num_results; i++) {
        /* a result computed into a donated parameter's buffer */
        if (p->result_alias[i] >= 0)
            s->ptrs[p->result_slot[i]] =
                ((tb__native_buf *)arguments[p->result_alias[i]]->payload)->ptr;
    }
    if (p->scalar_table) {
        /* each kernel's run of entries: the scalars it reads, in its order */
        *table = (unsigned char *)tb__calloc(p->table_len + 1, 8);
        if (*table == NULL) return TB_ERR_OUT_OF_MEMORY;
        for (i = 0; i < p->num_kernels; i++) {
            const tb__plan_kernel *k = &p->kernels[i];
            size_t j;
            for (j = 0; j < k->num_table_params; j++) {
                int32_t a = k->table_params[j];
                const tb__native_buf *b = (const tb__native_buf *)arguments[a]->payload;
                if (b != NULL)
                    memcpy(*table + 8 * ((size_t)k->table_at + j), b->ptr,
                           tb_dtype_size(p->param_dtype[a]));
            }
        }
    }
    return TB_OK;
}

/* Runs kernel i: its output allocated, its arguments gathered, its work items on the pool. */
static tb_status tb__native_run_kernel(tb__native_comp *c, size_t i,
                                       tb_backend_data *const *arguments, tb__native_run_state *s,
                                       unsigned char *table) {
    const tb__plan *p = c->plan;
    const tb__plan_kernel *k = &p->kernels[i];
    uint64_t size[3], t0;
    size_t j;
    const tb__native_buf *src =
        k->pack_param >= 0 ? (const tb__native_buf *)arguments[k->pack_param]->payload : NULL;
    tb__native_kept *kp = &c->kept[i];
    if (src != NULL && kp->panels != NULL && kp->src == src && kp->gen == src->gen) {
        s->ptrs[k->out_slot] = kp->panels->ptr; /* the panels of this buffer, made before */
        return TB_OK;
    }
    if (s->ptrs[k->out_slot] == NULL) {
        size_t bytes = 0;
        tb_status st = tb_shape_nbytes(&p->slots[k->out_slot].shape, &bytes);
        if (st != TB_OK) return st;
        tb__mutex_lock(&tb__native_mutex);
        st = tb__native_buf_alloc(c->rt, bytes, &s->owned[k->out_slot]);
        tb__mutex_unlock(&tb__native_mutex);
        if (st != TB_OK) return st;
        s->ptrs[k->out_slot] = s->owned[k->out_slot]->ptr;
    }
    if (k->empty) return TB_OK;
    s->argv[0] = s->ptrs[k->out_slot];
    for (j = 0; j < k->num_args; j++) {
        const tb__plan_arg *a = &k->args[j];
        if (a->kind == TB__ARG_BUF) {
            s->argv[j + 1] = s->ptrs[a->index];
        } else if (a->kind == TB__ARG_SCALAR) {
            s->argv[j + 1] = ((tb__native_buf *)arguments[a->index]->payload)->ptr;
        } else if (a->kind == TB__ARG_TABLE) {
            s->argv[j + 1] = table + 8 * (size_t)k->table_at; /* the kernel's run of the table */
        } else {
            s->argv[j + 1] = s->err;
        }
    }
    tb__native_global_size(k, size);
    t0 = tb_debug_level() >= 2 ? tb__now_ns() : 0;
    tb__native_run(c->rt->pool, c->fns[i], s->argv, (int64_t)(size[0] * size[1] * size[2]),
                   k->bytes + k->flops);
    (void)TB__ATOMIC_ADD(&c->rt->kernels_launched, 1);
    if (src != NULL && s->owned[k->out_slot] != NULL &&
        (uint64_t)s->owned[k->out_slot]->cap <= c->rt->cache_limit) {
        /* keep the panels with the computation (the next run of this buffer skips the pack) */
        tb__mutex_lock(&tb__native_mutex);
        if (kp->panels != NULL) tb__native_buf_free(c->rt, kp->panels);
        tb__mutex_unlock(&tb__native_mutex);
        kp->panels = s->owned[k->out_slot];
        kp->src = src;
        kp->gen = src->gen;
        s->owned[k->out_slot] = NULL;
    }
    if (tb_debug_level() >= 2) {
        double ns = (double)(tb__now_ns() - t0);
        if (ns < 1) ns = 1;
        tb_log_message(TB_LOG_DEBUG, "native:0 %-24s %10.3f ms %9.2f GB/s %9.2f GFLOP/s", k->name,
                       ns / 1e6, k->bytes / ns, k->flops / ns);
    }
    return TB_OK;
}

static tb_status tb__native_execute(void *user_data, void *computation,
                                    tb_backend_data *const *arguments, size_t num_arguments,
                                    tb_backend_data *const *results, size_t num_results) {
    tb__native_comp *c = (tb__native_comp *)computation;
    const tb__plan *p = c != NULL ? c->plan : NULL;
    tb__native_run_state s;
    unsigned char *table = NULL;
    tb_status st;
    size_t i, j;
    bool consumed = false;
    (void)user_data;
    if (p == NULL || num_arguments != p->num_params || num_results != p->num_results) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "native: execute with %zu arguments and %zu results, the computation has "
                         "%zu and %zu",
                         num_arguments, num_results, p != NULL ? p->num_params : 0,
                         p != NULL ? p->num_results : 0);
    }
    if (c->rt->exited)
        return tb__error(TB_ERR_STATE, "native: the computation outlived the backend");
    tb__mutex_lock(&tb__native_run_mutex);
    st = tb__native_run_init(c, arguments, &s, &table);
    for (i = 0; i < p->num_kernels && st == TB_OK; i++) {
        if ((int32_t)i == p->first_alias) {
            /* the kernels from here on write into donated buffers and cannot fail: a flag
               raised before them fails the run with the donated values intact */
            if (s.err[0] != 0) {
                st = tb__cg_run_error(p, "native", s.err);
                break;
            }
            consumed = true;
            for (j = 0; j < p->num_results; j++)
                if (p->result_alias[j] >= 0) /* panels kept from it are stale from here on */
                    ((tb__native_buf *)arguments[p->result_alias[j]]->payload)->gen =
                        tb__next_generation();
        }
        st = tb__native_run_kernel(c, i, arguments, &s, table);
        /* temporaries nobody reads any more go back to the cache */
        tb__mutex_lock(&tb__native_mutex);
        for (j = 0; j < p->num_slots; j++) {
            if (p->slots[j].kind == TB__SLOT_TEMP && s.owned != NULL && s.owned[j] != NULL &&
                p->slots[j].last_use <= (int32_t)i) {
                tb__native_buf_free(c->rt, s.owned[j]);
                s.owned[j] = NULL;
                s.ptrs[j] = NULL;
            }
        }
        tb__mutex_unlock(&tb__native_mutex);
    }
    if (st == TB_OK && s.err[0] != 0) st = tb__cg_run_error(p, "native", s.err);
    tb__mutex_lock(&tb__native_mutex);
    for (i = 0; i < p->num_results && st == TB_OK; i++) {
        int32_t src = p->result_source[i];
        tb__native_buf *copy = NULL;
        size_t bytes = 0;
        if (src < 0) continue;
        /* the buffer it repeats may be a donated one: its size is the slot's */
        st = tb_shape_nbytes(&p->slots[p->result_slot[src]].shape, &bytes);
        if (st == TB_OK) st = tb__native_buf_alloc(c->rt, bytes, &copy);
        if (st != TB_OK) break;
        if (bytes > 0) memcpy(copy->ptr, s.ptrs[p->result_slot[src]], bytes);
        results[i]->payload = copy;
    }
    for (i = 0; i < p->num_results; i++) {
        int32_t d = p->result_alias[i];
        if (d >= 0) {
            /* the donated buffer is the result's (success), or freed once written (failure) */
            if (st == TB_OK) {
                results[i]->payload = arguments[d]->payload;
                arguments[d]->payload = NULL;
            } else if (consumed) {
                tb__native_buf_free(c->rt, (tb__native_buf *)arguments[d]->payload);
                arguments[d]->payload = NULL;
            }
            continue;
        }
        if (p->result_source[i] >= 0) {
            if (st != TB_OK && results[i]->payload != NULL) {
                tb__native_buf_free(c->rt, (tb__native_buf *)results[i]->payload);
                results[i]->payload = NULL;
            }
        } else if (st == TB_OK) {
            results[i]->payload = s.owned[p->result_slot[i]];
            s.owned[p->result_slot[i]] = NULL;
        }
    }
    if (s.owned != NULL) {
        for (i = 0; i < p->num_slots; i++)
            tb__native_buf_free(c->rt, s.owned[i]);
    }
    tb__mutex_unlock(&tb__native_mutex);
    tb__mutex_unlock(&tb__native_run_mutex);
    tb__free(s.owned);
    tb__free(s.ptrs);
    tb__free(s.argv);
    tb__free(table);
    return st;
}

/* ---- backend entries: IR hooks, lifetime, registration ---- */

/* Every built-in op; custom ops with a kernel expression (compiled as C99 with <tgmath.h>). */
static bool tb__native_supports_node(void *user_data, const tb_node *node) {
    (void)user_data;
    if (node->op >= TB_OP_BUILTIN_COUNT) {
        const tb_custom_op_desc *d = tb__plan_custom(node->op);
        return d != NULL && d->opencl_expr != NULL && d->infer_shape == NULL;
    }
    return node->op >= 0;
}

static size_t tb__native_metrics_report(void *user_data, char *buf, size_t cap) {
    tb__str s;
    tb__native_rt *rt;
    size_t n;
    char *text;
    (void)user_data;
    memset(&s, 0, sizeof s);
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_rt_get();
    if (rt == NULL || rt->status != TB_OK) {
        tb__str_append(&s, "Native: unavailable: %s\n", rt != NULL ? rt->reason : "out of memory");
    } else {
        tb__str_append(&s, "Device: native:0 (%s, %u threads)\n", rt->info.name,
                       (unsigned)rt->info.compute_units);
        tb__str_append(&s, "  Native::Compiler: %s %s\n", rt->cc_command, rt->options);
        tb__str_append(&s, "  Native::BytesInUse: %llu\n", (unsigned long long)rt->bytes_in_use);
        tb__str_append(&s, "  Native::PeakBytesInUse: %llu\n", (unsigned long long)rt->peak_bytes);
        tb__str_append(&s, "  Native::BytesCached: %llu\n", (unsigned long long)rt->cached_bytes);
        tb__str_append(&s, "  Native::ProgramCompile: %llu\n", (unsigned long long)rt->compiles);
        tb__str_append(&s, "  Native::DiskCacheHit: %llu\n", (unsigned long long)rt->disk_hits);
        tb__str_append(&s, "  Native::DiskCacheMiss: %llu\n", (unsigned long long)rt->disk_misses);
        tb__str_append(&s, "  Native::DiskCacheRejected: %llu\n",
                       (unsigned long long)rt->disk_rejected);
        tb__str_append(&s, "  Native::KernelLaunch: %llu\n",
                       (unsigned long long)rt->kernels_launched);
    }
    tb__mutex_unlock(&tb__native_mutex);
    text = tb__str_take(&s);
    if (text == NULL) {
        if (cap > 0) buf[0] = '\0';
        return 0;
    }
    n = strlen(text);
    if (cap > 0) {
        size_t k = n < cap - 1 ? n : cap - 1;
        memcpy(buf, text, k);
        buf[k] = '\0';
    }
    tb__free(text);
    return n;
}

static void tb__native_prepare_to_exit(void *user_data) {
    tb__native_rt *rt;
    (void)user_data;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_current;
    if (rt != NULL) {
        tb__native_cache_trim(rt, 0);
        tb__native_progs_trim(rt, 0);
        rt->exited = true;
        tb__native_current = NULL;
        tb__native_rt_unref(rt);
    }
    tb__mutex_unlock(&tb__native_mutex);
}

/* registers the "native" backend (called by tb__register_builtin_backends) */
static tb_status tb__native_register(void) {
    tb_backend_impl impl;
    memset(&impl, 0, sizeof impl);
    impl.prepare_to_exit = tb__native_prepare_to_exit;
    impl.supports_node = tb__native_supports_node;
    impl.data_from_host = tb__native_data_from_host;
    impl.data_from_scalar = tb__native_data_from_scalar;
    impl.data_to_host = tb__native_data_to_host;
    impl.data_release = tb__native_data_release;
    impl.data_map_host = tb__native_data_map_host;
    impl.create_lowering_context = tb__native_create_lowering_context;
    impl.release_lowering_context = tb__native_release_lowering_context;
    impl.compile = tb__native_compile;
    impl.execute = tb__native_execute;
    impl.release_computation = tb__native_release_computation;
    impl.computation_backend_text = tb__native_backend_text;
    impl.get_node_kernel = tb__native_get_node_kernel;
    impl.get_backend_devices = tb__native_get_backend_devices;
    impl.get_device_info = tb__native_get_device_info;
    impl.create_metrics_report = tb__native_metrics_report;
    return tb_backend_register("native", &impl, "");
}

#endif /* TB__HAVE_NATIVE */
