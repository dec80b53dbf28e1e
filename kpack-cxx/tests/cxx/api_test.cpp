// C++17 test program for the C++ API (kpack.hpp over the cxx bridge),
// driven by kpack-cxx/tests/cxx_api.rs and, through CMake, by
// integration/cmake-consumer (both CMake paths):
//
//   api_test all FIXTURES_DIR WORK_DIR META BINARY
//   api_test oom HUGE_ARCHIVE META BINARY        (under ulimit -v)
//
// WORK_DIR holds the damaged archives of cxx_api.rs (bad_magic.kpack,
// bad_version.kpack, bad_toc.kpack, wrong_type.kpack, corrupt_zstd.kpack,
// a_directory.kpack); META/BINARY are the loader scenario (archives
// lib_gfx1100.kpack, lib_gfx1101.kpack).
#include <rocm_kpack/kpack.hpp>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

static_assert(std::is_base_of<std::exception, kpack::Error>::value, "");
static_assert(std::is_same<decltype(std::declval<const kpack::Archive&>().kernel("", "")),
                           kpack::Bytes>::value,
              "");

static int failures = 0;

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                                     \
    }                                                                                 \
  } while (0)

// Run `f`, which must throw kpack::Error with `code` and a what() that
// contains each of `parts`; returns what().
template <typename F>
static std::string expect_error(F&& f, kpack_error_t code, std::vector<std::string> parts,
                                int line) {
  try {
    f();
  } catch (const kpack::Error& e) {
    std::string what = e.what();
    if (e.code() != code) {
      std::fprintf(stderr, "line %d: error %s (%s), expected %s\n", line,
                   kpack::error_name(e.code()), e.what(), kpack::error_name(code));
      ++failures;
    }
    for (const std::string& p : parts) {
      if (what.find(p) == std::string::npos) {
        std::fprintf(stderr, "line %d: what() \"%s\" lacks \"%s\"\n", line, e.what(), p.c_str());
        ++failures;
      }
    }
    return what;
  }
  std::fprintf(stderr, "line %d: no exception\n", line);
  ++failures;
  return "";
}
#define EXPECT_ERROR(expr, code, ...) \
  expect_error([&] { (void)(expr); }, code, {__VA_ARGS__}, __LINE__)

static std::vector<uint8_t> bytes(const std::string& text, uint8_t fill, size_t count) {
  std::vector<uint8_t> v(text.begin(), text.end());
  v.insert(v.end(), count, fill);
  return v;
}

static std::vector<uint8_t> vec(const kpack::Bytes& b) { return {b.begin(), b.end()}; }

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

static void archive_methods(const std::string& fixtures) {
  const std::string noop = fixtures + "/test_noop.kpack";
  kpack::Archive a(noop);
  CHECK(a.path() == noop);
  CHECK((a.architectures() == std::vector<std::string>{"gfx900", "gfx906"}));
  CHECK((a.binaries() == std::vector<std::string>{"bin/testapp#0", "lib/libtest.so#0"}));
  std::vector<kpack::KernelInfo> ks = a.kernels();
  CHECK(ks.size() == 3);
  size_t total = 0;
  for (const kpack::KernelInfo& k : ks) {
    CHECK(k.size == a.kernel_size(k.binary, k.target));
    CHECK(a.kernel(k.binary, k.target).size() == k.size);
    total += k.size;
  }
  CHECK(total == 100 + 19 + 200 + 19 + 150 + 18);
  CHECK(vec(a.kernel("lib/libtest.so#0", "gfx900")) == bytes("KERNEL1_GFX900_DATA", 0, 100));
  CHECK(vec(a.kernel("lib/libtest.so#0", "gfx906")) == bytes("KERNEL2_GFX906_DATA", 0, 200));
  CHECK(vec(a.kernel("bin/testapp#0", "gfx900")) == bytes("KERNEL3_APP_GFX900", 0xff, 150));
  EXPECT_ERROR(a.kernel("bin/testapp#0", "gfx906"), KPACK_ERROR_KERNEL_NOT_FOUND, noop,
               "no kernel bin/testapp#0 @ gfx906");
  EXPECT_ERROR(a.kernel_size("nope#0", "gfx900"), KPACK_ERROR_KERNEL_NOT_FOUND, noop, "nope#0");
  EXPECT_ERROR(a.kernel(std::string("\xff#0"), "gfx900"), KPACK_ERROR_KERNEL_NOT_FOUND, noop);

  // Into the caller's buffer: exactly, larger, too small.
  std::vector<uint8_t> buf(400, 0xee);
  CHECK(a.read_kernel("lib/libtest.so#0", "gfx906", buf.data(), buf.size()) == 219);
  CHECK(std::vector<uint8_t>(buf.begin(), buf.begin() + 219) ==
        bytes("KERNEL2_GFX906_DATA", 0, 200));
  CHECK(buf[219] == 0xee);
  EXPECT_ERROR(a.read_kernel("lib/libtest.so#0", "gfx906", buf.data(), 218),
               KPACK_ERROR_INVALID_ARGUMENT, noop, "219 bytes", "holds 218");

  // The C handle is the same archive.
  size_t n = 0;
  CHECK(kpack_get_binary_count(a.handle(), &n) == KPACK_SUCCESS && n == 2);

  // Move-only.
  kpack::Archive b = std::move(a);
  CHECK(a.handle() == nullptr);
  CHECK(b.binaries().size() == 2);
  EXPECT_ERROR(a.architectures(), KPACK_ERROR_INVALID_ARGUMENT, "kpack::Archive", "moved");
  kpack::Archive z = kpack::Archive::open(fixtures + "/test_zstd.kpack");
  CHECK((z.architectures() == std::vector<std::string>{"gfx1100", "gfx1101"}));
  std::vector<uint8_t> k = bytes("HIP_KERNEL_GFX1100_", 'A', 500);
  k.insert(k.end(), 500, 'B');
  CHECK(vec(z.kernel("lib/libhip.so#0", "gfx1100")) == k);
  CHECK(vec(z.kernel("bin/hiptest#0", "gfx1100")) == bytes("TEST_APP_KERNEL___", 0x42, 1000));
  b = std::move(z);
  CHECK(b.binaries() == (std::vector<std::string>{"bin/hiptest#0", "lib/libhip.so#0"}));
}

