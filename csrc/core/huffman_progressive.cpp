// FastHuffman for progressive JPEGs: every scan of an 8-bit progressive Huffman file decoded
// with the bit reader of the baseline decoder (huffman_reader.h), into libjpeg's
// whole-image coefficient buffer.
//
// Why: a progressive file's scans are all entropy-decoded before its first row comes out,
// and that is ~93% of its decode time (libjpeg-turbo 2.1.5, jpeg_read_coefficients against
// a full decode, demo set, 2-core box); most of it in the refinement scans' loop over
// every coefficient of every block (libjpeg's decode_mcu_AC_refine, ~70% of the samples in
// perf). Progressive rows are the native side's bound in a hybrid epoch over mixed data (the
// hardware engines refuse them), and web-scraped sets hold many.
//
// How: libjpeg creates its progressive entropy decoder inside jpeg_start_decompress and
// starts the first scan at once through the input controller's start_input_pass, the one
// hook it calls through a pointer there. prepare_progressive wraps that hook; the wrapper
// wraps the new entropy decoder's start_pass, which libjpeg calls at every scan. There
// libjpeg's own start_pass runs first (it checks the scan's parameters, keeps coef_bits,
// builds its tables, resets its flag) and then start_progressive_scan installs the
// decode_mcu below, which follows jdphuff.c (libjpeg-turbo 2.1.5) step by step: the same
// coefficients on valid data (tests/io/test_fast_huffman.py compares them), the same
// warnings and the same "out of data" behaviour on damaged data (the rest of a scan's
// blocks left as they are; DC refinement reads zeros).
#include <algorithm>
#include <atomic>
#include <climits>

#ifdef __x86_64__
#include <immintrin.h>
#endif

#include "core/cpu_features.h"
#include "core/huffman.h"
#include "core/huffman_reader.h"

