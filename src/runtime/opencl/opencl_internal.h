/* ===========================================================================================
   The internal contract of the OpenCL backend's parts (opencl_api.c, opencl_device.c,
   opencl_program.c, opencl.c): the part of the OpenCL API the backend uses, declared here so
   that no SDK is needed; the runtime's, devices', buffers' and programs' state; the functions
   the parts give each other, each defined in the part named above it.
   =========================================================================================== */
#include "../../impl_begin.h"

#ifndef TB_NO_OPENCL

#ifdef TB_OPENCL_LINKED
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#ifndef CL_USE_DEPRECATED_OPENCL_1_2_APIS
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#endif
#if defined(__APPLE__)
#include <OpenCL/opencl.h>
#else
#include <CL/cl.h>
#endif
typedef cl_int tb__cl_int;
typedef cl_uint tb__cl_uint;
typedef cl_ulong tb__cl_ulong;
typedef cl_bool tb__cl_bool;
typedef cl_bitfield tb__cl_bitfield;
typedef cl_platform_id tb__cl_platform_id;
typedef cl_device_id tb__cl_device_id;
typedef cl_context tb__cl_context;
typedef cl_command_queue tb__cl_command_queue;
typedef cl_mem tb__cl_mem;
typedef cl_program tb__cl_program;
typedef cl_kernel tb__cl_kernel;
typedef cl_event tb__cl_event;
typedef cl_context_properties tb__cl_context_properties;
#define TB__CL_CALL     CL_API_CALL
#define TB__CL_CALLBACK CL_CALLBACK
#else
typedef int32_t tb__cl_int;
typedef uint32_t tb__cl_uint;
typedef uint64_t tb__cl_ulong;
typedef uint32_t tb__cl_bool;
typedef uint64_t tb__cl_bitfield;
typedef struct tb__cl_platform_st *tb__cl_platform_id;
typedef struct tb__cl_device_st *tb__cl_device_id;
typedef struct tb__cl_context_st *tb__cl_context;
typedef struct tb__cl_queue_st *tb__cl_command_queue;
typedef struct tb__cl_mem_st *tb__cl_mem;
typedef struct tb__cl_program_st *tb__cl_program;
typedef struct tb__cl_kernel_st *tb__cl_kernel;
typedef struct tb__cl_event_st *tb__cl_event;
typedef intptr_t tb__cl_context_properties;
#if defined(_WIN32)
#define TB__CL_CALL     __stdcall
#define TB__CL_CALLBACK __stdcall
#else
#define TB__CL_CALL
#define TB__CL_CALLBACK
#endif
#endif

