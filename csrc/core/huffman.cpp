#include "core/huffman.h"

#include <array>
#include <atomic>
#include <algorithm>
#include <cstring>

#include <jerror.h>

#include "core/cpu_features.h"
#include "core/huffman_reader.h"

namespace fastdata {
namespace {

using namespace huffman_reader;

std::atomic<bool> g_enabled{true};
std::atomic<uint64_t> g_installs{0};
std::atomic<uint64_t> g_index_jumps{0};

// libjpeg's decode_mcu contract: decode one MCU into MCU_data (already zeroed), or just
// advance past it when MCU_data is null (rows skipped). Needs at most 31 bits per
// coefficient (a 16-bit code, or 17 for a bad one, plus up to 15 bits of value), so it
// refills below 32.
template <bool kStore>
FASTDATA_HOT inline void decode_blocks(FastHuffman& s, Bits& r, j_decompress_ptr cinfo, JBLOCKROW* MCU_data) {
  const int blocks = cinfo->blocks_in_MCU;
  for (int b = 0; b < blocks; ++b) {
    JCOEF* block = kStore ? MCU_data[b][0] : nullptr;
    const FastHuffman::Table& dc = *s.dc[b];
    const FastHuffman::Table& ac = *s.ac[b];
    if (r.nbits < 32) refill(s, r, cinfo);
    const int diff = read_dc_diff(r, dc, cinfo);
    // Unsigned: corrupt data may push the predictor anywhere; libjpeg's int wraps the same way.
    int& last = s.last_dc[s.comp[b]];
    last = static_cast<int>(static_cast<unsigned>(last) + static_cast<unsigned>(diff));
    const int v = last;
    if (kStore) block[0] = static_cast<JCOEF>(v);
    for (int k = 1; k < 64; ++k) {
      if (r.nbits < 32) refill(s, r, cinfo);
      const uint64_t g = lookup(r, ac);
      if (g & FastHuffman::kResolved) {  // includes end of block (run 63) and 16 zeros (run 15)
        k += (g >> 16) & 0x7F;
        if (kStore) block[kNaturalOrder[k]] = static_cast<JCOEF>(static_cast<int16_t>(g >> 32));
        if (k < 63) {  // the second step (see Table::lut); at k >= 63 the block has ended
          consume(r, g & 0x1F);
          k += (g >> 24) & 0x7F;
          if (kStore) block[kNaturalOrder[k]] = static_cast<JCOEF>(static_cast<int16_t>(g >> 48));
        } else {
          consume(r, (g >> 5) & 0x1F);
        }
        continue;
      }
      const int sym = read_symbol(r, g, ac, cinfo);
      const int run = sym >> 4, size = sym & 15;
      if (size) {
        k += run;
        const int value = extend(take(r, size), size);
        if (kStore) block[kNaturalOrder[k]] = static_cast<JCOEF>(value);
      } else {
        if (run != 15) break;  // end of block
        k += 15;
      }
    }
  }
}


// At a restart boundary with the restart index in use: skip the interval if the crop does
// not need it; else read on through the marker (the interval before was decoded too) or
// jump to where the index says it starts (use_restart_index checked that a marker of the
// right number ends just before).
void enter_interval(FastHuffman& s, j_decompress_ptr cinfo) {
  const long i = s.next_interval++;
  s.restarts_to_go = cinfo->restart_interval;
  // One MCU an interval (what fastdata-convert writes): the MCU's own row and column decide,
  // without interval_needed's divisions (this runs for every MCU, skipped rows included).
  const bool needed = s.interval_mcus == 1
                          ? i >= s.need_mcu0 && i < s.need_mcu1 && s.mcu_col >= s.first_col && s.mcu_col <= s.last_col
                          : s.interval_needed(i, static_cast<long>(cinfo->MCUs_per_row));
  if (!needed) {
    s.skipping = true;
    return;
  }
  if (i == 0) return;  // the reader is at the scan's start (install)
  if (!s.skipping) {
    process_restart(s, cinfo);
    return;
  }
  g_index_jumps.fetch_add(1, std::memory_order_relaxed);
  while (s.next_jump < s.jumps.size() && s.jumps[s.next_jump].interval < i) ++s.next_jump;
  if (s.next_jump == s.jumps.size() || s.jumps[s.next_jump].interval != i) {
    // use_restart_index resolved every interval a jump lands on (the first needed one of
    // each needed MCU row); should one be missing, decode no more, as past the end of data.
    s.skipping = false;
    s.insufficient = true;
    warn(cinfo, JWRN_HIT_MARKER);
    return;
  }
  const uint8_t* at = s.scan_begin + s.jumps[s.next_jump].offset;
  cinfo->src->bytes_in_buffer = static_cast<size_t>(s.end - at);
  cinfo->src->next_input_byte = at;
  cinfo->unread_marker = 0;
  reinterpret_cast<MarkerReaderHead*>(cinfo->marker)->next_restart_num = static_cast<int>(i & 7);
  s.start_interval(cinfo);
  s.at_marker = false;
  s.insufficient = false;
  s.skipping = false;
}

// The scan's last MCU was in a skipped interval: leave the source at the marker after the
// scan (EOI), where libjpeg's jpeg_finish_decompress reads on.
void end_skipped_scan(FastHuffman& s, j_decompress_ptr cinfo) {
  s.bits = Bits();
  s.bits.p = s.scan_begin + s.scan_bytes;
  s.at_marker = false;
  s.eof_unreported = false;
  cinfo->unread_marker = 0;
}

FASTDATA_HOT inline boolean decode_mcu_body(j_decompress_ptr cinfo, JBLOCKROW* MCU_data) {
  FastHuffman& s = *static_cast<FastHuffman*>(cinfo->client_data);
  if (cinfo->restart_interval && s.restarts_to_go == 0) {
    if (s.indexed) {
      enter_interval(s, cinfo);
    } else {
      process_restart(s, cinfo);
    }
  }
  if (!s.insufficient && !s.skipping) {  // else past the data, or not needed: leave the blocks zero
    Bits r = s.bits;
    if (MCU_data && s.mcu_col >= s.first_col && s.mcu_col <= s.last_col) {
      decode_blocks<true>(s, r, cinfo, MCU_data);
    } else {
      decode_blocks<false>(s, r, cinfo, MCU_data);
    }
    s.bits = r;
    if (r.nbits < r.pad_bits) {  // this MCU read zeros past the end of the data
      s.insufficient = true;
      report_eof(s, cinfo);
      warn(cinfo, JWRN_HIT_MARKER);
    }
  }
  if (++s.mcu_col == static_cast<long>(cinfo->MCUs_per_row)) s.mcu_col = 0;
  --s.restarts_to_go;  // counts only with a restart interval
  if (--s.mcus_left == 0) {
    if (s.skipping) {
      end_skipped_scan(s, cinfo);
    } else {
      return_read_ahead(s, cinfo);
    }
  }
  cinfo->src->next_input_byte = s.bits.p;
  cinfo->src->bytes_in_buffer = static_cast<size_t>(s.end - s.bits.p);
  return TRUE;
}

// The same code twice: for baseline x86-64, and with BMI2, whose one-uop variable shifts
// (shlx/shrx) the bit reader uses on every code (`shl %cl` is several uops on many cores).
// Measured +2% on the 2-core AMD box (interleaved A/B of two builds); not A/B'd on Intel.
boolean decode_mcu(j_decompress_ptr cinfo, JBLOCKROW* MCU_data) { return decode_mcu_body(cinfo, MCU_data); }
#ifdef FASTDATA_X86
__attribute__((target("bmi2"))) boolean decode_mcu_bmi2(j_decompress_ptr cinfo, JBLOCKROW* MCU_data) {
  return decode_mcu_body(cinfo, MCU_data);
}
#endif

using DecodeMcu = boolean (*)(j_decompress_ptr, JBLOCKROW*);

DecodeMcu pick_decode_mcu() {
#ifdef FASTDATA_X86
  if (bmi2_allowed()) return decode_mcu_bmi2;
#endif
  return decode_mcu;
}

// Canonical code assignment as libjpeg's jpeg_make_d_derived_tbl (which has already
// validated the table by the time we are installed), then the lookup table (layout in
// FastHuffman::Table): first one coefficient per entry, then, for AC tables, the second
// step where the bits left over after the first resolve a coefficient on their own.
void build_table(const JHUFF_TBL& h, bool is_dc, FastHuffman::Table* t) {
  int huffsize[257], huffcode[257];
  int p = 0;
  for (int l = 1; l <= 16; ++l) {
    for (int i = 0; i < h.bits[l] && p < 256; ++i) huffsize[p++] = l;
  }
  huffsize[p] = 0;
  const int count = p;
  int code = 0, si = huffsize[0];
  p = 0;
  while (huffsize[p]) {
    while (huffsize[p] == si) huffcode[p++] = code++;
    code <<= 1;
    ++si;
  }
  p = 0;
  for (int l = 1; l <= 16; ++l) {
    if (h.bits[l] && p < count) {
      t->valoffset[l] = p - huffcode[p];
      p = std::min(p + h.bits[l], count);
      t->maxcode[l] = huffcode[p - 1];
    } else {
      t->maxcode[l] = -1;
    }
  }
  t->maxcode[0] = -1;
  t->valoffset[0] = t->valoffset[17] = 0;
  t->maxcode[17] = 0xFFFFF;
  std::memcpy(t->huffval, h.huffval, sizeof(t->huffval));

  constexpr int kSize = 1 << kLut;
  uint64_t* lut = t->lut;
  std::memset(lut, 0, sizeof(t->lut));
  std::memset(t->symbols, 0, sizeof(t->symbols));
  for (p = 0; p < count; ++p) {
    const int len = huffsize[p];
    if (len > kLut) continue;
    const int sym = h.huffval[p];
    const int first = huffcode[p] << (kLut - len), n = 1 << (kLut - len);
    for (int i = 0; i < n; ++i) t->symbols[first + i] = static_cast<uint16_t>((sym << 5) | len);
    // AC symbols without a value: 0xF0 is sixteen zeros (run 15 and the zero itself);
    // every other one ends the block, as in libjpeg: run 63 takes k past the block's end
    // and the zero it writes lands on a coefficient that is still zero (or on nothing).
    int run = is_dc ? 0 : sym >> 4;
    const int size = is_dc ? sym : sym & 15;
    if (!is_dc && size == 0 && run != 15) run = 63;
    const bool resolvable = size <= 15 && len + size <= kLut;
    for (int i = 0; i < n; ++i) {
      const int idx = first + i;
      if (resolvable) {
        const int bits = size ? (idx >> (kLut - len - size)) & ((1 << size) - 1) : 0;
        const uint64_t value = static_cast<uint16_t>(size ? extend(bits, size) : 0);
        const uint64_t used = static_cast<uint64_t>(len + size);
        // The second step, until paired below: advance 0, the same value again.
        lut[idx] = FastHuffman::kResolved | (used << 5) | used | (static_cast<uint64_t>(run) << 16) | (value << 32) |
                   (value << 48);
      } else {
        lut[idx] = (static_cast<uint64_t>(sym) << 16) | static_cast<uint64_t>(len);
      }
    }
  }
  if (is_dc) return;
  // In place: a paired entry keeps its first coefficient's fields (bits 5..9, run1, value1),
  // which are all that is read from the entry a second coefficient comes from. An end of
  // block is never paired after (the bits that follow are the next block's), but may be
  // the second: its advance 64 ends the block as in the one-coefficient case.
  for (int idx = 0; idx < kSize; ++idx) {
    const uint64_t e1 = lut[idx];
    if (!(e1 & FastHuffman::kResolved) || ((e1 >> 16) & 0x7F) == 63) continue;  // no value, or end of block
    const int used1 = static_cast<int>(e1 & 0x1F);
    // The bits after the first coefficient, left-aligned: their low used1 bits are not
    // known here, so the second entry counts only if it reads none of them.
    const uint64_t e2 = lut[(idx << used1) & (kSize - 1)];
    const int used2 = static_cast<int>((e2 >> 5) & 0x1F);
    if (!(e2 & FastHuffman::kResolved) || used1 + used2 > kLut) continue;
    lut[idx] = (e1 & 0x0000FFFF007FFFE0ULL) | static_cast<uint64_t>(used1 + used2) |
               ((1 + ((e2 >> 16) & 0x7F)) << 24) | (((e2 >> 32) & 0xFFFF) << 48);
  }
}

}  // namespace

void set_fast_huffman_enabled(bool enabled) { g_enabled.store(enabled); }
bool fast_huffman_enabled() { return g_enabled.load(); }
uint64_t fast_huffman_scans() { return g_installs.load(std::memory_order_relaxed); }
uint64_t restart_index_jumps() { return g_index_jumps.load(std::memory_order_relaxed); }

const FastHuffman::Table* FastHuffman::table_for(const JHUFF_TBL* src, int kind, int number) {
  uint8_t key[17 + 256];
  std::memcpy(key, src->bits, 17);
  std::memcpy(key + 17, src->huffval, 256);
  if (!built_[kind][number] || std::memcmp(key, built_from_[kind][number], sizeof(key)) != 0) {
    build_table(*src, kind == 0, &tables_[kind][number]);
    std::memcpy(built_from_[kind][number], key, sizeof(key));
    built_[kind][number] = true;
  }
  return &tables_[kind][number];
}

void FastHuffman::start_interval(j_decompress_ptr cinfo) {
  bits = Bits();
  begin = bits.p = cinfo->src->next_input_byte;
  end = begin + cinfo->src->bytes_in_buffer;
  marker_at = nullptr;
  eof_unreported = false;
  for (int& v : last_dc) v = 0;
  restarts_to_go = cinfo->restart_interval;
}

void FastHuffman::set_cropped_columns(j_decompress_ptr cinfo, JDIMENSION xoffset) {
  // libjpeg-turbo's jpeg_crop_scanline: the alignment is one iMCU column.
#if JPEG_LIB_VERSION >= 70
  const long scaled = cinfo->min_DCT_h_scaled_size;
#else
  const long scaled = cinfo->min_DCT_scaled_size;
#endif
  const long align = (cinfo->comps_in_scan == 1 && cinfo->num_components == 1) ? scaled
                                                                               : scaled * cinfo->max_h_samp_factor;
  first_col = static_cast<long>(xoffset) / align;
  last_col = (static_cast<long>(xoffset) + static_cast<long>(cinfo->output_width) + align - 1) / align - 1;
}

bool FastHuffman::interval_needed(long i, long mcus_per_row) const {
  // MCUs m0..m1 of the scan, rows r0..r1: needed if one of them is in a needed row and,
  // in that row, in the cropped columns (a whole row always is).
  const long m0 = i * interval_mcus, m1 = std::min(m0 + interval_mcus, total_mcus) - 1;
  const long r0 = m0 / mcus_per_row, r1 = m1 / mcus_per_row;
  const long lo = std::max(r0, need_row0), hi = std::min(r1, need_row1);
  if (lo > hi) return false;
  if (hi - lo >= 2) return true;
  for (long r : {lo, hi}) {
    const long c0 = r == r0 ? m0 % mcus_per_row : 0;
    const long c1 = r == r1 ? m1 % mcus_per_row : mcus_per_row - 1;
    if (c0 <= last_col && c1 >= first_col) return true;
  }
  return false;
}

namespace {

// The start of interval `target`, reading the RSTn markers of the scan from `from`, the
// start of interval `first` (< target): each must have its number and end at or before
// `limit`. Returns UINT32_MAX if the data does not have them.
uint32_t find_interval_start(const uint8_t* scan, uint32_t from, long first, long target, uint32_t limit) {
  uint32_t p = from;
  for (long j = first; j < target;) {
    // A marker takes two bytes, both before `limit`.
    const void* hit = p + 1 < limit ? std::memchr(scan + p, 0xFF, limit - 1 - p) : nullptr;
    if (hit == nullptr) return UINT32_MAX;
    const uint32_t q = static_cast<uint32_t>(static_cast<const uint8_t*>(hit) - scan);
    const uint8_t c = scan[q + 1];
    if (c == 0x00 || c == 0xFF) {  // a stuffed data byte, or a fill byte before a marker
      p = q + (c == 0x00 ? 2 : 1);
      continue;
    }
    if (c != 0xD0 + (j & 7)) return UINT32_MAX;  // another marker, or a RSTn out of sequence
    p = q + 2;
    ++j;
  }
  return p;
}

// Asks for the bytes that use_restart_index and the decode will read in each needed MCU row
// (from the indexed interval before its first cropped MCU, whose markers lead to it, to the
// indexed one after its last) all at once, so that their cache misses overlap: read one
// after another they stalled on memory at every needed row, where a sequential decode
// streams (perf: most of use_restart_index's own time was its first load of each row).
// Only addresses inside the record's bytes are touched.
void prefetch_needed_rows(const RestartIndex& index, const uint8_t* scan, size_t avail, long row0, long row1,
                          long mcus_per_row, long first_col, long last_col) {
  const long entries = static_cast<long>(index.offsets.size()) - 1;  // the last is the scan's end
  const long per_entry = index.interval * index.stride;               // MCUs
  for (long r = row0; r <= row1; ++r) {
    const long m0 = r * mcus_per_row + std::min(first_col, mcus_per_row - 1);
    const long m1 = r * mcus_per_row + std::min(last_col, mcus_per_row - 1);
    const size_t from = index.offsets[std::min(m0 / per_entry, entries)];
    const size_t to = std::min<size_t>(avail, index.offsets[std::min(m1 / per_entry + 1, entries)] + 2);
    for (size_t o = from >= 2 ? from - 2 : 0; o < to; o += 64) __builtin_prefetch(scan + o);
  }
}

}  // namespace

const char* FastHuffman::use_restart_index(j_decompress_ptr cinfo, const RestartIndex& index, int y0, int y1) {
  const long interval = index.interval, stride = index.stride, count = static_cast<long>(index.count);
  const uint32_t* offs = index.offsets.data();
  const long entries = static_cast<long>(index.offsets.size()) - 1;  // the last is scan_bytes
  if (cinfo->client_data != this || static_cast<long>(cinfo->restart_interval) != interval || interval <= 0) {
    return "restart index does not match the file's restart interval";
  }
  if (count != (total_mcus + interval - 1) / interval || stride <= 0 || entries != (count - 1) / stride + 1) {
    return "restart index does not match the number of restart intervals";
  }
#if JPEG_LIB_VERSION >= 70
  const long scaled = cinfo->min_DCT_v_scaled_size;
#else
  const long scaled = cinfo->min_DCT_scaled_size;
#endif
  const long rows_per_mcu_row = cinfo->comps_in_scan == 1 ? scaled : scaled * cinfo->max_v_samp_factor;
  // libjpeg's fancy upsampling of vertically subsampled chroma reads one chroma row above
  // and below each output row: max_v_samp_factor output rows at most (fewer where DCT
  // scaling enlarged the chroma IDCT). Those rows' MCUs are decoded too, whichever MCU row
  // they fall in; the rest of libjpeg's context (iMCU rows it reads and discards) may be zeros.
  const long margin = cinfo->max_v_samp_factor;
  need_row0 = std::max(0L, static_cast<long>(y0) - margin) / rows_per_mcu_row;
  need_row1 = (std::max(static_cast<long>(y1), 1L) - 1 + margin) / rows_per_mcu_row;
  interval_count = count;
  interval_mcus = interval;
  need_mcu0 = need_row0 * static_cast<long>(cinfo->MCUs_per_row);
  need_mcu1 = (need_row1 + 1) * static_cast<long>(cinfo->MCUs_per_row);
  const long mcus_per_row = static_cast<long>(cinfo->MCUs_per_row);
  const long last_row = std::min(need_row1, static_cast<long>(cinfo->MCU_rows_in_scan) - 1);
  const uint32_t scan_size = offs[entries];
  scan_bytes = scan_size;
  prefetch_needed_rows(index, scan_begin, static_cast<size_t>(end - scan_begin), need_row0, last_row, mcus_per_row,
                       first_col, last_col);
  // The index against the data: the scan ends with a marker where the index says, and (below)
  // each jump lands right after the RSTn that ends the interval before it. A damaged index
  // or record fails here, before any jump; it can point only inside this record's bytes.
  const size_t avail = static_cast<size_t>(end - scan_begin);
  if (static_cast<size_t>(scan_size) + 2 > avail || scan_begin[scan_size] != 0xFF ||
      scan_begin[scan_size + 1] != 0xD9) {
    return "restart index: the scan does not end where the index says (truncated or damaged record)";
  }
  // Indexed starts are checked where a jump uses them (below): parse_restart_index already
  // bounded them (increasing, within the scan), and the others are never read.
  auto indexed_start_ok = [&](long k) {
    const uint32_t o = offs[k];
    return k == 0 || (o >= 2 && o <= scan_size && scan_begin[o - 2] == 0xFF &&
                      scan_begin[o - 1] == 0xD0 + ((k * stride - 1) & 7));
  };
  // The jumps: a run of needed intervals starts with the one holding a needed row's first
  // cropped MCU (an interval before it in that row would hold only columns left of the
  // crop, or be needed itself), so one candidate per needed MCU row covers them all.
  jumps.clear();
  next_jump = 0;
  long previous = 0;  // interval 0 is never a jump (the reader starts there)
  for (long r = need_row0; r <= last_row; ++r) {
    const long i = (r * mcus_per_row + std::min(first_col, mcus_per_row - 1)) / interval;
    if (i <= previous) continue;
    previous = i;
    if (!interval_needed(i, mcus_per_row) || interval_needed(i - 1, mcus_per_row)) continue;
    const long k = i / stride;
    uint32_t at = offs[k];
    if (!indexed_start_ok(k)) return "restart index: an interval does not start after its restart marker (damaged record)";
    if (i != k * stride) {
      // Between two indexed starts: read the markers from the indexed one. The last of them
      // ends where the next indexed interval starts (or at the scan's closing marker).
      const uint32_t limit = k + 1 < entries ? std::min(offs[k + 1], scan_size) - 2 : scan_size;
      at = find_interval_start(scan_begin, offs[k], k * stride, i, limit);
      if (at == UINT32_MAX) {
        return "restart index: the restart markers between two indexed intervals do not match it (damaged "
               "record)";
      }
    }
    jumps.push_back(Jump{i, at});
  }
  indexed = true;
  skipping = false;
  next_interval = 0;
  restarts_to_go = 0;  // the first MCU is a boundary: interval 0 may be skipped too
  return nullptr;
}

bool FastHuffman::install(j_decompress_ptr cinfo) {
#if !defined(LIBJPEG_TURBO_VERSION) || !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
  // Checked only against libjpeg-turbo's decoder, and the 8-byte refill reads little-endian.
  return false;
#endif
  if (!fast_huffman_enabled() || cinfo->progressive_mode || cinfo->arith_code || cinfo->data_precision != 8 ||
      jpeg_has_multiple_scans(cinfo) || cinfo->entropy == nullptr || cinfo->src == nullptr ||
      cinfo->blocks_in_MCU > 10 || cinfo->comps_in_scan > 4 || cinfo->unread_marker != 0) {
    return false;
  }
  for (int b = 0; b < cinfo->blocks_in_MCU; ++b) {
    const int ci = cinfo->MCU_membership[b];
    const jpeg_component_info* info = cinfo->cur_comp_info[ci];
    if (info == nullptr || info->dc_tbl_no < 0 || info->dc_tbl_no > 3 || info->ac_tbl_no < 0 || info->ac_tbl_no > 3) {
      return false;
    }
    const JHUFF_TBL* dct = cinfo->dc_huff_tbl_ptrs[info->dc_tbl_no];
    const JHUFF_TBL* act = cinfo->ac_huff_tbl_ptrs[info->ac_tbl_no];
    if (dct == nullptr || act == nullptr) return false;
    dc[b] = table_for(dct, 0, info->dc_tbl_no);
    ac[b] = table_for(act, 1, info->ac_tbl_no);
    comp[b] = ci;
  }
  start_interval(cinfo);
  at_marker = false;
  insufficient = false;
  mcus_left = static_cast<long>(cinfo->MCUs_per_row) * static_cast<long>(cinfo->MCU_rows_in_scan);
  mcu_col = 0;
  first_col = 0;
  last_col = 1L << 30;
  indexed = false;
  skipping = false;
  next_interval = 0;
  total_mcus = mcus_left;
  scan_begin = begin;
  cinfo->client_data = this;
  reinterpret_cast<EntropyDecoderHead*>(cinfo->entropy)->decode_mcu = pick_decode_mcu();
  g_installs.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace fastdata
