"""What a GPU visit brought back, made into results: ``bench/results/<date>-<machine>-gpu-<block>.{json,md}`` for
every block it ran (``<date>.N``, N = 2, 3, ..., for a later attempt of a block on the same date: no attempt's
result is overwritten), and the engines' comparison with the headline judged (``import_results``), plus what
``bench/gpu_session.py`` needs to know of the results already held (``held_results``).

    python bench/gpu_session.py --import-results DIR          (DIR: the reply's files_at)

A block's figures are read from the run folders the visit packed (``logs.tar.gz``) through restartbench.analysis, as
every other run's are; the ratios set them against the probe's limits (pinned D2H, the disk's write and cold read).
The Markdown of each result is made from its JSON (``markdown``), so tests/test_bench_results.py can remake it.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import tarfile
import tempfile
from pathlib import Path

from results_io import ROOT, attempt_stem, write_results

sys.path.insert(0, str(ROOT))

from restartbench.analysis import HARNESS_PARTS, RESTART_PART_COLUMNS, collect  # noqa: E402
from restartbench.events import read_events  # noqa: E402

LEDGER = "ledger.json"
LOGS_TAR = "logs.tar.gz"
ENGINES_FIRST = ("torch", "lazy", "lazy-direct", "lazy-direct-prefetch", "dcp-async", "fastpersist", "datastates")
ENGINES_THEN = ("dcp", "torchsnapshot", "decoupled", "lazy-buffered")
VARIANTS = {"lazy-direct": ("lazy", ("--lazy-direct-io",)),
            "lazy-direct-prefetch": ("lazy", ("--lazy-direct-io", "--lazy-prefetch")),
            "lazy-buffered": ("lazy", ("--no-lazy-direct-io",))}
"""Engine blocks that run an engine with options: the block's label -> (the engine, config-n-run.py's options).
Since the fourteenth session lazy writes and reads with O_DIRECT by default on CUDA, so lazy-direct is what the lazy
block runs there (its results are kept, from the third visit), and lazy-buffered measures what that default buys."""
ENGINE_OPTIONS = {"datastates": ("--host-cache-gb", "20")}
"""Options an engine's own 1B block gives it. DataStates' pinned host cache (GiB: DataStates multiplies by 2**30) is
sized to hold the rank's whole state, as the lazy engine's pinned buffer does: 20,978,831,360 bytes at 1B tp1pp1
(the third H100 visit's runs) = 19.54 GiB, so 20. Its default, 4, does not even hold the 1B's largest tensor (the
fp32 partition, 5.58 GiB): that visit's run stopped at its first save. The harness's DataStatesConfigError was
recorded, then DataStates' host tier, still writing the module's files into the folder the harness removed for the
failed save, ended the process (host_tier.cpp's FATAL, in the run's train.stdout.log). A failed save now waits for
those writes first (``DataStatesEngine``)."""


def engine_of(label: str) -> str:
    """The engine an engine block's label runs (``VARIANTS``; else the label is the engine)."""
    return VARIANTS.get(label, (label, ()))[0]


def options_of(label: str) -> tuple[str, ...]:
    """config-n-run.py's options an engine block's label adds (``VARIANTS``, ``ENGINE_OPTIONS``; else none)."""
    return VARIANTS[label][1] if label in VARIANTS else ENGINE_OPTIONS.get(label, ())

DONE = ("ok", "failed")
"""Outcomes that count as a block's result: a failure (as shipped) is a result; a time-out or a skip is not."""
HEADLINE = {"cost_over_floor_max": 2.0, "durable_share_min": 0.9, "restore_share_min": 0.9}
"""The project's goal for lazy on one GPU (issue 25): whole cost <= 2x the D2H floor, durable throughput >= 90 % of
fio's write, cold restore throughput >= 90 % of fio's read, and ahead of every other engine."""


ERROR_LINE = re.compile(r"\berror:|^\w+(Error|Exception)\b.*:|^FAILED ")
"""A line that says what went wrong (``error_lines``)."""


class ResultsError(RuntimeError):
    """What a visit brought back cannot be read: the message says what to give instead."""


# -- the results already held ----------------------------------------------------------------------------------------


def held_results(results: Path, machine: str, block: str, statuses: tuple[str, ...] = DONE
                 ) -> list[tuple[Path, dict]]:
    """Every results file that holds ``block``'s result (ok or failed; any of ``statuses``) for this machine, oldest
    first, with its meta."""
    held = []
    for path in sorted(results.glob(f"*-{machine}-gpu-{block}.json")):
        meta = json.loads(path.read_text()).get("meta", {})
        if meta.get("status") in statuses:
            held.append((path, meta))
    return sorted(held, key=lambda pair: (pair[1].get("date", ""), pair[1].get("started") or "", pair[0].name))


def held_result(results: Path, machine: str, code: str, block: str) -> Path | None:
    """The results file that already holds ``block`` for this machine and code (a result: ok or failed)."""
    return next((path for path, meta in reversed(held_results(results, machine, block))
                 if meta.get("code", {}).get("tree") == code), None)


# -- results ---------------------------------------------------------------------------------------------------------


def import_results(out: Path, results: Path) -> list[Path]:
    """Write ``<date>-<machine>-gpu-<block>.{json,md}`` into ``results`` for every block the visit ran (``out``:
    what it brought back, ``ledger.json`` and ``logs.tar.gz``), and the engines' comparison with the headline."""
    ledger_path = out / LEDGER
    if not ledger_path.is_file():
        raise ResultsError(f"{out} holds no {LEDGER}: give the folder a visit brought back (the reply's files_at)")
    ledger = json.loads(ledger_path.read_text())
    written = []
    with tempfile.TemporaryDirectory(prefix="gpu-session-") as tmp:
        logs = Path(tmp)
        if (out / LOGS_TAR).is_file():
            with tarfile.open(out / LOGS_TAR) as tar:
                tar.extractall(logs, filter="data")
        probe = probe_limits(ledger, results)
        for name, entry in ledger["blocks"].items():
            if "seconds" not in entry:
                continue  # skipped, blocked or not started: nothing measured
            result = block_result(ledger, name, entry, logs, probe)
            if name != "setup":
                written.append(write_results(results, result, markdown, attempt_stem(results, result["meta"])))
        engines = engines_summary(results, ledger)
        if engines:
            written.append(write_results(results, engines, markdown))
    return written


def block_meta(ledger: dict, name: str, entry: dict) -> dict:
    session = ledger["session"]
    runtime = ledger["blocks"].get("setup", {}).get("files", {}).get("runtime.json", {})
    date = (entry.get("started") or session["visits"][-1]["started"])[:10]
    return {"benchmark": f"gpu-{name}", "date": date, "machine": session["machine"], "gpu": session.get("gpu"),
            "code": session["code"], "session_argv": session["visits"][entry["visit"] - 1]["argv"],
            "runtime": runtime, **{k: entry.get(k) for k in ("status", "error", "exit", "expected_s", "basis",
                                                             "seconds", "started", "ended", "commands")}}


def error_lines(log: Path, limit: int = 6) -> list[str]:
    """The first lines of a block's log that say what went wrong: a compiler's ``error:``, pytest's ``E`` lines, a
    Python exception's last line. A failure's tail is often a traceback of the build tool around it (the
    2026-11-27 DataStates build's last 40 lines were setuptools' frames, its ``uint64_t`` error far above)."""
    if not log.is_file():
        return []
    found = []
    for line in log.read_text(errors="replace").splitlines():
        text = line.strip()
        if (ERROR_LINE.search(text) or text.startswith("E  ")) and text not in found:
            found.append(text)
            if len(found) == limit:
                break
    return found


def block_result(ledger: dict, name: str, entry: dict, logs: Path, probe: dict | None) -> dict:
    result = {"meta": block_meta(ledger, name, entry), "log_tail": entry.get("log_tail", []),
              "files": entry.get("files", {})}
    if entry.get("status") != "ok":
        result["error_lines"] = error_lines(logs / f"{name}.log")
    runs = logs / name / "runs"
    if runs.is_dir():
        result["runs"] = run_figures(runs, probe if name.startswith("engines-1B-") else None)
    if name == "probe" and entry["status"] in DONE:
        try:
            result["limits"] = limits_of(entry["files"])
        except ResultsError as error:
            result["limits_error"] = str(error)
    return result


def probe_limits(ledger: dict, results: Path) -> dict | None:
    """The probe's limits: this visit's probe (whatever its files give, even where the block failed on one of its
    commands: its copies are measured before its storage), else the latest held for this machine, at this code or
    another (None: no probe, or one whose files give nothing: the probe's own result says why)."""
    probe = ledger["blocks"].get("probe", {})
    if probe.get("status") in DONE:
        try:
            return limits_of(probe.get("files", {}))
        except ResultsError:
            return None
    held = held_results(results, ledger["session"]["machine"], "probe")
    return json.loads(held[-1][0].read_text()).get("limits") if held else None


def limits_of(files: dict) -> dict:
    """Pinned D2H bandwidth and the cost of pinning (gpu_probe.py), and the storage's write and cold read
    (bench/limits.py's best method; None each, with ``storage_error``, where it measured none)."""
    copies, storage = files.get("copies.json"), files.get("limits.json")
    if not isinstance(copies, dict):
        raise ResultsError("the probe's copies.json is missing or not JSON: see its log in logs.tar.gz")
    limits = {"d2h_pinned_GBps": copies["d2h_pinned"]["best_GBps"], "pin_s_per_GiB": copies["pin"]["best_s_per_GiB"],
              **engine_pin_limits(copies.get("engine_pin")), "write_MBps": None, "read_MBps": None}
    if not isinstance(storage, dict):
        return {**limits, "storage_error": "bench/limits.py wrote no JSON: see the probe's log in logs.tar.gz"}
    if storage.get("error"):
        return {**limits, "storage_error": storage["error"]}
    try:
        write, read = storage["write"]["best_MBps"], storage["read"]["best_MBps"]
    except (KeyError, TypeError):
        raise ResultsError("bench/limits.py's JSON has no write.best_MBps / read.best_MBps: update "
                           "gpu_session.limits_of to its format") from None
    return {**limits, "write_MBps": write, "read_MBps": read, "storage_tool": storage.get("tool", "fio")}


def engine_pin_limits(engine_pin: dict | None) -> dict:
    """The lazy engine's own pinning (gpu_probe.py's ``engine_pin``, absent before 2026-11-26's fault-in), s/GiB with
    and without its parallel fault-in, and the fault-in's threads."""
    if not engine_pin:
        return {}
    huge = engine_pin.get("prefault_huge")  # measured since the huge-page mapping (2026-11-26, later)
    return {"engine_pin_s_per_GiB": engine_pin["prefault"]["best_s_per_GiB"],
            "engine_pin_fault_threads": engine_pin["prefault"]["fault_threads"],
            "engine_pin_no_prefault_s_per_GiB": engine_pin["no_prefault"]["best_s_per_GiB"],
            **({"engine_pin_huge_s_per_GiB": huge["best_s_per_GiB"], "engine_pin_huge_d2h_GBps": huge["d2h_GBps"],
                "engine_pin_d2h_GBps": engine_pin["prefault"]["d2h_GBps"]} if huge else {})}


def run_figures(runs: Path, probe: dict | None) -> list[dict]:
    """Per run folder under ``runs``: its last checkpoint and first restore as restartbench.analysis reads them, the
    GPU memory peaks from the events, and with ``probe`` the ratios to its limits."""
    collected = collect(runs)
    table = collected.table()
    kept = {str(e.run): e for e in collected.excluded if e.training_kept}  # its restart never finished
    rows = [{"run": str(e.run.relative_to(runs)), "status": e.status, "reason": e.reason}
            for e in collected.excluded if not e.training_kept]
    for run, frame in (table.groupby("run") if not table.empty else ()):
        ckpts = frame[frame.kind == "checkpoint"].sort_values("step")
        restarts = frame[frame.kind == "restart"].sort_values("attempt")
        status = {"status": kept[run].status, "reason": kept[run].reason} if run in kept else {"status": "complete"}
        figures = {"run": str(Path(run).relative_to(runs)), "engine": frame["engine"].iloc[0], **status,
                   **gpu_peaks(Path(run))}
        if not ckpts.empty:
            figures.update(checkpoint_figures(ckpts.iloc[-1]))
        if not restarts.empty:
            figures.update(restart_figures(restarts.iloc[0]))
        if probe:
            figures.update(ratios(figures, probe))
        rows.append(figures)
    return rows


def _value(row, column: str):
    value = row.get(column)
    return None if value is None or value != value else (value.item() if hasattr(value, "item") else value)


def checkpoint_figures(row) -> dict:
    return {key: _value(row, column) for key, column in (
        ("tag", "tag"), ("bytes", "bytes"), ("bytes_per_rank_max", "bytes_per_rank_max"), ("stall_s", "stall_max_s"),
        ("slowdown_s", "slowdown_s"), ("cost_s", "cost_s"), ("durable_s", "durable_rank_max_s"),
        ("durable_MBps", "write_MBps"), ("iteration_s", "iteration_s"))}


def restart_figures(row) -> dict:
    """The first restore: its verdict, the restart (all of it, and less the harness's own checks: what a job that
    checks nothing would take), its parts (max over ranks) and the harness's checks on the critical path."""
    parts = {column[len("restart_"):-2]: _value(row, column) for column, _ in RESTART_PART_COLUMNS}
    checks = {label: _value(row, f"path_{label.replace(' ', '_')}_s") for label in HARNESS_PARTS}
    prefetched = bool(_value(row, "prefetched"))  # the read ran during start-up: restore is that read's own time
    return {"verdict": _value(row, "verdict"), "exact": _value(row, "exact"), "restart_s": _value(row, "restart_s"),
            "restart_less_checks_s": _value(row, "restart_less_checks_s"), "restart_parts_s": parts,
            "harness_checks_s": checks, "prefetched": prefetched, "prefetch_wait_s": _value(row, "prefetch_wait_s"),
            "ds_init_stages_s": _value(row, "ds_init_parts"),
            "restore_s": _value(row, "prefetch_read_s") if prefetched else parts.get("ckpt_load"),
            "cache": _value(row, "cache"),
            "restore_MBps": _value(row, "read_MBps"), "bytes_read": _value(row, "bytes_read"),
            "restore_peak_rss_bytes": _value(row, "restore_peak_rss_bytes"),
            "train_peak_rss_bytes": _value(row, "train_peak_rss_bytes")}  # the restart row holds steady training's


def gpu_peaks(run: Path) -> dict:
    """The largest ``cuda_max_allocated_bytes`` any span recorded, per phase (None on a CPU run)."""
    peaks: dict[str, int | None] = {"train_gpu_peak_bytes": None, "restore_gpu_peak_bytes": None}
    for event in read_events(run):
        peak = event.get("cuda_max_allocated_bytes")
        key = f"{'train' if event['phase'] == 'train' else 'restore'}_gpu_peak_bytes"
        if peak is not None:
            peaks[key] = max(peaks[key] or 0, peak)
    return peaks


def ratios(figures: dict, probe: dict) -> dict:
    """The run against the probe's limits: stall and whole cost over the D2H floor (the rank's bytes over pinned
    D2H bandwidth), durable throughput over fio's write, a cold restore's throughput over fio's read."""
    out: dict = {}
    if figures.get("bytes_per_rank_max"):
        floor = figures["bytes_per_rank_max"] / (probe["d2h_pinned_GBps"] * 1e9)
        out.update(d2h_floor_s=floor, stall_over_floor=_over(figures.get("stall_s"), floor),
                   cost_over_floor=_over(figures.get("cost_s"), floor))
    out["durable_over_write"] = _over(figures.get("durable_MBps"), probe["write_MBps"])
    cold = figures.get("cache") == "cold"
    out["restore_over_read"] = _over(figures.get("restore_MBps"), probe["read_MBps"]) if cold else None
    return out


def _over(value: float | None, limit: float | None) -> float | None:
    return value / limit if value is not None and limit else None


def block_options(meta: dict) -> list[str]:
    """The options an engine block's run was given beyond every block's own (``VARIANTS``, ``ENGINE_OPTIONS``), as
    its command line held in ``meta`` says: the words after its ``--checkpoint-dir`` and that folder."""
    words = shlex.split((meta.get("commands") or [""])[0])
    return words[words.index("--checkpoint-dir") + 2:] if "--checkpoint-dir" in words else []


def engines_summary(results: Path, ledger: dict) -> dict | None:
    """Every engine's latest 1B figures held in ``results`` for this machine (just written included), side by side,
    each with the commit it ran (visits run other code), with the headline for lazy judged; None when there is none."""
    session = ledger["session"]
    rows, dates = [], []
    for engine in ENGINES_FIRST + ENGINES_THEN:  # a block that timed out may hold its training's figures
        held = held_results(results, session["machine"], f"engines-1B-{engine}", (*DONE, "timed out"))
        if not held:
            continue
        path, meta = held[-1]
        run = next((r for r in json.loads(path.read_text()).get("runs", []) if r.get("engine") == engine_of(engine)),
                   {})
        rows.append({"status": meta["status"], "error": meta.get("error"), "file": path.name,
                     "commit": meta.get("code", {}).get("commit"), "options": block_options(meta), **run,
                     "engine": engine})  # the block's label
        dates.append(meta["date"])
    if not rows:
        return None
    meta = {"benchmark": "gpu-engines-1B", "date": max(dates), "machine": session["machine"],
            "gpu": session.get("gpu"), "code": session["code"],
            "runtime": ledger.get("blocks", {}).get("setup", {}).get("files", {}).get("runtime.json", {})}
    variants = {label: headline(rows, label) for label in VARIANTS if any(r["engine"] == label for r in rows)}
    return {"meta": meta, "engines": rows, "headline": headline(rows),
            **({"variant_headlines": variants} if variants else {})}


def headline(rows: list[dict], subject: str = "lazy") -> dict:
    """The goal for lazy (``HEADLINE``), or for its variant ``subject`` (``VARIANTS``), each criterion met or not, or
    unjudged where a figure is missing; against every other engine (lazy's variants are not others)."""
    lazy = next((r for r in rows if r["engine"] == subject and r.get("cost_s") is not None), None)
    if lazy is None:
        return {"judged": False, "reason": f"no {subject} run with figures yet"}
    others = [r for r in rows if engine_of(r["engine"]) != "lazy" and r.get("cost_s") is not None]
    checks = {
        "cost_within_2x_floor": _at_most(lazy.get("cost_over_floor"), HEADLINE["cost_over_floor_max"]),
        "durable_at_least_90pct_of_fio_write": _at_least(lazy.get("durable_over_write"),
                                                         HEADLINE["durable_share_min"]),
        "cold_restore_at_least_90pct_of_fio_read": _at_least(lazy.get("restore_over_read"),
                                                             HEADLINE["restore_share_min"]),
    }
    for key, label in (("cost_s", "cost"), ("durable_s", "durable"), ("restore_s", "restore")):
        theirs = [r[key] for r in others if r.get(key) is not None]
        checks[f"{label}_ahead_of_every_other_engine"] = (
            None if lazy.get(key) is None or not theirs else lazy[key] < min(theirs))
    return {"judged": True, "checks": checks, "others": sorted(r["engine"] for r in others),
            "met": all(checks.values()) if None not in checks.values() else None}


def _at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def _at_least(value: float | None, limit: float) -> bool | None:
    return None if value is None else value >= limit


# -- Markdown, made from the JSON --------------------------------------------------------------------------------------


def _f(value, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def _meta_lines(meta: dict) -> list[str]:
    code = meta["code"]
    runtime = meta.get("runtime") or {}
    return [f"Machine: **{meta['machine']}** ({meta.get('gpu') or 'no GPU'}); Python {runtime.get('python', '?')}, "
            f"torch {runtime.get('torch', '?')}, DeepSpeed {runtime.get('deepspeed', '?')}. Code: tree "
            f"`{code['tree'][:12]}` ({code['files']} files under {', '.join(code['paths'])}), commit "
            f"{(code.get('commit') or 'unknown')[:10]}."]


def markdown(result: dict) -> str:
    """Every gpu-<block> result's Markdown (the engines' comparison's too), made from its JSON alone."""
    if result["meta"]["benchmark"] == "gpu-engines-1B":
        return engines_markdown(result)
    meta = result["meta"]
    lines = [f"# GPU block `{meta['benchmark'][4:]}` — {meta['machine']}, {meta['date']}", "",
             *_meta_lines(meta), "",
             f"`python bench/gpu_session.py {shlex.join(meta['session_argv'])}`: **{meta['status']}** after "
             f"{_f(meta['seconds'], '.0f')} s (expected {meta['expected_s']:.0f} s: {meta['basis']}).", ""]
    if meta.get("error"):
        lines += [f"Error: {meta['error']} (exit {meta.get('exit')})."]
        if result.get("error_lines"):
            lines += ["", "First error lines of its log:", "", "```", *result["error_lines"], "```"]
        lines += ["", "Last lines of its log:", "", "```", *result["log_tail"][-20:], "```", ""]
    lines += ["Commands:", "", *[f"- `{c}`" for c in meta["commands"]], ""]
    if result.get("limits"):
        lines += limits_markdown(result["limits"])
    if "runs" in result:
        lines += runs_markdown(result["runs"])
    return "\n".join(lines) + "\n"


def limits_markdown(lim: dict) -> list[str]:
    disk = (f"write ending in fsync **{lim['write_MBps']:.0f} MB/s**, cold read **{lim['read_MBps']:.0f} MB/s** "
            f"(bench/limits.py: best of its {lim.get('storage_tool', 'fio')} methods, one job, the checkpoint's one "
            "rank)" if lim.get("write_MBps") else f"not measured: {lim.get('storage_error')}")
    engine_pin = [] if "engine_pin_s_per_GiB" not in lim else [
        f"- the lazy engine's pinning of fresh memory (copies.pin_pages): **{lim['engine_pin_s_per_GiB']:.2f} s/GiB** "
        f"with its fault-in on {lim['engine_pin_fault_threads']} threads, "
        f"{lim['engine_pin_no_prefault_s_per_GiB']:.2f} s/GiB without" + (
            "" if "engine_pin_huge_s_per_GiB" not in lim else
            f"; private huge-page memory {lim['engine_pin_huge_s_per_GiB']:.2f} s/GiB with the fault-in (D2H into it "
            f"{lim['engine_pin_huge_d2h_GBps']:.1f} GB/s, into the shared mapping "
            f"{lim['engine_pin_d2h_GBps']:.1f} GB/s)")]
    return ["## Limits", "",
            f"- pinned device-to-host copy: **{lim['d2h_pinned_GBps']:.1f} GB/s** (bench/gpu_probe.py: one torch copy "
            f"of 4 GiB, best of 5), pinning host memory {lim['pin_s_per_GiB']:.2f} s/GiB (bench/gpu_probe.py)",
            *engine_pin, f"- disk: {disk}", ""]


def runs_markdown(runs: list[dict]) -> list[str]:
    lines = ["## Runs (last checkpoint; restore = the relaunch's first attempt)", "",
             "| run | engine | stall s | slowdown s | whole cost s | durable s | restore s (cache) | restart s | "
             "restart less checks s | verdict | host peak GB train/restore | GPU peak GB train/restore | "
             "stall ÷ D2H floor | cost ÷ floor | durable ÷ disk write | restore ÷ disk read |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if "stall_s" not in r:  # no figures: failed, skipped or left out whole
            lines.append(f"| {r['run']} | — | {r['status']}: {r['reason']} |" + " |" * 13)
            continue
        verdict = r.get("verdict") if r.get("status") == "complete" else f"restart left out ({r.get('status')})"
        cache = f" ({r['cache']}{', prefetched' if r.get('prefetched') else ''})" if r.get("cache") else ""
        lines.append(
            f"| {r['run']} | {r['engine']} | {_f(r.get('stall_s'), '.3f')} | {_f(r.get('slowdown_s'), '.3f')} | "
            f"{_f(r.get('cost_s'), '.3f')} | {_f(r.get('durable_s'))} | {_f(r.get('restore_s'))}{cache} "
            f"| {_f(r.get('restart_s'))} | {_f(r.get('restart_less_checks_s'))} | {verdict} | "
            f"{_gb(r.get('train_peak_rss_bytes'))}/"
            f"{_gb(r.get('restore_peak_rss_bytes'))} | {_gb(r.get('train_gpu_peak_bytes'))}/"
            f"{_gb(r.get('restore_gpu_peak_bytes'))} | {_f(r.get('stall_over_floor'))} | "
            f"{_f(r.get('cost_over_floor'))} | {_f(r.get('durable_over_write'))} | {_f(r.get('restore_over_read'))} |")
    partial = [r for r in runs if "stall_s" in r and r.get("status") != "complete"]
    lines += ["", *(f"- {r['run']}: {r['status']}: {r['reason']}" for r in partial)] if partial else []
    parts = [r for r in runs if r.get("restart_parts_s")]
    if parts:
        lines += ["", "Restart parts, s (max over ranks; `dist_init` holds the process group and the CUDA context, "
                  "made by torch.cuda.set_device; NCCL makes its communicators at their first collectives, in "
                  "`ds_init`):", ""]
        lines += [f"- {r['run']}: " + ", ".join(f"{k} {_f(v)}" for k, v in r["restart_parts_s"].items()
                                                 if v is not None)
                  + ds_init_clause(r.get("ds_init_stages_s"))
                  + (f" (prefetched: the read ran from before the model build, {_f(r.get('restore_s'))} s, and "
                     f"the load waited {_f(r.get('prefetch_wait_s'))} s of it)" if r.get("prefetched") else "")
                  + "; the harness's checks on the critical path: "
                  + (", ".join(f"{k} {_f(v)}" for k, v in r.get("harness_checks_s", {}).items() if v is not None)
                     or "none recorded") for r in parts]
    prefetched = ("; prefetched = the engine read the checkpoint from before the model build (--lazy-prefetch): "
                  "restore is then that read's own time, and its load only waited for what was left of it and copied "
                  "the tensors out" if any(r.get("prefetched") for r in runs) else "")
    lines += ["", FIGURES_SAID + prefetched, ""]
    return lines


def ds_init_clause(stages: dict | None, shown: int = 3) -> str:
    """The largest stages of the restart's ``deepspeed.initialize`` (restartbench.ds_init_timing, max over ranks),
    where the run recorded them: what its ds_init part is made of."""
    if not stages:
        return ""
    largest = sorted(stages.items(), key=lambda item: -item[1])[:shown]
    return f" (ds_init's largest stages: {', '.join(f'{name} {_f(value)}' for name, value in largest)})"


FIGURES_SAID = (
    "stall = the longest any rank's save blocked training (plus lazy's later wait for its copies); slowdown = what the "
    "iterations the save's background work overlapped took beyond the clean median; whole cost = stall + slowdown; "
    "durable = first save start to the last rank's files fsync'd; restore = the relaunch's checkpoint load, page "
    "cache evicted first (cold) unless said; restart = launch to the end of the first resumed iteration; restart "
    "less checks = the restart less the harness's own checks on its critical path (the manifest check of the files, "
    "the page-cache eviction, the exactness proof's digest): what a job that checks nothing would take; verdict = "
    "the restored state against the digests recorded at save and iteration K+1 against the uninterrupted run "
    "(restartbench's proof); host peak = largest RSS of any rank in steady training / in the restart; GPU peak = "
    "torch's cuda max allocated in any span; D2H floor = the rank's checkpoint bytes ÷ the probe's pinned D2H "
    "bandwidth; disk write/read = the probe's bench/limits.py figures (fio's, or dd's where the machine has no fio; "
    "a ratio above 1 says the limit was measured too low; — where the probe measured none). All on the machine "
    "named above, one run each.")


def _gb(value) -> str:
    return "—" if value is None else f"{value / 1e9:.1f}"


LAZY_DEFAULT_NOTE = ("The lazy row ran as its commit's lazy did by default: buffered before 7c7cc1a (2026-11-27), "
                     "with O_DIRECT on CUDA from it on; lazy-buffered is lazy with `--no-lazy-direct-io`.")
"""Said under every engines table: what a plain lazy block ran depends on its commit."""
SETUP_IN_DS_INIT = {"datastates": "DataStates pins its host cache (cudaMallocHost of --host-cache-gb)",
                    "fastpersist": "FastPersist loads its ops (built on a fresh machine's first run)"}
"""Engines whose set-up DeepSpeed does inside ``deepspeed.initialize``, when it makes its checkpoint engine: in their
rows it is part of ds_init, on the relaunch as well, and engine_setup holds the harness's own set-up only."""


def engines_markdown(result: dict) -> str:
    meta, head = result["meta"], result["headline"]
    lines = [f"# Engines at 1B bf16 on one GPU — {meta['machine']}, {meta['date']}", "", *_meta_lines(meta), "",
             "Each engine: one `config-n-run.py 1B tp1pp1 --device cuda --dtype bf16 --iters 2 --save-interval 1 "
             "--keep-checkpoints 1` run (two saves, a cold restore, proved exact), its own "
             "`gpu-engines-1B-<engine>` file"
             + "".join(f"; {label} is {engine} with `{' '.join(options)}`" for label, (engine, options) in
                       VARIANTS.items() if any(r["engine"] == label for r in result["engines"]))
             + "".join(f"; {r['engine']} ran with `{' '.join(r['options'])}`" for r in result["engines"]
                       if r.get("options") and r["engine"] not in VARIANTS) + ".",
             "", LAZY_DEFAULT_NOTE, ""]
    lines += runs_markdown([{**r, "run": r["engine"], "reason": r.get("reason") or r.get("error") or "no figures"}
                            for r in result["engines"]])
    in_ds_init = [note for engine, note in SETUP_IN_DS_INIT.items() if any(r["engine"] == engine
                                                                         for r in result["engines"])]
    if in_ds_init:
        lines += ["; ".join(in_ds_init) + " when DeepSpeed makes its checkpoint engine, inside deepspeed.initialize: "
                  "that set-up is in ds_init, on the relaunch too, not in engine_setup.", ""]
    commits = {r["engine"]: r.get("commit") or "?" for r in result["engines"]}
    if len(set(commits.values())) > 1:
        lines += ["The engines ran at different code (visits run the code of their day): "
                  + ", ".join(f"{engine} at {str(commit)[:10]}" for engine, commit in commits.items()) + ".", ""]
    lines += headline_markdown(head, "lazy")
    for label, head in result.get("variant_headlines", {}).items():
        lines += ["", *headline_markdown(head, f"lazy with {' '.join(options_of(label))} ({label})")]
    return "\n".join(lines) + "\n"


def headline_markdown(head: dict, subject: str) -> list[str]:
    lines = [f"## Headline: {subject}", ""]
    if not head["judged"]:
        return [*lines, f"Not judged: {head['reason']}."]
    verdict = {True: "met", False: "NOT met", None: "not judged (a figure is missing)"}
    lines += [f"- {name.replace('_', ' ')}: **{verdict[ok]}**" for name, ok in head["checks"].items()]
    return [*lines, "", f"Against: {', '.join(head['others']) or 'no other engine yet'}. Goal (issue 25): whole cost "
            f"≤ {HEADLINE['cost_over_floor_max']:g}× the D2H floor, durable throughput ≥ "
            f"{HEADLINE['durable_share_min']:.0%} of fio's write, cold restore ≥ "
            f"{HEADLINE['restore_share_min']:.0%} of fio's read, lower cost, durable and restore times than "
            f"every other engine: **{verdict[head['met']]}**."]


