// Build: cc -std=c99 -O2 -I. examples/train_mnist.c -o train_mnist -ldl -lpthread -lm
//    or: c++ -x c++ -std=c++11 -O2 -I. examples/train_mnist.c -o train_mnist -ldl -lpthread -lm
//        (both from the repository root)
// Run:   ./train_mnist [EPOCHS] [--device D] [--data DIR] [--images N] [--test-images N]
//                      [--dtype f32|bf16|f16]
//        (Debian: apt-get install dataset-fashion-mnist)
//        mpirun -np 2 ./train_mnist [EPOCHS] --group mpi [...]   (data-parallel)
//        ./train_mnist [EPOCHS] --devices opencl:0,opencl:1 [...]  (data-parallel, one process)
/* Trains a multilayer perceptron, 784 -> 512 -> 256 -> 10 with ReLU, on Fashion-MNIST: AdamW
   (lr 1e-3, times 0.6 after every epoch: a schedule, which never recompiles), cross-entropy,
   minibatches of 128 shuffled every epoch. The dataset's four
   gzip'd IDX files are read from DIR (default /usr/share/datasets/fashion-mnist, where Debian's
   dataset-fashion-mnist package puts them) with tb_idx_load.

   Each step records the forward pass, asks tb_grad for the gradients and lets
   tb_optimizer_step run forward, backward and the update as one graph, which compiles at the
   first step and is a cache hit at every later one. The loss and the count of right answers
   come back from the same graph. One line per epoch gives the mean loss, the training and test
   accuracy, images per second and the epoch's time.

   EPOCHS defaults to 1; the device to opencl:0 when there is one, else native:0
   (a C compiler on PATH), else cpu:0. --images and
   --test-images train and test on the first N images only (a quick run). --dtype bf16 (or f16)
   trains in mixed precision: the weights stay f32 (the optimizer updates them there), and each
   step's forward pass runs on bf16 casts of them and of the images, its matmuls accumulating in
   f32; the logits go back to f32 for the loss, and the gradients flow back through the casts
   to f32. Exit status 1 on any error.

   --group mpi trains data-parallel over the ranks of the process group (start it with
   `mpirun -np N`): every rank shuffles alike, takes its share of each batch of 128, and one
   all-reduce (sum) of all the gradients, the loss and the count of right answers gives every
   rank the whole batch's gradient, so the weights stay the same on every rank and follow the
   one-process run. The all-reduce is recorded like any op: forward, backward, the all-reduce
   and the update run in the optimizer step's one sync (the graphs below and above the
   all-reduce each compile once). Rank 0 prints.

   --devices D1,D2,... trains data-parallel over devices of this process with sharded tensors:
   the weights replicated on every device (TB_REPLICATE, one optimizer over all the replicas),
   each batch split by rows (TB_SHARD), each device's loss its rows' share (TB_PARTIAL), and
   tb_sharded_grad's one all-reduce of the gradients, the loss and the count of right answers
   across the devices. The replicas take the same updates, so they stay equal; the test set is
   evaluated on the first device. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH       128
#define PIXELS      784
#define H1          512
#define H2          256
#define CLASSES     10
#define NPARAMS     6
#define MAX_DEVICES 8

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(const char *what) {
    fprintf(stderr, "train_mnist: %s: %s\n", what, tb_last_error());
    return 1;
}

/* The images of an IDX file as floats normalised with the training set's mean and standard
   deviation, and its labels as i64 (host arrays; NULL after printing why). */
typedef struct dataset {
    float *x;
    int64_t *y;
    int64_t n;
} dataset;

