#include "core/huffman.h"

#include "core/cpu_features.h"

#include <array>
#include <atomic>
#include <algorithm>
#include <cstring>

#include <jerror.h>

namespace fastdata {
namespace {

constexpr int kLut = FastHuffman::kLutBits;

// Inlined into each target-specific copy of the decode loop (see decode_mcu_bmi2).
#define FASTDATA_HOT __attribute__((always_inline))

std::atomic<bool> g_enabled{true};
std::atomic<uint64_t> g_installs{0};
std::atomic<uint64_t> g_index_jumps{0};

// The start of libjpeg's entropy-module interface (jpegint.h). Only the second field,
// decode_mcu, is touched: the first two are the same in IJG libjpeg 6b-9 and libjpeg-turbo
// 1.x-3.x, while the fields after them differ (3.x inserts decode_mcus and process_restart,
// IJG 9 a finish_pass), so libjpeg's insufficient_data flag is not ours to set (our own is
// FastHuffman::insufficient; libjpeg reads its flag only for progressive block smoothing).
// Declared here because not every libjpeg-turbo install ships jpegint.h.
struct EntropyDecoderHead {
  void (*start_pass)(j_decompress_ptr cinfo);
  boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW* MCU_data);
};

// The start of libjpeg's marker-reader interface (jpegint.h), the same in IJG libjpeg 6b-9
// and libjpeg-turbo 1.x-3.x: FastHuffman calls read_restart_marker at each restart
// interval, so that resynchronisation after damage is libjpeg's own.
// next_restart_num follows them in all of those versions (set when FastHuffman jumps to an
// indexed interval, so that libjpeg expects that interval's own RSTn at its end).
struct MarkerReaderHead {
  void (*reset_marker_reader)(j_decompress_ptr cinfo);
  int (*read_markers)(j_decompress_ptr cinfo);
  boolean (*read_restart_marker)(j_decompress_ptr cinfo);
  boolean saw_SOI;
  boolean saw_SOF;
  int next_restart_num;
};

// Zigzag position -> natural position, padded with 63s: a corrupt run past the end of the
// block stays inside it (libjpeg's jpeg_natural_order does the same), and an end-of-block
// entry (run 63, value 0, see build_table) writes its zero there.
constexpr std::array<uint8_t, 128> natural_order() {
  std::array<uint8_t, 128> t{};
  const uint8_t zigzag[64] = {0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,
                              12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28,
                              35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
                              58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63};
  for (int i = 0; i < 128; ++i) t[i] = i < 64 ? zigzag[i] : 63;
  return t;
}
constexpr std::array<uint8_t, 128> kNaturalOrder = natural_order();

void warn(j_decompress_ptr cinfo, int code) {  // libjpeg's WARNMS
  cinfo->err->msg_code = code;
  (*cinfo->err->emit_message)(reinterpret_cast<j_common_ptr>(cinfo), -1);
}

FASTDATA_HOT inline int extend(int bits, int size) {  // JPEG's sign extension of a size-bit magnitude
  return bits < (1 << (size - 1)) ? bits - (1 << size) + 1 : bits;
}

using Bits = FastHuffman::Bits;

// Appends one byte of entropy-coded data (or zeros once a marker or the end is reached),
// following libjpeg's jpeg_fill_bit_buffer: 0xFF 0x00 is a data 0xFF, fill bytes 0xFF are
// skipped, anything else is a marker, left in cinfo->unread_marker.
void append_byte(FastHuffman& s, Bits* r, j_decompress_ptr cinfo) {
  uint32_t c = 0;
  if (!s.at_marker) {
    const uint8_t* q = r->p;
    if (q < s.end && *q != 0xFF) {
      c = *q;
      r->p = q + 1;
    } else {
      while (q < s.end && *q == 0xFF) ++q;
      if (q >= s.end) {
        // libjpeg's memory source warns and inserts a fake EOI here. The warning waits until
        // the bits are needed (report_eof), or is left to libjpeg (return_read_ahead): this
        // reader looks up to 8 bytes further ahead than libjpeg's, and a crop that stops
        // short of the end must not fail for that.
        s.eof_unreported = true;
        cinfo->unread_marker = JPEG_EOI;
        r->p = s.end;
        s.at_marker = true;
      } else if (*q == 0) {
        // Fill bytes before a stuffed zero: not valid JPEG. libjpeg's byte reader takes the
        // run as one data 0xFF, as here, yet libjpeg-turbo 2.1.5 decoded "FF FF 00" to other
        // pixels than "FF 00", without a warning (fuzz/regressions/crop/fill-bytes-before-
        // stuffed-zero; my reading, not traced: its fast path's attempt at the MCU leaves
        // coefficients its slow retry does not overwrite). With no reference pixels to
        // match, the data is reported as corrupt (strict mode fails it).
        if (q - r->p > 1) {
          cinfo->err->msg_parm.i[0] = static_cast<int>(q - r->p - 1);
          cinfo->err->msg_parm.i[1] = 0;
          warn(cinfo, JWRN_EXTRANEOUS_DATA);
        }
        c = 0xFF;
        r->p = q + 1;
      } else {
        cinfo->unread_marker = *q;
        s.marker_at = r->p;
        r->p = q + 1;
        s.at_marker = true;
      }
    }
  }
  if (s.at_marker) r->pad_bits += 8;
  r->acc |= static_cast<uint64_t>(c) << (56 - r->nbits);
  r->nbits += 8;
}

// Byte by byte, near markers and the end of the data. Not inlined: its pointer argument
// would otherwise keep the hot loop's reader out of registers.
__attribute__((noinline)) void refill_slow(FastHuffman& s, Bits* r, j_decompress_ptr cinfo) {
  while (r->nbits <= 56) append_byte(s, r, cinfo);
}

// Past a marker (or the end of the data) the reader reads zeros: append them until more
// than 56 bits are buffered, counted in pad_bits, as append_byte does one byte at a time.
FASTDATA_HOT inline void pad_past_marker(Bits& r) {
  const int zeros = (56 - r.nbits) / 8 + 1;  // refill runs below 32 bits
  r.nbits += 8 * zeros;
  r.pad_bits += 8 * zeros;
}

// What refill_slow does, byte by byte, when a marker follows `n` data bytes (no 0xFF among
// them) that leave room in the buffer: append them, note the marker as append_byte does,
// then zeros. In one step because restart-indexed records have a marker after every MCU.
// `word` holds the next 8 bytes, first byte highest; `code` is the marker's second byte.
FASTDATA_HOT inline void take_until_marker(FastHuffman& s, Bits& r, j_decompress_ptr cinfo, uint64_t word, int n,
                                           uint8_t code) {
  r.acc |= (word & ~(~0ULL >> (8 * n))) >> r.nbits;
  r.nbits += 8 * n;  // <= 56: the caller checked that n bytes leave room
  cinfo->unread_marker = code;
  s.marker_at = r.p + n;
  s.at_marker = true;
  r.p += n + 2;
  pad_past_marker(r);
}

// Tops the bit buffer up to at least 32 bits (what decode_blocks needs): 8 bytes at once
// where none is 0xFF, else up to and past a marker, else the bytes before the first 0xFF if
// they are enough; byte by byte only around stuffed and fill bytes and near the end.
FASTDATA_HOT inline void refill(FastHuffman& s, Bits& r, j_decompress_ptr cinfo) {
  if (s.at_marker) {
    pad_past_marker(r);
    return;
  }
  if (s.end - r.p >= 8) {
    uint64_t w;
    std::memcpy(&w, r.p, 8);
    const uint64_t x = ~w;  // a zero byte here is an 0xFF byte in w
    const uint64_t ff = (x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL;
    const int k = (64 - r.nbits) >> 3;
    if (ff == 0) {
      // Take the whole bytes that fit. The bits of the partial next byte land below
      // nbits and are the same bits the next refill will OR in again.
      r.acc |= __builtin_bswap64(w) >> r.nbits;
      r.p += k;
      r.nbits += 8 * k;
      return;
    }
    // A marker in these bytes (every MCU in restart-indexed records): read up to it and
    // past it at once, as refill_slow would byte by byte, even where the bytes before it
    // would do for now (the next refill would stop at the same marker again).
    const int first_ff = __builtin_ctzll(ff) >> 3;  // the lowest flagged byte is exact
    if (first_ff < k && first_ff < 7) {
      const uint8_t code = r.p[first_ff + 1];
      if (code != 0x00 && code != 0xFF) {
        take_until_marker(s, r, cinfo, __builtin_bswap64(w), first_ff, code);
        return;
      }
    }
    // A stuffed byte (0xFF 0x00) or fill bytes: take the bytes before the first 0xFF when
    // they are enough for a coefficient, so that the byte-by-byte path reads only from the
    // 0xFF on. Bytes from the 0xFF on are masked off: the slow path may read them as other
    // bits (zeros at a marker).
    const int before = std::min(k, first_ff);
    if (r.nbits + 8 * before >= 32) {
      r.acc |= (__builtin_bswap64(w) & ~(~0ULL >> (8 * before))) >> r.nbits;
      r.p += before;
      r.nbits += 8 * before;
      return;
    }
  }
  Bits t = r;
  refill_slow(s, &t, cinfo);
  r = t;
}

FASTDATA_HOT inline void consume(Bits& r, int n) {
  r.acc <<= n;
  r.nbits -= n;
}

FASTDATA_HOT inline int take(Bits& r, int n) {  // n in 1..16
  const int v = static_cast<int>(r.acc >> (64 - n));
  consume(r, n);
  return v;
}

// A symbol whose code the table lookup did not resolve (longer than kLut bits, or bad).
int decode_long(Bits& r, const FastHuffman::Table& t, j_decompress_ptr cinfo) {
  int l = kLut + 1;
  int32_t code = static_cast<int32_t>(r.acc >> (64 - l));
  while (code > t.maxcode[l]) {  // maxcode[17] is a sentinel above every 17-bit code
    ++l;
    code = static_cast<int32_t>(r.acc >> (64 - l));
  }
  consume(r, l);
  if (l > 16) {
    warn(cinfo, JWRN_HUFF_BAD_CODE);
    return 0;
  }
  return t.huffval[(code + t.valoffset[l]) & 0xFF];
}

// A table entry that did not resolve a value: the symbol, read here (its value bits follow).
FASTDATA_HOT inline int read_symbol(Bits& r, uint64_t e, const FastHuffman::Table& t, j_decompress_ptr cinfo) {
  if (e == 0) return decode_long(r, t, cinfo);
  consume(r, e & 0x1F);
  return static_cast<int>(e >> 16) & 0xFF;
}

FASTDATA_HOT inline uint64_t lookup(const Bits& r, const FastHuffman::Table& t) {
  return t.lut[r.acc >> (64 - kLut)];
}

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
    int diff;
    const uint64_t f = lookup(r, dc);
    if (f & FastHuffman::kResolved) {
      consume(r, f & 0x1F);
      diff = static_cast<int16_t>(f >> 32);
    } else {
      const int size = read_symbol(r, f, dc, cinfo);  // libjpeg checked DC symbols are <= 15
      diff = size ? extend(take(r, size), size) : 0;
    }
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

// The end-of-data warning of libjpeg's memory source, once this reader needs bits past it.
void report_eof(FastHuffman& s, j_decompress_ptr cinfo) {
  if (s.eof_unreported) warn(cinfo, JWRN_JPEG_EOF);
  s.eof_unreported = false;
}

// After the scan's last MCU, and at each restart interval: give back the whole bytes read
// ahead but not used, so that libjpeg's marker reader sees (and warns about) any garbage
// between the data and the next marker, as it would had it read only what it needed.
void return_read_ahead(FastHuffman& s, j_decompress_ptr cinfo) {
  Bits& r = s.bits;
  const uint8_t* q = r.p;
  if (s.at_marker) {
    if (s.marker_at != nullptr) {
      q = s.marker_at;  // un-read the marker: libjpeg's marker reader finds it again
    } else if (s.eof_unreported) {
      // Un-read the end of the data too: libjpeg's source meets it itself when (and only
      // if) libjpeg reads on, warns and inserts its fake EOI, as without this decoder.
      q = s.end;
      s.eof_unreported = false;
    } else {
      return;  // the end, met and reported, or a marker libjpeg left unread: keep its state
    }
    cinfo->unread_marker = 0;
    s.at_marker = false;
  }
  for (int whole = (r.nbits - r.pad_bits) / 8; whole > 0 && q > s.begin; --whole) {
    q -= (q - s.begin >= 2 && q[-1] == 0x00 && q[-2] == 0xFF) ? 2 : 1;  // a stuffed 0xFF is two bytes
  }
  r = Bits();
  r.p = q;
}

// At a restart interval, as libjpeg's process_restart: hand the data back to libjpeg's
// marker reader (whole bytes read ahead included, which it counts as extraneous), let it
// read the RSTn marker or resynchronise, then start afresh after it with the DC
// predictions reset. Decoding resumes only if the marker was found.
void process_restart(FastHuffman& s, j_decompress_ptr cinfo) {
  auto* marker = reinterpret_cast<MarkerReaderHead*>(cinfo->marker);
  if (s.at_marker && s.marker_at != nullptr && s.bits.nbits - s.bits.pad_bits < 8 &&
      cinfo->unread_marker == JPEG_RST0 + marker->next_restart_num) {
    // The expected RSTn right after the interval's data, no byte in between: what libjpeg's
    // read_restart_marker does then (accept it, expect the next number), without handing the
    // data back and forth. With a marker every MCU (restart-indexed records) this is every
    // MCU; anything else (extraneous bytes, another marker, the end) takes libjpeg's path.
    marker->next_restart_num = (marker->next_restart_num + 1) & 7;
    cinfo->unread_marker = 0;
    cinfo->src->next_input_byte = s.bits.p;  // just after the marker (append_byte)
    cinfo->src->bytes_in_buffer = static_cast<size_t>(s.end - s.bits.p);
    s.start_interval(cinfo);
    s.at_marker = false;
    s.insufficient = false;
    return;
  }
  return_read_ahead(s, cinfo);
  cinfo->src->next_input_byte = s.bits.p;
  cinfo->src->bytes_in_buffer = static_cast<size_t>(s.end - s.bits.p);
  // Never false here: the memory source does not suspend. Should it be, treat it as the end.
  const bool read = reinterpret_cast<MarkerReaderHead*>(cinfo->marker)->read_restart_marker(cinfo);
  s.start_interval(cinfo);
  s.at_marker = !read || cinfo->unread_marker != 0;  // a marker libjpeg left unread: zeros from here
  if (!s.at_marker) s.insufficient = false;
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
  static const bool bmi2 = simd_allowed() && __builtin_cpu_supports("bmi2");
  if (bmi2) return decode_mcu_bmi2;
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
  for (p = 0; p < count; ++p) {
    const int len = huffsize[p];
    if (len > kLut) continue;
    const int sym = h.huffval[p];
    const int first = huffcode[p] << (kLut - len), n = 1 << (kLut - len);
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
