/* libFuzzer harness: the input is a safetensors file, loaded with tb_safetensors_load from a
   file (fuzz_files.h). A load either fails with TB_ERR_FORMAT, TB_ERR_DTYPE,
   TB_ERR_UNSUPPORTED (or TB_ERR_OUT_OF_MEMORY) and a message naming the reader, or gives a set
   whose tensors hold exactly the bytes after the header: as many (the tensors tile the data)
   and, without bool tensors (whose bytes are folded to 0 or 1), the same bytes in some order.
   Each tensor is then read back and cast (fuzz_files.h), the set is saved with
   tb_safetensors_save, which must succeed, and loaded back: the same names, shapes, values and
   metadata; saving that again gives the same file. */
#include "fuzz_files.h"

static const tb_status st_load_errors[] = {TB_ERR_FORMAT, TB_ERR_DTYPE, TB_ERR_UNSUPPORTED,
                                           TB_ERR_OUT_OF_MEMORY, TB_OK};

/* How often each byte value occurs in data[0, size). */
static void st_histogram(const unsigned char *data, size_t size, uint64_t counts[256]) {
    size_t i;
    for (i = 0; i < size; i++)
        counts[data[i]]++;
}

/* The tensors' bytes against the file's data: the same count and, without bools, the same
   bytes (the tensors tile the data in some order). */
static void st_check_data(const tb_tensor_set *set, const uint8_t *data, size_t size) {
    uint64_t header_len = 0, from_file[256], from_tensors[256];
    size_t i, total = 0, data_len;
    bool has_bool = false;
    if (size < 8) fuzz_fail("a file of %zu bytes loaded", size);
    for (i = 0; i < 8; i++)
        header_len |= (uint64_t)data[i] << (8 * i);
    if (header_len > size - 8) fuzz_fail("a header longer than the file loaded");
    data_len = size - 8 - (size_t)header_len;
    memset(from_file, 0, sizeof from_file);
    memset(from_tensors, 0, sizeof from_tensors);
    st_histogram(data + 8 + header_len, data_len, from_file);
    for (i = 0; i < tb_tensor_set_count(set); i++) {
        tb_tensor *t = tb_tensor_set_tensor(set, i);
        tb_shape shape = tb_tensor_shape(t);
        size_t nbytes = 0;
        unsigned char *host;
        if (tb_shape_nbytes(&shape, &nbytes) != TB_OK) fuzz_fail("tensor %zu: no byte size", i);
        if (nbytes > data_len - total)
            fuzz_fail("the tensors hold more bytes than the file's %zu of data", data_len);
        total += nbytes;
        if (shape.dtype == TB_BOOL) has_bool = true;
        host = (unsigned char *)malloc(nbytes ? nbytes : 1);
        if (host == NULL) fuzz_fail("malloc");
        if (tb_tensor_to_host(t, host, nbytes) != TB_OK) fuzz_fail("tensor %zu: to_host", i);
        st_histogram(host, nbytes, from_tensors);
        free(host);
    }
    if (total != data_len)
        fuzz_fail("the tensors hold %zu bytes, the file %zu bytes of data", total, data_len);
    if (!has_bool && memcmp(from_file, from_tensors, sizeof from_file) != 0)
        fuzz_fail("the tensors' bytes are not the file's data");
}

static int fuzz_safetensors_one(const uint8_t *data, size_t size) {
    char path[1024];
    tb_tensor_set *set;
    fuzz_setup();
    files_write(path, "input.safetensors", data, size);
    set = tb_safetensors_load(path, NULL);
    if (set == NULL) {
        files_check_failure("tb_safetensors_load", st_load_errors, "safetensors");
        tb_clear_error();
        return 0;
    }
    st_check_data(set, data, size);
    if (!files_round_trip(set, tb_safetensors_save, tb_safetensors_load, "safetensors round trip"))
        fuzz_fail("tb_safetensors_save of a loaded set failed");
    files_touch_set_and_free(set, "safetensors");
    tb_clear_error();
    return 0;
}

#ifndef TB_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_safetensors_one(data, size);
}
#endif
