/* ===========================================================================================
   Model files: tensor sets, safetensors and .npz
   =========================================================================================== */

#if !defined(_WIN32)
#include <sys/mman.h>
#endif

/* ---- tensor sets ---- */

typedef struct tb__set_entry {
    char *name;
    tb_tensor *tensor; /* one reference */
} tb__set_entry;

typedef struct tb__meta_entry {
    char *key;
    char *value;
} tb__meta_entry;

struct tb_tensor_set {
    tb__set_entry *entries;
    size_t count, cap;
    size_t *slots;     /* open addressing on the names: entry index + 1, 0 = empty */
    size_t slot_count; /* a power of two above twice the count; 0 before the first add */
    tb__meta_entry *meta;
    size_t meta_count, meta_cap;
};

#define TB__SET_NONE ((size_t)-1)

static size_t tb__set_slot_of(const char *name, size_t slot_count) {
    return (size_t)tb__hash_bytes(0x7e5e7, name, strlen(name)) & (slot_count - 1);
}

static size_t tb__set_find(const tb_tensor_set *set, const char *name) {
    size_t i;
    if (set->slot_count == 0) return TB__SET_NONE;
    for (i = tb__set_slot_of(name, set->slot_count); set->slots[i] != 0;
         i = (i + 1) & (set->slot_count - 1)) {
        if (strcmp(set->entries[set->slots[i] - 1].name, name) == 0) return set->slots[i] - 1;
    }
    return TB__SET_NONE;
}

/* Makes room in the index for `need` names (rebuilding it larger when needed). */
static tb_status tb__set_reserve_index(tb_tensor_set *set, size_t need) {
    size_t count = set->slot_count ? set->slot_count : 16, i, *slots;
    if (need <= set->slot_count / 2) return TB_OK;
    while (count / 2 < need)
        count *= 2;
    slots = (size_t *)tb__calloc(count, sizeof *slots);
    if (slots == NULL) return tb_last_status();
    for (i = 0; i < set->count; ++i) {
        size_t s = tb__set_slot_of(set->entries[i].name, count);
        while (slots[s] != 0)
            s = (s + 1) & (count - 1);
        slots[s] = i + 1;
    }
    tb__free(set->slots);
    set->slots = slots;
    set->slot_count = count;
    return TB_OK;
}

/* The length of `name` if it is a valid name (1..TB_TENSOR_SET_MAX_NAME bytes), else 0. */
static size_t tb__set_name_length(const char *name) {
    size_t n = 0;
    while (n <= TB_TENSOR_SET_MAX_NAME && name[n] != '\0')
        ++n;
    return n <= TB_TENSOR_SET_MAX_NAME ? n : 0;
}

/* Appends `tensor` under `name`, taking over the caller's reference (released on error). */
static tb_status tb__set_add_owned(const char *fn, tb_tensor_set *set, const char *name,
                                   tb_tensor *tensor) {
    char *copy;
    tb_status st;
    if (tb__set_name_length(name) == 0) {
        tb_tensor_release(tensor);
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: a tensor name must be 1 to %d bytes", fn,
                         TB_TENSOR_SET_MAX_NAME);
    }
    if (tb__set_find(set, name) != TB__SET_NONE) {
        tb_tensor_release(tensor);
        return tb__error(TB_ERR_DUPLICATE, "%s: the set already has a tensor named '%s'", fn, name);
    }
    st = tb__grow((void **)&set->entries, &set->cap, set->count + 1, sizeof *set->entries);
    if (st == TB_OK) st = tb__set_reserve_index(set, set->count + 1);
    copy = st == TB_OK ? tb__strdup(name) : NULL;
    if (copy == NULL) {
        tb_tensor_release(tensor);
        return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_OUT_OF_MEMORY;
    }
    set->entries[set->count].name = copy;
    tb__scope_disown(tensor); /* the set keeps the reference: a scope no longer owns it */
    set->entries[set->count].tensor = tensor;
    {
        size_t s = tb__set_slot_of(copy, set->slot_count);
        while (set->slots[s] != 0)
            s = (s + 1) & (set->slot_count - 1);
        set->slots[s] = set->count + 1;
    }
    set->count++;
    return TB_OK;
}

TBDEF tb_tensor_set *tb_tensor_set_new(void) {
    tb__ensure_setup();
    return (tb_tensor_set *)tb__calloc(1, sizeof(tb_tensor_set));
}

TBDEF void tb_tensor_set_free(tb_tensor_set *set) {
    size_t i;
    if (set == NULL) return;
    for (i = 0; i < set->count; ++i) {
        tb_tensor_release(set->entries[i].tensor);
        tb__free(set->entries[i].name);
    }
    for (i = 0; i < set->meta_count; ++i) {
        tb__free(set->meta[i].key);
        tb__free(set->meta[i].value);
    }
    tb__free(set->entries);
    tb__free(set->slots);
    tb__free(set->meta);
    tb__free(set);
}

TBDEF tb_status tb_tensor_set_add(tb_tensor_set *set, const char *name, tb_tensor *tensor) {
    tb__ensure_setup();
    if (set == NULL || name == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_add: %s is NULL",
                         set == NULL ? "set" : "name");
    if (tensor == NULL) {
        if (tb_last_status() != TB_OK) return tb_last_status();
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_add: tensor is NULL");
    }
    return tb__set_add_owned("tb_tensor_set_add", set, name, tb_tensor_retain(tensor));
}

TBDEF size_t tb_tensor_set_count(const tb_tensor_set *set) {
    return set != NULL ? set->count : 0;
}

static bool tb__set_index_ok(const char *fn, const tb_tensor_set *set, size_t index) {
    tb__ensure_setup();
    if (set == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: set is NULL", fn);
        return false;
    }
    if (index >= set->count) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: index %lu is past the set's %lu tensors", fn,
                  (unsigned long)index, (unsigned long)set->count);
        return false;
    }
    return true;
}

TBDEF const char *tb_tensor_set_name(const tb_tensor_set *set, size_t index) {
    return tb__set_index_ok("tb_tensor_set_name", set, index) ? set->entries[index].name : NULL;
}

TBDEF tb_tensor *tb_tensor_set_tensor(const tb_tensor_set *set, size_t index) {
    return tb__set_index_ok("tb_tensor_set_tensor", set, index) ? set->entries[index].tensor : NULL;
}

TBDEF tb_tensor *tb_tensor_set_get(const tb_tensor_set *set, const char *name) {
    size_t i;
    tb__str known;
    tb__ensure_setup();
    if (set == NULL || name == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_get: %s is NULL",
                  set == NULL ? "set" : "name");
        return NULL;
    }
    i = tb__set_find(set, name);
    if (i != TB__SET_NONE) return set->entries[i].tensor;
    memset(&known, 0, sizeof known);
    for (i = 0; i < set->count && i < 8; ++i)
        tb__str_append(&known, "%s'%.64s'", i ? ", " : "", set->entries[i].name);
    if (set->count > 8) tb__str_append(&known, ", ...");
    tb__error(TB_ERR_NOT_FOUND, "tb_tensor_set_get: no tensor named '%.200s' (the set has %lu%s%s)",
              name, (unsigned long)set->count, set->count ? ": " : "",
              known.data != NULL && !known.failed ? known.data : "");
    tb__str_free(&known);
    return NULL;
}

static size_t tb__set_meta_find(const tb_tensor_set *set, const char *key) {
    size_t i;
    for (i = 0; i < set->meta_count; ++i)
        if (strcmp(set->meta[i].key, key) == 0) return i;
    return TB__SET_NONE;
}

TBDEF tb_status tb_tensor_set_set_metadata(tb_tensor_set *set, const char *key, const char *value) {
    size_t i;
    char *k = NULL, *v;
    tb__ensure_setup();
    if (set == NULL || key == NULL || value == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_set_metadata: %s is NULL",
                         set == NULL   ? "set"
                         : key == NULL ? "key"
                                       : "value");
    if (tb__set_name_length(key) == 0)
        return tb__error(TB_ERR_INVALID_ARGUMENT,
                         "tb_tensor_set_set_metadata: a key must be 1 to %d bytes",
                         TB_TENSOR_SET_MAX_NAME);
    i = tb__set_meta_find(set, key);
    v = tb__strdup(value);
    if (v == NULL) return tb_last_status();
    if (i != TB__SET_NONE) {
        tb__free(set->meta[i].value);
        set->meta[i].value = v;
        return TB_OK;
    }
    if (tb__grow((void **)&set->meta, &set->meta_cap, set->meta_count + 1, sizeof *set->meta) !=
            TB_OK ||
        (k = tb__strdup(key)) == NULL) {
        tb__free(v);
        return tb_last_status();
    }
    set->meta[set->meta_count].key = k;
    set->meta[set->meta_count].value = v;
    set->meta_count++;
    return TB_OK;
}

TBDEF const char *tb_tensor_set_metadata(const tb_tensor_set *set, const char *key) {
    size_t i;
    tb__ensure_setup();
    if (set == NULL || key == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_metadata: %s is NULL",
                  set == NULL ? "set" : "key");
        return NULL;
    }
    i = tb__set_meta_find(set, key);
    if (i == TB__SET_NONE) {
        tb__error(TB_ERR_NOT_FOUND, "tb_tensor_set_metadata: no metadata key '%.200s'", key);
        return NULL;
    }
    return set->meta[i].value;
}

TBDEF size_t tb_tensor_set_metadata_count(const tb_tensor_set *set) {
    return set != NULL ? set->meta_count : 0;
}

TBDEF const char *tb_tensor_set_metadata_key(const tb_tensor_set *set, size_t index) {
    tb__ensure_setup();
    if (set == NULL || index >= set->meta_count) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_tensor_set_metadata_key: %s",
                  set == NULL ? "set is NULL" : "index is past the end");
        return NULL;
    }
    return set->meta[index].key;
}

/* Syncs the set's pending tensors, one graph per device (so that a model's tensors computed
   together compile once). */
