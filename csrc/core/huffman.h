// A faster Huffman decoder for baseline JPEG, plugged into libjpeg-turbo's pipeline.
//
// Why: entropy decoding is ~70% of a RandomResizedCrop decode (perf, one thread: every
// column of every row down to the crop's bottom must be decoded), and libjpeg-turbo's
// decoder resolves each coefficient in two steps (an 8-bit lookahead for the symbol, then
// a separate read of its value bits). This one resolves the common short codes, symbol and
// value together, in one 10-bit table lookup that often yields two AC coefficients at
// once, and tops its bit buffer up 8 bytes at a time when none of them is 0xFF.
//
// How: after jpeg_start_decompress, `FastHuffman::install` replaces the decode_mcu hook of
// libjpeg's entropy module, so IDCT, upsampling, colour conversion, ROI cropping and row
// skipping stay libjpeg-turbo's. It installs only for 8-bit baseline sequential Huffman
// scans (with or without restart markers, which libjpeg's own marker reader reads).
// Progressive Huffman files are decoded scan by scan (`prepare_progressive`,
// huffman_progressive.cpp); arithmetic-coded files keep libjpeg's own decoder. On valid data it
// yields libjpeg's coefficients exactly (tests/io/test_fast_huffman.py). On damaged data
// it follows libjpeg (a bad code reads as symbol 0; running into a marker or the end of the
// data warns and decodes the rest as zeros) and is stricter in two ways: every bad code
// warns (libjpeg-turbo's fast path stays silent), and bytes between an MCU and the next
// marker always warn (libjpeg swallows those within its bit buffer's read-ahead). Its own
// longer read-ahead never warns: the end of the data counts only once its bits are needed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include <vector>

#include <jpeglib.h>

#include "core/restart_index.h"

namespace fastdata {

// Process-wide switch (default on), for A/B runs and the tests that compare against
// libjpeg's own decoder; decodes already started keep the decoder they began with.
void set_fast_huffman_enabled(bool enabled);
bool fast_huffman_enabled();
// Scans decoded by FastHuffman since the process started (tests check where it applies).
uint64_t fast_huffman_scans();
// Jumps over skipped restart intervals with a restart index since the process started (tests).
uint64_t restart_index_jumps();
// Progressive scans decoded by FastHuffman since the process started (tests).
uint64_t fast_progressive_scans();
// The progressive decoder alone (default on; off: libjpeg's for progressive files, the
// fast one for baseline scans), for A/B runs.
void set_fast_progressive_enabled(bool enabled);
bool fast_progressive_enabled();
// Which copy of the progressive decoder this CPU runs: "pdep" (BMI2's bit deposit),
// "software-deposit" (BMI2 without pdep: AMD Zen 1/2) or "portable" (jpeg_info: tests and fastdata-doctor).
const char* progressive_decoder_copy();

class FastHuffman {
 public:
  static constexpr int kLutBits = 10;  // 10 and 11 measured alike; four tables of 8 KiB stay in L1
  static constexpr uint64_t kResolved = 1u << 10;  // a table entry that resolves a value

  // Takes over entropy decoding of the scan that jpeg_start_decompress just began, if it
  // can (see above). Returns whether it did. `cinfo->client_data` is set to this object,
  // which must outlive the decode. The source must be jpeg_mem_src (all data in memory).
  bool install(j_decompress_ptr cinfo);

  // For a progressive file: after jpeg_read_header and before jpeg_start_decompress (or
  // jpeg_read_coefficients), which entropy-decode every scan of such a file before the
  // first row comes out. Hooks libjpeg's input controller so that each scan of an 8-bit
  // progressive Huffman file is decoded here: libjpeg's own start_pass still checks the
  // scan's parameters, keeps its progression status (coef_bits, which block smoothing
  // reads) and builds its tables, then the scan's decode_mcu is ours. Returns whether it
  // hooked. `cinfo->client_data` is set to this object, which must outlive the decode. Call
  // it for each image: the hook removes itself when the image's first scan starts (a struct
  // reused for another image takes libjpeg's decoder unless it is called again); an image
  // abandoned before jpeg_start_decompress leaves it set, so such a struct must be called
  // again or recreated (JpegDecoder recreates its struct per image, Transcoder per call).
  bool prepare_progressive(j_decompress_ptr cinfo);

  // The progressive scan libjpeg just started (called from the hook): takes it if it can,
  // else leaves it to libjpeg's decoder.
  void start_progressive_scan(j_decompress_ptr cinfo);
  // After jpeg_crop_scanline: libjpeg inverse-transforms only the MCU columns of the crop
  // (its first_iMCU_col..last_iMCU_col), so coefficients of the others are decoded (they
  // must be, to find the next code) but not stored. Recomputed here with libjpeg's formula.
  void set_cropped_columns(j_decompress_ptr cinfo, JDIMENSION xoffset);

  struct Table {
    // By the next kLutBits bits of the stream, one of:
    //   kResolved, with run1 in bits 16..22 and value1 (int16) in bits 32..47: symbol and
    //     value resolved together (DC: the difference; AC: run 0..15, or 63 for an end of
    //     block), whose bits (code and value) are in bits 5..9. AC entries also hold a
    //     second step, taken while the block goes on: bits 0..4 are the bits of both steps,
    //     24..30 the second's advance and 48..63 its value. Where the bits left over resolve
    //     a second coefficient, the advance is 1 + its run; else it is 0 and the value is
    //     value1 again, so the step rewrites the same coefficient and the decoder needs no
    //     branch on which kind it got (a first version with that branch measured 8-10%
    //     slower than one coefficient per lookup; this one 18% faster, 2-core box);
    //   (symbol << 16) | code length: the symbol only (its value bits follow);
    //   0: a code longer than kLutBits (or none): canonical decoding below.
    uint64_t lut[1 << kLutBits];
    // By the next kLutBits bits: (symbol << 5) | code length, or 0 for a longer code (or
    // none). Progressive AC scans read symbols this way: their end-of-band symbols carry a
    // run of blocks that the baseline entries above fold into "end of block".
    uint16_t symbols[1 << kLutBits];
    int32_t maxcode[18];              // canonical decoding of long codes, as libjpeg
    int32_t valoffset[18];
    uint8_t huffval[256];
  };

