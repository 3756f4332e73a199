"""Layering: placers sit at the bottom; the portfolio, compare, report and cli build on them, never the reverse."""

import ast
import subprocess
import sys
from pathlib import Path

import devplace

PLACERS = Path(devplace.__file__).parent / "placers"
ABOVE = ("devplace.portfolio", "devplace.compare", "devplace.cli", "devplace.report")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, at any depth (inside functions too), with its line; a
    ``from devplace import x`` counts as ``devplace.x``, and ``import_module("...")`` as its string."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            if node.module == "devplace":
                found += [(node.lineno, f"devplace.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            found += [(node.lineno, arg.value) for arg in node.args[:1] if isinstance(arg, ast.Constant)]
    return found


def upward_imports(path: Path) -> list[str]:
    return [f"{path.name}:{line} imports {module}" for line, module in imported_modules(path)
            if module in ("devplace", "devplace.place") or module.startswith(ABOVE)]


def test_no_placer_imports_a_layer_above_it():
    files = sorted(PLACERS.glob("*.py"))
    assert len(files) >= 10
    bad = [finding for path in files for finding in upward_imports(path)]
    assert bad == []


def test_the_walk_sees_imports_hidden_in_functions(tmp_path):
    hidden = tmp_path / "sneaky.py"
    hidden.write_text("import numpy\n\ndef f():\n    from devplace.compare import parse_algo\n"
                      "    from devplace import portfolio\n    import devplace as dp\n")
    assert [f.split(" imports ")[1] for f in upward_imports(hidden)] == [
        "devplace.compare", "devplace", "devplace.portfolio", "devplace"]


def test_placers_listed_in_one_registry_whatever_is_imported_first():
    # sim-search lives in the portfolio yet is listed with the others, even by the bottom layer's function
    code = "import devplace.placers as p; print(sorted(p.available()))"
    listed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    from devplace.portfolio import available

    assert "'sim-search'" in listed and listed.strip() == str(sorted(available()))
    assert available()["sim-search"].module == "devplace.portfolio.sim_search"
