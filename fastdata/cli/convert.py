"""``fastdata-convert SRC DST``: pack an image dataset into a crash-safe LMDB cache.

SRC is an ImageFolder tree (torchvision semantics) or a ``path,label`` list file; DST is
an LMDB directory in the format defined by :mod:`fastdata.cache.format`. The work is
:func:`fastdata.cache.build.writer.convert`; this module only parses arguments and reports.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Optional, Sequence

from ..cache import format as cf
from ..cache.errors import ConvertError
from ..cache.build.records import DEFAULT_QUALITY
from ..cache.build.ordered_pool import processed_in_order
from ..cache.build.scan import scan
from ..cache.build.writer import DEFAULT_BATCH, convert, worker_count

__all__ = ["ConvertError", "convert", "convert_tar", "main"]  # convert and ConvertError: for callers of the old module


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fastdata-convert",
        description="Pack an ImageFolder tree or a 'path,label' list file into a crash-safe LMDB cache.",
    )
    p.add_argument("src", metavar="SRC", help="ImageFolder root, or a text file of 'path,label' lines")
    p.add_argument("dst", metavar="DST", help="LMDB directory to create")
    p.add_argument("--max-side", type=int, default=None, metavar="N",
                   help="shrink images whose longer side exceeds N (re-encoded as baseline 4:2:0 JPEG); "
                        "non-JPEG inputs are re-encoded too")
    p.add_argument("--quality", type=int, default=DEFAULT_QUALITY, metavar="Q", help="JPEG quality for re-encoded images")
    p.add_argument("--keep-progressive", action="store_true",
                   help="store progressive JPEGs as they are; by default every grayscale/YCbCr/RGB JPEG is "
                        "rewritten losslessly as baseline with restart markers and a restart index (same DCT "
                        "coefficients, identical decoded pixels, EXIF/ICC kept) so crops entropy-decode only "
                        "the restart intervals they need")
    p.add_argument("--workers", type=int, default=None, metavar="N", help="processes (default: all usable cores)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted conversion into DST")
    p.add_argument("--on-error", choices=("skip", "raise"), default="raise",
                   help="bad input files: stop naming the file (raise, default) or leave them out and list them (skip)")
    p.add_argument("--verify", action="store_true", help="re-read and check every record after writing")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH, metavar="N", help="records per write transaction")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--format", choices=("lmdb", "tar"), default="lmdb",
                   help="lmdb: one LMDB cache (default); tar: WebDataset tar shards plus index.json "
                        "(fastdata.TarShards; docs/shards.md), in a seeded random order")
    p.add_argument("--shard-size", default="1GB", metavar="SIZE", help="tar: largest shard (default 1GB)")
    p.add_argument("--seed", type=int, default=0, help="tar: seed of the order samples are written in")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    import lmdb

    args = _parser().parse_args(argv)
    if args.format == "tar":
        return _main_tar(args)
    if args.workers is not None and args.workers > 0 and not args.quiet and worker_count(args.workers) < args.workers:
        print(f"fastdata-convert: --workers {args.workers} is more than the {worker_count(None)} usable cores; "
              f"using {worker_count(None)}", file=sys.stderr)
    try:
        summary = convert(
            args.src, args.dst, max_side=args.max_side, quality=args.quality,
            keep_progressive=args.keep_progressive, workers=args.workers,
            resume=args.resume, on_error=args.on_error, verify=args.verify, batch_size=args.batch_size,
            progress=None if args.quiet else sys.stderr,
        )
    except (ConvertError, cf.CacheFormatError, ValueError, OSError, lmdb.Error) as exc:
        print(f"fastdata-convert: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fastdata-convert: interrupted; continue with --resume", file=sys.stderr)
        return 130
    if summary.already_complete:
        print(f"fastdata-convert: {args.dst} is already complete ({summary.written} images)", file=sys.stderr)
    else:
        print(summary.text(), file=sys.stderr)
    return 0


def convert_tar(src: str, dst: str, *, shard_size: int, max_side: Optional[int] = None,
                quality: int = DEFAULT_QUALITY, keep_progressive: bool = False, workers: Optional[int] = None,
                on_error: str = "raise", seed: int = 0) -> Any:
    """``fastdata-convert SRC DST --format tar``: SRC (ImageFolder or list file) as WebDataset
    tar shards plus ``index.json`` in DST (fastdata.cli.shard_writer), each image stored as the
    LMDB writer stores it, in a seeded random order. Returns a ShardWriterSummary."""
    from .shard_writer import write_order, write_shards

    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    plan = scan(src)
    todo = [(int(pos), plan.abspath(int(pos))) for pos in write_order(len(plan.items), seed)]
    results = ((r[0], r[1], r[2]) for r in processed_in_order(todo, worker_count(workers), max_side, quality,
                                                               keep_progressive))
    try:
        return write_shards(dst, results, plan.items, plan.classes, shard_size, on_error)
    except ValueError as e:
        raise ConvertError(str(e)) from None


def _main_tar(args: argparse.Namespace) -> int:
    from ..sources.tar_shards import parse_size

    if args.resume or args.verify:
        print("fastdata-convert: error: --resume and --verify are for --format lmdb", file=sys.stderr)
        return 1
    try:
        summary = convert_tar(args.src, args.dst, shard_size=parse_size(args.shard_size), max_side=args.max_side,
                              quality=args.quality, keep_progressive=args.keep_progressive, workers=args.workers,
                              on_error=args.on_error, seed=args.seed)
    except (ConvertError, ValueError, OSError) as exc:
        print(f"fastdata-convert: error: {exc}", file=sys.stderr)
        return 1
    if not args.quiet or summary.skipped:
        print(summary.text(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
