#!/usr/bin/env python3
"""Mutation score of the modules that carry the study's guarantees, with the fast tests that guard them.

    python bench/mutation.py [--targets verify,integrity,...]

Each target is one module or a few (optionally only some of their functions: the predictors' size arithmetic) and the
fast tests that guard it. For each, mutmut (pinned in the ``bench`` extra) mutates a scratch copy of the
working tree, runs the guarding tests against every mutant, and reports killed, survived, timed-out and
untested mutants. A survivor is a change to the code that no test notices: either a missing test, or an
equivalent mutant (the program's behaviour does not change), which ``bench/mutation_accepted/<target>.yaml``
lists with the reason, keyed by the mutated line so that a changed line must be looked at again.

Target: no surviving mutant in verify.py and integrity.py; at least 90 % killed elsewhere; every survivor
listed. Writes ``bench/results/YYYY-MM-DD-<machine>-mutation.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from results_io import add_output_arguments, attempt_stem, machine_line, run_meta, write_results  # noqa: E402

MUTMUT = Path(sys.executable).parent / "mutmut"
# The predictors' size arithmetic: every function that computes a file's bytes or sums them (the plan's totals, each
# rank's state in shards.py, the sizes in sizes.py, each engine's predictor).
PREDICTOR_MODULES = ("restartbench/plan.py", "restartbench/shards.py", "restartbench/sizes.py",
                     *(f"restartbench/engines/{folder}/predict.py"
                       for folder in ("deepspeed", "lazy", "dcp", "torchsnapshot")))
PLAN_SIZE_FUNCTIONS = ("*CheckpointPlan*", "*zero_partition*", "*payload_bytes*", "*saved_size*",
                       "*_tensor_saved_size*", "*_deepspeed_files*", "*_fastpersist_files*", "*_fastpersist_writers*",
                       "*_lazy_files*", "*_dcp_files*", "*_dcp_rank_file*", "*_torchsnapshot_files*",
                       "*_snapshot_request_bytes*", "*ZeroOptimizer*", "*_adamw*", "*scaled_preset*")

# The what-if's model: its terms and the fit of a calibration, then the prediction of a target cluster from them; the
# I/O around them (calibrate's Slurm runs, the CLI, the plots) is left to the end-to-end tests.
WHATIF_FIT_MODULES = tuple(f"restartbench/whatif/{name}.py" for name in ("terms", "fit", "tensors"))
WHATIF_TESTS = (*(f"tests/test_whatif{suffix}.py" for suffix in ("", "_calibrate", "_tensors", "_cpu_share", "_gpu",
                                                                 "_validation", "_parts", "_fit_terms")),
                "tests/test_engine_cost_traits.py", "tests/test_dcp_coordinator.py")


@dataclass(frozen=True)
class Target:
    name: str
    modules: tuple[str, ...]  # paths of the mutated modules, relative to the repository root
    tests: tuple[str, ...]  # the fast tests that guard it
    required_score: float  # (killed + timeout) / (killed + survived + timeout + untested), after accepted survivors
    functions: tuple[str, ...] = ()  # mutmut name globs to restrict the mutants to; empty: the whole modules

    @property
    def slug(self) -> str:
        """The target's name as a file name (its accepted equivalents: bench/mutation_accepted/<slug>.yaml)."""
        return self.name.replace(" ", "-")


TARGETS = (
    Target("verify", ("restartbench/verify.py",), ("tests/test_verify.py", "tests/test_verify_chunked.py"), 1.0),
    Target("integrity", ("restartbench/integrity.py",), ("tests/test_integrity.py",), 1.0),
    Target("pagecache", ("restartbench/pagecache.py",), ("tests/test_pagecache.py",), 0.9),
    Target("layout", ("restartbench/layout.py",), ("tests/test_layout.py", "tests/test_properties.py"), 0.9),
    Target("results", ("restartbench/results.py",), ("tests/test_results.py",), 0.9),
    Target("predictor sizes", PREDICTOR_MODULES, ("tests/test_predict.py",), 0.9, PLAN_SIZE_FUNCTIONS),
    Target("goodput", ("restartbench/goodput.py",), ("tests/test_goodput.py",), 0.9),
    Target("harness", ("restartbench/harness.py",),
           ("tests/test_harness.py", "tests/test_engines_harness.py", "tests/test_harness_restore_choice.py"), 0.9),
    Target("run folder", ("restartbench/rundir.py",), ("tests/test_rundir.py", "tests/test_rundir_paths.py"), 0.9),
    Target("what-if fit", WHATIF_FIT_MODULES, WHATIF_TESTS, 0.9),
    Target("what-if prediction", ("restartbench/whatif/predict.py",), WHATIF_TESTS, 0.9),
    # what the what-if reads of an engine beyond its files: its registry's traits, DCP's share-out of a stage module,
    # the name an emulated run is listed under and the engine it stands for
    Target("what-if engine traits", ("restartbench/engines/__init__.py", "restartbench/engines/dcp/predict.py"),
           WHATIF_TESTS, 0.9, ("*cost_traits*", "*module_split*", "*dedup_owners*", "*listed_as*", "*is_emulated*",
                               "*base_engine*")),
    # the lazy engine's file format, and the pure pieces of its load into another layout (which elements each file
    # holds, merged into read runs and batches; the saved files' headers checked); the rest of the reshard runs only
    # under torchrun, where its multi-rank round trips prove it exact and mutmut sees no coverage
    Target("lazy format and reshard",
           ("restartbench/engines/lazy/format.py", "restartbench/engines/lazy/reshard.py"),
           ("tests/test_engine_lazy_units.py", "tests/test_engine_lazy.py", "tests/test_engine_lazy_reshard.py"), 0.9,
           ("restartbench.engines.lazy.format.*", *(f"restartbench.engines.lazy.reshard.{name}*" for name in (
               "x_layout_name", "x_model_file", "x_optim_file", "x_saved_sizes", "x_saved_slices", "x_slice_runs",
               "x_merge_runs", "x_partition_pieces", "x_batches", "x_piece_runs", "xǁSavedFilesǁ_check",
               "xǁSavedFilesǁheader")))),
)

