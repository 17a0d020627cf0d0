// libFuzzer target "crop": the fused RandomResizedCrop/CenterCrop decode (transform_jpeg:
// header, crop plan, ROI + DCT-scaled decode, orientation, resize and flip), the path of
// every Loader sample, into an output of exactly out_h x out_w x 3 bytes.
//
// Input: a 32-byte parameter block (fuzz_common.h; outputs up to 512 x 512) followed by the
// JPEG bytes. Flag bits of the block: roi off (bit 0, as Loader(roi=False)); strict (bit 1).
// Oracles beyond "no crash", as in fuzz_decode.cpp: a lenient decode that warned fails when
// strict; FastHuffman and libjpeg's Huffman decoder give the same pixels when neither warns.
// Run it once more with FASTDATA_FORCE_SCALAR=1 for the resampler's baseline x86-64 loops
// (the choice is made once per process: cpu_features.h).
#include <algorithm>
#include <vector>

#include "core/sample.h"
#include "fuzz_common.h"

namespace {

bool crop(const uint8_t* data, size_t size, const fuzz::FuzzSpec& fs, bool strict, bool fast_huffman,
          fastdata::SampleScratch* s, std::vector<uint8_t>* out, int* warnings) {
  s->decoder.set_fast_huffman(fast_huffman);
  out->assign(static_cast<size_t>(fs.spec.out_h) * fs.spec.out_w * 3, 0);  // exact size
  const fastdata::SampleKey key{fs.seed, fs.epoch, fs.index};
  return fuzz::expected_or_ok([&] {
    *warnings = fastdata::transform_jpeg(data, size, fs.spec, key, strict, fuzz::kDecodeMaxPixels, out->data(), s);
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fastdata::SampleScratch scratch;  // reused, as each engine thread does
  fuzz::Params p(data, size);
  const fuzz::FuzzSpec fs = fuzz::read_spec(p, 512);
  const bool strict = (fs.flags & 2) != 0;
  const uint8_t* jpeg = data + std::min(size, fuzz::Params::kSize);
  const size_t jpeg_size = size - std::min(size, fuzz::Params::kSize);

  std::vector<uint8_t> fast, plain;
  int fast_warnings = 0, plain_warnings = 0;
  if (!crop(jpeg, jpeg_size, fs, strict, true, &scratch, &fast, &fast_warnings)) return 0;
  FUZZ_CHECK(!strict || fast_warnings == 0, "strict crop returned %d warnings", fast_warnings);
  if (fast_warnings > 0) {
    int w = 0;
    FUZZ_CHECK(!crop(jpeg, jpeg_size, fs, true, true, &scratch, &plain, &w),
               "lenient crop warned %d times, strict crop succeeded", fast_warnings);
    return 0;
  }
  if (!crop(jpeg, jpeg_size, fs, strict, false, &scratch, &plain, &plain_warnings) || plain_warnings > 0) return 0;
  FUZZ_CHECK(plain == fast, "FastHuffman and libjpeg's Huffman decoder differ on a clean %dx%d crop", fs.spec.out_h,
             fs.spec.out_w);
  return 0;
}
