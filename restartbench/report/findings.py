"""The findings: the plain sentences at the top of the report and the console summary, which engine stalls training
least, what each configuration's stall, whole cost, durability and restart come to, and which throughputs went above
the storage's measured limit: a run above the limit's max is a defect to investigate (``limit_defects``)."""

from __future__ import annotations

import pandas as pd

from restartbench import analysis
from restartbench.analysis.baselines import LIMIT_DEFECT, LIMIT_UNDERESTIMATED, SPREAD_MIN_PASSES
from restartbench.report.style import fmt_bytes, fmt_s, fmt_share


def findings(table: pd.DataFrame) -> list[str]:
    """Plain sentences: first which engine stalls training least overall, then per configuration the stall ranking,
    engines whose files become durable long after training resumed, and what the restart time is made of."""
    if table.empty:
        return []
    ckpt = analysis.checkpoint_summary(table)
    rest = analysis.restart_summary(table)
    keys = [k for k in analysis.group_keys(table) if k != "engine"]
    out, winners = [], []
    for values in _configurations(ckpt, rest, keys):
        c = _matching(ckpt, keys, values).sort_values("stall_s", kind="stable")
        r = _matching(rest, keys, values)
        sentences = []
        if not c.empty and pd.notna(c.iloc[0]["stall_s"]):
            winners.append(c.iloc[0]["engine"])
            sentences.extend(_checkpoint_sentences(c))
        sentences.extend(_restart_sentences(r))
        ranks = pd.concat([c["ranks"], r["ranks"]]).max()
        out.append(f"{_where(table, keys, values, ranks)}: " + " ".join(sentences))
    out.extend(_limit_findings(table, ckpt, rest, keys))
    if winners:
        out.insert(0, _least_stall_overall(winners))
    return out


def _configurations(ckpt: pd.DataFrame, rest: pd.DataFrame, keys: list[str]) -> list[tuple[str, ...]]:
    """Every configuration (its ``keys`` as text) with a checkpoint or a restart summary row, in order of first
    appearance."""
    return list(dict.fromkeys([*map(tuple, ckpt[keys].astype(str).values),
                               *map(tuple, rest[keys].astype(str).values)]))


def _matching(frame: pd.DataFrame, keys: list[str], values: tuple[str, ...]) -> pd.DataFrame:
    """The rows of ``frame`` whose ``keys``, as text, are ``values`` (so that NaN matches its configuration's 'nan')."""
    return frame[(frame[keys].astype(str) == list(values)).all(axis=1)]


def _where(table: pd.DataFrame, keys: list[str], values: tuple[str, ...], ranks: float) -> str:
    """A configuration as its findings name it: its keys, its ranks and, where recorded, its device."""
    device = _matching(table, keys, values)["device"].dropna()
    return " · ".join(values) + f" ({int(ranks)} ranks" + (f", {device.iloc[0]}" if not device.empty else "") + ")"


def _least_stall_overall(winners: list[str]) -> str:
    """The engine that stalls training least in the most configurations (``winners``: one engine per
    configuration), and how often the others did."""
    counts = pd.Series(winners).value_counts()
    lead = counts.index[0]
    return (f"Least training stall: {lead} in {counts.iloc[0]} of {len(winners)} configuration(s)"
            + (f" (others: {', '.join(f'{e} {n}' for e, n in counts.iloc[1:].items())})." if len(counts) > 1
               else "."))


def _checkpoint_sentences(ckpt: pd.DataFrame) -> list[str]:
    """One configuration's checkpoints (its checkpoint_summary rows by stall, the first one's stall measured): the
    stall ranking, the whole cost where background work adds to it, and the engines durable long after the stall."""
    return [_stall_ranking(ckpt), *_whole_cost_sentences(ckpt), *_late_durability(ckpt)]


def _stall_ranking(ckpt: pd.DataFrame) -> str:
    """The least stall, its iterations' worth and durability, then the other engines' stalls as multiples of it."""
    best = ckpt.iloc[0]
    text = (f"{best['engine']} stalls training least: {fmt_s(best['stall_s'])} per checkpoint (max over ranks, "
            f"median of {int(best['checkpoints'])}")
    if pd.notna(best["stall_iterations"]):
        text += f"; {best['stall_iterations']:.2g} iterations' worth"
    text += f"), files durable after {fmt_s(best['durable_s'])}"
    others = [f"{row['engine']} {fmt_s(row['stall_s'])} ({row['stall_s'] / best['stall_s']:.1f}×)"
              for _, row in ckpt.iloc[1:].iterrows() if best["stall_s"] and pd.notna(row["stall_s"])]
    return text + (f"; then {', '.join(others)}." if others else "; the only engine measured here.")


