"""bench/gpu_session.py and bench/gpu_results.py on the CPU: the budget and the ledger driven by a clock of the
test's own (real commands, fake seconds), every real block's command lines checked against the programs that take
them, and the results written from a ledger and a real tiny run (--keep-checkpoints 1: the older checkpoint removed,
the kept one restored exactly)."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from restartbench.config import build_parser, config_from_args
from restartbench.estimate import checkpoint_bytes
from restartbench.events import read_events
from restartbench.integrity import committed_tags

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import gpu_blocks as gb  # noqa: E402
import gpu_probe  # noqa: E402
import gpu_results as gr  # noqa: E402
import gpu_session as gs  # noqa: E402

PY = sys.executable


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def session(tmp_path, budget, seconds, results=None, code="c0de"):
    """A Session whose commands run for real and take ``seconds[their first word after -c]`` on the fake clock."""
    clock = FakeClock()

    def timed(command, env, timeout, log):
        code_ = gs.execute(command, env, timeout, log)
        clock.t += seconds.get(command[-1], 0)
        return code_

    where = gb.Where(root=ROOT, work=tmp_path / "work", site=tmp_path / "site", wheels=tmp_path / "whl")
    return gs.Session(where, tmp_path / "out", budget, "cpu2", {"tree": code, "files": 1, "paths": [], "commit": None},
                      results=results or tmp_path / "results", clock=clock, execute=timed)


def block(name, expected, code="pass", needs=(), every_visit=False):
    return gb.Block(name, expected, "test", ((PY, "-c", code),), needs=needs, every_visit=every_visit)


def statuses(ledger):
    return {name: entry["status"] for name, entry in ledger["blocks"].items()}


def test_blocks_that_do_not_fit_are_not_started_and_a_failure_does_not_stop_the_rest(tmp_path):
    blocks = [block("a", 10, "print('a ran')"), block("big", 400), block("bad", 10, "import sys; print('boom');"
                                                                          " sys.exit(3)"), block("d", 20)]
    s = session(tmp_path, budget=200, seconds={"print('a ran')": 12, "pass": 25})
    ledger = s.run(blocks, None, ["--budget", "200"], None)
    assert statuses(ledger) == {"a": "ok", "big": "not started", "bad": "failed", "d": "ok"}
    assert "does not fit" in ledger["blocks"]["big"]["error"]
    bad = ledger["blocks"]["bad"]
    assert bad["exit"] == 3 and "exited with 3" in bad["error"] and "boom" in bad["log_tail"]
    assert ledger["blocks"]["d"]["seconds"] == 25
    assert json.loads((tmp_path / "out" / gr.LEDGER).read_text()) == json.loads(json.dumps(ledger, default=str))
    with tarfile.open(tmp_path / "out" / gr.LOGS_TAR) as tar:
        assert {"a.log", "bad.log", "d.log"} <= set(tar.getnames())


def test_the_margin_keeps_a_block_that_only_just_fits_from_starting(tmp_path):
    """100 s left less the reserve: a 75 s block needs 75 x 1.15 + 10 = 96 s, more than 85."""
    ledger = session(tmp_path, budget=100, seconds={}).run([block("x", 75), block("y", 60)], None, [], None)
    assert statuses(ledger) == {"x": "not started", "y": "ok"}


def test_a_command_past_its_time_is_stopped_and_its_block_recorded_as_timed_out(tmp_path):
    log = tmp_path / "slow.log"
    started = time.monotonic()
    assert gs.execute([PY, "-c", "import time; time.sleep(60)"], {}, 1, log) == 124
    assert time.monotonic() - started < 30 and "stopped after 1 s" in log.read_text()
    assert gs.execute(["no-such-program-here"], {}, 1, log) == 127
    ledger = session(tmp_path, 100, {}).run([block("slow", 1, "raise SystemExit(124)")], None, [], None)
    assert statuses(ledger) == {"slow": "timed out"} and ledger["blocks"]["slow"]["exit"] == 124


def test_a_block_held_in_bench_results_is_skipped_unless_a_block_run_now_needs_it(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    for name, code in (("prep", "c0de"), ("x", "c0de"), ("y", "other")):
        (results / f"2026-11-20-cpu2-gpu-{name}.json").write_text(json.dumps({"meta": {"code": {"tree": code},
                                                                                     "status": "ok"}}))
    blocks = [block("setup", 1, every_visit=True), block("prep", 1, needs=("setup",)),
              block("x", 1, needs=("setup",)), block("y", 1, needs=("setup", "prep"))]
    ledger = session(tmp_path, 100, {}, results).run(blocks, None, [], None)
    assert statuses(ledger) == {"setup": "ok", "prep": "ok", "x": "skipped", "y": "ok"}
    assert ledger["blocks"]["prep"]["why"] == "needed by y" and "held in" in ledger["blocks"]["x"]["why"]


def held(results, name, code, seconds, date="2026-11-20", status="ok"):
    results.mkdir(exist_ok=True)
    (results / f"{date}-cpu2-gpu-{name}.json").write_text(json.dumps({"meta": {
        "code": {"tree": code, "commit": code}, "status": status, "seconds": seconds, "date": date,
        "benchmark": f"gpu-{name}"}}))


def test_blocks_held_at_other_code_come_after_the_unmeasured_and_are_planned_with_their_measured_seconds(tmp_path):
    """Code changes between visits: a visit measures first what was never measured, then refreshes what was measured
    at other code; without that each visit would spend its minutes on the first blocks again."""
    results = tmp_path / "results"
    held(results, "a", "older", 60)
    blocks = [block("setup", 1, every_visit=True), block("a", 300, "print('a')", needs=("setup",)),
              block("b", 60, "print('b')", needs=("setup",))]
    ledger = session(tmp_path, 100, {"print('a')": 60, "print('b')": 60}, results).run(blocks, None, [], None)
    assert statuses(ledger) == {"setup": "ok", "b": "ok", "a": "not started"}
    assert list(ledger["blocks"]) == ["setup", "b", "a"]
    assert ledger["blocks"]["a"]["expected_s"] == 60 and ledger["blocks"]["a"]["basis"].startswith(
        "measured on this machine: 60 s on 2026-11-20")


def test_a_block_that_only_failed_at_other_code_keeps_its_place_in_the_priority_order(tmp_path):
    """The first H100 visit's probe failed (no fio on the image): the code that fixes it must not send the probe to
    the back of the next visit, behind every block never run."""
    results = tmp_path / "results"
    held(results, "probe", "older", 20, status="failed")
    held(results, "smoke", "older", 30)
    blocks = [block("setup", 1, every_visit=True), block("probe", 10, "print('p')", needs=("setup",)),
              block("smoke", 10, "print('s')", needs=("setup",)), block("engine", 10, "print('e')", needs=("setup",))]
    ledger = session(tmp_path, 1000, {}, results).run(blocks, None, [], None)
    assert list(ledger["blocks"]) == ["setup", "probe", "engine", "smoke"]


def test_a_stale_block_moves_up_with_an_unmeasured_block_that_needs_it():
    blocks = [block("setup", 1, every_visit=True), block("build", 1, needs=("setup",)), block("x", 1),
              block("use", 1, needs=("setup", "build"))]
    assert [b.name for b in gs.visit_order(blocks, {"build", "x"})] == ["setup", "build", "use", "x"]


def test_the_engines_summary_takes_each_engines_latest_result_and_says_when_their_code_differs(tmp_path):
    results = tmp_path / "results"
    held(results, "engines-1B-lazy", "aaaa", 100, date="2026-11-20")
    held(results, "engines-1B-lazy", "bbbb", 90, date="2026-11-27", status="failed")
    held(results, "engines-1B-torch", "cccc", 80, date="2026-11-25")
    ledger = {"session": {"machine": "cpu2", "code": {"tree": "dddd", "commit": "dddd", "files": 1, "paths": []}}}
    summary = gr.engines_summary(results, ledger)
    assert [(r["engine"], r["commit"], r["status"]) for r in summary["engines"]] == [
        ("torch", "cccc", "ok"), ("lazy", "bbbb", "failed")]
    assert "torch at cccc, lazy at bbbb" in gr.engines_markdown(summary)
    held(results, "engines-1B-lazy-direct", "eeee", 70, date="2026-11-28")  # its run is an engine lazy run
    direct = results / "2026-11-28-cpu2-gpu-engines-1B-lazy-direct.json"
    direct.write_text(json.dumps({**json.loads(direct.read_text()), "runs": [{"engine": "lazy", "cost_s": 0.1}]}))
    summary = gr.engines_summary(results, ledger)
    assert [(r["engine"], r.get("cost_s")) for r in summary["engines"]][1:] == [("lazy", None), ("lazy-direct", 0.1)]
    text = gr.engines_markdown(summary)
    assert summary["variant_headlines"]["lazy-direct"]["judged"] and "## Headline: lazy with --lazy-direct-io" in text
    assert "lazy-direct is lazy with `--lazy-direct-io`" in text


def test_an_engine_blocks_own_options_are_read_from_its_command_and_named_with_the_engines(tmp_path):
    results = tmp_path / "results"
    where = gb.Where(work=tmp_path / "w", wheels=tmp_path / "whl")
    for name, commit in (("engines-1B-datastates", "aaaa"), ("engines-1B-torch", "aaaa")):
        held(results, name, commit, 60)
        path = results / f"2026-11-20-cpu2-gpu-{name}.json"
        command = gb.engine_block(where, name.removeprefix("engines-1B-")).commands[0]
        meta = {**json.loads(path.read_text())["meta"], "commands": [shlex.join(command)]}
        path.write_text(json.dumps({"meta": meta}))
    ledger = {"session": {"machine": "cpu2", "code": {"tree": "a", "commit": "a", "files": 1, "paths": []}}}
    summary = gr.engines_summary(results, ledger)
    assert {r["engine"]: r["options"] for r in summary["engines"]} == {"torch": [],
                                                                        "datastates": ["--host-cache-gb", "20"]}
    text = gr.engines_markdown(summary)
    assert "; datastates ran with `--host-cache-gb 20`." in text
    assert "DataStates pins its host cache" in text and "in ds_init" in text and "FastPersist" not in text
    torch_only = {**summary, "engines": [r for r in summary["engines"] if r["engine"] == "torch"]}
    assert "in ds_init" not in gr.engines_markdown(torch_only)


def test_datastates_host_cache_holds_a_1b_ranks_whole_state():
    """ENGINE_OPTIONS' 20 GiB: at least the 1B tp1pp1 rank's checkpoint as the plan predicts it (19.54 GiB), as the
    lazy engine's pinned buffer holds it: DataStates' 4 GB default stopped the third H100 visit's run."""
    flags = gr.ENGINE_OPTIONS["datastates"]
    cfg = config_from_args(["1B", "tp1pp1", "--device", "cuda", "--dtype", "bf16", "--engine", "datastates", *flags])
    assert checkpoint_bytes(cfg) <= cfg.engine.host_cache_gb * 2**30 < checkpoint_bytes(cfg) + 2**30


