/* OpenCL failures: the library opens tests/cl_fault/cl_fault.c (a stand-in ICD loader that
   forwards to the real one) through TB_OPENCL_LIBRARY, and the n-th call of one entry point
   fails with an error a driver really gives (clCreateBuffer CL_MEM_OBJECT_ALLOCATION_FAILURE,
   clEnqueueNDRangeKernel CL_OUT_OF_RESOURCES, clBuildProgram CL_BUILD_PROGRAM_FAILURE, ...).
   For each entry point and n, a workload (uploads, elementwise, reductions, matmul and softmax,
   a second device, concat/pad/gather, the backend text, DLPack, mark step, the buffer cache)
   must give a clean error (a status and a message) or exactly the values of a clean run; the
   inputs and the results computed before the failure keep their values; once failures stop,
   the same session runs the workload right; tb_shutdown leaves no block of the allocator hook
   and no OpenCL object (the stand-in counts them). Programs come from source (TB_CACHE_DIR=off)
   and from the disk cache, each in a sweep of its own.

   The suite tries n = 1 and the last call of each entry point in a clean run;
   TB_TEST_CL_FAULT_SWEEP=full tries every n (tools/fault_sweep.sh; TB_TEST_CL_FAULT_SHARD=i/k
   takes the entry points numbered i modulo k, for k processes). The stand-in is
   build/cl_fault/libtb_cl_fault.so (tests/cl_fault/build.sh; tools/test.sh builds it), or
   $TB_TEST_CL_FAULT. Skipped without it or without an OpenCL device. */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fault_workload.h"

/* ---- the stand-in's controls ---- */

static int (*shim_entry_count)(void);
static const char *(*shim_entry_name)(int);
static void (*shim_arm)(int, long, long, int);
static long (*shim_calls)(int);
static long (*shim_injected)(void);
static long (*shim_live)(int, const char **);
static void *g_shim;
static char g_shim_path[1024], g_skip[2200], g_cache[256];

#define LIVE_KINDS 7

/* The error each entry point fails with: what a driver gives for it. */
static const struct {
    const char *name;
    int error;
} g_errors[] = {
    {"clGetPlatformIDs", -6 /* CL_OUT_OF_HOST_MEMORY */},
    {"clGetPlatformInfo", -6},
    {"clGetDeviceIDs", -6},
    {"clGetDeviceInfo", -6},
    {"clCreateContext", -6},
    {"clReleaseContext", -5 /* CL_OUT_OF_RESOURCES */},
    {"clCreateCommandQueue", -5},
    {"clReleaseCommandQueue", -5},
    {"clCreateBuffer", -4 /* CL_MEM_OBJECT_ALLOCATION_FAILURE */},
    {"clReleaseMemObject", -5},
    {"clEnqueueReadBuffer", -5},
    {"clEnqueueWriteBuffer", -5},
    {"clEnqueueCopyBuffer", -4},
    {"clEnqueueMapBuffer", -12 /* CL_MAP_FAILURE */},
    {"clEnqueueUnmapMemObject", -5},
    {"clCreateProgramWithSource", -6},
    {"clCreateProgramWithBinary", -42 /* CL_INVALID_BINARY */},
    {"clBuildProgram", -11 /* CL_BUILD_PROGRAM_FAILURE */},
    {"clGetProgramBuildInfo", -6},
    {"clGetProgramInfo", -6},
    {"clReleaseProgram", -5},
    {"clCreateKernel", -5},
    {"clReleaseKernel", -5},
    {"clSetKernelArg", -5},
    {"clGetKernelWorkGroupInfo", -5},
    {"clEnqueueNDRangeKernel", -5},
    {"clFinish", -5},
    {"clFlush", -5},
    {"clWaitForEvents", -14 /* CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST */},
    {"clGetEventProfilingInfo", -7 /* CL_PROFILING_INFO_NOT_AVAILABLE */},
    {"clReleaseEvent", -5},
};

static int error_for(const char *name) {
    size_t i;
    for (i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++) {
        if (strcmp(g_errors[i].name, name) == 0) return g_errors[i].error;
    }
    fail_msg("no error code for %s", name);
    return 0;
}

