// EXIF orientation: parsing the APP1 tag and mapping oriented coordinates to stored ones.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fastdata {

// Orientation tag (0x0112) of an APP1 "Exif" payload; 1 when absent or malformed.
int parse_exif_orientation(const uint8_t* data, size_t size);

// Orientations 5..8 swap the axes: the displayed width is the stored height.
inline bool orientation_transposes(int orientation) { return orientation >= 5 && orientation <= 8; }

// Maps oriented pixel (ox, oy) to stored pixel (sx, sy) for a stored image of w x h:
//   sx = ax * ox + bx * oy + cx,   sy = ay * ox + by * oy + cy
// (the inverse of what PIL.ImageOps.exif_transpose applies).
struct OrientationMap {
  int ax, bx, cx, ay, by, cy;
};
OrientationMap orientation_map(int orientation, int stored_w, int stored_h);

}  // namespace fastdata
