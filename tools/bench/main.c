/* The benchmark: torch_backend.h's compiled backends (opencl:0 and native:0) beside PyTorch
   eager on the same threads, the memory-bandwidth bound (OpenBLAS for matmul) and hand-written
   OpenCL kernels, all in one run. Build and run it with tools/bench.sh:

       build/bench/bench [--quick] [--json FILE] [--only CASE,...] [--torch-peer SCRIPT]

   Every case checks every side's result (ours on each backend, PyTorch's, the anchors') against
   the cpu reference backend or a host computation before anything is timed; a wrong result stops
   the run with exit status 1. Timing: two untimed warm-ups per side, then rounds that call every
   side once in an order shuffled every round (each of ours ends when its result is ready: tb_sync,
   and clFinish on OpenCL); the median of the rounds is reported.

   The program re-executes itself for the parts that need a fresh process:
       --child coldstart BACKEND     one MLP step in a new process (the caller sets TB_CACHE_DIR
                                     and POCL_CACHE_DIR), prints "RESULT key=value" lines
       --child mlp-profile BACKEND   MLP steps with per-kernel profiling (debug level 2), prints
                                     the kernel times of the last step */
#define _GNU_SOURCE
#include "bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const g_case_names[] = {
    "chain8",
    "add",
    "gates",
    "sum",
    "max",
    "row_sums",
    "softmax",
    "layer_norm",
    "matmul",
    "mlp",
    "mlp_train",
    "conv",
    "trace",
    "replay",
    "coldstart",
    "half",
    "allreduce_devices",
};
#define NUM_CASES (sizeof g_case_names / sizeof g_case_names[0])

static const char *g_only; /* comma-separated case names, NULL: all */

/* Whether --only lets the case `name` run. */
static int selected(const char *name) {
    const char *p = g_only;
    size_t len = strlen(name);
    if (p == NULL) return 1;
    while (*p != '\0') {
        size_t n = strcspn(p, ",");
        if (n == len && strncmp(p, name, n) == 0) return 1;
        p += n;
        if (*p == ',') p++;
    }
    return 0;
}

static int check_only(void) {
    const char *p = g_only;
    while (p != NULL && *p != '\0') {
        size_t n = strcspn(p, ","), k;
        int known = 0;
        for (k = 0; k < NUM_CASES; k++)
            if (strlen(g_case_names[k]) == n && strncmp(p, g_case_names[k], n) == 0) known = 1;
        if (!known) {
            fprintf(stderr, "bench: unknown case '%.*s' in --only\n", (int)n, p);
            return 0;
        }
        p += n;
        if (*p == ',') p++;
    }
    return 1;
}

static void cpu_name(char *out, size_t cap) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    snprintf(out, cap, "unknown");
    if (f == NULL) return;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c != NULL) {
                snprintf(out, cap, "%s", c + 2);
                out[strcspn(out, "\n")] = '\0';
            }
            break;
        }
    }
    fclose(f);
}

/* The machine and the peers, printed before the cases and once more at the end. */
static void print_machine(FILE *f) {
    char cpu[256], pver[256] = "", pname[256] = "";
    tb_device_info info;
    int b;
    cpu_name(cpu, sizeof cpu);
    fprintf(f, "machine: %s, %ld cores online; the native backend and the peers on %d thread%s\n",
            cpu, sysconf(_SC_NPROCESSORS_ONLN), g_threads, g_threads == 1 ? "" : "s");
    for (b = 0; b < NUM_BACKENDS; b++) {
        const bench_backend *be = &g_backends[b];
        if (!be->ok) {
            fprintf(f, "%s:0: skipped: %s\n", be->name, be->why);
            continue;
        }
        memset(&info, 0, sizeof info);
        tb_backend_device_info(&be->dev, &info);
        fprintf(f, "%s:0: %s (%s, driver %s, %u compute units)\n", be->name, info.name,
                info.language_version, info.driver_version, info.compute_units);
    }
    if (g_backends[0].ok) {
        clGetPlatformInfo(g_platform, CL_PLATFORM_NAME, sizeof pname, pname, NULL);
        clGetPlatformInfo(g_platform, CL_PLATFORM_VERSION, sizeof pver, pver, NULL);
        fprintf(f, "platform: %s, %s\n", pname, pver);
    }
    fprintf(f, "PyTorch: %s\n", torch_about());
    fprintf(f, "OpenBLAS: %s\n", openblas_about());
    fprintf(f, "CLBlast: %s\n",
            !have_clblast()    ? "not installed (libclblast-dev): its anchor is skipped"
            : g_backends[0].ok ? "linked, on opencl:0"
                               : "linked, unused (no OpenCL device)");
    fprintf(f,
            "bandwidth (%d thread%s, %s, 3 buffers of %.0f MiB; last-level cache %.0f "
            "MiB; %s): read %.2f GB/s, copy %.2f GB/s (with non-temporal stores %.2f GB/s), triad "
            "%.2f GB/s\n",
            g_threads, g_threads == 1 ? "" : "s",
            g_bw.measured > 1 ? "best of the measurements before and after the bandwidth cases"
                              : "before the cases",
            g_bw.buffer_bytes / 1048576.0, g_bw.l3_bytes / 1048576.0,
            g_bw.wide ? "the read and the non-temporal copy in 64-byte vectors" : "16-byte vectors",
            g_bw.read / 1e9, g_bw.copy / 1e9, g_bw.copy_stream / 1e9, g_bw.triad / 1e9);
    fprintf(f, "torch_backend.h %s\n", TB_VERSION_STRING);
}

