"""fastdata-bench's PNG: a bursty contender (one window far above its rate) still plots
without matplotlib's tight_layout warning (an error under this suite's filterwarnings)."""
from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from fastdata.cli import bench_report

pytest.importorskip("matplotlib")


def row(name: str, rate: float, window_max: float) -> dict:
    return {"name": name, "label": f"{name} (a label as long as the real ones)", "status": "ok",
            "images_per_s": rate, "speedup_vs_baseline": rate / 300.0,
            "spread": {"min": 0.8 * rate, "q1": 0.9 * rate, "q3": rate, "max": window_max}}


def test_plot_with_a_window_far_above_the_rate(tmp_path: Path) -> None:
    report = {"ablation": False, "config": {"batch_size": 8, "dtype": "float32", "device": "cpu"},
              "machine": {"cores_usable": 2},
              "results": [row("dataloader", 300.0, 320.0), row("fastdata", 900.0, 2400.0),
                          {"name": "ffcv", "label": "FFCV (its .beton)", "status": "skipped",
                           "reason": "ffcv.loader not importable: ModuleNotFoundError: No module named 'ffcv'"}]}
    bench_report.plot(report, tmp_path / "r.png")  # raised UserWarning (tight_layout) before the fix
    with Image.open(tmp_path / "r.png") as im:
        assert im.format == "PNG" and im.size[0] > 300
