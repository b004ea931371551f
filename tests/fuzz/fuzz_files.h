/* Shared by the harnesses of the model-file readers (fuzz_safetensors.c, fuzz_npz.c,
   fuzz_idx.c). The readers take a path, so an input is written to a file in a private folder
   (made on first use under $TMPDIR, else /tmp, and removed with its files when the process
   exits) and loaded from there, through the memory mapping a user's load goes through.

   What a load gave is then used as a user would: every tensor's bytes are read back, cast to
   f64 by an op (the cast reads the file's bytes in place where the loader did not copy them)
   and compared with the harness's own conversion, and one tensor is kept past the set that
   held it. A load that fails must fail with one of the statuses the reader documents and a
   message that names the reader. */
#ifndef TB_FUZZ_FILES_H
#define TB_FUZZ_FILES_H

#include "fuzz_common.h"

#include <dirent.h>
#include <unistd.h>

/* A tensor of more elements is read back but not cast (the cast would copy it once more). */
#define FILES_MAX_CAST 4096

static char files_dir_path[512];

static void files_dir_remove(void) {
    DIR *dir;
    struct dirent *entry;
    char path[1024];
    if (files_dir_path[0] == '\0') return;
    dir = opendir(files_dir_path);
    if (dir != NULL) {
        while ((entry = readdir(dir)) != NULL) {
            if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
            snprintf(path, sizeof path, "%s/%s", files_dir_path, entry->d_name);
            unlink(path);
        }
        closedir(dir);
    }
    rmdir(files_dir_path);
    files_dir_path[0] = '\0';
}

