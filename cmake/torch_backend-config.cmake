# The CMake package of torch_backend.h, installed by `cmake --install` or tools/install.sh:
#     find_package(torch_backend 0.1 REQUIRED)
#     target_link_libraries(app PRIVATE torch_backend::torch_backend)
# torch_backend::torch_backend is an INTERFACE target: the include path and the system
# libraries the implementation needs (threads, dl, m). One file of yours defines
# TB_IMPLEMENTATION before including the header, or torch_backend_add_implementation() (from
# torch_backend-functions.cmake, included here) compiles it once as a library.
# The layout is fixed relative to this file: PREFIX/share/cmake/torch_backend/ holds it and
# PREFIX/include/torch_backend.h the header, so an installed tree may be moved as a whole.
include(CMakeFindDependencyMacro)
find_dependency(Threads)

get_filename_component(_torch_backend_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT EXISTS "${_torch_backend_prefix}/include/torch_backend.h")
    set(torch_backend_FOUND FALSE)
    set(torch_backend_NOT_FOUND_MESSAGE
        "${_torch_backend_prefix}/include/torch_backend.h is missing (a broken install?)")
    unset(_torch_backend_prefix)
    return()
endif()

if(NOT TARGET torch_backend::torch_backend)
    set(_torch_backend_libs Threads::Threads ${CMAKE_DL_LIBS})
    if(UNIX)
        list(APPEND _torch_backend_libs m)
    endif()
    add_library(torch_backend::torch_backend INTERFACE IMPORTED)
    set_target_properties(torch_backend::torch_backend PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${_torch_backend_prefix}/include"
        INTERFACE_LINK_LIBRARIES "${_torch_backend_libs}")
    unset(_torch_backend_libs)
endif()

set_property(GLOBAL PROPERTY TORCH_BACKEND_IMPL_SOURCE
             "${CMAKE_CURRENT_LIST_DIR}/torch_backend_impl.c")
include("${CMAKE_CURRENT_LIST_DIR}/torch_backend-functions.cmake")
unset(_torch_backend_prefix)
