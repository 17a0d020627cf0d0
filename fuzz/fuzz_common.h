// Shared by the libFuzzer harnesses in this folder: the parameter block that the plan and
// crop targets read before the JPEG bytes, the transform spec it encodes, and the rules
// for what counts as a finding.
//
// Expected outcomes of hostile input: fastdata::DecodeError and std::invalid_argument (the
// exceptions the engine turns into a per-sample error). Anything else is a finding: another
// exception escapes LLVMFuzzerTestOneInput (libFuzzer aborts on it), a FUZZ_CHECK fails, or
// ASan/UBSan report (built with -fno-sanitize-recover, so every report ends the run).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "core/augment.h"
#include "core/decoder.h"

namespace fuzz {

// Pixel limit for decodes in the harnesses. The engine's default (89,478,485, Pillow's) lets
// a 40-byte header demand seconds of decoding and ~270 MB of output, which turns fuzzing
// into a timeout hunt; 1 Mpx (say 1024 x 1024) still covers every code path (1/8 DCT
// scaling, crops, restarts, CMYK). The plan target, which decodes nothing, uses the
// engine's default.
constexpr int64_t kDecodeMaxPixels = int64_t{1} << 20;
constexpr int64_t kEngineMaxPixels = 89478485;  // fastdata/engine.py DEFAULT_MAX_PIXELS

#define FUZZ_CHECK(cond, ...)                                              \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                   \
      std::fprintf(stderr, "\n");                                          \
      std::abort();                                                        \
    }                                                                      \
  } while (0)

// Runs f(); returns false when it threw one of the expected exceptions.
template <typename F>
bool expected_or_ok(F&& f) {
  try {
    f();
    return true;
  } catch (const fastdata::DecodeError&) {
    return false;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

// Little-endian fields from a fixed-size prefix; reads past the end give zeros, so any
// input length is a valid parameter block.
class Params {
 public:
  static constexpr size_t kSize = 32;
  Params(const uint8_t* data, size_t size) {
    std::memset(bytes_, 0, sizeof(bytes_));
    std::memcpy(bytes_, data, size < kSize ? size : kSize);
  }
  uint32_t u8() { return take(1); }
  uint32_t u16() { return take(2); }
  uint32_t u32() { return take(4); }

 private:
  uint32_t take(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n && pos_ < kSize; ++i) v |= static_cast<uint32_t>(bytes_[pos_++]) << (8 * i);
    return v;
  }
  uint8_t bytes_[kSize];
  size_t pos_ = 0;
};

// A positive double as the Python API lets through (`0 < lo <= hi`): a log-scale value in
// [2^-16, 2^16], or one of the extremes (tiny, huge, infinity) that the checks also accept.
inline double positive_double(uint32_t u16) {
  switch (u16) {
    case 0: return std::numeric_limits<double>::denorm_min();
    case 1: return 1e-300;
    case 0xFFFD: return 1e300;
    case 0xFFFE: return std::numeric_limits<double>::max();
    case 0xFFFF: return std::numeric_limits<double>::infinity();
    default: return std::exp2((static_cast<double>(u16) - 32768.0) / 2048.0);
  }
}

struct FuzzSpec {
  fastdata::TransformSpec spec;
  uint64_t seed = 0, epoch = 0, index = 0;
  uint32_t flags = 0;  // harness-specific bits
};

// Reads a spec valid for the Python API (fastdata/transforms.py, fastdata/engine.py
// native_spec): kinds RandomResizedCrop and CenterCrop only, output 1..max_out per axis,
// 0 < scale_lo <= scale_hi, 0 < ratio_lo <= ratio_hi, hflip in [0, 1], resize_to >= 1.
inline FuzzSpec read_spec(Params& p, int max_out) {
  FuzzSpec f;
  const uint32_t kind_flags = p.u8();
  f.flags = kind_flags >> 1;
  f.spec.kind = (kind_flags & 1) ? fastdata::TransformKind::kCenterCrop : fastdata::TransformKind::kRandomResizedCrop;
  f.spec.out_h = 1 + static_cast<int>(p.u16() % static_cast<uint32_t>(max_out));
  f.spec.out_w = 1 + static_cast<int>(p.u16() % static_cast<uint32_t>(max_out));
  double s0 = positive_double(p.u16()), s1 = positive_double(p.u16());
  double r0 = positive_double(p.u16()), r1 = positive_double(p.u16());
  if (s0 > s1) std::swap(s0, s1);
  if (r0 > r1) std::swap(r0, r1);
  f.spec.scale_lo = s0, f.spec.scale_hi = s1;
  f.spec.ratio_lo = r0, f.spec.ratio_hi = r1;
  f.spec.hflip = p.u8() / 255.0;
  const uint32_t resize = p.u32();
  // Mostly realistic sizes, sometimes anything up to INT_MAX (Python passes any positive int).
  f.spec.resize_to = (resize & 0x80000000u) ? static_cast<int>(resize & 0x7FFFFFFFu) : static_cast<int>(resize % 4096);
  if (f.spec.resize_to < 1) f.spec.resize_to = 1;
  f.spec.roi = (f.flags & 1) == 0;
  f.seed = p.u32();
  f.epoch = p.u8();
  f.index = p.u16();
  return f;
}

}  // namespace fuzz
