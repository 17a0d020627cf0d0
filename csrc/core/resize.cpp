#include "core/resize.h"

#include "core/cpu_features.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#ifdef FASTDATA_X86
#include <immintrin.h>
#endif

namespace fastdata {
namespace {

inline uint8_t clip8(int32_t v, int bits) {
  v >>= bits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// ---- horizontal pass: out pixel k of each row = sum_t w16[k,t] * in[first[k] + t] ----
// Scalar and SIMD versions do the same integer arithmetic, so every CPU gives the same bytes.

void horizontal_pass_scalar(const uint8_t* src, ptrdiff_t src_stride, int x_origin, int rows, const AxisFilter& fx,
                            uint8_t* dst, ptrdiff_t dst_stride) {
  const int out = static_cast<int>(fx.first.size());
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = src + y * src_stride;
    uint8_t* o = dst + y * dst_stride;
    for (int k = 0; k < out; ++k) {
      const uint8_t* p = in + static_cast<ptrdiff_t>(fx.first[k] - x_origin) * 3;
      int32_t acc[3] = {1 << (kResizeBits16 - 1), 1 << (kResizeBits16 - 1), 1 << (kResizeBits16 - 1)};
      const int n = fx.count[k];
      for (int t = 0; t < n; ++t) {
        // tap t sits in group t/4, vector (t%4)/2, lane t%2
        const int32_t wt = fx.weights16[w16_offset(k, t / 4, fx.groups) + ((t % 4) / 2) * 16 + (t % 2)];
        for (int c = 0; c < 3; ++c) acc[c] += wt * p[3 * t + c];
      }
      for (int c = 0; c < 3; ++c) o[3 * k + c] = clip8(acc[c], kResizeBits16);
    }
  }
}

#ifdef FASTDATA_X86
__attribute__((target("sse4.1,ssse3"))) void horizontal_pass_sse41(const uint8_t* src, ptrdiff_t src_stride,
                                                                   int x_origin, int rows, const AxisFilter& fx,
                                                                   uint8_t* dst, ptrdiff_t dst_stride) {
  const int out = static_cast<int>(fx.first.size());
  const int groups = fx.groups;
  // From 16 loaded bytes (pixels 0..3 of a group, 3 bytes each) build int16 lanes
  // (R0 R1 G0 G1 B0 B1 0 0) and (R2 R3 G2 G3 B2 B3 0 0); 0x80 yields a zero byte.
  const __m128i shuf01 = _mm_setr_epi8(0, -128, 3, -128, 1, -128, 4, -128, 2, -128, 5, -128, -128, -128, -128, -128);
  const __m128i shuf23 = _mm_setr_epi8(6, -128, 9, -128, 7, -128, 10, -128, 8, -128, 11, -128, -128, -128, -128, -128);
  const __m128i half = _mm_set1_epi32(1 << (kResizeBits16 - 1));
  const __m128i zero = _mm_setzero_si128();
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = src + y * src_stride;
    uint8_t* o = dst + y * dst_stride;
    for (int k = 0; k < out; ++k) {
      const uint8_t* p = in + static_cast<ptrdiff_t>(fx.first[k] - x_origin) * 3;
      const int g_end = (fx.count[k] + 3) / 4;
      __m128i acc = half;
      for (int g = 0; g < g_end; ++g) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 12 * g));
        const int16_t* w = fx.weights16.data() + w16_offset(k, g, groups);
        const __m128i wa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
        const __m128i wb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16));
        acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_shuffle_epi8(v, shuf01), wa));
        acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_shuffle_epi8(v, shuf23), wb));
      }
      // lanes: (R, G, B, 0) sums
      acc = _mm_srai_epi32(acc, kResizeBits16);
      const uint32_t rgb = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_packus_epi16(_mm_packus_epi32(acc, zero), zero)));
      if (k + 1 < out) {
        std::memcpy(o + 3 * k, &rgb, 4);  // the 4th byte is overwritten by pixel k + 1
      } else {
        std::memcpy(o + 3 * k, &rgb, 3);
      }
    }
  }
}


