"""The docs cannot drift from the code: README.md's "Using it" commands run as written (parsed from
the README, so editing it changes the test), and the cluster format lists every communication model."""

import re
import shlex
from pathlib import Path

import pytest

from devplace.cluster import COMM_MODELS

ROOT = Path(__file__).resolve().parent.parent
SMALL_GRAPH = ROOT / "devplace" / "data" / "gnmt_layers_training.json"  # 192 ops: every placer takes seconds
SMALL_MODEL = "zoo:mlp:preset=small"  # stands for any zoo target: a capture of seconds, not minutes
WRITES = ("-o", "--output", "--trace")


def using_it_commands() -> list[list[str]]:
    """The command lines of the first bash block under "## Using it", comments dropped."""
    section = (ROOT / "README.md").read_text().split("## Using it", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def small(arg: str) -> str:
    """The same command on a small input: GRAPH and model targets shrink, repository paths resolve."""
    if arg == "GRAPH":
        return str(SMALL_GRAPH)
    if arg.startswith("zoo:"):
        return SMALL_MODEL
    if arg.startswith("devplace/"):
        return str(ROOT / arg)
    return arg


def test_readme_block_is_what_this_test_reads():
    commands = using_it_commands()
    assert len(commands) >= 6 and all(c[0] == ".venv/bin/devplace" for c in commands)
    assert {c[1] for c in commands} >= {"info", "place", "simulate", "compare", "profile"}


@pytest.mark.slow
def test_every_command_in_the_readme_runs(tmp_path, monkeypatch):
    """In this process (``devplace`` is ``devplace.cli:app``), so torch and numba load once."""
    from typer.testing import CliRunner

    from devplace.cli import app

    monkeypatch.chdir(tmp_path)
    for command in using_it_commands():
        args = [small(arg) for arg in command[1:]]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, f"README: {shlex.join(command)}\n{result.output}"
        for flag, value in zip(args, args[1:]):
            if flag in WRITES:
                assert (tmp_path / value).exists(), f"README: {shlex.join(command)} wrote no {value}"


def test_cluster_format_lists_every_communication_model():
    text = (ROOT / "docs" / "cluster-format.md").read_text()
    for model in COMM_MODELS:
        assert re.search(rf"^- `{model}`: ", text, re.M), f"docs/cluster-format.md does not describe {model!r}"
