// SPDX-License-Identifier: MIT
// kpack runtime C++ API (C++17): kpack::Archive, kpack::Cache, kpack::Error.
//
// A thin face over the same Rust archive and loader as the C API, through a
// cxx bridge (kpack-cxx/src/bridge.rs; its generated header is
// <rocm_kpack/kpack_bridge.h>, cxx's is <rust/cxx.h>). Link
// librocm_kpack_cxx.a (the C++ glue) before librocm_kpack.a, or the CMake
// target kpack::runtime from a C++ target. No Rust toolchain is needed.
//
//   kpack::Archive a = kpack::Archive::open("blas_gfx942.kpack");
//   for (const kpack::KernelInfo& k : a.kernels()) { ... k.binary, k.target, k.size }
//   rust::Vec<std::uint8_t> code = a.kernel("lib/librocblas.so#0", "gfx942");
//
//   kpack::Cache cache;  // reads ROCM_KPACK_* now
//   kpack::Bytes co = cache.load_code_object(
//       metadata, "/opt/rocm/lib/librocblas.so", 0, {"gfx942:sramecc+:xnack-"});
//   kpack::CodeObject view = cache.load_code_object_view(
//       metadata, "/opt/rocm/lib/librocblas.so", 0, {"gfx942:sramecc+:xnack-"});
//   // view.data(), view.size(): no copy from an uncompressed archive
//
// Failures throw kpack::Error: code() is the kpack_error_t, what() the
// message the kpack command prints for the same problem (the file, and
// what is wrong with it).
#ifndef ROCM_KPACK_HPP
#define ROCM_KPACK_HPP

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kpack.h"
#include "rust/cxx.h"
#include "rocm_kpack/kpack_bridge.h"

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

// A failed kpack call: code() is the C API's error value, what() kpack's
// message (e.g. "a.kpack: TOC field `gfx_arches` is a int, expected array").
class Error : public std::runtime_error {
 public:
  Error(kpack_error_t code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  kpack_error_t code() const noexcept { return code_; }

 private:
  kpack_error_t code_;
};

// Code objects: a Rust-owned vector (data(), size(), begin(), end(),
// operator[]), handed over without a copy.
using Bytes = rust::Vec<std::uint8_t>;

// A code object as the C API hands it out: for an archive that stores it
// uncompressed (scheme none), its own private copy-on-write mapping of the
// archive's pages (no copy; mapped() is true), else a buffer the
// decompression wrote. Writable; a write is seen by no other load. It stays
// valid until destroyed, also after the Archive or Cache it came from is
// gone. Move-only; release() hands the pointer to C code, which must free it
// with kpack_free_code_object.
class CodeObject {
 public:
  CodeObject() noexcept = default;
  CodeObject(CodeObject&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        mapped_(std::exchange(other.mapped_, false)) {}
  CodeObject& operator=(CodeObject&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      mapped_ = std::exchange(other.mapped_, false);
    }
    return *this;
  }
  CodeObject(const CodeObject&) = delete;
  CodeObject& operator=(const CodeObject&) = delete;
  ~CodeObject() { reset(); }

  std::uint8_t* data() noexcept { return data_; }
  const std::uint8_t* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  std::uint8_t* begin() noexcept { return data_; }
  std::uint8_t* end() noexcept { return data_ + size_; }
  const std::uint8_t* begin() const noexcept { return data_; }
  const std::uint8_t* end() const noexcept { return data_ + size_; }
  std::uint8_t& operator[](std::size_t i) noexcept { return data_[i]; }
  const std::uint8_t& operator[](std::size_t i) const noexcept { return data_[i]; }
  // Whether it is a mapping of the archive (stored uncompressed, no copy).
  bool mapped() const noexcept { return mapped_; }
  // Give up ownership: the caller frees the pointer with
  // kpack_free_code_object.
  void* release() noexcept {
    size_ = 0;
    mapped_ = false;
    return std::exchange(data_, nullptr);
  }

