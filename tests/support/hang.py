"""Run a call that may block on a named pipe: its result, or a test failure (never a hung suite)."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest


def within(seconds: float, fn, *args):
    """fn(*args), or a failure when it blocks; a pipe it waits on (an argument, or a folder's manifest.json) is
    then opened for writing to free the thread."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as error:  # handed to the test thread
            out["error"] = error

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for a in args:
            if isinstance(a, (str, Path)):
                p = Path(a) / "manifest.json" if Path(a).is_dir() else Path(a)
                if p.is_fifo():
                    with contextlib.suppress(OSError):
                        os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"{getattr(fn, '__name__', fn)} blocked on {args}")
    if "error" in out:
        raise out["error"]
    return out.get("value")
