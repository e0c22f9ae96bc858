"""``python -m restartbench.whatif --calibrate`` (restartbench/whatif/calibrate.py): the step list, the refusals
of bad input with nothing written, the atomic write, resuming from complete runs, a run stopped at its timeout, a
failed run or an unfittable term refused with nothing written; one small real calibration (multirank)."""

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from restartbench.whatif import calibrate as cal
from restartbench.whatif import calibration_runs as runs
from restartbench.whatif import cli
from restartbench.whatif.cluster import load_cluster
from restartbench.whatif.fit import Fit, Limits, read_fit


def _options(tmp_path: Path, **changes) -> cal.Options:
    return cal.Options(**{"out": tmp_path / "mine.yaml", "logs": tmp_path / "logs", **changes})


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- the steps -------------------------------------------------------------------------------------------------


def test_the_steps_probe_then_run_real_then_emulated_then_fit_then_write(tmp_path):
    steps = cal.plan_steps(_options(tmp_path), gpu_skip="no GPU here")
    kinds = [s.kind for s in steps]
    assert kinds == ["probe"] * 4 + ["run"] * (len(steps) - 6) + ["fit", "write"]
    assert steps[0].name.startswith("storage limits (2 writers") and steps[1].name == "host copy"
    assert steps[2].name == "d2h" and steps[2].skip == "no GPU here" and steps[2].expected_s == 0
    assert steps[3].name == "collective planner" and not steps[3].skip  # dcp is among the default engines
    runs = [s.case for s in steps if s.kind == "run"]
    real = [c for c in runs if c.scale is None]
    emulated = [c for c in runs if c.scale is not None]
    assert runs == real + emulated  # real runs first: the fit's start-up terms need them most
    for engine in cal.DEFAULT_ENGINES:  # per engine two sizes of real run and two scales of emulated one
        assert {c.preset for c in real if c.engine == engine} == {"tiny", "small"}
        assert {c.scale for c in emulated if c.engine == engine} == set(cal.EMULATED_SCALES)
    assert {c.ranks for c in real} == {2, 4}  # two world sizes: dist init's slope
    assert all(2 <= c.ranks <= 8 for c in runs) and len(set(runs)) == len(runs)
    assert sum(s.expected_s for s in steps) <= 15 * 60


def test_the_d2h_probe_runs_where_a_gpu_is_visible_and_engines_pick_the_runs(tmp_path):
    steps = cal.plan_steps(_options(tmp_path, engines=("lazy",)), gpu_skip="")
    assert steps[2].name == "d2h" and not steps[2].skip and steps[2].expected_s > 0
    assert steps[3].name == "collective planner" and "no collective engine" in steps[3].skip
    assert {s.case.engine for s in steps if s.case} == {"lazy"}
    assert cal.probe_jobs(tuple(s.case for s in steps if s.case)) == 2


def test_a_case_launches_the_configuration_it_names(tmp_path):
    emulated = cal.Case("3B", "tp1pp1dp2", "dcp", 0.05).argv(tmp_path)
    assert emulated[:4] == ["3B", "tp1pp1dp2", "--engine", "dcp"] and "--emulate" in emulated
    assert emulated[emulated.index("--emulate-scale") + 1] == "0.05"
    real = cal.Case("small", "tp1pp1dp2", "torch").argv(tmp_path)
    assert "--emulate" not in real and real[real.index("--logs") + 1] == str(tmp_path)


# -- refusals --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("changes", "says"), [
    ({"out": Path("mine.json")}, "a cluster file is YAML"),
    ({"out": Path("no/such/folder/mine.yaml")}, "does not exist"),
    ({"engines": ("torch", "bogus")}, "unknown checkpoint engine 'bogus'"),
    ({"engines": ("none",)}, "nothing to fit"),
    ({"engines": ("torch", "torch")}, "twice"),
    ({"engines": ()}, "names no engine"),
    ({"timeout_s": 0}, "--timeout"),
    ({"gpus_per_node": 0}, "--gpus-per-node"),
])
def test_bad_input_is_refused_before_anything_runs(tmp_path, changes, says):
    if "out" in changes:
        changes["out"] = tmp_path / changes["out"]
    before = _listing(tmp_path)
    with pytest.raises(cal.CalibrationError, match=says):
        cal.plan_steps(_options(tmp_path, **changes), gpu_skip="")
    assert _listing(tmp_path) == before


