/* ===========================================================================================
   OpenCL: the part of the API the backend uses, declared here so that no SDK is needed, and
   the ICD loader, opened at run time (no -lOpenCL) unless TB_OPENCL_LINKED is defined.
   =========================================================================================== */
#include "impl_begin.h"

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
#define TB__CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT          (1u << 7)
#define TB__CL_DEVICE_TYPE_CPU                           (1u << 1)
#define TB__CL_DEVICE_TYPE_GPU                           (1u << 2)
#define TB__CL_DEVICE_TYPE_ACCELERATOR                   (1u << 3)
#define TB__CL_DEVICE_TYPE_ALL                           0xFFFFFFFFu
#define TB__CL_CONTEXT_PLATFORM                          0x1084
#define TB__CL_QUEUE_PROFILING_ENABLE                    (1u << 1)
#define TB__CL_MEM_READ_WRITE                            (1u << 0)
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

/* Symbol names in the order of the struct's members (every member is one function pointer). */
static const char *const tb__cl_symbols[] = {"clGetPlatformIDs",
                                             "clGetPlatformInfo",
                                             "clGetDeviceIDs",
                                             "clGetDeviceInfo",
                                             "clCreateContext",
                                             "clReleaseContext",
                                             "clCreateCommandQueue",
                                             "clReleaseCommandQueue",
                                             "clCreateBuffer",
                                             "clReleaseMemObject",
                                             "clEnqueueReadBuffer",
                                             "clEnqueueWriteBuffer",
                                             "clEnqueueCopyBuffer",
                                             "clEnqueueMapBuffer",
                                             "clEnqueueUnmapMemObject",
                                             "clCreateProgramWithSource",
                                             "clCreateProgramWithBinary",
                                             "clBuildProgram",
                                             "clGetProgramBuildInfo",
                                             "clGetProgramInfo",
                                             "clReleaseProgram",
                                             "clCreateKernel",
                                             "clReleaseKernel",
                                             "clSetKernelArg",
                                             "clGetKernelWorkGroupInfo",
                                             "clEnqueueNDRangeKernel",
                                             "clFinish",
                                             "clFlush",
                                             "clWaitForEvents",
                                             "clGetEventProfilingInfo",
                                             "clReleaseEvent"};

static const char *tb__cl_error_name(tb__cl_int err) {
    switch (err) {
    case 0:
        return "CL_SUCCESS";
    case -1:
        return "CL_DEVICE_NOT_FOUND";
    case -2:
        return "CL_DEVICE_NOT_AVAILABLE";
    case -3:
        return "CL_COMPILER_NOT_AVAILABLE";
    case -4:
        return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case -5:
        return "CL_OUT_OF_RESOURCES";
    case -6:
        return "CL_OUT_OF_HOST_MEMORY";
    case -7:
        return "CL_PROFILING_INFO_NOT_AVAILABLE";
    case -11:
        return "CL_BUILD_PROGRAM_FAILURE";
    case -12:
        return "CL_MAP_FAILURE";
    case -14:
        return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    case -30:
        return "CL_INVALID_VALUE";
    case -31:
        return "CL_INVALID_DEVICE_TYPE";
    case -32:
        return "CL_INVALID_PLATFORM";
    case -33:
        return "CL_INVALID_DEVICE";
    case -34:
        return "CL_INVALID_CONTEXT";
    case -35:
        return "CL_INVALID_QUEUE_PROPERTIES";
    case -36:
        return "CL_INVALID_COMMAND_QUEUE";
    case -37:
        return "CL_INVALID_HOST_PTR";
    case -38:
        return "CL_INVALID_MEM_OBJECT";
    case -42:
        return "CL_INVALID_BINARY";
    case -43:
        return "CL_INVALID_BUILD_OPTIONS";
    case -44:
        return "CL_INVALID_PROGRAM";
    case -45:
        return "CL_INVALID_PROGRAM_EXECUTABLE";
    case -46:
        return "CL_INVALID_KERNEL_NAME";
    case -47:
        return "CL_INVALID_KERNEL_DEFINITION";
    case -48:
        return "CL_INVALID_KERNEL";
    case -49:
        return "CL_INVALID_ARG_INDEX";
    case -50:
        return "CL_INVALID_ARG_VALUE";
    case -51:
        return "CL_INVALID_ARG_SIZE";
    case -52:
        return "CL_INVALID_KERNEL_ARGS";
    case -53:
        return "CL_INVALID_WORK_DIMENSION";
    case -54:
        return "CL_INVALID_WORK_GROUP_SIZE";
    case -55:
        return "CL_INVALID_WORK_ITEM_SIZE";
    case -56:
        return "CL_INVALID_GLOBAL_OFFSET";
    case -57:
        return "CL_INVALID_EVENT_WAIT_LIST";
    case -58:
        return "CL_INVALID_EVENT";
    case -59:
        return "CL_INVALID_OPERATION";
    case -61:
        return "CL_INVALID_BUFFER_SIZE";
    case -63:
        return "CL_INVALID_GLOBAL_WORK_SIZE";
    case -1001:
        return "CL_PLATFORM_NOT_FOUND_KHR";
    }
    return "unknown OpenCL error";
}

