// Build: cc -std=c99 -O2 -I. examples/models.c -o models -ldl -lpthread -lm
//    or: c++ -x c++ -std=c++11 -O2 -I. examples/models.c -o models -ldl -lpthread -lm
//        (both from the repository root)
// Run:   /usr/bin/python3 tools/export_model.py resnet18 resnet18.safetensors
//        ./models resnet18.safetensors [--device D] [--reps N] [--tolerance T]
/* Real models rebuilt from PyTorch's weights: torchvision's ResNet-18 and ResNet-50,
   MobileNetV2 and SqueezeNet 1.0, and a torch.nn.TransformerEncoder (post-norm, ReLU, batch
   first), read from a safetensors file that tools/export_model.py writes (the model's
   state_dict under PyTorch's names, an input, and PyTorch's output for it). The network is
   written here from those names: each convolution followed by a batch norm has the norm
   folded into its weights once (tb_batch_norm_fold), so a forward pass is convolutions with
   bias, activations, pools and additions, recorded lazily and run as one graph.

   Prints the model, the device, the time of the first forward (which compiles the graph's
   kernels unless a cache has them), the median of REPS cached forwards (default 5; each
   takes the input from host memory, as new data would come: borrowed in place where the
   device keeps host memory, copied to it elsewhere) beside PyTorch's time where the file has it
   ("torch_ms", measured by the exporter on its own threads), and the largest difference from
   PyTorch's output relative to the output's largest magnitude; then a second line: the time the
   batch norms took to fold (a graph of its own, compiled first), the kernels of the forward's graph
   (its first run launches each), how many of them are distinct (each compiled once, unless a cache
   has it) and the kernels a cached forward launches (weights' panels kept from the first run are
   not packed again) (the metrics' KernelLaunch; 0 on cpu). Exit status 1 when the difference is
   above the tolerance (default 1e-5) or on any error. The device defaults to opencl:0 when there is
   one, else native:0, else cpu:0. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, posix_memalign */
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct model {
    tb_tensor_set *weights; /* the file's tensors, on the device */
    tb_tensor_set *folded;  /* "<conv>.weight" and "<conv>.bias" with their batch norm folded in */
    const char *kind;
    bool failed;
} model;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The weight named by the format; NULL (and m->failed) when the file has none. */
static tb_tensor *weight(model *m, const char *fmt, ...) {
    char name[256];
    va_list ap;
    tb_tensor *t;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    t = tb_tensor_set_get(m->weights, name);
    if (t == NULL) m->failed = true;
    return t;
}

/* Whether the file has the weight named by the format (no error either way). */
static bool has(model *m, const char *fmt, ...) {
    char name[256];
    va_list ap;
    bool found;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    found = tb_tensor_set_get(m->weights, name) != NULL;
    tb_clear_error();
    return found;
}

/* conv `c` (weight, optional bias) then batch norm `bn`, folded into one convolution the first
   time (prepare() computes the folded weights, so the forward graph holds only them). */
static tb_tensor *conv_bn(model *m, tb_tensor *x, const char *c, const char *bn, int64_t stride,
                          int64_t pad, int64_t groups) {
    char wn[160], bname[160];
    tb_tensor *w, *b;
    const int64_t st[2] = {stride, stride}, pd[2] = {pad, pad};
    snprintf(wn, sizeof wn, "%s.weight", c);
    snprintf(bname, sizeof bname, "%s.bias", c);
    if (tb_tensor_set_count(m->folded) == 0 || !tb_tensor_set_get(m->folded, wn)) {
        tb_tensor *fw = NULL, *fb = NULL;
        tb_clear_error();
        if (tb_batch_norm_fold(
                weight(m, "%s", wn), has(m, "%s", bname) ? weight(m, "%s", bname) : NULL,
                weight(m, "%s.running_mean", bn), weight(m, "%s.running_var", bn),
                weight(m, "%s.weight", bn), weight(m, "%s.bias", bn), 1e-5, &fw, &fb) != TB_OK) {
            m->failed = true;
            return NULL;
        }
        if (tb_tensor_set_add(m->folded, wn, fw) != TB_OK ||
            tb_tensor_set_add(m->folded, bname, fb) != TB_OK)
            m->failed = true;
        if (m->failed)
            return NULL; /* fw and fb belong to the forward's scope; the set keeps its own */
    }
    w = tb_tensor_set_get(m->folded, wn);
    b = tb_tensor_set_get(m->folded, bname);
    return tb_conv2d(x, w, b, st, pd, NULL, groups);
}