// (R, G, B, 0) int32 sums of output pixels k (low lane) and k + 1 (high lane); k even.
template <int G>
__attribute__((target("avx2"), always_inline)) inline __m256i horizontal_pair_avx2(
    const uint8_t* in, int k, const int* first, const int16_t* w16, size_t pair_stride, __m256i shuf01,
    __m256i shuf23, __m256i half) {
  const uint8_t* p0 = in + static_cast<ptrdiff_t>(first[k]) * 3;
  const uint8_t* p1 = in + static_cast<ptrdiff_t>(first[k + 1]) * 3;
  const int16_t* wp = w16 + static_cast<size_t>(k / 2) * pair_stride;
  __m256i acc = half;
  for (int g = 0; g < G; ++g) {
    const __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + 12 * g))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + 12 * g)), 1);
    const __m256i wa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 32 * g));
    const __m256i wb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 32 * g + 16));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_shuffle_epi8(v, shuf01), wa));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_shuffle_epi8(v, shuf23), wb));
  }
  return _mm256_srai_epi32(acc, kResizeBits16);
}

// Two output pixels per 256-bit accumulator, one per 128-bit lane, four pixels per step;
// otherwise the arithmetic of the SSSE3 loop above. G = tap groups actually used (the
// widest count[k] / 4, rounded up), a compile-time constant so the loop unrolls.
template <int G>
__attribute__((target("avx2"))) void horizontal_pass_avx2(const uint8_t* src, ptrdiff_t src_stride, int x_origin,
                                                          int rows, const AxisFilter& fx, uint8_t* dst,
                                                          ptrdiff_t dst_stride) {
  const int out = static_cast<int>(fx.first.size());
  const __m256i shuf01 = _mm256_setr_epi8(0, -128, 3, -128, 1, -128, 4, -128, 2, -128, 5, -128, -128, -128, -128,
                                          -128, 0, -128, 3, -128, 1, -128, 4, -128, 2, -128, 5, -128, -128, -128,
                                          -128, -128);
  const __m256i shuf23 = _mm256_setr_epi8(6, -128, 9, -128, 7, -128, 10, -128, 8, -128, 11, -128, -128, -128, -128,
                                          -128, 6, -128, 9, -128, 7, -128, 10, -128, 8, -128, 11, -128, -128, -128,
                                          -128, -128);
  const __m256i half = _mm256_set1_epi32(1 << (kResizeBits16 - 1));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  // Four pixels as (R G B 0) dwords -> 12 packed bytes.
  const __m128i compact = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -128, -128, -128, -128);
  // Locals, not fx's members: stores to `o` could alias them and force reloads.
  const int16_t* w16 = fx.weights16.data();
  const int* first = fx.first.data();
  const size_t pair_stride = static_cast<size_t>(fx.groups) * 32;
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = src + y * src_stride - static_cast<ptrdiff_t>(x_origin) * 3;
    uint8_t* o = dst + y * dst_stride;
    int k = 0;
    for (; k + 4 <= out; k += 4) {
      // dwords after the packs: k, k+2, k, k+2 | k+1, k+3, k+1, k+3; the permute orders them.
      __m256i p = _mm256_packus_epi32(horizontal_pair_avx2<G>(in, k, first, w16, pair_stride, shuf01, shuf23, half),
                                         horizontal_pair_avx2<G>(in, k + 2, first, w16, pair_stride, shuf01, shuf23, half));
      p = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p, p), order);
      const __m128i px = _mm_shuffle_epi8(_mm256_castsi256_si128(p), compact);
      if (k + 6 <= out) {  // 16 bytes stay in the row; bytes 12-15 are rewritten next
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 3 * k), px);
      } else {
        _mm_storel_epi64(reinterpret_cast<__m128i*>(o + 3 * k), px);
        const uint32_t tail = static_cast<uint32_t>(_mm_extract_epi32(px, 2));
        std::memcpy(o + 3 * k + 8, &tail, 4);
      }
    }
    for (; k < out; ++k) {  // up to 3 pixels: same arithmetic, scalar
      const uint8_t* p = in + static_cast<ptrdiff_t>(first[k]) * 3;
      int32_t acc[3] = {1 << (kResizeBits16 - 1), 1 << (kResizeBits16 - 1), 1 << (kResizeBits16 - 1)};
      for (int t = 0; t < fx.count[k]; ++t) {
        const int32_t wt = w16[w16_offset(k, t / 4, fx.groups) + ((t % 4) / 2) * 16 + (t % 2)];
        for (int c = 0; c < 3; ++c) acc[c] += wt * p[3 * t + c];
      }
      for (int c = 0; c < 3; ++c) o[3 * k + c] = clip8(acc[c], kResizeBits16);
    }
  }
}
// ---- vertical pass: out row k = sum_t w[k,t] * in row (first[k] + t), 14-bit weights ----
// Rows are taken in pairs: their bytes interleaved and widened to int16 meet the weight
// pair (w[t], w[t+1]) in one multiply-add, which gives the same exact int32 sums as the
// scalar loop below.
__attribute__((target("avx2"))) void vertical_pass_avx2(const uint8_t* src, ptrdiff_t src_stride, int y_origin,
                                                        int width, const AxisFilter& fy, uint8_t* dst,
                                                        ptrdiff_t dst_stride) {
  const int out = static_cast<int>(fy.first.size());
  const __m256i half = _mm256_set1_epi32(1 << (kResizeBits16 - 1));
  const __m256i zero = _mm256_setzero_si256();
  const int32_t* weights = fy.weights.data();
  const int* first = fy.first.data();
  const int* count = fy.count.data();
  const int taps = fy.taps;
  // 32 bytes per step; a last partial step is redone at width - 32 (same bytes, no
  // write past the row). Narrower rows go to the scalar loop.
  const int simd_width = width >= 32 ? width : 0;
  for (int k = 0; k < out; ++k) {
    const int32_t* w = weights + static_cast<size_t>(k) * taps;
    const uint8_t* base = src + static_cast<ptrdiff_t>(first[k] - y_origin) * src_stride;
    uint8_t* o = dst + k * dst_stride;
    const int n = count[k];
    for (int x0 = 0; x0 < simd_width; x0 += 32) {
      const int x = std::min(x0, width - 32);
      __m256i a0 = half, a1 = half, a2 = half, a3 = half;
      const uint8_t* row = base + x;
      int t = 0;
      for (; t < n; t += 2, row += 2 * src_stride) {
        const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
        __m256i r1 = zero;
        int32_t pair = w[t] & 0xFFFF;
        if (t + 1 < n) {
          r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + src_stride));
          pair |= static_cast<int32_t>(static_cast<uint32_t>(w[t + 1]) << 16);
        }
        const __m256i wp = _mm256_set1_epi32(pair);
        const __m256i lo = _mm256_unpacklo_epi8(r0, r1), hi = _mm256_unpackhi_epi8(r0, r1);
        a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), wp));
        a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), wp));
        a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), wp));
        a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), wp));
      }
      // a0..a3 hold bytes 0-3, 4-7, 8-11, 12-15 of each 128-bit half: the packs put them
      // back in memory order.
      a0 = _mm256_srai_epi32(a0, kResizeBits16);
      a1 = _mm256_srai_epi32(a1, kResizeBits16);
      a2 = _mm256_srai_epi32(a2, kResizeBits16);
      a3 = _mm256_srai_epi32(a3, kResizeBits16);
      const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(a0, a1), _mm256_packus_epi32(a2, a3));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + x), bytes);
    }
    for (int x = simd_width; x < width; ++x) {
      int32_t acc = 1 << (kResizeBits16 - 1);
      for (int t = 0; t < n; ++t) acc += w[t] * base[t * src_stride + x];
      o[x] = clip8(acc, kResizeBits16);
    }
  }
}
#endif

