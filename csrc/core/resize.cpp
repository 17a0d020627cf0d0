#include "core/resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define FASTDATA_X86 1
#endif

namespace fastdata {
namespace {

inline uint8_t clip8(int32_t v) {
  v >>= kResizeBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Horizontal pass over `rows` rows: out pixel k of a row = sum_t w[k,t] * in[first[k] + t].
void horizontal_pass_scalar(const uint8_t* src, ptrdiff_t src_stride, int x_origin, int rows, const AxisFilter& fx,
                            uint8_t* dst, ptrdiff_t dst_stride) {
  const int out = static_cast<int>(fx.first.size());
  const int taps = fx.taps;
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = src + y * src_stride;
    uint8_t* o = dst + y * dst_stride;
    for (int k = 0; k < out; ++k) {
      const int32_t* w = fx.weights.data() + static_cast<size_t>(k) * taps;
      const uint8_t* p = in + static_cast<ptrdiff_t>(fx.first[k] - x_origin) * 3;
      int32_t r = 1 << (kResizeBits - 1), g = r, b = r;
      const int n = fx.count[k];
      for (int t = 0; t < n; ++t) {
        r += w[t] * p[3 * t];
        g += w[t] * p[3 * t + 1];
        b += w[t] * p[3 * t + 2];
      }
      o[3 * k] = clip8(r);
      o[3 * k + 1] = clip8(g);
      o[3 * k + 2] = clip8(b);
    }
  }
}

#ifdef FASTDATA_X86
// The same arithmetic (bit-identical) with one pixel's three channels in one register:
// each tap is a 4-byte load, widen, multiply, add. Reads one byte past a tap's pixel,
// hence the padding precondition in resize.h.
__attribute__((target("sse4.1"))) void horizontal_pass_sse41(const uint8_t* src, ptrdiff_t src_stride, int x_origin,
                                                             int rows, const AxisFilter& fx, uint8_t* dst,
                                                             ptrdiff_t dst_stride) {
  const int out = static_cast<int>(fx.first.size());
  const int taps = fx.taps;
  const __m128i half = _mm_set1_epi32(1 << (kResizeBits - 1));
  const __m128i zero = _mm_setzero_si128();
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = src + y * src_stride;
    uint8_t* o = dst + y * dst_stride;
    for (int k = 0; k < out; ++k) {
      const int32_t* w = fx.weights.data() + static_cast<size_t>(k) * taps;
      const uint8_t* p = in + static_cast<ptrdiff_t>(fx.first[k] - x_origin) * 3;
      const int n = fx.count[k];
      __m128i acc = half;
      for (int t = 0; t < n; ++t) {
        int32_t v;
        std::memcpy(&v, p + 3 * t, 4);
        const __m128i px = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(v));
        acc = _mm_add_epi32(acc, _mm_mullo_epi32(px, _mm_set1_epi32(w[t])));
      }
      acc = _mm_srai_epi32(acc, kResizeBits);
      const __m128i packed = _mm_packus_epi16(_mm_packus_epi32(acc, zero), zero);  // clamps to 0..255
      const uint32_t rgb = static_cast<uint32_t>(_mm_cvtsi128_si32(packed));
      if (k + 1 < out) {
        std::memcpy(o + 3 * k, &rgb, 4);  // the 4th byte is overwritten by pixel k + 1
      } else {
        std::memcpy(o + 3 * k, &rgb, 3);
      }
    }
  }
}
#endif

void horizontal_pass(const uint8_t* src, ptrdiff_t src_stride, int x_origin, int rows, const AxisFilter& fx,
                     uint8_t* dst, ptrdiff_t dst_stride) {
#ifdef FASTDATA_X86
  static const bool sse41 = __builtin_cpu_supports("sse4.1");
  if (sse41) {
    horizontal_pass_sse41(src, src_stride, x_origin, rows, fx, dst, dst_stride);
    return;
  }
#endif
  horizontal_pass_scalar(src, src_stride, x_origin, rows, fx, dst, dst_stride);
}

// Vertical pass: out row k = sum_t w[k,t] * in row (first[k] + t); rows are `width` bytes.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx2", "default")))
#endif
void vertical_pass(const uint8_t* src, ptrdiff_t src_stride, int y_origin, int width, const AxisFilter& fy,
                   uint8_t* dst, ptrdiff_t dst_stride) {
  const int out = static_cast<int>(fy.first.size());
  const int taps = fy.taps;
  int32_t acc[1024];
  for (int k = 0; k < out; ++k) {
    const int32_t* w = fy.weights.data() + static_cast<size_t>(k) * taps;
    const uint8_t* base = src + static_cast<ptrdiff_t>(fy.first[k] - y_origin) * src_stride;
    uint8_t* o = dst + k * dst_stride;
    const int n = fy.count[k];
    // Column blocks keep the accumulators in L1 and let the compiler vectorize the taps loop.
    for (int x0 = 0; x0 < width; x0 += 1024) {
      const int bw = std::min(1024, width - x0);
      for (int x = 0; x < bw; ++x) acc[x] = 1 << (kResizeBits - 1);
      for (int t = 0; t < n; ++t) {
        const uint8_t* row = base + t * src_stride + x0;
        const int32_t wt = w[t];
        for (int x = 0; x < bw; ++x) acc[x] += wt * row[x];
      }
      for (int x = 0; x < bw; ++x) o[x0 + x] = clip8(acc[x]);
    }
  }
}

}  // namespace

void build_axis_filter(const AxisMap& map, int size, bool reverse, AxisFilter* f) {
  // Pillow's precompute_coeffs with the triangle (bilinear) filter, support 1 widened by
  // the downscale factor so that reductions are antialiased; reads limited to [lo, hi).
  const int lo = std::max(0, static_cast<int>(std::floor(map.lo)));
  const int hi = std::min(size, static_cast<int>(std::ceil(map.hi)));
  const double scale = map.scale;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  const int out = map.out;
  f->taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  f->first.assign(out, 0);
  f->count.assign(out, 0);
  f->weights.assign(static_cast<size_t>(out) * f->taps, 0);
  f->need_lo = hi;
  f->need_hi = lo;
  std::vector<double> k(f->taps);
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
      k[x] = d < 1.0 ? 1.0 - d : 0.0;
      ww += k[x];
    }
    if (ww == 0) {  // degenerate: nearest pixel
      for (int x = 0; x < n; ++x) k[x] = 0;
      k[0] = 1;
      ww = 1;
    }
    const int dst = reverse ? out - 1 - xx : xx;
    int32_t* w = f->weights.data() + static_cast<size_t>(dst) * f->taps;
    for (int x = 0; x < n; ++x) {
      const double v = k[x] / ww * (1 << kResizeBits);
      w[x] = static_cast<int32_t>(v < 0 ? std::trunc(v - 0.5) : std::trunc(v + 0.5));
    }
    f->first[dst] = lo + xmin;
    f->count[dst] = n;
    f->need_lo = std::min(f->need_lo, lo + xmin);
    f->need_hi = std::max(f->need_hi, lo + xmin + n);
  }
}

void resample_rgb(const uint8_t* src, ptrdiff_t src_stride, int src_x0, int src_y0, const AxisFilter& fx,
                  const AxisFilter& fy, uint8_t* dst, ptrdiff_t dst_stride, ResizeScratch* scratch) {
  const int out_w = static_cast<int>(fx.first.size());
  const int out_h = static_cast<int>(fy.first.size());
  const int src_rows = fy.need_hi - fy.need_lo;
  const int src_cols = fx.need_hi - fx.need_lo;
  // The horizontal pass is the scalar, expensive one: run it on whichever is fewer, the
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
