"""The multi-process backend: one process per device, values exchanged with torch.distributed.

``run_distributed`` launches one process per placement device on this machine
(``torch.multiprocessing`` spawn; gloo on CPU, NCCL on GPU) and supervises them: a rank that raises
ends the run with its error and op, a rank that dies (killed, crashed) is named with its signal or
exit code and op, a rank that makes no progress for ``timeout_s`` ends it as hung, and every child is
killed before returning. Nothing of a local run is reachable from the network: the rendezvous store
is served by this process on a socket bound to 127.0.0.1, and gloo's connections use the loopback
interface. Ranks ignore SIGINT (the supervisor handles Ctrl-C and stops them) and die with their
parent (Linux parent-death signal, and a poll of the parent's pid elsewhere).
Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) ``run_under_torchrun`` is the body each process
runs instead, across machines.

Each rank runs its instructions in the plan's order (schedule.py): after computing a value it
posts a non-blocking send to every rank that reads it; it keeps the receives from each peer posted
``RECEIVES_AHEAD`` events ahead in that peer's send order (always up to the one it needs), and waits
for a value when it needs it.

A CPU device is a process with one thread (``torch.set_num_threads(1)``), so two devices use two
cores for real. Measured step time: all ranks pass a barrier and, on one machine, wait spinning for
a start time they agreed on (``synchronized_start``), then each times its part of the step up to its
last op and completed sends; a step's time is the slowest rank's. Asked for a timeline, each rank
records its last step (interpreter.py: its instructions, its receive waits and its send postings,
from its own start) and the parts are merged.
"""

from __future__ import annotations

import ctypes
import os
import queue as queue_module
import signal
import socket
import sys
import threading
import time
from datetime import timedelta

import numpy as np
import torch

from devplace.execute.interpreter import PlacedInterpreter, merge_timeline, timeline_part
from devplace.execute.program import ExecutionError, Program
from devplace.execute.schedule import Plan

# Receives a rank keeps posted ahead per peer. A receive posted before its send lets gloo deliver the
# data as soon as it is sent; one posted only when the value is needed costs a rendezvous that waits
# for the busy sender's transport thread to be scheduled: 4-8x slower per transfer on a loaded 2-core
# machine (ping-pong of 4 KiB: 0.3-0.4 ms posted ahead, 1.5-3.3 ms posted when needed; rnnlm's m-ETF
# step 68-77 ms against 109-206 ms, alternating at load 4.8-5.8). The cost: up to this many receive
# buffers per peer allocated before their values are needed.
RECEIVES_AHEAD = 64

# per-rank status slots in shared memory
_OP, _WAITING_ON, _SINCE, _DONE, _JOB = range(5)
_SLOTS = 5


LOOPBACK = "127.0.0.1"
# how often a rank checks that its parent is still there (where no parent-death signal exists)
PARENT_POLL_S = 0.5


def loopback_store(world: int, timeout_s: float):
    """The rendezvous store, served by this process on a socket bound to the loopback address only
    (torch's own TCPStore server listens on every interface); (store, port)."""
    import torch.distributed as dist

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((LOOPBACK, 0))
    listener.listen(max(world, 16))
    port = listener.getsockname()[1]
    store = dist.TCPStore(LOOPBACK, port, world, True, timedelta(seconds=timeout_s), wait_for_workers=False,
                          master_listen_fd=listener.detach())
    return store, port


def loopback_interface() -> str | None:
    """This machine's loopback interface name (``lo`` on Linux, ``lo0`` on macOS), for gloo."""
    try:
        return next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)
    except OSError:
        return None


