"""An HTTP agent for the pause/wake tests: holds MB mebibytes of state and answers
``GET /`` with a counter it keeps, a checksum of its state and its PID in its namespace;
``GET /?s=N`` computes for N seconds before answering. A third argument: a file it keeps open."""
import hashlib
import http.server
import json
import os
import sys
import time
import urllib.parse

PORT, MB = int(sys.argv[1]), int(sys.argv[2])
state = bytearray(os.urandom(1 << 20)) * MB
counter = {"n": 0}
digest = hashlib.sha256(state).hexdigest()
kept = open(sys.argv[3], "a") if len(sys.argv) > 3 else None  # noqa: SIM115 - open for the process's life


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        url = urllib.parse.urlparse(self.path)
        seconds = float(urllib.parse.parse_qs(url.query).get("s", ["0"])[0])
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            hashlib.sha256(state[: 1 << 20]).digest()
        counter["n"] += 1
        body = json.dumps({"counter": counter["n"], "checksum": hashlib.sha256(state).hexdigest(),
                           "pid": os.getpid()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print(json.dumps({"port": PORT, "checksum": digest}), flush=True)
server.serve_forever()
