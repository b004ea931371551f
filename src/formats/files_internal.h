/* ===========================================================================================
   The internal contract of the model file parts (files.c, safetensors.c, inflate.c, npz.c,
   idx.c): tensor sets, a file's bytes, the file being written, CRC-32 and inflate, and the
   functions the parts give the ones after them, each defined in the part named above it.
   =========================================================================================== */
#include "../impl_begin.h"

/* ---- files.c: tensor sets ---- */

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

/* the entry of `name`, or TB__SET_NONE */
static size_t tb__set_find(const tb_tensor_set *set, const char *name);
/* appends `tensor` under `name`, taking over the caller's reference (released on error) */
static tb_status tb__set_add_owned(const char *fn, tb_tensor_set *set, const char *name,
                                   tb_tensor *tensor);
/* the metadata entry of `key`, or TB__SET_NONE */
static size_t tb__set_meta_find(const tb_tensor_set *set, const char *key);
/* syncs the set's pending tensors, one graph per device */
static tb_status tb__set_sync(const tb_tensor_set *set);

/* ---- files.c: a file's bytes, shared by the tensors that use them in place ---- */

typedef struct tb__blob {
    int32_t refcount;
    unsigned char *data;
    size_t size;
    bool mapped; /* munmap, else tb__free */
} tb__blob;

/* the whole file: memory-mapped where the system allows, else read into memory */
static tb_status tb__blob_open(const char *fn, const char *path, tb__blob **out);
/* a blob owning `data` (from tb__alloc; freed here on error) */
static tb__blob *tb__blob_owning(unsigned char *data, size_t size);
static void tb__blob_release(void *context); /* drops a reference to the blob */
/* a tensor of `shape` whose elements are the bytes at `bytes` inside `blob` (little-endian
   unless `big_endian`): in place where it can, else a converted copy */
static tb_tensor *tb__blob_tensor(tb__blob *blob, const unsigned char *bytes, const tb_shape *shape,
                                  bool big_endian, const tb_device *device);
/* little-endian numbers */
static uint16_t tb__le16(const unsigned char *p);
static uint32_t tb__le32(const unsigned char *p);
static uint64_t tb__le64(const unsigned char *p);
/* whether `n` bytes are well-formed UTF-8 */
static bool tb__utf8_valid(const unsigned char *s, size_t n);

/* ---- files.c: writing files ---- */

/* Writes a file through a temporary one and a rename. */
typedef struct tb__out_file {
    FILE *f;
    char *tmp;
    const char *path;
    uint64_t written;
    bool failed;
} tb__out_file;

static tb_status tb__out_open(const char *fn, const char *path, tb__out_file *o);
static void tb__out_write(tb__out_file *o, const void *data, size_t size);
/* closes the file and renames it into place when `ok` and every write worked; removes it
   otherwise */
static tb_status tb__out_close(const char *fn, tb__out_file *o, bool ok);
/* the value of a synced tensor as contiguous host bytes, little-endian (a copy in *copy that
   the caller frees where the tensor's own buffer cannot serve) */
static tb_status tb__tensor_le_bytes(tb_tensor *t, const unsigned char **bytes, size_t *nbytes,
                                     unsigned char **copy);

/* ---- safetensors.c ---- */

/* the safetensors name of a library dtype; NULL for one it cannot hold */
static const char *tb__st_dtype_name(tb_dtype dtype);

/* ---- inflate.c: CRC-32 and inflate ---- */

/* CRC-32 (zip's, reflected 0xedb88320), eight bytes per step: the tables */
typedef struct tb__crc32_tables {
    uint32_t t[8][256];
} tb__crc32_tables;

static void tb__crc32_init(tb__crc32_tables *c);
/* the CRC-32 of `crc` continued over n bytes (0 to start) */
static uint32_t tb__crc32(const tb__crc32_tables *c, uint32_t crc, const unsigned char *p,
                          size_t n);

/* Inflating (RFC 1951) s->in into a buffer of known size, s->out. */
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

/* inflates all of s->in into exactly s->out_len bytes: NULL on success, else the reason */
static const char *tb__inflate(tb__inflater *s);