def die_with_parent(parent_pid: int) -> None:
    """End this rank when the process that launched it is gone, so none is left orphaned: Linux's
    parent-death signal (SIGKILL), and a thread polling the parent's pid as a fallback."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)
    threading.Thread(target=watch, name="devplace-parent-watch", daemon=True).start()


def restore_strides(buffer: torch.Tensor, stride: tuple | None) -> torch.Tensor:
    """The received (contiguous) tensor laid out with the strides it had when traced, when those
    are a dense permutation: later views and in-place ops were traced against that layout."""
    if stride is None or buffer.dim() == 0 or tuple(buffer.stride()) == tuple(stride):
        return buffer
    dims = sorted(range(buffer.dim()), key=lambda d: stride[d])
    expected = 1
    for d in dims:
        if buffer.shape[d] != 1 and stride[d] != expected:
            return buffer  # overlapping or gapped layout (an expand, a slice): keep it contiguous
        expected *= buffer.shape[d]
    out = torch.empty_strided(buffer.shape, stride, dtype=buffer.dtype, device=buffer.device)
    out.copy_(buffer)
    return out


class RankInterpreter(PlacedInterpreter):
    """Runs one rank's instructions; remote values arrive by ``irecv``, local ones leave by ``isend``."""

    def __init__(self, program: Program, plan: Plan, rank: int, device: torch.device, state: dict, status=None):
        super().__init__(program, [device] * len(program), state)
        self.plan, self.rank, self.device = plan, rank, device
        self.status = status
        self.written = program.written
        self.pending_sends: list = []
        self.base = rank * _SLOTS

    def run(self, order=None):
        self.posted: dict[str, tuple] = {}  # name -> (work, buffer)
        self.next_recv = {src: 0 for src in self.plan.recvs[self.rank]}
        self.outstanding = {src: 0 for src in self.plan.recvs[self.rank]}
        for src in self.plan.recvs[self.rank]:
            self.post_receives(src, RECEIVES_AHEAD)
        return super().run(self.plan.rank_order[self.rank] if order is None else order)

    def post_receives(self, src: int, up_to: int) -> None:
        """Post the next receives from ``src``, in its send order, until ``up_to`` are outstanding."""
        import torch.distributed as dist

        events = self.plan.recvs[self.rank].get(src, [])
        while self.outstanding[src] < up_to and self.next_recv[src] < len(events):
            event_name, tag = events[self.next_recv[src]]
            ins = self.program.instrs[self.program.index[event_name]]
            if ins.shape is None:
                raise ExecutionError(f"value {event_name!r} is not a single tensor and cannot be sent between ranks")
            buffer = torch.empty(ins.shape, dtype=ins.dtype, device=self.device)
            self.posted[event_name] = (dist.irecv(buffer, src=src, tag=tag), buffer)
            self.next_recv[src] += 1
            self.outstanding[src] += 1

    def _mark(self, op: int, waiting_on: int) -> None:
        if self.status is not None:
            self.status[self.base + _OP] = op
            self.status[self.base + _WAITING_ON] = waiting_on
            self.status[self.base + _SINCE] = time.monotonic()

    def run_node(self, ins):
        self._mark(self.program.index[ins.name], -1)
        super().run_node(ins)

    def fetch(self, name, device):
        if name not in self.env:
            self.env[name] = {device: self.receive(name)}
            self._mark(self.program.index[self.current.name], -1)
        return super().fetch(name, device)

    def receive(self, name: str):
        src = int(self.plan.home[self.program.index[name]])
        while name not in self.posted:
            if self.next_recv.get(src, 0) >= len(self.plan.recvs[self.rank].get(src, [])):
                raise ExecutionError(f"rank {self.rank} needs {name!r} from rank {src}, but the plan has no such transfer")
            self.post_receives(src, self.outstanding[src] + 1)
        work, buffer = self.posted.pop(name)
        self.outstanding[src] -= 1
        self.post_receives(src, RECEIVES_AHEAD)
        self._mark(self.program.index[self.current.name], src)
        if self.timeline is None:
            work.wait()
        else:
            waited = time.perf_counter_ns()
            work.wait()
            self.ready_ns = self.record("wait", name, src, waited)
        return restore_strides(buffer, self.program.instrs[self.program.index[name]].stride)

    def store(self, ins, value, device):
        super().store(ins, value, device)
        sends = self.plan.sends.get(self.program.index[ins.name])
        if sends:
            import torch.distributed as dist

            if not isinstance(value, torch.Tensor):
                raise ExecutionError(f"value {ins.name!r} is not a single tensor and cannot be sent between ranks")
            payload = value.detach()
            payload = payload.clone(memory_format=torch.contiguous_format) if ins.name in self.written else payload.contiguous()
            for dst, tag in sends:
                posted = time.perf_counter_ns()
                self.pending_sends.append((dist.isend(payload, dst=dst, tag=tag), payload))
                if self.timeline is not None:
                    self.record("send", ins.name, dst, posted)

    def finish_sends(self) -> None:
        for work, _payload in self.pending_sends:
            work.wait()
        self.pending_sends = []


