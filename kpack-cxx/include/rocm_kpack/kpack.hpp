// SPDX-License-Identifier: MIT
// kpack runtime C++ API: a header-only C++17 layer over the C API of
// <rocm_kpack/kpack.h>. Link librocm_kpack as for the C API; nothing else
// (no generated headers, no Rust toolchain) is needed to build against it.
//
//   kpack::Archive a("blas_gfx942.kpack");
//   for (const std::string& key : a.binaries()) { ... }
//   std::vector<uint8_t> code = a.kernel("lib/librocblas.so#0", "gfx942");
//
//   kpack::Cache cache;  // reads ROCM_KPACK_* now
//   std::vector<uint8_t> co = cache.load_code_object(
//       metadata, "/opt/rocm/lib/librocblas.so", 0, {"gfx942:sramecc+:xnack-"});
//
// Failures throw kpack::Error, which carries the kpack_error_t.
#ifndef ROCM_KPACK_HPP
#define ROCM_KPACK_HPP

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kpack.h"

namespace kpack {

// The name of an error code ("KPACK_ERROR_KERNEL_NOT_FOUND").
inline const char* error_name(kpack_error_t code) noexcept {
  switch (code) {
    case KPACK_SUCCESS: return "KPACK_SUCCESS";
    case KPACK_ERROR_INVALID_ARGUMENT: return "KPACK_ERROR_INVALID_ARGUMENT";
    case KPACK_ERROR_FILE_NOT_FOUND: return "KPACK_ERROR_FILE_NOT_FOUND";
    case KPACK_ERROR_INVALID_FORMAT: return "KPACK_ERROR_INVALID_FORMAT";
    case KPACK_ERROR_UNSUPPORTED_VERSION: return "KPACK_ERROR_UNSUPPORTED_VERSION";
    case KPACK_ERROR_KERNEL_NOT_FOUND: return "KPACK_ERROR_KERNEL_NOT_FOUND";
    case KPACK_ERROR_DECOMPRESSION_FAILED: return "KPACK_ERROR_DECOMPRESSION_FAILED";
    case KPACK_ERROR_OUT_OF_MEMORY: return "KPACK_ERROR_OUT_OF_MEMORY";
    case KPACK_ERROR_NOT_IMPLEMENTED: return "KPACK_ERROR_NOT_IMPLEMENTED";
    case KPACK_ERROR_IO_ERROR: return "KPACK_ERROR_IO_ERROR";
    case KPACK_ERROR_MSGPACK_PARSE_FAILED: return "KPACK_ERROR_MSGPACK_PARSE_FAILED";
    case KPACK_ERROR_PATH_DISCOVERY_FAILED: return "KPACK_ERROR_PATH_DISCOVERY_FAILED";
    case KPACK_ERROR_INVALID_METADATA: return "KPACK_ERROR_INVALID_METADATA";
    case KPACK_ERROR_ARCHIVE_NOT_FOUND: return "KPACK_ERROR_ARCHIVE_NOT_FOUND";
    case KPACK_ERROR_ARCH_NOT_FOUND: return "KPACK_ERROR_ARCH_NOT_FOUND";
  }
  return "KPACK_ERROR_(unknown)";
}

// A failed kpack call: code() is the C API's error, what() says which call
// on what and the error's name.
class Error : public std::runtime_error {
 public:
  Error(kpack_error_t code, const std::string& context)
      : std::runtime_error(context + ": " + error_name(code)), code_(code) {}
  kpack_error_t code() const noexcept { return code_; }

 private:
  kpack_error_t code_;
};

namespace detail {

inline void check(kpack_error_t code, const std::string& context) {
  if (code != KPACK_SUCCESS) throw Error(code, context);
}

struct FreeDeleter {
  void operator()(void* p) const noexcept { std::free(p); }
};

// Take ownership of a malloc'ed buffer and copy it into a vector.
inline std::vector<uint8_t> take_buffer(void* data, size_t size) {
  std::unique_ptr<void, FreeDeleter> owned(data);
  const uint8_t* bytes = static_cast<const uint8_t*>(owned.get());
  return std::vector<uint8_t>(bytes, bytes + size);
}

inline std::string quoted(const std::string& s) { return "\"" + s + "\""; }

}  // namespace detail

// An open .kpack archive. Move-only; const member functions may be called
// from several threads at once.
class Archive {
 public:
  // Open the archive at `path`; throws Error.
  explicit Archive(const std::string& path) {
    detail::check(kpack_open(path.c_str(), &handle_),
                  "kpack_open(" + detail::quoted(path) + ")");
  }
  static Archive open(const std::string& path) { return Archive(path); }