static tb_status tb__set_sync(const tb_tensor_set *set) {
    tb_tensor **group;
    size_t i, j, n;
    tb_status st = TB_OK;
    if (set->count == 0) return TB_OK;
    group = (tb_tensor **)tb__calloc(set->count, sizeof *group);
    if (group == NULL) return tb_last_status();
    for (i = 0; i < set->count && st == TB_OK; ++i) {
        tb_device dev = tb_tensor_device(set->entries[i].tensor);
        bool first = true;
        if (tb_tensor_node(set->entries[i].tensor) == NULL) continue;
        for (j = 0; j < i && first; ++j) { /* this device was synced with an earlier tensor */
            tb_device other = tb_tensor_device(set->entries[j].tensor);
            if (tb_device_equal(&dev, &other)) first = false;
        }
        if (!first) continue;
        for (n = 0, j = i; j < set->count; ++j) {
            tb_device other = tb_tensor_device(set->entries[j].tensor);
            if (tb_device_equal(&dev, &other)) group[n++] = set->entries[j].tensor;
        }
        st = tb_sync(group, n);
    }
    tb__free(group);
    return st;
}

/* ---- a file's bytes, shared by the tensors that use them in place ---- */

typedef struct tb__blob {
    int32_t refcount;
    unsigned char *data;
    size_t size;
    bool mapped; /* munmap, else tb__free */
} tb__blob;

static void tb__blob_release(void *context) {
    tb__blob *b = (tb__blob *)context;
    if (b == NULL || TB__ATOMIC_ADD(&b->refcount, -1) != 0) return;
#if !defined(_WIN32)
    if (b->mapped) {
        munmap(b->data, b->size);
        b->data = NULL;
    }
#endif
    tb__free(b->data);
    tb__free(b);
}

/* A blob owning `data` (from tb__alloc; freed here on error). */
static tb__blob *tb__blob_owning(unsigned char *data, size_t size) {
    tb__blob *b = (tb__blob *)tb__calloc(1, sizeof *b);
    if (b == NULL) {
        tb__free(data);
        return NULL;
    }
    b->refcount = 1;
    b->data = data;
    b->size = size;
    return b;
}

/* The whole file: memory-mapped where the system allows, else read into memory. */
static tb_status tb__blob_open(const char *fn, const char *path, tb__blob **out) {
    unsigned char *data = NULL;
    size_t size = 0;
#if !defined(_WIN32)
    struct stat st;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return tb__error(errno == ENOENT ? TB_ERR_NOT_FOUND : TB_ERR_IO, "%s: cannot open %s: %s",
                         fn, path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 ||
        (uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        int e = errno;
        close(fd);
        return tb__error(TB_ERR_IO, "%s: %s is not a regular file that can be read%s%s", fn, path,
                         e ? ": " : "", e ? strerror(e) : "");
    }
    size = (size_t)st.st_size;
    if (size > 0) {
        void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map != MAP_FAILED) {
            tb__blob *b;
            close(fd);
            b = (tb__blob *)tb__calloc(1, sizeof *b);
            if (b == NULL) {
                munmap(map, size);
                return tb_last_status();
            }
            b->refcount = 1;
            b->data = (unsigned char *)map;
            b->size = size;
            b->mapped = true;
            *out = b;
            return TB_OK;
        }
        data = (unsigned char *)tb__alloc(size);
        if (data == NULL) {
            close(fd);
            return tb_last_status();
        }
        {
            size_t got = 0;
            while (got < size) {
                ssize_t n = read(fd, data + got, size - got);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) {
                    int e = n < 0 ? errno : 0;
                    close(fd);
                    tb__free(data);
                    return tb__error(TB_ERR_IO, "%s: cannot read %s: %s", fn, path,
                                     e ? strerror(e) : "the file shrank while being read");
                }
                got += (size_t)n;
            }
        }
    }
    close(fd);
#else
    FILE *f = fopen(path, "rb");
    long end;
    if (f == NULL)
        return tb__error(errno == ENOENT ? TB_ERR_NOT_FOUND : TB_ERR_IO, "%s: cannot open %s: %s",
                         fn, path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (end = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return tb__error(TB_ERR_IO, "%s: cannot read %s", fn, path);
    }
    size = (size_t)end;
    if (size > 0) {
        data = (unsigned char *)tb__alloc(size);
        if (data == NULL || fread(data, 1, size, f) != size) {
            fclose(f);
            tb__free(data);
            return data == NULL ? tb_last_status()
                                : tb__error(TB_ERR_IO, "%s: cannot read %s", fn, path);
        }
    }
    fclose(f);
#endif
    *out = tb__blob_owning(data, size);
    return *out != NULL ? TB_OK : tb_last_status();
}

/* A tensor of `shape` whose elements are the bytes at `bytes` inside `blob`, little-endian
   unless `big_endian`. On a device that shares host memory it uses them in place when they are
   aligned for the dtype, in the host's byte order and (for bool) all 0 or 1; the tensor's
   buffer then holds a reference to the blob. Otherwise the tensor gets a converted copy. */
static tb_tensor *tb__blob_tensor(tb__blob *blob, const unsigned char *bytes, const tb_shape *shape,
                                  bool big_endian, const tb_device *device) {
    size_t nbytes = 0, width = tb_dtype_size(shape->dtype), i;
    bool in_place;
    unsigned char *copy;
    tb_tensor *t;
    if (tb_shape_nbytes(shape, &nbytes) != TB_OK) return NULL;
    if (nbytes == 0) return tb_tensor_from_host(NULL, shape, device);
    in_place =
        (uintptr_t)bytes % width == 0 && (width == 1 || big_endian != tb__host_is_little_endian());
    for (i = 0; in_place && shape->dtype == TB_BOOL && i < nbytes; ++i)
        in_place = bytes[i] <= 1;
    if (in_place) {
        t = tb_tensor_from_host_borrowed(bytes, shape, device);
        if (t == NULL) return NULL;
        TB__ATOMIC_ADD(&blob->refcount, 1);
        /* a device that copied: the blob is not needed by this tensor */
        if (!tb__data_set_host_release(tb_tensor_data(t), bytes, tb__blob_release, blob))
            tb__blob_release(blob);
        return t;
    }
    if ((width == 1 || big_endian != tb__host_is_little_endian()) && shape->dtype != TB_BOOL)
        return tb_tensor_from_host(bytes, shape, device); /* only misaligned: one copy */
    copy = (unsigned char *)tb__alloc(nbytes);
    if (copy == NULL) return NULL;
    memcpy(copy, bytes, nbytes);
    if (width > 1 && big_endian == tb__host_is_little_endian())
        tb__swap_bytes(copy, nbytes / width, width);
    if (shape->dtype == TB_BOOL)
        for (i = 0; i < nbytes; ++i)
            copy[i] = copy[i] != 0;
    t = tb_tensor_from_host(copy, shape, device);
    tb__free(copy);
    return t;
}

static uint16_t tb__le16(const unsigned char *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t tb__le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t tb__le64(const unsigned char *p) {
    return (uint64_t)tb__le32(p) | ((uint64_t)tb__le32(p + 4) << 32);
}

/* Whether `n` bytes are well-formed UTF-8 (no overlong forms, surrogates or values past
   U+10FFFF). */
static bool tb__utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len, k;
        uint32_t cp;
        if (c < 0x80) {
            ++i;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (n - i < len) return false;
        for (k = 1; k < len; ++k) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += len;
    }
    return true;
}

/* Writes a file through a temporary one and a rename. */
typedef struct tb__out_file {
    FILE *f;
    char *tmp;
    const char *path;
    uint64_t written;
    bool failed;
} tb__out_file;

static tb_status tb__out_open(const char *fn, const char *path, tb__out_file *o) {
    memset(o, 0, sizeof *o);
    o->path = path;
    o->tmp = tb__format("%s.tmp%lu", path, (unsigned long)tb__now_ns());
    if (o->tmp == NULL) return tb_last_status();
    o->f = fopen(o->tmp, "wb");
    if (o->f == NULL) {
        tb_status st = tb__error(TB_ERR_IO, "%s: cannot write %s: %s", fn, o->tmp, strerror(errno));
        tb__free(o->tmp);
        o->tmp = NULL;
        return st;
    }
    return TB_OK;
}

static void tb__out_write(tb__out_file *o, const void *data, size_t size) {
    if (o->failed || size == 0) return;
    if (fwrite(data, 1, size, o->f) != size)
        o->failed = true;
    else
        o->written += size;
}

/* Closes the file and renames it into place when `ok` and every write worked; removes it
   otherwise. Returns the error of a failed write. */
static tb_status tb__out_close(const char *fn, tb__out_file *o, bool ok) {
    tb_status st = TB_OK;
    int saved = 0;
    if (o->f != NULL) {
        if (fclose(o->f) != 0) o->failed = true;
        o->f = NULL;
    }
    if (ok && o->failed) saved = errno;
    if (ok && !o->failed && rename(o->tmp, o->path) != 0) {
        saved = errno;
        o->failed = true;
    }
    if (ok && o->failed)
        st = tb__error(TB_ERR_IO, "%s: cannot write %s: %s", fn, o->path,
                       saved ? strerror(saved) : "write failed");
    if (!ok || o->failed) remove(o->tmp);
    tb__free(o->tmp);
    o->tmp = NULL;
    return st;
}

/* The value of a synced tensor as contiguous host bytes, little-endian: the tensor's own buffer
   on the cpu backend (and a little-endian host), else a copy in *copy that the caller frees. */
static tb_status tb__tensor_le_bytes(tb_tensor *t, const unsigned char **bytes, size_t *nbytes,
                                     unsigned char **copy) {
    tb_shape shape = tb_tensor_shape(t);
    tb_backend_data *data;
    void *host;
    tb_status st = tb_shape_nbytes(&shape, nbytes);
    size_t width = tb_dtype_size(shape.dtype);
    *copy = NULL;
    if (st != TB_OK) return st;
    data = tb_tensor_data(t);
    if (data == NULL) return tb_last_status() != TB_OK ? tb_last_status() : TB_ERR_INTERNAL;
    host = tb__host_data(data);
    if (host != NULL && (width == 1 || tb__host_is_little_endian())) {
        *bytes = (const unsigned char *)host;
        return TB_OK;
    }
    *copy = (unsigned char *)tb__alloc(*nbytes ? *nbytes : 1);
    if (*copy == NULL) return tb_last_status();
    st = tb_tensor_to_host(t, *copy, *nbytes);
    if (st != TB_OK) {
        tb__free(*copy);
        *copy = NULL;
        return st;
    }
    if (width > 1 && !tb__host_is_little_endian()) tb__swap_bytes(*copy, *nbytes / width, width);
    *bytes = *copy;
    return TB_OK;
}