def test_existing_files_and_a_logs_file_are_refused_unless_forced(tmp_path):
    (tmp_path / "mine-fit.json").write_text("{}")
    with pytest.raises(cal.CalibrationError, match="mine-fit.json exists; pass --force"):
        cal.plan_steps(_options(tmp_path), gpu_skip="")
    assert cal.plan_steps(_options(tmp_path, force=True), gpu_skip="")
    (tmp_path / "logs").write_text("")
    with pytest.raises(cal.CalibrationError, match="is a file"):
        cal.plan_steps(_options(tmp_path, force=True), gpu_skip="")


def test_the_command_refuses_bad_input_writing_nothing(tmp_path, capsys, monkeypatch):
    before = _listing(tmp_path)
    out = str(tmp_path / "mine.yaml")
    monkeypatch.setattr(cal.shutil, "which", lambda name: None)  # no Slurm (tests/test_whatif_calibrate_slurm.py)
    assert cli.main(["--calibrate", "--out", out, "--slurm", "--logs", str(tmp_path / "logs")]) == 2
    assert "no usable Slurm" in capsys.readouterr().err
    assert cli.main(["--calibrate", "--out", out, "--engines", "torch,bogus"]) == 2
    assert "bogus" in capsys.readouterr().err
    for argv, says in ((["--calibrate"], "needs --out"), (["tiny", "tp1pp1dp2", "--calibrate", "--out", out], "drop"),
                       (["--out", out], "go with --calibrate"), (["tiny", "tp1pp1dp2"], "needs --cluster")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2 and says in capsys.readouterr().err
    assert _listing(tmp_path) == before


def test_the_dry_run_lists_the_steps_and_their_expected_time(tmp_path, capsys):
    assert cli.main(["--calibrate", "--out", str(tmp_path / "mine.yaml"), "--dry-run", "--engines", "torch"]) == 0
    out = capsys.readouterr().out
    assert "storage limits" in out and "tiny tp1pp1dp4 torch (real)" in out and "expected: about" in out
    assert _listing(tmp_path) == []


# -- the atomic write ------------------------------------------------------------------------------------------


def test_the_files_appear_together_or_not_at_all(tmp_path):
    a, b = tmp_path / "a-fit.json", tmp_path / "a.yaml"
    b.write_text("old")

    def refuse(temporaries):
        assert set(temporaries) == {a, b} and all(t.read_text() for t in temporaries.values())
        assert not a.exists() and b.read_text() == "old"  # nothing in place before the check passes
        raise cal.CalibrationError("bad")
    with pytest.raises(cal.CalibrationError):
        cal.write_atomically({a: "fit", b: "new"}, refuse)
    assert _listing(tmp_path) == ["a.yaml"] and b.read_text() == "old"  # no temporaries left, the old file kept
    with pytest.raises(OSError):  # a file that cannot be written: the others are not written either
        cal.write_atomically({a: "fit", tmp_path / "missing" / "x.yaml": "new"})
    assert _listing(tmp_path) == ["a.yaml"]
    cal.write_atomically({a: "fit", b: "new"}, lambda temporaries: None)
    assert a.read_text() == "fit" and b.read_text() == "new" and _listing(tmp_path) == ["a-fit.json", "a.yaml"]


# -- resuming and the runner -----------------------------------------------------------------------------------


def _fake_run(root: Path, case: cal.Case, status: str = "complete") -> Path:
    folder = root / case.preset / case.layout / case.engine / f"run-{status}-{case.scale}"
    folder.mkdir(parents=True)
    emulation = {"emulate": case.scale is not None, "emulate_scale": case.scale,
                 "ranks_per_process": case.ranks_per_process}
    (folder / "metadata.json").write_text(json.dumps({
        "status": status, "preset": case.preset,
        "engine": case.engine if case.scale is None else f"{case.engine}-emulated"}))
    (folder / "config.json").write_text(json.dumps({"layout": {"layout": case.layout}, "emulation": emulation}))
    return folder


def test_each_runs_ranks_per_process_and_width_are_read_from_its_config(tmp_path):
    """The tidy table has neither; the fit needs both (the CPU share, and DCP's choice of replicas by bytes)."""
    real = _fake_run(tmp_path, cal.Case("tiny", "tp1pp1dp2", "dcp"))
    emulated = _fake_run(tmp_path, cal.Case("7B", "tp1pp1dp2", "dcp", 0.04, 4))

    class Collected:
        def table(self):  # a run's rows (its checkpoint and its restart) share its folder
            return pd.DataFrame({"run_id": ["a", "a", "b"], "run": [str(real), str(real), str(emulated)]})
    assert runs.per_process(Collected()) == {"a": 1, "b": 4}
    assert runs.emulate_scales(Collected()) == {"a": 1.0, "b": 0.04}


def test_a_complete_run_of_the_case_is_found_and_reused_without_running(tmp_path, monkeypatch):
    case = cal.Case("3B", "tp1pp1dp2", "lazy", 0.05)
    _fake_run(tmp_path, case, "failed")
    _fake_run(tmp_path, cal.Case("3B", "tp1pp1dp2", "lazy", 0.02))  # another scale
    _fake_run(tmp_path, cal.Case("3B", "tp1pp1dp2", "torch", 0.05))  # another engine
    assert runs.completed(tmp_path, case) is None
    done = _fake_run(tmp_path, case)
    assert runs.completed(tmp_path, case) == done
    assert runs.completed(tmp_path, cal.Case("3B", "tp1pp1dp2", "lazy")) is None  # the real run is another case

    def no_launch(*args, **kwargs):
        raise AssertionError("a complete case must not be run again")
    monkeypatch.setattr(cal.subprocess, "Popen", no_launch)
    result = runs.run_case(case, tmp_path, timeout=5)
    assert result["exit"] == 0 and result["note"] == "already complete" and result["run"] == str(done)


def test_a_run_past_its_timeout_is_stopped_with_its_process_group(tmp_path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    monkeypatch.setattr(runs, "RUN_PROGRAM", "import subprocess, sys, time; "
                        f"p = subprocess.Popen(['sleep', '60']); open({str(pid_file)!r}, 'w').write(str(p.pid)); "
                        "time.sleep(60)")
    start = time.perf_counter()
    result = runs.run_case(cal.Case("tiny", "tp1pp1dp2", "torch"), tmp_path / "runs", timeout=2)
    assert result["exit"] is None and "stopped after 2 s" in result["note"]
    assert time.perf_counter() - start < 20
    child = Path(f"/proc/{int(pid_file.read_text())}/stat")
    time.sleep(0.2)  # the launcher's children (the ranks) are stopped too: gone, or a zombie nobody reaped yet
    assert not child.exists() or child.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_run_that_exits_0_without_a_complete_run_counts_as_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "RUN_PROGRAM", "print('nothing')")
    result = runs.run_case(cal.Case("tiny", "tp1pp1dp2", "torch"), tmp_path / "runs", timeout=30)
    assert result["exit"] == 1 and "no complete run" in result["note"] and result["tail"] == ["nothing"]


# -- the calibration refuses, writing nothing ------------------------------------------------------------------

STORAGE = {"target": "/x", "jobs": 2, "size_mib_per_job": 8, "repeats": 1,
           "write": {"best": "w", "MBps": {"min": 400.0, "median": 500.0, "max": 600.0}, "methods": {"w": {}}},
           "read": {"best": "r", "MBps": {"min": 900.0, "median": 1000.0, "max": 1100.0}, "methods": {"r": {}}}}
COPY = {"bytes": 1, "jobs": 2, "MBps": {"min": 1000.0, "median": 2000.0, "max": 3000.0}, "method": "m"}


def _probes(step, options, jobs):
    return STORAGE if step.name.startswith("storage") else COPY


def test_a_failed_run_refuses_the_calibration_naming_it_and_writes_nothing(tmp_path, monkeypatch):
    options = _options(tmp_path)
    monkeypatch.setattr(cal, "run_probe", _probes)
    monkeypatch.setattr(cal, "run_case", lambda case, *a, **k: {"case": {}, "exit": 3, "wall_s": 1.0,
                                                                "log": f"/logs/{case.preset}.log"})
    steps = [s for s in cal.plan_steps(options, gpu_skip="cpu") if s.kind != "run" or s.case.preset == "small"]
    with pytest.raises(cal.CalibrationError, match=r"3 calibration run\(s\) did not complete.*small tp1pp1dp2 "
                                                   r"torch \(real\) \(exit 3, output in /logs/small.log\).*Rerun"):
        cal.calibrate(options, steps)
    assert not options.out.exists() and not options.fit_path.exists() and not options.record_path.exists()


def test_too_few_runs_for_a_term_refuse_naming_the_term_and_the_runs_that_would_fit_it(tmp_path, monkeypatch):
    """Every planned run 'complete' but all of one size: the fit module's refusal comes through, nothing written."""
    options = _options(tmp_path, engines=("torch",))
    steps = [s for s in cal.plan_steps(options, gpu_skip="cpu") if s.kind != "run" or s.case.scale is None]
    for step in steps:
        if step.case:
            _fake_run(options.logs / "runs", step.case)
    rows = []
    for i, step in enumerate(s for s in steps if s.case):
        common = {"run_id": f"r{i}", "run": str(runs.completed(options.logs / "runs", step.case)), "engine": "torch",
                  "preset": step.case.preset, "layout": step.case.layout, "tp": 1, "pp": 1, "ranks": 2, "nodes": 1,
                  "iteration_s": 0.5, "restore_layout": None}
        rows += [{**common, "kind": "checkpoint", "bytes_per_rank_max": 1e8, "files_per_rank_max": 3, "bytes": 2e8,
                  "files": 6, "stall_max_s": 1.0 + i / 10, "durable_rank_max_s": 2.0, "slowdown_s": 0.0,
                  "background_seen": True},
                 {**common, "kind": "restart", "restart_ckpt_load_s": 1.0, "restart_launch_s": 0.1,
                  "restart_imports_s": 5.0, "restart_dist_init_s": 0.5, "restart_model_build_s": 0.2,
                  "restart_ds_init_s": 1.0, "restart_engine_setup_s": 0.01, "restart_1st_iter_s": 1.5,
                  "path_gaps_s": 0.05}]

    class Collected:
        def table(self):
            return pd.DataFrame(rows)
    monkeypatch.setattr("restartbench.analysis.collect", lambda root: Collected())
    monkeypatch.setattr(cal, "run_probe", _probes)
    monkeypatch.setattr(cal, "per_process", lambda collected: {})
    monkeypatch.setattr(cal, "emulate_scales", lambda collected: {})
    with pytest.raises(cal.CalibrationError, match=r"too few runs.*torch: term 'torch stall'.*all have the same "
                                                   r"files, bytes; runs that would fit it:.*different bytes"):
        cal.calibrate(options, steps)
    assert not options.out.exists() and not options.fit_path.exists() and not options.record_path.exists()


@pytest.mark.parametrize(("engines", "per_item"), [(("dcp",), (4e-5, 1e-5)), (("torch",), (None, None))])
def test_the_fit_file_takes_the_coordinators_rate_from_its_probe_where_it_ran(tmp_path, monkeypatch, engines,
                                                                             per_item):
    """Probes and fit stubbed: the collective planner's seconds per item at a save and at a load go into the fit
    file; without a collective engine the probe is skipped and the fit has neither."""
    options = _options(tmp_path, engines=engines)
    steps = [s for s in cal.plan_steps(options, gpu_skip="cpu") if s.kind != "run"]
    planner = {"per_item_s": 4e-5, "load_per_item_s": 1e-5}
    monkeypatch.setattr(cal, "run_probe", lambda step, options, jobs: planner if step.name == "collective planner"
                        else STORAGE if step.name.startswith("storage") else COPY)
    monkeypatch.setattr(cal, "fit_runs", lambda *a, **k: {"fit": Fit(Limits(0.5, 1.0, "s"), 2), "runs": []})
    cal.calibrate(options, steps)
    fit = read_fit(options.fit_path)
    assert (fit.collective_plan_s_per_item, fit.collective_load_plan_s_per_item) == per_item


# -- a real calibration ----------------------------------------------------------------------------------------


@pytest.mark.multirank
def test_a_small_real_calibration_writes_a_cluster_file_that_loads(tmp_path, monkeypatch, capsys):
    """Two real torch runs (tiny at 2 and 4 ranks: the bytes per rank and the world size differ) and small probes:
    about 2 minutes here. The whole calibration (python -m restartbench.whatif --calibrate) is measured by hand."""
    monkeypatch.setattr(cal, "PROBE_MIB", 16)
    monkeypatch.setattr(cal, "PROBE_REPEATS", 1)
    monkeypatch.setattr(cal, "HOST_COPY_BYTES", 2**20)
    options = _options(tmp_path, engines=("torch",))
    steps = [s for s in cal.plan_steps(options, gpu_skip="cpu") if s.kind != "run" or
             (s.case.preset, s.case.scale) == ("tiny", None)]
    assert [s.case.layout for s in steps if s.case] == ["tp1pp1dp2", "tp1pp1dp4"]
    record = cal.calibrate(options, steps)
    cluster = load_cluster(options.out)
    assert cluster.device == "cpu" and cluster.calibration == "mine-fit.json"
    assert cluster.sources["local_write_GBps"][0] == "calibration" and cluster.local_write_GBps > 0
    assert cluster.assumed("dist_init_anchor_s")  # cited, not calibrated
    fit = read_fit(cluster.fit_path())
    assert fit.calibrated_ranks == 4 and "torch" in fit.engines
    assert fit.startup["dist init"].coefficients  # fitted on two world sizes
    assert [s["step"] for s in record["steps"]] == [s.name for s in steps]
    out = capsys.readouterr().out
    assert "step 4/" in out and "exit 0 in" in out and "written" in out
    # a second calibration into the same logs reuses both runs
    again = cal.calibrate(_options(tmp_path, engines=("torch",), out=tmp_path / "again.yaml"), steps)
    assert [s.get("note") for s in again["steps"] if s["kind"] == "run"] == ["already complete"] * 2
    assert load_cluster(tmp_path / "again.yaml").calibration == "again-fit.json"


def test_files_that_do_not_load_back_are_not_put_in_place(tmp_path):
    options = _options(tmp_path)
    good_fit = tmp_path / "fit.tmp"
    good_fit.write_text(json.dumps({"limits": {"write_GBps": 1, "read_GBps": 1, "source": "s"},
                                    "calibrated_ranks": 2, "runs": [], "engines": {}, "startup": {}}))
    bad_cluster = tmp_path / "cluster.tmp"
    bad_cluster.write_text("name: {value: x, basis: calibration, source: s}\n")  # every other field missing
    check = cal.check_written(options)
    with pytest.raises(cal.CalibrationError, match="do not load back.*field 'device' is missing"):
        check({options.fit_path: good_fit, options.out: bad_cluster})
    bad_fit = tmp_path / "bad-fit.tmp"
    bad_fit.write_text("{}")
    with pytest.raises(cal.CalibrationError, match="do not load back.*not a what-if fit file"):
        check({options.fit_path: bad_fit, options.out: bad_cluster})