  Archive(Archive&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Archive& operator=(Archive&& other) noexcept {
    if (this != &other) {
      kpack_close(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Archive(const Archive&) = delete;
  Archive& operator=(const Archive&) = delete;
  ~Archive() { kpack_close(handle_); }

  // The target IDs the archive serves, in its gfx_arches order.
  std::vector<std::string> architectures() const {
    size_t n = 0;
    detail::check(kpack_get_architecture_count(handle_, &n), "kpack_get_architecture_count");
    std::vector<std::string> out;
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const char* s = nullptr;
      detail::check(kpack_get_architecture(handle_, i, &s), "kpack_get_architecture");
      out.emplace_back(s);
    }
    return out;
  }

  // The binary keys ("lib/libfoo.so#0"), sorted bytewise.
  std::vector<std::string> binaries() const {
    size_t n = 0;
    detail::check(kpack_get_binary_count(handle_, &n), "kpack_get_binary_count");
    std::vector<std::string> out;
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const char* s = nullptr;
      detail::check(kpack_get_binary(handle_, i, &s), "kpack_get_binary");
      out.emplace_back(s);
    }
    return out;
  }

  // The code object of `binary` (exact key with "#N") for `arch`.
  std::vector<uint8_t> kernel(const std::string& binary, const std::string& arch) const {
    void* data = nullptr;
    size_t size = 0;
    detail::check(kpack_get_kernel(handle_, binary.c_str(), arch.c_str(), &data, &size),
                  "kpack_get_kernel(" + detail::quoted(binary) + ", " +
                      detail::quoted(arch) + ")");
    return detail::take_buffer(data, size);
  }

  // The C handle (owned by this object).
  kpack_archive_t handle() const noexcept { return handle_; }

 private:
  kpack_archive_t handle_ = nullptr;
};

// A loader cache: reads ROCM_KPACK_* once at construction; opened archives
// stay open until destruction. Move-only; load_code_object may be called
// from several threads at once.
class Cache {
 public:
  Cache() { detail::check(kpack_cache_create(&handle_), "kpack_cache_create"); }
  Cache(Cache&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Cache& operator=(Cache&& other) noexcept {
    if (this != &other) {
      kpack_cache_destroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;
  ~Cache() { kpack_cache_destroy(handle_); }

  // The code object `kernel_name#co_index` for the first of `archs` that
  // an archive serves (see kpack_load_code_object).
  std::vector<uint8_t> load_code_object(const void* hipk_metadata,
                                        const std::string& binary_path, uint32_t co_index,
                                        const std::vector<std::string>& archs) const {
    std::vector<const char*> list;
    list.reserve(archs.size());
    for (const std::string& a : archs) list.push_back(a.c_str());
    void* data = nullptr;
    size_t size = 0;
    detail::check(kpack_load_code_object(handle_, hipk_metadata, binary_path.c_str(), co_index,
                                         list.data(), list.size(), &data, &size),
                  "kpack_load_code_object(" + detail::quoted(binary_path) + ", " +
                      std::to_string(co_index) + ")");
    return detail::take_buffer(data, size);
  }

  // The C handle (owned by this object).
  kpack_cache_t handle() const noexcept { return handle_; }

 private:
  kpack_cache_t handle_ = nullptr;
};

// Where an address lives: the mapped file and the address's offset in it.
struct BinaryLocation {
  std::string path;
  size_t offset = 0;
};

// The file mapped at `address` (see kpack_discover_binary_path).
inline BinaryLocation discover_binary_path(const void* address) {
  // Paths longer than the buffer give INVALID_ARGUMENT: retry bigger.
  for (size_t size = 4096; size <= (size_t{1} << 20); size *= 16) {
    std::vector<char> buf(size);
    size_t offset = 0;
    kpack_error_t e = kpack_discover_binary_path(address, buf.data(), buf.size(), &offset);
    if (e == KPACK_SUCCESS) return BinaryLocation{std::string(buf.data()), offset};
    if (e != KPACK_ERROR_INVALID_ARGUMENT || address == nullptr)
      throw Error(e, "kpack_discover_binary_path");
  }
  throw Error(KPACK_ERROR_INVALID_ARGUMENT, "kpack_discover_binary_path: path too long");
}

// The architectures of the archive at `path`, read with
// kpack_enumerate_architectures; `f(arch)` returns false to stop. An
// exception thrown by `f` is rethrown after the archive is closed.
template <typename F>
void enumerate_architectures(const std::string& path, F&& f) {
  struct State {
    F* f;
    std::exception_ptr error;
  } state{&f, nullptr};
  auto trampoline = [](const char* arch, void* user) -> bool {
    State* s = static_cast<State*>(user);
    try {
      return static_cast<bool>((*s->f)(std::string(arch)));
    } catch (...) {
      s->error = std::current_exception();
      return false;
    }
  };
  kpack_error_t e = kpack_enumerate_architectures(path.c_str(), trampoline, &state);
  if (state.error) std::rethrow_exception(state.error);
  detail::check(e, "kpack_enumerate_architectures(" + detail::quoted(path) + ")");
}

}  // namespace kpack

#endif  // ROCM_KPACK_HPP
