// test: run
// Build: cc -std=c99 -I. examples/kit_backend.c -o kit_backend -ldl -lpthread -lm
//        (from the repository root)
// Run:   ./kit_backend
/* A compiled backend through the public kit (tb_kit_register), in one file: "kitc" runs the
   library's generated C99 kernels, built by the system C compiler ($CC, else cc) into a shared
   object and loaded with dlopen, on one thread, in host memory. The kit does the rest: fusion,
   the kernel plan and its C99 source, the computation cache, buffer lifetimes and donation,
   run-time error reports, TB_DEBUG profiling and metrics. A vendor's runtime (CUDA through
   NVRTC, HIP, Level Zero) is this file with its own calls in the memory, build and launch
   entries, and TB_KIT_OPENCL_C or C99 as its language.

   The program registers the backend, runs a small network's forward and one training step on
   it, and checks every value against the cpu backend; it exits with status 1 on a mismatch.
   tests/test_kit.c runs the library's whole compiled-backend suite on it. */
#define _POSIX_C_SOURCE 200809L
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- the device: this process's CPU, one of it ---- */

typedef struct kitc_buffer {
    tb_kit_buffer k; /* first: the kit sees this part */
} kitc_buffer;

typedef struct kitc_device {
    pthread_mutex_t lock;
    bool alive;
    tb_kit_stats stats;
} kitc_device;

static kitc_device kitc_dev = {
    PTHREAD_MUTEX_INITIALIZER, true, {0, 0, 0, 256u << 20, 0, 0, 0, 0, 0}};

/* kitc:0, a CPU device */
static void kitc_device_of(tb_device *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->backend, sizeof out->backend, "kitc");
    out->type = TB_DEVICE_CPU;
    out->ordinal = 0;
}

static size_t kitc_devices(tb_device *out, size_t cap, char *why, size_t why_cap) {
    (void)why;
    (void)why_cap;
    if (cap > 0) kitc_device_of(&out[0]);
    return 1;
}

static void *kitc_open(int32_t ordinal, const char *func, bool bare) {
    (void)bare;
    if (ordinal != 0) {
        tb_set_error(TB_ERR_NOT_FOUND, "%s: no device kitc:%d (1 device)", func, (int)ordinal);
        return NULL;
    }
    return &kitc_dev;
}

static void kitc_close(void *dev) {
    (void)dev; /* the device is static */
}

static bool kitc_alive(void *dev) {
    return ((kitc_device *)dev)->alive;
}

static int32_t kitc_ordinal(void *dev) {
    (void)dev;
    return 0;
}

static void kitc_info(void *dev, bool full, tb_device_info *out) {
    (void)dev;
    (void)full;
    memset(out, 0, sizeof *out);
    kitc_device_of(&out->device);
    snprintf(out->name, sizeof out->name, "host CPU, C99 kernels on one thread");
    snprintf(out->vendor, sizeof out->vendor, "example");
    snprintf(out->language_version, sizeof out->language_version, "C99");
    out->compute_units = 1;
    out->global_memory = (uint64_t)8 << 30;
    out->max_allocation = (uint64_t)2 << 30;
    out->max_work_group_size = 1;
    out->supports_f64 = true;
    out->unified_memory = true;
}

static tb_kit_stats *kitc_stats(void *dev) {
    return &((kitc_device *)dev)->stats;
}

/* C99 kernels, for 16-byte vectors (any x86-64 or aarch64 compiler's default target). */
static void kitc_facts(void *dev, tb_kit_facts *f) {
    (void)dev;
    f->language = TB_KIT_C99;
    f->type = TB_DEVICE_CPU;
    f->vector_bytes = 16;
    f->vector_registers = 16;
    f->compute_units = 1;
    f->max_group = 1;
    f->max_allocation = (uint64_t)2 << 30;
    f->max_args = 4096;
    f->buffer_align = 64;
    f->f64 = true;
    f->f64_accumulate = true;
}

static void kitc_lock(void *dev) {
    pthread_mutex_lock(&((kitc_device *)dev)->lock);
}

static void kitc_unlock(void *dev) {
    pthread_mutex_unlock(&((kitc_device *)dev)->lock);
}

/* ---- memory: 64-byte aligned host memory ---- */

static tb_status kitc_alloc(void *dev, size_t bytes, tb_kit_buffer **out) {
    kitc_device *d = (kitc_device *)dev;
    kitc_buffer *b = (kitc_buffer *)calloc(1, sizeof *b);
    size_t cap = bytes > 0 ? (bytes + 63) / 64 * 64 : 64;
    if (b == NULL || posix_memalign(&b->k.mem, 64, cap) != 0) {
        free(b);
        return tb_set_error(TB_ERR_OUT_OF_MEMORY, "kitc: cannot allocate %zu bytes", bytes);
    }
    b->k.device = dev;
    b->k.size = bytes;
    b->k.cap = cap;
    d->stats.bytes_in_use += cap;
    if (d->stats.bytes_in_use > d->stats.peak_bytes) d->stats.peak_bytes = d->stats.bytes_in_use;
    *out = &b->k;
    return TB_OK;
}

