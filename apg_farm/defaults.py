"""Constants gathered in one place, each with the reason for its value."""

from __future__ import annotations

#: Seconds a claim stays valid without renewal; the engine renews every third of it.
LEASE_SECONDS = 60.0
#: Seconds Store.retrying keeps at a transaction through a store that cannot be reached (a
#: PostgreSQL restart or a short stop): under a lease, so a claim held through the outage is
#: still this worker's when the store comes back.
STORE_PATIENCE = 40.0
#: A claim delivered more often than retries + this many times is poisoned, not looped.
EXTRA_DELIVERIES = 3
#: Seconds a model waits after its provider failed (rate limit, outage), doubling with each
#: trouble in a row up to the ceiling; an attempt the provider failed waits longer still.
PROVIDER_BACKOFF = 30.0
PROVIDER_BACKOFF_MAX = 1800.0
#: Tries of one attempt the provider may fail and still be retried. The record that says so is
#: written in the bed: an agent could claim an outage to try again, so the retries are few.
PROVIDER_RETRIES = 3
#: A provider claim that would start a new outage of a model is believed at most once in this
#: many seconds: a real outage hits many runs at once and is rare; an agent claiming one each
#: time it fails makes claims between runs of its model that go fine (outcomes.md, "Provider
#: trouble"). Claims while a believed outage goes on (no clean run since) are believed.
PROVIDER_OUTAGE_QUIET = 600.0
#: Seconds apart two claims of different models of one provider may begin and still corroborate
#: each other (store/outages.py): an outage hits the provider's models in the same minutes.
PROVIDER_OUTAGE_WINDOW = 300.0
#: Seconds a run that says its adapter never started may take and still be believed: an adapter
#: fails to start before its agent works; a claim after longer may be an agent that saw itself
#: failing. APG_FARM_START_WINDOW overrides it (time-scaled simulated beds need less).
AGENT_START_SECONDS = 60.0
#: Infrastructure failures in a row after which a bed is quarantined.
MAX_CONSECUTIVE_INFRA_ERRORS = 3
#: Bytes of stdout/stderr kept per phase (head + tail); enough for every token and the DDEV exit line.
PHASE_OUTPUT_LIMIT = 256 * 1024
#: Bytes of grade stdout kept whole; an envelope past this is INVALID (too large), never cut.
GRADE_STDOUT_LIMIT = 2 * 1024 * 1024
#: Bytes of a run.json the farm will read.
RUN_JSON_LIMIT = 1024 * 1024
#: Seconds between polls of the store by an idle embedded bed thread.
IDLE_POLL_SECONDS = 0.2
#: The fixture set APG uses when none is named.
DEFAULT_FIXTURES = ("kb_docs", "canvas_home")
#: Where APG keeps baselines and runs, relative to the approot, unless AI_PG_BASELINE_DIR says otherwise.
BASELINE_DIR = ".ai-proving-ground"
#: Bytes of a sweep file the farm reads: 8 MiB holds some 400,000 task ids of 15 characters and
#: parses in about 3 s of CPU (docs/benchmarks.md); a bigger file is a generated mistake.
SWEEP_FILE_LIMIT = 8 * 1024 * 1024
#: Attempts (tasks × models × trials) a submit or run takes unless `--max-attempts` raises it: at
#: minutes of a bed each, a million is years of bed time; 10⁹ is a typo, not a plan.
MAX_ATTEMPTS = 1_000_000
#: The highest `--max-attempts`: a submit writes about 33,000 attempts a second and holds them in
#: one transaction (10⁶ took 30 s and 220 MB), so ten million is the most one submit can carry.
MAX_ATTEMPTS_CEILING = 10_000_000
#: Attempts above which a submit or run asks first (`--yes`, or a prompt on a terminal).
CONFIRM_ATTEMPTS = 100_000
