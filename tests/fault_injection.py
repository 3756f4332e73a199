"""Test-only faults for the distributed executor, installed from the test: production code has no hook.

``install(monkeypatch, rank=..., op=..., action=...)`` replaces the executor's per-rank body with
``rank_body_with_fault`` bound to the fault. Ranks are spawned processes that import this module
afresh (the test folder is on their ``sys.path``), so the fault reaches them as the body's argument
and each one patches its own ``RankInterpreter`` before running the real body.
"""

from __future__ import annotations

import functools
import time

from devplace.execute import distributed

_real_rank_body = distributed._run_body  # imported before any test replaces it, in every process


def rank_body_with_fault(fault: dict, rank, world, settings, status, jobs):
    """The executor's body on rank ``rank``, with ``fault`` armed if it is this rank's."""
    if fault["rank"] == rank:
        call_function = distributed.RankInterpreter.call_function

        def faulty(self, ins, args, kwargs, device):
            if fault.get("op") in (None, ins.name):
                if fault["action"] == "hang":
                    time.sleep(fault.get("seconds", 3600))
                else:
                    raise RuntimeError("fault injected for a test")
            return call_function(self, ins, args, kwargs, device)

        distributed.RankInterpreter.call_function = faulty  # a spawned rank: its own module, gone with it
    return _real_rank_body(rank, world, settings, status, jobs)


def install(monkeypatch, **fault) -> None:
    """Make the next distributed runs in this test inject ``fault`` (rank, op, action, seconds)."""
    monkeypatch.setattr(distributed, "_run_body", functools.partial(rank_body_with_fault, fault))