/* Values from the Khronos headers (CL/cl.h). */
#define TB__CL_SUCCESS                                   0
#define TB__CL_DEVICE_NOT_FOUND                          (-1)
#define TB__CL_MEM_OBJECT_ALLOCATION_FAILURE             (-4)
#define TB__CL_OUT_OF_RESOURCES                          (-5)
#define TB__CL_OUT_OF_HOST_MEMORY                        (-6)
#define TB__CL_BUILD_PROGRAM_FAILURE                     (-11)
#define TB__CL_INVALID_BUFFER_SIZE                       (-61)
#define TB__CL_PLATFORM_NOT_FOUND_KHR                    (-1001)
#define TB__CL_TRUE                                      1u
#define TB__CL_FALSE                                     0u
#define TB__CL_PLATFORM_VERSION                          0x0901u
#define TB__CL_PLATFORM_NAME                             0x0902u
#define TB__CL_PLATFORM_VENDOR                           0x0903u
#define TB__CL_DEVICE_TYPE                               0x1000u
#define TB__CL_DEVICE_MAX_COMPUTE_UNITS                  0x1002u
#define TB__CL_DEVICE_MAX_WORK_GROUP_SIZE                0x1004u
#define TB__CL_DEVICE_MAX_CLOCK_FREQUENCY                0x100Cu
#define TB__CL_DEVICE_MAX_MEM_ALLOC_SIZE                 0x1010u
#define TB__CL_DEVICE_MAX_PARAMETER_SIZE                 0x1017u
#define TB__CL_DEVICE_MEM_BASE_ADDR_ALIGN                0x1019u
#define TB__CL_DEVICE_SINGLE_FP_CONFIG                   0x101Bu
#define TB__CL_DEVICE_GLOBAL_MEM_SIZE                    0x101Fu
#define TB__CL_DEVICE_LOCAL_MEM_SIZE                     0x1023u
#define TB__CL_DEVICE_AVAILABLE                          0x1027u
#define TB__CL_DEVICE_COMPILER_AVAILABLE                 0x1028u
#define TB__CL_DEVICE_NAME                               0x102Bu
#define TB__CL_DEVICE_VENDOR                             0x102Cu
#define TB__CL_DRIVER_VERSION                            0x102Du
#define TB__CL_DEVICE_VERSION                            0x102Fu
#define TB__CL_DEVICE_EXTENSIONS                         0x1030u
#define TB__CL_DEVICE_DOUBLE_FP_CONFIG                   0x1032u
#define TB__CL_DEVICE_HOST_UNIFIED_MEMORY                0x1035u
#define TB__CL_DEVICE_OPENCL_C_VERSION                   0x103Du
#define TB__CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT          0x103Au
#define TB__CL_FP_FMA                                    (1u << 5)
#define TB__CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT          (1u << 7)
#define TB__CL_DEVICE_TYPE_CPU                           (1u << 1)
#define TB__CL_DEVICE_TYPE_GPU                           (1u << 2)
#define TB__CL_DEVICE_TYPE_ACCELERATOR                   (1u << 3)
#define TB__CL_DEVICE_TYPE_ALL                           0xFFFFFFFFu
#define TB__CL_CONTEXT_PLATFORM                          0x1084
#define TB__CL_QUEUE_PROFILING_ENABLE                    (1u << 1)
#define TB__CL_MEM_READ_WRITE                            (1u << 0)
#define TB__CL_MEM_USE_HOST_PTR                          (1u << 3)
#define TB__CL_MEM_ALLOC_HOST_PTR                        (1u << 4)
#define TB__CL_MAP_READ                                  (1u << 0)
#define TB__CL_MAP_WRITE                                 (1u << 1)
#define TB__CL_PROGRAM_BINARY_SIZES                      0x1165u
#define TB__CL_PROGRAM_BINARIES                          0x1166u
#define TB__CL_PROGRAM_BUILD_LOG                         0x1183u
#define TB__CL_KERNEL_WORK_GROUP_SIZE                    0x11B0u
#define TB__CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE 0x11B3u
#define TB__CL_PROFILING_COMMAND_START                   0x1282u
#define TB__CL_PROFILING_COMMAND_END                     0x1283u