def test_a_block_whose_need_failed_is_blocked(tmp_path):
    blocks = [block("setup", 1, "raise SystemExit(1)", every_visit=True), block("x", 1, needs=("setup",))]
    ledger = session(tmp_path, 100, {}).run(blocks, None, [], None)
    assert statuses(ledger) == {"setup": "failed", "x": "blocked"}
    assert "needs setup" in ledger["blocks"]["x"]["error"]


def test_a_session_resumes_in_its_output_folder_with_the_remaining_blocks(tmp_path):
    blocks = [block("setup", 5, "print(0)", every_visit=True), block("a", 50, needs=("setup",)),
              block("b", 50, "print(2)", needs=("setup",))]
    first = session(tmp_path, 100, {"print(0)": 5, "pass": 50}).run(blocks, None, [], None)
    assert statuses(first) == {"setup": "ok", "a": "ok", "b": "not started"}
    second = session(tmp_path, 200, {"print(0)": 5, "print(2)": 50}).run(blocks, None, [], None)
    assert statuses(second) == {"setup": "ok", "a": "skipped", "b": "ok"}
    assert second["blocks"]["a"]["why"].startswith("skipped: done earlier") and len(second["session"]["visits"]) == 2
    third = session(tmp_path, 200, {}, code="changed").run(blocks, None, [], None)
    assert statuses(third) == {"setup": "ok", "a": "ok", "b": "ok"}  # other code: nothing done counts


