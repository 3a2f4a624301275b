"""The farm's own settings, read from APG_FARM_* environment variables. None of them ever reaches a bed."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from apg_farm.defaults import PROVIDER_BACKOFF, PROVIDER_BACKOFF_MAX
from apg_farm.errors import BadInput


class Settings(BaseSettings):
    """Process-wide settings; every farm process reads the same ones."""

    model_config = SettingsConfigDict(env_prefix="APG_FARM_", extra="ignore")

    home: Path = Field(default_factory=lambda: Path.home() / ".apg-farm")
    """Folder for the embedded database and the demo's beds."""

    database_url: str | None = None
    """SQLAlchemy URL of the store; default SQLite at `<home>/farm.db`."""

    broker_url: str | None = None
    """Celery broker (Redis); unset means the embedded executor."""

    lease_seconds: float = Field(default=60.0, gt=0)
    """How long a claim lives without renewal; a dead worker's attempt returns after this."""

    no_worker_grace: float = Field(default=60.0, gt=0)
    """Seconds `sweep submit --wait` (and `run`, `sweep resume`) waits while the sweep's pool has no
    live worker, then exits 1 saying so."""

    visibility_timeout: float = Field(default=43200.0, gt=0)
    """Redis visibility timeout (s): above every attempt's hard time limit, so a slow attempt is
    never redelivered while it runs. Lost messages are found by the reconciler, not by this."""

    reconcile_seconds: float = Field(default=15.0, gt=0)
    """How often `apg-farm scheduler` reconciles the store with the broker."""
    provider_backoff: float = Field(default=PROVIDER_BACKOFF, gt=0)
    """Seconds a model is paused after its provider failed, doubling per trouble in a row."""
    provider_backoff_max: float = Field(default=PROVIDER_BACKOFF_MAX, gt=0)
    """The longest such pause."""

    @property
    def backoff(self) -> tuple[float, float]:
        return (self.provider_backoff, max(self.provider_backoff, self.provider_backoff_max))

    def resolved_database_url(self) -> str:
        """The URL to open: the explicit one, or the embedded SQLite file under home."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.home / 'farm.db'}"


def load_settings() -> Settings:
    """Settings from the environment, read at call time so tests can change them."""
    try:
        return Settings()
    except ValidationError as error:
        problems = "; ".join(
            f"APG_FARM_{str(p['loc'][0]).upper()}: {p['msg']}" for p in error.errors() if p["loc"]
        )
        raise BadInput(problems or str(error), fix="correct the environment variable") from None
