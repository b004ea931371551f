// Build: cc -std=c99 -O2 -I. examples/gpt.c -o gpt -ldl -lpthread -lm
//    or: c++ -x c++ -std=c++11 -O2 -I. examples/gpt.c -o gpt -ldl -lpthread -lm
//        (both from the repository root)
// Run:   ./gpt [--iters N] [--device D] [--data DIR] [--save FILE] [--resume FILE]
//              [--save-init FILE] [--eval-every N]
//        (Debian: apt-get install fortunes)
/* A small GPT trained from scratch on characters: the configuration of nanoGPT's CPU example
   (4 layers, 4 heads, 128 embedding dims, blocks of 64 characters, batches of 12, no dropout,
   AdamW with lr 1e-3, betas (0.9, 0.99), weight decay 0.1 on every parameter), on the English
   text of Debian's fortunes package (the plain-text files of DIR, default
   /usr/share/games/fortunes, in name order: about 2.5 MB), 90% for training and the last 10%
   held out.

   The model is nanoGPT's: token and position embeddings; per layer a pre-norm causal
   self-attention (tb_scaled_dot_product_attention) and a pre-norm MLP (4x, exact GELU), each
   added to the residual stream; a final layer norm; the output layer shares the token
   embedding's weights. Initialisation as nanoGPT's: normal(0, 0.02), the residual projections
   0.02 / sqrt(2 * layers), zero biases. The batches' offsets come from a splitmix64 stream
   seeded with 1337, so tools/bench/gpt_torch.py (the same model in PyTorch) reads the same
   data in the same order; --save-init FILE writes the initial weights for it.

   Each step records the forward pass, takes tb_grad and lets tb_optimizer_step run forward,
   backward and update as one graph (compiled at the first step). Every --eval-every
   iterations (default 250, and at the end) it prints the training loss and the loss on 20
   fixed held-out batches; --save FILE writes a checkpoint (weights, optimizer state and the
   iteration, one safetensors file) there, and --resume FILE continues from one: a resumed run
   gives the losses the uninterrupted run gives. Exit status 1 on any error. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#define TB_IMPLEMENTATION
#include "torch_backend.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LAYERS     4
#define HEADS      4
#define EMBD       128
#define BLOCK      64
#define BATCH      12
#define EVAL_BATCH 20
#define MAX_PARAMS (4 + 12 * LAYERS)

typedef struct corpus {
    unsigned char *text; /* the characters as token ids */
    size_t len, split;   /* [0, split) trains, [split, len) is held out */
    int vocab;
    unsigned char chars[256];
} corpus;

typedef struct gpt {
    tb_tensor *p[MAX_PARAMS];
    char names[MAX_PARAMS][48];
    int n;
    tb_device dev;
} gpt;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(const char *what) {
    fprintf(stderr, "gpt: %s: %s\n", what, tb_last_error());
    return 1;
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The plain-text files of dir (no extension), in name order, as one text. */
static int load_corpus(const char *dir, corpus *c) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char *names[512], path[1024];
    size_t n = 0, i, cap = 0;
    bool seen[256] = {false};
    int v;
    if (d == NULL) {
        fprintf(stderr, "gpt: cannot open %s (Debian: apt-get install fortunes)\n", dir);
        return 1;
    }
    while ((e = readdir(d)) != NULL && n < 512)
        if (e->d_name[0] != '.' && strchr(e->d_name, '.') == NULL) {
            names[n] = (char *)malloc(strlen(e->d_name) + 1);
            if (names[n] != NULL) strcpy(names[n++], e->d_name);
        }
    closedir(d);
    qsort(names, n, sizeof names[0], cmp_str);
    memset(c, 0, sizeof *c);
    for (i = 0; i < n; i++) {
        FILE *f;
        long size;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        free(names[i]);
        f = fopen(path, "rb");
        if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) <= 0 ||
            fseek(f, 0, SEEK_SET) != 0) {
            if (f != NULL) fclose(f);
            continue;
        }
        if (c->len + (size_t)size > cap) {
            unsigned char *t;
            cap = (c->len + (size_t)size) * 2;
            t = (unsigned char *)realloc(c->text, cap);
            if (t == NULL) {
                fclose(f);
                return 1;
            }
            c->text = t;
        }
        c->len += fread(c->text + c->len, 1, (size_t)size, f);
        fclose(f);
    }
    if (c->len < 100 * BLOCK) {
        fprintf(stderr, "gpt: %s holds too little text (%zu bytes)\n", dir, c->len);
        return 1;
    }
    for (i = 0; i < c->len; i++)
        seen[c->text[i]] = true;
    for (v = 0; v < 256; v++)
        if (seen[v]) c->chars[c->vocab++] = (unsigned char)v;
    for (i = 0; i < c->len; i++) { /* bytes to token ids (the sorted distinct bytes) */
        int lo = 0, hi = c->vocab - 1;
        while (c->chars[(lo + hi) / 2] != c->text[i])
            if (c->chars[(lo + hi) / 2] < c->text[i])
                lo = (lo + hi) / 2 + 1;
            else
                hi = (lo + hi) / 2 - 1;
        c->text[i] = (unsigned char)((lo + hi) / 2);
    }
    c->split = c->len * 9 / 10;
    return 0;
}

