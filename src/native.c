/* ===========================================================================================
   Native backend ("native"): the planner's kernels rendered as C99 (codegen.c, codegen_kernels.c),
   compiled at run time by the system C compiler ($CC, else cc) into a shared object, loaded with
   dlopen and run on a pool of threads (one per core: a kernel's work items are split among them).
   Programs are cached on disk as OpenCL's are (diskcache.c), keyed by the source, the compiler, its
   options, the CPU and this library's version. Memory is host memory. Without a compiler the
   backend has no device and says why, as OpenCL without a loader does.
   =========================================================================================== */
#include "impl_begin.h"

#if defined(TB__HAVE_NATIVE)

#include <sys/wait.h>

/* ---- the C99 dialect of the code generator ---- */

static const char tb__native_head[] =
    "/* torch_backend.h: C99 (GNU vector extensions) for the native backend */\n"
    "#include <stdint.h>\n"
    "#include <string.h>\n"
    "#include <limits.h>\n"
    "#include <tgmath.h>\n"
    "typedef unsigned char uchar;\n"
    "typedef uint32_t uint;\n"
    "typedef uint64_t ulong;\n"
    "#define TB_FN static inline\n"
    "#define TB_HAS_F64 1\n"
    "static inline long tb_min_l(long a, long b) { return a < b ? a : b; }\n"
    "static inline float tb_as_f32(uint b) { float f; memcpy(&f, &b, sizeof f); return f; }\n"
    "static inline uint tb_as_u32(float f) { uint b; memcpy(&b, &f, sizeof b); return b; }\n"
    "typedef unsigned short ushort;\n"
    "#define TB_BITS_F32(b) tb_as_f32(b)\n"
    "#define TB_F32_BITS(f) tb_as_u32(f)\n"
    "#define TB_LDH(p, i) tb_h2f((p)[i])\n"
    "#define TB_STH(p, i, v) ((p)[i] = (ushort)tb_f2h(v))\n"
    "#if defined(__FLT16_MAX__) /* the compiler's _Float16: F16C instructions where the CPU has "
    "them */\n"
    "#define TB_HAS_F16_CVT 1\n"
    "static inline uint tb_f2h(float x) {\n"
    "    _Float16 f = (_Float16)x; ushort b; memcpy(&b, &f, sizeof b); return b;\n"
    "}\n"
    "static inline float tb_rnd_f16(float x) { return (float)(_Float16)x; }\n"
    "#endif\n"
    "static inline double tb_as_f64(ulong b) { double f; memcpy(&f, &b, sizeof f); return f; }\n"
    "typedef float float16 __attribute__((vector_size(64)));\n"
    "typedef double double8 __attribute__((vector_size(64)));\n"
    "static inline float16 vload16(long i, const float *p) {\n"
    "    float16 v; memcpy(&v, p + i * 16, sizeof v); return v;\n"
    "}\n"
    "static inline void vstore16(float16 v, long i, float *p) { memcpy(p + i * 16, &v, sizeof v); "
    "}\n"
    "static inline double8 vload8(long i, const double *p) {\n"
    "    double8 v; memcpy(&v, p + i * 8, sizeof v); return v;\n"
    "}\n"
    "static inline void vstore8(double8 v, long i, double *p) { memcpy(p + i * 8, &v, sizeof v); "
    "}\n"
    "typedef int int16 __attribute__((vector_size(64)));\n"
    "#define TB_HAS_VEC16 1\n"
    "#define TB_VBC(c) ((float16){0} + (c))\n"
    "#define TB_VSEL(a, b, m) ((float16)(((int16)(a) & ~(m)) | ((int16)(b) & (m))))\n"
    "#define TB_VCVTI(x) __builtin_convertvector((x), int16)\n"
    "#define TB_VASF(x) ((float16)(x))\n"
    "#define TB_VASI(x) ((int16)(x))\n"
    "typedef uint uint16 __attribute__((vector_size(64)));\n"
    "#define TB_VASU(x) ((uint16)(x))\n"
    "#define TB_VASFU(x) ((float16)(x))\n"
    "#define TB_VSTORE(v, s) memcpy((s), &(v), sizeof(float16))\n"
    "#define TB_VEXP(x) tb_vexp16(x) /* the prelude's: C has no vector exp */\n"
    "#if defined(__AVX512F__) && defined(__GNUC__) /* a * b + c rounded once */\n"
    "#define TB_VFMA(a, b, c) __builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)0xffff, 4)\n"
    "#else\n"
    "#define TB_VFMA(a, b, c) ((a) * (b) + (c))\n"
    "#endif\n"
    "#if defined(__AVX512F__) && defined(__GNUC__) /* p * 2^k (k whole) rounded once */\n"
    "#define TB_VSCALEF(p, k) __builtin_ia32_scalefps512_mask(p, k, p, (unsigned short)0xffff, 4)\n"
    "#endif\n"
    "/* rows streamed through the caches: the next row fetched ahead, outputs stored past the\n"
    "   caches (the fence orders those stores before the kernel's end) */\n"
    "#define TB_PREFETCH(p) __builtin_prefetch(p)\n"
    "#define TB_PREFETCH_L2(p) __builtin_prefetch((p), 0, 1) /* to the outer caches only */\n"
    "#if defined(__clang__)\n"
    "#define TB_VSTREAM(v, p) __builtin_nontemporal_store((v), (float16 *)(p))\n"
    "#elif defined(__AVX512F__) && defined(__GNUC__)\n"
    "#define TB_VSTREAM(v, p) __builtin_ia32_movntps512((p), (v))\n"
    "#else\n"
    "#define TB_VSTREAM(v, p) vstore16((v), 0, (p))\n"
    "#endif\n"
    "#if defined(__SSE__) && defined(__GNUC__)\n"
    "#define TB_VSTREAM_END() __builtin_ia32_sfence()\n"
    "#else\n"
    "#define TB_VSTREAM_END() ((void)0)\n"
    "#endif\n"
    "static inline float16 TB_VSQRT(float16 x) {\n"
    "    float16 r; int i; for (i = 0; i < 16; i++) r[i] = __builtin_sqrtf(x[i]); return r;\n"
    "}\n"
    "\n";

