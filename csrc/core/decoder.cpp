#include "core/decoder.h"

#include <algorithm>
#include <cstring>

#include "core/exif.h"
#include "core/restart_index.h"

namespace fastdata {
namespace {

// libjpeg's default error_exit calls exit(): never let it. Errors jump back to the
// caller's setjmp; warnings (corrupt data) are counted, and are errors when strict.
void on_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegDecoder::ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  longjmp(err->jump, 1);
}

void on_emit_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  auto* err = reinterpret_cast<JpegDecoder::ErrorManager*>(cinfo->err);
  if (err->warnings++ == 0) (*cinfo->err->format_message)(cinfo, err->first_warning);
  if (err->strict) {
    std::snprintf(err->message, sizeof(err->message), "%s (corrupt data; strict mode)", err->first_warning);
    longjmp(err->jump, 1);
  }
}

Subsampling classify_subsampling(const jpeg_decompress_struct& c) {
  if (c.num_components == 1) return Subsampling::kGray;
  if (c.num_components < 3) return Subsampling::kOther;
  const int h0 = c.comp_info[0].h_samp_factor, v0 = c.comp_info[0].v_samp_factor;
  for (int i = 1; i < c.num_components; ++i) {
    if (c.comp_info[i].h_samp_factor != 1 || c.comp_info[i].v_samp_factor != 1) return Subsampling::kOther;
  }
  if (h0 == 1 && v0 == 1) return Subsampling::k444;
  if (h0 == 2 && v0 == 1) return Subsampling::k422;
  if (h0 == 2 && v0 == 2) return Subsampling::k420;
  if (h0 == 1 && v0 == 2) return Subsampling::k440;
  if (h0 == 4 && v0 == 1) return Subsampling::k411;
  return Subsampling::kOther;
}

}  // namespace

void cmyk_to_rgb(const uint8_t* cmyk, uint8_t* rgb, int n, bool inverted) {
  for (int i = 0; i < n; ++i, cmyk += 4, rgb += 3) {
    int c = cmyk[0], m = cmyk[1], y = cmyk[2], k = cmyk[3];
    if (inverted) {  // Adobe writes 255 - ink
      c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
    }
    const int nk = 255 - k;
    // Pillow: CLIP8(nk - MULDIV255(ink, nk)), MULDIV255(a, b) = ((a*b + 128) + ((a*b + 128) >> 8)) >> 8
    auto muldiv255 = [](int a, int b) {
      const int t = a * b + 128;
      return ((t >> 8) + t) >> 8;
    };
    rgb[0] = static_cast<uint8_t>(std::clamp(nk - muldiv255(c, nk), 0, 255));
    rgb[1] = static_cast<uint8_t>(std::clamp(nk - muldiv255(m, nk), 0, 255));
    rgb[2] = static_cast<uint8_t>(std::clamp(nk - muldiv255(y, nk), 0, 255));
  }
}

const char* libjpeg_version() {
#ifdef LIBJPEG_TURBO_VERSION
#define FASTDATA_STR2(x) #x
#define FASTDATA_STR(x) FASTDATA_STR2(x)
  return FASTDATA_STR(LIBJPEG_TURBO_VERSION);
#else
  return "unknown";
#endif
}

int64_t coefficient_buffer_bytes(const jpeg_decompress_struct& c, bool buffered) {
  if (!buffered) return 0;
  int64_t bytes = 0;
  for (int ci = 0; ci < c.num_components; ++ci) {
    const jpeg_component_info& comp = c.comp_info[ci];
    const int64_t h = comp.h_samp_factor, v = comp.v_samp_factor;  // 1..4, checked by libjpeg
    const int64_t w_blocks = (static_cast<int64_t>(comp.width_in_blocks) + h - 1) / h * h;
    const int64_t h_blocks = (static_cast<int64_t>(comp.height_in_blocks) + v - 1) / v * v;
    bytes += w_blocks * h_blocks * static_cast<int64_t>(sizeof(JBLOCK));
  }
  return bytes;
}

