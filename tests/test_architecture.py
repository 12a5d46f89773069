"""The package's shape, as docs/architecture.md draws it: each folder imports only the floors below
it, no two files import each other (directly or round a loop), and no module outgrows a reader.

Imports are read with ``ast`` from the source (every ``import`` and ``from ... import``, at module
level or inside a function, ``TYPE_CHECKING`` blocks included), so a lazy import cannot hide an
upward arrow. Nothing is imported to check it.
"""

from __future__ import annotations

import ast
import pathlib

import networkx as nx
import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "flowride"

# Plain helpers every floor may use: error types, limits, units, file handling, schemas,
# argparse types, the rank launcher, clock offsets between ranks, the noisy neighbour.
BASE = {"errors", "sizes", "units", "files", "schema", "argtypes", "ranks", "clocks", "neighbour", "__init__"}
# What each folder (or top-level module) may import besides itself and BASE. Two stacks:
# synthesis (topology -> collectives -> schedule -> synth | program -> comm; api on synth) and
# harvesting (pipeline -> harvest -> sidetasks); cli sits on both.
ALLOWED: dict[str, set[str]] = {
    "topology": set(),
    "collectives": {"topology"},
    "schedule": {"topology", "collectives"},
    "runtime": {"topology", "collectives", "schedule"},
    "synth": {"topology", "collectives", "schedule", "runtime"},
    "program": {"topology", "collectives", "schedule"},
    "comm": {"topology", "collectives", "schedule", "program"},
    "api": {"topology", "collectives", "schedule", "synth", "runtime"},
    "sweep": {"topology", "collectives", "schedule", "synth", "program", "api", "runtime"},
    "pipeline": set(),
    "harvest": {"pipeline"},
    "sidetasks": {"harvest"},
    "concurrent": {"topology", "collectives", "schedule", "synth", "api", "runtime"},
    "plan": {"topology", "collectives", "schedule", "synth", "api", "concurrent", "pipeline", "harvest", "runtime"},
    "cli": {"topology", "collectives", "schedule", "synth", "program", "comm", "api", "sweep", "concurrent", "pipeline", "harvest",
            "sidetasks", "plan", "runtime"},
    "__main__": {"cli"},
}
MAX_LINES = 560  # "no module over ~550 lines"


def _files() -> list[pathlib.Path]:
    return sorted(SRC.rglob("*.py"))


def _module(path: pathlib.Path) -> str:
    """Dotted name under flowride: ``synth.lp``, ``synth`` for synth/__init__.py, ``__init__`` for the root."""
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(dotted: str, known: set[str]) -> str | None:
    """The module a ``flowride.x.y`` name lives in (``x.y`` if it is a module, else ``x``)."""
    parts = dotted.split(".")[1:]
    while parts:
        name = ".".join(parts)
        if name in known:
            return name
        parts = parts[:-1]
    return "__init__" if "__init__" in known else None


def _imports(path: pathlib.Path, known: set[str]) -> set[str]:
    """Every flowride module ``path`` imports, anywhere in the file."""
    out: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from pkg import sub`` imports the module ``sub``; ``from mod import name`` imports ``mod``
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; write flowride.<module> so the floors stay visible")
        for n in names:
            if n == "flowride" or n.startswith("flowride."):
                m = _resolve(n, known)
                if m is not None:
                    out.add(m)
    return out


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    files = {_module(p): p for p in _files()}
    g = nx.DiGraph()
    for mod, path in files.items():
        g.add_node(mod)
        for dep in _imports(path, set(files)):
            if dep != mod:
                g.add_edge(mod, dep)
    return g


def _floor(mod: str) -> str:
    return mod.split(".")[0]


def test_the_rules_name_every_folder():
    floors = {_floor(_module(p)) for p in _files()}
    assert floors <= BASE | set(ALLOWED), f"new folder(s) {sorted(floors - BASE - set(ALLOWED))}: give them a floor here and in docs/architecture.md"


def test_every_import_points_down(graph):
    wrong = []
    for a, b in graph.edges:
        fa, fb = _floor(a), _floor(b)
        if fa == fb or fb in BASE:
            continue
        allowed = set() if fa in BASE else ALLOWED[fa]
        if fb not in allowed:
            wrong.append(f"{a} -> {b}")
    assert not wrong, "imports that run up or sideways (see docs/architecture.md):\n" + "\n".join(sorted(wrong))


def test_base_modules_import_only_base(graph):
    wrong = [f"{a} -> {b}" for a, b in graph.edges if _floor(a) in BASE and _floor(b) not in BASE]
    assert not wrong, "\n".join(wrong)


def test_no_import_circles_between_files(graph):
    loops = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not loops, f"files that import each other round a loop: {loops}"


def test_the_checker_sees_lazy_and_upward_imports(tmp_path):
    """The reader is not blind: an import inside a function counts, and resolves to its module."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from flowride.synth.lp import build_lp\n    import flowride.api\n")
    assert _imports(f, {"synth.lp", "synth", "api", "__init__"}) == {"synth.lp", "api"}
    g = tmp_path / "g.py"
    g.write_text("from flowride.cli import demo\nfrom flowride.synth import bounds_of_nothing\n")
    assert _imports(g, {"cli", "cli.demo", "synth", "__init__"}) == {"cli.demo", "synth"}


def test_no_module_outgrows_a_reader():
    long = {str(p.relative_to(SRC)): n for p in _files() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}; split them along a real seam"
