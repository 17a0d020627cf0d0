"""The demo ImageFolder: deterministic, photo-like, the promised mix of kinds, atomic cache."""
from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

from fastdata.cli import demo
from imagegen import has_marker, sos_offset


def _digest_tree(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_builds_are_byte_identical_for_any_thread_count(tmp_path: Path) -> None:
    a = demo.build_demo(tmp_path / "a", count=24, seed=3, classes=4, workers=1)
    b = demo.build_demo(tmp_path / "b", count=24, seed=3, classes=4, workers=2)
    da, db = _digest_tree(a), _digest_tree(b)
    assert len(da) == 24 + 1  # images + manifest
    assert da == db
    c = demo.build_demo(tmp_path / "c", count=24, seed=4, classes=4, workers=2)
    differing = [k for k in da if k != demo.MANIFEST and da[k] != _digest_tree(c).get(k)]
    assert len(differing) == 24  # another seed gives other images


def test_statistics_and_kinds_within_stated_ranges(tmp_path: Path) -> None:
    count, classes = 60, 6
    root = demo.build_demo(tmp_path / "d", count=count, seed=0, classes=classes, workers=2)
    manifest = demo.read_manifest(root)
    assert manifest["classes"] == sorted(manifest["classes"]) and len(manifest["classes"]) == classes
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == manifest["classes"]
    kinds, bpp_420 = [], []
    for entry in manifest["images"]:
        path = root / entry["path"]
        data = path.read_bytes()
        assert len(data) == entry["nbytes"]
        with Image.open(path) as im:
            im.load()
            w, h = im.size
            assert (w, h) == (entry["width"], entry["height"])
            assert 200 <= min(w, h) <= 600, (path, w, h)
            assert max(w, h) / min(w, h) <= 16 / 9 + 0.01
            bpp = len(data) / (w * h)
            assert 0.35 <= bpp <= 1.3, (path, bpp)
            # Label = class folder, as torchvision's ImageFolder would read it.
            assert manifest["classes"][entry["label"]] == path.parent.name
            kind = entry["kind"]
            kinds.append(kind)
            # Restart markers (a DRI segment in the headers, RSTn in the scan) exactly in the restart kind.
            assert has_marker(data, 0xDD) == (kind == "restart"), path
            assert (b"\xff\xd0" in data[sos_offset(data):]) == (kind == "restart"), path
            orientation = im.getexif().get(0x0112, 1)
            assert orientation == entry["orientation"]
            if kind == "gray":
                assert im.mode == "L"
            elif kind == "cmyk":
                assert im.mode == "CMYK"
            else:
                assert im.mode == "RGB"
            assert bool(im.info.get("progressive", 0)) == (kind == "progressive")
            assert (orientation != 1) == (kind == "exif")
            if kind == "exif":
                assert 2 <= orientation <= 8
            if im.mode == "RGB":
                sampling = JpegImagePlugin.get_sampling(im)
                assert sampling == {"444": 0, "422": 1}.get(kind, 2), (path, sampling)
                if sampling == 2 and kind == "baseline":
                    bpp_420.append(bpp)
                # Photo-like, not flat: local detail and colour variation everywhere.
                arr = np.asarray(im, np.float32)
                assert arr.std(axis=(0, 1)).min() > 10
                assert np.abs(np.diff(arr[..., 1], axis=1)).mean() > 2
    for kind in demo.KINDS:
        assert kind in kinds, kind
    assert 0.5 <= float(np.median(bpp_420)) <= 1.0
    assert kinds.count("baseline") > count // 2  # the special kinds are "a few"


def test_all_exif_orientations_over_a_cycle() -> None:
    cycle = len(demo._KIND_CYCLE)
    orients = [demo.exif_orientation(i) for i in range(7 * cycle)]
    assert set(orients) == set(range(1, 9))
    assert all((o != 1) == (demo._KIND_CYCLE[i % cycle] == "exif") for i, o in enumerate(orients))


def test_ensure_demo_caches_and_an_interrupted_build_is_not_complete(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))

    def stop(done: int, total: int) -> None:
        if done == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        demo.ensure_demo(count=12, seed=1, classes=3, progress=stop)
    target = demo.demo_dir(12, 1, 3)
    assert target.parent == tmp_path / "cache"
    assert not target.exists()
    assert list((tmp_path / "cache").iterdir()) == []  # temp dir cleaned up

    # A leftover without its manifest (e.g. a killed process) is not taken as complete.
    target.mkdir(parents=True)
    (target / "junk").write_bytes(b"x")
    calls = []
    path = demo.ensure_demo(count=12, seed=1, classes=3, progress=lambda d, t: calls.append(d))
    assert path == target and demo.is_complete(path) and not (path / "junk").exists()
    assert calls[-1] == 12
    stamp = (path / demo.MANIFEST).stat().st_mtime_ns
    assert demo.ensure_demo(count=12, seed=1, classes=3, progress=lambda d, t: calls.append(-1)) == path
    assert (path / demo.MANIFEST).stat().st_mtime_ns == stamp and -1 not in calls


def test_photo_like_jpeg_has_exact_size_and_photo_bitrate() -> None:
    data = demo.photo_like_jpeg(seed=0, index=7, width=500, height=375)
    with Image.open(io.BytesIO(data)) as im:
        assert im.size == (500, 375) and im.mode == "RGB"
    assert 0.45 <= len(data) / (500 * 375) <= 1.1
    assert demo.photo_like_jpeg(seed=0, index=7, width=500, height=375) == data
