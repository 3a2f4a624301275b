"""Commands: bed, sweep, run, report, demo."""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from rich.markup import escape

from apg_farm.cli import analysis as analysis_cli
from apg_farm.cli import (
    bed_list,
    budget,
    canary,
    distributed,
    evidence,
    grow,
    pool,
    remote,
    sweep_file,
    sweeps,
)
from apg_farm.cli.common import (
    err,
    human_output,
    json_option,
    machine_output,
    open_store,
    out,
    print_json,
    print_table,
    print_verdict,
    report_table,
)
from apg_farm.cli.completion import (
    completing,
    completion_option,
    install_completion,
    register_completion_classes,
    show_completion,
)
from apg_farm.cli.logs import configure_logging, pick_level
from apg_farm.cli.running import bed_doctor, doctor_lines, execute_sweep, interrupted_lines
from apg_farm.defaults import MAX_ATTEMPTS
from apg_farm.errors import BadInput, FarmError

if TYPE_CHECKING:
    from apg_farm.scheduler import Submission
    from apg_farm.specs import SweepSpec
    from apg_farm.store import Store

app = typer.Typer(
    name="apg-farm",
    help="Run AI-agent evaluation sweeps on a pool of ai_proving_ground beds.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Ours take the shell's name (completion.py).
    add_completion=False,
    # `-h` beside `--help` on every command: subcommands inherit the root's help option names.
    context_settings={"help_option_names": ["-h", "--help"]},
)
bed_app = typer.Typer(help="Enrol, inspect and release beds.", no_args_is_help=True)
sweep_app = typer.Typer(help="Submit, list, watch, cancel and delete sweeps.", no_args_is_help=True)
db_app = typer.Typer(help="The store's schema.", no_args_is_help=True)
model_app = typer.Typer(help="Models the farm paused.", no_args_is_help=True)
app.add_typer(bed_app, name="bed")
app.add_typer(sweep_app, name="sweep")
remote.register(app, bed_app)
bed_list.register(bed_app)
canary.register(bed_app)
grow.register(bed_app)
budget.register(app)
evidence.register(app)
pool.register(app)
sweeps.register(sweep_app)
app.add_typer(db_app, name="db")
app.add_typer(model_app, name="model")

log = logging.getLogger(__name__)


def _show_version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        out.print(f"apg-farm {version('apg-farm')}", markup=False)
    except PackageNotFoundError:
        out.print("apg-farm (version unknown: the package is not installed)", markup=False)
    raise typer.Exit()


@app.callback()
def farm_options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print apg-farm's version and exit.",
        ),
    ] = False,
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose",
            "-v",
            count=True,
            show_default=False,
            help="Log more: the farm's debug lines as well.",
        ),
    ] = 0,
    quiet: Annotated[
        int,
        typer.Option("--quiet", "-q", count=True, show_default=False, help="Log errors only."),
    ] = 0,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            metavar="LEVEL",
            help="The farm's log level: debug, info (the default), warning or error.",
        ),
    ] = None,
    show_completion: Annotated[
        str | None,
        completion_option("--show-completion", show_completion, "Print the completion script"),
    ] = None,
    install_completion: Annotated[
        str | None,
        completion_option(
            "--install-completion", install_completion, "Install the completion script"
        ),
    ] = None,
) -> None:
    # Options given before the command (`apg-farm -v run FILE`): they set the farm's loggers.
    level = pick_level(verbose=verbose, quiet=quiet, log_level=log_level)
    configure_logging(level)
    log.debug("log level %s", logging.getLevelName(level))


def _split(value: str, field: str) -> tuple[str, ...]:
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    if not items:
        raise BadInput(
            "empty list", field=field, fix="give comma-separated names, e.g. kb_docs,canvas_home"
        )
    return items


