// kpack::Archive::kernel_info against kpack::Archive::kernel, driven by
// tests/tests/kernel_info.rs:
//
//   kernel_info_cxx ARCHIVE...
//
// For every code object of each archive (Archive::kernels()): kernel_info's
// original_size is the size of the bytes kernel() and kernel_view() give,
// stored_size and scheme as kpack.h says, and the same as the C API's
// kpack_get_kernel_info on the archive's handle. Unknown entries throw
// kpack::Error with KPACK_ERROR_KERNEL_NOT_FOUND. Prints one line per code
// object, "ENTRY <key> <arch> <original_size> <stored_size> <scheme>", then
// "PASS N"; exits 1 on any failed check.
#include <rocm_kpack/kpack.hpp>

#include <cstdio>
#include <string>

static int failures = 0;

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                                     \
    }                                                                                 \
  } while (0)

static kpack_error_t info_error(const kpack::Archive& a, const std::string& key,
                                const std::string& arch) {
  try {
    a.kernel_info(key, arch);
  } catch (const kpack::Error& e) {
    CHECK(std::string(e.what()).find(a.path()) != std::string::npos);
    return e.code();
  }
  return KPACK_SUCCESS;
}

static std::size_t check_archive(const std::string& path) {
  kpack::Archive a = kpack::Archive::open(path);
  std::size_t n = 0;
  for (const kpack::KernelInfo& k : a.kernels()) {
    kpack::EntryInfo info = a.kernel_info(k.binary, k.target);
    rust::Vec<std::uint8_t> bytes = a.kernel(k.binary, k.target);
    kpack::CodeObject view = a.kernel_view(k.binary, k.target);
    CHECK(info.original_size == bytes.size());
    CHECK(info.original_size == view.size());
    CHECK(info.original_size == k.size);
    if (info.scheme == KPACK_COMPRESSION_NOOP) CHECK(info.stored_size == info.original_size);
    if (info.scheme == KPACK_COMPRESSION_ZSTD_PER_KERNEL) CHECK(info.stored_size > 4 + 6);
    CHECK(view.mapped() == (info.scheme == KPACK_COMPRESSION_NOOP));
    // The same answer as the C API on the same handle.
    std::size_t original = 0, stored = 0;
    kpack_compression_scheme_t scheme = KPACK_COMPRESSION_NOOP;
    CHECK(kpack_get_kernel_info(a.handle(), k.binary.c_str(), k.target.c_str(), &original,
                                &stored, &scheme) == KPACK_SUCCESS);
    CHECK(original == info.original_size && stored == info.stored_size && scheme == info.scheme);
    std::printf("ENTRY %s %s %llu %llu %d\n", k.binary.c_str(), k.target.c_str(),
                static_cast<unsigned long long>(info.original_size),
                static_cast<unsigned long long>(info.stored_size), static_cast<int>(info.scheme));
    if (n == 0) {
      CHECK(info_error(a, "no/such/binary.so#0", k.target) == KPACK_ERROR_KERNEL_NOT_FOUND);
      CHECK(info_error(a, k.binary, "gfx0") == KPACK_ERROR_KERNEL_NOT_FOUND);
      CHECK(info_error(a, std::string("\xff\xfe"), k.target) == KPACK_ERROR_KERNEL_NOT_FOUND);
    }
    n++;
  }
  CHECK(n > 0);
  // A moved-from archive is refused, not dereferenced.
  kpack::Archive b = std::move(a);
  try {
    a.kernel_info("x#0", "gfx942");  // NOLINT(bugprone-use-after-move)
    CHECK(false);
  } catch (const kpack::Error& e) {
    CHECK(e.code() == KPACK_ERROR_INVALID_ARGUMENT);
  }
  return n;
}

int main(int argc, char** argv) {
  std::size_t total = 0;
  for (int i = 1; i < argc; i++) {
    try {
      total += check_archive(argv[i]);
    } catch (const kpack::Error& e) {
      std::fprintf(stderr, "%s: %s\n", argv[i], e.what());
      failures++;
    }
  }
  CHECK(argc > 1);
  if (failures) {
    std::fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  std::printf("PASS %zu\n", total);
  return 0;
}
