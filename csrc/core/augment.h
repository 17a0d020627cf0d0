// Crop geometry: which source region each output pixel comes from.
// Everything here is in the EXIF-oriented image's coordinates.
#pragma once
#include <cstdint>

namespace fastdata {

enum class TransformKind : int { kRandomResizedCrop = 0, kCenterCrop = 1, kFull = 2 };

struct TransformSpec {
  TransformKind kind = TransformKind::kRandomResizedCrop;
  int out_h = 224, out_w = 224;
  double scale_lo = 0.08, scale_hi = 1.0;  // RandomResizedCrop area fraction
  double ratio_lo = 3.0 / 4.0, ratio_hi = 4.0 / 3.0;
  double hflip = 0.5;                      // probability of a horizontal flip
  int resize_to = 256;                     // CenterCrop: shorter side before the crop
  bool roi = true;                         // region-of-interest + DCT-scaled decode (off only to measure it)
};

// An integer crop box (torchvision's i, j, h, w) and the flip decision.
struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;
  bool flip = false;
};

// One output axis of a resize: output pixel k samples source position
// start + (k + 0.5) * scale, and the filter only reads source pixels in [lo, hi).
struct AxisMap {
  double start = 0, scale = 1;
  double lo = 0, hi = 0;
  int out = 0;
};

struct ResizePlan {
  AxisMap x, y;
  bool flip = false;
};

// torchvision.transforms.RandomResizedCrop.get_params, keyed by (seed, epoch, index).
CropBox sample_random_resized_crop(int height, int width, const TransformSpec& spec, uint64_t seed,
                                   uint64_t epoch, uint64_t index);

// Where each output pixel comes from, for an oriented image of height x width.
ResizePlan plan_resize(int height, int width, const TransformSpec& spec, uint64_t seed, uint64_t epoch,
                       uint64_t index);

}  // namespace fastdata