/* ---- safetensors ---- */

#define TB__ST_MAX_HEADER  100000000u /* the reference implementation's limit, in bytes */
#define TB__JSON_MAX_DEPTH 64

/* A JSON text (the safetensors header) being read; errors name the byte in the file. */
typedef struct tb__json {
    const char *text;
    size_t len;
    size_t pos;
    const char *fn;
    const char *path;
} tb__json;

static tb_status tb__json_fail(const tb__json *j, const char *what) {
    return tb__error(TB_ERR_FORMAT, "%s: %s: bad JSON header at byte %lu: %s", j->fn, j->path,
                     (unsigned long)(8 + j->pos), what);
}

static void tb__json_space(tb__json *j) {
    while (j->pos < j->len && (j->text[j->pos] == ' ' || j->text[j->pos] == '\t' ||
                               j->text[j->pos] == '\n' || j->text[j->pos] == '\r'))
        j->pos++;
}

static bool tb__json_accept(tb__json *j, char c) {
    tb__json_space(j);
    if (j->pos < j->len && j->text[j->pos] == c) {
        j->pos++;
        return true;
    }
    return false;
}

static int tb__json_hex4(const char *s) {
    int v = 0, i;
    for (i = 0; i < 4; ++i) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* A string, decoded into a new allocation *out (its length in *out_len; it may hold NUL bytes
   from \u0000), or only checked when out is NULL. The text was checked to be UTF-8. */
static tb_status tb__json_string(tb__json *j, char **out, size_t *out_len) {
    size_t end, n = 0;
    char *buf = NULL;
    tb__json_space(j);
    if (j->pos >= j->len || j->text[j->pos] != '"') return tb__json_fail(j, "expected a string");
    end = ++j->pos;
    while (end < j->len && j->text[end] != '"')
        end += j->text[end] == '\\' ? 2 : 1;
    if (end >= j->len) return tb__json_fail(j, "unterminated string");
    if (out != NULL) {
        buf = (char *)tb__alloc(end - j->pos + 1); /* decoding never lengthens the text */
        if (buf == NULL) return tb_last_status();
    }
    while (j->pos < end) {
        unsigned char c = (unsigned char)j->text[j->pos];
        uint32_t cp;
        if (c < 0x20) {
            tb__free(buf);
            return tb__json_fail(j, "control character in a string");
        }
        if (c != '\\') {
            if (buf != NULL) buf[n] = (char)c;
            n++;
            j->pos++;
            continue;
        }
        c = (unsigned char)j->text[++j->pos]; /* before `end`: the scan skipped escapes */
        switch (c) {
        case '"':
        case '\\':
        case '/':
            cp = c;
            break;
        case 'b':
            cp = 8;
            break;
        case 'f':
            cp = 12;
            break;
        case 'n':
            cp = 10;
            break;
        case 'r':
            cp = 13;
            break;
        case 't':
            cp = 9;
            break;
        case 'u': {
            int hi = j->pos + 4 < end ? tb__json_hex4(j->text + j->pos + 1) : -1;
            if (hi < 0) {
                tb__free(buf);
                return tb__json_fail(j, "\\u needs four hex digits");
            }
            cp = (uint32_t)hi;
            j->pos += 4;
            if (cp >= 0xdc00 && cp <= 0xdfff) {
                tb__free(buf);
                return tb__json_fail(j, "lone low surrogate");
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                int lo =
                    j->pos + 6 < end && j->text[j->pos + 1] == '\\' && j->text[j->pos + 2] == 'u'
                        ? tb__json_hex4(j->text + j->pos + 3)
                        : -1;
                if (lo < 0xdc00 || lo > 0xdfff) {
                    tb__free(buf);
                    return tb__json_fail(j, "high surrogate without a low one");
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
                j->pos += 6;
            }
            break;
        }
        default:
            tb__free(buf);
            return tb__json_fail(j, "bad escape in a string");
        }
        j->pos++;
        if (buf != NULL) { /* UTF-8 of cp: never longer than its escape */
            if (cp < 0x80) {
                buf[n] = (char)cp;
            } else if (cp < 0x800) {
                buf[n] = (char)(0xc0 | (cp >> 6));
                buf[++n] = (char)(0x80 | (cp & 0x3f));
            } else if (cp < 0x10000) {
                buf[n] = (char)(0xe0 | (cp >> 12));
                buf[++n] = (char)(0x80 | ((cp >> 6) & 0x3f));
                buf[++n] = (char)(0x80 | (cp & 0x3f));
            } else {
                buf[n] = (char)(0xf0 | (cp >> 18));
                buf[++n] = (char)(0x80 | ((cp >> 12) & 0x3f));
                buf[++n] = (char)(0x80 | ((cp >> 6) & 0x3f));
                buf[++n] = (char)(0x80 | (cp & 0x3f));
            }
        } else {
            n += cp < 0x80 ? 0 : cp < 0x800 ? 1 : cp < 0x10000 ? 2 : 3;
        }
        n++;
    }
    j->pos = end + 1;
    if (buf != NULL) {
        buf[n] = '\0';
        *out = buf;
    }
    if (out_len != NULL) *out_len = n;
    return TB_OK;
}

/* A non-negative integer up to INT64_MAX, without fraction or exponent. */
static tb_status tb__json_uint(tb__json *j, uint64_t *out) {
    uint64_t v = 0;
    size_t start;
    tb__json_space(j);
    start = j->pos;
    if (j->pos < j->len && j->text[j->pos] == '-') return tb__json_fail(j, "negative number");
    while (j->pos < j->len && j->text[j->pos] >= '0' && j->text[j->pos] <= '9') {
        unsigned d = (unsigned)(j->text[j->pos] - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10) return tb__json_fail(j, "number too large");
        v = v * 10 + d;
        j->pos++;
    }
    if (j->pos == start) return tb__json_fail(j, "expected a non-negative integer");
    if (j->pos - start > 1 && j->text[start] == '0') return tb__json_fail(j, "leading zero");
    if (j->pos < j->len &&
        (j->text[j->pos] == '.' || j->text[j->pos] == 'e' || j->text[j->pos] == 'E'))
        return tb__json_fail(j, "expected an integer, not a fraction");
    *out = v;
    return TB_OK;
}

/* Checks and skips any JSON value; `depth` counts the containers around it (a container may
   be opened while fewer than TB__JSON_MAX_DEPTH are open). */
static tb_status tb__json_skip(tb__json *j, int depth) {
    tb_status st;
    char c;
    tb__json_space(j);
    if (j->pos >= j->len) return tb__json_fail(j, "expected a value");
    c = j->text[j->pos];
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        if (depth >= TB__JSON_MAX_DEPTH) return tb__json_fail(j, "nested deeper than 64 levels");
        j->pos++;
        if (tb__json_accept(j, close)) return TB_OK;
        for (;;) {
            if (c == '{') {
                st = tb__json_string(j, NULL, NULL);
                if (st != TB_OK) return st;
                if (!tb__json_accept(j, ':')) return tb__json_fail(j, "expected ':'");
            }
            st = tb__json_skip(j, depth + 1);
            if (st != TB_OK) return st;
            if (tb__json_accept(j, close)) return TB_OK;
            if (!tb__json_accept(j, ','))
                return tb__json_fail(j, "expected ',' or a closing bracket");
        }
    }
    if (c == '"') return tb__json_string(j, NULL, NULL);
    if (c == 't' || c == 'f' || c == 'n') {
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t n = strlen(word);
        if (j->len - j->pos < n || memcmp(j->text + j->pos, word, n) != 0)
            return tb__json_fail(j, "expected a value");
        j->pos += n;
        return TB_OK;
    }
    if (c == '-' || (c >= '0' && c <= '9')) { /* JSON's number grammar */
        size_t digits;
        if (c == '-') j->pos++;
        for (digits = 0; j->pos < j->len && j->text[j->pos] >= '0' && j->text[j->pos] <= '9';
             ++digits)
            j->pos++;
        if (digits == 0) return tb__json_fail(j, "bad number");
        if (digits > 1 && j->text[j->pos - digits] == '0') return tb__json_fail(j, "leading zero");
        if (j->pos < j->len && j->text[j->pos] == '.') {
            j->pos++;
            for (digits = 0; j->pos < j->len && j->text[j->pos] >= '0' && j->text[j->pos] <= '9';
                 ++digits)
                j->pos++;
            if (digits == 0) return tb__json_fail(j, "bad number");
        }
        if (j->pos < j->len && (j->text[j->pos] == 'e' || j->text[j->pos] == 'E')) {
            j->pos++;
            if (j->pos < j->len && (j->text[j->pos] == '+' || j->text[j->pos] == '-')) j->pos++;
            for (digits = 0; j->pos < j->len && j->text[j->pos] >= '0' && j->text[j->pos] <= '9';
                 ++digits)
                j->pos++;
            if (digits == 0) return tb__json_fail(j, "bad number");
        }
        return TB_OK;
    }
    return tb__json_fail(j, "expected a value");
}

/* The safetensors dtypes the library reads; F16 and BF16 are widened to f32. */
typedef struct tb__st_dtype {
    const char *name;
    tb_dtype dtype;
    uint8_t width; /* bytes per element in the file */
} tb__st_dtype;

static const tb__st_dtype tb__st_dtypes[] = {
    {"F64", TB_F64, 8}, {"F32", TB_F32, 4}, {"F16", TB_F32, 2}, {"BF16", TB_F32, 2},
    {"I64", TB_I64, 8}, {"I32", TB_I32, 4}, {"U8", TB_U8, 1},   {"BOOL", TB_BOOL, 1},
};
#define TB__ST_F16  2
#define TB__ST_BF16 3

/* The safetensors name of a library dtype; NULL for one it cannot hold. */
static const char *tb__st_dtype_name(tb_dtype dtype) {
    switch (dtype) {
    case TB_F32:
        return "F32";
    case TB_F64:
        return "F64";
    case TB_I32:
        return "I32";
    case TB_I64:
        return "I64";
    case TB_U8:
        return "U8";
    case TB_BOOL:
        return "BOOL";
    default:
        return NULL;
    }
}

/* One tensor of the header. The shape is parsed again (from shape_pos) when the tensor is made,
   which keeps this small: the entries never take more memory than the header's text. */
typedef struct tb__st_entry {
    char *name;
    size_t shape_pos;
    uint64_t begin, end;
    uint8_t dtype; /* index in tb__st_dtypes */
} tb__st_entry;

/* "[d0, d1, ...]" into dims; more than TB_MAX_RANK dims is TB_ERR_UNSUPPORTED. */
static tb_status tb__st_shape(tb__json *j, const char *name, int64_t dims[TB_MAX_RANK],
                              int32_t *rank) {
    *rank = 0;
    if (!tb__json_accept(j, '[')) return tb__json_fail(j, "'shape' must be a list of integers");
    if (tb__json_accept(j, ']')) return TB_OK;
    for (;;) {
        uint64_t d;
        tb_status st = tb__json_uint(j, &d);
        if (st != TB_OK) return st;
        if (*rank == TB_MAX_RANK)
            return tb__error(TB_ERR_UNSUPPORTED,
                             "%s: %s: tensor '%.200s' has more than %d dimensions, the most the "
                             "library supports",
                             j->fn, j->path, name, TB_MAX_RANK);
        dims[(*rank)++] = (int64_t)d;
        if (tb__json_accept(j, ']')) return TB_OK;
        if (!tb__json_accept(j, ',')) return tb__json_fail(j, "expected ',' or ']' in 'shape'");
    }
}

/* One tensor's object: dtype, shape, data_offsets (other keys are skipped, as the reference
   implementation does), checked against each other. */
static tb_status tb__st_tensor_entry(tb__json *j, tb__st_entry *e) {
    bool has_dtype = false, has_shape = false, has_offsets = false;
    int64_t dims[TB_MAX_RANK];
    int32_t rank = 0, d;
    uint64_t numel = 1, need;
    tb_status st = TB_OK;
    if (!tb__json_accept(j, '{')) return tb__json_fail(j, "a tensor's entry must be an object");
    if (!tb__json_accept(j, '}')) {
        for (;;) {
            char *key = NULL;
            st = tb__json_string(j, &key, NULL);
            if (st != TB_OK) return st;
            if (!tb__json_accept(j, ':')) {
                tb__free(key);
                return tb__json_fail(j, "expected ':'");
            }
            if ((strcmp(key, "dtype") == 0 && has_dtype) ||
                (strcmp(key, "shape") == 0 && has_shape) ||
                (strcmp(key, "data_offsets") == 0 && has_offsets)) {
                st = tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s' has '%s' twice", j->fn,
                               j->path, e->name, key);
            } else if (strcmp(key, "dtype") == 0) {
                char *name = NULL;
                size_t i, n = sizeof tb__st_dtypes / sizeof tb__st_dtypes[0];
                has_dtype = true;
                st = tb__json_string(j, &name, NULL);
                for (i = 0; st == TB_OK && i < n && strcmp(name, tb__st_dtypes[i].name) != 0; ++i)
                    ;
                if (st == TB_OK && i == n)
                    st = tb__error(TB_ERR_DTYPE,
                                   "%s: %s: tensor '%.200s' has dtype '%.32s', which the library "
                                   "does not read (it reads F32 F64 I32 I64 U8 BOOL, and F16 BF16 "
                                   "widened to f32)",
                                   j->fn, j->path, e->name, name);
                e->dtype = (uint8_t)i;
                tb__free(name);
            } else if (strcmp(key, "shape") == 0) {
                has_shape = true;
                tb__json_space(j);
                e->shape_pos = j->pos;
                st = tb__st_shape(j, e->name, dims, &rank);
            } else if (strcmp(key, "data_offsets") == 0) {
                has_offsets = true;
                if (!tb__json_accept(j, '['))
                    st = tb__json_fail(j, "'data_offsets' must be [begin, end]");
                if (st == TB_OK) st = tb__json_uint(j, &e->begin);
                if (st == TB_OK && !tb__json_accept(j, ','))
                    st = tb__json_fail(j, "'data_offsets' must be [begin, end]");
                if (st == TB_OK) st = tb__json_uint(j, &e->end);
                if (st == TB_OK && !tb__json_accept(j, ']'))
                    st = tb__json_fail(j, "'data_offsets' must be [begin, end]");
            } else {
                st = tb__json_skip(j, 2); /* inside the header's and the tensor's objects */
            }
            tb__free(key);
            if (st != TB_OK) return st;
            if (tb__json_accept(j, '}')) break;
            if (!tb__json_accept(j, ',')) return tb__json_fail(j, "expected ',' or '}'");
        }
    }
    if (!has_dtype || !has_shape || !has_offsets)
        return tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s' lacks '%s'", j->fn, j->path,
                         e->name,
                         !has_dtype   ? "dtype"
                         : !has_shape ? "shape"
                                      : "data_offsets");
    if (e->begin > e->end)
        return tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s' has data_offsets [%llu, %llu]",
                         j->fn, j->path, e->name, (unsigned long long)e->begin,
                         (unsigned long long)e->end);
    for (d = 0; d < rank; ++d) {
        if (dims[d] != 0 && numel > (uint64_t)INT64_MAX / 8 / (uint64_t)dims[d])
            return tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s': the shape's size overflows",
                             j->fn, j->path, e->name);
        numel *= (uint64_t)dims[d];
    }
    need = numel * tb__st_dtypes[e->dtype].width;
    if (need != e->end - e->begin)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: tensor '%.200s': data_offsets [%llu, %llu] hold %llu bytes but "
                         "%s of %llu elements needs %llu",
                         j->fn, j->path, e->name, (unsigned long long)e->begin,
                         (unsigned long long)e->end, (unsigned long long)(e->end - e->begin),
                         tb__st_dtypes[e->dtype].name, (unsigned long long)numel,
                         (unsigned long long)need);
    return TB_OK;
}

