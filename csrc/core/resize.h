// Antialiased bilinear resampling of interleaved RGB, Pillow's algorithm in fixed point,
// with the horizontal flip folded into the filter tables. Writes into caller memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/augment.h"

namespace fastdata {

// Filter taps for one axis: output k reads `count[k]` source pixels from `first[k]`.
// Both passes use 14-bit weights (Pillow uses 22): vertical passes read them from `weights`
// (one int32 per tap; two rows share one int16 multiply-add). Horizontal passes use
// `weights16` (the same values, int16) so that two taps of all three channels go through one
// multiply-add: for each group of 4 taps, two 8-lane vectors (w0 w1 w0 w1 w0 w1 0 0) and
// (w2 w3 w2 w3 w2 w3 0 0), zero past count[k], stored pairwise for output pixels 2q and
// 2q+1 so that one 256-bit load serves both (see w16_offset).
struct AxisFilter {
  std::vector<int> first, count;
  std::vector<int32_t> weights;   // out * taps, 14-bit
  std::vector<int16_t> weights16;  // ceil(out / 2) * groups * 32
  int taps = 0;
  int groups = 0;                // ceil(taps / 4)
  int max_count = 0;             // max of count[k]
  int need_lo = 0, need_hi = 0;  // source pixels read, [need_lo, need_hi)
};

// Where output pixel k's first vector of tap group g starts in weights16; the second
// vector is 16 entries later.
inline size_t w16_offset(int k, int g, int groups) {
  return (static_cast<size_t>(k / 2) * groups + g) * 32 + (k % 2) * 8;
}

constexpr int kResizeBits16 = 14;  // int16 weights: 1.0 == 16384 still fits
// Source buffers must stay readable this many bytes past their last pixel (SIMD loads).
constexpr size_t kResizePadding = 64;

// Builds the filter for `map` on a source axis of `size` pixels; `reverse` mirrors the output.
// simd_weights: also fill weights16 (the CPU resampler's SIMD layout); the GPU resampler's
// tables (_C.axis_filters) need only first/count/weights.
void build_axis_filter(const AxisMap& map, int size, bool reverse, AxisFilter* filter, bool simd_weights = true);

// Scratch reused across calls on one thread (no allocation in steady state).
struct ResizeScratch {
  std::vector<uint8_t> tmp;
};

// Resamples a source region into dst. The region holds source pixels (x, y) for
// x in [src_x0, ...), y in [src_y0, ...) at src + (y - src_y0) * src_stride + (x - src_x0) * 3,
// and must cover [fx.need_lo, fx.need_hi) x [fy.need_lo, fy.need_hi), plus kResizePadding
// readable bytes after the last pixel. dst receives
// fy.first.size() rows of fx.first.size() RGB pixels, rows `dst_stride` bytes apart.
void resample_rgb(const uint8_t* src, ptrdiff_t src_stride, int src_x0, int src_y0, const AxisFilter& fx,
                  const AxisFilter& fy, uint8_t* dst, ptrdiff_t dst_stride, ResizeScratch* scratch);

}  // namespace fastdata
