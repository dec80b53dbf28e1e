# kpack_offload_target(<target>
#     [ARCHIVE_DIR <dir>] [GROUP <name>] [KERNEL_NAME <name>]
#     [SEARCH_PATHS <pattern>...]
#     [INSTALL_ARCHIVES_DESTINATION <dir>] [INSTALL_DESTINATION <dir>])
#
# After <target> (a shared library, module or executable with HIP device
# code) is linked, move its device code into per-target .kpack archives and
# rewrite its output file in place (atomically) into a host-only binary that
# finds them at run time. See docs/cmake.md.
#
# ARCHIVE_DIR    where the archives go (default: `.kpack` beside the file)
# GROUP          archive name prefix, <GROUP>_<target>.kpack (default: the
#                target's output base name)
# KERNEL_NAME    the binary's key in the archives (default: its file name)
# SEARCH_PATHS   archive paths written into the binary, relative to its
#                directory, `@GFXARCH@` standing for a target ID (default:
#                the relative path from the file to ARCHIVE_DIR)
# INSTALL_ARCHIVES_DESTINATION
#                install the archives there (relative to the install prefix);
#                when it is not `.kpack` beside where the target is installed,
#                a second search path for the installed layout is added
# INSTALL_DESTINATION
#                where the target itself is installed (default:
#                CMAKE_INSTALL_LIBDIR for libraries, CMAKE_INSTALL_BINDIR for
#                executables); only used to compute that search path
include_guard(GLOBAL)

function(kpack_offload_target target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG ""
    "ARCHIVE_DIR;GROUP;KERNEL_NAME;INSTALL_ARCHIVES_DESTINATION;INSTALL_DESTINATION" "SEARCH_PATHS")
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kpack_offload_target(${target}): unknown arguments: ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT TARGET ${target})
    message(FATAL_ERROR "kpack_offload_target(${target}): no such target")
  endif()
  get_target_property(_type ${target} TYPE)
  if(NOT _type MATCHES "^(SHARED_LIBRARY|MODULE_LIBRARY|EXECUTABLE)$")
    message(FATAL_ERROR "kpack_offload_target(${target}): a ${_type} has no device code to offload "
      "(kpack offloads shared libraries, modules and executables; static libraries and objects are link inputs)")
  endif()
  if(NOT TARGET kpack::kpack)
    message(FATAL_ERROR "kpack_offload_target(${target}): kpack::kpack is not defined (find_package(rocm-kpack) first)")
  endif()

  if(NOT ARG_ARCHIVE_DIR)
    set(ARG_ARCHIVE_DIR "$<TARGET_FILE_DIR:${target}>/.kpack")
  endif()
  if(NOT ARG_GROUP)
    set(ARG_GROUP "$<TARGET_FILE_BASE_NAME:${target}>")
  endif()
  set(_args offload "$<TARGET_FILE:${target}>" -o "$<TARGET_FILE:${target}>"
    --archive-dir "${ARG_ARCHIVE_DIR}" --group "${ARG_GROUP}")
  if(ARG_KERNEL_NAME)
    list(APPEND _args --kernel-name "${ARG_KERNEL_NAME}")
  endif()
  foreach(_p IN LISTS ARG_SEARCH_PATHS)
    list(APPEND _args --search-path "${_p}")
  endforeach()

  if(ARG_INSTALL_ARCHIVES_DESTINATION)
    include(GNUInstallDirs)
    if(NOT ARG_INSTALL_DESTINATION)
      if(_type STREQUAL "EXECUTABLE")
        set(ARG_INSTALL_DESTINATION "${CMAKE_INSTALL_BINDIR}")
      else()
        set(ARG_INSTALL_DESTINATION "${CMAKE_INSTALL_LIBDIR}")
      endif()
    endif()
    if(NOT ARG_SEARCH_PATHS)
      # The search path of the installed layout, when the archives are not
      # installed in `.kpack` beside the binary (as in the build tree).
      set(_root "/kpack-install-root")
      file(RELATIVE_PATH _rel "${_root}/${ARG_INSTALL_DESTINATION}" "${_root}/${ARG_INSTALL_ARCHIVES_DESTINATION}")
      if(NOT _rel STREQUAL ".kpack")
        if(_rel STREQUAL "")
          set(_rel ".")
        endif()
        list(APPEND _args --extra-search-path "${_rel}/${ARG_GROUP}_@GFXARCH@.kpack")
      endif()
    endif()
    install(CODE "
      file(GLOB _kpack_archives \"${ARG_ARCHIVE_DIR}/${ARG_GROUP}_*.kpack\")
      if(NOT _kpack_archives)
        message(FATAL_ERROR \"kpack_offload_target(${target}): no archives in ${ARG_ARCHIVE_DIR}: was ${target} built?\")
      endif()
      file(INSTALL \${_kpack_archives} DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${ARG_INSTALL_ARCHIVES_DESTINATION}\")
    ")
  endif()

  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND kpack::kpack ${_args}
    COMMENT "kpack: offloading the device code of ${target}"
    VERBATIM)
  # Building kpack from source (either way): make sure it exists before the
  # target's post-build step runs.
  if(TARGET kpack_build)
    add_dependencies(${target} kpack_build)
  endif()
endfunction()