/* `name` inside the private folder, into path[1024]. */
static FUZZ_UNUSED void files_path(char *path, const char *name) {
    if (files_dir_path[0] == '\0') {
        const char *tmp = getenv("TMPDIR");
        snprintf(files_dir_path, sizeof files_dir_path, "%s/tb_fuzz_XXXXXX",
                 tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
        if (mkdtemp(files_dir_path) == NULL) {
            files_dir_path[0] = '\0';
            fuzz_fail("cannot make a folder for the inputs under %s", tmp ? tmp : "/tmp");
        }
        atexit(files_dir_remove);
    }
    snprintf(path, 1024, "%s/%s", files_dir_path, name);
}

/* Writes `size` bytes to `name` in the private folder; its path into path[1024]. */
static FUZZ_UNUSED void files_write(char *path, const char *name, const uint8_t *data,
                                    size_t size) {
    FILE *f;
    files_path(path, name);
    f = fopen(path, "wb");
    if (f == NULL || (size > 0 && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
        fuzz_fail("cannot write %s", path);
}

/* The whole of a file the library wrote (NULL when it cannot be read); free it. */
static FUZZ_UNUSED uint8_t *files_read(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    uint8_t *data = NULL;
    size_t cap = 0, n = 0;
    if (f == NULL) return NULL;
    for (;;) {
        size_t got;
        if (n == cap) {
            uint8_t *bigger;
            cap = cap ? 2 * cap : 4096;
            bigger = (uint8_t *)realloc(data, cap);
            if (bigger == NULL) {
                free(data);
                fclose(f);
                return NULL;
            }
            data = bigger;
        }
        got = fread(data + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    *size = n;
    return data;
}

/* A failed load: one of the statuses in `allowed` (ending with TB_OK), and a message that
   names the reader `fn` (an allocation that failed may be named by the allocator instead). */
static FUZZ_UNUSED void files_check_failure(const char *fn, const tb_status *allowed,
                                            const char *what) {
    tb_status st = tb_last_status();
    size_t n = strlen(fn);
    const char *message = tb_last_error();
    for (; *allowed != TB_OK; allowed++)
        if (*allowed == st) break;
    if (*allowed == TB_OK) fuzz_fail("%s: the load failed with %s", what, tb_status_string(st));
    if (st != TB_ERR_OUT_OF_MEMORY && (strncmp(message, fn, n) != 0 || message[n] != ':'))
        fuzz_fail("%s: the message '%s' does not name %s", what, message, fn);
}

/* IEEE half and bfloat16 bits as a double. */
static double files_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 31u, man = h & 1023u, bits;
    float f;
    if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else {
        f = (float)man / 16777216.0f; /* a subnormal: man * 2^-24, exact in a float */
        return (h & 0x8000u) ? -(double)f : (double)f;
    }
    memcpy(&f, &bits, 4);
    return (double)f;
}

static double files_bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return (double)f;
}

/* Element `i` of host bytes of `dtype` (in host order) as a double. */
static double files_element(const unsigned char *host, tb_dtype dtype, size_t i) {
    switch (dtype) {
    case TB_F32: {
        float v;
        memcpy(&v, host + 4 * i, 4);
        return (double)v;
    }
    case TB_F64: {
        double v;
        memcpy(&v, host + 8 * i, 8);
        return v;
    }
    case TB_I32: {
        int32_t v;
        memcpy(&v, host + 4 * i, 4);
        return (double)v;
    }
    case TB_I64: {
        int64_t v;
        memcpy(&v, host + 8 * i, 8);
        return (double)v;
    }
    case TB_F16:
    case TB_BF16: {
        uint16_t v;
        memcpy(&v, host + 2 * i, 2);
        return dtype == TB_F16 ? files_f16(v) : files_bf16(v);
    }
    default: /* TB_U8, TB_BOOL */
        return (double)host[i];
    }
}

/* The tensor's value as host bytes (malloc'ed, at least one byte; free it), checked: a valid
   shape, bools 0 or 1, and for a small tensor the same values through a cast to f64. */
static FUZZ_UNUSED unsigned char *files_touch(tb_tensor *t, size_t *nbytes, const char *what) {
    tb_shape shape = tb_tensor_shape(t), wide;
    unsigned char *host;
    size_t i, count;
    *nbytes = 0;
    if (tb_shape_validate(&shape) != TB_OK || tb_shape_nbytes(&shape, nbytes) != TB_OK)
        fuzz_fail("%s: loaded an invalid shape", what);
    host = (unsigned char *)malloc(*nbytes ? *nbytes : 1);
    if (host == NULL) fuzz_fail("%s: malloc of %zu bytes", what, *nbytes);
    if (tb_tensor_to_host(t, host, *nbytes) != TB_OK) fuzz_fail("%s: tb_tensor_to_host", what);
    count = *nbytes / tb_dtype_size(shape.dtype);
    if (shape.dtype == TB_BOOL)
        for (i = 0; i < count; i++)
            if (host[i] > 1) fuzz_fail("%s: bool element %zu holds %u", what, i, host[i]);
    /* an empty tensor may have dims that only a narrower dtype allows (the size rule of
       tb_shape_make reads its 0 dims as 1): its cast must then fail, with TB_ERR_OVERFLOW */
    if (count == 0 && tb_shape_make(&wide, TB_F64, shape.rank, shape.dims) != TB_OK) {
        tb_tensor *cast = tb_cast(t, TB_F64);
        if (cast != NULL || tb_last_status() != TB_ERR_OVERFLOW)
            fuzz_fail("%s: the cast of an empty tensor to an f64 shape that overflows gave %s",
                      what, cast != NULL ? "a tensor" : tb_status_string(tb_last_status()));
        tb_clear_error();
    } else if (count <= FILES_MAX_CAST) {
        tb_tensor *cast = tb_cast(t, TB_F64);
        double *values = (double *)malloc(count ? count * sizeof(double) : 1);
        if (cast == NULL || values == NULL) fuzz_fail("%s: tb_cast to f64", what);
        if (tb_tensor_to_host(cast, values, count * sizeof(double)) != TB_OK)
            fuzz_fail("%s: tb_tensor_to_host of the cast", what);
        for (i = 0; i < count; i++) {
            double want = files_element(host, shape.dtype, i);
            if (want != values[i] && !(want != want && values[i] != values[i]))
                fuzz_fail("%s: element %zu is %.17g, cast to f64 it gives %.17g", what, i, want,
                          values[i]);
        }
        free(values);
        tb_tensor_release(cast);
    }
    return host;
}

/* Every tensor of the set checked (files_touch), then the first one kept past the set: the set
   is freed and the tensor must still give the same bytes. Frees the set. */
static FUZZ_UNUSED void files_touch_set_and_free(tb_tensor_set *set, const char *what) {
    size_t i, count = tb_tensor_set_count(set), first_bytes = 0;
    unsigned char *first = NULL;
    tb_tensor *kept = NULL;
    for (i = 0; i < count; i++) {
        const char *name = tb_tensor_set_name(set, i);
        tb_tensor *t = tb_tensor_set_tensor(set, i);
        size_t nbytes;
        unsigned char *host;
        if (name == NULL || t == NULL || name[0] == '\0')
            fuzz_fail("%s: tensor %zu has no name or no tensor", what, i);
        if (tb_tensor_set_get(set, name) != t)
            fuzz_fail("%s: tb_tensor_set_get('%s') finds another tensor", what, name);
        host = files_touch(t, &nbytes, what);
        if (i == 0) {
            first = host;
            first_bytes = nbytes;
        } else {
            free(host);
        }
    }
    for (i = 0; i < tb_tensor_set_metadata_count(set); i++) {
        const char *key = tb_tensor_set_metadata_key(set, i);
        if (key == NULL || tb_tensor_set_metadata(set, key) == NULL)
            fuzz_fail("%s: metadata entry %zu cannot be read back", what, i);
    }
    if (count > 0) kept = tb_tensor_retain(tb_tensor_set_tensor(set, 0));
    tb_tensor_set_free(set);
    if (kept != NULL) {
        unsigned char *again = (unsigned char *)malloc(first_bytes ? first_bytes : 1);
        if (again == NULL) fuzz_fail("%s: malloc", what);
        if (tb_tensor_to_host(kept, again, first_bytes) != TB_OK ||
            memcmp(again, first, first_bytes) != 0)
            fuzz_fail("%s: a tensor kept past its set changed", what);
        free(again);
        tb_tensor_release(kept);
    }
    free(first);
}

/* Whether two sets hold the same names, shapes, values and metadata, in the same order. */
static FUZZ_UNUSED void files_check_same_sets(tb_tensor_set *a, tb_tensor_set *b,
                                              const char *what) {
    size_t i, count = tb_tensor_set_count(a);
    if (tb_tensor_set_count(b) != count)
        fuzz_fail("%s: %zu tensors, then %zu", what, count, tb_tensor_set_count(b));
    for (i = 0; i < count; i++) {
        tb_tensor *x = tb_tensor_set_tensor(a, i), *y = tb_tensor_set_tensor(b, i);
        tb_shape sx = tb_tensor_shape(x), sy = tb_tensor_shape(y);
        size_t nx = 0, ny = 0;
        unsigned char *hx, *hy;
        if (strcmp(tb_tensor_set_name(a, i), tb_tensor_set_name(b, i)) != 0)
            fuzz_fail("%s: tensor %zu is named '%s', then '%s'", what, i, tb_tensor_set_name(a, i),
                      tb_tensor_set_name(b, i));
        if (!tb_shape_equal(&sx, &sy)) fuzz_fail("%s: tensor %zu changed its shape", what, i);
        tb_shape_nbytes(&sx, &nx);
        tb_shape_nbytes(&sy, &ny);
        hx = (unsigned char *)malloc(nx ? nx : 1);
        hy = (unsigned char *)malloc(ny ? ny : 1);
        if (hx == NULL || hy == NULL) fuzz_fail("%s: malloc", what);
        if (tb_tensor_to_host(x, hx, nx) != TB_OK || tb_tensor_to_host(y, hy, ny) != TB_OK)
            fuzz_fail("%s: tb_tensor_to_host", what);
        if (nx != ny || memcmp(hx, hy, nx) != 0)
            fuzz_fail("%s: tensor '%s' changed its values", what, tb_tensor_set_name(a, i));
        free(hx);
        free(hy);
    }
    if (tb_tensor_set_metadata_count(a) != tb_tensor_set_metadata_count(b))
        fuzz_fail("%s: the metadata changed its size", what);
    for (i = 0; i < tb_tensor_set_metadata_count(a); i++) {
        const char *key = tb_tensor_set_metadata_key(a, i);
        const char *other = tb_tensor_set_metadata(b, key);
        if (other == NULL || strcmp(other, tb_tensor_set_metadata(a, key)) != 0)
            fuzz_fail("%s: metadata '%s' changed", what, key);
    }
}

/* Writes the set with `save`, loads the file back with `load` (the same set), writes that
   again and compares: the two files must be the same bytes. Returns false, with the save's
   error left, when the first save fails. */
static FUZZ_UNUSED bool files_round_trip(tb_tensor_set *set,
                                         tb_status (*save)(const char *, const tb_tensor_set *),
                                         tb_tensor_set *(*load)(const char *, const tb_device *),
                                         const char *what) {
    char first[1024], second[1024];
    uint8_t *a, *b;
    size_t na = 0, nb = 0;
    tb_tensor_set *again;
    files_path(first, "saved_once");
    files_path(second, "saved_twice");
    tb_clear_error();
    if (save(first, set) != TB_OK) return false;
    again = load(first, NULL);
    if (again == NULL) fuzz_fail("%s: a file the library wrote does not load", what);
    files_check_same_sets(set, again, what);
    if (save(second, again) != TB_OK) fuzz_fail("%s: the second save failed", what);
    a = files_read(first, &na);
    b = files_read(second, &nb);
    if (a == NULL || b == NULL) fuzz_fail("%s: cannot read the saved files back", what);
    if (na != nb || memcmp(a, b, na) != 0)
        fuzz_fail("%s: saving what was loaded from a saved file gives other bytes", what);
    free(a);
    free(b);
    tb_tensor_set_free(again);
    return true;
}

#endif /* TB_FUZZ_FILES_H */
