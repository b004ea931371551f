/* The compiled-backend suite, cache. Caches: scalars are parameters (no recompile), the program
   cache on disk and its checks of every file it reads, repeated kernels compiled once, the progress
   of first compiles, and a cache folder that is a file. Part of tests/backend_suite/suite.c. */

/* ---- scalars are parameters ---- */

static void test_scalars_do_not_recompile(void **state) {
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[8];
    tb_shape s = shp(TB_F32, 1, 8, 0, 0, 0);
    tb_tensor *x;
    int i, k;
    (void)state;
    REQUIRE_OPENCL();
    x = tb_tensor_from_host(a, &s, &g_ocl);
    tb_metrics_reset();
    for (k = 0; k < 3; k++) {
        tb_tensor *y = tb_mul_scalar(x, (double)k + 0.5);
        y = take(y, tb_add_scalar(y, -(double)k));
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        for (i = 0; i < 8; i++)
            assert_true(got[i] == a[i] * ((float)k + 0.5f) - (float)k);
        tb_tensor_release(y);
    }
    assert_int_equal(tb_metrics_counter("UncachedCompile"), 1);
    assert_int_equal(tb_metrics_counter("CachedCompile"), 2);
    /* many scalars (more than a device may take as kernel arguments) */
    tb_metrics_reset();
    for (k = 0; k < 2; k++) {
        tb_tensor *y = tb_tensor_retain(x);
        float expect[8];
        int j;
        for (i = 0; i < 8; i++)
            expect[i] = a[i];
        for (j = 0; j < 40; j++) {
            double m = 1.0 + (double)(j + k) / 64.0, c = (double)j / 1024.0;
            y = take(y, tb_mul_scalar(y, m));
            y = take(y, tb_add_scalar(y, c));
            for (i = 0; i < 8; i++)
                expect[i] = expect[i] * (float)m + (float)c;
        }
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        for (i = 0; i < 8; i++)
            assert_true(got[i] == expect[i]);
        tb_tensor_release(y);
    }
    assert_int_equal(tb_metrics_counter("UncachedCompile"), 1);
    assert_int_equal(tb_metrics_counter("CachedCompile"), 1);
    tb_tensor_release(x);
}

/* ---- the program cache on disk ---- */

static char g_cache_dir[256];

static int count_cache_files(const char *dir, char *first, size_t cap) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    if (d == NULL) return 0;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 6 && strcmp(e->d_name + len - 6, ".clbin") == 0) {
            if (n == 0 && first != NULL) snprintf(first, cap, "%s/%s", dir, e->d_name);
            n++;
        }
    }
    closedir(d);
    return n;
}

/* Runs one fixed graph in a fresh library state; returns its value's first element. */
static float run_fixed_graph(void) {
    float a[16], got[16];
    tb_shape s = shp(TB_F32, 2, 4, 4, 0, 0);
    tb_tensor *x, *y;
    int i;
    tb_device dev;
    for (i = 0; i < 16; i++)
        a[i] = (float)i * 0.25f - 1.0f;
    assert_int_equal(tb_device_make("opencl", 0, &dev), TB_OK);
    x = tb_tensor_from_host(a, &s, &dev);
    y = tb_matmul(x, x);
    y = take(y, tb_add_scalar(y, 0.125));
    y = take(y, tb_softmax(y, 1));
    if (tb_tensor_to_host(y, got, sizeof got) != TB_OK) fail_msg("%s", tb_last_error());
    tb_tensor_release(x);
    tb_tensor_release(y);
    return got[5];
}

/* The tests of the library's own program cache: PoCL's kernel cache left to the library's
   choice as if it were off (POCL_KERNEL_CACHE=0, which PoCL itself read at its start), so that
   program binaries are written (tb__ocl_driver_caches). */
#define REQUIRE_OUR_DISK_CACHE()                                                                   \
    do {                                                                                           \
        REQUIRE_OPENCL();                                                                          \
        setenv("POCL_KERNEL_CACHE", "0", 1);                                                       \
    } while (0)

