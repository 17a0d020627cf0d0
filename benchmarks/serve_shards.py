"""Serve a folder over HTTP on 127.0.0.1 with Range support (what fastdata.TarShards and
object stores need; ``python -m http.server`` ignores Range), for shard benchmarks.

    python benchmarks/serve_shards.py FOLDER [--port 8765]
"""
from __future__ import annotations

import argparse
import os
import re
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer


class RangeHandler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms stalls

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        path = self.translate_path(self.path)
        if m is None or not os.path.isfile(path):
            return super().do_GET()
        size = os.path.getsize(path)
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
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        with open(path, "rb") as f:  # zero-copy, as nginx and object stores serve files
            self.wfile.flush()
            self.connection.sendfile(f, offset=start, count=end - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--port", type=int, default=8765)
    args = p.parse_args()
    os.chdir(args.folder)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), RangeHandler)
    server.daemon_threads = True
    print(f"serving {os.getcwd()} at http://127.0.0.1:{args.port}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