// Every error of opening, with the message kpack prints: the file, then
// what is wrong with it.
static void open_errors(const std::string& work) {
  auto at = [&](const char* name) { return work + "/" + name; };
  EXPECT_ERROR(kpack::Archive(at("missing.kpack")), KPACK_ERROR_FILE_NOT_FOUND,
               at("missing.kpack"), "No such file");
  EXPECT_ERROR(kpack::Archive(at("bad_magic.kpack")), KPACK_ERROR_INVALID_FORMAT,
               at("bad_magic.kpack"), "not a kpack archive", "KPAX");
  EXPECT_ERROR(kpack::Archive(at("bad_version.kpack")), KPACK_ERROR_UNSUPPORTED_VERSION,
               at("bad_version.kpack"), "version 2");
  EXPECT_ERROR(kpack::Archive(at("bad_toc.kpack")), KPACK_ERROR_MSGPACK_PARSE_FAILED,
               at("bad_toc.kpack"), "not valid MessagePack");
  EXPECT_ERROR(kpack::Archive(at("wrong_type.kpack")), KPACK_ERROR_INVALID_FORMAT,
               at("wrong_type.kpack"), "TOC field `gfx_arches`");
  EXPECT_ERROR(kpack::Archive(at("a_directory.kpack")), KPACK_ERROR_IO_ERROR,
               at("a_directory.kpack"));
  // A std::runtime_error like before.
  try {
    kpack::Archive bad(at("bad_magic.kpack"));
    CHECK(false);
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("bad_magic.kpack") != std::string::npos);
  }
  kpack::Archive c(at("corrupt_zstd.kpack"));
  EXPECT_ERROR(c.kernel("lib/libhip.so#0", "gfx1100"), KPACK_ERROR_DECOMPRESSION_FAILED,
               at("corrupt_zstd.kpack"), "lib/libhip.so#0");
  std::vector<uint8_t> buf(2000);
  EXPECT_ERROR(c.read_kernel("lib/libhip.so#0", "gfx1100", buf.data(), buf.size()),
               KPACK_ERROR_DECOMPRESSION_FAILED, at("corrupt_zstd.kpack"));
  CHECK(c.kernel("bin/hiptest#0", "gfx1100").size() == 1018);
  CHECK(std::string(kpack::error_name(KPACK_ERROR_ARCH_NOT_FOUND)) ==
        "KPACK_ERROR_ARCH_NOT_FOUND");
}

static void enumerate(const std::string& fixtures, const std::string& work) {
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
               KPACK_ERROR_FILE_NOT_FOUND, "missing.kpack");
}

