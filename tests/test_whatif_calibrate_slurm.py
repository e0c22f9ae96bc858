"""``python -m restartbench.whatif --calibrate --slurm`` (restartbench/whatif/calibrate.py, limits.py): the plan's
Slurm steps, the refusal without a usable Slurm (nothing written), sinfo's nodes and the one-host guess, the shared
probe's barrier, host detection and aggregation arithmetic, its cluster fields, the fit of one-host runs, the wait for
a submitted job; one real shared probe on two local Slurm nodes (multirank)."""

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT

from restartbench.whatif import calibrate as cal
from restartbench.whatif import calibration_runs as runs
from restartbench.whatif import cli
from restartbench.whatif import limits as probes
from restartbench.whatif import slurm as slurm_info
from restartbench.whatif.cluster import cluster_from_mapping, load_cluster, to_mapping
from restartbench.whatif.fit import Fit, Limits

SLURM_LOCAL = ROOT / "scripts" / "slurm-local.sh"


def _options(tmp_path: Path, **changes) -> cal.Options:
    return cal.Options(**{"out": tmp_path / "mine.yaml", "logs": tmp_path / "logs", **changes})


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- the plan --------------------------------------------------------------------------------------------------


def test_the_slurm_plan_adds_the_shared_probe_and_2_node_runs_beside_the_1_node_steps(tmp_path):
    plain = cal.plan_steps(_options(tmp_path), gpu_skip="no GPU")
    steps = cal.plan_steps(_options(tmp_path, slurm=True), gpu_skip="no GPU")
    added = [s for s in steps if s not in plain]
    assert [s for s in steps if s in plain] == plain  # every 1-node step kept, in its order
    shared, *runs = added
    assert shared.kind == "probe" and shared.name.startswith("shared storage (2 nodes at once and one alone, 1 "
                                                             "writer(s) per node")
    assert shared.via == "srun --nodes 2 --ntasks-per-node 1" and shared.expected_s == cal.EXPECTED_S["shared storage"]
    assert steps.index(shared) == 4 and steps[0].name.startswith("storage limits (2 writers")  # after the 1-node probes
    cases = [s.case for s in runs]
    assert cases == [cal.Case("tiny", "tp1pp1dp2", "torch", nodes=2),
                     *(cal.Case("3B", "tp1pp1dp2", engine, cal.EMULATED_SCALES[-1], nodes=2)
                       for engine in cal.DEFAULT_ENGINES)]
    assert [s.kind for s in steps[-2:]] == ["fit", "write"] and all(s.kind == "run" for s in runs)
    assert all(s.via.startswith("sbatch --nodes 2") and s.expected_s == cal.EXPECTED_S[
        (s.case.preset, s.case.layout, 2)] for s in runs)
    assert all(c.concurrency == 1 and "2 nodes" in c.label for c in cases)  # one writer per node
    argv = cases[0].argv(tmp_path)
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--launcher") + 1] == "slurm"
    assert "--submit" in argv


def test_the_dry_run_prints_the_slurm_steps_and_whether_slurm_is_usable(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cal, "run_sinfo", lambda: "node1|idle|127.0.0.1\nnode2|idle|127.0.0.1\n")
    assert cli.main(["--calibrate", "--out", str(tmp_path / "mine.yaml"), "--dry-run", "--engines", "torch",
                     "--slurm"]) == 0
    out = capsys.readouterr().out
    assert "[srun --nodes 2 --ntasks-per-node 1]" in out and "tiny tp1pp1dp2 torch (real, 2 nodes)" in out
    assert "Slurm: 2 node(s), 2 idle (node1, node2); one host" in out
    monkeypatch.setattr(cal, "run_sinfo", lambda: "node1|idle|127.0.0.1\n")
    assert cli.main(["--calibrate", "--out", str(tmp_path / "mine.yaml"), "--dry-run", "--engines", "torch",
                     "--slurm"]) == 0
    assert "would be refused" in capsys.readouterr().out
    assert _listing(tmp_path) == []


# -- the refusal -----------------------------------------------------------------------------------------------


