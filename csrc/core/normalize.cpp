#include "core/normalize.h"

#include "core/cpu_features.h"

#include <cmath>
#include <cstring>

#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace fastdata {

size_t value_bytes(OutputType type) {
  switch (type) {
    case OutputType::kUint8: return 1;
    case OutputType::kFloat32: return 4;
    case OutputType::kFloat16:
    case OutputType::kBFloat16: return 2;
  }
  return 1;
}

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

uint16_t bfloat16_bits(float value) {
  const uint32_t u = bits_of(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN: quiet, sign kept
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1)) >> 16);  // ties to even; overflow carries to inf
}

uint16_t float16_bits(float value) {
  // Exponent-aligned addition: adding a power of two that puts the half's last mantissa bit at
  // the float's last one makes the FPU round (to nearest even, the default mode) exactly where
  // the half keeps its bits, subnormal halves included; the two scalings first send what
  // overflows the half to infinity. (The method of the FP16 library, Marat Dukhan, MIT.)
  const uint32_t w = bits_of(value);
  const uint32_t shl1 = w + w;  // the sign shifted out
  const uint32_t sign = w & 0x80000000u;
  float base = (std::fabs(value) * 0x1.0p+112f) * 0x1.0p-110f;
  uint32_t bias = shl1 & 0xff000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;  // below the half's normal range: align to its subnormals
  base = float_of((bias >> 1) + 0x07800000u) + base;
  const uint32_t b = bits_of(base);
  const uint32_t nonsign = ((b >> 13) & 0x00007c00u) + (b & 0x00000fffu);
  return static_cast<uint16_t>((sign >> 16) | (shl1 > 0xff000000u ? 0x7e00u : nonsign));
}

namespace {

#if defined(__x86_64__) || defined(__i386__)
// 8 bytes -> 8 floats, each byte widened by one instruction (pmovzxbd).
__attribute__((target("avx2"), always_inline)) inline __m256 widen8_avx2(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// 24 values (8 pixels) per step; ``f32`` must be 32-byte aligned; returns how many values it
// wrote (a multiple of 24; the caller finishes the row).
__attribute__((target("avx2"))) size_t normalize_avx2(const uint8_t* u8, float* f32, size_t n, const float s[24],
                                                      const float b[24]) {
  const __m256 s0 = _mm256_loadu_ps(s), s1 = _mm256_loadu_ps(s + 8), s2 = _mm256_loadu_ps(s + 16);
  const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), b2 = _mm256_loadu_ps(b + 16);
  size_t i = 0;
  for (; i + 24 <= n; i += 24) {
    _mm256_stream_ps(f32 + i, _mm256_add_ps(_mm256_mul_ps(widen8_avx2(u8 + i), s0), b0));
    _mm256_stream_ps(f32 + i + 8, _mm256_add_ps(_mm256_mul_ps(widen8_avx2(u8 + i + 8), s1), b1));
    _mm256_stream_ps(f32 + i + 16, _mm256_add_ps(_mm256_mul_ps(widen8_avx2(u8 + i + 16), s2), b2));
  }
  return i;
}

// bfloat16 bits of 8 floats, ties to even (bfloat16_bits without the NaN case: normalized
// values of finite scale and bias are never NaN), in the low 16 bits of each 32.
__attribute__((target("avx2"), always_inline)) inline __m256i bfloat16_avx2(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
}

// 8 values into ``dst``: streamed where every step's stores are 16-byte aligned (48 bytes per
// step keep them so), plain stores otherwise.
template <bool kStream>
__attribute__((target("avx2"), always_inline)) inline void store8(uint16_t* dst, __m128i v) {
  if (kStream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), v);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), v);
  }
}

