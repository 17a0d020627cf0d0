#include "core/sample.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/exif.h"

namespace fastdata {

RegionPlan plan_region(const JpegInfo& info, const TransformSpec& spec, const SampleKey& key,
                       SampleScratch* s) {
  const int ow = info.oriented_width(), oh = info.oriented_height();
  ResizePlan plan = plan_resize(oh, ow, spec, key.seed, key.epoch, key.index);
  RegionPlan r;
  if (spec.roi) {
    // DCT scaling replaces the first halvings of the resize: use 1/d while the crop is
    // still at least d times the output on both axes (libjpeg-turbo's SIMD scales).
    for (int d : {8, 4, 2}) {
      if (plan.x.scale >= d && plan.y.scale >= d) {
        r.denom = d;
        break;
      }
    }
  }
  const int d = r.denom;
  if (d > 1) {
    for (AxisMap* a : {&plan.x, &plan.y}) {
      a->start /= d;
      a->scale /= d;
      a->lo /= d;
      a->hi /= d;
    }
  }
  const int sw = (info.width + d - 1) / d, sh = (info.height + d - 1) / d;
  if (d > 1) {
    // The scaled image has ceil(n / d) pixels, its last one partial. Along an axis that the
    // orientation mirrors, that partial pixel comes first, which shifts the oriented grid
    // by ceil(n / d) - n / d scaled pixels.
    const OrientationMap signs = orientation_map(info.orientation, 1, 1);
    auto shift_if_mirrored = [d](AxisMap* a, bool mirrored, int n) {
      if (!mirrored) return;
      const double off = (n + d - 1) / d - static_cast<double>(n) / d;
      a->start += off;
      a->lo += off;
      a->hi += off;
    };
    shift_if_mirrored(&plan.x, signs.ax < 0 || signs.ay < 0, signs.ax != 0 ? info.width : info.height);
    shift_if_mirrored(&plan.y, signs.bx < 0 || signs.by < 0, signs.bx != 0 ? info.width : info.height);
  }
  const bool transposed = orientation_transposes(info.orientation);
  const int osw = transposed ? sh : sw, osh = transposed ? sw : sh;
  build_axis_filter(plan.x, osw, plan.flip, &s->fx);
  build_axis_filter(plan.y, osh, false, &s->fy);
  if (!spec.roi) {
    r.x0 = 0, r.y0 = 0, r.x1 = sw, r.y1 = sh;
    return r;
  }
  // The oriented rectangle the filters read, mapped back to stored coordinates.
  const OrientationMap m = orientation_map(info.orientation, sw, sh);
  const int oxs[2] = {s->fx.need_lo, s->fx.need_hi - 1}, oys[2] = {s->fy.need_lo, s->fy.need_hi - 1};
  r.x0 = sw, r.y0 = sh, r.x1 = 0, r.y1 = 0;
  for (int ox : oxs) {
    for (int oy : oys) {
      const int sx = m.ax * ox + m.bx * oy + m.cx, sy = m.ay * ox + m.by * oy + m.cy;
      r.x0 = std::min(r.x0, sx), r.x1 = std::max(r.x1, sx + 1);
      r.y0 = std::min(r.y0, sy), r.y1 = std::max(r.y1, sy + 1);
    }
  }
  // One more pixel on each side: fancy chroma upsampling reads neighbours, and without
  // them the edge pixels would differ from a full decode.
  r.x0 = std::max(r.x0 - 1, 0), r.y0 = std::max(r.y0 - 1, 0);
  r.x1 = std::min(r.x1 + 1, sw), r.y1 = std::min(r.y1 + 1, sh);
  return r;
}

void check_pixel_limit(const JpegInfo& info, int64_t max_pixels) {
  const int64_t pixels = static_cast<int64_t>(info.width) * info.height;
  if (max_pixels > 0 && pixels > max_pixels) {
    char msg[200];
    std::snprintf(msg, sizeof(msg),
                  "image is %dx%d = %lld pixels, above the limit of %lld (decompression bomb guard; "
                  "raise max_pixels to allow it)",
                  info.width, info.height, static_cast<long long>(pixels), static_cast<long long>(max_pixels));
    throw DecodeError(msg);
  }
}

void copy_oriented(const DecodedRegion& region, int orientation, int ox0, int oy0, int ox1, int oy1,
                   uint8_t* dst, ptrdiff_t dst_stride) {
  const OrientationMap m = orientation_map(orientation, region.scaled_width, region.scaled_height);
  const int n = ox1 - ox0;
  auto move3 = [](uint8_t* q, const uint8_t* p) {
    q[0] = p[0];
    q[1] = p[1];
    q[2] = p[2];
  };
  auto stored = [&](int ox, int oy) {  // the stored pixel shown at oriented (ox, oy)
    return region.pixels + static_cast<ptrdiff_t>(m.ay * ox + m.by * oy + m.cy - region.y0) * region.stride +
           static_cast<ptrdiff_t>(m.ax * ox + m.bx * oy + m.cx - region.x0) * 3;
  };
  if (m.ay == 0) {
    // Orientations 1-4: an output row is part of one stored row, forwards or backwards.
    for (int oy = oy0; oy < oy1; ++oy) {
      uint8_t* o = dst + (oy - oy0) * dst_stride;
      const uint8_t* p = stored(ox0, oy);
      if (m.ax > 0) {
        std::memcpy(o, p, static_cast<size_t>(n) * 3);
      } else {
        for (int i = 0; i < n; ++i, o += 3, p -= 3) move3(o, p);
      }
    }
    return;
  }
  // Orientations 5-8: an output row is part of one stored column. Eight output rows at a
  // time, so that each stored row is read once per eight (24 adjacent bytes) instead of
  // once per output row, a cache line apart for every pixel. A pixel moves as 4 bytes: the
  // extra byte read is the next pixel's or the region's padding (decode_region pads it), and
  // the extra byte written is the next output pixel's, written after it; the last column
  // moves 3 bytes, since the output may end there (decode_full's array).
  constexpr int kRows = 8;
  const ptrdiff_t next = m.bx * 3;  // from one output row's pixel to the next row's, in the stored row
  auto move4 = [](uint8_t* q, const uint8_t* p) { std::memcpy(q, p, 4); };
  for (int oy = oy0; oy < oy1; oy += kRows) {
    const int rows = std::min(kRows, oy1 - oy);
    uint8_t* o = dst + (oy - oy0) * dst_stride;
    for (int ox = ox0; ox < ox1; ++ox, o += 3) {
      const uint8_t* p = stored(ox, oy);
      if (rows == kRows && ox + 1 < ox1) {
        for (int r = 0; r < kRows; ++r) move4(o + r * dst_stride, p + r * next);
      } else {
        for (int r = 0; r < rows; ++r) move3(o + r * dst_stride, p + r * next);
      }
    }
  }
}

int transform_jpeg(const uint8_t* data, size_t size, const TransformSpec& spec, const SampleKey& key, bool strict,
                   int64_t max_pixels, uint8_t* out, SampleScratch* s) {
  JpegDecoder& dec = s->decoder;
  const JpegInfo info = dec.read_header(data, size, strict);
  check_pixel_limit(info, max_pixels);
  const RegionPlan r = plan_region(info, spec, key, s);
  const DecodedRegion region = dec.decode_region(r.denom, r.x0, r.y0, r.x1, r.y1);
  const ptrdiff_t out_stride = static_cast<ptrdiff_t>(spec.out_w) * 3;
  if (info.orientation == 1) {
    resample_rgb(region.pixels, region.stride, region.x0, region.y0, s->fx, s->fy, out, out_stride, &s->resize);
  } else {
    // Orient only the pixels the filters read, then resample rows as usual.
    const int w = s->fx.need_hi - s->fx.need_lo, h = s->fy.need_hi - s->fy.need_lo;
    s->oriented.resize(static_cast<size_t>(w) * h * 3 + kResizePadding);
    copy_oriented(region, info.orientation, s->fx.need_lo, s->fy.need_lo, s->fx.need_hi, s->fy.need_hi,
                  s->oriented.data(), static_cast<ptrdiff_t>(w) * 3);
    resample_rgb(s->oriented.data(), static_cast<ptrdiff_t>(w) * 3, s->fx.need_lo, s->fy.need_lo, s->fx, s->fy,
                 out, out_stride, &s->resize);
  }
  return dec.warnings();
}

void transform_pixels(const uint8_t* rgb, int h, int w, ptrdiff_t stride, const TransformSpec& spec,
                      const SampleKey& key, uint8_t* out, SampleScratch* s) {
  const ResizePlan plan = plan_resize(h, w, spec, key.seed, key.epoch, key.index);
  build_axis_filter(plan.x, w, plan.flip, &s->fx);
  build_axis_filter(plan.y, h, false, &s->fy);
  // Caller-owned pixels carry no padding for the SIMD loads: copy the rows read (rare path).
  const int rows = s->fy.need_hi - s->fy.need_lo;
  const size_t row_bytes = static_cast<size_t>(w) * 3;
  s->oriented.resize(rows * row_bytes + kResizePadding);
  for (int y = 0; y < rows; ++y) {
    std::memcpy(s->oriented.data() + y * row_bytes, rgb + (s->fy.need_lo + y) * stride, row_bytes);
  }
  resample_rgb(s->oriented.data(), static_cast<ptrdiff_t>(row_bytes), 0, s->fy.need_lo, s->fx, s->fy, out,
               static_cast<ptrdiff_t>(spec.out_w) * 3, &s->resize);
}

void entropy_floor(const uint8_t* data, size_t size, const TransformSpec& spec, const SampleKey& key,
                   SampleScratch* s) {
  JpegDecoder& dec = s->decoder;
  const JpegInfo info = dec.read_header(data, size, false);
  const RegionPlan r = plan_region(info, spec, key, s);
  dec.skip_rows(std::min(info.height, r.y1 * r.denom));
}

}  // namespace fastdata
