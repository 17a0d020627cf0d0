// libFuzzer target "probe": header reading (fastdata.probe, the first step of every decode)
// and the EXIF orientation parser it uses.
//
// Input: any bytes, as a file's contents. Checks: the header fields are in range, strict
// and lenient header reads agree when both succeed, the EXIF parser returns 1..8 for any
// bytes, and the orientation map sends the oriented image's corners into the stored image.
#include <iterator>

#include "core/exif.h"
#include "core/sample.h"
#include "fuzz_common.h"

namespace {

void check_info(const fastdata::JpegInfo& info) {
  FUZZ_CHECK(info.width >= 1 && info.height >= 1, "size %dx%d", info.width, info.height);
  FUZZ_CHECK(info.components >= 1 && info.components <= 10, "%d components", info.components);
  FUZZ_CHECK(info.orientation >= 1 && info.orientation <= 8, "orientation %d", info.orientation);
  FUZZ_CHECK(static_cast<size_t>(info.subsampling) < std::size(fastdata::kSubsamplingNames), "subsampling out of range");
  FUZZ_CHECK((info.components == 1) == (info.subsampling == fastdata::Subsampling::kGray),
             "%d components but subsampling %s", info.components, fastdata::subsampling_name(info.subsampling));
  const fastdata::OrientationMap m = fastdata::orientation_map(info.orientation, info.width, info.height);
  const int ow = info.oriented_width(), oh = info.oriented_height();
  for (int ox : {0, ow - 1}) {
    for (int oy : {0, oh - 1}) {
      const long long sx = static_cast<long long>(m.ax) * ox + static_cast<long long>(m.bx) * oy + m.cx;
      const long long sy = static_cast<long long>(m.ay) * ox + static_cast<long long>(m.by) * oy + m.cy;
      FUZZ_CHECK(0 <= sx && sx < info.width && 0 <= sy && sy < info.height,
                 "orientation %d maps (%d, %d) to (%lld, %lld) outside %dx%d", info.orientation, ox, oy, sx, sy,
                 info.width, info.height);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fastdata::JpegDecoder decoder;  // reused, as the bindings' thread_scratch() is
  const int o = fastdata::parse_exif_orientation(data, size);
  FUZZ_CHECK(o >= 1 && o <= 8, "parse_exif_orientation returned %d", o);

  fastdata::JpegInfo lenient, strict;
  const bool ok_lenient = fuzz::expected_or_ok([&] { lenient = decoder.read_header(data, size, false); });
  if (ok_lenient) check_info(lenient);
  const bool ok_strict = fuzz::expected_or_ok([&] { strict = decoder.read_header(data, size, true); });
  if (ok_strict) {
    check_info(strict);
    FUZZ_CHECK(ok_lenient, "strict header read succeeded where the lenient one failed");
    FUZZ_CHECK(strict.width == lenient.width && strict.height == lenient.height &&
                   strict.components == lenient.components && strict.orientation == lenient.orientation &&
                   strict.progressive == lenient.progressive && strict.subsampling == lenient.subsampling,
               "strict and lenient header reads disagree");
  }
  return 0;
}
