"""Library code does not print: long work reports to the progress hook, messages go to logging."""

import ast
from pathlib import Path

import devplace
from devplace.progress import Reporter, reporting

PACKAGE = Path(devplace.__file__).parent
MAY_WRITE = {"cli.py", "progress.py", "demo.py"}   # the command line, and the reporters it installs


def writes_to_the_terminal(path: Path) -> list[str]:
    """Calls of print() and uses of sys.stdout / sys.stderr in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} print()")
        if isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr") and \
                getattr(node.value, "id", None) == "sys":
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} sys.{node.attr}")
    return found


def test_no_library_module_prints():
    files = [p for p in PACKAGE.rglob("*.py") if p.name not in MAY_WRITE]
    assert len(files) > 40
    assert [hit for path in files for hit in writes_to_the_terminal(path)] == []


def test_measured_capture_reports_its_timing_runs_to_the_hook(capfd):
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    seen = []

    class Collect(Reporter):
        def begin(self, task, total=None):
            seen.append((task, total))

        def update(self, done, *, best_step_us=None, note=""):
            seen.append(done)

    loss = lambda out, y: nn.functional.cross_entropy(out, y)  # noqa: E731
    with reporting(Collect()):
        devplace.capture(model, (torch.randn(3, 8),), loss, targets=(torch.tensor([0, 1, 1]),),
                         cost="measured", repeats=2)
    assert seen == [("timing ops", 3), 1, 2, 3]
    assert capfd.readouterr() == ("", "")


def test_line_reporter_shows_a_short_tasks_last_update_when_it_ends():
    import io

    from devplace.progress import LineReporter

    out = io.StringIO()
    lines = LineReporter(every_s=3600.0, stream=out)
    lines.begin("search", total=3)
    for done in (1, 2, 3):
        lines.update(done, best_step_us=1000.0 * (4 - done))
    lines.end()
    shown = out.getvalue().splitlines()
    assert shown[0].startswith("[search] 1/3") and shown[-1].startswith("[search] 3/3  best 1.000 ms")
    assert len(shown) == 2
