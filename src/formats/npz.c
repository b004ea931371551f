/* ===========================================================================================
   Model files: .npz (a zip of .npy files), loaded (stored or deflated entries) and saved
   (stored entries; zip64 records where the sizes need them).
   =========================================================================================== */

/* One file of a zip's central directory. 40 bytes: never more than the 46 bytes of the record
   it comes from, so the directory's size bounds the memory. */
typedef struct tb__zip_entry {
    const unsigned char *name; /* inside the file's bytes, not NUL-terminated */
    uint64_t local_offset;
    uint64_t comp_size;
    uint64_t size;
    uint32_t crc;
    uint16_t method;
    uint16_t name_len;
} tb__zip_entry;

#define TB__ZIP_MAX32 0xffffffffu
#define TB__ZIP_MAX16 0xffffu

/* The central directory's place and size, from the end records (zip64 where present). */
static tb_status tb__zip_find_directory(const char *path, const tb__blob *blob, uint64_t *cd_offset,
                                        uint64_t *cd_size, uint64_t *count, uint64_t *cd_limit) {
    static const char fn[] = "tb_npz_load";
    const unsigned char *d = blob->data, *e = NULL;
    size_t pos, lowest;
    if (blob->size < 22)
        return tb__error(TB_ERR_FORMAT, "%s: %s is too short to be a zip file", fn, path);
    lowest = blob->size > 22 + 65535 ? blob->size - 22 - 65535 : 0;
    for (pos = blob->size - 22;; --pos) {
        if (memcmp(d + pos, "PK\5\6", 4) == 0 && pos + 22 + tb__le16(d + pos + 20) <= blob->size) {
            e = d + pos;
            break;
        }
        if (pos == lowest) break;
    }
    if (e == NULL)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s is not a zip file (no end of central directory record)", fn, path);
    if (tb__le16(e + 4) != 0 || tb__le16(e + 6) != 0 || tb__le16(e + 8) != tb__le16(e + 10))
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: zip files split over several disks are not "
                         "supported",
                         fn, path);
    *count = tb__le16(e + 10);
    *cd_size = tb__le32(e + 12);
    *cd_offset = tb__le32(e + 16);
    *cd_limit = pos;
    if (pos >= 20 && memcmp(d + pos - 20, "PK\6\7", 4) == 0) {
        uint64_t z = tb__le64(d + pos - 20 + 8);
        const unsigned char *r;
        if (z > pos - 20 || pos - 20 - z < 56 || memcmp(d + z, "PK\6\6", 4) != 0)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: the zip64 end of central directory record is missing or "
                             "out of place",
                             fn, path);
        r = d + z;
        if (tb__le32(r + 16) != 0 || tb__le32(r + 20) != 0 || tb__le64(r + 24) != tb__le64(r + 32))
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: zip files split over several disks are not supported", fn,
                             path);
        *count = tb__le64(r + 32);
        *cd_size = tb__le64(r + 40);
        *cd_offset = tb__le64(r + 48);
        *cd_limit = z;
    }
    if (*cd_offset > *cd_limit || *cd_size > *cd_limit - *cd_offset)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: the central directory (%llu bytes at offset %llu) lies outside "
                         "the file",
                         fn, path, (unsigned long long)*cd_size, (unsigned long long)*cd_offset);
    if (*count > *cd_size / 46)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: the zip claims %llu entries but its central directory of %llu "
                         "bytes holds at most %llu",
                         fn, path, (unsigned long long)*count, (unsigned long long)*cd_size,
                         (unsigned long long)(*cd_size / 46));
    return TB_OK;
}

