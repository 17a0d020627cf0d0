// The native engine's resize filter tables for a whole batch, for the GPU resampler
// (fastdata/decoders/gpu_resize.py): the same taps and 14-bit weights as the CPU path, from
// the same function (build_axis_filter), so the two paths cannot drift apart. Built here
// rather than in numpy (10-20 ms per batch), and kept across calls: a set's tables repeat (see
// FilterKey), and building them every batch was about half of the GPU resampler's host time
// (docs/results.md, "Filter tables kept across batches").
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "bindings/register.h"
#include "bindings/released_gil.h"
#include "core/resize.h"

namespace py = pybind11;

namespace fastdata::bindings {
namespace {

using Doubles = py::array_t<double, py::array::c_style | py::array::forcecast>;
using Ints = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using Bools = py::array_t<bool, py::array::c_style | py::array::forcecast>;

// What build_axis_filter's output depends on once the window [lo, hi) is known: it works in the
// window's own coordinates (origin = start - lo, the window's length), so two windows at
// different offsets with equal keys get equal filters, `first` shifted by the offset. A
// RandomResizedCrop of integer boxes has origin 0: one filter per (crop length, flip) per
// axis, ~2 x 500 for a set of 500-pixel images, whatever the crops' positions.
struct FilterKey {
  uint64_t origin_bits, scale_bits;  // the doubles' bits: equal bits, equal arithmetic
  int64_t window;
  int out;
  bool reverse;
  bool operator==(const FilterKey& o) const {
    return origin_bits == o.origin_bits && scale_bits == o.scale_bits && window == o.window && out == o.out &&
           reverse == o.reverse;
  }
};

struct FilterKeyHash {
  size_t operator()(const FilterKey& k) const {
    uint64_t h = k.origin_bits * 0x9E3779B97F4A7C15ull;
    h ^= k.scale_bits + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h ^= static_cast<uint64_t>(k.window) * 0xC2B2AE3D27D4EB4Full + (h << 6) + (h >> 2);
    h ^= (static_cast<uint64_t>(k.out) << 1 | static_cast<uint64_t>(k.reverse)) + (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};

// One filter relative to its window's start: output k reads from lo + first[k].
struct RelativeFilter {
  std::vector<int32_t> first;
  std::vector<int16_t> weights;  // out * max_count, zero past count[k]
  int max_count = 0;
  int64_t need_lo = 0, need_hi = 0;
};

RelativeFilter relative_filter(const AxisFilter& af, int64_t lo, int out) {
  RelativeFilter r;
  r.max_count = af.max_count;
  r.need_lo = af.need_lo - lo;
  r.need_hi = af.need_hi - lo;
  r.first.resize(static_cast<size_t>(out));
  r.weights.assign(static_cast<size_t>(out) * af.max_count, 0);
  for (int k = 0; k < out; ++k) {
    r.first[k] = static_cast<int32_t>(af.first[k] - lo);
    for (int t = 0; t < af.count[k]; ++t) {
      r.weights[static_cast<size_t>(k) * af.max_count + t] =
          static_cast<int16_t>(af.weights[static_cast<size_t>(k) * af.taps + t]);
    }
  }
  return r;
}

// Shared by every caller (the GPU decoder's lanes call from their own threads). Bounded by
// bytes: when full it starts over, which a set whose windows keep changing (every image a new
// size under a fused center crop) does once per ~64 MB of new filters: 15,000-27,000 of them at
// 224 outputs (by the byte count below, ~2.5-4.3 KB each for scales 1-3, 3-7 taps).
class FilterCache {
 public:
  static constexpr size_t kMaxBytes = size_t{64} << 20;
  // Per entry beside the arrays: the map node, the shared_ptr's control block, allocator headers.
  static constexpr size_t kEntryOverhead = 160;
  using Entry = std::shared_ptr<const RelativeFilter>;

  Entry find(const FilterKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }
  void insert(const FilterKey& key, Entry entry) {
    const size_t bytes = kEntryOverhead + sizeof(RelativeFilter) + entry->first.size() * sizeof(int32_t) +
                         entry->weights.size() * sizeof(int16_t);
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes_ + bytes > kMaxBytes) clear_locked();
    if (map_.emplace(key, std::move(entry)).second) bytes_ += bytes;
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return map_.size();
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    clear_locked();
  }

 private:
  void clear_locked() {
    map_.clear();
    bytes_ = 0;
  }
  std::mutex mutex_;
  std::unordered_map<FilterKey, Entry, FilterKeyHash> map_;
  size_t bytes_ = 0;
};

FilterCache& filter_cache() {
  static FilterCache* cache = new FilterCache();  // never destroyed: no teardown order at exit
  return *cache;
}

uint64_t bits_of(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

py::tuple axis_filters(const Doubles& start, const Doubles& scale, const Ints& lo, const Ints& hi, int out,
                       const Bools& reverse, bool cache) {
  const py::ssize_t n = start.size();
  if (start.ndim() != 1 || scale.ndim() != 1 || lo.ndim() != 1 || hi.ndim() != 1 || reverse.ndim() != 1 ||
      scale.size() != n || lo.size() != n || hi.size() != n || reverse.size() != n) {
    throw py::value_error("start, scale, lo, hi and reverse must be 1-D arrays of one length");
  }
  if (out < 0) throw py::value_error("out must be non-negative");
  const double* st = start.data();
  const double* sc = scale.data();
  const int64_t* l = lo.data();
  const int64_t* h = hi.data();
  const bool* rev = reverse.data();
  for (py::ssize_t b = 0; b < n; ++b) {
    if (h[b] <= l[b]) throw py::value_error("every crop window must hold at least one source pixel");
    if (!(sc[b] > 0)) throw py::value_error("scale must be positive");
    if (l[b] < 0 || h[b] > (int64_t{1} << 30)) throw py::value_error("window out of range");
  }
  std::vector<FilterCache::Entry> filters(static_cast<size_t>(n));
  int taps = 1;
  {
    ReleasedGil nogil;
    AxisFilter af;  // reused: build_axis_filter assigns every field
    for (py::ssize_t b = 0; b < n; ++b) {
      AxisMap map;
      map.start = st[b];
      map.scale = sc[b];
      map.lo = static_cast<double>(l[b]);
      map.hi = static_cast<double>(h[b]);
      map.out = out;
      // build_axis_filter's own window for these arguments is [l, h): see FilterKey.
      const FilterKey key{bits_of(map.start - map.lo), bits_of(map.scale), h[b] - l[b], out, rev[b]};
      if (cache) filters[b] = filter_cache().find(key);
      if (!filters[b]) {
        build_axis_filter(map, static_cast<int>(h[b]), rev[b], &af, /*simd_weights=*/false);
        filters[b] = std::make_shared<const RelativeFilter>(relative_filter(af, l[b], out));
        if (cache) filter_cache().insert(key, filters[b]);
      }
      taps = std::max(taps, filters[b]->max_count);
    }
  }
  py::array_t<int32_t> first({n, static_cast<py::ssize_t>(out)});
  py::array_t<int16_t> weights({n, static_cast<py::ssize_t>(out), static_cast<py::ssize_t>(taps)});
  py::array_t<int64_t> max_count(n), need_lo(n), need_hi(n);
  int32_t* f = first.mutable_data();
  int16_t* w = weights.mutable_data();
  std::memset(w, 0, static_cast<size_t>(weights.nbytes()));
  for (py::ssize_t b = 0; b < n; ++b) {
    const RelativeFilter& rf = *filters[b];
    const int32_t offset = static_cast<int32_t>(l[b]);
    for (int k = 0; k < out; ++k) {
      f[b * out + k] = offset + rf.first[k];
      std::memcpy(w + (b * out + k) * taps, rf.weights.data() + static_cast<size_t>(k) * rf.max_count,
                  static_cast<size_t>(rf.max_count) * sizeof(int16_t));  // max_count <= taps
    }
    max_count.mutable_data()[b] = out ? rf.max_count : 1;
    need_lo.mutable_data()[b] = out ? l[b] + rf.need_lo : l[b];
    need_hi.mutable_data()[b] = out ? l[b] + rf.need_hi : l[b] + 1;
  }
  return py::make_tuple(first, weights, max_count, need_lo, need_hi);
}

}  // namespace

void register_filters(py::module_& m) {
  m.def("axis_filters", &axis_filters, py::arg("start"), py::arg("scale"), py::arg("lo"), py::arg("hi"),
        py::arg("out"), py::arg("reverse"), py::arg("cache") = true,
        "The native resize filter of one axis for a batch (build_axis_filter per image): output k of image b "
        "reads source positions first[b, k] + t with 14-bit weights[b, k, t] (zero past its tap count). "
        "Returns (first int32 [B, out], weights int16 [B, out, taps], max_count int64 [B], need_lo int64 [B], "
        "need_hi int64 [B]). cache: reuse filters built by earlier calls for the same window length, "
        "origin, scale and flip (bit-identical; False builds every one afresh and leaves the cache alone).");
  static const std::string size_doc = "How many filters axis_filters holds for reuse (up to " +
                                      std::to_string(FilterCache::kMaxBytes >> 20) +
                                      " MB of them; it starts over when full).";
  m.def("axis_filter_cache_size", [] { return filter_cache().size(); }, size_doc.c_str());
  m.def("clear_axis_filter_cache", [] { filter_cache().clear(); }, "Drops every filter axis_filters kept.");
}

}  // namespace fastdata::bindings
