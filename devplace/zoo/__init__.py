"""The benchmark model zoo: the networks the placement papers used, at their configurations.

>>> from devplace import zoo
>>> m = zoo.build("gnmt", preset="small")
>>> outputs = m.model(*m.example_inputs)
>>> loss = m.loss_fn(outputs, *m.targets)          # the same as m.loss(outputs)
>>> loss.dim()
0

The training-step contract
--------------------------
``build(name, **config)`` returns a :class:`ZooModel`. One training step on it is::

    outputs = zm.model(*zm.example_inputs)     # forward: inputs only, never the labels
    loss = zm.loss_fn(outputs, *zm.targets)    # a scalar tensor (mean over the batch)
    loss.backward()

``example_inputs`` and ``targets`` are tuples of tensors (token ids, images, labels) made from
``seed``; ``loss_fn`` is a plain module-level function of the model's outputs followed by the
targets, so it closes over no tensor and can be traced with fake tensors passed for both.

Configurations
--------------
Every model has its paper configuration as defaults (``spec(name).defaults``), named presets (every
model has ``small``: tiny and fast, for tests; and ``medium``: a one-thread CPU training step of
roughly 5-250 ms, the sizes of the capture-fidelity table in BENCHMARKS.md) and accepts overrides
of any default key::

    zoo.build("gnmt")                          # the paper configuration
    zoo.build("gnmt", preset="small")          # the test-size preset
    zoo.build("gnmt", preset="medium")         # the capture-fidelity size
    zoo.build("gnmt", layers=2, seq_len=50)    # paper configuration with two overrides

Explicit keys win over the preset, which wins over the defaults. ``seed`` (default 0) fixes the
parameter initialisation and the example batch; building never touches the global RNG state.
Dropout is off by default throughout, so a step is a pure function of its inputs and a placed run
can be checked number for number against a one-device run.

Targets on the command line look like ``zoo:gnmt:layers=4,seq_len=50`` (see :func:`parse_target`).

Naming convention
-----------------
Submodule names identify the parts a human expert would place by hand: ``encoder.layers.{i}``,
``decoder.layers.{i}``, ``attention``, ``classifier`` (GNMT), ``rnnlm.layers.{i}`` (RNNLM),
``encoder.layers.{i}`` (transformer). Captured ops carry these names through the module stack.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from devplace.errors import DevplaceError

# One module per model family; each defines ``SPECS``, a list of ModelSpec.
_FAMILY_MODULES = ("small", "rnnlm", "gnmt", "cnn", "transformer", "nasnet")
_RESERVED_KEYS = ("preset", "seed")


@dataclass
class ZooModel:
    """A built benchmark model and one example batch; see the package docstring for the contract."""

    name: str
    model: Any  # torch.nn.Module
    example_inputs: tuple
    targets: tuple
    loss_fn: Callable[..., Any]
    config: dict = field(default_factory=dict)

    def loss(self, outputs: Any) -> Any:
        """``loss_fn(outputs, *targets)``: the scalar training loss of the example batch."""
        return self.loss_fn(outputs, *self.targets)


@dataclass(frozen=True)
class ModelSpec:
    """How to build one zoo model.

    ``make(config)`` receives the fully resolved configuration (defaults, preset, overrides, seed)
    and returns ``(model, example_inputs, targets, loss_fn)``; it runs inside a forked, seeded RNG.
    """

    name: str
    summary: str
    defaults: dict
    presets: dict
    make: Callable[[dict], tuple]


_registry: dict[str, ModelSpec] | None = None


def _specs() -> dict[str, ModelSpec]:
    global _registry
    if _registry is None:
        found: dict[str, ModelSpec] = {}
        for family in _FAMILY_MODULES:
            module = importlib.import_module(f"devplace.zoo.{family}")
            for s in module.SPECS:
                if "small" not in s.presets:
                    raise AssertionError(f"zoo model {s.name!r} has no 'small' preset")
                found[s.name] = s
        _registry = found
    return _registry


def names() -> list[str]:
    """The names of all zoo models, sorted."""
    return sorted(_specs())


def spec(name: str) -> ModelSpec:
    """The ModelSpec of ``name``; a DevplaceError listing the known names if there is none."""
    try:
        return _specs()[name]
    except KeyError:
        raise DevplaceError(f"no zoo model {name!r}: known models are {', '.join(names())}") from None


def valid_keys(name: str) -> list[str]:
    """The configuration keys ``name`` accepts (its defaults' keys plus preset and seed)."""
    return sorted(spec(name).defaults) + list(_RESERVED_KEYS)


def _check_keys(name: str, keys) -> None:
    valid = valid_keys(name)
    for key in keys:
        if key not in valid:
            raise DevplaceError(
                f"zoo model {name!r} has no configuration key {key!r}: valid keys are {', '.join(valid)}"
            )


def _coerce(name: str, key: str, value: Any, default: Any) -> Any:
    """``value`` converted to the type of ``default`` (strings parsed), or a DevplaceError."""
    kind = type(default)
    bad = DevplaceError(
        f"zoo model {name!r}: {key}={value!r} is not a valid {kind.__name__} (default {default!r})"
    )
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise bad
    if kind is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value).strip())
        except ValueError:
            raise bad from None
    if kind is float:
        if isinstance(value, bool):
            raise bad
        try:
            return float(value)
        except (TypeError, ValueError):
            raise bad from None
    return str(value)


