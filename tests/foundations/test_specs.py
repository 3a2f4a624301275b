"""Sweep files: validation names the field and the fix; nothing bad gets through."""

from __future__ import annotations

from pathlib import Path

import pytest

from apg_farm.errors import BadInput, NotFound
from apg_farm.specs import load_sweep, parse_sweep

GOOD = {
    "name": "s1",
    "tasks": ["dv01_view_build"],
    "models": ["anthropic/claude-sonnet-5-5"],
    "trials": 2,
}


def test_minimal_sweep_gets_defaults() -> None:
    """A sweep with only the required keys gets the default fixture set, agent and timeouts."""
    spec = parse_sweep(GOOD)
    assert spec.fixtures == ["kb_docs", "canvas_home"]
    assert spec.pool == "canvas_home,kb_docs"
    assert spec.retries == 2 and spec.timeouts.run == 5400


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"tasks": ["dv01; rm -rf /"]}, "tasks.0"),
        ({"tasks": ["$(reboot)"]}, "tasks.0"),
        ({"models": ["a b"]}, "models.0"),
        ({"models": ["-rf"]}, "models.0"),
        ({"tasks": []}, "tasks"),
        ({"models": ["m", "m"]}, "listed twice"),
        ({"trials": 0}, "trials"),
        ({"trials": "many"}, "trials"),
        ({"retries": -1}, "retries"),
        ({"timeouts": {"run": 0}}, "timeouts.run"),
        ({"timeouts": {"walk": 3}}, "timeouts.walk: unknown key"),
        ({"modles": ["x"]}, "modles: unknown key"),
        ({"name": "has space"}, "name"),
        ({"fixtures": ["kb docs"]}, "fixtures.0"),
    ],
)
def test_bad_values_are_rejected_naming_the_field(change: dict[str, object], needle: str) -> None:
    """Each bad value is refused with a message naming its field."""
    with pytest.raises(BadInput) as info:
        parse_sweep({**GOOD, **change})
    assert needle in str(info.value)


def test_missing_key_says_add_it() -> None:
    """A missing required key is named with the fix."""
    data = dict(GOOD)
    del data["models"]
    with pytest.raises(BadInput, match="models: required; add it"):
        parse_sweep(data)


def test_load_errors_are_typed(tmp_path: Path) -> None:
    """Missing file, bad YAML, non-UTF-8 and a non-mapping each give a clear typed error."""
    with pytest.raises(NotFound):
        load_sweep(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\ntasks: [a\n")
    with pytest.raises(BadInput, match="line"):
        load_sweep(broken)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(BadInput, match="UTF-8"):
        load_sweep(binary)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(BadInput, match="mapping"):
        load_sweep(listing)


def test_digest_is_stable() -> None:
    """The same spec always has the same digest; a change changes it."""
    assert parse_sweep(GOOD).digest() == parse_sweep(dict(GOOD)).digest()
    assert parse_sweep(GOOD).digest() != parse_sweep({**GOOD, "trials": 3}).digest()
