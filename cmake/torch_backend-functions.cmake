# torch_backend_add_implementation(<name> [STATIC | SHARED | OBJECT] [EXCLUDE_FROM_ALL])
#
# Defines a library <name> holding the implementation of torch_backend.h (the translation unit
# with TB_IMPLEMENTATION), compiled once: link it instead of defining TB_IMPLEMENTATION in one of
# your own files. Without a type it follows BUILD_SHARED_LIBS. It links torch_backend::torch_backend
# publicly, so its users get the include path and the system libraries too. The project must
# have the C language enabled. Configuration macros go on the target:
#     torch_backend_add_implementation(tb STATIC)
#     target_compile_definitions(tb PUBLIC TB_NO_OPENCL)
function(torch_backend_add_implementation name)
    get_property(source GLOBAL PROPERTY TORCH_BACKEND_IMPL_SOURCE)
    if(NOT source)
        message(FATAL_ERROR "torch_backend_add_implementation: torch_backend was not added "
                            "(find_package, add_subdirectory or FetchContent first)")
    endif()
    add_library(${name} ${ARGN} "${source}")
    target_link_libraries(${name} PUBLIC torch_backend::torch_backend)
endfunction()