def test_without_slurm_commands_the_calibration_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cal.shutil, "which", lambda name: None)
    monkeypatch.setattr(cal, "run_case", lambda *a, **k: pytest.fail("nothing may run"))
    monkeypatch.setattr(cal, "run_probe", lambda *a, **k: pytest.fail("nothing may run"))
    with pytest.raises(cal.CalibrationError, match=r"sinfo, sbatch, srun not on PATH.*slurm-local.sh up DIR 8 2"):
        cal.calibrate(_options(tmp_path, slurm=True, engines=("torch",)))
    assert cli.main(["--calibrate", "--out", str(tmp_path / "mine.yaml"), "--slurm", "--engines", "torch",
                     "--logs", str(tmp_path / "logs")]) == 2
    assert "no usable Slurm" in capsys.readouterr().err
    assert _listing(tmp_path) == []


def test_a_failing_sinfo_or_too_few_idle_nodes_refuse_saying_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(cal.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    failed = subprocess.CompletedProcess([], 1, "", "sinfo: error: x\nsinfo: fatal: no configuration source\n")
    monkeypatch.setattr(cal.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(cal.CalibrationError, match=r"sinfo exited 1 \(SLURM_CONF is not set\): sinfo: fatal: no "
                                                   r"configuration source; run --slurm where"):
        cal.slurm_nodes()
    with pytest.raises(cal.CalibrationError, match=r"1 idle node\(s\) \(nodes: node1, node2\).*need 2"):
        cal.slurm_nodes("node1|idle|10.0.0.1\nnode2|down*|10.0.0.2\n")
    with pytest.raises(cal.CalibrationError, match="0 idle node"):
        cal.slurm_nodes("")
    assert _listing(tmp_path) == []


def test_sinfo_nodes_once_each_idle_or_mixed_and_the_one_host_guess():
    text = ("node1|idle|a\nnode1|idle|a\nnode2|mixed|b\nnode3|allocated|c\nnode4|idle*|d\nnode5|drained|e\n"
            "node6|idle~|f\n\n")
    found = slurm_info.parse_sinfo(text, resolve={"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}.get)
    assert found.nodes == ("node1", "node2", "node3", "node4", "node5", "node6")
    assert found.idle == ("node1", "node2") and not found.one_host
    same = slurm_info.parse_sinfo("node1|idle|127.0.0.1\nnode2|idle|127.0.0.1\n", resolve=lambda a: a)
    assert same.one_host and "one host" in same.line()
    loopback = slurm_info.parse_sinfo("node1|idle|localhost\nnode2|idle|vm\n",
                                      resolve={"localhost": "127.0.0.1", "vm": "127.0.1.1"}.get)
    assert loopback.one_host
    one = slurm_info.parse_sinfo("node1|idle|127.0.0.1\n", resolve=lambda a: a)
    assert not one.one_host  # one node is no "two on one"


# -- the shared probe ------------------------------------------------------------------------------------------


def _report(node, boot, phases, host="h", rank=0):
    return {"node": node, "host": host, "boot_id": boot, "rank": rank, "phases": phases}


def _phase(repeat, together, side, start, end, nbytes):
    return {"repeat": repeat, "together": together, "side": side, "start": start, "end": end, "bytes": nbytes}


def test_the_probes_nodes_are_one_host_by_boot_id_else_by_hostname():
    assert probes.one_host([_report("n1", "b", [], "x"), _report("n2", "b", [], "y")])
    assert not probes.one_host([_report("n1", "b1", [], "x"), _report("n2", "b2", [], "x")])
    assert probes.one_host([_report("n1", "", [], "x"), _report("n2", "", [], "x")])
    assert not probes.one_host([_report("n1", "", [], "x"), _report("n2", "b", [], "y")])


def test_the_shared_figures_aggregate_over_the_nodes_span_and_keep_one_client_alone():
    mb = 1e6
    first = _report("n1", "b1", [
        _phase(0, False, "write", 0.0, 1.0, 150 * mb), _phase(0, False, "read", 1.0, 1.5, 300 * mb),
        _phase(0, True, "write", 10.0, 11.0, 100 * mb), _phase(0, True, "read", 12.0, 12.5, 100 * mb),
        _phase(1, False, "write", 20.0, 22.0, 150 * mb), _phase(1, False, "read", 22.0, 23.0, 300 * mb),
        _phase(1, True, "write", 30.0, 32.0, 100 * mb), _phase(1, True, "read", 40.0, 40.5, 100 * mb)], "x")
    second = _report("n2", "b2", [
        _phase(0, True, "write", 10.5, 12.0, 100 * mb), _phase(0, True, "read", 12.0, 13.0, 100 * mb),
        _phase(1, True, "write", 30.0, 34.0, 100 * mb), _phase(1, True, "read", 40.0, 40.5, 100 * mb)], "y", rank=1)
    figures = probes.shared_figures([second, first])
    assert figures["nodes"] == ["n1", "n2"] and figures["hosts"] == ["x", "y"] and not figures["one_host"]
    write, read = figures["write"], figures["read"]
    # together: 200 MB over first start to last end (2 s, then 4 s); each node its own bytes over its own time
    assert write["aggregate_MBps"] == pytest.approx({"min": 50.0, "median": 75.0, "max": 100.0})
    assert write["per_node_MBps"] == pytest.approx({"min": 25.0, "median": (50.0 + 200 / 3) / 2, "max": 100.0})
    assert write["alone_MBps"] == pytest.approx({"min": 75.0, "median": 112.5, "max": 150.0})
    assert read["aggregate_MBps"] == pytest.approx({"min": 200.0, "median": 300.0, "max": 400.0})
    assert read["alone_MBps"] == pytest.approx({"min": 300.0, "median": 450.0, "max": 600.0})
    with pytest.raises(probes.ProbeError, match="incomplete"):  # a node's together phase missing
        probes.shared_figures([first, {**second, "phases": second["phases"][:2]}])
    with pytest.raises(probes.ProbeError, match="2 nodes or more"):
        probes.shared_figures([first])


def test_the_barrier_starts_each_phase_on_every_node_together(tmp_path):
    """Two node tasks in threads against a BarrierServer: the first node's alone phases end before any together
    phase starts, and the second node writes only together."""
    reports = {}
    with probes.BarrierServer(2, timeout=60) as server:
        def task(rank):
            barrier = probes.tcp_barrier(("127.0.0.1", server.port), f"t{rank}", timeout=60)
            reports[rank] = probes.node_task(tmp_path / f"n{rank}", 1, 2, 2, barrier, rank)
        threads = [threading.Thread(target=task, args=(rank,)) for rank in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert set(reports) == {0, 1}
    first, second = reports[0]["phases"], reports[1]["phases"]
    assert [(p["repeat"], p["together"], p["side"]) for p in second] == [
        (r, True, side) for r in (0, 1) for side in ("write", "read")]
    assert len(first) == 8 and all(p["bytes"] == 8 * 2**20 for p in first + second)  # whole 8 MiB blocks
    for repeat in (0, 1):
        alone_end = max(p["end"] for p in first if p["repeat"] == repeat and not p["together"])
        assert min(p["start"] for p in second if p["repeat"] == repeat) >= alone_end
        for side in ("write", "read"):  # the two nodes' together phases overlap
            a, b = (next(p for p in ps if (p["repeat"], p["together"], p["side"]) == (repeat, True, side))
                    for ps in (first, second))
            assert a["start"] <= b["end"] and b["start"] <= a["end"]
    assert reports[0]["boot_id"] == reports[1]["boot_id"] and probes.one_host([reports[0], reports[1]])
    assert not list(tmp_path.rglob(".whatif-shared-*"))  # the probe's files removed


def test_srun_gets_its_own_allocation_even_inside_one():
    env = probes.srun_environment({"SLURM_JOB_ID": "7", "SLURM_NNODES": "1", "SLURM_CONF": "/c", "PATH": "/bin"})
    assert env == {"SLURM_CONF": "/c", "PATH": "/bin"}


# -- the cluster file and the fit -------------------------------------------------------------------------------

SHARED = {"nodes": ["node1", "node2"], "hosts": ["vm"], "one_host": True, "target": "/logs/probe-shared",
          "jobs_per_node": 1, "size_mib_per_job": 256, "repeats": 2, "method": "srun --nodes 2 ...",
          "write": {"aggregate_MBps": {"min": 300.0, "median": 400.0, "max": 500.0},
                    "per_node_MBps": {"min": 150.0, "median": 200.0, "max": 250.0},
                    "alone_MBps": {"min": 350.0, "median": 450.0, "max": 550.0}},
          "read": {"aggregate_MBps": {"min": 900.0, "median": 1000.0, "max": 1100.0},
                   "per_node_MBps": {"min": 400.0, "median": 500.0, "max": 600.0},
                   "alone_MBps": {"min": 1100.0, "median": 1200.0, "max": 1300.0}}}
STORAGE = {"target": "/x", "jobs": 2, "size_mib_per_job": 8, "repeats": 1,
           "write": {"best": "w", "MBps": {"min": 400.0, "median": 500.0, "max": 600.0}, "methods": {"w": {}}},
           "read": {"best": "r", "MBps": {"min": 900.0, "median": 1000.0, "max": 1100.0}, "methods": {"r": {}}}}
COPY = {"bytes": 1, "jobs": 2, "MBps": {"min": 1000.0, "median": 2000.0, "max": 3000.0}, "method": "m"}


def test_the_cluster_file_takes_the_shared_storage_as_measured_and_says_the_nodes_are_one_host(tmp_path):
    slurm = slurm_info.parse_sinfo("node1|idle|127.0.0.1\nnode2|idle|127.0.0.1\n", resolve=lambda a: a)
    cluster = cal.calibrated_cluster(_options(tmp_path, slurm=True), {"storage": STORAGE, "host_copy": COPY}, None,
                                     "now", SHARED, slurm)
    assert cluster.storage == "shared" and cluster.nodes == 2
    assert cluster.shared_write_GBps == pytest.approx(0.4) and cluster.shared_read_GBps == pytest.approx(1.0)
    assert cluster.shared_per_client_GBps == pytest.approx(1.2) and cluster.nic_GBps == pytest.approx(1.2)
    assert cluster.local_write_GBps == pytest.approx(0.5)  # the 1-node probe kept
    for name in ("storage", "shared_write_GBps", "shared_read_GBps", "shared_per_client_GBps", "nic_GBps", "nodes"):
        basis, source = cluster.sources[name]
        assert basis == "calibration" and "one host" in source, (name, source)
    assert "srun --nodes 2" in cluster.sources["shared_write_GBps"][1]
    assert "300-500 MB/s" in cluster.sources["shared_write_GBps"][1]
    assert "one node alone" in cluster.sources["shared_per_client_GBps"][1]
    assert cluster_from_mapping(to_mapping(cluster), cluster.path) == cluster  # a valid file
    apart = cal.calibrated_cluster(_options(tmp_path, slurm=True), {"storage": STORAGE, "host_copy": COPY}, None,
                                   "now", {**SHARED, "one_host": False, "hosts": ["a", "b"]})
    assert "one host" not in apart.sources["shared_write_GBps"][1] and "hosts a, b" in \
        apart.sources["shared_write_GBps"][1]
    alone = cal.calibrated_cluster(_options(tmp_path), {"storage": STORAGE, "host_copy": COPY}, None, "now")
    assert alone.storage == "local" and alone.nodes == 1 and alone.shared_write_GBps == 0


def test_the_cluster_file_gives_the_cores_per_node_where_the_calibration_ran(tmp_path, monkeypatch):
    monkeypatch.setattr(cal.os, "cpu_count", lambda: 6)
    limits = {"storage": STORAGE, "host_copy": COPY}
    alone = cal.calibrated_cluster(_options(tmp_path), limits, None, "now")
    assert alone.cpu_cores_per_node == 6 and alone.sources["cpu_cores_per_node"][0] == "calibration"
    assert "os.cpu_count()" in alone.sources["cpu_cores_per_node"][1]
    slurm = slurm_info.parse_sinfo("node1|idle|127.0.0.1\nnode2|idle|127.0.0.1\n", resolve=lambda a: a)
    one_host = cal.calibrated_cluster(_options(tmp_path, slurm=True), limits, None, "now", SHARED, slurm)
    assert one_host.cpu_cores_per_node == 3 and "one host" in one_host.sources["cpu_cores_per_node"][1]
    apart = cal.calibrated_cluster(_options(tmp_path, slurm=True), limits, None, "now",
                                   {**SHARED, "one_host": False, "hosts": ["a", "b"]})
    assert apart.cpu_cores_per_node == 6


def test_the_shared_probe_line_says_one_host():
    line = slurm_info.shared_summary(SHARED)
    assert "write 400 MB/s, read 1000 MB/s in all" in line and "one node alone: write 450 MB/s, read 1200" in line
    assert "2 nodes on one host (vm, one boot id): one disk" in line
    assert "hosts a, b" in slurm_info.shared_summary({**SHARED, "one_host": False, "hosts": ["a", "b"]})


def test_runs_on_nodes_of_one_host_are_fitted_as_one_node_of_all_their_processes():
    table = pd.DataFrame({"run_id": ["a", "a", "b"], "nodes": [2, 2, 1], "bytes": [1.0, 1.0, 2.0]})
    fitted, notes = slurm_info.one_host_as_one_node(table)
    assert list(fitted["nodes"]) == [1, 1, 1] and list(table["nodes"]) == [2, 2, 1]  # the caller's table untouched
    assert "1 run(s)" in notes["multi-node runs"] and ": a" in notes["multi-node runs"]
    same, none = slurm_info.one_host_as_one_node(table[table["nodes"] == 1])
    assert none == {} and list(same["nodes"]) == [1]


def test_a_calibration_with_slurm_writes_the_shared_fields_and_records_what_slurm_had(tmp_path, monkeypatch):
    """Every probe and run stubbed: the write step gets the shared probe's figures and the nodes sinfo listed."""
    options = _options(tmp_path, slurm=True, engines=("torch",))
    slurm = slurm_info.parse_sinfo("node1|idle|127.0.0.1\nnode2|idle|127.0.0.1\n", resolve=lambda a: a)
    steps = [s for s in cal.plan_steps(options, gpu_skip="cpu") if s.kind != "run"]
    seen = []
    monkeypatch.setattr(cal, "run_probe", lambda step, options, jobs: seen.append((step.name[:14], jobs)) or (
        SHARED if step.name.startswith("shared") else STORAGE if step.name.startswith("storage") else COPY))
    fit = Fit(Limits(0.5, 1.0, "s"), calibrated_ranks=2)
    monkeypatch.setattr(cal, "fit_runs", lambda *a, **k: seen.append(("fit", k)) or {"fit": fit, "runs": []})
    record = cal.calibrate(options, steps, slurm=slurm)
    assert seen == [("storage limits", 2), ("host copy", 2), ("shared storage", 1), ("fit", {"one_host": True})]
    assert record["slurm"]["idle"] == ["node1", "node2"] and record["shared_storage"] == SHARED
    cluster = load_cluster(options.out)
    assert cluster.storage == "shared" and cluster.shared_write_GBps == pytest.approx(0.4)
    assert json.loads(options.record_path.read_text())["shared_storage"]["one_host"] is True


# -- waiting for a submitted job --------------------------------------------------------------------------------


def test_the_wait_reads_the_job_id_and_returns_when_its_run_folder_says_so(tmp_path, monkeypatch):
    assert runs.submitted_job("[restartbench] submitted job 42 (slurm)\n42\nwarning: later\n") == "42"
    assert runs.submitted_job("no job here\n") == ""
    run = tmp_path / "tiny" / "run"
    run.mkdir(parents=True)
    (run / "metadata.json").write_text(json.dumps({"job_id": "42", "status": "running"}))
    cancelled = []
    monkeypatch.setattr(cal.subprocess, "run", lambda argv, **k: cancelled.append(argv))

    def finish():
        time.sleep(0.3)
        (run / "metadata.json").write_text(json.dumps({"job_id": "42", "status": "complete"}))
    threading.Thread(target=finish).start()
    assert runs.wait_for_job(tmp_path, "42\n", time.perf_counter() + 30, poll_s=0.05) == ("42", 0, run / "slurm-42.out")
    (run / "metadata.json").write_text(json.dumps({"job_id": "42", "status": "failed"}))
    assert runs.wait_for_job(tmp_path, "42\n", time.perf_counter() + 30, poll_s=0.05)[1] == 1
    assert cancelled == []
    (run / "metadata.json").write_text(json.dumps({"job_id": "42", "status": "running"}))
    assert runs.wait_for_job(tmp_path, "42\n", time.perf_counter() + 0.2, poll_s=0.05) == ("42", None, None)
    assert cancelled == [["scancel", "--full", "42"]]
    assert runs.wait_for_job(tmp_path, "oops\n", time.perf_counter() + 5) == ("", 1, None)


# -- a real Slurm ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """Two Slurm nodes on this host (scripts/slurm-local.sh, its own ports); skipped with the reason where it
    cannot come up."""
    install = subprocess.run(["bash", str(SLURM_LOCAL), "install"], capture_output=True, text=True)
    if install.returncode != 0:
        pytest.skip(f"Slurm cannot be installed here: {install.stderr.strip()[-300:]}")
    state = tmp_path_factory.mktemp("slurm-calibrate")
    env = {**os.environ, "SLURM_LOCAL_PORT": "18817"}
    up = subprocess.run(["bash", str(SLURM_LOCAL), "up", str(state), "8", "2"], capture_output=True, text=True,
                        env=env)
    if up.returncode != 0:
        subprocess.run(["bash", str(SLURM_LOCAL), "down", str(state)])
        pytest.skip(f"Slurm did not come up: {up.stderr.strip()[-300:]}")
    yield state / "slurm.conf"
    subprocess.run(["bash", str(SLURM_LOCAL), "down", str(state)])


@pytest.mark.multirank
def test_the_shared_probe_runs_on_two_real_slurm_nodes_and_finds_them_one_host(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm))
    found = cal.slurm_nodes()
    assert found.idle == ("node1", "node2") and found.one_host
    shared = probes.shared_storage_limits(tmp_path / "probe", nodes=2, jobs=1, size_mib=16, repeats=1, timeout=120)
    assert shared["nodes"] == ["node1", "node2"] and shared["one_host"]
    assert {r["rank"] for r in shared["reports"]} == {0, 1}
    for side in ("write", "read"):
        assert shared[side]["aggregate_MBps"]["median"] > 0 and shared[side]["alone_MBps"]["median"] > 0
    assert not list((tmp_path / "probe").glob(".whatif-shared-*"))


def test_a_2_node_case_is_waited_for_after_its_submit_and_cancelled_past_its_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "RUN_PROGRAM", "print('[restartbench] submitted job 77'); print('77')")
    waited = []
    out = tmp_path / "slurm-77.out"
    out.write_text("the job's output\nits last line\n")
    answers = iter([("77", 1, out), ("77", None, None)])
    monkeypatch.setattr(runs, "wait_for_job", lambda folder, printed, deadline: waited.append(printed) or next(answers))
    case = cal.Case("tiny", "tp1pp1dp2", "torch", nodes=2)
    failed = runs.run_case(case, tmp_path / "runs", timeout=60)
    assert waited == ["[restartbench] submitted job 77\n77\n"]
    assert failed["exit"] == 1 and failed["job"] == "77" and failed["log"] == str(out)
    assert failed["tail"] == ["the job's output", "its last line"]
    late = runs.run_case(case, tmp_path / "runs", timeout=60)
    assert late["exit"] is None and late["note"] == "stopped after 60 s (--timeout), job 77 cancelled"
    one_node = runs.run_case(cal.Case("tiny", "tp1pp1dp2", "torch"), tmp_path / "runs", timeout=60)
    assert len(waited) == 2 and "job" not in one_node  # a 1-node case is not waited for
