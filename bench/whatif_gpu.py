#!/usr/bin/env python3
"""The what-if cost model, calibrated on the CPU machine, against the real 1B runs of the GPU visits.

    python bench/whatif_gpu.py               # every stored H100 1B run, predicted from clusters/cpu2-fit.json

The model (``restartbench.whatif``) was calibrated on tiny and small runs over gloo on a 2-core CPU machine
(``bench/whatif_validation.py``) and checked there on held-out CPU runs. The GPU visits (``bench/gpu_session.py``)
brought back runs it never saw, of another device, preset and machine: 1B bf16 on one H100 over NCCL. This script
predicts each of them from its configuration alone and sets every part beside what the run measured:

1. The machine as a cluster file, from the probe block of the visit that measured its disk with fio
   (``bench/results/*-h100-gpu-probe.json``): one node, one GPU, its cores, pinned and pageable D2H, the lazy
   engine's pinning rate, fio's write ending in fsync and cold read. It is written to ``clusters/h100-local.yaml``
   with today's engine's pinning (private huge pages), for ``python -m restartbench.whatif ... --cluster``.
2. Each complete run of ``bench/results/*-h100-gpu-engines-1B-*.json``: its engine (a variant as its engine: the fit
   has no O_DIRECT runs), its measured iteration time as the first iteration's input, and the pinning rate its
   code used (huge pages from ``HUGE_PAGES_SINCE``, else the engine's earlier 4 KiB-page pinning).
3. The parts that the fit predicts (``restartbench.whatif.validation``) and the whole cost, with each error, and the
   median and largest error per part over the runs.

Nothing is run: the figures are the stored results'. An engine the calibration never ran is listed as not predicted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import yaml
from results_io import ROOT, add_output_arguments, attempt_stem, machine_line, run_meta, write_results

sys.path.insert(0, str(ROOT))

from restartbench.whatif import cluster as clusters  # noqa: E402
from restartbench.whatif import fit as fitting  # noqa: E402
from restartbench.whatif import predict as model  # noqa: E402
from restartbench.whatif import validation  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CLUSTERS = ROOT / "clusters"
FIT = CLUSTERS / "cpu2-fit.json"
TEMPLATE = CLUSTERS / "h100-pfs.yaml"
WRITTEN = CLUSTERS / "h100-local.yaml"
HUGE_PAGES_SINCE = "7df1e29"
"""The commit from which the lazy engine pins private huge-page memory (0.05 s/GiB on the H100, 0.31 before)."""
GiB = 2**30
#: The GPU block's restart part → the model's part.
PART_NAMES = {"launch": "launch", "imports": "imports", "dist_init": "dist init", "model_build": "model build",
              "ds_init": "ds init", "engine_setup": "engine setup", "ckpt_load": "ckpt load", "1st_iter": "1st iter"}
PARTS = ("stall", "whole cost", "durable", *PART_NAMES.values(), "restart total")


def latest_probe(results: Path = RESULTS) -> dict:
    """The newest H100 probe block whose disk was measured (fio or dd)."""
    for path in sorted(results.glob("*-h100-gpu-probe.json"), reverse=True):
        probe = yaml.safe_load(path.read_text())  # JSON is YAML
        if probe.get("limits", {}).get("write_MBps"):
            return {**probe, "path": str(path.relative_to(ROOT))}
    raise SystemExit(f"no H100 probe with a disk measurement in {results}: run the GPU session's probe block")


def cluster_fields(probe: dict, pin_s_per_gib: float, pin_how: str) -> dict:
    """The probed machine as a cluster file's fields: measured ones from ``probe``, the rest (the rendezvous anchor,
    the GPU's peak, MFU, the slowdown of an asynchronous save) as clusters/h100-pfs.yaml cites them."""
    limits, meta = probe["limits"], probe["files"]["limits.json"]["meta"]
    copies = probe["files"]["copies.json"]
    where = f"{probe['path']} (GPU session probe block, {probe['meta']['date']}, {probe['meta']['gpu']})"
    tool = limits.get("storage_tool") or "dd"
    fields = {
        "name": ("one H100 machine with its local disk (the GPU machine lent to this project)", "probe", where),
        "device": ("cuda", "probe", where),
        "nodes": (1, "probe", "one machine"),
        "gpus_per_node": (1, "probe", "nvidia-smi: one GPU"),
        "cpu_cores_per_node": (meta["cpus"], "probe", f"os.cpu_count() on the machine ({where})"),
        "d2h_pinned_GBps": (copies["d2h_pinned"]["best_GBps"], "probe",
                            f"bench/gpu_probe.py, 4 GiB, best of 5; {where}"),
        "d2h_pageable_GBps": (copies["d2h_pageable"]["best_GBps"], "probe",
                              f"bench/gpu_probe.py, 4 GiB, best of 5; {where}"),
        "pin_GBps": (GiB / 1e9 / pin_s_per_gib, "probe", f"{pin_how}, {pin_s_per_gib:.3f} s/GiB; {where}"),
        "local_write_GBps": (limits["write_MBps"] / 1e3, "fio" if tool == "fio" else "probe",
                             f"bench/limits.py ({tool}), one job, write ending in fsync; {where}"),
        "local_read_GBps": (limits["read_MBps"] / 1e3, "fio" if tool == "fio" else "probe",
                            f"bench/limits.py ({tool}), one job, cold read; {where}"),
        "storage": ("local", "probe", "the machine's own disk"),
        **{name: (0.0, "probe", "no shared file system") for name in
           ("shared_write_GBps", "shared_read_GBps", "shared_per_client_GBps", "nic_GBps")},
        "calibration": (FIT.name, "calibration", "bench/whatif_validation.py's fit on the 2-core CPU machine"),
    }
    template = clusters.load_cluster(TEMPLATE)
    for name in ("dist_init_anchor_ranks", "dist_init_anchor_s", "gpu_peak_tflops", "mfu", "async_slowdown_fraction"):
        fields[name] = (getattr(template, name), *template.sources[name])
    return {name: {"value": value, "basis": basis, "source": source} for name, (value, basis, source) in fields.items()}


