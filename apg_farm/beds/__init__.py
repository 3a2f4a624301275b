"""Beds: enrolling, checking and maintaining them, local and remote.

`registry` adds, lists, releases and quarantines beds and keeps their events; `remote` enrols
beds over SSH and `inventory` applies a whole pool from one file; `escrow` records and checks the
escrow set; `maintenance` runs provision, escrow and doctor; `mounts` asks Docker what a bed's
web container can see. Imports store, contract and transports.
"""

from __future__ import annotations

from apg_farm.beds.escrow import (
    EscrowRecord,
    apply_escrow_record,
    enrol_escrow,
    escrow_hash_argv,
    fingerprint_escrow_set,
    record_escrow_set,
)
from apg_farm.beds.fingerprints import ddev_config_argv, record_ddev_config
from apg_farm.beds.hashes import hash_changes_in
from apg_farm.beds.inventory import apply_inventory, load_inventory
from apg_farm.beds.maintenance import run_doctor, run_escrow, run_provision
from apg_farm.beds.mounts import check_bed_mounts, classify_container, doctor_bed
from apg_farm.beds.registry import (
    NewBed,
    add_bed,
    get_bed,
    list_beds,
    record_event,
    validate_new_bed,
)
from apg_farm.beds.remote import NewRemoteBed, add_remote_bed, set_docker_host
from apg_farm.beds.web_environment import arrived as web_settings_arrived
from apg_farm.beds.web_environment import printenv_argv, web_settings

__all__ = [
    "EscrowRecord",
    "NewBed",
    "NewRemoteBed",
    "add_bed",
    "add_remote_bed",
    "apply_escrow_record",
    "apply_inventory",
    "check_bed_mounts",
    "classify_container",
    "ddev_config_argv",
    "doctor_bed",
    "enrol_escrow",
    "escrow_hash_argv",
    "fingerprint_escrow_set",
    "get_bed",
    "hash_changes_in",
    "list_beds",
    "load_inventory",
    "printenv_argv",
    "record_ddev_config",
    "record_escrow_set",
    "record_event",
    "run_doctor",
    "run_escrow",
    "run_provision",
    "set_docker_host",
    "validate_new_bed",
    "web_settings",
    "web_settings_arrived",
]