// The 16-bit outputs, 24 values per step as above: float16 by F16C's conversion (rounding to
// nearest even), bfloat16 in integer steps. kStream: ``dst`` is 16-byte aligned. Returns how
// many values it wrote.
template <bool kStream>
__attribute__((target("avx2,f16c"))) size_t normalize_halves_avx2(const uint8_t* u8, uint16_t* dst, size_t n,
                                                                  const float s[24], const float b[24], bool bf16) {
  const __m256 s0 = _mm256_loadu_ps(s), s1 = _mm256_loadu_ps(s + 8), s2 = _mm256_loadu_ps(s + 16);
  const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), b2 = _mm256_loadu_ps(b + 16);
  size_t i = 0;
  for (; i + 24 <= n; i += 24) {
    const __m256 v0 = _mm256_add_ps(_mm256_mul_ps(widen8_avx2(u8 + i), s0), b0);
    const __m256 v1 = _mm256_add_ps(_mm256_mul_ps(widen8_avx2(u8 + i + 8), s1), b1);
    const __m256 v2 = _mm256_add_ps(_mm256_mul_ps(widen8_avx2(u8 + i + 16), s2), b2);
    __m128i h0, h1, h2;
    if (bf16) {
      // packus works within 128-bit lanes: [v0 0-3, v1 0-3 | v0 4-7, v1 4-7], put in order by 0xD8.
      const __m256i p01 = _mm256_permute4x64_epi64(_mm256_packus_epi32(bfloat16_avx2(v0), bfloat16_avx2(v1)), 0xd8);
      const __m256i p22 = _mm256_permute4x64_epi64(_mm256_packus_epi32(bfloat16_avx2(v2), bfloat16_avx2(v2)), 0xd8);
      h0 = _mm256_castsi256_si128(p01);
      h1 = _mm256_extracti128_si256(p01, 1);
      h2 = _mm256_castsi256_si128(p22);
    } else {
      h0 = _mm256_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      h1 = _mm256_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      h2 = _mm256_cvtps_ph(v2, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    store8<kStream>(dst + i, h0);
    store8<kStream>(dst + i + 8, h1);
    store8<kStream>(dst + i + 16, h2);
  }
  return i;
}
#endif

// float32: with SSE2 the rows go out with streaming stores (a float32 batch is 4x the uint8
// one and far larger than the caches, and plain stores first read every destination line).
// Measured per 224x224 image (CPU time, 2-core box): 125 us with the per-channel loop it
// replaces (which did not vectorize), 87 us vectorized, 52 us streamed. With AVX2 (16-byte
// aligned rows: one SSE2 group first where that leaves them 32-byte aligned), 31-33 us against
// 41-62 us for the SSE2 loop (2026-12-02, 224x224 rows out of cache, one thread). Four pixels
// are twelve values, so one 12-wide pattern of scales covers them.
void normalize_float32(const uint8_t* u8, float* f32, size_t n, const float s[24], const float b[24]) {
  size_t i = 0;
#ifdef __SSE2__
  const __m128 s0 = _mm_loadu_ps(s), s1 = _mm_loadu_ps(s + 4), s2 = _mm_loadu_ps(s + 8);
  const __m128 b0 = _mm_loadu_ps(b), b1 = _mm_loadu_ps(b + 4), b2 = _mm_loadu_ps(b + 8);
  const __m128i zero = _mm_setzero_si128();
  const bool aligned = (reinterpret_cast<uintptr_t>(f32) & 15) == 0;
  const auto group = [&](size_t at) {  // values at..at+11 (``at`` a multiple of 12)
    uint32_t w[3];
    std::memcpy(w, u8 + at, 12);
    const __m128i v = _mm_setr_epi32(static_cast<int>(w[0]), static_cast<int>(w[1]), static_cast<int>(w[2]), 0);
    const __m128i lo = _mm_unpacklo_epi8(v, zero), hi = _mm_unpackhi_epi8(v, zero);
    const __m128 f0 = _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(_mm_unpacklo_epi16(lo, zero)), s0), b0);
    const __m128 f1 = _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(_mm_unpackhi_epi16(lo, zero)), s1), b1);
    const __m128 f2 = _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(_mm_unpacklo_epi16(hi, zero)), s2), b2);
    if (aligned) {  // 12 floats are 48 bytes: every group stays 16-byte aligned
      _mm_stream_ps(f32 + at, f0);
      _mm_stream_ps(f32 + at + 4, f1);
      _mm_stream_ps(f32 + at + 8, f2);
    } else {
      _mm_storeu_ps(f32 + at, f0);
      _mm_storeu_ps(f32 + at + 4, f1);
      _mm_storeu_ps(f32 + at + 8, f2);
    }
  };
#if defined(__x86_64__) || defined(__i386__)
  const bool avx2 = avx2_allowed();
  if (avx2 && aligned) {
    if ((reinterpret_cast<uintptr_t>(f32) & 31) != 0 && n >= 12) group(i), i += 12;
    if ((reinterpret_cast<uintptr_t>(f32 + i) & 31) == 0) i += normalize_avx2(u8 + i, f32 + i, n - i, s, b);
  }
#endif
  for (; i + 12 <= n; i += 12) group(i);
  _mm_sfence();  // streaming stores are weakly ordered: visible before the batch is handed over
#endif
  for (; i + 12 <= n; i += 12) {
    for (int k = 0; k < 12; ++k) f32[i + k] = u8[i + k] * s[k] + b[k];
  }
  for (; i < n; ++i) f32[i] = u8[i] * s[i % 3] + b[i % 3];
}

// float16 / bfloat16 (AVX2 + F16C, streamed where 16-byte aligned; the portable rounding for the
// tail and on other CPUs): without the conversion in a store, the Loader converted the float32
// batch in torch afterwards, a second pass over 1.5x the output's bytes on the producer and
// torch's threads (2-core box, 8,192 photo-like 500x375 set, 2026-12-05: 46 ms per batch of
// 256 for float16 and 79 ms for bfloat16, against the native threads' ~200).
void normalize_halves(const uint8_t* u8, uint16_t* dst, size_t n, const float s[24], const float b[24], bool bf16) {
  size_t i = 0;
#if defined(__x86_64__) || defined(__i386__)
  const bool avx2 = avx2_f16c_allowed();
  if (avx2 && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    i = normalize_halves_avx2<true>(u8, dst, n, s, b, bf16);
    _mm_sfence();  // streaming stores are weakly ordered: visible before the batch is handed over
  } else if (avx2) {  // rows of h * w not a multiple of 8 pixels (299x299): every other row
    i = normalize_halves_avx2<false>(u8, dst, n, s, b, bf16);
  }
#endif
  for (; i < n; ++i) {
    const float v = u8[i] * s[i % 3] + b[i % 3];
    dst[i] = bf16 ? bfloat16_bits(v) : float16_bits(v);
  }
}

}  // namespace

void normalize_row(const uint8_t* u8, void* dst, size_t pixels, OutputType type, const float scale[3],
                   const float bias[3]) {
  float s[24], b[24];
  for (int k = 0; k < 24; ++k) s[k] = scale[k % 3], b[k] = bias[k % 3];
  const size_t n = pixels * 3;
  if (type == OutputType::kFloat32) {
    normalize_float32(u8, static_cast<float*>(dst), n, s, b);
  } else if (type == OutputType::kFloat16 || type == OutputType::kBFloat16) {
    normalize_halves(u8, static_cast<uint16_t*>(dst), n, s, b, type == OutputType::kBFloat16);
  }
}

}  // namespace fastdata
