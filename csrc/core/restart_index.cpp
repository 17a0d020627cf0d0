#include "core/restart_index.h"

#include <cstring>
#include <stdexcept>

namespace fastdata {
namespace {

constexpr char kIdentifier[] = "fastdata-rst";  // + its NUL: 13 bytes
constexpr size_t kIdentifierSize = sizeof(kIdentifier);
constexpr size_t kFixedSize = kIdentifierSize + 1 + 2 + 4 + 4;
constexpr size_t kMaxSegmentData = 65535 - 2;

uint32_t read_u32(const uint8_t* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24); }

void put_u32(std::vector<uint8_t>* v, uint32_t x) {
  for (int i = 0; i < 4; ++i) v->push_back(static_cast<uint8_t>(x >> (8 * i)));
}

struct ScanLayout {
  size_t sos = 0;         // position of the SOS marker's 0xFF
  size_t data = 0;        // first byte of entropy-coded data
  size_t data_end = 0;    // the 0xFF of the marker that ends the scan
  std::vector<uint32_t> starts;  // interval starts, relative to `data`
};

ScanLayout find_scan(const std::vector<uint8_t>& j) {
  const size_t n = j.size();
  if (n < 4 || j[0] != 0xFF || j[1] != 0xD8) throw std::invalid_argument("add_restart_index: not a JPEG");
  size_t p = 2;
  ScanLayout s;
  bool have_scan = false;
  while (true) {
    if (p >= n || j[p] != 0xFF) throw std::invalid_argument("add_restart_index: malformed marker sequence");
    const size_t at = p;
    while (p < n && j[p] == 0xFF) ++p;
    if (p >= n) throw std::invalid_argument("add_restart_index: truncated file");
    const int m = j[p++];
    if (m == 0xD9) break;  // EOI
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) throw std::invalid_argument("add_restart_index: unexpected marker");
    if (p + 2 > n) throw std::invalid_argument("add_restart_index: truncated segment");
    const size_t len = (static_cast<size_t>(j[p]) << 8) | j[p + 1];
    if (len < 2 || p + len > n) throw std::invalid_argument("add_restart_index: truncated segment");
    if (m == kRestartIndexMarker && len - 2 >= kIdentifierSize &&
        std::memcmp(&j[p + 2], kIdentifier, kIdentifierSize) == 0) {
      throw std::invalid_argument("add_restart_index: the file already has a restart index");
    }
    p += len;
    if (m != 0xDA) continue;
    if (have_scan) throw std::invalid_argument("add_restart_index: more than one scan");
    have_scan = true;
    s.sos = at;
    s.data = p;
    s.starts.push_back(0);
    // Entropy-coded data: 0xFF 0x00 is a data byte, RSTn starts the next interval, any
    // other marker ends the scan.
    while (true) {
      while (p < n && j[p] != 0xFF) ++p;
      if (p + 1 >= n) throw std::invalid_argument("add_restart_index: scan runs to the end of the file");
      const int c = j[p + 1];
      if (c == 0x00) {
        p += 2;
      } else if (c == 0xFF) {
        ++p;  // fill byte
      } else if (c >= 0xD0 && c <= 0xD7) {
        if (c != 0xD0 + static_cast<int>((s.starts.size() - 1) & 7)) {
          throw std::invalid_argument("add_restart_index: restart markers out of sequence");
        }
        p += 2;
        s.starts.push_back(static_cast<uint32_t>(p - s.data));
      } else {
        s.data_end = p;
        break;
      }
    }
  }
  if (!have_scan) throw std::invalid_argument("add_restart_index: no scan");
  if (s.data_end - s.data > 0xFFFFFFFFu) throw std::invalid_argument("add_restart_index: scan too large");
  return s;
}

}  // namespace