def test_only_selects_blocks_and_names_the_choices_for_an_unknown_one(tmp_path):
    blocks = gb.plan_blocks(gb.Where(work=tmp_path), free_bytes=60 * gb.GiB)
    wanted = gs.selected(blocks, ["engines-1B"], lambda b: None)
    assert sorted(wanted) == sorted(["setup", "datastates-build"] + [b.name for b in blocks
                                                                     if b.name.startswith("engines-1B-")])
    assert wanted["datastates-build"] == "needed by engines-1B-datastates"
    with pytest.raises(gs.SessionError, match="unknown block.*smok.*choose among setup, probe"):
        gs.selected(blocks, ["smok"], lambda b: None)


def test_setup_unpacks_the_debs_there_are_and_refuses_without_wheels(tmp_path):
    where = gb.Where(work=tmp_path / "w", wheels=tmp_path / "whl")
    where.wheels.mkdir()
    assert "no wheels" in gb.setup_block(where).problem
    (where.wheels / "x-1.0-py3-none-any.whl").write_bytes(b"")
    without = gb.setup_block(where)
    assert without.problem is None and not [c for c in without.commands if c[0] in ("dpkg", "ldconfig")]
    (where.wheels / "libaio1t64_0.3_amd64.deb").write_bytes(b"")
    assert [c[:2] for c in gb.setup_block(where).commands if c[0] in ("dpkg", "ldconfig")] == [("dpkg", "-x"),
                                                                                              ("ldconfig",)]


def make_wheel(folder: Path, module: str, source: str) -> Path:
    """A pure-Python wheel holding one module, written by hand (no build backend, no network)."""
    name = f"{module}-0.1"
    path = folder / f"{name}-py3-none-any.whl"
    files = {f"{module}.py": source,
             f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n",
             f"{name}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n"}
    record = "".join(f"{file},,\n" for file in [*files, f"{name}.dist-info/RECORD"])
    with zipfile.ZipFile(path, "w") as wheel:
        for file, text in {**files, f"{name}.dist-info/RECORD": record}.items():
            wheel.writestr(file, text)
    return path


