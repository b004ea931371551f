/* ===========================================================================================
   Native backend: its thread pool. One job at a time: a kernel's work items split into
   chunks, taken by the pool's threads and the caller from a shared counter.
   =========================================================================================== */
#include "../../impl_begin.h"

#if defined(TB__HAVE_NATIVE)

/* On Linux the pool's threads are kept off the core the caller runs on (tb__native_place): the
   caller works on the job as soon as it has woken them, and when all have slept (a pause
   between calls) the scheduler may queue a woken thread on the caller's own core, where both
   then share that core for the whole job (and the next ones) while another sits idle. Each
   thread may run on the CPUs the caller may run on, less the caller's: a process or thread
   that is pinned (taskset, sched_setaffinity) keeps its pool within its CPUs. */

#if defined(__linux__)
typedef int (*tb__native_getcpu_fn)(void);
#endif

struct tb__native_pool { /* tb__native_pool (native_internal.h) */
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
};

/* How long a pool thread that has finished a job watches for the next one, and the caller for
   the threads to finish theirs, before sleeping on the condition variable: a training step of
   the small GPT launches about 500 kernels, some tens of microseconds apart, and a wake-up
   through the kernel's scheduler on each of them took a sixth of its time (a context switch
   each way). Idle, a thread gives that much time to watching after each job. */
#define TB__NATIVE_SPIN_NS 100000

static void tb__native_relax(void) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_ia32_pause();
#elif defined(__GNUC__) && defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Watches *word until it is no longer `value` (true) or the spin time ends (false). */
static bool tb__native_spin(const uint64_t *word, uint64_t value, const bool *stop) {
    uint64_t start = 0;
    unsigned i;
    for (i = 0;; i++) {
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != value) return true;
        if (stop != NULL && __atomic_load_n(stop, __ATOMIC_ACQUIRE)) return true;
        if ((i & 63u) == 0) {
            uint64_t now = tb__now_ns();
            if (start == 0) start = now;
            if (now - start > TB__NATIVE_SPIN_NS) return false;
        }
        tb__native_relax();
    }
}

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
        if (!p->stop && p->generation == seen) {
            pthread_mutex_unlock(&p->lock);
            (void)tb__native_spin(&p->generation, seen, &p->stop);
            pthread_mutex_lock(&p->lock);
        }
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->wake, &p->lock);
        if (p->stop) break;
        seen = p->generation;
        fn = p->fn;
        args = p->args;
        pthread_mutex_unlock(&p->lock);
        tb__native_work(p, fn, args);
        pthread_mutex_lock(&p->lock);
        if (__atomic_sub_fetch(&p->running, 1, __ATOMIC_ACQ_REL) == 0)
            pthread_cond_signal(&p->done);
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
    __atomic_store_n(&p->stop, true, __ATOMIC_RELEASE);
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
    __atomic_store_n(&p->running, p->num_threads, __ATOMIC_RELEASE);
    __atomic_add_fetch(&p->generation, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    tb__native_work(p, fn, args);
    {
        uint64_t start = tb__now_ns();
        while (__atomic_load_n(&p->running, __ATOMIC_ACQUIRE) > 0 &&
               tb__now_ns() - start <= TB__NATIVE_SPIN_NS)
            tb__native_relax();
    }
    pthread_mutex_lock(&p->lock);
    while (p->running > 0)
        pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

#endif /* TB__HAVE_NATIVE */
