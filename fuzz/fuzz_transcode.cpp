// libFuzzer target "transcode": progressive -> baseline rewriting (transcode_to_baseline,
// used by fastdata-convert at cache-write time).
//
// Input: the file's bytes. Oracles beyond "no crash": a transcoded file is a sequential
// JPEG of the same size that decodes strictly (no warning), and, since only the entropy
// coding changes, to the same pixels as the input wherever the input decodes cleanly and
// its scans code every coefficient in full. (A progressive file whose scans leave some
// coefficient unrefined, e.g. one missing its last scan, decodes with libjpeg's block
// smoothing, which its sequential rewrite does not get: fastdata-convert compares the
// pixels and keeps such files as they are.)
#include <csetjmp>
#include <cstring>
#include <vector>

#include "core/sample.h"
#include "core/transcode.h"
#include "fuzz_common.h"

namespace {

// Whether every coefficient of every component was coded to its last bit (libjpeg's
// coef_bits, kept for progressive files only: a sequential file codes everything).
bool coefficients_complete(const uint8_t* data, size_t size) {
  jpeg_decompress_struct cinfo;
  fastdata::JpegDecoder::ErrorManager err;
  std::memset(&cinfo, 0, sizeof(cinfo));
  std::memset(&err, 0, sizeof(err));
  cinfo.err = fastdata::install_error_manager(&err);
  bool complete = false;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  jpeg_read_coefficients(&cinfo);
  complete = true;
  if (cinfo.progressive_mode && cinfo.coef_bits != nullptr) {
    for (int c = 0; c < cinfo.num_components; ++c) {
      for (int k = 0; k < DCTSIZE2; ++k) complete = complete && cinfo.coef_bits[c][k] == 0;
    }
  }
  jpeg_destroy_decompress(&cinfo);
  return complete;
}

bool decode(const uint8_t* data, size_t size, bool strict, fastdata::SampleScratch* s, std::vector<uint8_t>* out,
            int* warnings) {
  return fuzz::expected_or_ok([&] {
    *warnings = fastdata::decode_full(data, size, strict, fuzz::kDecodeMaxPixels, s, [&](int h, int w) {
      out->assign(static_cast<size_t>(h) * w * 3, 0);
      return out->data();
    });
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fastdata::SampleScratch scratch;
  std::vector<uint8_t> baseline;
  if (!fuzz::expected_or_ok([&] { baseline = fastdata::transcode_to_baseline(data, size, fuzz::kDecodeMaxPixels); })) {
    return 0;
  }
  fastdata::JpegInfo in_info, out_info;
  FUZZ_CHECK(fuzz::expected_or_ok([&] { in_info = scratch.decoder.read_header(data, size, false); }),
             "transcoded a file whose header does not read");
  FUZZ_CHECK(fuzz::expected_or_ok([&] { out_info = scratch.decoder.read_header(baseline.data(), baseline.size(), true); }),
             "the transcoded file's header does not read");
  FUZZ_CHECK(!out_info.progressive, "the transcoded file is still progressive");
  FUZZ_CHECK(out_info.width == in_info.width && out_info.height == in_info.height &&
                 out_info.components == in_info.components && out_info.orientation == in_info.orientation,
             "header changed: %dx%d/%d/o%d -> %dx%d/%d/o%d", in_info.width, in_info.height, in_info.components,
             in_info.orientation, out_info.width, out_info.height, out_info.components, out_info.orientation);
  std::vector<uint8_t> in_pixels, out_pixels;
  int in_warnings = 0, out_warnings = 0;
  // Files that do not decode (e.g. sampling factors libjpeg reads but cannot upsample:
  // "Fractional sampling not implemented yet") are out of scope: fastdata-convert decodes
  // every file before it transcodes one.
  if (!decode(data, size, false, &scratch, &in_pixels, &in_warnings)) return 0;
  FUZZ_CHECK(decode(baseline.data(), baseline.size(), true, &scratch, &out_pixels, &out_warnings),
             "the transcoded file does not decode strictly");
  if (in_warnings == 0 && coefficients_complete(data, size)) {
    FUZZ_CHECK(in_pixels == out_pixels, "transcoding changed the pixels");
  }
  return 0;
}
