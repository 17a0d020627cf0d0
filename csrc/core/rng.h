// Counter-based random numbers: every draw for sample i of epoch e is a pure function of
// (seed, epoch, i, draw number), so results never depend on threads or scheduling.
#pragma once
#include <cstdint>

namespace fastdata {

// SplitMix64's finalizer: a bijective 64-bit mixer with good avalanche.
inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t epoch, uint64_t index)
      : key_(mix64(mix64(mix64(seed) ^ (epoch * 0xd1b54a32d192ed03ULL)) ^
                   (index * 0x8cb92ba72f3d8dd7ULL))) {}

  uint64_t next() { return mix64(key_ ^ mix64(++counter_)); }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; bias < n / 2^64).
  int64_t below(int64_t n) {
    return static_cast<int64_t>((static_cast<unsigned __int128>(next()) * static_cast<uint64_t>(n)) >> 64);
  }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace fastdata
