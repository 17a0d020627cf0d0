"""Output of `fastdata-bench`: machine info, the terminal table, JSON and a PNG bar chart.

The report is one plain dict (JSON-ready): ``machine``, ``config``, ``dataset``,
``results`` (one entry per contender or ablation step, in run order: measured ones carry
their numbers, skipped/failed ones a ``reason``) and ``ablation`` (bool).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, List, Optional, TextIO

import fastdata
from fastdata.io.host import usable_cores


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _threads_per_core() -> Optional[int]:
    """Hardware threads sharing cpu0's core (2 with SMT/hyper-threading), from sysfs; None where
    unknown. A row's CPU cores mean less with SMT: two busy siblings share one core's units."""
    try:
        with open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list", encoding="ascii") as f:
            return cpu_list_count(f.read())
    except OSError:
        return None


def cpu_list_count(text: str) -> Optional[int]:
    """CPUs in a kernel CPU list ("0,8", "0-1", "3"); None when it is not one."""
    count = 0
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            return None
        if last < first:
            return None
        count += last - first + 1
    return count


def machine_info() -> Dict[str, Any]:
    """CPU model, cores, memory, GPU and the versions that matter for these numbers."""
    import psutil

    info: Dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores_usable": usable_cores(),
        "cores_logical": os.cpu_count(),
        "threads_per_core": _threads_per_core(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
    }
    versions: Dict[str, Optional[str]] = {"fastdata": fastdata.__version__}
    for dist in ("torch", "torchvision", "numpy", "Pillow", "Pillow-SIMD", "lmdb",
                 "opencv-python-headless", "simplejpeg", "nvidia-dali-cuda120", "nvidia-dali-cuda130"):
        v = _version(dist)
        if v is not None:
            versions[dist] = v
    try:
        from PIL import features

        versions["libjpeg-turbo (Pillow)"] = features.version("libjpeg_turbo")
    except Exception:  # an old Pillow without features.version: leave it out
        pass
    info["versions"] = versions
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
                   "cuda": torch.version.cuda}
    except Exception as e:  # a broken CUDA setup is worth reporting, not crashing on
        gpu = {"error": f"{type(e).__name__}: {e}"}
    info["gpu"] = gpu
    return info


def build_report(results: List[Dict[str, Any]], *, dataset: Dict[str, Any], config: Dict[str, Any],
                 ablation: bool, wall_seconds: float) -> Dict[str, Any]:
    return {
        "tool": "fastdata-bench",
        "fastdata_version": fastdata.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["fastdata-bench"] + sys.argv[1:]) if sys.argv else "fastdata-bench",
        "machine": machine_info(),
        "config": config,
        "dataset": dataset,
        "ablation": ablation,
        "results": results,
        "wall_seconds": round(wall_seconds, 2),
    }


# ---------------------------------------------------------------------------------------
# Table


def _fmt_rate(x: Optional[float]) -> str:
    return "" if x is None else f"{x:,.0f}"


# A contender timed for less than this (its share of --seconds, less its start-up and warm-up)
# is marked: on the H200, six contenders under --seconds 20 were timed 0.02-2.7 s each, and one
# printed 22,912 img/s from two batches (2026-12-03).
SHORT_TIMED_SECONDS = 2.0


def _short(r: Dict[str, Any]) -> bool:
    return r.get("status") == "ok" and r.get("timed_seconds", SHORT_TIMED_SECONDS) < SHORT_TIMED_SECONDS


def table_rows(report: Dict[str, Any]) -> List[List[str]]:
    """Header + one row per result (strings), shared by the rich and the plain table."""
    ablation = report["ablation"]
    # img/s: timed images / timed seconds; min-max and IQR: of the timed windows (bench_runner)
    head = ["step" if ablation else "contender", "img/s", "min-max", "IQR", "CPU cores", "peak RSS MB"]
    head += ["vs previous", "vs baseline"] if ablation else ["vs baseline"]
    rows = [head]
    for r in report["results"]:
        if r.get("status") != "ok":
            row = [r["label"], r["status"], r.get("reason", "")]
            rows.append(row + [""] * (len(head) - len(row)))
            continue
        s = r["spread"]
        row = [r["label"], _fmt_rate(r["images_per_s"]) + ("*" if _short(r) else ""), f"{s['min']:,.0f}-{s['max']:,.0f}",
               f"{s['q1']:,.0f}-{s['q3']:,.0f}", f"{r['cpu_cores_busy']:.2f}", f"{r['peak_rss_mb']:,.0f}"]
        if ablation:
            row += [f"{r['speedup_vs_previous']:.2f}x", f"{r['speedup_vs_baseline']:.2f}x"]
        else:
            row += [f"{r['speedup_vs_baseline']:.2f}x" if "speedup_vs_baseline" in r else ""]
        rows.append(row)
    return rows


def gpu_side_rate(result: Dict[str, Any]) -> float:
    """Rows per second a GPU backend's run decoded on the GPU: its rate times the share of its rows
    the GPU decoded (``LoaderStats.gpu_share``); 0 for a run without a GPU side."""
    return result["images_per_s"] * result.get("detail", {}).get("gpu_share", 0.0)


def ceiling_line(report: Dict[str, Any]) -> Optional[str]:
    """With fastdata (native) and fastdata-gpu measured in the same run: their sum, what the
    box can do when both decode at once (the gpu contender keeps 2 native threads for the
    rows the engines refuse), and the hybrid's share of it; with the engines contender too,
    the gpu backend's rate as a share of the engines' decode-only rate, and on a set with rows
    the engines do not take, the share its GPU rows alone make (the engines' rate counts only
    the images they decode).

    That sum counts each side with the whole machine's CPU, which the two sides cannot both
    have at once. So the line adds the **CPU-budget ceiling**: the gpu rate plus the native
    rate per busy core times the cores the gpu contender leaves (the machine's usable cores
    less the gpu's busy cores), and the hybrid's share of that. It is a low estimate: native's
    rate per core is taken at full load, and it is higher on fewer cores (H200 box, bench_decode.py:
    72% of the one-thread rate per thread at 8 threads, 68% at 16), so the hybrid's share of it
    reads high."""
    ok = {r["name"]: r for r in report["results"] if r.get("status") == "ok"}
    if "fastdata" not in ok or "fastdata-gpu" not in ok:
        return None
    native, gpu, hybrid = ok["fastdata"], ok["fastdata-gpu"], ok.get("fastdata-hybrid")
    ceiling = native["images_per_s"] + gpu["images_per_s"]
    line = f"ceiling (native + gpu, same run): {ceiling:,.0f} img/s"
    if hybrid is not None:
        line += f"; hybrid {hybrid['images_per_s'] / ceiling:.0%} of it"
        share = hybrid.get("detail", {}).get("gpu_share")
        if share is not None:
            line += f", GPU share {share:.0%}"
    cores = (report.get("machine") or {}).get("cores_usable")
    if cores and native.get("cpu_cores_busy") and gpu.get("cpu_cores_busy") is not None:
        left = max(0.0, cores - gpu["cpu_cores_busy"])
        budget = gpu["images_per_s"] + native["images_per_s"] / native["cpu_cores_busy"] * left
        line += (f"; CPU-budget ceiling (gpu + native at its full-load rate per core on the {left:.1f} of {cores} "
                 f"cores gpu leaves; a low estimate): {budget:,.0f} img/s")
        if hybrid is not None:
            line += f", hybrid {hybrid['images_per_s'] / budget:.0%} of it"
    own = native_thread_share(hybrid) if hybrid is not None else None
    if own is not None:
        # Hybrid's native side gets fewer cores than native alone, and on some hosts less out of
        # each (an H100, thirty-second session: about 787 against 1,048): the two losses read
        # apart here.
        alone, beside = native_rows_per_cpu_second(native, 1.0), native_rows_per_cpu_second(hybrid, own)
        if alone is not None and beside is not None:
            line += f"; hybrid's native threads about {beside:,.0f} rows per core-second, native alone's {alone:,.0f}"
    if "engines" in ok:  # the gpu backend against what its decoder alone delivers
        engines = ok["engines"]["images_per_s"]
        line += (f"; gpu {gpu['images_per_s'] / engines:.2f}x the engines' decode-only rate"
                 f" at {gpu['cpu_cores_busy']:.1f} cores")
        share = gpu.get("detail", {}).get("gpu_share")
        if share is not None and share < 0.995:
            # The engines' rate counts only the images they decode; gpu decodes the rest (progressive,
            # CMYK, ...) on its native threads, which can set its rate (the demo mix on a slow host,
            # forty-fifth session: 0.76x overall). Its GPU rows alone are the like-for-like figure.
            line += f" (its GPU rows alone {gpu_side_rate(gpu) / engines:.2f}x, {1 - share:.0%} of its rows native)"
    return line


def native_thread_share(result: Dict[str, Any]) -> Optional[float]:
    """The share of a GPU backend's rows its native decode threads decoded, from the Loader's
    counts over its whole life: the rows the GPU was not given, less those it handed back (the
    inline engine's threads decode them). None without the counts."""
    detail = result.get("detail") or {}
    counts = [detail.get(k) for k in ("gpu_rows", "native_rows", "gpu_rejected")]
    if not all(isinstance(c, int) for c in counts) or counts[0] + counts[1] <= 0:
        return None
    gpu_rows, native_rows, rejected = counts
    return (native_rows - rejected) / (gpu_rows + native_rows)


def native_rows_per_cpu_second(result: Dict[str, Any], native_share: float) -> Optional[float]:
    """Rows the native decode threads gave per second of their CPU time in the timed window,
    or None without their thread figures. ``native_share``: their share of the result's
    images, from the Loader's counts over its whole life, warm-up included (as on the GPU-side
    line): where hybrid's share moves during the run the figure is an estimate (its GPU share
    climbing from the warm-up's, it reads high)."""
    cpu = (result.get("thread_cpu_seconds") or {}).get("fastdata-native", 0.0)
    seconds = result.get("timed_seconds") or 0.0
    if cpu <= 0 or seconds <= 0:
        return None
    return result["images_per_s"] * native_share * seconds / cpu


# Thread kinds of the gpu decoder (fastdata.decoders.nvimgcodec): its decode and resample
# workers and nvImageCodec's own host threads (OS name "[NVIMGCODEC][TP...", cut to 15 chars).
GPU_FEEDER_THREADS = ("py:fastdata-gpu-", "[NVIMGCODEC]")


def decode_kernel_share(stage: Dict[str, float]) -> Optional[float]:
    """The share of the GPU decoder's calls' CPU time spent in the kernel (its
    ``stage_seconds``): waiting through system calls, against a spin in user space. None where
    the decoder kept no split (another OS, or a result from before it did)."""
    in_kernel, cpu = stage.get("decode_sys"), stage.get("decode_cpu") or 0.0
    return in_kernel / cpu if in_kernel is not None and cpu > 0 else None


def gpu_side_lines(report: Dict[str, Any]) -> List[str]:
    """Where a gpu or hybrid contender's time goes, one line each: the rows/s its GPU side
    delivered; the nvImageCodec decode stage's wall time (summed over its lanes) and its calling
    threads' CPU time per GPU row (with ``decode_kernel_share``), and how busy that stage was
    (wall per row x GPU rows/s / lanes: near 100% means the GPU side is the limit; the first batches' slower calls can put that estimate above 100%, shown
    as 100%); the share of their CPU time the GPU decoder's threads spent runnable
    but waiting for a core (``thread_runqueue_seconds``); the cores of the native decode threads
    and of the planning (inline engine) threads, with how busy the native threads were within
    their runs (``LoaderStats.native_busy_in_runs``, over the Loader's life) and how many of them
    were runnable but waiting for a core on average; the planning threads' minor page faults per row
    read (``thread_minor_faults``; an underestimate: the rows are counted over the Loader's life,
    and the producer thread, which reads a share of them, is left out); the cores the whole process kept busy out of the
    machine's usable ones (a hybrid run with unused cores while its native threads wait for one
    left CPU on the table: forty-second session, 2.7 of 16 unused beside 2.3 waiting); hybrid's share
    from the producer's waits where it ended, and how often it moved up and down. The stage
    seconds and rows are the decoder's totals since it was made, so per-row figures include
    the warm-up batches; the thread figures are the timed window's. Last, what making the
    decoder's nvImageCodec decoders and the instances they are made on cost, once, before the
    first batch (``creation_seconds``; an instance another Loader made costs nothing, though a
    decoder made while another makes it waits for it, in its wall time)."""
    lines = []
    for r in report["results"]:
        detail = r.get("detail", {})
        stage, gpu_rows = detail.get("gpu_stage_seconds"), detail.get("gpu_rows") or 0
        if r.get("status") != "ok" or not stage or gpu_rows <= 0:
            continue
        rate = gpu_side_rate(r)
        lanes = detail.get("gpu_decode_lanes", 1)
        wall, cpu = stage["decode"] / gpu_rows, stage["decode_cpu"] / gpu_rows
        in_kernel = decode_kernel_share(stage)
        kernel = f" ({in_kernel:.0%} of it in the kernel)" if in_kernel is not None else ""
        line = (f"{r['label']}: GPU side {rate:,.0f} rows/s; its decode calls {1e6 * wall:.0f} us of wall and "
                f"{1e6 * cpu:.0f} us of CPU per row{kernel}, the stage busy {min(1.0, wall * rate / lanes):.0%}"
                + (f" (each of {lanes} lanes)" if lanes > 1 else ""))
        threads, waits = r.get("thread_cpu_seconds", {}), r.get("thread_runqueue_seconds")
        feeders = [k for k in threads if k.startswith(GPU_FEEDER_THREADS)]
        feeder_cpu = sum(threads[k] for k in feeders)
        if waits is not None and feeder_cpu > 0:  # None: the kernel keeps no run-queue figures
            line += f"; its threads waited for a core {sum(waits.get(k, 0.0) for k in feeders) / feeder_cpu:.0%} of their CPU time"
        # The native engine's threads decode the CPU's rows; the inline engine's read and plan every
        # row for the GPU decoder (and decode the rows it hands back).
        seconds = r.get("timed_seconds") or 0.0
        faults = r.get("thread_minor_faults") or {}
        for kind, what in (("fastdata-native", "native decode"), ("fastdata-inline", "planning")):
            if threads.get(kind, 0.0) > 0 and seconds > 0:
                line += f"; {what} threads {threads[kind] / seconds:.1f} cores"
                if kind == "fastdata-inline" and faults.get(kind) and detail.get("rows_read_to_route"):
                    # the planning threads read every GPU row's file into fresh memory: page faults
                    # there say malloc handed that memory back to the kernel and took it again
                    line += f" ({faults[kind] / detail['rows_read_to_route']:.1f} minor page faults per row read)"
                if kind == "fastdata-native" and detail.get("native_busy_in_runs"):
                    # the rest of their time in runs they waited for a run's last rows (LoaderStats)
                    line += f", busy {detail['native_busy_in_runs']:.0%} within their runs"
                if kind == "fastdata-native" and waits and waits.get(kind, 0.0) >= 0.05 * seconds:
                    # runnable but preempted (SCHED_IDLE beside the GPU side's threads): beside the
                    # process's unused cores below, the CPU the native side could have had
                    line += f", {waits[kind] / seconds:.1f} threads runnable but waiting for a core"
        usable, busy = (report.get("machine") or {}).get("cores_usable"), r.get("cpu_cores_busy")
        if usable and busy is not None:
            line += f"; the process {busy:.1f} of {usable} cores busy"
        split = detail.get("split_from_waits")
        if split:  # many moves both ways: the share swings around the balance (balance.py says why)
            rates = f" (the rates' {split['rates']:.0%})" if "rates" in split else ""
            # moves up that started from the rates' share (its floor): many of them in a steady
            # run would mean the rates read above where the waits settle
            lifts = f" ({split['lifts']} from the rates' share)" if split.get("lifts") else ""
            line += (f"; the split from the waits ended at {split['share']:.0%}{rates} after {split['up']} moves "
                     f"up{lifts} and {split['down']} down")
        created = detail.get("gpu_decoder_creation")
        if created:  # once per Loader, before its first batch: not in the timed window
            instances = created["instances"]
            line += (f"; making its nvImageCodec decoders took {created['wall']:.1f} s ({created['decoders']} "
                     f"decoders on {instances} instance{'s' if instances != 1 else ''}: "
                     f"{created['instance_create']:.1f} s making instances, {created['decoder_create']:.1f} s "
                     "the decoders)")
        lines.append(line)
    return lines


def jpeg_engines_line(report: Dict[str, Any]) -> Optional[str]:
    """How busy the GPU's hardware JPEG engines were while each contender was timed (NVML's
    counter, sampled by the runner: ``jpeg_engines_busy_percent``), for those measured on a
    GPU that has the counter: engine occupancy beside each rate."""
    busy = [(r["label"], r["jpeg_engines_busy_percent"]) for r in report["results"]
            if r.get("status") == "ok" and r.get("jpeg_engines_busy_percent") is not None]
    if not busy:
        return None
    return "JPEG engines busy (NVML, timed window): " + ", ".join(f"{label} {pct:.0f}%" for label, pct in busy)


def short_timing_line(report: Dict[str, Any]) -> Optional[str]:
    """The contenders marked * in the table: timed too briefly for their rates to mean much.
    ``--seconds`` is the whole measurement's budget, shared by the contenders (and rounds), and
    each one's start-up and warm-up come out of its share."""
    short = [r for r in report["results"] if _short(r)]
    if not short:
        return None
    what = "steps" if report.get("ablation") else "contenders"
    seconds = report.get("config", {}).get("seconds")
    each = "; ".join(f"{r['label']} {r['timed_seconds']:.2f} s ({r.get('timed_batches', '?')} batches)" for r in short)
    budget = f" of --seconds {seconds:g}, which all {what} share" if seconds else ""
    return (f"* timed for under {SHORT_TIMED_SECONDS:g} s{budget}: {each}. "
            f"These rates are not reliable: raise --seconds or compare fewer {what}")


def machine_line(report: Dict[str, Any]) -> str:
    m = report["machine"]
    v = m["versions"]
    gpu = m.get("gpu") or {}
    smt = m.get("threads_per_core")
    per_core = f", {smt} thread{'s' if smt != 1 else ''} per core" if smt else ""
    parts = [f"{m['cpu']} ({m['cores_usable']} usable cores{per_core})", f"{m['memory_gb']} GB"]
    if m.get("os"):
        parts.append(m["os"])
    parts.append(f"GPU {gpu.get('name')} x{gpu.get('count')}" if gpu.get("name") else "no GPU")
    libs = ", ".join(f"{k} {val}" for k, val in v.items())
    return " | ".join(parts) + "\n" + f"Python {m['python']}, {libs}"


def print_report(report: Dict[str, Any], stream: Optional[TextIO] = None) -> None:
    """The results table (rich when installed and writing to a terminal, else plain text)."""
    stream = stream if stream is not None else sys.stdout
    rows = table_rows(report)
    notes = [line for line in (short_timing_line(report), ceiling_line(report), jpeg_engines_line(report)) if line] \
        + gpu_side_lines(report)
    c = report["config"]
    d = report["dataset"]
    title = (f"fastdata-bench {'ablation' if report['ablation'] else 'comparison'}: "
             f"{d.get('kind')} ({d.get('images', '?')} images), batch {c['batch_size']}, "
             f"{c['transform']}, {c['dtype']} on {c['device']}, {c['threads']} workers/threads")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None  # noqa: N806 - plain text below
    if Console is not None and getattr(stream, "isatty", lambda: False)():
        table = Table(title=title, title_justify="left")
        for i, h in enumerate(rows[0]):
            table.add_column(h, justify="left" if i == 0 else "right", overflow="fold")
        for row in rows[1:]:
            table.add_row(*row)
        console = Console(file=stream)
        console.print(table)
        for line in notes:
            console.print(line)
        console.print(machine_line(report), style="dim")
        return
    stream.write(title + "\n")
    stream.write(format_plain(rows) + "\n")
    for line in notes:
        stream.write(line + "\n")
    stream.write(machine_line(report) + "\n")
    stream.flush()


def format_plain(rows: List[List[str]]) -> str:
    """Fixed-width text; skipped rows put their reason across the number columns."""
    ncol = len(rows[0])
    widths = [max(len(r[i]) for r in rows if not (r[1] in ("skipped", "failed") and i >= 2))
              for i in range(ncol)]
    out = []
    for k, r in enumerate(rows):
        if k > 0 and r[1] in ("skipped", "failed"):
            out.append(f"{r[0]:<{widths[0]}}  {r[1]}: {r[2]}")
            continue
        cells = [r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in range(1, ncol)]
        out.append("  ".join(cells).rstrip())
        if k == 0:
            out.append("-" * len(out[-1]))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# JSON and PNG


def write_json(report: Dict[str, Any], path: Path) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, allow_nan=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


def plot_unavailable() -> Optional[str]:
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        return str(e)
    return None


def plot(report: Dict[str, Any], path: Path) -> None:
    """Horizontal bar chart of img/s with the windows' min-max as whiskers; skipped rows labelled."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    results = report["results"]
    labels = [r["label"] for r in results]
    rates = [r["images_per_s"] if r.get("status") == "ok" else 0.0 for r in results]
    lo = [r["images_per_s"] - r["spread"]["min"] if r.get("status") == "ok" else 0.0 for r in results]
    hi = [r["spread"]["max"] - r["images_per_s"] if r.get("status") == "ok" else 0.0 for r in results]
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(results) + 1.6), dpi=110)
    ypos = list(range(len(results)))[::-1]
    colors = ["#9a9a9a" if r["name"] in ("dataloader", "baseline", "simd", "pin_memory", "workers")
              else "#2b7bba" for r in results]
    ax.barh(ypos, rates, xerr=[lo, hi], color=colors, capsize=3)
    # The axis reaches past the longest whisker, so every value label stays inside it (a label
    # outside the axes makes tight_layout give up, with a warning).
    top = max([r["spread"]["max"] for r in results if r.get("status") == "ok"] + rates) if any(rates) else 1.0
    for y, r in zip(ypos, results):
        if r.get("status") == "ok":
            extra = f"  ({r['speedup_vs_baseline']:.2f}x)" if "speedup_vs_baseline" in r else ""
            ax.text(r["spread"]["max"] + top * 0.01, y, f"{r['images_per_s']:,.0f}{extra}", va="center", fontsize=8)
        else:
            ax.text(top * 0.01, y, f"{r['status']}: {r.get('reason', '')[:70]}", va="center", fontsize=7,
                    color="#a33")
    ax.set_yticks(ypos)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlim(0, top * 1.3)
    ax.set_xlabel("images/s (timed images / timed s; whiskers: windows' min-max)")
    c = report["config"]
    m = report["machine"]
    ax.set_title(f"fastdata-bench{' ablation' if report['ablation'] else ''}: batch {c['batch_size']}, "
                 f"{c['dtype']} on {c['device']}, {m['cores_usable']} cores", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
