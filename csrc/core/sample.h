// One sample's path: header -> crop plan -> ROI/DCT-scaled decode -> orient -> resize+flip
// -> caller's output row. Single-threaded; the engine runs many of these in parallel.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/augment.h"
#include "core/decoder.h"
#include "core/resize.h"

namespace fastdata {

// Per-thread state reused between samples: no allocation in steady state.
struct SampleScratch {
  JpegDecoder decoder;
  ResizeScratch resize;
  AxisFilter fx, fy;
  std::vector<uint8_t> oriented;  // crop region after EXIF orientation (orientations 2..8 only)
  std::vector<uint8_t> row_u8;    // one uint8 output row, when the batch output is float
};

struct SampleKey {
  uint64_t seed = 0, epoch = 0, index = 0;
};

// Throws DecodeError. `out` receives spec.out_h rows of spec.out_w RGB pixels, contiguous.
// Returns the number of libjpeg corrupt-data warnings (0 when strict: warnings throw).
int transform_jpeg(const uint8_t* data, size_t size, const TransformSpec& spec, const SampleKey& key, bool strict,
                   int64_t max_pixels, uint8_t* out, SampleScratch* scratch);

// The same crop/resize/flip for pixels decoded elsewhere (the Pillow fallback):
// an oriented RGB image of h x w, rows `stride` bytes apart.
void transform_pixels(const uint8_t* rgb, int h, int w, ptrdiff_t stride, const TransformSpec& spec,
                      const SampleKey& key, uint8_t* out, SampleScratch* scratch);

// Full decode with EXIF orientation applied. `alloc(h, w)` returns the destination for
// h rows of w RGB pixels (contiguous); it is called once, after the header is read.
template <typename Alloc>
int decode_full(const uint8_t* data, size_t size, bool strict, int64_t max_pixels, SampleScratch* scratch,
                Alloc alloc);

// Entropy-decodes the rows a transform_jpeg of this sample would need, and nothing else:
// the floor that no decoder of these rows can beat. Benchmarks only.
void entropy_floor(const uint8_t* data, size_t size, const TransformSpec& spec, const SampleKey& key,
                   SampleScratch* scratch);

// The stored region a transform_jpeg of this sample decodes: DCT scale 1/denom and rows
// [y0, y1), columns [x0, x1) of the scaled stored image. Also builds scratch->fx/fy, the
// filters in oriented scaled coordinates. Public for the fuzz harness (fuzz/fuzz_plan.cpp).
struct RegionPlan {
  int denom = 1;
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};
RegionPlan plan_region(const JpegInfo& info, const TransformSpec& spec, const SampleKey& key,
                       SampleScratch* scratch);

// ---- implementation details shared with decode_full ----
void check_pixel_limit(const JpegInfo& info, int64_t max_pixels);
// Copies oriented pixels [ox0, ox1) x [oy0, oy1) of a region in JpegDecoder's own buffer
// (decode_region without a destination: it is padded, and the copy reads a byte past a pixel).
void copy_oriented(const DecodedRegion& region, int orientation, int ox0, int oy0, int ox1, int oy1,
                   uint8_t* dst, ptrdiff_t dst_stride);

template <typename Alloc>
int decode_full(const uint8_t* data, size_t size, bool strict, int64_t max_pixels, SampleScratch* scratch,
                Alloc alloc) {
  JpegDecoder& dec = scratch->decoder;
  const JpegInfo info = dec.read_header(data, size, strict);
  check_pixel_limit(info, max_pixels);
  const int ow = info.oriented_width(), oh = info.oriented_height();
  uint8_t* dst = alloc(oh, ow);
  if (info.orientation == 1) {
    dec.decode_region(1, 0, 0, info.width, info.height, dst, static_cast<ptrdiff_t>(ow) * 3);
  } else {
    const DecodedRegion region = dec.decode_region(1, 0, 0, info.width, info.height);
    copy_oriented(region, info.orientation, 0, 0, ow, oh, dst, static_cast<ptrdiff_t>(ow) * 3);
  }
  return dec.warnings();
}

}  // namespace fastdata