def _env_pairs(values: list[str]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in values:
        name, sep, value = item.partition("=")
        if not sep:
            raise BadInput(f"{item!r} is not NAME=VALUE", field="--env")
        pairs.append((name, value))
    return tuple(pairs)


@bed_app.command("add")
def bed_add(
    name: Annotated[str, typer.Argument(help="A name for the bed, unique in the farm.")],
    approot: Annotated[Path, typer.Option("--approot", help="The bed's DDEV project folder.")],
    ddev: Annotated[str, typer.Option("--ddev", help="The ddev executable.")] = "ddev",
    fixtures: Annotated[
        str, typer.Option("--fixtures", help="The bed's fixture set.")
    ] = "kb_docs,canvas_home",
    escrow_set: Annotated[
        Path | None,
        typer.Option("--escrow-set", help="The escrow set `ddev ai-eval-escrow` printed."),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="NAME=VALUE given to every bed command (no secrets)."),
    ] = None,
    ssh: Annotated[
        str | None, typer.Option("--ssh", help="user@host[:port]: the bed is on that host.")
    ] = None,
    identity: Annotated[Path | None, typer.Option("--identity", help="SSH private key.")] = None,
    known_hosts: Annotated[
        Path | None,
        typer.Option(
            "--known-hosts", help="known_hosts file (default: $APG_FARM_HOME/known_hosts)."
        ),
    ] = None,
    trust_host_key: Annotated[
        bool, typer.Option("--trust-host-key", help="Pin an unknown host key on first use.")
    ] = False,
    docker_host: Annotated[
        str | None, typer.Option("--docker-host", help="Docker engine for the mounts check.")
    ] = None,
    host_only: Annotated[
        bool,
        typer.Option(
            "--host-only",
            help="The bed has no web container: every command runs on its host (simulated beds).",
        ),
    ] = False,
    untrusted_verifier: Annotated[
        bool,
        typer.Option(
            "--untrusted-verifier",
            help="Run attempts with no escrow set: verified by the agent-writable ddev wrapper; "
            "reports say so.",
        ),
    ] = False,
) -> None:
    """Enrol a bed: on this machine, or on another host with --ssh.

    A bed takes attempts once its escrow set is recorded (--escrow-set, or `apg-farm bed escrow`),
    or when enrolled with --untrusted-verifier."""
    from apg_farm.beds import NewBed, add_bed, record_escrow_set, set_docker_host

    if ssh is not None:
        remote.add_ssh_bed(
            name=name,
            ssh=ssh,
            approot=str(approot),
            ddev=ddev,
            fixtures=_split(fixtures, "--fixtures"),
            escrow_set=str(escrow_set) if escrow_set else None,
            env=_env_pairs(env or []),
            identity=identity,
            known_hosts=known_hosts,
            trust_host_key=trust_host_key,
            docker_host=docker_host,
            untrusted_verifier=untrusted_verifier,
            host_only=host_only,
        )
        return
    if identity or known_hosts or trust_host_key:
        raise BadInput(
            "only for a bed on another host",
            field="--identity/--known-hosts/--trust-host-key",
            fix="add --ssh user@host",
        )
    store = open_store(create=True)
    row = add_bed(
        store,
        NewBed(
            name=name,
            approot=approot,
            ddev=ddev,
            fixtures=_split(fixtures, "--fixtures"),
            escrow_set=escrow_set,
            env=_env_pairs(env or []),
            untrusted_verifier=untrusted_verifier,
            host_only=host_only,
        ),
    )
    if docker_host:
        set_docker_host(store, row.name, docker_host)
    out.print(escape(f"bed {row.name} added to pool {row.pool} ({row.approot})"))
    if row.escrow_set is not None:
        record_escrow_set(store, row, row.escrow_set)
    elif row.untrusted_verifier:
        err.print(
            "[yellow]warning:[/] --untrusted-verifier: verification uses `ddev ai-eval-verify`, which "
            "an agent can rewrite; reports of sweeps that ran here say so."
        )
    else:
        err.print(
            "[yellow]note:[/] no escrow set yet: the bed takes no attempt until `apg-farm bed escrow "
            f"{row.name}` records one (or it is enrolled with --untrusted-verifier)."
        )


