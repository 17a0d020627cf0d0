"""Test helpers for tar shards: WebDataset-layout shards whose labels are the samples'
global indices, and a real HTTP server on 127.0.0.1 (stdlib ThreadingHTTPServer) with
Range support and injectable faults (connections dropped mid-body)."""
from __future__ import annotations

import io
import os
import re
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, List, Optional

from PIL import Image


def sample_jpeg(i: int, size: int = 24) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size + i % 7, size), ((37 * i) % 256, (11 * i) % 256, 255 - i % 256)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def write_shards(folder: Path, counts: List[int], prefix: str = "train", json_every: int = 0) -> List[Path]:
    """Shards ``prefix-000000.tar`` ... holding samples ``s{i:06d}.jpg`` + ``.cls`` (label i,
    the global index); every ``json_every``-th sample has its label in ``.json`` instead."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, i = [], 0
    for s, n in enumerate(counts):
        path = folder / f"{prefix}-{s:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for _ in range(n):
                key = f"s{i:06d}"
                _add(tar, f"{key}.jpg", sample_jpeg(i))
                if json_every and i % json_every == 0:
                    _add(tar, f"{key}.json", b'{"label": %d}' % i)
                else:
                    _add(tar, f"{key}.cls", b"%d" % i)
                i += 1
        paths.append(path)
    return paths


class ShardServer:
    """Serves ``root`` at ``url`` over HTTP/1.1 with ``Range``; ``drop_every=k`` cuts every
    k-th body after half its bytes and closes the connection (Content-Length promised in full)."""

    def __init__(self, root: Path, drop_every: int = 0):
        self.root = Path(root)
        self.drop_every = drop_every
        self.requests = 0
        self.dropped = 0
        self.bytes_sent = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms stalls

            def log_message(self, *args: object) -> None:
                pass

            def _file(self) -> Optional[Path]:
                path = (server.root / self.path.lstrip("/").split("?")[0]).resolve()
                if server.root.resolve() not in path.parents or not path.is_file():
                    self.send_error(404)
                    return None
                return path

            def do_HEAD(self) -> None:
                path = self._file()
                if path is None:
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(path.stat().st_size))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()

            def do_GET(self) -> None:
                path = self._file()
                if path is None:
                    return
                size = path.stat().st_size
                start, end = 0, size
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                with server._lock:
                    server.requests += 1
                    drop = server.drop_every and server.requests % server.drop_every == 0
                if m:
                    start = int(m.group(1))
                    end = min(size, int(m.group(2)) + 1) if m.group(2) else size
                    if start >= size:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(end - start))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                with open(path, "rb") as f:
                    f.seek(start)
                    body = f.read(end - start)
                if drop and len(body) > 1:
                    self.wfile.write(body[:len(body) // 2])
                    self.wfile.flush()
                    with server._lock:
                        server.dropped += 1
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body)
                with server._lock:
                    server.bytes_sent += len(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()

    def __enter__(self) -> "ShardServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
