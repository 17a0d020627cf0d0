// libjpeg-turbo behind a small, exception-safe interface: header probe and
// region-of-interest decode with DCT-domain scaling, always to RGB.
#pragma once
#include <cstddef>
#include <cstdint>
#include <csetjmp>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <jpeglib.h>

#include "core/huffman.h"
#include "core/restart_index.h"

namespace fastdata {

// Corrupt or unsupported data. The message is libjpeg's own (or ours for limits).
class DecodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ColorSpace : int { kGray = 0, kYCbCr = 1, kRGB = 2, kCMYK = 3, kYCCK = 4, kOther = 5 };

// Chroma subsampling as the header reader classifies it. The value is the code the plan carries
// per row (CropPlan.subsamplings) and indexes kSubsamplingNames (_C.SUBSAMPLING_NAMES).
enum class Subsampling : int32_t { kOther = 0, kGray = 1, k444 = 2, k422 = 3, k420 = 4, k440 = 5, k411 = 6 };
inline constexpr const char* kSubsamplingNames[] = {"other", "gray", "4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:1:1"};
static_assert(sizeof(kSubsamplingNames) / sizeof(kSubsamplingNames[0]) == static_cast<size_t>(Subsampling::k411) + 1,
              "one name per Subsampling code");
inline const char* subsampling_name(Subsampling s) { return kSubsamplingNames[static_cast<int32_t>(s)]; }

struct JpegInfo {
  int width = 0, height = 0;  // as stored
  int components = 0;
  int precision = 8;        // bits per sample (SOF)
  bool arithmetic = false;  // arithmetic-coded entropy data (SOF9..SOF15) instead of Huffman
  ColorSpace color_space = ColorSpace::kOther;
  Subsampling subsampling = Subsampling::kOther;
  bool progressive = false;
  int orientation = 1;  // EXIF, 1..8
  bool adobe_inverted = false;
  bool restart_indexed = false;  // carries fastdata's restart index (restart_index.h)
  int oriented_width() const { return orientation >= 5 ? height : width; }
  int oriented_height() const { return orientation >= 5 ? width : height; }
};

// Progressive (and other multi-scan) JPEGs are decoded through whole-image arrays of DCT
// coefficients: 128 bytes per 8x8 block of every component, whatever the crop or DCT scale.
// A complete file codes every block's DC coefficient with at least one bit, so its arrays
// never exceed 1024 x its size; a file that claims more is truncated or crafted (a 2 KB
// progressive CMYK file claiming 9459x9459 asked for ~700 MB per thread, #16 item 8). The
// budget is that bound plus a floor that keeps small truncated images decodable (grey
// below the cut, as before). The pixel limit alone cannot bound this: it is per image, and
// libjpeg fills the arrays whatever the file actually holds.
constexpr int64_t kCoefficientBytesPerInputByte = 1024;
constexpr int64_t kCoefficientBudgetFloor = int64_t{64} << 20;  // 64 MiB
inline int64_t coefficient_budget(size_t input_size) {
  return kCoefficientBudgetFloor + kCoefficientBytesPerInputByte * static_cast<int64_t>(input_size);
}

// Bytes of the whole-image coefficient arrays libjpeg allocates for `c` after
// jpeg_read_header (the sizes jdcoefct.c requests); `buffered`: the arrays are made
// (multi-scan decode, or jpeg_read_coefficients), else 0.
int64_t coefficient_buffer_bytes(const jpeg_decompress_struct& c, bool buffered);

// Throws DecodeError (after aborting `c`) when coefficient_buffer_bytes exceeds
// coefficient_budget(input_size); otherwise sets libjpeg's own max_memory_to_use a little
// above the budget, so nothing else libjpeg buffers can grow past it either.
void check_coefficient_budget(jpeg_decompress_struct* c, size_t input_size, bool buffered);

inline bool looks_like_jpeg(const uint8_t* data, size_t size) {
  return size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

// Rows of a decoded region of the (possibly DCT-scaled) stored image, RGB.
struct DecodedRegion {
  const uint8_t* pixels = nullptr;
  ptrdiff_t stride = 0;   // bytes between rows
  int x0 = 0, y0 = 0;     // top-left in scaled stored coordinates
  int width = 0, height = 0;
  int scaled_width = 0, scaled_height = 0;  // the whole scaled image
};

// One per thread: keeps fastdata's buffers between images; libjpeg's object is made anew
// for each image (see read_header).
class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Parses the header of `data` (which must outlive the decode). Throws DecodeError.
  JpegInfo read_header(const uint8_t* data, size_t size, bool strict);

  // After read_header: decodes rows [y0, y1) and at least columns [x0, x1) of the stored
  // image scaled by 1/denom (denom in 1, 2, 4, 8). A file with a restart index entropy-
  // decodes only the restart intervals the region needs (the same pixels as without). With into != nullptr (full-width
  // regions only) rows go straight to `into`, `into_stride` bytes apart.
  DecodedRegion decode_region(int denom, int x0, int y0, int x1, int y1, uint8_t* into = nullptr,
                              ptrdiff_t into_stride = 0);

  // Entropy-decodes rows [0, rows) of the image without IDCT or colour work (benchmarks'
  // floor for any decode that must produce those rows).
  void skip_rows(int rows);

  // Off: libjpeg-turbo's own Huffman decoder even where FastHuffman applies (the
  // benchmark's "plain libjpeg-turbo" reference).
  void set_fast_huffman(bool on) { fast_huffman_ = on; }

  int warnings() const { return err_.warnings; }
  const char* first_warning() const { return err_.first_warning; }

  struct ErrorManager {
    jpeg_error_mgr pub;
    jmp_buf jump;
    int warnings;
    bool strict;
    char message[JMSG_LENGTH_MAX];
    char first_warning[JMSG_LENGTH_MAX];
  };

 private:
  [[noreturn]] void fail();
  void create();  // jpeg_create_decompress with the markers fastdata reads
  jpeg_decompress_struct cinfo_;
  ErrorManager err_;
  JpegInfo info_;
  size_t input_size_ = 0;  // of the image read_header parsed
  std::vector<uint8_t> region_;
  std::vector<uint8_t> cmyk_row_;
  std::vector<JSAMPROW> rows_;
  FastHuffman huffman_;
  bool fast_huffman_ = true;
  // The file's restart index (read_header; interval 0: none), used by crop decodes through FastHuffman.
  RestartIndex index_;
};

// Points `err->pub` at libjpeg's message table with fastdata's handlers (errors longjmp to
// `err->jump`; warnings are counted and, when `err->strict`, longjmp too) and returns it
// for `cinfo.err`. Every libjpeg object here (decoder, transcoder) uses it, so none can
// reach libjpeg's default error_exit, which calls exit().
jpeg_error_mgr* install_error_manager(JpegDecoder::ErrorManager* err);

// Adobe-inverted or plain CMYK -> RGB, the same arithmetic as Pillow's cmyk2rgb.
void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, int n, bool inverted);

const char* libjpeg_version();

}  // namespace fastdata
