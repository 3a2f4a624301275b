"""YAML read strictly: a key given twice and nesting no file of ours needs are refused.

PyYAML keeps the last of two equal keys without a word (`trials: 10` then `trials: 1000`), and its
pure-Python composer recurses once per level, so a file nested 20,000 deep raises RecursionError.
libyaml (the C parser the PyYAML wheels bundle) is four times faster and stops at 1000 levels
itself; the pure-Python loader is the fallback, bounded here at `MAX_DEPTH`.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node

from apg_farm.errors import BadInput

#: Levels of nesting the pure-Python loader takes; libyaml's own limit is 1000. A sweep file needs 3.
MAX_DEPTH = 100
_MERGE = "tag:yaml.org,2002:merge"


class DuplicateKey(ConstructorError):
    """A mapping names the same key twice."""


class TooDeep(yaml.composer.ComposerError):
    """The document nests deeper than the loader takes."""


class _UniqueKeys(SafeConstructor):
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Checked on the keys as written, before `<<` merges (which may be overridden on purpose).
        first: dict[Any, Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                earlier = first.setdefault(key, key_node)
            except TypeError:  # unhashable: SafeConstructor refuses it with its own message
                continue
            if earlier is not key_node:
                raise DuplicateKey(None, None, _twice(earlier, key_node), key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _twice(first: Node, second: Node) -> str:
    line = first.start_mark.line + 1
    if first.value == second.value:
        return f"key {second.value!r} given twice (first at line {line})"
    # 1 and true, or 1 and 0x1: one key to Python, written two ways.
    return f"key {second.value!r} is key {first.value!r} of line {line} again"


class PureLoader(_UniqueKeys, yaml.SafeLoader):
    """The pure-Python safe loader, with unique keys and nesting bounded at MAX_DEPTH."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise TooDeep(
                    None,
                    None,
                    f"nested more than {MAX_DEPTH} levels deep",
                    self.peek_event().start_mark,  # type: ignore[no-untyped-call]
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


FastLoader: type[Any] | None = None
if yaml.__with_libyaml__:

    class _FastLoader(_UniqueKeys, yaml.CSafeLoader):
        """libyaml's safe loader (its own 1000-level bound), with unique keys."""

    FastLoader = _FastLoader


def load_yaml(text: str, *, source: str, fast: bool = True) -> Any:
    """One YAML document from `text`, or BadInput naming `source`, the line and the fix."""
    loader = FastLoader if fast and FastLoader is not None else PureLoader
    try:
        return yaml.load(text, Loader=loader)  # both are safe loaders
    except RecursionError:
        raise _too_deep(source, None) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        if isinstance(error, TooDeep) or "nesting depth" in problem:
            raise _too_deep(source, where) from None
        if isinstance(error, DuplicateKey):
            raise BadInput(
                f"{source}:{where.removeprefix(' at')}: {problem}",
                fix="keep one of the two: YAML would silently use only the last",
            ) from None
        raise BadInput(f"{source}: {problem}{where}", fix="correct the YAML syntax") from None


def _too_deep(source: str, where: str | None) -> BadInput:
    return BadInput(
        f"{source}: nested too deeply{where or ''}",
        fix="nothing the farm reads nests more than a few levels (a sweep file: 3); "
        "remove the extra brackets or indentation",
    )
