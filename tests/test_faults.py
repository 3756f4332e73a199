"""Faults against ``devplace run --backend distributed``, done to the real processes from outside:
kill -9 of a rank, of the parent, SIGSTOP of a rank, Ctrl-C; and the rendezvous kept off the network.

Each test starts the command line in its own session (a long run: many steps), waits until both
ranks are connected, does the fault and checks the outcome and that no process of the run is left.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from devplace.cluster import uniform_cluster  # noqa: E402
from devplace.execute import prepare  # noqa: E402
from devplace.portfolio import place  # noqa: E402

TARGET = "zoo:mlp:preset=small"
LOOPBACK_PREFIXES = ("127.", "::1", "::ffff:127.")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("faults")
    p = prepare(TARGET, repeats=1)
    place(p.graph, uniform_cluster(2, kind=p.graph.device_kinds[0]), algo="round-robin", seed=0).save(
        folder / "placement.json", p.graph)
    (folder / "two.toml").write_text(
        'name = "two"\ncomm_model = "duplex"\n[[devices]]\nkind = "cpu"\ncount = 2\nmemory_gib = 4\n'
        "[links.default]\nlatency_us = 50\nbandwidth_bytes_per_us = 1000\n")
    return folder


def start_run(files, timeout_s: float = 60) -> subprocess.Popen:
    """A distributed run that would go on for minutes, in its own session (so Ctrl-C can reach its group)."""
    return subprocess.Popen(
        [sys.executable, "-m", "devplace.cli", "run", TARGET, "--placement", str(files / "placement.json"),
         "--cluster", str(files / "two.toml"), "--backend", "distributed", "--cost", "measured",
         "--steps", "1000000", "--warmup", "0", "--timeout", str(timeout_s)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        # a shell without job control starts `cmd &` with SIGINT ignored, and the run inherits that (so Ctrl-C
        # could not reach it); give the run SIGINT's default, as a job in a terminal's foreground has
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        # faulthandler: a run that does not end is asked (SIGABRT) for its threads' stacks, for the failure message
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PYTHONFAULTHANDLER": "1"},
    )


def stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def ranks_of(parent: int) -> list[int]:
    """The run's rank processes (spawned children of ``parent``, multiprocessing's helper left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        fields = stat_fields(int(entry.name)) if entry.name.isdigit() else None
        if fields and int(fields[1]) == parent and fields[0] not in ("Z", "X"):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "spawn_main" in cmdline and "resource_tracker" not in cmdline:
                found.append(int(entry.name))
    return sorted(found)


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def tcp_sockets() -> list[tuple[str, int, str, str]]:
    """(local address, local port, state in hex, inode) of every TCP socket, from /proc/net/tcp{,6}."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            address, port = cols[1].split(":")
            raw = bytes.fromhex(address)
            if len(raw) == 4:
                text = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:  # four little-endian 32-bit words
                text = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
            rows.append((text, int(port, 16), cols[3], cols[9]))
    return rows


def wait_until_running(proc: subprocess.Popen, limit_s: float = 90) -> list[int]:
    """The two ranks' pids once each holds its connections (store + its peer): the steps are running."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        ranks = ranks_of(proc.pid)
        if len(ranks) == 2:
            established = {inode for _, _, state, inode in tcp_sockets() if state == "01"}
            if all(len(socket_inodes(r) & established) >= 2 for r in ranks):
                time.sleep(1.0)
                return ranks
        time.sleep(0.2)
    proc.kill()
    pytest.fail("the ranks did not start")


def finish(proc: subprocess.Popen, limit_s: float = 60) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        masks = [line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                 if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))]  # SIGINT is bit 1 (0x2)
        os.kill(proc.pid, signal.SIGABRT)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            err = "(no stacks within 10 s)"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the run did not end within {limit_s:g} s; its signal masks: {masks}; where its threads were:\n{err}")
    return proc.returncode, err


def assert_gone(pids: list[int], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    assert [p for p in pids if alive(p)] == []


def test_kill_9_of_a_rank_names_that_rank(files):
    proc = start_run(files)
    ranks = wait_until_running(proc)
    os.kill(ranks[1], signal.SIGKILL)
    code, err = finish(proc)
    assert code == 2, err
    assert "rank 1 died (killed by SIGKILL)" in err and len(err.strip().splitlines()) == 1, err
    assert_gone(ranks, 5)


def test_kill_9_of_the_parent_leaves_no_rank_alive(files):
    proc = start_run(files, timeout_s=10)
    ranks = wait_until_running(proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert_gone(ranks, 10)  # the run's timeout: the ranks go at once (parent-death signal)


def test_sigstop_of_a_rank_ends_with_the_hang_message(files):
    proc = start_run(files, timeout_s=3)
    ranks = wait_until_running(proc)
    os.kill(ranks[1], signal.SIGSTOP)
    code, err = finish(proc)
    assert code == 2, err
    assert "rank 1 hung" in err and "stopped" in err and "no progress for 3 s" in err, err
    assert_gone(ranks, 5)


def test_ctrl_c_ends_with_interrupted(files):
    proc = start_run(files)
    ranks = wait_until_running(proc)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    code, err = finish(proc)
    assert code == 130 and err.strip().splitlines()[-1] == "interrupted", err
    assert "Traceback" not in err
    assert_gone(ranks, 5)


def non_loopback_addresses() -> list[str]:
    """This machine's own IPv4 addresses other than 127.x (from the kernel's routing table)."""
    lines = Path("/proc/net/fib_trie").read_text().splitlines()
    return sorted({lines[i - 1].split()[-1] for i, line in enumerate(lines)
                   if "/32 host LOCAL" in line and not lines[i - 1].split()[-1].startswith("127.")})


def test_the_rendezvous_is_not_reachable_from_the_network(files):
    proc = start_run(files)
    try:
        ranks = wait_until_running(proc)
        mine = set().union(*(socket_inodes(pid) for pid in [proc.pid, *ranks]))
        listening = [(address, port) for address, port, state, inode in tcp_sockets() if state == "0A" and inode in mine]
        assert listening, "the run has no listening socket: the store was not found"
        assert all(address.startswith(LOOPBACK_PREFIXES) for address, _ in listening), listening
        for address in non_loopback_addresses():
            for _, port in listening:
                with socket.socket() as client, pytest.raises(OSError):
                    client.settimeout(2)
                    client.connect((address, port))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
