/* ===========================================================================================
   Native backend: programs. A kernel program's C source compiled by the system compiler in a
   supervised child process (a time limit, its own temporary folder), loaded with dlopen and
   cached in memory and on disk (diskcache.c); the host's vector shape the programs are
   compiled for, from what both the CPU and the compiler's target have.
   =========================================================================================== */
#include "../../impl_begin.h"

#if defined(TB__HAVE_NATIVE)

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

/* The descriptors the supervisor closes in the compiler's process: below the process's limit,
   or below TB__NATIVE_FD_LIMIT where that limit is unknown, tiny or huge. */
static long tb__native_fd_limit(void) {
    long n = sysconf(_SC_OPEN_MAX);
    return n < 64 || n > TB__NATIVE_FD_LIMIT ? TB__NATIVE_FD_LIMIT : n;
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
    tb__native_job job = {path, argv, timeout_s, tb__native_fd_limit(), files, dir};
    tb__native_outcome out;
    size_t got = 0;
    pid_t sup;
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
        tb__native_close_from(8, job.fd_limit);
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

static void tb__native_prog_drop(void *ctx, tb__kit_prog *p) {
    (void)ctx;
    tb__native_prog_free((tb__native_prog *)p);
}

static void tb__native_prog_unref(tb__native_rt *rt, tb__native_prog *prog) {
    if (prog != NULL) tb__kit_prog_unref(&rt->programs, &prog->base, tb__native_prog_drop, NULL);
}

/* Drops cached programs no computation uses, oldest first, until at most `keep` remain. */
static void tb__native_progs_trim(tb__native_rt *rt, size_t keep) {
    tb__kit_progs_trim(&rt->programs, keep, tb__native_prog_drop, NULL);
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
    prog = (tb__native_prog *)tb__kit_prog_find(rt->programs, key, src, len, NULL);
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
        (void)TB__ATOMIC_ADD(&rt->stats.disk_hits, 1);
        *from_disk = true;
    } else {
        if (path != NULL) (void)TB__ATOMIC_ADD(&rt->stats.disk_misses, 1);
        if (why != NULL) {
            if (tb_debug_level() >= 1)
                tb_log_message(TB_LOG_INFO, "native: program cache file %s not used: %s", path,
                               why);
            tb__disk_reject(path);
            (void)TB__ATOMIC_ADD(&rt->stats.disk_rejected, 1);
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
            (void)TB__ATOMIC_ADD(&rt->stats.builds, 1);
            tb__disk_store(&tb__native_disk_format, save_dir, &dkey, key, &rt->cache_dir_reported,
                           bytes, n);
        }
    }
    tb__free(bytes);
    tb__free(save_dir);
    tb__free(path);
    if (st != TB_OK) return st;
    prog = (tb__native_prog *)tb__calloc(1, sizeof *prog);
    if (prog != NULL) prog->base.source = (char *)tb__alloc(len + 1);
    if (prog == NULL || prog->base.source == NULL) {
        tb__free(prog);
        dlclose(handle);
        return TB_ERR_OUT_OF_MEMORY;
    }
    memcpy(prog->base.source, src, len);
    prog->base.source[len] = '\0';
    prog->base.source_len = len;
    prog->base.key[0] = key[0];
    prog->base.key[1] = key[1];
    prog->handle = handle;
    prog->base.refcount = 2; /* the cache and the caller */
    tb__mutex_lock(&tb__native_mutex);
    prog->base.next = rt->programs;
    rt->programs = &prog->base;
    tb__native_progs_trim(rt, TB__NATIVE_MAX_PROGRAMS);
    tb__mutex_unlock(&tb__native_mutex);
    *out = prog;
    return TB_OK;
}

#endif /* TB__HAVE_NATIVE */
