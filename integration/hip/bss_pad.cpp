// 12 KiB of .bss beside a fixture's device code: with lld, .bss gets a
// segment of its own whose zero-filled window in file offsets reaches past
// the next segment's start, as in the libraries of 2024-2025 wheels.
char kpack_bss_pad[12288];

extern "C" char *kpack_bss_pad_at(int i) { return &kpack_bss_pad[i]; }
