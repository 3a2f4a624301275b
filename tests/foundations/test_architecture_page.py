"""docs/architecture.md's "Where each question is answered": every `path:function` it names
exists, so the page cannot send a newcomer to a function that moved or was renamed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
#: `apg_farm/x/y.py:name` or `apg_farm/x/y.py:Class.method`, in backticks.
NAMED = re.compile(r"`(apg_farm/[\w/]+\.py):([\w.]+)`")


def _section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index("## Where each question is answered")
    return text[start : text.index("\n## ", start + 1)]


def _defined(path: Path) -> set[str]:
    """Every function and class of `path`, and each class's methods as `Class.method`."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return names


def test_every_function_the_page_names_exists() -> None:
    named = NAMED.findall(_section())
    assert len(named) >= 10  # one a question at least
    missing = [
        f"{path}:{name}"
        for path, name in named
        if not (ROOT / path).is_file() or name not in _defined(ROOT / path)
    ]
    assert missing == []


def test_a_renamed_function_is_found(tmp_path: Path) -> None:
    """The check itself: a name that is not defined, or a file that is not there, is missing."""
    module = tmp_path / "m.py"
    module.write_text(
        "def kept():\n    pass\n\nclass Policy:\n    def doubt(self):\n        pass\n"
    )
    assert _defined(module) == {"kept", "Policy", "Policy.doubt"}
    assert "renamed" not in _defined(module)