bool parse_restart_index(const uint8_t* d, size_t size, RestartIndex* index) {
  if (size < kFixedSize || std::memcmp(d, kIdentifier, kIdentifierSize) != 0) return false;
  const uint8_t* p = d + kIdentifierSize;
  const uint8_t* end = d + size;
  const uint8_t version = *p++;
  if (version != 1 && version != kRestartIndexVersion) return false;
  const int interval = p[0] | (p[1] << 8);
  p += 2;
  const uint32_t count = read_u32(p);
  const uint32_t scan_bytes = read_u32(p + 4);
  p += 8;
  int stride = 1;
  if (version == 2) {
    if (end - p < 2) return false;
    stride = p[0] | (p[1] << 8);
    p += 2;
  }
  if (interval == 0 || count == 0 || stride == 0) return false;
  const uint32_t entries = (count - 1) / static_cast<uint32_t>(stride) + 1;
  // Each delta takes at least one byte: more entries than the segment holds is damage.
  if (entries - 1 > static_cast<size_t>(end - p)) return false;
  std::vector<uint32_t>* offsets = &index->offsets;
  offsets->resize(static_cast<size_t>(entries) + 1);
  uint32_t* o = offsets->data();
  o[0] = 0;
  uint64_t at = 0;
  for (uint32_t k = 1; k < entries; ++k) {
    uint64_t delta = 0;
    int shift = 0;
    while (true) {
      if (p >= end || shift > 28) return false;
      const uint8_t b = *p++;
      delta |= static_cast<uint64_t>(b & 0x7F) << shift;
      shift += 7;
      if (!(b & 0x80)) break;
    }
    at += delta;
    // Each of the `stride` intervals in between holds its RSTn at least: starts grow by
    // 2 * stride or more, within the scan.
    if (delta < 2 * static_cast<uint64_t>(stride) || at > scan_bytes) return false;
    o[k] = static_cast<uint32_t>(at);
  }
  if (p != end) return false;
  o[entries] = scan_bytes;
  index->interval = interval;
  index->stride = stride;
  index->count = count;
  return true;
}

std::vector<uint8_t> add_restart_index(const std::vector<uint8_t>& jpeg, int interval, int stride) {
  if (interval < 1 || interval > 65535) throw std::invalid_argument("add_restart_index: interval out of range");
  if (stride < 1 || stride > 65535) throw std::invalid_argument("add_restart_index: stride out of range");
  const ScanLayout s = find_scan(jpeg);
  std::vector<uint8_t> seg;
  seg.insert(seg.end(), kIdentifier, kIdentifier + kIdentifierSize);
  seg.push_back(kRestartIndexVersion);
  seg.push_back(static_cast<uint8_t>(interval & 0xFF));
  seg.push_back(static_cast<uint8_t>(interval >> 8));
  put_u32(&seg, static_cast<uint32_t>(s.starts.size()));
  put_u32(&seg, static_cast<uint32_t>(s.data_end - s.data));
  seg.push_back(static_cast<uint8_t>(stride & 0xFF));
  seg.push_back(static_cast<uint8_t>(stride >> 8));
  const size_t step = static_cast<size_t>(stride);
  for (size_t i = step; i < s.starts.size(); i += step) {
    uint32_t delta = s.starts[i] - s.starts[i - step];
    do {
      const uint8_t b = delta & 0x7F;
      delta >>= 7;
      seg.push_back(static_cast<uint8_t>(b | (delta ? 0x80 : 0)));
    } while (delta);
  }
  if (seg.size() > kMaxSegmentData) throw std::invalid_argument("add_restart_index: index too large for one segment");
  std::vector<uint8_t> out;
  out.reserve(jpeg.size() + seg.size() + 4);
  out.insert(out.end(), jpeg.begin(), jpeg.begin() + static_cast<ptrdiff_t>(s.sos));
  const size_t len = seg.size() + 2;
  out.push_back(0xFF);
  out.push_back(static_cast<uint8_t>(kRestartIndexMarker));
  out.push_back(static_cast<uint8_t>(len >> 8));
  out.push_back(static_cast<uint8_t>(len & 0xFF));
  out.insert(out.end(), seg.begin(), seg.end());
  out.insert(out.end(), jpeg.begin() + static_cast<ptrdiff_t>(s.sos), jpeg.end());
  return out;
}

}  // namespace fastdata