void check_coefficient_budget(jpeg_decompress_struct* c, size_t input_size, bool buffered) {
  const int64_t need = coefficient_buffer_bytes(*c, buffered);
  const int64_t budget = coefficient_budget(input_size);
  if (need > budget) {
    jpeg_abort_decompress(c);
    char msg[400];
    std::snprintf(msg, sizeof(msg),
                  "a %ux%u JPEG of %zu bytes would need %lld MiB of whole-image coefficient buffers (as progressive "
                  "decoding and transcoding use), above its budget of %lld MiB (64 MiB + 1024 x the file size, "
                  "which a complete file never exceeds): the file is truncated or crafted",
                  static_cast<unsigned>(c->image_width), static_cast<unsigned>(c->image_height), input_size,
                  static_cast<long long>(need >> 20), static_cast<long long>(budget >> 20));
    throw DecodeError(msg);
  }
  // The backstop inside libjpeg (jmemnobs.c honours it since libjpeg-turbo 2.0): room for
  // the arrays above plus the row buffers (a few MB at most: a JPEG is at most 65535 wide).
  c->mem->max_memory_to_use = static_cast<long>(budget + (int64_t{32} << 20));
}

jpeg_error_mgr* install_error_manager(JpegDecoder::ErrorManager* err) {
  jpeg_error_mgr* pub = jpeg_std_error(&err->pub);
  pub->error_exit = on_error_exit;
  pub->emit_message = on_emit_message;
  return pub;
}

JpegDecoder::JpegDecoder() {
  std::memset(&cinfo_, 0, sizeof(cinfo_));
  std::memset(&err_, 0, sizeof(err_));
  cinfo_.err = install_error_manager(&err_);
  create();
}

void JpegDecoder::create() {
  // jpeg_create_decompress only fails on out-of-memory, through error_exit. A half-made
  // object is safe to destroy (jpeg_destroy checks its memory manager), and the next
  // read_header destroys and creates it again.
  if (setjmp(err_.jump)) throw std::bad_alloc();
  jpeg_create_decompress(&cinfo_);
  jpeg_save_markers(&cinfo_, JPEG_APP0 + 1, 0xFFFF);  // EXIF
  jpeg_save_markers(&cinfo_, kRestartIndexMarker, 0xFFFF);  // fastdata's restart index (APP15)
}

JpegDecoder::~JpegDecoder() { jpeg_destroy_decompress(&cinfo_); }

void JpegDecoder::fail() {
  jpeg_abort_decompress(&cinfo_);
  throw DecodeError(err_.message);
}

// Functions with setjmp below construct no C++ objects between setjmp and the libjpeg
// calls, so a longjmp skips no destructor.
JpegInfo JpegDecoder::read_header(const uint8_t* data, size_t size, bool strict) {
  // libjpeg keeps DQT/DHT tables from one image to the next (its "abbreviated datastream"
  // feature), so a file that lacks a table, or names one it does not define, would decode
  // silently with whatever the image before left on this thread. A new decompressor per
  // image decodes each file as a fresh one does: a missing DHT gets the standard tables,
  // a missing DQT is an error. Destroying and creating it costs 0.19 µs of CPU (2-core box,
  // 2026-12-01), nothing next to a decode.
  jpeg_destroy_decompress(&cinfo_);
  create();
  err_.warnings = 0;
  err_.strict = strict;
  err_.first_warning[0] = '\0';
  if (size == 0) throw DecodeError("empty input (0 bytes)");
  if (!looks_like_jpeg(data, size)) throw DecodeError("not a JPEG file (no SOI marker)");
  if (setjmp(err_.jump)) fail();
  jpeg_mem_src(&cinfo_, data, static_cast<unsigned long>(size));
  const int rc = jpeg_read_header(&cinfo_, TRUE);
  if (rc != JPEG_HEADER_OK) {
    jpeg_abort_decompress(&cinfo_);
    throw DecodeError("JPEG file has no image (tables-only datastream)");
  }
  JpegInfo info;
  info.width = static_cast<int>(cinfo_.image_width);
  info.height = static_cast<int>(cinfo_.image_height);
  info.components = cinfo_.num_components;
  info.precision = cinfo_.data_precision;
  info.arithmetic = cinfo_.arith_code != 0;
  switch (cinfo_.jpeg_color_space) {
    case JCS_GRAYSCALE: info.color_space = ColorSpace::kGray; break;
    case JCS_YCbCr: info.color_space = ColorSpace::kYCbCr; break;
    case JCS_RGB: info.color_space = ColorSpace::kRGB; break;
    case JCS_CMYK: info.color_space = ColorSpace::kCMYK; break;
    case JCS_YCCK: info.color_space = ColorSpace::kYCCK; break;
    default: info.color_space = ColorSpace::kOther; break;
  }
  info.subsampling = classify_subsampling(cinfo_);
  info.progressive = jpeg_has_multiple_scans(&cinfo_) != 0;
  info.adobe_inverted = cinfo_.saw_Adobe_marker != 0;
  index_.interval = 0;
  bool exif_seen = false;
  for (jpeg_saved_marker_ptr m = cinfo_.marker_list; m != nullptr; m = m->next) {
    if (m->marker == JPEG_APP0 + 1 && !exif_seen) {
      exif_seen = true;
      const int o = parse_exif_orientation(m->data, m->data_length);
      if (o != 1 || info.orientation == 1) info.orientation = o;
    } else if (m->marker == kRestartIndexMarker && index_.interval == 0) {
      // A malformed segment leaves the file on the plain path (libjpeg reads it as ever).
      if (!parse_restart_index(m->data, m->data_length, &index_)) index_.interval = 0;
    }
  }
  info.restart_indexed = index_.interval != 0;
  info_ = info;
  input_size_ = size;
  return info;
}