/* A batch of BATCH blocks from [lo, hi) at offsets from the stream: inputs and targets. */
static void make_batch(const corpus *c, size_t lo, size_t hi, uint64_t *rng, int64_t *x,
                       int64_t *y) {
    int b, t;
    for (b = 0; b < BATCH; b++) {
        size_t at = lo + (size_t)(splitmix64(rng) % (uint64_t)(hi - lo - BLOCK - 1));
        for (t = 0; t < BLOCK; t++) {
            x[b * BLOCK + t] = c->text[at + (size_t)t];
            y[b * BLOCK + t] = c->text[at + (size_t)t + 1];
        }
    }
}

static tb_tensor *param(gpt *m, const char *name, int rank, int64_t d0, int64_t d1, double std) {
    tb_shape s;
    int64_t dims[2] = {d0, d1};
    tb_tensor *t;
    if (tb_shape_make(&s, TB_F32, rank, dims) != TB_OK) return NULL;
    if (std > 0) {
        tb_tensor *r = tb_randn(&s, &m->dev);
        t = r != NULL ? tb_mul_scalar(r, std) : NULL;
        tb_tensor_release(r);
    } else {
        t = tb_full(&s, std < 0 ? 1.0 : 0.0, &m->dev); /* std -1: ones (layer norm weights) */
    }
    if (t == NULL || tb_sync(&t, 1) != TB_OK || tb_set_requires_grad(t, true) != TB_OK) return NULL;
    snprintf(m->names[m->n], sizeof m->names[m->n], "%s", name);
    m->p[m->n++] = t;
    return t;
}

static int build(gpt *m, int vocab) {
    char name[48];
    int l;
    double proj = 0.02 / sqrt(2.0 * LAYERS);
    tb_manual_seed(1337);
    m->n = 0;
    if (!param(m, "wte", 2, vocab, EMBD, 0.02) || !param(m, "wpe", 2, BLOCK, EMBD, 0.02)) return 1;
    for (l = 0; l < LAYERS; l++) {
        static const struct {
            const char *name;
            int rank;
            int64_t d0, d1;
            int init; /* 0 normal 0.02, 1 residual projection, 2 zeros, 3 ones */
        } shapes[12] = {{"ln_1.weight", 1, EMBD, 1, 3},
                        {"ln_1.bias", 1, EMBD, 1, 2},
                        {"attn.c_attn.weight", 2, 3 * EMBD, EMBD, 0},
                        {"attn.c_attn.bias", 1, 3 * EMBD, 1, 2},
                        {"attn.c_proj.weight", 2, EMBD, EMBD, 1},
                        {"attn.c_proj.bias", 1, EMBD, 1, 2},
                        {"ln_2.weight", 1, EMBD, 1, 3},
                        {"ln_2.bias", 1, EMBD, 1, 2},
                        {"mlp.c_fc.weight", 2, 4 * EMBD, EMBD, 0},
                        {"mlp.c_fc.bias", 1, 4 * EMBD, 1, 2},
                        {"mlp.c_proj.weight", 2, EMBD, 4 * EMBD, 1},
                        {"mlp.c_proj.bias", 1, EMBD, 1, 2}};
        int j;
        for (j = 0; j < 12; j++) {
            double std = shapes[j].init == 0 ? 0.02 : shapes[j].init == 1 ? proj : 0.0;
            if (shapes[j].init == 3) std = -1.0;
            snprintf(name, sizeof name, "h.%d.%s", l, shapes[j].name);
            if (!param(m, name, shapes[j].rank, shapes[j].d0, shapes[j].d1, std)) return 1;
        }
    }
    if (!param(m, "ln_f.weight", 1, EMBD, 1, -1.0) || !param(m, "ln_f.bias", 1, EMBD, 1, 0.0))
        return 1;
    return 0;
}

/* The parameters of layer l: p[2 + 12 * l + j] in the order of build()'s table. */
static tb_tensor *lp(const gpt *m, int l, int j) {
    return m->p[2 + 12 * l + j];
}

