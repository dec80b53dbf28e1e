// crossload LIBRARY SYMBOL: dlcheck for the foreign hosts (run under
// qemu-user). dlopen()s LIBRARY, calls `int SYMBOL(void)` and prints the
// result. Linked with hipstub.c and -rdynamic, so the library's HIP
// registration calls resolve to the stand-in runtime in this program.
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: crossload LIBRARY SYMBOL\n");
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    fprintf(stderr, "crossload: %s\n", dlerror());
    return 1;
  }
  int (*fn)(void) = (int (*)(void))dlsym(lib, argv[2]);
  if (!fn) {
    fprintf(stderr, "crossload: %s\n", dlerror());
    return 1;
  }
  printf("%d\n", fn());
  if (dlclose(lib) != 0) {
    fprintf(stderr, "crossload: %s\n", dlerror());
    return 1;
  }
  return 0;
}
