#include "core/augment.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"

namespace fastdata {

CropBox sample_random_resized_crop(int height, int width, const TransformSpec& spec, uint64_t seed,
                                   uint64_t epoch, uint64_t index) {
  SampleRng rng(seed, epoch, index);
  CropBox box;
  const double area = static_cast<double>(height) * width;
  const double log_lo = std::log(spec.ratio_lo), log_hi = std::log(spec.ratio_hi);
  bool found = false;
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    const double target_area = area * rng.uniform(spec.scale_lo, spec.scale_hi);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    // Python's round() is banker's rounding; std::nearbyint under the default mode matches it.
    // Compared as doubles: extreme scale/ratio values (1e300, inf) give sizes no int holds.
    const double wd = std::nearbyint(std::sqrt(target_area * aspect));
    const double hd = std::nearbyint(std::sqrt(target_area / aspect));
    if (0 < wd && wd <= width && 0 < hd && hd <= height) {
      const int w = static_cast<int>(wd), h = static_cast<int>(hd);
      box.top = static_cast<int>(rng.below(height - h + 1));
      box.left = static_cast<int>(rng.below(width - w + 1));
      box.height = h;
      box.width = w;
      found = true;
    }
  }
  if (!found) {  // torchvision's fallback: the central crop clamped to the ratio range
    const double in_ratio = static_cast<double>(width) / height;
    int w = width, h = height;
    // At least one pixel: with a ratio range far from the image's (say 0.01 for a 1-pixel-
    // tall row) torchvision's formula rounds to an empty crop, whose filter would read
    // the pixel before the image. At most the image: the rounding stays inside it anyway.
    if (in_ratio < spec.ratio_lo) {
      h = static_cast<int>(std::clamp(std::nearbyint(w / spec.ratio_lo), 1.0, static_cast<double>(height)));
    } else if (in_ratio > spec.ratio_hi) {
      w = static_cast<int>(std::clamp(std::nearbyint(h * spec.ratio_hi), 1.0, static_cast<double>(width)));
    }
    box.top = (height - h) / 2;
    box.left = (width - w) / 2;
    box.height = h;
    box.width = w;
  }
  // The flip draw comes after the crop draws, so it is independent of how many tries ran.
  SampleRng flip_rng(seed ^ 0x5bd1e995ULL, epoch, index);
  box.flip = flip_rng.uniform() < spec.hflip;
  return box;
}

ResizePlan plan_resize(int height, int width, const TransformSpec& spec, uint64_t seed, uint64_t epoch,
                       uint64_t index) {
  ResizePlan plan;
  plan.x.out = spec.out_w;
  plan.y.out = spec.out_h;
  switch (spec.kind) {
    case TransformKind::kRandomResizedCrop: {
      // Same as Pillow's crop(box).resize(size): the filter sees only the crop.
      const CropBox box = sample_random_resized_crop(height, width, spec, seed, epoch, index);
      plan.x = {static_cast<double>(box.left), static_cast<double>(box.width) / spec.out_w,
                static_cast<double>(box.left), static_cast<double>(box.left + box.width), spec.out_w};
      plan.y = {static_cast<double>(box.top), static_cast<double>(box.height) / spec.out_h,
                static_cast<double>(box.top), static_cast<double>(box.top + box.height), spec.out_h};
      plan.flip = box.flip;
      break;
    }
    case TransformKind::kCenterCrop: {
      // torchvision Resize(resize_to) (shorter side, longer side truncated) then CenterCrop:
      // the resize reads the whole image, so the filter may see pixels just outside the crop.
      // In doubles (whole numbers, exact below 2^53): a large resize_to makes the resized
      // image's longer side overflow an int, though only its ratio to the source is used.
      double new_w, new_h;
      if (width <= height) {
        new_w = spec.resize_to;
        new_h = std::trunc(static_cast<double>(spec.resize_to) * height / width);
      } else {
        new_h = spec.resize_to;
        new_w = std::trunc(static_cast<double>(spec.resize_to) * width / height);
      }
      new_w = std::max(new_w, 1.0);
      new_h = std::max(new_h, 1.0);
      const double crop_top = std::nearbyint((new_h - spec.out_h) / 2.0);
      const double crop_left = std::nearbyint((new_w - spec.out_w) / 2.0);
      const double sx = width / new_w, sy = height / new_h;
      plan.x = {crop_left * sx, sx, 0.0, static_cast<double>(width), spec.out_w};
      plan.y = {crop_top * sy, sy, 0.0, static_cast<double>(height), spec.out_h};
      break;
    }
    case TransformKind::kFull:
      plan.x = {0.0, 1.0, 0.0, static_cast<double>(width), width};
      plan.y = {0.0, 1.0, 0.0, static_cast<double>(height), height};
      break;
  }
  return plan;
}

}  // namespace fastdata
