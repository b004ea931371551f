/* ===========================================================================================
   Interop: .npy files
   =========================================================================================== */

/* Reads a .npy file (format 1.0 to 3.0, C order, f2 f4 f8 i4 i8 u1 b1, little or big endian) into a
   new tensor on `device` (NULL: current). Fortran order, other dtypes, truncated files, headers
   that lie and shapes that overflow are TB_ERR_FORMAT with the reason. */
TBDEF tb_tensor *tb_npy_load(const char *path, const tb_device *device);
/* Writes the tensor's value (syncing it) as .npy 1.0 (2.0 if the header needs it), through a
   temporary file and a rename. f16 is '<f2'; bf16, which numpy lacks, is TB_ERR_DTYPE. */
TBDEF tb_status tb_npy_save(const char *path, tb_tensor *tensor);

/* ===========================================================================================
   Interop: DLPack
   The structs below are the C ABI of DLPack (github.com/dmlc/dlpack), field for field and value
   for value, under this library's prefix: tb_dl_managed_tensor is DLPack's DLManagedTensor
   (v0.8, what numpy's and PyTorch's __dlpack__ capsules named "dltensor" hold) and
   tb_dl_managed_tensor_versioned is DLManagedTensorVersioned (v1.0 and later), so a pointer to
   one may be cast to the other library's type and back.
   =========================================================================================== */

#define TB_DLPACK_VERSION       80 /* DLPack's DLPACK_VERSION of tb_dl_managed_tensor (v0.8) */
#define TB_DLPACK_ABI_VERSION   1  /* DLPack's DLPACK_ABI_VERSION of the same */
#define TB_DLPACK_MAJOR_VERSION 1  /* the version written into tb_dl_managed_tensor_versioned */
#define TB_DLPACK_MINOR_VERSION 0
/* tb_dl_managed_tensor_versioned.flags (DLPACK_FLAG_BITMASK_READ_ONLY, _IS_COPIED) */
#define TB_DLPACK_FLAG_READ_ONLY ((uint64_t)1 << 0)
#define TB_DLPACK_FLAG_IS_COPIED ((uint64_t)1 << 1)

/* DLDeviceType (kDLCPU = 1, kDLCUDA = 2, ...). */
typedef enum tb_dl_device_type {
    TB_DL_CPU = 1,
    TB_DL_CUDA = 2,
    TB_DL_CUDA_HOST = 3,
    TB_DL_OPENCL = 4,
    TB_DL_VULKAN = 7,
    TB_DL_METAL = 8,
    TB_DL_VPI = 9,
    TB_DL_ROCM = 10,
    TB_DL_ROCM_HOST = 11,
    TB_DL_EXT_DEV = 12,
    TB_DL_CUDA_MANAGED = 13,
    TB_DL_ONEAPI = 14,
    TB_DL_WEBGPU = 15,
    TB_DL_HEXAGON = 16
} tb_dl_device_type;

/* DLDataTypeCode (kDLInt = 0, kDLUInt = 1, kDLFloat = 2, ...). */
typedef enum tb_dl_data_type_code {
    TB_DL_INT = 0,
    TB_DL_UINT = 1,
    TB_DL_FLOAT = 2,
    TB_DL_OPAQUE_HANDLE = 3,
    TB_DL_BFLOAT = 4,
    TB_DL_COMPLEX = 5,
    TB_DL_BOOL = 6
} tb_dl_data_type_code;

/* DLDevice. device_type holds a tb_dl_device_type (4 bytes, as DLPack's enum). */
typedef struct tb_dl_device {
    int32_t device_type;
    int32_t device_id;
} tb_dl_device;

/* DLDataType: code (a tb_dl_data_type_code), bits per lane, lanes. The library's dtypes are
   f32 (FLOAT, 32), f64 (FLOAT, 64), f16 (FLOAT, 16), bf16 (BFLOAT, 16), i32 (INT, 32), i64
   (INT, 64), u8 (UINT, 8) and bool (BOOL, 8, one byte per element as numpy and PyTorch store
   it), all with lanes 1. */
typedef struct tb_dl_data_type {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} tb_dl_data_type;

/* DLTensor. shape and strides have ndim entries; strides count elements, not bytes, and NULL
   strides mean C-contiguous. The first element is at (char *)data + byte_offset. */
typedef struct tb_dl_tensor {
    void *data;
    tb_dl_device device;
    int32_t ndim;
    tb_dl_data_type dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} tb_dl_tensor;

/* DLManagedTensor: the consumer calls deleter(self) once when it no longer needs the tensor
   (deleter may be NULL: nothing to release). */
typedef struct tb_dl_managed_tensor {
    tb_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct tb_dl_managed_tensor *self);
} tb_dl_managed_tensor;