/* Whether opencl:0 is PoCL's (the library's own test of it). */
static bool first_device_is_pocl(void) {
    tb__ocl_runtime *rt;
    bool pocl = false;
    tb__mutex_lock(&tb__ocl_mutex);
    rt = tb__ocl_runtime_get();
    if (rt != NULL && rt->proc.status == TB_OK && rt->num_devices > 0)
        pocl = strstr(rt->devices[0].platform_name, "Portable Computing Language") != NULL;
    tb__mutex_unlock(&tb__ocl_mutex);
    return pocl;
}

static void test_disk_cache(void **state) {
    char *old = getenv("TB_CACHE_DIR") != NULL ? strdup(getenv("TB_CACHE_DIR")) : NULL;
    char file[512];
    float first, again;
    (void)state;
    REQUIRE_OUR_DISK_CACHE();
    snprintf(g_cache_dir, sizeof g_cache_dir, "/tmp/tb_opencl_cache_XXXXXX");
    assert_non_null(mkdtemp(g_cache_dir));
    setenv("TB_CACHE_DIR", g_cache_dir, 1);

    restart_library();
    first = run_fixed_graph();
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheMiss"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 0);
    assert_int_equal(count_cache_files(g_cache_dir, file, sizeof file), 1);

    /* a fresh in-memory state: the binary comes from the disk */
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 0);

    /* a corrupt file is ignored, rebuilt and rewritten */
    {
        FILE *f = fopen(file, "r+b");
        assert_non_null(f);
        assert_int_equal(fseek(f, 70, SEEK_SET), 0);
        fputc(0x5a, f);
        fputc(0xa5, f);
        fclose(f);
    }
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 0);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 1);

    /* a truncated file, then a file of garbage, are ignored too */
    assert_int_equal(truncate(file, 30), 0);
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    {
        FILE *f = fopen(file, "wb");
        assert_non_null(f);
        fputs("TBOCLBIN this is not a program binary, only text that looks like a header....", f);
        fclose(f);
    }
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    assert_int_equal(count_cache_files(g_cache_dir, NULL, 0), 1);

#if defined(TB__OCL_DISK_CACHE) && TB__OCL_DISK_CACHE
    /* the right key and checksum around a binary the driver does not load */
    {
        static unsigned char bytes[1 << 22];
        size_t n, kn, bn;
        FILE *f = fopen(file, "rb");
        assert_non_null(f);
        n = fread(bytes, 1, sizeof bytes, f);
        fclose(f);
        assert_true(n > TB__OCL_BIN_HEADER && n < sizeof bytes);
        kn = (size_t)tb__ocl_get64(bytes + 32);
        assert_true(TB__OCL_BIN_HEADER + kn < n);
        bn = n - TB__OCL_BIN_HEADER - kn;
        memset(bytes + TB__OCL_BIN_HEADER + kn, 0x5a, bn);
        tb__ocl_put64(bytes + 48, tb__ocl_disk_checksum(bytes + TB__OCL_BIN_HEADER, kn,
                                                        bytes + TB__OCL_BIN_HEADER + kn, bn));
        f = fopen(file, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(bytes, 1, n, f), n);
        fclose(f);
    }
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 1);
#endif

    /* "off" disables it */
    setenv("TB_CACHE_DIR", "off", 1);
    restart_library();
    (void)run_fixed_graph();
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheMiss"), 0);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 0);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);

    remove(file);
    rmdir(g_cache_dir);
    if (old != NULL) {
        setenv("TB_CACHE_DIR", old, 1);
        free(old);
    } else {
        unsetenv("TB_CACHE_DIR");
    }
    restart_library();
    probe();
}

/* ---- the disk cache trusts no file it did not check ---- */