namespace fastdata {
namespace {

using namespace huffman_reader;

std::atomic<bool> g_progressive_enabled{true};
std::atomic<uint64_t> g_progressive_scans{0};

// The start of libjpeg's input controller (jpegint.h), the same in IJG libjpeg 6b-9 and
// libjpeg-turbo 1.x-3.x.
struct InputControllerHead {
  int (*consume_input)(j_decompress_ptr cinfo);
  void (*reset_input_controller)(j_decompress_ptr cinfo);
  void (*start_input_pass)(j_decompress_ptr cinfo);
  void (*finish_input_pass)(j_decompress_ptr cinfo);
};

// libjpeg's entropy decoder through its insufficient_data flag, which moved in 3.0 (the
// lossless mode's two hooks came before it; the 3.0 betas, 2.1.90 and 2.1.91, have it so too).
// Fixed when fastdata is built: the library it runs with must be the one whose headers it was
// built against (pip builds fastdata against the system's libjpeg-turbo; rebuild it after
// moving that between 2.x and 3.x, which both install as libjpeg.so.62 / .so.8). libjpeg
// reads the flag before each MCU to know the last iMCU row decoded from real data, which block smoothing of an incomplete
// progressive file depends on: ours keeps it as libjpeg's own decoder would.
struct EntropyDecoderFlag {
  EntropyDecoderHead head;  // start_pass, decode_mcu
#if defined(LIBJPEG_TURBO_VERSION_NUMBER) && LIBJPEG_TURBO_VERSION_NUMBER >= 2001090
  void (*decode_mcus)();
  void (*process_restart)();
#endif
  boolean insufficient_data;
};

FASTDATA_HOT inline int read_ac_symbol(Bits& r, const FastHuffman::Table& t, j_decompress_ptr cinfo) {
  const uint16_t e = t.symbols[r.acc >> (64 - kLut)];
  if (e == 0) return decode_long(r, t, cinfo);
  consume(r, e & 0x1F);
  return e >> 5;
}

// jdphuff.c's decode_mcu_DC_first: each block's DC difference, added to its component's
// prediction, stored shifted by Al.
FASTDATA_HOT inline void dc_first(FastHuffman& s, Bits& r, j_decompress_ptr cinfo, JBLOCKROW* MCU_data) {
  for (int b = 0; b < cinfo->blocks_in_MCU; ++b) {
    const FastHuffman::Table& dc = *s.dc[b];
    if (r.nbits < 32) refill(s, r, cinfo);
    const int diff = read_dc_diff(r, dc, cinfo);
    int& last = s.last_dc[s.comp[b]];
    if ((last >= 0 && diff > INT_MAX - last) || (last < 0 && diff < INT_MIN - last)) {
      ERREXIT(cinfo, JERR_BAD_DCT_COEF);
    }
    last += diff;
    MCU_data[b][0][0] = static_cast<JCOEF>(static_cast<unsigned>(last) << s.scan_al);
  }
}

// decode_mcu_DC_refine: one bit per block, the next bit of its DC value.
FASTDATA_HOT inline void dc_refine(FastHuffman& s, Bits& r, j_decompress_ptr cinfo, JBLOCKROW* MCU_data) {
  const int p1 = 1 << s.scan_al;
  if (r.nbits < 32) refill(s, r, cinfo);  // blocks_in_MCU <= 10 bits
  for (int b = 0; b < cinfo->blocks_in_MCU; ++b) {
    if (take(r, 1)) MCU_data[b][0][0] = static_cast<JCOEF>(MCU_data[b][0][0] | p1);
  }
}

// A coefficient stored at zigzag position k (past 63: position 63, as kNaturalOrder's
// padding) in the block's word of nonzero flags: set or cleared by what was stored.
FASTDATA_HOT inline void flag(uint64_t* mask, int k, JCOEF stored) {
  const uint64_t bit = 1ULL << (63 - std::min(k, 63));
  *mask = stored != 0 ? *mask | bit : *mask & ~bit;
}

// An AC first scan's coefficient: the value shifted to bit Al, stored and flagged.
FASTDATA_HOT inline void store_first(JCOEF* block, uint64_t* mask, int k, int value, int al) {
  const JCOEF c = static_cast<JCOEF>(static_cast<unsigned>(value) << al);
  block[kNaturalOrder[k]] = c;
  flag(mask, k, c);
}

// decode_mcu_AC_first: the band's coefficients of one block, or one block of an end-of-band run.
FASTDATA_HOT inline void ac_first(FastHuffman& s, Bits& r, j_decompress_ptr cinfo, JCOEF* block, uint64_t* mask) {
  if (s.eobrun > 0) {
    --s.eobrun;
    return;
  }
  const FastHuffman::Table& t = *s.scan_ac;
  const int se = s.scan_se, al = s.scan_al;
  uint64_t unused;
  if (mask == nullptr) mask = &unused;
  for (int k = s.scan_ss; k <= se; ++k) {
    if (r.nbits < 32) refill(s, r, cinfo);  // a code (<= 17 bits) and its value (<= 15)
    // Most coefficients resolve in one lookup with their value (the baseline table's first
    // step). Not those without a value: sixteen zeros must write nothing (this band's
    // positions may belong to a scan still to come) and the end of a band carries a run.
    const uint64_t e = lookup(r, t);
    const int value = static_cast<int16_t>(e >> 32);
    if ((e & FastHuffman::kResolved) && value != 0) {
      consume(r, (e >> 5) & 0x1F);
      k += (e >> 16) & 0x7F;
      store_first(block, mask, k, value, al);
      continue;
    }
    const int sym = read_ac_symbol(r, t, cinfo);
    const int run = sym >> 4, size = sym & 15;
    if (size) {
      k += run;  // at most 63 + 15: kNaturalOrder is padded
      store_first(block, mask, k, extend(take(r, size), size), al);
    } else if (run == 15) {
      k += 15;  // sixteen zeros
    } else {  // end of band, for this block and 2^run - 1 + (run bits) more
      unsigned eob = 1u << run;
      if (run) eob += static_cast<unsigned>(take(r, run));
      s.eobrun = eob - 1;
      break;
    }
  }
}

// The refinement scans keep a block's nonzero coefficients as one 64-bit word, zigzag
// position j at bit 63 - j: in this order BMI2's deposit (which fills a mask's bits from the
// lowest up with a value's bits from the lowest up) gives the first bit read, the value's
// highest, to the lowest position (HardwareDeposit), and the bit walks go through positions
// upwards from the highest bit down (SoftwareDeposit).

// Zigzag positions lo..hi as bits 63 - hi..63 - lo (none when hi < lo; lo <= 65, hi <= 63).
FASTDATA_HOT inline uint64_t positions(int lo, int hi) {
  return hi < lo ? 0 : (~0ULL >> lo) & (~0ULL << (63 - hi));
}

// The block's nonzero coefficients among zigzag positions lo..hi (for blocks without a
// word kept: FastHuffman::nonzero_masks).
FASTDATA_HOT inline uint64_t nonzero_positions(const JCOEF* block, int lo, int hi) {
  uint64_t m = 0;
  for (int j = lo; j <= hi; ++j) m |= static_cast<uint64_t>(block[kNaturalOrder[j]] != 0) << (63 - j);
  return m;
}

// A correction bit of 1 on an already-nonzero coefficient: one step of p1 away from zero,
// unless its bit p1 is set already (libjpeg's "(coef & p1) == 0"). Branch-free: the sign and
// that bit are data.
FASTDATA_HOT inline void correct(JCOEF* c, int p1) {
  const int v = *c;
  const int sign = v >> 31;             // 0 or -1
  const int step = (p1 ^ sign) - sign;  // p1 away from zero: +p1 or -p1
  const int apply = -static_cast<int>((v & p1) == 0);
  *c = static_cast<JCOEF>(v + (step & apply));
}

// A refinement scan's block: its band, the steps of bit Al, and its nonzero positions (the
// kept word, or made here once: a new coefficient lands only where the walk has already
// passed, and a corrected one stays nonzero).
struct RefineBlock {
  const FastHuffman::Table& table;
  int se, p1, m1;
  uint64_t nonzero;
};

FASTDATA_HOT inline RefineBlock refine_block(const FastHuffman& s, const JCOEF* block, const uint64_t* mask) {
  const int ss = s.scan_ss, se = s.scan_se;
  return RefineBlock{*s.scan_ac, se, 1 << s.scan_al, static_cast<int>(~0u << s.scan_al),
                     mask != nullptr ? *mask & positions(ss, se) : nonzero_positions(block, ss, se)};
}

// One symbol of a refinement scan: false at an end of band (s.eobrun set, this block counted
// in it); else true with the zeros to pass in *run and the new coefficient in *v (+-p1, or 0
// for sixteen zeros).
FASTDATA_HOT inline bool refine_symbol(FastHuffman& s, Bits& r, j_decompress_ptr cinfo, const RefineBlock& b,
                                       int* run, int* v) {
  if (r.nbits < 32) refill(s, r, cinfo);  // a code (<= 17 bits), then a sign bit or up to 14 bits of run
  const int sym = read_ac_symbol(r, b.table, cinfo);
  const int size = sym & 15;
  *run = sym >> 4;
  *v = 0;
  if (size) {
    if (size != 1) warn(cinfo, JWRN_HUFF_BAD_CODE);  // a new coefficient is always +-1
    *v = take(r, 1) ? b.p1 : b.m1;
  } else if (*run != 15) {
    s.eobrun = 1u << *run;
    if (*run) s.eobrun += static_cast<unsigned>(take(r, *run));
    return false;
  }
  return true;
}

// The next n bits (n <= 63) as an integer, the first of them its highest bit.
FASTDATA_HOT inline uint64_t read_bits(FastHuffman& s, Bits& r, j_decompress_ptr cinfo, int n) {
  if (n <= r.nbits) {  // the usual case: a few bits, and enough are left after the symbol
    const uint64_t x = (r.acc >> 1) >> (63 - n);  // none when n is 0
    consume(r, n);
    return x;
  }
  uint64_t x = 0;
  while (n > 0) {
    const int part = std::min(n, 32);
    if (r.nbits < part) refill(s, r, cinfo);
    x = (x << part) | (r.acc >> (64 - part));
    consume(r, part);
    n -= part;
  }
  return x;
}

// The highest set bit of x (not 0), alone.
FASTDATA_HOT inline uint64_t top_bit(uint64_t x) { return uint64_t{1} << (63 - __builtin_clzll(x)); }

// The refinement walk's two steps over a block's words (the first position the highest bit).
// nth_zero(zeros, run): the bit, alone, of the (run + 1)-th set bit of `zeros` from the
// highest (the band's zeros still ahead), or 0 where there are not that many.
// corrections(s, r, cinfo, passed): one correction bit read for each bit set in `passed`, the
// highest first, and those that are 1, at their bits.
#ifdef FASTDATA_X86
// With BMI2's deposit (pdep), where it is fast (fast_bit_deposit): the zero is one deposit,
// and the correction bits are read at once and deposited. Not always_inline: these are taken
// in only once their caller has been inlined into a function built for BMI2
// (decode_mcu_progressive_bmi2).
struct HardwareDeposit {
  __attribute__((target("bmi2,popcnt"))) static inline uint64_t nth_zero(uint64_t zeros, int run) {
    const int left = __builtin_popcountll(zeros);
    return left > run ? _pdep_u64(uint64_t{1} << (left - 1 - run), zeros) : 0;
  }
  __attribute__((target("bmi2,popcnt"))) static inline uint64_t corrections(FastHuffman& s, Bits& r,
                                                                            j_decompress_ptr cinfo, uint64_t passed) {
    return _pdep_u64(read_bits(s, r, cinfo, __builtin_popcountll(passed)), passed);
  }
};
#endif

// The same as bit walks: for AMD Zen 1 and 2, whose pdep is microcode (tens to hundreds of
// cycles, by the bits set), and for CPUs without BMI2 (ARM among them). The walks are short:
// in the demo set's refinement scans a run is 0 for 53% of the symbols and at most 2 for 87%,
// and 58% of the symbols pass no nonzero coefficient. (A branch-free broadword select
// measured no faster than the walk.) kCounted: the correction bits are read at once (their
// count known) and walked onto the positions from the lowest, which is faster where the count
// is one instruction (the BMI2 build, Intel: 2.98 against 3.25 ms per demo progressive file,
// though 21.8 against 20.5 ms over 20 smooth 35 KB ones); without POPCNT the count is a libgcc
// call, and the walk takes one bit at a time from the highest position instead (21.2-21.8
// against 25.5-26.3 ms over the smooth files, 3.32-3.36 against 3.32 over the demo ones).
template <bool kCounted>
struct SoftwareDeposit {
  FASTDATA_HOT static inline uint64_t nth_zero(uint64_t zeros, int run) {
    for (int i = 0; i < run && zeros != 0; ++i) zeros &= ~top_bit(zeros);  // the run's zeros
    return zeros != 0 ? top_bit(zeros) : 0;
  }
  FASTDATA_HOT static inline uint64_t corrections(FastHuffman& s, Bits& r, j_decompress_ptr cinfo, uint64_t passed) {
    uint64_t out = 0;
    if constexpr (kCounted) {
      uint64_t v = read_bits(s, r, cinfo, __builtin_popcountll(passed));  // the first bit read, the highest
      // Four bits without a branch, then the rest: fewer mispredicted loop exits.
      for (int i = 0; i < 4; ++i, passed &= passed - 1, v >>= 1) out |= (passed & (0 - passed)) & (0 - (v & 1));
      for (; passed != 0; passed &= passed - 1, v >>= 1) out |= (passed & (0 - passed)) & (0 - (v & 1));
    } else {
      while (passed != 0) {
        if (r.nbits < 32) refill(s, r, cinfo);
        uint64_t bits = r.acc;  // the next bits, the first at the top
        int n = 0;
        for (; passed != 0 && n < 32; ++n, bits <<= 1) {
          const uint64_t at = top_bit(passed);
          out |= at & (0 - (bits >> 63));
          passed ^= at;
        }
        consume(r, n);
      }
    }
    return out;
  }
};

// decode_mcu_AC_refine: newly nonzero coefficients (+-1 at bit Al) placed after runs of
// still-zero ones, and a correction bit for every already-nonzero coefficient passed. libjpeg
// visits the band's positions one by one with a branch on each; here the block's nonzero
// positions are one word (RefineBlock), the zero a run ends on is picked from the band's
// zeros left (nth_zero), and the correction bits of the coefficients passed are put at their
// positions (corrections). The block's corrections are applied together at its end
// (each coefficient takes at most one per scan, and none is where a new one lands, except
// past the band's end with corrupt data, where libjpeg corrects first and then overwrites).
template <class Deposit>
FASTDATA_HOT inline void ac_refine(FastHuffman& s, Bits& reader, j_decompress_ptr cinfo, JCOEF* block, uint64_t* mask) {
  Bits r = reader;  // in registers (a reference would keep it in memory), given back at the end
  const RefineBlock b = refine_block(s, block, mask);
  const int se = b.se, p1 = b.p1;
  const uint64_t nonzero = b.nonzero;
  int k = s.scan_ss;
  uint64_t corrected = 0;  // the coefficients whose correction bit was 1
  int past_end = 0;        // a new coefficient that ran past the band's end (corrupt data)
  if (s.eobrun == 0) {
    for (; k <= se; ++k) {
      int run, v;
      if (!refine_symbol(s, r, cinfo, b, &run, &v)) break;  // the rest of the block: the end-of-band pass below
      // Past already-nonzero coefficients and `run` zeros, to the zero that becomes the new
      // coefficient (for sixteen zeros, the last of them), or past the band's end.
      const uint64_t ahead = positions(k, se);
      const uint64_t at = Deposit::nth_zero(~nonzero & ahead, run);  // the run's zero is the (run + 1)-th from k
      int target = se + 1;
      uint64_t passed = nonzero & ahead;
      if (at != 0) {
        target = 63 - __builtin_ctzll(at);
        passed &= ~(at | (at - 1));  // positions before the target: the bits above its bit
      }
      corrected |= Deposit::corrections(s, r, cinfo, passed);
      k = target;
      if (v) {
        if (k <= se) {
          block[kNaturalOrder[k]] = static_cast<JCOEF>(v);
          if (mask != nullptr) *mask |= 1ULL << (63 - k);
        } else {
          past_end = v;
        }
      }
    }
  }
  if (s.eobrun > 0) {
    // In an end-of-band run: only correction bits, for the nonzero coefficients left in the band.
    corrected |= Deposit::corrections(s, r, cinfo, nonzero & positions(k, se));
    --s.eobrun;
  }
  for (uint64_t m = corrected; m != 0; m &= m - 1) correct(block + kNaturalOrder[63 - __builtin_ctzll(m)], p1);
  if (past_end) {
    block[kNaturalOrder[se + 1]] = static_cast<JCOEF>(past_end);
    if (mask != nullptr) flag(mask, se + 1, static_cast<JCOEF>(past_end));
  }
  reader = r;
}

template <class Deposit>
FASTDATA_HOT inline boolean decode_mcu_progressive_body(j_decompress_ptr cinfo, JBLOCKROW* MCU_data) {
  FastHuffman& s = *static_cast<FastHuffman*>(cinfo->client_data);
  if (cinfo->restart_interval && s.restarts_to_go == 0) {
    process_restart(s, cinfo);  // DC predictions reset with the reader
    s.eobrun = 0;
  }
  // Out of data, libjpeg leaves the rest of the scan's blocks as they are, except in a DC
  // refinement scan, which reads on (zeros: its bits only ever set coefficient bits).
  if (!s.insufficient || s.scan_kind == FastHuffman::ScanKind::kDcRefine) {
    // No blocks (libjpeg's row skipping) only ever comes for single-scan files: a refinement
    // could not be decoded without the coefficients it refines.
    if (MCU_data == nullptr) ERREXIT(cinfo, JERR_NOTIMPL);
    // A non-interleaved (AC) scan's MCU is one block, in the component's raster order.
    uint64_t* mask = s.scan_masks != nullptr ? s.scan_masks + (s.total_mcus - s.mcus_left) : nullptr;
    Bits r = s.bits;
    switch (s.scan_kind) {
      case FastHuffman::ScanKind::kDcFirst: dc_first(s, r, cinfo, MCU_data); break;
      case FastHuffman::ScanKind::kDcRefine: dc_refine(s, r, cinfo, MCU_data); break;
      case FastHuffman::ScanKind::kAcFirst: ac_first(s, r, cinfo, MCU_data[0][0], mask); break;
      case FastHuffman::ScanKind::kAcRefine: ac_refine<Deposit>(s, r, cinfo, MCU_data[0][0], mask); break;
    }
    s.bits = r;
    if (r.nbits < r.pad_bits && !s.insufficient) {  // this MCU read zeros past the end of the data
      s.insufficient = true;
      report_eof(s, cinfo);
      warn(cinfo, JWRN_HIT_MARKER);
    }
  }
  *s.libjpeg_insufficient = s.insufficient;
  --s.restarts_to_go;  // counts only with a restart interval
  if (--s.mcus_left == 0) return_read_ahead(s, cinfo);
  cinfo->src->next_input_byte = s.bits.p;
  cinfo->src->bytes_in_buffer = static_cast<size_t>(s.end - s.bits.p);
  return TRUE;
}

// Three copies: portable; with BMI2 (its one-uop shifts and bit counts) but the software bit
// deposit, for AMD Zen 1 and 2, which microcode pdep; and with BMI2's pdep
// (fast_bit_deposit), on other CPUs that have it.
boolean decode_mcu_progressive(j_decompress_ptr cinfo, JBLOCKROW* MCU_data) {
  return decode_mcu_progressive_body<SoftwareDeposit<false>>(cinfo, MCU_data);
}
#ifdef FASTDATA_X86
__attribute__((target("bmi,bmi2,popcnt"))) boolean decode_mcu_progressive_bmi2_software_deposit(
    j_decompress_ptr cinfo, JBLOCKROW* MCU_data) {
  return decode_mcu_progressive_body<SoftwareDeposit<true>>(cinfo, MCU_data);
}
__attribute__((target("bmi,bmi2,popcnt"))) boolean decode_mcu_progressive_bmi2(j_decompress_ptr cinfo,
                                                                                JBLOCKROW* MCU_data) {
  return decode_mcu_progressive_body<HardwareDeposit>(cinfo, MCU_data);
}
#endif

using DecodeMcu = boolean (*)(j_decompress_ptr, JBLOCKROW*);

struct ProgressiveCopy {
  DecodeMcu decode_mcu;
  const char* name;
};

ProgressiveCopy pick_progressive_copy() {
#ifdef FASTDATA_X86
  if (fast_bit_deposit()) return {decode_mcu_progressive_bmi2, "pdep"};
  if (bmi2_allowed()) return {decode_mcu_progressive_bmi2_software_deposit, "software-deposit"};
#endif
  return {decode_mcu_progressive, "portable"};
}

void start_pass_hook(j_decompress_ptr cinfo) {
  FastHuffman& s = *static_cast<FastHuffman*>(cinfo->client_data);
  s.libjpeg_start_pass(cinfo);  // errors on a bad progression, warns on an odd one, as ever
  s.start_progressive_scan(cinfo);
}

void start_input_pass_hook(j_decompress_ptr cinfo) {
  FastHuffman& s = *static_cast<FastHuffman*>(cinfo->client_data);
  // Called once per image, right after libjpeg made its entropy decoder, which lives as
  // long as the image: its start_pass is wrapped for this scan and every later one. This
  // hook goes at once: the input controller outlives the image, and a later image on the
  // same struct must take this decoder only if prepare_progressive says so for it.
  reinterpret_cast<InputControllerHead*>(cinfo->inputctl)->start_input_pass = s.libjpeg_start_input_pass;
  auto* entropy = reinterpret_cast<EntropyDecoderFlag*>(cinfo->entropy);
  if (entropy != nullptr && cinfo->progressive_mode && !cinfo->arith_code && entropy->head.start_pass != start_pass_hook) {
    s.libjpeg_start_pass = entropy->head.start_pass;
    entropy->head.start_pass = start_pass_hook;
  }
  s.libjpeg_start_input_pass(cinfo);
}

}  // namespace

const char* progressive_decoder_copy() { return pick_progressive_copy().name; }
uint64_t fast_progressive_scans() { return g_progressive_scans.load(std::memory_order_relaxed); }
void set_fast_progressive_enabled(bool enabled) { g_progressive_enabled.store(enabled); }
bool fast_progressive_enabled() { return g_progressive_enabled.load(); }

bool FastHuffman::prepare_progressive(j_decompress_ptr cinfo) {
#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
  // Checked only against libjpeg-turbo's decoder (whose entropy struct layout the flag
  // above follows), and the 8-byte refill reads little-endian.
  return false;
#else
  if (!fast_huffman_enabled() || !fast_progressive_enabled() || !cinfo->progressive_mode || cinfo->arith_code || cinfo->data_precision != 8 ||
      cinfo->inputctl == nullptr || cinfo->src == nullptr) {
    return false;
  }
  auto* input = reinterpret_cast<InputControllerHead*>(cinfo->inputctl);
  if (input->start_input_pass != start_input_pass_hook) {  // once: a second call must not wrap the wrapper
    libjpeg_start_input_pass = input->start_input_pass;
    input->start_input_pass = start_input_pass_hook;
  }
  // One word of nonzero flags per block (the coefficients start zero), where the image's
  // components are few enough for component_masks; else the refinements test coefficients.
  masks_valid = false;
  if (cinfo->num_components >= 1 && cinfo->num_components <= 4) {
    size_t total = 0;
    for (int ci = 0; ci < cinfo->num_components; ++ci) {
      component_masks[ci] = total;
      total += static_cast<size_t>(cinfo->comp_info[ci].width_in_blocks) * cinfo->comp_info[ci].height_in_blocks;
    }
    // Bounded: check_coefficient_budget passed 16x as much. Each engine thread keeps its
    // words from image to image, but not a huge image's after smaller ones come (8 MB and up).
    if (nonzero_masks.capacity() > (size_t{1} << 20) && total < nonzero_masks.capacity() / 4) {
      std::vector<uint64_t>().swap(nonzero_masks);
    }
    nonzero_masks.assign(total, 0);
    masks_valid = true;
  }
  cinfo->client_data = this;
  return true;
#endif
}

void FastHuffman::start_progressive_scan(j_decompress_ptr cinfo) {
  scan_masks = nullptr;
  if (!take_progressive_scan(cinfo)) masks_valid = false;  // libjpeg's own decoder does not keep the nonzero flags
}

bool FastHuffman::take_progressive_scan(j_decompress_ptr cinfo) {
  if (cinfo->unread_marker != 0 || cinfo->blocks_in_MCU > 10 || cinfo->comps_in_scan < 1 ||
      cinfo->comps_in_scan > 4 || cinfo->src == nullptr) {
    return false;  // libjpeg's own decode_mcu (its start_pass chose it) decodes this scan
  }
  const bool dc_band = cinfo->Ss == 0;
  const bool refine = cinfo->Ah != 0;
  if (!dc_band && cinfo->comps_in_scan != 1) return false;  // libjpeg's start_pass refused it already
  for (int b = 0; b < cinfo->blocks_in_MCU; ++b) {
    const int ci = cinfo->MCU_membership[b];
    const jpeg_component_info* info = cinfo->cur_comp_info[ci];
    if (info == nullptr) return false;
    comp[b] = ci;
    if (dc_band && !refine) {
      if (info->dc_tbl_no < 0 || info->dc_tbl_no > 3 || cinfo->dc_huff_tbl_ptrs[info->dc_tbl_no] == nullptr) {
        return false;
      }
      dc[b] = table_for(cinfo->dc_huff_tbl_ptrs[info->dc_tbl_no], 0, info->dc_tbl_no);
    }
  }
  if (!dc_band) {
    const jpeg_component_info* info = cinfo->cur_comp_info[0];
    if (info->ac_tbl_no < 0 || info->ac_tbl_no > 3 || cinfo->ac_huff_tbl_ptrs[info->ac_tbl_no] == nullptr) {
      return false;
    }
    scan_ac = table_for(cinfo->ac_huff_tbl_ptrs[info->ac_tbl_no], 1, info->ac_tbl_no);
    const int ci = info->component_index;
    if (masks_valid && ci >= 0 && ci < 4 && ci < cinfo->num_components) {
      scan_masks = nonzero_masks.data() + component_masks[ci];
    }
  }
  scan_kind = dc_band ? (refine ? ScanKind::kDcRefine : ScanKind::kDcFirst)
                      : (refine ? ScanKind::kAcRefine : ScanKind::kAcFirst);
  scan_ss = cinfo->Ss;
  scan_se = cinfo->Se;
  scan_al = cinfo->Al;
  eobrun = 0;
  start_interval(cinfo);
  at_marker = false;
  insufficient = false;
  mcus_left = static_cast<long>(cinfo->MCUs_per_row) * static_cast<long>(cinfo->MCU_rows_in_scan);
  total_mcus = mcus_left;
  mcu_col = 0;
  first_col = 0;
  last_col = 1L << 30;
  indexed = false;
  skipping = false;
  scan_begin = begin;
  auto* entropy = reinterpret_cast<EntropyDecoderFlag*>(cinfo->entropy);
  libjpeg_insufficient = &entropy->insufficient_data;
  entropy->head.decode_mcu = pick_progressive_copy().decode_mcu;
  g_progressive_scans.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace fastdata