static void cache(const std::vector<uint8_t>& meta, const std::string& binary) {
  kpack::Cache cache;
  const std::vector<std::string> archs = {"amdgcn-amd-amdhsa--gfx1100", "gfx1101"};
  CHECK(vec(cache.load_code_object(meta.data(), binary, 0, archs)) == code("app#0", "gfx1100"));
  CHECK(vec(cache.load_code_object(meta.data(), binary, 1, archs)) == code("app#1", "gfx1101"));
  EXPECT_ERROR(cache.load_code_object(meta.data(), binary, 9, archs),
               KPACK_ERROR_KERNEL_NOT_FOUND, binary, "app#9");
  EXPECT_ERROR(cache.load_code_object(meta.data(), binary, 2, archs),
               KPACK_ERROR_DECOMPRESSION_FAILED, binary, "lib_gfx1100.kpack", "app#2");
  EXPECT_ERROR(cache.load_code_object(meta.data(), binary, 0, {}), KPACK_ERROR_INVALID_ARGUMENT,
               "no architecture");
  EXPECT_ERROR(cache.load_code_object(meta.data(), binary, 0, {"gfx90a"}),
               KPACK_ERROR_ARCH_NOT_FOUND, binary, "gfx90a");
  EXPECT_ERROR(cache.load_code_object(meta.data(), "/nowhere/bin", 0, archs),
               KPACK_ERROR_ARCHIVE_NOT_FOUND, "/nowhere/bin", "could be opened");
  const uint8_t junk[] = {0xc1};
  EXPECT_ERROR(cache.load_code_object(junk, binary, 0, archs), KPACK_ERROR_INVALID_METADATA,
               binary);
  EXPECT_ERROR(cache.load_code_object(nullptr, binary, 0, archs), KPACK_ERROR_INVALID_ARGUMENT,
               binary, "NULL");
  EXPECT_ERROR(cache.load_code_object(meta.data(), binary, 0, {std::string("\xff")}),
               KPACK_ERROR_INVALID_ARGUMENT, "UTF-8");

  // 16 threads on one cache and one archive.
  kpack::Archive shared(binary.substr(0, binary.rfind('/')) + "/lib_gfx1101.kpack");
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        uint32_t co = static_cast<uint32_t>((t + i) % 2);
        std::string key = "app#" + std::to_string(co);
        if (vec(cache.load_code_object(meta.data(), binary, co, archs)) !=
            code(key, co == 0 ? "gfx1100" : "gfx1101"))
          ++errors;
        if (vec(shared.kernel("app#1", "gfx1101")) != code("app#1", "gfx1101")) ++errors;
        try {
          cache.load_code_object(meta.data(), binary, 9, archs);
          ++errors;
        } catch (const kpack::Error& e) {
          if (e.code() != KPACK_ERROR_KERNEL_NOT_FOUND) ++errors;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors == 0);

  kpack::Cache moved = std::move(cache);
  CHECK(cache.handle() == nullptr);
  EXPECT_ERROR(cache.load_code_object(meta.data(), binary, 0, archs),
               KPACK_ERROR_INVALID_ARGUMENT, "kpack::Cache", "moved");
  CHECK(vec(moved.load_code_object(meta.data(), binary, 0, archs)) == code("app#0", "gfx1100"));

  // ROCM_KPACK_DISABLE is read when a cache is made.
  setenv("ROCM_KPACK_DISABLE", "1", 1);
  kpack::Cache disabled;
  unsetenv("ROCM_KPACK_DISABLE");
  EXPECT_ERROR(disabled.load_code_object(meta.data(), binary, 0, archs),
               KPACK_ERROR_NOT_IMPLEMENTED, "ROCM_KPACK_DISABLE");
}

static void discover(const char* argv0) {
  static const char marker[] = "kpack c++ marker";
  kpack::BinaryLocation loc = kpack::discover_binary_path(marker);
  char self[PATH_MAX];
  CHECK(realpath(argv0, self) != nullptr);
  CHECK(loc.path == self);
  CHECK(loc.offset > 0);
  int local = 0;
  EXPECT_ERROR(kpack::discover_binary_path(&local), KPACK_ERROR_PATH_DISCOVERY_FAILED,
               "not in a file mapping");
  EXPECT_ERROR(kpack::discover_binary_path(nullptr), KPACK_ERROR_INVALID_ARGUMENT, "NULL");
}

// Out of memory: a valid archive with a 4 GiB kernel, under ulimit -v.
static void oom(const std::string& huge, const std::vector<uint8_t>& meta,
                const std::string& binary) {
  kpack::Archive a(huge);
  CHECK(a.kernel_size("k#0", "gfx1100") == (size_t{1} << 32));
  EXPECT_ERROR(a.kernel("k#0", "gfx1100"), KPACK_ERROR_OUT_OF_MEMORY, huge, "allocate");
  kpack::Cache c;
  EXPECT_ERROR(c.load_code_object(meta.data(), binary, 0, {"gfx1100"}),
               KPACK_ERROR_OUT_OF_MEMORY, binary, "allocate");
}

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "all" && argc == 6) {
    const std::string fixtures = argv[2], work = argv[3], binary = argv[5];
    archive_methods(fixtures);
    open_errors(work);
    enumerate(fixtures, work);
    cache(read_file(argv[4]), binary);
    discover(argv[0]);
  } else if (cmd == "oom" && argc == 5) {
    oom(argv[2], read_file(argv[3]), argv[4]);
  } else {
    std::fprintf(stderr, "usage: %s all FIXTURES WORK META BINARY | oom HUGE META BINARY\n",
                 argv[0]);
    return 2;
  }
  if (failures != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("PASS\n");
  return 0;
}
