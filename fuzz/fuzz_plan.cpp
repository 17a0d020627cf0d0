// libFuzzer target "plan": the crop plan, without decoding pixels.
//
// Input: a 32-byte parameter block (fuzz_common.h: transform spec with outputs up to
// 2048 x 2048 (larger ones only cost time), seed/epoch/index, then
// stored height, width and EXIF orientation), optionally followed by JPEG bytes. With JPEG
// bytes the image's own header decides the size and orientation, as in Engine::plan
// (read_header, pixel limit, plan_resize); without, the block does, so sizes up to the
// engine's pixel limit are planned without building such a file.
//
// Checks what the decode path relies on: the filters of plan_region read only pixels of
// the (DCT-scaled, oriented) image; the stored region it asks libjpeg for lies inside the
// scaled image and covers every pixel the filters read.
#include <algorithm>
#include <cmath>

#include "core/exif.h"
#include "core/sample.h"
#include "fuzz_common.h"

namespace {

void check_filter(const fastdata::AxisFilter& f, int out, int size, const char* axis) {
  FUZZ_CHECK(static_cast<int>(f.first.size()) == out && static_cast<int>(f.count.size()) == out,
             "%s: %zu filter entries for %d outputs", axis, f.first.size(), out);
  FUZZ_CHECK(0 <= f.need_lo && f.need_lo < f.need_hi && f.need_hi <= size, "%s: reads [%d, %d) of %d pixels",
             axis, f.need_lo, f.need_hi, size);
  for (int k = 0; k < out; ++k) {
    FUZZ_CHECK(f.count[k] >= 1 && f.count[k] <= f.taps, "%s: output %d has %d taps (max %d)", axis, k, f.count[k],
               f.taps);
    FUZZ_CHECK(f.first[k] >= f.need_lo && f.first[k] + f.count[k] <= f.need_hi,
               "%s: output %d reads [%d, %d) outside [%d, %d)", axis, k, f.first[k], f.first[k] + f.count[k],
               f.need_lo, f.need_hi);
  }
}

void plan_one(const fastdata::JpegInfo& info, const fuzz::FuzzSpec& fs, fastdata::SampleScratch* s) {
  const fastdata::SampleKey key{fs.seed, fs.epoch, fs.index};
  // Engine::plan's part: the crop box in oriented coordinates.
  const fastdata::ResizePlan rp =
      fastdata::plan_resize(info.oriented_height(), info.oriented_width(), fs.spec, fs.seed, fs.epoch, fs.index);
  FUZZ_CHECK(rp.x.out == fs.spec.out_w && rp.y.out == fs.spec.out_h, "plan output %dx%d, spec %dx%d", rp.y.out,
             rp.x.out, fs.spec.out_h, fs.spec.out_w);
  // Filter tables hold out x taps weights, taps ~ 2 x (source pixels per output pixel), and
  // building them loops over every tap: past 256K weights an axis costs milliseconds under
  // coverage instrumentation (a CenterCrop with a tiny `resize` and a large output reaches
  // hundreds of MB, legal and only slow). Those are planned without the filters.
  for (const fastdata::AxisMap* a : {&rp.x, &rp.y}) {
    const double taps = 2 * std::ceil(std::max(a->scale, 1.0)) + 1;
    if (!(taps * a->out <= (1 << 18))) return;
  }
  // transform_jpeg's part: DCT scale, filters, stored region.
  const fastdata::RegionPlan r = fastdata::plan_region(info, fs.spec, key, s);
  const int d = r.denom;
  FUZZ_CHECK(d == 1 || d == 2 || d == 4 || d == 8, "denom %d", d);
  const int sw = (info.width + d - 1) / d, sh = (info.height + d - 1) / d;
  const bool transposed = fastdata::orientation_transposes(info.orientation);
  check_filter(s->fx, fs.spec.out_w, transposed ? sh : sw, "x");
  check_filter(s->fy, fs.spec.out_h, transposed ? sw : sh, "y");
  FUZZ_CHECK(0 <= r.x0 && r.x0 < r.x1 && r.x1 <= sw && 0 <= r.y0 && r.y0 < r.y1 && r.y1 <= sh,
             "region [%d,%d)x[%d,%d) outside %dx%d", r.x0, r.x1, r.y0, r.y1, sw, sh);
  // Every corner of the rectangle the filters read lies in the region (it is a rectangle in
  // both coordinate systems, so the corners suffice).
  const fastdata::OrientationMap m = fastdata::orientation_map(info.orientation, sw, sh);
  for (int ox : {s->fx.need_lo, s->fx.need_hi - 1}) {
    for (int oy : {s->fy.need_lo, s->fy.need_hi - 1}) {
      const int sx = m.ax * ox + m.bx * oy + m.cx, sy = m.ay * ox + m.by * oy + m.cy;
      FUZZ_CHECK(r.x0 <= sx && sx < r.x1 && r.y0 <= sy && sy < r.y1,
                 "oriented (%d, %d) -> stored (%d, %d) outside region [%d,%d)x[%d,%d)", ox, oy, sx, sy, r.x0, r.x1,
                 r.y0, r.y1);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fastdata::SampleScratch scratch;  // reused, as each engine thread does
  fuzz::Params p(data, size);
  const fuzz::FuzzSpec fs = fuzz::read_spec(p, 2048);
  fastdata::JpegInfo info;
  info.width = 1 + static_cast<int>(p.u16());
  info.height = 1 + static_cast<int>(p.u16());
  info.orientation = 1 + static_cast<int>(p.u8() % 8);
  const uint8_t* jpeg = data + std::min(size, fuzz::Params::kSize);
  const size_t jpeg_size = size - std::min(size, fuzz::Params::kSize);
  fuzz::expected_or_ok([&] {
    if (jpeg_size > 0) info = scratch.decoder.read_header(jpeg, jpeg_size, false);
    fastdata::check_pixel_limit(info, fuzz::kEngineMaxPixels);
    plan_one(info, fs, &scratch);
  });
  return 0;
}
