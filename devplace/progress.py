"""One progress hook for long work (searches, training): library code reports, the caller decides how it shows.

Library code never prints. A long-running placer asks ``current()`` for the active reporter and
tells it what it is doing; by default that reporter is silent, so the Python API stays quiet
unless asked. The command line installs a rich progress bar (``RichReporter``) with
``reporting(...)``; a Python user can install ``LineReporter()`` (one line per update on stderr),
the rich bar, or their own ``Reporter`` subclass.
Free-text messages go through ``logging`` (logger ``devplace``), not through this hook.

>>> seen = []
>>> class Collect(Reporter):
...     def update(self, done, *, best_step_us=None, note=""):
...         seen.append((done, best_step_us))
>>> with reporting(Collect()):
...     task = current()
...     task.begin("search", total=2)
...     task.update(1, best_step_us=10.0)
...     task.end()
>>> seen
[(1, 10.0)]
>>> current().update(5)   # silent outside
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar


class Reporter:
    """Silent by default: override what you want to see.

    ``begin`` opens a task of ``total`` units (None: unknown), ``update`` says how many are done,
    with the best step time found so far when there is one, ``end`` closes the task. Tasks may nest
    (a search whose seeds are placers that report too); a reporter may show only the outermost."""

    def begin(self, task: str, total: int | None = None) -> None:
        pass

    def update(self, done: int, *, best_step_us: float | None = None, note: str = "") -> None:
        pass

    def end(self) -> None:
        pass


class LineReporter(Reporter):
    """One line per update on stderr: at most one per ``every_s`` seconds, and a task's last update
    when it ends (so a short task still shows where it finished)."""

    def __init__(self, every_s: float = 1.0, stream=None):
        self.every_s = every_s
        self.stream = stream if stream is not None else sys.stderr
        self._tasks: list[tuple[str, int | None]] = []
        self._last_shown = -math.inf   # not 0: monotonic() counts from boot, so 0 could be within every_s
        self._unshown: str | None = None   # the latest update's line, if it was held back

    def begin(self, task: str, total: int | None = None) -> None:
        self._tasks.append((task, total))

    def update(self, done: int, *, best_step_us: float | None = None, note: str = "") -> None:
        if not self._tasks:
            return
        line = _line(*self._tasks[-1], done, best_step_us, note)
        now = time.monotonic()
        if now - self._last_shown < self.every_s:
            self._unshown = line
            return
        self._last_shown = now
        self._write(line)

    def end(self) -> None:
        if self._unshown is not None:
            self._write(self._unshown)
        if self._tasks:
            self._tasks.pop()

    def _write(self, line: str) -> None:
        self._unshown = None
        self.stream.write(line + "\n")
        self.stream.flush()


class RichReporter(Reporter):
    """A rich progress bar per open task, with the best step time so far; a task's bar goes when it ends.

    ``showing_progress(console)`` installs one and shows its bars around a block of work.
    """

    def __init__(self, console=None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[best]}", markup=False), TimeElapsedColumn(), console=console, transient=True,
        )
        self._tasks: list[tuple[int, str]] = []

    def __enter__(self) -> "RichReporter":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def begin(self, task: str, total: int | None = None) -> None:
        self._tasks.append((self.progress.add_task(task, total=total, best=""), task))

    def update(self, done: int, *, best_step_us: float | None = None, note: str = "") -> None:
        if not self._tasks:
            return
        task_id, name = self._tasks[-1]
        fields = {"best": f"best {best_step_us / 1e3:.3f} ms"} if best_step_us is not None else {}
        self.progress.update(task_id, completed=done, description=f"{name}: {note}" if note else name, **fields)

    def end(self) -> None:
        if self._tasks:
            self.progress.remove_task(self._tasks.pop()[0])


def _line(task: str, total: int | None, done: int, best_step_us: float | None, note: str) -> str:
    parts = [f"[{task}] {done}" + (f"/{total}" if total else "")]
    if best_step_us is not None:
        parts.append(f"best {best_step_us / 1e3:.3f} ms")
    if note:
        parts.append(note)
    return "  ".join(parts)


SILENT = Reporter()
_current: ContextVar[Reporter] = ContextVar("devplace_progress", default=SILENT)


def current() -> Reporter:
    """The reporter long-running code should tell its progress to (silent unless one is installed)."""
    return _current.get()


@contextmanager
def reporting(reporter: Reporter):
    """Install ``reporter`` for the code run inside the ``with`` block."""
    token = _current.set(reporter)
    try:
        yield reporter
    finally:
        _current.reset(token)


@contextmanager
def showing_progress(console=None):
    """Show progress during the block: rich bars on ``console`` (a rich Console) when it is a
    terminal, else a ``LineReporter`` line every few seconds on its stream (logs and pipes keep them)."""
    if console is not None and not console.is_terminal:
        with reporting(LineReporter(every_s=2.0, stream=console.file)) as lines:
            yield lines
        return
    with reporting(RichReporter(console)) as bar, bar:
        yield bar


__all__ = ["Reporter", "LineReporter", "RichReporter", "showing_progress", "SILENT", "current", "reporting"]
