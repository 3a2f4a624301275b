"""The farm's own settings, read from APG_FARM_* environment variables. None of them ever reaches a bed."""

from __future__ import annotations

import difflib
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from apg_farm.errors import BadInput


class Settings(BaseModel):
    """Process-wide settings; every farm process reads the same ones: each field from
    `APG_FARM_<FIELD>` (any case) unless given as an argument."""

    # inf and nan are no durations: APG_FARM_LEASE_SECONDS=inf was taken (#31).
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    home: Path = Field(default_factory=lambda: Path.home() / ".apg-farm")
    """Folder for the embedded database and the demo's beds."""

    database_url: str | None = None
    """SQLAlchemy URL of the store; default SQLite at `<home>/farm.db`."""

    db_password: SecretStr | None = None
    """The store's password (APG_FARM_DB_PASSWORD), kept out of the URL: given with a
    `database_url` that names a user but no password, it is put into the URL percent-encoded, so
    any character (`@`, `/`, `%`, `:`) works."""

    broker_url: str | None = None
    """Celery broker (Redis); unset means the embedded executor."""

    lease_seconds: float | None = Field(default=None, gt=0)
    """How long a claim lives without renewal; a dead worker's attempt returns after this.
    Unset: the retry policy's (contract/retries.py; RetryPolicy.from_settings reads these four)."""

    no_worker_grace: float = Field(default=60.0, gt=0)
    """Seconds `sweep submit --wait` (and `run`, `sweep resume`) waits while the sweep's pool has no
    live worker, then exits 1 saying so."""

    visibility_timeout: float = Field(default=43200.0, gt=0)
    """Redis visibility timeout (s): above every attempt's hard time limit, so a slow attempt is
    never redelivered while it runs. Lost messages are found by the reconciler, not by this."""

    reconcile_seconds: float = Field(default=15.0, gt=0)
    """How often `apg-farm scheduler` reconciles the store with the broker."""
    window_per_bed: int = Field(default=2, ge=1, le=1000)
    """Messages a pool's queue holds per active bed (the broker window): submit sends only these,
    and the scheduler and each finished attempt top the queue up to it (docs/operations.md)."""
    provider_backoff: float | None = Field(default=None, gt=0)
    """Seconds a model is paused after its provider failed, doubling per trouble in a row."""
    provider_backoff_max: float | None = Field(default=None, gt=0)
    """The longest such pause."""
    start_window: float | None = Field(default=None, gt=0)
    """Seconds within which a run that says its adapter never started must have ended to be
    believed (a retry): a claim made later may come from an agent that did its work, saw it
    failing and wrote the claim to be tried again (docs/outcomes.md, the rule)."""

    canary_every: int = Field(default=0, ge=0)
    """A bed's canary (docs/operations.md, "Canaries") is due after this many executions on it
    since its last one; 0: not by count. A bed's own `apg-farm bed canary --every` wins."""
    canary_hours: float = Field(default=24.0, ge=0)
    """A bed's canary is due this many hours after its last one (or its enrolment); 0: not by
    time. A bed's own `apg-farm bed canary --hours` wins."""

    database_url_file: Path | None = None
    """A file holding `database_url` (its first line), for a URL with a password kept out of
    every environment; it must not be readable by group or others (chmod 600)."""
    db_password_file: Path | None = None
    """A file holding `db_password`, likewise private."""
    broker_url_file: Path | None = None
    """A file holding `broker_url`, likewise private."""

    evidence_dir: str | None = None
    """Where each execution's run folder is moved off its bed (workers/evidence.py), an absolute
    folder on the bed's host: this machine for a local bed, the bed's own host for an SSH bed.
    Unset: `<home>/evidence` for a local bed, `~/.apg-farm-evidence` on an SSH bed's host. It must
    lie outside the bed's approot and every container mount (refused otherwise)."""

    @model_validator(mode="before")
    @classmethod
    def _from_environment(cls, given: Any) -> Any:
        # What pydantic-settings did for this model (its import was a fifth of a read
        # command's start-up, #31): an argument wins, then the variable, then the default.
        if not isinstance(given, dict):
            return given
        environ = {name.lower(): value for name, value in os.environ.items()}
        found = {
            field: environ[f"apg_farm_{field}"]
            for field in cls.model_fields
            if f"apg_farm_{field}" in environ
        }
        return {**found, **given}

    @field_validator("evidence_dir")
    @classmethod
    def _evidence_dir_is_absolute(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if not value.startswith("/") or "\x00" in value or "\n" in value:
            raise ValueError(
                f"{value!r} is not an absolute folder; write /var/lib/apg-farm/evidence"
            )
        return value.rstrip("/") or "/"

    @field_validator("database_url_file", "db_password_file", "broker_url_file")
    @classmethod
    def _secret_file_is_private(cls, value: Path | None) -> Path | None:
        if value is not None:
            read_secret_file(value)  # refused now, with the field's name, not at first use
        return value

    @model_validator(mode="after")
    def _values_from_files(self) -> Settings:
        for name in ("database_url", "db_password", "broker_url"):
            path = getattr(self, f"{name}_file")
            if path is None:
                continue
            if getattr(self, name) is not None:
                raise ValueError(
                    f"APG_FARM_{name.upper()} and APG_FARM_{name.upper()}_FILE are both set; "
                    "keep one"
                )
            value = read_secret_file(path)
            if name == "broker_url":
                broker_problem(value)
            setattr(self, name, SecretStr(value) if name == "db_password" else value)
        return self

    @field_validator("home")
    @classmethod
    def _home_is_a_folder(cls, value: Path) -> Path:
        # A file here would surface much later as a traceback from whoever first makes a folder.
        if value.exists() and not value.is_dir():
            raise ValueError(f"{value} is a file, not a folder")
        return value

    @field_validator("broker_url")
    @classmethod
    def _broker_is_redis(cls, value: str | None) -> str | None:
        if value:
            broker_problem(value)
        return value

    def resolved_database_url(self) -> str:
        """The URL to open: the explicit one, or the embedded SQLite file under home."""
        if self.database_url:
            if self.db_password is None:
                return self.database_url
            return with_password(self.database_url, self.db_password.get_secret_value())
        return f"sqlite:///{self.home / 'farm.db'}"


def read_secret_file(path: Path) -> str:
    """The first line of a settings file that only its owner may read; ValueError saying how to
    fix it otherwise (like ssh with a private key: a file others can read holds no secret)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        if not path.is_file():
            raise ValueError(f"{path} is not a file")
        if mode & 0o077:
            raise ValueError(
                f"{path} is readable by group or others (mode {mode:o}); chmod 600 {path}"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    value = text.splitlines()[0].strip() if text.strip() else ""
    if not value:
        raise ValueError(f"{path} is empty; write the value on its first line")
    return value


def with_password(url: str, password: str) -> str:
    """`url` (which names a user and no password) with `password` percent-encoded into it."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at or not userinfo:
        raise BadInput(
            "APG_FARM_DB_PASSWORD is set but APG_FARM_DATABASE_URL names no user",
            field="APG_FARM_DATABASE_URL",
            fix="write the user in the URL without a password: postgresql://apg@host:5432/db",
        )
    if ":" in userinfo:
        raise BadInput(
            "APG_FARM_DB_PASSWORD is set and APG_FARM_DATABASE_URL has a password too",
            field="APG_FARM_DATABASE_URL",
            fix="leave the password out of the URL",
        )
    netloc = f"{userinfo}:{quote(password, safe='')}@{hostport}"
    return urlunsplit(parts._replace(netloc=netloc))


def broker_problem(url: str) -> None:
    """Raise ValueError unless `url` is a Redis URL both Celery and redis-py accept: the broker
    window and the broker view talk to Redis directly, so no other broker works."""
    parts = urlsplit(url)
    problem = None
    if parts.scheme not in ("redis", "rediss"):
        problem = f"{url!r} is not a Redis URL"
    else:
        try:
            parts.port  # noqa: B018 - urllib checks the port only when it is read
        except ValueError as error:
            problem = f"{error} in {url!r}"
        database = parts.path.lstrip("/")
        if problem is None and database and not database.isdigit():
            problem = f"the Redis database in {url!r} must be a number, not {database!r}"
    if problem:
        raise ValueError(f"{problem}; write redis://host:6379/0 (or rediss:// for TLS)")


PREFIX = "APG_FARM_"
#: `APG_FARM_*` names read or set outside `Settings`: by the farm's code (the dashboard token, a
#: worker's bed, the markers and variables a bed command or an upgrade script gets) and by the
#: repository's Compose file and image scripts (docs/operations.md). Anything else with the
#: prefix is most likely a typo, which pydantic would ignore without a word.
OTHER_NAMES = frozenset(
    {
        "APG_FARM_DASHBOARD_TOKEN",
        "APG_FARM_DASHBOARD_TOKEN_FILE",
        "APG_FARM_SECRETS_FD",
        "APG_FARM_WORKER_BED",
        "APG_FARM_COMMAND",
        "APG_FARM_ATTEMPT",
        "APG_FARM_BED",
        "APG_FARM_POOL",
        "APG_FARM_DDEV",
        "APG_FARM_FIXTURES",
        "APG_FARM_ROLLOUT",
        "APG_FARM_SSH_DIR",
        "APG_FARM_FLOWER_PORT",
        "APG_FARM_DASHBOARD_PORT",
        "APG_FARM_BASE_IMAGE",
        "APG_FARM_DEBIAN_MIRROR",
        "APG_FARM_DEBOOTSTRAP_TIMEOUT",
        "APG_FARM_DOCKERD_DRIVERS",
        "APG_FARM_DOCKERD_LOG",
        "APG_FARM_DOCKERD_WAIT",
        "APG_FARM_EXTRA_CA_DIR",
        "APG_FARM_IMAGE_CACHE",
        # Click's shell completion: the script `--show-completion` prints sets it.
        "APG_FARM_COMPLETE",
    }
)
#: Prefixes of names that belong to the test suite (tests/), never to a farm process.
TEST_PREFIXES = ("APG_FARM_TEST_", "APG_FARM_INSPECT_", "APG_FARM_DASHBOARD_SCREENSHOTS")


def known_names() -> frozenset[str]:
    """Every `APG_FARM_*` name the farm or its tooling reads."""
    fields = {f"APG_FARM_{name.upper()}" for name in Settings.model_fields}
    return frozenset(fields) | OTHER_NAMES


def unknown_names(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """Each `APG_FARM_*` variable of the environment that nothing reads, with the known name
    closest to it (None when none is close): a typo'd setting is otherwise silently unused."""
    env = os.environ if environ is None else environ
    known = known_names()
    found = []
    for name in sorted(env):
        if not name.startswith(PREFIX) or name in known or name.startswith(TEST_PREFIXES):
            continue
        # Compared without the prefix they all share, which would make any two names look alike.
        close = difflib.get_close_matches(name[len(PREFIX) :], [k[len(PREFIX) :] for k in known])
        found.append((name, PREFIX + close[0] if close else None))
    return found


_warned = False


def warn_unknown_names() -> None:
    """Say once per process, on stderr, which `APG_FARM_*` variables nothing reads."""
    global _warned
    if _warned:
        return
    _warned = True
    for name, close in unknown_names():
        hint = f"; did you mean {close}?" if close else ""
        sys.stderr.write(f"warning: {name} is not an apg-farm setting and is ignored{hint}\n")


def load_settings() -> Settings:
    """Settings from the environment, read at call time so tests can change them."""
    warn_unknown_names()
    try:
        return Settings()
    except ValidationError as error:
        # A problem across fields (a value and its file both set) has no location: its
        # message names the variables itself.
        problems = "; ".join(
            (f"APG_FARM_{str(p['loc'][0]).upper()}: " if p["loc"] else "")
            + p["msg"].removeprefix("Value error, ")
            for p in error.errors()
        )
        raise BadInput(problems or str(error), fix="correct the environment variable") from None