/* The head's second part: 16 lanes of 16-bit floats. */
static const char tb__native_head2[] =
    /* 16 lanes of f16: the F16C instructions where the CPU has them, else lane by lane; bf16
       as the top half of an f32 */
    "typedef unsigned short ushort16 __attribute__((vector_size(32)));\n"
    "#if defined(__AVX512F__) && defined(__GNUC__)\n"
    "typedef short tb_v16hi __attribute__((vector_size(32)));\n"
    "static inline float16 tb_vh2f16(tb_v16hi h) {\n"
    "    return __builtin_ia32_vcvtph2ps512_mask(h, (float16){0}, (unsigned short)0xffff, 4);\n"
    "}\n"
    "static inline tb_v16hi tb_vf2h16(float16 v) {\n"
    "    return __builtin_ia32_vcvtps2ph512_mask(v, 0, (tb_v16hi){0}, (unsigned short)0xffff);\n"
    "}\n"
    "#if !defined(__clang__) /* gcc's builtin: one widening load (clang has no such builtin) */\n"
    "#define TB_HAS_VLDBF 1\n"
    "static inline float16 tb_vldbf(const ushort *p) {\n"
    "    tb_v16hi h; memcpy(&h, p, sizeof h);\n"
    "    return (float16)(__builtin_ia32_pmovzxwd512_mask(h, (int16){0}, (unsigned short)0xffff) "
    "<< 16);\n"
    "}\n"
    "#endif\n"
    "#elif defined(__F16C__) && defined(__GNUC__)\n"
    "typedef short tb_v16hi __attribute__((vector_size(32)));\n"
    "typedef short tb_v8hi __attribute__((vector_size(16)));\n"
    "typedef float tb_v8sf __attribute__((vector_size(32)));\n"
    "static inline float16 tb_vh2f16(tb_v16hi h) {\n"
    "    tb_v8hi a, b; tb_v8sf fa, fb; float16 r;\n"
    "    memcpy(&a, &h, 16); memcpy(&b, (char *)&h + 16, 16);\n"
    "    fa = __builtin_ia32_vcvtph2ps256(a); fb = __builtin_ia32_vcvtph2ps256(b);\n"
    "    memcpy(&r, &fa, 32); memcpy((char *)&r + 32, &fb, 32); return r;\n"
    "}\n"
    "static inline tb_v16hi tb_vf2h16(float16 v) {\n"
    "    tb_v8sf fa, fb; tb_v8hi a, b; tb_v16hi h;\n"
    "    memcpy(&fa, &v, 32); memcpy(&fb, (char *)&v + 32, 32);\n"
    "    a = __builtin_ia32_vcvtps2ph256(fa, 0); b = __builtin_ia32_vcvtps2ph256(fb, 0);\n"
    "    memcpy(&h, &a, 16); memcpy((char *)&h + 16, &b, 16); return h;\n"
    "}\n"
    "#else\n"
    "typedef ushort16 tb_v16hi;\n"
    "static inline float tb_h2f(uint h);\n"
    "static inline uint tb_f2h(float f);\n"
    "static inline float16 tb_vh2f16(tb_v16hi h) {\n"
    "    float16 r; int i; for (i = 0; i < 16; i++) r[i] = tb_h2f(h[i]); return r;\n"
    "}\n"
    "static inline tb_v16hi tb_vf2h16(float16 v) {\n"
    "    tb_v16hi h; int i; for (i = 0; i < 16; i++) h[i] = (ushort)tb_f2h(v[i]); return h;\n"
    "}\n"
    "#endif\n"
    "static inline float16 tb_vldh(const ushort *p) {\n"
    "    tb_v16hi h; memcpy(&h, p, sizeof h); return tb_vh2f16(h);\n"
    "}\n"
    "static inline void tb_vsth(float16 v, ushort *p) {\n"
    "    tb_v16hi h = tb_vf2h16(v); memcpy(p, &h, sizeof h);\n"
    "}\n"
    "#define TB_VLDH(p) tb_vldh(p)\n"
    "#define TB_VSTH(v, p) tb_vsth((v), (p))\n"
    "#define TB_VRNDH(x) tb_vh2f16(tb_vf2h16(x))\n"
    "#ifndef TB_HAS_VLDBF\n"
    "static inline float16 tb_vldbf(const ushort *p) {\n"
    "    ushort16 h; memcpy(&h, p, sizeof h);\n"
    "    return (float16)(__builtin_convertvector(h, uint16) << 16);\n"
    "}\n"
    "#endif\n"
    "static inline void tb_vstbf(float16 r, ushort *p) {\n"
    "    ushort16 h = __builtin_convertvector((uint16)r >> 16, ushort16); memcpy(p, &h, sizeof "
    "h);\n"
    "}\n"
    "#define TB_VLDBF(p) tb_vldbf(p)\n"
    "#define TB_VSTBF(v, p) tb_vstbf(tb_vrnd_bf16(v), (p))\n";

static const char *tb__native_math(const char *fn, tb_dtype dtype) {
    (void)dtype; /* <tgmath.h> picks the float or double function */
    return fn;
}

/* The work-item space of a kernel: its global size per dimension. */
static void tb__native_global_size(const tb__plan_kernel *k, uint64_t size[3]) {
    int d;
    if (k->group_size[0] > 0) {
        for (d = 0; d < 3; d++)
            size[d] =
                (uint64_t)k->groups[d] * (uint64_t)(k->group_size[d] > 0 ? k->group_size[d] : 1);
    } else {
        size[0] = k->items;
        size[1] = size[2] = 1;
    }
}

/* A kernel is two functions: NAME_item, the body for one work item (tb_g0..2 its ids), and
   NAME(args, lo, hi), which runs work items [lo, hi) of the flattened space, the pointers and
   scalars it reads taken from args in the plan's order (the output first). */
static void tb__native_emit_kernel(tb__str *src, const tb__plan_kernel *k,
                                   const tb__cg_param *params, size_t num_params,
                                   const char *body) {
    /* an elementwise kernel's non-temporal stores: one fence for the whole range */
    const char *fence =
        k->stream_out && k->kind == TB__K_ELEMENTWISE ? "    TB_VSTREAM_END();\n" : "";
    uint64_t size[3];
    size_t i;
    tb__native_global_size(k, size);
    tb__str_append(src, "static inline void %s_item(long tb_g0, long tb_g1, long tb_g2", k->name);
    for (i = 0; i < num_params; i++) {
        const tb__cg_param *q = &params[i];
        if (q->role == TB__ARG_SCALAR) {
            tb__str_append(src, ",\n    const %s %s", q->type, q->name);
        } else if (q->role == -1 || q->role == TB__ARG_ERR) {
            tb__str_append(src, ",\n    %s *restrict %s", q->type, q->name);
        } else {
            tb__str_append(src, ",\n    const %s *restrict %s", q->type, q->name);
        }
    }
    tb__str_append(src, ") {\n    (void)tb_g0, (void)tb_g1, (void)tb_g2;\n%s}\n\n", body);
    tb__str_append(src, "void %s(void *const *tb_a, long tb_lo, long tb_hi) {\n", k->name);
    for (i = 0; i < num_params; i++) {
        const tb__cg_param *q = &params[i];
        if (q->role == TB__ARG_SCALAR) {
            tb__str_append(src, "    const %s %s = *(const %s *)tb_a[%zu];\n", q->type, q->name,
                           q->type, i);
        } else if (q->role == -1 || q->role == TB__ARG_ERR) {
            tb__str_append(src, "    %s *restrict %s = (%s *)tb_a[%zu];\n", q->type, q->name,
                           q->type, i);
        } else {
            tb__str_append(src, "    const %s *restrict %s = (const %s *)tb_a[%zu];\n", q->type,
                           q->name, q->type, i);
        }
    }
    /* the bound lets the compiler see that every item is in range */
    tb__str_append(src, "    if (tb_hi > %lldL) tb_hi = %lldL;\n",
                   (long long)(size[0] * size[1] * size[2]),
                   (long long)(size[0] * size[1] * size[2]));
    if (size[1] == 1 && size[2] == 1) {
        tb__str_append(src, "    for (long tb_w = tb_lo; tb_w < tb_hi; tb_w++)\n");
        tb__str_append(src, "        %s_item(tb_w, 0, 0", k->name);
        for (i = 0; i < num_params; i++)
            tb__str_append(src, ", %s", params[i].name);
        tb__str_append(src, ");\n%s}\n\n", fence);
        return;
    }
    /* runs of dimension 0 at fixed ids 1 and 2: one division per run, not per item */
    tb__str_append(src, "    for (long tb_w = tb_lo; tb_w < tb_hi;) {\n");
    tb__str_append(src,
                   "        const long tb_r = tb_w / %lldL, tb_g1 = tb_r %% %lldL, tb_g2 = tb_r / "
                   "%lldL;\n",
                   (long long)size[0], (long long)size[1], (long long)size[1]);
    tb__str_append(src, "        long tb_g0 = tb_w %% %lldL, tb_end = tb_w + (%lldL - tb_g0);\n",
                   (long long)size[0], (long long)size[0]);
    tb__str_append(src, "        if (tb_end > tb_hi) tb_end = tb_hi;\n");
    tb__str_append(src, "        for (; tb_w < tb_end; tb_w++, tb_g0++)\n");
    tb__str_append(src, "            %s_item(tb_g0, tb_g1, tb_g2", k->name);
    for (i = 0; i < num_params; i++)
        tb__str_append(src, ", %s", params[i].name);
    tb__str_append(src, ");\n    }\n%s}\n\n", fence);
}

static void tb__native_dialect(tb__dialect *d) {
    memset(d, 0, sizeof *d);
    d->name = "C99";
    d->head = tb__native_head;
    d->head2 = tb__native_head2;
    d->vec_make = "(float16){%s}";
    d->global = "";
    d->local = NULL; /* a thread runs a range of work items: no work-groups */
    d->barrier = "";
    d->global_id = "tb_g%d";
    d->group_id = "tb_g%d";
    d->local_id = "0";
    d->vec_zero = "(%s){0}";
    d->min_long = "tb_min_l";
    d->bits_f32 = "tb_as_f32";
    d->bits_f64 = "tb_as_f64";
    d->f64 = true;
    d->math = tb__native_math;
    d->kernel = tb__native_emit_kernel;
}

/* ---- the thread pool ----
   One job at a time: a kernel's work items split into chunks, taken by the pool's threads
   and the caller from a shared counter.
   On Linux the pool's threads are kept off the core the caller runs on (tb__native_place): the
   caller works on the job as soon as it has woken them, and when all have slept (a pause
   between calls) the scheduler may queue a woken thread on the caller's own core, where both
   then share that core for the whole job (and the next ones) while another sits idle. Each
   thread may run on the CPUs the caller may run on, less the caller's: a process or thread
   that is pinned (taskset, sched_setaffinity) keeps its pool within its CPUs. */

