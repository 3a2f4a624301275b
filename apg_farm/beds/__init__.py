"""Beds: enrolling, checking and maintaining them, local and remote.

`registry` adds, lists, releases and quarantines beds and keeps their events; `remote` enrols
beds over SSH and `inventory` applies a whole pool from one file; `escrow` records and checks the
escrow set and `identity` the baseline it holds (set key, code versions); `git_baseline`
records the bed's git repository with it and puts it back before each run, and `worktree` the
project's other files; `maintenance` runs
provision, escrow and doctor; `upgrade` rolls an upgrade across a pool; `mounts` asks Docker
what a bed's web container can see; `clone` grows a pool by a checked copy
of an escrowed bed; `triage` orders beds by what they need (quarantined, stuck, failing first). Imports store, contract and transports.
"""

from __future__ import annotations

from apg_farm.beds.clone import CloneRefused, CloneRequest, CloneResult, clone_bed, plan_clone
from apg_farm.beds.clone import Step as CloneStep
from apg_farm.beds.escrow import (
    EscrowRecord,
    apply_escrow_record,
    enrol_escrow,
    escrow_hash_argv,
    fingerprint_escrow_set,
    record_escrow_set,
)
from apg_farm.beds.fingerprints import ddev_config_argv, record_ddev_config
from apg_farm.beds.git_baseline import GIT_BASELINE, GIT_TIMEOUT, GitBaseline, read_git_baseline
from apg_farm.beds.git_baseline import clean_actions as git_clean_actions
from apg_farm.beds.git_baseline import clean_argv as git_clean_argv
from apg_farm.beds.git_baseline import clean_failure as git_clean_failure
from apg_farm.beds.git_baseline import parse_record as parse_git_record
from apg_farm.beds.git_baseline import record_argv as git_record_argv
from apg_farm.beds.hashes import hash_changes_in
from apg_farm.beds.inventory import apply_inventory, load_inventory
from apg_farm.beds.kept_paths import (
    DERIVATIVES as KEPT_DERIVATIVES,
)
from apg_farm.beds.kept_paths import (
    KEPT_PATHS,
    KeptFolder,
    KeptListing,
    list_kept,
    parse_listing,
    read_kept_listing,
)
from apg_farm.beds.maintenance import run_doctor, run_escrow, run_provision
from apg_farm.beds.mounts import (
    CREDENTIAL_NAMES,
    check_bed_mounts,
    classify_container,
    doctor_bed,
)
from apg_farm.beds.registry import (
    NewBed,
    add_bed,
    get_bed,
    list_beds,
    record_event,
    validate_new_bed,
)
from apg_farm.beds.remote import NewRemoteBed, add_remote_bed, set_docker_host
from apg_farm.beds.triage import PROBLEMS, SORT_KEYS, problem_of, stuck_beds, triage_rank
from apg_farm.beds.upgrade import STEPS as UPGRADE_STEPS
from apg_farm.beds.upgrade import (
    UpgradeOptions,
    UpgradePlan,
    UpgradeResult,
    plan_upgrade,
    run_upgrade,
)
from apg_farm.beds.web_environment import arrived as web_settings_arrived
from apg_farm.beds.web_environment import printenv_argv, web_settings
from apg_farm.beds.worktree import STDOUT_LIMIT as WORKTREE_STDOUT_LIMIT
from apg_farm.beds.worktree import TIMEOUT as WORKTREE_TIMEOUT
from apg_farm.beds.worktree import (
    WORKTREE,
    Worktree,
    parse_worktree,
    read_worktree,
    worktree_argv,
)

__all__ = [
    "CREDENTIAL_NAMES",
    "GIT_BASELINE",
    "GIT_TIMEOUT",
    "KEPT_DERIVATIVES",
    "KEPT_PATHS",
    "PROBLEMS",
    "SORT_KEYS",
    "UPGRADE_STEPS",
    "WORKTREE",
    "WORKTREE_STDOUT_LIMIT",
    "WORKTREE_TIMEOUT",
    "CloneRefused",
    "CloneRequest",
    "CloneResult",
    "CloneStep",
    "EscrowRecord",
    "GitBaseline",
    "KeptFolder",
    "KeptListing",
    "NewBed",
    "NewRemoteBed",
    "UpgradeOptions",
    "UpgradePlan",
    "UpgradeResult",
    "Worktree",
    "add_bed",
    "add_remote_bed",
    "apply_escrow_record",
    "apply_inventory",
    "check_bed_mounts",
    "classify_container",
    "clone_bed",
    "ddev_config_argv",
    "doctor_bed",
    "enrol_escrow",
    "escrow_hash_argv",
    "fingerprint_escrow_set",
    "get_bed",
    "git_clean_actions",
    "git_clean_argv",
    "git_clean_failure",
    "git_record_argv",
    "hash_changes_in",
    "list_beds",
    "list_kept",
    "load_inventory",
    "parse_git_record",
    "parse_listing",
    "parse_worktree",
    "plan_clone",
    "plan_upgrade",
    "printenv_argv",
    "problem_of",
    "read_git_baseline",
    "read_kept_listing",
    "read_worktree",
    "record_ddev_config",
    "record_escrow_set",
    "record_event",
    "run_doctor",
    "run_escrow",
    "run_provision",
    "run_upgrade",
    "set_docker_host",
    "stuck_beds",
    "triage_rank",
    "validate_new_bed",
    "web_settings",
    "web_settings_arrived",
    "worktree_argv",
]