/* "__metadata__": null or an object of strings, into the set. */
static tb_status tb__st_metadata(tb__json *j, tb_tensor_set *set) {
    tb__json_space(j);
    if (j->len - j->pos >= 4 && memcmp(j->text + j->pos, "null", 4) == 0) {
        j->pos += 4;
        return TB_OK;
    }
    if (!tb__json_accept(j, '{')) return tb__json_fail(j, "'__metadata__' must be an object");
    if (tb__json_accept(j, '}')) return TB_OK;
    for (;;) {
        char *key = NULL, *value = NULL;
        size_t key_len = 0, value_len = 0;
        tb_status st = tb__json_string(j, &key, &key_len);
        if (st == TB_OK && !tb__json_accept(j, ':')) st = tb__json_fail(j, "expected ':'");
        tb__json_space(j);
        if (st == TB_OK && (j->pos >= j->len || j->text[j->pos] != '"'))
            st = tb__json_fail(j, "'__metadata__' values must be strings");
        if (st == TB_OK) st = tb__json_string(j, &value, &value_len);
        if (st == TB_OK && (key_len != strlen(key) || value_len != strlen(value)))
            st = tb__error(TB_ERR_FORMAT, "%s: %s: a metadata string holds a NUL character", j->fn,
                           j->path);
        if (st == TB_OK && tb__set_meta_find(set, key) != TB__SET_NONE)
            st = tb__error(TB_ERR_FORMAT, "%s: %s: metadata key '%.200s' appears twice", j->fn,
                           j->path, key);
        if (st == TB_OK && tb_tensor_set_set_metadata(set, key, value) != TB_OK)
            st = tb__error(tb_last_status() == TB_ERR_OUT_OF_MEMORY ? TB_ERR_OUT_OF_MEMORY
                                                                    : TB_ERR_FORMAT,
                           "%s: %s: metadata key '%.200s' is empty or longer than %d bytes", j->fn,
                           j->path, key, TB_TENSOR_SET_MAX_NAME);
        tb__free(key);
        tb__free(value);
        if (st != TB_OK) return st;
        if (tb__json_accept(j, '}')) return TB_OK;
        if (!tb__json_accept(j, ',')) return tb__json_fail(j, "expected ',' or '}'");
    }
}

/* Counts the members of the header's top-level object, checking the JSON as a whole. */
static tb_status tb__st_count(tb__json *j, size_t *count) {
    tb_status st;
    *count = 0;
    if (!tb__json_accept(j, '{')) return tb__json_fail(j, "the header must be a JSON object");
    while (!tb__json_accept(j, '}')) {
        st = tb__json_string(j, NULL, NULL);
        if (st != TB_OK) return st;
        if (!tb__json_accept(j, ':')) return tb__json_fail(j, "expected ':'");
        st = tb__json_skip(j, 1);
        if (st != TB_OK) return st;
        ++*count;
        if (tb__json_accept(j, '}')) break;
        if (!tb__json_accept(j, ',')) return tb__json_fail(j, "expected ',' or '}'");
        tb__json_space(j);
        if (j->pos < j->len && j->text[j->pos] == '}') return tb__json_fail(j, "expected a string");
    }
    tb__json_space(j);
    if (j->pos != j->len) return tb__json_fail(j, "text after the header's object");
    return TB_OK;
}

static int tb__st_by_name(const void *a, const void *b) {
    return strcmp((*(tb__st_entry *const *)a)->name, (*(tb__st_entry *const *)b)->name);
}