# How far ahead of the agreeing all-reduce the common start lies; it covers the all-reduce itself.
START_MARGIN_S = 0.003


def synchronized_start(same_host: bool) -> None:
    """Return on every rank at the same moment, as far as this machine's clock can tell.

    Ranks leave a gloo barrier up to ~1.5 ms apart here (each is woken by its transport thread in
    turn); a rank that leaves early waits that long for its peer's first value, and the step time
    would count it. On one machine the monotonic clock is shared, so the ranks agree on a start a
    few ms ahead (the latest proposal) and spin until it: spinning, not sleeping, so no rank needs
    waking at the start. Across machines (torchrun) the clocks differ and the barrier has to do."""
    import torch.distributed as dist

    dist.barrier()
    if not same_host:
        return
    start = torch.tensor([time.monotonic() + START_MARGIN_S], dtype=torch.float64)
    dist.all_reduce(start, op=dist.ReduceOp.MAX)
    target = float(start)
    while time.monotonic() < target:
        pass


def _rank_body(rank: int, world: int, program: Program, plan: Plan, state: dict, settings: dict, status):
    """Run warm-up + measured steps on this rank; (first-step outputs held here, step times in us,
    the last step's timeline part when ``settings["timeline"]``, else None)."""

    device = torch.device(settings["devices"][rank]) if settings.get("devices") else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    state = {k: v.to(device, copy=True) for k, v in state.items()}  # a job never changes its inputs
    interp = RankInterpreter(program, plan, rank, device, state, status)
    first, times, part = {}, [], None
    n_steps = settings["warmup"] + settings["steps"]
    for step in range(n_steps):
        interp.timeline = [] if settings.get("timeline") and step == n_steps - 1 else None
        synchronized_start(settings.get("same_host", True))
        started = time.perf_counter_ns()
        out = interp.run()
        interp.finish_sends()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = (time.perf_counter_ns() - started) / 1e3
        if step == 0:
            first = {k: v.detach().cpu().numpy().copy() for k, v in out.items()}
        if step >= settings["warmup"]:
            times.append(elapsed)
        if interp.timeline is not None:
            part = {**timeline_part(interp.timeline, started, lambda _name: rank), "device_end_us": {rank: elapsed}}
    interp.timeline = None
    return first, times, part


def _local_state(program: Program, plan: Plan, state: dict, rank: int) -> dict:
    """Only the placeholders this rank holds (constants and unplaced ones go everywhere)."""
    return {name: v for name, v in state.items() if int(plan.home[program.index[name]]) in (rank, -1)}


def _run_body(rank, world, settings, status, jobs):
    """Run each (program, plan, state) job in turn in this process group; one result per job."""
    results = []
    for k, (program, plan, state) in enumerate(jobs):
        if status is not None:
            status[rank * _SLOTS + _JOB] = k
        results.append(_rank_body(rank, world, program, plan, state, settings, status))
    if status is not None:
        status[rank * _SLOTS + _DONE] = 1
    return (results,)


