"""The run folder's contract (restartbench.rundir, restartbench.events): plan.json typed both ways and refused when
another version wrote it, the event names spelled once, and the one event reader."""

import ast
import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest
from conftest import ROOT
from test_results import write_run

from restartbench import analysis, rundir
from restartbench.config import config_from_args
from restartbench.events import EVENT_NAMES, EventFileError, EventLog, events_file, read_events
from restartbench.rundir import RunFolderError, RunPlan
from restartbench.study import plan_run

#: The sources whose event names are checked: the package, the benchmarks, the analysis entry point.
SOURCES = sorted([*(ROOT / "restartbench").rglob("*.py"), *(ROOT / "bench").glob("*.py"),
                  *(ROOT / "analysis").glob("*.py")])
#: Where an event name may be spelled as a string: the one place that defines them.
DEFINED_IN = "restartbench/events.py"

_GROUPS = "|".join(sorted({name.split(".")[0] for name in EVENT_NAMES}))
EVENT_LITERAL = re.compile(rf"""(["'])((?:{_GROUPS})\.[a-z_]+)\1""")


def event_literals(text: str) -> list[str]:
    """Every quoted ``"<group>.<name>"`` string of the known event groups."""
    return [match.group(2) for match in EVENT_LITERAL.finditer(text)]


def literals_by_file() -> dict[str, list[str]]:
    found = {str(path.relative_to(ROOT)): event_literals(path.read_text()) for path in SOURCES}
    return {path: names for path, names in found.items() if names}


# -- plan.json -------------------------------------------------------------------------------------------------


@pytest.fixture
def plan(tmp_path) -> RunPlan:
    return plan_run(config_from_args(["tiny", "tp2pp2", "--logs", str(tmp_path / "logs"), "--dry-run"]))


def test_a_plan_round_trips_through_plan_json(plan, tmp_path):
    plan.save(tmp_path)
    assert RunPlan.load(tmp_path) == plan
    stored = json.loads((tmp_path / rundir.PLAN).read_text())  # the on-disk keys are the fields, and the mark
    assert set(stored) == {*asdict(plan), "checkpoint_external"}


def test_an_object_store_plan_round_trips_with_its_settings(plan, tmp_path):
    plan.checkpoint_dir, plan.remote = "s3://ckpt/run", {"scheme": "s3://", "client": "fsspec", "endpoint": None}
    plan.save(tmp_path)
    assert RunPlan.load(tmp_path) == plan


def _write_plan_json(folder: Path, stored: dict) -> None:
    (folder / rundir.PLAN).write_text(json.dumps(stored))


def test_a_plan_json_lacking_a_field_is_refused_naming_it_and_the_file(plan, tmp_path):
    stored = asdict(plan)
    del stored["backend"]
    _write_plan_json(tmp_path, stored)
    refusal = (rf"{re.escape(str(tmp_path / 'plan.json'))} was written by another version of restartbench: "
               r"it lacks the field\(s\) 'backend'\. .*config-n-run\.py")
    with pytest.raises(RunFolderError, match=refusal):
        RunPlan.load(tmp_path)


def test_a_plan_json_with_an_unknown_field_is_refused_naming_it(plan, tmp_path):
    _write_plan_json(tmp_path, {**asdict(plan), "nodes": 2})
    with pytest.raises(RunFolderError, match=r"plan\.json was written by .*: it has the unknown field\(s\) 'nodes'"):
        RunPlan.load(tmp_path)


def test_a_plan_json_lacking_one_field_and_with_another_names_both(plan, tmp_path):
    stored = asdict(plan)
    stored["ranks"] = stored.pop("world_size")
    _write_plan_json(tmp_path, stored)
    with pytest.raises(RunFolderError, match=r"lacks the field\(s\) 'world_size'; it has the unknown field\(s\) "
                                             r"'ranks'"):
        RunPlan.load(tmp_path)


def test_the_analysis_lists_a_run_whose_plan_another_version_wrote_as_unreadable(plan, tmp_path):
    run_dir = write_run(tmp_path / "logs")
    _write_plan_json(run_dir, {**asdict(plan), "nodes": 2})
    excluded = analysis.collect(tmp_path / "logs").excluded
    assert [(e.status, "unknown field(s) 'nodes'" in e.reason) for e in excluded] == [("unreadable", True)]


