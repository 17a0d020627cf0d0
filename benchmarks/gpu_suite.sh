#!/usr/bin/env bash
# The commands behind the GPU-machine tables in docs/results.md (one H200, 16 cores), in stages so
# that each fits one 10-minute call. Results go to $OUT (default ./gpu_results).
#   bash benchmarks/gpu_suite.sh setup   # build fastdata in place; install carried wheels
#   bash benchmarks/gpu_suite.sh decode  # CPU decode tests, core_contention probe, bench_decode (1..16 threads); no DALI
#   bash benchmarks/gpu_suite.sh tests   # GPU tests + decode/GPU-decode benchmarks
#   bash benchmarks/gpu_suite.sh bench   # fastdata-bench to CUDA: all contenders; DataLoader/FFCV/fastdata per dtype
#   bash benchmarks/gpu_suite.sh engines # the hardware JPEG engines per chroma subsampling and call layout; hybrid per layout
#   bash benchmarks/gpu_suite.sh contention # gpu-only and hybrid on the 8,192 set: lanes, SCHED_IDLE vs nice 10 (10 runs of ~35 s)
#   bash benchmarks/gpu_suite.sh claim   # hybrid on the demo mix: the native rows claimed largest first vs in batch order
#   bash benchmarks/gpu_suite.sh overlap # hybrid on both sets: the native runs with and without a barrier, where the threads idle
#   bash benchmarks/gpu_suite.sh progressive # hybrid on the demo mix and per-core decode: progressive Huffman decoder vs libjpeg's
#   bash benchmarks/gpu_suite.sh train   # examples/train.py: ResNet-50/18, DataLoader vs fastdata vs synthetic
#   bash benchmarks/gpu_suite.sh train18 # the issue's training target: ResNet-18 on the 8,192 set, synthetic vs hybrid, eager and CUDA graphs
#   bash benchmarks/gpu_suite.sh kernels # the input's GPU busy time per batch: the resampler and the fused assembly, per kernel
#   bash benchmarks/gpu_suite.sh beside  # where the GPU time goes while ResNet-18 trains as CUDA graphs: streams, the loader's stages
#   bash benchmarks/gpu_suite.sh pinned_calls # the engines' calls with the bytes pageable or pinned, alone and beside a replayed graph
#   bash benchmarks/gpu_suite.sh lanes   # two decode lanes or four beside that training (alternating; four: hybrid's default)
#   bash benchmarks/gpu_suite.sh lanes_alone # hybrid alone on two, three or four lanes, gpu-only on two or four: the calls' CPU per row (alternating)
#   bash benchmarks/gpu_suite.sh waits   # the hybrid split from the producer's waits (balance.WAIT_SPLIT) or from the rates, alone (alternating)
#   bash benchmarks/gpu_suite.sh waits_train # the same beside ResNet-18 training as CUDA graphs (alternating)
#   bash benchmarks/gpu_suite.sh waits_mix # the waits' split or the rates' on the demo mix (4,096 images), alone (alternating)
#   bash benchmarks/gpu_suite.sh waits_step # that split's largest step, 1/64 of a batch (the default) or 1/16, alone (alternating)
#   bash benchmarks/gpu_suite.sh blocking # the CUDA context's blocking sync on or CUDA's default, hybrid and gpu-only alone (alternating)
#   bash benchmarks/gpu_suite.sh blocking_train # the same beside ResNet-18 training as CUDA graphs, synthetic under both (alternating)
#   bash benchmarks/gpu_suite.sh cache_train # hybrid beside ResNet-18 training as CUDA graphs from the files or from fastdata-convert's LMDB (alternating)
#   bash benchmarks/gpu_suite.sh priority # hybrid's native threads under SCHED_IDLE (13, 16 or 19) or at nice 19, alone (alternating)
#   bash benchmarks/gpu_suite.sh cores_train # hybrid's native threads 13 or 16 beside ResNet-18 training as CUDA graphs (alternating)
#   bash benchmarks/gpu_suite.sh timeline # gpu-only and hybrid alone: each producer step's wall and CPU per batch, every thread kind's CPU
#   bash benchmarks/gpu_suite.sh default_train # native (the default) against hybrid beside that training, from the files (alternating)
#   bash benchmarks/gpu_suite.sh stream_train # that training on torch's default (legacy) stream or a side stream, hybrid from the LMDB (alternating)
#   bash benchmarks/gpu_suite.sh preempt # no GPU: SCHED_IDLE native decode per CPU-second beside often-waking threads, floating or partitioned
#   bash benchmarks/gpu_suite.sh shared  # a process's gpu decoders on one nvImageCodec instance or one each, beside that training (alternating)
#   bash benchmarks/gpu_suite.sh cache   # native, gpu and hybrid from files and from fastdata-convert's LMDB (restart-indexed records), alternating
#   bash benchmarks/gpu_suite.sh proof   # the issue's proof: one fastdata-bench run per set (8,192 set, demo mix) with every contender, DALI included
#   bash benchmarks/gpu_suite.sh dali_part N # copy the carried part .dali/pN of DALI's wheels to /tmp/dali; the last (03) joins them
#   bash benchmarks/gpu_suite.sh ddp     # two-GPU torchrun/NCCL loader test (needs the nvidia-h200-x2 kind)
set -uo pipefail
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# bench_gpu_decode.py's 8,192 photo-like 500x375 JPEGs in /tmp/set8192, built once per machine.
set8192() {
  [ -d /tmp/set8192 ] || python3 -c "import sys; from pathlib import Path; sys.path.insert(0, 'benchmarks')
from bench_gpu_decode import build_set; build_set(Path('/tmp/set8192'), 8192, 500, 375, 16)" >/dev/null
}
# The same set as fastdata-convert's LMDB (records with a restart marker every MCU and the restart index).
set8192_lmdb() {
  set8192
  [ -e /tmp/set8192.lmdb ] || python3 -m fastdata.cli.convert /tmp/set8192 /tmp/set8192.lmdb --quiet
}
# The demo mix built larger (4,096 images of 16 classes; fastdata.cli.demo: gray, CMYK, progressive,
# EXIF-rotated, 4:4:4 and 4:2:2 among baseline 4:2:0) in /tmp/mixed, built once per machine.
mixedset() {
  [ -d /tmp/mixed ] || python3 -m fastdata.cli.demo --count 4096 --classes 16 --out /tmp/mixed >/dev/null
}
# fastdata-bench (TARGET bench) or examples/train.py (TARGET train) with ARGS, in one process
# after the Python statements SETTING: a module switch set before anything is made, for an A/B
# ("pass" for none).   with_setting SETTING TARGET ARGS...
with_setting() {
  local setting=$1 target=$2; shift 2
  python3 -c "import runpy, sys; $setting
if sys.argv[1] == 'bench': sys.argv = ['fastdata-bench'] + sys.argv[2:]; runpy.run_module('fastdata.cli.bench', run_name='__main__')
else: sys.argv = ['train.py'] + sys.argv[2:]; runpy.run_path('examples/train.py', run_name='__main__')" "$target" "$@"
}
# The setting for an A/B of the CUDA context's scheduling: VALUE True makes the primary context
# with blocking sync (CU_CTX_SCHED_BLOCKING_SYNC = 4: a wait on the GPU sleeps instead of
# spinning), before anything uses CUDA; False leaves CUDA's default.
blocking_flag="import ctypes; cu = ctypes.CDLL('libcuda.so.1'); rc = cu.cuInit(0) or (VALUE and cu.cuDevicePrimaryCtxSetFlags(0, 4)); rc and sys.exit(f'CUDA driver call failed: {rc}')"
# What this machine's CPU side does now: native decode alone on the CPU (16 threads, the 8,192
# set unless SET), one line, its JSON in $OUT/NAME_host.json. Hosts lent as one kind differ, and
# one machine drifted ~20% between calls (twenty-eighth session), so a training table's share of
# synthetic is read beside this line of the same call.   host_probe NAME [SET]
host_probe() {
  local name=$1 set=${2:-/tmp/set8192}
  fastdata-bench "$set" --device cpu --compare fastdata --threads 16 --batch-size 256 --seconds 8 --rounds 1 \
    --quiet --json "$OUT/${name}_host.json" >/dev/null 2>&1
  python3 - "$OUT/${name}_host.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))["results"][0]
    rate, cores = r["images_per_s"], r.get("cpu_cores_busy") or 0.0
    print(f"host probe: native decode alone {rate:,.0f} img/s at {cores:.1f} cores"
          + (f" ({rate / cores:,.0f} per core)" if cores else ""))
except (OSError, ValueError, KeyError, IndexError) as e:
    print(f"host probe: no result ({type(e).__name__}: {e})")
PY
}
# hybrid alone in fastdata-bench on the 8,192 set (or the folder BENCH_SET; 20 s each), an A/B of
# the module switch SETTING, one run per VALUE in the order given, each its own process; JSON in
# $OUT/NAME_K_VALUE.json. BENCH_COMPARE: another contender than hybrid.
#   [BENCH_SET=DIR] [BENCH_COMPARE=C] bench_ab NAME SETTING VALUE...
bench_ab() {
  local name=$1 setting=$2 value k=0 set=${BENCH_SET:-/tmp/set8192} compare=${BENCH_COMPARE:-fastdata-hybrid}; shift 2
  [ "$set" = /tmp/set8192 ] && set8192
  for value in "$@"; do
    k=$((k + 1)); echo "== $name: ${setting//VALUE/$value}"
    with_setting "${setting//VALUE/$value}" bench "$set" --device cuda --dtype float16 --batch-size 256 \
      --threads 16 --seconds 20 --rounds 1 --compare "$compare" --json "$OUT/${name}_${k}_$value.json" 2>&1 \
      | grep -E "backend=|GPU side" | grep -v '^\['
  done
}
# One line per bench_ab run of NAME (its JSON files, in run order): img/s, the rows/s of each
# side, the native threads' cores and rows per second of their CPU time (fastdata-bench's own
# estimate: bench_report.native_thread_share, native_rows_per_cpu_second), the share of that CPU
# time they waited for a core, the engines' busy share, the cores of the whole process, the GPU
# decoder's nvImageCodec calls' CPU per GPU row and the part of it in the kernel.   ab_table NAME
ab_table() {
  python3 - "$OUT" "$1" <<'PY'
import glob, json, re, sys
from fastdata.cli.bench_report import decode_kernel_share, gpu_side_rate, native_rows_per_cpu_second, native_thread_share
out, name = sys.argv[1:]
print(f"{'run':>3} {'setting':>8} {'img/s':>8} {'gpu rows/s':>10} {'native rows/s':>13} {'native cores':>12} "
      f"{'per core-s':>10} {'runq':>5} {'engines':>7} {'cores':>5} {'call CPU us/row':>15} {'kernel':>6}")
files = sorted(glob.glob(f"{out}/{name}_[0-9]*_*.json"), key=lambda f: int(re.search(rf"{name}_(\d+)_", f).group(1)))
for f in files:
    k, value = re.search(rf"{name}_(\d+)_(.*)\.json$", f).groups()
    try:
        r = json.load(open(f))["results"][0]
        d, secs = r.get("detail", {}), r.get("timed_seconds") or 0
        stage = d.get("gpu_stage_seconds") or {}
        rate, own = r["images_per_s"], native_thread_share(r) or 0.0
        cpu = r.get("thread_cpu_seconds", {}).get("fastdata-native", 0.0)
        waits = (r.get("thread_runqueue_seconds") or {}).get("fastdata-native", 0.0)
        per_cpu = native_rows_per_cpu_second(r, own) if own > 0 else None
        print(f"{k:>3} {value:>8} {rate:>8,.0f} {gpu_side_rate(r):>10,.0f} {rate * own:>13,.0f} "
              f"{cpu / secs if secs else 0:>12.1f} {per_cpu or 0:>10,.0f} {waits / cpu if cpu else 0:>5.0%} "
              f"{r.get('jpeg_engines_busy_percent') or 0:>6.0f}% {r.get('cpu_cores_busy') or 0:>5.1f} "
              f"{1e6 * stage.get('decode_cpu', 0) / max(1, d.get('gpu_rows') or 0):>15.0f} "
              + (f"{kernel:>6.0%}" if (kernel := decode_kernel_share(stage)) is not None else f"{'-':>6}"))
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        print(f"{k:>3} {value:>8} no result ({type(e).__name__}: {e})")
PY
}
# ResNet-18 training as CUDA graphs on the 8,192 set, an A/B of the module switch SETTING (its
# value written as VALUE): one synthetic run, then each RUN ("value|backend") in turn, each its own
# process; one table per value, each against the same synthetic run (or against the value's own,
# where a RUN's backend is "synthetic": the last synthetic run is a table's reference), in
# $OUT/NAME_value.md.
#   graphs_ab NAME SETTING RUN...
graphs_ab() {
  local name=$1 setting=$2 run value backend data; shift 2
  local args="--arch resnet18 --batch-size 256 --steps 300 --warmup-steps 80 --compile --compile-mode reduce-overhead --log-every 100"
  local values
  values=$(printf '%s\n' "$@" | cut -d'|' -f1 | sort -u)
  set8192
  host_probe "${name}_before"
  rm -f "$OUT/${name}_synthetic.jsonl"
  python3 examples/train.py --synthetic $args --results "$OUT/${name}_synthetic.jsonl" 2>&1 | grep -E "^summary|Error" | cut -c1-200
  for value in $values; do cp "$OUT/${name}_synthetic.jsonl" "$OUT/${name}_$value.jsonl"; done
  for run in "$@"; do
    value=${run%%|*}; backend=${run#*|}; data=/tmp/set8192
    case $backend in *@*) data=${backend#*@}; backend=${backend%%@*} ;; esac  # BACKEND@DATA: another input
    echo "== $name $value, $backend, $data"
    local input="$data --no-eval --backend $backend"
    [ "$backend" = synthetic ] && input=--synthetic  # the value's own synthetic run: its table's reference
    with_setting "${setting//VALUE/$value}" train $input $args \
      --results "$OUT/${name}_$value.jsonl" 2>&1 | grep -E "^summary|Error" | cut -c1-200
  done
  host_probe "${name}_after"
  for value in $values; do
    echo "== $name $value"
    python3 examples/train.py --table "$OUT/${name}_$value.jsonl" | tee "$OUT/${name}_$value.md"
  done
}
stage=${1:?stage: setup|dali_part|proof|decode|tests|bench|engines|contention|claim|overlap|progressive|train|train18|kernels|beside|pinned_calls|lanes|lanes_alone|waits|waits_train|waits_mix|waits_step|blocking|blocking_train|cache_train|priority|cores_train|timeline|default_train|stream_train|preempt|shared|cache|ddp}
case "$stage" in
  setup)
    # Optional wheels carried in: lmdb (.whl/) and DALI (/tmp/dali/wheels after joining parts).
    wheels=$(ls .whl/*.whl /tmp/dali/wheels/*.whl 2>/dev/null)
    [ -n "$wheels" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels
    python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -3
    python3 -c "import fastdata, torch; print('fastdata', fastdata.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())"
    lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket)" | tee "$OUT/lscpu.txt"
    ;;
  dali_part)
    # DALI and its CUDA libraries (~230 MB of wheels) travel as four tar parts of 58 MiB, one a call
    # (a call carries at most 64 MiB), into .dali/p00..p03; each call copies its part out of the tree
    # and the last joins them into /tmp/dali/wheels, which setup installs with .whl's wheels.
    part=${2:?dali_part N: 00..03}
    mkdir -p /tmp/dali && cp ".dali/p$part/"* /tmp/dali/ && ls -la /tmp/dali
    if [ "$part" = 03 ]; then
      mkdir -p /tmp/dali/wheels && cat /tmp/dali/dali.tar.0[0-3] | tar xf - -C /tmp/dali/wheels && ls /tmp/dali/wheels
    fi
    ;;
  decode)
    python3 -m pytest tests/io/test_fast_huffman.py tests/io/test_decode.py tests/io/test_decode_batch.py \
      tests/io/test_bad_input.py -q -p no:cacheprovider 2>&1 | tee "$OUT/decode_tests.log" | tail -3
    # The machine's own per-core slowdown with N busy cores (no fastdata involved)
    gcc -O2 -pthread -o /tmp/core_contention benchmarks/core_contention.c && /tmp/core_contention 1.5 2 \
      | tee "$OUT/core_contention.txt"
    python3 benchmarks/bench_decode.py --images 256 --threads 1,2,4,8,16 --json "$OUT/bench_decode_16c.json" 2>&1 \
      | tee "$OUT/bench_decode_16c.log" | tail -34
    ;;
  tests)
    # tests/gpu, plus the DALI backend and Loader-DALI suites' CUDA cases (DALI's asynchronous mixed pipeline)
    python3 -m pytest tests/gpu tests/decoders/test_dali_backend.py tests/loader/test_loader_dali.py \
      -q -m "gpu and not slow" -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
    python3 benchmarks/bench_decode.py --images 256 --threads 1,2,4,8,16 --json "$OUT/bench_decode_16c.json" 2>&1 \
      | tee "$OUT/bench_decode_16c.log" | tail -32
    python3 benchmarks/bench_gpu_decode.py --count 8192 --seconds 150 --json "$OUT/bench_gpu_decode.json" 2>&1 \
      | tee "$OUT/bench_gpu_decode.log" | tail -20
    ;;
  bench)
    fastdata-bench --device cuda --seconds 60 --json "$OUT/bench_cuda.json" 2>&1 | tee "$OUT/bench_cuda.log" | tail -20
    # The README's "Loader vs DataLoader and FFCV" CUDA table (was benchmarks/bench_loader.py)
    for dtype in uint8 float16; do
      fastdata-bench --device cuda --batch-size 256 --compare dataloader,ffcv,fastdata --dtype $dtype --rounds 2 \
        --seconds 36 --json "$OUT/bench_loader_cuda_$dtype.json" 2>&1 | tee "$OUT/bench_loader_cuda_$dtype.log" | tail -8
    done
    ;;
  engines)
    mixedset
    python3 benchmarks/bench_engines.py /tmp/mixed --seconds 6 --json "$OUT/bench_engines.json" 2>&1 \
      | tee "$OUT/bench_engines.log" | grep -v '^{'
    # Hybrid and gpu-only on the mix, alternating: 4:2:0 alone on the engines against the default
    # (4:2:0, 4:2:2 and 4:4:4, each on instances of its own; docs/results.md, ninth and tenth sessions).
    for setting in "n.ENGINE_SUBSAMPLING_CODES = [4]" "pass" "n.ENGINE_SUBSAMPLING_CODES = [4]" "pass"; do
      echo "== $setting"
      with_setting "import fastdata.decoders.nvimgcodec as n; $setting" bench \
        /tmp/mixed --device cuda --dtype float16 --batch-size 256 --threads 16 --seconds 40 \
        --compare fastdata-gpu,fastdata-hybrid 2>&1 | grep -v '^\[' | tail -6
    done
    ;;
  contention)
    # Hybrid's GPU side ran each of its rows 1.4x slower than gpu-only did (decode stage wall per
    # row, H200, eleventh session), its threads waiting for a core 56-69% of their CPU time beside
    # native threads at nice 10; under SCHED_IDLE 18% (twelfth session, one run). gpu-only with two
    # lanes of one instance (the default) and one lane of two, then hybrid alternating the default
    # (SCHED_IDLE native threads, four lanes of one instance, five batches in flight) against nice
    # 10 and against one lane of two instances with two batches in flight (the layout until the
    # thirteenth session; set before the Loader is made); summarized last by the bench's
    # own GPU-side line (bench_report.gpu_side_lines: the decode stage per row, its threads'
    # run-queue wait).
    set8192
    rm -f "$OUT"/contention_*.json "$OUT/contention_spy.txt"  # never summarize an earlier call's runs
    ONE_LANE="import fastdata.decoders.nvimgcodec as n; n.DECODE_LANES = 1; n.DECODE_THREADS = 2"
    NICE10="import fastdata.loader.pipeline as p; p.GPU_NATIVE_IDLE = False"
    ONE_LANE_HYBRID="import fastdata.decoders.nvimgcodec as n; n.HYBRID_DECODE_LANES = 1; n.DECODE_THREADS = 2; n.HYBRID_DEPTH = 2"
    k=0
    for run in "fastdata-gpu|pass" "fastdata-gpu|$ONE_LANE" "fastdata-hybrid|pass" "fastdata-hybrid|$NICE10" \
               "fastdata-hybrid|$ONE_LANE_HYBRID" "fastdata-hybrid|pass" "fastdata-hybrid|$NICE10" "fastdata-hybrid|$ONE_LANE_HYBRID" \
               "fastdata-hybrid|pass"; do
      k=$((k + 1)); contender=${run%%|*}; setting=${run#*|}
      echo "== $k $contender: $setting"
      with_setting "$setting" bench /tmp/set8192 --device cuda --dtype float16 --batch-size 256 --threads 16 --seconds 20 \
        --compare "$contender" --json "$OUT/contention_$k.json" 2>&1 | grep -E "backend=" | grep -v '^\[' | tail -1
    done
    # Where hybrid's threads are, steady state: py-spy (when installed) attached 14 s into a run
    # (its first batch comes ~8 s after the start), 8 s of samples with native frames, idle
    # ones too; the top frames of each thread kind are printed after the summary.
    if command -v py-spy >/dev/null; then
      python3 -m fastdata.cli.bench /tmp/set8192 --device cuda --dtype float16 --batch-size 256 --threads 16 \
        --seconds 30 --compare fastdata-hybrid --quiet >/dev/null 2>&1 &
      bench_pid=$!
      sleep 14
      timeout 30 py-spy record --pid "$bench_pid" -d 8 -r 100 --native --idle --threads --format raw \
        -o "$OUT/contention_spy.txt" >/dev/null 2>&1 || echo "py-spy could not attach"
      wait "$bench_pid"
    fi
    python3 - "$OUT" <<'PY' | tee "$OUT/contention.txt"
import collections, glob, json, os, re, sys
from fastdata.cli.bench_report import gpu_side_lines
for path in sorted(glob.glob(sys.argv[1] + "/contention_*.json"), key=lambda p: int(p.split("_")[-1][:-5])):
    report = json.load(open(path))
    r = report["results"][0]
    print(f"run {path.split('_')[-1][:-5]}: {r.get('images_per_s', 0):,.0f} img/s, {r.get('cpu_cores_busy', 0):.1f} cores")
    for line in gpu_side_lines(report):
        print("   ", line)
spy = os.path.join(sys.argv[1], "contention_spy.txt")
if os.path.exists(spy):  # raw py-spy: "thread (tid): name;frame;...;frame count"
    leaves = collections.defaultdict(collections.Counter)
    for line in open(spy):
        stack, count = line.rstrip().rsplit(" ", 1)
        frames = stack.split(";")
        kind = re.sub(r"(_\d+|-[0-9a-f]{8,})$", "", frames[0].split(":", 1)[-1].strip())
        kind = re.sub(r"^thread \(\w+\)$", "unnamed threads", kind)
        # The deepest frame that says where: libc's waits and unresolved addresses (all that the
        # leaves showed in the twelfth session) are skipped for the frame that called them.
        named = [f for f in frames[1:] if "(libc.so" not in f and "libpthread" not in f and not f.startswith("0x")]
        leaves[kind][(named[-1] if named else frames[-1])[:110]] += int(count)
    for kind, counter in sorted(leaves.items(), key=lambda kv: -sum(kv[1].values()))[:8]:
        print(f"{kind}: {sum(counter.values())} samples")
        for frame, n in counter.most_common(4):
            print(f"    {n:5d} {frame}")
PY
    ;;
  claim)
    # The engine's threads take a run's rows largest first (claim_order, csrc/core/engine.cpp); on
    # the mix hybrid's native share is ~56 rows a batch, ~91% of them ones the engines refuse, on
    # 13 threads, and a model from measured row costs put the run 1.26x shorter than in batch
    # order (docs/results.md, "Rows claimed largest first"). Alternating runs, each its own process;
    # the bench's GPU-side line gives the native threads' cores.
    mixedset
    for setting in "_C._set_claim_largest_first(False)" "pass" "_C._set_claim_largest_first(False)" "pass"; do
      echo "== $setting"
      with_setting "from fastdata import _C; $setting" bench /tmp/mixed --device cuda --dtype float16 --batch-size 256 --threads 16 --seconds 30 \
        --compare fastdata-hybrid 2>&1 | grep -E "backend=hybrid" | grep -v '^\['
    done
    ;;
  overlap)
    # The native engine's runs without a barrier (ThreadPool::enqueue) against with one
    # (_C._set_overlap_runs(False)), alternating in one process; the table says where the native
    # threads idle: no run queued (occupancy) or inside runs (docs/results.md, "fifteenth session").
    mixedset
    set8192
    for set in /tmp/mixed /tmp/set8192; do
      python3 benchmarks/bench_native_occupancy.py $set --device cuda --backend hybrid --seconds 15 --runs 4 \
        --switch overlap 2>&1 | tail -7 | tee -a "$OUT/overlap.log"
    done
    ;;
  progressive)
    # fastdata's progressive Huffman decoder against libjpeg-turbo's (_C._set_fast_progressive),
    # alternating in one process: hybrid on the demo mix, whose native side is bound by the
    # progressive rows the engines refuse (docs/results.md, "sixteenth session"); then the
    # per-core decode A/B on progressive files.
    mixedset
    python3 benchmarks/bench_native_occupancy.py /tmp/mixed --device cuda --backend hybrid --seconds 15 --runs 4 \
      --switch progressive 2>&1 | tail -7 | tee "$OUT/progressive.log"
    python3 benchmarks/bench_decode.py --progressive --images 64 --threads 1,16 --process-seconds 0 \
      --json "$OUT/bench_decode_progressive.json" 2>&1 | tail -30 | tee -a "$OUT/progressive.log"
    ;;
  train)
    # --loader fastdata takes the Loader's default backend: native since the thirty-ninth session
    # (hybrid on CUDA with the gpu extra before); train18 and the *_train stages name theirs.
    python3 -m fastdata.cli.demo --count 10000 --classes 100 --out /tmp/demo10k >/dev/null
    rm -f "$OUT/runs.jsonl"
    for arch in resnet50 resnet18; do
      python3 examples/train.py --synthetic --arch $arch --batch-size 256 --steps 120 --warmup-steps 30 \
        --log-every 30 --results "$OUT/runs.jsonl" 2>&1 | tail -2
      for loader in dataloader fastdata; do
        python3 examples/train.py /tmp/demo10k --arch $arch --loader $loader --batch-size 256 --steps 120 \
          --warmup-steps 30 --log-every 30 --no-eval --results "$OUT/runs.jsonl" 2>&1 | tail -2
      done
    done
    python3 examples/train.py --table "$OUT/runs.jsonl" | tee "$OUT/train_table.md"
    ;;
  train18)
    # ResNet-18, bf16, channels_last, on the 8,192 set: synthetic against hybrid, alternating,
    # with the eager step and with the step as CUDA graphs (--compile-mode reduce-overhead; its
    # first steps compile, untimed). Twenty-second session (H100): eager hybrid 83-88% of
    # synthetic with data wait 0.3-0.5%; graphs 75% with data wait 7.5-8.5%.
    set8192
    # One table per mode: the table compares each run with the last synthetic run of its model.
    for mode in eager graphs; do
      steps="--steps 150 --warmup-steps 30"
      [ $mode = graphs ] && steps="--steps 200 --warmup-steps 60 --compile --compile-mode reduce-overhead"
      rm -f "$OUT/train18_$mode.jsonl"
      for input in "--synthetic" "/tmp/set8192 --no-eval --backend hybrid" "--synthetic" "/tmp/set8192 --no-eval --backend hybrid"; do
        python3 examples/train.py $input --arch resnet18 --batch-size 256 $steps --log-every 100 \
          --results "$OUT/train18_$mode.jsonl" 2>&1 | grep -E "^summary|Error" | cut -c1-200
      done
      echo "== $mode"
      python3 examples/train.py --table "$OUT/train18_$mode.jsonl" | tee "$OUT/train18_$mode.md"
    done
    ;;
  kernels)
    # GPU busy time per batch of 256 (torch's profiler), which the CUDA events around a call
    # overstate by the time the GPU idles while the host plans: the input's cost to a training step.
    python3 benchmarks/bench_gpu_resample.py --images 256 --repeats 50 --layouts hwc --assembly --kernel-times \
      --json "$OUT/bench_gpu_resample_kernels.json" 2>&1 | tee "$OUT/kernels.log" | tail -14
    ;;
  beside)
    # The loader beside a training step that launches as CUDA graphs (twenty-third session, H100:
    # the GPU side's decode calls took 2.4x (gpu-only) to 4.4x (hybrid) their bench time per row).
    # Synthetic, hybrid and gpu-only, each with 10 steps profiled after the warm-up (each CUDA
    # stream's GPU time per step and launch-to-start delays; those steps are not in the rate), the
    # loader's stage times per batch under the table; then hybrid and gpu-only alone in the bench.
    set8192
    rm -f "$OUT/beside.jsonl"
    for input in "--synthetic" "/tmp/set8192 --no-eval --backend hybrid" "/tmp/set8192 --no-eval --backend gpu"; do
      python3 examples/train.py $input --arch resnet18 --batch-size 256 --steps 300 --warmup-steps 80 --profile-steps 10 \
        --compile --compile-mode reduce-overhead --log-every 100 --results "$OUT/beside.jsonl" 2>&1 \
        | grep -E "^profile|^  |Error" | cut -c1-400
    done
    python3 examples/train.py --table "$OUT/beside.jsonl" | tee "$OUT/beside.md"
    for contender in fastdata-hybrid fastdata-gpu; do
      fastdata-bench /tmp/set8192 --device cuda --dtype float16 --batch-size 256 --threads 16 --seconds 20 \
        --compare $contender 2>&1 | grep -E "backend=|GPU side|JPEG" | grep -v '^\['
    done
    ;;
  pinned_calls)
    # The engines' calls (RGB) with the files' bytes pageable or in pinned memory, alone and beside
    # a replayed ResNet-18 graph, alternating: beside it, pageable calls ran ~20x slower with their
    # thread's CPU busy the whole call (thirty-ninth session); nvJPEG uploads the bytes inside the
    # call. Fortieth session, H100: pinned bytes no faster beside it (one lane 361/347 img/s against
    # 407/382), so the Loader's A/B switch for them (PINNED_BITSTREAMS) was taken out.
    set8192
    python3 benchmarks/bench_engines_beside_load.py /tmp/set8192 --lanes 1,4 --seconds 3 --rounds 2 2>&1 \
      | tee "$OUT/engines_beside_load.log" | grep -v '^\[' | grep -v "nvjpeg2k\|nvtiff\|nvTIFF\|nvJPEG2000"
    ;;
  lanes)
    # More batches decoding at once beside ResNet-18 training as CUDA graphs: two lanes (three
    # batches in flight) against four (five), gpu-only and hybrid, alternating; VALUE sets both
    # backends' layouts. Twenty-sixth session, H100: hybrid 89.0% of synthetic on two lanes, 94.3%
    # on four (now hybrid's default, nvimgcodec.HYBRID_DECODE_LANES); gpu-only no faster on four.
    graphs_ab lanes "import fastdata.decoders.nvimgcodec as n; n.DECODE_LANES = n.HYBRID_DECODE_LANES = VALUE; n.DEPTH = n.HYBRID_DEPTH = VALUE + 1" \
      "2|gpu" "4|gpu" "4|hybrid" "2|hybrid" "2|gpu" "4|gpu"
    ;;
  lanes_alone)
    # The same layouts alone in the bench: hybrid on two, three or four lanes (batches in flight one
    # more), then gpu-only on two or four, alternating. Asked because every figure of the GPU side's
    # calls' CPU (hybrid ~125-131 us per GPU row on four lanes, gpu-only ~85 on two, forty-fourth
    # session) compared four lanes with two: if each lane's thread is busy for its call's whole wall
    # (thirty-ninth session), a call's CPU per row is about the lanes at once over the GPU side's
    # rows/s (2 / 23,000 = 87 us; 4 / 20,600 = 194 at most), whether native threads run beside it or not.
    # Forty-fifth session, another H100: it follows the calls in flight at once, not the native threads
    # (gpu-only 73 us on two lanes, 179 on four; hybrid, whose lanes are not all in a call at once,
    # 69-70 on two, 98-108 on four), and hybrid on fewer lanes ran no faster (docs/results.md).
    bench_ab lanes_alone "import fastdata.decoders.nvimgcodec as n; n.HYBRID_DECODE_LANES = VALUE; n.HYBRID_DEPTH = VALUE + 1" \
      4 2 3 3 2 4
    ab_table lanes_alone
    BENCH_COMPARE=fastdata-gpu bench_ab lanes_gpu "import fastdata.decoders.nvimgcodec as n; n.DECODE_LANES = VALUE; n.DEPTH = VALUE + 1" \
      2 4
    ab_table lanes_gpu
    ;;
  waits)
    # balance.WAIT_SPLIT: the hybrid's balanced share moved by which side the producer waited for
    # (the native threads or the GPU decoder; a move up from the rates' share at least) instead of
    # set from the two measured rates, alone in the bench, alternating; the native and gpu rows
    # once before, for the ceiling.
    set8192
    fastdata-bench /tmp/set8192 --device cuda --dtype float16 --batch-size 256 --threads 16 --seconds 40 --rounds 1 \
      --compare fastdata,fastdata-gpu --json "$OUT/waits_ceiling.json" 2>&1 | grep -v '^\[' | tail -5
    bench_ab waits "import fastdata.loader.balance as b; b.WAIT_SPLIT = VALUE" False True True False
    ;;
  waits_train)
    graphs_ab waits "import fastdata.loader.balance as b; b.WAIT_SPLIT = VALUE" \
      "False|hybrid" "True|hybrid" "True|hybrid" "False|hybrid"
    ;;
  waits_mix)
    # The same A/B on the demo mix: one set of four 12-s runs by hand (thirtieth session) had the
    # waits 3-8% slower there, inside a wide spread; the thirty-first session's runs 7% (steps of
    # 1/16) and 20% (1/64) slower, all but the start as fast: a climb starts at the rates' share since
    # (thirty-second session: the waits +5% here by the means, +1% by the medians; +6% on the 8,192 set).
    mixedset
    BENCH_SET=/tmp/mixed bench_ab waits_mix "import fastdata.loader.balance as b; b.WAIT_SPLIT = VALUE" \
      False True True False False True
    ;;
  waits_step)
    # balance.WAIT_STEP_MAX: a model of the two queues (tests: _queued_hybrid) swings 160-212 rows
    # of 256 around the balance point at 1/16 and runs 96% of its ceiling at 1/64 against 89%; on
    # an H100 (thirty-first session) 1/64 ran +6% (two alternating pairs) and is the default since.
    bench_ab waits_step "import fastdata.loader.balance as b; b.WAIT_STEP_MAX = 1 / VALUE" 16 64 64 16
    ;;
  blocking)
    # CUDA's host waits asleep: the primary context made with CU_CTX_SCHED_BLOCKING_SYNC (set before
    # torch makes it) or with CUDA's default (a waiting thread spins while the process has fewer
    # contexts than cores), hybrid then gpu-only alone, alternating: does the flag reach the GPU
    # side's decode calls, whose CPU time is about their wall time? Thirty-third session, H100: no
    # (102-116 against 106-110 us of CPU per GPU row in hybrid, 71 against 72 in gpu-only).
    bench_ab blocking "$blocking_flag" True False False True
    BENCH_COMPARE=fastdata-gpu bench_ab blocking_gpu "$blocking_flag" True False
    ab_table blocking; ab_table blocking_gpu
    ;;
  blocking_train)
    # Beside training the decode calls took ~850 us of CPU per GPU row against ~120 alone (H100,
    # thirty-fourth session): if that is a wait for the GPU inside nvJPEG, blocking sync frees the
    # cores for the native threads. It reaches the training's own waits too, so synthetic runs under it.
    # One pair on an H200 (these runs by hand, thirty-fourth session): 76.0% against 75.1% of
    # synthetic, the calls' CPU 91% of their wall against 90%: no change seen, but there the calls
    # took ~350 us a GPU row, not the H100's ~850. The True table keeps the copied default-context
    # synthetic row above its own, which is its reference.
    graphs_ab blocking "$blocking_flag" "True|synthetic" "True|hybrid" "False|hybrid" "False|hybrid" "True|hybrid"
    ;;
  cache_train)
    # The same training with hybrid reading the 8,192 set's files or fastdata-convert's LMDB of them
    # (records with a restart marker every MCU and the restart index: native decode of this kind of
    # image 1.36-1.37x per core from them on the 2-core box, thirty-sixth session). Beside training
    # the loader is CPU-bound (thirty-fourth session's reckoning: 98% of synthetic needs at most
    # ~0.885 ms of CPU an image; from the files the runs spent ~0.93).
    set8192_lmdb
    graphs_ab cache_train "pass  # VALUE: which input" "files|hybrid" "lmdb|hybrid@/tmp/set8192.lmdb" \
      "lmdb|hybrid@/tmp/set8192.lmdb" "files|hybrid"
    ;;
  priority)
    # Hybrid's native threads under SCHED_IDLE, 13 (HYBRID_HOST_CORES = 3), 16 (0, the default since
    # this stage's runs) or 19, or 13 at nice 19, alternating on the 8,192 set; first wake_placement.c,
    # where the kernel puts a woken SCHED_IDLE thread (with all cores but one kept busy by a crowd
    # of spinning threads, the case the 2-core box cannot make). Asked because the forty-second
    # proof left 2.7 of 16 cores unused while 2.3 native threads waited for one. Forty-fourth
    # session, one H100: 0% of wakes on the waker's core, crowd or not; idle16 and idle19 kept
    # 15.3-15.4 cores busy and ran 1-5% above idle13 (14.7-14.9); nice19's rate fell between the
    # two, at 13.9-14.0 cores (docs/results.md).
    uname -r
    gcc -O2 -pthread -o /tmp/wake_placement benchmarks/wake_placement.c && for crowd in 0 $(( $(nproc) - 2 )); do
      for policy in idle nice19 normal; do /tmp/wake_placement $policy 2 $crowd; done; done | tee "$OUT/wake_placement.txt"
    bench_ab priority "import fastdata.loader.pipeline as p; v = 'VALUE'; p.GPU_NATIVE_IDLE = v != 'nice19'; \
p.GPU_NATIVE_NICE = 19; p.HYBRID_HOST_CORES = {'idle16': 0, 'idle19': -3}.get(v, 3)" \
      idle13 idle16 nice19 idle19 idle19 nice19 idle16 idle13
    ab_table priority  # each run's GPU-side line (bench_report.gpu_side_lines) is printed as it runs
    ;;
  cores_train)
    # Hybrid's native threads 13 (HYBRID_HOST_CORES = 3) or 16 (0, the default since the forty-fourth
    # session) beside ResNet-18 training as CUDA graphs, alternating. That session, one H100: bench
    # alone, 16 led 13 in four pairs of four (36.6-37.1k img/s against 35.4-36.1k); beside training
    # both 98.5-99.6% of synthetic (thirty-ninth session, a slower host: no different either).
    graphs_ab cores "import fastdata.loader.pipeline as p; p.HYBRID_HOST_CORES = VALUE" "3|hybrid" "0|hybrid" \
      "0|hybrid" "3|hybrid"
    ;;
  timeline)
    # Where the GPU side's host threads spend their CPU, step by step (bench_producer_timeline.py: each
    # step's wall and CPU per batch, then every thread kind's CPU per batch). Forty-second session's
    # proof: gpu-only's producer thread 0.89 cores (53 us per row) against hybrid's 21 us per row;
    # forty-fourth session, another H100: gpu-only's producer 3.5 ms of CPU per batch, ~14 us per row.
    # gpu-only with 2 native threads as fastdata-bench's contender runs it; hybrid its own choice.
    set8192
    for run in "gpu --threads 2" "hybrid"; do
      python3 benchmarks/bench_producer_timeline.py /tmp/set8192 --device cuda --backend $run --dtype float16 \
        --batch-size 256 --seconds 12 --label "" 2>&1 | tee "$OUT/timeline_${run%% *}.txt" | grep -v '^\['
    done
    ;;
  default_train)
    # The default's evidence from the files: native (backend="auto" since the thirty-ninth session)
    # against hybrid beside ResNet-18 training as CUDA graphs on the 8,192 set's files, alternating
    # (from the LMDB native led by 0.7-21 points in four calls). Fortieth session, one H100, two
    # calls: native 96.8/84.7% and 76.5/74.4% of synthetic, hybrid 90.2/84.2% and 81.2/81.6%: even.
    # Forty-fifth session, another H100 (probe 12,632-12,770 img/s): native 90.9/78.5%, hybrid 87.0/85.7%.
    graphs_ab default "pass  # VALUE: the backend" "native|native" "hybrid|hybrid" "hybrid|hybrid" "native|native"
    ;;
  stream_train)
    # Whether the step loses to an implicit sync with the legacy default stream (which torch
    # trains on) where nvJPEG's work goes: the main thread's current stream a side stream or not.
    # Thirty-eighth session, one H100: side 76.6% and 76.5% of synthetic, legacy 83.9% and 81.5%.
    set8192_lmdb
    L=/tmp/set8192.lmdb
    graphs_ab stream "import torch; VALUE and torch.cuda.set_stream(torch.cuda.Stream(0))" "False|hybrid@$L" \
      "True|hybrid@$L" "True|hybrid@$L" "False|hybrid@$L"
    ;;
  preempt)
    # No GPU: what this host's SCHED_IDLE native threads lose per CPU-second beside threads that
    # wake often (the GPU side's pattern), floating over every core or kept to three reserved
    # ones (one H100 host: hybrid's native threads about 787 rows per CPU-second against 1,048 alone).
    python3 benchmarks/bench_idle_preemption.py --patterns 200:100,50:20 --wakers 8 --reserve 3 2>&1 \
      | tee "$OUT/preempt.txt" | tail -32
    # 0:1000000 is a busy loop: partitioned, what the cores cost each other with no thread shared
    # (another H100 host, by hand: 0.85-0.91x with five loops on cores 11-15, thirty-third session).
    python3 benchmarks/bench_idle_preemption.py --patterns 0:1000000 --wakers 5 --reserve 5 2>&1 \
      | tee "$OUT/preempt_busy.txt" | tail -16
    ;;
  shared)
    # nvimgcodec.SHARED_INSTANCE: the decoder objects on one nvImageCodec instance (the default;
    # a hybrid start of 1.0 s) or on one each (16.6 s), beside ResNet-18 training as CUDA graphs,
    # alternating: whether decoders sharing an instance decode slower beside training.
    graphs_ab shared "import fastdata.decoders.nvimgcodec as n; n.SHARED_INSTANCE = VALUE" \
      "True|hybrid" "False|hybrid" "False|hybrid" "True|hybrid"
    ;;
  cache)
    # native, gpu and hybrid on the 8,192 set as files and as fastdata-convert's LMDB (records with a
    # restart marker every MCU and the restart index: 1.41x the native crop rate per core on the
    # 2-core box), alternating: whether the engines take those records as they take the files.
    set8192_lmdb
    k=0
    for data in /tmp/set8192 /tmp/set8192.lmdb /tmp/set8192.lmdb /tmp/set8192; do
      k=$((k + 1)); echo "== $k $data"
      native=fastdata; [ "${data%.lmdb}" != "$data" ] && native=lmdb  # on an LMDB the native row is "lmdb"
      fastdata-bench "$data" --device cuda --dtype float16 --batch-size 256 --threads 16 --seconds 60 --rounds 1 \
        --compare $native,fastdata-gpu,fastdata-hybrid --json "$OUT/cache_$k.json" 2>&1 | grep -v '^\[' | tail -8
    done
    ;;
  proof)
    # The issue's proof: one run per set with every contender, each its own share of the seconds,
    # img/s and CPU cores per contender, and the gpu + native ceiling of the same run (the report's
    # last lines). Needs DALI's wheels (dali_part 00..03, then setup) for the last two contenders.
    set8192; mixedset
    for data in /tmp/set8192 /tmp/mixed; do
      echo "== proof $data"
      fastdata-bench "$data" --device cuda --dtype float16 --batch-size 256 --threads 16 --seconds ${PROOF_SECONDS:-90} \
        --rounds 1 --settle-max 5 --compare dataloader,fastdata,fastdata-gpu,fastdata-hybrid,fastdata-dali,dali \
        --json "$OUT/proof_$(basename $data).json" 2>&1 | grep -v '^\[' | tail -16
    done
    ;;
  ddp)
    python3 -m pytest tests/loader/test_loader_ddp.py -q -m gpu -p no:cacheprovider 2>&1 | tee "$OUT/ddp.log" | tail -5
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
