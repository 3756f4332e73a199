"""Parsing ``devplace profile`` targets into (model, example_inputs, loss_fn, targets).

- ``path/to/file.py:function``: the function, called with no arguments, returns
  ``(model, example_inputs, loss_fn)`` with ``loss_fn(output)`` a scalar, or a zoo-style object
  with ``model``, ``example_inputs``, ``targets`` and ``loss_fn(output, *targets)``.
- ``zoo:NAME[:k=v,...]``: ``devplace.zoo.build(NAME, k=v, ...)`` (options parsed by the zoo).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from devplace.errors import CaptureError


def load_target(target: str):
    """The (model, example_inputs, loss_fn, targets) a target names."""
    if target.startswith("zoo:"):
        from devplace import zoo

        name, config = zoo.parse_target(target)
        return _unpack(zoo.build(name, **config), target)
    path_text, sep, function = target.rpartition(":")
    if not sep or not path_text.endswith(".py") or not function:
        raise CaptureError(f"target {target!r} must be path/to/file.py:function or zoo:NAME[:k=v,...]")
    path = Path(path_text)
    if not path.is_file():
        raise CaptureError(f"target file {path_text!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"devplace_target_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        raise CaptureError(f"importing {path_text!r} failed: {_theirs(exc)}") from exc
    fn = getattr(module, function, None)
    if not callable(fn):
        raise CaptureError(f"{path_text!r} has no function {function!r}")
    try:
        result = fn()
    except (Exception, SystemExit) as exc:  # the user's code: their error, not devplace's
        raise CaptureError(f"your function {function!r} in {path_text!r} {_theirs(exc)}") from exc
    return _unpack(result, target)


def _theirs(exc: BaseException) -> str:
    """A user's exception in one line; ``sys.exit`` named as such (it must not end devplace)."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r}) instead of returning (model, example_inputs, loss_fn)"
    text = str(exc).strip().splitlines()
    return f"raised {type(exc).__name__}" + (f": {text[0]}" if text else "")


def _unpack(result, target: str):
    if all(hasattr(result, a) for a in ("model", "example_inputs", "targets", "loss_fn")):
        return result.model, result.example_inputs, result.loss_fn, result.targets
    if isinstance(result, tuple) and len(result) == 3:
        return (*result, ())
    raise CaptureError(
        f"{target} must give (model, example_inputs, loss_fn) or a zoo model, not {type(result).__name__}"
    )
