#include "core/transcode.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>

#include "core/decoder.h"
#include "core/restart_index.h"

#include <jerror.h>  // ERREXIT1, JERR_OUT_OF_MEMORY (after jpeglib.h, which decoder.h includes)

namespace fastdata {
namespace {

// Output straight into a std::vector. Not jpeg_mem_dest: after its buffer has grown,
// an error leaves the current buffer reachable only through libjpeg's private state
// (leaked) and the caller's pointer dangling (freeing it is a double free).
struct VectorDestination {
  jpeg_destination_mgr pub;
  std::vector<uint8_t>* out;
};

// Resizes the vector to `new_size` with its first `used` bytes written.
void grow(j_compress_ptr cinfo, size_t used, size_t new_size) {
  auto* dest = reinterpret_cast<VectorDestination*>(cinfo->dest);
  bool grown = true;
  try {
    dest->out->resize(new_size);
  } catch (const std::exception&) {
    grown = false;
  }
  // No C++ exception may cross libjpeg's C frames: report through error_exit (longjmp),
  // and only outside the catch block (a longjmp out of a handler leaks the exception).
  if (!grown) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 1);
  dest->pub.next_output_byte = dest->out->data() + used;
  dest->pub.free_in_buffer = new_size - used;
}

void init_destination(j_compress_ptr cinfo) {
  auto* dest = reinterpret_cast<VectorDestination*>(cinfo->dest);
  grow(cinfo, 0, std::max<size_t>(dest->out->size(), 16384));
}

// Called when the buffer is full. The whole buffer counts as written: libjpeg's Huffman
// encoder keeps its position in local state and leaves pub.free_in_buffer stale here
// (libjpeg.txt: ignore next_output_byte/free_in_buffer in empty_output_buffer).
boolean empty_output_buffer(j_compress_ptr cinfo) {
  auto* dest = reinterpret_cast<VectorDestination*>(cinfo->dest);
  grow(cinfo, dest->out->size(), dest->out->size() * 2);
  return TRUE;
}

void term_destination(j_compress_ptr cinfo) {
  auto* dest = reinterpret_cast<VectorDestination*>(cinfo->dest);
  dest->out->resize(dest->out->size() - dest->pub.free_in_buffer);
}

bool is_kept_marker(int marker) { return marker == JPEG_APP0 + 1 || marker == JPEG_APP0 + 2; }

bool same_table(const JHUFF_TBL* a, const JHUFF_TBL* b) {
  if (a == nullptr || b == nullptr) return false;
  int count = 0;
  for (int l = 1; l <= 16; ++l) count += a->bits[l];
  return std::memcmp(a->bits, b->bits, sizeof(a->bits)) == 0 && count <= 256 &&
         std::memcmp(a->huffval, b->huffval, static_cast<size_t>(count)) == 0;
}

// Whether every component of the (single-scan) source is coded with the table that
// jpeg_set_defaults gave the same component of the output: libjpeg's standard tables, which
// most cameras and encoders write. The rewrite then keeps them: records that share tables
// let the decoder reuse its lookup tables (FastHuffman rebuilds them for each new table:
// ~2% of a Loader's CPU with per-image tables), and the standard tables code every DC
// difference a restart marker's reset can produce.
bool uses_output_default_tables(const jpeg_decompress_struct& src, const jpeg_compress_struct& dst) {
  if (jpeg_has_multiple_scans(const_cast<j_decompress_ptr>(&src)) || src.num_components != dst.num_components) {
    return false;
  }
  for (int ci = 0; ci < src.num_components; ++ci) {
    const jpeg_component_info& a = src.comp_info[ci];
    const jpeg_component_info& b = dst.comp_info[ci];
    if (a.dc_tbl_no < 0 || a.dc_tbl_no >= NUM_HUFF_TBLS || a.ac_tbl_no < 0 || a.ac_tbl_no >= NUM_HUFF_TBLS ||
        !same_table(src.dc_huff_tbl_ptrs[a.dc_tbl_no], dst.dc_huff_tbl_ptrs[b.dc_tbl_no]) ||
        !same_table(src.ac_huff_tbl_ptrs[a.ac_tbl_no], dst.ac_huff_tbl_ptrs[b.ac_tbl_no])) {
      return false;
    }
  }
  return true;
}

// The progressive Huffman decoder of this thread's transcodes: one per thread, kept (its
// tables are ~100 KB, and a Transcoder lives for one call).
FastHuffman& progressive_huffman() {
  static thread_local FastHuffman huffman;
  return huffman;
}

// Both libjpeg objects and everything the error path touches live in one object, so a
// longjmp back into to_baseline() finds them in memory (no locals modified after setjmp).
class Transcoder {
 public:
  Transcoder() {
    std::memset(&src_, 0, sizeof(src_));
    std::memset(&dst_, 0, sizeof(dst_));
    std::memset(&err_, 0, sizeof(err_));
    err_.strict = true;  // a warning means corrupt data: never write it out as a clean file
    // One error manager for both objects: whichever fails jumps to the same place.
    src_.err = install_error_manager(&err_);
    dst_.err = &err_.pub;
    if (setjmp(err_.jump)) {  // creation fails only on out-of-memory
      destroy();
      throw std::bad_alloc();
    }
    jpeg_create_decompress(&src_);
    src_created_ = true;
    jpeg_create_compress(&dst_);
    dst_created_ = true;
    jpeg_save_markers(&src_, JPEG_APP0 + 1, 0xFFFF);  // EXIF (orientation), XMP
    jpeg_save_markers(&src_, JPEG_APP0 + 2, 0xFFFF);  // ICC profile
    dest_.pub.init_destination = init_destination;
    dest_.pub.empty_output_buffer = empty_output_buffer;
    dest_.pub.term_destination = term_destination;
    dest_.out = &out_;
  }
  ~Transcoder() { destroy(); }
  Transcoder(const Transcoder&) = delete;
  Transcoder& operator=(const Transcoder&) = delete;