@bed_app.command("doctor")
def bed_doctor_cmd(
    name: str,
    via_worker: Annotated[
        bool,
        typer.Option(
            help="Ask the bed's worker (its `bed.NAME` queue) instead of running it here."
        ),
    ] = False,
    run_canary: Annotated[
        bool,
        typer.Option(
            "--canary",
            help="Run the bed's canary instead: verify, reset and grade a task with no agent; "
            "a PASSED or a grade that cannot run quarantines the bed.",
        ),
    ] = False,
    task: Annotated[
        str | None, typer.Option(help="With --canary: the task to grade (default: the bed's).")
    ] = None,
    dataset: Annotated[
        str | None, typer.Option(help="With --canary and --task: the dataset named with it.")
    ] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Run `ddev ai-eval-doctor` on the bed and show its verdict (or, with --canary, its canary).

    Exit 0 healthy, 1 not; --json prints the whole verdict (APG's checks and the effective
    mounts)."""
    from apg_farm.beds import get_bed

    if (task or dataset) and not run_canary:
        raise BadInput("--task and --dataset go with --canary", field="--task", fix="add --canary")
    if run_canary:
        if via_worker:
            raise BadInput(
                "--canary runs here, not through the bed's worker (its claim loop runs the due ones)",
                field="--via-worker",
                fix="drop --via-worker",
            )
        canary.doctor_canary(name, task=task, dataset=dataset, as_json=as_json)
        return
    if as_json:
        machine_output()
    store = open_store()
    if via_worker:
        event = distributed.maintenance_via_worker(store, get_bed(store, name), "doctor")
        healthy = event.startswith("healthy")
        if as_json:
            print_json({"bed": name, "healthy": healthy, "event": event})
        else:
            out.print(event, markup=False, soft_wrap=True)
        if not healthy:
            raise typer.Exit(1)
        return
    healthy, verdict = bed_doctor(store, get_bed(store, name))
    if as_json:
        print_json(verdict)
    else:
        for line in doctor_lines(name, healthy, verdict):
            out.print(line, markup=False, soft_wrap=True)
    if not healthy:
        raise typer.Exit(1)


@bed_app.command("release")
def bed_release(
    name: str,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Release without running the bed's doctor first (it may fail again)."
        ),
    ] = False,
) -> None:
    """Return a quarantined bed to its pool once a human has looked at it: its doctor runs first,
    and a bed it calls NOT healthy stays out (exit 1)."""
    from apg_farm.beds import get_bed
    from apg_farm.scheduler import pool_queue
    from apg_farm.store import release_bed
    from apg_farm.workers import resume_consumer

    store = open_store()
    if not force:
        # A bed released while its doctor fails is quarantined again at its next attempt.
        healthy, verdict = bed_doctor(store, get_bed(store, name))
        if not healthy:
            for line in doctor_lines(name, healthy, verdict)[:-1]:
                err.print(line, markup=False, soft_wrap=True)
            err.print(
                f"bed {name} stays quarantined: its doctor is NOT healthy; fix what it names, "
                "or release it anyway with --force",
                markup=False,
                soft_wrap=True,
            )
            raise typer.Exit(1)
    row = release_bed(store, name)
    out.print(f"bed {row.name} is active again")
    resume_consumer(pool_queue(row.pool), (row.meta or {}).get("worker"))


@model_app.command("release")
def model_release(model: str) -> None:
    """Let a model paused for claims the farm could not check run again (docs/outcomes.md,
    "Claims"): look at its attempts' reasons first."""
    from apg_farm.store import release_model

    if not release_model(open_store(), model):
        out.print(f"model {model} is not paused for its claims")
        raise typer.Exit(1)
    out.print(f"model {model} may run again")


@sweep_app.command("submit")
def sweep_submit(
    file: Path,
    wait: Annotated[bool, typer.Option(help="Block until every attempt has an outcome.")] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Validate and estimate cost and time from earlier executions; store nothing.",
        ),
    ] = False,
    as_json: Annotated[
        bool,
        json_option(
            "Print one JSON document on stdout and nothing else there: the estimate with "
            "--dry-run, {ok, submitted, report} with --wait, else {submitted, dispatched}."
        ),
    ] = False,
    detect: Annotated[
        float | None,
        typer.Option(
            "--detect",
            help="With --dry-run: the trials per (task, model) a paired comparison of the "
            "models needs to detect this difference in pooled pass rate (e.g. 0.05), and their price.",
        ),
    ] = None,
    power: Annotated[
        float | None, typer.Option("--power", help="With --detect: the power wanted (0.8).")
    ] = None,
    alpha: Annotated[
        float | None,
        typer.Option("--alpha", help="With --detect: the two-sided significance level (0.05)."),
    ] = None,
    correlation: Annotated[
        float | None,
        typer.Option(
            "--correlation",
            help="With --detect: the models' correlation on a cell, instead of history's or 0.",
        ),
    ] = None,
    task_sd: Annotated[
        float | None,
        typer.Option(
            "--task-sd",
            help="With --detect: the SD across tasks of the difference, instead of history's "
            "or 0.1.",
        ),
    ] = None,
    max_attempts: sweep_file.MaxAttempts = MAX_ATTEMPTS,
    yes: sweep_file.Yes = False,
) -> None:
    """Create a sweep's attempts (idempotent) and, with a broker configured, send them to the beds.

    --dry-run stores and sends nothing: it estimates cost and time from earlier executions;
    with --detect, also the trials a paired comparison of the models needs, and their price.
    A sweep of more than 1,000,000 attempts is refused unless --max-attempts allows it; one of
    more than 100,000 is submitted only with --yes (or a yes at the terminal's question)."""
    from dataclasses import asdict

    from apg_farm.scheduler import check_flags, estimate_sweep, plan_power

    if dry_run and wait:
        raise BadInput(
            "--dry-run and --wait cannot go together: a dry run sends nothing to wait for",
            field="--dry-run",
            fix="drop --wait, or --dry-run to submit",
        )
    if as_json:
        machine_output()
    wanted = check_flags(
        dry_run=dry_run,
        detect=detect,
        power=power,
        alpha=alpha,
        correlation=correlation,
        task_sd=task_sd,
    )
    # The file first: a refused one leaves the store as it was.
    if dry_run:
        spec = sweep_file.price_sweep(file, max_attempts=max_attempts)
    else:
        spec = sweep_file.read_sweep(file, max_attempts=max_attempts, yes=yes)
    # A dry run stores nothing, so it needs a store that exists (a mistyped URL would otherwise
    # price the sweep against a new empty one and say it has no history).
    store = open_store(create=not dry_run)
    if dry_run:
        # What submit checks (the file, the broker's limits, the stored sweep), then no write.
        if distributed.broker_configured():
            distributed.check_limits(spec)
        estimate = estimate_sweep(store, spec)
        plan = None if wanted is None else plan_power(store, spec, estimate, **wanted)
        if as_json:
            data = estimate.as_dict()
            if plan is not None:
                data["power"] = plan.as_dict()
            print_json(data)
        else:
            out.print(estimate.describe(), markup=False, soft_wrap=True)
            if plan is not None:
                out.print(plan.describe(), markup=False, soft_wrap=True)
        return
    if wait and not distributed.broker_configured():
        raise BadInput(
            "--wait needs a broker",
            field="APG_FARM_BROKER_URL",
            fix="or use `apg-farm run FILE`",
        )
    result = _submit_spec(store, spec)
    if wait:
        # As `run` on the workers: dispatch, wait, then the results table (or the JSON).
        _run_to_the_end(store, result.sweep_id, as_json=as_json, submitted=result)
        return
    dispatched = distributed.dispatch(store) if distributed.broker_configured() else None
    out.print(dispatched or "no broker configured: run it with `apg-farm run FILE` (embedded)")
    if as_json:
        print_json({"submitted": asdict(result), "dispatched": dispatched})


