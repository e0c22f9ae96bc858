"""The memory watch sees a part's peak, even one gone by the time the part ends, and puts it on the part's span."""

import time

from restartbench.events import EventLog, read_events
from restartbench.memwatch import SAMPLE_INTERVAL_S, MemoryWatch, rss_bytes

MiB = 2**20


def test_a_span_records_the_peak_of_memory_freed_before_it_ended(tmp_path):
    watch = MemoryWatch().start()
    log = EventLog(tmp_path, "restore", 0, watch=watch)
    try:
        before = rss_bytes()
        with log.span("restore.load"):
            block = b"\x01" * (256 * MiB)  # written: every page resident (a calloc'd one may not be)
            time.sleep(10 * SAMPLE_INTERVAL_S)
            del block
            time.sleep(10 * SAMPLE_INTERVAL_S)
            after_free = rss_bytes()
        with log.span("train.iteration", step=1):
            time.sleep(5 * SAMPLE_INTERVAL_S)
    finally:
        watch.stop()
        log.close()
    load, iteration = read_events(tmp_path, "restore")
    assert after_free < before + 64 * MiB, "the block is given back (else the test proves nothing)"
    assert load["peak_rss_bytes"] >= before + 200 * MiB and load["rss_resolution_s"] == SAMPLE_INTERVAL_S
    assert iteration["peak_rss_bytes"] < before + 64 * MiB, "a later part does not inherit the earlier peak"


def test_the_timeline_is_thinned_and_relative_to_its_start():
    watch = MemoryWatch(interval_s=0.001).start()
    start = time.time()
    time.sleep(0.6)
    watch.stop()
    timeline = watch.timeline(start)
    assert 50 <= len(timeline) <= 400
    assert all(0 <= t < 1 and rss > 0 for t, rss in timeline) and timeline == sorted(timeline)
