/* The native backend's compiler and program cache, as a careful user and an attacker meet
   them: $CC and TB_NATIVE_CFLAGS reach the compiler word for word and key the cache whole; a
   compile has a time budget (TB_COMPILE_TIMEOUT) and no compiler outlives the process that
   started it; a cache entry that others may write to is refused and removed; an entry that
   loads but lacks a kernel is dropped and the program compiled again; the cache folder stays
   under TB_CACHE_MAX; bad TB_NATIVE_THREADS values are said and ignored or capped. Every case
   restarts the library so that the environment is read again. Skipped without a C compiler. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

static char g_dir[256];   /* scratch: scripts and logs */
static char g_cache[300]; /* the cache folder of the current case */
static bool g_have_cc;

/* ---- helpers ---- */

static const char *path_in(const char *name) {
    static char bufs[4][512];
    static int next;
    char *b = bufs[next++ % 4];
    snprintf(b, sizeof bufs[0], "%s/%s", g_dir, name);
    return b;
}

static void write_text(const char *path, const char *text, mode_t mode) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "r");
    char *buf;
    long n;
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (char *)calloc((size_t)n + 1, 1);
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) buf[0] = '\0';
    fclose(f);
    return buf;
}

/* The library set up again with the environment as it is now, its cache in a fresh folder
   (made here) unless `cache` names one. */
static void restart(const char *cache) {
    tb_shutdown();
    if (cache == NULL) {
        static int serial;
        snprintf(g_cache, sizeof g_cache, "%s/cache%d", g_dir, serial++);
        assert_int_equal(mkdir(g_cache, 0700), 0);
    } else if (cache != g_cache) {
        snprintf(g_cache, sizeof g_cache, "%s", cache);
    }
    setenv("TB_CACHE_DIR", g_cache, 1);
    assert_int_equal(tb_setup(NULL), TB_OK);
}

/* A counter of the native backend's metrics report ("Native::NAME: N"), or -1. */
static long native_metric(const char *name) {
    char *text = tb_backend_metrics_report("native"), *at;
    char key[96];
    long v = -1;
    snprintf(key, sizeof key, "Native::%s: ", name);
    at = text != NULL ? strstr(text, key) : NULL;
    if (at != NULL) v = strtol(at + strlen(key), NULL, 10);
    tb_free(text);
    return v;
}

/* Runs a small graph on native whose program differs with `variant`; its status. The value
   is checked against the cpu backend's. */
static tb_status run_graph(int variant) {
    float v[5] = {0.5f, -1.0f, 2.0f, 3.0f, -0.25f}, got[5], want[5];
    tb_shape s = tb_shape_of(TB_F32, 1, 5);
    tb_device nat;
    tb_tensor *x, *y, *xc, *yc;
    tb_status st;
    int k;
    assert_int_equal(tb_device_parse("native:0", &nat), TB_OK);
    x = tb_tensor_from_host(v, &s, &nat);
    xc = tb_tensor_from_host(v, &s, NULL);
    y = tb_exp(x);
    yc = tb_exp(xc);
    for (k = 0; k < variant; k++) {
        tb_tensor *a = tb_add_scalar(y, 0.5 + k), *b = tb_add_scalar(yc, 0.5 + k);
        tb_tensor_release(y);
        tb_tensor_release(yc);
        y = tb_tanh(a);
        yc = tb_tanh(b);
        tb_tensor_release(a);
        tb_tensor_release(b);
    }
    st = tb_tensor_to_host(y, got, sizeof got);
    if (st == TB_OK) {
        assert_int_equal(tb_tensor_to_host(yc, want, sizeof want), TB_OK);
        for (k = 0; k < 5; k++)
            assert_true(fabsf(got[k] - want[k]) <= 1e-6f * (1.0f + fabsf(want[k])));
    }
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(xc);
    tb_tensor_release(yc);
    return st;
}

/* The entries (".so" files) of the cache folder: their count; the path of the first in
   `first` and their bytes in `*bytes` when asked. */