@sweep_app.command("retry")
def sweep_retry(
    sweep: Annotated[str, typer.Argument(help="Sweep id or name.")],
    only: Annotated[
        str, typer.Option(help="Outcomes to run again, comma-separated.")
    ] = "error,invalid",
) -> None:
    """Run again the attempts that ended ERROR or INVALID, as new executions (history is kept)."""
    from apg_farm.results import find_sweep
    from apg_farm.scheduler import parse_retry_outcomes
    from apg_farm.store import retry_attempts

    outcomes = parse_retry_outcomes(only)
    store = open_store()
    target = find_sweep(store, sweep)
    count = retry_attempts(store, target.id, outcomes)
    out.print(f"{count} attempts queued again")
    if distributed.broker_configured():
        out.print(distributed.dispatch(store))
    else:
        out.print(
            f"run them with `apg-farm run` on the sweep file, or `apg-farm sweep resume {target.name}`"
        )


@sweep_app.command("status")
def sweep_status_cmd(
    sweep: Annotated[str, typer.Argument(help="Sweep id or name.")],
    as_json: Annotated[bool, json_option()] = False,
    watch: Annotated[bool, typer.Option(help="Redraw until the sweep is done.")] = False,
    interval: Annotated[float, typer.Option(min=0.5, help="Seconds between redraws.")] = 2.0,
) -> None:
    """Progress per model, running attempts per bed with their phase, quarantined beds, ETA."""
    analysis_cli.status_command(sweep, as_json=as_json, watch=watch, interval=interval)