/* `in` as a JSON string's contents: quotes, backslashes and control characters dropped. */
static const char *json_text(const char *in, char *out, size_t cap) {
    size_t n = 0;
    for (; *in != '\0' && n + 1 < cap; in++)
        if (*in != '"' && *in != '\\' && (unsigned char)*in >= 0x20) out[n++] = *in;
    out[n] = '\0';
    return out;
}

static void json_facts(void) {
    char cpu[256], dev[256] = "", a[256], b[512], c[512], d[512];
    tb_device_info info;
    memset(&info, 0, sizeof info);
    if (g_backends[0].ok && tb_backend_device_info(&g_backends[0].dev, &info) == TB_OK)
        snprintf(dev, sizeof dev, "%.120s, driver %.64s", info.name, info.driver_version);
    cpu_name(cpu, sizeof cpu);
    json_machine("{\"case\": \"machine\", \"cpu\": \"%s\", \"cores\": %ld, \"threads\": %d, "
                 "\"quick\": %s, \"opencl\": %s, \"opencl_device\": \"%s\", \"native\": %s, "
                 "\"pytorch\": %s, \"pytorch_about\": \"%s\", \"openblas\": \"%s\", "
                 "\"clblast\": %s, \"bandwidth_read\": %.6g, \"bandwidth_copy\": %.6g, "
                 "\"bandwidth_copy_stream\": %.6g, \"bandwidth_triad\": %.6g, \"buffer_bytes\": "
                 "%.0f, \"llc_bytes\": %.0f, "
                 "\"bandwidth_64mib_read\": %.6g, \"bandwidth_64mib_copy\": %.6g, "
                 "\"bandwidth_64mib_triad\": %.6g, "
                 "\"version\": \"%s\"}",
                 json_text(cpu, a, sizeof a), sysconf(_SC_NPROCESSORS_ONLN), g_threads,
                 g_quick ? "true" : "false", g_backends[0].ok ? "true" : "false",
                 json_text(dev, b, sizeof b), g_backends[1].ok ? "true" : "false",
                 torch_ok() ? "true" : "false", json_text(torch_about(), c, sizeof c),
                 json_text(openblas_about(), d, sizeof d),
                 have_clblast() && g_backends[0].ok ? "true" : "false", g_bw.read, g_bw.copy,
                 g_bw.copy_stream, g_bw.triad, g_bw.buffer_bytes, g_bw.l3_bytes, g_bw.small_read,
                 g_bw.small_copy, g_bw.small_triad, TB_VERSION_STRING);
}

static void usage(const char *self) {
    fprintf(stderr,
            "usage: %s [--quick] [--json FILE] [--only CASE,...] [--torch-peer SCRIPT]\n"
            "cases: chain8 add gates sum max row_sums softmax layer_norm matmul mlp mlp_train conv "
            "trace "
            "replay coldstart half allreduce_devices\n",
            self);
}