static void kitc_release(tb_kit_buffer *b) {
    ((kitc_device *)b->device)->stats.bytes_in_use -= b->cap;
    free(b->mem);
    free(b);
}

static tb_status kitc_write(void *dev, tb_kit_buffer *b, const void *host, size_t bytes) {
    (void)dev;
    if (bytes > 0) memcpy(b->mem, host, bytes);
    return TB_OK;
}

static tb_status kitc_read(void *dev, const tb_kit_buffer *b, void *host, size_t bytes) {
    (void)dev;
    if (bytes > 0) memcpy(host, b->mem, bytes);
    return TB_OK;
}

static tb_status kitc_copy(void *dev, const tb_kit_buffer *from, tb_kit_buffer *to, size_t bytes) {
    (void)dev;
    if (bytes > 0) memcpy(to->mem, from->mem, bytes);
    return TB_OK;
}

/* ---- programs: the source compiled into a shared object, loaded ---- */

/* The source in a private folder, compiled there; the loaded object (the files are removed). */
static tb_status kitc_build(void *dev, const tb_kit_program *src, void **program) {
    char dir[] = "/tmp/kitc-XXXXXX", path[64], cmd[512];
    const char *cc = getenv("CC") != NULL && getenv("CC")[0] != '\0' ? getenv("CC") : "cc";
    FILE *f;
    void *so = NULL;
    int rc;
    (void)dev;
    if (mkdtemp(dir) == NULL) return tb_set_error(TB_ERR_IO, "kitc: cannot make a folder");
    snprintf(path, sizeof path, "%s/k.c", dir);
    f = fopen(path, "w");
    if (f == NULL || fwrite(src->source, 1, src->length, f) != src->length) {
        if (f != NULL) fclose(f);
        rmdir(dir);
        return tb_set_error(TB_ERR_IO, "kitc: cannot write %s", path);
    }
    fclose(f);
    tb_kit_progress(0, src->num_functions);
    snprintf(cmd, sizeof cmd,
             "%s -std=gnu99 -O2 -fPIC -shared -ffp-contract=off -fno-math-errno -w -o %s/k.so "
             "%s/k.c -lm 2>%s/k.log",
             cc, dir, dir, dir);
    rc = system(cmd);
    snprintf(path, sizeof path, "%s/k.so", dir);
    if (rc == 0) so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "kitc: %s left behind\n", dir);
    if (so == NULL) {
        return tb_set_error(TB_ERR_COMPILE, "kitc: %s could not build the program (status %d)", cc,
                            rc);
    }
    kitc_lock(dev); /* builds run on several threads at once */
    kitc_dev.stats.builds++;
    kitc_unlock(dev);
    tb_kit_progress(src->num_functions, src->num_functions);
    *program = so;
    return TB_OK;
}

static tb_status kitc_kernel(void *dev, void *program, const tb_kit_kernel *k, void **handle,
                             size_t *aux) {
    (void)dev;
    *handle = dlsym(program, k->function);
    *aux = 0;
    if (*handle == NULL)
        return tb_set_error(TB_ERR_COMPILE, "kitc: the program has no kernel %s", k->function);
    return TB_OK;
}

static void kitc_drop(void *dev, void *program) {
    (void)dev;
    dlclose(program);
}

/* ---- launches: every work item on this thread ---- */

typedef void (*kitc_fn)(void *const *args, long lo, long hi);

static uint64_t kitc_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static tb_status kitc_launch(void *dev, void *handle, size_t aux, const tb_kit_kernel *k,
                             const tb_kit_arg *args, size_t num_args, uint64_t *event) {
    void *small[64], **argv = small;
    uint64_t size[3], t0 = kitc_now_ns();
    kitc_fn fn;
    size_t j;
    (void)dev;
    (void)aux;
    if (num_args > 64 && (argv = (void **)calloc(num_args, sizeof *argv)) == NULL)
        return tb_set_error(TB_ERR_OUT_OF_MEMORY, "kitc: out of memory");
    for (j = 0; j < num_args; j++) {
        if (args[j].kind == TB_KIT_ARG_SCALAR) {
            argv[j] = (void *)args[j].value.bytes;
        } else if (args[j].kind == TB_KIT_ARG_TABLE) {
            argv[j] = (unsigned char *)args[j].mem + 8 * (size_t)args[j].at;
        } else {
            argv[j] = args[j].mem;
        }
    }
    memcpy(&fn, &handle, sizeof fn);
    tb_kit_work_items(k, size);
    fn(argv, 0, (long)(size[0] * size[1] * size[2]));
    if (argv != small) free(argv);
    if (event != NULL) *event = kitc_now_ns() - t0;
    return TB_OK;
}

static void kitc_finish(void *dev) {
    (void)dev; /* a launch returns when its work is done */
}

static double kitc_elapsed(void *dev, uint64_t event) {
    (void)dev;
    return (double)event;
}

static void kitc_shutdown(void) {
    kitc_lock(&kitc_dev);
    kitc_dev.alive = false;
    kitc_unlock(&kitc_dev);
}

/* Registers "kitc" (once a process; after tb_shutdown, again). The table is filled by name, so
   that entries the kit adds later stay NULL here. */
