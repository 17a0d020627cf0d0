// Run-time CPU dispatch shared by the hot loops (resize, Huffman decoding).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#define FASTDATA_X86 1
#endif

namespace fastdata {

// False when FASTDATA_FORCE_SCALAR=1: every dispatched loop takes its baseline x86-64 (or
// scalar) version. Tests compare both ways bit for bit (tests/io/test_simd_parity.py).
bool simd_allowed();

}  // namespace fastdata