static int load_set(const char *dir, const char *prefix, int64_t limit, dataset *out) {
    char path[1024];
    tb_device cpu;
    tb_tensor *img, *lab;
    tb_shape is, ls;
    unsigned char *pix, *lbl;
    int64_t i, j, n;
    memset(out, 0, sizeof *out);
    if (tb_device_make("cpu", 0, &cpu) != TB_OK) return fail("cpu device");
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    img = tb_idx_load(path, &cpu);
    if (img == NULL) return fail("images");
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    lab = tb_idx_load(path, &cpu);
    if (lab == NULL) {
        tb_tensor_release(img);
        return fail("labels");
    }
    is = tb_tensor_shape(img);
    ls = tb_tensor_shape(lab);
    if (is.rank != 3 || is.dims[1] * is.dims[2] != PIXELS || ls.rank != 1 ||
        ls.dims[0] != is.dims[0] || is.dtype != TB_U8 || ls.dtype != TB_U8) {
        fprintf(stderr, "train_mnist: %s: not 28x28 u8 images with u8 labels\n", prefix);
        tb_tensor_release(img);
        tb_tensor_release(lab);
        return 1;
    }
    n = is.dims[0] < limit ? is.dims[0] : limit;
    pix = (unsigned char *)malloc((size_t)is.dims[0] * PIXELS);
    lbl = (unsigned char *)malloc((size_t)ls.dims[0]);
    out->x = (float *)malloc((size_t)n * PIXELS * sizeof(float));
    out->y = (int64_t *)malloc((size_t)n * sizeof(int64_t));
    if (pix == NULL || lbl == NULL || out->x == NULL || out->y == NULL ||
        tb_tensor_to_host(img, pix, (size_t)is.dims[0] * PIXELS) != TB_OK ||
        tb_tensor_to_host(lab, lbl, (size_t)ls.dims[0]) != TB_OK) {
        free(pix);
        free(lbl);
        tb_tensor_release(img);
        tb_tensor_release(lab);
        return fail("reading the dataset");
    }
    for (i = 0; i < n; i++) {
        for (j = 0; j < PIXELS; j++) /* Fashion-MNIST's mean 0.2860 and std 0.3530 */
            out->x[i * PIXELS + j] = ((float)pix[i * PIXELS + j] / 255.0f - 0.2860f) / 0.3530f;
        out->y[i] = lbl[i];
    }
    out->n = n;
    free(pix);
    free(lbl);
    tb_tensor_release(img);
    tb_tensor_release(lab);
    return 0;
}

/* PyTorch's nn.Linear initialisation: weight and bias uniform in +-1/sqrt(fan_in). */
static tb_tensor *uniform(int64_t rows, int64_t cols, int64_t fan_in, const tb_device *dev,
                          tb_process_group *group) {
    tb_shape s =
        cols > 0 ? tb_shape_of(TB_F32, 2, (int)rows, (int)cols) : tb_shape_of(TB_F32, 1, (int)rows);
    double bound = 1.0 / sqrt((double)fan_in);
    tb_tensor *u = tb_rand(&s, dev), *a = tb_mul_scalar(u, 2.0 * bound);
    tb_tensor *w = tb_sub_scalar(a, bound);
    tb_tensor_release(u);
    tb_tensor_release(a);
    if (group != NULL) { /* rank 0's weights everywhere */
        u = w;
        w = tb_broadcast(group, u, 0);
        tb_tensor_release(u);
    }
    if (w != NULL && (tb_sync(&w, 1) != TB_OK || tb_set_requires_grad(w, true) != TB_OK)) {
        tb_tensor_release(w);
        w = NULL;
    }
    return w;
}

static tb_dtype g_compute = TB_F32; /* --dtype: the forward pass's (the weights stay f32) */

/* f32 logits of the batch x [n, 784], computed in g_compute; the scope releases the
   intermediates as it ends */
static tb_tensor *forward(tb_tensor *const *p, tb_tensor *x) {
    tb_tensor *q[NPARAMS], *h, *k, *z;
    int i;
    if (tb_scope_begin() != TB_OK) return NULL;
    for (i = 0; i < NPARAMS; i++)
        q[i] = g_compute == TB_F32 ? p[i] : tb_cast(p[i], g_compute);
    if (g_compute != TB_F32) x = tb_cast(x, g_compute);
    h = tb_relu(tb_add(tb_matmul(x, q[0]), q[1]));
    k = tb_relu(tb_add(tb_matmul(h, q[2]), q[3]));
    z = tb_add(tb_matmul(k, q[4]), q[5]);
    z = tb_scope_keep(g_compute == TB_F32 ? z : tb_cast(z, TB_F32));
    tb_scope_end();
    return z;
}

