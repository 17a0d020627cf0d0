// A test oracle's input: progressive JPEGs with any scan script, written by libjpeg-turbo's
// own encoder (Pillow and OpenCV write only libjpeg's default progression). The tests decode
// them with fastdata's progressive Huffman decoder and with libjpeg's own, and compare.
// Not part of the library's decode path.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <jpeglib.h>

#include "bindings/jpeg_jump_error.h"
#include "bindings/register.h"

namespace py = pybind11;

namespace fastdata::bindings {

namespace {

// Everything a longjmp back into encode() touches, outside its stack frame.
struct Encoder {
  jpeg_compress_struct cinfo{};
  JumpError err{};
  unsigned char* out = nullptr;
  unsigned long out_size = 0;
  std::vector<jpeg_scan_info> scans;
  ~Encoder() {
    jpeg_destroy_compress(&cinfo);
    std::free(out);  // jpeg_mem_dest's buffer
  }
};

using Scan = std::tuple<std::vector<int>, int, int, int, int>;  // components, Ss, Se, Ah, Al

py::bytes encode_progressive(const py::array_t<uint8_t, py::array::c_style | py::array::forcecast>& pixels,
                             int quality, const std::vector<Scan>& script, int restart_interval) {
  if (pixels.ndim() != 3 || (pixels.shape(2) != 1 && pixels.shape(2) != 3) || pixels.shape(0) < 1 ||
      pixels.shape(1) < 1) {
    throw std::invalid_argument("pixels must be uint8 [H, W, 1] or [H, W, 3]");
  }
  if (script.empty() || script.size() > 100) throw std::invalid_argument("the scan script needs 1..100 scans");
  const int channels = static_cast<int>(pixels.shape(2));
  Encoder e;
  for (const Scan& scan : script) {
    const auto& comps = std::get<0>(scan);
    if (comps.empty() || comps.size() > MAX_COMPS_IN_SCAN) throw std::invalid_argument("1..4 components a scan");
    jpeg_scan_info info{};
    info.comps_in_scan = static_cast<int>(comps.size());
    for (size_t i = 0; i < comps.size(); ++i) info.component_index[i] = comps[i];
    std::tie(std::ignore, info.Ss, info.Se, info.Ah, info.Al) = scan;
    e.scans.push_back(info);
  }
  e.cinfo.err = jpeg_std_error(&e.err.pub);
  e.err.pub.error_exit = jump_error_exit;
  if (setjmp(e.err.jump)) throw std::invalid_argument(std::string("libjpeg refused: ") + e.err.message);
  jpeg_create_compress(&e.cinfo);
  jpeg_mem_dest(&e.cinfo, &e.out, &e.out_size);
  e.cinfo.image_width = static_cast<JDIMENSION>(pixels.shape(1));
  e.cinfo.image_height = static_cast<JDIMENSION>(pixels.shape(0));
  e.cinfo.input_components = channels;
  e.cinfo.in_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(&e.cinfo);  // 4:2:0 for colour, as libjpeg's default
  jpeg_set_quality(&e.cinfo, quality, TRUE);
  e.cinfo.scan_info = e.scans.data();  // libjpeg checks the script (jcmaster.c validate_script)
  e.cinfo.num_scans = static_cast<int>(e.scans.size());
  e.cinfo.restart_interval = static_cast<unsigned int>(restart_interval);
  jpeg_start_compress(&e.cinfo, TRUE);
  const size_t stride = static_cast<size_t>(pixels.shape(1)) * channels;
  while (e.cinfo.next_scanline < e.cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(pixels.data() + e.cinfo.next_scanline * stride);
    jpeg_write_scanlines(&e.cinfo, &row, 1);
  }
  jpeg_finish_compress(&e.cinfo);
  return py::bytes(reinterpret_cast<const char*>(e.out), e.out_size);
}

}  // namespace

void register_test_encoder(py::module_& m) {
  m.def("_encode_progressive", &encode_progressive, py::arg("pixels"), py::arg("quality"), py::arg("scans"),
        py::arg("restart_interval") = 0,
        "Testing: a JPEG of uint8 [H, W, 1 or 3] pixels written by libjpeg with the given scan script, a "
        "list of (component indices, Ss, Se, Ah, Al). Raises ValueError if libjpeg refuses the script.");
}

}  // namespace fastdata::bindings
