/* ===========================================================================================
   Model files: tensor sets, safetensors and .npz
   A tensor set is an ordered list of named tensors (what a model file holds) plus string
   metadata (safetensors' "__metadata__"). Names are unique, non-empty and at most
   TB_TENSOR_SET_MAX_NAME bytes; any bytes but NUL are allowed (safetensors needs UTF-8).
   Ownership: the set holds one reference to each tensor it lists and copies every string it is
   given; tb_tensor_set_free drops them. A tensor or string read from a set is borrowed: valid
   while the set lives, or longer if the caller retains the tensor (tb_tensor_retain).
   Thread safety: a set may be read from several threads; changing it (add, set_metadata, free)
   needs the caller's lock against every other use of the same set.
   =========================================================================================== */

#define TB_TENSOR_SET_MAX_NAME 4096 /* longest tensor name or metadata key, in bytes */

typedef struct tb_tensor_set tb_tensor_set;

/* A new, empty set; free it with tb_tensor_set_free. NULL only when out of memory. */
TBDEF tb_tensor_set *tb_tensor_set_new(void);
/* Releases the set's references and strings, then the set. NULL is ignored. Tensors loaded from
   a file that the caller retained stay valid (a memory-mapped file stays mapped until the last
   tensor using it is released). */
TBDEF void tb_tensor_set_free(tb_tensor_set *set);
/* Appends `tensor` under `name` (copied) and retains it; the caller keeps its own reference.
   Errors: NULL set, name or tensor (a NULL tensor from a failed op keeps that op's error), an
   empty name or one longer than TB_TENSOR_SET_MAX_NAME (TB_ERR_INVALID_ARGUMENT), a name
   already in the set (TB_ERR_DUPLICATE), out of memory. On error the set is unchanged. */
TBDEF tb_status tb_tensor_set_add(tb_tensor_set *set, const char *name, tb_tensor *tensor);
/* The number of tensors (0 for NULL). */
TBDEF size_t tb_tensor_set_count(const tb_tensor_set *set);
/* The name / the tensor at `index` (in the order added or stored in the file), borrowed. NULL
   and TB_ERR_INVALID_ARGUMENT for a NULL set or an index past the end. */
TBDEF const char *tb_tensor_set_name(const tb_tensor_set *set, size_t index);
TBDEF tb_tensor *tb_tensor_set_tensor(const tb_tensor_set *set, size_t index);
/* The tensor named `name`, borrowed; NULL and TB_ERR_NOT_FOUND (the message lists some of the
   names the set has) when there is none. */
TBDEF tb_tensor *tb_tensor_set_get(const tb_tensor_set *set, const char *name);
/* Sets metadata `key` to `value` (both copied), replacing an earlier value of the key. Errors:
   NULL arguments, an empty key or one longer than TB_TENSOR_SET_MAX_NAME, out of memory. */
TBDEF tb_status tb_tensor_set_set_metadata(tb_tensor_set *set, const char *key, const char *value);
/* The value of metadata `key`, borrowed; NULL (TB_ERR_NOT_FOUND) when the key is not set. */
TBDEF const char *tb_tensor_set_metadata(const tb_tensor_set *set, const char *key);
/* The number of metadata entries, and the key at `index` (borrowed; NULL past the end). */
TBDEF size_t tb_tensor_set_metadata_count(const tb_tensor_set *set);
TBDEF const char *tb_tensor_set_metadata_key(const tb_tensor_set *set, size_t index);

/* Reads a safetensors file (github.com/huggingface/safetensors: an 8-byte little-endian header
   length, a JSON header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, optional
   "__metadata__": {string: string}}, then the data) into a new set on `device` (NULL: the
   current device), tensors in the header's order. Dtypes F32 F64 F16 BF16 I32 I64 U8 BOOL
   load as f32 f64 f16 bf16 i32 i64 u8 bool.
   The file is memory-mapped; on a device that keeps or shares host memory (the cpu backend;
   native and an OpenCL device with unified memory, PoCL's, for tensors aligned to 64 bytes)
   each suitably aligned tensor uses the mapping in place, without a copy, and the mapping lives
   until the last such tensor is released (the set may be freed first). Do not truncate or
   rewrite the file in place while those tensors live (replacing it, as tb_safetensors_save
   does through a rename, is safe). Other devices get copies and the file is closed on return.
   The whole file is checked before any tensor is made, as the reference implementation does:
   errors are TB_ERR_IO / TB_ERR_NOT_FOUND (cannot open or read), TB_ERR_FORMAT with the reason
   (a header length past the end of the file or above 100 MB, bad JSON or UTF-8, nesting
   deeper than 64, a duplicate name or key, missing or mistyped fields, offsets that are out of
   range, overlap, leave gaps or do not match the dtype and shape), TB_ERR_DTYPE (a dtype the
   library does not have, e.g. I16), TB_ERR_UNSUPPORTED (more than TB_MAX_RANK dims). No
   allocation is larger than the file. On error NULL is returned and nothing stays mapped.
   Thread-safe with other loads. */