ACCEPTED_DIR = ROOT / "bench" / "mutation_accepted"  # <target slug>.yaml: survivors judged equivalent, and why
#: An accepted survivor whose reason starts so is no equivalent: its code runs only on CUDA, where the named GPU test
#: guards it. It is left out of the CPU's score and listed as left to a GPU.
GPU_ONLY = "gpu only:"
#: Statuses that count as detected: a test failed, or the tests ran past mutmut's time limit against the mutant (it
#: made them hang or crawl: verify's chunk list of 64 M entries). Both are listed; only "killed" is left unlisted.
DETECTED = ("killed", "timeout")


def accepted(target: Target) -> dict[str, str]:
    """{mutated line: why it is equivalent} for one target, from bench/mutation_accepted/<slug>.yaml."""
    path = ACCEPTED_DIR / f"{target.slug}.yaml"
    return {entry["line"]: entry["why"] for entry in yaml.safe_load(path.read_text()) or []} if path.exists() else {}


# What the tests read beside the package (mutmut's copy holds only the package and tests/ otherwise).
ALSO_COPY = ("templates", "docs", "third_party", "config-n-run.py", "analysis", "bench", "clusters", "constraints.txt")

STATUS_LINE = re.compile(r"^\s*(\S+): (.+)$")


def scratch_copy(target: Target, into: Path) -> None:
    """The working tree's tracked files, plus a [tool.mutmut] section naming the modules and their tests."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    settings = {"source_paths": ["restartbench"], "only_mutate": list(target.modules),
                "pytest_add_cli_args_test_selection": list(target.tests), "also_copy": list(ALSO_COPY),
                "pytest_add_cli_args": ["-p", "no:cacheprovider", "-q", "-m", "not multirank"]}
    with open(into / "pyproject.toml", "a") as handle:  # a JSON list of strings is a TOML array
        handle.write("\n[tool.mutmut]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items()))


def mutmut(args: list[str], cwd: Path) -> str:
    # mutmut forks each mutant's test run from a process that has already run the tests: torch's OpenMP worker
    # threads do not survive the fork, so the child hangs at its first parallel tensor operation (a 1M-element
    # ``^=`` does; 1,000 elements do not), reported as "timeout" or "segfault". One OpenMP thread starts no workers.
    env = {**os.environ, "RESTARTBENCH_PLAN_CACHE": "off", "RESTARTBENCH_ALLOW_SKIPS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(MUTMUT), *args], cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"mutmut {' '.join(args)} failed in {cwd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def mutated_line(name: str, cwd: Path) -> str:
    """The line the mutant changes, as '+' lines of mutmut's diff (the first one)."""
    diff = mutmut(["show", name], cwd)
    added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return added[0] if added else diff.strip().splitlines()[-1]


