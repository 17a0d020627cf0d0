// The restart index: where each restart interval of a JPEG's scan starts, so that a crop
// decode can begin its entropy decoding at the first interval it needs instead of at the
// top of the image (restart markers reset the DC predictions, so an interval decodes on
// its own).
//
// fastdata-convert stores it inside the JPEG, as one APP15 segment before the SOS marker:
// every record carries its own index (LMDB, the RAM cache or a copied file alike), and any
// JPEG reader skips an APPn it does not know. Layout of the segment's data (little-endian):
//
//   "fastdata-rst\0"  13 bytes, identifier
//   version           u8 (2; version 1 is still read: it has no stride field, stride 1)
//   interval          u16: MCUs per restart interval, equal to the file's DRI value
//   count             u32: restart intervals in the scan (>= 1)
//   scan_bytes        u32: bytes of entropy-coded data, from the byte after the SOS
//                          segment to the marker that ends the scan (EOI)
//   stride            u16 (version 2 only, >= 1): the index gives the start of every
//                          stride-th interval (0, stride, 2 * stride, ...)
//   deltas            ceil(count / stride) - 1 unsigned LEB128 varints: start of interval
//                          k * stride minus start of interval (k - 1) * stride, in bytes
//                          (interval 0 starts at 0; interval i starts right after its RSTn
//                          marker, n = (i - 1) mod 8)
//
// Why a stride: with a restart marker every MCU (the cheapest crop decode), one varint per
// interval would cost ~1.3% of the bytes; the decoder finds the few intervals it jumps to
// between two indexed ones by reading their RSTn markers (FastHuffman::use_restart_index).
//
// Nothing here trusts the index: FastHuffman::use_restart_index checks every offset against
// the data (each must follow the right RSTn marker, within the scan) before a seek uses it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastdata {

constexpr int kRestartIndexMarker = 0xEF;  // APP15
constexpr uint8_t kRestartIndexVersion = 2;
// Intervals per index entry that fastdata-convert writes: with one interval per MCU, an
// entry per ~8 MCUs of a 500x375 photo (~1.2 KB of scan) keeps the index at ~0.15% of the
// bytes, and a jump reads at most 7 markers past its entry.
constexpr int kRestartIndexStride = 8;

// A parsed index: `offsets` holds ceil(count / stride) + 1 entries, the start of intervals
// 0, stride, 2 * stride, ... relative to the scan's first byte, then scan_bytes.
struct RestartIndex {
  int interval = 0;  // 0: none
  int stride = 1;
  uint32_t count = 0;
  std::vector<uint32_t> offsets;
};

// Parses an APP15 segment's data (after its length field), version 1 or 2. Returns false
// when it is not a fastdata restart index (other APP15 users) or is malformed.
bool parse_restart_index(const uint8_t* data, size_t size, RestartIndex* index);

// Adds the index segment (version 2, an entry every `stride` intervals) to a JPEG of one
// sequential scan whose restart interval is `interval` MCUs (the writer's DRI), before its
// SOS marker. Throws std::invalid_argument when the file has no single scan, no restart
// markers where expected, a stride outside 1..65535 or an index too large for one segment
// (about 20,000 entries).
std::vector<uint8_t> add_restart_index(const std::vector<uint8_t>& jpeg, int interval, int stride);

}  // namespace fastdata