def _whole_cost_sentences(ckpt: pd.DataFrame) -> list[str]:
    """Engines of one configuration whose background work cost training more than their stall, and the least whole
    cost where it is another engine than the least stall (``ckpt``: its checkpoint_summary rows, by stall)."""
    if "cost_s" not in ckpt:
        return []
    costly = [row for _, row in ckpt.iterrows() if pd.notna(row["slowdown_s"]) and row["slowdown_s"] > 0.005
              and row["slowdown_s"] > row["stall_s"]]
    out = []
    if costly:
        out.append("; ".join(f"{row['engine']}'s background work slows the {row['overlapped_iterations']:.0f} "
                             f"iteration(s) it overlaps by {fmt_s(row['slowdown_s'])}, so a checkpoint costs "
                             f"training {fmt_s(row['cost_s'])} in all"
                             + (f", {row['cost_s'] / row['stall_s']:.1f}× its" if row["stall_s"] > 0 else ", its")
                             + f" {fmt_s(row['stall_s'])} stall" for row in costly) + ".")
    cheapest = ckpt.dropna(subset=["cost_s"]).sort_values("cost_s", kind="stable")
    if not cheapest.empty and not ckpt.empty and cheapest.iloc[0]["engine"] != ckpt.iloc[0]["engine"]:
        best = cheapest.iloc[0]
        out.append(f"The least whole cost (stall + slowdown) is {best['engine']}'s: {fmt_s(best['cost_s'])} per "
                   "checkpoint.")
    return out


def _late_durability(ckpt: pd.DataFrame) -> list[str]:
    """The engines of one configuration whose files are durable well after training resumed (more than twice the
    stall, and more than 5 ms after it): the window in which a crash loses the checkpoint. Empty where none is."""
    late = [row for _, row in ckpt.iterrows() if pd.notna(row["durable_s"]) and row["stall_s"]
            and row["durable_s"] > 2 * row["stall_s"] and row["durable_s"] - row["stall_s"] > 0.005]
    if not late:
        return []
    return [", ".join(f"{row['engine']} ({fmt_s(row['stall_s'])} stall, durable after {fmt_s(row['durable_s'])})"
                      for row in late)
            + (" returns" if len(late) == 1 else " return")
            + " to training well before the files are durable (a synchronous engine leaves them in the page cache "
              "until they are fsync'd; an asynchronous one goes on writing in the background): a crash in that "
              "window loses the checkpoint."]


def _restart_sentences(rest: pd.DataFrame) -> list[str]:
    """One configuration's restarts (its restart_summary rows): what a restoring restart takes, or, where only
    engine none relaunched, the start-up floor alone. Empty where no restart was timed."""
    restores = rest["restores_checkpoint"].astype(bool)
    restoring = rest[restores & rest["restart_s"].notna()]
    floor = rest[~restores & rest["restart_s"].notna()]
    if not restoring.empty:
        return [_restoring_sentence(restoring, floor)]
    if not floor.empty:
        return [f"Engine none relaunches without a checkpoint in {fmt_s(floor.iloc[0]['restart_s'])}: the start-up "
                "floor every restart pays."]
    return []


def _restoring_sentence(restoring: pd.DataFrame, floor: pd.DataFrame) -> str:
    """The restarts that restore a checkpoint: their totals, the load's share, where the rest of the time goes,
    engine none's floor (``floor``: its rows, if measured) and what a warm page cache means."""
    totals = ", ".join(f"{fmt_s(row['restart_s'])} ({row['engine']})" for _, row in restoring.iterrows())
    caches = ", ".join(sorted({str(x) for x in restoring["cache"].dropna()})) or "unknown"
    text = (f"Restart takes {totals} from relaunch to the end of the first resumed iteration."
            + _load_clause(restoring, caches) + _prefetch_clause(restoring) + _start_up_clause(restoring) + ".")
    if not floor.empty:
        text += (f" A relaunch that restores nothing (engine none) takes {fmt_s(floor.iloc[0]['restart_s'])}: the "
                 "start-up floor every restart pays.")
    if "warm" in caches:
        text += (" A warm cache means some of the checkpoint was in memory when the restore began, so reads may have "
                 "come from memory, not storage.")
    return text


def _load_clause(restoring: pd.DataFrame, caches: str) -> str:
    """The checkpoint load's range over the engines, its largest share of the restart and the page cache it read
    from (``caches``); empty where no load was timed."""
    loads = restoring["restart_ckpt_load_s"].dropna()
    if loads.empty:
        return ""
    share = (restoring["restart_ckpt_load_s"] / restoring["restart_s"]).dropna()
    span = fmt_s(loads.min()) if loads.min() == loads.max() else f"{fmt_s(loads.min())}–{fmt_s(loads.max())}"
    return f" Loading the checkpoint is {span} (at most {100 * share.max():.1f}% of it; {caches} page cache)"


def _start_up_clause(restoring: pd.DataFrame) -> str:
    """The three largest start-up parts of the critical path (medians over the engines), leaving out the load, the
    first iteration, the gaps and the harness's own checks; empty where none was timed."""
    path = [(label, restoring[column].median()) for column, label in analysis.PATH_COLUMNS
            if column in restoring and label not in ("ckpt load", "1st iter", "gaps", *analysis.HARNESS_PARTS)]
    path = sorted([(label, v) for label, v in path if pd.notna(v)], key=lambda p: -p[1])[:3]
    if not path:
        return ""
    return "; the time goes to start-up: " + ", ".join(f"{label} {fmt_s(v)}" for label, v in path)


