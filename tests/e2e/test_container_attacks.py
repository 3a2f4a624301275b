"""The attack catalogue (docs/attacks.md) on container beds: a real web container on the real
Docker engine, under both assignments of run and grade. A file of its own so that pytest-xdist
(`--dist loadfile`) runs it beside tests/e2e/test_container_beds.py, not after it.

Needs the engine and the image of fixtures/container (`APG_FARM_TEST_BED_IMAGE`, exported by
.ci/run): skipped without them locally, a failure under CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from apg_farm.cli.attacks import CATALOGUE, Attack, run_attack
from apg_farm.fixtures import simbed
from apg_farm.store import Store
from tests.e2e.test_container_beds import ASSIGNMENTS
from tests.support.simbeds import bed_image


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ["web", "host"])
@pytest.mark.parametrize("attack", CATALOGUE, ids=[a.key for a in CATALOGUE])
def test_every_attack_ends_as_catalogued_on_a_container_bed(
    attack: Attack, assignment: str, sqlite_only_store: Store, tmp_path: Path
) -> None:
    """The attack catalogue (docs/attacks.md) on a bed with a real web container."""
    image, store = bed_image(), sqlite_only_store
    approot = tmp_path / "beds" / f"attack-{attack.key}".replace("_", "-")
    try:
        recorded = run_attack(
            store, tmp_path, attack, image=image, web_commands=ASSIGNMENTS[assignment]
        )
        assert recorded.as_catalogued, recorded
    finally:
        simbed.stop_container(approot)
