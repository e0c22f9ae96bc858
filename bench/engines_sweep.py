#!/usr/bin/env python3
"""The engines sweep (sweeps/engines.yaml: every engine, two layouts) run N times and summarized, as one result.

    python bench/engines_sweep.py [--sweep sweeps/engines.yaml] [--repetitions 3] [--logs DIR] [--collect-only]

1. Runs the sweep (``python -m restartbench.sweep``) from a copy of the sweep file with ``repetitions`` and ``logs``
   replaced (``<logs>/sweep.yaml``, kept: the sweep as run). The sweep resumes: complete cells under the same logs
   root are kept, failed ones run again (the old attempt moved aside).
2. Runs ``analysis/summarize.py <logs> --out <logs>/summary``: its console summary is what a user sees, its
   ``report.html`` the report.
3. Collects the runs with ``restartbench.analysis`` and writes ``bench/results/YYYY-MM-DD-<machine>-engines-sweep.json``
   and ``.md`` (made from it; bench/results_io.py), holding:
   - every cell of the sweep: complete, failed (with the error, and the engine's known issue where it fails as
     shipped: decoupled) or skipped (with the reason: datastates without its package);
   - per preset × layout × engine, each figure the max over ranks of one checkpoint or restart, then the median over
     the repetitions (and the checkpoints of a run): stall, slowdown, whole cost (``checkpoint_summary``); the restart
     and its parts, the resume memory spike (``restart_summary``); the write and read throughput as ratios to each
     run's own fio baseline (measured before phase 1 with as many jobs as ranks write on the node: the checkpoint's
     concurrency), with the analysis's flags (``write_limit``, ``read_limit``); deepspeed.initialize's stages
     (``ds_init_summary``); the goodput at the default failure rate (``goodput_table``);
   - a check that no ratio above its bar is left without the analysis's note, per checkpoint and per restore (the
     bar: the limit's max, its winning method's fastest pass; 1.05 for a baseline without spread, the old rule).

``--collect-only`` runs neither the sweep nor summarize.py: it collects an existing logs root.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from results_io import ROOT, add_output_arguments, machine_line, run_meta, write_results

sys.path.insert(0, str(ROOT))

from restartbench import analysis, goodput  # noqa: E402
from restartbench.analysis import LIMIT_TOLERANCE_PCT, PATH_COLUMNS, RESTART_PART_COLUMNS  # noqa: E402
from restartbench.analysis.baselines import top_pct  # noqa: E402
from restartbench.engines import known_issue  # noqa: E402

MB = 1e6
GB = 1e9
DEFAULT_SWEEP = Path("sweeps/engines.yaml")
SWEEP_COPY = "sweep.yaml"
KEYS = ("preset", "layout", "engine")


# -- running -----------------------------------------------------------------------------------------------


def default_logs(sweep_file: Path) -> Path:
    """Where the sweep puts its runs unless told: its ``logs``, else logs/<file name> (restartbench.sweep)."""
    data = yaml.safe_load(sweep_file.read_text()) or {}
    return ROOT / (data.get("logs") or Path("logs") / sweep_file.stem)


def sweep_copy(sweep_file: Path, repetitions: int, logs: Path, folder: Path) -> Path:
    """The sweep file with ``repetitions`` and ``logs`` replaced (the sweep CLI has no override for either), written
    to ``<folder>/sweep.yaml``."""
    data = yaml.safe_load(sweep_file.read_text()) or {}
    data.update(repetitions=repetitions, logs=str(logs))
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / SWEEP_COPY
    copy.write_text(f"# {sweep_file} as run by bench/engines_sweep.py (repetitions and logs replaced)\n"
                    + yaml.safe_dump(data, sort_keys=False))
    return copy


def run_step(argv: list[str]) -> dict:
    """Run a command in the repository root, its output going to the console; its exit status and wall time."""
    print(f"$ {' '.join(argv)}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT)
    return {"argv": argv[1:], "exit": done.returncode, "wall_s": time.perf_counter() - start}


# -- cells -------------------------------------------------------------------------------------------------


def sweep_cells(sweep_file: Path, logs: Path) -> list[dict]:
    """Every cell of the sweep (one per run folder) with the state its folder is in: complete, skipped, failed,
    running, missing (not run) or unreadable; failed and skipped ones with the reason metadata.json gives, a failed
    one with the engine's known issue where it fails as shipped; attempts moved aside by reruns are counted."""
    from restartbench.sweep import cell_config, load_sweep, unique_cells  # the run configuration: plans each cell

    sweep = load_sweep(sweep_file)
    configs, _ = unique_cells({cell: cell_config(sweep, cell) for cell in sweep.cells})
    cells = []
    for cell, cfg in configs.items():
        run_dir = Path(cfg.paths.run_dir)
        status, reason, issue = "missing", None, None
        try:
            meta = json.loads((run_dir / "metadata.json").read_text())
            status, reason = meta.get("status") or "unknown", meta.get("error")
            issue = meta.get("engine_known_issue")
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as error:
            status, reason = "unreadable", f"{run_dir / 'metadata.json'}: {error}"
        if status == "failed" and issue is None:
            issue = known_issue(cell.engine, "cpu")
        cells.append({"preset": cell.preset, "layout": cell.layout, "engine": cell.engine,
                      "repetition": cell.repetition, "run_dir": _relative(run_dir, logs), "status": status,
                      "reason": reason, "known_issue": issue,
                      "earlier_attempts": len(list(run_dir.parent.glob(f"{run_dir.name}.attempt*")))})
    return cells


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


