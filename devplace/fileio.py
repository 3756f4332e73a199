"""Writing files so that a failure never leaves half of one behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from devplace.errors import DevplaceError


def write_bytes_atomic(path: "str | Path", data: bytes) -> None:
    """Write to a temporary file beside ``path``, then rename it into place. A failure is a
    DevplaceError naming ``path`` (not the temporary file) and why."""
    path = Path(path)
    try:
        _write(path, data)
    except OSError as exc:
        raise DevplaceError(f"cannot write {str(path)!r}: {_why(path, exc)}") from None


def _why(path: Path, exc: OSError) -> str:
    """What stops ``path`` being written, in the user's terms."""
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            return f"{str(parent)!r} is a file, not a folder"
    if path.is_dir():
        return "it is a folder"
    return exc.strerror or type(exc).__name__


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file private (0600); give it the mode a plain open() would
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: "str | Path", text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def json_default(value):
    """``json.dumps(default=...)`` for numpy scalars and arrays, which json cannot write itself."""
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")