static int cache_entries(char *first, size_t cap, long long *bytes) {
    DIR *d = opendir(g_cache);
    struct dirent *e;
    int n = 0;
    if (bytes != NULL) *bytes = 0;
    if (d == NULL) return 0;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        struct stat st;
        char path[1024];
        if (len < 4 || strcmp(e->d_name + len - 3, ".so") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", g_cache, e->d_name);
        if (n == 0 && first != NULL) snprintf(first, cap, "%s", path);
        if (bytes != NULL && stat(path, &st) == 0) *bytes += (long long)st.st_size;
        n++;
    }
    closedir(d);
    return n;
}

/* Whether process `pid` still runs (a zombie, which no longer runs, counts as gone). */
static bool running(long pid) {
    char path[64], text[512], *close_paren;
    size_t n;
    FILE *f;
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    f = fopen(path, "r");
    if (f == NULL) return kill((pid_t)pid, 0) == 0; /* no /proc: a zombie counts as running */
    n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    /* "pid (name) state ...": a process reaped between the open and the read leaves the read
       empty; then whether the pid still exists decides */
    close_paren = strrchr(text, ')');
    if (close_paren == NULL || close_paren[1] == '\0' || close_paren[2] == '\0')
        return kill((pid_t)pid, 0) == 0;
    return close_paren[2] != 'Z' && close_paren[2] != 'X';
}

/* Waits up to `seconds` for the pid written in the file `path` to appear; 0 if it did not. */
static long wait_for_pid(const char *path, double seconds) {
    struct timespec nap = {0, 20 * 1000 * 1000};
    int i;
    for (i = 0; i < (int)(seconds * 50); i++) {
        char *text = read_text(path);
        long pid = text != NULL ? strtol(text, NULL, 10) : 0;
        free(text);
        if (pid > 0) return pid;
        nanosleep(&nap, NULL);
    }
    return 0;
}

static bool gone_within(long pid, double seconds) {
    struct timespec nap = {0, 20 * 1000 * 1000};
    int i;
    for (i = 0; i < (int)(seconds * 50); i++) {
        if (!running(pid)) return true;
        nanosleep(&nap, NULL);
    }
    return !running(pid);
}

#define REQUIRE_CC()                                                                               \
    do {                                                                                           \
        if (!g_have_cc) skip();                                                                    \
    } while (0)

static int setup(void **state) {
    tb_device nat;
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/tb_native_cc_XXXXXX");
    if (mkdtemp(g_dir) == NULL) return -1;
    unsetenv("TB_NATIVE_CFLAGS");
    unsetenv("TB_COMPILE_TIMEOUT");
    unsetenv("TB_CACHE_MAX");
    unsetenv("TB_NATIVE_THREADS");
    restart(NULL);
    g_have_cc = tb_device_parse("native:0", &nat) == TB_OK && run_graph(0) == TB_OK;
    if (!g_have_cc) print_message("no native backend here: %s\n", tb_last_error());
    return 0;
}

static int teardown(void **state) {
    char cmd[512];
    (void)state;
    tb_shutdown();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int reset(void **state) {
    (void)state;
    unsetenv("CC");
    unsetenv("TB_NATIVE_CFLAGS");
    unsetenv("TB_COMPILE_TIMEOUT");
    unsetenv("TB_CACHE_MAX");
    unsetenv("TB_NATIVE_THREADS");
    tb_clear_error();
    return 0;
}

/* ---- the compiler's command ---- */

/* A compiler that writes each of its arguments on a line of its own, then runs cc. */
static const char *recording_cc(void) {
    char text[1024];
    snprintf(text, sizeof text,
             "#!/bin/sh\n: > '%s'\nfor a in \"$@\"; do printf '%%s\\n' \"$a\" >> '%s'; done\n"
             "exec cc \"$@\"\n",
             path_in("args.txt"), path_in("args.txt"));
    write_text(path_in("record-cc"), text, 0700);
    return path_in("record-cc");
}

/* How many lines of the recorded arguments are exactly `word`. */
static int recorded(const char *word) {
    char *text = read_text(path_in("args.txt")), *line, *save = NULL;
    int n = 0;
    if (text == NULL) return -1;
    for (line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save))
        n += strcmp(line, word) == 0;
    free(text);
    return n;
}