#if defined(__linux__)
typedef int (*tb__native_getcpu_fn)(void);
#endif

typedef void (*tb__native_fn)(void *const *args, long lo, long hi);

typedef struct tb__native_pool {
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    pthread_t *threads;
    size_t num_threads; /* besides the caller */
    /* the job */
    uint64_t generation;
    tb__native_fn fn;
    void *const *args;
    int64_t total, chunk, chunks;
    int64_t next;   /* the next chunk to take (atomic) */
    size_t running; /* threads still working on this generation */
    bool stop;
#if defined(__linux__)
    /* pthread_getaffinity_np, pthread_setaffinity_np and sched_getcpu (looked up, as they are
       GNU extensions; NULL: the threads are left where the scheduler puts them), and the
       caller's CPU and CPU mask the threads were last placed for */
    tb__affinity_fn get_affinity, set_affinity;
    tb__native_getcpu_fn getcpu;
    int placed_cpu;
    unsigned long placed_mask[TB__CPU_WORDS];
#endif
} tb__native_pool;

static int64_t tb__native_take(tb__native_pool *p) {
    return __atomic_fetch_add(&p->next, 1, __ATOMIC_ACQ_REL);
}

static void tb__native_work(tb__native_pool *p, tb__native_fn fn, void *const *args) {
    int64_t c;
    while ((c = tb__native_take(p)) < p->chunks) {
        int64_t lo = c * p->chunk, hi = lo + p->chunk;
        if (hi > p->total) hi = p->total;
        fn(args, (long)lo, (long)hi);
    }
}

