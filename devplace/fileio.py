"""Reading and writing files: a bad file gets an error that names it, a failed write never leaves half of one."""

from __future__ import annotations

import json
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


def read_json_object(path: "str | Path", what: str, error: type[DevplaceError], give: str = "a .json file") -> dict:
    """The JSON object in ``path``, or ``error`` naming ``what`` and the file and saying what is wrong
    (for a folder, to ``give`` a file instead).

    >>> read_json_object("missing.json", "graph file", DevplaceError)
    Traceback (most recent call last):
    devplace.errors.DevplaceError: graph file 'missing.json' does not exist
    """
    path = Path(path)
    name = f"{what} {str(path)!r}"
    if path.is_dir():
        raise error(f"{name} is a directory: give {give}")
    if not path.is_file():
        raise error(f"{name} does not exist")
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{name} is not valid JSON: {exc}") from None
    except RecursionError:
        raise error(f"{name} nests lists or objects too deeply to read") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise error(f"{name} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"{name} holds a JSON {type(data).__name__}, not one JSON object")
    return data