/* The central directory's records into `entries` (`count` of them). */
static tb_status tb__zip_read_directory(const char *path, const tb__blob *blob, uint64_t cd_offset,
                                        uint64_t cd_size, tb__zip_entry *entries, size_t count) {
    static const char fn[] = "tb_npz_load";
    const unsigned char *p = blob->data + cd_offset, *end = p + cd_size;
    size_t i;
    for (i = 0; i < count; ++i) {
        tb__zip_entry *z = &entries[i];
        size_t name_len, extra_len, comment_len;
        const unsigned char *extra, *x;
        uint16_t flags;
        bool need_size, need_comp, need_offset;
        if (end - p < 46 || memcmp(p, "PK\1\2", 4) != 0)
            return tb__error(TB_ERR_FORMAT, "%s: %s: central directory record %lu is malformed", fn,
                             path, (unsigned long)i);
        flags = tb__le16(p + 8);
        z->method = tb__le16(p + 10);
        z->crc = tb__le32(p + 16);
        z->comp_size = tb__le32(p + 20);
        z->size = tb__le32(p + 24);
        name_len = tb__le16(p + 28);
        extra_len = tb__le16(p + 30);
        comment_len = tb__le16(p + 32);
        z->local_offset = tb__le32(p + 42);
        if ((size_t)(end - p) - 46 < name_len + extra_len + comment_len)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: central directory record %lu runs past the directory", fn,
                             path, (unsigned long)i);
        z->name = p + 46;
        z->name_len = (uint16_t)name_len;
        if (flags & 0x41)
            return tb__error(TB_ERR_FORMAT, "%s: %s: entry '%.*s' is encrypted", fn, path,
                             (int)name_len, (const char *)z->name);
        if (z->method != 0 && z->method != 8)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: entry '%.*s' uses compression method %u (only stored and "
                             "deflate are read)",
                             fn, path, (int)name_len, (const char *)z->name, (unsigned)z->method);
        /* zip64: the fields at their maximum are in the extra field, in this order */
        need_size = z->size == TB__ZIP_MAX32;
        need_comp = z->comp_size == TB__ZIP_MAX32;
        need_offset = z->local_offset == TB__ZIP_MAX32;
        extra = p + 46 + name_len;
        for (x = extra; x + 4 <= extra + extra_len;) {
            size_t id = tb__le16(x), len = tb__le16(x + 2);
            const unsigned char *v = x + 4;
            if (len > (size_t)(extra + extra_len - v)) break;
            if (id == 1) {
                const unsigned char *vend = v + len;
                uint64_t *fields[3];
                bool *needs[3];
                int f;
                fields[0] = &z->size;
                fields[1] = &z->comp_size;
                fields[2] = &z->local_offset;
                needs[0] = &need_size;
                needs[1] = &need_comp;
                needs[2] = &need_offset;
                for (f = 0; f < 3; ++f) {
                    if (!*needs[f] || vend - v < 8) continue;
                    *fields[f] = tb__le64(v);
                    *needs[f] = false;
                    v += 8;
                }
            }
            x += 4 + len;
        }
        if (need_size || need_comp || need_offset)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: entry '%.*s' lacks the zip64 sizes its record refers to", fn,
                             path, (int)name_len, (const char *)z->name);
        p += 46 + name_len + extra_len + comment_len;
    }
    return TB_OK;
}

/* Where an entry's data start (after its local header); 0 when the header is not there. */
static uint64_t tb__zip_data_offset(const tb__blob *blob, const tb__zip_entry *z,
                                    uint64_t cd_offset) {
    const unsigned char *h;
    if (z->local_offset > cd_offset || cd_offset - z->local_offset < 30) return 0;
    h = blob->data + z->local_offset;
    if (memcmp(h, "PK\3\4", 4) != 0) return 0;
    return z->local_offset + 30 + tb__le16(h + 26) + tb__le16(h + 28);
}

static int tb__zip_by_offset(const void *a, const void *b) {
    const tb__zip_entry *x = *(const tb__zip_entry *const *)a;
    const tb__zip_entry *y = *(const tb__zip_entry *const *)b;
    return x->local_offset < y->local_offset ? -1 : x->local_offset > y->local_offset ? 1 : 0;
}

/* Every entry's local header is where the directory says, names the same file, and its data
   lie before the directory without overlapping another entry. */