static void *tb__native_thread(void *arg) {
    tb__native_pool *p = (tb__native_pool *)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        tb__native_fn fn;
        void *const *args;
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->wake, &p->lock);
        if (p->stop) break;
        seen = p->generation;
        fn = p->fn;
        args = p->args;
        pthread_mutex_unlock(&p->lock);
        tb__native_work(p, fn, args);
        pthread_mutex_lock(&p->lock);
        if (--p->running == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

#if defined(__linux__)
static void tb__native_place_init(tb__native_pool *p) {
    void *self = dlopen(NULL, RTLD_LAZY), *cpu;
    tb__affinity_fn get, set;
    p->placed_cpu = -1;
    if (self == NULL || !tb__affinity_calls(self, &get, &set)) return;
    cpu = dlsym(self, "sched_getcpu");
    if (cpu == NULL) return;
    p->get_affinity = get;
    p->set_affinity = set;
    memcpy(&p->getcpu, &cpu, sizeof cpu); /* as tb__affinity_calls */
}

/* Before a job: the pool's threads may run on the caller's CPUs less the one it runs on (all of
   the caller's where it has only that one). Two system calls when nothing changed. */
static void tb__native_place(tb__native_pool *p) {
    unsigned long mask[TB__CPU_WORDS];
    int cpu;
    size_t i, w = sizeof(unsigned long) * CHAR_BIT;
    bool other = false;
    if (p->set_affinity == NULL) return;
    cpu = p->getcpu();
    memset(mask, 0, sizeof mask);
    if (cpu < 0 || (size_t)cpu >= TB__CPU_WORDS * w ||
        p->get_affinity(pthread_self(), sizeof mask, mask) != 0)
        return;
    if (cpu == p->placed_cpu && memcmp(mask, p->placed_mask, sizeof mask) == 0) return;
    p->placed_cpu = cpu;
    memcpy(p->placed_mask, mask, sizeof mask);
    mask[(size_t)cpu / w] &= ~(1ul << ((size_t)cpu % w));
    for (i = 0; i < TB__CPU_WORDS; i++)
        other = other || mask[i] != 0;
    if (!other) memcpy(mask, p->placed_mask, sizeof mask);
    for (i = 0; i < p->num_threads; i++)
        (void)p->set_affinity(p->threads[i], sizeof mask, mask);
}
#endif

/* A pool of `threads` threads besides the caller; NULL with the error set. */
static tb__native_pool *tb__native_pool_new(size_t threads) {
    tb__native_pool *p = (tb__native_pool *)tb__calloc(1, sizeof *p);
    size_t i;
    if (p == NULL) return NULL;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (threads > 0) {
        p->threads = (pthread_t *)tb__calloc(threads, sizeof(pthread_t));
        if (p->threads == NULL) threads = 0;
    }
    for (i = 0; i < threads; i++) {
        if (pthread_create(&p->threads[i], NULL, tb__native_thread, p) != 0) break;
        p->num_threads++;
    }
#if defined(__linux__)
    tb__native_place_init(p);
#endif
    return p;
}

static void tb__native_pool_free(tb__native_pool *p) {
    size_t i;
    if (p == NULL) return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (i = 0; i < p->num_threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->lock);
    tb__free(p->threads);
    tb__free(p);
}

/* Runs fn over work items [0, total). Small jobs (`work` bytes and operations below a few tens
   of kilobytes) run on the caller alone: waking threads would cost more. */
static void tb__native_run(tb__native_pool *p, tb__native_fn fn, void *const *args, int64_t total,
                           double work) {
    int64_t parts;
    if (total <= 0) return;
    if (p == NULL || p->num_threads == 0 || work < 65536.0 || total == 1) {
        fn(args, 0, (long)total);
        return;
    }
    parts = (int64_t)(p->num_threads + 1) * 4;
    if (parts > total) parts = total;
#if defined(__linux__)
    tb__native_place(p);
#endif
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->args = args;
    p->total = total;
    p->chunk = (total + parts - 1) / parts;
    p->chunks = (total + p->chunk - 1) / p->chunk;
    __atomic_store_n(&p->next, 0, __ATOMIC_RELEASE);
    p->running = p->num_threads;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    tb__native_work(p, fn, args);
    pthread_mutex_lock(&p->lock);
    while (p->running > 0)
        pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

/* ---- the runtime: the compiler, the device, memory, programs ---- */

#include <spawn.h>

extern char **environ;

/* A host buffer, 64-byte aligned (the payload of every native tb_backend_data). */
typedef struct tb__native_buf {
    void *base;
    unsigned char *ptr;
    size_t size;  /* bytes asked for */
    size_t cap;   /* bytes it holds: the size class */
    uint64_t gen; /* tb__next_generation when it was handed out or last written */
} tb__native_buf;

/* A loaded shared object, shared by every computation whose source is the same. */
typedef struct tb__native_prog {
    struct tb__native_prog *next;
    uint64_t key[2];
    char *source; /* confirms a hit on the key */
    size_t source_len;
    void *handle;
    int32_t refcount; /* computations using it, plus one while it is in the cache */
} tb__native_prog;

typedef struct tb__native_rt {
    int32_t refcount; /* the backend's reference, plus one per buffer and computation alive */
    bool exited;
    tb_status status; /* TB_OK, or why the backend cannot be used */
    char reason[512];
    tb_device_info info;
    /* the compiler: its command words ($CC split at spaces), its options, its identity (the
       first line of --version, read at the first compile) and the CPU's */
    char *cc_text;
    char *cc_argv[16];
    size_t cc_argc;
    char options[512];
    char cc_id[4200];
    char cpu[512];
    uint64_t l2_bytes; /* a core's L2 cache as the C library reports it; 0: unknown */
    tb__native_pool *pool;
    /* the caching allocator: free buffers, oldest first */
    tb__native_buf **cache;
    size_t cache_count, cache_cap;
    uint64_t cached_bytes, cache_limit, bytes_in_use, peak_bytes;
    tb__native_prog *programs;
    uint64_t compiles, disk_hits, disk_misses, disk_rejected, kernels_launched;
    int32_t cache_dir_reported; /* atomic: why the cache folder is not used was said */
} tb__native_rt;

/* Guards the runtime, its allocator and its program cache (never held while the compiler
   runs); runs are serialised by tb__native_run_mutex (one job in the pool at a time). */
static tb__mutex tb__native_mutex = TB__MUTEX_INIT;
static tb__mutex tb__native_run_mutex = TB__MUTEX_INIT;
static tb__native_rt *tb__native_current;

#define TB__NATIVE_MAX_PROGRAMS 256

static const tb__disk_format tb__native_disk_format = {"native", "TBNATIVE", 1u, ".so"};

/* The bits of a program key that count (all: the in-memory cache confirms hits by source). */
static const uint64_t tb__native_key_mask = ~(uint64_t)0;

static void tb__native_prog_free(tb__native_prog *prog) {
    if (prog->handle != NULL) dlclose(prog->handle);
    tb__free(prog->source);
    tb__free(prog);
}

static void tb__native_rt_destroy(tb__native_rt *rt) {
    tb__native_prog *prog, *next;
    size_t i;
    tb__native_pool_free(rt->pool);
    for (prog = rt->programs; prog != NULL; prog = next) {
        next = prog->next;
        tb__native_prog_free(prog);
    }
    for (i = 0; i < rt->cache_count; i++) {
        tb__free(rt->cache[i]->base);
        tb__free(rt->cache[i]);
    }
    tb__free(rt->cache);
    tb__free(rt->cc_text);
    tb__free(rt);
}

static void tb__native_rt_unref(tb__native_rt *rt) {
    if (rt != NULL && --rt->refcount == 0) tb__native_rt_destroy(rt);
}

/* Whether `name` is an executable file, found on $PATH when it has no slash; its path in
   `found` (of 4096 bytes). */
static bool tb__native_find_program(const char *name, char *found) {
    const char *path = tb__getenv("PATH"), *p;
    char buf[4096];
    if (name == NULL || name[0] == '\0') return false;
    if (strchr(name, '/') != NULL) {
        snprintf(found, 4096, "%s", name);
        return access(name, X_OK) == 0;
    }
    if (path == NULL) path = "/usr/bin:/bin";
    for (p = path; *p != '\0';) {
        const char *end = strchr(p, ':');
        size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
        if (n > 0 && n + strlen(name) + 2 <= sizeof buf) {
            memcpy(buf, p, n);
            buf[n] = '/';
            strcpy(buf + n + 1, name);
            if (access(buf, X_OK) == 0) {
                memcpy(found, buf, sizeof buf);
                return true;
            }
        }
        p += n;
        if (*p == ':') p++;
    }
    return false;
}

/* The CPU's model and features (the compiled code is for this CPU: -march=native). */
static void tb__native_read_cpu(tb__native_rt *rt) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[4096];
    bool model = false, flags = false;
    uint64_t h = 0x637075ull;
    snprintf(rt->info.name, sizeof rt->info.name, "host CPU");
    if (f == NULL) return;
    while ((!model || !flags) && fgets(line, sizeof line, f) != NULL) {
        char *colon = strchr(line, ':');
        size_t n;
        if (colon == NULL) continue;
        n = strlen(colon + 1);
        while (n > 0 && (colon[n] == '\n' || colon[n] == ' '))
            colon[n--] = '\0';
        if (!model && strncmp(line, "model name", 10) == 0) {
            snprintf(rt->info.name, sizeof rt->info.name, "%s", colon + 2);
            model = true;
        } else if (!flags &&
                   (strncmp(line, "flags", 5) == 0 || strncmp(line, "Features", 8) == 0)) {
            h = tb__hash_bytes(h, colon + 1, strlen(colon + 1));
            flags = true;
        }
    }
    fclose(f);
    snprintf(rt->cpu, sizeof rt->cpu, "%s; features %016llx", rt->info.name, (unsigned long long)h);
}

/* Facts of the device, the compiler's command and options; an unusable runtime says why. */
static void tb__native_probe(tb__native_rt *rt) {
    const char *cc = tb__getenv("CC"), *extra = tb__getenv("TB_NATIVE_CFLAGS");
    const char *threads = tb__getenv("TB_NATIVE_THREADS");
    long cores = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    char *p, found[4096];
    struct stat st;
    tb_device_info *info = &rt->info;
    strcpy(info->device.backend, "native");
    info->device.type = TB_DEVICE_CPU;
    snprintf(info->vendor, sizeof info->vendor, "torch_backend.h");
    snprintf(info->language_version, sizeof info->language_version, "C99");
    snprintf(info->driver_version, sizeof info->driver_version, "%s", TB_VERSION_STRING);
    info->compute_units = cores > 0 ? (uint32_t)cores : 1;
    if (threads != NULL && atoi(threads) > 0) info->compute_units = (uint32_t)atoi(threads);
    info->global_memory = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    info->max_allocation = info->global_memory;
    info->max_work_group_size = 1;
    info->unified_memory = true;
    info->supports_f64 = true;
    tb__native_read_cpu(rt);
#if defined(_SC_LEVEL2_CACHE_SIZE)
    {
        long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        rt->l2_bytes = l2 > 0 ? (uint64_t)l2 : 0;
    }
#endif
    rt->cache_limit = info->global_memory / 8;
    if (rt->cache_limit < ((uint64_t)64 << 20)) rt->cache_limit = (uint64_t)64 << 20;
    if (sizeof(long) != 8) {
        rt->status = TB_ERR_UNAVAILABLE;
        snprintf(rt->reason, sizeof rt->reason, "native: needs a 64-bit long (an LP64 system)");
        return;
    }
    rt->cc_text = tb__strdup(cc != NULL ? cc : "cc");
    if (rt->cc_text == NULL) {
        rt->status = TB_ERR_OUT_OF_MEMORY;
        snprintf(rt->reason, sizeof rt->reason, "native: out of memory");
        return;
    }
    for (p = rt->cc_text; *p != '\0' && rt->cc_argc < 8;) {
        while (*p == ' ' || *p == '\t')
            *p++ = '\0';
        if (*p == '\0') break;
        rt->cc_argv[rt->cc_argc++] = p;
        while (*p != '\0' && *p != ' ' && *p != '\t')
            p++;
    }
    if (rt->cc_argc == 0 || !tb__native_find_program(rt->cc_argv[0], found) ||
        stat(found, &st) != 0) {
        rt->status = TB_ERR_UNAVAILABLE;
        snprintf(rt->reason, sizeof rt->reason,
                 "native: no C compiler: '%s' is not an executable on PATH (set CC)",
                 rt->cc_argc > 0 ? rt->cc_argv[0] : (cc != NULL ? cc : "cc"));
        return;
    }
    /* the compiler's identity for the disk cache: the file it is (a new version is another
       file, or the same file changed) */
    snprintf(rt->cc_id, sizeof rt->cc_id, "%s: %s (%lld bytes, modified %lld)",
             cc != NULL ? cc : "cc", found, (long long)st.st_size, (long long)st.st_mtime);
    snprintf(rt->options, sizeof rt->options,
             "-std=gnu99 -O3 -march=native -fPIC -shared -ffp-contract=off -fno-math-errno -w%s%s",
             extra != NULL ? " " : "", extra != NULL ? extra : "");
}

/* The runtime, made on first use. Call with tb__native_mutex held. NULL (the error set) when
   memory ran out: nothing is kept, and the next call tries again. */
static tb__native_rt *tb__native_rt_get(void) {
    tb__native_rt *rt = tb__native_current;
    if (rt != NULL) return rt;
    rt = (tb__native_rt *)tb__calloc(1, sizeof *rt);
    if (rt == NULL) return NULL;
    rt->refcount = 1;
    tb__native_probe(rt);
    if (rt->status == TB_OK) {
        rt->pool = tb__native_pool_new(rt->info.compute_units > 1 ? rt->info.compute_units - 1 : 0);
        if (rt->pool == NULL) {
            rt->status = TB_ERR_OUT_OF_MEMORY;
            snprintf(rt->reason, sizeof rt->reason, "native: out of memory");
        }
    }
    if (rt->status == TB_ERR_OUT_OF_MEMORY) {
        tb__error(rt->status, "%s", rt->reason);
        tb__native_rt_destroy(rt);
        return NULL;
    }
    if (rt->status != TB_OK) tb_log_message(TB_LOG_INFO, "%s", rt->reason);
    tb__native_current = rt;
    return rt;
}

/* The usable runtime for `ordinal`, or NULL with the error set. Call with the mutex held. */
static tb__native_rt *tb__native_device(int32_t ordinal, const char *func) {
    tb__native_rt *rt = tb__native_rt_get();
    if (rt == NULL) return NULL;
    if (rt->status != TB_OK) {
        tb__error(rt->status, "%s", rt->reason);
        return NULL;
    }
    if (ordinal != 0) {
        tb__error(TB_ERR_NOT_FOUND, "%s: no device native:%d (1 device)", func, (int)ordinal);
        return NULL;
    }
    return rt;
}

static void tb__native_buf_destroy(tb__native_buf *b) {
    tb__free(b->base);
    tb__free(b);
}

static void tb__native_cache_trim(tb__native_rt *rt, uint64_t keep) {
    while (rt->cache_count > 0 && rt->cached_bytes > keep) {
        tb__native_buf *b = rt->cache[0];
        memmove(rt->cache, rt->cache + 1, (rt->cache_count - 1) * sizeof *rt->cache);
        rt->cache_count--;
        rt->cached_bytes -= b->cap;
        tb__native_buf_destroy(b);
        tb__native_rt_unref(rt);
    }
}

/* A buffer of `size` bytes from the cache (the smallest of its size class) or new. Call with
   the mutex held. */
static tb_status tb__native_buf_alloc(tb__native_rt *rt, size_t size, tb__native_buf **out) {
    size_t cap = tb__size_class(size), i;
    tb__native_buf *b;
    for (i = 0; i < rt->cache_count; i++) {
        if (rt->cache[i]->cap == cap) {
            b = rt->cache[i];
            memmove(rt->cache + i, rt->cache + i + 1,
                    (rt->cache_count - i - 1) * sizeof *rt->cache);
            rt->cache_count--;
            rt->cached_bytes -= b->cap;
            b->size = size;
            b->gen = tb__next_generation();
            rt->bytes_in_use += b->cap;
            if (rt->bytes_in_use > rt->peak_bytes) rt->peak_bytes = rt->bytes_in_use;
            *out = b;
            return TB_OK;
        }
    }
    b = (tb__native_buf *)tb__calloc(1, sizeof *b);
    if (b == NULL) return TB_ERR_OUT_OF_MEMORY;
    if (cap > SIZE_MAX - 64 || (b->base = tb__alloc(cap + 64)) == NULL) {
        tb__native_cache_trim(rt, 0); /* what the cache holds may be what is missing */
        b->base = cap > SIZE_MAX - 64 ? NULL : tb__alloc(cap + 64);
        if (b->base == NULL) {
            tb__free(b);
            return tb__error(TB_ERR_OUT_OF_MEMORY, "native: cannot allocate %zu bytes", size);
        }
    }
    b->ptr = (unsigned char *)b->base + (64 - (uintptr_t)b->base % 64) % 64;
    b->size = size;
    b->cap = cap;
    b->gen = tb__next_generation();
    rt->refcount++;
    rt->bytes_in_use += cap;
    if (rt->bytes_in_use > rt->peak_bytes) rt->peak_bytes = rt->bytes_in_use;
    *out = b;
    return TB_OK;
}

/* Gives a buffer back: cached for reuse while the cache has room. Call with the mutex held. */
static void tb__native_buf_free(tb__native_rt *rt, tb__native_buf *b) {
    if (b == NULL) return;
    rt->bytes_in_use -= b->cap;
    if (rt->exited || b->cap > rt->cache_limit ||
        tb__grow((void **)&rt->cache, &rt->cache_cap, rt->cache_count + 1, sizeof *rt->cache) !=
            TB_OK) {
        tb__native_buf_destroy(b);
        tb__native_rt_unref(rt);
        return;
    }
    rt->cache[rt->cache_count++] = b;
    rt->cached_bytes += b->cap;
    tb__native_cache_trim(rt, rt->cache_limit);
}

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

/* Runs argv (argv[0] found on PATH) with its output into the file `log`; the exit status, 128 +
   the signal that ended it, or -1 with the error set when it cannot start. */
static int tb__native_spawn(char *const *argv, const char *log) {
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int rc, status = 0;
    if (posix_spawn_file_actions_init(&fa) != 0) {
        tb__error(TB_ERR_OUT_OF_MEMORY, "native: out of memory");
        return -1;
    }
    rc = posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (rc == 0) rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        tb__error(TB_ERR_UNAVAILABLE, "native: cannot run %s: %s", argv[0], strerror(rc));
        return -1;
    }
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            tb__error(TB_ERR_COMPILE, "native: waiting for %s failed: %s", argv[0],
                      strerror(errno));
            return -1;
        }
    }
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 255;
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
    tb__disk_key_add(key, rt->cc_id, (size_t)-1);
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
    char *argv[64], opts[512], *dir, *csrc = NULL, *out = NULL, *log = NULL, *p;
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
    if (csrc == NULL || out == NULL || log == NULL) {
        st = TB_ERR_OUT_OF_MEMORY;
    } else if (!tb__native_write_file(csrc, src, len)) {
        st = tb__error(TB_ERR_IO, "native: cannot write %s: %s", csrc, strerror(errno));
    }
    if (st == TB_OK) {
        for (k = 0; k < rt->cc_argc; k++)
            argv[i++] = rt->cc_argv[k];
        snprintf(opts, sizeof opts, "%s", rt->options);
        for (p = opts; *p != '\0' && i < 56;) {
            while (*p == ' ')
                *p++ = '\0';
            if (*p == '\0') break;
            argv[i++] = p;
            while (*p != '\0' && *p != ' ')
                p++;
        }
        argv[i++] = (char *)"-o";
        argv[i++] = out;
        argv[i++] = csrc;
        argv[i++] = (char *)"-lm";
        argv[i] = NULL;
        rc = tb__native_spawn(argv, log);
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

static void tb__native_prog_unref(tb__native_rt *rt, tb__native_prog *prog) {
    tb__native_prog **link;
    if (prog == NULL || --prog->refcount > 0) return;
    for (link = &rt->programs; *link != NULL; link = &(*link)->next) {
        if (*link == prog) {
            *link = prog->next;
            break;
        }
    }
    tb__native_prog_free(prog);
}

/* Drops cached programs no computation uses, oldest first, until at most `keep` remain. */
static void tb__native_progs_trim(tb__native_rt *rt, size_t keep) {
    size_t count = 0;
    tb__native_prog *prog;
    for (prog = rt->programs; prog != NULL; prog = prog->next)
        count++;
    while (count > keep) {
        tb__native_prog *oldest = NULL;
        for (prog = rt->programs; prog != NULL; prog = prog->next)
            if (prog->refcount == 1) oldest = prog; /* the list is newest first */
        if (oldest == NULL) break;
        tb__native_prog_unref(rt, oldest);
        count--;
    }
}

static tb__native_prog *tb__native_prog_find(tb__native_rt *rt, const uint64_t key[2],
                                             const char *src, size_t len) {
    tb__native_prog *prog;
    for (prog = rt->programs; prog != NULL; prog = prog->next) {
        if (prog->key[0] == key[0] && prog->key[1] == key[1] && prog->source_len == len &&
            memcmp(prog->source, src, len) == 0) {
            prog->refcount++;
            return prog;
        }
    }
    return NULL;
}

/* The loaded program of a source: from memory, from the disk cache, or compiled now (the
   compiler runs without any lock held). */
static tb_status tb__native_get_program(tb__native_rt *rt, const char *src, size_t len,
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
    prog = tb__native_prog_find(rt, key, src, len);
    tb__mutex_unlock(&tb__native_mutex);
    if (prog != NULL) {
        *out = prog;
        return TB_OK;
    }
    bytes = tb__disk_lookup(&tb__native_disk_format, &dkey, key, &rt->cache_dir_reported, &n,
                            &save_dir, &path, &why);
    if (bytes != NULL) {
        handle = tb__native_load_bytes(bytes, n);
        if (handle == NULL) {
            why = "a shared object that does not load";
            tb__disk_reject(path);
            save_dir = tb__disk_cache_path();
        }
        tb__free(bytes);
        bytes = NULL;
    }
    if (handle != NULL) {
        (void)TB__ATOMIC_ADD(&rt->disk_hits, 1);
    } else {
        if (path != NULL) (void)TB__ATOMIC_ADD(&rt->disk_misses, 1);
        if (why != NULL) {
            if (tb_debug_level() >= 1)
                tb_log_message(TB_LOG_INFO, "native: program cache file %s not used: %s", path,
                               why);
            tb__disk_reject(path);
            (void)TB__ATOMIC_ADD(&rt->disk_rejected, 1);
        }
        st = tb__native_compile_source(rt, src, len, &handle, &bytes, &n);
        if (st == TB_OK) {
            (void)TB__ATOMIC_ADD(&rt->compiles, 1);
            tb__disk_store(&tb__native_disk_format, save_dir, &dkey, key, &rt->cache_dir_reported,
                           bytes, n);
        }
    }
    tb__free(bytes);
    tb__free(save_dir);
    tb__free(path);
    if (st != TB_OK) return st;
    prog = (tb__native_prog *)tb__calloc(1, sizeof *prog);
    if (prog != NULL) prog->source = (char *)tb__alloc(len + 1);
    if (prog == NULL || prog->source == NULL) {
        tb__free(prog);
        dlclose(handle);
        return TB_ERR_OUT_OF_MEMORY;
    }
    memcpy(prog->source, src, len);
    prog->source[len] = '\0';
    prog->source_len = len;
    prog->key[0] = key[0];
    prog->key[1] = key[1];
    prog->handle = handle;
    prog->refcount = 2; /* the cache and the caller */
    tb__mutex_lock(&tb__native_mutex);
    prog->next = rt->programs;
    rt->programs = prog;
    tb__native_progs_trim(rt, TB__NATIVE_MAX_PROGRAMS);
    tb__mutex_unlock(&tb__native_mutex);
    *out = prog;
    return TB_OK;
}

/* ---- backend entries: devices and data ---- */

static size_t tb__native_get_backend_devices(void *user_data, tb_device *out, size_t cap) {
    tb__native_rt *rt;
    size_t n = 0;
    (void)user_data;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_rt_get();
    if (rt != NULL && rt->status == TB_OK) {
        n = 1;
        if (cap > 0) out[0] = rt->info.device;
    }
    tb__mutex_unlock(&tb__native_mutex);
    return n;
}

static tb_status tb__native_get_device_info(void *user_data, int32_t ordinal, tb_device_info *out) {
    tb__native_rt *rt;
    (void)user_data;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(ordinal, "native");
    if (rt != NULL) *out = rt->info;
    tb__mutex_unlock(&tb__native_mutex);
    return rt != NULL ? TB_OK : tb_last_status();
}

static tb_status tb__native_data_from_host(void *user_data, tb_backend_data *data,
                                           const void *host) {
    tb__native_rt *rt;
    tb__native_buf *b = NULL;
    size_t size;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &size);
    if (st != TB_OK) return st;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(data->device.ordinal, "native");
    st = rt != NULL ? tb__native_buf_alloc(rt, size, &b) : tb_last_status();
    tb__mutex_unlock(&tb__native_mutex);
    if (st != TB_OK) return st;
    if (size > 0) memcpy(b->ptr, host, size);
    data->payload = b;
    return TB_OK;
}