  // The bit reader: copied into locals for each MCU so that it lives in registers.
  struct Bits {
    uint64_t acc = 0;  // bit buffer, next bit at the top
    int nbits = 0;     // valid bits in acc, of which the last `pad_bits` are zeros past a marker
    int pad_bits = 0;
    const uint8_t* p = nullptr;  // next byte to read
  };

  // After install, set_cropped_columns and before any row is read: entropy-decode only the
  // restart intervals that output rows [y0, y1) (of the possibly DCT-scaled image) and the
  // cropped columns need, jumping over the others with the restart index (restart_index.h;
  // offsets relative to the scan's first byte). MCUs of skipped intervals come back as zero
  // blocks; the rows that fancy upsampling reads above and below the region are decoded
  // too, so the region's pixels are exact. Checks the index against the data first (the
  // scan must end where the index says) and finds where each interval a jump lands on
  // starts: the indexed offset (which must follow its RSTn marker), or the RSTn markers read
  // from the indexed interval before it, each of the right number and before the next
  // indexed one. Returns a message for DecodeError if the data does not match; nullptr when
  // in use.
  const char* use_restart_index(j_decompress_ptr cinfo, const RestartIndex& index, int y0, int y1);

  // Reads from cinfo->src afresh, as at the scan's start and after each restart marker:
  // an empty bit buffer, DC predictions 0, a full restart interval ahead.
  void start_interval(j_decompress_ptr cinfo);

  // Decoder state between MCUs (public for the decode functions' sake).
  Bits bits;
  const uint8_t* begin = nullptr;  // the scan's entropy-coded data
  const uint8_t* end = nullptr;
  bool insufficient = false;          // an MCU ran past the data: the rest decode as zeros
  bool at_marker = false;             // a marker (or the end of data) stopped the reader
  const uint8_t* marker_at = nullptr;  // where that marker starts (null at the end of data)
  bool eof_unreported = false;        // the reader met the end of the data; not yet warned
  long mcus_left = 0;
  long restarts_to_go = 0;                // MCUs until the next restart marker (with an interval)
  long mcu_col = 0;                       // column of the next MCU in its row
  long first_col = 0, last_col = 1L << 30;  // MCU columns whose coefficients are stored
  int last_dc[4] = {0, 0, 0, 0};
  // The restart index in use (use_restart_index), else indexed == false.
  bool indexed = false;
  bool skipping = false;           // the current interval is not decoded
  long next_interval = 0;          // number of the interval that the next boundary starts
  long total_mcus = 0;
  long need_row0 = 0, need_row1 = 0;  // MCU rows to decode
  long need_mcu0 = 0, need_mcu1 = 0;  // their MCUs: [need_mcu0, need_mcu1)
  // Where the decode jumps: the first interval of each run of needed ones (after a skipped
  // one), in scan order, with its start (use_restart_index).
  struct Jump {
    long interval;
    uint32_t offset;
  };
  std::vector<Jump> jumps;
  size_t next_jump = 0;
  uint32_t scan_bytes = 0;  // where the scan's closing marker is
  long interval_count = 0;
  long interval_mcus = 0;
  const uint8_t* scan_begin = nullptr;
  bool interval_needed(long i, long mcus_per_row) const;
  // The progressive scan being decoded (start_progressive_scan).
  enum class ScanKind { kDcFirst, kDcRefine, kAcFirst, kAcRefine };
  ScanKind scan_kind = ScanKind::kDcFirst;
  int scan_ss = 0, scan_se = 0, scan_al = 0;  // spectral band and successive-approximation bit
  unsigned eobrun = 0;                        // blocks left in an end-of-band run
  const Table* scan_ac = nullptr;             // an AC scan's table (one component)
  boolean* libjpeg_insufficient = nullptr;    // libjpeg's own "out of data" flag (block smoothing reads it)
  // Which AC coefficients of each block are nonzero, one word per block (bit 63 - j: zigzag
  // position j), kept up to date by the AC scans as they decode: the refinement scans read
  // a block's word instead of testing its 63 coefficients. Valid while every AC scan of the
  // image so far was decoded here (masks_valid); scan_masks: the current AC scan's
  // component's words, one per block in scan order (null: test the coefficients).
  std::vector<uint64_t> nonzero_masks;
  size_t component_masks[4] = {};
  bool masks_valid = false;
  uint64_t* scan_masks = nullptr;
  void (*libjpeg_start_input_pass)(j_decompress_ptr) = nullptr;  // what the hooks wrap
  void (*libjpeg_start_pass)(j_decompress_ptr) = nullptr;
  const Table* dc[10] = {};  // per block of the MCU
  const Table* ac[10] = {};
  int comp[10] = {};

 private:
  bool take_progressive_scan(j_decompress_ptr cinfo);
  // Rebuilds a table only when the image's table differs from the one it was built from
  // (datasets mostly share libjpeg's standard tables).
  const Table* table_for(const JHUFF_TBL* src, int kind, int number);
  Table tables_[2][4];  // [dc, ac][table number]
  uint8_t built_from_[2][4][17 + 256] = {};
  bool built_[2][4] = {};
};

}  // namespace fastdata
