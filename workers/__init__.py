"""Workers: running attempts on beds.

`engine` runs one attempt on one bed, start to finish, recorded; `embedded` runs one thread per
bed in one process (no broker); `celery_app` and `tasks` are the distributed mode, one Celery
worker per bed; `harness` hands a prepared bed to an outside harness (Inspect); `evidence` moves each
execution's run folder off its bed. Imports scheduler (queue names, re-sending a retry), beds, store and contract.
"""

from __future__ import annotations

from apg_farm.workers.canary import CanaryResult, run_canary
from apg_farm.workers.celery_app import WORKER_BED, make_app, resume_consumer
from apg_farm.workers.container_state import diff_argv
from apg_farm.workers.embedded import EmbeddedExecutor, ExecutorResult
from apg_farm.workers.engine import AttemptEngine, AttemptReport
from apg_farm.workers.evidence import EvidenceRefused, Unneeded, remove_folder, unneeded_folders
from apg_farm.workers.farm_errors import FARM_ERROR_CHARS, farm_error_trace
from apg_farm.workers.harness import HandOver, Harness, HarnessEnd, Seat
from apg_farm.workers.host_files import find_argv

__all__ = [
    "FARM_ERROR_CHARS",
    "WORKER_BED",
    "AttemptEngine",
    "AttemptReport",
    "CanaryResult",
    "EmbeddedExecutor",
    "EvidenceRefused",
    "ExecutorResult",
    "HandOver",
    "Harness",
    "HarnessEnd",
    "Seat",
    "Unneeded",
    "diff_argv",
    "farm_error_trace",
    "find_argv",
    "make_app",
    "remove_folder",
    "resume_consumer",
    "run_canary",
    "unneeded_folders",
]