static void test_cc_and_flags_word_for_word(void **state) {
    char cc[1024], flags[4096], word[32];
    int i, at = 0;
    (void)state;
    REQUIRE_CC();
    /* a CC of 12 words and 60 flags: every word arrives as one argument of its own */
    at = snprintf(cc, sizeof cc, "%s", recording_cc());
    for (i = 0; i < 11; i++)
        at += snprintf(cc + at, sizeof cc - (size_t)at, " -DCC_WORD_%d", i);
    for (i = 0, at = 0; i < 60; i++)
        at += snprintf(flags + at, sizeof flags - (size_t)at, "%s-DFLAG_%02d\t", i ? " " : "", i);
    setenv("CC", cc, 1);
    setenv("TB_NATIVE_CFLAGS", flags, 1);
    restart(NULL);
    assert_int_equal(run_graph(1), TB_OK);
    for (i = 0; i < 11; i++) {
        snprintf(word, sizeof word, "-DCC_WORD_%d", i);
        assert_int_equal(recorded(word), 1);
    }
    for (i = 0; i < 60; i++) {
        snprintf(word, sizeof word, "-DFLAG_%02d", i);
        if (recorded(word) != 1) fail_msg("%s did not reach the compiler as one word", word);
    }
    assert_int_equal(cache_entries(NULL, 0, NULL), 1);
    /* flags that differ only in their last word key another entry */
    flags[strlen(flags) - 3] = '9';
    setenv("TB_NATIVE_CFLAGS", flags, 1);
    restart(g_cache);
    assert_int_equal(run_graph(1), TB_OK);
    assert_int_equal(native_metric("DiskCacheHit"), 0);
    assert_int_equal(native_metric("ProgramCompile"), 1);
    assert_int_equal(cache_entries(NULL, 0, NULL), 2);
    /* and the same flags find theirs */
    restart(g_cache);
    assert_int_equal(run_graph(1), TB_OK);
    assert_int_equal(native_metric("DiskCacheHit"), 1);
    assert_int_equal(native_metric("ProgramCompile"), 0);
}

/* Symbols hidden by the user's flags: the kernels are exported whatever the flags say. */
static void test_hidden_visibility(void **state) {
    (void)state;
    REQUIRE_CC();
    setenv("TB_NATIVE_CFLAGS", "-fvisibility=hidden", 1);
    restart(NULL);
    assert_int_equal(run_graph(2), TB_OK);
    restart(g_cache);
    assert_int_equal(run_graph(2), TB_OK);
    assert_int_equal(native_metric("DiskCacheHit"), 1);
}

/* ---- time budget, and no compiler outliving its process ---- */

/* A compiler that records its pid and its child's, then waits (the child sleeps long). */
static const char *slow_cc(void) {
    char text[4096], pid[512], child[512];
    snprintf(pid, sizeof pid, "%s", path_in("cc.pid"));
    snprintf(child, sizeof child, "%s", path_in("child.pid"));
    snprintf(text, sizeof text,
             "#!/bin/sh\necho $$ > '%s.tmp' && mv '%s.tmp' '%s'\nsleep 60 &\n"
             "echo $! > '%s.tmp' && mv '%s.tmp' '%s'\nwait\n",
             pid, pid, pid, child, child, child);
    write_text(path_in("slow-cc"), text, 0700);
    unlink(pid);
    unlink(child);
    return path_in("slow-cc");
}

static void test_compile_time_budget(void **state) {
    time_t start;
    long cc, child;
    tb_status st;
    (void)state;
    REQUIRE_CC();
    setenv("CC", slow_cc(), 1);
    setenv("TB_COMPILE_TIMEOUT", "1.5", 1);
    restart(NULL);
    start = time(NULL);
    st = run_graph(3);
    assert_int_equal(st, TB_ERR_COMPILE);
    assert_non_null(strstr(tb_last_error(), "did not finish within 1.5 s"));
    assert_non_null(strstr(tb_last_error(), "TB_COMPILE_TIMEOUT"));
    assert_true(time(NULL) - start < 20);
    cc = wait_for_pid(path_in("cc.pid"), 1);
    child = wait_for_pid(path_in("child.pid"), 1);
    assert_true(cc > 0 && child > 0);
    /* the compiler and what it started are gone with it */
    assert_true(gone_within(cc, 5));
    assert_true(gone_within(child, 5));
    assert_int_equal(cache_entries(NULL, 0, NULL), 0);
    /* a bad value is said and the default kept */
    setenv("TB_COMPILE_TIMEOUT", "soon", 1);
    unsetenv("CC");
    restart(NULL);
    assert_int_equal(run_graph(3), TB_OK);
}

