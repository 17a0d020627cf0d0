// Run-time CPU dispatch shared by the hot loops (resize, Huffman decoding).
#pragma once

namespace fastdata {

// False when FASTDATA_FORCE_SCALAR=1: every dispatched loop takes its baseline x86-64 (or
// scalar) version. Tests compare both ways bit for bit (tests/unit/test_simd_parity.py).
bool simd_allowed();

}  // namespace fastdata