def resolve_config(name: str, **config: Any) -> dict:
    """The full configuration ``build(name, **config)`` would use: defaults < preset < overrides."""
    s = spec(name)
    _check_keys(name, config)
    preset = config.pop("preset", None)
    seed = config.pop("seed", 0)
    resolved = dict(s.defaults)
    if preset is not None:
        if preset not in s.presets:
            raise DevplaceError(
                f"zoo model {name!r} has no preset {preset!r}: presets are {', '.join(sorted(s.presets))}"
            )
        resolved.update(s.presets[preset])
    for key, value in config.items():
        resolved[key] = _checked_size(name, key, _coerce(name, key, value, s.defaults[key]))
    resolved["seed"] = _checked_size(name, "seed", _coerce(name, "seed", seed, 0))
    return resolved


# Whole-number settings that may be 0; every other one is a size (layers, batch, units) of at least 1.
MAY_BE_ZERO = ("seed", "mask_token")
# Settings that are probabilities, in [0, 1).
PROBABILITIES = ("dropout",)
# Largest size a zoo setting may take: beyond it the model would not fit any machine's memory.
MAX_SIZE = 10**7


def _checked_size(name: str, key: str, value: Any) -> Any:
    """Refuse sizes that build no model (0, negative) or one no memory holds, and non-finite floats."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        low = 0 if key in MAY_BE_ZERO else 1
        high = 2**63 - 1 if key == "seed" else MAX_SIZE
        if value < low:
            raise DevplaceError(f"{name}: {key} must be at least {low}, not {value} (zoo model {name!r}: {key}={value})")
        if value > high:
            raise DevplaceError(f"{name}: {key} must be at most {high}, not {value} (zoo model {name!r}: {key}={value})")
    if isinstance(value, float) and not (math.isfinite(value) and value >= 0):
        raise DevplaceError(f"zoo model {name!r}: {key}={value} must be a finite number >= 0")
    if key in PROBABILITIES and not 0 <= value < 1:
        raise DevplaceError(f"zoo model {name!r}: {key}={value} is a probability: give a number from 0 to below 1")
    return value


def build(name: str, **config: Any) -> ZooModel:
    """Build zoo model ``name`` (see :func:`names`) with its paper defaults, a preset, overrides.

    ``config`` keys: any key of ``spec(name).defaults``, ``preset`` (e.g. ``"small"``) and
    ``seed`` (default 0). Unknown keys, presets or names raise a DevplaceError listing valid ones.
    """
    import torch

    resolved = resolve_config(name, **config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(resolved["seed"])
        model, example_inputs, targets, loss_fn = spec(name).make(dict(resolved))
    model.train()
    return ZooModel(
        name=name, model=model, example_inputs=tuple(example_inputs), targets=tuple(targets),
        loss_fn=loss_fn, config=resolved,
    )


def parse_target(target: str) -> tuple[str, dict]:
    """Parse ``"zoo:NAME[:KEY=VALUE,...]"`` into ``(NAME, config)`` with typed values.

    Values are converted to the type of the key's default (int, float, bool or str); ``preset``
    is a string and ``seed`` an int. The ``zoo:`` prefix may be left out.

    >>> parse_target("zoo:gnmt:layers=4,seq_len=50")
    ('gnmt', {'layers': 4, 'seq_len': 50})
    """
    text = target.strip()
    if text.startswith("zoo:"):
        text = text[len("zoo:"):]
    name, _, options = text.partition(":")
    name = name.strip()
    s = spec(name)
    config: dict = {}
    for item in filter(None, (part.strip() for part in options.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise DevplaceError(
                f"zoo target {target!r}: {item!r} is not KEY=VALUE; valid keys for {name!r} are "
                f"{', '.join(valid_keys(name))}"
            )
        _check_keys(name, [key])
        if key == "preset":
            config[key] = value
        elif key == "seed":
            config[key] = _coerce(name, key, value, 0)
        else:
            config[key] = _coerce(name, key, value, s.defaults[key])
    return name, config


__all__ = ["ModelSpec", "ZooModel", "build", "names", "parse_target", "resolve_config", "spec", "valid_keys"]
