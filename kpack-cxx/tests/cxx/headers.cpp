// Compile-only check of <rocm_kpack/kpack.hpp> under strict C++17 flags.
#include <rocm_kpack/kpack.hpp>
#include <rocm_kpack/kpack.hpp>  // include guards

#include <type_traits>

static_assert(std::is_base_of<std::runtime_error, kpack::Error>::value, "");
static_assert(!std::is_copy_constructible<kpack::Archive>::value, "");
static_assert(std::is_nothrow_move_constructible<kpack::Archive>::value, "");
static_assert(!std::is_copy_constructible<kpack::Cache>::value, "");
static_assert(std::is_nothrow_move_constructible<kpack::Cache>::value, "");
static_assert(std::is_same<decltype(std::declval<const kpack::Archive&>().kernel("", "")),
                           rust::Vec<uint8_t>>::value,
              "");
static_assert(std::is_same<decltype(std::declval<const kpack::Archive&>().kernels()),
                           std::vector<kpack::KernelInfo>>::value,
              "");
static_assert(std::is_same<decltype(std::declval<kpack::Error&>().code()), kpack_error_t>::value,
              "");

int main() { return 0; }
