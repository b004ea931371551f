/* libFuzzer harness: the input is a .npy file. Each input is loaded twice, once from a memory
   stream of known size (the fseek/ftell path) and once from a pipe (a stream of unknown size,
   read in growing chunks); both must agree. A load either fails with TB_ERR_FORMAT (or
   TB_ERR_OUT_OF_MEMORY) and an error message, or gives a tensor whose byte size is exactly what
   follows the header, and whose bytes are the file's (bool bytes folded to 0 or 1). */
#include "fuzz_common.h"

#include <unistd.h>

/* The .npy header length of a file that loaded (its preamble is valid then). */
static size_t npy_data_offset(const uint8_t *data) {
    size_t header_len = (size_t)data[8] | ((size_t)data[9] << 8);
    if (data[6] == 1) return 10 + header_len;
    header_len |= ((size_t)data[10] << 16) | ((size_t)data[11] << 24);
    return 12 + header_len;
}

static void npy_check(tb_tensor *t, const uint8_t *data, size_t size, const char *how) {
    tb_shape shape;
    size_t nbytes = 0, offset, i;
    unsigned char *host;
    if (t == NULL) {
        tb_status st = tb_last_status();
        if (st != TB_ERR_FORMAT && st != TB_ERR_OUT_OF_MEMORY)
            fuzz_fail("%s: load failed with %s", how, tb_status_string(st));
        if (strncmp(tb_last_error(), "tb_npy_load: ", 13) != 0)
            fuzz_fail("%s: message '%s'", how, tb_last_error());
        return;
    }
    shape = tb_tensor_shape(t);
    if (tb_shape_validate(&shape) != TB_OK || tb_shape_nbytes(&shape, &nbytes) != TB_OK)
        fuzz_fail("%s: loaded an invalid shape", how);
    offset = npy_data_offset(data);
    if (offset > size || size - offset != nbytes)
        fuzz_fail("%s: %zu data bytes after the header, the tensor holds %zu", how, size - offset,
                  nbytes);
    host = (unsigned char *)malloc(nbytes ? nbytes : 1);
    if (host == NULL) return;
    if (tb_tensor_to_host(t, host, nbytes) != TB_OK) fuzz_fail("%s: to_host", how);
    if (shape.dtype == TB_BOOL || shape.dtype == TB_U8) {
        for (i = 0; i < nbytes; i++) {
            unsigned char want = data[offset + i];
            if (shape.dtype == TB_BOOL) want = want != 0;
            if (host[i] != want) fuzz_fail("%s: byte %zu differs", how, i);
        }
    }
    free(host);
}

/* The status and shape of a load, to compare the two paths. */
typedef struct npy_outcome {
    tb_status status;
    tb_shape shape;
} npy_outcome;

static npy_outcome npy_load_memory(const uint8_t *data, size_t size) {
    npy_outcome r;
    FILE *f;
    tb_tensor *t;
    memset(&r, 0, sizeof r);
    f = fmemopen((void *)(uintptr_t)data, size, "rb");
    if (f == NULL) {
        r.status = TB_ERR_IO;
        return r;
    }
    tb_clear_error();
    t = tb__npy_load_stream(f, "memory", NULL);
    fclose(f);
    npy_check(t, data, size, "memory");
    r.status = t != NULL ? TB_OK : tb_last_status();
    if (t != NULL) r.shape = tb_tensor_shape(t);
    tb_tensor_release(t);
    return r;
}

/* Through a pipe: the whole input fits in the pipe's buffer, so one thread writes then reads. */
static bool npy_load_pipe(const uint8_t *data, size_t size, npy_outcome *r) {
    int fds[2];
    FILE *f;
    tb_tensor *t;
    if (size > 32768 || pipe(fds) != 0) return false;
    if (size > 0 && write(fds[1], data, size) != (ssize_t)size) {
        close(fds[0]);
        close(fds[1]);
        return false;
    }
    close(fds[1]);
    f = fdopen(fds[0], "rb");
    if (f == NULL) {
        close(fds[0]);
        return false;
    }
    tb_clear_error();
    t = tb__npy_load_stream(f, "pipe", NULL);
    fclose(f);
    npy_check(t, data, size, "pipe");
    memset(r, 0, sizeof *r);
    r->status = t != NULL ? TB_OK : tb_last_status();
    if (t != NULL) r->shape = tb_tensor_shape(t);
    tb_tensor_release(t);
    return true;
}

static int fuzz_npy_one(const uint8_t *data, size_t size) {
    npy_outcome a, b;
    fuzz_setup();
    if (size == 0) return 0; /* fmemopen refuses an empty buffer */
    a = npy_load_memory(data, size);
    if (a.status == TB_ERR_IO) return 0;
    if (npy_load_pipe(data, size, &b)) {
        if ((a.status == TB_OK) != (b.status == TB_OK))
            fuzz_fail("memory stream gives %s, pipe gives %s", tb_status_string(a.status),
                      tb_status_string(b.status));
        if (a.status == TB_OK && !tb_shape_equal(&a.shape, &b.shape))
            fuzz_fail("memory stream and pipe load different shapes");
    }
    tb_clear_error();
    return 0;
}

#ifndef TB_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_npy_one(data, size);
}
#endif
