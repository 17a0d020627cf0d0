"""The contenders of `fastdata-bench`: one small class per way of feeding a training loop.

Every contender runs the same job (see :class:`Job`): the same encoded images,
RandomResizedCrop(224) + horizontal flip, ImageNet normalization, the same batch size,
output dtype and device; each yields ``(images, labels)`` batches forever (epochs are
chained) until the generator is closed. ``images`` is a normalized ``job.dtype`` tensor
[B, 3, 224, 224] on ``job.device`` (with ``job.dtype == "uint8"``: raw uint8 [B, 224, 224, 3],
NHWC, not normalized); ``labels`` int64 [B]. A contender that cannot run here says why
through ``unavailable()`` and is reported as skipped, never dropped. fastdata.cli.bench_runner
times them.

Heavy imports (torch, torchvision, DALI, fastdata's loader) happen inside the methods so
that a missing optional package turns into a skip reason, not an import failure of the tool.
"""
from __future__ import annotations

import importlib
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from fastdata.io.normalization import IMAGENET_MEAN, IMAGENET_STD

Batch = Tuple[Any, Any]  # (images tensor, labels tensor)


@dataclass
class Job:
    """What every contender must produce, and from which data.

    ``paths``/``labels`` list the image files (empty when the data is an LMDB cache);
    ``folder`` is set when the data is an ImageFolder tree, ``lmdb`` when it is a fastdata
    LMDB cache. ``workers`` is the process/thread count (DataLoader workers, native threads).
    """

    paths: List[str]
    labels: List[int]
    classes: List[str]
    folder: Optional[Path] = None
    lmdb: Optional[Path] = None
    list_file: Optional[Path] = None
    shards: Optional[str] = None  # tar shards: an index.json path/URL or a shard pattern (fastdata.TarShards)
    batch_size: int = 64
    size: int = 224
    device: str = "cpu"
    dtype: str = "float32"
    workers: int = 2
    cache_dir: Optional[Path] = None
    log: Callable[[str], None] = field(default=lambda msg: None, repr=False)

    @property
    def num_images(self) -> int:
        return len(self.paths) if self.paths else -1

    @property
    def uint8(self) -> bool:
        """Raw uint8 NHWC images instead of normalized NCHW floats."""
        return self.dtype == "uint8"

    def torch_dtype(self) -> Any:
        import torch

        return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "uint8": torch.uint8}[self.dtype]


def _missing(module: str) -> Optional[str]:
    """None when ``module`` imports, else a one-line reason."""
    try:
        importlib.import_module(module)
    except Exception as e:  # ImportError, or an extension failing to load: both mean "skip"
        return f"{module} not importable: {type(e).__name__}: {e}"
    return None


def _float_only(job: Job) -> Optional[str]:
    return "uint8 output is not implemented for this contender (normalized float only)" if job.uint8 else None


def _cuda_reason(job: Job) -> Optional[str]:
    if not job.device.startswith("cuda"):
        return "GPU contender: run with --device cuda"
    import torch

    if not torch.cuda.is_available():
        return "CUDA is not available"
    return None


