"""Typed stub of fastdata._C, the native core (csrc/bindings/).

Kept in step with the extension by tests/package/test_c_stub.py: every name, class, method and
property registered in C++ appears here and nothing else does, with the same parameters
(names, order, keyword-only markers, defaults) and the same scalar and bound-class types.
Arguments are converted with the GIL held; the work runs with the GIL released.
"""
from collections.abc import Sequence
from typing import Any, ClassVar, Optional, Union

import numpy as np
import numpy.typing as npt

# Anything exposing a contiguous buffer: bytes, bytearray, memoryview, numpy uint8 arrays.
_Buffer = Any
# Sample i of a batch: a file path (read on a native thread) or an encoded buffer.
_Item = Union[str, _Buffer]

class NativeDecodeError(ValueError):
    """Corrupt or unsupported JPEG data (libjpeg's message); fastdata.decode re-raises it as
    fastdata.DecodeError."""

class TransformKind:
    """Which crop a TransformSpec describes."""

    RANDOM_RESIZED_CROP: ClassVar[TransformKind]
    CENTER_CROP: ClassVar[TransformKind]
    FULL: ClassVar[TransformKind]
    __members__: ClassVar[dict[str, TransformKind]]
    def __init__(self, value: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __int__(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class SampleStatus:
    """Outcome of one sample of a batch (csrc/core/engine.h)."""

    OK: ClassVar[SampleStatus]
    NOT_JPEG: ClassVar[SampleStatus]  # left untouched for the caller's fallback decoder
    DECODE_ERROR: ClassVar[SampleStatus]  # corrupt or unsupported data; the row is zero-filled
    READ_ERROR: ClassVar[SampleStatus]  # the file could not be read; the row is zero-filled
    INTERNAL: ClassVar[SampleStatus]  # a bug or out of memory; the row is zero-filled
    __members__: ClassVar[dict[str, SampleStatus]]
    def __init__(self, value: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __int__(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class TransformSpec:
    """What the engine does to each sample. Immutable; every field is validated on
    construction (ValueError): out_h, out_w in 1..16384; 0 < scale_lo <= scale_hi;
    0 < ratio_lo <= ratio_hi; 0 <= hflip <= 1; resize_to >= 1."""

    def __init__(self, *, kind: TransformKind, out_h: int, out_w: int, scale_lo: float = 0.08,
                 scale_hi: float = 1.0, ratio_lo: float = 0.75, ratio_hi: float = 1.3333333333333333,
                 hflip: float = 0.5, resize_to: int = 256, roi: bool = True) -> None: ...
    @property
    def kind(self) -> TransformKind: ...
    @property
    def out_h(self) -> int: ...
    @property
    def out_w(self) -> int: ...
    @property
    def scale_lo(self) -> float: ...
    @property
    def scale_hi(self) -> float: ...
    @property
    def ratio_lo(self) -> float: ...
    @property
    def ratio_hi(self) -> float: ...
    @property
    def hflip(self) -> float: ...
    @property
    def resize_to(self) -> int:
        """CenterCrop: the shorter side before the crop."""
    @property
    def roi(self) -> bool:
        """Decode only the crop's region, DCT-scaled where it can (off only to measure it)."""
    def __repr__(self) -> str: ...

class SampleFailure:
    """A sample the native pass did not write: its row in the batch, why, and the message."""

    @property
    def row(self) -> int: ...
    @property
    def status(self) -> SampleStatus: ...
    @property
    def message(self) -> str: ...
    @property
    def file_bytes(self) -> Optional[npt.NDArray[np.uint8]]:
        """NOT_JPEG from a path: the bytes the engine read (for the fallback), else None."""
    def __repr__(self) -> str: ...

class BatchReport:
    """What Engine.run did. Times are summed over native threads."""

    @property
    def failures(self) -> list[SampleFailure]:
        """In row order; NOT_JPEG rows are untouched, the others zero-filled."""
    @property
    def warnings(self) -> int:
        """libjpeg corrupt-data warnings over the batch (non-strict decodes)."""
    @property
    def read_seconds(self) -> float: ...
    @property
    def decode_seconds(self) -> float: ...
    @property
    def wall_seconds(self) -> float:
        """The run's own duration (for a started run: its share of the time the native threads
        had started runs to work on, overlaps counted once; see BatchTimes in csrc/core/engine.h)."""

class PendingRun:
    """A queued Engine.run (Engine.start_run). Keeps the items' buffers and out alive until
    the run has finished; dropped unwaited, it waits for the run first."""

    def done(self) -> bool: ...
    def wait(self) -> BatchReport:
        """Wait (GIL released) and return the run's report. Once only."""

# The names of CropPlan.subsamplings' codes: "other", "gray", "4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:1:1".
SUBSAMPLING_NAMES: tuple[str, ...]

class CropPlan:
    """Where each sample's output comes from (Engine.plan); failed rows keep zeros."""

    @property
    def boxes(self) -> npt.NDArray[np.float64]:
        """[N, 4]: x0, y0, x1, y1 in EXIF-oriented pixels."""
    @property
    def flips(self) -> npt.NDArray[np.bool_]:
        """[N]"""
    @property
    def sizes(self) -> npt.NDArray[np.int32]:
        """[N, 2]: oriented height, width."""
    @property
    def orientations(self) -> npt.NDArray[np.int32]:
        """[N]: EXIF orientation 1..8."""
    @property
    def components(self) -> npt.NDArray[np.int32]:
        """[N]: colour components in the header (1, 3, or 4 for CMYK/YCCK)."""
    @property
    def precisions(self) -> npt.NDArray[np.int32]:
        """[N]: bits per sample in the header."""
    @property
    def arithmetic(self) -> npt.NDArray[np.bool_]:
        """[N]: arithmetic-coded entropy data instead of Huffman."""
    @property
    def progressive(self) -> npt.NDArray[np.bool_]:
        """[N]: multi-scan (progressive) entropy data."""
    @property
    def subsamplings(self) -> npt.NDArray[np.int32]:
        """[N]: chroma subsampling, an index into SUBSAMPLING_NAMES."""
    @property
    def rgb_coded(self) -> npt.NDArray[np.bool_]:
        """[N]: three components libjpeg reads as RGB, not YCbCr."""
    @property
    def failures(self) -> list[SampleFailure]: ...

IDLE_PRIORITY: int  # Engine's nice_increment that asks for SCHED_IDLE

class Engine:
    """A pool of native threads (the caller counts as one). Destroying it joins the threads
    with the GIL released. nice_increment: nice steps below the creator (0..19), or
    IDLE_PRIORITY for SCHED_IDLE (nice 19 where that is refused, counted in priority_lowered)."""

    def __init__(self, threads: int, nice_increment: int = 0, thread_name: str = "fastdata-native") -> None: ...
    @property
    def threads(self) -> int: ...
    @property
    def priority_lowered(self) -> bool:
        """False when a native thread could not lower its priority as nice_increment asked."""
    def run(self, items: Sequence[_Item], spec: TransformSpec, out: npt.NDArray[Any], seed: int, epoch: int,
            indices: Optional[npt.ArrayLike], strict: bool, max_pixels: int, max_file_bytes: int,
            scale_bias: Optional[tuple[Sequence[float], Sequence[float]]] = None) -> BatchReport:
        """Decode + transform items[i] into out[i] (uint8 [N, H, W, 3], or with scale_bias
        float32, float16 or uint16 holding bfloat16 bits); never raises for bad data:
        failures are in the report."""
    def start_run(self, items: Sequence[_Item], spec: TransformSpec, out: npt.NDArray[Any], seed: int, epoch: int,
                  indices: Optional[npt.ArrayLike], strict: bool, max_pixels: int, max_file_bytes: int,
                  scale_bias: Optional[tuple[Sequence[float], Sequence[float]]] = None) -> PendingRun:
        """run, started on the engine's threads: its rows are claimed once those of the runs
        started before it all are (no barrier between runs), and it finishes after them;
        returns at once. out must not be touched before wait() returns."""
    def plan(self, items: Sequence[_Item], spec: TransformSpec, seed: int, epoch: int,
             indices: Optional[npt.ArrayLike], max_pixels: int, max_file_bytes: int) -> CropPlan: ...
    def read_files(self, paths: Sequence[str],
                   max_file_bytes: int) -> tuple[list[npt.NDArray[np.uint8]], list[Optional[str]]]: ...
    def transform_pixels(self, pixels: npt.NDArray[np.uint8], spec: TransformSpec, out: npt.NDArray[Any], row: int,
                         seed: int, epoch: int, index: int,
                         scale_bias: Optional[tuple[Sequence[float], Sequence[float]]] = None) -> None: ...

def probe(data: _Buffer) -> dict[str, Any]:
    """width, height, oriented_width, oriented_height, color_space, subsampling, progressive,
    orientation, components, restart_indexed."""

def decode_full(data: _Buffer, strict: bool, max_pixels: int) -> tuple[npt.NDArray[np.uint8], int]:
    """(uint8 [H, W, 3] RGB after EXIF orientation, libjpeg warnings)."""

def jpeg_info() -> dict[str, Any]:
    """libjpeg_turbo_version, simd_disabled_by_env."""

def read_file(path: str, max_file_bytes: int) -> tuple[npt.NDArray[np.uint8], Optional[str]]:
    """A whole regular file as the engine reads it: (bytes, None), or (empty array, the reason)."""

def sample_crop_boxes(height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float], hflip: float,
                      seed: int, epoch: int, indices: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """[N, 5] = (top, left, height, width, flip)."""

def axis_filters(start: npt.ArrayLike, scale: npt.ArrayLike, lo: npt.ArrayLike, hi: npt.ArrayLike, out: int,
                 reverse: npt.ArrayLike, cache: bool = True) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int16],
                                                                      npt.NDArray[np.int64], npt.NDArray[np.int64],
                                                                      npt.NDArray[np.int64]]:
    """The native resize filter of one axis for a batch (the GPU resampler's tables); cache:
    reuse filters of earlier calls with the same window length, origin, scale and flip."""

def _set_claim_largest_first(enabled: bool) -> bool:
    """Testing/A-B switch for the engine's claim order; returns the previous setting."""

def _set_overlap_runs(enabled: bool) -> bool:
    """Testing/A-B switch: started runs overlap (default) or wait for the one before; returns the previous setting."""

def _overlap_runs() -> bool:
    """Whether started runs overlap (_set_overlap_runs)."""

def _half_bits(values: npt.ArrayLike, bfloat16: bool) -> npt.NDArray[np.uint16]:
    """Testing: float16 (or bfloat16) bits of float32 values (uint16), by the normalize path's portable rounding."""

def _claim_order(sizes: Sequence[int], is_path: Sequence[bool]) -> list[int]:
    """Testing: the order Engine::run's threads take rows of these encoded sizes in."""

def axis_filter_cache_size() -> int:
    """How many filters axis_filters holds for reuse."""

def clear_axis_filter_cache() -> None:
    """Drops every filter axis_filters kept."""

class NvImageCodecInstance:
    """An nvImageCodec instance (its codec extensions loaded); NvImageCodecBatch decoders are made on it."""
    def __init__(self, library: str) -> None: ...
    @property
    def library_version(self) -> int: ...
    @property
    def create_seconds(self) -> float: ...

class NvImageCodecBatch:
    """One nvImageCodec decoder, made on an instance; decodes a batch slice into one buffer, GIL released."""
    def __init__(self, instance: NvImageCodecInstance, device_id: int | None, max_cpu_threads: int,
                 backend_kinds: Sequence[int], options: str) -> None: ...
    def decode(self, datas: Sequence[_Buffer], out: int, out_bytes: int, offsets: npt.ArrayLike,
               heights: npt.ArrayLike, widths: npt.ArrayLike, cuda_stream: int) -> npt.NDArray[np.uint8]: ...
    @property
    def host_buffers(self) -> bool: ...
    @property
    def instance(self) -> NvImageCodecInstance: ...
    @property
    def create_seconds(self) -> float: ...

def transcode_to_baseline(data: _Buffer, max_pixels: int) -> bytes: ...
def transcode_restart_indexed(data: _Buffer, max_pixels: int, interval_mcus: int, index_stride: int = 8) -> bytes: ...
def entropy_floor(datas: list[_Buffer], spec: TransformSpec, seed: int, epoch: int) -> None: ...
def plain_decode(datas: list[_Buffer]) -> None: ...
def _set_fast_huffman(enabled: bool) -> bool: ...
def _fast_huffman_scans() -> int: ...
def _fast_progressive_scans() -> int: ...
def _set_fast_progressive(enabled: bool) -> bool: ...
def _encode_progressive(pixels: npt.ArrayLike, quality: int, scans: Sequence[tuple[Sequence[int], int, int, int, int]],
                        restart_interval: int = 0) -> bytes: ...
def _restart_index_jumps() -> int: ...
def _decode_region(data: _Buffer, denom: int, x0: int, y0: int, x1: int, y1: int,
                   strict: bool) -> tuple[npt.NDArray[np.uint8], int]: ...
