/* Calls into libprobe.so: prints the size of a kernel of the reference
 * zstd archive, read through the prelinked librocm_kpack.a inside it. */
#include <stdio.h>

long probe_kernel_size(const char* path, const char* key, const char* arch);

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    printf("size=%ld\n", probe_kernel_size(argv[1], "lib/libhip.so#0", "gfx1100"));
    return 0;
}
