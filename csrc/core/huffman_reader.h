// The bit reader and symbol decoding that FastHuffman's scan decoders share (baseline scans
// in huffman.cpp, progressive ones in huffman_progressive.cpp), and the pieces of libjpeg's
// internal interfaces they touch. Internal to those two files.
#pragma once
#include <array>
#include <cstdint>
#include <cstring>

#include <jerror.h>

#include "core/huffman.h"

namespace fastdata {
namespace huffman_reader {

constexpr int kLut = FastHuffman::kLutBits;

// Inlined into each target-specific copy of the decode loop (see decode_mcu_bmi2).
#define FASTDATA_HOT __attribute__((always_inline))

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

inline void warn(j_decompress_ptr cinfo, int code) {  // libjpeg's WARNMS
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
inline void append_byte(FastHuffman& s, Bits* r, j_decompress_ptr cinfo) {
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
__attribute__((noinline)) inline void refill_slow(FastHuffman& s, Bits* r, j_decompress_ptr cinfo) {
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
inline int decode_long(Bits& r, const FastHuffman::Table& t, j_decompress_ptr cinfo) {
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

// A DC difference (code and value): one lookup for most, else the symbol, then its value
// bits. Needs at most 31 bits buffered (a 17-bit bad code or a 16-bit code and 15 bits);
// libjpeg has checked that the table's DC symbols are <= 15.
FASTDATA_HOT inline int read_dc_diff(Bits& r, const FastHuffman::Table& dc, j_decompress_ptr cinfo) {
  const uint64_t f = lookup(r, dc);
  if (f & FastHuffman::kResolved) {
    consume(r, f & 0x1F);
    return static_cast<int16_t>(f >> 32);
  }
  const int size = read_symbol(r, f, dc, cinfo);
  return size ? extend(take(r, size), size) : 0;
}


// The end-of-data warning of libjpeg's memory source, once this reader needs bits past it.
inline void report_eof(FastHuffman& s, j_decompress_ptr cinfo) {
  if (s.eof_unreported) warn(cinfo, JWRN_JPEG_EOF);
  s.eof_unreported = false;
}

// After the scan's last MCU, and at each restart interval: give back the whole bytes read
// ahead but not used, so that libjpeg's marker reader sees (and warns about) any garbage
// between the data and the next marker, as it would had it read only what it needed.
inline void return_read_ahead(FastHuffman& s, j_decompress_ptr cinfo) {
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
inline void process_restart(FastHuffman& s, j_decompress_ptr cinfo) {
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

}  // namespace huffman_reader
}  // namespace fastdata