# -- figures -----------------------------------------------------------------------------------------------


def clean(value: Any) -> Any:
    """A table value as JSON: numpy scalars as Python numbers, NaN and infinities as None."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is not None and not isinstance(value, (str, int, float, bool, list, dict)):
        return str(value)
    return value


def _key(row: dict, keys: list[str]) -> dict:
    return {k: clean(row[k]) for k in keys}


def _ratio(pct: Any) -> float | None:
    pct = clean(pct)
    return None if pct is None else pct / 100


def baselines(table) -> dict[tuple, dict]:
    """Per configuration, the storage baselines its runs were held to: tool, fio jobs and ranks per node (the
    checkpoint's concurrency) from each run's own baseline.json, 'logs root' where a run has none of its own."""
    found: dict[tuple, dict] = {}
    for row in table.drop_duplicates("run").to_dict("records"):
        path = Path(row["run"]) / "baseline.json"
        try:
            own = json.loads(path.read_text())
        except (OSError, ValueError):
            own = None
        entry = found.setdefault(tuple(row[k] for k in KEYS), {"tools": set(), "jobs": set(),
                                                               "ranks_per_node": set(), "runs_without_own": 0})
        if own is None:
            entry["runs_without_own"] += 1
        else:
            entry["tools"].add(str(own.get("tool")))
            if own.get("jobs") is not None:
                entry["jobs"].add(int(own["jobs"]))
        nodes = row.get("nodes")
        nodes = int(nodes) if nodes == nodes and nodes else 1
        if row.get("ranks") == row.get("ranks"):
            entry["ranks_per_node"].add(int(row["ranks"]) // nodes)
    return {key: {"tool": ", ".join(sorted(v["tools"])) or None, "jobs": sorted(v["jobs"]),
                  "ranks_per_node": sorted(v["ranks_per_node"]), "runs_without_own": v["runs_without_own"]}
            for key, v in found.items()}


def checkpoint_rows(table, limits: dict[tuple, dict]) -> list[dict]:
    """checkpoint_summary per configuration: stall, slowdown, whole cost, durable time, write against the fio limit."""
    summary = analysis.checkpoint_summary(table)
    keys = [k for k in analysis.group_keys(table)]
    bars = summary_bars(table, "write", keys)
    rows = []
    for row in summary.to_dict("records"):
        rows.append({
            **_key(row, keys),
            **{c: clean(row.get(c)) for c in (
                "runs", "checkpoints", "seen_checkpoints", "ranks", "bytes", "bytes_per_rank_max", "files",
                "stall_s", "stall_min_s", "stall_max_s", "slowdown_s", "cost_s", "overlapped_iterations",
                "durable_s", "iteration_s", "write_MBps", "baseline_write_MBps")},
            "write_ratio": _ratio(row.get("write_pct_of_storage")), "write_limit": clean(row.get("write_limit")),
            "write_bar": bars.get(tuple(str(row[k]) for k in keys)),
            "baseline": limits.get(tuple(row[k] for k in KEYS)),
        })
    return rows


def restart_rows(table, limits: dict[tuple, dict]) -> list[dict]:
    """restart_summary per configuration: total, parts (each max over ranks), the critical rank's path, read against
    the fio limit, cache, exactness, the resume memory spike."""
    summary = analysis.restart_summary(table)
    keys = [k for k in analysis.group_keys(table)]
    bars = summary_bars(table, "read", keys)
    rows = []
    for row in summary.to_dict("records"):
        rows.append({
            **_key(row, keys),
            **{c: clean(row.get(c)) for c in ("runs", "attempts", "verdicts", "ranks", "restart_s", "restart_min_s",
                                              "restart_max_s", "rank_spread_s")},
            "parts": {label: clean(row.get(column)) for column, label in RESTART_PART_COLUMNS},
            "critical_path": {label: clean(row.get(column)) for column, label in PATH_COLUMNS},
            **{c: clean(row.get(c)) for c in ("restores_checkpoint", "bytes_read", "files_read", "read_MBps",
                                              "baseline_read_MBps")},
            "read_ratio": _ratio(row.get("read_pct_of_storage")), "read_limit": clean(row.get("read_limit")),
            "read_bar": bars.get(tuple(str(row[k]) for k in keys)),
            **{c: clean(row.get(c)) for c in ("cache", "exact", "restore_peak_rss_bytes", "resume_spike")},
            "baseline": limits.get(tuple(row[k] for k in KEYS)),
        })
    return rows


def ds_init_rows(table) -> list[dict]:
    """ds_init_summary per configuration: the slowest stages by name, the rest, collective wait, other, their sum."""
    summary = analysis.ds_init_summary(table)
    keys = [k for k in analysis.group_keys(table)]
    fixed = ("other stages", "collective wait", "other", "parts_sum_s")
    stages = [c for c in summary.columns if c not in (*keys, *fixed)]
    rows = [{**_key(row, keys), "stages": {s: clean(row[s]) for s in stages},
             **{f"{c.replace(' ', '_').removesuffix('_s')}_s": clean(row.get(c)) for c in fixed}}
            for row in analysis.sort_rows(summary, keys).to_dict("records")]
    return rows


def goodput_rows(table, failures_per_gpu_hour: float) -> list[dict]:
    rates = analysis.goodput_table(table, failures_per_gpu_hour)
    return [{c: clean(v) for c, v in row.items()} for row in rates.to_dict("records")]


def bar_pct(row: dict, side: str) -> float:
    """The share of its limit (percent) above which the analysis notes a run's ``side`` throughput: the limit's max
    where its baseline has a spread, else the old rule's 105 % (restartbench.analysis.baselines.limit_note)."""
    top = top_pct(clean(row.get(f"baseline_{side}_MBps")), clean(row.get(f"baseline_{side}_max_MBps")))
    return LIMIT_TOLERANCE_PCT if top is None else top


def summary_bars(table, side: str, keys: list[str]) -> dict[tuple, float]:
    """Per configuration (its keys as text), the most lenient bar of its rows as a ratio: a median ratio above it puts
    at least half of the rows above their own bar, so the summary must carry a note."""
    kind = "checkpoint" if side == "write" else "restart"
    rows = table[table["kind"] == kind] if not table.empty else table
    bars: dict[tuple, float] = {}
    for row in rows.to_dict("records"):
        key = tuple(str(row[k]) for k in keys)
        bars[key] = max(bars.get(key, 0.0), bar_pct(row, side) / 100)
    return bars


def unflagged(table) -> list[dict]:
    """Every checkpoint and every restore whose throughput is above its bar (``bar_pct``) without the analysis's
    note (should be none: the analysis notes each)."""
    found = []
    for row in table.to_dict("records"):
        for side, column, kind in (("write", "write_pct_of_storage", "checkpoint"),
                                   ("read", "read_pct_of_storage", "restart")):
            pct = clean(row.get(column)) if row["kind"] == kind else None
            if pct is not None and pct > bar_pct(row, side) and clean(row.get(f"{side}_limit")) is None:
                found.append({"run_id": row["run_id"], "kind": kind, "tag": clean(row.get("tag")),
                              "attempt": clean(row.get("attempt")), "side": side, "ratio": pct / 100})
    return found


def flag_counts(table) -> dict:
    """How many checkpoints and restores were above their bar (``bar_pct``), and how many of them carry a note."""
    counts = {}
    for side, column, kind in (("write", "write_pct_of_storage", "checkpoint"), ("read", "read_pct_of_storage",
                                                                               "restart")):
        rows = table[table["kind"] == kind] if not table.empty else table
        pct = rows[column].astype(float) if column in rows else rows.iloc[0:0]
        bars = [bar_pct(row, side) for row in rows.to_dict("records")] if len(rows) else []
        above = rows[(pct > bars).to_numpy()] if len(rows) else rows
        limit = f"{side}_limit"
        counts[side] = {"measured": int(pct.notna().sum()) if len(rows) else 0, "above": len(above),
                        "flagged": int(above[limit].notna().sum()) if len(above) and limit in above else 0,
                        "notes": sorted({str(v) for v in above[limit].dropna()}) if len(above) and limit in above
                        else []}
    return counts


def collect_result(logs: Path, failures_per_gpu_hour: float) -> dict:
    """The tables of every run under ``logs`` (restartbench.analysis), as JSON-ready rows."""
    collected = analysis.collect(logs)
    table = collected.table()
    excluded = [{"run": _relative(e.run, logs), "status": e.status, "reason": e.reason, "preset": e.preset,
                 "layout": e.layout, "engine": e.engine} for e in collected.excluded]
    if table.empty:
        return {"complete_runs": 0, "excluded": excluded, "checkpoints": [], "restarts": [], "ds_init": [],
                "goodput": [], "unflagged": [], "limit_flags": {}, "runs_started": None, "run_versions": [],
                "warnings": list(collected.warnings)}
    limits = baselines(table)
    started = sorted(table["started"].dropna())
    versions = table.drop_duplicates("run")[["torch", "deepspeed", "python"]].drop_duplicates()
    return {
        "complete_runs": int(table["run_id"].nunique()), "excluded": excluded,
        "runs_started": [started[0], started[-1]] if started else None,
        "run_versions": [{c: clean(v) for c, v in row.items()} for row in versions.to_dict("records")],
        "checkpoints": checkpoint_rows(table, limits), "restarts": restart_rows(table, limits),
        "ds_init": ds_init_rows(table), "goodput": goodput_rows(table, failures_per_gpu_hour),
        "unflagged": unflagged(table), "limit_flags": flag_counts(table),
        "warnings": list(collected.warnings),
    }


# -- Markdown ----------------------------------------------------------------------------------------------


def _num(value, spec: str, scale: float = 1.0) -> str:
    return "—" if value is None else format(value / scale, spec)


def _s(value) -> str:
    """Seconds with three decimals (milliseconds shown), '—' where missing."""
    return _num(value, ".3f")


def _limit(ratio, note, bar=None) -> str:
    """A ratio to its limit with the analysis's note; above its configuration's bar (the most lenient of its runs'
    limit maxima, ``summary_bars``; 1.05 where unknown) without one it says so."""
    if ratio is None:
        return "—"
    text = f"{ratio:.2f}"
    if note:
        return f"{text} ({note})"
    return text + (" (**unflagged**)" if ratio > (bar or LIMIT_TOLERANCE_PCT / 100) else "")


def _baseline(base: dict | None) -> str:
    if not base:
        return "—"
    jobs = "/".join(str(j) for j in base["jobs"]) or "?"
    per_node = "/".join(str(r) for r in base["ranks_per_node"]) or "?"
    text = f"{base['tool'] or 'logs root'} {jobs} jobs, {per_node} ranks/node"
    return text + (f", {base['runs_without_own']} run(s) without their own" if base["runs_without_own"] else "")


def _reason(text: str | None, limit: int = 240) -> str:
    if not text:
        return "no reason recorded"
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _cells(cells: list[dict]) -> list[str]:
    lines = ["## Cells", "",
             "Each cell of the sweep (preset × layout × engine × repetition) and the state of its run folder.", "",
             "| preset | layout | engine | complete | failed | skipped | not run | other | attempts moved aside |",
             "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[dict]] = {}
    for cell in cells:
        groups.setdefault((cell["preset"], cell["layout"], cell["engine"]), []).append(cell)
    for (preset, layout, engine), group in groups.items():
        count = {s: sum(c["status"] == s for c in group) for s in ("complete", "failed", "skipped", "missing")}
        other = [f"{c['status']} (rep{c['repetition']})" for c in group if c["status"] not in count]
        lines.append(f"| {preset} | {layout} | {engine} | {count['complete']} | {count['failed']} | "
                     f"{count['skipped']} | {count['missing']} | {', '.join(other) or '—'} | "
                     f"{sum(c['earlier_attempts'] for c in group)} |")
    reasons: dict[tuple, set] = {}
    for cell in cells:
        if cell["status"] in ("failed", "skipped", "unreadable"):
            why = (f"fails as shipped: {_reason(cell['known_issue'])}" if cell["status"] == "failed"
                   and cell.get("known_issue") else _reason(cell["reason"]))
            reasons.setdefault((cell["engine"], cell["status"]), set()).add(why)
    if reasons:
        lines += ["", "Not complete, with the reason:", ""]
        lines += [f"- `{engine}` {status}: {'; '.join(sorted(why))}" for (engine, status), why in reasons.items()]
    return lines + [""]


def markdown(result: dict) -> str:
    meta, cells, figures = result["meta"], result["cells"], result["figures"]
    steps = result["steps"]
    options = meta["sweep_content"].get("options") or {}
    lines = [f"# Engines sweep — {meta['machine']}, {meta['date']}", "",
             f"`{meta['command']}` — sweep `{meta['sweep']}`: presets {', '.join(meta['sweep_content']['presets'])}; "
             f"layouts {', '.join(meta['sweep_content']['layouts'])}; "
             f"engines {', '.join(meta['sweep_content']['engines'])}; repetitions {meta['repetitions']}; options "
             + (", ".join(f"{k} {v}" for k, v in options.items()) or "none") + f"; logs `{meta['logs']}`.", "",
             machine_line(meta), ""]
    if meta["collect_only"]:
        lines += ["Collected only (`--collect-only`): the runs were made earlier under the logs root; neither the "
                  "sweep nor summarize.py ran in this invocation.", ""]
    else:
        lines += ["Steps: " + "; ".join(f"`{' '.join(s['argv'])}` exit {s['exit']} after {s['wall_s']:.0f} s"
                                        for s in steps.values() if s), ""]
    started = figures.get("runs_started")
    versions = "; ".join(", ".join(f"{k} {v}" for k, v in row.items()) for row in figures.get("run_versions") or [])
    lines += [f"**What was measured.** Complete runs: {figures['complete_runs']}"
              + (f", started {started[0]} to {started[1]}" if started else "")
              + (f" ({versions})" if versions else "") + ". Every time is the **max over ranks** of one checkpoint "
              "or one restart; each table cell is then the **median over the repetitions** (and, for checkpoints, "
              "over the checkpoints of each run; `runs` says how many). Restores read a **cold cache**: the run "
              "evicts the checkpoint from the page cache and checks it is gone before the load (the `cache` column "
              "says what each restore recorded). Throughput ratios are to each run's own fio baseline, measured "
              "before phase 1 with as many jobs as ranks write on the node (the checkpoint's concurrency: the "
              "`limits` column), each the best of the methods it ran (one, fio O_DIRECT, in runs before "
              "2026-11-26); a ratio above the limit's max (the winning "
              "method's fastest pass) is a defect to investigate and carries the analysis's note, never an engine "
              "beating the storage (a baseline without spread keeps the old rule: 'limit underestimated' above "
              "1.05). Console summary and report.html: "
              + (f"`{meta['summary']}`." if meta.get("summary") else "not made in this invocation."), ""]
    lines += _cells(cells)

    ckpts = figures["checkpoints"]
    lines += ["## Checkpoints", "",
              "stall = time the save blocked training (s); slowdown = what the iterations overlapping the save's "
              "background work took beyond the clean median iteration (s; 0 for a synchronous engine; over the "
              "checkpoints whose background work ended during training, `seen`); whole cost = stall + slowdown (s), "
              "the goodput's C; durable = save start → the rank's files fsync'd (s); write = all ranks' bytes ÷ "
              "durable (MB/s); ÷ fio write = write ÷ the run's fio write bandwidth.", "",
              "| preset | layout | engine | runs | ckpts (seen) | bytes MB | stall s (min–max of ckpts) | slowdown s | "
              "whole cost s | durable s | iteration s | write MB/s | fio write MB/s | ÷ fio write | limits |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ckpts:
        lines.append(
            f"| {r['preset']} | {r['layout']} | {r['engine']} | {r['runs']} | {r['checkpoints']} "
            f"({_num(r['seen_checkpoints'], '.0f')}) | {_num(r['bytes'], '.1f', MB)} | {_s(r['stall_s'])} "
            f"({_s(r['stall_min_s'])}–{_s(r['stall_max_s'])}) | {_s(r['slowdown_s'])} | {_s(r['cost_s'])} | "
            f"{_s(r['durable_s'])} | {_s(r['iteration_s'])} | {_num(r['write_MBps'], '.0f')} | "
            f"{_num(r['baseline_write_MBps'], '.0f')} | "
            f"{_limit(r['write_ratio'], r['write_limit'], r.get('write_bar'))} | "
            f"{_baseline(r['baseline'])} |")
    lines.append("")

    restarts = figures["restarts"]
    parts = [p for p in (restarts[0]["parts"] if restarts else {})
             if any(r["parts"].get(p) is not None for r in restarts)]
    lines += ["## Restarts", "",
              "total = launch → end of the first resumed iteration (s); each part the max over ranks (s; parts of "
              "different ranks, so they need not add up to the total; the JSON's `critical_path` holds the slowest "
              "rank's, which do); engine none restores nothing (the start-up floor); read = bytes read ÷ ckpt load "
              "(MB/s); ÷ fio read = read ÷ the run's fio O_DIRECT read bandwidth; peak RSS = the largest host RSS of "
              "any rank during the restart (GB, sampled at 100 Hz); resume spike = peak RSS ÷ steady training's "
              "peak (×).", "",
              "| preset | layout | engine | runs | verdicts | total s | " + " | ".join(f"{p} s" for p in parts)
              + " | read MB/s | fio read MB/s | ÷ fio read | cache | peak RSS GB | resume spike × |",
              "|" + "---|" * (12 + len(parts))]
    for r in restarts:
        lines.append(
            f"| {r['preset']} | {r['layout']} | {r['engine']} | {_num(r['runs'], '.0f')} | {r['verdicts']} | "
            f"{_s(r['restart_s'])} | " + " | ".join(_s(r["parts"].get(p)) for p in parts)
            + f" | {_num(r['read_MBps'], '.0f')} | {_num(r['baseline_read_MBps'], '.0f')} | "
            f"{_limit(r['read_ratio'], r['read_limit'], r.get('read_bar'))} | {r['cache'] or '—'} | "
            f"{_num(r['restore_peak_rss_bytes'], '.2f', GB)} | {_num(r['resume_spike'], '.2f')} |")
    lines.append("")

    flags = figures.get("limit_flags") or {}
    if flags:
        lines += ["**Limits check.** " + "; ".join(
            f"{side}: {f['above']} of {f['measured']} measured {'checkpoints' if side == 'write' else 'restores'} "
            f"above their limit's max (1.05 without spread), {f['flagged']} noted"
            + (f" ({', '.join(f['notes'])})" if f["notes"] else "")
            for side, f in flags.items()) + ". Above it without a note: "
            + ("none." if not figures["unflagged"] else "; ".join(
                f"{u['run_id']} {u['kind']} {u['tag'] or u['attempt']} {u['side']} {u['ratio']:.2f}"
                for u in figures["unflagged"]) + "."), ""]

    ds = figures["ds_init"]
    stages = list(ds[0]["stages"]) if ds else []
    lines += ["## Inside deepspeed.initialize (restart)", "",
              "DeepSpeed's own set-up stages during the restart (s): each the max over ranks, median over the "
              "repetitions; the five slowest by name, the rest as other stages; collective wait = time inside "
              "collectives (mostly waiting for slower ranks); other = the call's time outside every timed stage; "
              "sum = their sum (each from its slowest rank, so it can exceed one rank's call).", ""]
    if ds:
        lines += ["| preset | layout | engine | " + " | ".join(stages) + " | other stages | collective wait | other "
                  "| sum |", "|" + "---|" * (7 + len(stages))]
        for r in ds:
            lines.append(f"| {r['preset']} | {r['layout']} | {r['engine']} | "
                         + " | ".join(_s(r["stages"].get(s)) for s in stages)
                         + f" | {_s(r['other_stages_s'])} | {_s(r['collective_wait_s'])} | {_s(r['other_s'])} | "
                         f"{_s(r['parts_sum_s'])} |")
    else:
        lines.append("No restart timed deepspeed.initialize's stages.")
    lines.append("")

    rates = figures["goodput"]
    lines += ["## Goodput at the default failure rate", "", f"{meta['goodput_assumptions']}. C = whole cost (s), "
              "R = restart (s), iteration = clean median iteration (s), MTBF = 3600 ÷ (F × G) (h), interval = "
              "Daly's optimal training time between checkpoints (s, and iterations); lost shares of wall time: "
              "checkpoints C/(τ+C), re-done work (τ+C)/2M, restarts R/M (%); goodput = what is left (%). Engine "
              "none has none.", "",
              "| preset | layout | engine | C s | R s | iteration s | GPUs | MTBF h | interval s (iterations) | "
              "checkpoints % | re-done % | restarts % | goodput % |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rates:
        lines.append(
            f"| {r['preset']} | {r['layout']} | {r['engine']} | {_s(r['cost_s'])} | {_s(r['restart_s'])} | "
            f"{_s(r['iteration_s'])} | {r['gpus']} | {_num(r['mtbf_s'], '.0f', 3600)} | "
            f"{_num(r['interval_s'], '.0f')} ({_num(r['interval_iterations'], '.0f')}) | "
            f"{_num(r['checkpoint_pct'], '.2g')} | {_num(r['rework_pct'], '.2g')} | "
            f"{_num(r['restart_pct'], '.2g')} | {_num(r['goodput_pct'], '.4f')} |")
    lines.append("")

    excluded = [e for e in figures["excluded"] if not any(e["run"] == c["run_dir"] for c in cells)]
    if excluded:
        lines += ["Other run folders under the logs root left out of the figures: " + "; ".join(
            f"`{e['run']}` {e['status']}: {_reason(e['reason'], 160)}" for e in excluded), ""]
    return "\n".join(lines) + "\n"


# -- main --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, default=DEFAULT_SWEEP, help="sweep file (default: %(default)s)")
    parser.add_argument("--repetitions", type=int, default=3, help="repetitions of every cell (default: %(default)s)")
    parser.add_argument("--logs", type=Path,
                        help="logs root (default: the sweep file's logs, else logs/<sweep file name>)")
    parser.add_argument("--collect-only", action="store_true",
                        help="run neither the sweep nor summarize.py: collect the runs already under the logs root")
    add_output_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.repetitions < 1:
        parser.error("--repetitions must be at least 1")
    sweep_file = args.sweep if args.sweep.is_absolute() else (Path.cwd() / args.sweep)
    if not sweep_file.is_file():
        parser.error(f"{args.sweep}: no such sweep file")
    logs = (args.logs if args.logs else default_logs(sweep_file)).resolve()
    if args.collect_only and not logs.is_dir():
        parser.error(f"--collect-only: {logs} is not a folder")
    meta = {**run_meta("engines-sweep", argv, args.machine), "sweep": _relative(sweep_file, ROOT),
            "sweep_content": yaml.safe_load(sweep_file.read_text()), "repetitions": args.repetitions,
            "logs": str(logs), "collect_only": args.collect_only, "summary": None,
            "failures_per_gpu_hour": goodput.LLAMA3_FAILURES_PER_GPU_HOUR,
            "goodput_assumptions": analysis.goodput_assumptions(goodput.LLAMA3_FAILURES_PER_GPU_HOUR, None)}
    steps: dict[str, dict | None] = {"sweep": None, "summarize": None}
    with tempfile.TemporaryDirectory(prefix="engines-sweep-") as scratch:
        # the sweep as run is kept in the logs root; to collect only, the cells' folders are planned from a copy
        copy = sweep_copy(sweep_file, args.repetitions, logs, Path(scratch) if args.collect_only else logs)
        if not args.collect_only:
            steps["sweep"] = run_step([sys.executable, "-m", "restartbench.sweep", str(copy)])
            summary = logs / "summary"
            steps["summarize"] = run_step([sys.executable, "analysis/summarize.py", str(logs),
                                           "--out", str(summary)])
            meta["summary"] = str(summary / "report.html")
        cells = sweep_cells(copy, logs)
    figures = collect_result(logs, goodput.LLAMA3_FAILURES_PER_GPU_HOUR)
    write_results(args.out, {"meta": meta, "steps": steps, "cells": cells, "figures": figures}, markdown)
    unexpected = [c for c in cells if c["status"] == "failed" and not c["known_issue"]
                  or c["status"] not in ("complete", "skipped", "failed")]
    for cell in unexpected[:10]:
        print(f"cell {cell['preset']} {cell['layout']} {cell['engine']} rep{cell['repetition']}: {cell['status']}"
              + (f" ({_reason(cell['reason'])})" if cell["reason"] else ""), file=sys.stderr)
    if len(unexpected) > 10:
        print(f"... and {len(unexpected) - 10} more cells neither complete, skipped nor failing as shipped",
              file=sys.stderr)
    summarize_failed = steps["summarize"] is not None and steps["summarize"]["exit"] != 0
    return 1 if unexpected or figures["unflagged"] or summarize_failed else 0


if __name__ == "__main__":
    sys.exit(main())