DecodedRegion JpegDecoder::decode_region(int denom, int x0, int y0, int x1, int y1, uint8_t* into,
                                         ptrdiff_t into_stride) {
  const bool cmyk = info_.color_space == ColorSpace::kCMYK || info_.color_space == ColorSpace::kYCCK;
  if (info_.color_space == ColorSpace::kOther) {
    jpeg_abort_decompress(&cinfo_);
    throw DecodeError("unsupported JPEG colour space");
  }
  // Sizes must be known before setjmp; libjpeg computes the scaled size the same way.
  cinfo_.scale_num = 1;
  cinfo_.scale_denom = static_cast<unsigned int>(denom);
  cinfo_.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  cinfo_.dct_method = JDCT_ISLOW;
  cinfo_.do_fancy_upsampling = TRUE;
  const int sw = static_cast<int>((static_cast<long>(info_.width) + denom - 1) / denom);
  const int sh = static_cast<int>((static_cast<long>(info_.height) + denom - 1) / denom);
  x0 = std::clamp(x0, 0, sw);
  x1 = std::clamp(x1, x0, sw);
  y0 = std::clamp(y0, 0, sh);
  y1 = std::clamp(y1, y0, sh);
  if (x1 <= x0 || y1 <= y0) {
    jpeg_abort_decompress(&cinfo_);
    throw DecodeError("empty decode region");
  }
  // Column cropping with vertical sampling above 2 (e.g. a 2x4 luma) leaves libjpeg-turbo
  // 2.1 reading stale upsampler rows, so the crop would depend on the image this decoder
  // saw before: decode whole rows for those (rare) files.
  const bool crop_columns = (x0 > 0 || x1 < sw) && cinfo_.max_v_samp_factor <= 2;
  // Worst case after iMCU alignment: the region grows by one iMCU (<= 32 px) on the left.
  // Whole rows (no column crop) are sw wide from column 0: a narrower stride let libjpeg
  // write past the buffer's end (found by the crop_scalar fuzzer, 2026-12-02).
  const int max_width = crop_columns ? std::min(sw, (x1 - x0) + 64) : sw;
  const ptrdiff_t stride = into ? into_stride : static_cast<ptrdiff_t>(max_width) * 3;
  if (!into) region_.resize(static_cast<size_t>(y1 - y0) * stride + 64);  // + resize's SIMD padding (kResizePadding)
  if (cmyk) cmyk_row_.resize(static_cast<size_t>(sw) * 4);
  rows_.resize(static_cast<size_t>(y1 - y0));
  uint8_t* base = into ? into : region_.data();
  for (int r = 0; r < y1 - y0; ++r) rows_[r] = base + r * stride;

  // Without a column crop the rows start at column 0, whatever x0 asked for.
  JDIMENSION out_x0 = crop_columns ? static_cast<JDIMENSION>(x0) : 0, out_w = static_cast<JDIMENSION>(sw);
  check_coefficient_budget(&cinfo_, input_size_, jpeg_has_multiple_scans(&cinfo_) != 0);
  if (fast_huffman_) huffman_.prepare_progressive(&cinfo_);  // progressive scans are decoded inside start_decompress
  if (setjmp(err_.jump)) fail();
  if (!jpeg_start_decompress(&cinfo_)) {  // only with suspending sources, which we never use
    jpeg_abort_decompress(&cinfo_);
    throw DecodeError("libjpeg suspended");
  }
  if (static_cast<int>(cinfo_.output_width) != sw || static_cast<int>(cinfo_.output_height) != sh) {
    jpeg_abort_decompress(&cinfo_);
    throw DecodeError("unexpected scaled size");
  }
  const bool installed = fast_huffman_ && huffman_.install(&cinfo_);
  if (crop_columns) {
    out_w = static_cast<JDIMENSION>(x1 - x0);
    jpeg_crop_scanline(&cinfo_, &out_x0, &out_w);
    if (installed) huffman_.set_cropped_columns(&cinfo_, out_x0);
    if (static_cast<int>(out_w) > max_width || static_cast<int>(out_x0 + out_w) < x1) {
      jpeg_abort_decompress(&cinfo_);
      throw DecodeError("internal: crop alignment exceeded its bound");
    }
  }
  if (index_.interval != 0 && installed && (y0 > 0 || y1 < sh || crop_columns)) {
    const char* problem = huffman_.use_restart_index(&cinfo_, index_, y0, y1);
    if (problem != nullptr) {
      jpeg_abort_decompress(&cinfo_);
      throw DecodeError(problem);
    }
  }
  if (y0 > 0) {
    const JDIMENSION skipped = jpeg_skip_scanlines(&cinfo_, static_cast<JDIMENSION>(y0));
    if (static_cast<int>(skipped) != y0) {
      jpeg_abort_decompress(&cinfo_);
      throw DecodeError("premature end of image while skipping rows");
    }
  }
  while (static_cast<int>(cinfo_.output_scanline) < y1) {
    const int r = static_cast<int>(cinfo_.output_scanline) - y0;
    JDIMENSION got;
    if (cmyk) {
      JSAMPROW row = cmyk_row_.data();
      got = jpeg_read_scanlines(&cinfo_, &row, 1);
      if (got == 1) cmyk_to_rgb(cmyk_row_.data(), rows_[r], static_cast<int>(out_w), info_.adobe_inverted);
    } else {
      got = jpeg_read_scanlines(&cinfo_, &rows_[r], static_cast<JDIMENSION>(y1 - y0 - r));
    }
    if (got == 0) {
      jpeg_abort_decompress(&cinfo_);
      throw DecodeError("libjpeg returned no rows");
    }
  }
  if (y1 == sh) {
    // Through the end of the image: read on to the EOI marker, so that corrupt data noticed
    // only there (e.g. "extraneous bytes before marker") still warns, and fails when strict.
    jpeg_finish_decompress(&cinfo_);
  } else {
    // The rows below the region are never entropy-decoded: stop here.
    jpeg_abort_decompress(&cinfo_);
  }
  DecodedRegion region;
  region.pixels = base;
  region.stride = stride;
  region.x0 = static_cast<int>(out_x0);
  region.y0 = y0;
  region.width = static_cast<int>(out_w);
  region.height = y1 - y0;
  region.scaled_width = sw;
  region.scaled_height = sh;
  return region;
}