static tb_status tb__zip_check_entries(const char *path, const tb__blob *blob,
                                       tb__zip_entry *entries, size_t count, uint64_t cd_offset) {
    static const char fn[] = "tb_npz_load";
    tb__zip_entry **order;
    uint64_t previous_end = 0;
    size_t i;
    tb_status st = TB_OK;
    order = (tb__zip_entry **)tb__calloc(count ? count : 1, sizeof *order);
    if (order == NULL) return tb_last_status();
    for (i = 0; i < count; ++i)
        order[i] = &entries[i];
    qsort(order, count, sizeof *order, tb__zip_by_offset);
    for (i = 0; i < count && st == TB_OK; ++i) {
        const tb__zip_entry *z = order[i];
        uint64_t data = tb__zip_data_offset(blob, z, cd_offset);
        /* the header's address only once its offset is known to be inside the file */
        const unsigned char *h = data != 0 ? blob->data + z->local_offset : blob->data;
        if (data == 0 || data > cd_offset || z->comp_size > cd_offset - data)
            st = tb__error(TB_ERR_FORMAT,
                           "%s: %s: entry '%.*s' (local header at %llu, %llu bytes) is not "
                           "inside the file's data",
                           fn, path, (int)z->name_len, (const char *)z->name,
                           (unsigned long long)z->local_offset, (unsigned long long)z->comp_size);
        else if (tb__le16(h + 26) != z->name_len || memcmp(h + 30, z->name, z->name_len) != 0)
            st = tb__error(TB_ERR_FORMAT,
                           "%s: %s: entry '%.*s' has another name in its local header", fn, path,
                           (int)z->name_len, (const char *)z->name);
        else if (z->local_offset < previous_end)
            st = tb__error(TB_ERR_FORMAT, "%s: %s: entry '%.*s' overlaps the entry before it", fn,
                           path, (int)z->name_len, (const char *)z->name);
        previous_end = data + z->comp_size;
    }
    tb__free(order);
    return st;
}

/* The tensor of one .npy held in `bytes` (inside `blob`). */
static tb_tensor *tb__npz_npy(const char *label, tb__blob *blob, const unsigned char *bytes,
                              size_t size, const tb_device *device) {
    static const char fn[] = "tb_npz_load";
    size_t preamble, header_len, nbytes = 0;
    tb__npy_header h;
    tb_shape shape;
    if (size < 10 || memcmp(bytes, tb__npy_magic, 6) != 0) {
        tb__error(TB_ERR_FORMAT, "%s: %s is not a .npy file (bad magic)", fn, label);
        return NULL;
    }
    if (bytes[6] == 1) {
        preamble = 10;
        header_len = tb__le16(bytes + 8);
    } else if ((bytes[6] == 2 || bytes[6] == 3) && size >= 12) {
        preamble = 12;
        header_len = tb__le32(bytes + 8);
    } else {
        tb__error(TB_ERR_FORMAT, "%s: %s: unsupported .npy format version %u.%u", fn, label,
                  (unsigned)bytes[6], (unsigned)bytes[7]);
        return NULL;
    }
    if (header_len > size - preamble) {
        tb__error(TB_ERR_FORMAT, "%s: %s: the .npy header of %lu bytes runs past the entry", fn,
                  label, (unsigned long)header_len);
        return NULL;
    }
    if (tb__npy_parse_header((const char *)bytes + preamble, header_len, label, &h) != TB_OK) {
        /* the .npy parser names tb_npy_load: name this function instead */
        char message[1024];
        tb_status st = tb_last_status();
        const char *text = tb_last_error();
        snprintf(message, sizeof message, "%s",
                 strncmp(text, "tb_npy_load: ", 13) == 0 ? text + 13 : text);
        tb__error(st, "%s: %s", fn, message);
        return NULL;
    }
    if (tb_shape_make(&shape, h.dtype, h.rank, h.dims) != TB_OK ||
        tb_shape_nbytes(&shape, &nbytes) != TB_OK) {
        tb__error(TB_ERR_FORMAT, "%s: %s: the shape in the .npy header is too large", fn, label);
        return NULL;
    }
    if (nbytes != size - preamble - header_len) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: the .npy holds %lu bytes of data but its header describes %lu", fn,
                  label, (unsigned long)(size - preamble - header_len), (unsigned long)nbytes);
        return NULL;
    }
    return tb__blob_tensor(blob, bytes + preamble + header_len, &shape, h.big_endian, device);
}