/* The process that started a compile is killed: its compiler, and the compiler's own child,
   end too. The process is this program again (`--compile`), started afresh: a forked copy of a
   process with threads cannot use the library. */
static void outlives_case(const char *mode) {
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    pid_t pid;
    long cc, child;
    int status;
    if (n <= 0) skip();
    self[n] = '\0';
    setenv("CC", slow_cc(), 1);
    setenv("TB_COMPILE_TIMEOUT", "0", 1); /* no limit: only the process's end stops it */
    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char *const argv[] = {self, (char *)mode, NULL};
        execv(self, argv);
        _exit(127);
    }
    cc = wait_for_pid(path_in("cc.pid"), 60);
    child = wait_for_pid(path_in("child.pid"), 5);
    if (cc <= 0 || child <= 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("the compile did not start");
    }
    assert_true(running(cc) && running(child));
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(gone_within(cc, 10));
    assert_true(gone_within(child, 10));
}

static void test_no_compiler_outlives_its_process(void **state) {
    (void)state;
    REQUIRE_CC();
    outlives_case("--compile");
    /* with stdin, stdout and stderr closed the library's descriptors take their numbers */
    outlives_case("--compile-closed");
}

/* A helper that the compiler leaves running (a compile server, as sccache starts) keeps the
   compiler's descriptors: the compile ends when the compiler does, not when the helper does. */
static void test_compiler_leaves_a_helper(void **state) {
    char text[256];
    time_t start;
    (void)state;
    REQUIRE_CC();
    snprintf(text, sizeof text, "#!/bin/sh\nsleep 20 &\nexec cc \"$@\"\n");
    write_text(path_in("helper-cc"), text, 0700);
    setenv("CC", path_in("helper-cc"), 1);
    setenv("TB_COMPILE_TIMEOUT", "10", 1);
    restart(NULL);
    start = time(NULL);
    assert_int_equal(run_graph(8), TB_OK);
    assert_true(time(NULL) - start < 8);
}

/* A program that ignores SIGCHLD (its children reaped for it): a compiler's failure is still
   told as the compiler's, with its exit status and output. */
static void test_sigchld_ignored(void **state) {
    char text[256];
    void (*old)(int);
    tb_status st;
    (void)state;
    REQUIRE_CC();
    snprintf(text, sizeof text, "#!/bin/sh\necho 'no such compiler here' >&2\nexit 3\n");
    write_text(path_in("failing-cc"), text, 0700);
    setenv("CC", path_in("failing-cc"), 1);
    restart(NULL);
    old = signal(SIGCHLD, SIG_IGN);
    st = run_graph(9);
    signal(SIGCHLD, old);
    assert_int_equal(st, TB_ERR_COMPILE);
    if (strstr(tb_last_error(), "exited with 3") == NULL ||
        strstr(tb_last_error(), "no such compiler here") == NULL)
        fail_msg("not the compiler's failure: %s", tb_last_error());
}

/* The child of test_no_compiler_outlives_its_process: a compile on native, then exit. */
static int compile_and_exit(void) {
    float v[3] = {1, 2, 3}, out[3];
    tb_shape s = tb_shape_of(TB_F32, 1, 3);
    tb_device nat;
    tb_tensor *x, *y;
    if (tb_device_parse("native:0", &nat) != TB_OK) return 1;
    x = tb_tensor_from_host(v, &s, &nat);
    y = tb_sin(x);
    (void)tb_tensor_to_host(y, out, sizeof out);
    tb_tensor_release(y);
    tb_tensor_release(x);
    tb_shutdown();
    return 0;
}

/* ---- the entries of the cache ---- */

/* An entry that others may write to could have been rewritten with a matching checksum: it is
   not loaded, it is removed, and the program compiled and stored again (private). */
