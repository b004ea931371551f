// Build: cc -std=c99 -O2 -I. examples/train_cnn.c -o train_cnn -ldl -lpthread -lm
//    or: c++ -x c++ -std=c++11 -O2 -I. examples/train_cnn.c -o train_cnn -ldl -lpthread -lm
//        (both from the repository root)
// Run:   ./train_cnn [EPOCHS] [--device D] [--data DIR] [--images N] [--test-images N]
//        (Debian: apt-get install dataset-fashion-mnist)
/* Trains the two-convolution network of Fashion-MNIST's benchmark table on Fashion-MNIST:
   conv 5x5, 32 channels (padding 2) -> ReLU -> max-pool 2 -> conv 5x5, 64 channels -> ReLU ->
   max-pool 2 -> dense 3136 -> 1024 -> ReLU -> dropout 0.4 -> dense 10. AdamW (lr 1e-3, times
   0.7 after every epoch: a schedule, which never recompiles), cross-entropy, minibatches of
   128 shuffled every epoch. The dataset's four
   gzip'd IDX files are read from DIR (default /usr/share/datasets/fashion-mnist, where Debian's
   dataset-fashion-mnist package puts them) with tb_idx_load.

   Each step records the forward pass, asks tb_grad for the gradients and lets
   tb_optimizer_step run forward, backward and the update as one graph, which compiles at the
   first step and is a cache hit at every later one. The loss and the count of right answers
   come back from the same graph. One line per epoch gives the mean loss, the training and test
   accuracy, images per second and the epoch's time.

   EPOCHS defaults to 1; the device to opencl:0 when there is one, else native:0
   (a C compiler on PATH), else cpu:0. --images and
   --test-images train and test on the first N images only (a quick run). Exit status 1 on any
   error. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH   128
#define PIXELS  784
#define C1      32
#define C2      64
#define FLAT    (C2 * 7 * 7)
#define HIDDEN  1024
#define CLASSES 10
#define NPARAMS 8

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(const char *what) {
    fprintf(stderr, "train_cnn: %s: %s\n", what, tb_last_error());
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
        fprintf(stderr, "train_cnn: %s: not 28x28 u8 images with u8 labels\n", prefix);
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

/* PyTorch's nn.Conv2d and nn.Linear initialisation: weight and bias uniform in
   +-1/sqrt(fan_in). */
static tb_tensor *uniform(tb_shape s, int64_t fan_in, const tb_device *dev) {
    double bound = 1.0 / sqrt((double)fan_in);
    tb_tensor *u = tb_rand(&s, dev), *a = tb_mul_scalar(u, 2.0 * bound);
    tb_tensor *w = tb_sub_scalar(a, bound);
    tb_tensor_release(u);
    tb_tensor_release(a);
    if (w != NULL && (tb_sync(&w, 1) != TB_OK || tb_set_requires_grad(w, true) != TB_OK)) {
        tb_tensor_release(w);
        w = NULL;
    }
    return w;
}

/* logits of the batch x [n, 1, 28, 28]; dropout only while training; the scope releases the
   intermediates as it ends */
