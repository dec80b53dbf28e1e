// Host-only main of vadd_pie and vadd_nopie: runs without a GPU and exits 0
// when the host computation is right.
extern "C" int vadd_host_check(void);
extern "C" int vadd_launch(const float *a, const float *b, float *c,
                           unsigned n);

int main(int argc, char **) {
  // Keeps the launcher (and so the kernel stub) referenced; never taken.
  if (argc > 1000)
    return vadd_launch(nullptr, nullptr, nullptr, 0);
  return vadd_host_check() == 1571328 ? 0 : 1;
}
