// test: run
// Build: cc -std=c99 -I. examples/mlp.c -o mlp -ldl -lpthread -lm
//    or: c++ -x c++ -std=c++11 -I. examples/mlp.c -o mlp -ldl -lpthread -lm
//        (both from the repository root)
// Run:   ./mlp [FOLDER]     (default mlp_weights/; TB_BACKEND=opencl ./mlp runs it on OpenCL)
/* Inference of a small multilayer perceptron, 16 -> 32 -> 32 -> 4, on a batch of 8 rows, with
   weights read from .npy files: the folder holds w1.npy [16,32], b1.npy [32], w2.npy [32,32],
   b2.npy [32], w3.npy [32,4], b3.npy [4] and the batch x.npy [8,16], all float32 (numpy's
   np.save writes them). When the folder lacks them, the program writes deterministic ones
   first (tb_randn from a fixed seed, saved with tb_npy_save).

   The whole forward pass is recorded lazily and runs as one graph on the current backend
   (TB_BACKEND, TB_DEVICE); the program prints the graph as Graphviz DOT before running it, then
   the predicted class and the probabilities of each row, then the metrics report. It checks
   the probabilities against a plain C computation of the same network and exits with status 1
   on any failure. */
#define _POSIX_C_SOURCE 200809L
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(_WIN32)
#include <direct.h>
#define make_folder(path) _mkdir(path)
#else
#include <sys/stat.h>
#define make_folder(path) mkdir(path, 0777)
#endif

#define BATCH   8
#define IN      16
#define HIDDEN  32
#define CLASSES 4

/* The parameters: name, rows, columns (0: a vector), standard deviation of the generated
   values. w* are He-initialised, b* small. */
typedef struct param {
    const char *name;
    int64_t rows, cols;
    double scale;
} param;

static const param params[] = {
    {"x", BATCH, IN, 1.0},        {"w1", IN, HIDDEN, 0.35}, {"b1", HIDDEN, 0, 0.1},
    {"w2", HIDDEN, HIDDEN, 0.25}, {"b2", HIDDEN, 0, 0.1},   {"w3", HIDDEN, CLASSES, 0.25},
    {"b3", CLASSES, 0, 0.1},
};
#define NUM_PARAMS (sizeof params / sizeof params[0])

static void path_of(char *buf, size_t cap, const char *folder, const char *name) {
    snprintf(buf, cap, "%s/%s.npy", folder, name);
}

static tb_shape shape_of(const param *p) {
    tb_shape shape;
    int64_t dims[2];
    dims[0] = p->rows;
    dims[1] = p->cols;
    tb_shape_make(&shape, TB_F32, p->cols > 0 ? 2 : 1, dims);
    return shape;
}

/* Writes every parameter file that is missing, with values from a fixed seed. */
static int write_missing(const char *folder) {
    tb_device cpu;
    size_t i;
    int wrote = 0;
    if (make_folder(folder) != 0 && errno != EEXIST) {
        fprintf(stderr, "mlp: cannot create %s: %s\n", folder, strerror(errno));
        return 1;
    }
    if (tb_device_make("cpu", 0, &cpu) != TB_OK) return 1;
    tb_manual_seed(20240607);
    for (i = 0; i < NUM_PARAMS; ++i) {
        char path[1024];
        FILE *f;
        tb_shape shape = shape_of(&params[i]);
        tb_tensor *noise, *scaled;
        tb_status st;
        path_of(path, sizeof path, folder, params[i].name);
        f = fopen(path, "rb");
        if (f != NULL) {
            fclose(f);
            continue;
        }
        /* generated on the cpu device, so the values do not depend on the backend */
        noise = tb_randn(&shape, &cpu);
        scaled = tb_mul_scalar(noise, params[i].scale);
        st = scaled != NULL ? tb_npy_save(path, scaled) : tb_last_status();
        tb_tensor_release(noise);
        tb_tensor_release(scaled);
        if (st != TB_OK) {
            fprintf(stderr, "mlp: cannot write %s: %s\n", path, tb_last_error());
            return 1;
        }
        wrote++;
    }
    if (wrote > 0) printf("wrote %d parameter files to %s/\n", wrote, folder);
    return 0;
}

/* relu(x @ w + b), or just x @ w + b for the last layer. Called inside a scope, which owns
   the intermediate handles. */
static tb_tensor *layer(tb_tensor *x, tb_tensor *w, tb_tensor *b, int relu) {
    tb_tensor *y = tb_add(tb_matmul(x, w), b);
    return relu ? tb_relu(y) : y;
}

/* The same network in plain C (double accumulation), for the check. */
static void host_forward(float *const *v, double probs[BATCH][CLASSES]) {
    double h1[BATCH][HIDDEN], h2[BATCH][HIDDEN];
    int r, i, k;
    for (r = 0; r < BATCH; ++r) {
        double m = -INFINITY, total = 0;
        for (i = 0; i < HIDDEN; ++i) {
            double s = v[2][i];
            for (k = 0; k < IN; ++k)
                s += (double)v[0][r * IN + k] * v[1][k * HIDDEN + i];
            h1[r][i] = s > 0 ? s : 0;
        }
        for (i = 0; i < HIDDEN; ++i) {
            double s = v[4][i];
            for (k = 0; k < HIDDEN; ++k)
                s += h1[r][k] * v[3][k * HIDDEN + i];
            h2[r][i] = s > 0 ? s : 0;
        }
        for (i = 0; i < CLASSES; ++i) {
            double s = v[6][i];
            for (k = 0; k < HIDDEN; ++k)
                s += h2[r][k] * v[5][k * CLASSES + i];
            probs[r][i] = s;
            if (s > m) m = s;
        }
        for (i = 0; i < CLASSES; ++i)
            total += probs[r][i] = exp(probs[r][i] - m);
        for (i = 0; i < CLASSES; ++i)
            probs[r][i] /= total;
    }
}