static tb_status kitc_register(void) {
    static tb_kit_runtime rt;
    if (rt.name == NULL) {
        rt.name = "kitc";
        rt.metric = "Kitc";
        rt.build_metric = "ProgramBuild";
        rt.devices = kitc_devices;
        rt.open = kitc_open;
        rt.close = kitc_close;
        rt.alive = kitc_alive;
        rt.ordinal = kitc_ordinal;
        rt.info = kitc_info;
        rt.stats = kitc_stats;
        rt.facts = kitc_facts;
        rt.lock = kitc_lock;
        rt.unlock = kitc_unlock;
        rt.alloc = kitc_alloc;
        rt.release = kitc_release;
        rt.write = kitc_write;
        rt.read = kitc_read;
        rt.copy = kitc_copy;
        rt.build = kitc_build;
        rt.kernel = kitc_kernel;
        rt.drop = kitc_drop;
        rt.launch = kitc_launch;
        rt.finish = kitc_finish;
        rt.elapsed = kitc_elapsed;
        rt.shutdown = kitc_shutdown;
    }
    kitc_lock(&kitc_dev);
    kitc_dev.alive = true;
    kitc_unlock(&kitc_dev);
    if (tb_has_backend("kitc")) return TB_OK;
    return tb_kit_register("kitc", &rt, "");
}

#ifndef KITC_NO_MAIN

/* ---- the demonstration: a forward and a training step, checked against cpu ---- */

/* A small network's output, loss and weight gradients on `device_text`, into out. */
static int run(const char *device_text, float out[4][256]) {
    tb_device dev;
    tb_shape xs, w1s, w2s;
    tb_tensor *x = NULL, *w1 = NULL, *w2 = NULL, *y = NULL, *loss = NULL, *grads[2] = {NULL, NULL};
    tb_tensor *params[2];
    int rc = 0, i;
    if (tb_device_parse(device_text, &dev) != TB_OK) return 1;
    xs = tb_shape_of(TB_F32, 2, 8, 16);
    w1s = tb_shape_of(TB_F32, 2, 16, 16);
    w2s = tb_shape_of(TB_F32, 2, 16, 4);
    tb_manual_seed(7);
    x = tb_randn(&xs, &dev);
    w1 = tb_randn(&w1s, &dev);
    w2 = tb_randn(&w2s, &dev);
    params[0] = w1;
    params[1] = w2;
    tb_set_requires_grad(w1, true);
    tb_set_requires_grad(w2, true);
    {
        tb_tensor *h = tb_relu(tb_matmul(x, w1)), *z = tb_matmul(h, w2);
        y = tb_softmax(z, 1);
        loss = tb_mean(tb_mul(y, y), NULL, 0, false);
        tb_tensor_release(h);
        tb_tensor_release(z);
    }
    if (tb_grad(loss, NULL, params, 2, grads) != TB_OK) rc = 1;
    if (rc == 0 && (tb_tensor_to_host(y, out[0], 8 * 4 * sizeof(float)) != TB_OK ||
                    tb_tensor_to_host(loss, out[1], sizeof(float)) != TB_OK ||
                    tb_tensor_to_host(grads[0], out[2], 16 * 16 * sizeof(float)) != TB_OK ||
                    tb_tensor_to_host(grads[1], out[3], 16 * 4 * sizeof(float)) != TB_OK))
        rc = 1;
    if (rc != 0) fprintf(stderr, "kit_backend: %s: %s\n", device_text, tb_last_error());
    tb_tensor_release(x);
    tb_tensor_release(w1);
    tb_tensor_release(w2);
    tb_tensor_release(y);
    tb_tensor_release(loss);
    for (i = 0; i < 2; i++)
        tb_tensor_release(grads[i]);
    return rc;
}

int main(void) {
    static float ours[4][256], ref[4][256];
    static const int counts[4] = {32, 1, 256, 64};
    static const char *const names[4] = {"forward", "loss", "grad w1", "grad w2"};
    double worst = 0;
    char *report;
    int t, i;
    if (kitc_register() != TB_OK) {
        fprintf(stderr, "kit_backend: %s\n", tb_last_error());
        return 1;
    }
    if (run("kitc:0", ours) != 0 || run("cpu:0", ref) != 0) return 1;
    for (t = 0; t < 4; t++) {
        double err = 0, scale = 1e-6;
        for (i = 0; i < counts[t]; i++) {
            err = fmax(err, fabs((double)ours[t][i] - (double)ref[t][i]));
            scale = fmax(scale, fabs((double)ref[t][i]));
        }
        printf("%-8s %3d values, largest difference from cpu %.3g (of %.3g)\n", names[t], counts[t],
               err, scale);
        worst = fmax(worst, err / scale);
    }
    report = tb_backend_metrics_report("kitc");
    if (report != NULL) printf("%s", report);
    tb_free(report);
    tb_shutdown();
    if (worst > 1e-5) {
        fprintf(stderr, "kit_backend: kitc differs from cpu by %.3g of the scale\n", worst);
        return 1;
    }
    printf("kitc matches cpu\n");
    return 0;
}

#endif /* KITC_NO_MAIN */