/* The entry points, resolved once. */
typedef struct tb__cl_api {
    tb__cl_int(TB__CL_CALL *GetPlatformIDs)(tb__cl_uint, tb__cl_platform_id *, tb__cl_uint *);
    tb__cl_int(TB__CL_CALL *GetPlatformInfo)(tb__cl_platform_id, tb__cl_uint, size_t, void *,
                                             size_t *);
    tb__cl_int(TB__CL_CALL *GetDeviceIDs)(tb__cl_platform_id, tb__cl_bitfield, tb__cl_uint,
                                          tb__cl_device_id *, tb__cl_uint *);
    tb__cl_int(TB__CL_CALL *GetDeviceInfo)(tb__cl_device_id, tb__cl_uint, size_t, void *, size_t *);
    tb__cl_context(TB__CL_CALL *CreateContext)(
        const tb__cl_context_properties *, tb__cl_uint, const tb__cl_device_id *,
        void(TB__CL_CALLBACK *)(const char *, const void *, size_t, void *), void *, tb__cl_int *);
    tb__cl_int(TB__CL_CALL *ReleaseContext)(tb__cl_context);
    tb__cl_command_queue(TB__CL_CALL *CreateCommandQueue)(tb__cl_context, tb__cl_device_id,
                                                          tb__cl_bitfield, tb__cl_int *);
    tb__cl_int(TB__CL_CALL *ReleaseCommandQueue)(tb__cl_command_queue);
    tb__cl_mem(TB__CL_CALL *CreateBuffer)(tb__cl_context, tb__cl_bitfield, size_t, void *,
                                          tb__cl_int *);
    tb__cl_int(TB__CL_CALL *ReleaseMemObject)(tb__cl_mem);
    tb__cl_int(TB__CL_CALL *EnqueueReadBuffer)(tb__cl_command_queue, tb__cl_mem, tb__cl_bool,
                                               size_t, size_t, void *, tb__cl_uint,
                                               const tb__cl_event *, tb__cl_event *);
    tb__cl_int(TB__CL_CALL *EnqueueWriteBuffer)(tb__cl_command_queue, tb__cl_mem, tb__cl_bool,
                                                size_t, size_t, const void *, tb__cl_uint,
                                                const tb__cl_event *, tb__cl_event *);
    tb__cl_int(TB__CL_CALL *EnqueueCopyBuffer)(tb__cl_command_queue, tb__cl_mem, tb__cl_mem, size_t,
                                               size_t, size_t, tb__cl_uint, const tb__cl_event *,
                                               tb__cl_event *);
    void *(TB__CL_CALL *EnqueueMapBuffer)(tb__cl_command_queue, tb__cl_mem, tb__cl_bool,
                                          tb__cl_bitfield, size_t, size_t, tb__cl_uint,
                                          const tb__cl_event *, tb__cl_event *, tb__cl_int *);
    tb__cl_int(TB__CL_CALL *EnqueueUnmapMemObject)(tb__cl_command_queue, tb__cl_mem, void *,
                                                   tb__cl_uint, const tb__cl_event *,
                                                   tb__cl_event *);
    tb__cl_program(TB__CL_CALL *CreateProgramWithSource)(tb__cl_context, tb__cl_uint, const char **,
                                                         const size_t *, tb__cl_int *);
    tb__cl_program(TB__CL_CALL *CreateProgramWithBinary)(tb__cl_context, tb__cl_uint,
                                                         const tb__cl_device_id *, const size_t *,
                                                         const unsigned char **, tb__cl_int *,
                                                         tb__cl_int *);
    tb__cl_int(TB__CL_CALL *BuildProgram)(tb__cl_program, tb__cl_uint, const tb__cl_device_id *,
                                          const char *,
                                          void(TB__CL_CALLBACK *)(tb__cl_program, void *), void *);
    tb__cl_int(TB__CL_CALL *GetProgramBuildInfo)(tb__cl_program, tb__cl_device_id, tb__cl_uint,
                                                 size_t, void *, size_t *);
    tb__cl_int(TB__CL_CALL *GetProgramInfo)(tb__cl_program, tb__cl_uint, size_t, void *, size_t *);
    tb__cl_int(TB__CL_CALL *ReleaseProgram)(tb__cl_program);
    tb__cl_kernel(TB__CL_CALL *CreateKernel)(tb__cl_program, const char *, tb__cl_int *);
    tb__cl_int(TB__CL_CALL *ReleaseKernel)(tb__cl_kernel);
    tb__cl_int(TB__CL_CALL *SetKernelArg)(tb__cl_kernel, tb__cl_uint, size_t, const void *);
    tb__cl_int(TB__CL_CALL *GetKernelWorkGroupInfo)(tb__cl_kernel, tb__cl_device_id, tb__cl_uint,
                                                    size_t, void *, size_t *);
    tb__cl_int(TB__CL_CALL *EnqueueNDRangeKernel)(tb__cl_command_queue, tb__cl_kernel, tb__cl_uint,
                                                  const size_t *, const size_t *, const size_t *,
                                                  tb__cl_uint, const tb__cl_event *,
                                                  tb__cl_event *);
    tb__cl_int(TB__CL_CALL *Finish)(tb__cl_command_queue);
    tb__cl_int(TB__CL_CALL *Flush)(tb__cl_command_queue);
    tb__cl_int(TB__CL_CALL *WaitForEvents)(tb__cl_uint, const tb__cl_event *);
    tb__cl_int(TB__CL_CALL *GetEventProfilingInfo)(tb__cl_event, tb__cl_uint, size_t, void *,
                                                   size_t *);
    tb__cl_int(TB__CL_CALL *ReleaseEvent)(tb__cl_event);
} tb__cl_api;

#define TB__OCL_CALL(rt, fn) ((rt)->api.fn)

/* ---- opencl_api.c ---- */

static const char *tb__cl_error_name(tb__cl_int err);
static bool tb__cl_is_oom(tb__cl_int err);
static bool tb__ocl_load_library(tb__cl_api *api, char *reason, size_t cap);

/* ---- opencl_device.c: the runtime, devices, buffers ---- */

struct tb__ocl_runtime;
struct tb__ocl_device;

/* A device buffer: the payload of an opencl tb_backend_data with memory (k.mem its cl_mem, k.device
   its tb__ocl_device). */
typedef struct tb__ocl_buffer {
    tb_kit_buffer k;
    /* set: over a caller's host array (tb__ocl_buffer_borrow), never cached, never counted in
       the device's bytes, given back by release(context) once the device's queue is done */
    void (*release)(void *context);
    void *context;
} tb__ocl_buffer;

#define TB__OCL_MEM(b) ((tb__cl_mem)(b)->k.mem)
#define TB__OCL_DEV(b) ((tb__ocl_device *)(b)->k.device)

/* A built program shared by every computation whose source is the same. */
typedef struct tb__ocl_program {
    tb__kit_prog base; /* in the device's list; base.key: tb__ocl_program_key */
    tb__cl_program program;
    /* the disk cache folder to write the binary to after the first run: some drivers (PoCL)
       add the machine code of the kernels launched so far to the binary, so a later process
       skips that compile too; NULL when written, or when the disk cache is off */
    char *save_dir;
} tb__ocl_program;

