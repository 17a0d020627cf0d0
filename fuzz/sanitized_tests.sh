#!/usr/bin/env bash
# The test suite against an AddressSanitizer + UndefinedBehaviorSanitizer build of
# fastdata._C (see fuzz/README.md).
#
#   fuzz/sanitized_tests.sh [PYTEST ARGS...]     default: tests/unit
#
# Builds the extension with FASTDATA_SANITIZE=1 (setup.py) outside the source tree, puts it
# in a copy of the fastdata package under SANITIZE_WORK (default /tmp/fastdata-sanitized),
# and runs pytest with that copy first on PYTHONPATH and the compiler's ASan runtime
# preloaded (CPython itself is not instrumented). Leak detection is off: CPython and torch
# keep memory until exit by design. Any ASan or UBSan report aborts the run (non-zero exit).
# PYTHON: the interpreter with the test dependencies (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
work=${SANITIZE_WORK:-/tmp/fastdata-sanitized}
rm -rf "$work/pkg"
mkdir -p "$work/pkg"
FASTDATA_SANITIZE=1 "$py" setup.py -q build_ext --build-lib "$work/lib" --build-temp "$work/tmp" >"$work/build.log" 2>&1 || {
  tail -30 "$work/build.log"; echo "sanitized build failed" >&2; exit 1; }
cp -r fastdata "$work/pkg/"
rm -f "$work/pkg/fastdata/"_C*.so
cp "$work/lib/fastdata/"_C*.so "$work/pkg/fastdata/"
compiler=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('CXX').split()[0])")
libasan=$("$compiler" -print-file-name=libasan.so)
if [ ! -e "$libasan" ]; then echo "no ASan runtime found for $compiler ($libasan)" >&2; exit 1; fi
libstdcxx=$("$compiler" -print-file-name=libstdc++.so)
[ $# -gt 0 ] || set -- tests/unit
# libstdc++ preloaded too: python does not link it, and ASan resolves its __cxa_throw
# interceptor at start-up (else the first C++ throw fails ASan's CHECK).
export LD_PRELOAD="$libasan $libstdcxx"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_init_order=1:detect_stack_use_after_return=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export PYTHONPATH="$work/pkg"
# The sanitized build must be the one imported: -P keeps the current directory (the
# source tree, with its own _C) off sys.path; PYTHONPATH wins over an editable install.
"$py" -P -c "import fastdata, fastdata._C as c; assert c.__file__.startswith('$work/pkg'), c.__file__; print('sanitized', c.__file__)"
exec "$py" -P -m pytest -p no:cacheprovider -q "$@"
