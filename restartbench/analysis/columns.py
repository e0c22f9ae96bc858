"""The columns of the analysis' tables and what each holds (the report's glossary): the tidy table (``TABLE_COLUMNS``),
the per-rank table (``RANK_COLUMNS``), the span and memory tables, the restart parts and the critical path's parts,
the setup columns that may vary within a configuration, and the units."""

from __future__ import annotations

from restartbench.results import HARNESS_CHECKS, RELAYOUT_CONVERSION, RESTART_PARTS

MB = 1e6
MiB = 2**20
FILE_KINDS = ("layer", "model", "optimizer", "other")

#: (tidy-table column, label) of each restart part, in launch order.
RESTART_PART_COLUMNS = [(f"restart_{label.replace(' ', '_')}_s", label) for _event, label in RESTART_PARTS]
#: The restart's critical path: the parts of the rank that was last ready to train (its first resumed iteration
#: started last; every rank waits for it there), in launch order. ``check files`` (the manifest check), ``cache``
#: (the page cache's eviction and measure before the load) and ``verify`` (the exactness check) are the harness's
#: own work (``HARNESS_PARTS``), ``gaps`` the time between spans; with ``1st iter`` they add up to the restart total.
#: Since 2026-12-07 every relaunch checks and evicts its checkpoint right after the distributed init, before the model
#: is built (earlier runs did it after the engine set-up, but with ``--lazy-prefetch``): the parts are in that order.
PATH_PARTS = ("launch", "imports", "dist init", "check files", "cache", "model build", "ds init", "engine setup",
              "convert", "ckpt load", "verify", "gaps", "1st iter")
#: The critical path's parts that are the harness checking itself, not what a training job's restart costs: a job
#: that checks nothing takes ``restart_less_checks_s`` (restart_s less these).
HARNESS_PARTS = tuple(label for _event, label in HARNESS_CHECKS)
PATH_COLUMNS = [(f"path_{label.replace(' ', '_')}_s", label) for label in PATH_PARTS]


def limit_columns(side: str, example: str) -> dict[str, str]:
    """The columns of ``side``'s storage limit (restartbench.analysis.baselines.BASELINE_COLUMNS) and what each
    holds."""
    return {
        f"baseline_{side}_MBps": f"the storage's {side} limit from baseline.json (10^6 B/s): the winning method's "
                                 "median over its repeats (a baseline without spread: its one figure)",
        f"baseline_{side}_best": f"the method that won the {side} limit (baseline.json's {side}_best, e.g. {example}; "
                                 "None for a baseline without spread: an older baseline.json, or an object store's)",
        f"baseline_{side}_n": f"passes of the winning {side} method (1 for a run's own baseline: one repeat)",
        f"baseline_{side}_min_MBps": f"the winning {side} method's slowest pass (10^6 B/s; None without spread)",
        f"baseline_{side}_max_MBps": f"the winning {side} method's fastest pass (10^6 B/s; None without spread): a "
                                     f"{side} throughput above it is a defect ({side}_limit)",
    }