static tb_tensor *conv(model *m, tb_tensor *x, const char *c, int64_t stride, int64_t pad) {
    const int64_t st[2] = {stride, stride}, pd[2] = {pad, pad};
    return tb_conv2d(x, weight(m, "%s.weight", c), weight(m, "%s.bias", c), st, pd, NULL, 1);
}

/* Global average pooling to [N, C]. */
static tb_tensor *pool_flat(tb_tensor *x) {
    const int64_t one[2] = {1, 1};
    tb_tensor *p = tb_adaptive_avg_pool2d(x, one);
    int64_t dims[2] = {p != NULL ? tb_tensor_shape(p).dims[0] : 1, -1};
    return tb_reshape(p, dims, 2);
}

static tb_tensor *head(model *m, tb_tensor *x, const char *fc) {
    return tb_linear(pool_flat(x), weight(m, "%s.weight", fc), weight(m, "%s.bias", fc));
}

/* ---- ResNet (BasicBlock for 18 and 34, Bottleneck for 50 and deeper) ---- */

static tb_tensor *resnet_block(model *m, tb_tensor *x, int layer, int block, bool bottleneck) {
    char p[64], a[96], b[96];
    int64_t stride = layer > 1 && block == 0 ? 2 : 1;
    tb_tensor *y, *skip = x;
    snprintf(p, sizeof p, "layer%d.%d", layer, block);
    snprintf(a, sizeof a, "%s.conv1", p);
    snprintf(b, sizeof b, "%s.bn1", p);
    if (bottleneck) {
        y = tb_relu(conv_bn(m, x, a, b, 1, 0, 1));
        snprintf(a, sizeof a, "%s.conv2", p);
        snprintf(b, sizeof b, "%s.bn2", p);
        y = tb_relu(conv_bn(m, y, a, b, stride, 1, 1));
        snprintf(a, sizeof a, "%s.conv3", p);
        snprintf(b, sizeof b, "%s.bn3", p);
        y = conv_bn(m, y, a, b, 1, 0, 1);
    } else {
        y = tb_relu(conv_bn(m, x, a, b, stride, 1, 1));
        snprintf(a, sizeof a, "%s.conv2", p);
        snprintf(b, sizeof b, "%s.bn2", p);
        y = conv_bn(m, y, a, b, 1, 1, 1);
    }
    if (has(m, "%s.downsample.0.weight", p)) {
        snprintf(a, sizeof a, "%s.downsample.0", p);
        snprintf(b, sizeof b, "%s.downsample.1", p);
        skip = conv_bn(m, x, a, b, stride, 0, 1);
    }
    return tb_relu(tb_add(y, skip));
}

static tb_tensor *resnet(model *m, tb_tensor *x) {
    const int64_t k[2] = {3, 3}, s[2] = {2, 2}, pd[2] = {1, 1};
    bool bottleneck = has(m, "layer1.0.conv3.weight");
    int layer, block;
    x = tb_relu(conv_bn(m, x, "conv1", "bn1", 2, 3, 1));
    x = tb_max_pool2d(x, k, s, pd, NULL, false);
    for (layer = 1; layer <= 4; layer++)
        for (block = 0; has(m, "layer%d.%d.conv1.weight", layer, block); block++)
            x = resnet_block(m, x, layer, block, bottleneck);
    return head(m, x, "fc");
}

/* ---- MobileNetV2 ---- */

