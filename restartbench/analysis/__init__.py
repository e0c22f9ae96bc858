"""Tables across many run folders (used by analysis/summarize.py, the report and the notebooks).

``collect(root)`` finds every run folder under ``root`` (a folder holding ``metadata.json``;
run folders are not searched inside), and returns a ``Collected`` with six tables:

- ``table()``: the tidy table, one row per run × event: ``kind == "checkpoint"`` (one per
  checkpoint tag) or ``kind == "restart"`` (one per restore attempt: the run's own restore is
  attempt 1, each ``./submit-job.sh --restore`` relaunch another; ``tag`` is None for engine
  ``none``, whose restart restores nothing: the start-up floor). Columns: ``TABLE_COLUMNS``.
- ``rank_table()``: the same events per rank (``RANK_COLUMNS``), so that per-rank spread is
  kept rather than averaged away.
- ``file_table()``: every checkpoint file (tag, path, bytes, kind, writing rank), from
  ``inventory.json`` (or, without one, from the ``checkpoint.durable`` events).
- ``span_table()``: every restore attempt's spans per rank on the restart's clock (seconds since the rank's launch):
  the restart's parts and the harness's verify, each with its host RSS at the start and its peak (``SPAN_COLUMNS``).
- ``memory_table()``: every restore attempt's host RSS over time per rank (the ``rank.memory`` timeline, thinned
  by the rank as it wrote it) on the same clock, each sample with the part it fell in (``MEMORY_COLUMNS``).
- ``excluded_table()``: runs left out, each with a ``status`` and a reason:
  ``skipped`` (the run itself was skipped, e.g. an optional engine not installed: by design),
  ``failed``, ``incomplete`` (never finished) or ``unreadable`` (a malformed file, named). A failed or incomplete
  run whose training finished whole (every rank ended it, every checkpoint begun was committed, none failed) keeps
  its checkpoint rows and files in the tables, and its reason says so: its restart is what is left out.

Figures follow the aggregation rules of ``restartbench.results``: a checkpoint's stall is the
max over ranks of the time ``save`` blocked training; durable is the max over ranks of save
start → that rank's files fsync'd; committed is when rank 0 then wrote ``latest``; a restart is
the max over ranks of launch → end of the first resumed iteration, each part its max over ranks.
A checkpoint's whole cost (``cost_s``) is its stall plus ``slowdown_s``: what the iterations its background work
overlapped took beyond the clean median iteration (``results.interference``).
Throughput is the checkpoint's total bytes (all ranks) over its durable time.

Storage baseline: a ``baseline.json`` in the run folder, or in any folder between it and the
collected root (the nearest wins), gives the storage's measured bandwidth::

    {"tool": "fio", "write_MBps": 1830.0, "read_MBps": 2950.0,
     "target": "/lustre/ckpt", "block_size": "1M", "jobs": 8, "direct": true,
     "measured": "2026-11-22T18:00:00Z"}

``write_MBps``/``read_MBps`` (MB = 10^6 bytes, at least one of them) are required; the rest is
shown as given. Where none exists the throughput plot says "no baseline measured".

Each run folder is read once: the first collect keeps what it read in the folder (``analysis-record.json``,
``restartbench.analysis.records``), later ones read that record instead of the events wherever it is current (made
by this code, from the files as they are now).

The package, by concern: ``collecting`` (finding and reading run folders, the ``Collected`` tables), ``blocks`` (a
table joined from the runs' blocks of rows), ``runs`` (one run folder into its rows), ``records`` (the per-run
record), ``checkpoints``, ``interference``, ``restart_rows`` and
``restarts``, ``relayout``, ``files``, ``goodput_rates``, ``comparison``, ``baselines``, ``grouping``, ``reading`` and
``columns``. Every public name is importable from ``restartbench.analysis``.
"""

from __future__ import annotations

from restartbench.analysis.baselines import (
    LIMIT_TOLERANCE_PCT,
    LIMIT_UNDERESTIMATED,
    WARM_CACHE,
    BaselineFinder,
    limit_note,
)
from restartbench.analysis.checkpoints import checkpoint_summary, rank_checkpoints
from restartbench.analysis.collecting import Collected, Excluded, collect, run_folders
from restartbench.analysis.columns import (
    FILE_KINDS,
    HARNESS_PARTS,
    MB,
    MEMORY_COLUMNS,
    PATH_COLUMNS,
    PATH_PARTS,
    RANK_COLUMNS,
    RESTART_PART_COLUMNS,
    SETUP_KEYS,
    SPAN_COLUMNS,
    TABLE_COLUMNS,
    MiB,
)
from restartbench.analysis.comparison import engine_comparison, rank_spread
from restartbench.analysis.files import file_statistics, file_summary, files_per_rank, size_check
from restartbench.analysis.goodput_rates import (
    GOODPUT_COLUMNS,
    checkpoint_cost,
    goodput_assumptions,
    goodput_table,
    start_up_floor,
)
from restartbench.analysis.grouping import (
    LOGS_ENV,
    engine_order,
    group_keys,
    logs_from_env,
    pick_configuration,
    select,
    sort_rows,
)
from restartbench.analysis.records import RECORD_FILE
from restartbench.analysis.relayout import RELAYOUT_COLUMNS, relayout_summary
from restartbench.analysis.restart_rows import SPAN_PARTS, critical_path, rank_restarts, restart_memory, restart_spans
from restartbench.analysis.restarts import (
    ds_init_summary,
    max_over_ranks,
    restart_summary,
    same_layout_restarts,
    typical_restarts,
)
from restartbench.baseline import BASELINE_FILE

__all__ = [
    "BASELINE_FILE", "FILE_KINDS", "GOODPUT_COLUMNS", "HARNESS_PARTS", "LIMIT_TOLERANCE_PCT", "LIMIT_UNDERESTIMATED",
    "LOGS_ENV", "MB", "MEMORY_COLUMNS", "PATH_COLUMNS", "PATH_PARTS", "RANK_COLUMNS", "RECORD_FILE", "RELAYOUT_COLUMNS",
    "RESTART_PART_COLUMNS", "SETUP_KEYS", "SPAN_COLUMNS", "SPAN_PARTS", "TABLE_COLUMNS", "WARM_CACHE", "BaselineFinder",
    "Collected", "Excluded", "MiB", "checkpoint_cost", "checkpoint_summary", "collect", "critical_path",
    "ds_init_summary", "engine_comparison", "engine_order", "file_statistics", "file_summary", "files_per_rank",
    "goodput_assumptions", "goodput_table", "group_keys", "limit_note", "logs_from_env", "max_over_ranks",
    "pick_configuration", "rank_checkpoints", "rank_restarts", "rank_spread", "relayout_summary", "restart_memory",
    "restart_spans", "restart_summary", "run_folders", "same_layout_restarts", "select", "size_check", "sort_rows",
    "start_up_floor", "typical_restarts",
]