int main(int argc, char **argv) {
    const char *folder = argc > 1 ? argv[1] : "mlp_weights";
    tb_tensor *p[NUM_PARAMS] = {NULL};
    tb_tensor *probs = NULL, *pred = NULL;
    float *host[NUM_PARAMS] = {NULL};
    float out_probs[BATCH][CLASSES];
    int64_t out_pred[BATCH];
    double expected[BATCH][CLASSES], worst = 0;
    char device_text[64];
    char *dot = NULL, *report = NULL;
    tb_device device;
    int failed = 0, r, c;
    size_t i;

    if (write_missing(folder) != 0) {
        tb_shutdown();
        return 1;
    }
    tb_metrics_reset(); /* the report below covers the inference only */
    if (tb_current_device(&device) != TB_OK) {
        fprintf(stderr, "mlp: %s\n", tb_last_error());
        tb_shutdown();
        return 1;
    }
    tb_device_format(&device, device_text, sizeof device_text);
    printf("backend %s, device %s\n", device.backend, device_text);

    /* Load the parameters onto the current device and check their shapes. */
    for (i = 0; i < NUM_PARAMS && !failed; ++i) {
        char path[1024];
        tb_shape want = shape_of(&params[i]), got;
        path_of(path, sizeof path, folder, params[i].name);
        p[i] = tb_npy_load(path, NULL);
        if (p[i] == NULL) {
            fprintf(stderr, "mlp: %s\n", tb_last_error());
            failed = 1;
            break;
        }
        got = tb_tensor_shape(p[i]);
        if (!tb_shape_equal(&got, &want)) {
            char a[64], b[64];
            tb_shape_format(&got, a, sizeof a);
            tb_shape_format(&want, b, sizeof b);
            fprintf(stderr, "mlp: %s holds %s, the network needs %s\n", path, a, b);
            failed = 1;
        }
    }

    if (!failed) {
        /* Recorded, not run: the forward pass is one pending graph. The scope releases the
           intermediate handles at its end; the two outputs are kept (the caller's). */
        if (tb_scope_begin() == TB_OK) {
            tb_tensor *h1 = layer(p[0], p[1], p[2], 1);
            tb_tensor *h2 = layer(h1, p[3], p[4], 1);
            tb_tensor *logits = layer(h2, p[5], p[6], 0);
            probs = tb_scope_keep(tb_softmax(logits, -1));
            pred = tb_scope_keep(tb_argmax(logits, -1, false));
            tb_scope_end();
        }
        if (probs == NULL || pred == NULL) {
            fprintf(stderr, "mlp: %s\n", tb_last_error());
            failed = 1;
        }
    }
    if (!failed) {
        tb_tensor *outputs[2];
        outputs[0] = probs;
        outputs[1] = pred;
        dot = tb_ir_dot(outputs, 2);
        if (dot != NULL) printf("\nthe graph (Graphviz DOT):\n%s\n", dot);
        /* Both outputs in one computation. */
        if (dot == NULL || tb_sync(outputs, 2) != TB_OK ||
            tb_tensor_to_host(probs, out_probs, sizeof out_probs) != TB_OK ||
            tb_tensor_to_host(pred, out_pred, sizeof out_pred) != TB_OK) {
            fprintf(stderr, "mlp: %s\n", tb_last_error());
            failed = 1;
        }
    }
    if (!failed) {
        printf("row  class  probabilities\n");
        for (r = 0; r < BATCH; ++r) {
            printf("%3d  %5lld ", r, (long long)out_pred[r]);
            for (c = 0; c < CLASSES; ++c)
                printf(" %.4f", out_probs[r][c]);
            printf("\n");
        }
        report = tb_metrics_report();
        if (report != NULL) printf("\n%s\n", report);
    }

    /* The check: the same network in plain C on the same files. */
    for (i = 0; i < NUM_PARAMS && !failed; ++i) {
        tb_shape s = tb_tensor_shape(p[i]);
        size_t nbytes = 0;
        tb_shape_nbytes(&s, &nbytes);
        host[i] = (float *)malloc(nbytes);
        if (host[i] == NULL || tb_tensor_to_host(p[i], host[i], nbytes) != TB_OK) {
            fprintf(stderr, "mlp: cannot read %s back\n", params[i].name);
            failed = 1;
        }
    }
    if (!failed) {
        host_forward(host, expected);
        for (r = 0; r < BATCH; ++r) {
            int best = 0;
            for (c = 0; c < CLASSES; ++c) {
                double err = fabs(out_probs[r][c] - expected[r][c]);
                if (err > worst) worst = err;
                if (expected[r][c] > expected[r][best]) best = c;
            }
            /* argmax agrees unless two classes tie within rounding */
            if (out_pred[r] != best && fabs(expected[r][out_pred[r]] - expected[r][best]) > 1e-5) {
                fprintf(stderr, "mlp: row %d: predicted %lld, the check says %d\n", r,
                        (long long)out_pred[r], best);
                failed = 1;
            }
        }
        printf("largest difference from the plain C check: %.2e\n", worst);
        if (worst > 1e-4) {
            fprintf(stderr, "mlp: the probabilities differ from the check by %.2e\n", worst);
            failed = 1;
        }
    }

    for (i = 0; i < NUM_PARAMS; ++i) {
        tb_tensor_release(p[i]);
        free(host[i]);
    }
    tb_tensor_release(probs);
    tb_tensor_release(pred);
    tb_free(dot);
    tb_free(report);
    tb_shutdown();
    return failed ? 1 : 0;
}
