"""The three processes of a session for the group tests, started one by one and talking to each
other: ``front PORT MIDDLE_PORT`` answers ``GET /`` over HTTP by asking the middle over one
localhost TCP connection kept open; ``middle PORT REQ RESP`` asks the back through two named
pipes; ``back REQ RESP`` holds 20 MiB of state. Each counts the requests it saw, and the answer
carries every count and the back's checksum."""
import hashlib
import http.server
import json
import os
import socket
import sys
import time

role = sys.argv[1]


def hello(**extra: object) -> None:
    print(json.dumps({"role": role, "pid": os.getpid(), **extra}), flush=True)


if role == "back":
    state = bytearray(os.urandom(1 << 20)) * 20
    checksum = hashlib.sha256(state).hexdigest()
    hello(checksum=checksum)
    with open(sys.argv[2]) as requests, open(sys.argv[3], "w") as answers:
        for n, _ in enumerate(requests, 1):
            answers.write(json.dumps({"back": n, "checksum": hashlib.sha256(state).hexdigest()}) + "\n")
            answers.flush()
elif role == "middle":
    listener = socket.create_server(("127.0.0.1", int(sys.argv[2])))
    hello()
    with open(sys.argv[3], "w") as requests, open(sys.argv[4]) as answers:
        conn, _ = listener.accept()
        with conn, conn.makefile("rw") as front:
            for n, _ in enumerate(front, 1):
                requests.write("ask\n")
                requests.flush()
                front.write(json.dumps({"middle": n, **json.loads(answers.readline())}) + "\n")
                front.flush()
else:
    port, middle_port = int(sys.argv[2]), int(sys.argv[3])
    while True:
        try:
            middle = socket.create_connection(("127.0.0.1", middle_port)).makefile("rw")
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    count = {"n": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            middle.write("ask\n")
            middle.flush()
            count["n"] += 1
            body = json.dumps({"front": count["n"], **json.loads(middle.readline())}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    hello()
    server.serve_forever()