/* Saves TB_CACHE_DIR, points it at `dir` (created when `make` is set) and restarts. */
static char *cache_dir_begin(char *dir, size_t cap, bool make) {
    char *old = getenv("TB_CACHE_DIR") != NULL ? strdup(getenv("TB_CACHE_DIR")) : NULL;
    if (make) {
        snprintf(dir, cap, "/tmp/tb_opencl_cache_XXXXXX");
        assert_non_null(mkdtemp(dir));
    }
    setenv("TB_CACHE_DIR", dir, 1);
    restart_library();
    return old;
}

static void cache_dir_end(char *old) {
    if (old != NULL) {
        setenv("TB_CACHE_DIR", old, 1);
        free(old);
    } else {
        unsetenv("TB_CACHE_DIR");
    }
    restart_library();
    probe();
}

/* With PoCL's kernel cache on, the library writes no binary of PoCL's programs to its own
   cache (PoCL would compile every kernel again to serialise one); the results are the same. */
static void test_disk_cache_left_to_pocl(void **state) {
    char dir[64], *old;
    float first, again;
    (void)state;
    REQUIRE_OPENCL();
    unsetenv("POCL_KERNEL_CACHE");
    if (!first_device_is_pocl()) skip();
    old = cache_dir_begin(dir, sizeof dir, true);
    first = run_fixed_graph();
    assert_int_equal(count_cache_files(dir, NULL, 0), 0);
    restart_library();
    again = run_fixed_graph();
    assert_true(first == again);
    assert_int_equal(count_cache_files(dir, NULL, 0), 0);
    rmdir(dir);
    cache_dir_end(old);
}