static tb_status tb__native_data_from_scalar(void *user_data, tb_backend_data *data,
                                             tb_scalar value) {
    unsigned char bytes[8];
    memset(bytes, 0, sizeof bytes);
    tb__scalar_store(value, data->shape.dtype, bytes);
    return tb__native_data_from_host(user_data, data, bytes);
}

static tb_status tb__native_data_to_host(void *user_data, const tb_backend_data *data, void *host) {
    const tb__native_buf *b = (const tb__native_buf *)data->payload;
    size_t size;
    tb_status st;
    (void)user_data;
    st = tb_shape_nbytes(&data->shape, &size);
    if (st != TB_OK) return st;
    if (b == NULL || b->size < size) {
        return tb__error(TB_ERR_INVALID_ARGUMENT, "native: data_to_host of a data without a value");
    }
    if (size > 0) memcpy(host, b->ptr, size);
    return TB_OK;
}

static void tb__native_data_release(void *user_data, tb_backend_data *data) {
    tb__native_buf *b = (tb__native_buf *)data->payload;
    (void)user_data;
    if (b == NULL) return;
    tb__mutex_lock(&tb__native_mutex);
    if (tb__native_current != NULL) {
        tb__native_buf_free(tb__native_current, b);
    } else {
        tb__native_buf_destroy(b); /* the backend exited: nothing caches it */
    }
    tb__mutex_unlock(&tb__native_mutex);
    data->payload = NULL;
}