def _limit_findings(table: pd.DataFrame, ckpt: pd.DataFrame, rest: pd.DataFrame, keys: list[str]) -> list[str]:
    """The throughputs above their limit: each run whose write or restore went above the winning method's max (a
    defect, ``limit_defects``), then each configuration whose baseline has no spread and went above 105 % of it (the
    rule before issue 26)."""
    out = limit_defects(table)
    for summary, side, column, flag in ((ckpt, "wrote", "write_pct_of_storage", "write_limit"),
                                        (rest, "restored", "read_pct_of_storage", "read_limit")):
        if flag not in summary:
            continue
        for _, row in summary[summary[flag].fillna("").astype(str).str.startswith(LIMIT_UNDERESTIMATED)].iterrows():
            where = " · ".join(str(row[k]) for k in keys) + f" · {row['engine']}"
            out.append(f"Limit underestimated: {where} {side} at {fmt_share(row[column])} of the storage's measured "
                       f"bandwidth (median; {row[flag].removeprefix(LIMIT_UNDERESTIMATED).strip(' ()')} "
                       "above 105 %): baseline.json measured the storage too low, so this ratio is no engine beating "
                       "the disk. Its baseline.json has no spread (an older format, an object store's, or fewer "
                       f"than {SPREAD_MIN_PASSES} passes of the winning method, as a run's own baseline has), so the "
                       "rule from before issue 26 judges it; measure the limit's spread (bench/limits.py --repeats 5 "
                       "at the checkpoint's concurrency) to judge the ratio against the best method's max.")
    return out


#: Per side: the kind of row it is judged on, the verb, what a row is, and what to look at when a throughput is above
#: the limit's max.
DEFECT_SIDES = (
    ("write", "checkpoint", "wrote", "checkpoint(s)",
     "whether the engine's files were durable when the run says they were (a write timed without its fsync runs at "
     "the page cache's speed), whether its bytes are the bytes it wrote, and whether the probe measured the disk the "
     "checkpoint went to (baseline.json's target, probe_below_rule, the machine's load while it ran)"),
    ("read", "restart", "restored", "restore(s)",
     "whether the engine read from the page cache though the restore was meant cold (cache {cache}{resident}: a "
     "page the eviction missed, a file read twice within the load), whether its bytes read are the bytes it read"
     "{process}, and whether the probe reached the disk the checkpoint was read from (baseline.json's target, "
     "probe_below_rule, the machine's load while it ran)"),
)


def limit_defects(table: pd.DataFrame) -> list[str]:
    """One sentence per run and side whose throughput went above the limit's max (``LIMIT_DEFECT``): the run, its
    engine, the highest ratio, the limit's winning method and spread, and what to investigate."""
    out = []
    for side, kind, verb, unit, look in DEFECT_SIDES:
        flag, pct = f"{side}_limit", f"{side}_pct_of_storage"
        if table.empty or flag not in table:
            continue
        rows = table[table["kind"] == kind]
        for run_id, run in rows[rows[flag] == LIMIT_DEFECT].groupby("run_id", sort=True):
            worst = run.loc[run[pct].astype(float).idxmax()]
            measured = int(rows.loc[rows["run_id"] == run_id, pct].notna().sum())
            passes = int(worst[f"baseline_{side}_n"])
            spread = (f"{worst[f'baseline_{side}_min_MBps']:.0f}–{worst[f'baseline_{side}_MBps']:.0f}–"
                      f"{worst[f'baseline_{side}_max_MBps']:.0f} MB/s (min–median–max of {passes} passes)")
            resident, process = worst.get("resident_fraction"), worst.get("process_bytes_read")
            details = {"cache": worst.get("cache") if pd.notna(worst.get("cache")) else "unknown",
                       "resident": (f", at most {100 * float(resident):.0f} % of the checkpoint resident at its start"
                                    if pd.notna(resident) else ""),
                       "process": (f" (the ranks' processes read {fmt_bytes(process)} in all)"
                                   if pd.notna(process) else "")}
            out.append(f"Defect to investigate: run {run_id} ({worst['engine']}) {verb} at "
                       f"{worst[f'{side}_MBps']:.0f} MB/s, {worst[pct] / 100:.2f}× its {side} limit and above the "
                       f"limit's max ({len(run)} of {measured} {unit}); the limit is "
                       f"{worst[f'baseline_{side}_best']}, {spread}. No engine {side}s faster than "
                       f"the disk: look at {look.format(**details)}.")
    return out


def _prefetch_clause(restoring: pd.DataFrame) -> str:
    """What the load does not hold where the engine read the checkpoint during start-up (``--lazy-prefetch``)."""
    if "prefetched" not in restoring:
        return ""
    early = restoring[restoring["prefetched"].eq(True)]
    return "".join(f" ({row['engine']} read it from before the model build, {fmt_s(row['prefetch_read_s'])} beside "
                   f"the start-up; its load waited {fmt_s(row['prefetch_wait_s'])} for that read, then copied it "
                   "out)" for _, row in early.iterrows())