/* DLPackVersion and DLManagedTensorVersioned. */
typedef struct tb_dl_pack_version {
    uint32_t major;
    uint32_t minor;
} tb_dl_pack_version;

typedef struct tb_dl_managed_tensor_versioned {
    tb_dl_pack_version version;
    void *manager_ctx;
    void (*deleter)(struct tb_dl_managed_tensor_versioned *self);
    uint64_t flags; /* TB_DLPACK_FLAG_* */
    tb_dl_tensor dl_tensor;
} tb_dl_managed_tensor_versioned;

/* Hands the tensor's value to a DLPack consumer. Syncs the tensor first. On a device that
   keeps host memory (the cpu and native backends) nothing is copied: the managed tensor points
   at the tensor's own buffer and holds a reference to that buffer (the tensor's backend data),
   so the tensor may be released first; a new value given to the tensor (tb_assign) then goes
   to a buffer of its own, never into the lent one. An OpenCL device that shares the host's
   memory (PoCL's CPU devices) lends its buffer the same way, mapped to the host for reading
   until the deleter (which ends the mapping; kernels may still read the buffer meanwhile). On
   any other device the value is copied to a new host buffer that the deleter frees. Either way the
   device is {TB_DL_CPU, 0} (the consumer gets host memory), byte_offset is 0, and shape and strides
   (always set, in elements, C order) live in the managed tensor. The consumer must not write
   through `data` (a tensor's value never changes) and calls deleter(*out) exactly once, from any
   thread, before tb_shutdown. Errors: NULL arguments (a NULL tensor keeps the error of the op that
   produced it), a failed sync, out of memory; *out is untouched on error. Not thread-safe with
   other calls on the same tensor. Python: wrap *out in a PyCapsule named "dltensor" to hand it to
   numpy.from_dlpack and the like (tests/dlpack_numpy.py shows it through ctypes). */
TBDEF tb_status tb_dlpack_export(tb_tensor *tensor, tb_dl_managed_tensor **out);

/* A new tensor on `device` (NULL: the current device) holding the value of a DLPack tensor.
   Accepted: device type TB_DL_CPU (host memory), lanes 1, the library's eight dtypes (see
   tb_dl_data_type), ndim 0..TB_MAX_RANK, non-negative dims, any strides (NULL: C-contiguous)
   and byte_offset. On success the library owns `managed`:
     - on a device that keeps or shares host memory (the cpu backend; native and an OpenCL
       device with CL_DEVICE_HOST_UNIFIED_MEMORY, PoCL's, for data aligned to 64 bytes), a
       C-contiguous, suitably aligned tensor (and, for bool, one holding only 0 and 1 bytes) is
       used in place, without a copy (and never written: tb_assign gives the tensor a new
       buffer);
       managed->deleter runs exactly once, when the last reference to the buffer is dropped
       (possibly on another thread): the tensors using it, pending graphs that read it, and a
       cached computation compiled with it as an input (tb_computation_cache_clear drops
       those); on OpenCL once the device's queue has also finished the kernels queued before
       (the call that drops it waits for them). The producer must keep the data alive and
       unchanged until then.
     - otherwise the value is copied (strided tensors into C order) and managed->deleter runs
       before this function returns.
   On ANY error NULL is returned, the deleter is not called and the caller still owns
   `managed` (it may call the deleter itself). Errors: NULL `managed`, a device type other than
   TB_DL_CPU ("tb_dlpack_import: device type 2 (CUDA) is not supported; only CPU (1) memory"),
   an unsupported dtype or lanes != 1 (TB_ERR_DTYPE), ndim outside 0..8 or negative dims
   (TB_ERR_SHAPE), a NULL data pointer for a non-empty tensor, sizes that overflow. */
TBDEF tb_tensor *tb_dlpack_import(tb_dl_managed_tensor *managed, const tb_device *device);

/* tb_dlpack_export with the versioned struct: version {TB_DLPACK_MAJOR_VERSION,
   TB_DLPACK_MINOR_VERSION}; flags TB_DLPACK_FLAG_READ_ONLY when the buffer is the tensor's own,
   TB_DLPACK_FLAG_IS_COPIED when it is a copy the consumer may write to. */
TBDEF tb_status tb_dlpack_export_versioned(tb_tensor *tensor, tb_dl_managed_tensor_versioned **out);
/* tb_dlpack_import with the versioned struct. A major version other than
   TB_DLPACK_MAJOR_VERSION is TB_ERR_UNSUPPORTED (the deleter is not called: DLPack allows the
   caller to call it). The flags need no action: the library never writes to the buffer. */
TBDEF tb_tensor *tb_dlpack_import_versioned(tb_dl_managed_tensor_versioned *managed,
                                            const tb_device *device);
