"""The findings: the plain sentences at the top of the report and the console summary, which engine stalls training
least, what each configuration's stall, whole cost, durability and restart come to, and which throughputs went above
the storage's measured limit (``findings``)."""

from __future__ import annotations

import pandas as pd

from restartbench import analysis
from restartbench.report.style import fmt_s, fmt_share


def findings(table: pd.DataFrame) -> list[str]:
    """Plain sentences: first which engine stalls training least overall, then per configuration the stall ranking,
    engines whose files become durable long after training resumed, and what the restart time is made of."""
    if table.empty:
        return []
    ckpt = analysis.checkpoint_summary(table)
    rest = analysis.restart_summary(table)
    keys = [k for k in analysis.group_keys(table) if k != "engine"]
    configs = list(dict.fromkeys([*map(tuple, ckpt[keys].astype(str).values),
                                  *map(tuple, rest[keys].astype(str).values)]))
    out, winners = [], []
    for values in configs:
        c = ckpt[(ckpt[keys].astype(str) == list(values)).all(axis=1)].sort_values("stall_s", kind="stable")
        r = rest[(rest[keys].astype(str) == list(values)).all(axis=1)]
        ranks = pd.concat([c["ranks"], r["ranks"]]).max()
        sentences = []
        if not c.empty and pd.notna(c.iloc[0]["stall_s"]):
            best = c.iloc[0]
            winners.append(best["engine"])
            text = (f"{best['engine']} stalls training least: {fmt_s(best['stall_s'])} per checkpoint (max over ranks, "
                    f"median of {int(best['checkpoints'])}")
            if pd.notna(best["stall_iterations"]):
                text += f"; {best['stall_iterations']:.2g} iterations' worth"
            text += f"), files durable after {fmt_s(best['durable_s'])}"
            others = [f"{row['engine']} {fmt_s(row['stall_s'])} ({row['stall_s'] / best['stall_s']:.1f}×)"
                      for _, row in c.iloc[1:].iterrows() if best["stall_s"] and pd.notna(row["stall_s"])]
            sentences.append(text + (f"; then {', '.join(others)}." if others else "; the only engine measured here."))
            sentences.extend(_whole_cost_sentences(c))
            late = [row for _, row in c.iterrows() if pd.notna(row["durable_s"]) and row["stall_s"]
                    and row["durable_s"] > 2 * row["stall_s"] and row["durable_s"] - row["stall_s"] > 0.005]
            if late:
                sentences.append(", ".join(f"{row['engine']} ({fmt_s(row['stall_s'])} stall, durable after "
                                           f"{fmt_s(row['durable_s'])})" for row in late)
                                 + (" returns" if len(late) == 1 else " return")
                                 + " to training well before the files are durable (a synchronous engine leaves "
                                   "them in the page cache until they are fsync'd; an asynchronous one goes on "
                                   "writing in the background): a crash in that window loses the checkpoint.")
        restoring = r[r["restores_checkpoint"].astype(bool) & r["restart_s"].notna()]
        floor = r[~r["restores_checkpoint"].astype(bool) & r["restart_s"].notna()]
        if not restoring.empty:
            totals = ", ".join(f"{fmt_s(row['restart_s'])} ({row['engine']})" for _, row in restoring.iterrows())
            loads = restoring["restart_ckpt_load_s"].dropna()
            share = (restoring["restart_ckpt_load_s"] / restoring["restart_s"]).dropna()
            caches = ", ".join(sorted({str(x) for x in restoring["cache"].dropna()})) or "unknown"
            text = f"Restart takes {totals} from relaunch to the end of the first resumed iteration."
            if not loads.empty:
                span = (fmt_s(loads.min()) if loads.min() == loads.max()
                        else f"{fmt_s(loads.min())}–{fmt_s(loads.max())}")
                text += (f" Reading the checkpoint is {span} (at most {100 * share.max():.1f}% of it; "
                         f"{caches} page cache)")
            path = [(label, restoring[column].median()) for column, label in analysis.PATH_COLUMNS
                    if column in restoring and label not in ("ckpt load", "1st iter", "gaps", "verify")]
            path = sorted([(label, v) for label, v in path if pd.notna(v)], key=lambda p: -p[1])[:3]
            if path:
                text += "; the time goes to start-up: " + ", ".join(f"{label} {fmt_s(v)}" for label, v in path)
            text += "."
            if not floor.empty:
                base = floor.iloc[0]["restart_s"]
                text += (f" A relaunch that restores nothing (engine none) takes {fmt_s(base)}: the start-up floor "
                         "every restart pays.")
            if "warm" in caches:
                text += (" A warm cache means some of the checkpoint was in memory when the restore began, so reads "
                         "may have come from memory, not storage.")
            sentences.append(text)
        elif not floor.empty:
            sentences.append(f"Engine none relaunches without a checkpoint in {fmt_s(floor.iloc[0]['restart_s'])}: "
                             "the start-up floor every restart pays.")
        device = table.loc[(table[keys].astype(str) == list(values)).all(axis=1), "device"].dropna()
        where = " · ".join(values) + f" ({int(ranks)} ranks" + (f", {device.iloc[0]}" if not device.empty else "") + ")"
        out.append(f"{where}: " + " ".join(sentences))
    out.extend(_limit_findings(ckpt, rest, keys))
    if winners:
        counts = pd.Series(winners).value_counts()
        lead = counts.index[0]
        out.insert(0, f"Least training stall: {lead} in {counts.iloc[0]} of {len(winners)} configuration(s)"
                   + (f" (others: {', '.join(f'{e} {n}' for e, n in counts.iloc[1:].items())})." if len(counts) > 1
                      else "."))
    return out


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


def _limit_findings(ckpt: pd.DataFrame, rest: pd.DataFrame, keys: list[str]) -> list[str]:
    """One sentence per configuration whose throughput went above 105 % of the storage's measured bandwidth."""
    out = []
    for summary, side, column, flag in ((ckpt, "wrote", "write_pct_of_storage", "write_limit"),
                                        (rest, "restored", "read_pct_of_storage", "read_limit")):
        if flag not in summary:
            continue
        for _, row in summary[summary[flag].fillna("").str.startswith(analysis.LIMIT_UNDERESTIMATED)].iterrows():
            where = " · ".join(str(row[k]) for k in keys) + f" · {row['engine']}"
            out.append(f"Limit underestimated: {where} {side} at {fmt_share(row[column])} of the storage's measured "
                       f"bandwidth (median; {row[flag].removeprefix(analysis.LIMIT_UNDERESTIMATED).strip(' ()')} "
                       "above 105 %): baseline.json measured the storage too low, so this ratio is no engine beating "
                       "the disk.")
    return out
