#!/usr/bin/env python3
"""A broken server, for the tests of what the server engines do when a server misbehaves (we
cannot make a real llama-server misbehave on demand). It listens on the `--port P` of its argv,
so it can stand in for llama-server (as the engine's binary) or for any OpenAI server (in a
command template). FAKE_SERVER_MODE says how it is broken:

unhealthy        GET /health answers 503 forever
garbage          every connection gets bytes that are not HTTP
ignore-term      healthy, and ignores SIGTERM
spawn-child      healthy, and starts a `sleep` child whose pid it writes to FAKE_CHILD_PID_FILE
llama-no-timings llama-server's endpoints, but the stream's final event has no timings
llama-garbage    llama-server's endpoints, but /completion streams an event that is not JSON
openai-no-usage  an OpenAI server whose stream carries no usage
openai-short     an OpenAI server that stops after 2 tokens with finish_reason "stop"
"""

import json
import os
import signal
import socket
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = os.environ.get("FAKE_SERVER_MODE", "")
PORT = int(sys.argv[sys.argv.index("--port") + 1])


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        print(self.requestline, flush=True)

    def reply(self, status: int, body) -> None:
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def events(self, events: list) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for event in events:
            data = event if isinstance(event, bytes) else json.dumps(event).encode()
            self.wfile.write(b"data: " + data + b"\n\n")
            self.wfile.flush()

    def do_GET(self):
        if self.path == "/health":
            self.reply(503 if MODE == "unhealthy" else 200, {"status": "loading" if MODE == "unhealthy" else "ok"})
        elif self.path == "/metrics":
            self.reply(200, b"llamacpp:spec_decode_num_drafts_total 0\n")
        elif self.path == "/v1/models":
            self.reply(200, {"data": [{"id": "fake"}]})
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            self.reply(200, {"tokens": [1, 2, 3]})
        elif self.path == "/completion":
            n = body["n_predict"]
            tokens = [{"tokens": [7], "tokens_predicted": i + 1, "stop": False} for i in range(n)]
            if MODE == "llama-garbage":
                self.events([b"this is not json"])
            else:
                self.events([*tokens, {"tokens": [], "tokens_predicted": n, "stop": True, "stop_type": "limit"}])
        elif self.path == "/v1/completions":
            if not body.get("stream"):
                self.reply(200, {"choices": [{"text": "x", "index": 0, "finish_reason": "length"}]})
                return
            n = 2 if MODE == "openai-short" else body["max_tokens"]
            events = [{"choices": [{"text": "x", "index": 0, "finish_reason": None}]} for _ in range(n)]
            usage = {"completion_tokens": n, "prompt_tokens": 3}
            done = {"choices": [], "usage": usage} if MODE != "openai-no-usage" else {"choices": []}
            last = {
                "choices": [{"text": "", "index": 0, "finish_reason": "stop" if n < body["max_tokens"] else "length"}]
            }
            self.events([*events, last, done, b"[DONE]"])
        else:
            self.reply(404, {"error": "not found"})


def garbage() -> None:
    with socket.create_server(("127.0.0.1", PORT)) as server:
        while True:
            conn, _ = server.accept()
            conn.recv(65536)
            conn.sendall(b"this is not HTTP at all\r\n\r\n")
            conn.close()


if __name__ == "__main__":
    print(f"fake server ({MODE}) on port {PORT}: {sys.argv}", flush=True)
    if MODE == "ignore-term":
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
    if MODE == "spawn-child":
        child = subprocess.Popen(["sleep", "300"])
        with open(os.environ["FAKE_CHILD_PID_FILE"], "w") as f:
            f.write(str(child.pid))
    if MODE == "garbage":
        garbage()
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