static int tb__st_by_offset(const void *a, const void *b) {
    const tb__st_entry *x = *(tb__st_entry *const *)a, *y = *(tb__st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Names unique; the tensors' data tile [0, data_len) without gaps or overlaps. */
static tb_status tb__st_check_layout(const char *path, tb__st_entry *entries, size_t count,
                                     uint64_t data_len) {
    tb__st_entry **order;
    uint64_t expected = 0;
    size_t i;
    tb_status st = TB_OK;
    if (count == 0) {
        if (data_len == 0) return TB_OK;
        return tb__error(TB_ERR_FORMAT,
                         "tb_safetensors_load: %s: %llu bytes of data follow a header that "
                         "lists no tensor",
                         path, (unsigned long long)data_len);
    }
    order = (tb__st_entry **)tb__calloc(count, sizeof *order);
    if (order == NULL) return tb_last_status();
    for (i = 0; i < count; ++i)
        order[i] = &entries[i];
    qsort(order, count, sizeof *order, tb__st_by_name);
    for (i = 1; i < count && st == TB_OK; ++i)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0)
            st = tb__error(TB_ERR_FORMAT, "tb_safetensors_load: %s: tensor '%.200s' appears twice",
                           path, order[i]->name);
    qsort(order, count, sizeof *order, tb__st_by_offset);
    for (i = 0; i < count && st == TB_OK; ++i) {
        if (order[i]->begin != expected)
            st = tb__error(TB_ERR_FORMAT,
                           "tb_safetensors_load: %s: tensor '%.200s' starts at data byte %llu "
                           "where %llu was expected (%s)",
                           path, order[i]->name, (unsigned long long)order[i]->begin,
                           (unsigned long long)expected,
                           order[i]->begin < expected ? "it overlaps another tensor"
                                                      : "a gap between tensors");
        expected = order[i]->end;
    }
    if (st == TB_OK && expected != data_len)
        st = tb__error(TB_ERR_FORMAT,
                       "tb_safetensors_load: %s: the tensors end at data byte %llu but the file "
                       "holds %llu bytes of data",
                       path, (unsigned long long)expected, (unsigned long long)data_len);
    tb__free(order);
    return st;
}

static float tb__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
    float f;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        exp = 113;
        while ((mant & 0x400) == 0) {
            mant <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
}

/* An F16 or BF16 tensor widened to f32 (a copy). */
static tb_tensor *tb__st_widen(const unsigned char *bytes, const tb_shape *shape, bool bf16,
                               const tb_device *device) {
    int64_t numel = 0, i;
    float *values;
    tb_tensor *t;
    if (tb_shape_numel(shape, &numel) != TB_OK) return NULL;
    values = (float *)tb__alloc(numel ? (size_t)numel * 4 : 1);
    if (values == NULL) return NULL;
    for (i = 0; i < numel; ++i) {
        uint16_t h = tb__le16(bytes + 2 * i);
        if (bf16) {
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&values[i], &bits, 4);
        } else {
            values[i] = tb__f16_to_f32(h);
        }
    }
    t = tb_tensor_from_host(values, shape, device);
    tb__free(values);
    return t;
}

TBDEF tb_tensor_set *tb_safetensors_load(const char *path, const tb_device *device) {
    static const char fn[] = "tb_safetensors_load";
    tb__blob *blob = NULL;
    tb_tensor_set *set = NULL;
    tb__st_entry *entries = NULL;
    size_t count = 0, parsed = 0, i;
    uint64_t header_len;
    bool seen_metadata = false;
    tb__json j;
    tb_device dev;
    tb_status st;
    tb__ensure_setup();
    if (path == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: path is NULL", fn);
        return NULL;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) return NULL;
    st = tb__blob_open(fn, path, &blob);
    if (st != TB_OK) return NULL;
    if (blob->size < 8) {
        tb__error(TB_ERR_FORMAT, "%s: %s is %lu bytes, shorter than the 8-byte header length", fn,
                  path, (unsigned long)blob->size);
        goto fail;
    }
    header_len = tb__le64(blob->data);
    if (header_len > blob->size - 8 || header_len > TB__ST_MAX_HEADER) {
        tb__error(TB_ERR_FORMAT, "%s: %s: the header claims %llu bytes but %s", fn, path,
                  (unsigned long long)header_len,
                  header_len > blob->size - 8 ? "the file is shorter"
                                              : "safetensors allows at most 100000000");
        goto fail;
    }
    memset(&j, 0, sizeof j);
    j.text = (const char *)blob->data + 8;
    j.len = (size_t)header_len;
    j.fn = fn;
    j.path = path;
    if (!tb__utf8_valid(blob->data + 8, j.len)) {
        tb__error(TB_ERR_FORMAT, "%s: %s: the header is not valid UTF-8", fn, path);
        goto fail;
    }
    if (tb__st_count(&j, &count) != TB_OK) goto fail;
    set = tb_tensor_set_new();
    entries = (tb__st_entry *)tb__calloc(count ? count : 1, sizeof *entries);
    if (set == NULL || entries == NULL) goto fail;
    j.pos = 0;
    tb__json_accept(&j, '{');
    for (i = 0; i < count; ++i) {
        char *key = NULL;
        size_t key_len = 0;
        if (i > 0) tb__json_accept(&j, ',');
        if (tb__json_string(&j, &key, &key_len) != TB_OK) goto fail;
        tb__json_accept(&j, ':');
        if (strcmp(key, "__metadata__") == 0 && key_len == 12) {
            tb__free(key);
            if (seen_metadata) {
                tb__error(TB_ERR_FORMAT, "%s: %s: '__metadata__' appears twice", fn, path);
                goto fail;
            }
            seen_metadata = true;
            if (tb__st_metadata(&j, set) != TB_OK) goto fail;
            continue;
        }
        entries[parsed].name = key;
        parsed++;
        if (key_len != strlen(key) || key_len == 0 || key_len > TB_TENSOR_SET_MAX_NAME) {
            tb__error(TB_ERR_FORMAT,
                      "%s: %s: a tensor name is empty, longer than %d bytes or "
                      "holds a NUL character",
                      fn, path, TB_TENSOR_SET_MAX_NAME);
            goto fail;
        }
        if (tb__st_tensor_entry(&j, &entries[parsed - 1]) != TB_OK) goto fail;
    }
    if (tb__st_check_layout(path, entries, parsed, blob->size - 8 - header_len) != TB_OK) goto fail;
    for (i = 0; i < parsed; ++i) {
        const tb__st_entry *e = &entries[i];
        const unsigned char *bytes = blob->data + 8 + header_len + e->begin;
        int64_t dims[TB_MAX_RANK];
        int32_t rank = 0;
        tb_shape shape;
        tb_tensor *t;
        j.pos = e->shape_pos;
        tb__st_shape(&j, e->name, dims, &rank);
        if (tb_shape_make(&shape, tb__st_dtypes[e->dtype].dtype, rank, dims) != TB_OK) {
            tb__error(TB_ERR_FORMAT, "%s: %s: tensor '%.200s' is too large for this machine", fn,
                      path, e->name);
            goto fail;
        }
        if (e->dtype == TB__ST_F16 || e->dtype == TB__ST_BF16)
            t = tb__st_widen(bytes, &shape, e->dtype == TB__ST_BF16, &dev);
        else
            t = tb__blob_tensor(blob, bytes, &shape, false, &dev);
        if (t == NULL || tb__set_add_owned(fn, set, e->name, t) != TB_OK) goto fail;
    }
    for (i = 0; i < parsed; ++i)
        tb__free(entries[i].name);
    tb__free(entries);
    tb__blob_release(blob);
    return set;
fail:
    for (i = 0; i < parsed; ++i)
        tb__free(entries[i].name);
    tb__free(entries);
    tb_tensor_set_free(set);
    tb__blob_release(blob);
    return NULL;
}

/* A JSON string literal of `s` (the caller checked it is UTF-8). */
static void tb__json_append_string(tb__str *out, const char *s) {
    tb__str_append(out, "\"");
    for (; *s != '\0'; ++s) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            tb__str_append(out, "\\%c", (char)c);
        else if (c < 0x20)
            tb__str_append(out, "\\u%04x", (unsigned)c);
        else
            tb__str_append(out, "%c", (char)c);
    }
    tb__str_append(out, "\"");
}

static bool tb__utf8_string(const char *s) {
    return tb__utf8_valid((const unsigned char *)s, strlen(s));
}

TBDEF tb_status tb_safetensors_save(const char *path, const tb_tensor_set *set) {
    static const char fn[] = "tb_safetensors_save";
    static const size_t widths[4] = {8, 4, 2, 1};
    size_t *order = NULL, n = 0, i, w;
    uint64_t *begin = NULL, offset = 0;
    unsigned char length[8];
    tb__str header;
    tb__out_file out;
    tb_status st = TB_OK;
    tb__ensure_setup();
    if (path == NULL || set == NULL)
        return tb__error(TB_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         path == NULL ? "path" : "set");
    for (i = 0; i < set->count; ++i) {
        tb_shape shape = tb_tensor_shape(set->entries[i].tensor);
        if (!tb__utf8_string(set->entries[i].name) ||
            strcmp(set->entries[i].name, "__metadata__") == 0)
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: tensor name '%.200s' is not valid UTF-8 or is the reserved "
                             "'__metadata__'",
                             fn, set->entries[i].name);
        if (tb__st_dtype_name(shape.dtype) == NULL)
            return tb__error(TB_ERR_DTYPE,
                             "%s: tensor '%.200s' has dtype %s, which safetensors "
                             "cannot hold here",
                             fn, set->entries[i].name, tb_dtype_name(shape.dtype));
    }
    for (i = 0; i < set->meta_count; ++i)
        if (!tb__utf8_string(set->meta[i].key) || !tb__utf8_string(set->meta[i].value))
            return tb__error(TB_ERR_INVALID_ARGUMENT,
                             "%s: metadata key '%.200s' or its value is not valid UTF-8", fn,
                             set->meta[i].key);
    st = tb__set_sync(set);
    if (st != TB_OK) return st;
    order = (size_t *)tb__calloc(set->count ? set->count : 1, sizeof *order);
    begin = (uint64_t *)tb__calloc(set->count ? set->count : 1, sizeof *begin);
    if (order == NULL || begin == NULL) {
        tb__free(order);
        tb__free(begin);
        return tb_last_status();
    }
    /* the data: widest dtypes first, each group in the set's order, so all stay aligned */
    for (w = 0; w < 4; ++w) {
        for (i = 0; i < set->count; ++i) {
            tb_shape shape = tb_tensor_shape(set->entries[i].tensor);
            size_t nbytes = 0;
            if (tb_dtype_size(shape.dtype) != widths[w]) continue;
            tb_shape_nbytes(&shape, &nbytes);
            order[n++] = i;
            begin[i] = offset;
            offset += nbytes;
        }
    }
    memset(&header, 0, sizeof header);
    tb__str_append(&header, "{");
    if (set->meta_count > 0) {
        tb__str_append(&header, "\"__metadata__\":{");
        for (i = 0; i < set->meta_count; ++i) {
            if (i > 0) tb__str_append(&header, ",");
            tb__json_append_string(&header, set->meta[i].key);
            tb__str_append(&header, ":");
            tb__json_append_string(&header, set->meta[i].value);
        }
        tb__str_append(&header, "}");
    }
    for (i = 0; i < set->count; ++i) {
        tb_shape shape = tb_tensor_shape(set->entries[i].tensor);
        size_t nbytes = 0;
        int32_t d;
        tb_shape_nbytes(&shape, &nbytes);
        if (i > 0 || set->meta_count > 0) tb__str_append(&header, ",");
        tb__json_append_string(&header, set->entries[i].name);
        tb__str_append(&header, ":{\"dtype\":\"%s\",\"shape\":[", tb__st_dtype_name(shape.dtype));
        for (d = 0; d < shape.rank; ++d)
            tb__str_append(&header, "%s%lld", d ? "," : "", (long long)shape.dims[d]);
        tb__str_append(&header, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)begin[i],
                       (unsigned long long)(begin[i] + nbytes));
    }
    tb__str_append(&header, "}");
    while (!header.failed && (8 + header.len) % 8 != 0)
        tb__str_append(&header, " ");
    if (header.failed) {
        st = tb__error(TB_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    } else {
        for (i = 0; i < 8; ++i)
            length[i] = (unsigned char)(((uint64_t)header.len >> (8 * i)) & 0xff);
        st = tb__out_open(fn, path, &out);
    }
    if (st == TB_OK) {
        tb__out_write(&out, length, 8);
        tb__out_write(&out, header.data, header.len);
        for (i = 0; i < n && st == TB_OK && !out.failed; ++i) {
            const unsigned char *bytes = NULL;
            unsigned char *copy = NULL;
            size_t nbytes = 0;
            st = tb__tensor_le_bytes(set->entries[order[i]].tensor, &bytes, &nbytes, &copy);
            if (st == TB_OK) tb__out_write(&out, bytes, nbytes);
            tb__free(copy);
        }
        if (st == TB_OK)
            st = tb__out_close(fn, &out, true);
        else
            tb__out_close(fn, &out, false);
    }
    tb__str_free(&header);
    tb__free(order);
    tb__free(begin);
    return st;
}