 private:
  friend class Archive;
  friend class Cache;
  explicit CodeObject(const bridge::CodeObjectRef& r) noexcept
      : data_(reinterpret_cast<std::uint8_t*>(r.data)), size_(r.size), mapped_(r.mapped) {}
  void reset() noexcept {
    kpack_free_code_object(data_);
    data_ = nullptr;
    size_ = 0;
    mapped_ = false;
  }
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  bool mapped_ = false;
};

// One code object of an archive.
struct KernelInfo {
  std::string binary;   // the binary key, with its "#N"
  std::string target;   // the target ID ("gfx942", "gfx90a:xnack-")
  std::uint64_t size;   // uncompressed size in bytes
  std::uint32_t ordinal;  // index in the archive's blob
};

// What Archive::kernel_info reports of one code object (as
// kpack_get_kernel_info).
struct EntryInfo {
  std::uint64_t original_size;        // uncompressed: the size kernel() gives
  std::uint64_t stored_size;          // bytes it takes in the archive
  kpack_compression_scheme_t scheme;  // how the archive stores it
};

// Where an address lives: the mapped file and the address's offset in it.
struct BinaryLocation {
  std::string path;
  std::size_t offset = 0;
};

namespace detail {

// Call a bridge function `f(failure)`; a failure becomes kpack::Error.
template <typename F>
auto call(F&& f) -> decltype(f(std::declval<bridge::Failure&>())) {
  bridge::Failure failure;
  failure.code = KPACK_SUCCESS;
  auto result = f(failure);
  if (failure.code != KPACK_SUCCESS)
    throw Error(static_cast<kpack_error_t>(failure.code),
                std::string(failure.message.data(), failure.message.size()));
  return result;
}

inline rust::Slice<const std::uint8_t> bytes(const std::string& s) noexcept {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

inline std::string text(const rust::String& s) { return std::string(s.data(), s.size()); }

inline std::vector<std::string> texts(const rust::Vec<rust::String>& v) {
  std::vector<std::string> out;
  out.reserve(v.size());
  for (const rust::String& s : v) out.push_back(text(s));
  return out;
}

[[noreturn]] inline void moved_from(const char* what) {
  throw Error(KPACK_ERROR_INVALID_ARGUMENT, std::string(what) + ": used after being moved from");
}

}  // namespace detail

// An open .kpack archive (memory-mapped until destruction). Move-only;
// const member functions may be called from several threads at once.
class Archive {
 public:
  // Open the archive at `path`; throws Error (FILE_NOT_FOUND, IO_ERROR,
  // INVALID_FORMAT, UNSUPPORTED_VERSION, MSGPACK_PARSE_FAILED).
  explicit Archive(const std::string& path)
      : impl_(detail::call([&](bridge::Failure& f) {
          return bridge::open_archive(detail::bytes(path), f);
        })) {}
  static Archive open(const std::string& path) { return Archive(path); }

  Archive(Archive&& other) noexcept : impl_(std::exchange(other.impl_, nullptr)) {}
  Archive& operator=(Archive&& other) noexcept {
    if (this != &other) {
      reset();
      impl_ = std::exchange(other.impl_, nullptr);
    }
    return *this;
  }
  Archive(const Archive&) = delete;
  Archive& operator=(const Archive&) = delete;
  ~Archive() { reset(); }

  // The path it was opened with.
  std::string path() const {
    rust::Vec<std::uint8_t> p = get().path();
    return std::string(p.begin(), p.end());
  }

  // The target IDs the archive serves, in its gfx_arches order.
  std::vector<std::string> architectures() const { return detail::texts(get().architectures()); }

  // The binary keys ("lib/libfoo.so#0"), sorted bytewise.
  std::vector<std::string> binaries() const { return detail::texts(get().binaries()); }

  // Every code object: binary key, target, size, in TOC order (keys in file
  // order, then their targets).
  std::vector<KernelInfo> kernels() const {
    rust::Vec<bridge::KernelInfo> v = get().kernels();
    std::vector<KernelInfo> out;
    out.reserve(v.size());
    for (const bridge::KernelInfo& k : v)
      out.push_back({detail::text(k.binary), detail::text(k.target), k.size, k.ordinal});
    return out;
  }

  // The size of the code object of `binary` (exact key with "#N") for
  // `arch` (exact target ID); KERNEL_NOT_FOUND, DECOMPRESSION_FAILED.
  std::size_t kernel_size(const std::string& binary, const std::string& arch) const {
    return detail::call([&](bridge::Failure& c) {
      return get().kernel_size(detail::bytes(binary), detail::bytes(arch), c);
    });
  }

  // The sizes and scheme of that code object, from the TOC and without
  // decompressing (kpack_get_kernel_info); KERNEL_NOT_FOUND,
  // DECOMPRESSION_FAILED (the TOC and the frame disagree).
  EntryInfo kernel_info(const std::string& binary, const std::string& arch) const {
    bridge::EntryInfo i = detail::call([&](bridge::Failure& c) {
      return get().kernel_info(detail::bytes(binary), detail::bytes(arch), c);
    });
    return {i.original_size, i.stored_size, static_cast<kpack_compression_scheme_t>(i.scheme)};
  }

  // Decompress that code object straight into `out` (at least
  // kernel_size() bytes: else INVALID_ARGUMENT); returns its size.
  std::size_t read_kernel(const std::string& binary, const std::string& arch, std::uint8_t* out,
                          std::size_t capacity) const {
    return detail::call([&](bridge::Failure& c) {
      return get().read_kernel(detail::bytes(binary), detail::bytes(arch),
                               rust::Slice<std::uint8_t>(out, capacity), c);
    });
  }

  // That code object, decompressed into a new buffer (no further copy).
  Bytes kernel(const std::string& binary, const std::string& arch) const {
    return detail::call([&](bridge::Failure& c) {
      return get().kernel(detail::bytes(binary), detail::bytes(arch), c);
    });
  }

