// libFuzzer target "decode": the whole-image decode (fastdata.decode: decode_full, with EXIF
// orientation), into a buffer of exactly the size it asked for (ASan sees any overrun).
//
// Input: the file's bytes. Oracles beyond "no crash":
//  - a lenient decode that warned must fail when strict (strict mode's promise);
//  - FastHuffman against libjpeg-turbo's own Huffman decoder: when neither warns, the
//    pixels must be identical (huffman.h: on valid data it yields libjpeg's coefficients);
//    for progressive files also when they warn (huffman_progressive.cpp follows libjpeg's
//    progressive decoder on damaged data too; its baseline decoder has a fast path whose
//    damaged-data quirks FastHuffman does not copy, see design.md).
#include <vector>

#include "core/sample.h"
#include "fuzz_common.h"

namespace {

struct Decoded {
  std::vector<uint8_t> pixels;
  int h = 0, w = 0, warnings = 0;
};

bool decode(const uint8_t* data, size_t size, bool strict, bool fast_huffman, fastdata::SampleScratch* s,
            Decoded* out) {
  s->decoder.set_fast_huffman(fast_huffman);
  return fuzz::expected_or_ok([&] {
    out->warnings = fastdata::decode_full(data, size, strict, fuzz::kDecodeMaxPixels, s, [&](int h, int w) {
      FUZZ_CHECK(h >= 1 && w >= 1, "alloc(%d, %d)", h, w);
      out->h = h, out->w = w;
      out->pixels.assign(static_cast<size_t>(h) * w * 3, 0);  // exact size: no slack for an overrun
      return out->pixels.data();
    });
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fastdata::SampleScratch scratch;  // reused, as each engine thread does
  Decoded fast;
  if (!decode(data, size, false, true, &scratch, &fast)) return 0;
  // Both Huffman decoders only for images small enough to keep the run fast.
  const bool small = static_cast<int64_t>(fast.h) * fast.w <= (1 << 18);
  if (fast.warnings > 0) {
    Decoded strict;
    FUZZ_CHECK(!decode(data, size, true, true, &scratch, &strict),
               "lenient decode warned %d times, strict decode succeeded", fast.warnings);
    bool progressive = false;
    fuzz::expected_or_ok([&] { progressive = scratch.decoder.read_header(data, size, false).progressive; });
    Decoded plain;
    if (small && progressive && decode(data, size, false, false, &scratch, &plain)) {
      FUZZ_CHECK(plain.pixels == fast.pixels, "FastHuffman and libjpeg differ on a damaged progressive %dx%d decode",
                 fast.h, fast.w);
    }
    return 0;
  }
  if (!small) return 0;
  Decoded plain;
  if (!decode(data, size, false, false, &scratch, &plain) || plain.warnings > 0) return 0;
  FUZZ_CHECK(plain.h == fast.h && plain.w == fast.w, "size %dx%d vs %dx%d", plain.h, plain.w, fast.h, fast.w);
  FUZZ_CHECK(plain.pixels == fast.pixels, "FastHuffman and libjpeg's Huffman decoder differ on a clean %dx%d decode",
             fast.h, fast.w);
  return 0;
}
