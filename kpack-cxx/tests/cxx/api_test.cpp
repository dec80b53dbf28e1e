// C++17 test program for kpack.hpp, driven by kpack-cxx/tests/cxx_api.rs:
//   api_test FIXTURES_DIR WORK_DIR META BINARY
// WORK_DIR holds bad_magic.kpack; META/BINARY are the loader scenario of
// that test (archives lib_gfx1100.kpack, lib_gfx1101.kpack).
#include <rocm_kpack/kpack.hpp>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

static int failures = 0;

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                                     \
    }                                                                                 \
  } while (0)

// Run `f`, which must throw kpack::Error with `code`; returns what().
template <typename F>
static std::string expect_error(F&& f, kpack_error_t code, int line) {
  try {
    f();
  } catch (const kpack::Error& e) {
    if (e.code() != code) {
      std::fprintf(stderr, "line %d: error %d (%s), expected %d\n", line, (int)e.code(),
                   e.what(), (int)code);
      ++failures;
    }
    return e.what();
  }
  std::fprintf(stderr, "line %d: no exception\n", line);
  ++failures;
  return "";
}
#define EXPECT_ERROR(expr, code) expect_error([&] { (void)(expr); }, code, __LINE__)

static std::vector<uint8_t> bytes(const std::string& text, uint8_t fill, size_t count) {
  std::vector<uint8_t> v(text.begin(), text.end());
  v.insert(v.end(), count, fill);
  return v;
}

// The loader tests' code object for (key, target): see common/mod.rs.
static std::vector<uint8_t> code(const std::string& key, const std::string& target) {
  std::string head = "co " + key.substr(key.rfind('#') + 1) + " " + target + " ";
  std::vector<uint8_t> v(head.begin(), head.end());
  for (size_t i = 0; i < 3000; ++i) v.push_back(static_cast<uint8_t>(key[i % key.size()]));
  return v;
}

static std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

