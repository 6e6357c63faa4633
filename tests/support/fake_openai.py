"""A tiny scripted OpenAI-style server on 127.0.0.1 for load-generator tests: one thread, replies chosen by
prompt or by a failure pattern, streamed frame by frame with set pauses."""

from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAUSE_S = 0.05  # "slow" mode: before the first token and between tokens


class FakeOpenAI(ThreadingHTTPServer):
    """`url`; `fail_every` k makes every k-th completion request answer HTTP 500 (1: all); `key` requires a key."""

    daemon_threads = True

    def __init__(self, fail_every: int = 0, key: str | None = None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fail_every = fail_every
        self.key = key
        self.count = itertools.count(1)
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> FakeOpenAI:
        threading.Thread(target=self.serve_forever, args=(0.02,), daemon=True).start()  # quick shutdown
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: FakeOpenAI
    disable_nagle_algorithm = True  # each frame leaves when written, so the client sees the scripted pauses

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _authorised(self) -> bool:
        if self.server.key and self.headers.get("Authorization") != f"Bearer {self.server.key}":
            self._json(401, {"error": {"message": "bad key"}})
            return False
        return True

    def do_GET(self) -> None:
        if not self._authorised():
            return
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "no such route"}})

    def do_POST(self) -> None:
        if not self._authorised():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.bodies.append(body)
            n = next(self.server.count)
        chat = self.path == "/v1/chat/completions"
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        if (self.server.fail_every and n % self.server.fail_every == 0) or prompt == "http-500":
            self._json(500, {"error": {"message": f"scripted failure {n}"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        self._stream(prompt, chat)

    def _send(self, frame: dict | str, pause: float = 0.0) -> None:
        time.sleep(pause)
        data = frame if isinstance(frame, str) else json.dumps(frame)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def _stream(self, mode: str, chat: bool) -> None:
        def chunk(text: str, finish: str | None = None) -> dict:
            choice = {"delta": {"content": text} if text else {}} if chat else {"text": text}
            return {"object": "chunk", "choices": [{"index": 0, "finish_reason": finish, **choice}]}

        pause = PAUSE_S if mode == "slow" else 0.0
        self.wfile.write(b": keepalive\n\n")
        if chat:
            self._send(
                {"object": "chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            )
        for i, text in enumerate(("a", "b", "c")):
            self._send(chunk(text), pause)
            if mode == "stream-error" and i == 0:
                self._send({"error": {"message": "generation failed", "type": "server_error"}})
                self._send("[DONE]")
                return
            if mode == "cut" and i == 0:
                return
        self._send(chunk("", "length"))
        if mode != "no-usage":
            self._send(
                {"object": "chunk", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 5}}
            )
        self._send("[DONE]")
