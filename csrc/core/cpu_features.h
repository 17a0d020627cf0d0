// Run-time CPU dispatch shared by the hot loops (resize, Huffman decoding).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#define FASTDATA_X86 1
#endif

namespace fastdata {

// False when FASTDATA_FORCE_SCALAR=1: every dispatched loop takes its baseline x86-64 (or
// scalar) version. Tests compare both ways bit for bit (tests/io/test_simd_parity.py).
bool simd_allowed();

// simd_allowed, and BMI1, BMI2 and POPCNT present: the Huffman decoders' BMI2 copies.
bool bmi2_allowed();

// BMI2 with a fast bit deposit (pdep): bmi2_allowed, and not AMD's Zen 1 and 2 (family 17h,
// Hygon's Dhyana too), which run pdep as microcode (tens to hundreds of cycles, by the bit
// count). FASTDATA_SOFTWARE_BIT_DEPOSIT=1 answers false as those CPUs do, so that their path
// can be tested and timed on others.
bool fast_bit_deposit();

// simd_allowed, and AVX2 present (the OS saves its registers): the resampler's and the
// normalize path's AVX2 copies.
bool avx2_allowed();

// avx2_allowed, and F16C present: the normalize path's float16/bfloat16 stores.
bool avx2_f16c_allowed();

// The test switches above, by name: set in the environment to anything but empty or "0".
// Read again at each call (the decisions above are read once per process).
inline constexpr const char* kTestSwitches[] = {"FASTDATA_FORCE_SCALAR", "FASTDATA_SOFTWARE_BIT_DEPOSIT"};
bool env_switch(const char* name);

}  // namespace fastdata
