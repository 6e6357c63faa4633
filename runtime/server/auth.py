"""API keys: from options, the TFC_API_KEY setting (comma-separated) or a key file (mode 0600); SHA-256 digests
only."""

from __future__ import annotations

import hashlib
import hmac
import stat
from collections.abc import Iterable
from pathlib import Path

from tfc import settings
from tfc.errors import TfcError


class KeyFileError(TfcError):
    """A key file that cannot be used (missing, readable by others, empty)."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    """The accepted keys, kept as digests; `allows(header_value)` compares in constant time."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [_digest(k) for k in keys if k]

    @property
    def enabled(self) -> bool:
        """Whether any key is required."""
        return bool(self._digests)

    def allows(self, key: str | None) -> bool:
        """Whether `key` is one of the accepted keys (every digest compared, so timing says nothing)."""
        if not self._digests:
            return True
        probe = _digest(key or "")
        ok = False
        for d in self._digests:
            ok |= hmac.compare_digest(d, probe)
        return ok and key is not None


def presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key a request presents: `Authorization: Bearer K` or `x-api-key: K`."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return x_api_key.strip() if x_api_key else None


def read_key_file(path: Path) -> list[str]:
    """Keys of a key file: one a line, optionally `label: key`; refused unless only its owner can read it."""
    try:
        info = path.stat()
    except OSError as error:
        raise KeyFileError(f"{path}: cannot read the key file ({error.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise KeyFileError(f"{path}: the key file is not a regular file")
    if info.st_mode & 0o077:
        raise KeyFileError(
            f"{path}: the key file has mode {stat.S_IMODE(info.st_mode):04o}; run chmod 600 on it"
        )
    keys = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keys.append(line.split(":", 1)[1].strip() if ": " in line else line)
    if not keys:
        raise KeyFileError(f"{path}: the key file holds no key")
    return keys


def gather_keys(options: Iterable[str], key_file: Path | None) -> ApiKeys:
    """Keys from --api-key options, the TFC_API_KEY setting and a key file, together."""
    keys = [*options, *settings.get("TFC_API_KEY")]
    if key_file is not None:
        keys += read_key_file(key_file)
    return ApiKeys(keys)