void vertical_pass_scalar(const uint8_t* src, ptrdiff_t src_stride, int y_origin, int width, const AxisFilter& fy,
                          uint8_t* dst, ptrdiff_t dst_stride) {
  const int out = static_cast<int>(fy.first.size());
  int32_t acc[1024];
  for (int k = 0; k < out; ++k) {
    const int32_t* w = fy.weights.data() + static_cast<size_t>(k) * fy.taps;
    const uint8_t* base = src + static_cast<ptrdiff_t>(fy.first[k] - y_origin) * src_stride;
    uint8_t* o = dst + k * dst_stride;
    const int n = fy.count[k];
    for (int x0 = 0; x0 < width; x0 += 1024) {
      const int bw = std::min(1024, width - x0);
      for (int x = 0; x < bw; ++x) acc[x] = 1 << (kResizeBits16 - 1);
      for (int t = 0; t < n; ++t) {
        const uint8_t* row = base + t * src_stride + x0;
        const int32_t wt = w[t];
        for (int x = 0; x < bw; ++x) acc[x] += wt * row[x];
      }
      for (int x = 0; x < bw; ++x) o[x0 + x] = clip8(acc[x], kResizeBits16);
    }
  }
}

void horizontal_pass(const uint8_t* src, ptrdiff_t src_stride, int x_origin, int rows, const AxisFilter& fx,
                     uint8_t* dst, ptrdiff_t dst_stride) {
#ifdef FASTDATA_X86
  // The SIMD loops read whole groups of 4 taps: beyond 4 groups they would outrun the padding.
  static const bool avx2 = avx2_allowed();
  static const bool sse41 = simd_allowed() && __builtin_cpu_supports("sse4.1") && __builtin_cpu_supports("ssse3");
  if (fx.groups <= 4 && avx2) {
    // Only the groups some count[k] reaches: the others hold zero weights.
    switch ((fx.max_count + 3) / 4) {
      case 1: return horizontal_pass_avx2<1>(src, src_stride, x_origin, rows, fx, dst, dst_stride);
      case 2: return horizontal_pass_avx2<2>(src, src_stride, x_origin, rows, fx, dst, dst_stride);
      case 3: return horizontal_pass_avx2<3>(src, src_stride, x_origin, rows, fx, dst, dst_stride);
      default: return horizontal_pass_avx2<4>(src, src_stride, x_origin, rows, fx, dst, dst_stride);
    }
  }
  if (fx.groups <= 4 && sse41) return horizontal_pass_sse41(src, src_stride, x_origin, rows, fx, dst, dst_stride);
#endif
  horizontal_pass_scalar(src, src_stride, x_origin, rows, fx, dst, dst_stride);
}