def _shuffled_batches(n: int, batch_size: int) -> Iterator[List[int]]:
    """Index batches of ``range(n)`` forever, reshuffled every epoch (a fixed seed), dropping
    each epoch's last partial batch: the loop of the contenders that index files themselves."""
    rng = random.Random(0)
    order = list(range(n))
    while True:
        rng.shuffle(order)
        for start in range(0, n - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def _gpu_files_reason(job: Job, module: str, who: str = "needs") -> Optional[str]:
    """Why a GPU contender that reads image files with ``module`` cannot run here, or None."""
    reason = _float_only(job) or _cuda_reason(job) or _missing(module)
    if reason:
        return reason
    if not job.paths:
        return f"{who} image files (DATA is an LMDB cache)"
    return None


def pillow_flavour() -> str:
    """'Pillow-SIMD x.y' when Pillow-SIMD provides PIL, else 'Pillow x.y'."""
    from importlib import metadata

    import PIL

    try:
        metadata.distribution("Pillow-SIMD")
        return f"Pillow-SIMD {PIL.__version__}"
    except metadata.PackageNotFoundError:
        return f"Pillow {PIL.__version__}"


# ---------------------------------------------------------------------------------------
# torch DataLoader + torchvision transforms (the baseline users start from)


class _LMDBDataset:
    """torch Dataset over a fastdata LMDB cache, opened lazily in each worker process
    (an LMDB environment must not cross a fork)."""

    def __init__(self, path: Path, transform: Any) -> None:
        self.path, self.transform = path, transform
        self._source: Any = None
        self._pid = -1
        src = self._open()
        self._len = len(src)
        self._labels = [int(x) for x in src.labels]

    def _open(self) -> Any:
        if self._source is None or self._pid != os.getpid():
            import fastdata

            self._source, self._pid = fastdata.LMDBSource(str(self.path)), os.getpid()
        return self._source

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_source"], state["_pid"] = None, -1
        return state

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> Tuple[Any, int]:
        import io

        from PIL import Image

        from ..io.pillow_fallback import FALLBACK_FORMATS

        item = self._open().fetch([i])[0]
        data = open(item, "rb").read() if isinstance(item, str) else bytes(item)
        with Image.open(io.BytesIO(data), formats=("JPEG",) + FALLBACK_FORMATS) as im:  # never EPS & co.
            img = im.convert("RGB")
        return self.transform(img), self._labels[i]


class _PathDataset:
    """(path, label) list read with torchvision's default loader (what ImageFolder does)."""

    def __init__(self, paths: Sequence[str], labels: Sequence[int], transform: Any) -> None:
        self.paths, self.labels, self.transform = list(paths), list(labels), transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Tuple[Any, int]:
        from torchvision.datasets.folder import default_loader

        return self.transform(default_loader(self.paths[i])), self.labels[i]


class DataLoaderContender:
    """``torch.utils.data.DataLoader`` over torchvision's ImageFolder with
    RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize, ``workers``
    processes, pinned memory when the output goes to CUDA (pinning without an accelerator
    only warns). Note: torchvision's loader does not apply EXIF orientation; fastdata does.
    """

    name = "dataloader"

    def __init__(self, workers: Optional[int] = None, pin_memory: Optional[bool] = None,
                 label: Optional[str] = None, require_simd: bool = False) -> None:
        self.workers, self.pin_memory, self.require_simd = workers, pin_memory, require_simd
        self.label = label or ("DataLoader + Pillow-SIMD" if require_simd else "DataLoader (torchvision)")
        self.detail: Dict[str, Any] = {}

    def unavailable(self, job: Job) -> Optional[str]:
        reason = _missing("torchvision")
        if reason:
            return reason
        flavour = pillow_flavour()
        if self.require_simd and not flavour.startswith("Pillow-SIMD"):
            return (f"Pillow-SIMD not installed ({flavour}); it replaces Pillow: "
                    "pip uninstall -y pillow && CC=\"cc -mavx2\" pip install pillow-simd")
        if not self.require_simd and flavour.startswith("Pillow-SIMD"):
            return ("the installed PIL is Pillow-SIMD (stock Pillow cannot load side by side): "
                    "see the Pillow-SIMD row")
        if job.lmdb is None and job.folder is None and not job.paths:
            return "DATA is tar shards: see the webdataset row"
        if job.device.startswith("cuda"):
            return _cuda_reason(job)
        return None

    def batches(self, job: Job) -> Iterator[Batch]:
        import torch
        from torch.utils.data import DataLoader, RandomSampler
        from torchvision import datasets, transforms

        steps: List[Any] = [transforms.RandomResizedCrop(job.size), transforms.RandomHorizontalFlip()]
        if job.uint8:
            steps.append(transforms.PILToTensor())
        else:
            steps += [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        tf = transforms.Compose(steps)
        if job.lmdb is not None:
            ds: Any = _LMDBDataset(job.lmdb, tf)
        elif job.folder is not None:
            ds = datasets.ImageFolder(str(job.folder), transform=tf)
        else:
            ds = _PathDataset(job.paths, job.labels, tf)
        workers = job.workers if self.workers is None else self.workers
        cuda = job.device.startswith("cuda")
        pin = cuda if self.pin_memory is None else (self.pin_memory and cuda)
        self.detail = {"workers": workers, "pin_memory": pin, "pillow": pillow_flavour()}
        # One long shuffled epoch (permutations chained): a small demo set would otherwise
        # drain the worker pipeline every few batches, which a real dataset never does.
        sampler = RandomSampler(ds, replacement=False, num_samples=len(ds) * 10_000)
        loader = DataLoader(ds, batch_size=job.batch_size, sampler=sampler, num_workers=workers,
                            pin_memory=pin, drop_last=True, persistent_workers=workers > 0)
        dtype, device = job.torch_dtype(), torch.device(job.device)
        it = iter(loader)
        try:
            for images, labels in it:
                if job.uint8:
                    images = images.permute(0, 2, 3, 1)  # NHWC like fastdata's uint8 output (a view)
                images = images.to(device, non_blocking=pin).to(dtype)
                yield images, labels.to(device, non_blocking=pin)
        finally:
            # Shut the worker processes down now, not at garbage collection.
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            del it, loader


# ---------------------------------------------------------------------------------------
# fastdata


class RepeatedSource:
    """A source protocol view that repeats ``inner`` ``times`` times (index i -> i % n).

    Why: the demo set is small, and chaining many short epochs measures epoch-boundary
    drain rather than steady-state throughput; a long virtual epoch avoids that for fastdata
    as the chained RandomSampler does for the DataLoader.
    """

    def __init__(self, inner: Any, times: int) -> None:
        import numpy as np

        self.inner, self.times = inner, int(times)
        self.classes = list(inner.classes)
        self._n = len(inner)
        self._labels = np.tile(np.asarray(inner.labels, dtype=np.int64), self.times)

    def __len__(self) -> int:
        return self._n * self.times

    @property
    def labels(self) -> Any:
        return self._labels

    def name(self, index: int) -> str:
        return self.inner.name(index % self._n)

    def fetch(self, indices: Sequence[int]) -> Sequence[Any]:
        return self.inner.fetch([int(i) % self._n for i in indices])


def open_shards(spec: str, **options: Any) -> Any:
    """fastdata.TarShards from an index (``*.json``) or a shard pattern/URL."""
    import fastdata

    return fastdata.TarShards(index=spec, **options) if spec.endswith(".json") else fastdata.TarShards(spec, **options)


def repeat_shards(source: Any, batch_size: int, **options: Any) -> Any:
    """A small shard set listed several times in its index, so one epoch holds at least 400
    batches (as ``_repeat_for`` does for the random-access sources)."""
    import fastdata
    from fastdata.sources.shard_index import ShardIndex

    times = max(1, -(-400 * batch_size // max(len(source), 1)))
    if times == 1 and not options:
        return source
    return fastdata.TarShards(index=ShardIndex(source.index.shards * times, source.classes), **options)


def _repeat_for(source: Any, batch_size: int) -> Any:
    """Repeat small sources so one epoch holds at least 400 batches."""
    n = len(source)
    times = max(1, -(-400 * batch_size // max(n, 1)))
    return source if times == 1 else RepeatedSource(source, times)


class FastdataContender:
    """``fastdata.Loader`` from files, an LMDB cache or RAM.

    ``source``: "files" | "lmdb" | "ram" (``fastdata.RAMCache`` of the LMDB cache's records: the
    ablation adds it on top of the LMDB step, and its restart-indexed records are what makes the
    LMDB row faster than files in the page cache). ``roi=False`` asks the engine for a plain full
    decode followed by crop+resize (the ablation's "native decode" step); it needs the
    lead's ``roi`` switch on ``fastdata.Loader``. ``host_normalize=True`` with a CUDA job
    takes uint8 NHWC batches on the host and copies/normalizes them synchronously on the
    default stream (the ablation's "before CUDA-stream prefetch" steps). ``backend``:
    the Loader's decoding backend ("native", "hybrid", or the GPU decoders "gpu", "dali" and
    "nvjpeg"); the GPU ones record the rows each decoder took in ``detail``.
    """

    def __init__(self, source: str = "files", roi: bool = True, host_normalize: bool = False,
                 threads: Optional[int] = None, label: Optional[str] = None, backend: str = "native",
                 shard_cache: bool = False) -> None:
        self.shard_cache = shard_cache  # shards: TarShards' local disk cache on (a temporary folder)
        if source not in ("files", "lmdb", "ram", "shards"):
            raise ValueError(f"unknown fastdata source {source!r}")
        self.source, self.roi, self.host_normalize, self.threads = source, roi, host_normalize, threads
        self.backend = backend
        self.name = {"files": "fastdata", "lmdb": "lmdb", "ram": "ram", "shards": "shards"}[source]
        if backend != "native":
            self.name = f"fastdata-{backend}"
        self.label = label or {"files": "fastdata (files)", "lmdb": "fastdata (LMDB)",
                               "ram": "fastdata (RAM, LMDB records)", "shards": "fastdata (tar shards)"}[source]
        if backend != "native" and label is None:  # they read DATA as given: files, or an LMDB's records
            self.label = f"fastdata (backend={backend})"
        self.detail: Dict[str, Any] = {}

    def reads_lmdb(self, job: Job) -> bool:
        """Whether this contender reads an LMDB cache (given as DATA, or built by ensure_lmdb)."""
        return self.source in ("lmdb", "ram") or (self.source == "files" and job.lmdb is not None)

    def unavailable(self, job: Job) -> Optional[str]:
        try:
            import fastdata

            # The lazy imports of everything this contender uses are the availability check.
            needed = ["Loader", "RandomResizedCrop"]
            if self.source == "shards":
                needed.append("TarShards")
            elif self.reads_lmdb(job):
                needed.append("LMDBSource")
            elif job.folder is not None:
                needed.append("ImageFolder")
            else:
                needed.append("FileList")
            if self.source == "ram":
                needed.append("RAMCache")
            for attr in needed:
                getattr(fastdata, attr)
        except Exception as e:  # a module not written or not built yet: skip, with its error
            return f"{type(e).__name__}: {e}"
        if self.source == "shards" and job.shards is None:
            return "no tar shards (DATA or --shards: an index.json or a shard pattern)"
        if self.source == "files" and job.lmdb is None and job.folder is None and not job.paths:
            return "DATA is tar shards: there are no files to read"
        if self.source == "files" and job.lmdb is not None and self.backend == "native":  # a GPU backend's row reads it
            return "DATA is an LMDB cache: there are no files to read (the lmdb row reads it)"
        if self.reads_lmdb(job) and job.lmdb is None and job.folder is None and job.list_file is None:
            return "no ImageFolder or list file to convert to LMDB"
        if not self.roi:
            import inspect

            if "roi" not in inspect.signature(fastdata.Loader).parameters:
                return ("the engine exposes no switch for a plain full decode "
                        "(needs fastdata.Loader(..., roi=False))")
        if self.backend != "native":
            if job.uint8:
                return _float_only(job)
            if not job.device.startswith("cuda"):
                return f"backend={self.backend} decodes on the GPU (needs --device cuda)"
            if self.backend == "dali":
                reason = _missing("nvidia.dali")
                if reason:
                    return reason
            if self.backend in ("gpu", "hybrid"):
                # Not imported: that import makes nvImageCodec's Python API instance, with every
                # codec extension loaded, which these backends do not use (nvimgcodec_library).
                from ..decoders.nvimgcodec import GPU_MISSING, gpu_extra_installed

                if not gpu_extra_installed():
                    return GPU_MISSING
        if job.device.startswith("cuda"):
            return _cuda_reason(job)
        return None

    def _open_source(self, job: Job) -> Any:
        import fastdata

        if self.source == "shards":
            options: Dict[str, Any] = {}
            if self.shard_cache:  # a fresh cache folder per run: the first pass reads over the network
                import tempfile

                self._cache_dir = tempfile.TemporaryDirectory(prefix="fastdata-bench-shards-")
                options.update(cache_dir=self._cache_dir.name, cache_size="100GB")
            return repeat_shards(open_shards(job.shards), job.batch_size, **options)
        if self.reads_lmdb(job):
            path = job.lmdb if job.lmdb is not None else ensure_lmdb(job)
            src: Any = fastdata.LMDBSource(str(path))
        elif job.folder is not None:
            src = fastdata.ImageFolder(str(job.folder))
        else:
            src = fastdata.FileList(job.paths, job.labels)
        if self.source == "ram":
            src = fastdata.RAMCache(src)
        return src

    def batches(self, job: Job) -> Iterator[Batch]:
        import fastdata
        import torch

        src = self._open_source(job)
        if self.source != "shards":
            src = _repeat_for(src, job.batch_size)
        cuda = job.device.startswith("cuda")
        threads = job.workers if self.threads is None else self.threads
        if self.backend == "hybrid" and self.threads is None:
            from fastdata.loader.pipeline import hybrid_native_threads

            threads = hybrid_native_threads(threads)  # as the Loader's default does on a box of job.workers cores
        kwargs: Dict[str, Any] = dict(
            batch_size=job.batch_size, transform=fastdata.RandomResizedCrop(job.size), shuffle=True,
            seed=0, drop_last=True, threads=threads, prefetch=3, mean=IMAGENET_MEAN, std=IMAGENET_STD,
            backend=self.backend)
        if not self.roi:
            kwargs["roi"] = False
        sync_copy = cuda and self.host_normalize
        if sync_copy:
            kwargs.update(device="cpu", dtype=torch.uint8)
        else:
            kwargs.update(device=job.device, dtype=job.torch_dtype())
        self.detail = {"threads": threads, "roi": self.roi, "source": type(src).__name__,
                       "stream_prefetch": cuda and not sync_copy, "backend": self.backend}
        loader = fastdata.Loader(src, **kwargs)
        try:
            if not sync_copy:
                epoch = 0
                while True:
                    loader.set_epoch(epoch)
                    yield from loader
                    epoch += 1
            device, dtype = torch.device(job.device), job.torch_dtype()
            mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
            std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255
            epoch = 0
            while True:
                loader.set_epoch(epoch)
                for images, labels in loader:
                    # uint8 NHWC on the host -> synchronous copy -> normalize on the GPU.
                    x = images.to(device).permute(0, 3, 1, 2).float()
                    yield ((x - mean) / std).to(dtype), labels.to(device)
                epoch += 1
        finally:
            if self.backend != "native":  # rows per decoder: a GPU backend that hands all to the CPU shows here
                st = loader.stats()
                self.detail.update(gpu_rows=st.gpu_rows, native_rows=st.native_rows, gpu_rejected=st.gpu_rejected,
                                   gpu_share=round(st.gpu_share, 3), native_busy_in_runs=round(st.native_busy_in_runs, 3))
                # rows read for routing on the producer's call (hybrid: up to the GPU's share)
                self.detail["rows_read_to_route"] = loader._pipeline.stats["read_rows"]
                balancer = loader._pipeline.balancer
                if balancer is not None and balancer.share_from_waits is not None:  # where the waits left the split
                    split = dict(share=round(balancer.share_from_waits, 3), up=balancer.moves[0],
                                 down=balancer.moves[1], lifts=balancer.lifts)
                    if balancer.rates_measured:  # else the rates' share is only the initial guess
                        split["rates"] = round(balancer.rate_share(), 3)
                    self.detail["split_from_waits"] = split
                stages = loader.gpu_stage_seconds()
                decoder = loader._pipeline.decoders[0]  # the GPU decoder, or native alone
                if stages:  # where the GPU decoder's worker spent its time (seconds, summed)
                    self.detail["gpu_stage_seconds"] = {k: round(v, 3) for k, v in stages.items()}
                    self.detail["gpu_decode_lanes"] = getattr(decoder, "lanes", 1)
                created = getattr(decoder, "creation_seconds", None)
                if created:  # what making its nvImageCodec decoders cost, once per Loader
                    self.detail["gpu_decoder_creation"] = dict({k: round(v, 3) for k, v in created.items()},
                                                               decoders=decoder.decoder_total,
                                                               instances=decoder.instance_total)
            loader.close()
            cache_dir = getattr(self, "_cache_dir", None)
            if cache_dir is not None:
                cache_dir.cleanup()
                self._cache_dir = None


def ensure_lmdb(job: Job) -> Path:
    """Path of an LMDB cache of ``job``'s data, built with fastdata-convert if absent.

    Cached under ``job.cache_dir/lmdb/<name>-<hash of the source path>``; a cache that
    LMDBSource refuses (incomplete, newer format) is rebuilt, and so is one of an older
    format version: the benchmark measures what fastdata-convert writes now (format 2's
    restart index makes crop decodes faster than format 1's records).
    """
    import hashlib
    import shutil

    import fastdata
    from fastdata.cache import format as cf
    from fastdata.cli import convert

    src = job.folder if job.folder is not None else job.list_file
    if src is None:
        raise ValueError("no ImageFolder or list file to convert")
    cache = Path(job.cache_dir) if job.cache_dir is not None else Path.home() / ".cache" / "fastdata"
    digest = hashlib.sha256(str(Path(src).resolve()).encode()).hexdigest()[:12]
    dst = cache / "lmdb" / f"{Path(src).name}-{digest}"
    if dst.exists():
        try:
            version = fastdata.LMDBSource(str(dst)).meta["format_version"]
            if version == cf.FORMAT_VERSION:
                return dst
            job.log(f"rebuilding LMDB cache {dst}: format version {version}, fastdata-convert writes "
                    f"{cf.FORMAT_VERSION}")
            shutil.rmtree(dst)  # ours (under the benchmark's cache folder); --resume cannot change options
        except Exception as e:  # incomplete or stale cache: convert again (resumes if it can)
            job.log(f"rebuilding LMDB cache {dst}: {e}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    job.log(f"converting {src} -> {dst} (fastdata-convert, once)")
    argv = [str(src), str(dst), "--workers", str(job.workers)]
    if dst.exists():
        argv.append("--resume")
    rc = convert.main(argv)
    if rc not in (None, 0):
        raise RuntimeError(f"fastdata-convert {' '.join(argv)} exited with {rc}")
    return dst


class WebDatasetContender:
    """``torch.utils.data.DataLoader`` (``webdataset.WebLoader``) over ``webdataset.WebDataset``
    reading the same tar shards: shards shuffled and split over ``workers`` processes, a
    1000-sample shuffle buffer (TarShards' default), Pillow decode, then the same torchvision
    transforms as the DataLoader row. webdataset reads http(s) URLs through ``curl``."""

    name = "webdataset"
    label = "DataLoader + WebDataset"

    def __init__(self) -> None:
        self.detail: Dict[str, Any] = {}

    def unavailable(self, job: Job) -> Optional[str]:
        reason = _missing("webdataset") or _missing("torchvision")
        if reason:
            return reason + " (pip install webdataset)"
        if job.shards is None:
            return "no tar shards (DATA or --shards: an index.json or a shard pattern)"
        if job.device.startswith("cuda"):
            return _cuda_reason(job)
        return None

    def batches(self, job: Job) -> Iterator[Batch]:
        import torch
        import webdataset as wds
        from torchvision import transforms

        urls = open_shards(job.shards).urls
        steps: List[Any] = [transforms.RandomResizedCrop(job.size), transforms.RandomHorizontalFlip()]
        if job.uint8:
            steps.append(transforms.PILToTensor())
        else:
            steps += [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        tf = transforms.Compose(steps)
        workers = min(job.workers, len(urls))
        cuda = job.device.startswith("cuda")
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node,
                             workersplitter=wds.split_by_worker, empty_check=False)
              .repeat().shuffle(1000).decode("pil").to_tuple("jpg;png;jpeg;webp", "cls")
              .map_tuple(tf, int).batched(job.batch_size, partial=False))
        loader = wds.WebLoader(ds, batch_size=None, num_workers=workers, pin_memory=cuda,
                               persistent_workers=workers > 0)
        self.detail = {"workers": workers, "shards": len(urls), "pillow": pillow_flavour(),
                       "webdataset": getattr(wds, "__version__", "?")}
        dtype, device = job.torch_dtype(), torch.device(job.device)
        it = iter(loader)
        try:
            for images, labels in it:
                if job.uint8:
                    images = images.permute(0, 2, 3, 1)  # NHWC like fastdata's uint8 output (a view)
                yield images.to(device, non_blocking=cuda).to(dtype), torch.as_tensor(labels).to(device)
        finally:
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            del it, loader


# ---------------------------------------------------------------------------------------
# FFCV


class FFCVContender:
    """FFCV's Loader over its own packed ``.beton`` of the same ImageFolder (written once,
    JPEG q90, not timed): RandomResizedCrop decode + flip (+ normalize), ``workers``
    threads, random order over one long epoch (the set's indices repeated), as FFCV's
    documented pipelines do it: on CUDA uint8 goes to the GPU and is normalized there, on
    the CPU NormalizeImage runs on the host. uint8 output is NHWC; normalized output is
    NCHW (a channels_last view). FFCV builds from source against OpenCV and libturbojpeg
    (apt install libopencv-dev libturbojpeg0-dev pkg-config; pip install ffcv numba)."""

    name = "ffcv"
    label = "FFCV (its .beton)"

    def __init__(self) -> None:
        self.detail: Dict[str, Any] = {}

    def unavailable(self, job: Job) -> Optional[str]:
        reason = _missing("ffcv.loader")
        if reason:
            return reason
        if job.folder is None:
            return "packs an ImageFolder into its .beton (DATA is not a folder)"
        if job.dtype == "bfloat16":
            return "FFCV's NormalizeImage makes float16 or float32 only"
        if job.device.startswith("cuda"):
            return _cuda_reason(job)
        return None

    def batches(self, job: Job) -> Iterator[Batch]:
        import numpy as np
        import torch
        from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
        from ffcv.loader import Loader, OrderOption
        from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, Squeeze, ToDevice, ToTensor, ToTorchImage

        if job.folder is None:
            raise ValueError("FFCV packs an ImageFolder: the job has none")
        cuda = job.device.startswith("cuda")
        device = torch.device(job.device)
        image: List[Any] = [RandomResizedCropRGBImageDecoder((job.size, job.size)), RandomHorizontalFlip()]
        label: List[Any] = [IntDecoder(), ToTensor(), Squeeze()]
        normalize = None
        if not job.uint8:
            np_dtype = {"float32": np.float32, "float16": np.float16}[job.dtype]
            normalize = NormalizeImage(255 * np.array(IMAGENET_MEAN), 255 * np.array(IMAGENET_STD), np_dtype)
        if cuda:
            image += [ToTensor(), ToDevice(device, non_blocking=True)]
            label.append(ToDevice(device, non_blocking=True))
            if normalize is not None:
                image += [ToTorchImage(channels_last=True), normalize]
        else:
            if normalize is not None:
                image.append(normalize)
            image.append(ToTensor())
            if normalize is not None:
                image.append(ToTorchImage(channels_last=True))
        n = len(job.labels)
        indices = np.tile(np.arange(n, dtype=np.uint64), max(1, -(-400 * job.batch_size // n)))
        beton = ensure_beton(job)
        self.detail = {"workers": job.workers, "beton": str(beton)}
        loader = Loader(str(beton), batch_size=job.batch_size, num_workers=job.workers, order=OrderOption.RANDOM,
                        drop_last=True, os_cache=True, seed=0, indices=indices,
                        pipelines={"image": image, "label": label})
        it = None
        try:
            while True:
                it = iter(loader)
                yield from it
        finally:
            if it is not None:
                it.close()  # stop FFCV's batch thread now


def ensure_beton(job: Job) -> Path:
    """FFCV's packed file of ``job.folder``, cached under ``job.cache_dir/ffcv``.

    Images are stored as JPEG (quality 90, no resizing: FFCV decodes them with
    libjpeg-turbo, as fastdata decodes the original files); labels as ints. Keyed by the
    folder's path and every file's name, size and mtime: a changed folder gets a new file.
    """
    import hashlib

    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from torchvision import datasets

    root = Path(job.folder)
    key = hashlib.sha256(str(root.resolve()).encode())
    for path_str, _ in datasets.ImageFolder(str(root)).samples:
        st = os.stat(path_str)
        key.update(f"{os.path.relpath(path_str, root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    cache = Path(job.cache_dir) if job.cache_dir is not None else Path.home() / ".cache" / "fastdata"
    path = cache / "ffcv" / f"{root.name}-{key.hexdigest()[:12]}.beton"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    job.log(f"packing {root} -> {path} (FFCV's DatasetWriter, once)")
    tmp = path.with_suffix(".tmp")
    writer = DatasetWriter(str(tmp), {"image": RGBImageField(write_mode="jpg", jpeg_quality=90),
                                      "label": IntField()}, num_workers=job.workers)
    writer.from_indexed_dataset(datasets.ImageFolder(str(root)))
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------
# GPU peers


class DALIContender:
    """NVIDIA DALI's own pipeline: file reader, fused ROI decode on the GPU
    (``decoders.image_random_crop``, device="mixed"), resize, flip + normalize."""

    name = "dali"
    label = "DALI (mixed decode)"

    def __init__(self) -> None:
        self.detail: Dict[str, Any] = {}

    def unavailable(self, job: Job) -> Optional[str]:
        return _gpu_files_reason(job, "nvidia.dali", "DALI's file reader needs")

    def batches(self, job: Job) -> Iterator[Batch]:
        import torch
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        dali_dtype = {"float32": types.FLOAT, "float16": types.FLOAT16}.get(job.dtype, types.FLOAT)
        device_id = torch.device(job.device).index or 0

        @pipeline_def(batch_size=job.batch_size, num_threads=job.workers, device_id=device_id, seed=0)
        def pipe() -> Any:
            jpegs, labels = fn.readers.file(files=job.paths, labels=job.labels, random_shuffle=True,
                                            name="Reader")
            images = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB)
            images = fn.resize(images, resize_x=job.size, resize_y=job.size)
            images = fn.crop_mirror_normalize(
                images, dtype=dali_dtype, output_layout="CHW",
                mean=[m * 255 for m in IMAGENET_MEAN], std=[s * 255 for s in IMAGENET_STD],
                mirror=fn.random.coin_flip())
            return images, labels.gpu()

        p = pipe()
        p.build()
        it = DALIGenericIterator([p], ["images", "labels"], reader_name="Reader", auto_reset=True)
        dtype = job.torch_dtype()
        self.detail = {"threads": job.workers}
        try:
            while True:
                for out in it:
                    yield out[0]["images"].to(dtype), out[0]["labels"].view(-1).long()
        finally:
            del it, p


class TorchvisionGPUContender:
    """torchvision's batched nvJPEG decode (``decode_jpeg(list, device="cuda")``), then
    torchvision's RandomResizedCrop + flip per image on the GPU and normalize. Files are
    read on the calling thread; images nvJPEG rejects (e.g. CMYK) are decoded on the CPU."""

    name = "nvjpeg"
    label = "torchvision GPU decode (nvJPEG)"

    def __init__(self) -> None:
        self.detail: Dict[str, Any] = {}

    def unavailable(self, job: Job) -> Optional[str]:
        return _gpu_files_reason(job, "torchvision")

    def batches(self, job: Job) -> Iterator[Batch]:
        import torch
        from torchvision.io import ImageReadMode, decode_image, decode_jpeg, read_file
        from torchvision.transforms import v2

        device, dtype = torch.device(job.device), job.torch_dtype()
        mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
        std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255
        rrc = v2.RandomResizedCrop(job.size, antialias=True)
        flip = v2.RandomHorizontalFlip()
        fallbacks = 0
        self.detail = {"cpu_fallbacks": 0}
        for idx in _shuffled_batches(len(job.paths), job.batch_size):
            datas = [read_file(job.paths[i]) for i in idx]
            try:
                decoded = decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)
            except RuntimeError:
                # One bad/unsupported image fails the batch call: redo it per image,
                # falling back to the CPU decoder for those nvJPEG rejects.
                decoded = []
                for d in datas:
                    try:
                        decoded.append(decode_jpeg(d, mode=ImageReadMode.RGB, device=device))
                    except RuntimeError:
                        fallbacks += 1
                        decoded.append(decode_image(d, mode=ImageReadMode.RGB).to(device))
                self.detail["cpu_fallbacks"] = fallbacks
            x = torch.stack([flip(rrc(img)) for img in decoded]).float()
            labels = torch.tensor([job.labels[i] for i in idx], device=device)
            yield ((x - mean) / std).to(dtype), labels


class EnginesContender:
    """nvImageCodec on the hardware JPEG engines, decode only: up to ``MAX_FILES`` of the files
    (an even sample) parsed into code streams once, up front, then each batch decoded as the
    ``gpu`` backend's stage 1 did it before 2026-12-03 (``HW_GPU_ONLY``, 4 host threads per
    instance, ``INSTANCES`` instances called at once on slices of the batch, each
    decoding into its images of the batch before; stored orientation, RGB), waited for on the
    GPU. On a set of one chroma subsampling (the 8,192 set) that was the backend's layout; on a
    mix of subsamplings the backend now gives each one instances of its own
    (``instances_by_code``), which decoded the demo mix 2.1x faster than slices of mixed rows
    (15,487 against 7,345 img/s, ``benchmarks/bench_engines.py``, H200), so there this row
    understates the engines. No
    reading, parsing, crop, resize or normalize in the loop: what the engines themselves
    deliver, the ceiling ``backend="gpu"`` is measured against. Yields a [k] tensor per batch, k = the images the engines decoded
    (those they refuse do not count)."""

    MAX_FILES = 8192  # held in memory: ~0.5 GB of ImageNet-like JPEGs
    # Fixed, so that the ceiling does not move with the backend's own layout: decode only, two
    # instances ran 24,045 img/s against one's 17,181 and three's 21,026 (H200, docs/results.md).
    INSTANCES = 2

    name = "engines"
    label = "nvImageCodec engines, decode only"

    def __init__(self) -> None:
        self.detail: Dict[str, Any] = {}

    def unavailable(self, job: Job) -> Optional[str]:
        return _gpu_files_reason(job, "nvidia.nvimgcodec")

    def batches(self, job: Job) -> Iterator[Batch]:
        from concurrent.futures import ThreadPoolExecutor

        import torch
        from nvidia import nvimgcodec

        from fastdata.decoders.nvimgcodec import ENGINE_KINDS, decode_slices

        device = torch.device(job.device)
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        streams = []
        step = max(1, -(-len(job.paths) // self.MAX_FILES))
        for path in job.paths[::step]:
            with open(path, "rb") as f:
                streams.append(nvimgcodec.CodeStream(f.read()))
        decoders = [nvimgcodec.Decoder(device_id=device.index, max_num_cpu_threads=4,
                                       backends=[nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, k))
                                                 for k in ENGINE_KINDS])
                    for _ in range(self.INSTANCES)]
        params = nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=nvimgcodec.ColorSpec.SRGB,
                                         sample_format=nvimgcodec.SampleFormat.I_RGB)
        if len(streams) < job.batch_size:
            raise ValueError(f"{len(streams)} images are fewer than one batch of {job.batch_size}")
        cuda_streams = [torch.cuda.Stream(device) for _ in decoders]
        consumer = torch.cuda.current_stream(device)

        # NVIDIA's own Python API at its fastest (docs/results.md, third pass): code streams parsed
        # before timing, and each instance decoding into its last batch's images (``images=``:
        # no allocation per image). The gpu backend decodes through fastdata's own call instead.
        spare: List[List[Any]] = [[] for _ in decoders]

        def decode(k: int, part: List[Any]) -> int:
            reuse = spare[k][:len(part)] + [None] * (len(part) - len(spare[k]))
            with torch.cuda.device(device):
                images = decoders[k].decode(part, images=reuse, params=params, cuda_stream=cuda_streams[k].cuda_stream)
            spare[k] = [img for img in images if img is not None]
            return sum(img is not None for img in images)

        refused = 0
        with ThreadPoolExecutor(len(decoders), thread_name_prefix="fastdata-gpu-decode") as pool:
            for idx in _shuffled_batches(len(streams), job.batch_size):
                batch = [streams[i] for i in idx]
                calls = [pool.submit(decode, k, batch[lo:hi]) for k, (lo, hi) in
                         enumerate(decode_slices(len(batch), len(decoders)))]
                decoded = sum(call.result() for call in calls)
                for stream in cuda_streams:  # the consumer's stream sees the images complete
                    consumer.wait_stream(stream)
                refused += len(batch) - decoded
                self.detail["refused"] = refused
                yield torch.empty(decoded, device=device), torch.empty(decoded, device=device)


def make_contender(name: str) -> Any:
    """The contender registered under ``name`` (see CONTENDERS)."""
    factories: Dict[str, Callable[[], Any]] = {
        "dataloader": DataLoaderContender,
        "simd": lambda: DataLoaderContender(require_simd=True),
        "fastdata": lambda: FastdataContender("files"),
        "lmdb": lambda: FastdataContender("lmdb"),
        "shards": lambda: FastdataContender("shards"),
        "shards-cache": lambda: FastdataContender("shards", shard_cache=True,
                                                  label="fastdata (shards + cache)"),
        "webdataset": WebDatasetContender,
        "ram": lambda: FastdataContender("ram"),
        "ffcv": FFCVContender,
        "fastdata-dali": lambda: FastdataContender("files", backend="dali"),
        "fastdata-nvjpeg": lambda: FastdataContender("files", backend="nvjpeg"),
        "fastdata-gpu": lambda: FastdataContender("files", backend="gpu", threads=2),
        "fastdata-hybrid": lambda: FastdataContender("files", backend="hybrid"),
        "dali": DALIContender,
        "nvjpeg": TorchvisionGPUContender,
        "engines": EnginesContender,
    }
    if name not in factories:
        raise ValueError(f"unknown contender {name!r}; choose from {', '.join(CONTENDERS)}")
    c = factories[name]()
    c.name = name
    return c


CONTENDERS = ("dataloader", "simd", "fastdata", "lmdb", "ram", "shards", "shards-cache", "webdataset", "ffcv",
              "fastdata-dali", "fastdata-nvjpeg", "fastdata-gpu", "fastdata-hybrid", "dali", "nvjpeg", "engines")