static tb_tensor *mobilenet_v2(model *m, tb_tensor *x) {
    /* the stride of features.1 .. features.17 (torchvision's inverted residual settings) */
    static const int stride[18] = {0, 1, 2, 1, 2, 1, 1, 2, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1};
    char a[96], b[96];
    int i;
    x = tb_relu6(conv_bn(m, x, "features.0.0", "features.0.1", 2, 1, 1));
    for (i = 1; i <= 17; i++) {
        bool expand = has(m, "features.%d.conv.3.weight", i);
        int dw = expand ? 1 : 0; /* the depthwise conv's index in conv */
        tb_tensor *y = x, *w;
        int64_t hidden;
        if (expand) {
            snprintf(a, sizeof a, "features.%d.conv.0.0", i);
            snprintf(b, sizeof b, "features.%d.conv.0.1", i);
            y = tb_relu6(conv_bn(m, y, a, b, 1, 0, 1));
        }
        snprintf(a, sizeof a, "features.%d.conv.%d.0", i, dw);
        snprintf(b, sizeof b, "features.%d.conv.%d.1", i, dw);
        w = weight(m, "%s.weight", a);
        hidden = w != NULL ? tb_tensor_shape(w).dims[0] : 1;
        y = tb_relu6(conv_bn(m, y, a, b, stride[i], 1, hidden));
        snprintf(a, sizeof a, "features.%d.conv.%d", i, dw + 1);
        snprintf(b, sizeof b, "features.%d.conv.%d", i, dw + 2);
        y = conv_bn(m, y, a, b, 1, 0, 1);
        if (stride[i] == 1 && y != NULL && x != NULL &&
            tb_tensor_shape(y).dims[1] == tb_tensor_shape(x).dims[1])
            y = tb_add(x, y);
        x = y;
    }
    x = tb_relu6(conv_bn(m, x, "features.18.0", "features.18.1", 1, 0, 1));
    return head(m, x, "classifier.1");
}

/* ---- SqueezeNet 1.0 ---- */

static tb_tensor *fire(model *m, tb_tensor *x, int i) {
    char a[64];
    tb_tensor *parts[2];
    snprintf(a, sizeof a, "features.%d.squeeze", i);
    x = tb_relu(conv(m, x, a, 1, 0));
    snprintf(a, sizeof a, "features.%d.expand1x1", i);
    parts[0] = tb_relu(conv(m, x, a, 1, 0));
    snprintf(a, sizeof a, "features.%d.expand3x3", i);
    parts[1] = tb_relu(conv(m, x, a, 1, 1));
    return tb_concat(parts, 2, 1);
}

static tb_tensor *squeezenet(model *m, tb_tensor *x) {
    const int64_t k[2] = {3, 3}, s[2] = {2, 2};
    int i;
    x = tb_relu(conv(m, x, "features.0", 2, 0));
    for (i = 2; i <= 12; i++)
        x = i == 2 || i == 6 || i == 11 ? tb_max_pool2d(x, k, s, NULL, NULL, true) : fire(m, x, i);
    return pool_flat(tb_relu(conv(m, x, "classifier.1", 1, 0)));
}

/* ---- TransformerEncoder (post-norm, ReLU, batch first) ---- */