def pinning(probe: dict, huge: bool) -> tuple[float, str]:
    limits = probe["limits"]
    if huge:
        return limits["engine_pin_huge_s_per_GiB"], "the lazy engine's pinning into private huge pages (since 7df1e29)"
    return limits["engine_pin_s_per_GiB"], "the lazy engine's pinning of 4 KiB pages, faulted in on 16 threads " \
        "(before 7df1e29)"


def has_huge_pages(commit: str) -> bool:
    """Whether ``commit`` pins huge pages (descends from ``HUGE_PAGES_SINCE``)."""
    done = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", HUGE_PAGES_SINCE, commit],
                          capture_output=True)
    return done.returncode == 0


def stored_runs(results: Path = RESULTS) -> list[dict]:
    """Every complete run of the stored 1B engine blocks, with its block's label, date and code."""
    runs = []
    for path in sorted(results.glob("*-h100-gpu-engines-1B-*.json")):
        block = yaml.safe_load(path.read_text())
        label = block["meta"]["benchmark"].removeprefix("gpu-engines-1B-")
        runs += [{**run, "label": label, "date": block["meta"]["date"], "commit": block["meta"]["code"]["commit"],
                  "result": str(path.relative_to(ROOT))} for run in block.get("runs", [])
                 if run.get("status") == "complete"]
    return runs


def measured(run: dict) -> dict[str, float]:
    out = {"stall": run["stall_s"], "whole cost": run["cost_s"], "durable": run["durable_s"],
           "restart total": run["restart_less_checks_s"]}
    out.update({PART_NAMES[k]: v for k, v in run["restart_parts_s"].items() if k in PART_NAMES and v is not None})
    return {k: float(v) for k, v in out.items() if v is not None}


def predicted(run: dict, fit: fitting.Fit, cluster: clusters.Cluster) -> dict[str, float]:
    layout = run["run"].split("/")[1]
    spec = validation.RunSpec(run["run"], "1B", layout, run["engine"], "bf16", None, 1, run["iteration_s"])
    return validation.predicted_parts(spec, fit, cluster)


def compare(runs: list[dict], fit: fitting.Fit, probe: dict) -> list[dict]:
    rows = []
    for run in runs:
        pin_s, pin_how = pinning(probe, has_huge_pages(run["commit"]))
        cluster = clusters.cluster_from_mapping(cluster_fields(probe, pin_s, pin_how), str(WRITTEN))
        ident = {k: run[k] for k in ("run", "label", "engine", "date", "commit", "result")}
        try:
            guess = predicted(run, fit, cluster)
        except (fitting.FitError, model.WhatIfError) as error:
            rows.append({**ident, "error": str(error), "parts": []})
            continue
        parts = validation.errors(guess, measured(run))
        ordered = sorted(parts, key=lambda p: PARTS.index(p["part"]))
        rows.append({**ident, "pin_GBps": cluster.pin_GBps, "parts": ordered})
    return rows