/* One entry of the zip as a tensor, into the set under its name without ".npy". */
static tb_status tb__npz_entry(const char *path, tb__blob *blob, const tb__zip_entry *z,
                               uint64_t cd_offset, const tb__crc32_tables *tables,
                               const tb_device *device, tb_tensor_set *set) {
    static const char fn[] = "tb_npz_load";
    char *label, *name;
    const unsigned char *compressed = blob->data + tb__zip_data_offset(blob, z, cd_offset);
    tb__blob *inflated = NULL;
    const unsigned char *bytes = compressed;
    tb_tensor *t = NULL;
    tb_status st = TB_OK;
    if (z->name_len <= 4 || memcmp(z->name + z->name_len - 4, ".npy", 4) != 0 ||
        memchr(z->name, '\0', z->name_len) != NULL || z->name_len - 4 > TB_TENSOR_SET_MAX_NAME)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: entry '%.*s' is not a .npy file named '<name>.npy'", fn, path,
                         (int)z->name_len, (const char *)z->name);
    label = tb__format("%s[%.*s]", path, (int)z->name_len, (const char *)z->name);
    name = tb__format("%.*s", (int)z->name_len - 4, (const char *)z->name);
    if (label == NULL || name == NULL) {
        tb__free(label);
        tb__free(name);
        return tb_last_status();
    }
    if (tb__set_find(set, name) != TB__SET_NONE) {
        st = tb__error(TB_ERR_FORMAT, "%s: %s: two entries are named '%.*s'", fn, path,
                       (int)z->name_len, (const char *)z->name);
    } else if (z->method == 0 && z->comp_size != z->size) {
        st = tb__error(TB_ERR_FORMAT, "%s: %s: a stored entry of %llu bytes claims %llu", fn, label,
                       (unsigned long long)z->comp_size, (unsigned long long)z->size);
    } else if (z->method == 8 && z->size / 1032 > z->comp_size) {
        st = tb__error(TB_ERR_FORMAT,
                       "%s: %s: %llu compressed bytes cannot inflate to the %llu claimed (deflate "
                       "gives at most 1032 times its input)",
                       fn, label, (unsigned long long)z->comp_size, (unsigned long long)z->size);
    } else if (z->size > (uint64_t)SIZE_MAX) {
        st = tb__error(TB_ERR_FORMAT, "%s: %s: the entry is too large for this machine", fn, label);
    } else if (z->method == 8) {
        unsigned char *out = (unsigned char *)tb__alloc(z->size ? (size_t)z->size : 1);
        inflated = out != NULL ? tb__blob_owning(out, (size_t)z->size) : NULL;
        if (inflated == NULL) {
            st = tb_last_status();
        } else {
            tb__inflater s;
            const char *why;
            memset(&s, 0, sizeof s);
            s.in = compressed;
            s.in_len = (size_t)z->comp_size;
            s.out = out;
            s.out_len = (size_t)z->size;
            why = tb__inflate(&s);
            if (why != NULL)
                st = tb__error(TB_ERR_FORMAT, "%s: %s: corrupt deflate data: %s", fn, label, why);
            bytes = out;
        }
    }
    if (st == TB_OK && tb__crc32(tables, 0, bytes, (size_t)z->size) != z->crc)
        st = tb__error(TB_ERR_FORMAT, "%s: %s: CRC-32 mismatch: the entry's data are corrupt", fn,
                       label);
    if (st == TB_OK) {
        t = tb__npz_npy(label, inflated != NULL ? inflated : blob, bytes, (size_t)z->size, device);
        st = t != NULL ? tb__set_add_owned(fn, set, name, t) : tb_last_status();
    }
    tb__blob_release(inflated);
    tb__free(label);
    tb__free(name);
    return st;
}

