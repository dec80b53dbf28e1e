// dlcheck LIBRARY SYMBOL: dlopen()s LIBRARY, calls `int SYMBOL(void)` and
// prints the result. Lets tests run a fixture's host code (the *_host_check
// functions) without loading it into their own process.
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: dlcheck LIBRARY SYMBOL\n");
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlcheck: %s\n", dlerror());
    return 1;
  }
  int (*fn)(void) = (int (*)(void))dlsym(lib, argv[2]);
  if (!fn) {
    fprintf(stderr, "dlcheck: %s\n", dlerror());
    return 1;
  }
  printf("%d\n", fn());
  if (dlclose(lib) != 0) {
    fprintf(stderr, "dlcheck: %s\n", dlerror());
    return 1;
  }
  return 0;
}