def by_part(rows: list[dict]) -> dict[str, dict]:
    """Per part, over the runs: the median and the largest error (signed, the largest by magnitude)."""
    out = {}
    for name in PARTS:
        found = [p["error"] for r in rows for p in r["parts"] if p["part"] == name]
        if found:
            out[name] = {"runs": len(found), "median_error": statistics.median(found),
                         "largest_error": max(found, key=abs)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    meta = run_meta("whatif-gpu", argv if argv is not None else sys.argv[1:], machine="h100")
    probe, fit = latest_probe(), fitting.read_fit(FIT)
    written = cluster_fields(probe, *pinning(probe, huge=True))
    WRITTEN.write_text("# One H100 machine with its local disk, from the GPU session's probe (bench/whatif_gpu.py "
                       "writes it).\n" + yaml.safe_dump(written, sort_keys=False, width=120))
    rows = compare(stored_runs(), fit, probe)
    every = [p for r in rows for p in r["parts"]]
    write_results(args.out, {"meta": meta, "probe": probe["path"], "fit": str(FIT.relative_to(ROOT)),
                             "fit_runs": len(fit.runs), "cluster": written, "runs": rows,
                             "by_part": by_part(rows), "summary": validation.summary(every)}, markdown,
                  attempt_stem(args.out, meta))  # a later fit's comparison never overwrites an earlier one's
    return 0


# -- the Markdown, from the JSON alone ---------------------------------------------------------------------------


def _s(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def _pct(value: float) -> str:
    return f"{100 * value:+.0f} %"


def markdown(result: dict) -> str:
    meta, cluster = result["meta"], result["cluster"]
    lines = [f"# What-if model, calibrated on the CPU machine, against the GPU visits' 1B runs — {meta['machine']}, "
             f"{meta['date']}", "", f"`{meta['command']}`", "",
             "Nothing measured here: the runs are the H100's. " + machine_line({**meta, "machine": "The script ran on "
                                                                                  f"cpu{meta['cpus']}"}), ""]
    lines += [f"Fit: `{result['fit']}` ({result['fit_runs']} calibration runs: tiny and small over gloo on 2 CPU "
              f"cores). Machine: `{result['probe']}`, written as `clusters/h100-local.yaml`: "
              f"{cluster['cpu_cores_per_node']['value']} cores, pinned D2H "
              f"{cluster['d2h_pinned_GBps']['value']:.1f} GB/s, pageable {cluster['d2h_pageable_GBps']['value']:.1f} "
              f"GB/s, disk write {cluster['local_write_GBps']['value']:.2f} GB/s and read "
              f"{cluster['local_read_GBps']['value']:.2f} GB/s ({cluster['local_write_GBps']['basis']}). "
              "Each run is predicted from its preset, layout, engine and measured iteration time alone; the "
              "restart total is the restart less the harness's own checks (the model predicts no checks).", ""]
    summary = result["summary"]
    if summary["parts"]:
        lines += [f"**Over {summary['parts']} parts of {sum(1 for r in result['runs'] if r['parts'])} runs: median "
                  f"|error| {100 * summary['median_abs_error']:.0f} %, largest {100 * summary['max_abs_error']:.0f} "
                  f"%** (the CPU validation's target: median ≤ 15 %, none beyond 35 %).", ""]
    near = [name for name, p in result["by_part"].items() if abs(p["median_error"]) <= validation.TARGET_MAX]
    far = [name for name, p in result["by_part"].items() if abs(p["median_error"]) > validation.TARGET_MAX]
    lines += ["## Per part, over the runs", "",
              f"Within 35 % at the median over the runs: {', '.join(near) or 'none'}. "
              f"Beyond: {', '.join(far) or 'none'}.",
              "", "| part | runs | median error | largest error |", "|---|---|---|---|"]
    lines += [f"| {name} | {p['runs']} | {_pct(p['median_error'])} | {_pct(p['largest_error'])} |"
              for name, p in result["by_part"].items()]
    lines += ["", "## Per run (predicted s / measured s, error)", ""]
    for run in result["runs"]:
        lines += run_markdown(run)
    lines += ["stall = the longest a save blocked training; whole cost = stall + the slowdown of the iterations an "
              "asynchronous save overlapped; durable = first save start to the files fsync'd; the restart's parts "
              "as the GPU block's table names them (max over ranks; one rank here), the checkpoint load the relaunch's "
              "first, from a cold page cache. Error = (predicted − measured) "
              "/ measured. One run per engine: no spread."]
    return "\n".join(lines) + "\n"


def run_markdown(run: dict) -> list[str]:
    """One run's parts, predicted beside measured (or why it was not predicted)."""
    title = f"### {run['label']} ({run['engine']}), {run['date']}, code {run['commit'][:7]}"
    if not run["parts"]:
        return [title, "", f"Not predicted: {run['error']}", ""]
    return [title, "", f"`{run['run']}` ({run['result']}); lazy pinning at {run['pin_GBps']:.1f} GB/s.", "",
            "| part | predicted s | measured s | error |", "|---|---|---|---|",
            *[f"| {p['part']} | {_s(p['predicted_s'])} | {_s(p['measured_s'])} | {_pct(p['error'])} |"
              for p in run["parts"]], ""]


if __name__ == "__main__":
    sys.exit(main())
