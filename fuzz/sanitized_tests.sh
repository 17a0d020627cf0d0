#!/usr/bin/env bash
# The test suite against an AddressSanitizer + UndefinedBehaviorSanitizer build of
# fastdata._C (see fuzz/README.md).
#
#   fuzz/sanitized_tests.sh [PYTEST ARGS...]     default: tests/io (the native engine's tests)
#
# Copies the working tree (tracked and new files) to SANITIZE_WORK (default
# /tmp/fastdata-sanitized/src; files the tree no longer has are removed from it), builds the
# extension there in place with FASTDATA_SANITIZE=1 (setup.py), and runs pytest in that copy with the compiler's ASan runtime preloaded
# (CPython itself is not instrumented). A copy, so that the tests' child processes (which
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
files=$(mktemp)
trap 'rm -f "$files"' EXIT
git ls-files -z -co --exclude-standard >"$files"
# The copy is reused, so a file deleted or renamed in the tree since the last run would stay
# in it: setup.py globs csrc/*/*.cpp and pytest collects tests/, so a stale source or test
# breaks or changes the run. Before copying (a file that became a folder would stop tar),
# anything there that the tree lacks goes, except build outputs; only in a folder this script
# made (its marker file), never in another one SANITIZE_WORK names by mistake.
marker="$work/.fastdata-sanitized-copy"
# (A copy made before the marker existed is known by this script in it.)
if [ -n "$(ls -A "$work")" ] && [ ! -e "$marker" ] && [ ! -e "$work/fuzz/sanitized_tests.sh" ]; then
  echo "$work is not empty and not a copy this script made: not copying into it" >&2; exit 1
fi
touch "$marker"
"$py" - "$work" "$files" <<'PRUNE'
import os, shutil, sys
work, listing = sys.argv[1], sys.argv[2]
with open(listing, "rb") as f:
    keep = {os.fsdecode(p) for p in f.read().split(b"\0") if p}
folders = set()  # every folder above a kept file
for p in keep:
    while os.path.dirname(p):
        p = os.path.dirname(p)
        folders.add(p)
for root, dirs, names in os.walk(work):
    rel_root = os.path.relpath(root, work)
    at_top = rel_root == "."
    for d in list(dirs):
        rel = os.path.normpath(os.path.join(rel_root, d))
        if d == "__pycache__" or (at_top and d == "build"):
            dirs.remove(d)  # build outputs
        elif rel not in folders:
            path = os.path.join(root, d)
            os.remove(path) if os.path.islink(path) else shutil.rmtree(path)
            dirs.remove(d)
    for name in names:
        rel = os.path.normpath(os.path.join(rel_root, name))
        built = name.endswith(".so") or (at_top and name in ("build.log", ".fastdata-sanitized-copy"))
        if rel not in keep and not built:
            os.remove(os.path.join(root, name))
PRUNE
# tar keeps modification times, so unchanged sources are not rebuilt on the next run.
tar --null -T "$files" -cf - | tar -xf - -C "$work"
rm -f "$files"  # the exec below skips the EXIT trap
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
