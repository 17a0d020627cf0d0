// Lossless JPEG -> sequential ("baseline") JPEG, jpegtran-style: the DCT coefficients are
// copied, only the entropy coding changes, so every decoder produces the same pixels from
// the output as from the input (except for a progressive input whose scans leave some
// coefficient unrefined: libjpeg decodes that with block smoothing, which the sequential
// copy does not get; fastdata-convert compares the pixels and keeps such files as they are). Used at cache-write time so progressive files, which
// libjpeg must entropy-decode in full before any row comes out, take the ROI crop path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastdata {

// Rewrites `data` as one interleaved sequential scan with optimized Huffman tables (SOF1
// when the tables need it, else SOF0), keeping the APP1 (EXIF, XMP) and APP2 (ICC)
// markers in their order and dropping other APPn/COM markers; JFIF/Adobe colour-space
// markers are regenerated from the coefficients' colour space.
//
// Throws DecodeError (decoder.h) for corrupt or truncated input: libjpeg's warnings are
// errors here, as in strict decoding, so damaged data is never rewritten as a clean file.
// Throws std::invalid_argument for inputs other than 8-bit 1-component (grayscale) or
// 3-component (YCbCr/RGB) JPEGs: CMYK/YCCK would gain an Adobe marker that changes how
// decoders invert them. Throws DecodeError when width x height exceeds `max_pixels` (> 0),
// before the coefficient arrays are allocated. Thread-safe (no shared state).
std::vector<uint8_t> transcode_to_baseline(const uint8_t* data, size_t size, int64_t max_pixels);

// The same rewrite with a restart marker every `interval_mcus` MCUs (0: one per MCU row)
// and the restart index segment (restart_index.h; an entry every `index_stride` intervals), so that a crop decode can start its
// entropy decoding at the interval where the crop starts. Still lossless: only the
// entropy coding changes. A baseline input coded with libjpeg's standard Huffman tables keeps
// them (records that share tables decode faster); others get optimized tables. Same errors
// as transcode_to_baseline; std::invalid_argument for
// an interval outside 0..65535, a stride outside 1..65535 or an index too large for one segment.
std::vector<uint8_t> transcode_restart_indexed(const uint8_t* data, size_t size, int64_t max_pixels,
                                               int interval_mcus, int index_stride);

}  // namespace fastdata