@pytest.mark.parametrize("text, problem", [("{not json", "is not valid JSON"), ("[1, 2]", "expected a JSON object")])
def test_a_plan_json_that_is_no_json_object_is_refused(tmp_path, text, problem):
    (tmp_path / rundir.PLAN).write_text(text)
    with pytest.raises(RunFolderError, match=problem):
        RunPlan.load(tmp_path)


def test_rundir_and_events_import_nothing_from_restartbench():
    """Leaf modules: every layer may read the run folder through them."""
    for module in ("rundir", "events"):
        tree = ast.parse((ROOT / "restartbench" / f"{module}.py").read_text())
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert [name for name in imported if name and name.startswith("restartbench")] == [], module


# -- event names -----------------------------------------------------------------------------------------------


def test_the_scan_finds_quoted_event_names_only():
    text = """log.emit("checkpoint.save") x == 'restore.load' ``phase.end`` "train.stdout.log" "restartbench.train" """
    assert event_literals(text) == ["checkpoint.save", "restore.load"]


def test_every_event_name_spelled_in_the_sources_is_a_known_event():
    unknown = {path: sorted(set(names) - EVENT_NAMES) for path, names in literals_by_file().items()}
    assert {path: names for path, names in unknown.items() if names} == {}


def test_event_names_are_spelled_only_where_they_are_defined():
    """Writers and readers use restartbench.events.Event; a new string literal of an event name fails here."""
    assert set(literals_by_file()) - {DEFINED_IN} == set()


def test_every_event_is_documented_in_the_run_folder_page():
    """docs/run-folder.md, linked from the README, has the table of events."""
    page = (ROOT / "docs" / "run-folder.md").read_text()
    assert sorted(name for name in EVENT_NAMES if f"`{name}`" not in page) == []


# -- the event reader ------------------------------------------------------------------------------------------


def _write(run_dir: Path, phase: str, rank: int, *names: str) -> None:
    log = EventLog(run_dir, phase, rank)
    for step, name in enumerate(names):
        log.emit(name, step=step)
    log.close()


def test_each_rank_of_each_phase_writes_its_own_file(tmp_path):
    assert events_file(tmp_path, "train", 3) == tmp_path / "events" / "train-rank00003.jsonl"
    _write(tmp_path, "train", 3, "phase.end")
    assert [json.loads(line)["event"] for line in events_file(tmp_path, "train", 3).read_text().splitlines()] == [
        "phase.end"]


def test_the_reader_selects_by_phase_and_rank(tmp_path):
    for phase in ("train", "restore"):
        for rank in (0, 1, 10):
            _write(tmp_path, phase, rank, "phase.end")
    every = [(e["phase"], e["rank"]) for e in read_events(tmp_path)]
    assert every == [(p, r) for p in ("restore", "train") for r in (0, 1, 10)]  # file by file, in name order
    assert [(e["phase"], e["rank"]) for e in read_events(tmp_path, "train")] == [("train", r) for r in (0, 1, 10)]
    assert [(e["phase"], e["rank"]) for e in read_events(tmp_path, "restore", 1)] == [("restore", 1)]
    assert [(e["phase"], e["rank"]) for e in read_events(tmp_path, rank=10)] == [("restore", 10), ("train", 10)]


def test_a_run_without_events_has_none(tmp_path):
    assert read_events(tmp_path) == [] and read_events(tmp_path, "train", 0) == []


def test_events_read_as_json_wrote_them_nan_and_big_integers_included(tmp_path):
    """The reader goes through orjson where it can and json where orjson refuses the text: a NaN and an integer
    beyond 64 bits, which json writes, come back as json reads them."""
    _write(tmp_path, "train", 0, "phase.end")
    path = events_file(tmp_path, "train", 0)
    event = {"event": "rank.resources", "phase": "train", "rank": 0, "time": 1.0, "rss_bytes": float("nan"),
             "threads": 2**70}
    path.write_text(path.read_text() + json.dumps(event) + "\n")
    read = read_events(tmp_path)[-1]
    assert read["rss_bytes"] != read["rss_bytes"] and read["threads"] == 2**70 and read["time"] == 1.0


def test_a_torn_last_line_is_refused_naming_file_and_line(tmp_path):
    _write(tmp_path, "train", 0, "phase.error")
    path = events_file(tmp_path, "train", 0)
    path.write_text(path.read_text() + '{"event": "phase.e')
    with pytest.raises(EventFileError, match=r"train-rank00000\.jsonl:2: not a JSON event line"):
        read_events(tmp_path)