def run_target(target: Target, workdir: Path) -> dict:
    scratch_copy(target, workdir)
    mutmut(["run", *target.functions], workdir)
    statuses = dict(m.groups() for m in map(STATUS_LINE.match, mutmut(["results", "--all", "true"], workdir)
                                            .splitlines()) if m)
    if target.functions:
        statuses = {k: v for k, v in statuses.items() if any(fnmatch.fnmatch(k, g) for g in target.functions)}
    counts: dict[str, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    survivors, equivalents = [], accepted(target)
    for name, status in sorted(statuses.items()):
        if status == "killed":
            continue
        line = mutated_line(name, workdir)
        survivors.append({"mutant": name, "status": status, "line": line,
                          "accepted": equivalents.get(line)})
    score = score_of(counts, survivors)
    return {"target": target.name, "modules": list(target.modules), "tests": list(target.tests),
            "functions": list(target.functions), "mutants": len(statuses), "counts": counts, "score": score,
            "required_score": target.required_score, "meets_target": score >= target.required_score,
            "survivors": survivors}


def score_of(counts: dict[str, int], survivors: list[dict]) -> float:
    """Detected (``DETECTED``) ÷ the mutants less the accepted survivors (equivalents, and those left to a GPU)."""
    counted = sum(counts.values()) - sum(1 for s in survivors if s["accepted"])
    return sum(counts.get(status, 0) for status in DETECTED) / counted if counted else 1.0


def markdown(result: dict) -> str:
    meta, rows = result["meta"], result["targets"]
    lines = [f"# Mutation score of the guarantees' modules: {meta['date']}", "",
             f"Command: `{meta['command']}`; {result['mutmut']}.", "", machine_line(meta), "",
             "Each module is mutated by mutmut and its guarding fast tests (`-m 'not multirank'`) run against every "
             "mutant. Score = killed ÷ (mutants − accepted equivalent survivors).", "",
             "| module | functions | guarding tests | mutants | killed | survived | other | score | target | met |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        other = sum(v for k, v in r["counts"].items() if k not in ("killed", "survived"))
        modules = ", ".join(f"`{m}`" for m in r["modules"])
        lines.append(f"| {modules} | {'size arithmetic' if r['functions'] else 'all'} | "
                     f"{', '.join(r['tests'])} | {r['mutants']} | {r['counts'].get('killed', 0)} | "
                     f"{r['counts'].get('survived', 0)} | {other} | {r['score']:.1%} | "
                     f"{r['required_score']:.0%} | {'yes' if r['meets_target'] else '**no**'} |")
    if any(r["counts"].get("timeout") for r in rows):
        lines += ["", "A mutant whose tests ran past mutmut's time limit (timeout, in 'other') counts as detected: it "
                  "made them hang or crawl; each is listed below."]
    on_gpu = sum(1 for r in rows for s in r["survivors"] if (s["accepted"] or "").startswith(GPU_ONLY))
    if on_gpu:
        lines += ["", f"{on_gpu} survivor(s) run only on CUDA: not equivalents, but untestable on this machine; the "
                  "score leaves them out and each is listed below as left to a GPU, with the test that guards it "
                  "there."]
    lines += ["", "## Every survivor", ""]
    for r in rows:
        for s in r["survivors"]:
            lines.append(f"- `{s['mutant']}` ({s['status']}): `{s['line']}` — {_verdict(s)}")
    if not any(r["survivors"] for r in rows):
        lines.append("None.")
    return "\n".join(lines) + "\n"


def chosen_targets(names: str) -> tuple[Target, ...]:
    """The targets named in ``names`` (comma-separated), in TARGETS' order; refuses a name that is none of them."""
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in {t.name for t in TARGETS}]
    if unknown or not wanted:
        what = f"unknown target(s) {', '.join(map(repr, unknown))}" if unknown else "no target named"
        raise ValueError(f"--targets: {what}; the targets are {', '.join(repr(t.name) for t in TARGETS)}")
    return tuple(t for t in TARGETS if t.name in wanted)


def _verdict(survivor: dict) -> str:
    accepted_why = survivor["accepted"]
    if survivor["status"] == "timeout" and not accepted_why:
        return "detected: the tests ran past mutmut's time limit against it"
    if not accepted_why:
        return "**not accepted: a test is missing**"
    if accepted_why.startswith(GPU_ONLY):
        return f"left to a GPU: {accepted_why.removeprefix(GPU_ONLY).strip()}"
    return f"accepted: {accepted_why}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(t.name for t in TARGETS),
                        help="comma-separated target names (default: all)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="work in DIR/<target> and keep it (default: a temporary folder, removed): there, "
                             "'MUTANT_UNDER_TEST=<mutant> python -m pytest TEST' in mutants/ runs a test against one "
                             "mutant, to kill survivors one by one")
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    if not MUTMUT.exists():
        print(f"bench/mutation.py needs mutmut ({MUTMUT} is missing): "
              "pip install -c constraints.txt -e '.[bench]'", file=sys.stderr)
        return 2
    try:
        chosen = chosen_targets(args.targets)
    except ValueError as error:
        parser.error(str(error))
    meta = run_meta("mutation", sys.argv[1:] if argv is None else argv, args.machine)
    rows = []
    for target in chosen:
        print(f"[mutation] {target.name}: mutating {', '.join(target.modules)} against {', '.join(target.tests)}",
              flush=True)
        if args.keep:
            workdir = args.keep / target.slug
            workdir.mkdir(parents=True)  # a fresh folder: mutmut reuses what an earlier run left
            row = run_target(target, workdir)
        else:
            with tempfile.TemporaryDirectory(prefix="restartbench-mutation-") as scratch:
                row = run_target(target, Path(scratch))
        print(f"[mutation] {target.name}: {row['counts']} score {row['score']:.1%}", flush=True)
        rows.append(row)
    version = f"mutmut {importlib.metadata.version('mutmut')}"
    write_results(args.out, {"meta": meta, "mutmut": version, "targets": rows}, markdown, attempt_stem(args.out, meta))
    return 0 if all(r["meets_target"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
