"""A real `tfc serve` process on 127.0.0.1 for tests: started, waited for, stopped; bounded in time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tfc.runtime.parallel.ports import free_port

from tfc import settings


class ServerProcess:
    """`tfc serve IMAGE` in a child process; `url`, `get`, `stop`; the log is kept for failures."""

    def __init__(
        self,
        image: str | Path,
        *args: str,
        env: dict | None = None,
        log: Path | None = None,
        device: str | None = None,
        ready_s: float = 90.0,
        command: list[str] | None = None,
    ):
        device = device or settings.get("TFC_TEST_SERVE_DEVICE")  # cuda: the fast forward (GPU runs)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready_s = ready_s  # how long `with` waits for /health
        self.log_path = log
        full_env = {**os.environ, **(env or {})}
        cmd = [
            *(command or [sys.executable, "-m", "tfc"]),  # command: what runs in place of `python -m tfc`
            "serve",
            str(image),
            "--port",
            str(self.port),
            "--device",
            device,
            *args,
        ]
        self._log = open(log, "w+") if log else subprocess.DEVNULL  # noqa: SIM115
        # cwd outside the checkout: `python -m tfc` there would find the source folder tfc/ before the install
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=tempfile.gettempdir()
        )

    def wait_ready(self, timeout: float = 90.0) -> ServerProcess:
        """Block until /health says ready (or fail with the log)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"tfc serve exited with {self.proc.returncode}: {self.output()}")
            try:
                status, _body, _ = self.get("/health")
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"tfc serve was not ready within {timeout} s: {self.output()}")

    def get(self, path: str, headers: dict | None = None) -> tuple[int, dict | str, dict]:
        """(status, JSON body or text, headers) of a GET."""
        return self.request("GET", path, None, headers)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict | None = None,
        headers: dict | None = None,
        timeout: float = 30,
    ):
        """(status, JSON body or text, headers) of one HTTP request."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        if isinstance(body, dict):
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, _parse(r.read()), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, _parse(e.read()), dict(e.headers)

    def rss_kib(self) -> int:
        """The server process's resident memory."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def signal(self, sig: int = signal.SIGTERM) -> None:
        """Send a signal to the server."""
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait, return the exit code (killed if it does not stop in time)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if hasattr(self._log, "close"):
            self._log.close()
        return self.proc.returncode

    def output(self) -> str:
        """What the server printed so far."""
        if hasattr(self._log, "seek"):
            self._log.flush()
            self._log.seek(0)
            return self._log.read()[-4000:]
        return ""

    def __enter__(self) -> ServerProcess:
        try:
            return self.wait_ready(self.ready_s)
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def _parse(raw: bytes) -> dict | str:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