static void test_entry_writable_by_others(void **state) {
    char entry[1024];
    struct stat st;
    (void)state;
    REQUIRE_CC();
    restart(NULL);
    assert_int_equal(run_graph(5), TB_OK);
    assert_int_equal(cache_entries(entry, sizeof entry, NULL), 1);
    assert_int_equal(stat(entry, &st), 0);
    assert_int_equal(st.st_mode & 077, 0);
    assert_int_equal(chmod(entry, 0666), 0);
    restart(g_cache);
    assert_int_equal(run_graph(5), TB_OK);
    assert_int_equal(native_metric("DiskCacheHit"), 0);
    assert_int_equal(native_metric("DiskCacheRejected"), 1);
    assert_int_equal(native_metric("ProgramCompile"), 1);
    assert_int_equal(stat(entry, &st), 0);
    assert_int_equal(st.st_mode & 077, 0);
    /* group-writable alone is refused too */
    assert_int_equal(chmod(entry, 0620), 0);
    restart(g_cache);
    assert_int_equal(run_graph(5), TB_OK);
    assert_int_equal(native_metric("DiskCacheRejected"), 1);
    restart(g_cache);
    assert_int_equal(run_graph(5), TB_OK);
    assert_int_equal(native_metric("DiskCacheHit"), 1);
}

/* Bytes of a file. */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    unsigned char *b;
    long len;
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = (unsigned char *)malloc((size_t)len);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* An entry with the right key and checksum around a shared object that loads but lacks the
   program's kernels: dropped, and the program compiled again, once. */
static void test_entry_without_its_kernels(void **state) {
    char entry[1024], cmd[2048];
    unsigned char *a, *b, *forged;
    size_t na, nb, ka, n;
    FILE *f;
    (void)state;
    REQUIRE_CC();
    restart(NULL);
    assert_int_equal(run_graph(6), TB_OK);
    assert_int_equal(cache_entries(entry, sizeof entry, NULL), 1);
    write_text(path_in("other.c"), "int tb_no_kernel_here = 1;\n", 0600);
    snprintf(cmd, sizeof cmd, "cc -shared -fPIC -o '%s' '%s'", path_in("other.so"),
             path_in("other.c"));
    assert_int_equal(system(cmd), 0);
    a = slurp(entry, &na);
    b = slurp(path_in("other.so"), &nb);
    ka = (size_t)tb__disk_get64(a + 32);
    /* the entry's header and key around the other shared object, the checksum made anew */
    n = 64 + ka + nb;
    forged = (unsigned char *)malloc(n);
    assert_non_null(forged);
    memcpy(forged, a, 64 + ka);
    memcpy(forged + 64 + ka, b, nb);
    tb__disk_put64(forged + 40, (uint64_t)nb);
    tb__disk_put64(forged + 48, tb__disk_checksum(forged + 64, ka, forged + 64 + ka, nb));
    f = fopen(entry, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(forged, 1, n, f), n);
    fclose(f);
    free(a);
    free(b);
    free(forged);
    assert_int_equal(chmod(entry, 0600), 0);
    restart(g_cache);
    assert_int_equal(run_graph(6), TB_OK);
    assert_int_equal(native_metric("DiskCacheRejected"), 1);
    assert_int_equal(native_metric("ProgramCompile"), 1);
    restart(g_cache);
    assert_int_equal(run_graph(6), TB_OK);
    assert_int_equal(native_metric("DiskCacheHit"), 1);
    assert_int_equal(native_metric("ProgramCompile"), 0);
}

/* A compiler whose output lacks the kernels (here: it compiles an empty file instead) is an
   error that says so, and leaves no entry that would fail every later run. */
static void test_compile_without_kernels(void **state) {
    char text[512];
    (void)state;
    REQUIRE_CC();
    write_text(path_in("empty.c"), "int tb_nothing_here;\n", 0600);
    snprintf(text, sizeof text,
             "#!/bin/sh\nout=\nwhile [ $# -gt 0 ]; do\n  case \"$1\" in\n    -o) out=$2; shift "
             ";;\n  esac\n  shift\ndone\nexec cc -shared -fPIC -o \"$out\" '%s'\n",
             path_in("empty.c"));
    write_text(path_in("empty-cc"), text, 0700);
    setenv("CC", path_in("empty-cc"), 1);
    restart(NULL);
    assert_int_equal(run_graph(7), TB_ERR_COMPILE);
    assert_non_null(strstr(tb_last_error(), "has no kernel"));
    assert_int_equal(cache_entries(NULL, 0, NULL), 0);
}