/* how many rows of logits z pick the label y, as an f32 scalar */
static tb_tensor *correct(tb_tensor *z, tb_tensor *y) {
    tb_tensor *s;
    if (tb_scope_begin() != TB_OK) return NULL;
    s = tb_scope_keep(tb_sum(tb_cast(tb_eq(tb_argmax(z, 1, false), y), TB_F32), NULL, 0, false));
    tb_scope_end();
    return s;
}

static tb_tensor *batch_x(const float *x, int64_t rows, const tb_device *dev) {
    tb_shape s = tb_shape_of(TB_F32, 2, (int)rows, PIXELS);
    return tb_tensor_from_host(x, &s, dev);
}

static tb_tensor *batch_y(const int64_t *y, int64_t rows, const tb_device *dev) {
    tb_shape s = tb_shape_of(TB_I64, 1, (int)rows);
    return tb_tensor_from_host(y, &s, dev);
}

/* Test accuracy in batches of up to 1000 (no gradients: nothing requires grad downstream of
   the detached parameters). */
static int evaluate(tb_tensor *const *params, const dataset *test, const tb_device *dev,
                    double *acc) {
    double right = 0;
    int64_t at;
    for (at = 0; at < test->n; at += 1000) {
        int64_t rows = test->n - at < 1000 ? test->n - at : 1000;
        tb_tensor *x = batch_x(test->x + at * PIXELS, rows, dev);
        tb_tensor *y = batch_y(test->y + at, rows, dev);
        tb_tensor *z = forward(params, x), *c = correct(z, y);
        float v = 0;
        tb_status st = c != NULL ? tb_tensor_to_host(c, &v, sizeof v) : tb_last_status();
        tb_tensor_release(x);
        tb_tensor_release(y);
        tb_tensor_release(z);
        tb_tensor_release(c);
        if (st != TB_OK) return fail("evaluation");
        right += v;
    }
    *acc = test->n > 0 ? right / (double)test->n : 0.0;
    return 0;
}

/* One data-parallel step on this rank's rows of the batch. Its loss is the sum over its rows
   divided by the whole batch's size, so that the sum over the ranks of the gradients is the
   whole batch's mean gradient however the rows are split. One all-reduce carries every
   gradient, the loss and the count of right answers (one buffer, as DDP's buckets do); it is
   lazy, so the optimizer step's sync runs the whole step, the loss and count included. */
static int distributed_step(tb_process_group *group, tb_optimizer *opt, tb_tensor *const *params,
                            tb_tensor *x, tb_tensor *y, float *loss_hits) {
    tb_tensor *z = forward(params, x), *ce, *loss, *hits, *flat, *sum, *tail;
    tb_tensor *grads[NPARAMS] = {NULL}, *parts[NPARAMS + 2] = {NULL}, *reduced[NPARAMS] = {NULL};
    int64_t off = 0, n, one = 1;
    int k, rc = 0;
    ce = tb_cross_entropy(z, y, TB_REDUCTION_SUM, 0.0);
    loss = tb_div_scalar(ce, (double)BATCH);
    hits = correct(z, y);
    tb_tensor_release(ce);
    tb_tensor_release(z); /* see the single-process step: hold nothing that reads the weights */
    if (loss == NULL || hits == NULL || tb_grad(loss, NULL, params, NPARAMS, grads) != TB_OK)
        rc = fail("gradients");
    for (k = 0; rc == 0 && k < NPARAMS; k++) {
        tb_shape s = tb_tensor_shape(grads[k]);
        tb_shape_numel(&s, &n);
        parts[k] = tb_reshape(grads[k], &n, 1);
    }
    parts[NPARAMS] = tb_reshape(loss, &one, 1);
    parts[NPARAMS + 1] = tb_reshape(hits, &one, 1);
    flat = rc == 0 ? tb_concat(parts, NPARAMS + 2, 0) : NULL;
    for (k = 0; k < NPARAMS + 2; k++)
        tb_tensor_release(parts[k]);
    for (k = 0; k < NPARAMS; k++)
        tb_tensor_release(grads[k]);
    tb_tensor_release(loss);
    tb_tensor_release(hits);
    sum = tb_all_reduce(group, flat, TB_REDUCE_SUM);
    tb_tensor_release(flat);
    for (k = 0; k < NPARAMS; k++) {
        tb_shape s = tb_tensor_shape(params[k]);
        tb_tensor *part;
        tb_shape_numel(&s, &n);
        part = tb_slice(sum, 0, off, off + n, 1);
        reduced[k] = tb_reshape(part, s.dims, s.rank);
        tb_tensor_release(part);
        off += n;
    }
    tail = tb_slice(sum, 0, off, off + 2, 1);
    if (rc == 0 && (sum == NULL || tb_optimizer_step(opt, reduced, &tail, 1) != TB_OK ||
                    tb_tensor_to_host(tail, loss_hits, 2 * sizeof(float)) != TB_OK))
        rc = fail("distributed step");
    for (k = 0; k < NPARAMS; k++)
        tb_tensor_release(reduced[k]);
    tb_tensor_release(tail);
    tb_tensor_release(sum);
    return rc;
}

