"""Backend plumbing on CPU: routing to the native fallback, failures, assembly, dtypes.

The nvJPEG decoder runs here with torchvision's CPU JPEG decoder standing in for nvJPEG
(``_allow_cpu``), so the code around the GPU decoder — plan, routing, fallback, resampling,
assembly — is checked against the native backend without a GPU.
"""
from __future__ import annotations

import io


import numpy as np
import pytest
import torch

import fastdata
from fastdata.decoders import BACKENDS
from fastdata.decoders.nvjpeg import NvjpegDecoder
from fastdata.decoders.routing import ends_with_eoi, gpu_decodable, plan_batch, route
from fastdata.loader.pipeline import make_backend
from fastdata.cli.demo import photo_like_jpeg
from imagegen import encode_jpeg, hard_case_folder, make_12bit, patch_sof, photo_like, psnr

pytest.importorskip("torchvision")
from torchvision.io.image import ImageReadMode  # noqa: E402


class CpuStandInDecoder(NvjpegDecoder):
    """nvJPEG's role played by torchvision's CPU decoder; it rejects progressive files as nvJPEG may."""

    _allow_cpu = True

    def __init__(self, transform):
        super().__init__(transform, device=torch.device("cpu"))
        self.seen = []

        def decode(tensors, device):
            out = []
            for t in tensors:
                info = fastdata.probe(t.numpy())
                self.seen.append(info)
                if info.progressive:
                    raise RuntimeError("progressive not supported (stand-in)")
                out.append(torch.ops.image.decode_jpeg(t, ImageReadMode.RGB.value, False))
            return out

        self._decode_jpegs = decode


def CpuStandIn(transform, **config):
    """The nvJPEG backend's pipeline with the stand-in decoder (``.decoders[0]``) in nvJPEG's place."""
    return make_backend(CpuStandInDecoder(transform), transform, **config)


@pytest.mark.parametrize("transform", [fastdata.RandomResizedCrop(64), fastdata.CenterCrop(64)])
def test_standin_matches_native_with_fallbacks_and_failures(tmp_path, transform):
    paths = hard_case_folder(tmp_path)
    indices = np.arange(1000, 1000 + len(paths))
    cfg = dict(device="cpu", dtype=None, seed=4, threads=2)
    with CpuStandIn(transform, **cfg) as gpu, make_backend("native", transform, **cfg) as native:
        a, fa, ra = gpu.run(paths, indices, 3)
        b, fb, rb = native.run(paths, indices, 3)
        stats = dict(gpu.stats)
    assert a.shape == b.shape == (len(paths), 64, 64, 3) and a.dtype == torch.uint8
    # Same failures, same rows, named by path and dataset index.
    assert ra == rb == [len(paths) - 2, len(paths) - 1]
    assert [(e.index, e.name) for e in fa] == [(e.index, e.name) for e in fb]
    assert fa[0].name.endswith("garbage.jpg") and "missing.jpg" in fa[1].name and fa[1].index == indices[-1]
    assert (a[ra] == 0).all()
    for row in range(len(paths) - 2):
        assert psnr(a[row], b[row]) >= 30, (paths[row], psnr(a[row], b[row]))
    # Row order: each row is closest to its own native row.
    sims = torch.tensor([[psnr(a[i], b[j]) for j in range(6)] for i in range(6)])
    assert (sims.argmax(1) == torch.arange(6)).all()
    # CMYK and PNG never reach the GPU decoder; the progressive file was rejected and fell back.
    assert stats["gpu_rejected"] >= 1 and stats["native_rows"] >= 3
    assert not any(info.components == 4 for info in gpu.decoders[0].seen)


def test_normalized_output_and_layout(tmp_path):
    paths = hard_case_folder(tmp_path)[:7]
    t = fastdata.RandomResizedCrop((48, 40))
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    with CpuStandIn(t, device="cpu", dtype=None, seed=1, threads=2) as raw:
        u8, _, _ = raw.run(paths, np.arange(7), 0)
    for dtype, cl in [(torch.float16, True), (torch.float32, False), (torch.bfloat16, True)]:
        with CpuStandIn(t, device="cpu", dtype=dtype, mean=mean, std=std, channels_last=cl, seed=1, threads=2) as be:
            y, failures, rows = be.run(paths, np.arange(7), 0)
        assert not failures and not rows
        assert y.shape == (7, 3, 48, 40) and y.dtype == dtype
        assert y.is_contiguous(memory_format=torch.channels_last) if cl else y.is_contiguous()
        ref = (u8.double() / 255 - torch.tensor(mean, dtype=torch.float64)) / torch.tensor(std, dtype=torch.float64)
        tol = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
        torch.testing.assert_close(y.double(), ref.permute(0, 3, 1, 2), atol=tol, rtol=0)


