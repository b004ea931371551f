/* ===========================================================================================
   OpenCL backend: availability and native objects
   The "opencl" backend is registered by default (unless built with TB_NO_OPENCL) and used
   through the generic API (tb_device_make("opencl", 0, &dev), tb_set_backend("opencl"), ...).
   These functions reach below it, for programs that mix their own OpenCL code with the library.
   OpenCL objects are given as void * (cast them to cl_platform_id, cl_context, cl_mem, ...):
   no OpenCL type appears in this header and no SDK is needed to include it.
   Environment: TB_OPENCL_LIBRARY (the ICD loader to open, default libOpenCL.so.1; not used
   when built with TB_OPENCL_LINKED),
   TB_OPENCL_BUILD_OPTIONS (appended to the options every program is built with, e.g.
   "-cl-mad-enable"; part of the program cache key), TB_CACHE_DIR (the program binary cache,
   default $XDG_CACHE_HOME/torch_backend or ~/.cache/torch_backend, created 0700; a folder
   others may write to is not used; "off" disables it).
   =========================================================================================== */

/* The OpenCL objects behind one device of the "opencl" backend. They are owned by the library:
   do not release them; they stay valid until tb_shutdown. */
typedef struct tb_opencl_native {
    void *platform; /* cl_platform_id */
    void *device;   /* cl_device_id */
    void *context;  /* cl_context: this device only */
    void *queue;    /* cl_command_queue: in order, profiling enabled; the library's kernels for
                       this device run on it, so work enqueued there is ordered with them */
} tb_opencl_native;

/* TB_OK when the OpenCL backend can run here: the ICD loader (libOpenCL.so.1, or
   $TB_OPENCL_LIBRARY) opens, exports every entry point the backend uses, and lists at least
   one usable device. Otherwise TB_ERR_UNAVAILABLE with the reason in tb_last_error(), e.g.
   "opencl: cannot open libOpenCL.so.1: ...". Built with TB_NO_OPENCL: TB_ERR_UNSUPPORTED.
   The answer is decided at the first use after each setup. Thread-safe. */
TBDEF tb_status tb_opencl_available(void);

/* Fills *out with the native objects of `device`, an "opencl" device (NULL: the backend's
   default device), creating its context and queue if needed. Errors: a device of another
   backend or out of range (TB_ERR_INVALID_ARGUMENT / TB_ERR_NOT_FOUND), the backend unavailable
   (TB_ERR_UNAVAILABLE with the reason); *out is untouched on error. Thread-safe. */
TBDEF tb_status tb_opencl_native_device(const tb_device *device, tb_opencl_native *out);

/* The cl_mem holding a tensor's value, syncing the tensor first; *size gets the value's size
   in bytes (the buffer may be larger). The buffer stays owned by the tensor and holds this
   value as long as the tensor does: read or write it on the device's queue
   (tb_opencl_native_device). A tensor that uses host memory in place (a DLPack import or a
   model file's tensor on a device that shares the host's memory) has a buffer over that
   memory: writing it writes the producer's array (a file's mapping is read-only). Errors: NULL
   arguments, a tensor that is not on an "opencl" device. Not thread-safe with other calls on the
   same tensor. */
TBDEF tb_status tb_opencl_tensor_buffer(tb_tensor *tensor, void **mem, size_t *size);

/* Releases the device memory that the caching allocator keeps for reuse on `device` (NULL:
   every opencl device). Memory in use by tensors is not touched. Thread-safe. */
TBDEF tb_status tb_opencl_trim_cache(const tb_device *device);
