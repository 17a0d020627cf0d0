#!/usr/bin/env bash
# The test suite against an AddressSanitizer + UndefinedBehaviorSanitizer build of
# fastdata._C (see fuzz/README.md).
#
#   fuzz/sanitized_tests.sh [PYTEST ARGS...]     default: tests/io (the native engine's tests)
#
# Copies the working tree (tracked and new files) to SANITIZE_WORK (default
# /tmp/fastdata-sanitized/src, made afresh each run), builds the extension there in place with
# FASTDATA_SANITIZE=1 (setup.py), and runs pytest in that copy with the compiler's ASan runtime
# preloaded (CPython itself is not instrumented). A copy, so that the tests' child processes (which
# run from the repository root) import the sanitized build too, and the source tree's own
# _C is left alone. Leak detection is off: CPython and torch keep memory until exit by
# design. Any ASan or UBSan report aborts the run (non-zero exit).
# PYTHON: the interpreter with the test dependencies (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
case "$py" in /*) ;; */*) py="$PWD/$py" ;; esac
work=${SANITIZE_WORK:-/tmp/fastdata-sanitized}/src
mkdir -p "$work"
# A fresh copy and a full build every run: a file deleted or renamed in the tree must not stay
# behind (setup.py compiles csrc/*/*.cpp and pytest collects tests/; a stale
# csrc/bindings/gpu_batch.cpp on the CI machine once failed this build), and setup.py's
# up-to-date check sees newer sources, not deleted ones. Only a folder this script made is
# replaced (its marker, or, in a copy from before the marker, this script), never another one
# SANITIZE_WORK names by mistake.
marker="$work/.fastdata-sanitized-copy"
if [ -n "$(ls -A "$work")" ] && [ ! -e "$marker" ] && [ ! -e "$work/fuzz/sanitized_tests.sh" ]; then
  echo "$work is not empty and not a copy this script made: not replacing it" >&2; exit 1
fi
rm -rf "$work" && mkdir -p "$work" && touch "$marker"
git ls-files -z -co --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$work"
cd "$work"
FASTDATA_SANITIZE=1 "$py" setup.py -q build_ext --inplace -j "$(nproc)" >build.log 2>&1 || {
  tail -30 build.log; echo "sanitized build failed" >&2; exit 1; }
compiler=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('CXX').split()[0])")
libasan=$("$compiler" -print-file-name=libasan.so)
libstdcxx=$("$compiler" -print-file-name=libstdc++.so)
if [ ! -e "$libasan" ]; then echo "no ASan runtime found for $compiler ($libasan)" >&2; exit 1; fi
[ $# -gt 0 ] || set -- tests/io
# libstdc++ preloaded too: python does not link it, and ASan resolves its __cxa_throw
# interceptor at start-up (else the first C++ throw fails ASan's CHECK).
export LD_PRELOAD="$libasan $libstdcxx"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_init_order=1:detect_stack_use_after_return=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export PYTHONPATH="$work"  # first, before an editable install of the source tree
"$py" -c "import fastdata._C as c; assert c.__file__.startswith('$work/'), c.__file__; print('sanitized', c.__file__)"
exec "$py" -m pytest -p no:cacheprovider -q "$@"
