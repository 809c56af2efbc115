"""The design's folder table, held: each of Loopline's packages imports only the packages its row of the table lets it
talk to (the design's arrows point down and never back up; only ``loopline/``, the composition root, imports them all).

Every import of every module counts, those inside functions (lazy imports) too. No stack needed.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Who may import whom (the design's "talks to" column): ``online``'s registry client is ``schemas.model_registry``.
TALKS_TO: dict[str, frozenset[str]] = {
    "schemas": frozenset(),
    "feature_store": frozenset({"schemas"}),
    "streams": frozenset({"schemas", "feature_store"}),
    "online": frozenset({"schemas", "feature_store"}),
    "feedback_loop": frozenset({"schemas", "feature_store", "streams"}),
    "offline_training": frozenset({"schemas", "feedback_loop"}),
    "infra": frozenset(),
    "loopline": frozenset({"schemas", "feature_store", "streams", "online", "feedback_loop", "offline_training", "infra"}),
}


def imported_packages(source: str) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def test_every_package_imports_only_what_the_design_table_lets_it() -> None:
    crossings = []
    for package, allowed in TALKS_TO.items():
        modules = sorted((REPO / package).rglob("*.py"))
        assert modules, f"{package}/ holds no module: the table names a folder that is gone"
        for module in modules:
            for line, imported in imported_packages(module.read_text()):
                if imported in TALKS_TO and imported != package and imported not in allowed:
                    crossings.append(f"{module.relative_to(REPO)}:{line} imports {imported}")
    assert not crossings, "imports against the design's folder table:\n" + "\n".join(crossings)


def test_the_check_sees_lazy_imports_and_passes_relative_ones_over() -> None:
    source = "import os\nfrom streams.recompute import x\n\ndef f():\n    import online.scorer\n    from . import sibling\n"
    assert imported_packages(source) == [(1, "os"), (2, "streams"), (5, "online")]