/* --devices: one device's share of the step (its rows of the batch, its weight replicas); the
   count of right answers goes to hits[index] */
typedef struct shard_ctx {
    tb_tensor *hits[MAX_DEVICES];
} shard_ctx;

static tb_tensor *shard_loss(void *user, tb_tensor *const *in, size_t index) {
    shard_ctx *c = (shard_ctx *)user;
    tb_tensor *z = forward(in + 2, in[0]), *ce = tb_cross_entropy(z, in[1], TB_REDUCTION_SUM, 0.0);
    tb_tensor *loss = tb_div_scalar(ce, (double)BATCH); /* its rows' share of the batch mean */
    c->hits[index] = correct(z, in[1]);
    tb_tensor_release(ce);
    tb_tensor_release(z);
    return loss;
}

/* One data-parallel step over the devices of this process: params are the replicated weights,
   opt updates every replica (device d's weights are its parameters d * NPARAMS ...). */
static int sharded_step(tb_sharded *const *params, tb_optimizer *opt, const tb_device *devs, int nd,
                        const float *x, const int64_t *y, float *loss_hits) {
    tb_tensor *xs[MAX_DEVICES] = {NULL}, *ys[MAX_DEVICES] = {NULL}, *g[NPARAMS * MAX_DEVICES];
    tb_sharded *in[2 + NPARAMS] = {NULL}, *loss = NULL, *hits = NULL, *also[2],
                       *grads[NPARAMS] = {NULL}, *sums[2] = {NULL, NULL};
    shard_ctx ctx;
    int d, k, rc = 0;
    memset(&ctx, 0, sizeof ctx);
    for (d = 0; d < nd; d++) { /* device d's rows [lo, hi), straight from the host */
        int64_t lo = (int64_t)BATCH * d / nd, hi = (int64_t)BATCH * (d + 1) / nd;
        xs[d] = batch_x(x + lo * PIXELS, hi - lo, &devs[d]);
        ys[d] = batch_y(y + lo, hi - lo, &devs[d]);
    }
    in[0] = tb_sharded_from_tensors(xs, (size_t)nd, TB_SHARD, 0);
    in[1] = tb_sharded_from_tensors(ys, (size_t)nd, TB_SHARD, 0);
    for (k = 0; k < NPARAMS; k++)
        in[2 + k] = params[k];
    if (in[0] != NULL && in[1] != NULL)
        loss = tb_sharded_map(in, 2 + NPARAMS, shard_loss, &ctx, TB_PARTIAL, 0);
    if (loss != NULL) hits = tb_sharded_from_tensors(ctx.hits, (size_t)nd, TB_PARTIAL, 0);
    also[0] = loss;
    also[1] = hits;
    if (hits == NULL || tb_sharded_grad(loss, params, NPARAMS, grads, also, 2, sums) != TB_OK)
        rc = fail("gradients");
    /* the step reads nothing of the forward pass but the gradients: let it go first */
    tb_sharded_release(loss);
    tb_sharded_release(hits);
    for (d = 0; rc == 0 && d < nd; d++)
        for (k = 0; k < NPARAMS; k++)
            g[d * NPARAMS + k] = tb_sharded_shard(grads[k], (size_t)d);
    if (rc == 0 &&
        (tb_optimizer_step(opt, g, NULL, 0) != TB_OK ||
         tb_tensor_to_host(tb_sharded_shard(sums[0], 0), &loss_hits[0], sizeof(float)) != TB_OK ||
         tb_tensor_to_host(tb_sharded_shard(sums[1], 0), &loss_hits[1], sizeof(float)) != TB_OK))
        rc = fail("sharded step");
    for (k = 0; k < NPARAMS; k++)
        tb_sharded_release(grads[k]);
    for (d = 0; d < nd; d++) {
        tb_tensor_release(xs[d]);
        tb_tensor_release(ys[d]);
        tb_tensor_release(ctx.hits[d]);
    }
    tb_sharded_release(sums[0]);
    tb_sharded_release(sums[1]);
    tb_sharded_release(in[0]);
    tb_sharded_release(in[1]);
    return rc;
}

