// Run-time CPU dispatch shared by the hot loops (resize, Huffman decoding).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#define FASTDATA_X86 1
#endif

namespace fastdata {

// False when FASTDATA_FORCE_SCALAR=1: every dispatched loop takes its baseline x86-64 (or
// scalar) version. Tests compare both ways bit for bit (tests/io/test_simd_parity.py).
bool simd_allowed();

// BMI2 with a fast bit deposit (pdep): simd_allowed, BMI2 and POPCNT present, and not AMD's
// Zen 1 and 2 (family 17h, Hygon's Dhyana too), which run pdep as microcode (tens to hundreds
// of cycles, by the bit count).
bool fast_bit_deposit();

}  // namespace fastdata