TBDEF tb_tensor_set *tb_npz_load(const char *path, const tb_device *device) {
    static const char fn[] = "tb_npz_load";
    tb__blob *blob = NULL;
    tb_tensor_set *set = NULL;
    tb__zip_entry *entries = NULL;
    uint64_t cd_offset = 0, cd_size = 0, count = 0, cd_limit = 0;
    tb__crc32_tables *crc = NULL;
    size_t i;
    tb_device dev;
    tb__ensure_setup();
    if (path == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: path is NULL", fn);
        return NULL;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    if (tb__blob_open(fn, path, &blob) != TB_OK) return NULL;
    if (tb__zip_find_directory(path, blob, &cd_offset, &cd_size, &count, &cd_limit) != TB_OK)
        goto fail;
    entries = (tb__zip_entry *)tb__calloc(count ? (size_t)count : 1, sizeof *entries);
    set = tb_tensor_set_new();
    if (entries == NULL || set == NULL) goto fail;
    if (tb__zip_read_directory(path, blob, cd_offset, cd_size, entries, (size_t)count) != TB_OK ||
        tb__zip_check_entries(path, blob, entries, (size_t)count, cd_offset) != TB_OK)
        goto fail;
    crc = (tb__crc32_tables *)tb__alloc(sizeof *crc);
    if (crc == NULL) goto fail;
    tb__crc32_init(crc);
    for (i = 0; i < (size_t)count; ++i)
        if (tb__npz_entry(path, blob, &entries[i], cd_offset, crc, &dev, set) != TB_OK) goto fail;
    tb__free(crc);
    tb__free(entries);
    tb__blob_release(blob);
    return set;
fail:
    tb__free(crc);
    tb__free(entries);
    tb_tensor_set_free(set);
    tb__blob_release(blob);
    return NULL;
}

/* Test hook: write zip64 records even where the sizes do not need them. */
static bool tb__npz_force_zip64 = false;

static unsigned char *tb__put16(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v & 0xff);
    p[1] = (unsigned char)((v >> 8) & 0xff);
    return p + 2;
}

static unsigned char *tb__put32(unsigned char *p, uint32_t v) {
    return tb__put16(tb__put16(p, v & 0xffff), v >> 16);
}

static unsigned char *tb__put64(unsigned char *p, uint64_t v) {
    return tb__put32(tb__put32(p, (uint32_t)(v & 0xffffffffu)), (uint32_t)(v >> 32));
}

/* The general purpose flags of an entry: bit 11 says the name is UTF-8 (else readers take it
   as code page 437). */
static uint32_t tb__npz_name_flags(const char *name) {
    for (; *name != '\0'; ++name)
        if ((unsigned char)*name >= 0x80) return 0x800;
    return 0;
}

/* What the directory needs to know of an entry written. */
typedef struct tb__npz_written {
    uint64_t offset, size;
    uint32_t crc;
} tb__npz_written;

