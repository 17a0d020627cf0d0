"""fastdata.Loader on CPU: order, labels, pixels, shuffling, resume, sharding, bad files.

Oracles: torchvision's ImageFolder (samples, labels, order), torchvision's Resize+CenterCrop
(+ToTensor+Normalize) on Pillow images (pixels), and the flat colour of each generated image,
which encodes a unique id that survives any crop, flip or resize (so order is checkable
under RandomResizedCrop too).
"""
from __future__ import annotations

import io
import json
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.loader.loader import IMAGENET_MEAN, IMAGENET_STD

tv_datasets = pytest.importorskip("torchvision.datasets")
tv_transforms = pytest.importorskip("torchvision.transforms")

STEP = 7  # colour levels between ids: far above JPEG's error on a flat colour (~1 level)


def id_color(k: int, label: int) -> Tuple[int, int, int]:
    return 8 + STEP * (k % 32), 8 + STEP * (k // 32), 40 + 60 * label


def decode_id(image: np.ndarray) -> int:
    """The id of a flat-colour image from its centre pixel (uint8 [H, W, 3])."""
    h, w = image.shape[:2]
    r, g = (int(v) for v in image[h // 2, w // 2, :2])
    return round((r - 8) / STEP) + 32 * round((g - 8) / STEP)


def batch_ids(images: torch.Tensor) -> List[int]:
    """ids of a uint8 NHWC batch."""
    return [decode_id(im) for im in images.numpy()]


def flat_image(k: int, label: int) -> Image.Image:
    size = (40 + 3 * (k % 5), 36 + 2 * (k % 7))  # (w, h): varied so every resize path runs
    return Image.new("RGB", size, id_color(k, label))


def make_folder(root: Path, counts: Dict[str, int]) -> Dict[str, int]:
    """Class folders of flat-colour images; returns {path: id}. Includes a nested folder, an
    upper-case extension, a PNG and a non-image file, which torchvision skips."""
    ids: Dict[str, int] = {}
    k = 0
    for label, (cls, count) in enumerate(sorted(counts.items())):
        for j in range(count):
            sub = root / cls / ("nested" if j % 4 == 3 else "")
            sub.mkdir(parents=True, exist_ok=True)
            ext = ".png" if j == 1 else (".JPEG" if j == 2 else ".jpg")
            path = sub / f"img_{j:02d}{ext}"
            flat_image(k, label).save(path, quality=95)
            ids[str(path)] = k
            k += 1
        (root / cls / "notes.txt").write_text("not an image")
    return ids


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Dict[str, int]]:
    root = tmp_path_factory.mktemp("folder")
    return root, make_folder(root, {"cat": 7, "dog": 5, "eel": 9})


def loader_for(source, **kw) -> fastdata.Loader:
    args = dict(batch_size=4, transform=fastdata.RandomResizedCrop(24), device="cpu", dtype=torch.uint8,
                threads=2, drop_last=False)
    args.update(kw)
    return fastdata.Loader(source, **args)


def epoch_batches(loader: fastdata.Loader, epoch: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    loader.set_epoch(epoch)
    return [(x.clone(), y.clone()) for x, y in loader]


def test_image_folder_matches_torchvision(folder) -> None:
    root, _ = folder
    ours, theirs = fastdata.ImageFolder(root), tv_datasets.ImageFolder(str(root))
    assert ours.classes == theirs.classes == ["cat", "dog", "eel"]
    assert ours.class_to_idx == theirs.class_to_idx
    assert ours.samples == theirs.samples
    np.testing.assert_array_equal(ours.labels, theirs.targets)
    assert len(ours) == len(theirs) == 21
    assert isinstance(ours, fastdata.Source)


def test_unshuffled_order_and_labels_match_torchvision(folder) -> None:
    root, ids = folder
    tv = tv_datasets.ImageFolder(str(root))
    with loader_for(fastdata.ImageFolder(root), shuffle=False, transform=fastdata.CenterCrop(24)) as loader:
        assert len(loader) == 6  # ceil(21 / 4)
        batches = list(loader)
    assert [len(y) for _, y in batches] == [4, 4, 4, 4, 4, 1]
    got_ids = [k for x, _ in batches for k in batch_ids(x)]
    got_labels = torch.cat([y for _, y in batches]).tolist()
    assert got_ids == [ids[p] for p, _ in tv.samples]
    assert got_labels == tv.targets
    for x, y in batches:
        assert x.dtype == torch.uint8 and x.shape[1:] == (24, 24, 3) and y.dtype == torch.int64


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from imagegen import photo_like

    root = tmp_path_factory.mktemp("photos")
    for i in range(6):
        (root / f"c{i % 2}").mkdir(exist_ok=True)
        photo_like(90 + 11 * i, 120 + 7 * i, index=i).save(root / f"c{i % 2}" / f"{i}.jpg", quality=90)
    return root


def test_center_crop_pixels_close_to_torchvision(photo_folder: Path) -> None:
    tf = tv_transforms.Compose([tv_transforms.Resize(73), tv_transforms.CenterCrop(64)])
    norm = tv_transforms.Compose([tf, tv_transforms.ToTensor(), tv_transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    tv_raw = tv_datasets.ImageFolder(str(photo_folder), transform=tf)
    tv_norm = tv_datasets.ImageFolder(str(photo_folder), transform=norm)
    src = fastdata.ImageFolder(photo_folder)
    crop = fastdata.CenterCrop(64, resize=73)
    with loader_for(src, batch_size=6, shuffle=False, transform=crop) as loader:
        (raw, labels), = list(loader)
    with loader_for(src, batch_size=6, shuffle=False, transform=crop, dtype=torch.float32) as loader:
        (normed, _), = list(loader)
    assert normed.shape == (6, 3, 64, 64) and normed.is_contiguous(memory_format=torch.channels_last)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    for i in range(6):
        ref, label = tv_raw[i]
        diff = np.abs(raw[i].numpy().astype(np.int16) - np.asarray(ref, dtype=np.int16))
        # The horizontal pass uses 14-bit weights (Pillow: 22-bit): at most a level or two.
        assert diff.max() <= 2 and diff.mean() < 0.5, (i, diff.max(), diff.mean())
        assert int(labels[i]) == label
        ref_norm, _ = tv_norm[i]
        assert ((normed[i] - ref_norm).abs() * std * 255).max().item() <= 2.01


# The largest relative error of one rounding to each dtype (half an ulp: 2^-24, 2^-11, 2^-8),
# plus the float32 arithmetic before it (u8 * scale + bias, each rounded once: a few 2^-24).
# Seen on this test's images: 1.9e-7, 3.0e-4, 2.4e-3.
ROUNDING = {torch.float32: 2e-6, torch.float16: 2.0 ** -11 + 2e-6, torch.bfloat16: 2.0 ** -8 + 2e-6}


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mean,std", [(IMAGENET_MEAN, IMAGENET_STD), ((0.5, 0.25, 0.0), (0.5, 1.5, 0.1))])
def test_float_outputs_are_the_normalized_uint8_outputs(folder, dtype, channels_last, mean, std) -> None:
    """Every float dtype and layout: the uint8 output of the same crops and flips, normalized in
    float64 and rounded to the dtype once, within that one rounding (relative to max(|x|, 1))."""
    src = fastdata.ImageFolder(folder[0])
    with loader_for(src, seed=4) as loader:
        raw = epoch_batches(loader, 3)
    m = torch.tensor(mean, dtype=torch.float64).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).view(1, 3, 1, 1)
    with loader_for(src, seed=4, dtype=dtype, channels_last=channels_last, mean=mean, std=std) as loader:
        got = epoch_batches(loader, 3)
    assert len(got) == len(raw)
    for (x, y), (xr, yr) in zip(got, raw):
        want = (xr.permute(0, 3, 1, 2).double() / 255 - m) / s
        assert x.dtype == dtype and x.shape == want.shape
        assert x.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        err = ((x.double() - want).abs() / want.abs().clamp_min(1)).max().item()
        assert err <= ROUNDING[dtype], (dtype, channels_last, err)
        assert torch.equal(y, yr)


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_outputs_on_the_cpu_are_the_float32_outputs_cast(folder, dtype, channels_last) -> None:
    """On the CPU the native threads write float16/bfloat16 themselves: bit for bit the float32
    batch cast by torch (.to(dtype)), as the Loader delivered them before (a float32 batch,
    then a cast)."""
    src = fastdata.ImageFolder(folder[0])
    with loader_for(src, seed=4, dtype=torch.float32) as loader:
        full = epoch_batches(loader, 2)
    with loader_for(src, seed=4, dtype=dtype, channels_last=channels_last) as loader:
        got = epoch_batches(loader, 2)
        assert loader._pipeline.ring.image_dtype == dtype  # written by the native threads, not cast after
    assert len(got) == len(full)
    for (x, y), (xf, yf) in zip(got, full):
        assert x.dtype == dtype
        assert x.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        assert torch.equal(x.view(torch.int16), xf.to(dtype).contiguous(
            memory_format=torch.channels_last if channels_last else torch.contiguous_format).view(torch.int16))
        assert torch.equal(y, yf)


@pytest.mark.parametrize("mean,std", [((0.5, 0.5, 0.5), (0.2, float("nan"), 0.2)), ((0.5, float("nan"), 0.5), (1, 1, 1)),
                                      ((0.5, 0.5, 0.5), (0.2, 0.0, 0.2)), ((0.5, 0.5), (1, 1, 1)),
                                      ((0.5, 0.5, float("inf")), (1, 1, 1))])
def test_a_mean_or_std_that_is_not_finite_or_positive_is_refused(folder, mean, std) -> None:
    with pytest.raises(ValueError, match="mean and std need 3 finite values each"):
        loader_for(fastdata.ImageFolder(folder[0]), dtype=torch.float32, mean=mean, std=std)


def test_shuffled_epochs_are_permutations_deterministic_per_seed_and_epoch(folder) -> None:
    root, ids = folder
    src = fastdata.ImageFolder(root)
    with loader_for(src, seed=7) as a, loader_for(src, seed=7) as b, loader_for(src, seed=8) as c:
        e0, e1 = epoch_batches(a, 0), epoch_batches(a, 1)
        b0 = epoch_batches(b, 0)
        c0 = epoch_batches(c, 0)
        # Without set_epoch, each new iteration moves on to the next epoch.
        a.set_epoch(0)
        list(a)
        implicit = [(x.clone(), y) for x, y in a]
    order0 = [k for x, _ in e0 for k in batch_ids(x)]
    order1 = [k for x, _ in e1 for k in batch_ids(x)]
    assert sorted(order0) == sorted(order1) == sorted(ids.values())
    assert order0 != order1, "a new epoch must reorder"
    assert order0 != sorted(order0), "shuffle=True must shuffle"
    assert order0 != [k for x, _ in c0 for k in batch_ids(x)], "the seed must change the order"
    for (x, y), (xb, yb) in zip(e0, b0):  # same seed and epoch: identical pixels (crops, flips)
        assert torch.equal(x, xb) and torch.equal(y, yb)
    for (x, y), (xi, yi) in zip(e1, implicit):
        assert torch.equal(x, xi) and torch.equal(y, yi)
    # Labels travel with their images.
    label_of = {k: lab for k, lab in zip((ids[p] for p in src.paths), src.labels.tolist())}
    for x, y in e0:
        assert [label_of[k] for k in batch_ids(x)] == y.tolist()


@pytest.mark.parametrize("k", [0, 2, 5])
def test_resume_yields_exactly_the_remaining_batches(folder, k: int) -> None:
    src = fastdata.ImageFolder(folder[0])
    with loader_for(src, seed=3) as ref_loader:
        ref1, ref2 = epoch_batches(ref_loader, 1), epoch_batches(ref_loader, 2)
    with loader_for(src, seed=3) as first:
        first.set_epoch(1)
        it = iter(first)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(first.state_dict()))  # plain data, no pickle needed
    assert state["epoch"] == 1 and state["batch"] == k
    with loader_for(src, seed=3) as resumed:
        resumed.load_state_dict(state)
        got = []
        for epoch in (1, 2):  # the usual training loop: set_epoch keeps the resume point
            resumed.set_epoch(epoch)
            got.append([(x.clone(), y.clone()) for x, y in resumed])
    assert len(got[0]) == len(ref1) - k and len(got[1]) == len(ref2)
    for (x, y), (xr, yr) in zip(got[0] + got[1], ref1[k:] + ref2):
        assert torch.equal(x, xr) and torch.equal(y, yr)


def test_state_after_a_whole_epoch_points_at_the_next_and_mismatches_raise(folder) -> None:
    src = fastdata.ImageFolder(folder[0])
    with loader_for(src, seed=3) as loader:
        loader.set_epoch(4)
        list(loader)
        state = loader.state_dict()
        assert (state["epoch"], state["batch"]) == (5, 0)
    with loader_for(src, seed=3, batch_size=5) as other, pytest.raises(ValueError, match="batch_size"):
        other.load_state_dict(state)
    with loader_for(src, seed=4) as other, pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rank_shards_are_disjoint_covering_and_equal_length(folder, world: int, drop_last: bool) -> None:
    root, ids = folder
    src = fastdata.ImageFolder(root)
    shards = []
    counts = set()
    for rank in range(world):
        with loader_for(src, batch_size=2, seed=5, rank=rank, world_size=world, drop_last=drop_last,
                        threads=1) as loader:
            batches = epoch_batches(loader, 2)
        counts.add((len(loader), len(batches)))
        shards.append([k for x, _ in batches for k in batch_ids(x)])
    assert len(counts) == 1, f"ranks disagree on the batch count: {counts}"
    n_batches = counts.pop()[0]
    assert n_batches == len(batches)
    everything = [k for s in shards for k in s]
    if drop_last:
        assert len(set(everything)) == len(everything), "drop_last shards must be disjoint"
        assert len(everything) == world * (21 // world // 2) * 2
    else:
        assert set(everything) == set(ids.values()), "the union over ranks must cover the dataset"
        # Only the wrap-around padding repeats samples: fewer than one per rank.
        assert len(everything) - len(set(everything)) == -(-21 // world) * world - 21


def test_file_list_csv_and_bytes_source_give_the_same_batches(folder, tmp_path: Path) -> None:
    root, _ = folder
    ref_src = fastdata.ImageFolder(root)
    with loader_for(ref_src, seed=9) as loader:
        ref = epoch_batches(loader, 1)
    listing = tmp_path / "list.csv"
    lines = ["# path,label", ""] + [f"{os.path.relpath(p, tmp_path)},{lab}" for p, lab in ref_src.samples]
    listing.write_text("\n".join(lines) + "\n")
    sources = [
        fastdata.FileList.from_csv(str(listing)),
        fastdata.FileList(ref_src.paths, ref_src.labels.tolist()),
        fastdata.BytesSource([Path(p).read_bytes() for p in ref_src.paths], ref_src.labels, classes=ref_src.classes),
    ]
    assert sources[0].paths == ref_src.paths
    assert sources[2].classes == ref_src.classes and sources[0].classes == ["0", "1", "2"]
    for src in sources:
        with loader_for(src, seed=9) as loader:
            got = epoch_batches(loader, 1)
        assert len(got) == len(ref)
        for (x, y), (xr, yr) in zip(got, ref):
            assert torch.equal(x, xr) and torch.equal(y, yr)


@pytest.mark.parametrize("line", ["just_a_path.jpg", "a.jpg,cat", "a.jpg,-1", ",3"])
def test_bad_file_list_lines_raise_naming_the_line(tmp_path: Path, line: str) -> None:
    listing = tmp_path / "list.txt"
    listing.write_text(f"ok.jpg,0\n{line}\n")
    with pytest.raises(ValueError, match=r"list\.txt:2"):
        fastdata.FileList.from_csv(str(listing))


def test_kept_cpu_batches_are_never_overwritten(folder) -> None:
    src = fastdata.ImageFolder(folder[0])
    with loader_for(src, seed=2, prefetch=1) as loader:
        kept, copies = [], []
        for epoch in range(3):
            loader.set_epoch(epoch)
            for x, y in loader:
                kept.append((x, y))
                copies.append((x.clone(), y.clone()))
    assert len(kept) == 18
    for (x, y), (xc, yc) in zip(kept, copies):
        assert torch.equal(x, xc) and torch.equal(y, yc)


def test_dropped_cpu_batches_recycle_the_ring(folder) -> None:
    """Steady state allocates nothing: the ring's slots are reused. Pageable memory, also on a
    CUDA machine (pinned CPU outputs come from torch's host cache per batch, by design)."""
    src = fastdata.ImageFolder(folder[0])
    with loader_for(src, seed=2, pin_memory=False) as loader:
        for epoch in range(3):
            loader.set_epoch(epoch)
            for x, y in loader:
                del x, y
        assert loader._ring.allocations == len(loader._ring)


# ---- damaged files ----

@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory, damaged_dir: Path) -> Tuple[Path, Dict[str, int], List[str]]:
    """A folder of good flat-colour images with broken files among them. Pillow is the
    oracle for 'broken': every file listed as bad fails to open in Pillow too."""
    root = tmp_path_factory.mktemp("damaged")
    ids = make_folder(root, {"a": 6, "b": 6})
    good = io.BytesIO()
    flat_image(99, 0).save(good, "JPEG", quality=95)
    bad = {
        root / "a" / "img_00_truncated_header.jpg": good.getvalue()[:100],
        root / "b" / "img_03_garbage.jpg": bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8)),
        root / "b" / "img_05_page.JPEG": b"<!DOCTYPE html><html><body>404 Not Found</body></html>\n",
        root / "a" / "img_04_empty.jpeg": b"",
        root / "b" / "img_04_html.JPEG": (damaged_dir / "html_page.JPEG").read_bytes(),
    }
    for path, data in bad.items():
        path.write_bytes(data)
        with pytest.raises(Exception):
            Image.open(path).convert("RGB")
    return root, ids, sorted(str(p) for p in bad)


def test_on_error_raise_names_the_file(damaged) -> None:
    root, _, bad = damaged
    src = fastdata.ImageFolder(root)
    first_bad = min(src.paths.index(p) for p in bad)
    with loader_for(src, shuffle=False, batch_size=3) as loader:
        seen = 0
        with pytest.raises(fastdata.DecodeError) as info:
            for x, _ in loader:
                seen += len(x)
    assert seen == first_bad // 3 * 3, "batches before the bad one arrive intact"
    err = info.value
    names = [f.name for f in err.failures] if isinstance(err, fastdata.BatchDecodeError) else [err.name]
    assert src.paths[first_bad] in names and set(names) <= set(bad)
    assert src.paths[first_bad] in str(err)


def test_on_error_skip_replaces_counts_and_warns_once(damaged) -> None:
    root, ids, bad = damaged
    src = fastdata.ImageFolder(root)
    good_after = {}
    for i, p in enumerate(src.paths):  # the replacement: the next sample in dataset order that decodes
        j = i
        while src.paths[j] in bad:
            j = (j + 1) % len(src)
        good_after[i] = ids[src.paths[j]]
    with loader_for(src, shuffle=False, batch_size=4, on_error="skip") as loader:
        assert len(loader) == -(-len(src) // 4)
        with pytest.warns(RuntimeWarning) as record:
            first = [(x.clone(), y.clone()) for x, y in loader]
        warned = [str(w.message) for w in record]
        assert len(warned) == len(bad)
        for path in bad:
            assert sum(path in m for m in warned) == 1, f"{path} must be named exactly once"
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a second epoch warns no more
            list(loader)
        stats = loader.stats()
    assert stats.failures == 2 * len(bad) and stats.replacement_failures == 0  # no two bad in a row
    got = [k for x, _ in first for k in batch_ids(x)]
    assert got == [good_after[i] for i in range(len(src))]
    labels = torch.cat([y for _, y in first]).tolist()
    label_by_id = {ids[p]: lab for p, lab in src.samples if p in ids}
    assert labels == [label_by_id[k] for k in got], "a replacement carries its own label"


def test_a_replacement_that_fails_too_is_counted_apart(tmp_path: Path, damaged_dir: Path) -> None:
    """failures counts the epoch's samples that failed (each once); a replacement candidate that
    fails while a failed sample's place is filled counts in replacement_failures instead."""
    root = tmp_path / "r"
    (root / "a").mkdir(parents=True)
    for k in range(6):
        flat_image(k, 0).save(root / "a" / f"img_{k}.jpg", quality=95)
    # samples 3 and 4 are broken: 3's first candidate (4) fails too, then 5 takes both places
    (root / "a" / "img_3.jpg").write_bytes(b"")
    (root / "a" / "img_4.jpg").write_bytes((damaged_dir / "html_page.JPEG").read_bytes())
    src = fastdata.ImageFolder(root)
    for batch_size in (6, 4):  # 3 and 4 in one batch, and in two (4 then fails in its own batch)
        with loader_for(src, shuffle=False, batch_size=batch_size, on_error="skip",
                        transform=fastdata.CenterCrop(24)) as loader:
            with pytest.warns(RuntimeWarning):
                got = [k for x, _ in loader for k in batch_ids(x)]
            stats = loader.stats()
        assert got == [0, 1, 2, 5, 5, 5]
        assert (stats.failures, stats.replacement_failures) == (2, 1), batch_size


def test_damaged_asset_folder_skips_only_what_pillow_cannot_open(tmp_path: Path, damaged_dir: Path) -> None:
    """The checked-in regression files: Pillow-readable ones (a PNG named .JPEG) decode."""
    cls = tmp_path / "x"
    cls.mkdir()
    files = [p for p in sorted(damaged_dir.iterdir()) if p.suffix.lower() in (".jpg", ".jpeg")]
    for p in files:
        (cls / p.name).write_bytes(p.read_bytes())
    src = fastdata.ImageFolder(tmp_path)
    with loader_for(src, shuffle=False, batch_size=len(src), on_error="skip") as loader:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            list(loader)
        failures = loader.stats().failures
    named = {p for p in src.paths if any(p in str(w.message) for w in record)}
    for p in src.paths:
        try:
            with Image.open(p) as im:
                im.convert("RGB")
            pillow_ok = True
        except Exception:
            pillow_ok = False
        if not pillow_ok and "truncated" not in p:  # libjpeg decodes a truncated scan (warning) by design
            assert p in named
        if pillow_ok:
            assert p not in named
    assert failures == len(named)


@pytest.mark.parametrize("kw", [dict(on_error="ignore"), dict(prefetch=0), dict(device="tpu"),
                                dict(dtype=torch.int32), dict(batch_size=0), dict(threads=0),
                                dict(batch_size=50, drop_last=True)])
def test_bad_arguments_raise(folder, kw) -> None:
    with pytest.raises(ValueError):
        loader_for(fastdata.ImageFolder(folder[0]), **kw)


class SlowSource(fastdata.ImageFolder):
    """An ImageFolder whose lookups take 25 ms a batch (a slow network store, say) and that
    counts its lookups, so a test can wait for the loader to make one."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.fetches = 0
        self.fetched = threading.Condition()

    def fetch(self, indices):
        time.sleep(0.025)
        with self.fetched:
            self.fetches += 1
            self.fetched.notify_all()
        return super().fetch(indices)


def test_stats_account_for_every_batch_and_prefetch_hides_the_pipeline(folder) -> None:
    src = SlowSource(folder[0])
    ahead = []
    with loader_for(src, seed=1, prefetch=2) as loader:
        sizes = []
        for k, (x, y) in enumerate(loader):
            sizes.append(len(y))
            if k + 1 < 6:
                # Prefetch: batch k + 1 is looked up while the step holds batch k, without
                # the loop asking for it (a loader that fetched on demand never would).
                with src.fetched:
                    ahead.append(src.fetched.wait_for(lambda: src.fetches >= k + 2, timeout=30))
            time.sleep(0.03)  # a training step far slower than decoding 4 tiny images
        stats = loader.stats()
    assert ahead == [True] * 5
    assert stats.batches == len(sizes) == 6 and stats.images == sum(sizes) == 21
    assert stats.read_seconds > 0 and stats.decode_seconds > 0  # files read by native threads
    assert stats.fetch_seconds >= 6 * 0.025
    assert stats.failures == 0 and stats.h2d_seconds == 0  # nothing to copy on CPU
    assert stats.threads == 2 and stats.prefetch == 2 and stats.batch_size == 4
    assert stats.wall_seconds >= 6 * 0.03
    assert 0 <= stats.wait_share <= 1
    # The native threads' runs: every row was theirs (no GPU decoder, no replacement), so their
    # busy time is the read + decode time, spent within the runs' span; with a step far slower
    # than decoding, they had a run to decode for a small part of the time.
    assert stats.native_busy_seconds == pytest.approx(stats.read_seconds + stats.decode_seconds)
    assert 0 < stats.native_busy_seconds <= stats.threads * stats.native_run_seconds * 1.01 + 1e-4
    assert 0 < stats.native_run_seconds <= stats.wall_seconds
    assert 0 < stats.native_occupancy < 0.5 and 0 < stats.native_busy_in_runs <= 1.01


def test_stats_since_an_earlier_snapshot_cover_the_window_between(folder) -> None:
    # The window after the first two batches: its counts are those of the batches after them,
    # and the snapshots' differences add back up to the whole.
    with loader_for(SlowSource(folder[0]), seed=1, prefetch=2) as loader:
        it = iter(loader)
        first = [len(next(it)[1]) for _ in range(2)]
        mark = loader.stats()
        rest = [len(y) for _, y in it]
        end = loader.stats()
    window = end.since(mark)
    assert (mark.batches, window.batches, end.batches) == (2, 4, 6)
    assert window.images == sum(rest) and mark.images == sum(first)
    assert window.native_rows == end.native_rows - mark.native_rows == sum(rest)
    assert window.wall_seconds == pytest.approx(end.wall_seconds - mark.wall_seconds) and window.wall_seconds > 0
    assert window.images_per_s == pytest.approx(window.images / window.wall_seconds)
    assert window.decode_seconds == pytest.approx(end.decode_seconds - mark.decode_seconds)
    assert (window.threads, window.prefetch, window.batch_size) == (end.threads, end.prefetch, end.batch_size)
    assert 0 < window.native_occupancy <= 1
    with pytest.raises(ValueError, match="earlier snapshot is later"):
        mark.since(end)


def test_default_threads_are_this_ranks_share_of_the_node(folder, monkeypatch) -> None:
    # Under torchrun every rank of a node builds its own Loader: each takes its share of the
    # cores, not all of them (N ranks x all cores would oversubscribe the node N times).
    from fastdata.io import host

    monkeypatch.setattr(host, "usable_cores", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert host.cores_per_local_rank() == 16
    for ranks, share in [("1", 16), ("4", 4), ("3", 5), ("32", 1)]:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
        assert host.cores_per_local_rank() == share
    for bad in ("two", "0", "-2"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", bad)
        with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
            host.cores_per_local_rank()

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    with loader_for(fastdata.ImageFolder(folder[0]), threads=None) as loader:
        assert loader.stats().threads == 2
        assert sum(x.shape[0] for x, _ in loader) == 21  # and it runs
    with loader_for(fastdata.ImageFolder(folder[0]), threads=3) as loader:
        assert loader.stats().threads == 3  # an explicit count is kept