#undef TB__ST_F16
#undef TB__ST_BF16

/* ---- .npz: CRC-32, inflate, zip ---- */

/* CRC-32 (zip's, reflected 0xedb88320), eight bytes per step ("slicing by 8"). */
typedef struct tb__crc32_tables {
    uint32_t t[8][256];
} tb__crc32_tables;

static void tb__crc32_init(tb__crc32_tables *c) {
    uint32_t n, k, v;
    for (n = 0; n < 256; ++n) {
        for (v = n, k = 0; k < 8; ++k)
            v = (v & 1) ? 0xedb88320u ^ (v >> 1) : v >> 1;
        c->t[0][n] = v;
    }
    for (k = 1; k < 8; ++k)
        for (n = 0; n < 256; ++n)
            c->t[k][n] = (c->t[k - 1][n] >> 8) ^ c->t[0][c->t[k - 1][n] & 0xff];
}

static uint32_t tb__crc32(const tb__crc32_tables *c, uint32_t crc, const unsigned char *p,
                          size_t n) {
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = crc ^ tb__le32(p), hi = tb__le32(p + 4);
        crc = c->t[7][lo & 0xff] ^ c->t[6][(lo >> 8) & 0xff] ^ c->t[5][(lo >> 16) & 0xff] ^
              c->t[4][lo >> 24] ^ c->t[3][hi & 0xff] ^ c->t[2][(hi >> 8) & 0xff] ^
              c->t[1][(hi >> 16) & 0xff] ^ c->t[0][hi >> 24];
    }
    while (n-- > 0)
        crc = c->t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* Deflate (RFC 1951) into a buffer of known size. Huffman codes decode through a table for codes
   up to TB__HUFF_FAST bits and bit by bit (canonical order) for longer ones. */
#define TB__HUFF_FAST 9

typedef struct tb__huff {
    uint16_t fast[1 << TB__HUFF_FAST]; /* symbol | length << 9; 0: a longer code */
    uint16_t count[16];                /* codes of each length */
    uint16_t symbol[288];              /* symbols in canonical order */
} tb__huff;

typedef struct tb__inflater {
    const unsigned char *in;
    size_t in_len, in_pos;
    uint64_t bits;
    int nbits;
    int pad; /* zero bytes added past the end of the input */
    unsigned char *out;
    size_t out_len, out_pos;
    bool full; /* stopped because the output was full: out holds its first out_len bytes */
    bool done; /* the last block ended */
} tb__inflater;

static void tb__inf_refill(tb__inflater *s) {
    while (s->nbits <= 56) {
        if (s->in_pos < s->in_len)
            s->bits |= (uint64_t)s->in[s->in_pos++] << s->nbits;
        else
            s->pad++;
        s->nbits += 8;
    }
}

static uint32_t tb__inf_bits(tb__inflater *s, int n) {
    uint32_t v;
    if (s->nbits < n) tb__inf_refill(s);
    v = (uint32_t)(s->bits & ((1u << n) - 1));
    s->bits >>= n;
    s->nbits -= n;
    return v;
}

/* Whether the decoder read past the end of the input. */
static bool tb__inf_overrun(const tb__inflater *s) {
    return s->nbits < 8 * s->pad;
}

static bool tb__huff_build(tb__huff *h, const uint8_t *lengths, int n) {
    uint16_t offs[16];
    int len, sym, left = 1, index = 0;
    uint32_t code = 0;
    memset(h->count, 0, sizeof h->count);
    memset(h->fast, 0, sizeof h->fast);
    for (sym = 0; sym < n; ++sym)
        h->count[lengths[sym]]++;
    h->count[0] = 0;
    for (len = 1; len <= 15; ++len) {
        left = (left << 1) - h->count[len];
        if (left < 0) return false; /* over-subscribed */
    }
    offs[1] = 0;
    for (len = 1; len < 15; ++len)
        offs[len + 1] = (uint16_t)(offs[len] + h->count[len]);
    for (sym = 0; sym < n; ++sym)
        if (lengths[sym] != 0) h->symbol[offs[lengths[sym]]++] = (uint16_t)sym;
    for (len = 1; len <= TB__HUFF_FAST; ++len, code <<= 1) {
        int k;
        for (k = 0; k < h->count[len]; ++k, ++code, ++index) {
            uint32_t rev = 0, r;
            int b;
            for (b = 0; b < len; ++b)
                rev |= ((code >> b) & 1u) << (len - 1 - b);
            for (r = rev; r < (1u << TB__HUFF_FAST); r += 1u << len)
                h->fast[r] = (uint16_t)(h->symbol[index] | (len << 9));
        }
    }
    return true;
}

/* The next symbol, or -1 for a code the table does not have. */
static int tb__huff_decode(tb__inflater *s, const tb__huff *h) {
    int len, code = 0, first = 0, index = 0;
    uint16_t e;
    if (s->nbits < 16) tb__inf_refill(s);
    e = h->fast[s->bits & ((1u << TB__HUFF_FAST) - 1)];
    if (e != 0) {
        s->bits >>= e >> 9;
        s->nbits -= e >> 9;
        return e & 511;
    }
    for (len = 1; len <= 15; ++len) {
        int count = h->count[len];
        code |= (int)(s->bits & 1);
        s->bits >>= 1;
        s->nbits--;
        if (code - count < first) return h->symbol[index + (code - first)];
        index += count;
        first = (first + count) << 1;
        code <<= 1;
    }
    return -1;
}

