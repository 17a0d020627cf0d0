// Per-channel normalization of decoded rows on the native threads (the CPU output path; on
// GPUs it runs there): value = u8 * scale[c] + bias[c] in float32, a multiply then an add on
// every path (no FMA: the same bytes whatever the CPU), stored in the output's type.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fastdata {

// The value type of a batch's rows: uint8 RGB as decoded, or normalized RGB stored as
// float32, float16 or bfloat16. The two 16-bit types are the float32 value rounded to nearest,
// ties to even, exactly as torch's .to(torch.float16 / torch.bfloat16) rounds it (a NaN, which
// finite scales and biases never give, stays NaN but may keep other payload bits).
enum class OutputType : uint8_t { kUint8, kFloat32, kFloat16, kBFloat16 };

// Bytes per value of ``type``.
size_t value_bytes(OutputType type);

// ``pixels`` RGB pixels of ``u8`` normalized into ``dst`` (``pixels * 3`` values of ``type``,
// which is not kUint8).
void normalize_row(const uint8_t* u8, void* dst, size_t pixels, OutputType type, const float scale[3],
                   const float bias[3]);

// float32 -> float16 / bfloat16 bits, rounded to nearest even (NaN stays NaN); the portable
// paths of normalize_row, and its tests' reference.
uint16_t float16_bits(float value);
uint16_t bfloat16_bits(float value);

}  // namespace fastdata