/* ISO C has no cast from an object pointer to a function pointer; POSIX says they match. */
#define SHIM_SYM(var, name)                                                                        \
    do {                                                                                           \
        void *sym_ = dlsym(g_shim, name);                                                          \
        if (sym_ == NULL) return false;                                                            \
        memcpy(&(var), &sym_, sizeof sym_);                                                        \
    } while (0)

static bool shim_open(void) {
    const char *path = getenv("TB_TEST_CL_FAULT");
    snprintf(g_shim_path, sizeof g_shim_path, "%s",
             path != NULL ? path : "build/cl_fault/libtb_cl_fault.so");
    if (g_shim_path[0] != '/') {
        char cwd[512];
        if (getcwd(cwd, sizeof cwd) == NULL) return false;
        snprintf(g_shim_path, sizeof g_shim_path, "%s/%s", cwd,
                 path != NULL ? path : "build/cl_fault/libtb_cl_fault.so");
    }
    g_shim = dlopen(g_shim_path, RTLD_NOW | RTLD_LOCAL);
    if (g_shim == NULL) {
        snprintf(g_skip, sizeof g_skip, "cannot open %s (tests/cl_fault/build.sh builds it): %s",
                 g_shim_path, dlerror());
        return false;
    }
    SHIM_SYM(shim_entry_count, "tb_cl_fault_entry_count");
    SHIM_SYM(shim_entry_name, "tb_cl_fault_entry_name");
    SHIM_SYM(shim_arm, "tb_cl_fault_arm");
    SHIM_SYM(shim_calls, "tb_cl_fault_calls");
    SHIM_SYM(shim_injected, "tb_cl_fault_injected");
    SHIM_SYM(shim_live, "tb_cl_fault_live");
    return true;
}

static int group_setup(void **state) {
    (void)state;
    if (!shim_open()) {
        if (g_skip[0] == '\0')
            snprintf(g_skip, sizeof g_skip, "%s lacks its controls", g_shim_path);
        return 0;
    }
    snprintf(g_cache, sizeof g_cache, "%s/tb_cl_faults.XXXXXX",
             getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(g_cache) == NULL) return -1;
    setenv("TB_OPENCL_LIBRARY", g_shim_path, 1);
    tb_shutdown();
    if (tb_opencl_available() != TB_OK) {
        snprintf(g_skip, sizeof g_skip, "no OpenCL device through %s: %s", g_shim_path,
                 tb_last_error());
    }
    tb_shutdown();
    return 0;
}

static int group_teardown(void **state) {
    char cmd[600];
    (void)state;
    tb_shutdown();
    wl_records_free();
    if (g_cache[0] != '\0') {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_cache);
        if (system(cmd) != 0) print_error("could not remove %s\n", g_cache);
    }
    unsetenv("TB_OPENCL_LIBRARY");
    return 0;
}

/* ---- the workload ---- */

#define CW_MAX 64

typedef struct cw_state {
    wl_record *rec;
    /* what was computed, with its value as read then, for the check after a failure */
    tb_tensor *done[CW_MAX];
    unsigned char *value[CW_MAX];
    size_t size[CW_MAX], num_done;
    tb_tensor *kept[CW_MAX];
    size_t num_kept;
    tb_status status;
    char step[160], message[1100];
} cw_state;

static void cw_fail(cw_state *s, const char *step, tb_status st) {
    if (s->status != TB_OK) return;
    s->status = st != TB_OK ? st : tb_last_status();
    if (s->status == TB_OK) s->status = TB_ERR_INTERNAL;
    snprintf(s->step, sizeof s->step, "%s", step);
    snprintf(s->message, sizeof s->message, "%s", tb_last_error());
}

static tb_tensor *cw_keep(cw_state *s, tb_tensor *t) {
    if (t != NULL) {
        if (s->num_kept == CW_MAX) fail_msg("more than %d tensors", CW_MAX);
        s->kept[s->num_kept++] = t;
    }
    return t;
}

