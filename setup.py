"""Build of the native extension fastdata._C against the system libjpeg-turbo.

Why a setup.py: the extension needs a header check with a readable message and
per-compiler flags, which a static pyproject table cannot express.
"""
import glob
import os
import sys

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

JPEG_HINT = (
    "fastdata needs libjpeg-turbo's development headers (jpeglib.h) to build.\n"
    "  Debian/Ubuntu: apt-get install libjpeg62-turbo-dev   (or libjpeg-turbo8-dev)\n"
    "  Fedora/RHEL:   dnf install libjpeg-turbo-devel\n"
    "  conda:         conda install -c conda-forge libjpeg-turbo\n"
    "Set FASTDATA_JPEG_PREFIX=/path/to/prefix if it lives elsewhere (include/ and lib/ below it)."
)


def find_jpeg():
    """Return (include_dirs, library_dirs) holding jpeglib.h, or exit with one clear message."""
    prefixes = [os.environ.get("FASTDATA_JPEG_PREFIX"), os.environ.get("CONDA_PREFIX"),
                "/usr", "/usr/local", "/opt/libjpeg-turbo", "/opt/homebrew/opt/jpeg-turbo"]
    for prefix in filter(None, prefixes):
        inc = os.path.join(prefix, "include")
        if os.path.exists(os.path.join(inc, "jpeglib.h")):
            libs = [d for d in (os.path.join(prefix, "lib"), os.path.join(prefix, "lib64"),
                                os.path.join(prefix, "lib", "x86_64-linux-gnu"),
                                os.path.join(prefix, "lib", "aarch64-linux-gnu")) if os.path.isdir(d)]
            return [inc], libs
    sys.exit("error: jpeglib.h not found.\n" + JPEG_HINT)


include_dirs, library_dirs = find_jpeg()

# FASTDATA_SANITIZE=1: an AddressSanitizer + UndefinedBehaviorSanitizer build, for
# fuzz/sanitized_tests.sh only (it preloads the ASan runtime into Python); never a release.
SANITIZE_FLAGS = (["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1", "-g"]
                  if os.environ.get("FASTDATA_SANITIZE") == "1" else [])

ext = Pybind11Extension(
    "fastdata._C",
    sorted(glob.glob("csrc/core/*.cpp") + glob.glob("csrc/gpu/*.cpp") + glob.glob("csrc/bindings/*.cpp")),
    include_dirs=["csrc"] + include_dirs,
    library_dirs=library_dirs,
    # Link the shared library: Debian's libjpeg.a is not position independent.
    # dl: libnvimgcodec is loaded at run time (csrc/gpu/nvimgcodec_instance.cpp), never linked.
    libraries=["jpeg", "dl"],
    cxx_std=17,
    # -O3 for the resampler's loops; no -march=native: wheels must run on any x86-64.
    # Hot loops get AVX2 clones chosen at run time (target_clones in resize.cpp).
    extra_compile_args=["-O3", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-clobbered"] + SANITIZE_FLAGS,
    extra_link_args=SANITIZE_FLAGS,
)

setup(ext_modules=[ext], cmdclass={"build_ext": build_ext})