/* The folder stays under TB_CACHE_MAX: the entries used least recently go first. */
static void test_cache_cap(void **state) {
    long long bytes = 0, one;
    int k, n;
    (void)state;
    REQUIRE_CC();
    restart(NULL);
    assert_int_equal(run_graph(1), TB_OK);
    assert_int_equal(cache_entries(NULL, 0, &one), 1);
    /* room for about five entries */
    {
        char cap[32];
        snprintf(cap, sizeof cap, "%lld", one * 5 + one / 2);
        setenv("TB_CACHE_MAX", cap, 1);
    }
    for (k = 2; k < 14; k++) {
        assert_int_equal(run_graph(k), TB_OK);
        n = cache_entries(NULL, 0, &bytes);
        if (bytes > one * 6) fail_msg("%d entries, %lld bytes, after %d programs", n, bytes, k);
    }
    /* the most recent program is there; the first was trimmed */
    restart(g_cache);
    assert_int_equal(run_graph(13), TB_OK);
    assert_int_equal(native_metric("DiskCacheHit"), 1);
    assert_int_equal(run_graph(2), TB_OK);
    assert_int_equal(native_metric("ProgramCompile"), 1);
    /* a size with a unit, and no cap */
    setenv("TB_CACHE_MAX", "1K", 1);
    assert_int_equal(run_graph(14), TB_OK);
    assert_true(cache_entries(NULL, 0, NULL) == 1); /* only the entry just written stays */
    setenv("TB_CACHE_MAX", "0", 1);
    assert_int_equal(run_graph(15), TB_OK);
    assert_int_equal(run_graph(16), TB_OK);
    assert_int_equal(cache_entries(NULL, 0, NULL), 3);
}

/* ---- a program in parts ---- */

/* Runs 12 different unary ops of one input as one graph (12 kernels of different code) on
   native; checked against the cpu backend. Its status. */
static tb_status run_twelve(void) {
    typedef tb_tensor *(*unary)(tb_tensor *);
    static const unary ops[12] = {tb_exp,  tb_sin, tb_cos,  tb_tanh, tb_sigmoid, tb_abs,
                                  tb_relu, tb_neg, tb_sqrt, tb_log,  tb_floor,   tb_ceil};
    float v[6] = {0.5f, 1.0f, 2.0f, 3.0f, 0.25f, 4.5f}, got[6], want[6];
    tb_shape s = tb_shape_of(TB_F32, 1, 6);
    tb_device nat;
    tb_tensor *x, *xc, *y[12], *yc[12];
    tb_status st;
    int i, k;
    assert_int_equal(tb_device_parse("native:0", &nat), TB_OK);
    x = tb_tensor_from_host(v, &s, &nat);
    xc = tb_tensor_from_host(v, &s, NULL);
    for (i = 0; i < 12; i++) {
        y[i] = ops[i](x);
        yc[i] = ops[i](xc);
    }
    st = tb_sync(y, 12);
    for (i = 0; i < 12 && st == TB_OK; i++) {
        assert_int_equal(tb_tensor_to_host(y[i], got, sizeof got), TB_OK);
        assert_int_equal(tb_tensor_to_host(yc[i], want, sizeof want), TB_OK);
        for (k = 0; k < 6; k++)
            assert_true(fabsf(got[k] - want[k]) <= 1e-6f * (1.0f + fabsf(want[k])));
    }
    for (i = 0; i < 12; i++) {
        tb_tensor_release(y[i]);
        tb_tensor_release(yc[i]);
    }
    tb_tensor_release(x);
    tb_tensor_release(xc);
    return st;
}

/* A graph of 12 functions compiles as two parts with two threads (two cache entries, two
   compiles) and as one with one; a later process finds both parts on disk; a compiler that
   fails fails the sync with its message, from whichever part. */