#: Columns of the tidy table and what each holds (also the glossary of the report).
TABLE_COLUMNS: dict[str, str] = {
    "run_id": "run folder relative to the collected root",
    "run": "run folder path",
    "kind": "checkpoint (one row per checkpoint tag) or restart (one row per restore attempt of a run)",
    "preset": "model preset", "layout": "canonical parallel layout", "tp": "tensor parallel",
    "pp": "pipeline parallel", "dp": "data parallel", "engine": "checkpoint engine",
    "engine_options": "the engine's own options the run set away from their defaults on its device, as "
                      "config-n-run.py's words ('--lazy-chunk-mb 8'; '--no-lazy-direct-io' for a buffered lazy run "
                      "on CUDA; '' for none): runs of one engine with other options are other configurations",
    "dtype": "training precision", "storage": "checkpoint folder given by --checkpoint-dir, else 'run folder'",
    "client": "object-store client the checkpoints went through (s3torchconnector or fsspec); None for a folder",
    "ranks": "world size", "nodes": "nodes", "device": "cpu or cuda", "backend": "gloo or nccl",
    "gpu": "GPU model (runtime.json)", "host": "host of rank 0", "started": "run start (UTC)",
    "torch": "torch version", "deepspeed": "DeepSpeed version", "python": "Python version",
    "restartbench": "restartbench version",
    "iters": "phase-1 iterations", "save_interval": "checkpoint every N iterations",
    "iteration_s": "the clean median: median phase-1 iteration time (max over ranks per step, step 1 left out) over "
                   "the iterations that overlapped no checkpoint's background work",
    "predicted_bytes": "one checkpoint's bytes as restartbench.plan predicts the run's engine's files for its config "
                       "(engines without a prediction: DeepSpeed's default engine's)",
    **limit_columns("write", "write-direct-libaio-qd16-4M"),
    **limit_columns("read", "read-direct-libaio-qd32-1M"),
    "baseline_tool": "tool that measured the baseline",
    "tag": "checkpoint tag (restart: the tag restored; None = nothing restored, engine none)",
    "step": "iteration after which the checkpoint was taken",
    "ranks_saved": "ranks that recorded a save of this tag",
    "stall_max_s": "training stall: max over ranks of the time save blocked training",
    "stall_min_s": "min over ranks of the save time", "stall_median_s": "median over ranks of the save time",
    "stall_rank": "rank with the longest save",
    "stall_iterations": "stall_max_s / iteration_s",
    "stall_overhead_pct": "share of training time lost to stalls at this save interval: "
                          "stall / (save_interval · iteration + stall)",
    "overlapped_iterations": "iterations that overlapped this checkpoint's background work on some rank (from the end "
                             "of save to the rank's files durable; each iteration counted for the earliest checkpoint "
                             "it overlapped). 0 for a synchronous engine, and for phase 1's last save, whose "
                             "background work the harness waits for at the end of training (not training time)",
    "slowdown_s": "sum over the overlapped iterations of (iteration time - iteration_s), an iteration's time being its "
                  "max over ranks less any lazy copy wait in it (already in the stall); 0 by construction for a "
                  "synchronous engine (the harness waits for durability before the next iteration)",
    "cost_s": "the checkpoint's whole cost to training: stall_max_s + slowdown_s (a negative slowdown, noise, adds "
              "nothing)",
    "background_seen": "True where on every rank training went on after the save and the files were durable before "
                       "the harness began waiting for them: the background work ended while training ran, so "
                       "slowdown_s covers it; False for phase 1's last save (waited for after training) and where the "
                       "harness waited while the work still ran (a synchronous engine's wait; an asynchronous save "
                       "still writing at the next save: the rest is in wait_durable_max_s, not in slowdown_s)",
    "wait_durable_max_s": "max over ranks of the time the harness waited for durability",
    "durable_rank_max_s": "durable: max over ranks of the checkpoint's start (its first rank's save start) -> the "
                          "rank's files fsync'd",
    "durable_rank_min_s": "min over ranks of the checkpoint's start -> files fsync'd",
    "durable_rank": "rank durable last",
    "committed_s": "the checkpoint's start -> rank 0 wrote latest (after every rank was durable: one clock, so never "
                   "below durable_rank_max_s)",
    "bytes": "bytes of the checkpoint, all ranks", "files": "files of the checkpoint, all ranks",
    "bytes_per_rank_max": "largest bytes written by one rank",
    "bytes_per_rank_min": "smallest bytes written by one rank",
    "files_per_rank_max": "most files written by one rank", "files_per_rank_min": "fewest files written by one rank",
    "write_MBps": "bytes / durable_rank_max_s (10^6 B/s)",
    "write_pct_of_storage": "write_MBps as a share of the storage's write limit (baseline.json: the winning fio "
                            "method's median for a folder, a plain multipart upload for S3), percent",
    "write_limit": "the judgement of write_MBps against the limit's spread: None up to the winning method's max "
                   "(baseline_write_max_MBps); above it \"defect: above the limit's max\" (no engine writes faster "
                   "than the disk: the figure or the limit is wrong; a finding says what to look at); a baseline "
                   "without spread (an older baseline.json) keeps the rule from before issue 26: 'limit "
                   "underestimated' above 105 % of the limit",
    "save_MiBps": "seed 000's save throughput: bytes / durable_rank_max_s in MiB/s (2^20 B/s); durable_rank_max_s "
                  "is its 'corrected' save duration (save start -> fsync'd, no model set-up or device load in it)",
    "attempt": "restore attempt: 1 is the run's own restore, 2, 3... its restore-only relaunches (--restore)",
    "verdict": "how the attempt ended: exact, not exact, not verified (verification off, or engine none), refused (a "
               "damaged checkpoint, none to restore: no restart time), failed (no restart time) or skipped (the "
               "engine cannot restart on the layout asked for: skip_reason)",
    "requested_tag": "the checkpoint the attempt asked for with --tag (None: the one 'latest' names)",
    "restore_peak_rss_bytes": "the restart's peak host memory: the largest RSS any rank had in any restart part "
                              "(sampled at 100 Hz by restartbench.memwatch; a shorter spike can be missed)",
    "peak_rss_part": "the restart part the peak came in",
    "ds_init_parts": "deepspeed.initialize in DeepSpeed's own stages, {stage: seconds}, each the max over ranks, with "
                     "'collective wait' (time inside collectives: mostly waiting for slower ranks) and 'other' "
                     "(restartbench.ds_init_timing; ds_init_summary gives the medians)",
    "train_peak_rss_bytes": "steady training's peak host memory: the largest RSS of any rank in a phase-1 iteration",
    "resume_spike": "restore_peak_rss_bytes / train_peak_rss_bytes: above 1, resuming needs more host memory than "
                    "training (where jobs run out of memory on resume)",
    "fell_back_from": "the checkpoint the attempt wanted but found damaged, restoring an earlier one instead",
    "restart_s": "restart: max over ranks of launch -> end of the first resumed iteration",
    "restart_min_s": "fastest rank's launch -> end of the first resumed iteration",
    "restart_rank": "slowest rank of the restart",
    "restart_less_checks_s": "what the restart takes without the harness's own checks (manifest check, page-cache "
                             "eviction, exactness proof): a job that checks nothing. restart_s less the critical "
                             "rank's path_check_files_s, path_cache_s and path_verify_s (a run without those spans, "
                             "older runs or engine none, less what it has)",
    **{column: f"restart part '{label}', max over ranks" for column, label in RESTART_PART_COLUMNS},
    "path_rank": "the restart's critical rank: the last one ready to train (everyone waits for it in the first "
                 "iteration)",
    **{column: f"critical path: '{label}' of the critical rank (the path parts add up to restart_s)"
       for column, label in PATH_COLUMNS},
    "path_ds_init_parts": "the critical rank's deepspeed.initialize in its stages, {stage: seconds}, with 'collective "
                          "wait' and 'other' (they add up to the time the call was timed: path_ds_init_s less what "
                          "the span does around it, reading ds_config.json)",
    "restores_checkpoint": "False for engine none: a relaunch that restores nothing (the start-up floor)",
    "bytes_read": "bytes the restore read, all ranks, as the engines report them",
    "files_read": "files the restore read, all ranks",
    "process_bytes_read": "bytes the ranks' processes read during the load, all ranks, as the kernel counted them "
                          "(rchar of /proc/self/io: also what an engine reads outside its reported files, such as "
                          "DeepSpeed's universal load; page cache hits included)",
    "read_deserialize_max_s": "max over ranks of time inside the engine's file reads (read + deserialize)",
    "read_MBps": "bytes_read / the read's time (10^6 B/s): the ckpt load's, or where the engine read during "
                 "start-up (prefetched) that read's own time, prefetch_read_s",
    "prefetched": "the engine read the checkpoint from before the model build (--lazy-prefetch) and the load took "
                  "it from there, on every rank: restart_ckpt_load_s then holds the load's wait and copy-out only",
    "prefetch_read_s": "a prefetched load: the early read's own time, first piece asked to last in (max over ranks; "
                       "it ran beside the model build and deepspeed.initialize)",
    "prefetch_wait_s": "a prefetched load: how long the load still waited for the early read (max over ranks)",
    "read_limit": "the judgement of read_MBps against the limit's spread: None up to the winning method's max "
                  "(baseline_read_max_MBps); above it \"defect: above the limit's max\" on a restore that was not "
                  "warm (the engine read from memory though the restore was meant cold, or the limit did not measure "
                  "the disk; a finding says what to look at), 'warm cache' on a warm one (memory answered, not the "
                  "disk); a baseline without spread (an older baseline.json) keeps the rule from before issue 26: "
                  "'limit underestimated' above 105 % of the limit",
    "read_pct_of_storage": "read_MBps as a share of the storage's read limit (baseline.json: the winning method's "
                           "median), percent; above the limit's max only from a warm page cache or a defect",
    "load_MiBps": "seed 000's load throughput: bytes_read / restart_ckpt_load_s in MiB/s; restart_ckpt_load_s is its "
                  "'corrected' load duration (no process set-up or model build in it); a prefetched load's read "
                  "time instead (read_MBps)",
    "cache": "page cache of the checkpoint when the restore began, measured with mincore on every node: cold (no "
             "byte resident) or warm (some bytes may be served from memory)",
    "resident_fraction": "largest share of the checkpoint's pages resident in any node's page cache at restore start",
    "exact": "restore verified exact (None: not verified or nothing restored)",
    "restore_layout": "the layout the restart ran on: the run's own, or another (--restore-layout: proved on the "
                      "consolidated state, see restartbench.consolidated)",
    "loss_diff": "a restart on another layout: iteration K+1's loss less the uninterrupted run's (reduction order "
                 "changes with tp and dp; None on the run's own layout, where the loss must be equal)",
    **{f"convert_{name}": f"the engine's offline conversion for another layout (rank 0): {name.replace('_', ' ')}"
       for name in RELAYOUT_CONVERSION},
    "skip_reason": "a restart the engine cannot make on another layout (verdict skipped, nothing launched): why",
}

