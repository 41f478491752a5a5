"""The layers docs/architecture.md draws, checked against the imports: ``jobs`` imports no other app,
``cluster`` imports only ``jobs``, ``dashboard`` and ``chaos`` sit above both and below nothing, and
no app imports ``scheduler_project`` (this repository's own project). Read from the source with
``ast`` (imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APPS = ("jobs", "cluster", "dashboard", "chaos")
# What each app may import of the others.
ALLOWED = {
    "jobs": set(),
    "cluster": {"jobs"},
    "dashboard": {"cluster", "jobs"},
    "chaos": {"cluster", "jobs"},
}
FORBIDDEN_ALWAYS = {"scheduler_project"}


def imported_tops(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    tops: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            tops |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            tops.add(node.module.split(".")[0])
    return tops


def sources(app: str) -> list[Path]:
    return sorted(p for p in (ROOT / app).rglob("*.py") if "migrations" not in p.parts)


@pytest.mark.parametrize("app", APPS)
def test_an_app_imports_only_the_layers_below_it(app: str) -> None:
    wrong = {}
    for path in sources(app):
        tops = imported_tops(path) & (set(APPS) | FORBIDDEN_ALWAYS)
        bad = tops - ALLOWED[app] - {app}
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert wrong == {}, f"{app} imports above its layer: {wrong}"


def test_the_check_can_fail() -> None:
    """The reader sees an import from inside a function as well as a top-level one."""
    probe = ROOT / "var" / "layers_probe.py"
    probe.parent.mkdir(exist_ok=True)
    probe.write_text("def f():\n    from dashboard import views\n    import cluster.node\n")
    try:
        assert imported_tops(probe) == {"dashboard", "cluster"}
    finally:
        probe.unlink()
