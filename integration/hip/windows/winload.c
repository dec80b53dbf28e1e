// winload LIBRARY SYMBOL: the Windows fixtures' loader (run under Wine).
// LoadLibrary()s LIBRARY, calls `int SYMBOL(void)` and prints the result,
// then one line per wrapper the stand-in amdhip64.dll was handed
// ("<magic> <version> <reserved1> <hex bytes at the pointer>"), then
// FreeLibrary()s it.
typedef void *HANDLE;
__declspec(dllimport) void *__stdcall LoadLibraryA(const char *name);
__declspec(dllimport) void *__stdcall GetProcAddress(void *module,
                                                     const char *name);
__declspec(dllimport) int __stdcall FreeLibrary(void *module);
__declspec(dllimport) unsigned long __stdcall GetLastError(void);
__declspec(dllimport) HANDLE __stdcall GetStdHandle(unsigned long which);
__declspec(dllimport) int __stdcall WriteFile(HANDLE h, const void *data,
                                              unsigned long n,
                                              unsigned long *written,
                                              void *overlapped);
__declspec(dllimport) int kp_stub_count(void);
__declspec(dllimport) const char *kp_stub_line(int i);

static void out(const char *s) {
  unsigned long n = 0, w;
  while (s[n])
    ++n;
  WriteFile(GetStdHandle((unsigned long)-11), s, n, &w, 0);
}

static void out_int(long v) {
  char buf[24], *p = buf + 23;
  int neg = v < 0;
  unsigned long u = neg ? -(unsigned long)v : (unsigned long)v;
  *p = 0;
  do {
    *--p = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (neg)
    *--p = '-';
  out(p);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    out("usage: winload LIBRARY SYMBOL\n");
    return 2;
  }
  void *lib = LoadLibraryA(argv[1]);
  if (!lib) {
    out("winload: LoadLibrary failed: error ");
    out_int((long)GetLastError());
    out("\n");
    return 1;
  }
  int (*fn)(void) = (int (*)(void))GetProcAddress(lib, argv[2]);
  if (!fn) {
    out("winload: no such symbol\n");
    return 1;
  }
  out_int(fn());
  out("\n");
  for (int i = 0; i < kp_stub_count(); ++i) {
    out(kp_stub_line(i));
    out("\n");
  }
  return FreeLibrary(lib) ? 0 : 1;
}