static bool tb__cl_is_oom(tb__cl_int err) {
    return err == TB__CL_MEM_OBJECT_ALLOCATION_FAILURE || err == TB__CL_OUT_OF_RESOURCES ||
           err == TB__CL_OUT_OF_HOST_MEMORY;
}

/* Opens the ICD loader ($TB_OPENCL_LIBRARY, else the system's) and resolves every entry point
   into *api; on failure `reason` (of `cap` bytes) says why. The library stays loaded: drivers
   keep threads and state past the release of their last object, and some crash when
   unloaded; opening it again gives the same handle. */
static bool tb__ocl_load_library(tb__cl_api *api, char *reason, size_t cap) {
#if defined(TB_OPENCL_LINKED)
    api->GetPlatformIDs = clGetPlatformIDs;
    api->GetPlatformInfo = clGetPlatformInfo;
    api->GetDeviceIDs = clGetDeviceIDs;
    api->GetDeviceInfo = clGetDeviceInfo;
    api->CreateContext = clCreateContext;
    api->ReleaseContext = clReleaseContext;
    api->CreateCommandQueue = clCreateCommandQueue;
    api->ReleaseCommandQueue = clReleaseCommandQueue;
    api->CreateBuffer = clCreateBuffer;
    api->ReleaseMemObject = clReleaseMemObject;
    api->EnqueueReadBuffer = clEnqueueReadBuffer;
    api->EnqueueWriteBuffer = clEnqueueWriteBuffer;
    api->EnqueueCopyBuffer = clEnqueueCopyBuffer;
    api->EnqueueMapBuffer = clEnqueueMapBuffer;
    api->EnqueueUnmapMemObject = clEnqueueUnmapMemObject;
    api->CreateProgramWithSource = clCreateProgramWithSource;
    api->CreateProgramWithBinary = clCreateProgramWithBinary;
    api->BuildProgram = clBuildProgram;
    api->GetProgramBuildInfo = clGetProgramBuildInfo;
    api->GetProgramInfo = clGetProgramInfo;
    api->ReleaseProgram = clReleaseProgram;
    api->CreateKernel = clCreateKernel;
    api->ReleaseKernel = clReleaseKernel;
    api->SetKernelArg = clSetKernelArg;
    api->GetKernelWorkGroupInfo = clGetKernelWorkGroupInfo;
    api->EnqueueNDRangeKernel = clEnqueueNDRangeKernel;
    api->Finish = clFinish;
    api->Flush = clFlush;
    api->WaitForEvents = clWaitForEvents;
    api->GetEventProfilingInfo = clGetEventProfilingInfo;
    api->ReleaseEvent = clReleaseEvent;
    (void)reason, (void)cap;
    return true;
#else
    const size_t count = sizeof tb__cl_symbols / sizeof tb__cl_symbols[0];
    const char *path = tb__getenv("TB_OPENCL_LIBRARY");
    void *lib;
    size_t i;
    if (path == NULL) {
#if defined(_WIN32)
        path = "OpenCL.dll";
#elif defined(__APPLE__)
        path = "/System/Library/Frameworks/OpenCL.framework/OpenCL";
#else
        path = "libOpenCL.so.1";
#endif
    }
    if (sizeof(tb__cl_api) != count * sizeof(void *)) {
        snprintf(reason, cap, "opencl: function pointers and data pointers differ in size here");
        return false;
    }
#if defined(_WIN32)
    lib = (void *)LoadLibraryA(path);
    if (lib == NULL) {
        snprintf(reason, cap, "opencl: cannot open %s: error %lu", path,
                 (unsigned long)GetLastError());
        return false;
    }
#else
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *why = dlerror();
        snprintf(reason, cap, "opencl: cannot open %s: %s", path,
                 why != NULL ? why : "unknown reason");
        return false;
    }
#endif
    for (i = 0; i < count; i++) {
        void *sym;
#if defined(_WIN32)
        FARPROC proc = GetProcAddress((HMODULE)lib, tb__cl_symbols[i]);
        memcpy(&sym, &proc, sizeof sym);
#else
        sym = dlsym(lib, tb__cl_symbols[i]);
#endif
        if (sym == NULL) {
            snprintf(reason, cap, "opencl: %s does not export %s", path, tb__cl_symbols[i]);
            return false;
        }
        memcpy((char *)api + i * sizeof(void *), &sym, sizeof sym);
    }
    return true;
#endif
}

#endif /* TB_NO_OPENCL */