static tb_tensor *encoder_layer(model *m, tb_tensor *x, int l, int64_t heads) {
    tb_shape s = tb_tensor_shape(x);
    int64_t bsz = s.dims[0], len = s.dims[1], d = s.dims[2], hd[4], back[3];
    const int32_t perm[4] = {0, 2, 1, 3};
    tb_tensor *qkv, *q, *k, *v, *a;
    hd[0] = bsz, hd[1] = len, hd[2] = heads, hd[3] = d / heads;
    back[0] = bsz, back[1] = len, back[2] = d;
    qkv = tb_linear(x, weight(m, "layers.%d.self_attn.in_proj_weight", l),
                    weight(m, "layers.%d.self_attn.in_proj_bias", l));
    q = tb_permute(tb_reshape(tb_slice(qkv, 2, 0, d, 1), hd, 4), perm, 4);
    k = tb_permute(tb_reshape(tb_slice(qkv, 2, d, 2 * d, 1), hd, 4), perm, 4);
    v = tb_permute(tb_reshape(tb_slice(qkv, 2, 2 * d, 3 * d, 1), hd, 4), perm, 4);
    a = tb_scaled_dot_product_attention(q, k, v, NULL, 0.0, false, 0.0);
    a = tb_reshape(tb_permute(a, perm, 4), back, 3);
    a = tb_linear(a, weight(m, "layers.%d.self_attn.out_proj.weight", l),
                  weight(m, "layers.%d.self_attn.out_proj.bias", l));
    x = tb_layer_norm(tb_add(x, a), 1, weight(m, "layers.%d.norm1.weight", l),
                      weight(m, "layers.%d.norm1.bias", l), 1e-5);
    a = tb_relu(tb_linear(x, weight(m, "layers.%d.linear1.weight", l),
                          weight(m, "layers.%d.linear1.bias", l)));
    a = tb_linear(a, weight(m, "layers.%d.linear2.weight", l),
                  weight(m, "layers.%d.linear2.bias", l));
    return tb_layer_norm(tb_add(x, a), 1, weight(m, "layers.%d.norm2.weight", l),
                         weight(m, "layers.%d.norm2.bias", l), 1e-5);
}

static tb_tensor *encoder(model *m, tb_tensor *x) {
    int l;
    for (l = 0; has(m, "layers.%d.norm1.weight", l); l++)
        x = encoder_layer(m, x, l, 4);
    return x;
}

static tb_tensor *forward(model *m, tb_tensor *x) {
    if (strncmp(m->kind, "resnet", 6) == 0) return resnet(m, x);
    if (strcmp(m->kind, "mobilenet_v2") == 0) return mobilenet_v2(m, x);
    if (strcmp(m->kind, "squeezenet1_0") == 0) return squeezenet(m, x);
    if (strcmp(m->kind, "encoder") == 0) return encoder(m, x);
    tb_set_error(TB_ERR_INVALID_ARGUMENT, "models: unknown model kind");
    return NULL;
}

/* The input as a caller with new data each time has it: in host memory. */
typedef struct host_input {
    void *data; /* 64-byte aligned, so that a device that keeps host memory borrows it */
    tb_shape shape;
    tb_device device;
} host_input;

/* One forward, timed: the input taken from host memory (borrowed in place where the device
   keeps host memory, else copied to it), the graph recorded and run, its output's values read
   back into out (n floats). Returns the seconds. */
static double run_once(model *m, const host_input *in, float *out, size_t n, tb_status *st) {
    double t0 = now_s();
    tb_tensor *y;
    *st = tb_scope_begin();
    if (*st != TB_OK) return 0;
    y = forward(m, tb_tensor_from_host_borrowed(in->data, &in->shape, &in->device));
    *st = y == NULL || m->failed ? (tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_NOT_FOUND)
                                 : tb_tensor_to_host(y, out, n * sizeof(float));
    tb_scope_end();
    return now_s() - t0;
}

/* Records a forward pass once to fold every batch norm, and computes the folded weights in one
   graph of their own. */
