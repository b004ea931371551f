/* torch_backend.h - v0.1.0 - a lazy-tensor backend layer with an OpenCL execution path, in C.
   Public domain-style single-file library; BSD-3-Clause, see the end of README.md and LICENSE.

   WHAT IT IS
     The C form of PyTorch's Lazy Tensor Core backend layer and of torch._dynamo's backend
     registry: a registry of backends, devices, shapes, an IR of lazy tensor nodes, an executor with
     a computation cache, a CPU reference backend that is always present, and two compiled
     backends that lower IR graphs to generated kernels: OpenCL C on any OpenCL device, and C
     compiled at run time by the system's compiler on the host's cores ("native"). Both sit on
     a public kit (tb_kit_register) with which a vendor's runtime becomes a compiled backend by
     giving its memory, build and launch calls.

   USAGE
     Do this:
         #define TB_IMPLEMENTATION
     before you include this file in *one* C or C++ file to create the implementation:

         #include ...
         #define TB_IMPLEMENTATION
         #include "torch_backend.h"

     Every other file includes "torch_backend.h" without the define. Link with -ldl -lpthread -lm
     where the C library needs them. No OpenCL SDK is needed: the ICD loader (libOpenCL.so.1) is
     opened at run time.

   CONFIGURATION MACROS (define before the implementation include)
     TB_STATIC              make every public function static to the including file (with gcc
                            and clang one weak symbol stays external, tb_plugin_attach_host,
                            through which a host passes its error hook to a plugin's copy)
     TB_OPENCL_LINKED       call the OpenCL entry points directly (link with -lOpenCL) instead of
                            opening the ICD loader at run time
     TB_NO_OPENCL           leave the OpenCL backend out entirely
     TB_NO_NATIVE           leave the native backend (C compiled at run time) out
     TB_NO_PLUGINS          leave plugin loading (dlopen) out
     TB_NO_MPI              leave the MPI loader out (the "mpi" process group then reports
                            TB_ERR_UNAVAILABLE)
     TB_ASSERT(x)           your own assert for internal invariants (default: assert.h)

   ENVIRONMENT VARIABLES
     TB_BACKEND          the default backend (default "cpu"; desc.backend overrides it)
     TB_DEVICE           the default device, as "backend:ordinal", e.g. "opencl:0" (desc.device
                         overrides it). A bad TB_BACKEND or TB_DEVICE is an error wherever the
                         default is used ("TB_BACKEND='x' is not a usable backend: ..."), never
                         a fallback
     TB_BACKEND_PATH     ':'-separated folders searched for plugins libtb_backend_<name>.so
     TB_CACHE_DIR        folder of the compiled-program cache (opencl and native), created
                         0700 (a folder or entry others may write to is not used); "off"
                         disables it
     TB_CACHE_MAX        size cap of that folder, e.g. "500M" (default 1G; 0: no cap): past
                         it, the entries used least recently are removed
     TB_COMPILE_TIMEOUT  seconds a native compile may take (default 300; 0: no limit); no
                         compiler outlives the process that started it
     CC, TB_NATIVE_CFLAGS  the native backend's C compiler (default cc) and extra options, split
                         at blanks, each word one argument
     TB_NATIVE_THREADS   threads of the native backend (default: the online cores)
     TB_OPENCL_LIBRARY   path of the OpenCL ICD loader (default libOpenCL.so.1; ignored with
                         TB_OPENCL_LINKED)
     TB_MPI_LIBRARY      the MPI library the "mpi" process group opens (default: libmpi.so.40,
                         then libmpich.so.12, then libmpi_abi.so.0); no -lmpi is ever needed
     TB_COLLECTIVE_TIMEOUT  seconds an "mpi" collective may wait for the other ranks before
                         it fails and the group becomes unusable (default 300; 0: no end)
     TB_OPENCL_BUILD_OPTIONS  extra options for every OpenCL program build (part of the disk
                         cache key), e.g. "-cl-fast-relaxed-math"
     POCL_AFFINITY       PoCL's own; set to 1 (workers pinned) before the driver starts where it
                         is unset and the process may run on every online CPU
     POCL_KERNEL_CACHE   PoCL's own; while its kernel cache is on (the default), PoCL's programs
                         are left to it and not written to TB_CACHE_DIR; 0 writes them (a later
                         process then loads each in about 1 ms, not PoCL's 24)
     TB_DEBUG            1: one line per graph compile/run, and one while a compile is still
                         running after 1 s; 2: also one line per kernel with time, GB/s,
                         GFLOP/s; 3: also the IR and the generated OpenCL C
     TB_CHECK            1: run every graph on the reference backend too and log the first node
                         whose value differs; 2: also fail that sync (TB_ERR_EXECUTE); desc.check
                         overrides it

   ERRORS
     Functions return a tb_status (TB_OK is 0) or, for functions returning a handle, NULL. The
     reason is in tb_last_error() (thread-local). An op given a NULL input returns NULL and keeps
     the first error, so a chain of ops can be checked once at the end.

   LISTS AND TEXTS INTO CALLER ARRAYS
     Functions that fill an array of `cap` entries (tb_backend_list, tb_backend_list_plugins,
     tb_backend_devices, tb_shape_format, tb_device_format) return or store the full count (or
   length) whatever `cap` is, and write at most `cap` entries. A NULL array asks for the count
   alone: `cap` is then ignored, and the count is the same as with an array.

   THREAD SAFETY
     The registry, the op table, the metrics and the computation cache are guarded by locks. A
     tensor may be read from several threads; building graphs on the same tensors from several
     threads at once needs the caller's own lock. Each function's comment says more where needed.

   VERSION
     0.1.0 (TB_VERSION_MAJOR/MINOR/PATCH); plugin API version TB_API_VERSION.
*/
#ifndef TORCH_BACKEND_H
#define TORCH_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define TB_VERSION_MAJOR  0
#define TB_VERSION_MINOR  1
#define TB_VERSION_PATCH  0
#define TB_VERSION_STRING "0.1.0"
/* The binary contract between the library and a backend plugin; bumped whenever
   tb_backend_impl, tb_backend_data or tb_plugin_desc change layout. */
#define TB_API_VERSION 3

#ifndef TBDEF
#ifdef TB_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define TBDEF static __attribute__((unused))
#else
#define TBDEF static
#endif
#else
#define TBDEF extern
#endif
#endif

#if defined(__GNUC__) || defined(__clang__)
#define TB_PRINTF_LIKE(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define TB_PRINTF_LIKE(fmt, args)
#endif

#ifdef __cplusplus
extern "C" {
#endif