  // That code object without a copy when the archive stores it
  // uncompressed (a mapping of the archive), else decompressed; it outlives
  // this Archive. Errors as kernel().
  CodeObject kernel_view(const std::string& binary, const std::string& arch) const {
    return CodeObject(detail::call([&](bridge::Failure& c) {
      return get().kernel_view(detail::bytes(binary), detail::bytes(arch), c);
    }));
  }

  // The same archive as a C handle, for the C API (owned by this object:
  // do not kpack_close it); NULL after a move.
  kpack_archive_t handle() const noexcept { return reinterpret_cast<kpack_archive_t>(impl_); }

 private:
  const bridge::KpackArchive& get() const {
    if (impl_ == nullptr) detail::moved_from("kpack::Archive");
    return *impl_;
  }
  void reset() noexcept {
    kpack_close(handle());
    impl_ = nullptr;
  }
  bridge::KpackArchive* impl_;
};

// A loader cache: reads ROCM_KPACK_* once at construction; opened archives
// stay open until destruction. Move-only; load_code_object may be called
// from several threads at once.
class Cache {
 public:
  Cache() : impl_(detail::call([](bridge::Failure& c) { return bridge::new_cache(c); })) {}
  Cache(Cache&& other) noexcept : impl_(std::exchange(other.impl_, nullptr)) {}
  Cache& operator=(Cache&& other) noexcept {
    if (this != &other) {
      reset();
      impl_ = std::exchange(other.impl_, nullptr);
    }
    return *this;
  }
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;
  ~Cache() { reset(); }

  // The code object `kernel_name#co_index` of the binary at `binary_path`
  // whose HIPK metadata is `hipk_metadata`, for the first of `archs` (in
  // priority order) that an archive serves (see kpack_load_code_object).
  Bytes load_code_object(const void* hipk_metadata, const std::string& binary_path,
                         std::uint32_t co_index, const std::vector<std::string>& archs) const {
    std::string names;
    std::vector<std::size_t> lens;
    lens.reserve(archs.size());
    for (const std::string& a : archs) {
      names += a;
      lens.push_back(a.size());
    }
    const bridge::KpackCache& cache = get();
    return detail::call([&](bridge::Failure& c) {
      return cache.load_code_object(static_cast<const std::uint8_t*>(hipk_metadata),
                                    detail::bytes(binary_path), co_index, detail::bytes(names),
                                    rust::Slice<const std::size_t>(lens.data(), lens.size()), c);
    });
  }

  // load_code_object() handed out as kpack_load_code_object does: without
  // a copy when the archive stores the code object uncompressed (a mapping
  // of the archive), else in a buffer recycled from earlier loads of this
  // cache. It outlives this Cache. Errors as load_code_object().
  CodeObject load_code_object_view(const void* hipk_metadata, const std::string& binary_path,
                                   std::uint32_t co_index,
                                   const std::vector<std::string>& archs) const {
    std::string names;
    std::vector<std::size_t> lens;
    lens.reserve(archs.size());
    for (const std::string& a : archs) {
      names += a;
      lens.push_back(a.size());
    }
    const bridge::KpackCache& cache = get();
    return CodeObject(detail::call([&](bridge::Failure& c) {
      return cache.load_code_object_view(
          static_cast<const std::uint8_t*>(hipk_metadata), detail::bytes(binary_path), co_index,
          detail::bytes(names), rust::Slice<const std::size_t>(lens.data(), lens.size()), c);
    }));
  }

  // The same cache as a C handle (owned by this object); NULL after a move.
  kpack_cache_t handle() const noexcept { return reinterpret_cast<kpack_cache_t>(impl_); }

 private:
  const bridge::KpackCache& get() const {
    if (impl_ == nullptr) detail::moved_from("kpack::Cache");
    return *impl_;
  }
  void reset() noexcept {
    kpack_cache_destroy(handle());
    impl_ = nullptr;
  }
  bridge::KpackCache* impl_;
};

// The file mapped at `address` (see kpack_discover_binary_path):
// PATH_DISCOVERY_FAILED, NOT_IMPLEMENTED, INVALID_ARGUMENT for NULL.
inline BinaryLocation discover_binary_path(const void* address) {
  bridge::MappedFile f = detail::call([&](bridge::Failure& c) {
    return bridge::discover_binary_path(reinterpret_cast<std::size_t>(address), c);
  });
  return BinaryLocation{std::string(f.path.begin(), f.path.end()),
                        static_cast<std::size_t>(f.offset)};
}

// Call `f(arch)` for each architecture of the archive at `path` until it
// returns false. An exception thrown by `f` propagates (the archive is
// closed first).
template <typename F>
void enumerate_architectures(const std::string& path, F&& f) {
  std::vector<std::string> archs = Archive(path).architectures();
  for (const std::string& a : archs) {
    if (!static_cast<bool>(f(a))) break;
  }
}

}  // namespace kpack

#endif  // ROCM_KPACK_HPP
