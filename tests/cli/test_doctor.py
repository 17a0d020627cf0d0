"""fastdata-doctor on this machine: findings, JSON, exit status, and advice for broken setups
(the command in fastdata.cli.doctor, its checks in fastdata.diagnostics.doctor_checks)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest
from PIL import Image

import fastdata
from fastdata.cache.build.writer import convert
from fastdata.cli import doctor
from fastdata.cli.doctor import check_storage, exit_status, main
from fastdata.diagnostics import doctor_checks
from fastdata.diagnostics.doctor_checks import Finding

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def short_budgets(monkeypatch):
    # Same code paths, shorter measurement loops: keeps the suite fast on 2 shared cores.
    monkeypatch.setattr(doctor, "_DECODE_BUDGET_S", 0.05)
    monkeypatch.setattr(doctor, "_READ_BUDGET_S", 0.05)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(4):
            img = rng.integers(0, 256, (48 + 8 * i, 64, 3), dtype=np.uint8)
            img[:, :, c] = 255 - 10 * i  # class and index are visible in the pixels
            Image.fromarray(img).save(root / f"class{c}" / f"{i}.jpg", quality=85)
    return root


def _run_json(args, capsys) -> dict:
    rc = main(["--json", *args])
    out = json.loads(capsys.readouterr().out)
    assert out["exit_status"] == rc
    return out


def _by_name(out: dict) -> dict:
    return {f["name"]: f for f in out["findings"]}


def test_cpu_only_machine_reports_cuda_absent_and_skips_gpu_checks(data, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only machine, on any machine
    out = _run_json([str(data)], capsys)
    f = _by_name(out)
    has_driver = os.path.exists("/proc/driver/nvidia/version")
    assert f["cuda"]["status"] == ("fail" if has_driver else "warn")
    assert f["cuda"]["value"]["available"] is False
    assert f["cuda"]["value"]["torch_cuda"] == torch.version.cuda
    assert "device='cpu'" in f["cuda"]["advice"] or "driver" in f["cuda"]["advice"]
    for name in ("pinned_memory", "h2d_bandwidth"):
        assert f[name]["status"] == "info" and f[name]["value"] == "skipped"
        assert "no CUDA device" in f[name]["advice"]
    # the hardware JPEG engines: the gpu extra is a test dependency, the GPU is missing
    assert f["gpu_jpeg_engines"]["status"] == "info" and f["gpu_jpeg_engines"]["value"] == "no CUDA device"
    assert out["exit_status"] == (1 if has_driver else 0)


def test_without_the_gpu_extra_doctor_says_how_to_get_it(monkeypatch):
    from fastdata.cli import doctor
    from fastdata.decoders import nvimgcodec

    monkeypatch.setattr(nvimgcodec, "gpu_extra_installed", lambda: False)
    (finding,) = doctor.check_gpu_jpeg_engines()
    assert finding.status == "info" and "pip install fastdata[gpu]" in finding.advice


def test_storage_and_cpu_findings_match_the_filesystem(data, capsys):
    out = _run_json([str(data)], capsys)
    f = _by_name(out)
    files = [p for p in data.rglob("*") if p.is_file()]
    size = f["data_size"]["value"]
    assert size["files"] == len(files) == 8
    assert size["bytes"] == sum(p.stat().st_size for p in files)
    assert size["complete"] is True
    # every JPEG's header sampled: small baseline files, nothing to advise
    assert f["data_mix"]["status"] == "ok" and f["data_mix"]["value"]["sampled"] == 8
    assert f["data_mix"]["value"]["progressive_pct"] == 0.0
    rt = f["read_throughput"]["value"]
    assert rt["sequential_MBps"] > 0 and rt["random_reads_per_s"] > 0
    assert f["fits_in_ram"]["status"] == "ok" and "RAMCache" in f["fits_in_ram"]["advice"]
    advice = f["lmdb_cache"]["advice"]
    assert f["lmdb_cache"]["status"] == "info" and "fastdata-convert" in advice and "restart index" in advice
    assert "small files" in advice  # 8 files of a few KB
    assert f["cpu_cores"]["value"]["usable"] == len(os.sched_getaffinity(0))
    # which progressive decoder copy runs (tests/io/test_simd_parity.py checks each is chosen as named)
    assert f["libjpeg_turbo"]["value"]["progressive_decoder"] in ("pdep", "software-deposit", "portable")
    assert f["cpu_load"]["value"]["load1"] == pytest.approx(os.getloadavg()[0], abs=1.0)
    dec = f["decode_rate"]["value"]
    assert dec["images"] == "8 JPEGs from DATA"
    assert dec["pillow_img_per_s"] > 0
    assert f["dev_shm"]["status"] in ("ok", "warn")
    assert f["pillow"]["value"]["dist"] in ("pillow", "pillow-simd")
    assert set(out["counts"]) == {"ok", "warn", "fail", "info"}
    assert sum(out["counts"].values()) == len(out["findings"])


def test_decode_rate_uses_generated_images_without_data(capsys):
    f = _by_name(_run_json(["--no-gpu"], capsys))
    assert "generated" in f["decode_rate"]["value"]["images"]
    assert f["storage"]["status"] == "info" and "DATA" in f["storage"]["advice"]
    assert "cuda" not in f


def test_lmdb_cache_is_found(data, capsys):
    convert(str(data), str(data) + ".lmdb", workers=1)  # the sibling DATA.lmdb the doctor looks for
    f = _by_name(_run_json([str(data)], capsys))
    assert f["lmdb_cache"]["status"] == "ok"
    assert f["lmdb_cache"]["value"].endswith("data.lmdb")


def test_lmdb_that_is_not_a_fastdata_cache_fails(data, capsys):
    env = lmdb.open(str(data / "cache.lmdb"), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v")
    env.close()
    f = _by_name(_run_json([str(data)], capsys))
    assert f["lmdb_cache"]["status"] == "fail"
    assert f["lmdb_cache"]["value"].endswith("cache.lmdb") and "incomplete" in f["lmdb_cache"]["advice"]


def test_slow_storage_gets_cache_advice(data):
    scan = doctor_checks._scan(str(data))
    # Demand far above any disk: the random-read rate must be flagged with cache advice.
    (rt,) = [x for x in check_storage(str(data), scan, decode_rate=1e9) if x.name == "read_throughput"]
    if rt.value["page_cache_maybe_warm"]:
        pytest.skip("data lives in RAM here (tmpfs): cold-read speed cannot be judged")
    assert rt.status == "warn"
    assert "RAMCache" in rt.advice and "fastdata-convert" in rt.advice


def test_missing_or_empty_data_fails(tmp_path, capsys):
    out = _run_json(["--no-gpu", str(tmp_path / "nope")], capsys)
    assert out["exit_status"] == 1 and _by_name(out)["data"]["status"] == "fail"
    (tmp_path / "empty").mkdir()
    out = _run_json(["--no-gpu", str(tmp_path / "empty")], capsys)
    assert out["exit_status"] == 1 and _by_name(out)["data_size"]["status"] == "fail"


def test_libjpeg_without_simd_is_a_failure(monkeypatch):
    class FakeC:
        @staticmethod
        def jpeg_info():
            return {"libjpeg_turbo_version": "3.0.0", "simd": False}

    monkeypatch.setattr(doctor_checks, "_native", lambda: (FakeC, ""))
    (f,) = doctor_checks.check_libjpeg()
    assert f.status == "fail" and "SIMD" in f.advice
    assert exit_status([f, Finding("x", "ok", 1)]) == 1
    assert exit_status([Finding("x", "warn", 1), Finding("y", "info", None)]) == 0


def test_driver_present_but_no_cuda_in_torch_is_a_failure(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(doctor_checks, "_nvidia_driver_version", lambda: "550.54.15")
    (f,) = doctor_checks.check_cuda()
    assert f.status == "fail"
    assert "driver" in f.advice and f.value["driver"] == "550.54.15"


def test_a_crashing_check_is_reported_not_raised():
    def boom():
        raise RuntimeError("kaboom")

    (f,) = doctor._guard("thing", boom)
    assert f.status == "warn" and "kaboom" in f.value


def test_finding_rejects_unknown_status():
    with pytest.raises(ValueError):
        Finding("x", "great", 1)


def test_text_output_and_process_exit_code(data, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(Path(fastdata.__file__).resolve().parents[1]))  # this checkout
    ok = subprocess.run([sys.executable, "-m", "fastdata.cli.doctor", "--no-gpu", str(data)],
                        capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "decode_rate" in ok.stdout and "read_throughput" in ok.stdout
    assert ok.stdout.strip().splitlines()[-1].endswith("info")  # the counts line
    bad = subprocess.run([sys.executable, "-m", "fastdata.cli.doctor", "--no-gpu", str(tmp_path / "missing")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 1
    assert "FAIL" in bad.stdout


def test_data_mix_counts_the_kinds_from_their_headers(tmp_path: Path):
    from imagegen import encode_jpeg, encode_oriented, photo_like

    root = tmp_path / "mix" / "c0"
    root.mkdir(parents=True)
    img = photo_like(60, 80, index=1)
    files = {f"plain{i}.jpg": encode_jpeg(photo_like(60, 80, index=i)) for i in range(5)}
    files.update({"prog0.jpg": encode_jpeg(img, progressive=True), "prog1.JPEG": encode_jpeg(img, progressive=True),
                  "cmyk.jpg": encode_jpeg(img.convert("CMYK")), "rot6.jpg": encode_oriented(img, 6),
                  "gray.jpg": encode_jpeg(img.convert("L")), "garbage.jpg": b"not a jpeg at all"})
    for name, data in files.items():
        (root / name).write_bytes(data)
    img.save(root / "not_sampled.png")
    (f,) = doctor.check_data_mix(doctor._scan(str(tmp_path / "mix")))
    v = f.value
    assert v["sampled"] == 11  # the .jpg/.jpeg files, not the PNG
    assert (v["progressive_pct"], v["cmyk_pct"], v["exif_rotated_pct"], v["gray_pct"], v["bad_header_pct"]) == \
        (18.2, 9.1, 9.1, 9.1, 9.1)
    assert v["median_megapixels"] == round(60 * 80 / 1e6, 2)
    assert f.status == "info"
    assert "18.2% progressive" in f.advice and "fastdata-convert" in f.advice
    assert "9.1% CMYK" in f.advice and "garbage.jpg" in f.advice and "--max-side" not in f.advice


def test_data_mix_of_large_baseline_photos_advises_max_side(tmp_path: Path):
    root = tmp_path / "big" / "c0"
    root.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (900, 1300, 3), dtype=np.uint8)).save(root / f"{i}.jpg", quality=80)
    (f,) = doctor.check_data_mix(doctor._scan(str(tmp_path / "big")))
    assert f.value["median_megapixels"] == 1.17 and f.value["progressive_pct"] == 0.0
    assert f.status == "info" and "--max-side 512" in f.advice and "progressive" not in f.advice
    # small baseline files only: nothing to advise
    small = tmp_path / "small" / "c0"
    small.mkdir(parents=True)
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(small / "a.jpg")
    (g,) = doctor.check_data_mix(doctor._scan(str(tmp_path / "small")))
    assert g.status == "ok" and g.advice == "" and g.value["sampled"] == 1


def test_data_mix_reads_past_a_header_larger_than_its_prefix(tmp_path: Path):
    root = tmp_path / "icc" / "c0"
    root.mkdir(parents=True)
    img = Image.fromarray(np.random.default_rng(2).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    img.save(root / "big_icc.jpg", icc_profile=bytes(range(256)) * 1600, progressive=True)  # 400 KB of ICC
    assert (root / "big_icc.jpg").stat().st_size > doctor.MIX_PREFIX
    (f,) = doctor.check_data_mix(doctor._scan(str(tmp_path / "icc")))
    assert f.value["bad_header_pct"] == 0.0 and f.value["progressive_pct"] == 100.0


def test_a_test_switch_left_set_is_a_warning(monkeypatch):
    monkeypatch.setenv("FASTDATA_SOFTWARE_BIT_DEPOSIT", "1")
    (f,) = doctor_checks.check_libjpeg()
    assert f.status == "warn" and "FASTDATA_SOFTWARE_BIT_DEPOSIT" in f.advice
    for off in ("0", "00", ""):  # the extension's own rule: its first character not "0"
        monkeypatch.setenv("FASTDATA_SOFTWARE_BIT_DEPOSIT", off)
        (g,) = doctor_checks.check_libjpeg()
        assert "FASTDATA_SOFTWARE_BIT_DEPOSIT" not in g.advice and g.value["test_switches"] == []


def test_cache_advice_names_the_restart_index_only_for_jpegs(tmp_path, capsys):
    # fastdata-convert's restart index speeds up JPEG crops; a folder of PNGs gets the packing advice only.
    root = tmp_path / "pngs" / "class0"
    root.mkdir(parents=True)
    for i in range(3):
        Image.fromarray(np.full((32, 40, 3), 40 * i, np.uint8)).save(root / f"{i}.png")
    advice = _by_name(_run_json([str(tmp_path / "pngs")], capsys))["lmdb_cache"]["advice"]
    assert "small files" in advice and "restart index" not in advice