RANK_COLUMNS: dict[str, str] = {
    "run_id": "run folder relative to the collected root", "kind": "checkpoint or restart", "tag": "tag",
    "attempt": "restore attempt (restart rows)", "rank": "rank",
    "stall_s": "time the checkpoint blocked training on this rank: save, plus copy_wait_s",
    "copy_wait_s": "time training later waited (at the optimizer step) for a lazy save's copies to finish",
    "wait_durable_s": "time waited for this rank's files to be durable",
    "durable_s": "the checkpoint's start (its first rank's save start) -> this rank's files fsync'd",
    "bytes": "bytes written by this rank",
    "files": "files written by this rank", "restart_s": "launch -> end of this rank's first resumed iteration",
    "check_files_s": "this rank's manifest check of the checkpoint's files (restore.check_files, every check summed)",
    "cache_s": "this rank's page-cache preparation before the load (restore.cache: eviction and mincore measure)",
    "verify_s": "this rank's exactness check (restore.verify)",
    "bytes_read": "bytes this rank read", "files_read": "files this rank read",
    "read_deserialize_s": "time inside this rank's file reads",
    "ds_init_parts": "this rank's deepspeed.initialize in its stages, {stage: seconds}, with 'collective wait' and "
                     "'other' (restartbench.ds_init_timing)",
}