void JpegDecoder::skip_rows(int rows) {
  cinfo_.scale_num = 1;
  cinfo_.scale_denom = 1;
  cinfo_.out_color_space =
      (info_.color_space == ColorSpace::kCMYK || info_.color_space == ColorSpace::kYCCK) ? JCS_CMYK : JCS_RGB;
  check_coefficient_budget(&cinfo_, input_size_, jpeg_has_multiple_scans(&cinfo_) != 0);
  if (fast_huffman_) huffman_.prepare_progressive(&cinfo_);
  if (setjmp(err_.jump)) fail();
  jpeg_start_decompress(&cinfo_);
  if (fast_huffman_) huffman_.install(&cinfo_);
  // libjpeg-turbo skips to the end of the image without decoding anything, so stop one
  // row short and read that row through a one-pixel-wide crop (one iMCU column of IDCT).
  const int target = std::min<int>(rows, static_cast<int>(cinfo_.output_height));
  JDIMENSION x = 0, w = 1;
  jpeg_crop_scanline(&cinfo_, &x, &w);
  if (target > 1) jpeg_skip_scanlines(&cinfo_, static_cast<JDIMENSION>(target - 1));
  cmyk_row_.resize(static_cast<size_t>(w) * 4 + 64);
  JSAMPROW row = cmyk_row_.data();
  jpeg_read_scanlines(&cinfo_, &row, 1);
  jpeg_abort_decompress(&cinfo_);
}

}  // namespace fastdata