/* The buffers are host memory: the library reads and writes them in place (a collective's
   input and result), with nothing to do at the end. */
static void *tb__native_data_map_host(void *user_data, tb_backend_data *data, bool write) {
    tb__native_rt *rt;
    tb__native_buf *b = NULL;
    size_t size;
    (void)user_data;
    if (!write) {
        b = (tb__native_buf *)data->payload;
        return b != NULL ? b->ptr : NULL;
    }
    if (tb_shape_nbytes(&data->shape, &size) != TB_OK) return NULL;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(data->device.ordinal, "native");
    if (rt != NULL && tb__native_buf_alloc(rt, size, &b) != TB_OK) b = NULL;
    tb__mutex_unlock(&tb__native_mutex);
    if (b == NULL) return NULL;
    data->payload = b;
    return b->ptr;
}

/* ---- backend entries: lowering, compile, execute ---- */

/* Panels a pack kernel made of one parameter's buffer, kept while that buffer (the same object,
   of the same generation) comes again. */
typedef struct tb__native_kept {
    const tb__native_buf *src;
    uint64_t gen;
    tb__native_buf *panels;
} tb__native_kept;

/* A compiled graph: its plan, its source, its program and a function per kernel. */
typedef struct tb__native_comp {
    tb__plan *plan;
    char *source;
    size_t source_len;
    tb__native_rt *rt;
    tb__native_prog *prog;
    tb__native_fn *fns;
    tb__native_kept *kept; /* per kernel */
} tb__native_comp;

/* A lowering context: the computation until compile takes it. */
typedef struct tb__native_context {
    tb__native_comp *comp;
} tb__native_context;

static void tb__native_comp_release(tb__native_comp *c) {
    tb__native_rt *rt;
    if (c == NULL) return;
    rt = c->rt;
    tb__mutex_lock(&tb__native_mutex);
    if (rt != NULL && c->prog != NULL) tb__native_prog_unref(rt, c->prog);
    if (rt != NULL && c->kept != NULL) {
        size_t i;
        for (i = 0; i < c->plan->num_kernels; i++)
            if (c->kept[i].panels != NULL) tb__native_buf_free(rt, c->kept[i].panels);
    }
    tb__native_rt_unref(rt);
    tb__mutex_unlock(&tb__native_mutex);
    tb__free(c->kept);
    tb__free(c->fns);
    tb__free(c->source);
    tb__plan_free(c->plan);
    tb__free(c);
}

/* Plans the graph for the host's threads and renders the plan as C99. */
static tb_status tb__native_create_lowering_context(void *user_data, const tb_graph *graph,
                                                    void **context) {
    tb__native_rt *rt;
    tb__native_comp *c;
    tb__native_context *ctx;
    tb__pgraph G;
    tb__tuning tuning;
    tb__target target;
    tb__dialect dialect;
    tb_status st;
    (void)user_data;
    *context = NULL;
    ctx = (tb__native_context *)tb__calloc(1, sizeof *ctx);
    c = (tb__native_comp *)tb__calloc(1, sizeof *c);
    if (ctx == NULL || c == NULL) {
        tb__free(ctx);
        tb__free(c);
        return TB_ERR_OUT_OF_MEMORY;
    }
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_device(graph->device.ordinal, "native");
    if (rt != NULL) rt->refcount++;
    tb__mutex_unlock(&tb__native_mutex);
    if (rt == NULL) {
        tb__free(c);
        tb__free(ctx);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_UNAVAILABLE;
    }
    c->rt = rt;
    tb__tuning_of(TB__CLASS_HOST, &tuning);
    memset(&target, 0, sizeof target);
    target.tuning = &tuning;
    target.compute_units = rt->info.compute_units;
    target.max_group = 1;
    target.max_allocation = rt->info.max_allocation;
    target.max_args = 4096;
    target.f64 = true;
    target.acc_f64 = true;
    target.cache_bytes = rt->l2_bytes;
    target.buffer_align = 64; /* tb__native_buf_alloc */
    tb__native_dialect(&dialect);
    st = tb__plan_build(graph, &target, &G, &c->plan);
    if (st == TB_OK) {
        st = tb__cg_render(&G, c->plan, &dialect, &c->source, &c->source_len);
        tb__pgraph_free(&G);
    }
    if (st != TB_OK) {
        tb__native_comp_release(c);
        tb__free(ctx);
        return st;
    }
    ctx->comp = c;
    *context = ctx;
    return TB_OK;
}

static void tb__native_release_lowering_context(void *user_data, void *context) {
    tb__native_context *ctx = (tb__native_context *)context;
    (void)user_data;
    if (ctx == NULL) return;
    tb__native_comp_release(ctx->comp);
    tb__free(ctx);
}

/* Compiles (or finds) the program and looks its kernels up; the computation leaves the
   context. */