static const uint16_t tb__inf_len_base[29] = {3,  4,  5,  6,   7,   8,   9,   10,  11, 13,
                                              15, 17, 19, 23,  27,  31,  35,  43,  51, 59,
                                              67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t tb__inf_len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                              2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t tb__inf_dist_base[30] = {
    1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
    193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
static const uint8_t tb__inf_dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                               6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

/* One block's symbols until its end code. NULL on success, else the reason. */
static const char *tb__inf_codes(tb__inflater *s, const tb__huff *lit, const tb__huff *dist) {
    for (;;) {
        int sym = tb__huff_decode(s, lit);
        if (sym < 0) return "a literal/length code that the block's table does not have";
        if (tb__inf_overrun(s)) return "the compressed data end in the middle of a block";
        if (sym < 256) {
            if (s->out_pos >= s->out_len) {
                s->full = true;
                return "more data than the entry's size";
            }
            s->out[s->out_pos++] = (unsigned char)sym;
        } else if (sym == 256) {
            return NULL;
        } else {
            size_t len, d, k;
            int dsym;
            sym -= 257;
            if (sym >= 29) return "an invalid length code";
            len = tb__inf_len_base[sym] + tb__inf_bits(s, tb__inf_len_extra[sym]);
            dsym = tb__huff_decode(s, dist);
            if (dsym < 0 || dsym >= 30) return "an invalid distance code";
            d = tb__inf_dist_base[dsym] + tb__inf_bits(s, tb__inf_dist_extra[dsym]);
            if (tb__inf_overrun(s)) return "the compressed data end in the middle of a block";
            if (d > s->out_pos) return "a distance before the start of the data";
            if (len > s->out_len - s->out_pos) {
                /* what fits is copied, so a caller reading only a prefix gets all of it */
                len = s->out_len - s->out_pos;
                s->full = true;
            }
            if (d >= len) { /* no overlap */
                memcpy(s->out + s->out_pos, s->out + s->out_pos - d, len);
                s->out_pos += len;
            } else {
                for (k = 0; k < len; ++k, ++s->out_pos)
                    s->out[s->out_pos] = s->out[s->out_pos - d];
            }
            if (s->full) return "more data than the entry's size";
        }
    }
}

static const char *tb__inf_stored(tb__inflater *s) {
    uint32_t len, nlen;
    tb__inf_bits(s, s->nbits % 8);
    len = tb__inf_bits(s, 16);
    nlen = tb__inf_bits(s, 16);
    if (tb__inf_overrun(s)) return "the compressed data end in a stored block's header";
    if (len != (~nlen & 0xffffu)) return "a stored block whose length check fails";
    if (len > s->out_len - s->out_pos) {
        len = (uint32_t)(s->out_len - s->out_pos);
        s->full = true;
    }
    while (len > 0 && s->nbits >= 8) {
        s->out[s->out_pos++] = (unsigned char)tb__inf_bits(s, 8);
        len--;
    }
    if (tb__inf_overrun(s)) return "the compressed data end in a stored block";
    if (len > s->in_len - s->in_pos) return "the compressed data end in a stored block";
    memcpy(s->out + s->out_pos, s->in + s->in_pos, len);
    s->out_pos += len;
    s->in_pos += len;
    return s->full ? "more data than the entry's size" : NULL;
}

static const char *tb__inf_dynamic(tb__inflater *s, tb__huff *lit, tb__huff *dist) {
    static const uint8_t order[19] = {16, 17, 18, 0, 8,  7, 9,  6, 10, 5,
                                      11, 4,  12, 3, 13, 2, 14, 1, 15};
    uint8_t lengths[320];
    int nlen, ndist, ncode, i = 0, k;
    nlen = (int)tb__inf_bits(s, 5) + 257;
    ndist = (int)tb__inf_bits(s, 5) + 1;
    ncode = (int)tb__inf_bits(s, 4) + 4;
    if (nlen > 286 || ndist > 30) return "a block with too many codes";
    memset(lengths, 0, sizeof lengths);
    for (k = 0; k < ncode; ++k)
        lengths[order[k]] = (uint8_t)tb__inf_bits(s, 3);
    if (!tb__huff_build(lit, lengths, 19)) return "an over-subscribed code length code";
    while (i < nlen + ndist) {
        int sym = tb__huff_decode(s, lit), repeat;
        uint8_t value = 0;
        if (sym < 0) return "a code length code that the table does not have";
        if (tb__inf_overrun(s)) return "the compressed data end in a block's code lengths";
        if (sym < 16) {
            lengths[i++] = (uint8_t)sym;
            continue;
        }
        if (sym == 16) {
            if (i == 0) return "a repeated code length with none before it";
            value = lengths[i - 1];
            repeat = 3 + (int)tb__inf_bits(s, 2);
        } else if (sym == 17) {
            repeat = 3 + (int)tb__inf_bits(s, 3);
        } else {
            repeat = 11 + (int)tb__inf_bits(s, 7);
        }
        if (i + repeat > nlen + ndist) return "code lengths that run past the codes";
        while (repeat-- > 0)
            lengths[i++] = value;
    }
    if (lengths[256] == 0) return "a block without an end code";
    if (!tb__huff_build(lit, lengths, nlen)) return "an over-subscribed literal/length code";
    if (!tb__huff_build(dist, lengths + nlen, ndist)) return "an over-subscribed distance code";
    return NULL;
}

/* Inflates all of s->in into exactly s->out_len bytes. NULL on success, else the reason. When
   the data are longer, s->full is set and s->out holds their first s->out_len bytes (a caller
   may inflate a prefix that way); s->done says the last block ended. */
static const char *tb__inflate(tb__inflater *s) {
    tb__huff lit, dist;
    uint32_t final;
    do {
        const char *why = NULL;
        uint32_t type;
        final = tb__inf_bits(s, 1);
        type = tb__inf_bits(s, 2);
        if (tb__inf_overrun(s)) return "the compressed data end before the last block";
        if (type == 0) {
            why = tb__inf_stored(s);
        } else if (type == 1) {
            uint8_t lengths[288];
            int i;
            for (i = 0; i < 288; ++i)
                lengths[i] = (uint8_t)(i < 144 ? 8 : i < 256 ? 9 : i < 280 ? 7 : 8);
            tb__huff_build(&lit, lengths, 288);
            for (i = 0; i < 30; ++i)
                lengths[i] = 5;
            tb__huff_build(&dist, lengths, 30);
            why = tb__inf_codes(s, &lit, &dist);
        } else if (type == 2) {
            why = tb__inf_dynamic(s, &lit, &dist);
            if (why == NULL) why = tb__inf_codes(s, &lit, &dist);
        } else {
            why = "an invalid block type";
        }
        if (why != NULL) return why;
    } while (!final);
    s->done = true;
    if (s->out_pos != s->out_len) return "less data than the entry's size";
    return NULL;
}

#undef TB__HUFF_FAST

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
        const unsigned char *h = blob->data + z->local_offset;
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
        tb_shape shape = tb_tensor_shape(set->entries[i].tensor);
        if (tb__st_dtype_name(shape.dtype) == NULL || strlen(set->entries[i].name) + 4 > 65535)
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

/* ---- IDX files (MNIST's format), plain or gzip ---- */

/* The magic (0x0000TTNN) and at most 255 dims of 4 bytes: the longest IDX header. */
#define TB__IDX_MAX_HEADER (4 + 4 * 255)

typedef struct tb__idx_type {
    uint8_t code;   /* TT of the magic */
    uint8_t width;  /* bytes per element in the file */
    tb_dtype dtype; /* what it loads as */
    const char *name;
} tb__idx_type;

static const tb__idx_type tb__idx_types[] = {{0x08, 1, TB_U8, "u8"},   {0x09, 1, TB_I32, "i8"},
                                             {0x0b, 2, TB_I32, "i16"}, {0x0c, 4, TB_I32, "i32"},
                                             {0x0d, 4, TB_F32, "f32"}, {0x0e, 8, TB_F64, "f64"}};

/* What an IDX header says. */
typedef struct tb__idx_header {
    const tb__idx_type *type;
    tb_shape shape;
    size_t header_len; /* 4 + 4 * rank */
    size_t count;      /* elements */
    size_t data_len;   /* count * type->width: the bytes after the header */
    char text[128];    /* "u8[10000,28,28]", for messages */
} tb__idx_header;

static uint32_t tb__be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Parses the header at p[0, avail); `where` names what holds it in messages ("the file", "the
   decompressed data"). */
static tb_status tb__idx_parse_header(const char *fn, const char *path, const char *where,
                                      const unsigned char *p, size_t avail, tb__idx_header *h) {
    int64_t dims[TB_MAX_RANK];
    size_t i, n = 0, nbytes = 0;
    unsigned rank;
    memset(h, 0, sizeof *h);
    if (avail < 4)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: truncated: %s holds %lu bytes, an IDX header needs at least 4",
                         fn, path, where, (unsigned long)avail);
    if (p[0] != 0 || p[1] != 0)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s is not an IDX file: its magic 0x%02x%02x%02x%02x does not start "
                         "with two zero bytes (0x0000TTNN: TT the type, NN the rank)",
                         fn, path, p[0], p[1], p[2], p[3]);
    for (i = 0; i < sizeof tb__idx_types / sizeof tb__idx_types[0]; ++i)
        if (tb__idx_types[i].code == p[2]) h->type = &tb__idx_types[i];
    if (h->type == NULL)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: unknown IDX type code 0x%02x (known: 0x08 u8, 0x09 i8, 0x0B "
                         "i16, 0x0C i32, 0x0D f32, 0x0E f64)",
                         fn, path, p[2]);
    rank = p[3];
    if (rank == 0)
        return tb__error(TB_ERR_FORMAT, "%s: %s: rank 0 (an IDX file has at least one dimension)",
                         fn, path);
    if (rank > TB_MAX_RANK)
        return tb__error(TB_ERR_UNSUPPORTED, "%s: %s: %u dimensions; at most %d are supported", fn,
                         path, rank, TB_MAX_RANK);
    h->header_len = 4 + 4 * (size_t)rank;
    if (avail < h->header_len)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: truncated header: %u dimensions need %lu bytes, %s holds %lu", fn,
                         path, rank, (unsigned long)h->header_len, where, (unsigned long)avail);
    n = (size_t)snprintf(h->text, sizeof h->text, "%s[", h->type->name);
    for (i = 0; i < rank; ++i) {
        dims[i] = (int64_t)tb__be32(p + 4 + 4 * i);
        n += (size_t)snprintf(h->text + n, sizeof h->text - n, "%s%lld", i ? "," : "",
                              (long long)dims[i]);
    }
    snprintf(h->text + n, sizeof h->text - n, "]");
    if (tb_shape_make(&h->shape, h->type->dtype, (int32_t)rank, dims) != TB_OK ||
        tb_shape_nbytes(&h->shape, &nbytes) != TB_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", tb_last_error());
        return tb__error(TB_ERR_FORMAT, "%s: %s: the dims %s are too large (%s)", fn, path, h->text,
                         why);
    }
    /* the file's elements are never wider than the tensor's, so this does not overflow */
    h->count = nbytes / tb_dtype_size(h->type->dtype);
    h->data_len = h->count * h->type->width;
    if (h->data_len > SIZE_MAX - h->header_len - 8)
        return tb__error(TB_ERR_FORMAT, "%s: %s: the dims %s are too large for this machine", fn,
                         path, h->text);
    return TB_OK;
}

/* `count` big-endian elements of IDX type `code` at src as the loaded dtype's values in host
   order at dst; src may equal dst when the widths are equal (each element is read first). */
static void tb__idx_decode(unsigned char *dst, const unsigned char *src, size_t count,
                           uint8_t code) {
    size_t i;
    for (i = 0; i < count; ++i) {
        if (code == 0x09) {
            int32_t v = (int32_t)src[i] - (src[i] >= 0x80 ? 0x100 : 0);
            memcpy(dst + 4 * i, &v, 4);
        } else if (code == 0x0b) {
            uint32_t u = ((uint32_t)src[2 * i] << 8) | src[2 * i + 1];
            int32_t v = (int32_t)u - (u >= 0x8000 ? 0x10000 : 0);
            memcpy(dst + 4 * i, &v, 4);
        } else if (code == 0x0e) {
            uint64_t v = ((uint64_t)tb__be32(src + 8 * i) << 32) | tb__be32(src + 8 * i + 4);
            memcpy(dst + 8 * i, &v, 8);
        } else { /* 0x0c, 0x0d */
            uint32_t v = tb__be32(src + 4 * i);
            memcpy(dst + 4 * i, &v, 4);
        }
    }
}

/* The tensor of the data at `bytes` inside `blob`. `writable`: the blob's bytes are the
   loader's own (inflated), so values the width of the dtype are put in host order in place;
   on a device that shares host memory the tensor then uses the blob without a copy. */
