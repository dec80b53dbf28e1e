// The C++17 checker: the same as check.c through rocm_kpack/kpack.hpp (the
// C++ API; the code object comes back as a Rust-owned vector, no copy).
//
//   consumer_cxx LIBRARY EXPECTED_DIR TARGET...
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <rocm_kpack/kpack.hpp>

namespace {
struct Wrapper {
  uint32_t magic;
  uint32_t version;
  const void* binary;
  uint64_t reserved1;
};
std::vector<const Wrapper*> g_wrappers;
void* g_handle[1];

// EXPECTED_DIR/<target>#<co_index>.co, else <target>.co (as check.c).
std::string expected(const std::string& dir, const std::string& target, uint64_t index) {
  std::string p = dir + "/" + target + "#" + std::to_string(index) + ".co";
  if (std::ifstream(p).good()) return p;
  return dir + "/" + target + ".co";
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

extern "C" {
void** __hipRegisterFatBinary(const void* data) {
  g_wrappers.push_back(static_cast<const Wrapper*>(data));
  return g_handle;
}
void __hipUnregisterFatBinary(void**) {}
void __hipRegisterFunction() {}
void __hipRegisterVar() {}
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s LIBRARY EXPECTED_DIR TARGET...\n", argv[0]);
    return 2;
  }
  if (!dlopen(argv[1], RTLD_NOW | RTLD_LOCAL)) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  if (g_wrappers.empty()) {
    std::fprintf(stderr, "no fat binary was registered\n");
    return 1;
  }
  int loaded = 0;
  try {
    kpack::Cache cache;
    for (const Wrapper* w : g_wrappers) {
      if (w->magic != 0x4B504948u) {
        std::fprintf(stderr, "wrapper magic %08x is not HIPK\n", w->magic);
        return 1;
      }
      kpack::BinaryLocation where = kpack::discover_binary_path(w);
      for (int t = 3; t < argc; t++) {
        kpack::Bytes co = cache.load_code_object(w->binary, where.path,
                                                 static_cast<uint32_t>(w->reserved1), {argv[t]});
        std::vector<uint8_t> want = read_file(expected(argv[2], argv[t], w->reserved1));
        if (want.empty() || !std::equal(co.begin(), co.end(), want.begin(), want.end())) {
          std::fprintf(stderr, "%s (%s): %zu bytes, expected %zu\n", where.path.c_str(), argv[t], co.size(),
                       want.size());
          return 1;
        }
        loaded++;
      }
    }
  } catch (const kpack::Error& e) {
    std::fprintf(stderr, "kpack error %d: %s\n", static_cast<int>(e.code()), e.what());
    return 1;
  }
  std::printf("%d code objects loaded and identical\n", loaded);
  return loaded > 0 ? 0 : 1;
}