static tb_status tb__native_compile(void *user_data, void *context, void **computation) {
    tb__native_context *ctx = (tb__native_context *)context;
    tb__native_comp *c = ctx != NULL ? ctx->comp : NULL;
    tb__plan *p;
    tb_status st;
    size_t i;
    (void)user_data;
    *computation = NULL;
    if (c == NULL) return tb__error(TB_ERR_INVALID_ARGUMENT, "native: compile without a context");
    p = c->plan;
    if (tb_debug_level() >= 3) {
        tb_log_message(TB_LOG_DEBUG, "native: program of graph %016llx:\n%s",
                       (unsigned long long)p->graph_hash, c->source);
    }
    c->fns = (tb__native_fn *)tb__calloc(p->num_kernels + 1, sizeof(tb__native_fn));
    c->kept = (tb__native_kept *)tb__calloc(p->num_kernels + 1, sizeof(tb__native_kept));
    if (c->fns == NULL || c->kept == NULL) return TB_ERR_OUT_OF_MEMORY;
    st = tb__native_get_program(c->rt, c->source, c->source_len, &c->prog);
    for (i = 0; i < p->num_kernels && st == TB_OK; i++) {
        void *sym;
        if (p->kernels[i].empty) continue;
        sym = dlsym(c->prog->handle, p->kernels[i].name);
        if (sym == NULL) {
            st = tb__error(TB_ERR_COMPILE, "native: the program has no kernel %s",
                           p->kernels[i].name);
            break;
        }
        memcpy(&c->fns[i], &sym, sizeof sym);
    }
    if (st == TB_OK && tb_debug_level() >= 1) {
        tb__str names;
        memset(&names, 0, sizeof names);
        for (i = 0; i < p->num_kernels; i++)
            if (!p->kernels[i].empty)
                tb__str_append(&names, "%s%s", names.len > 0 ? " " : "", p->kernels[i].name);
        tb_log_message(TB_LOG_INFO, "native:0: graph %016llx: %s",
                       (unsigned long long)p->graph_hash, names.data != NULL ? names.data : "");
        tb__str_free(&names);
    }
    if (st != TB_OK) return st;
    ctx->comp = NULL;
    *computation = c;
    return TB_OK;
}

static void tb__native_release_computation(void *user_data, void *computation) {
    (void)user_data;
    tb__native_comp_release((tb__native_comp *)computation);
}

static const char *tb__native_backend_text(void *user_data, const void *computation) {
    (void)user_data;
    return computation != NULL ? ((const tb__native_comp *)computation)->source : NULL;
}

static int32_t tb__native_get_node_kernel(void *user_data, const void *computation,
                                          size_t node_index, const char **kernel_name) {
    const tb__native_comp *c = (const tb__native_comp *)computation;
    int32_t k;
    (void)user_data;
    if (kernel_name != NULL) *kernel_name = NULL;
    if (c == NULL || c->plan->node_kernel == NULL || node_index >= c->plan->num_nodes) return -1;
    k = c->plan->node_kernel[node_index];
    if (k >= 0 && kernel_name != NULL) *kernel_name = c->plan->kernels[k].name;
    return k;
}

/* The buffers of a run: the parameters' (borrowed) and the kernels' outputs (owned until they
   are results or freed after their last use). */
typedef struct tb__native_run_state {
    tb__native_buf **owned;
    unsigned char **ptrs;
    void **argv;
    int64_t err[4];
} tb__native_run_state;

static tb_status tb__native_run_init(tb__native_comp *c, tb_backend_data *const *arguments,
                                     tb__native_run_state *s, unsigned char **table) {
    const tb__plan *p = c->plan;
    size_t i, most = 1;
    *table = NULL;
    memset(s, 0, sizeof *s);
    for (i = 0; i < p->num_kernels; i++)
        if (p->kernels[i].num_args + 1 > most) most = p->kernels[i].num_args + 1;
    s->owned = (tb__native_buf **)tb__calloc(p->num_slots + 1, sizeof *s->owned);
    s->ptrs = (unsigned char **)tb__calloc(p->num_slots + 1, sizeof *s->ptrs);
    s->argv = (void **)tb__calloc(most, sizeof *s->argv);
    if (s->owned == NULL || s->ptrs == NULL || s->argv == NULL) return TB_ERR_OUT_OF_MEMORY;
    for (i = 0; i < p->num_slots; i++) {
        const tb__native_buf *b;
        if (p->slots[i].kind != TB__SLOT_PARAM) continue;
        b = (const tb__native_buf *)arguments[p->slots[i].index]->payload;
        if (b == NULL)
            return tb__error(TB_ERR_INVALID_ARGUMENT, "native: an argument has no value");
        s->ptrs[i] = b->ptr;
    }
    for (i = 0; i < p->num_results; i++) {
        /* a result computed into a donated parameter's buffer */
        if (p->result_alias[i] >= 0)
            s->ptrs[p->result_slot[i]] =
                ((tb__native_buf *)arguments[p->result_alias[i]]->payload)->ptr;
    }
    if (p->scalar_table) {
        *table = (unsigned char *)tb__calloc(p->num_params + 1, 8);
        if (*table == NULL) return TB_ERR_OUT_OF_MEMORY;
        for (i = 0; i < p->num_params; i++) {
            const tb__native_buf *b = (const tb__native_buf *)arguments[i]->payload;
            if (p->param_scalar[i] && b != NULL)
                memcpy(*table + 8 * i, b->ptr, tb_dtype_size(p->param_dtype[i]));
        }
    }
    return TB_OK;
}

/* Runs kernel i: its output allocated, its arguments gathered, its work items on the pool. */
static tb_status tb__native_run_kernel(tb__native_comp *c, size_t i,
                                       tb_backend_data *const *arguments, tb__native_run_state *s,
                                       unsigned char *table) {
    const tb__plan *p = c->plan;
    const tb__plan_kernel *k = &p->kernels[i];
    uint64_t size[3], t0;
    size_t j;
    const tb__native_buf *src =
        k->pack_param >= 0 ? (const tb__native_buf *)arguments[k->pack_param]->payload : NULL;
    tb__native_kept *kp = &c->kept[i];
    if (src != NULL && kp->panels != NULL && kp->src == src && kp->gen == src->gen) {
        s->ptrs[k->out_slot] = kp->panels->ptr; /* the panels of this buffer, made before */
        return TB_OK;
    }
    if (s->ptrs[k->out_slot] == NULL) {
        size_t bytes = 0;
        tb_status st = tb_shape_nbytes(&p->slots[k->out_slot].shape, &bytes);
        if (st != TB_OK) return st;
        tb__mutex_lock(&tb__native_mutex);
        st = tb__native_buf_alloc(c->rt, bytes, &s->owned[k->out_slot]);
        tb__mutex_unlock(&tb__native_mutex);
        if (st != TB_OK) return st;
        s->ptrs[k->out_slot] = s->owned[k->out_slot]->ptr;
    }
    if (k->empty) return TB_OK;
    s->argv[0] = s->ptrs[k->out_slot];
    for (j = 0; j < k->num_args; j++) {
        const tb__plan_arg *a = &k->args[j];
        if (a->kind == TB__ARG_BUF) {
            s->argv[j + 1] = s->ptrs[a->index];
        } else if (a->kind == TB__ARG_SCALAR) {
            s->argv[j + 1] = ((tb__native_buf *)arguments[a->index]->payload)->ptr;
        } else if (a->kind == TB__ARG_TABLE) {
            s->argv[j + 1] = table;
        } else {
            s->argv[j + 1] = s->err;
        }
    }
    tb__native_global_size(k, size);
    t0 = tb_debug_level() >= 2 ? tb__now_ns() : 0;
    tb__native_run(c->rt->pool, c->fns[i], s->argv, (int64_t)(size[0] * size[1] * size[2]),
                   k->bytes + k->flops);
    (void)TB__ATOMIC_ADD(&c->rt->kernels_launched, 1);
    if (src != NULL && s->owned[k->out_slot] != NULL &&
        (uint64_t)s->owned[k->out_slot]->cap <= c->rt->cache_limit) {
        /* keep the panels with the computation (the next run of this buffer skips the pack) */
        tb__mutex_lock(&tb__native_mutex);
        if (kp->panels != NULL) tb__native_buf_free(c->rt, kp->panels);
        tb__mutex_unlock(&tb__native_mutex);
        kp->panels = s->owned[k->out_slot];
        kp->src = src;
        kp->gen = src->gen;
        s->owned[k->out_slot] = NULL;
    }
    if (tb_debug_level() >= 2) {
        double ns = (double)(tb__now_ns() - t0);
        if (ns < 1) ns = 1;
        tb_log_message(TB_LOG_DEBUG, "native:0 %-24s %10.3f ms %9.2f GB/s %9.2f GFLOP/s", k->name,
                       ns / 1e6, k->bytes / ns, k->flops / ns);
    }
    return TB_OK;
}