int main(int argc, char** argv) {
  if (argc != 5) return 2;
  const std::string fixtures = argv[1], work = argv[2], binary = argv[4];
  const std::vector<uint8_t> meta = read_file(argv[3]);

  // kpack::Archive over the reference archives.
  {
    kpack::Archive a(fixtures + "/test_noop.kpack");
    CHECK((a.architectures() == std::vector<std::string>{"gfx900", "gfx906"}));
    CHECK((a.binaries() == std::vector<std::string>{"bin/testapp#0", "lib/libtest.so#0"}));
    CHECK(a.kernel("lib/libtest.so#0", "gfx900") == bytes("KERNEL1_GFX900_DATA", 0, 100));
    CHECK(a.kernel("lib/libtest.so#0", "gfx906") == bytes("KERNEL2_GFX906_DATA", 0, 200));
    CHECK(a.kernel("bin/testapp#0", "gfx900") == bytes("KERNEL3_APP_GFX900", 0xff, 150));
    std::string what = EXPECT_ERROR(a.kernel("bin/testapp#0", "gfx906"),
                                    KPACK_ERROR_KERNEL_NOT_FOUND);
    CHECK(what.find("bin/testapp#0") != std::string::npos);
    CHECK(what.find("KPACK_ERROR_KERNEL_NOT_FOUND") != std::string::npos);

    // Move-only handle.
    kpack::Archive b = std::move(a);
    CHECK(a.handle() == nullptr);
    CHECK(b.binaries().size() == 2);
    EXPECT_ERROR(a.architectures(), KPACK_ERROR_INVALID_ARGUMENT);
    kpack::Archive z = kpack::Archive::open(fixtures + "/test_zstd.kpack");
    CHECK((z.architectures() == std::vector<std::string>{"gfx1100", "gfx1101"}));
    std::vector<uint8_t> k = bytes("HIP_KERNEL_GFX1100_", 'A', 500);
    k.insert(k.end(), 500, 'B');
    CHECK(z.kernel("lib/libhip.so#0", "gfx1100") == k);
    CHECK(z.kernel("bin/hiptest#0", "gfx1100") == bytes("TEST_APP_KERNEL___", 0x42, 1000));
    b = std::move(z);
    CHECK(b.binaries() == (std::vector<std::string>{"bin/hiptest#0", "lib/libhip.so#0"}));
  }

  // Errors are kpack::Error, a std::runtime_error, carrying the code.
  {
    std::string what = EXPECT_ERROR(kpack::Archive(work + "/missing.kpack"),
                                    KPACK_ERROR_FILE_NOT_FOUND);
    CHECK(what.find("missing.kpack") != std::string::npos);
    EXPECT_ERROR(kpack::Archive(work + "/bad_magic.kpack"), KPACK_ERROR_INVALID_FORMAT);
    try {
      kpack::Archive bad(work + "/bad_magic.kpack");
      CHECK(false);
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).find("KPACK_ERROR_INVALID_FORMAT") != std::string::npos);
    }
    CHECK(std::string(kpack::error_name(KPACK_ERROR_ARCH_NOT_FOUND)) ==
          "KPACK_ERROR_ARCH_NOT_FOUND");
  }

  // enumerate_architectures, stopping early, and an exception from the
  // callback propagating after the archive is closed.
  {
    std::vector<std::string> seen;
    kpack::enumerate_architectures(fixtures + "/test_zstd.kpack", [&](const std::string& s) {
      seen.push_back(s);
      return true;
    });
    CHECK((seen == std::vector<std::string>{"gfx1100", "gfx1101"}));
    seen.clear();
    kpack::enumerate_architectures(fixtures + "/test_zstd.kpack", [&](const std::string& s) {
      seen.push_back(s);
      return false;
    });
    CHECK(seen.size() == 1);
    bool caught = false;
    try {
      kpack::enumerate_architectures(fixtures + "/test_zstd.kpack",
                                     [](const std::string&) -> bool {
                                       throw std::logic_error("from callback");
                                     });
    } catch (const std::logic_error& e) {
      caught = std::string(e.what()) == "from callback";
    }
    CHECK(caught);
    EXPECT_ERROR(kpack::enumerate_architectures(work + "/missing.kpack",
                                                [](const std::string&) { return true; }),
                 KPACK_ERROR_FILE_NOT_FOUND);
  }

  // kpack::Cache.
  {
    kpack::Cache cache;
    const std::vector<std::string> archs = {"amdgcn-amd-amdhsa--gfx1100", "gfx1101"};
    CHECK(cache.load_code_object(meta.data(), binary, 0, archs) == code("app#0", "gfx1100"));
    CHECK(cache.load_code_object(meta.data(), binary, 1, archs) == code("app#1", "gfx1101"));
    EXPECT_ERROR(cache.load_code_object(meta.data(), binary, 9, archs),
                 KPACK_ERROR_KERNEL_NOT_FOUND);
    EXPECT_ERROR(cache.load_code_object(meta.data(), binary, 2, archs),
                 KPACK_ERROR_DECOMPRESSION_FAILED);
    EXPECT_ERROR(cache.load_code_object(meta.data(), binary, 0, {}),
                 KPACK_ERROR_INVALID_ARGUMENT);
    EXPECT_ERROR(cache.load_code_object(meta.data(), binary, 0, {"gfx90a"}),
                 KPACK_ERROR_ARCH_NOT_FOUND);
    EXPECT_ERROR(cache.load_code_object(meta.data(), "/nowhere/bin", 0, archs),
                 KPACK_ERROR_ARCHIVE_NOT_FOUND);
    const uint8_t junk[] = {0xc1};
    EXPECT_ERROR(cache.load_code_object(junk, binary, 0, archs), KPACK_ERROR_INVALID_METADATA);

    // Shared between threads.
    std::vector<std::thread> threads;
    std::vector<int> errors(4, 0);
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 25; ++i) {
          uint32_t co = static_cast<uint32_t>((t + i) % 2);
          std::string key = "app#" + std::to_string(co);
          auto got = cache.load_code_object(meta.data(), binary, co, archs);
          if (got != code(key, co == 0 ? "gfx1100" : "gfx1101")) ++errors[t];
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int e : errors) CHECK(e == 0);

    kpack::Cache moved = std::move(cache);
    CHECK(cache.handle() == nullptr);
    CHECK(moved.load_code_object(meta.data(), binary, 0, archs) == code("app#0", "gfx1100"));
  }

  // discover_binary_path: this program's own data.
  {
    static const char marker[] = "kpack c++ marker";
    kpack::BinaryLocation loc = kpack::discover_binary_path(marker);
    char self[PATH_MAX];
    CHECK(realpath(argv[0], self) != nullptr);
    CHECK(loc.path == self);
    CHECK(loc.offset > 0);
    int local = 0;
    EXPECT_ERROR(kpack::discover_binary_path(&local), KPACK_ERROR_PATH_DISCOVERY_FAILED);
    EXPECT_ERROR(kpack::discover_binary_path(nullptr), KPACK_ERROR_INVALID_ARGUMENT);
  }

  if (failures != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("PASS\n");
  return 0;
}