/* A device. Its facts are set once, when the runtime loads; `lock` guards the rest: the
   allocator, the program cache, the statistics and every use of the queue (a run holds it
   from its first enqueue to its last). Devices run in parallel; a build holds no lock. */
typedef struct tb__ocl_device {
    struct tb__ocl_runtime *rt;
    tb__mutex lock;
    int32_t ordinal;
    tb__cl_platform_id platform;
    tb__cl_device_id id;
    tb_device_info info;
    char platform_name[128];
    char platform_version[128];
    char device_version[128];
    uint64_t max_alloc;
    size_t max_parameter_size; /* bytes of kernel arguments */
    uint32_t base_align_bits;  /* every buffer's start is aligned to this many bits */
    uint32_t float_lanes;      /* CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT: f32 lanes of its vectors */
    uint32_t clock_mhz;
    bool correct_divide_sqrt;
    bool fma; /* CL_FP_FMA of its float config */
    char build_options[512];
    /* created on first use */
    tb__cl_context ctx;
    tb__cl_command_queue queue;
    /* the caching allocator: free buffers, oldest first */
    tb__ocl_buffer **cache;
    size_t cache_count, cache_cap;
    uint64_t buffers_created, buffers_reused, cache_trims;
    /* programs and statistics */
    tb__kit_prog *programs;
    tb_kit_stats stats;
} tb__ocl_device;

typedef struct tb__ocl_runtime {
    tb__kit_proc proc; /* first: its count is the backend's, plus one per buffer, computation and
                          device in use */
    tb__cl_api api;
    tb__ocl_device *devices;
    size_t num_devices;
    int32_t default_ordinal;
    int32_t cache_dir_reported; /* atomic: why the cache folder is not used was said */
} tb__ocl_runtime;

/* Guards tb__ocl_current, the runtime's creation and its default device, and the creation of
   each device's context and queue. Taken before a device's lock, never after. */
static tb__mutex tb__ocl_mutex = TB__MUTEX_INIT;
static tb__kit_proc *tb__ocl_current; /* a tb__ocl_runtime */

/* the runtime (loaded on first use); call with tb__ocl_mutex held */
static tb__ocl_runtime *tb__ocl_runtime_get(void);
static void tb__ocl_runtime_ref(tb__ocl_runtime *rt);
static void tb__ocl_runtime_unref(tb__ocl_runtime *rt);
/* the device of an ordinal with its context and queue; call with tb__ocl_mutex held */
static tb__ocl_device *tb__ocl_device_get(int32_t ordinal, const char *func);
/* locks a device (and keeps its runtime) for its memory, programs and queue */
static tb__ocl_device *tb__ocl_device_acquire(int32_t ordinal, const char *func);
static void tb__ocl_device_lock(tb__ocl_device *dev);
static void tb__ocl_device_release(tb__ocl_device *dev);
/* the caching allocator and transfers; call with the device locked */
static tb_status tb__ocl_buffer_alloc(tb__ocl_device *dev, size_t size, tb__ocl_buffer **out);
static void tb__ocl_buffer_free(tb__ocl_buffer *buf);
static tb_status tb__ocl_buffer_borrow(tb__ocl_device *dev, void *host, size_t size,
                                       void (*release)(void *context), void *context,
                                       tb__ocl_buffer **out);
static void tb__ocl_buffer_destroy(tb__ocl_buffer *buf);
static void tb__ocl_cache_trim(tb__ocl_device *dev, uint64_t keep);
static tb_status tb__ocl_write(tb__ocl_device *dev, tb__ocl_buffer *buf, const void *host,
                               size_t size);
static tb_status tb__ocl_read(tb__ocl_device *dev, const tb__ocl_buffer *buf, void *host,
                              size_t size);
static void tb__ocl_metric(tb__ocl_device *dev, const char *name, int64_t delta);

/* ---- opencl_program.c: programs ---- */

/* the built program of a source (from memory, the disk cache, or built now; call without the
   device's lock) */
static tb_status tb__ocl_get_program(tb__ocl_device *dev, const char *src, size_t len,
                                     tb__ocl_program **out);
/* call these with the device locked */
static void tb__ocl_program_save(tb__ocl_device *dev, tb__ocl_program *p);
static void tb__ocl_program_unref(tb__ocl_device *dev, tb__ocl_program *p);
static void tb__ocl_programs_trim(tb__ocl_device *dev, size_t keep);

#endif /* TB_NO_OPENCL */
