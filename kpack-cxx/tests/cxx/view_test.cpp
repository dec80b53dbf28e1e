// SPDX-License-Identifier: MIT
// kpack::CodeObject, the C++ API's zero-copy path: Archive::kernel_view and
// Cache::load_code_object_view. Driven by tests/cxx_view.rs over the
// scenario of tests/common/zero_copy.rs:
//
//   view_test DIR N
//
// Prints PASS and exits 0 when every check holds.
#include <rocm_kpack/kpack.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace {

int failures = 0;

#define CHECK(cond)                                                    \
  do {                                                                 \
    if (!(cond)) {                                                     \
      ++failures;                                                      \
      std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                  \
  } while (0)

std::vector<std::uint8_t> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(f), {});
}

bool same(const kpack::CodeObject& c, const std::vector<std::uint8_t>& want) {
  return c.size() == want.size() &&
         (want.empty() || std::memcmp(c.data(), want.data(), want.size()) == 0);
}

std::string key(int i) { return "app#" + std::to_string(i); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const std::string dir = argv[1];
  const int n = std::atoi(argv[2]);
  const std::string none = dir + "/a_gfx1100.kpack";
  const std::string zstd = dir + "/a_gfx1101.kpack";
  std::vector<std::uint8_t> meta = slurp(dir + "/meta");
  const std::string binary = dir + "/app";

  std::vector<kpack::CodeObject> held;
  {
    kpack::Archive a(none);
    kpack::Cache cache;
    for (int i = 0; i < n; ++i) {
      std::vector<std::uint8_t> want = slurp(dir + "/gfx1100_" + std::to_string(i) + ".bin");
      kpack::CodeObject v = a.kernel_view(key(i), "gfx1100");
      CHECK(same(v, want));
      CHECK(v.mapped() == !want.empty());
      if (!want.empty()) {
        // A mapping of the archive file itself.
        kpack::BinaryLocation where = kpack::discover_binary_path(v.data());
        CHECK(where.path == none);
      }
      kpack::CodeObject l = cache.load_code_object_view(meta.data(), binary,
                                                        static_cast<std::uint32_t>(i), {"gfx1100"});
      CHECK(same(l, want));
      CHECK(l.mapped() == !want.empty());
      CHECK(want.empty() || l.data() != v.data());
      // Writable, and private to this view.
      if (!want.empty()) {
        l[0] ^= 0xff;
        CHECK(v[0] == want[0]);
        l[0] ^= 0xff;
      }
      held.push_back(std::move(v));
      held.push_back(std::move(l));
    }
    // Compressed: decompressed into a buffer, not a mapping.
    kpack::Archive z(zstd);
    for (int i = 0; i < n; ++i) {
      std::vector<std::uint8_t> want = slurp(dir + "/gfx1101_" + std::to_string(i) + ".bin");
      kpack::CodeObject v = z.kernel_view(key(i), "gfx1101");
      CHECK(same(v, want) && !v.mapped());
      kpack::CodeObject l = cache.load_code_object_view(meta.data(), binary,
                                                        static_cast<std::uint32_t>(i), {"gfx1101"});
      CHECK(same(l, want) && !l.mapped());
      held.push_back(std::move(v));
      held.push_back(std::move(l));
    }
    // Errors as kernel() and load_code_object().
    try {
      (void)a.kernel_view("app#99", "gfx1100");
      CHECK(false);
    } catch (const kpack::Error& e) {
      CHECK(e.code() == KPACK_ERROR_KERNEL_NOT_FOUND);
      CHECK(std::string(e.what()).find("app#99") != std::string::npos);
    }
    try {
      (void)cache.load_code_object_view(meta.data(), binary, 99, {"gfx1100"});
      CHECK(false);
    } catch (const kpack::Error& e) {
      CHECK(e.code() == KPACK_ERROR_KERNEL_NOT_FOUND);
    }
  }
  // The Archive and Cache are gone; the views are not.
  for (int i = 0; i < n; ++i) {
    std::vector<std::uint8_t> want = slurp(dir + "/gfx1100_" + std::to_string(i) + ".bin");
    CHECK(same(held[2 * i], want));
    CHECK(same(held[2 * i + 1], want));
  }
  // Moves hand the code object over; release() hands it to C.
  kpack::CodeObject moved = std::move(held[0]);
  CHECK(held[0].data() == nullptr && held[0].size() == 0 && !held[0].mapped());
  CHECK(moved.mapped());
  held[0] = std::move(moved);
  std::size_t size = held[0].size();
  void* raw = held[0].release();
  CHECK(raw != nullptr && size > 0 && held[0].data() == nullptr);
  kpack_free_code_object(raw);
  held.clear();
  kpack::CodeObject empty;
  CHECK(empty.empty() && empty.data() == nullptr);

  if (failures > 0) {
    std::printf("FAILED (%d)\n", failures);
    return 1;
  }
  std::printf("PASS\n");
  return 0;
}
