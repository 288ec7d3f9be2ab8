// Compares the engine's text of a float (print_line.cc's AppendRepr, the
// text of a debug.print line) with CPython's repr(float)
// (PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0)), in an embedded
// interpreter.  Built and run by tests/test_print_line.py on a sample;
//   print_line_check f32 STRIDE   every STRIDE-th float32 bit pattern
//                                 (STRIDE 1: all 2^32 of them, ~30 min)
//   print_line_check f64 COUNT    COUNT pseudo-random doubles, every other
//                                 one with its low mantissa bits cleared
// prints `checked=N mismatches=M` (and up to 10 mismatches on stderr).
#define HOSTCB_IMPORTS_NUMPY
#include "print_line.cc"
// The text of arrays, which print_line.cc's ArrayLineOfOperand makes.
#include "array_text.cc"

namespace hostcb {
// module.cc's dtype table, which PrintLineText reads (not used here).
PyArray_Descr* g_descr[kMaxDtype];
}  // namespace hostcb

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if !HOSTCB_PRINT_LINES
// This C++ library has no shortest floating-point std::to_chars: the
// engine formats every line in Python, and there is nothing to compare.
int main() {
  std::printf("unsupported=1\n");
  return 0;
}
#else

namespace {

uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t g_checked = 0, g_mismatches = 0;

void Check(double x, uint64_t bits) {
  std::string mine;
  hostcb::AppendRepr(x, &mine);
  char* python = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, nullptr);
  if (python == nullptr || mine != python) {
    if (g_mismatches < 10) {
      std::fprintf(stderr, "bits %016llx: %s, Python %s\n",
                   static_cast<unsigned long long>(bits), mine.c_str(),
                   python ? python : "(failed)");
    }
    ++g_mismatches;
  }
  PyMem_Free(python);
  ++g_checked;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 ||
      (std::strcmp(argv[1], "f32") != 0 && std::strcmp(argv[1], "f64") != 0)) {
    std::fprintf(stderr, "usage: %s f32 STRIDE | f64 COUNT\n", argv[0]);
    return 2;
  }
  const unsigned long long n = std::strtoull(argv[2], nullptr, 10);
  if (n == 0) {
    std::fprintf(stderr, "STRIDE and COUNT must be positive\n");
    return 2;
  }
  Py_Initialize();
  if (std::strcmp(argv[1], "f32") == 0) {
    for (uint64_t b = 0; b < (uint64_t{1} << 32); b += n) {
      const uint32_t bits = static_cast<uint32_t>(b);
      float f;
      std::memcpy(&f, &bits, sizeof f);
      Check(static_cast<double>(f), bits);
    }
  } else {
    uint64_t state = 12345;
    for (unsigned long long i = 0; i < n; ++i) {
      uint64_t bits = SplitMix(&state);
      // Short mantissas: few digits, and the ties between two of them.
      if (i & 1) bits &= ~((uint64_t{1} << (i % 52)) - 1);
      double x;
      std::memcpy(&x, &bits, sizeof x);
      Check(x, bits);
    }
  }
  std::printf("checked=%llu mismatches=%llu\n",
              static_cast<unsigned long long>(g_checked),
              static_cast<unsigned long long>(g_mismatches));
  return 0;
}

#endif  // HOSTCB_PRINT_LINES