static void test_program_in_parts(void **state) {
    char text[256];
    (void)state;
    REQUIRE_CC();
    setenv("TB_NATIVE_THREADS", "2", 1);
    restart(NULL);
    assert_int_equal(run_twelve(), TB_OK);
    assert_int_equal(cache_entries(NULL, 0, NULL), 2);
    assert_int_equal(native_metric("ProgramCompile"), 2);
    restart(g_cache);
    assert_int_equal(run_twelve(), TB_OK);
    assert_int_equal(native_metric("DiskCacheHit"), 2);
    assert_int_equal(native_metric("ProgramCompile"), 0);
    setenv("TB_NATIVE_THREADS", "1", 1);
    restart(NULL);
    assert_int_equal(run_twelve(), TB_OK);
    assert_int_equal(cache_entries(NULL, 0, NULL), 1);
    setenv("TB_NATIVE_THREADS", "2", 1);
    snprintf(text, sizeof text, "#!/bin/sh\necho 'no compiling today' >&2\nexit 3\n");
    write_text(path_in("failing-cc"), text, 0700);
    setenv("CC", path_in("failing-cc"), 1);
    restart(NULL);
    assert_int_equal(run_twelve(), TB_ERR_COMPILE);
    assert_non_null(strstr(tb_last_error(), "no compiling today"));
    assert_int_equal(cache_entries(NULL, 0, NULL), 0);
}

/* ---- TB_NATIVE_THREADS ---- */

static char g_log[4096];

static void capture_log(tb_log_level level, const char *message, void *user_data) {
    size_t n = strlen(g_log);
    (void)user_data;
    (void)level;
    snprintf(g_log + n, sizeof g_log - n, "%s\n", message);
}

/* The native device's threads with TB_NATIVE_THREADS set to `value`; what was logged in g_log. */
static uint32_t threads_with(const char *value) {
    tb_desc desc;
    tb_device nat;
    tb_device_info info;
    memset(&desc, 0, sizeof desc);
    desc.logger.func = capture_log;
    g_log[0] = '\0';
    setenv("TB_NATIVE_THREADS", value, 1);
    tb_shutdown();
    assert_int_equal(tb_setup(&desc), TB_OK);
    assert_int_equal(tb_device_parse("native:0", &nat), TB_OK);
    assert_int_equal(tb_backend_device_info(&nat, &info), TB_OK);
    return info.compute_units;
}

static void test_native_threads_variable(void **state) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    static const char *const bad[] = {"abc", "0", "-5", "3x", " "};
    size_t i;
    (void)state;
    REQUIRE_CC();
    if (cores < 1) cores = 1;
    assert_int_equal(threads_with("3"), 3);
    assert_string_equal(g_log, "");
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(threads_with(bad[i]), (uint32_t)cores);
        if (strstr(g_log, "TB_NATIVE_THREADS") == NULL || strstr(g_log, "ignored") == NULL)
            fail_msg("TB_NATIVE_THREADS='%s': no warning (log: %s)", bad[i], g_log);
    }
    assert_int_equal(threads_with("100000"), (uint32_t)(16 * cores));
    assert_non_null(strstr(g_log, "more than"));
    unsetenv("TB_NATIVE_THREADS");
    tb_shutdown();
    assert_int_equal(tb_setup(NULL), TB_OK);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cc_and_flags_word_for_word, reset, reset),
        cmocka_unit_test_setup_teardown(test_hidden_visibility, reset, reset),
        cmocka_unit_test_setup_teardown(test_compile_time_budget, reset, reset),
        cmocka_unit_test_setup_teardown(test_no_compiler_outlives_its_process, reset, reset),
        cmocka_unit_test_setup_teardown(test_compiler_leaves_a_helper, reset, reset),
        cmocka_unit_test_setup_teardown(test_sigchld_ignored, reset, reset),
        cmocka_unit_test_setup_teardown(test_entry_writable_by_others, reset, reset),
        cmocka_unit_test_setup_teardown(test_entry_without_its_kernels, reset, reset),
        cmocka_unit_test_setup_teardown(test_compile_without_kernels, reset, reset),
        cmocka_unit_test_setup_teardown(test_cache_cap, reset, reset),
        cmocka_unit_test_setup_teardown(test_program_in_parts, reset, reset),
        cmocka_unit_test_setup_teardown(test_native_threads_variable, reset, reset),
    };
    if (argc == 2 && strcmp(argv[1], "--compile") == 0) return compile_and_exit();
    if (argc == 2 && strcmp(argv[1], "--compile-closed") == 0) {
        close(0), close(1), close(2);
        return compile_and_exit();
    }
    return cmocka_run_group_tests_name("native_compiler", tests, setup, teardown);
}