static tb_tensor *attention(const gpt *m, int l, tb_tensor *x) {
    const int64_t hd[4] = {BATCH, BLOCK, HEADS, EMBD / HEADS}, back[3] = {BATCH, BLOCK, EMBD};
    const int32_t perm[4] = {0, 2, 1, 3};
    tb_tensor *qkv = tb_linear(x, lp(m, l, 2), lp(m, l, 3));
    tb_tensor *q = tb_permute(tb_reshape(tb_slice(qkv, 2, 0, EMBD, 1), hd, 4), perm, 4);
    tb_tensor *k = tb_permute(tb_reshape(tb_slice(qkv, 2, EMBD, 2 * EMBD, 1), hd, 4), perm, 4);
    tb_tensor *v = tb_permute(tb_reshape(tb_slice(qkv, 2, 2 * EMBD, 3 * EMBD, 1), hd, 4), perm, 4);
    tb_tensor *a = tb_scaled_dot_product_attention(q, k, v, NULL, 0.0, true, 0.0);
    a = tb_reshape(tb_permute(a, perm, 4), back, 3);
    return tb_linear(a, lp(m, l, 4), lp(m, l, 5));
}

/* The mean cross-entropy of the next characters (scope: the caller's). */
static tb_tensor *forward_loss(const gpt *m, const int64_t *xs, const int64_t *ys) {
    tb_shape ts = tb_shape_of(TB_I64, 2, BATCH, BLOCK), fs = tb_shape_of(TB_I64, 1, BATCH * BLOCK);
    const int64_t flat[2] = {BATCH * BLOCK, -1};
    tb_tensor *x = tb_tensor_from_host(xs, &ts, &m->dev),
              *y = tb_tensor_from_host(ys, &fs, &m->dev);
    tb_tensor *h = tb_add(tb_embedding(x, m->p[0]), m->p[1]);
    int l;
    for (l = 0; l < LAYERS; l++) {
        h = tb_add(h, attention(m, l, tb_layer_norm(h, 1, lp(m, l, 0), lp(m, l, 1), 1e-5)));
        h = tb_add(h,
                   tb_linear(tb_gelu(tb_linear(tb_layer_norm(h, 1, lp(m, l, 6), lp(m, l, 7), 1e-5),
                                               lp(m, l, 8), lp(m, l, 9))),
                             lp(m, l, 10), lp(m, l, 11)));
    }
    h = tb_layer_norm(h, 1, m->p[m->n - 2], m->p[m->n - 1], 1e-5);
    return tb_cross_entropy(tb_reshape(tb_linear(h, m->p[0], NULL), flat, 2), y, TB_REDUCTION_MEAN,
                            0.0);
}

/* The mean loss over EVAL_BATCH fixed held-out batches. */
static int evaluate(const gpt *m, const corpus *c, double *out) {
    static int64_t x[BATCH * BLOCK], y[BATCH * BLOCK];
    uint64_t rng = 42;
    double sum = 0;
    int i;
    for (i = 0; i < EVAL_BATCH; i++) {
        float v = 0;
        tb_tensor *loss;
        make_batch(c, c->split, c->len, &rng, x, y);
        if (tb_scope_begin() != TB_OK) return 1;
        loss = forward_loss(m, x, y);
        if (loss == NULL || tb_tensor_to_host(loss, &v, sizeof v) != TB_OK) {
            tb_scope_end();
            return 1;
        }
        tb_scope_end();
        sum += v;
    }
    *out = sum / EVAL_BATCH;
    return 0;
}

static int save(const gpt *m, tb_optimizer *opt, int64_t iter, uint64_t rng, const char *path,
                bool with_state) {
    tb_tensor_set *set = tb_tensor_set_new();
    char num[32];
    int i, bad = set == NULL;
    for (i = 0; !bad && i < m->n; i++)
        bad = tb_tensor_set_add(set, m->names[i], m->p[i]) != TB_OK;
    snprintf(num, sizeof num, "%lld", (long long)iter);
    if (!bad) bad = tb_tensor_set_set_metadata(set, "iter", num) != TB_OK;
    snprintf(num, sizeof num, "%llu", (unsigned long long)rng);
    if (!bad) bad = tb_tensor_set_set_metadata(set, "rng", num) != TB_OK;
    if (!bad && with_state) bad = tb_optimizer_state_save(opt, set, "optim.") != TB_OK;
    if (!bad) bad = tb_safetensors_save(path, set) != TB_OK;
    tb_tensor_set_free(set);
    return bad;
}