/* Reads `t`, appends its value to the record, and remembers it for the check. */
static bool cw_read(cw_state *s, const char *label, tb_tensor *t) {
    tb_shape shape = tb_tensor_shape(t);
    size_t n = 0;
    unsigned char *host;
    tb_status st;
    if (t == NULL) {
        cw_fail(s, label, TB_OK);
        return false;
    }
    assert_int_equal(tb_shape_nbytes(&shape, &n), TB_OK);
    host = (unsigned char *)malloc(n > 0 ? n : 1);
    assert_non_null(host);
    st = tb_tensor_to_host(t, host, n);
    if (st != TB_OK) {
        free(host);
        cw_fail(s, label, st);
        return false;
    }
    wl_put(s->rec, label, host, n);
    if (s->num_done == CW_MAX) fail_msg("more than %d results", CW_MAX);
    s->done[s->num_done] = tb_tensor_retain(t);
    s->value[s->num_done] = host;
    s->size[s->num_done] = n;
    s->num_done++;
    return true;
}

#define CK(expr) cw_keep(s, (expr))
#define CW_READ(label, t)                                                                          \
    do {                                                                                           \
        if (!cw_read(s, (label), (t))) goto out;                                                   \
    } while (0)
#define CW_S(expr)                                                                                 \
    do {                                                                                           \
        tb_status st_ = (expr);                                                                    \
        if (st_ != TB_OK) {                                                                        \
            cw_fail(s, #expr, st_);                                                                \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static float g_x[64 * 33], g_w[33 * 17], g_x2[64 * 33];

static void cw_inputs(void) {
    size_t i;
    for (i = 0; i < 64 * 33; i++) {
        g_x[i] = (float)((int)((i * 37 + 11) % 29) - 14) * 0.125f;
        g_x2[i] = (float)((int)((i * 13 + 5) % 23) - 11) * 0.25f;
    }
    for (i = 0; i < 33 * 17; i++)
        g_w[i] = (float)((int)((i * 7 + 3) % 19) - 9) * 0.0625f;
}

/* Stops at the first failure; the tensors stay in *s for cw_check_intact. */
static tb_status cw_run(cw_state *s, wl_record *rec) {
    tb_device d0, d1;
    tb_shape sx = tb_shape_of(TB_F32, 2, 64, 33), sw = tb_shape_of(TB_F32, 2, 33, 17);
    tb_tensor *x, *w, *x2, *t, *u, *v, *pair[2];
    size_t count = 0;
    memset(s, 0, sizeof *s);
    s->rec = rec;
    tb_clear_error();
    CW_S(tb_device_make("opencl", 0, &d0));
    CW_S(tb_backend_devices("opencl", NULL, 0, &count));
    if (count > 1) {
        CW_S(tb_device_make("opencl", 1, &d1));
    } else {
        d1 = d0;
    }
    x = CK(tb_tensor_from_host(g_x, &sx, &d0));
    w = CK(tb_tensor_from_host(g_w, &sw, &d0));
    CW_READ("x", x);
    CW_READ("w", w);
    /* elementwise */
    t = CK(tb_relu(CK(tb_sub_scalar(CK(tb_mul_scalar(x, 2.0)), 1.0))));
    CW_READ("relu", t);
    /* reductions, two results of one graph */
    {
        int32_t axis = 1;
        pair[0] = CK(tb_sum(t, &axis, 1, false));
        pair[1] = CK(tb_max(x, NULL, 0, false));
        if (pair[0] == NULL || pair[1] == NULL) {
            cw_fail(s, "reductions", TB_OK);
            goto out;
        }
        CW_S(tb_sync(pair, 2));
        CW_READ("sum", pair[0]);
        CW_READ("max", pair[1]);
    }
    /* matmul with an epilogue, softmax */
    u = CK(tb_softmax(CK(tb_add_scalar(CK(tb_matmul(x, w)), 0.5)), 1));
    CW_READ("softmax", u);
    /* the second device */
    v = CK(tb_to_device(t, &d1));
    v = CK(tb_exp(CK(tb_mul_scalar(v, 0.1))));
    CW_READ("second device", v);
    /* concat, pad, gather */
    {
        tb_tensor *parts[2];
        int64_t pads[4] = {1, 0, 2, 1};
        int64_t idx[64 * 2];
        tb_shape si = tb_shape_of(TB_I64, 2, 64, 2);
        size_t i;
        for (i = 0; i < 64 * 2; i++)
            idx[i] = (int64_t)((i * 5) % 33);
        parts[0] = x;
        parts[1] = t;
        v = CK(tb_pad(CK(tb_concat(parts, 2, 1)), pads, 4, -1.0));
        CW_READ("concat pad", v);
        v = CK(tb_gather(x, 1, CK(tb_tensor_from_host(idx, &si, &d0))));
        CW_READ("gather", v);
    }
    /* the backend's text, then the same graph runs */
    {
        char *text;
        v = CK(tb_tanh(CK(tb_add(t, x))));
        text = tb_ir_backend_text(&v, 1);
        if (text == NULL) {
            cw_fail(s, "tb_ir_backend_text", TB_OK);
            goto out;
        }
        wl_put(rec, "backend text", text, strlen(text));
        tb_free(text);
        CW_READ("tanh", v);
    }
    /* DLPack: a copy to the host */
    {
        tb_dl_managed_tensor *m = NULL;
        CW_S(tb_dlpack_export(u, &m));
        wl_put(rec, "dlpack", m->dl_tensor.data, 64 * 17 * sizeof(float));
        m->deleter(m);
    }
    /* the buffer cache given back, then new data through the cached computation */
    CW_S(tb_opencl_trim_cache(NULL));
    x2 = CK(tb_tensor_from_host(g_x2, &sx, &d0));
    v = CK(tb_relu(CK(tb_sub_scalar(CK(tb_mul_scalar(x2, 2.0)), 1.0))));
    CW_S(tb_mark_step());
    CW_READ("mark step", v);
    /* a buffer handed out */
    {
        void *mem = NULL;
        size_t size = 0;
        CW_S(tb_opencl_tensor_buffer(v, &mem, &size));
        if (mem == NULL || size != 64 * 33 * sizeof(float)) {
            cw_fail(s, "tb_opencl_tensor_buffer gave no buffer", TB_ERR_INTERNAL);
            goto out;
        }
    }
out:
    return s->status;
}

/* After a failure: every input and every result read before it still has its value. */
static void cw_check_intact(cw_state *s, const char *what) {
    size_t i;
    for (i = 0; i < s->num_done; i++) {
        unsigned char *now = (unsigned char *)malloc(s->size[i] > 0 ? s->size[i] : 1);
        tb_status st;
        assert_non_null(now);
        st = tb_tensor_to_host(s->done[i], now, s->size[i]);
        if (st != TB_OK) {
            wl_problem("%s: result %zu, computed before the failure, cannot be read: %s", what, i,
                       tb_last_error());
        } else if (memcmp(now, s->value[i], s->size[i]) != 0) {
            wl_problem("%s: result %zu, computed before the failure, changed", what, i);
        }
        free(now);
    }
}

static void cw_release(cw_state *s) {
    size_t i;
    for (i = 0; i < s->num_done; i++) {
        tb_tensor_release(s->done[i]);
        free(s->value[i]);
    }
    for (i = 0; i < s->num_kept; i++)
        tb_tensor_release(s->kept[i]);
    s->num_done = s->num_kept = 0;
}

/* ---- the sweep ---- */

static cw_state g_state;             /* static: a failed assertion leaves it to the next session */
static long g_live_base[LIVE_KINDS]; /* OpenCL objects alive when the session began */

static void session_begin(bool from_cache) {
    int kind;
    tb_shutdown();
    for (kind = 0; kind < LIVE_KINDS; kind++)
        g_live_base[kind] = shim_live(kind, NULL);
    setenv("TB_CACHE_DIR", from_cache ? g_cache : "off", 1);
    wl_hook_arm(0);
    if (wl_setup(true) != TB_OK) fail_msg("tb_setup: %s", tb_last_error());
}

/* Shuts down and checks that the session left nothing: no block of the hook, no OpenCL object
   (but the one whose release was refused, when `entry` is a release). */
static void session_end(const char *what, const char *entry) {
    int kind;
    tb_shutdown();
    wl_check_after_shutdown(what, 0);
    for (kind = 0; kind < LIVE_KINDS; kind++) {
        const char *name = "";
        long live = shim_live(kind, &name) - g_live_base[kind];
        long allowed = 0;
        if (strncmp(entry, "clRelease", 9) == 0 && live == 1) {
            /* the object whose release failed: the library cannot release it again */
            allowed = (strcmp(entry, "clReleaseContext") == 0 && kind == 0) ||
                      (strcmp(entry, "clReleaseCommandQueue") == 0 && kind == 1) ||
                      (strcmp(entry, "clReleaseMemObject") == 0 && kind == 2) ||
                      (strcmp(entry, "clReleaseProgram") == 0 && kind == 3) ||
                      (strcmp(entry, "clReleaseKernel") == 0 && kind == 4) ||
                      (strcmp(entry, "clReleaseEvent") == 0 && kind == 5);
        }
        if (live != allowed)
            wl_problem("%s: %ld OpenCL %s alive after tb_shutdown", what, live, name);
    }
}

/* One session where call n of entry `e` fails. Returns whether the call happened. */
static bool fail_one(int e, long n, bool from_cache, const wl_record *clean, long *errors) {
    const char *name = shim_entry_name(e);
    char what[256];
    wl_record *rec = &wl_rec_a;
    tb_status st;
    long injected;
    snprintf(what, sizeof what, "%s call %ld failing with %d (programs from %s)", name, n,
             error_for(name), from_cache ? "the disk cache" : "source");
    wl_record_free(rec);
    session_begin(from_cache);
    shim_arm(e, n, 1, error_for(name));
    st = cw_run(&g_state, rec);
    injected = shim_injected();
    shim_arm(-1, 0, 0, 0);
    if (injected == 0) {
        if (st != TB_OK)
            wl_problem("%s: not failed, yet %s: %s", what, g_state.step, g_state.message);
        cw_release(&g_state);
        session_end(what, "");
        return false;
    }
    if (st != TB_OK) {
        (*errors)++;
        if (g_state.message[0] == '\0')
            wl_problem("%s: %s failed without a message", what, g_state.step);
        if (getenv("TB_TEST_VERBOSE") != NULL)
            print_message("%s: %s: %s: %s\n", what, g_state.step, tb_status_string(st),
                          g_state.message);
        cw_check_intact(&g_state, what);
    } else if (wl_first_difference(clean, rec)[0] != '\0') {
        wl_problem("%s: every call succeeded but the results differ from a clean run's: %s", what,
                   wl_first_difference(clean, rec));
    }
    cw_release(&g_state);
    wl_record_free(rec);
    /* failures have stopped: the same session runs it right */
    st = cw_run(&g_state, rec);
    if (st != TB_OK) {
        wl_problem("%s: the next run in the session failed: %s: %s: %s", what, g_state.step,
                   tb_status_string(st), g_state.message);
    } else if (wl_first_difference(clean, rec)[0] != '\0') {
        wl_problem("%s: the next run in the session gives other results: %s", what,
                   wl_first_difference(clean, rec));
    }
    cw_release(&g_state);
    wl_record_free(rec);
    session_end(what, name);
    return true;
}

static void sweep(bool from_cache) {
    wl_record *clean = &wl_clean_rec;
    long calls[64], errors = 0, tried = 0;
    int e, count;
    bool full = getenv("TB_TEST_CL_FAULT_SWEEP") != NULL &&
                strcmp(getenv("TB_TEST_CL_FAULT_SWEEP"), "full") == 0;
    /* TB_TEST_CL_FAULT_SHARD=i/k: only the entry points numbered i modulo k */
    long shard = 0, shards = 1;
    const char *sh = getenv("TB_TEST_CL_FAULT_SHARD");
    if (sh != NULL && sscanf(sh, "%ld/%ld", &shard, &shards) != 2) shards = 1;
    if (shards < 1 || shard < 0 || shard >= shards) fail_msg("bad TB_TEST_CL_FAULT_SHARD");
    if (g_skip[0] != '\0') {
        print_message("skipped: %s\n", g_skip);
        skip();
    }
    count = shim_entry_count();
    assert_true(count > 0 && count <= 64);
    cw_inputs();
    wl_records_free();
    wl_problems = 0;
    /* two clean sessions: the first may fill the disk cache; the second gives the record and
       how often each entry point is called */
    session_begin(from_cache);
    if (cw_run(&g_state, clean) != TB_OK)
        fail_msg("clean run: %s: %s", g_state.step, g_state.message);
    cw_release(&g_state);
    session_end("clean run", "");
    wl_record_free(clean);
    session_begin(from_cache);
    shim_arm(-1, 0, 0, 0);
    if (cw_run(&g_state, clean) != TB_OK)
        fail_msg("clean run: %s: %s", g_state.step, g_state.message);
    cw_release(&g_state);
    session_end("clean run", "");
    for (e = 0; e < count; e++)
        calls[e] = shim_calls(e);
    for (e = 0; e < count; e++) {
        long n;
        if (calls[e] == 0 || e % shards != shard) continue;
        if (full) {
            for (n = 1; n <= calls[e] + 1; n++) {
                tried++;
                if (!fail_one(e, n, from_cache, clean, &errors)) break;
            }
        } else {
            /* the first call and the last (with two devices, often one on each) */
            tried++;
            (void)fail_one(e, 1, from_cache, clean, &errors);
            if (calls[e] > 1) {
                tried++;
                (void)fail_one(e, calls[e], from_cache, clean, &errors);
            }
        }
    }
    if (getenv("TB_TEST_VERBOSE") != NULL)
        print_message("%ld sessions with a failed call, %ld of them errors\n", tried, errors);
    wl_records_free();
    if (wl_problems > 0) {
        long problems = wl_problems;
        wl_problems = 0;
        fail_msg("%ld problems (the first 40 are above)", problems);
    }
}

/* The driver running out of host memory or resources while the runtime loads (clGetPlatformIDs,
   clGetDeviceIDs, clGetDeviceInfo, clGetPlatformInfo) is TB_ERR_OUT_OF_MEMORY for that call,
   and the next call loads the runtime again with every device and its facts. It used to make
   OpenCL unavailable until tb_shutdown ("no OpenCL platform is installed"), or to leave a
   device out, or nameless, for the whole session, with TB_OK. */
static void test_load_failures_retried(void **state) {
    static const char *const entries[] = {"clGetPlatformIDs", "clGetDeviceIDs", "clGetDeviceInfo",
                                          "clGetPlatformInfo"};
    static const int errors[] = {-6 /* CL_OUT_OF_HOST_MEMORY */, -5 /* CL_OUT_OF_RESOURCES */};
    tb_device devs[8];
    tb_device_info clean[8], info;
    size_t expected = 0, count, i, k;
    int e, count_entries;
    (void)state;
    if (g_skip[0] != '\0') {
        print_message("skipped: %s\n", g_skip);
        skip();
    }
    session_begin(false);
    assert_int_equal(tb_backend_devices("opencl", devs, 8, &expected), TB_OK);
    assert_true(expected > 0 && expected <= 8);
    for (i = 0; i < expected; i++)
        assert_int_equal(tb_backend_device_info(&devs[i], &clean[i]), TB_OK);
    session_end("clean load", "");
    count_entries = shim_entry_count();
    for (k = 0; k < sizeof entries / sizeof entries[0]; k++) {
        int index = -1;
        long n;
        for (e = 0; e < count_entries; e++) {
            if (strcmp(shim_entry_name(e), entries[k]) == 0) index = e;
        }
        assert_true(index >= 0);
        for (n = 1;; n++) {
            tb_status st;
            long injected;
            session_begin(false);
            shim_arm(index, n, 1, errors[n % 2]);
            count = 0;
            st = tb_backend_devices("opencl", devs, 8, &count);
            injected = shim_injected();
            shim_arm(-1, 0, 0, 0);
            if (injected > 0 && st != TB_OK && st != TB_ERR_OUT_OF_MEMORY) {
                fail_msg("%s call %ld failing with %d: %s '%s', not TB_ERR_OUT_OF_MEMORY",
                         entries[k], n, errors[n % 2], tb_status_string(st), tb_last_error());
            }
            if (st == TB_OK && count != expected) {
                fail_msg("%s call %ld failing with %d: TB_OK with %zu devices, not %zu", entries[k],
                         n, errors[n % 2], count, expected);
            }
            /* the next call loads it again, whole */
            assert_int_equal(tb_backend_devices("opencl", devs, 8, &count), TB_OK);
            assert_int_equal(count, expected);
            for (i = 0; i < expected; i++) {
                assert_int_equal(tb_backend_device_info(&devs[i], &info), TB_OK);
                if (strcmp(info.name, clean[i].name) != 0 ||
                    strcmp(info.extensions, clean[i].extensions) != 0 ||
                    strcmp(info.driver_version, clean[i].driver_version) != 0 ||
                    info.global_memory != clean[i].global_memory ||
                    info.compute_units != clean[i].compute_units ||
                    info.supports_f64 != clean[i].supports_f64) {
                    fail_msg("%s call %ld failing: device %zu is now '%s' (%u units), not '%s'",
                             entries[k], n, i, info.name, (unsigned)info.compute_units,
                             clean[i].name);
                }
            }
            session_end(entries[k], "");
            if (injected == 0) break;
        }
        assert_true(n > 1);
    }
    if (wl_problems > 0) {
        wl_problems = 0;
        fail_msg("objects or blocks left (above)");
    }
}

/* tb_shutdown with tensors still alive (the caller's mistake, but not one to crash on): the
   kernels they queued are finished before it returns, so that none runs, or is compiled by the
   driver, while the process exits. The child (this program again, `--shutdown-alive`: a forked
   copy of a process with threads cannot use the library) queues a matmul, leaves its tensors
   alive and calls tb_shutdown; it exits with 0 where tb_shutdown called clFinish, 2 where it
   did not, 1 where the work could not be queued. */
static int shutdown_with_tensors_alive(void) {
    tb_device dev;
    tb_shape s = tb_shape_of(TB_F32, 2, 256, 256);
    tb_tensor *a, *m, *y;
    int finish = -1, i;
    long before;
    if (!shim_open() || tb_device_parse("opencl:0", &dev) != TB_OK) return 1;
    for (i = 0; i < shim_entry_count(); i++)
        if (strcmp(shim_entry_name(i), "clFinish") == 0) finish = i;
    a = tb_randn(&s, &dev);
    m = tb_matmul(a, a);
    y = tb_exp(m);
    if (finish < 0 || y == NULL || tb_sync(&y, 1) != TB_OK) return 1;
    before = shim_calls(finish);
    tb_shutdown(); /* a, m and y stay alive */
    return shim_calls(finish) > before ? 0 : 2;
}

static void test_shutdown_with_tensors_alive(void **state) {
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    pid_t pid;
    int status;
    (void)state;
    if (g_skip[0] != '\0') {
        print_message("skipped: %s\n", g_skip);
        skip();
    }
    assert_true(n > 0);
    self[n] = '\0';
    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char *const argv[] = {self, (char *)"--shutdown-alive", NULL};
        execv(self, argv);
        _exit(127);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_programs_from_source(void **state) {
    (void)state;
    sweep(false);
}

static void test_programs_from_disk_cache(void **state) {
    (void)state;
    sweep(true);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_failures_retried),
        cmocka_unit_test(test_shutdown_with_tensors_alive),
        cmocka_unit_test(test_programs_from_source),
        cmocka_unit_test(test_programs_from_disk_cache),
    };
    if (argc == 2 && strcmp(argv[1], "--shutdown-alive") == 0) return shutdown_with_tensors_alive();
    if (getenv("TB_TEST_FILTER") != NULL) cmocka_set_test_filter(getenv("TB_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
