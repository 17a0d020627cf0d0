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
//   version           u8 (1)
//   interval          u16: MCUs per restart interval, equal to the file's DRI value
//   count             u32: restart intervals in the scan (>= 1)
//   scan_bytes        u32: bytes of entropy-coded data, from the byte after the SOS
//                          segment to the marker that ends the scan (EOI)
//   deltas            count - 1 unsigned LEB128 varints: start of interval i minus start
//                          of interval i-1, in bytes (interval 0 starts at 0; interval i
//                          starts right after its RSTn marker, n = (i - 1) mod 8)
//
// Nothing here trusts the index: FastHuffman::use_restart_index checks every offset against
// the data (each must follow the right RSTn marker, within the scan) before a seek uses it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastdata {

constexpr int kRestartIndexMarker = 0xEF;  // APP15
constexpr uint8_t kRestartIndexVersion = 1;

// Parses an APP15 segment's data (after its length field). Returns false when it is not a
// fastdata restart index (other APP15 users) or is malformed. On success `offsets` holds
// count + 1 entries: the start of each interval relative to the scan's first byte, then
// scan_bytes.
bool parse_restart_index(const uint8_t* data, size_t size, int* interval, std::vector<uint32_t>* offsets);

// Adds the index segment to a JPEG of one sequential scan whose restart interval is
// `interval` MCUs (the writer's DRI), before its SOS marker. Throws std::invalid_argument
// when the file has no single scan, no restart markers where expected or an index too large
// for one segment (about 20,000 intervals).
std::vector<uint8_t> add_restart_index(const std::vector<uint8_t>& jpeg, int interval);

}  // namespace fastdata