  // No C++ object is constructed between setjmp and the libjpeg calls below, so a
  // longjmp skips no destructor.
  // restart_mcus: < 0 no restart markers; 0 one per MCU row; else every restart_mcus MCUs.
  // index_stride: intervals per restart index entry (restart_mcus >= 0).
  std::vector<uint8_t> to_baseline(const uint8_t* data, size_t size, int64_t max_pixels, int restart_mcus,
                                   int index_stride) {
    if (size == 0) throw DecodeError("empty input (0 bytes)");
    if (!looks_like_jpeg(data, size)) throw DecodeError("not a JPEG file (no SOI marker)");
    // The output is about as large as the input (same coefficients, other Huffman codes).
    // Start at half of it so the growth path runs on (nearly) every call, tests included:
    // one extra copy of a few tens of KB is noise next to the transcode itself.
    out_.resize(size / 2 + 1024);
    if (setjmp(err_.jump)) fail();
    jpeg_mem_src(&src_, data, static_cast<unsigned long>(size));
    if (jpeg_read_header(&src_, TRUE) != JPEG_HEADER_OK) {
      jpeg_abort_decompress(&src_);
      throw DecodeError("JPEG file has no image (tables-only datastream)");
    }
    // jpeg_read_coefficients allocates whole-image coefficient arrays: refuse bombs first.
    const int64_t pixels = static_cast<int64_t>(src_.image_width) * src_.image_height;
    if (max_pixels > 0 && pixels > max_pixels) {
      jpeg_abort_decompress(&src_);
      char msg[200];
      std::snprintf(msg, sizeof(msg), "image is %ux%u = %lld pixels, above the limit of %lld (decompression bomb guard)",
                    static_cast<unsigned>(src_.image_width), static_cast<unsigned>(src_.image_height),
                    static_cast<long long>(pixels), static_cast<long long>(max_pixels));
      throw DecodeError(msg);
    }
    const bool supported =
        (src_.num_components == 1 && src_.jpeg_color_space == JCS_GRAYSCALE) ||
        (src_.num_components == 3 && (src_.jpeg_color_space == JCS_YCbCr || src_.jpeg_color_space == JCS_RGB));
    if (!supported) {
      jpeg_abort_decompress(&src_);
      throw std::invalid_argument(
          "transcode_to_baseline: only grayscale and YCbCr/RGB JPEGs are transcoded (CMYK/YCCK or unknown "
          "colour spaces are not)");
    }
    check_coefficient_budget(&src_, size, true);  // jpeg_read_coefficients buffers every image
    // Entropy-decodes every scan into whole-image coefficient arrays (libjpeg's memory);
    // with a memory source it cannot suspend, so NULL would be a libjpeg bug.
    if (src_.progressive_mode) {  // its scans with fastdata's Huffman decoder (huffman.h), as decoding does
      progressive_huffman().prepare_progressive(&src_);
    }
    jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&src_);
    if (coefficients == nullptr) {
      jpeg_abort_decompress(&src_);
      throw DecodeError("libjpeg returned no coefficients");
    }
    // Quantization tables, sampling factors, component ids, colour space (hence the
    // JFIF/Adobe marker) and JFIF density. jpeg_set_defaults inside leaves no scan script:
    // the output is sequential. The input's restart intervals are not copied.
    jpeg_copy_critical_parameters(&src_, &dst_);
    dst_.optimize_coding = TRUE;  // per-image Huffman tables: smaller than the standard ones
    if (restart_mcus >= 0 && uses_output_default_tables(src_, dst_)) dst_.optimize_coding = FALSE;
    if (restart_mcus == 0) dst_.restart_in_rows = 1;  // libjpeg sets restart_interval per scan
    if (restart_mcus > 0) dst_.restart_interval = static_cast<unsigned int>(restart_mcus);
    dst_.dest = &dest_.pub;
    jpeg_write_coefficients(&dst_, coefficients);  // writes SOI and JFIF/Adobe APPn
    for (jpeg_saved_marker_ptr m = src_.marker_list; m != nullptr; m = m->next) {
      if (is_kept_marker(m->marker)) jpeg_write_marker(&dst_, m->marker, m->data, m->data_length);
    }
    jpeg_finish_compress(&dst_);  // writes all coefficients, EOI; term_destination trims out_
    // All input was consumed by jpeg_read_coefficients; with a memory source this cannot
    // suspend, so FALSE would again be a libjpeg bug.
    if (!jpeg_finish_decompress(&src_)) {
      jpeg_abort_decompress(&src_);
      throw DecodeError("libjpeg did not finish reading the input");
    }
    if (err_.warnings != 0) throw DecodeError(err_.first_warning);  // unreachable while strict
    if (restart_mcus >= 0) return add_restart_index(out_, static_cast<int>(dst_.restart_interval), index_stride);
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail() {
    jpeg_abort_compress(&dst_);
    jpeg_abort_decompress(&src_);
    throw DecodeError(err_.message);
  }
  void destroy() {
    if (dst_created_) jpeg_destroy_compress(&dst_);
    if (src_created_) jpeg_destroy_decompress(&src_);
    dst_created_ = src_created_ = false;
  }

  jpeg_decompress_struct src_;
  jpeg_compress_struct dst_;
  JpegDecoder::ErrorManager err_;
  VectorDestination dest_;
  std::vector<uint8_t> out_;
  bool src_created_ = false, dst_created_ = false;
};

}  // namespace

std::vector<uint8_t> transcode_to_baseline(const uint8_t* data, size_t size, int64_t max_pixels) {
  // Creating the two libjpeg objects costs microseconds next to the milliseconds of a
  // transcode; a fresh pair per call keeps this free of shared state.
  Transcoder t;
  return t.to_baseline(data, size, max_pixels, -1, 1);
}

std::vector<uint8_t> transcode_restart_indexed(const uint8_t* data, size_t size, int64_t max_pixels,
                                               int interval_mcus, int index_stride) {
  if (interval_mcus < 0 || interval_mcus > 65535) {
    throw std::invalid_argument("transcode_restart_indexed: interval_mcus must be in 0..65535");
  }
  if (index_stride < 1 || index_stride > 65535) {
    throw std::invalid_argument("transcode_restart_indexed: index_stride must be in 1..65535");
  }
  Transcoder t;
  return t.to_baseline(data, size, max_pixels, interval_mcus, index_stride);
}

}  // namespace fastdata
