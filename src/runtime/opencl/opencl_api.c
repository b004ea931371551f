/* ===========================================================================================
   OpenCL: the part of the API the backend uses, declared here so that no SDK is needed, and
   the ICD loader, opened at run time (no -lOpenCL) unless TB_OPENCL_LINKED is defined (the
   types and values are in opencl_internal.h).
   =========================================================================================== */
#include "../../impl_begin.h"

#ifndef TB_NO_OPENCL

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

#if defined(__linux__)
/* PoCL's CPU device runs a worker thread per core, unpinned unless POCL_AFFINITY=1. After a
   pause between calls the scheduler may queue the woken workers on one core, where they share
   it for the whole kernel while another core idles (the native pool's problem, which it solves
   for itself): on the 2-core EPYC VMs sum and max ran at 0.90-0.95 of PyTorch unpinned, 1.11-1.15
   pinned, and an elementwise chain swung between 4.3 and 8.2 ms from run to run. So, before the
   driver starts, POCL_AFFINITY=1 is set where the user has not set it and the process may run
   on every online CPU (PoCL pins its workers to CPUs 0..n-1 whatever the process's own mask).
   Only PoCL reads the variable; POCL_AFFINITY=0 keeps it off. setenv and the mask call are
   looked up, as a strict C build may not declare them. */
static void tb__ocl_pocl_affinity(void) {
    typedef int (*tb__setenv_fn)(const char *name, const char *value, int overwrite);
    unsigned long mask[TB__CPU_WORDS];
    long online = sysconf(_SC_NPROCESSORS_ONLN), allowed = 0;
    void *self, *set_sym;
    tb__affinity_fn get, unused;
    tb__setenv_fn set;
    size_t i;
    if (online < 2 || tb__getenv("POCL_AFFINITY") != NULL) return;
    self = dlopen(NULL, RTLD_LAZY);
    if (self == NULL || !tb__affinity_calls(self, &get, &unused)) return;
    set_sym = dlsym(self, "setenv");
    if (set_sym == NULL) return;
    memcpy(&set, &set_sym, sizeof set_sym);
    memset(mask, 0, sizeof mask);
    if (get(pthread_self(), sizeof mask, mask) != 0) return;
    for (i = 0; i < sizeof mask / sizeof mask[0]; i++) {
        unsigned long m = mask[i];
        for (; m != 0; m &= m - 1)
            allowed++;
    }
    if (allowed >= online) set("POCL_AFFINITY", "1", 0);
}
#endif

/* Opens the ICD loader ($TB_OPENCL_LIBRARY, else the system's) and resolves every entry point
   into *api; on failure `reason` (of `cap` bytes) says why. The library stays loaded: drivers
   keep threads and state past the release of their last object, and some crash when
   unloaded; opening it again gives the same handle. */
static bool tb__ocl_load_library(tb__cl_api *api, char *reason, size_t cap) {
#if defined(__linux__)
    tb__ocl_pocl_affinity();
#endif
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