def test_strict_routes_truncated_to_native_and_reports_it(tmp_path):
    paths = hard_case_folder(tmp_path)
    trunc = paths.index(str(tmp_path / "truncated.jpg"))
    with CpuStandIn(fastdata.RandomResizedCrop(32), device="cpu", dtype=None, strict=True, threads=2) as be:
        _, failures, rows = be.run(paths, np.arange(len(paths)), 0)
    assert trunc in rows and any(e.name.endswith("truncated.jpg") for e in failures)


def rgb_coded_jpeg(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, keep_rgb=True)  # Pillow >= 10.1
    return buf.getvalue()


def test_routing_reads_the_header_facts_the_native_reader_parsed():
    img = photo_like(30, 40)
    rgb = encode_jpeg(img)
    cases = {  # name: (data, components, bits, arithmetic, a GPU decoder takes it)
        "rgb": (rgb, 3, 8, False, True),
        "progressive": (encode_jpeg(img, progressive=True), 3, 8, False, True),
        "extended": (patch_sof(rgb, marker=0xC1), 3, 8, False, True),
        "gray": (encode_jpeg(img.convert("L")), 1, 8, False, True),
        "cmyk": (encode_jpeg(img.convert("CMYK")), 4, 8, False, False),
        "arithmetic": (patch_sof(rgb, marker=0xC9), 3, 8, True, False),
        "truncated": (rgb[:-10], 3, 8, False, False),  # no EOI
        "padded": (rgb + b"\x00\x00\x00", 3, 8, False, True),  # EOI, then zero padding
        # three components libjpeg reads as RGB (Pillow's keep_rgb: Adobe transform 0), which
        # nvImageCodec's parser would take for YCbCr
        "rgb-coded": (rgb_coded_jpeg(img), 3, 8, False, False),
    }
    items = [c[0] for c in cases.values()] + [make_12bit(rgb), b"\x89PNG\r\n"]
    with fastdata.Engine(1) as engine:
        batch = plan_batch(items, np.arange(len(items)), 0, [None] * len(items), engine,
                           fastdata.RandomResizedCrop(8), seed=0)
    plan = batch.plan
    decodable = gpu_decodable(batch)
    assert decodable.dtype == bool and decodable.shape == (len(items),)
    for row, (name, (data, comps, bits, arith, gpu)) in enumerate(cases.items()):
        got = (int(plan.components[row]), int(plan.precisions[row]), bool(plan.arithmetic[row]))
        assert got == (comps, bits, arith), name
        assert decodable[row] == gpu, name
        # the plan's subsampling and color coding are the header reader's, as probe() names them
        assert fastdata._C.SUBSAMPLING_NAMES[plan.subsamplings[row]] == fastdata.probe(data).subsampling, name
        assert bool(plan.rgb_coded[row]) == (fastdata.probe(data).color_space == "rgb") == (name == "rgb-coded"), name
    # libjpeg-turbo's 8-bit header reader refuses 12-bit, so such a file is unplanned: native.
    twelve, png = len(cases), len(cases) + 1
    assert batch.unplanned == {twelve} and batch.not_jpeg == {png}
    assert not decodable[twelve] and not decodable[png]


class _Takes:
    """A decoder stand-in that accepts the rows of ``mask``."""

    def __init__(self, name, mask):
        self.name, self.mask = name, np.asarray(mask, bool)

    def accepts(self, batch):
        return self.mask