static tb_status prepare(model *m, tb_tensor *x) {
    size_t i, n;
    tb_tensor **all;
    tb_status st = tb_scope_begin();
    if (st != TB_OK) return st;
    if (forward(m, x) == NULL || m->failed) {
        st = tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_NOT_FOUND;
        tb_scope_end();
        return st;
    }
    n = tb_tensor_set_count(m->folded);
    all = (tb_tensor **)malloc((n + 1) * sizeof(tb_tensor *));
    if (all == NULL) {
        tb_scope_end();
        return tb_set_error(TB_ERR_OUT_OF_MEMORY, "models: no memory");
    }
    for (i = 0; i < n; i++)
        all[i] = tb_tensor_set_tensor(m->folded, i);
    st = n > 0 ? tb_sync(all, n) : TB_OK;
    free(all);
    tb_scope_end();
    return st;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static tb_status default_device(tb_device *dev) {
    if (tb_device_parse("opencl:0", dev) == TB_OK) return TB_OK;
    if (tb_device_parse("native:0", dev) == TB_OK) return TB_OK;
    return tb_device_parse("cpu:0", dev);
}

/* One line on stdout while a first compile takes more than a second (tb_desc.progress): what
   is compiling once a second has passed, and how long it took. */
static void show_compile(const tb_progress *p, void *user_data) {
    int *shown = (int *)user_data; /* 1: the start of the line is out */
    if (p->stage == TB_PROGRESS_BEGIN) *shown = 0;
    if (p->stage == TB_PROGRESS_BEGIN || p->seconds < 1.0) return;
    if (*shown == 0 && p->stage == TB_PROGRESS_KERNELS && p->kernels_done < p->kernels_total) {
        printf("compiling %lu kernels for %s ...", (unsigned long)p->kernels_total, p->device);
        fflush(stdout);
        *shown = 1;
    } else if (p->stage == TB_PROGRESS_END) {
        if (*shown == 0)
            printf("compiled %lu kernels for %s", (unsigned long)p->kernels_total, p->device);
        printf(" in %.1f s%s\n", p->seconds, p->from_disk ? " (from the disk cache)" : "");
        *shown = 0;
    }
}

/* The distinct kernels of the graphs first compiled so far (what the summary line reports):
   what their compiles built, unless a cache had them. */
static size_t kernels_compiled;

static void count_compile(const tb_progress *p, void *user_data) {
    if (p->stage == TB_PROGRESS_END) kernels_compiled += p->kernels_total;
    show_compile(p, user_data);
}

/* The library set up to show (and count) first compiles. */
static tb_status setup_with_progress(void) {
    static int shown;
    tb_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.progress.func = count_compile;
    desc.progress.user_data = &shown;
    return tb_setup(&desc);
}

/* The kernels the device's backend has launched so far (its KernelLaunch metric; 0 where it
   has none). */
static unsigned long long kernel_launches(const tb_device *dev) {
    char *report = tb_backend_metrics_report(dev->backend), *at;
    unsigned long long total = 0;
    for (at = report; at != NULL && (at = strstr(at, "::KernelLaunch: ")) != NULL; at++)
        total += strtoull(at + strlen("::KernelLaunch: "), NULL, 10);
    tb_free(report);
    tb_clear_error();
    return total;
}

int main(int argc, char **argv) {
    const char *path = NULL, *device = NULL;
    int reps = 5, i;
    double tol = 1e-5, first, *times, worst = 0, scale = 0, fold_s;
    size_t compiled;
    unsigned long long launched = 0, in_graph;
    tb_device dev;
    model m;
    tb_tensor *x, *want;
    host_input in;
    size_t n, j;
    float *out, *ref;
    tb_status st;
    const char *torch_ms;
    char devname[64];
    if (setup_with_progress() != TB_OK) {
        fprintf(stderr, "models: %s\n", tb_last_error());
        return 1;
    }
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = argv[++i];
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--tolerance") == 0 && i + 1 < argc)
            tol = atof(argv[++i]);
        else if (argv[i][0] != '-' && path == NULL)
            path = argv[i];
        else {
            fprintf(stderr, "usage: models FILE [--device D] [--reps N] [--tolerance T]\n");
            return 1;
        }
    }
    if (path == NULL || reps < 1) {
        fprintf(stderr, "usage: models FILE [--device D] [--reps N] [--tolerance T]\n");
        return 1;
    }
    if ((device != NULL ? tb_device_parse(device, &dev) : default_device(&dev)) != TB_OK) {
        fprintf(stderr, "models: %s\n", tb_last_error());
        return 1;
    }
    memset(&m, 0, sizeof m);
    m.weights = tb_safetensors_load(path, &dev);
    m.folded = tb_tensor_set_new();
    if (m.weights == NULL || m.folded == NULL) {
        fprintf(stderr, "models: %s\n", tb_last_error());
        return 1;
    }
    m.kind = tb_tensor_set_metadata(m.weights, "model");
    x = tb_tensor_set_get(m.weights, "input");
    want = tb_tensor_set_get(m.weights, "output");
    if (m.kind == NULL || x == NULL || want == NULL) {
        fprintf(stderr, "models: %s is not a file of tools/export_model.py: %s\n", path,
                tb_last_error());
        return 1;
    }
    {
        tb_shape ws = tb_tensor_shape(want);
        int64_t count = 1;
        int32_t d;
        for (d = 0; d < ws.rank; d++)
            count *= ws.dims[d];
        n = (size_t)count;
    }
    in.shape = tb_tensor_shape(x);
    in.device = dev;
    in.data = NULL;
    if (tb_shape_nbytes(&in.shape, &j) != TB_OK) {
        fprintf(stderr, "models: the input: %s\n", tb_last_error());
        return 1;
    }
    if (posix_memalign(&in.data, 64, j) != 0) {
        fprintf(stderr, "models: no memory for the input\n");
        return 1;
    }
    if (tb_tensor_to_host(x, in.data, j) != TB_OK) {
        fprintf(stderr, "models: the input: %s\n", tb_last_error());
        free(in.data);
        return 1;
    }
    out = (float *)malloc(n * sizeof(float));
    ref = (float *)malloc(n * sizeof(float));
    times = (double *)malloc((size_t)reps * sizeof(double));
    if (out == NULL || ref == NULL || times == NULL ||
        tb_tensor_to_host(want, ref, n * sizeof(float)) != TB_OK) {
        fprintf(stderr, "models: no memory for the output\n");
        return 1;
    }
    fold_s = now_s();
    st = prepare(&m, x);
    fold_s = now_s() - fold_s;
    compiled = kernels_compiled;
    in_graph = kernel_launches(&dev);
    first = st == TB_OK ? run_once(&m, &in, out, n, &st) : 0.0;
    if (st != TB_OK) { /* before another call replaces the error */
        fprintf(stderr, "models: %s: %s\n", m.kind, tb_last_error());
        return 1;
    }
    compiled = kernels_compiled - compiled;      /* the forward's own */
    in_graph = kernel_launches(&dev) - in_graph; /* a first run launches every kernel */
    for (i = 0; st == TB_OK && i < reps; i++) {
        unsigned long long before = kernel_launches(&dev);
        times[i] = run_once(&m, &in, out, n, &st);
        if (st != TB_OK) break;
        launched = kernel_launches(&dev) - before;
    }
    if (st != TB_OK) {
        fprintf(stderr, "models: %s: %s\n", m.kind, tb_last_error());
        return 1;
    }
    qsort(times, (size_t)reps, sizeof(double), cmp_double);
    for (j = 0; j < n; j++) {
        double e = fabs((double)out[j] - (double)ref[j]);
        if (fabs((double)ref[j]) > scale) scale = fabs((double)ref[j]);
        if (!(e <= worst)) worst = e; /* NaN stays */
    }
    worst = scale > 0 ? worst / scale : worst;
    tb_device_format(&dev, devname, sizeof devname);
    torch_ms = tb_tensor_set_metadata(m.weights, "torch_ms");
    tb_clear_error();
    printf("%s on %s: first forward %.3f s, cached forward %.2f ms (median of %d)", m.kind, devname,
           first, times[reps / 2] * 1e3, reps);
    if (torch_ms != NULL)
        printf(", PyTorch %s ms (PyTorch / ours %.2f)", torch_ms,
               atof(torch_ms) / (times[reps / 2] * 1e3));
    printf("; error / output scale %.2g\n", worst);
    printf("%s on %s: weights folded in %.3f s; the forward: %llu kernels, %zu distinct, %llu "
           "launched when cached\n",
           m.kind, devname, fold_s, in_graph, compiled, launched);
    free(times);
    free(in.data);
    free(ref);
    free(out);
    tb_tensor_set_free(m.folded);
    tb_tensor_set_free(m.weights);
    tb_shutdown();
    if (!(worst <= tol)) {
        fprintf(stderr, "models: %s differs from PyTorch by %.3g of the output's scale (> %g)\n",
                m.kind, worst, tol);
        return 1;
    }
    return 0;
}
