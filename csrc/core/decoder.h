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

namespace fastdata {

// Corrupt or unsupported data. The message is libjpeg's own (or ours for limits).
class DecodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ColorSpace : int { kGray = 0, kYCbCr = 1, kRGB = 2, kCMYK = 3, kYCCK = 4, kOther = 5 };

struct JpegInfo {
  int width = 0, height = 0;  // as stored
  int components = 0;
  int precision = 8;        // bits per sample (SOF)
  bool arithmetic = false;  // arithmetic-coded entropy data (SOF9..SOF15) instead of Huffman
  ColorSpace color_space = ColorSpace::kOther;
  const char* subsampling = "other";
  bool progressive = false;
  int orientation = 1;  // EXIF, 1..8
  bool adobe_inverted = false;
  bool restart_indexed = false;  // carries fastdata's restart index (restart_index.h)
  int oriented_width() const { return orientation >= 5 ? height : width; }
  int oriented_height() const { return orientation >= 5 ? width : height; }
};

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
  std::vector<uint8_t> region_;
  std::vector<uint8_t> cmyk_row_;
  std::vector<JSAMPROW> rows_;
  FastHuffman huffman_;
  bool fast_huffman_ = true;
  // The file's restart index (read_header), used by crop decodes through FastHuffman.
  int index_interval_ = 0;
  std::vector<uint32_t> index_offsets_;
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