/* Removes the files of a folder (not its subfolders), then the folder. */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[600];
    if (d != NULL) {
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* x + y (op 0) or x - y (op 1) of two fixed f32[4,4] inputs on opencl:0: both programs have
   one kernel of the same name and arguments. `got` gets the value; the expected one is
   checked here. */
static void run_pair(int op, float *got) {
    float a[16], b[16];
    tb_shape s = shp(TB_F32, 2, 4, 4, 0, 0);
    tb_tensor *x, *y, *z;
    tb_device dev;
    int i;
    for (i = 0; i < 16; i++) {
        a[i] = (float)i;
        b[i] = (float)(100 - 3 * i);
    }
    assert_int_equal(tb_device_make("opencl", 0, &dev), TB_OK);
    x = tb_tensor_from_host(a, &s, &dev);
    y = tb_tensor_from_host(b, &s, &dev);
    z = op == 0 ? tb_add(x, y) : tb_sub(x, y);
    if (tb_tensor_to_host(z, got, 16 * sizeof(float)) != TB_OK) fail_msg("%s", tb_last_error());
    for (i = 0; i < 16; i++) {
        float want = op == 0 ? a[i] + b[i] : a[i] - b[i];
        if (got[i] != want) fail_msg("element %d: %g, want %g", i, got[i], want);
    }
    tb_tensor_release(x);
    tb_tensor_release(y);
    tb_tensor_release(z);
}

/* The path of the only entry in `dir` (a fresh program was just run there). */
static void only_entry(const char *dir, char *path, size_t cap) {
    assert_int_equal(count_cache_files(dir, path, cap), 1);
}

static bool is_regular_file(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static size_t read_file(const char *path, unsigned char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n;
    assert_non_null(f);
    n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static void write_file(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* An entry named like another program's and carrying that name's key hash in its header,
   with a binary of a different source: the full key it holds does not match, so it is not
   run; it is removed, counted, rebuilt and rewritten. */
static void test_disk_cache_forged_entry(void **state) {
    static unsigned char bytes[1 << 22];
    char dir[256], sub_path[512], add_path[512], hex[17];
    const char *name;
    float got[16];
    size_t n;
    int half, i;
    char *old;
    (void)state;
    REQUIRE_OUR_DISK_CACHE();
    old = cache_dir_begin(dir, sizeof dir, true);
    run_pair(1, got);
    only_entry(dir, sub_path, sizeof sub_path);
    n = read_file(sub_path, bytes, sizeof bytes);
    assert_true(n > 64 && n < sizeof bytes);
    assert_int_equal(remove(sub_path), 0);
    restart_library();
    run_pair(0, got);
    only_entry(dir, add_path, sizeof add_path);
    /* the x - y binary, under the x + y name, with the name's hash in the header */
    name = strrchr(add_path, '/') + 1;
    for (half = 0; half < 2; half++) {
        uint64_t v;
        memcpy(hex, name + 16 * half, 16);
        hex[16] = '\0';
        v = strtoull(hex, NULL, 16);
        for (i = 0; i < 8; i++)
            bytes[16 + 8 * half + i] = (unsigned char)(v >> (8 * i));
    }
    write_file(add_path, bytes, n);
    restart_library();
    run_pair(0, got); /* checks the values */
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 0);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    /* the rebuilt entry replaced it */
    restart_library();
    run_pair(0, got);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 0);
    assert_int_equal(count_cache_files(dir, NULL, 0), 1);
    remove_dir(dir);
    cache_dir_end(old);
}

static void fifo_hang(int sig) {
    static const char message[] = "\ntest_opencl: hung opening a FIFO in the cache folder\n";
    (void)sig;
    if (write(2, message, sizeof message - 1) < 0) _exit(4);
    _exit(3);
}

/* A FIFO where an entry belongs: opening it would wait for a writer forever. It is rejected
   without blocking and the rebuilt entry, a regular file, takes its place. The alarm turns a
   hang into a failure. */
static void test_disk_cache_fifo_entry(void **state) {
    char dir[256], path[512];
    float got[16];
    char *old;
    (void)state;
    REQUIRE_OUR_DISK_CACHE();
    old = cache_dir_begin(dir, sizeof dir, true);
    run_pair(0, got);
    only_entry(dir, path, sizeof path);
    assert_int_equal(remove(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    restart_library();
    signal(SIGALRM, fifo_hang);
    alarm(120);
    run_pair(0, got);
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 1);
    assert_true(is_regular_file(path));
    remove_dir(dir);
    cache_dir_end(old);
}

/* Symbolic links at an entry's path and at the temporary paths its writer tries: none is
   followed (the file they point at keeps its bytes); entries are written as regular files. */
static void test_disk_cache_symlinks(void **state) {
    static const char precious[] = "not a cache entry: leave me alone\n";
    char dir[256], other[256], victim[512], path[512], links[8][600];
    unsigned char bytes[256];
    const char *name;
    float got[16];
    unsigned first;
    char *old;
    int i;
    (void)state;
    REQUIRE_OUR_DISK_CACHE();
    snprintf(other, sizeof other, "/tmp/tb_opencl_victim_XXXXXX");
    assert_non_null(mkdtemp(other));
    snprintf(victim, sizeof victim, "%s/precious.txt", other);
    write_file(victim, precious, sizeof precious - 1);
    old = cache_dir_begin(dir, sizeof dir, true);
    run_pair(0, got);
    only_entry(dir, path, sizeof path);
    name = strrchr(path, '/') + 1;

    /* the entry's path: read through O_NOFOLLOW, replaced by a rename */
    assert_int_equal(remove(path), 0);
    assert_int_equal(symlink(victim, path), 0);
    restart_library();
    run_pair(0, got);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheRejected"), 1);
    assert_true(is_regular_file(path));
    assert_int_equal(read_file(victim, bytes, sizeof bytes), sizeof precious - 1);
    assert_memory_equal(bytes, precious, sizeof precious - 1);

    /* the temporary paths the writer tries next: created with O_EXCL, so never followed */
    assert_int_equal(remove(path), 0);
    restart_library();
    first = tb__disk_counter;
    for (i = 0; i < 8; i++) {
        snprintf(links[i], sizeof links[i], "%s/.%.32s.%ld.%u.tmp", dir, name, (long)getpid(),
                 first + (unsigned)i);
        assert_int_equal(symlink(victim, links[i]), 0);
    }
    run_pair(0, got);
    assert_int_equal(read_file(victim, bytes, sizeof bytes), sizeof precious - 1);
    assert_memory_equal(bytes, precious, sizeof precious - 1);
    assert_true(is_regular_file(path));
    restart_library();
    run_pair(0, got);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 1);
    for (i = 0; i < 8; i++)
        unlink(links[i]);
    remove_dir(dir);
    remove_dir(other);
    cache_dir_end(old);
}

static char g_dir_log[4096];

static void capture_dir_log(tb_log_level level, const char *message, void *user_data) {
    size_t n = strlen(g_dir_log);
    (void)level;
    (void)user_data;
    snprintf(g_dir_log + n, sizeof g_dir_log - n, "%s\n", message);
}

/* The folders the cache creates are private (0700); an existing folder that others may write
   to is not used, and TB_DEBUG says so once. */
static void test_disk_cache_private_folder(void **state) {
    char base[256], mid[300], dir[320];
    const char *at;
    float got[16];
    struct stat st;
    tb_desc desc;
    int times = 0;
    char *old;
    (void)state;
    REQUIRE_OUR_DISK_CACHE();
    snprintf(base, sizeof base, "/tmp/tb_opencl_cache_XXXXXX");
    assert_non_null(mkdtemp(base));
    snprintf(mid, sizeof mid, "%s/new", base);
    snprintf(dir, sizeof dir, "%s/cache", mid);
    old = cache_dir_begin(dir, sizeof dir, false);
    run_pair(0, got);
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(stat(mid, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(count_cache_files(dir, NULL, 0), 1);

    /* writable by the group and the world: ignored */
    assert_int_equal(chmod(dir, 0777), 0);
    tb_shutdown();
    memset(&desc, 0, sizeof desc);
    desc.debug = 1;
    desc.logger.func = capture_dir_log;
    g_dir_log[0] = '\0';
    assert_int_equal(tb_setup(&desc), TB_OK);
    run_pair(0, got);
    run_pair(1, got);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheHit"), 0);
    assert_int_equal(tb_metrics_counter("OpenCL::DiskCacheMiss"), 0);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 2);
    assert_int_equal(count_cache_files(dir, NULL, 0), 1);
    for (at = g_dir_log; (at = strstr(at, dir)) != NULL; at++)
        times++;
    if (times != 1) fail_msg("the folder is named %d times in the log:\n%s", times, g_dir_log);
    assert_non_null(strstr(g_dir_log, "writable by others"));
    remove_dir(dir);
    rmdir(mid);
    rmdir(base);
    cache_dir_end(old);
}

/* Two programs whose keys collide (the hook keeps no bit of the key): the in-memory program
   cache compares the source too, so the second is built, not found. */
static void test_program_cache_key_collision(void **state) {
    char off[] = "off";
    float got[16];
    char *old;
    (void)state;
    REQUIRE_OPENCL();
    old = cache_dir_begin(off, sizeof off, false);
    tb__ocl_program_key_mask = 0;
    run_pair(0, got);
    run_pair(1, got); /* checks the values */
    tb__ocl_program_key_mask = ~(uint64_t)0;
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramBuild"), 2);
    assert_int_equal(tb_metrics_counter("OpenCL::ProgramKeyCollision"), 1);
    cache_dir_end(old);
}

/* Two kernels doing the same work on other buffers: one function in the program. */
static void test_repeated_kernels_once(void **state) {
    tb_shape s = shp(TB_F32, 2, 64, 48, 0, 0);
    tb_tensor *a[2], *b[2], *y[2][2];
    int d;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 2; d++) {
        const tb_device *dev = d ? &g_ocl : &g_cpu;
        tb_tensor *ea, *eb;
        tb_manual_seed(3);
        a[d] = tb_rand(&s, dev);
        b[d] = tb_rand(&s, dev);
        assert_int_equal(tb_sync(a + d, 1), TB_OK);
        assert_int_equal(tb_sync(b + d, 1), TB_OK);
        ea = tb_exp(a[d]);
        eb = tb_exp(b[d]);
        y[d][0] = tb_mul_scalar(ea, 2.0);
        y[d][1] = tb_mul_scalar(eb, 2.0);
        tb_tensor_release(ea);
        tb_tensor_release(eb);
    }
    assert_int_equal(kernel_count(y[1], 2), 1);
    compare_tensors("first of two repeated kernels", y[0][0], y[1][0]);
    compare_tensors("second of two repeated kernels", y[0][1], y[1][1]);
    for (d = 0; d < 2; d++) {
        tb_tensor_release(y[d][0]);
        tb_tensor_release(y[d][1]);
        tb_tensor_release(a[d]);
        tb_tensor_release(b[d]);
    }
}

/* Kernels that differ only in the scalars they read (more scalars than arguments take: a
   table of them) share one function, each reading its own values. */
static void test_repeated_kernels_other_scalars(void **state) {
    enum { N = 20 };
    tb_shape s = shp(TB_F32, 2, 8, 33, 0, 0);
    tb_tensor *x[2][N], *y[2][N];
    int d, i;
    (void)state;
    REQUIRE_OPENCL();
    for (d = 0; d < 2; d++) {
        const tb_device *dev = d ? &g_ocl : &g_cpu;
        tb_manual_seed(5);
        for (i = 0; i < N; i++) {
            tb_tensor *t;
            x[d][i] = tb_rand(&s, dev);
            assert_int_equal(tb_sync(&x[d][i], 1), TB_OK);
            t = tb_mul_scalar(x[d][i], 0.25 + i); /* one scalar each: 20 in the graph */
            y[d][i] = tb_add_scalar(t, -1.5 * i);
            tb_tensor_release(t);
        }
    }
    assert_int_equal(kernel_count(y[1], N), 1);
    for (i = 0; i < N; i++) {
        char what[64];
        snprintf(what, sizeof what, "kernel %d of %d with its own scalars", i, N);
        compare_tensors(what, y[0][i], y[1][i]);
    }
    for (d = 0; d < 2; d++) {
        for (i = 0; i < N; i++) {
            tb_tensor_release(y[d][i]);
            tb_tensor_release(x[d][i]);
        }
    }
}

/* ---- progress of first compiles ---- */

typedef struct progress_log {
    int count, begins, ends;
    tb_progress events[64];
    char device[64];
} progress_log;

static void record_progress(const tb_progress *p, void *user_data) {
    progress_log *log = (progress_log *)user_data;
    if (log->count < 64) log->events[log->count] = *p;
    log->count++;
    log->begins += p->stage == TB_PROGRESS_BEGIN;
    log->ends += p->stage == TB_PROGRESS_END;
    snprintf(log->device, sizeof log->device, "%s", p->device);
}

/* A graph's first compile reports BEGIN, its kernels as they become ready (never fewer than
   before, never more than its distinct kernels) and END once its first run is done; the same
   graph again, from the computation cache, reports nothing. */
static void test_compile_progress(void **state) {
    static progress_log log;
    tb_desc desc;
    float a[120], got[120];
    tb_shape s = shp(TB_F32, 2, 3, 40, 0, 0);
    tb_tensor *x, *y;
    char want[64];
    int32_t ax = 1;
    int rep, i;
    (void)state;
    REQUIRE_OPENCL();
    tb_shutdown();
    memset(&desc, 0, sizeof desc);
    memset(&log, 0, sizeof log);
    desc.progress.func = record_progress;
    desc.progress.user_data = &log;
    assert_int_equal(tb_setup(&desc), TB_OK);
    fill(a, &s, R_ANY, 0);
    for (rep = 0; rep < 2; rep++) {
        x = tb_tensor_from_host(a, &s, &g_ocl);
        y = tb_exp(x);
        y = take(y, tb_sum(y, &ax, 1, true));
        y = take(y, tb_mul(y, x)); /* a reduction kernel, then an elementwise kernel */
        assert_int_equal(tb_tensor_to_host(y, got, sizeof got), TB_OK);
        if (rep == 0) {
            const int kernels = 2; /* R_3_40 E_120, as in test_debug_lines */
            const tb_progress *last = &log.events[log.count - 1];
            assert_true(log.count >= 3 && log.count < 64);
            assert_int_equal(log.begins, 1);
            assert_int_equal(log.ends, 1);
            assert_int_equal(log.events[0].stage, TB_PROGRESS_BEGIN);
            assert_int_equal(last->stage, TB_PROGRESS_END);
            assert_int_equal(last->status, TB_OK);
            assert_int_equal(last->kernels_total, (size_t)kernels);
            assert_int_equal(last->kernels_done, (size_t)kernels);
            assert_true(last->seconds >= 0.0);
            for (i = 1; i < log.count - 1; i++) {
                assert_int_equal(log.events[i].stage, TB_PROGRESS_KERNELS);
                assert_int_equal(log.events[i].kernels_total, (size_t)kernels);
                assert_true(log.events[i].kernels_done >= log.events[i - 1].kernels_done);
                assert_true(log.events[i].kernels_done <= (size_t)kernels);
                assert_true(log.events[i].seconds >= log.events[i - 1].seconds);
            }
            assert_int_equal(log.events[0].graph_hash, last->graph_hash);
            tb_device_format(&g_ocl, want, sizeof want);
            assert_string_equal(log.device, want);
        } else {
            assert_int_equal(log.begins, 1); /* nothing more: the cache had it */
            assert_int_equal(log.ends, 1);
        }
        tb_tensor_release(x);
        tb_tensor_release(y);
    }
    restart_library();
    probe();
}

/* A cache folder that is a file: the warning gives that reason, not the errno a successful
   call left behind ("File exists" from the mkdir before it). */
static void test_cache_dir_is_a_file(void **state) {
    char *old = getenv("TB_CACHE_DIR") != NULL ? strdup(getenv("TB_CACHE_DIR")) : NULL;
    char file[64], expected[256];
    tb_desc desc;
    int fd;
    (void)state;
    REQUIRE_OPENCL();
    snprintf(file, sizeof file, "/tmp/tb_cache_file_XXXXXX");
    fd = mkstemp(file);
    assert_true(fd >= 0);
    close(fd);
    setenv("TB_CACHE_DIR", file, 1);
    tb_shutdown();
    memset(&desc, 0, sizeof desc);
    desc.logger.func = capture_log;
    g_log[0] = '\0';
    assert_int_equal(tb_setup(&desc), TB_OK);
    (void)run_fixed_graph();
    snprintf(expected, sizeof expected,
             "opencl: the program cache folder %s is not usable: not a folder\n", file);
    if (strstr(g_log, expected) == NULL) fail_msg("the log: %s", g_log);
    remove(file);
    if (old != NULL) {
        setenv("TB_CACHE_DIR", old, 1);
        free(old);
    } else {
        unsetenv("TB_CACHE_DIR");
    }
    restart_library();
    probe();
}

/* in the order they run */
static const struct CMUnitTest cache_tests[] = {
    cmocka_unit_test(test_scalars_do_not_recompile),
    cmocka_unit_test(test_repeated_kernels_once),
    cmocka_unit_test(test_repeated_kernels_other_scalars),
    cmocka_unit_test(test_compile_progress),
    OPENCL_ONLY(test_disk_cache_left_to_pocl),
    OPENCL_ONLY(test_disk_cache),
    OPENCL_ONLY(test_disk_cache_forged_entry),
    OPENCL_ONLY(test_disk_cache_fifo_entry),
    OPENCL_ONLY(test_disk_cache_symlinks),
    OPENCL_ONLY(test_disk_cache_private_folder),
    OPENCL_ONLY(test_program_cache_key_collision),
    OPENCL_ONLY(test_cache_dir_is_a_file),
};