def test_route_gives_each_row_to_the_first_decoder_that_accepts_it():
    items = [photo_like_jpeg(0, i, 40, 30) for i in range(5)] + [b"\xff\xd8\xff\xe0 a header cut short"]
    with fastdata.Engine(1) as engine:
        batch = plan_batch(items, np.arange(6), 0, [None] * 6, engine, fastdata.RandomResizedCrop(8), seed=0)
    assert batch.unplanned == {5}  # a header the reader could not plan: the last decoder's alone
    first = _Takes("first", [1, 0, 1, 0, 0, 1])
    second = _Takes("second", [1, 1, 0, 0, 0, 1])
    native = _Takes("native", [1] * 6)
    assert route(batch, [first, second, native]) == [[0, 2], [1], [3, 4, 5]]
    with pytest.raises(RuntimeError, match="no decoder accepts row 3"):
        route(batch, [first, _Takes("native", [1, 1, 1, 0, 1, 1])])
    with pytest.raises(RuntimeError, match="answered accepts"):
        route(batch, [_Takes("short", [1, 1]), native])
    same = _Takes("twice", [1, 0, 0, 0, 0, 1])  # one decoder listed twice: the first place takes its rows
    assert route(batch, [same, same, native]) == [[0], [], [1, 2, 3, 4, 5]]


def test_a_decoder_that_answers_per_row_is_refused_with_the_reason():
    class PerRow:  # the protocol before 2026-12-02: accepts(batch, row) -> bool
        name, depth = "per-row", 1

        def accepts(self, batch, row):
            return True

    with pytest.raises(TypeError, match=r"accepts must take the planned batch alone.*\['batch', 'row'\]"):
        make_backend(PerRow(), fastdata.RandomResizedCrop(8))


def test_ends_with_eoi():
    jpeg = photo_like_jpeg(0, 0, 40, 30)
    assert ends_with_eoi(jpeg) and ends_with_eoi(jpeg + b"\x00\x00") and not ends_with_eoi(jpeg[:-10])
    as_array = np.frombuffer(jpeg, np.uint8)  # what plan_batch hands the decoders
    assert ends_with_eoi(as_array) and ends_with_eoi(np.frombuffer(jpeg + b"\x00" * 3, np.uint8))
    assert not ends_with_eoi(as_array[:-10]) and not ends_with_eoi(as_array[:1])
    # A view of wider items is read as its bytes: 0xD9 as the last 16-bit item is bytes D9 00.
    assert not ends_with_eoi(np.array([0xFF, 0xD9], np.uint16))


def test_make_backend_rejects_unknown_names_and_cpu_nvjpeg():
    assert BACKENDS == ("native", "gpu", "hybrid", "nvjpeg", "dali")
    with pytest.raises(ValueError, match="backend must be one of"):
        make_backend("opencv", fastdata.RandomResizedCrop(8))
    with pytest.raises(ValueError, match="CUDA device"):
        make_backend("nvjpeg", fastdata.RandomResizedCrop(8), device="cpu")


def test_batches_submitted_ahead_are_bounded_by_the_ring_and_come_back_whole():
    """A batch's native rows are queued into its ring slot at submit: at most one batch per
    slot may wait uncollected (one more would overwrite a slot still to be collected)."""
    transform = fastdata.RandomResizedCrop(32)
    batches = [[photo_like_jpeg(k, i, 60 + 9 * i, 80) for i in range(4)] for k in range(4)]
    cfg = dict(device="cpu", dtype=None, seed=5, threads=2)
    with make_backend("native", transform, max_batch=4, **cfg) as ahead, \
            make_backend("native", transform, max_batch=4, **cfg) as one_by_one:
        slots = len(ahead.ring)
        assert slots == 2 + ahead.depth - 1 == 3
        pending = [ahead.submit(b, range(4 * k, 4 * k + 4), 1) for k, b in enumerate(batches[:slots])]
        with pytest.raises(RuntimeError, match="not yet collected"):
            ahead.submit(batches[slots], range(12, 16), 1)
        for k, p in enumerate(pending):
            got = ahead.collect(p)[0].clone()
            want = one_by_one.run(batches[k], range(4 * k, 4 * k + 4), 1)[0]
            assert torch.equal(got, want)
        ahead.discard(ahead.submit(batches[3], range(12, 16), 1))  # a discarded batch frees its slot too
        for k in range(slots):
            ahead.collect(ahead.submit(batches[k], range(4 * k, 4 * k + 4), 1))
