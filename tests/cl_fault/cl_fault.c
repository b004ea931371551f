/* An OpenCL ICD loader stand-in for fault injection: the library opens it through
   TB_OPENCL_LIBRARY, and it forwards every entry point the library uses to the real loader
   (libOpenCL.so.1, or $TB_CL_FAULT_REAL), except that it can fail chosen calls of one entry
   point with a given error code, doing nothing else. It also counts the OpenCL objects alive
   (created and not yet released) so that a test can tell whether the library released all it
   made. tests/test_opencl_faults.c drives it through the functions at the end, which it finds
   with dlsym on the same shared object.

   Built by tests/cl_fault/build.sh (tools/test.sh runs it), without sanitizers. */
#define _GNU_SOURCE
#define CL_TARGET_OPENCL_VERSION 120
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* The entry points, in the order the counters use. */
#define CLF_ENTRIES(X)                                                                             \
    X(GetPlatformIDs)                                                                              \
    X(GetPlatformInfo)                                                                             \
    X(GetDeviceIDs)                                                                                \
    X(GetDeviceInfo)                                                                               \
    X(CreateContext)                                                                               \
    X(ReleaseContext)                                                                              \
    X(CreateCommandQueue)                                                                          \
    X(ReleaseCommandQueue)                                                                         \
    X(CreateBuffer)                                                                                \
    X(ReleaseMemObject)                                                                            \
    X(EnqueueReadBuffer)                                                                           \
    X(EnqueueWriteBuffer)                                                                          \
    X(EnqueueCopyBuffer)                                                                           \
    X(EnqueueMapBuffer)                                                                            \
    X(EnqueueUnmapMemObject)                                                                       \
    X(CreateProgramWithSource)                                                                     \
    X(CreateProgramWithBinary)                                                                     \
    X(BuildProgram)                                                                                \
    X(GetProgramBuildInfo)                                                                         \
    X(GetProgramInfo)                                                                              \
    X(ReleaseProgram)                                                                              \
    X(CreateKernel)                                                                                \
    X(ReleaseKernel)                                                                               \
    X(SetKernelArg)                                                                                \
    X(GetKernelWorkGroupInfo)                                                                      \
    X(EnqueueNDRangeKernel)                                                                        \
    X(Finish)                                                                                      \
    X(Flush)                                                                                       \
    X(WaitForEvents)                                                                               \
    X(GetEventProfilingInfo)                                                                       \
    X(ReleaseEvent)

enum {
#define CLF_ENUM(name) CLF_##name,
    CLF_ENTRIES(CLF_ENUM)
#undef CLF_ENUM
        CLF_COUNT
};

static const char *const clf_names[CLF_COUNT] = {
#define CLF_NAME(name) "cl" #name,
    CLF_ENTRIES(CLF_NAME)
#undef CLF_NAME
};

/* Live objects: the kinds a test reads with tb_cl_fault_live. */
enum {
    LIVE_CONTEXT,
    LIVE_QUEUE,
    LIVE_MEM,
    LIVE_PROGRAM,
    LIVE_KERNEL,
    LIVE_EVENT,
    LIVE_MAP,
    LIVE_N
};

static void *clf_real[CLF_COUNT];
static pthread_once_t clf_once = PTHREAD_ONCE_INIT;
static long clf_calls[CLF_COUNT];
static long clf_live[LIVE_N];
/* the armed fault: calls numbered fail_from .. fail_from + fail_count - 1 (counted from 1 since
   arming) of entry `fail_entry` return `fail_error`; -1: none */
static int clf_fail_entry = -1;
static long clf_fail_from, clf_fail_count;
static cl_int clf_fail_error;
static long clf_injected;

static void clf_load(void) {
    const char *path = getenv("TB_CL_FAULT_REAL");
    void *lib = dlopen(path != NULL ? path : "libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    int i;
    if (lib == NULL) {
        fprintf(stderr, "cl_fault: cannot open the real OpenCL loader: %s\n", dlerror());
        return;
    }
    for (i = 0; i < CLF_COUNT; i++)
        clf_real[i] = dlsym(lib, clf_names[i]);
}

/* The real function, or NULL when the loader lacks it. */
static void *clf_fn(int entry) {
    pthread_once(&clf_once, clf_load);
    return clf_real[entry];
}

/* Counts the call; true when it is to fail (then *error is the code). */
static int clf_fails(int entry, cl_int *error) {
    long call = __atomic_add_fetch(&clf_calls[entry], 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&clf_fail_entry, __ATOMIC_SEQ_CST) != entry) return 0;
    if (call < clf_fail_from || call - clf_fail_from >= clf_fail_count) return 0;
    __atomic_add_fetch(&clf_injected, 1, __ATOMIC_SEQ_CST);
    *error = clf_fail_error;
    return 1;
}

