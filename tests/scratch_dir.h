/* The scratch folder of a file-format test: scratch_make in the group setup, path_of for the
   files in it, scratch_remove in the group teardown (the library is shut down, then the folder
   goes with everything in it). Included after cmocka.h and torch_backend.h. */
#ifndef TB_TESTS_SCRATCH_DIR_H
#define TB_TESTS_SCRATCH_DIR_H

#if defined(__GNUC__) || defined(__clang__)
#define SCRATCH_UNUSED __attribute__((unused)) /* a test may use only some of what is here */
#else
#define SCRATCH_UNUSED
#endif

static char tmpdir[256];

/* A fresh folder /tmp/<name>_XXXXXX; 0, or -1 when it cannot be made. */
static SCRATCH_UNUSED int scratch_make(const char *name) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/%s_XXXXXX", name);
    return mkdtemp(tmpdir) == NULL ? -1 : 0;
}

static SCRATCH_UNUSED int scratch_remove(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    tb_shutdown();
    return system(cmd) == 0 ? 0 : -1;
}

/* A path in the folder; four rotating buffers so a call can use several at once. */
static SCRATCH_UNUSED const char *path_of(const char *name) {
    static char bufs[4][512];
    static int next;
    char *buf = bufs[next++ % 4];
    int n = snprintf(buf, sizeof bufs[0], "%s/%s", tmpdir, name);
    assert_true(n > 0 && (size_t)n < sizeof bufs[0]);
    return buf;
}

static SCRATCH_UNUSED void write_bytes(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    fclose(f);
}

#endif