static tb_tensor *tb__idx_tensor(tb__blob *blob, unsigned char *bytes, bool writable,
                                 const tb__idx_header *h, const tb_device *device) {
    const bool host_big = !tb__host_is_little_endian();
    size_t size = tb_dtype_size(h->type->dtype);
    unsigned char *values;
    tb__blob *converted;
    tb_tensor *t;
    if (h->type->code == 0x08) return tb__blob_tensor(blob, bytes, &h->shape, false, device);
    if (writable && h->type->width == size) {
        tb__idx_decode(bytes, bytes, h->count, h->type->code);
        return tb__blob_tensor(blob, bytes, &h->shape, host_big, device);
    }
    values = (unsigned char *)tb__alloc(h->count ? h->count * size : 1);
    converted = values != NULL ? tb__blob_owning(values, h->count * size) : NULL;
    if (converted == NULL) return NULL;
    tb__idx_decode(values, bytes, h->count, h->type->code);
    t = tb__blob_tensor(converted, values, &h->shape, host_big, device);
    tb__blob_release(converted);
    return t;
}

/* An uncompressed IDX file. */
static tb_tensor *tb__idx_plain(const char *path, tb__blob *blob, const tb_device *device) {
    static const char fn[] = "tb_idx_load";
    tb__idx_header h;
    size_t have;
    if (tb__idx_parse_header(fn, path, "the file", blob->data, blob->size, &h) != TB_OK)
        return NULL;
    have = blob->size - h.header_len;
    if (have < h.data_len) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: truncated: the dims %s need %lu bytes of data, the file holds %lu", fn,
                  path, h.text, (unsigned long)h.data_len, (unsigned long)have);
        return NULL;
    }
    if (have > h.data_len) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: %lu bytes of trailing data after the %lu that the dims %s describe", fn,
                  path, (unsigned long)(have - h.data_len), (unsigned long)h.data_len, h.text);
        return NULL;
    }
    return tb__idx_tensor(blob, blob->data + h.header_len, false, &h, device);
}

/* The start of the deflate data after a gzip member's header (RFC 1952), checking it. */
static tb_status tb__gzip_header(const char *path, const unsigned char *p, size_t n,
                                 const tb__crc32_tables *crc, size_t *start) {
    static const char fn[] = "tb_idx_load";
    const unsigned flags = n > 3 ? p[3] : 0;
    size_t pos = 10;
    if (n < 10)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: truncated gzip header (%lu bytes; it has at least 10)", fn, path,
                         (unsigned long)n);
    if (p[2] != 8)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: bad gzip header: compression method %u is not deflate (8)", fn,
                         path, (unsigned)p[2]);
    if (flags & 0xe0)
        return tb__error(TB_ERR_FORMAT,
                         "%s: %s: bad gzip header: reserved flag bits are set (flags 0x%02x)", fn,
                         path, flags);
    if (flags & 4) { /* FEXTRA: a 2-byte length, then that many bytes */
        size_t xlen;
        if (n - pos < 2)
            return tb__error(TB_ERR_FORMAT, "%s: %s: truncated gzip header (in the extra field)",
                             fn, path);
        xlen = tb__le16(p + pos);
        if (n - pos - 2 < xlen)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: truncated gzip header: the extra field of %lu bytes runs "
                             "past the end of the file",
                             fn, path, (unsigned long)xlen);
        pos += 2 + xlen;
    }
    if (flags & 8) { /* FNAME, then FCOMMENT: NUL-terminated */
        const unsigned char *end = (const unsigned char *)memchr(p + pos, 0, n - pos);
        if (end == NULL)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: truncated gzip header: the file name has no terminating "
                             "NUL",
                             fn, path);
        pos = (size_t)(end - p) + 1;
    }
    if (flags & 16) {
        const unsigned char *end = (const unsigned char *)memchr(p + pos, 0, n - pos);
        if (end == NULL)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: truncated gzip header: the comment has no terminating NUL",
                             fn, path);
        pos = (size_t)(end - p) + 1;
    }
    if (flags & 2) { /* FHCRC: the low 16 bits of the CRC-32 of the header before it */
        uint32_t want;
        if (n - pos < 2)
            return tb__error(TB_ERR_FORMAT, "%s: %s: truncated gzip header (in the header CRC)", fn,
                             path);
        want = tb__crc32(crc, 0, p, pos) & 0xffffu;
        if (tb__le16(p + pos) != want)
            return tb__error(TB_ERR_FORMAT,
                             "%s: %s: bad gzip header: its CRC-16 is 0x%04x, the header gives "
                             "0x%04x",
                             fn, path, (unsigned)tb__le16(p + pos), (unsigned)want);
        pos += 2;
    }
    *start = pos;
    return TB_OK;
}

/* A gzip-compressed IDX file: the header is inflated first (into a small buffer) so that the
   data are inflated once, into a buffer of the size the dims give. */
static tb_tensor *tb__idx_gzip(const char *path, tb__blob *blob, const tb__crc32_tables *crc,
                               const tb_device *device) {
    static const char fn[] = "tb_idx_load";
    unsigned char head[TB__IDX_MAX_HEADER];
    const unsigned char *in, *trailer;
    size_t start = 0, in_len, total, pad, used;
    unsigned char *buffer, *out;
    tb__blob *inflated;
    tb__inflater s;
    tb__idx_header h;
    const char *why;
    tb_tensor *t;
    uint32_t crc_file, crc_data;
    if (tb__gzip_header(path, blob->data, blob->size, crc, &start) != TB_OK) return NULL;
    in = blob->data + start;
    in_len = blob->size - start;
    memset(&s, 0, sizeof s);
    s.in = in;
    s.in_len = in_len;
    s.out = head;
    s.out_len = sizeof head;
    why = tb__inflate(&s);
    if (why != NULL && !s.full && !s.done) {
        tb__error(TB_ERR_FORMAT, "%s: %s: corrupt or truncated gzip data: %s", fn, path, why);
        return NULL;
    }
    if (tb__idx_parse_header(fn, path, "the decompressed data", head, s.out_pos, &h) != TB_OK)
        return NULL;
    total = h.header_len + h.data_len;
    if (total / 1032 > in_len) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: the dims %s need %lu bytes, more than deflate can give from the %lu "
                  "compressed bytes (at most 1032 times as many): truncated data or wrong dims",
                  fn, path, h.text, (unsigned long)total, (unsigned long)in_len);
        return NULL;
    }
    /* the data start 8-byte aligned, so that the tensor can use them in place */
    pad = (8 - h.header_len % 8) % 8;
    buffer = (unsigned char *)tb__alloc(pad + total);
    inflated = buffer != NULL ? tb__blob_owning(buffer, pad + total) : NULL;
    if (inflated == NULL) return NULL;
    out = buffer + pad;
    memset(&s, 0, sizeof s);
    s.in = in;
    s.in_len = in_len;
    s.out = out;
    s.out_len = total;
    why = tb__inflate(&s);
    if (why != NULL) {
        if (s.full)
            tb__error(TB_ERR_FORMAT,
                      "%s: %s: the decompressed data are longer than the %lu bytes that the dims "
                      "%s describe",
                      fn, path, (unsigned long)total, h.text);
        else if (s.done)
            tb__error(TB_ERR_FORMAT,
                      "%s: %s: truncated: the dims %s need %lu bytes, the decompressed data hold "
                      "%lu",
                      fn, path, h.text, (unsigned long)total, (unsigned long)s.out_pos);
        else
            tb__error(TB_ERR_FORMAT, "%s: %s: corrupt or truncated gzip data: %s", fn, path, why);
        tb__blob_release(inflated);
        return NULL;
    }
    /* the deflate data end with the byte holding their last bit; the trailer follows */
    used = s.in_pos + (size_t)s.pad - (size_t)(s.nbits / 8);
    if (in_len - used < 8) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: truncated: the gzip trailer (CRC-32 and size, 8 bytes) has only %lu", fn,
                  path, (unsigned long)(in_len - used));
        tb__blob_release(inflated);
        return NULL;
    }
    trailer = in + used;
    if (in_len - used > 8) {
        const bool member = in_len - used >= 10 && trailer[8] == 0x1f && trailer[9] == 0x8b;
        tb__error(TB_ERR_FORMAT, "%s: %s: %lu bytes of trailing data after the gzip member%s", fn,
                  path, (unsigned long)(in_len - used - 8),
                  member ? " (a second member: concatenated gzip files are not supported)" : "");
        tb__blob_release(inflated);
        return NULL;
    }
    crc_file = tb__le32(trailer);
    crc_data = tb__crc32(crc, 0, out, total);
    if (crc_file != crc_data) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: CRC-32 mismatch (the trailer says 0x%08lx, the data give 0x%08lx): "
                  "the file is corrupt",
                  fn, path, (unsigned long)crc_file, (unsigned long)crc_data);
        tb__blob_release(inflated);
        return NULL;
    }
    if (tb__le32(trailer + 4) != (uint32_t)total) {
        tb__error(TB_ERR_FORMAT,
                  "%s: %s: the gzip trailer's ISIZE is %lu but the data inflate to %lu bytes", fn,
                  path, (unsigned long)tb__le32(trailer + 4), (unsigned long)total);
        tb__blob_release(inflated);
        return NULL;
    }
    t = tb__idx_tensor(inflated, out + h.header_len, true, &h, device);
    tb__blob_release(inflated);
    return t;
}

TBDEF tb_tensor *tb_idx_load(const char *path, const tb_device *device) {
    static const char fn[] = "tb_idx_load";
    tb__blob *blob = NULL;
    tb__crc32_tables *crc = NULL;
    tb_tensor *t = NULL;
    tb_device dev;
    tb__ensure_setup();
    if (path == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: path is NULL", fn);
        return NULL;
    }
    if (tb__resolve_device(device, &dev) != TB_OK) {
        char why[1024];
        tb_status st = tb_last_status();
        snprintf(why, sizeof why, "%s", tb_last_error());
        tb__error(st, "%s: %s: %s", fn, path, why);
        return NULL;
    }
    if (tb__blob_open(fn, path, &blob) != TB_OK) return NULL;
    if (blob->size >= 2 && blob->data[0] == 0x1f && blob->data[1] == 0x8b) {
        crc = (tb__crc32_tables *)tb__alloc(sizeof *crc);
        if (crc != NULL) {
            tb__crc32_init(crc);
            t = tb__idx_gzip(path, blob, crc, &dev);
        }
    } else {
        t = tb__idx_plain(path, blob, &dev);
    }
    tb__free(crc);
    tb__blob_release(blob);
    return t;
}

#undef TB__IDX_MAX_HEADER

#undef TB__ZIP_MAX32
#undef TB__ZIP_MAX16
#undef TB__SET_NONE