@sweep_app.command("cancel")
def sweep_cancel(sweep: Annotated[str, typer.Argument(help="Sweep id or name.")]) -> None:
    """Cancel queued attempts now and running ones at their next phase boundary."""
    from apg_farm.results import find_sweep
    from apg_farm.store import cancel_sweep

    store = open_store()
    cancelled = cancel_sweep(store, find_sweep(store, sweep).id)
    out.print(f"cancelled {cancelled} queued attempts; running ones stop at their next phase")


@sweep_app.command("set-priority")
def sweep_set_priority(
    sweep: Annotated[str, typer.Argument(help="Sweep id or name.")],
    weight: Annotated[
        str, typer.Argument(metavar="N", help="The sweep's weight on its pool, 1 to 1000.")
    ],
) -> None:
    """Change a sweep's weight: its queued attempts are claimed in proportion to it against the
    other sweeps of its pool (3 against 1: three claims in four). Nothing running is preempted."""
    from apg_farm.results import find_sweep
    from apg_farm.specs import check_priority
    from apg_farm.store import set_priority

    text = weight.strip()
    value: object = int(text) if text.lstrip("+-").isdigit() else text
    checked = check_priority(value)
    store = open_store()
    done = set_priority(store, find_sweep(store, sweep).id, checked)
    out.print(
        f"sweep {done.sweep}: priority {done.old} -> {done.new}; "
        f"{done.placed} queued attempts re-placed"
    )
    if distributed.broker_configured():
        # The window holds the next few attempts in the old order: the rest follow the new one.
        out.print(distributed.dispatch(store))


#: --json of the commands that run a sweep to its end.
RUN_JSON_HELP = (
    "At the end, print one JSON document on stdout ({ok, submitted, report}) and nothing else "
    "there; the progress and messages go to stderr."
)


@app.command("run")
def run_cmd(
    file: Path,
    max_attempts: sweep_file.MaxAttempts = MAX_ATTEMPTS,
    yes: sweep_file.Yes = False,
    as_json: Annotated[bool, json_option(RUN_JSON_HELP)] = False,
) -> None:
    """Submit a sweep file and run it to the end (embedded, or on the workers when a broker is set),
    then print the results table. Ctrl-C stops it and says how to resume.

    The same limits as `sweep submit`: over 1,000,000 attempts needs --max-attempts, over
    100,000 needs --yes."""
    if as_json:
        machine_output()
    spec = sweep_file.read_sweep(file, max_attempts=max_attempts, yes=yes)
    store = open_store(create=True)
    submitted = _submit_spec(store, spec)
    _run_to_the_end(store, submitted.sweep_id, as_json=as_json, submitted=submitted)


