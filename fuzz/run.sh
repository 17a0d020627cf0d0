#!/usr/bin/env bash
# Builds the libFuzzer targets (ASan + UBSan), makes the seed corpus, replays the checked-in
# regression inputs, then fuzzes each target. See fuzz/README.md.
#
#   fuzz/run.sh short [TARGET...]   each target for FUZZ_SECONDS seconds (default 30): CI
#   fuzz/run.sh long  [TARGET...]   each target for FUZZ_RUNS executions (default 1,000,000)
#
# TARGET: probe plan decode decode_zen crop crop_scalar transcode (default: all; crop_scalar is
# the crop target with FASTDATA_FORCE_SCALAR=1, the resampler's baseline loops; decode_zen the
# decode target with FASTDATA_SOFTWARE_BIT_DEPOSIT=1, the progressive decoder's AMD Zen 1/2 copy). Work files
# (seeds, growing corpus, logs, crash inputs) go to FUZZ_WORK (default /tmp/fastdata-fuzz).
# Python with numpy and Pillow (for the seeds): FUZZ_PYTHON (default python3).
# Exit status non-zero on any crash, sanitizer report, timeout, or memory-limit breach.
set -euo pipefail
cd "$(dirname "$0")"
mode=${1:-}
shift || true
case "$mode" in
  short) limit=(-max_total_time="${FUZZ_SECONDS:-30}") ;;
  long) limit=(-runs="${FUZZ_RUNS:-1000000}") ;;
  *) echo "usage: fuzz/run.sh short|long [TARGET...]" >&2; exit 2 ;;
esac
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(probe plan decode decode_zen crop crop_scalar transcode)
work=${FUZZ_WORK:-/tmp/fastdata-fuzz}
mkdir -p "$work/logs" "$work/crashes"

make -j"$(nproc)" >/dev/null
"${FUZZ_PYTHON:-python3}" make_seeds.py "$work/seeds"

# A target's binary and environment: decode_zen and crop_scalar are decode and crop under a switch.
binary_and_env() {
  bin=$1 env=()
  if [ "$1" = crop_scalar ]; then bin=crop env=(FASTDATA_FORCE_SCALAR=1); fi
  if [ "$1" = decode_zen ]; then bin=decode env=(FASTDATA_SOFTWARE_BIT_DEPOSIT=1); fi
}

# Every checked-in input once, under every target that runs its binary (fixed bugs stay fixed).
for t in probe plan decode decode_zen crop crop_scalar transcode; do
  binary_and_env "$t"
  files=(regressions/"$bin"/*)
  [ -e "${files[0]}" ] || continue
  env "${env[@]}" ./build/fuzz_"$bin" -runs=1 "${files[@]}" >"$work/logs/regressions_$t.log" 2>&1 || {
    tail -30 "$work/logs/regressions_$t.log"; echo "FAIL: a regression input of $t" >&2; exit 1; }
done
echo "regression inputs: ok"

# -timeout: 60 s catches hangs; the slowest input of the long runs took under 1 s, but on a
# shared machine a starved process once passed 10 s (decodes are limited to 1 Mpx);
# -rss_limit_mb / -malloc_limit_mb: no decode of a <= 8 KB input may need more than 1 GB.
status=0
for t in "${targets[@]}"; do
  binary_and_env "$t"
  mkdir -p "$work/corpus/$t"
  log="$work/logs/${mode}_$t.log"
  if env "${env[@]}" ./build/fuzz_"$bin" "${limit[@]}" -max_len=8192 -timeout=60 -rss_limit_mb=2048 \
      -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$work/crashes/$t-" \
      "$work/corpus/$t" "$work/seeds/$bin" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    echo "$t: ok, $runs executions, $rate exec/s"
  else
    status=1
    grep -E "ERROR|runtime error|FUZZ_CHECK|SUMMARY|Test unit written" "$log" | head -8 >&2 || true
    echo "$t: FAILED (log: $log)" >&2
  fi
done
exit $status
