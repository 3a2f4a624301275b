"""Which store backends a test runs on: the `store` fixture (conftest.py) gives each test
SQLite and PostgreSQL; `SQLITE_ONLY` narrows a test to SQLite, for the slow end-to-end tests
whose store paths other tests take on both backends already."""

from __future__ import annotations

import pytest

#: `@SQLITE_ONLY` on a test taking `store` (or `pytestmark = SQLITE_ONLY` on a module).
SQLITE_ONLY = pytest.mark.parametrize("store", ["sqlite"], indirect=True)
