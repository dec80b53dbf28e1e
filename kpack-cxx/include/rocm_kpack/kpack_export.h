/* SPDX-License-Identifier: MIT */
/* kpack runtime: symbol visibility of the public API (KPACK_API). */
#ifndef ROCM_KPACK_EXPORT_H
#define ROCM_KPACK_EXPORT_H

/*
 * KPACK_API marks the functions of the public C API.
 *
 * ELF (GCC, Clang): default visibility, so the functions are exported from
 * librocm_kpack.so, and from a shared library that links librocm_kpack.a.
 * Nothing else of the library is exported: librocm_kpack.so exports only
 * kpack_* functions, and the installed librocm_kpack.a is prelinked with
 * every other symbol made local.
 *
 * Windows: dllimport when using the DLL, dllexport when building it
 * (ROCM_KPACK_EXPORTS), nothing for the static library (define
 * ROCM_KPACK_STATIC).
 */
#if defined(_WIN32) || defined(__CYGWIN__)
#  if defined(ROCM_KPACK_STATIC)
#    define KPACK_API
#  elif defined(ROCM_KPACK_EXPORTS)
#    define KPACK_API __declspec(dllexport)
#  else
#    define KPACK_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define KPACK_API __attribute__((visibility("default")))
#else
#  define KPACK_API
#endif

#endif /* ROCM_KPACK_EXPORT_H */