static tb_status tb__native_execute(void *user_data, void *computation,
                                    tb_backend_data *const *arguments, size_t num_arguments,
                                    tb_backend_data *const *results, size_t num_results) {
    tb__native_comp *c = (tb__native_comp *)computation;
    const tb__plan *p = c != NULL ? c->plan : NULL;
    tb__native_run_state s;
    unsigned char *table = NULL;
    tb_status st;
    size_t i, j;
    bool consumed = false;
    (void)user_data;
    if (p == NULL || num_arguments != p->num_params || num_results != p->num_results) {
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "native: execute with %zu arguments and %zu results, the computation has "
                         "%zu and %zu",
                         num_arguments, num_results, p != NULL ? p->num_params : 0,
                         p != NULL ? p->num_results : 0);
    }
    if (c->rt->exited)
        return tb__error(TB_ERR_STATE, "native: the computation outlived the backend");
    tb__mutex_lock(&tb__native_run_mutex);
    st = tb__native_run_init(c, arguments, &s, &table);
    for (i = 0; i < p->num_kernels && st == TB_OK; i++) {
        if ((int32_t)i == p->first_alias) {
            /* the kernels from here on write into donated buffers and cannot fail: a flag
               raised before them fails the run with the donated values intact */
            if (s.err[0] != 0) {
                st = tb__plan_run_error(p, "native", s.err);
                break;
            }
            consumed = true;
            for (j = 0; j < p->num_results; j++)
                if (p->result_alias[j] >= 0) /* panels kept from it are stale from here on */
                    ((tb__native_buf *)arguments[p->result_alias[j]]->payload)->gen =
                        tb__next_generation();
        }
        st = tb__native_run_kernel(c, i, arguments, &s, table);
        /* temporaries nobody reads any more go back to the cache */
        tb__mutex_lock(&tb__native_mutex);
        for (j = 0; j < p->num_slots; j++) {
            if (p->slots[j].kind == TB__SLOT_TEMP && s.owned != NULL && s.owned[j] != NULL &&
                p->slots[j].last_use <= (int32_t)i) {
                tb__native_buf_free(c->rt, s.owned[j]);
                s.owned[j] = NULL;
                s.ptrs[j] = NULL;
            }
        }
        tb__mutex_unlock(&tb__native_mutex);
    }
    if (st == TB_OK && s.err[0] != 0) st = tb__plan_run_error(p, "native", s.err);
    tb__mutex_lock(&tb__native_mutex);
    for (i = 0; i < p->num_results && st == TB_OK; i++) {
        int32_t src = p->result_source[i];
        tb__native_buf *copy = NULL;
        size_t bytes = 0;
        if (src < 0) continue;
        /* the buffer it repeats may be a donated one: its size is the slot's */
        st = tb_shape_nbytes(&p->slots[p->result_slot[src]].shape, &bytes);
        if (st == TB_OK) st = tb__native_buf_alloc(c->rt, bytes, &copy);
        if (st != TB_OK) break;
        if (bytes > 0) memcpy(copy->ptr, s.ptrs[p->result_slot[src]], bytes);
        results[i]->payload = copy;
    }
    for (i = 0; i < p->num_results; i++) {
        int32_t d = p->result_alias[i];
        if (d >= 0) {
            /* the donated buffer is the result's (success), or freed once written (failure) */
            if (st == TB_OK) {
                results[i]->payload = arguments[d]->payload;
                arguments[d]->payload = NULL;
            } else if (consumed) {
                tb__native_buf_free(c->rt, (tb__native_buf *)arguments[d]->payload);
                arguments[d]->payload = NULL;
            }
            continue;
        }
        if (p->result_source[i] >= 0) {
            if (st != TB_OK && results[i]->payload != NULL) {
                tb__native_buf_free(c->rt, (tb__native_buf *)results[i]->payload);
                results[i]->payload = NULL;
            }
        } else if (st == TB_OK) {
            results[i]->payload = s.owned[p->result_slot[i]];
            s.owned[p->result_slot[i]] = NULL;
        }
    }
    if (s.owned != NULL) {
        for (i = 0; i < p->num_slots; i++)
            tb__native_buf_free(c->rt, s.owned[i]);
    }
    tb__mutex_unlock(&tb__native_mutex);
    tb__mutex_unlock(&tb__native_run_mutex);
    tb__free(s.owned);
    tb__free(s.ptrs);
    tb__free(s.argv);
    tb__free(table);
    return st;
}

/* ---- backend entries: IR hooks, lifetime, registration ---- */

/* Every built-in op; custom ops with a kernel expression (compiled as C99 with <tgmath.h>). */
static bool tb__native_supports_node(void *user_data, const tb_node *node) {
    (void)user_data;
    if (node->op >= TB_OP_BUILTIN_COUNT) {
        const tb_custom_op_desc *d = tb__plan_custom(node->op);
        return d != NULL && d->opencl_expr != NULL && d->infer_shape == NULL;
    }
    return node->op >= 0;
}

static size_t tb__native_metrics_report(void *user_data, char *buf, size_t cap) {
    tb__str s;
    tb__native_rt *rt;
    size_t n;
    char *text;
    (void)user_data;
    memset(&s, 0, sizeof s);
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_rt_get();
    if (rt == NULL || rt->status != TB_OK) {
        tb__str_append(&s, "Native: unavailable: %s\n", rt != NULL ? rt->reason : "out of memory");
    } else {
        tb__str_append(&s, "Device: native:0 (%s, %u threads)\n", rt->info.name,
                       (unsigned)rt->info.compute_units);
        tb__str_append(&s, "  Native::Compiler: %s %s\n", rt->cc_argv[0], rt->options);
        tb__str_append(&s, "  Native::BytesInUse: %llu\n", (unsigned long long)rt->bytes_in_use);
        tb__str_append(&s, "  Native::PeakBytesInUse: %llu\n", (unsigned long long)rt->peak_bytes);
        tb__str_append(&s, "  Native::BytesCached: %llu\n", (unsigned long long)rt->cached_bytes);
        tb__str_append(&s, "  Native::ProgramCompile: %llu\n", (unsigned long long)rt->compiles);
        tb__str_append(&s, "  Native::DiskCacheHit: %llu\n", (unsigned long long)rt->disk_hits);
        tb__str_append(&s, "  Native::DiskCacheMiss: %llu\n", (unsigned long long)rt->disk_misses);
        tb__str_append(&s, "  Native::DiskCacheRejected: %llu\n",
                       (unsigned long long)rt->disk_rejected);
        tb__str_append(&s, "  Native::KernelLaunch: %llu\n",
                       (unsigned long long)rt->kernels_launched);
    }
    tb__mutex_unlock(&tb__native_mutex);
    text = tb__str_take(&s);
    if (text == NULL) {
        if (cap > 0) buf[0] = '\0';
        return 0;
    }
    n = strlen(text);
    if (cap > 0) {
        size_t k = n < cap - 1 ? n : cap - 1;
        memcpy(buf, text, k);
        buf[k] = '\0';
    }
    tb__free(text);
    return n;
}

static void tb__native_prepare_to_exit(void *user_data) {
    tb__native_rt *rt;
    (void)user_data;
    tb__mutex_lock(&tb__native_mutex);
    rt = tb__native_current;
    if (rt != NULL) {
        tb__native_cache_trim(rt, 0);
        tb__native_progs_trim(rt, 0);
        rt->exited = true;
        tb__native_current = NULL;
        tb__native_rt_unref(rt);
    }
    tb__mutex_unlock(&tb__native_mutex);
}

/* registers the "native" backend (called by tb__register_builtin_backends) */
static tb_status tb__native_register(void) {
    tb_backend_impl impl;
    memset(&impl, 0, sizeof impl);
    impl.prepare_to_exit = tb__native_prepare_to_exit;
    impl.supports_node = tb__native_supports_node;
    impl.data_from_host = tb__native_data_from_host;
    impl.data_from_scalar = tb__native_data_from_scalar;
    impl.data_to_host = tb__native_data_to_host;
    impl.data_release = tb__native_data_release;
    impl.data_map_host = tb__native_data_map_host;
    impl.create_lowering_context = tb__native_create_lowering_context;
    impl.release_lowering_context = tb__native_release_lowering_context;
    impl.compile = tb__native_compile;
    impl.execute = tb__native_execute;
    impl.release_computation = tb__native_release_computation;
    impl.computation_backend_text = tb__native_backend_text;
    impl.get_node_kernel = tb__native_get_node_kernel;
    impl.get_backend_devices = tb__native_get_backend_devices;
    impl.get_device_info = tb__native_get_device_info;
    impl.create_metrics_report = tb__native_metrics_report;
    return tb_backend_register("native", &impl, "");
}

#endif /* TB__HAVE_NATIVE */
