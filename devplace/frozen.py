"""Read-only copies of the free-form ``meta`` records that graphs and clusters carry.

A graph or cluster is shared by every placer, cache and report that holds it, so a record one of
them edits would change under the others. ``freeze`` copies a record into values that refuse
edits: dicts become ``FrozenDict`` and lists ``FrozenList`` (still a ``dict`` and a ``list``, so
JSON, TOML, ``isinstance`` and ``==`` see plain ones), numpy arrays become read-only copies
(``read_only_array`` does the same for the arrays of a graph or cluster). To change a record,
build a new one (``{**record, "key": value}``, ``list(items)``) and a new graph or cluster around it.

>>> record = freeze({"scope": ["a", "b"], "times": {"total": 1.5}})
>>> record["times"]["total"], record["scope"] == ["a", "b"]
(1.5, True)
>>> record["times"]["total"] = 2.0
Traceback (most recent call last):
...
TypeError: this record is read-only: build a new one, e.g. {**record, key: value}
"""

from __future__ import annotations

import numpy as np


def _refuse(self, *args, **kwargs):
    raise TypeError("this record is read-only: build a new one, e.g. {**record, key: value}")


class FrozenDict(dict):
    """A dict whose items cannot be set, deleted or updated after it is made."""

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self):
        # pickle and copy would rebuild it item by item through __setitem__: hand them the whole dict
        return (FrozenDict, (dict(self),))


class FrozenList(list):
    """A list whose items cannot be set, added, removed or reordered after it is made."""

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __reduce__(self):
        return (FrozenList, (list(self),))


def freeze(value):
    """A deep read-only copy of ``value``: dicts, lists and tuples all the way down, numpy arrays;
    other values (numbers, strings, None) are immutable already. A ``FrozenDict`` or ``FrozenList``
    made here is frozen all the way down, so it is returned as it is."""
    if type(value) in (FrozenDict, FrozenList):
        return value
    if isinstance(value, dict):
        return FrozenDict((k, freeze(v)) for k, v in value.items())
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    if isinstance(value, tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(value)
    if isinstance(value, np.ndarray):
        return read_only_array(value, value.dtype)
    return value


def read_only_array(value, dtype) -> np.ndarray:
    """``value`` as a C-contiguous read-only array of ``dtype``: a read-only array of that layout is
    shared as it is, anything else copied (the caller may still write to its own array)."""
    if (isinstance(value, np.ndarray) and not value.flags.writeable and value.dtype == dtype
            and value.flags.c_contiguous):
        return value
    array = np.array(value, dtype=dtype, order="C")
    array.flags.writeable = False
    return array


def set_read_only_state(self, state: dict) -> None:
    """``__setstate__`` for a frozen value holding arrays: pickle and deepcopy make writeable copies
    of them, so make them read-only again (the record's dicts and lists come back frozen as they went)."""
    def lock(value) -> None:
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
        elif isinstance(value, tuple):
            for item in value:
                lock(item)

    for value in state.values():
        lock(value)
    self.__dict__.update(state)