void vertical_pass(const uint8_t* src, ptrdiff_t src_stride, int y_origin, int width, const AxisFilter& fy,
                   uint8_t* dst, ptrdiff_t dst_stride) {
#ifdef FASTDATA_X86
  static const bool simd = avx2_allowed();
  if (simd) return vertical_pass_avx2(src, src_stride, y_origin, width, fy, dst, dst_stride);
#endif
  vertical_pass_scalar(src, src_stride, y_origin, width, fy, dst, dst_stride);
}

}  // namespace

void build_axis_filter(const AxisMap& map, int size, bool reverse, AxisFilter* f, bool simd_weights) {
  // Pillow's precompute_coeffs with the triangle (bilinear) filter, support 1 widened by
  // the downscale factor so that reductions are antialiased; reads limited to [lo, hi).
  const int lo = std::max(0, static_cast<int>(std::floor(map.lo)));
  const int hi = std::min(size, static_cast<int>(std::ceil(map.hi)));
  const double scale = map.scale;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  const int out = map.out;
  f->taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  f->groups = (f->taps + 3) / 4;
  f->first.assign(out, 0);
  f->count.assign(out, 0);
  f->weights.assign(static_cast<size_t>(out) * f->taps, 0);
  if (simd_weights) {
    f->weights16.assign(static_cast<size_t>((out + 1) / 2) * f->groups * 32, 0);
  } else {
    f->weights16.clear();
  }
  f->need_lo = hi;
  f->need_hi = lo;
  f->max_count = 0;
  double k[64];
  std::vector<double> k_heap;
  double* kk = k;
  if (f->taps > 64) {
    k_heap.resize(f->taps);
    kk = k_heap.data();
  }
  const double origin = map.start - lo;  // compute in the clip window's own coordinates, as Pillow does
  const int window = hi - lo;
  for (int xx = 0; xx < out; ++xx) {
    const double center = origin + (xx + 0.5) * scale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > window) xmax = window;
    int n = xmax - xmin;
    if (n > f->taps) n = f->taps;
    if (n <= 0) {  // the window is empty at this position: take the nearest pixel
      xmin = std::min(std::max(static_cast<int>(center), 0), window - 1);
      n = 1;
    }
    double ww = 0;
    for (int x = 0; x < n; ++x) {
      double d = (x + xmin - center + 0.5) / filterscale;
      d = d < 0 ? -d : d;
      kk[x] = d < 1.0 ? 1.0 - d : 0.0;
      ww += kk[x];
    }
    if (ww == 0) {  // degenerate: nearest pixel
      for (int x = 0; x < n; ++x) kk[x] = 0;
      kk[0] = 1;
      ww = 1;
    }
    const int dst = reverse ? out - 1 - xx : xx;
    int32_t* w = f->weights.data() + static_cast<size_t>(dst) * f->taps;
    for (int x = 0; x < n; ++x) {
      const double v = kk[x] / ww;  // weights are >= 0: round half up
      const int16_t v16 = static_cast<int16_t>(std::trunc(v * (1 << kResizeBits16) + 0.5));
      w[x] = v16;
      if (!simd_weights) continue;
      int16_t* lane = f->weights16.data() + w16_offset(dst, x / 4, f->groups) + ((x % 4) / 2) * 16 + (x % 2);
      lane[0] = lane[2] = lane[4] = v16;  // R, G, B lanes of this tap
    }
    f->first[dst] = lo + xmin;
    f->count[dst] = n;
    f->need_lo = std::min(f->need_lo, lo + xmin);
    f->need_hi = std::max(f->need_hi, lo + xmin + n);
    f->max_count = std::max(f->max_count, n);
  }
}

