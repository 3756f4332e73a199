"""Where a batch of placements is simulated: this process, N local worker processes, or Ray workers.

The learner samples every placement itself and only hands the batch out for scoring; each
evaluator splits the batch into contiguous chunks, one per worker, and joins the answers in
order (each with the carried priority, if any: ``PlacementEnv.evaluate``). The simulator is
deterministic, so the outcomes (and with them the whole training run) are the same for one
worker, eight, or a Ray cluster.

Local workers are ``spawn``-ed processes (never forked from a learner that holds torch's
threads), each building the environment once from the pickled graph and cluster. Ray workers are
actors, one per CPU asked for; ``ray_address`` joins a running cluster, else a local Ray
instance starts (``pip install devplace[ray]``).

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> import numpy as np
>>> with evaluator(chain_graph([1.0, 2.0]), uniform_cluster(2), np.array([0, 1])) as ev:
...     ev.evaluate(np.array([[0, 1]])).step_us.tolist()
[3.0]
"""

from __future__ import annotations

import multiprocessing
from contextlib import contextmanager

import numpy as np

from devplace.errors import DevplaceError
from devplace.learn.env import Outcomes, PlacementEnv


class InProcess:
    """Simulate the batch here."""

    def __init__(self, env: PlacementEnv):
        self.env = env

    def evaluate(self, unit_devices: np.ndarray, carried: np.ndarray | None = None) -> Outcomes:
        return self.env.evaluate(unit_devices, carried)

    def close(self) -> None:
        pass


def _chunks(unit_devices: np.ndarray, n: int) -> list[np.ndarray]:
    """Contiguous, non-empty chunks of the batch, at most ``n``."""
    return [c for c in np.array_split(np.asarray(unit_devices), min(n, len(unit_devices))) if len(c)]


_worker_env: PlacementEnv | None = None


def _start_worker(graph, cluster, unit_of, orders) -> None:
    global _worker_env
    _worker_env = PlacementEnv(graph, cluster, unit_of, orders)


def _evaluate_in_worker(chunk: tuple[np.ndarray, np.ndarray | None]) -> Outcomes:
    return _worker_env.evaluate(*chunk)


class LocalWorkers:
    """``n`` spawned processes, each with its own environment."""

    def __init__(self, env: PlacementEnv, n: int):
        self.n = n
        context = multiprocessing.get_context("spawn")
        self.pool = context.Pool(n, initializer=_start_worker, initargs=(env.graph, env.cluster, env.unit_of, env.orders))

    def evaluate(self, unit_devices: np.ndarray, carried: np.ndarray | None = None) -> Outcomes:
        chunks = [(chunk, carried) for chunk in _chunks(unit_devices, self.n)]
        return Outcomes.concatenate(self.pool.map(_evaluate_in_worker, chunks))

    def close(self) -> None:
        self.pool.terminate()
        self.pool.join()


class RayWorkers:
    """``n`` Ray actors, each with its own environment; joins ``address`` or starts a local Ray."""

    def __init__(self, env: PlacementEnv, n: int, address: str | None):
        try:
            import ray
        except ImportError:
            raise DevplaceError("option ray/ray_address needs Ray: pip install 'devplace[ray]'") from None
        self.ray = ray
        self.started_here = not ray.is_initialized()
        if self.started_here:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False)
        actor = ray.remote(num_cpus=1)(_RayEnv)
        shared = ray.put((env.graph, env.cluster, env.unit_of, env.orders))
        self.actors = [actor.remote(shared) for _ in range(n)]

    def evaluate(self, unit_devices: np.ndarray, carried: np.ndarray | None = None) -> Outcomes:
        chunks = _chunks(unit_devices, len(self.actors))
        return Outcomes.concatenate(self.ray.get([a.evaluate.remote(c, carried) for a, c in zip(self.actors, chunks)]))

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        if self.started_here:
            self.ray.shutdown()


class _RayEnv:
    def __init__(self, shared):
        self.env = PlacementEnv(*shared)

    def evaluate(self, unit_devices: np.ndarray, carried: np.ndarray | None) -> Outcomes:
        return self.env.evaluate(unit_devices, carried)


@contextmanager
def evaluator(graph, cluster, unit_of, *, workers: int = 1, ray: bool = False, ray_address: str = "",
              orders: tuple[str, ...] = ("topological",)):
    """The evaluator the options ask for, closed on exit: Ray if ``ray`` or ``ray_address``, else
    ``workers`` local processes (1: this process); ``orders``: the schedule orders each placement is
    simulated in (``PlacementEnv``)."""
    if workers < 1:
        raise DevplaceError(f"option workers is {workers}: use 1 or more")
    env = PlacementEnv(graph, cluster, unit_of, orders)
    if ray or ray_address:
        chosen = RayWorkers(env, workers, ray_address or None)
    elif workers > 1:
        chosen = LocalWorkers(env, workers)
    else:
        chosen = InProcess(env)
    try:
        yield chosen
    finally:
        chosen.close()