/* One stored entry: local header, then the .npy (preamble, header text, data). */
static tb_status tb__npz_write_entry(tb__out_file *out, const char *name, tb_tensor *tensor,
                                     const tb__crc32_tables *tables, tb__npz_written *w) {
    tb_shape shape = tb_tensor_shape(tensor);
    const unsigned char *bytes = NULL;
    unsigned char *copy = NULL, preamble[12], local[30 + 20], *p;
    size_t nbytes = 0, header_len = 0, preamble_len, name_len = strlen(name) + 4, i;
    unsigned major = 1;
    char *header;
    bool zip64;
    uint32_t crc;
    tb_status st = tb__tensor_le_bytes(tensor, &bytes, &nbytes, &copy);
    if (st != TB_OK) return st;
    header = tb__npy_header_text(&shape, &header_len, &major);
    if (header == NULL) {
        tb__free(copy);
        return tb__error(TB_ERR_OUT_OF_MEMORY, "tb_npz_save: out of memory");
    }
    memcpy(preamble, tb__npy_magic, 6);
    preamble[6] = (unsigned char)major;
    preamble[7] = 0;
    preamble_len = major == 1 ? 10 : 12;
    for (i = 8; i < preamble_len; ++i)
        preamble[i] = (unsigned char)((header_len >> (8 * (i - 8))) & 0xff);
    w->offset = out->written;
    w->size = (uint64_t)preamble_len + header_len + nbytes;
    crc = tb__crc32(tables, 0, preamble, preamble_len);
    crc = tb__crc32(tables, crc, (const unsigned char *)header, header_len);
    w->crc = tb__crc32(tables, crc, bytes, nbytes);
    zip64 = w->size >= TB__ZIP_MAX32 || tb__npz_force_zip64;
    p = tb__put32(local, 0x04034b50u);
    p = tb__put16(p, zip64 ? 45 : 20); /* version needed */
    p = tb__put16(p, tb__npz_name_flags(name));
    p = tb__put16(p, 0);                       /* stored */
    p = tb__put16(p, 0);                       /* time 00:00 */
    p = tb__put16(p, (0 << 9) | (1 << 5) | 1); /* date 1980-01-01 */
    p = tb__put32(p, w->crc);
    p = tb__put32(p, zip64 ? TB__ZIP_MAX32 : (uint32_t)w->size);
    p = tb__put32(p, zip64 ? TB__ZIP_MAX32 : (uint32_t)w->size);
    p = tb__put16(p, (uint32_t)name_len);
    p = tb__put16(p, zip64 ? 20 : 0);
    tb__out_write(out, local, 30);
    tb__out_write(out, name, name_len - 4);
    tb__out_write(out, ".npy", 4);
    if (zip64) {
        p = tb__put16(local, 1);
        p = tb__put16(p, 16);
        p = tb__put64(p, w->size);
        tb__put64(p, w->size);
        tb__out_write(out, local, 20);
    }
    tb__out_write(out, preamble, preamble_len);
    tb__out_write(out, header, header_len);
    tb__out_write(out, bytes, nbytes);
    tb__free(header);
    tb__free(copy);
    return TB_OK;
}