@app.command("report")
def report_cmd(
    sweep: Annotated[str, typer.Argument(help="Sweep id or name.")],
    fmt: Annotated[
        str, typer.Option("--format", help="table, json, csv or html (json: the same as --json)")
    ] = "table",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file, not stdout.")
    ] = None,
    k: Annotated[int | None, typer.Option(help="k of pass@k and pass^k (default 5).")] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Per-model, per-task results with Wilson 95 % intervals, pass@k and model comparisons."""
    analysis_cli.report_command(sweep, fmt, output, k, as_json=as_json)


@app.command("demo")
def demo_cmd(
    beds: Annotated[int, typer.Option(min=1, max=64, help="Simulated beds.")] = 4,
    trials: Annotated[int, typer.Option(min=1, max=1000, help="Trials per (task, model).")] = 10,
    time_scale: Annotated[
        float, typer.Option(min=1, help="Divide real bed timings by this.")
    ] = 400,
    faults: Annotated[bool, typer.Option(help="Inject faults on some beds.")] = False,
    attacks: Annotated[
        bool,
        typer.Option(
            "--attacks",
            help="Instead, play every attack of the catalogue (docs/attacks.md), one bed each, "
            "and print what the farm recorded; exit 1 unless each ended as catalogued.",
        ),
    ] = False,
) -> None:
    """Run a sweep of 2 models x 3 tasks on simulated beds, embedded, and print the results."""
    if attacks:
        from apg_farm.cli.attacks import play_catalogue

        if not play_catalogue(open_store(create=True)):
            raise typer.Exit(1)
        return
    from apg_farm.cli.demo import run_demo

    ok = run_demo(
        open_store(create=True), beds=beds, trials=trials, time_scale=time_scale, faults=faults
    )
    if not ok:
        raise typer.Exit(1)


@sweep_app.command("resume")
def sweep_resume(
    sweep: Annotated[str, typer.Argument(help="Sweep id or name.")],
    as_json: Annotated[bool, json_option(RUN_JSON_HELP)] = False,
) -> None:
    """Run what is left of a sweep (after an interruption, a retry or a bed release), then print
    the results table. Attempts an interrupted run left holding beds are waited for (it says so)
    until their lease runs out (APG_FARM_LEASE_SECONDS)."""
    from apg_farm.results import find_sweep

    if as_json:
        machine_output()
    store = open_store()
    _run_to_the_end(store, find_sweep(store, sweep).id, as_json=as_json)


def _submit_spec(store: Store, spec: SweepSpec) -> Submission:
    """Check against the broker's limits when there is one, submit, and say what happened."""
    from apg_farm.scheduler import submit

    if distributed.broker_configured():
        distributed.check_limits(spec)
    submission = submit(store, spec)
    out.print(submission.describe())
    return submission


#: What `run --json` keeps of the analysis under "report": the report it always gave
#: (results.sweep_report's keys); `apg-farm report --json` has the rest.
RUN_REPORT_KEYS = (
    "sweep",
    "outcomes",
    "cells",
    "untrusted_verifier",
    "second_chance",
    "dataset_hashes",
)


def _run_to_the_end(
    store: Store, sweep_id: int, *, as_json: bool = False, submitted: Submission | None = None
) -> None:
    """Run what is left (on the workers when a broker is set, else here), then print the results:
    the table and how to see it again, or with --json one document. Ctrl-C says how to go on."""
    from dataclasses import asdict

    from apg_farm.results import analyse, find_sweep

    sweep = find_sweep(store, str(sweep_id))
    on_workers = distributed.broker_configured()
    try:
        if on_workers:
            out.print(distributed.dispatch(store))
            ok = distributed.wait_for_sweep(store, sweep_id)
        else:
            ok = execute_sweep(store, sweep_id)
    except KeyboardInterrupt:
        for line in interrupted_lines(store, sweep_id, sweep.name, distributed=on_workers):
            err.print(line, markup=False, soft_wrap=True)
        raise typer.Exit(130) from None
    # Read again: the run has ended it (finished), which the row read before does not know.
    report = analyse(store, find_sweep(store, str(sweep_id)))
    if as_json:
        print_json(
            {
                "ok": ok,
                "submitted": asdict(submitted) if submitted else None,
                "verdict": report["verdict"],
                "report": {key: report[key] for key in RUN_REPORT_KEYS if key in report},
            }
        )
    else:
        print_table(report_table(report))
        # Never wrapped: it is copied and pasted.
        out.print(f"the whole report: apg-farm report {sweep.name}", soft_wrap=True, markup=False)
        print_verdict(report["verdict"])
    if not ok:
        raise typer.Exit(1)


