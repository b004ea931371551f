/* The implementation of torch_backend.h, compiled once as a library by the CMake function
   torch_backend_add_implementation (the target torch_backend_impl in a source build). The
   configuration macros of the header (TB_NO_OPENCL, TB_NO_PLUGINS, TB_OPENCL_LINKED, ...) may
   be set on that target with target_compile_definitions. */
#define TB_IMPLEMENTATION
#include "torch_backend.h"