static void clf_count(int kind, long delta) {
    __atomic_add_fetch(&clf_live[kind], delta, __ATOMIC_SEQ_CST);
}

/* Mappings per buffer: a mapping counts as alive while its buffer lives (releasing a buffer
   ends its mappings). */
#define CLF_MAPS 4096
static struct {
    cl_mem mem;
    long count;
} clf_maps[CLF_MAPS];
static pthread_mutex_t clf_maps_lock = PTHREAD_MUTEX_INITIALIZER;

static void clf_map_add(cl_mem mem, long delta) {
    int i, free_slot = -1;
    pthread_mutex_lock(&clf_maps_lock);
    for (i = 0; i < CLF_MAPS; i++) {
        if (clf_maps[i].mem == mem) break;
        if (clf_maps[i].mem == NULL && free_slot < 0) free_slot = i;
    }
    if (i == CLF_MAPS && free_slot >= 0) {
        i = free_slot;
        clf_maps[i].mem = mem;
        clf_maps[i].count = 0;
    }
    if (i < CLF_MAPS) {
        clf_maps[i].count += delta;
        clf_count(LIVE_MAP, delta);
        if (clf_maps[i].count == 0) clf_maps[i].mem = NULL;
    }
    pthread_mutex_unlock(&clf_maps_lock);
}

static void clf_map_forget(cl_mem mem) {
    int i;
    pthread_mutex_lock(&clf_maps_lock);
    for (i = 0; i < CLF_MAPS; i++) {
        if (clf_maps[i].mem == mem) {
            clf_count(LIVE_MAP, -clf_maps[i].count);
            clf_maps[i].mem = NULL;
            clf_maps[i].count = 0;
        }
    }
    pthread_mutex_unlock(&clf_maps_lock);
}