@app.command("serve")
def serve_cmd(
    host: Annotated[str, typer.Option(help="Address to bind (loopback unless you mean it).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8750,
    read_only_public: Annotated[
        bool,
        typer.Option(
            "--read-only-public", help="Let anyone who reaches it browse; actions keep the token."
        ),
    ] = False,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option("--allowed-host", help="Host header to accept (repeat); default: loopback."),
    ] = None,
) -> None:
    """The live web dashboard: sweeps, beds, attempts; cancel, retry and release with a token."""
    # The web stack (starlette, jinja2, uvicorn) loads only for this command.
    from apg_farm.dashboard import serve

    serve(
        open_store(),
        host=host,
        port=port,
        read_only_public=read_only_public,
        allowed_hosts=tuple(allowed_host or ()),
    )


app.command("worker")(distributed.worker_cmd)
app.command("scheduler")(distributed.scheduler_cmd)
db_app.command("upgrade")(distributed.db_upgrade_cmd)


analysis_cli.register(app)


# Typer >= 0.29 raises its own Exit/Abort and its bundled click's usage errors; older ones, click's.
_EXITS: tuple[type[Any], ...] = (click.exceptions.Exit, typer.Exit)
_USAGE_ERRORS: tuple[type[Any], ...] = (click.ClickException,)
_ABORTS: tuple[type[Any], ...] = (click.exceptions.Abort, typer.Abort)
try:
    from typer._click.exceptions import ClickException as _BundledClickException

    _USAGE_ERRORS += (_BundledClickException,)
except ImportError:  # pragma: no cover - an older typer
    pass


#: The root's options that take a value (the word after them is no command).
_VALUED_OPTIONS = frozenset({"--log-level"})


def branch_of(tree: typer.Typer, args: Sequence[str]) -> typer.Typer:
    """`tree` with only the command or group that `args` invoke. Typer builds every command's
    parameters (through pydantic) before it reads a word: a third of `sweep list`'s start-up
    for forty commands it never runs (#31). The whole tree when no command word comes first
    (`--help`, `--version`, a mistyped command that earns a "did you mean").
    """
    names = {
        info.name or typer.main.get_command_name(info.callback.__name__): info
        for info in tree.registered_commands
        if info.callback is not None
    }
    groups = {info.name: info for info in tree.registered_groups if info.name}
    words = iter(args)
    for word in words:
        if word in _VALUED_OPTIONS:
            next(words, None)
        elif not word.startswith("-"):
            if word not in names and word not in groups:
                return tree
            branch = copy.copy(tree)
            branch.registered_commands = [names[word]] if word in names else []
            branch.registered_groups = [groups[word]] if word in groups else []
            return branch
        elif word.split("=", 1)[0] not in {"-v", "--verbose", "-q", "--quiet", "--log-level"}:
            return tree  # --help, --version, completion: they read the whole tree
    return tree


def main() -> None:
    """Entry point: typed errors become a message and an exit code, never a traceback."""
    if completing():
        register_completion_classes()
    human_output()
    try:
        tree = app if completing() else branch_of(app, sys.argv[1:])
        code = tree(standalone_mode=False, prog_name="apg-farm")
    except FarmError as error:
        # The message can quote anything (a bed's output, a path, `pip install 'x[y]'`): as text.
        err.print(f"[red]error:[/] {escape(error.render())}", soft_wrap=True)
        sys.exit(error.exit_code)
    except _EXITS as done:
        sys.exit(done.exit_code)
    except _USAGE_ERRORS as error:
        error.show()
        sys.exit(error.exit_code)
    except _ABORTS:
        err.print("aborted")
        sys.exit(1)
    except KeyboardInterrupt:
        err.print(
            "interrupted: running attempts keep their lease and return to the queue if abandoned"
        )
        sys.exit(130)
    finally:
        human_output()
    sys.exit(code if isinstance(code, int) else 0)