/* "opencl:0,opencl:1" into devs (at most MAX_DEVICES); the count, or 0 after printing why */
static int parse_devices(const char *list, tb_device *devs) {
    char one[64];
    int n = 0;
    while (*list != '\0') {
        size_t len = strcspn(list, ",");
        if (n == MAX_DEVICES || len == 0 || len >= sizeof one) {
            fprintf(stderr, "train_mnist: --devices: 1 to %d names, comma-separated\n",
                    MAX_DEVICES);
            return 0;
        }
        memcpy(one, list, len);
        one[len] = '\0';
        if (tb_device_parse(one, &devs[n]) != TB_OK) {
            fail("--devices");
            return 0;
        }
        n++;
        list += len;
        if (*list == ',') list++;
    }
    return n;
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_random(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
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

/* The library set up to show first compiles. */
static tb_status setup_with_progress(void) {
    static int shown;
    tb_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.progress.func = show_compile;
    desc.progress.user_data = &shown;
    return tb_setup(&desc);
}

int main(int argc, char **argv) {
    const char *dir = "/usr/share/datasets/fashion-mnist", *device = NULL, *group_name = NULL,
               *device_list = NULL;
    tb_process_group *group = NULL;
    int rank = 0, ranks = 1;
    int epochs = 1, e, i, rc = 1;
    int64_t limit = INT64_MAX, test_limit = INT64_MAX, *order = NULL, step;
    dataset train, test;
    tb_device dev, devs[MAX_DEVICES];
    int nd = 0; /* --devices: how many */
    tb_tensor *params[NPARAMS] = {NULL, NULL, NULL, NULL, NULL, NULL}, *all[NPARAMS * MAX_DEVICES];
    tb_sharded *sp[NPARAMS] = {NULL, NULL, NULL, NULL, NULL, NULL};
    tb_optimizer *opt = NULL;
    tb_optimizer_desc desc = tb_adamw_desc(1e-3);
    float *bx = NULL;
    int64_t *by = NULL;
    char name[64];
    if (setup_with_progress() != TB_OK) {
        fprintf(stderr, "train_mnist: %s\n", tb_last_error());
        return 1;
    }
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = argv[++i];
        else if (strcmp(argv[i], "--data") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "--images") == 0 && i + 1 < argc)
            limit = atoll(argv[++i]);
        else if (strcmp(argv[i], "--test-images") == 0 && i + 1 < argc)
            test_limit = atoll(argv[++i]);
        else if (strcmp(argv[i], "--group") == 0 && i + 1 < argc)
            group_name = argv[++i];
        else if (strcmp(argv[i], "--devices") == 0 && i + 1 < argc)
            device_list = argv[++i];
        else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc &&
                 tb_dtype_parse(argv[i + 1], &g_compute) == TB_OK &&
                 (g_compute == TB_F32 || g_compute == TB_BF16 || g_compute == TB_F16))
            i++;
        else if (argv[i][0] != '-' && atoi(argv[i]) > 0)
            epochs = atoi(argv[i]);
        else {
            fprintf(
                stderr,
                "usage: %s [EPOCHS] [--device D] [--data DIR] [--images N] "
                "[--test-images N] [--group mpi | --devices D1,D2,...] [--dtype f32|bf16|f16]\n",
                argv[0]);
            return 2;
        }
    }
    if (device_list != NULL) {
        nd = parse_devices(device_list, devs);
        if (nd == 0 || group_name != NULL) {
            if (nd > 0) fprintf(stderr, "train_mnist: --devices or --group, not both\n");
            return 2;
        }
        dev = devs[0];
    } else if (device != NULL ? tb_device_parse(device, &dev) != TB_OK
                              : (tb_device_make("opencl", 0, &dev) != TB_OK &&
                                 tb_device_make("native", 0, &dev) != TB_OK &&
                                 tb_device_make("cpu", 0, &dev) != TB_OK))
        return fail("device");
    tb_clear_error();
    if (group_name != NULL) {
        group = tb_process_group_get(group_name);
        if (group == NULL) {
            fail("process group");
            tb_shutdown();
            return 1;
        }
        rank = tb_process_group_rank(group);
        ranks = tb_process_group_size(group);
    }
    memset(&train, 0, sizeof train);
    memset(&test, 0, sizeof test);
    if (load_set(dir, "train", limit, &train) != 0 || load_set(dir, "t10k", test_limit, &test) != 0)
        goto done;
    tb_device_format(&dev, name, sizeof name);
    if (rank == 0)
        printf("Fashion-MNIST: %lld training and %lld test images; MLP 784-512-256-10, AdamW, "
               "batch %d, on %s%s (%d rank%s), forward in %s\n",
               (long long)train.n, (long long)test.n, BATCH, nd > 1 ? "devices " : "",
               nd > 1 ? device_list : name, ranks, ranks > 1 ? "s" : "", tb_dtype_name(g_compute));
    if (tb_manual_seed(0) != TB_OK) goto done;
    params[0] = uniform(PIXELS, H1, PIXELS, &dev, group);
    params[1] = uniform(H1, 0, PIXELS, &dev, group);
    params[2] = uniform(H1, H2, H1, &dev, group);
    params[3] = uniform(H2, 0, H1, &dev, group);
    params[4] = uniform(H2, CLASSES, H2, &dev, group);
    params[5] = uniform(CLASSES, 0, H2, &dev, group);
    for (i = 0; i < NPARAMS; i++)
        if (params[i] == NULL) {
            rc = fail("parameters");
            goto done;
        }
    if (nd > 1) { /* a replica of every weight on every device, one optimizer over them all */
        for (i = 0; i < NPARAMS; i++) {
            int d;
            sp[i] = tb_distribute(params[i], devs, (size_t)nd, TB_REPLICATE, 0);
            for (d = 0; sp[i] != NULL && d < nd; d++) {
                all[d * NPARAMS + i] = tb_sharded_shard(sp[i], (size_t)d);
                if (tb_set_requires_grad(all[d * NPARAMS + i], true) != TB_OK) {
                    rc = fail("replicas");
                    goto done;
                }
            }
            if (sp[i] == NULL) {
                rc = fail("replicas");
                goto done;
            }
        }
        opt = tb_optimizer_new(&desc, all, (size_t)(NPARAMS * nd));
    } else {
        opt = tb_optimizer_new(&desc, params, NPARAMS);
    }
    order = (int64_t *)malloc((size_t)(train.n > 0 ? train.n : 1) * sizeof(int64_t));
    bx = (float *)malloc((size_t)BATCH * PIXELS * sizeof(float));
    by = (int64_t *)malloc((size_t)BATCH * sizeof(int64_t));
    if (opt == NULL || order == NULL || bx == NULL || by == NULL) {
        rc = fail("setup");
        goto done;
    }
    for (step = 0; step < train.n; step++)
        order[step] = step;
    for (e = 1; e <= epochs; e++) {
        double t0 = now_s(), loss_sum = 0, right = 0, seconds, test_acc = 0;
        int64_t seen = 0, at, k;
        if (e > 1 && tb_optimizer_set_lr(opt, tb_optimizer_lr(opt) * 0.6) != TB_OK) {
            rc = fail("learning rate");
            goto done;
        }
        for (at = train.n - 1; at > 0; at--) { /* shuffle */
            int64_t j = (int64_t)(next_random() % (uint64_t)(at + 1)), t = order[at];
            order[at] = order[j];
            order[j] = t;
        }
        /* full batches only: every step has one shape, so one compiled graph */
        for (at = 0; at + BATCH <= train.n; at += BATCH) {
            tb_tensor *x, *y, *z, *loss, *hits, *also[2], *grads[NPARAMS];
            float lv = 0, hv = 0, lh[2] = {0, 0};
            if (nd > 1) { /* the whole batch, split over the devices */
                for (k = 0; k < BATCH; k++) {
                    memcpy(bx + k * PIXELS, train.x + order[at + k] * PIXELS,
                           PIXELS * sizeof(float));
                    by[k] = train.y[order[at + k]];
                }
                if (sharded_step(sp, opt, devs, nd, bx, by, lh) != 0) goto done;
                loss_sum += lh[0] * BATCH;
                right += lh[1];
                seen += BATCH;
                continue;
            }
            if (group != NULL) { /* this rank's rows [lo, hi) of the batch */
                int64_t lo = BATCH * rank / ranks, hi = BATCH * (rank + 1) / ranks;
                for (k = lo; k < hi; k++) {
                    memcpy(bx + (k - lo) * PIXELS, train.x + order[at + k] * PIXELS,
                           PIXELS * sizeof(float));
                    by[k - lo] = train.y[order[at + k]];
                }
                x = batch_x(bx, hi - lo, &dev);
                y = batch_y(by, hi - lo, &dev);
                k = distributed_step(group, opt, params, x, y, lh);
                tb_tensor_release(x);
                tb_tensor_release(y);
                if (k != 0) goto done;
                loss_sum += lh[0] * BATCH;
                right += lh[1];
                seen += BATCH;
                continue;
            }
            for (k = 0; k < BATCH; k++) {
                memcpy(bx + k * PIXELS, train.x + order[at + k] * PIXELS, PIXELS * sizeof(float));
                by[k] = train.y[order[at + k]];
            }
            x = batch_x(bx, BATCH, &dev);
            y = batch_y(by, BATCH, &dev);
            z = forward(params, x);
            loss = tb_cross_entropy(z, y, TB_REDUCTION_MEAN, 0.0);
            hits = correct(z, y);
            /* what the step reads is recorded: holding the logits would keep the old weights
               readable, and their buffers could not take the new weights in place */
            tb_tensor_release(z);
            z = NULL;
            also[0] = loss;
            also[1] = hits;
            if (loss == NULL || hits == NULL ||
                tb_grad(loss, NULL, params, NPARAMS, grads) != TB_OK ||
                tb_optimizer_step(opt, grads, also, 2) != TB_OK ||
                tb_tensor_to_host(loss, &lv, sizeof lv) != TB_OK ||
                tb_tensor_to_host(hits, &hv, sizeof hv) != TB_OK) {
                rc = fail("training step");
                goto done;
            }
            loss_sum += lv * BATCH;
            right += hv;
            seen += BATCH;
            for (k = 0; k < NPARAMS; k++)
                tb_tensor_release(grads[k]);
            tb_tensor_release(x);
            tb_tensor_release(y);
            tb_tensor_release(loss);
            tb_tensor_release(hits);
        }
        seconds = now_s() - t0;
        if (nd > 1) { /* the first device's replicas */
            tb_tensor *first[NPARAMS];
            for (i = 0; i < NPARAMS; i++)
                first[i] = tb_sharded_shard(sp[i], 0);
            if (evaluate(first, &test, &dev, &test_acc) != 0) goto done;
        } else if (evaluate(params, &test, &dev, &test_acc) != 0) {
            goto done;
        }
        if (rank == 0)
            printf(
                "epoch %d/%d  loss %.4f  train accuracy %.4f  test accuracy %.4f  %.0f images/s  "
                "%.2f s\n",
                e, epochs, seen > 0 ? loss_sum / (double)seen : 0.0,
                seen > 0 ? right / (double)seen : 0.0, test_acc, (double)seen / seconds, seconds);
        fflush(stdout);
    }
    if (rank == 0)
        printf("compiled graphs: %lld, cache hits: %lld\n",
               (long long)tb_metrics_counter("UncachedCompile"),
               (long long)tb_metrics_counter("CachedCompile"));
    rc = 0;
done:
    tb_optimizer_free(opt);
    for (i = 0; i < NPARAMS; i++) {
        tb_sharded_release(sp[i]);
        tb_tensor_release(params[i]);
    }
    free(order);
    free(bx);
    free(by);
    free(train.x);
    free(train.y);
    free(test.x);
    free(test.y);
    tb_shutdown();
    return rc;
}