#define REAL(name) ((__typeof__(&cl##name))clf_fn(CLF_##name))
/* A call that returns a status: fail, or forward (a missing function is CL_INVALID_OPERATION). */
#define FORWARD_STATUS(name, ...)                                                                  \
    do {                                                                                           \
        cl_int err_;                                                                               \
        if (clf_fails(CLF_##name, &err_)) return err_;                                             \
        if (REAL(name) == NULL) return CL_INVALID_OPERATION;                                       \
        return REAL(name)(__VA_ARGS__);                                                            \
    } while (0)

/* ---- the entry points ---- */

EXPORT cl_int clGetPlatformIDs(cl_uint num_entries, cl_platform_id *platforms,
                               cl_uint *num_platforms) {
    FORWARD_STATUS(GetPlatformIDs, num_entries, platforms, num_platforms);
}

EXPORT cl_int clGetPlatformInfo(cl_platform_id platform, cl_platform_info param_name,
                                size_t param_value_size, void *param_value,
                                size_t *param_value_size_ret) {
    FORWARD_STATUS(GetPlatformInfo, platform, param_name, param_value_size, param_value,
                   param_value_size_ret);
}

EXPORT cl_int clGetDeviceIDs(cl_platform_id platform, cl_device_type device_type,
                             cl_uint num_entries, cl_device_id *devices, cl_uint *num_devices) {
    FORWARD_STATUS(GetDeviceIDs, platform, device_type, num_entries, devices, num_devices);
}

EXPORT cl_int clGetDeviceInfo(cl_device_id device, cl_device_info param_name,
                              size_t param_value_size, void *param_value,
                              size_t *param_value_size_ret) {
    FORWARD_STATUS(GetDeviceInfo, device, param_name, param_value_size, param_value,
                   param_value_size_ret);
}

EXPORT cl_context clCreateContext(const cl_context_properties *properties, cl_uint num_devices,
                                  const cl_device_id *devices,
                                  void(CL_CALLBACK *pfn_notify)(const char *, const void *, size_t,
                                                                void *),
                                  void *user_data, cl_int *errcode_ret) {
    cl_int err;
    cl_context ctx;
    if (clf_fails(CLF_CreateContext, &err)) {
        if (errcode_ret != NULL) *errcode_ret = err;
        return NULL;
    }
    ctx = REAL(CreateContext)(properties, num_devices, devices, pfn_notify, user_data, errcode_ret);
    if (ctx != NULL) clf_count(LIVE_CONTEXT, 1);
    return ctx;
}

EXPORT cl_int clReleaseContext(cl_context context) {
    cl_int err;
    if (clf_fails(CLF_ReleaseContext, &err)) return err;
    err = REAL(ReleaseContext)(context);
    if (err == CL_SUCCESS) clf_count(LIVE_CONTEXT, -1);
    return err;
}

EXPORT cl_command_queue clCreateCommandQueue(cl_context context, cl_device_id device,
                                             cl_command_queue_properties properties,
                                             cl_int *errcode_ret) {
    cl_int err;
    cl_command_queue q;
    if (clf_fails(CLF_CreateCommandQueue, &err)) {
        if (errcode_ret != NULL) *errcode_ret = err;
        return NULL;
    }
    q = REAL(CreateCommandQueue)(context, device, properties, errcode_ret);
    if (q != NULL) clf_count(LIVE_QUEUE, 1);
    return q;
}

EXPORT cl_int clReleaseCommandQueue(cl_command_queue command_queue) {
    cl_int err;
    if (clf_fails(CLF_ReleaseCommandQueue, &err)) return err;
    err = REAL(ReleaseCommandQueue)(command_queue);
    if (err == CL_SUCCESS) clf_count(LIVE_QUEUE, -1);
    return err;
}

EXPORT cl_mem clCreateBuffer(cl_context context, cl_mem_flags flags, size_t size, void *host_ptr,
                             cl_int *errcode_ret) {
    cl_int err;
    cl_mem m;
    if (clf_fails(CLF_CreateBuffer, &err)) {
        if (errcode_ret != NULL) *errcode_ret = err;
        return NULL;
    }
    m = REAL(CreateBuffer)(context, flags, size, host_ptr, errcode_ret);
    if (m != NULL) clf_count(LIVE_MEM, 1);
    return m;
}

EXPORT cl_int clReleaseMemObject(cl_mem memobj) {
    cl_int err;
    if (clf_fails(CLF_ReleaseMemObject, &err)) return err;
    err = REAL(ReleaseMemObject)(memobj);
    if (err == CL_SUCCESS) {
        clf_count(LIVE_MEM, -1);
        clf_map_forget(memobj); /* the library never retains: this release frees it */
    }
    return err;
}

/* An event handed back to the caller counts as live until clReleaseEvent. */
static cl_int clf_event_out(cl_int err, cl_event *event) {
    if (err == CL_SUCCESS && event != NULL && *event != NULL) clf_count(LIVE_EVENT, 1);
    return err;
}

EXPORT cl_int clEnqueueReadBuffer(cl_command_queue command_queue, cl_mem buffer,
                                  cl_bool blocking_read, size_t offset, size_t size, void *ptr,
                                  cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                  cl_event *event) {
    cl_int err;
    if (clf_fails(CLF_EnqueueReadBuffer, &err)) return err;
    return clf_event_out(REAL(EnqueueReadBuffer)(command_queue, buffer, blocking_read, offset, size,
                                                 ptr, num_events_in_wait_list, event_wait_list,
                                                 event),
                         event);
}

EXPORT cl_int clEnqueueWriteBuffer(cl_command_queue command_queue, cl_mem buffer,
                                   cl_bool blocking_write, size_t offset, size_t size,
                                   const void *ptr, cl_uint num_events_in_wait_list,
                                   const cl_event *event_wait_list, cl_event *event) {
    cl_int err;
    if (clf_fails(CLF_EnqueueWriteBuffer, &err)) return err;
    return clf_event_out(REAL(EnqueueWriteBuffer)(command_queue, buffer, blocking_write, offset,
                                                  size, ptr, num_events_in_wait_list,
                                                  event_wait_list, event),
                         event);
}

EXPORT cl_int clEnqueueCopyBuffer(cl_command_queue command_queue, cl_mem src_buffer,
                                  cl_mem dst_buffer, size_t src_offset, size_t dst_offset,
                                  size_t size, cl_uint num_events_in_wait_list,
                                  const cl_event *event_wait_list, cl_event *event) {
    cl_int err;
    if (clf_fails(CLF_EnqueueCopyBuffer, &err)) return err;
    return clf_event_out(REAL(EnqueueCopyBuffer)(command_queue, src_buffer, dst_buffer, src_offset,
                                                 dst_offset, size, num_events_in_wait_list,
                                                 event_wait_list, event),
                         event);
}

EXPORT void *clEnqueueMapBuffer(cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_map,
                                cl_map_flags map_flags, size_t offset, size_t size,
                                cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                cl_event *event, cl_int *errcode_ret) {
    cl_int err;
    void *p;
    if (clf_fails(CLF_EnqueueMapBuffer, &err)) {
        if (errcode_ret != NULL) *errcode_ret = err;
        return NULL;
    }
    p = REAL(EnqueueMapBuffer)(command_queue, buffer, blocking_map, map_flags, offset, size,
                               num_events_in_wait_list, event_wait_list, event, &err);
    if (errcode_ret != NULL) *errcode_ret = err;
    if (p != NULL && err == CL_SUCCESS) {
        clf_map_add(buffer, 1);
        (void)clf_event_out(err, event);
    }
    return p;
}

EXPORT cl_int clEnqueueUnmapMemObject(cl_command_queue command_queue, cl_mem memobj,
                                      void *mapped_ptr, cl_uint num_events_in_wait_list,
                                      const cl_event *event_wait_list, cl_event *event) {
    cl_int err;
    if (clf_fails(CLF_EnqueueUnmapMemObject, &err)) return err;
    err = REAL(EnqueueUnmapMemObject)(command_queue, memobj, mapped_ptr, num_events_in_wait_list,
                                      event_wait_list, event);
    if (err == CL_SUCCESS) clf_map_add(memobj, -1);
    return clf_event_out(err, event);
}

EXPORT cl_program clCreateProgramWithSource(cl_context context, cl_uint count, const char **strings,
                                            const size_t *lengths, cl_int *errcode_ret) {
    cl_int err;
    cl_program p;
    if (clf_fails(CLF_CreateProgramWithSource, &err)) {
        if (errcode_ret != NULL) *errcode_ret = err;
        return NULL;
    }
    p = REAL(CreateProgramWithSource)(context, count, strings, lengths, errcode_ret);
    if (p != NULL) clf_count(LIVE_PROGRAM, 1);
    return p;
}

EXPORT cl_program clCreateProgramWithBinary(cl_context context, cl_uint num_devices,
                                            const cl_device_id *device_list, const size_t *lengths,
                                            const unsigned char **binaries, cl_int *binary_status,
                                            cl_int *errcode_ret) {
    cl_int err;
    cl_program p;
    if (clf_fails(CLF_CreateProgramWithBinary, &err)) {
        cl_uint i;
        if (binary_status != NULL) {
            for (i = 0; i < num_devices; i++)
                binary_status[i] = err;
        }
        if (errcode_ret != NULL) *errcode_ret = err;
        return NULL;
    }
    p = REAL(CreateProgramWithBinary)(context, num_devices, device_list, lengths, binaries,
                                      binary_status, errcode_ret);
    if (p != NULL) clf_count(LIVE_PROGRAM, 1);
    return p;
}

EXPORT cl_int clBuildProgram(cl_program program, cl_uint num_devices,
                             const cl_device_id *device_list, const char *options,
                             void(CL_CALLBACK *pfn_notify)(cl_program, void *), void *user_data) {
    FORWARD_STATUS(BuildProgram, program, num_devices, device_list, options, pfn_notify, user_data);
}

EXPORT cl_int clGetProgramBuildInfo(cl_program program, cl_device_id device,
                                    cl_program_build_info param_name, size_t param_value_size,
                                    void *param_value, size_t *param_value_size_ret) {
    FORWARD_STATUS(GetProgramBuildInfo, program, device, param_name, param_value_size, param_value,
                   param_value_size_ret);
}

EXPORT cl_int clGetProgramInfo(cl_program program, cl_program_info param_name,
                               size_t param_value_size, void *param_value,
                               size_t *param_value_size_ret) {
    FORWARD_STATUS(GetProgramInfo, program, param_name, param_value_size, param_value,
                   param_value_size_ret);
}

EXPORT cl_int clReleaseProgram(cl_program program) {
    cl_int err;
    if (clf_fails(CLF_ReleaseProgram, &err)) return err;
    err = REAL(ReleaseProgram)(program);
    if (err == CL_SUCCESS) clf_count(LIVE_PROGRAM, -1);
    return err;
}

EXPORT cl_kernel clCreateKernel(cl_program program, const char *kernel_name, cl_int *errcode_ret) {
    cl_int err;
    cl_kernel k;
    if (clf_fails(CLF_CreateKernel, &err)) {
        if (errcode_ret != NULL) *errcode_ret = err;
        return NULL;
    }
    k = REAL(CreateKernel)(program, kernel_name, errcode_ret);
    if (k != NULL) clf_count(LIVE_KERNEL, 1);
    return k;
}

EXPORT cl_int clReleaseKernel(cl_kernel kernel) {
    cl_int err;
    if (clf_fails(CLF_ReleaseKernel, &err)) return err;
    err = REAL(ReleaseKernel)(kernel);
    if (err == CL_SUCCESS) clf_count(LIVE_KERNEL, -1);
    return err;
}

EXPORT cl_int clSetKernelArg(cl_kernel kernel, cl_uint arg_index, size_t arg_size,
                             const void *arg_value) {
    FORWARD_STATUS(SetKernelArg, kernel, arg_index, arg_size, arg_value);
}

EXPORT cl_int clGetKernelWorkGroupInfo(cl_kernel kernel, cl_device_id device,
                                       cl_kernel_work_group_info param_name,
                                       size_t param_value_size, void *param_value,
                                       size_t *param_value_size_ret) {
    FORWARD_STATUS(GetKernelWorkGroupInfo, kernel, device, param_name, param_value_size,
                   param_value, param_value_size_ret);
}

EXPORT cl_int clEnqueueNDRangeKernel(cl_command_queue command_queue, cl_kernel kernel,
                                     cl_uint work_dim, const size_t *global_work_offset,
                                     const size_t *global_work_size, const size_t *local_work_size,
                                     cl_uint num_events_in_wait_list,
                                     const cl_event *event_wait_list, cl_event *event) {
    cl_int err;
    if (clf_fails(CLF_EnqueueNDRangeKernel, &err)) return err;
    return clf_event_out(REAL(EnqueueNDRangeKernel)(
                             command_queue, kernel, work_dim, global_work_offset, global_work_size,
                             local_work_size, num_events_in_wait_list, event_wait_list, event),
                         event);
}

EXPORT cl_int clFinish(cl_command_queue command_queue) {
    FORWARD_STATUS(Finish, command_queue);
}

EXPORT cl_int clFlush(cl_command_queue command_queue) {
    FORWARD_STATUS(Flush, command_queue);
}

EXPORT cl_int clWaitForEvents(cl_uint num_events, const cl_event *event_list) {
    FORWARD_STATUS(WaitForEvents, num_events, event_list);
}

EXPORT cl_int clGetEventProfilingInfo(cl_event event, cl_profiling_info param_name,
                                      size_t param_value_size, void *param_value,
                                      size_t *param_value_size_ret) {
    FORWARD_STATUS(GetEventProfilingInfo, event, param_name, param_value_size, param_value,
                   param_value_size_ret);
}

EXPORT cl_int clReleaseEvent(cl_event event) {
    cl_int err;
    if (clf_fails(CLF_ReleaseEvent, &err)) return err;
    err = REAL(ReleaseEvent)(event);
    if (err == CL_SUCCESS) clf_count(LIVE_EVENT, -1);
    return err;
}

/* ---- control, for the tests ---- */

/* The number of entry points, and the name of entry `i` ("clCreateBuffer"); NULL past the end. */
EXPORT int tb_cl_fault_entry_count(void) {
    return CLF_COUNT;
}

EXPORT const char *tb_cl_fault_entry_name(int i) {
    return i >= 0 && i < CLF_COUNT ? clf_names[i] : NULL;
}

/* Makes calls from .. from + count - 1 of entry `i` (counted from 1 from now on) return `error`
   without doing anything; i < 0 disarms. Resets every call counter. */
EXPORT void tb_cl_fault_arm(int i, long from, long count, int error) {
    int k;
    __atomic_store_n(&clf_fail_entry, -1, __ATOMIC_SEQ_CST);
    for (k = 0; k < CLF_COUNT; k++)
        __atomic_store_n(&clf_calls[k], 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&clf_injected, 0, __ATOMIC_SEQ_CST);
    clf_fail_from = from;
    clf_fail_count = count;
    clf_fail_error = (cl_int)error;
    if (i >= 0 && i < CLF_COUNT) __atomic_store_n(&clf_fail_entry, i, __ATOMIC_SEQ_CST);
}

/* Calls of entry `i` since the last arming. */
EXPORT long tb_cl_fault_calls(int i) {
    return i >= 0 && i < CLF_COUNT ? __atomic_load_n(&clf_calls[i], __ATOMIC_SEQ_CST) : 0;
}

/* Calls failed on purpose since the last arming. */
EXPORT long tb_cl_fault_injected(void) {
    return __atomic_load_n(&clf_injected, __ATOMIC_SEQ_CST);
}

/* Objects alive of kind `kind`: 0 contexts, 1 queues, 2 buffers, 3 programs, 4 kernels,
   5 events, 6 mappings (of buffers still alive); the name of the kind in *name. */
EXPORT long tb_cl_fault_live(int kind, const char **name) {
    static const char *const names[LIVE_N] = {"contexts", "queues", "buffers", "programs",
                                              "kernels",  "events", "mappings"};
    if (kind < 0 || kind >= LIVE_N) return 0;
    if (name != NULL) *name = names[kind];
    return __atomic_load_n(&clf_live[kind], __ATOMIC_SEQ_CST);
}
