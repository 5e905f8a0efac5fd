"""The floors of docs/architecture.md hold: every import (function-local ones included) points down or
stays inside its package, and no file of src/lowbit is part of an import circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "lowbit"

# Lower number = lower floor. A module may import its own package and any lower floor, never a higher one.
FLOORS = {
    "errors": 0, "_version": 0, "_checks": 1, "_io": 1, "_model": 1, "_persist": 2, "_checksum": 3, "models": 1, "datasets": 3,
    "native": 1, "casting": 1, "format_record": 1, "backend": 2, "formats": 3,  # _persist (2) builds on _io;
    # _checksum and datasets (3) on _persist (datasets: its corpus cache)
    "api": 4, "calibrate": 4, "qtensor": 4, "nn": 4,
    "optim": 5, "config": 5, "ops": 5,
    "graph": 6, "flows": 7, "export": 8, "report": 8,
    "ptq": 9, "convert": 9, "train": 9,
    "pipeline": 10, "search": 11, "cli": 12, "__main__": 13, "__init__": 13,
}  # fmt: skip


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _target_files(module: str) -> list[Path]:
    """The file(s) an import of ``module`` runs: the module itself (package __init__ or .py)."""
    relative = Path(*module.split("."))
    candidates = (SOURCE.parent / relative / "__init__.py", SOURCE.parent / relative.with_suffix(".py"))
    return [candidate for candidate in candidates if candidate.exists()]


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _imports(path: Path) -> set[Path]:
    """Every lowbit file ``path`` imports, at any depth of its code."""
    tree = ast.parse(path.read_text(), str(path))
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    modules: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):  # `import lowbit` names the package that is running already
            modules.update(alias.name for alias in node.names if alias.name != "lowbit")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not (here + ".").startswith(base + "."):  # an ancestor package is running already
                modules.add(base)
            modules.update(f"{base}.{alias.name}" for alias in node.names)  # lowbit.x.y when y is a module
    files: set[Path] = set()
    for module in modules:
        if module == "lowbit" or module.startswith("lowbit."):
            files.update(_target_files(module))
    files.discard(path)
    return files


def _floor_key(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return parts[0]


def _graph() -> dict[Path, set[Path]]:
    return {path: _imports(path) for path in sorted(SOURCE.rglob("*.py"))}


def test_every_package_has_a_floor():
    missing = sorted({_floor_key(path) for path in SOURCE.rglob("*.py")} - set(FLOORS))
    assert not missing, f"give these a floor in tests/test_layers.py and docs/architecture.md: {missing}"


def test_imports_point_down():
    upward = []
    for path, targets in _graph().items():
        source = _floor_key(path)
        for target in targets:
            destination = _floor_key(target)
            if destination != source and FLOORS[destination] >= FLOORS[source]:
                upward.append(f"{path.relative_to(SOURCE)} -> {target.relative_to(SOURCE)}")
    assert not upward, "imports that do not point down:\n" + "\n".join(sorted(upward))


def _cycle_from(graph: dict[Path, set[Path]]) -> list[Path] | None:
    state: dict[Path, int] = {}
    stack: list[Path] = []

    def visit(node: Path) -> list[Path] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in graph:
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle_between_files():
    graph = _graph()
    # A package's __init__ importing its own submodules, which import siblings through the package, is the
    # normal shape of a package; a circle is a file importing (directly or not) a file that imports it back
    # through a module other than its own package's __init__.
    inits = {path for path in graph if path.name == "__init__.py"}
    pruned = {path: {t for t in targets if not (t in inits and path.is_relative_to(t.parent))}
              for path, targets in graph.items()}  # fmt: skip
    cycle = _cycle_from(pruned)
    assert cycle is None, "import circle: " + " -> ".join(str(p.relative_to(SOURCE)) for p in cycle)


@pytest.mark.parametrize("module", ["lowbit.ptq", "lowbit.ops", "lowbit.calibrate", "lowbit.flows", "lowbit.graph",
                                    "lowbit.export", "lowbit.report", "lowbit.nn", "lowbit.qtensor"])  # fmt: skip
def test_documented_subpackages_are_attributes_of_lowbit(module):
    import subprocess
    import sys

    name = module.rpartition(".")[2]
    code = f"import lowbit, sys; m = lowbit.{name}; assert m.__name__ == {module!r}, m; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_import_lowbit_and_the_command_line_start_without_torch():
    import subprocess
    import sys

    code = "import sys, lowbit, lowbit.cli; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr[-2000:]


def test_ctrl_c_during_start_up_is_one_line_and_exit_130():
    import signal
    import subprocess
    import sys
    import time

    process = subprocess.Popen([sys.executable, "-m", "lowbit", "formats"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(0.4)  # past the interpreter's own start-up, inside the first heavy import
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert "Traceback" not in stderr, stderr[-2000:]
    assert process.returncode == 130 and stderr.strip() == "lowbit: interrupted", (process.returncode, stderr)


def test_ctrl_c_at_any_moment_is_one_line_and_130_or_the_finished_answer():
    """Delays across start-up, the command and the interpreter's shutdown: a Ctrl-C that a dependency's import
    swallowed, or that came once the answer was given, must not end in a traceback, an error line or death by
    the signal (status -2)."""
    import signal
    import subprocess
    import sys
    import time

    for delay in (0.2, 0.3, 0.4, 0.5, 0.7, 1.0, 1.2):
        process = subprocess.Popen([sys.executable, "-m", "lowbit", "formats"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)  # fmt: skip
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
        interrupted = (process.returncode, stderr.strip()) == (130, "lowbit: interrupted")
        finished = process.returncode == 0 and stderr.strip() == "" and "integer" in stdout
        assert interrupted or finished or _before_lowbit_ran(process.returncode, stderr), \
            (delay, process.returncode, stderr[-2000:])


def _before_lowbit_ran(status: int, stderr: str) -> bool:
    """A Ctrl-C that reached the interpreter before ``python -m lowbit`` ran a line of lowbit's entry point
    (interpreter start-up, runpy finding the package: 0.2 s is not enough for that on a loaded machine) ends
    the way Python ends any program there, which no program can change: killed by SIGINT after a traceback
    with no frame of lowbit's command."""
    frames = [line for line in stderr.splitlines() if line.strip().startswith("File ")]
    return status == -2 and stderr.rstrip().endswith("KeyboardInterrupt") and \
        not any("lowbit" in frame and "frozen" not in frame for frame in frames)


def test_no_bare_import_of_the_package_below_its_root():
    """``import lowbit`` inside the package reaches every lazy attribute and hides the arrow from the floor test
    above: a module imports the module it uses."""
    bare = []
    for path in sorted(SOURCE.rglob("*.py")):
        if path.parent == SOURCE and path.name in ("__init__.py", "__main__.py"):
            continue
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import) and any(alias.name == "lowbit" for alias in node.names):
                bare.append(f"{path.relative_to(SOURCE)}:{node.lineno}")
    assert not bare, "bare 'import lowbit' below the package root:\n" + "\n".join(bare)