def _worker(rank, world, port, body, body_args, settings, results, status):
    die_with_parent(settings["parent_pid"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the supervisor answers it
    torch.set_num_threads(1)
    jobs = body_args[0] if body_args and isinstance(body_args[0], list) else None
    import torch.distributed as dist

    try:
        backend = "nccl" if settings.get("devices") and str(settings["devices"][rank]).startswith("cuda") else "gloo"
        if settings.get("loopback_interface"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", settings["loopback_interface"])
            os.environ.setdefault("NCCL_SOCKET_IFNAME", settings["loopback_interface"])
        timeout = timedelta(seconds=settings["timeout_s"] + 60)
        store = dist.TCPStore(LOOPBACK, port, world, False, timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        results.put(("ready", rank))
        results.put(("done", rank, *body(rank, world, settings, status, *body_args)))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the supervisor, which names the rank
        op = None
        if jobs is not None and status[rank * _SLOTS + _OP] >= 0:
            op = jobs[int(status[rank * _SLOTS + _JOB])][0].instrs[int(status[rank * _SLOTS + _OP])].name
        waiting = int(status[rank * _SLOTS + _WAITING_ON]) if status is not None else -1
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        results.put(("error", rank, op, f"{type(exc).__name__}: {message}", waiting))


def run_distributed(program: Program, plan: Plan, state: dict, n_devices: int, *, steps: int = 5,
                    warmup: int = 1, timeout_s: float = 60.0, startup_timeout_s: float = 120.0,
                    devices: list[str] | None = None, timeline: bool = False) -> tuple:
    """Spawn one process per device, run the steps, return (first-step outputs, step times in us),
    and with ``timeline`` the last step's timeline (interpreter.merge_timeline) third."""
    return run_distributed_many([(program, plan, state)], n_devices, steps=steps, warmup=warmup, timeout_s=timeout_s,
                                startup_timeout_s=startup_timeout_s, devices=devices, timeline=timeline)[0]


def run_distributed_many(jobs: list[tuple[Program, Plan, dict]], n_devices: int, *, steps: int = 5, warmup: int = 1,
                         timeout_s: float = 60.0, startup_timeout_s: float = 120.0, devices: list[str] | None = None,
                         timeline: bool = False) -> list[tuple]:
    """Several (program, plan, state) jobs in one set of processes (one start-up for all of them);
    one result per job as ``run_distributed`` returns it."""
    settings = {"steps": steps, "warmup": warmup, "timeout_s": timeout_s, "devices": devices, "timeline": timeline}
    per_rank = [([(p, plan, _local_state(p, plan, state, rank)) for p, plan, state in jobs],) for rank in range(n_devices)]
    done = launch(_run_body, per_rank, settings, timeout_s=timeout_s, startup_timeout_s=startup_timeout_s,
                  programs=[p for p, _, _ in jobs])
    out = []
    for k in range(len(jobs)):
        first: dict = {}
        for rank in range(n_devices):
            first.update({name: torch.from_numpy(v) for name, v in done[rank][0][k][0].items()})
        times = np.max(np.asarray([done[r][0][k][1] for r in range(n_devices)], dtype=np.float64), axis=0).tolist()
        if timeline:
            out.append((first, times, merge_timeline([done[r][0][k][2] for r in range(n_devices)])))
        else:
            out.append((first, times))
    return out


def launch(body, per_rank_args: list[tuple], settings: dict, *, timeout_s: float, startup_timeout_s: float = 120.0,
           programs: list[Program] | None = None) -> dict[int, tuple]:
    """Run ``body(rank, world, settings, status, *per_rank_args[rank])`` in one spawned process per
    rank inside a process group; return each rank's result; kill every child on the way out."""
    import torch.multiprocessing as mp

    n_devices = len(per_rank_args)
    settings = {**settings, "timeout_s": timeout_s, "parent_pid": os.getpid(), "loopback_interface": loopback_interface()}

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    status = ctx.Array("d", [-1.0] * (_SLOTS * n_devices), lock=False)
    for r in range(n_devices):
        status[r * _SLOTS + _DONE] = status[r * _SLOTS + _JOB] = 0
    store, port = loopback_store(n_devices, startup_timeout_s)
    procs = []
    try:
        for rank in range(n_devices):
            p = ctx.Process(
                target=_worker, name=f"devplace-rank{rank}", daemon=True,
                args=(rank, n_devices, port, body, per_rank_args[rank], settings, results, status),
            )
            p.start()
            procs.append(p)
        return _supervise(procs, results, status, programs, n_devices, timeout_s, startup_timeout_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=10)
        results.close()
        results.join_thread()
        del store


def _supervise(procs, results, status, programs, world, timeout_s, startup_timeout_s):
    ready: set[int] = set()
    done: dict[int, tuple] = {}
    started = time.monotonic()
    while len(done) < world:
        try:
            message = results.get(timeout=0.2)
        except queue_module.Empty:
            message = None
        now = time.monotonic()
        if message is not None:
            kind, rank = message[0], message[1]
            if kind == "ready":
                ready.add(rank)
                if len(ready) == world:
                    for r in range(world):
                        status[r * _SLOTS + _SINCE] = now
            elif kind == "done":
                done[rank] = tuple(message[2:])
            else:
                # a peer's death shows first as this error; the reporter's own death after it (a live
                # process group aborting at exit) is not news
                _raise_if_died(procs, status, programs, wait_s=1.0, besides=rank)
                _raise_rank_error(message, results)
            continue
        for rank, p in enumerate(procs):
            if rank not in done and p.exitcode is not None:
                _drain_errors(results)
                _raise_if_died(procs, status, programs, wait_s=0.0)
                raise ExecutionError(f"rank {rank} ended without a result (exit code {p.exitcode})"
                                     f"{_at_op(status, rank, programs)}; the other ranks were stopped")
        if len(ready) < world:
            if now - started > startup_timeout_s:
                missing = sorted(set(range(world)) - ready)
                raise ExecutionError(f"rank {missing[0]} did not join the process group within {startup_timeout_s:g} s")
            continue
        stalled = [r for r in range(world) if r not in done and status[r * _SLOTS + _WAITING_ON] < 0
                   and now - status[r * _SLOTS + _SINCE] > timeout_s]
        waiting = [r for r in range(world) if r not in done and status[r * _SLOTS + _WAITING_ON] >= 0
                   and now - status[r * _SLOTS + _SINCE] > timeout_s]
        if stalled or (waiting and len(waiting) == world - len(done)):
            stopped = [r for r in stalled + waiting if _is_stopped(procs[r].pid)]
            rank = stopped[0] if stopped else stalled[0] if stalled else waiting[0]
            raise ExecutionError(
                f"rank {rank} hung{_at_op(status, rank, programs)}: no progress for {timeout_s:g} s"
                f"{' (its process was stopped)' if stopped else ''}; all ranks were stopped (raise --timeout if "
                f"the op is just slow)"
            )
    return done


def _raise_if_died(procs, status, programs, *, wait_s: float, besides: int = -1) -> None:
    """Name a rank other than ``besides`` that ended without reporting (killed, crashed: a non-zero
    exit), waiting up to ``wait_s`` for one to be reaped."""
    deadline = time.monotonic() + wait_s
    while True:
        for rank, p in enumerate(procs):
            if p.exitcode and rank != besides:
                how = (f"killed by {_signal_name(-p.exitcode)}" if p.exitcode < 0 else f"exit code {p.exitcode}")
                raise ExecutionError(f"rank {rank} died ({how}){_at_op(status, rank, programs)}; "
                                     f"the other ranks were stopped")
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _is_stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, a debugger): /proc state T or t, on Linux."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _at_op(status, rank: int, programs: list[Program] | None) -> str:
    op, job = int(status[rank * _SLOTS + _OP]), int(status[rank * _SLOTS + _JOB])
    return f" at op {programs[max(job, 0)].instrs[op].name!r}" if op >= 0 and programs else ""


def _arriving(results, seconds: float):
    """The messages that reach the supervisor's queue within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            yield results.get(timeout=0.1)
        except queue_module.Empty:
            continue


def _raise_rank_error(message, results) -> None:
    """Report the rank that failed first; a rank that failed while waiting on a peer is a symptom."""
    _, rank, op, text, waiting = message
    if waiting >= 0:
        for other in _arriving(results, 1.0):
            if other[0] == "error" and other[4] < 0:
                _, rank, op, text, waiting = other
                break
    where = f" at op {op!r}" if op else ""
    raise ExecutionError(f"rank {rank} failed{where}: {text}")


def _drain_errors(results) -> None:
    for message in _arriving(results, 0.5):
        if message[0] == "error":
            _raise_rank_error(message, results)


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def run_under_torchrun(program: Program, plan: Plan, state: dict, *, steps: int = 5, warmup: int = 1,
                       timeout_s: float = 600.0, devices: list[str] | None = None,
                       timeline: bool = False) -> tuple | None:
    """Body of one torchrun process; rank 0 returns (first-step outputs, step times) and with
    ``timeline`` the last step's timeline (each rank's times from its own start), others None."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if devices is None and torch.cuda.is_available():
        devices = [f"cuda:{local_rank}"] * world  # this rank's entry is the one used
    if devices is None:
        torch.set_num_threads(1)
    backend = "nccl" if devices and devices[rank].startswith("cuda") else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    settings = {"steps": steps, "warmup": warmup, "devices": devices, "timeline": timeline,
                "same_host": int(os.environ.get("LOCAL_WORLD_SIZE", -1)) == world}
    try:
        mine = _rank_body(rank, world, program, plan, _local_state(program, plan, state, rank), settings, None)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None
    outputs = {}
    for part, _, _ in gathered:
        outputs.update({k: torch.from_numpy(v) for k, v in part.items()})
    times = np.max(np.asarray([t for _, t, _ in gathered]), axis=0).tolist()
    return (outputs, times, merge_timeline([p for _, _, p in gathered])) if timeline else (outputs, times)
