// libhostonly.so: an ordinary C++ library without device code.
#include <numeric>
#include <vector>

// Returns 0 + 1 + ... + 99 = 4950.
extern "C" int hostonly_host_check(void) {
  std::vector<int> v(100);
  std::iota(v.begin(), v.end(), 0);
  return std::accumulate(v.begin(), v.end(), 0);
}