TBDEF tb_tensor_set *tb_safetensors_load(const char *path, const tb_device *device);
/* Writes the set as a safetensors file (through a temporary file and a rename): the metadata
   as "__metadata__", each tensor's value (syncing the pending ones, one graph per device)
   with its dtype (F32 F64 I32 I64 U8 BOOL). Data are laid out 8-byte types first, so that
   every tensor starts aligned for its dtype (as the reference writer does). Errors: NULL
   arguments, a name or metadata string that is not valid UTF-8 or a tensor named
   "__metadata__" (TB_ERR_INVALID_ARGUMENT), a failed sync, TB_ERR_IO. Not thread-safe with
   changes to the set or ops on its tensors. */
TBDEF tb_status tb_safetensors_save(const char *path, const tb_tensor_set *set);

/* Reads a NumPy .npz file (a zip of .npy files, what numpy.savez and numpy.savez_compressed
   write) into a new set on `device` (NULL: current), one tensor per "<name>.npy" entry in the
   zip's order, named without ".npy". Entries may be stored or deflated (inflated by the
   library itself, no zlib needed) and may use zip64; CRC-32s are checked. Each .npy holds
   what tb_npy_load accepts (f4 f8 i4 i8 u1 b1, C order). Stored entries in a memory-mapped
   file are used in place on the cpu backend where aligned, as in tb_safetensors_load. Errors:
   TB_ERR_IO / TB_ERR_NOT_FOUND, TB_ERR_FORMAT with the reason (no end of central directory,
   a central directory or entry outside the file, overlapping entries, names that differ
   between the directory and the entry, an entry not ending in ".npy", duplicate names,
   encryption, a compression other than stored or deflate, a size that deflate cannot produce
   from the compressed size, corrupt deflate data, a CRC mismatch, a malformed .npy), and the
   errors of tb_npy_load for an entry's dtype. No allocation is larger than the file, or for a
   deflated entry than its claimed size (at most 1032 times its compressed size, deflate's
   limit). On error NULL is returned. Thread-safe with other loads. */
TBDEF tb_tensor_set *tb_npz_load(const char *path, const tb_device *device);
/* Writes the set as an .npz (stored entries "<name>.npy", zip64 where sizes need it) through
   a temporary file and a rename; numpy.load reads it. The metadata is not written (.npz has no
   place for it). Errors: NULL arguments, a name that is empty, "." or "..", or holds '/' or
   '\\' (TB_ERR_INVALID_ARGUMENT: unzip would make it a folder, or a path outside the folder it
   unpacks into), a failed sync, TB_ERR_IO. Thread safety as
   tb_safetensors_save. */
TBDEF tb_status tb_npz_save(const char *path, const tb_tensor_set *set);

/* ===========================================================================================
   IDX files (the format of MNIST and Fashion-MNIST)
   =========================================================================================== */

/* Reads an IDX file (a big-endian magic 0x0000TTNN, TT the type and NN the rank, then NN
   big-endian u32 dims, then the elements big-endian in C order) into a new tensor of the file's
   dims on `device` (NULL: the current device). The file may be compressed as one gzip member
   (RFC 1952), as MNIST's `.gz` files are: that is decided by its first two bytes (0x1f 0x8b),
   not by its name, and it is inflated by the library itself (no zlib needed).
   Types: 0x08 u8 loads as u8, 0x0C i32 as i32, 0x0D f32 as f32, 0x0E f64 as f64; 0x09 i8 and
   0x0B i16 load widened to i32 (the narrowest dtype of the library that holds every value
   exactly). On a device that shares host memory (the cpu backend) a u8 file's mapping or the
   inflated data are used in place, without a copy.
   Errors (NULL returned; the message names the path and the reason): TB_ERR_INVALID_ARGUMENT
   (NULL path), TB_ERR_NOT_FOUND / TB_ERR_IO (cannot open or read the file), the error of an
   unknown `device`, TB_ERR_UNSUPPORTED (more than TB_MAX_RANK dims), and TB_ERR_FORMAT for: a
   magic not starting with two zero bytes, an unknown type code, rank 0, a truncated header, dims
   whose size overflows, data shorter or longer than the dims describe; for gzip also a bad
   header (method other than deflate, reserved flags, FEXTRA / FNAME / FCOMMENT running past the
   end, an FHCRC mismatch), corrupt or truncated deflate data, a missing trailer, a CRC-32 or
   ISIZE mismatch, and trailing data after the member (concatenated members are not supported).
   Memory: the file is memory-mapped; a gzip file's data are inflated once into a buffer of the
   size the dims give, never more than deflate can produce from the compressed bytes (1032 times
   as many); i8 and i16 need one more buffer for the widened values. Thread-safe with other
   loads. */
TBDEF tb_tensor *tb_idx_load(const char *path, const tb_device *device);
