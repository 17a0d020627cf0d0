#include "core/exif.h"

#include <cstring>

namespace fastdata {
namespace {

struct TiffReader {
  const uint8_t* base;
  size_t size;
  bool little;
  bool u16(size_t off, uint32_t* v) const {
    if (off + 2 > size) return false;
    *v = little ? (base[off] | (base[off + 1] << 8)) : ((base[off] << 8) | base[off + 1]);
    return true;
  }
  bool u32(size_t off, uint32_t* v) const {
    if (off + 4 > size) return false;
    const uint8_t* p = base + off;
    *v = little ? (uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24)
                : (uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]));
    return true;
  }
};

}  // namespace

int parse_exif_orientation(const uint8_t* data, size_t size) {
  // "Exif\0\0" then a TIFF header: byte order, 42, offset of IFD0.
  if (size < 14 || std::memcmp(data, "Exif\0\0", 6) != 0) return 1;
  TiffReader tiff{data + 6, size - 6, false};
  if (tiff.base[0] == 'I' && tiff.base[1] == 'I') {
    tiff.little = true;
  } else if (!(tiff.base[0] == 'M' && tiff.base[1] == 'M')) {
    return 1;
  }
  uint32_t magic, ifd, count;
  if (!tiff.u16(2, &magic) || magic != 42 || !tiff.u32(4, &ifd) || !tiff.u16(ifd, &count)) return 1;
  for (uint32_t i = 0; i < count; ++i) {
    const size_t entry = size_t(ifd) + 2 + size_t(i) * 12;
    uint32_t tag, type, value;
    if (!tiff.u16(entry, &tag)) return 1;
    if (tag != 0x0112) continue;
    if (!tiff.u16(entry + 2, &type) || type != 3 || !tiff.u16(entry + 8, &value)) return 1;
    return (value >= 1 && value <= 8) ? static_cast<int>(value) : 1;
  }
  return 1;
}

OrientationMap orientation_map(int orientation, int w, int h) {
  switch (orientation) {
    case 2: return {-1, 0, w - 1, 0, 1, 0};       // mirrored left-right
    case 3: return {-1, 0, w - 1, 0, -1, h - 1};  // rotated 180
    case 4: return {1, 0, 0, 0, -1, h - 1};       // mirrored top-bottom
    case 5: return {0, 1, 0, 1, 0, 0};            // transposed
    case 6: return {0, 1, 0, -1, 0, h - 1};       // displayed rotated 90 clockwise
    case 7: return {0, -1, w - 1, -1, 0, h - 1};  // transversed
    case 8: return {0, -1, w - 1, 1, 0, 0};       // displayed rotated 90 counter-clockwise
    default: return {1, 0, 0, 0, 1, 0};
  }
}

}  // namespace fastdata
