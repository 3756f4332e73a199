"""Fixtures shared by test files."""

import pytest


@pytest.fixture
def offered_starts(monkeypatch):
    """``record(prefix)``: a list that fills with the devices of every placement sim-search is offered
    whose description starts with ``prefix`` (what a track offers as its start)."""
    from devplace.portfolio.sim_search.search import _Search

    def record(prefix: str) -> list:
        offered, offer = [], _Search.offer

        def recording(search, step_us, devices, priority, how):
            if how.startswith(prefix):
                offered.append(devices.copy())
            return offer(search, step_us, devices, priority, how)

        monkeypatch.setattr(_Search, "offer", recording)
        return offered

    return record