static int resume(gpt *m, tb_optimizer *opt, const char *path, int64_t *iter, uint64_t *rng) {
    tb_tensor_set *set = tb_safetensors_load(path, &m->dev);
    const char *it, *rs;
    int i;
    if (set == NULL) return 1;
    for (i = 0; i < m->n; i++) {
        tb_tensor *t = tb_tensor_set_get(set, m->names[i]);
        if (t == NULL || tb_assign(m->p[i], t) != TB_OK) {
            tb_tensor_set_free(set);
            return 1;
        }
    }
    it = tb_tensor_set_metadata(set, "iter");
    rs = tb_tensor_set_metadata(set, "rng");
    if (it == NULL || rs == NULL || tb_optimizer_state_load(opt, set, "optim.") != TB_OK ||
        tb_sync(m->p, (size_t)m->n) != TB_OK) {
        tb_tensor_set_free(set);
        return 1;
    }
    *iter = strtoll(it, NULL, 10);
    *rng = strtoull(rs, NULL, 10);
    tb_tensor_set_free(set);
    return 0;
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
    static int64_t x[BATCH * BLOCK], y[BATCH * BLOCK];
    const char *data = "/usr/share/games/fortunes", *device = NULL, *save_path = NULL,
               *resume_path = NULL, *init_path = NULL;
    int64_t iters = 2000, every = 250, iter = 0;
    uint64_t rng = 1337;
    corpus c;
    gpt m;
    tb_optimizer *opt;
    tb_optimizer_desc desc = tb_adamw_desc(1e-3);
    double t0, train_sum = 0, val;
    int i, train_n = 0;
    if (setup_with_progress() != TB_OK) {
        fprintf(stderr, "gpt: %s\n", tb_last_error());
        return 1;
    }
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoll(argv[++i]);
        else if (strcmp(argv[i], "--eval-every") == 0 && i + 1 < argc)
            every = atoll(argv[++i]);
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = argv[++i];
        else if (strcmp(argv[i], "--data") == 0 && i + 1 < argc)
            data = argv[++i];
        else if (strcmp(argv[i], "--save") == 0 && i + 1 < argc)
            save_path = argv[++i];
        else if (strcmp(argv[i], "--resume") == 0 && i + 1 < argc)
            resume_path = argv[++i];
        else if (strcmp(argv[i], "--save-init") == 0 && i + 1 < argc)
            init_path = argv[++i];
        else {
            fprintf(stderr, "usage: gpt [--iters N] [--device D] [--data DIR] [--save FILE] "
                            "[--resume FILE] [--save-init FILE] [--eval-every N]\n");
            return 1;
        }
    }
    if (iters < 0 || every < 1) return fail("--iters and --eval-every");
    if (load_corpus(data, &c) != 0) return 1;
    if (device != NULL ? tb_device_parse(device, &m.dev) != TB_OK
                       : (tb_device_parse("opencl:0", &m.dev) != TB_OK &&
                          tb_device_parse("native:0", &m.dev) != TB_OK &&
                          tb_device_parse("cpu:0", &m.dev) != TB_OK))
        return fail("device");
    tb_clear_error();
    if (build(&m, c.vocab) != 0) return fail("parameters");
    if (init_path != NULL && save(&m, NULL, 0, rng, init_path, false) != 0)
        return fail("--save-init");
    desc.beta2 = 0.99;
    desc.weight_decay = 0.1;
    opt = tb_optimizer_new(&desc, m.p, (size_t)m.n);
    if (opt == NULL) return fail("optimizer");
    if (resume_path != NULL && resume(&m, opt, resume_path, &iter, &rng) != 0)
        return fail("--resume");
    {
        char dn[64];
        tb_device_format(&m.dev, dn, sizeof dn);
        printf("gpt: %d layers, %d heads, %d dims, blocks of %d, batches of %d on %s; %zu "
               "characters (%d distinct), %zu held out; from iteration %lld\n",
               LAYERS, HEADS, EMBD, BLOCK, BATCH, dn, c.len, c.vocab, c.len - c.split,
               (long long)iter);
    }
    t0 = now_s();
    while (iter < iters) {
        tb_tensor *loss, *grads[MAX_PARAMS];
        float lv = 0;
        make_batch(&c, 0, c.split, &rng, x, y);
        if (tb_scope_begin() != TB_OK) return fail("scope");
        loss = forward_loss(&m, x, y);
        if (loss == NULL || tb_grad(loss, NULL, m.p, (size_t)m.n, grads) != TB_OK ||
            tb_optimizer_step(opt, grads, &loss, 1) != TB_OK ||
            tb_tensor_to_host(loss, &lv, sizeof lv) != TB_OK)
            return fail("step");
        tb_scope_end();
        train_sum += lv;
        train_n++;
        iter++;
        if (iter % every == 0 || iter == iters) {
            if (evaluate(&m, &c, &val) != 0) return fail("evaluation");
            printf("iter %lld: train loss %.4f, held-out loss %.4f, %.1f ms per iteration\n",
                   (long long)iter, train_sum / train_n, val, (now_s() - t0) * 1e3 / train_n);
            fflush(stdout);
            if (save_path != NULL && save(&m, opt, iter, rng, save_path, true) != 0)
                return fail("--save");
            train_sum = 0;
            train_n = 0;
            t0 = now_s();
        }
    }
    tb_optimizer_free(opt);
    for (i = 0; i < m.n; i++)
        tb_tensor_release(m.p[i]);
    free(c.text);
    tb_shutdown();
    return 0;
}
