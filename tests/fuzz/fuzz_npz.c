/* libFuzzer harness: the input is an .npz file, loaded with tb_npz_load from a file
   (fuzz_files.h). A load either fails with TB_ERR_FORMAT (or TB_ERR_OUT_OF_MEMORY) and a message
   naming the reader, or gives a set whose tensors are read back and cast (fuzz_files.h), then
   saved with tb_npz_save and loaded back: the same names, shapes and values; saving that again
   gives the same file. The save may refuse only a name that is "." or "..", or holds '/' or
   '\\' (TB_ERR_INVALID_ARGUMENT): a zip entry may have such a name, an .npz the library writes
   may not.
   A changed byte in an entry's data almost always breaks its CRC-32, which would stop the load
   before the .npy is parsed; so each input is loaded a second time with the CRC-32s of its
   central directory set to those of its entries' data (inflated by the library's inflater),
   which takes the changed bytes on to the .npy parser. */
#include "fuzz_files.h"

/* A deflated entry that claims more is not inflated by the repair. */
#define NPZ_MAX_REPAIR (1u << 20)

static const tb_status npz_load_errors[] = {TB_ERR_FORMAT, TB_ERR_OUT_OF_MEMORY, TB_OK};

static uint32_t npz_le16(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}

static uint32_t npz_le32(const uint8_t *p) {
    return npz_le16(p) | (npz_le16(p + 2) << 16);
}

/* The CRC-32 of the entry whose data lie at data[start, start + comp_size), into *crc_out;
   false when it has none (corrupt deflate data, more than NPZ_MAX_REPAIR bytes). */
static bool npz_entry_crc(const uint8_t *data, size_t start, uint32_t comp_size, uint32_t size,
                          uint32_t method, const tb__crc32_tables *tables, uint32_t *crc_out) {
    tb__inflater s;
    unsigned char *out;
    bool ok;
    if (method == 0) {
        *crc_out = tb__crc32(tables, 0, data + start, comp_size);
        return true;
    }
    if (method != 8 || size > NPZ_MAX_REPAIR) return false;
    out = (unsigned char *)malloc(size ? size : 1);
    if (out == NULL) return false;
    memset(&s, 0, sizeof s);
    s.in = data + start;
    s.in_len = comp_size;
    s.out = out;
    s.out_len = size;
    ok = tb__inflate(&s) == NULL;
    if (ok) *crc_out = tb__crc32(tables, 0, out, size);
    free(out);
    return ok;
}

/* A copy of the input with each central directory record's CRC-32 set to its entry's, or NULL
   when that changes nothing. Zip64 records are left as they are. */
static uint8_t *npz_repair(const uint8_t *data, size_t size, const tb__crc32_tables *tables) {
    size_t pos, lowest, p, cd_end;
    uint32_t count, i;
    uint8_t *copy;
    bool changed = false;
    if (size < 22) return NULL;
    lowest = size > 22 + 65535 ? size - 22 - 65535 : 0;
    for (pos = size - 22;; pos--) {
        if (memcmp(data + pos, "PK\5\6", 4) == 0 && pos + 22 + npz_le16(data + pos + 20) <= size)
            break;
        if (pos == lowest) return NULL;
    }
    count = npz_le16(data + pos + 10);
    p = npz_le32(data + pos + 16);
    if (p > pos || npz_le32(data + pos + 12) > pos - p) return NULL;
    cd_end = p + npz_le32(data + pos + 12);
    copy = (uint8_t *)malloc(size);
    if (copy == NULL) return NULL;
    memcpy(copy, data, size);
    for (i = 0; i < count && cd_end - p >= 46 && memcmp(data + p, "PK\1\2", 4) == 0; i++) {
        uint32_t method = npz_le16(data + p + 10), comp = npz_le32(data + p + 20);
        uint32_t usize = npz_le32(data + p + 24), local = npz_le32(data + p + 42), crc;
        size_t record = 46 + (size_t)npz_le16(data + p + 28) + npz_le16(data + p + 30) +
                        npz_le16(data + p + 32);
        if (comp != 0xffffffffu && usize != 0xffffffffu && local <= size && size - local >= 30 &&
            memcmp(data + local, "PK\3\4", 4) == 0) {
            size_t start =
                (size_t)local + 30 + npz_le16(data + local + 26) + npz_le16(data + local + 28);
            if (start <= size && comp <= size - start &&
                npz_entry_crc(data, start, comp, usize, method, tables, &crc) &&
                crc != npz_le32(data + p + 16)) {
                copy[p + 16] = (uint8_t)(crc & 0xff);
                copy[p + 17] = (uint8_t)((crc >> 8) & 0xff);
                copy[p + 18] = (uint8_t)((crc >> 16) & 0xff);
                copy[p + 19] = (uint8_t)(crc >> 24);
                changed = true;
            }
        }
        if (record > cd_end - p) break;
        p += record;
    }
    if (!changed) {
        free(copy);
        return NULL;
    }
    return copy;
}

/* Whether a name of the set is one that tb_npz_save refuses. */
static bool npz_has_refused_name(const tb_tensor_set *set) {
    size_t i;
    for (i = 0; i < tb_tensor_set_count(set); i++) {
        const char *name = tb_tensor_set_name(set, i);
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || strpbrk(name, "/\\") != NULL)
            return true;
    }
    return false;
}

static void npz_load_check(const char *name, const uint8_t *data, size_t size, const char *what) {
    char path[1024];
    tb_tensor_set *set;
    files_write(path, name, data, size);
    tb_clear_error();
    set = tb_npz_load(path, NULL);
    if (set == NULL) {
        files_check_failure("tb_npz_load", npz_load_errors, what);
        tb_clear_error();
        return;
    }
    if (!files_round_trip(set, tb_npz_save, tb_npz_load, what) &&
        !(tb_last_status() == TB_ERR_INVALID_ARGUMENT && npz_has_refused_name(set)))
        fuzz_fail("%s: tb_npz_save of a loaded set failed", what);
    files_touch_set_and_free(set, what);
    tb_clear_error();
}

static int fuzz_npz_one(const uint8_t *data, size_t size) {
    static tb__crc32_tables tables;
    static bool tables_ready = false;
    uint8_t *repaired;
    fuzz_setup();
    if (!tables_ready) {
        tb__crc32_init(&tables);
        tables_ready = true;
    }
    npz_load_check("input.npz", data, size, "npz");
    repaired = npz_repair(data, size, &tables);
    if (repaired != NULL) {
        npz_load_check("repaired.npz", repaired, size, "npz with its CRC-32s repaired");
        free(repaired);
    }
    return 0;
}

#undef NPZ_MAX_REPAIR

#ifndef TB_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_npz_one(data, size);
}
#endif
