# The runtime targets, the same for the installed package
# (rocm-kpack-config.cmake) and a build from source (CMakeLists.txt):
#
#   kpack::runtime    librocm_kpack.a, with its headers, ROCM_KPACK_STATIC
#                     and the system libraries it needs. A C target links
#                     the C library only (no C++ runtime); a target whose
#                     link language is C++ also gets the C++ API's glue,
#                     librocm_kpack_cxx.a, whose symbols it does not export
#                     (--exclude-libs).
#   kpack::cxx        the C++ API (kpack.hpp): kpack::runtime and C++17.
#   rocm::rocm_kpack  kpack::runtime under the reference package's name.
#
# kpack_define_targets(LIBRARY <lib.a> CXX_LIBRARY <glue.a>
#     INCLUDE_DIR <dir> SYSTEM_LIBS <lib>... [GLOBAL])
include_guard(GLOBAL)

function(kpack_define_targets)
  cmake_parse_arguments(PARSE_ARGV 0 ARG "GLOBAL" "LIBRARY;CXX_LIBRARY;INCLUDE_DIR" "SYSTEM_LIBS")
  set(_global)
  if(ARG_GLOBAL)
    set(_global GLOBAL)
  endif()
  set(_cxx "$<LINK_LANGUAGE:CXX>")
  if(NOT TARGET kpack::runtime)
    add_library(kpack::runtime STATIC IMPORTED ${_global})
    set_target_properties(kpack::runtime PROPERTIES
      IMPORTED_LOCATION "${ARG_LIBRARY}"
      IMPORTED_LINK_INTERFACE_LANGUAGES "C"
      INTERFACE_INCLUDE_DIRECTORIES "${ARG_INCLUDE_DIR}"
      INTERFACE_COMPILE_DEFINITIONS "ROCM_KPACK_STATIC"
      # The glue calls into the C library: it comes first, the library
      # again after it.
      INTERFACE_LINK_LIBRARIES "$<${_cxx}:${ARG_CXX_LIBRARY}>;$<${_cxx}:${ARG_LIBRARY}>;${ARG_SYSTEM_LIBS}"
      INTERFACE_LINK_OPTIONS "$<${_cxx}:LINKER:--exclude-libs,librocm_kpack_cxx.a>")
  endif()
  if(NOT TARGET kpack::cxx)
    add_library(kpack::cxx INTERFACE IMPORTED ${_global})
    set_target_properties(kpack::cxx PROPERTIES
      INTERFACE_LINK_LIBRARIES kpack::runtime
      INTERFACE_COMPILE_FEATURES cxx_std_17)
  endif()
  if(NOT TARGET rocm::rocm_kpack)
    add_library(rocm::rocm_kpack INTERFACE IMPORTED ${_global})
    set_target_properties(rocm::rocm_kpack PROPERTIES INTERFACE_LINK_LIBRARIES kpack::runtime)
  endif()
endfunction()