def test_the_wrapper_installs_the_wheels_before_the_session_imports_anything(tmp_path):
    """bench/gpu-session.sh installs the carried wheels into the site before python starts: gpu_session.py's own
    imports need one of them (orjson, through restartbench's events), and the GPU image lacks it. The 2026-11-27
    visit's first call stopped at that import, when the setup block was still the one to install them."""
    wheels, site = tmp_path / "whl", tmp_path / "site"
    wheels.mkdir()
    make_wheel(wheels, "rb_wrapper_marker", "MARK = 1\n")
    env = {**os.environ, "PYTHON": PY, "RESTARTBENCH_WHEELS": str(wheels), "RESTARTBENCH_SITE": str(site)}
    done = subprocess.run(["bash", str(ROOT / "bench/gpu-session.sh"), "--budget", "100", "--dry-run", "--work",
                           str(tmp_path / "w"), "--only", "setup"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (site / "rb_wrapper_marker.py").is_file() and "1 wheels from" in done.stderr
    command_lines = [line for line in done.stdout.splitlines() if line.startswith("  ") and "basis:" not in line]
    assert "[setup]" in done.stdout and command_lines and not [line for line in command_lines if "pip" in line]
    imported = subprocess.run(["bash", "-c", f"cd {ROOT} && PYTHONPATH={site} {PY} -c 'import rb_wrapper_marker'"])
    assert imported.returncode == 0


def test_the_wrapper_puts_the_carried_fio_first_on_the_path_for_the_probe(tmp_path):
    """bench/gpu-session.sh installs scripts/build-fio.sh's fio from the wheels folder into the site's bin and puts it
    first on the PATH: the GPU image has no fio, and without one the probe's disk limits are dd's lower bounds. The
    probe block names the fio it will run (this CPU machine's own /usr/bin/fio comes after it)."""
    wheels, site = tmp_path / "whl", tmp_path / "site"
    wheels.mkdir()
    make_wheel(wheels, "rb_wrapper_marker", "MARK = 1\n")
    (wheels / "fio").write_text("#!/bin/sh\necho fio-3.33\n")  # carried without its x bit: the wrapper sets it
    env = {**os.environ, "PYTHON": PY, "RESTARTBENCH_WHEELS": str(wheels), "RESTARTBENCH_SITE": str(site)}
    done = subprocess.run(["bash", str(ROOT / "bench/gpu-session.sh"), "--budget", "300", "--dry-run", "--work",
                           str(tmp_path / "w"), "--only", "setup", "probe"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    probe = done.stdout.split("[probe]")[1].split("\n[")[0]
    assert f"fio ({site / 'bin' / 'fio'}" in probe and "expected 140 s" in probe
    assert os.access(site / "bin" / "fio", os.X_OK)


def test_the_probe_is_sized_to_leave_the_checkpoint_room(tmp_path):
    ckpt = 21 * 10**9
    assert gb.probe_mib(64 * gb.GiB, ckpt) == 4096
    assert gb.probe_mib(27 * gb.GiB, ckpt) == (27 * gb.GiB - ckpt - 4 * gb.GiB) // gb.MiB < 4096
    assert "does not fit" in gb.probe_block(gb.Where(work=tmp_path), 24 * gb.GiB, ckpt).problem


def test_the_probe_times_the_lazy_engines_pinning_with_and_without_its_fault_in(monkeypatch):
    """On the CPU, nothing registered: what the probe writes has the keys gpu_results.limits_of reads."""
    from restartbench.engines.lazy import copies
    monkeypatch.setattr(copies, "cuda_call", lambda *args: None)
    monkeypatch.setattr(gpu_probe.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(copies, "FAULT_SLICE_MIN", copies.PAGE)
    engine_pin = gpu_probe.engine_pin_cost(4 * gb.MiB, 2, device="cpu")
    assert engine_pin["prefault"]["fault_threads"] == copies.fault_threads()
    assert engine_pin["no_prefault"]["fault_threads"] == 0
    assert all(len(figures["register_s"]) == 2 and figures["d2h_GBps"] > 0 for figures in engine_pin.values())
    copies_json = {"d2h_pinned": {"best_GBps": 50.0}, "pin": {"best_s_per_GiB": 0.05}}
    lim = gr.limits_of({"copies.json": {**copies_json, "engine_pin": engine_pin}})
    assert lim["engine_pin_s_per_GiB"] == engine_pin["prefault"]["best_s_per_GiB"]
    assert lim["engine_pin_huge_s_per_GiB"] == engine_pin["prefault_huge"]["best_s_per_GiB"]
    assert engine_pin["prefault_huge"]["fault_threads"] == copies.fault_threads()
    text = "\n".join(gr.limits_markdown(lim))
    assert "the lazy engine's pinning of fresh memory" in text and "private huge-page memory" in text
    without_huge = {k: v for k, v in engine_pin.items() if k != "prefault_huge"}  # a probe of the day's first visit
    assert "huge" not in "\n".join(gr.limits_markdown(gr.limits_of({"copies.json": {**copies_json,
                                                                                  "engine_pin": without_huge}})))
    older = gr.limits_of({"copies.json": copies_json})  # a probe from before engine_pin: its text is unchanged
    assert "engine_pin_s_per_GiB" not in older and "lazy engine" not in "\n".join(gr.limits_markdown(older))


def test_every_blocks_command_lines_parse(tmp_path):
    """--dry-run's command lines, each against the program that takes it: config-n-run.py's parser (and one real
    config-n-run.py --dry-run), gpu_probe.py's, bench/limits.py's options, pytest's collection, bash's syntax check
    of the build script."""
    where = gb.Where(work=tmp_path / "w", wheels=tmp_path / "whl")
    blocks = gb.plan_blocks(where, free_bytes=60 * gb.GiB)
    commands = [c for b in blocks for c in b.commands + b.cleanup]
    runs = [c for c in commands if c[1:2] == (str(ROOT / "config-n-run.py"),)]
    assert len(runs) == 2 + 11  # smoke: torch and lazy; 8 engines, lazy-direct, lazy-direct-prefetch, lazy-buffered
    for command in runs:
        config = build_parser().parse_args(list(command[2:]))
        assert vars(config)["launch.device"] == "cuda"
    direct, prefetch = [vars(build_parser().parse_args(list(c[2:]))) for c in runs if "--lazy-direct-io" in c]
    assert direct["engine.engine"] == "lazy" and direct["engine.lazy_direct_io"] is True
    assert not direct["engine.lazy_prefetch"] and prefetch["engine.lazy_prefetch"] and prefetch["engine.lazy_direct_io"]
    buffered, = [vars(build_parser().parse_args(list(c[2:]))) for c in runs if "--no-lazy-direct-io" in c]
    assert buffered["engine.engine"] == "lazy" and buffered["engine.lazy_direct_io"] is False
    probe = next(c for c in commands if c[1:2] == (str(ROOT / "bench/gpu_probe.py"),))
    assert gpu_probe.parser().parse_args(list(probe[2:])).json.endswith("copies.json")
    limits = next(c for c in commands if c[1:2] == (str(ROOT / "bench/limits.py"),))
    shown = subprocess.run([PY, limits[1], "--help"], cwd=ROOT, capture_output=True, text=True).stdout
    assert all(word in shown for word in limits[2:] if word.startswith("--"))
    build = next(c for c in commands if c[:1] == ("bash",))
    assert subprocess.run(["bash", "-n", build[1]]).returncode == 0
    collected = [subprocess.run([*line, "--collect-only"], cwd=ROOT, capture_output=True, text=True)
                 for line in commands if line[1:3] == ("-m", "pytest")]
    assert len(collected) == 3 and all(c.returncode == 0 for c in collected)
    adapter_test, units, tests = collected  # datastates-build's, gpu-units', tests'
    assert "test_on_cuda_a_state_saved_through_the_adapter_loads_back_equal" in adapter_test.stdout
    assert "\n1/" in adapter_test.stdout  # that one test alone ("1/23 tests collected (22 deselected)")
    assert "test_engine_restores_exactly_on_cuda" in tests.stdout
    assert "test_flash_attention_backward_twice" in units.stdout and " deselected" in units.stdout
    smoke = [*runs[0], "--dry-run"]
    rendered = subprocess.run(smoke, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    dry = subprocess.run([PY, str(ROOT / "bench/gpu_session.py"), "--budget", "540", "--dry-run", "--work",
                          str(tmp_path / "w")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0 and all(f"[{b.name}]" in dry.stdout for b in blocks)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A real tiny run as an engines-1B block would make it: two saves, the older removed, a cold restore."""
    logs = tmp_path_factory.mktemp("gpu-session") / "engines-1B-lazy" / "runs"
    done = subprocess.run([PY, str(ROOT / "config-n-run.py"), "tiny", "tp1pp1", "--device", "cpu", "--dtype", "fp32",
                           "--engine", "lazy", "--iters", "2", "--save-interval", "1", "--keep-checkpoints", "1",
                           "--baseline-mib", "0", "--logs", str(logs)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return logs


def test_keep_checkpoints_1_keeps_the_newest_and_restores_it_exactly(tiny_run):
    [run] = [p.parent for p in tiny_run.rglob("metadata.json")]
    events = read_events(run)
    [removed] = [e for e in events if e["event"] == "checkpoint.removed"]
    assert (removed["tag"], removed["committed"]) == ("step1", "step2") and removed["bytes"] > 0
    assert committed_tags(run / "checkpoints") == ["step2"]
    assert all(e["exact"] for e in events if e["event"] == "restore.result")
    assert not [f for f in json.loads((run / "inventory.json").read_text()) if f["tag"] == "step1"]


def visit(tmp_path, runs: Path, storage: dict | None = None) -> Path:
    """What a visit brings back: a ledger with a setup, a probe and an engines-1B-lazy block, and the logs' archive
    (``storage``: the probe's limits.json, by default fio's limits)."""
    out = tmp_path / "out"
    out.mkdir()
    visit = {"started": "2026-11-26T10:00:00+00:00", "argv": ["--budget", "540"], "budget_s": 540, "gpu": "H100"}
    entry = {"expected_s": 300, "basis": "test", "commands": ["config-n-run.py 1B ..."], "code": "c0de", "visit": 1,
             "started": visit["started"], "ended": visit["started"], "exit": 0, "error": None, "log_tail": []}
    probe_files = {"copies.json": {"d2h_pinned": {"best_GBps": 50.0}, "pin": {"best_s_per_GiB": 0.5}},
                   "limits.json": storage or {"write": {"best_MBps": 1000.0}, "read": {"best_MBps": 2000.0}}}
    probe_status = "failed" if storage and storage.get("error") else "ok"
    runtime = {"python": "3.12.3", "torch": "2.11.0+cu130", "deepspeed": "0.19.8"}
    ledger = {"session": {"machine": "h100", "gpu": "NVIDIA H100 80GB HBM3", "visits": [visit],
                          "code": {"tree": "c0de", "files": 3, "paths": ["restartbench"], "commit": None}},
              "blocks": {"setup": {**entry, "status": "ok", "seconds": 8.0, "files": {"runtime.json": runtime}},
                         "probe": {**entry, "status": probe_status, "seconds": 100.0, "files": probe_files},
                         "engines-1B-lazy": {**entry, "status": "ok", "seconds": 280.0, "files": {}},
                         "tests": {**entry, "status": "not started", "error": "does not fit"}}}
    (out / gr.LEDGER).write_text(json.dumps(ledger))
    with tarfile.open(out / gr.LOGS_TAR, "w:gz") as tar:
        tar.add(runs, arcname="engines-1B-lazy/runs")
    return out


def test_import_results_writes_each_block_and_the_engines_with_ratios_to_the_probe(tmp_path, tiny_run):
    results = tmp_path / "results"
    written = gr.import_results(visit(tmp_path, tiny_run), results)
    names = sorted(p.name for p in written)
    assert names == ["2026-11-26-h100-gpu-engines-1B-lazy.md", "2026-11-26-h100-gpu-engines-1B.md",
                     "2026-11-26-h100-gpu-probe.md"]
    lazy = json.loads((results / "2026-11-26-h100-gpu-engines-1B-lazy.json").read_text())
    [run] = lazy["runs"]
    assert run["engine"] == "lazy" and run["verdict"] == "exact" and run["cache"] == "cold"
    assert run["d2h_floor_s"] == pytest.approx(run["bytes_per_rank_max"] / 50e9)
    assert run["stall_over_floor"] == pytest.approx(run["stall_s"] / run["d2h_floor_s"])
    assert run["durable_over_write"] == pytest.approx(run["durable_MBps"] / 1000.0)
    assert run["restore_over_read"] == pytest.approx(run["restore_MBps"] / 2000.0)
    assert {"imports", "dist_init", "ckpt_load"} <= set(run["restart_parts_s"])
    checks = run["harness_checks_s"]
    assert set(checks) == {"check files", "cache", "verify"} and all(v > 0 for v in checks.values())
    assert run["restart_less_checks_s"] < run["restart_s"] and "less_checks" not in run["restart_parts_s"]
    assert run["train_peak_rss_bytes"] > 0 and run["restore_peak_rss_bytes"] > 0  # host peaks, training's included
    stages = run["ds_init_stages_s"]  # what the restart's ds_init part is made of, its three largest in the text
    assert "basic_optimizer" in stages and "collective wait" in stages
    largest = sorted(stages.items(), key=lambda item: -item[1])[:3]
    md = (results / "2026-11-26-h100-gpu-engines-1B-lazy.md").read_text()
    assert f"(ds_init's largest stages: {', '.join(f'{k} {v:.2f}' for k, v in largest)})" in md
    assert "stall ÷ D2H floor" in md and "D2H floor = the rank's checkpoint bytes" in md and "**ok**" in md
    assert json.loads((results / "2026-11-26-h100-gpu-probe.json").read_text())["limits"]["write_MBps"] == 1000.0
    summary = json.loads((results / "2026-11-26-h100-gpu-engines-1B.json").read_text())
    assert summary["headline"]["checks"]["cost_ahead_of_every_other_engine"] is None  # no other engine yet
    assert gr.held_result(results, "h100", "c0de", "engines-1B-lazy") is not None
    for path in written:  # as tests/test_bench_results.py reads every result: the .md is markdown() of the .json
        assert path.read_text() == gr.markdown(json.loads(path.with_suffix(".json").read_text()))


def test_a_second_attempt_of_a_block_on_the_same_day_is_kept_beside_the_first_and_counts_as_the_latest(
        tmp_path, tiny_run):
    """The 2026-11-27 DataStates build: its failed first attempt's results file was overwritten by the second
    call's, the same day. Importing the same visit again rewrites its own files and adds none."""
    results = tmp_path / "results"
    first = visit(tmp_path, tiny_run)
    gr.import_results(first, results)
    gr.import_results(first, results)  # the same visit imported again
    assert not list(results.glob("2026-11-26.2-*"))
    second = first.rename(tmp_path / "first")
    ledger = json.loads((second / gr.LEDGER).read_text())
    ledger["blocks"]["probe"].update(started="2026-11-26T15:00:00+00:00", seconds=99.0)
    (second / gr.LEDGER).write_text(json.dumps(ledger))
    gr.import_results(second, results)
    earlier = json.loads((results / "2026-11-26-h100-gpu-probe.json").read_text())["meta"]
    later = json.loads((results / "2026-11-26.2-h100-gpu-probe.json").read_text())["meta"]
    assert (earlier["seconds"], later["seconds"]) == (100.0, 99.0)
    assert [meta["seconds"] for _, meta in gr.held_results(results, "h100", "probe")] == [100.0, 99.0]
    assert gr.held_result(results, "h100", "c0de", "probe").name == "2026-11-26.2-h100-gpu-probe.json"


def test_a_probe_without_storage_limits_still_gives_the_d2h_ratios_and_says_why_the_disk_ones_are_missing(
        tmp_path, tiny_run):
    """The first H100 visit: the image had no fio, so the probe block failed on bench/limits.py after measuring the
    copies; the stall's ratio to the D2H floor needs only the copies."""
    results = tmp_path / "results"
    no_fio = {"fio": None, "error": "fio is not installed on this machine"}
    gr.import_results(visit(tmp_path, tiny_run, storage=no_fio), results)
    [run] = json.loads((results / "2026-11-26-h100-gpu-engines-1B-lazy.json").read_text())["runs"]
    assert run["stall_over_floor"] == pytest.approx(run["stall_s"] / (run["bytes_per_rank_max"] / 50e9))
    assert run["durable_over_write"] is None and run["restore_over_read"] is None
    probe_md = (results / "2026-11-26-h100-gpu-probe.md").read_text()
    assert "50.0 GB/s" in probe_md and "disk: not measured: fio is not installed" in probe_md
    summary_md = (results / "2026-11-26-h100-gpu-engines-1B.md").read_text()
    assert "Python 3.12.3, torch 2.11.0+cu130, DeepSpeed 0.19.8" in summary_md


def test_a_run_killed_in_its_restore_gives_its_trainings_figures_and_says_its_restart_is_left_out(tmp_path, tiny_run):
    """The first H100 visit's lazy run: the visit's time ran out during its restore, after a whole training."""
    runs = tmp_path / "runs"
    shutil.copytree(tiny_run, runs)
    [run] = [p.parent for p in runs.rglob("metadata.json")]
    meta = json.loads((run / "metadata.json").read_text())
    (run / "metadata.json").write_text(json.dumps({**meta, "status": "running"}))
    for path in (run / "events").glob("restore-*.jsonl"):  # killed after the load: no result, no first iteration
        kept = [line for line in path.read_text().splitlines()
                if json.loads(line)["event"] not in ("restore.verify", "restore.result", "train.iteration",
                                                     "phase.end", "rank.memory")]
        path.write_text("\n".join(kept) + "\n")
    results = tmp_path / "results"
    gr.import_results(visit(tmp_path, runs), results)
    [lazy] = json.loads((results / "2026-11-26-h100-gpu-engines-1B-lazy.json").read_text())["runs"]
    assert lazy["status"] == "incomplete" and lazy["reason"].endswith("its restart is left out")
    assert lazy["stall_s"] > 0 and lazy["stall_over_floor"] > 0 and lazy["durable_over_write"] > 0
    assert lazy.get("restart_s") is None and lazy.get("verdict") is None
    md = (results / "2026-11-26-h100-gpu-engines-1B-lazy.md").read_text()
    assert "| restart left out (incomplete) |" in md and "incomplete: never finished" in md
    head = json.loads((results / "2026-11-26-h100-gpu-engines-1B.json").read_text())["headline"]
    assert head["judged"] and head["checks"]["cold_restore_at_least_90pct_of_fio_read"] is None
    assert head["checks"]["cost_within_2x_floor"] is not None and head["met"] is None


def test_the_headline_judges_lazy_against_the_goal_and_every_other_engine():
    lazy = {"engine": "lazy", "cost_s": 0.4, "durable_s": 20.0, "restore_s": 10.0, "cost_over_floor": 1.5,
            "durable_over_write": 0.95, "restore_over_read": 0.8}
    torch_ = {"engine": "torch", "cost_s": 30.0, "durable_s": 40.0, "restore_s": 9.0}
    head = gr.headline([lazy, torch_])
    assert head["checks"] == {"cost_within_2x_floor": True, "durable_at_least_90pct_of_fio_write": True,
                              "cold_restore_at_least_90pct_of_fio_read": False,
                              "cost_ahead_of_every_other_engine": True, "durable_ahead_of_every_other_engine": True,
                              "restore_ahead_of_every_other_engine": False}
    assert head["met"] is False and head["others"] == ["torch"]
    assert gr.headline([torch_]) == {"judged": False, "reason": "no lazy run with figures yet"}
    direct = {**lazy, "engine": "lazy-direct", "restore_s": 8.0, "restore_over_read": 0.95}
    assert gr.headline([lazy, direct, torch_])["others"] == ["torch"], "lazy's variants are not its rivals"
    judged = gr.headline([lazy, direct, torch_], "lazy-direct")
    assert judged["met"] is True and judged["others"] == ["torch"]


def test_a_failures_first_error_lines_are_found_above_its_build_tools_traceback(tmp_path):
    """The 2026-11-27 DataStates build: g++'s error 130 lines above the end, under setuptools' frames."""
    log = tmp_path / "datastates-build.log"
    log.write_text("\n".join(["Building wheel", "  error: subprocess-exited-with-error",
                              "      src/mem_region.hpp:11:11: error: 'uint64_t' does not name a type",
                              *[f'        File "setuptools/x.py", line {n}, in run' for n in range(60)],
                              "      RuntimeError: Error compiling objects for extension",
                              "E       assert 1 == 2", "FAILED tests/test_x.py::test_y", "ok line"]))
    found = gr.error_lines(log)
    assert found[1] == "src/mem_region.hpp:11:11: error: 'uint64_t' does not name a type"
    assert found[2:] == ["RuntimeError: Error compiling objects for extension", "E       assert 1 == 2",
                         "FAILED tests/test_x.py::test_y"]
    assert gr.error_lines(log, limit=2) == found[:2] and gr.error_lines(tmp_path / "absent.log") == []


def test_import_results_refuses_a_folder_without_a_ledger(tmp_path):
    with pytest.raises(gr.ResultsError, match="holds no ledger.json"):
        gr.import_results(tmp_path, tmp_path / "results")


def test_the_code_identity_follows_the_code_and_not_the_results(tmp_path):
    for rel in ("restartbench/a.py", "bench/results/x.json", "bench/b.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("1")
    before = gs.code_identity(tmp_path)
    (tmp_path / "bench/results/x.json").write_text("2")
    assert gs.code_identity(tmp_path)["tree"] == before["tree"] and before["files"] == 2
    (tmp_path / "bench/b.py").write_text("2")
    assert gs.code_identity(tmp_path)["tree"] != before["tree"]


def test_a_datastates_build_this_machine_holds_is_planned_as_its_check(tmp_path):
    """A visit's second command finds the first's build (scripts/build-datastates.sh leaves its stamp: the vendored
    source's files and torch's version) and plans seconds for it, not a build; a stamp of other source or torch is
    no build."""
    where = gb.Where(work=tmp_path / "w", site=tmp_path / "site", wheels=tmp_path / "whl")
    assert gb.datastates_build_block(where).expected_s == 110
    script = str(ROOT / "scripts/build-datastates.sh")
    stamp = subprocess.run(["bash", script, "--stamp"], env={"PATH": "/usr/bin:/bin", "PYTHON": PY},
                           capture_output=True, text=True, check=True).stdout.strip()
    assert len(stamp) == 64 and int(stamp, 16) >= 0
    (where.site / "datastates").mkdir(parents=True)
    (where.site / "datastates" / "BUILT").write_text(stamp + "\n")
    block = gb.datastates_build_block(where)
    assert block.expected_s == 35 and "built earlier" in block.basis
    assert block.commands[-1][-2:] == ("-k", gb.ADAPTER_TEST) and block.env["DATASTATES_SITE"] == str(where.site)
    (where.site / "datastates" / "BUILT").write_text("0" * 64 + "\n")  # another source or another torch
    assert gb.datastates_build_block(where).expected_s == 110


def test_the_slower_engines_blocks_are_planned_longer_with_their_reason(tmp_path):
    where = gb.Where(work=tmp_path / "w", wheels=tmp_path / "whl")
    blocks = {label: gb.engine_block(where, label) for label in ("torch", "fastpersist", "datastates")}
    assert {label: b.expected_s for label, b in blocks.items()} == {"torch": 200, "fastpersist": 430,
                                                                     "datastates": 240}
    assert "0.25 GB/s" in blocks["fastpersist"].basis and "cudaMallocHost" in blocks["datastates"].basis
    assert blocks["datastates"].needs == ("setup", "datastates-build")
