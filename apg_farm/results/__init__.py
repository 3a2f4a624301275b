"""Results: everything that reads the store to answer a question about sweeps.

`stats` holds the statistics (Wilson, pass@k, McNemar, Newcombe, Holm); `report` and `analysis`
compute a sweep's figures (`costs` what they cost), which `csv_report`, `html_report` (with
`cost_plot`) and `watch` present; `comparison`, `baseline` and `regression` set one result against
another; `dataset_hashes` names the attempts of a task graded against more than one dataset or task hash;
`listing` is the sweeps list with each sweep's figures; `sealing` and `export` make
evidence others can check; `power` plans the trials a paired comparison needs. Imports store and
contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from apg_farm.lazy_exports import lazy_exports

# The names, imported when first used (lazy_exports.py): `sweep list` loads the listing, not
# the analysis, the HTML report or the comparisons.
if TYPE_CHECKING:
    from apg_farm.results.analysis import analyse
    from apg_farm.results.baseline import (
        LoadedBaseline,
        build_baseline,
        is_sealed,
        load_baseline,
        parse_indispensable,
        unsealed_warning,
        write_baseline,
    )
    from apg_farm.results.bed_baselines import (
        ACROSS,
        baseline_lines,
        refuse_across_baselines,
    )
    from apg_farm.results.clustered import (
        MIN_TASKS,
        Clustered,
        bell_mccaffrey_df,
        clustered_difference,
        clustered_sums,
        t_quantile,
    )
    from apg_farm.results.comparison import Side, compare, load_side
    from apg_farm.results.cost_plot import CostPoint, cost_points, pareto_front, usd
    from apg_farm.results.csv_report import CSV_COLUMNS, report_csv
    from apg_farm.results.dataset_hashes import dataset_hash_lines
    from apg_farm.results.exclusions import report_lines as exclusion_lines
    from apg_farm.results.exclusions import warnings as exclusion_warnings
    from apg_farm.results.export import export_eee, model_slug
    from apg_farm.results.html_report import (
        cost_section,
        forest_plot,
        render_html,
        second_chance_section,
    )
    from apg_farm.results.listing import (
        MAX_ID,
        MAX_SWEEPS_PAGE,
        STATES,
        SWEEPS_PAGE,
        SweepPage,
        check_before,
        check_state,
        list_sweeps,
    )
    from apg_farm.results.power import (
        Paired,
        Rate,
        between_task_variance,
        cell_variance,
        paired_power,
        tasks_needed,
        trials_needed,
        within_task_correlation,
    )
    from apg_farm.results.queries import group_quantiles
    from apg_farm.results.regression import (
        CheckPolicy,
        CheckVerdict,
        CostFindings,
        check_regression,
        cost_findings,
        parse_cost_increase,
        parse_rerun_share,
        rerun_share_findings,
    )
    from apg_farm.results.report import CELL_COUNTS, find_sweep, sweep_report
    from apg_farm.results.sealing import (
        artifacts,
        seal,
        seal_directory,
        verify_seal,
    )
    from apg_farm.results.stats import (
        holm,
        mcnemar_exact,
        newcombe_paired,
        newcombe_unpaired,
        paired_comparison,
        pass_at_k,
        pass_hat_k,
        quantile,
        wilson,
    )
    from apg_farm.results.stop_report import (
        NOT_VALID,
        add_stop,
        stop_lines,
        stop_section,
        stop_summary,
    )
    from apg_farm.results.timeline import sweep_timeline, timeline_for
    from apg_farm.results.timeline_plot import timeline_svg
    from apg_farm.results.transcript import (
        Block,
        Clipped,
        Message,
        Transcript,
        clip,
        parse_transcript,
    )
    from apg_farm.results.watch import render_watch, running_table, watch_snapshot
    from apg_farm.store import SealedSweep, refuse_if_sealed

if not TYPE_CHECKING:  # hidden from mypy, which checks each name against the imports above
    __getattr__ = lazy_exports(__name__, __file__)

__all__ = [
    "ACROSS",
    "CELL_COUNTS",
    "CSV_COLUMNS",
    "MAX_ID",
    "MAX_SWEEPS_PAGE",
    "MIN_TASKS",
    "NOT_VALID",
    "STATES",
    "SWEEPS_PAGE",
    "Block",
    "CheckPolicy",
    "CheckVerdict",
    "Clipped",
    "Clustered",
    "CostFindings",
    "CostPoint",
    "LoadedBaseline",
    "Message",
    "Paired",
    "Rate",
    "SealedSweep",
    "Side",
    "SweepPage",
    "Transcript",
    "add_stop",
    "analyse",
    "artifacts",
    "baseline_lines",
    "bell_mccaffrey_df",
    "between_task_variance",
    "build_baseline",
    "cell_variance",
    "check_before",
    "check_regression",
    "check_state",
    "clip",
    "clustered_difference",
    "clustered_sums",
    "compare",
    "cost_findings",
    "cost_points",
    "cost_section",
    "dataset_hash_lines",
    "exclusion_lines",
    "exclusion_warnings",
    "export_eee",
    "find_sweep",
    "forest_plot",
    "group_quantiles",
    "holm",
    "is_sealed",
    "list_sweeps",
    "load_baseline",
    "load_side",
    "mcnemar_exact",
    "model_slug",
    "newcombe_paired",
    "newcombe_unpaired",
    "paired_comparison",
    "paired_power",
    "pareto_front",
    "parse_cost_increase",
    "parse_indispensable",
    "parse_rerun_share",
    "parse_transcript",
    "pass_at_k",
    "pass_hat_k",
    "quantile",
    "refuse_across_baselines",
    "refuse_if_sealed",
    "render_html",
    "render_watch",
    "report_csv",
    "rerun_share_findings",
    "running_table",
    "seal",
    "seal_directory",
    "second_chance_section",
    "stop_lines",
    "stop_section",
    "stop_summary",
    "sweep_report",
    "sweep_timeline",
    "t_quantile",
    "tasks_needed",
    "timeline_for",
    "timeline_svg",
    "trials_needed",
    "unsealed_warning",
    "usd",
    "verify_seal",
    "watch_snapshot",
    "wilson",
    "within_task_correlation",
    "write_baseline",
]
