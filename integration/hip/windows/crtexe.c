// The entry point of an EXE built with crt.c (kpack's Windows fixtures):
// runs the constructors, main(), the atexit() handlers, then exits with
// main's result. Imports kernel32.dll (an import library made by
// llvm-dlltool from kernel32.def).
void kp_run_constructors(void);
void kp_run_exit_handlers(void);

int main(int argc, char **argv);
__declspec(dllimport) char *__stdcall GetCommandLineA(void);
__declspec(dllimport) void __stdcall ExitProcess(unsigned code);

// Splits the command line at spaces outside double quotes (enough for the
// test programs' arguments).
static int kp_split(char *s, char **argv, int max) {
  int argc = 0;
  while (*s && argc < max) {
    while (*s == ' ')
      ++s;
    if (!*s)
      break;
    char *out = s;
    argv[argc++] = out;
    int quoted = 0;
    for (; *s && (quoted || *s != ' '); ++s) {
      if (*s == '"')
        quoted = !quoted;
      else
        *out++ = *s;
    }
    if (*s)
      ++s;
    *out = 0;
  }
  argv[argc] = 0;
  return argc;
}

void mainCRTStartup(void) {
  static char *argv[16];
  kp_run_constructors();
  int code = main(kp_split(GetCommandLineA(), argv, 15), argv);
  kp_run_exit_handlers();
  ExitProcess((unsigned)code);
}

