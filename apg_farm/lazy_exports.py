"""A package `__init__` that imports its modules when a name is first asked for (PEP 562).

A wing's `__init__` lists the names it exports once, as ordinary imports under
`if TYPE_CHECKING:` (mypy and readers see them there), and sets
`__getattr__ = lazy_exports(__name__, __file__)` outside that block. The first access to a name
imports only the module that defines it. Why: `apg-farm sweep list` needs the store's tables,
not the claim machinery, the sweep file's pydantic models or the transports that its `__init__`
used to import with them (issue #31: read commands under 0.5 s of CPU).
"""

from __future__ import annotations

import ast
import functools
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def lazy_exports(package: str, init_file: str) -> Callable[[str], Any]:
    """The module `__getattr__` of `package`, whose `__init__` is `init_file`."""

    def __getattr__(name: str) -> Any:
        where = _exports(init_file).get(name)
        if where is None:
            # `pkg.submodule` as the eager `__init__` allowed it, once anything imported it.
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as error:
                if error.name != f"{package}.{name}":
                    raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = where
        value = getattr(importlib.import_module(module), attribute)
        setattr(sys.modules[package], name, value)  # the next access is a plain lookup
        return value

    return __getattr__


@functools.cache
def _exports(init_file: str) -> dict[str, tuple[str, str]]:
    """Each exported name: (the module it comes from, its name there), read from the
    `if TYPE_CHECKING:` block of `init_file` (about 2 ms for a long `__init__`)."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    found: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for statement in node.body:
            if isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
                for alias in statement.names:
                    found[alias.asname or alias.name] = (statement.module, alias.name)
    return found