TBDEF tb_status tb_npz_save(const char *path, const tb_tensor_set *set) {
    static const char fn[] = "tb_npz_save";
    tb__npz_written *written;
    tb__crc32_tables *tables;
    unsigned char record[56 + 20 + 22], *p;
    uint64_t cd_offset, cd_size;
    tb__out_file out;
    size_t i;
    bool zip64_end;
    tb_status st;
    tb__ensure_setup();
    if (path == NULL || set == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         path == NULL ? "path" : "set");
    for (i = 0; i < set->count; ++i) {
        const char *name = set->entries[i].name;
        if (name[0] == '\0' || strcmp(name, ".") == 0 || strcmp(name, "..") == 0 ||
            strpbrk(name, "/\\") != NULL)
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: tensor '%.200s': a name must not be empty, '.' or '..', nor hold "
                             "'/' or '\\' (it would name a folder where the .npz is unpacked)",
                             fn, name);
    }
    for (i = 0; i < set->count; ++i) {
        tb_shape shape = tb_tensor_shape(set->entries[i].tensor);
        if (tb__st_dtype_name(shape.dtype) == NULL || shape.dtype == TB_BF16 ||
            strlen(set->entries[i].name) + 4 > 65535)
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: tensor '%.200s': its dtype has no .npy code or its name is "
                             "too long for a zip entry",
                             fn, set->entries[i].name);
    }
    st = tb__set_sync(set);
    if (st != TB_OK) return st;
    written = (tb__npz_written *)tb__calloc(set->count ? set->count : 1, sizeof *written);
    tables = (tb__crc32_tables *)tb__alloc(sizeof *tables);
    if (written == NULL || tables == NULL) {
        tb__free(written);
        tb__free(tables);
        return tb_last_status();
    }
    tb__crc32_init(tables);
    st = tb__out_open(fn, path, &out);
    for (i = 0; i < set->count && st == TB_OK && !out.failed; ++i)
        st = tb__npz_write_entry(&out, set->entries[i].name, set->entries[i].tensor, tables,
                                 &written[i]);
    cd_offset = out.written;
    for (i = 0; i < set->count && st == TB_OK && !out.failed; ++i) {
        const tb__npz_written *w = &written[i];
        size_t name_len = strlen(set->entries[i].name) + 4;
        bool big = w->size >= TB__ZIP_MAX32 || tb__npz_force_zip64;
        bool far = w->offset >= TB__ZIP_MAX32 || tb__npz_force_zip64;
        unsigned char head[46], extra[4 + 24], *x;
        p = tb__put32(head, 0x02014b50u);
        p = tb__put16(p, (3 << 8) | 45); /* made by: unix, zip 4.5 */
        p = tb__put16(p, big || far ? 45 : 20);
        p = tb__put16(p, tb__npz_name_flags(set->entries[i].name));
        p = tb__put16(p, 0);
        p = tb__put16(p, 0);
        p = tb__put16(p, (0 << 9) | (1 << 5) | 1);
        p = tb__put32(p, w->crc);
        p = tb__put32(p, big ? TB__ZIP_MAX32 : (uint32_t)w->size);
        p = tb__put32(p, big ? TB__ZIP_MAX32 : (uint32_t)w->size);
        p = tb__put16(p, (uint32_t)name_len);
        x = extra + 4;
        if (big) x = tb__put64(tb__put64(x, w->size), w->size);
        if (far) x = tb__put64(x, w->offset);
        tb__put16(tb__put16(extra, 1), (uint32_t)(x - extra - 4));
        p = tb__put16(p, x == extra + 4 ? 0 : (uint32_t)(x - extra));
        p = tb__put16(p, 0);              /* comment */
        p = tb__put16(p, 0);              /* disk */
        p = tb__put16(p, 0);              /* internal attributes */
        p = tb__put32(p, 0100644u << 16); /* a regular file, rw-r--r-- */
        tb__put32(p, far ? TB__ZIP_MAX32 : (uint32_t)w->offset);
        tb__out_write(&out, head, 46);
        tb__out_write(&out, set->entries[i].name, name_len - 4);
        tb__out_write(&out, ".npy", 4);
        if (x != extra + 4) tb__out_write(&out, extra, (size_t)(x - extra));
    }
    cd_size = out.written - cd_offset;
    zip64_end = set->count >= TB__ZIP_MAX16 || cd_offset >= TB__ZIP_MAX32 ||
                cd_size >= TB__ZIP_MAX32 || tb__npz_force_zip64;
    p = record;
    if (zip64_end) {
        uint64_t end_offset = out.written;
        p = tb__put32(p, 0x06064b50u);
        p = tb__put64(p, 44);
        p = tb__put16(p, (3 << 8) | 45);
        p = tb__put16(p, 45);
        p = tb__put32(p, 0);
        p = tb__put32(p, 0);
        p = tb__put64(p, set->count);
        p = tb__put64(p, set->count);
        p = tb__put64(p, cd_size);
        p = tb__put64(p, cd_offset);
        p = tb__put32(p, 0x07064b50u);
        p = tb__put32(p, 0);
        p = tb__put64(p, end_offset);
        p = tb__put32(p, 1);
    }
    p = tb__put32(p, 0x06054b50u);
    p = tb__put16(p, 0);
    p = tb__put16(p, 0);
    p = tb__put16(p, zip64_end ? TB__ZIP_MAX16 : (uint32_t)set->count);
    p = tb__put16(p, zip64_end ? TB__ZIP_MAX16 : (uint32_t)set->count);
    p = tb__put32(p, zip64_end ? TB__ZIP_MAX32 : (uint32_t)cd_size);
    p = tb__put32(p, zip64_end ? TB__ZIP_MAX32 : (uint32_t)cd_offset);
    p = tb__put16(p, 0);
    if (st == TB_OK) {
        tb__out_write(&out, record, (size_t)(p - record));
        st = tb__out_close(fn, &out, true);
    } else if (out.f != NULL) {
        tb__out_close(fn, &out, false);
    }
    tb__free(written);
    tb__free(tables);
    return st;
}

#undef TB__ZIP_MAX32
#undef TB__ZIP_MAX16