static tb_tensor *forward(tb_tensor *const *p, tb_tensor *x, bool training) {
    const int64_t pad[2] = {2, 2}, pool[2] = {2, 2}, flat[2] = {-1, FLAT};
    tb_tensor *h, *z;
    if (tb_scope_begin() != TB_OK) return NULL;
    h = tb_relu(tb_conv2d(x, p[0], p[1], NULL, pad, NULL, 1));
    h = tb_max_pool2d(h, pool, NULL, NULL, NULL, false);
    h = tb_relu(tb_conv2d(h, p[2], p[3], NULL, pad, NULL, 1));
    h = tb_reshape(tb_max_pool2d(h, pool, NULL, NULL, NULL, false), flat, 2);
    h = tb_dropout(tb_relu(tb_add(tb_matmul(h, p[4]), p[5])), 0.4, training);
    z = tb_scope_keep(tb_add(tb_matmul(h, p[6]), p[7]));
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
    tb_shape s = tb_shape_of(TB_F32, 4, (int)rows, 1, 28, 28);
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
        tb_tensor *z = forward(params, x, false), *c = correct(z, y);
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
    const char *dir = "/usr/share/datasets/fashion-mnist", *device = NULL;
    int epochs = 1, e, i, rc = 1;
    int64_t limit = INT64_MAX, test_limit = INT64_MAX, *order = NULL, step;
    dataset train, test;
    tb_device dev;
    tb_tensor *params[NPARAMS] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    tb_optimizer *opt = NULL;
    tb_optimizer_desc desc = tb_adamw_desc(1e-3);
    float *bx = NULL;
    int64_t *by = NULL;
    char name[64];
    if (setup_with_progress() != TB_OK) {
        fprintf(stderr, "train_cnn: %s\n", tb_last_error());
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
        else if (argv[i][0] != '-' && atoi(argv[i]) > 0)
            epochs = atoi(argv[i]);
        else {
            fprintf(stderr,
                    "usage: %s [EPOCHS] [--device D] [--data DIR] [--images N] "
                    "[--test-images N]\n",
                    argv[0]);
            return 2;
        }
    }
    if (device != NULL ? tb_device_parse(device, &dev) != TB_OK
                       : (tb_device_make("opencl", 0, &dev) != TB_OK &&
                          tb_device_make("native", 0, &dev) != TB_OK &&
                          tb_device_make("cpu", 0, &dev) != TB_OK))
        return fail("device");
    tb_clear_error();
    memset(&train, 0, sizeof train);
    memset(&test, 0, sizeof test);
    if (load_set(dir, "train", limit, &train) != 0 || load_set(dir, "t10k", test_limit, &test) != 0)
        goto done;
    tb_device_format(&dev, name, sizeof name);
    printf("Fashion-MNIST: %lld training and %lld test images; CNN conv5x5x32-pool-conv5x5x64-pool-"
           "1024-10, AdamW, batch %d, on %s\n",
           (long long)train.n, (long long)test.n, BATCH, name);
    if (tb_manual_seed(0) != TB_OK) goto done;
    params[0] = uniform(tb_shape_of(TB_F32, 4, C1, 1, 5, 5), 25, &dev);
    params[1] = uniform(tb_shape_of(TB_F32, 1, C1), 25, &dev);
    params[2] = uniform(tb_shape_of(TB_F32, 4, C2, C1, 5, 5), C1 * 25, &dev);
    params[3] = uniform(tb_shape_of(TB_F32, 1, C2), C1 * 25, &dev);
    params[4] = uniform(tb_shape_of(TB_F32, 2, FLAT, HIDDEN), FLAT, &dev);
    params[5] = uniform(tb_shape_of(TB_F32, 1, HIDDEN), FLAT, &dev);
    params[6] = uniform(tb_shape_of(TB_F32, 2, HIDDEN, CLASSES), HIDDEN, &dev);
    params[7] = uniform(tb_shape_of(TB_F32, 1, CLASSES), HIDDEN, &dev);
    for (i = 0; i < NPARAMS; i++)
        if (params[i] == NULL) {
            rc = fail("parameters");
            goto done;
        }
    opt = tb_optimizer_new(&desc, params, NPARAMS);
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
        if (e > 1 && tb_optimizer_set_lr(opt, tb_optimizer_lr(opt) * 0.7) != TB_OK) {
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
            float lv = 0, hv = 0;
            for (k = 0; k < BATCH; k++) {
                memcpy(bx + k * PIXELS, train.x + order[at + k] * PIXELS, PIXELS * sizeof(float));
                by[k] = train.y[order[at + k]];
            }
            x = batch_x(bx, BATCH, &dev);
            y = batch_y(by, BATCH, &dev);
            z = forward(params, x, true);
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
        if (evaluate(params, &test, &dev, &test_acc) != 0) goto done;
        printf("epoch %d/%d  loss %.4f  train accuracy %.4f  test accuracy %.4f  %.0f images/s  "
               "%.2f s\n",
               e, epochs, seen > 0 ? loss_sum / (double)seen : 0.0,
               seen > 0 ? right / (double)seen : 0.0, test_acc, (double)seen / seconds, seconds);
        fflush(stdout);
    }
    printf("compiled graphs: %lld, cache hits: %lld\n",
           (long long)tb_metrics_counter("UncachedCompile"),
           (long long)tb_metrics_counter("CachedCompile"));
    rc = 0;
done:
    tb_optimizer_free(opt);
    for (i = 0; i < NPARAMS; i++)
        tb_tensor_release(params[i]);
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
