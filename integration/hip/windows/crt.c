// The few pieces of a C runtime that HIP host code built for
// x86_64-pc-windows-msvc with -nostdlib needs (kpack's Windows fixtures:
// Debian has no MSVC runtime): a DLL's entry point, which runs the .CRT$XCU constructors (where HIP registers its fat
// binaries) and the atexit() handlers, plus _fltused and __chkstk.
// An EXE adds crtexe.c (its entry point).
typedef void (*kp_fn)(void);

// The linker sorts .CRT$XCA < .CRT$XCU < .CRT$XCZ: the constructors lie
// between these two markers.
__attribute__((section(".CRT$XCA"), used)) static kp_fn kp_xc_a = 0;
__attribute__((section(".CRT$XCZ"), used)) static kp_fn kp_xc_z = 0;

int _fltused = 0;

static kp_fn kp_exit_fns[64];
static int kp_exit_count;

int atexit(kp_fn fn) {
  if (kp_exit_count == 64)
    return -1;
  kp_exit_fns[kp_exit_count++] = fn;
  return 0;
}

void kp_run_constructors(void) {
  for (kp_fn *p = &kp_xc_a + 1; p < &kp_xc_z; ++p)
    if (*p)
      (*p)();
}

void kp_run_exit_handlers(void) {
  while (kp_exit_count > 0)
    kp_exit_fns[--kp_exit_count]();
}

// DLL_PROCESS_ATTACH = 1, DLL_PROCESS_DETACH = 0.
int __stdcall _DllMainCRTStartup(void *module, unsigned long reason,
                                 void *reserved) {
  (void)module;
  (void)reserved;
  if (reason == 1)
    kp_run_constructors();
  else if (reason == 0)
    kp_run_exit_handlers();
  return 1;
}

// Stack probe for frames larger than a page (MSVC's calling convention:
// size in rax, nothing clobbered).
__asm__(".globl __chkstk\n"
        "__chkstk:\n"
        "  pushq %rcx\n"
        "  pushq %rax\n"
        "  leaq 24(%rsp), %rcx\n"
        "1:\n"
        "  cmpq $0x1000, %rax\n"
        "  jb 2f\n"
        "  subq $0x1000, %rcx\n"
        "  testq %rcx, (%rcx)\n"
        "  subq $0x1000, %rax\n"
        "  jmp 1b\n"
        "2:\n"
        "  subq %rax, %rcx\n"
        "  testq %rcx, (%rcx)\n"
        "  popq %rax\n"
        "  popq %rcx\n"
        "  ret\n");