#: Columns of ``span_table()``: one row per restore attempt, rank and span.
SPAN_COLUMNS: dict[str, str] = {
    "run_id": "run folder relative to the collected root", "preset": "model preset", "layout": "parallel layout",
    "engine": "checkpoint engine", "attempt": "restore attempt", "rank": "rank",
    "part": "the restart part (launch, imports, dist init, model build, ds init, engine setup, ckpt load, 1st iter) "
            "or verify (the harness's exactness check)",
    "start_s": "seconds from the rank's launch to the span's start (the restart's clock)",
    "end_s": "seconds from the rank's launch to the span's end",
    "start_rss_bytes": "the rank's host RSS as the span began (None for launch: before the process ran)",
    "peak_rss_bytes": "the largest host RSS sampled during the span (restartbench.memwatch, unthinned)",
}

#: Columns of ``memory_table()``: one row per restore attempt, rank and memory sample.
MEMORY_COLUMNS: dict[str, str] = {
    "run_id": "run folder relative to the collected root", "preset": "model preset", "layout": "parallel layout",
    "engine": "checkpoint engine", "attempt": "restore attempt", "rank": "rank",
    "t_s": "seconds from the rank's launch (the restart's clock: the span table's and the restart parts')",
    "rss_bytes": "the process's host RSS (/proc/self/statm) at that time",
    "part": "the span of span_table the sample fell in (None: between spans)",
    "resolution_s": "the sampling interval; the timeline the rank recorded keeps an even selection of the samples",
}

SETUP_KEYS = ("dtype", "device", "storage", "client", "nodes", "engine_options")