void resample_rgb(const uint8_t* src, ptrdiff_t src_stride, int src_x0, int src_y0, const AxisFilter& fx,
                  const AxisFilter& fy, uint8_t* dst, ptrdiff_t dst_stride, ResizeScratch* scratch) {
  const int out_w = static_cast<int>(fx.first.size());
  const int out_h = static_cast<int>(fy.first.size());
  const int src_rows = fy.need_hi - fy.need_lo;
  const int src_cols = fx.need_hi - fx.need_lo;
  // The horizontal pass costs more per pixel: run it on whichever is fewer, the
  // source rows (horizontal first) or the output rows (vertical first).
  if (src_rows <= out_h) {
    const ptrdiff_t tmp_stride = static_cast<ptrdiff_t>(out_w) * 3;
    scratch->tmp.resize(static_cast<size_t>(src_rows) * tmp_stride + kResizePadding);
    horizontal_pass(src + (fy.need_lo - src_y0) * src_stride, src_stride, src_x0, src_rows, fx,
                    scratch->tmp.data(), tmp_stride);
    vertical_pass(scratch->tmp.data(), tmp_stride, fy.need_lo, out_w * 3, fy, dst, dst_stride);
  } else {
    const ptrdiff_t tmp_stride = static_cast<ptrdiff_t>(src_cols) * 3;
    scratch->tmp.resize(static_cast<size_t>(out_h) * tmp_stride + kResizePadding);
    vertical_pass(src + (fx.need_lo - src_x0) * 3, src_stride, src_y0, src_cols * 3, fy, scratch->tmp.data(),
                  tmp_stride);
    horizontal_pass(scratch->tmp.data(), tmp_stride, fx.need_lo, out_h, fx, dst, dst_stride);
  }
}

}  // namespace fastdata