int main(int argc, char **argv) {
    const char *json_path = NULL, *peer = "tools/bench/torch_peer.py";
    char cache_dir[1024] = "";
    int i, own_cache = 0, b;
    double t_start = now_s();
    ssize_t len;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            g_quick = 1;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            g_only = argv[++i];
        } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json_path = argv[++i];
        } else if (strcmp(argv[i], "--torch-peer") == 0 && i + 1 < argc) {
            peer = argv[++i];
        } else if (strcmp(argv[i], "--child") == 0 && i + 2 < argc) {
            if (i + 3 < argc && strcmp(argv[i + 3], "--quick") == 0) g_quick = 1;
            return child_main(argv[i + 1], argv[i + 2]);
        } else {
            usage(argv[0]);
            return 2;
        }
    }
    if (!check_only()) return 2;
    len = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (len <= 0) die("readlink /proc/self/exe: %s", strerror(errno));
    g_self[len] = '\0';
    if (getenv("TB_CACHE_DIR") == NULL) {
        make_temp_dir(cache_dir, sizeof cache_dir, "cache");
        setenv("TB_CACHE_DIR", cache_dir, 1);
        own_cache = 1;
    }
    if (json_path != NULL) {
        g_json = fopen(json_path, "w");
        if (g_json == NULL) die("cannot write %s: %s", json_path, strerror(errno));
    }
    open_backends(1, 1);
    if (!g_backends[0].ok && !g_backends[1].ok) {
        fprintf(stderr, "bench: neither compiled backend can run here: opencl: %s; native: %s\n",
                g_backends[0].why, g_backends[1].why);
        return 2;
    }
    for (b = 0; b < NUM_BACKENDS; b++)
        if (!g_backends[b].ok) note("%s: skipped: %s", g_backends[b].name, g_backends[b].why);
    if (g_backends[0].ok) hand_build();
    openblas_setup();
    torch_start(peer);
    printf("torch_backend.h benchmark%s: opencl:0 and native:0 beside PyTorch eager, the "
           "bandwidth bound and anchors\n",
           g_quick ? " (--quick)" : "");
    measure_bandwidth();
    print_machine(stdout);
    printf("\npt/ours = PyTorch time / our time (> 1: we are faster); of bnd = bound time / our "
           "time; an/ours = anchor time / our time\n\n");
    print_header();
    {
        int64_t n = g_quick ? (int64_t)1 << 20 : (int64_t)1 << 24;
        int64_t side = g_quick ? 1024 : 4096;
        static const int sizes[] = {256, 512, 1024, 2048};
        int num_sizes = g_quick ? 1 : 4, s;
        char times[1024] = "";
        size_t tl = 0;
        int bw_phase = 0;
        double t0;
#define RUN_CASE(NAME, CALL)                                                                       \
    if (selected(NAME)) {                                                                          \
        t0 = now_s();                                                                              \
        CALL;                                                                                      \
        tl += (size_t)snprintf(times + tl, sizeof times - tl, "%s%s %.1f s", tl > 0 ? ", " : "",   \
                               NAME, now_s() - t0);                                                \
        if (bw_phase) printf("  (%s measured in %.1f s)\n", NAME, now_s() - t0);                   \
    }
        /* the bandwidth cases: their rows wait for the second bandwidth measurement */
        hold_rows();
        bw_phase = 1;
        RUN_CASE("chain8", case_chain8(n))
        RUN_CASE("add", case_add(n))
        RUN_CASE("gates", case_gates(n))
        RUN_CASE("sum", case_reduce("sum", 0, n, 0))
        RUN_CASE("max", case_reduce("max", 1, n, 0))
        RUN_CASE("row_sums", case_reduce("row_sums", 0, side * side, side))
        RUN_CASE("softmax", case_norm("softmax", 0, side, side))
        RUN_CASE("layer_norm", case_norm("layer_norm", 1, side, side))
        RUN_CASE("half", case_half("chain8", n); case_half("axpy", n); case_half("sum", n))
        bw_phase = 0;
        note_footprints();
        bandwidth_end();
        json_facts();
        release_rows();
        RUN_CASE("matmul", for (s = 0; s < num_sizes; s++) case_matmul(sizes[s]))
        RUN_CASE("half", case_half("matmul", g_quick ? 256 : 512))
        RUN_CASE("mlp", case_mlp(256))
        RUN_CASE("mlp_train", case_mlp_train(256))
        RUN_CASE("conv", {
            case_conv("resnet", 32, 64, 64, 56, 3, 1, 0);
            case_conv("resnet", 32, 64, 64, 56, 3, 1, 1);
            case_conv("lenet", 256, 1, 32, 28, 5, 0, 0);
            case_conv("lenet", 256, 1, 32, 28, 5, 0, 1);
        })
        RUN_CASE("trace", case_trace())
        RUN_CASE("replay", case_replay())
        RUN_CASE("coldstart", case_coldstart())
        RUN_CASE("allreduce_devices", case_allreduce_devices(g_quick ? (1 << 20) : (1 << 24)))
#undef RUN_CASE
        note("time per case (setup, checks, tuning and timing): %s", times);
    }
    torch_stop();
    print_table();
    printf("\nbound: bandwidth cases: least traffic (every input read once, the output written "
           "once) moved by the bound side in the case's own rounds (flushed like every side; "
           "the same bytes read, or copied with non-temporal stores where the case writes); "
           "--quick: at the bandwidth measured before and after the cases; matmul and mlp: "
           "OpenBLAS on the host, same "
           "threads; mlp_train: the step in C on the host with OpenBLAS's sgemm\n"
           "rate: least traffic / our time (GB/s); matmul, mlp, mlp_train: 2*M*N*K flop of the "
           "matmuls / our time\n"
           "mlp_train's anchor: the same step written with the library's plain ops (backward and "
           "AdamW by hand) on the same backend; an/ours >= 0.9 is the target\n\n");
    printf("%s\n", notes_text());
    print_machine(stdout);
    printf("total %.1f s\n", now_s() - t_start);
    if (g_backends[0].ok) hand_release_all();
    tb_shutdown();
    if (g_json != NULL) fclose(g_json);
    if (own_cache) remove_tree(cache_dir);
    return 0;
}
