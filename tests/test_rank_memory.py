"""Memory on resume, from the rank side (issue 18): every span of a real run's phases records its peak host RSS,
each phase ends with the rank's memory timeline, and deepspeed.initialize is broken into its stages."""

import json
import mmap
import time

import pytest

from restartbench.events import Event, EventLog, read_events
from restartbench.memwatch import SAMPLE_INTERVAL_S, MemoryWatch
from restartbench.rankwatch import RankWatch

RESTART_PARTS = (Event.STARTUP_IMPORTS, Event.STARTUP_DIST_INIT, Event.STARTUP_MODEL_BUILD,
                 Event.STARTUP_DS_INITIALIZE, Event.STARTUP_ENGINE, Event.RESTORE_LOAD, Event.TRAIN_ITERATION)


def test_on_cpu_the_rank_watch_adds_nothing_to_the_host_figures(tmp_path):
    """Without watch_cuda (a CPU run) a span has the host figures only, torch untouched; nested spans each get
    their own start and a peak at least that start."""
    watch = RankWatch(MemoryWatch().start())
    log = EventLog(tmp_path, "train", 0, watch=watch)
    try:
        with log.span(Event.CHECKPOINT_SAVE, step=1, tag="step1"):
            with log.span(Event.CHECKPOINT_WORKAROUND):
                block = _fresh_resident_block(64 * 2**20)
                time.sleep(5 * SAMPLE_INTERVAL_S)
            block.close()
    finally:
        watch.host.stop()
        log.close()
    inner, outer = read_events(tmp_path, "train")
    for span in (inner, outer):
        assert set(span) >= {"peak_rss_bytes", "start_rss_bytes", "rss_resolution_s"}
        assert "cuda_max_allocated_bytes" not in span
        assert span["peak_rss_bytes"] >= span["start_rss_bytes"] and span["rss_resolution_s"] == SAMPLE_INTERVAL_S
    assert inner["peak_rss_bytes"] >= inner["start_rss_bytes"] + 60 * 2**20
    assert outer["peak_rss_bytes"] >= inner["peak_rss_bytes"] - 2**20, "the outer span saw the inner one's block"


def _fresh_resident_block(size: int) -> mmap.mmap:
    """``size`` bytes of new anonymous memory, every page written, so resident. Not a bytes object: malloc may serve
    that from a free stretch of a long-lived process's heap whose pages are resident already, and RSS would not move
    (it did not, in the full suite's pytest process at 970 MB)."""
    block = mmap.mmap(-1, size)
    for offset in range(0, size, mmap.PAGESIZE):
        block[offset] = 1
    return block


@pytest.mark.multirank
def test_a_real_run_records_memory_on_every_span_and_the_timeline_of_each_phase(tiny_dp2_run):
    run_dir = tiny_dp2_run
    assert json.loads((run_dir / "metadata.json").read_text())["status"] == "complete"
    for record in ("train", "restore"):
        events = read_events(run_dir, record)
        spans = [e for e in events if "duration_s" in e and e["event"] != Event.PROCESS_START]
        assert spans and all(e["peak_rss_bytes"] >= e["start_rss_bytes"] > 0 for e in spans), record
        memory = [e for e in events if e["event"] == Event.RANK_MEMORY]
        assert sorted(e["rank"] for e in memory) == [0, 1], record
        for entry in memory:
            times = [t for t, _ in entry["timeline"]]
            assert len(times) > 10 and times == sorted(times) and times[0] >= 0
            assert entry["peak_rss_bytes"] >= max(rss for _, rss in entry["timeline"])
            assert entry["resolution_s"] == SAMPLE_INTERVAL_S
    restore = read_events(run_dir, "restore")
    for rank in (0, 1):
        mine = {e["event"]: e for e in restore if e["rank"] == rank}
        for part in RESTART_PARTS:
            assert mine[part]["peak_rss_bytes"] > 0 and mine[part]["rss_resolution_s"] == SAMPLE_INTERVAL_S, part
        load = mine[Event.RESTORE_LOAD]
        assert load["peak_rss_bytes"] >= load["start_rss_bytes"]
        assert mine[Event.STARTUP_ENGINE]["engine"] == "torch" and "pinned_bytes" not in mine[Event.STARTUP_ENGINE]
        initialize = mine[Event.STARTUP_DS_INITIALIZE]
        assert {"zero_optimizer", "configure_optimizer", "distributed_model"} <= set(initialize["parts"])
        assert "broadcast" in initialize["collectives"] and initialize["other_s"] >= 0
        assert (sum(initialize["parts"].values()) + initialize["collective_wait_s"] + initialize["other_s"]
                <= initialize["duration_s"] + 1e-3)
