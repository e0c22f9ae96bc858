"""The report's words: each figure's heading and caption (``FIGURES``, in the page's order) and the definitions of
what is measured (``DEFINITIONS``)."""

from __future__ import annotations

FIGURES: dict[str, tuple[str, str]] = {
    "checkpoint_cost": ("Checkpoint stall, whole cost and durable time per engine",
                        "For each preset and layout, three bars per engine. <b>Stall</b> (solid) is what training "
                        "waited for <code>save</code>: the time it blocked the training loop, taken as "
                        "the <b>max over ranks</b> (the slowest rank holds everyone up at the next collective). "
                        "<b>Whole cost</b> (dotted) adds the <b>slowdown</b>: what the iterations that overlapped the "
                        "save's background work (an asynchronous engine's copy and write, from the end of save until "
                        "the rank's files were durable) took beyond the clean median iteration; a synchronous engine "
                        "has none, since the harness waits for durability before the next iteration. It is the median "
                        "stall plus the median slowdown of the checkpoints whose background work training saw end "
                        "(phase 1's last save is waited for after training, so it shows none). "
                        "<b>Durable</b> (hatched) runs from the start of the save until the rank's files were fsync'd "
                        "to stable storage (for an asynchronous engine: its background write finished), again the max "
                        "over ranks. Bars are medians over checkpoints and runs, whiskers the min–max; each dot is "
                        "one rank of one checkpoint, so the per-rank spread stays visible."),
    "restart_phases": ("Restart time as stacked phases",
                       "From the relaunch of the job to the end of the first resumed iteration. The bars follow the "
                       "<b>critical path</b>: the parts of the last rank ready to train (every rank waits for it in "
                       "the first iteration, a collective), so they add up to the total (diamond: the max over ranks "
                       "of launch → end of first iteration); medians over runs. The table below gives each part's max "
                       "over ranks instead. Only the orange part (ckpt load: read, deserialize, copy into model and "
                       "optimizer) depends on the checkpoint; the blue parts are start-up any relaunch pays; "
                       "<i>verify</i> is the harness's exactness check and <i>gaps</i> the time between measured "
                       "spans. Engine <code>none</code> restores nothing: its bar is the <b>start-up floor</b> (dashed "
                       "line). Each label gives the restore's page-cache state (<code>cache</code> field of the "
                       "<code>restore.load</code> event): <i>warm</i> means the files may have come from memory. "
                       "The thin strip under <i>ds init</i> splits <code>deepspeed.initialize</code> into DeepSpeed's "
                       "own set-up stages as the critical rank timed them (<code>restartbench/ds_init_timing.py</code>;"
                       " each stage its own time, nested stages taken out), in purples the five slowest stages and "
                       "the rest of them, in grey the call's time in no timed stage, hatched red the time spent inside "
                       "collectives (barrier, broadcast, <code>new_group</code>...): mostly waiting for slower ranks, "
                       "not work. The strip gives each stage's share of the bar (medians over runs; a label its "
                       "median)."),
    "restart_memory": ("Host memory during the restart",
                       "What the restart holds in host memory from the relaunch to the end of the first resumed "
                       "iteration: each rank's resident set size (RSS, <code>/proc/self/statm</code>, sampled by a "
                       "thread of the rank, <code>restartbench/memwatch.py</code>) as a grey line, their <b>max over "
                       "ranks</b> in black, for the restore attempt nearest each configuration's median restart. The "
                       "shaded spans are the restart parts of the critical rank (the one the restart figure's bar "
                       "follows; a part too short to shade is a line). A rank records its timeline thinned to at most "
                       "a few hundred points, so a spike shorter than the gap between two points can be missing from "
                       "the lines; the dotted line is the restart's peak from every sample (the largest span peak of "
                       "any rank and part, named). The dashed red line is steady training's peak: the largest RSS of "
                       "any rank in a phase-1 iteration. A restart peak above it is memory that resuming needs and "
                       "training does not (where jobs run out of memory on resume). Host memory only: a GPU's memory "
                       "is not in it. Each title gives the restore's page-cache state (cold or warm)."),
    "files_per_rank": ("Files and bytes per rank",
                       "Bytes each rank wrote for one checkpoint (the last of the latest run), split by file kind, "
                       "with the number of files above the bar. Uneven bars show which ranks carry the I/O (for "
                       "example data-parallel rank 0 writing all the weights)."),
    "throughput": ("Throughput against the storage baseline",
                   "Checkpoint write throughput = all ranks' bytes / durable time (max over ranks); restore read "
                   "throughput = bytes read / ckpt load time. Dashed lines: the storage's limit from a "
                   "<code>baseline.json</code> (e.g. fio) in the run folder or a parent folder, where one exists: "
                   "the median of the method that won; the table below names that method and its spread."),
    "checkpoint_size": ("Predicted against measured checkpoint size",
                        "The prediction made before launching (<code>python -m restartbench.plan</code>: every file "
                        "the run's engine writes for this preset and layout, from the engine's own code on "
                        "shape-only tensors) against the files actually written. Engines without a prediction "
                        "(decoupled, datastates) are set against DeepSpeed's default engine's. The weights/optimizer "
                        "split uses the rough rule parameters × weight bytes and parameters × 12 bytes."),
    "goodput": ("Goodput: the checkpoint interval the measurements imply",
                "Young and Daly's first-order model (<code>restartbench/goodput.py</code>): failures arrive at a "
                "constant rate F per GPU-hour on G GPUs, so the job's mean time between failures is M = 1/(F·G); "
                "each checkpoint costs training C, and a failure loses half a checkpoint period of work plus the "
                "restart R. Shares of wall time at interval τ: checkpoints C/(τ+C), re-done work (τ+C)/2M, restarts "
                "R/M; goodput is what is left. τ* is Daly's optimum √(2CM)·(1 + ⅓√(C/2M) + ⅑·C/2M) − C, never "
                "below one iteration. C is the <b>whole cost</b> of a checkpoint: its stall plus the slowdown of "
                "the iterations its background work overlapped (see the first figure). R is the restart as "
                "measured on this machine (max over ranks); on another machine or scale it differs."),
}


DEFINITIONS = """
<h2>What is measured</h2><dl class='defs'>
<dt>Stall</dt><dd>The time <code>save</code> blocked training on a rank (the <code>checkpoint.save</code> span); a
checkpoint's stall is the <b>max over ranks</b>, since the slowest rank holds the others at the next collective.
This is what training actually waited.</dd>
<dt>Slowdown and whole cost</dt><dd>After an asynchronous engine's <code>save</code> returns, its copy and write go
on in the background until the rank's files are durable, and slow the iterations they overlap. A checkpoint's
<b>slowdown</b> is the sum, over those iterations, of their time (max over ranks) beyond the clean median iteration
(the iterations that overlapped no save's work); its <b>whole cost</b> is the stall plus the slowdown, and is the C
of the goodput. A synchronous engine's slowdown is 0: the harness waits for durability before the next
iteration.</dd>
<dt>Durable</dt><dd>From the start of the save until that rank's files were on stable storage (fsync'd; for an
asynchronous engine, when its background write finished); the <b>max over ranks</b>. Until then a crash can lose the
checkpoint.</dd>
<dt>Committed</dt><dd>When rank 0 wrote <code>latest</code>, after every rank was durable: from then on a restart
uses this checkpoint.</dd>
<dt>Restart</dt><dd>The <b>max over ranks</b> of launch → end of the first resumed iteration, with each part
(launch, imports, distributed init, model build, <code>deepspeed.initialize</code>, checkpoint load, first iteration)
also its max over ranks in the tables. The figure stacks the parts of the critical rank (the last one ready to train),
which add up to the total.</dd>
<dt>Page cache</dt><dd>The <code>cache</code> field of the restore, measured (<code>mincore</code>) on every node
just before the load: <i>cold</i> means no byte of the checkpoint was in memory, so every read came from the storage;
<i>warm</i> means some bytes were (<code>resident_fraction</code> says how much): either \
<code>--restore-cache warm</code>
was asked for, or the storage keeps files in memory (tmpfs, /dev/shm) and eviction could not take them out.</dd>
<dt>Throughput</dt><dd>All ranks' bytes of a checkpoint over its durable time (write), bytes read over the load time
(restore); MB = 10<sup>6</sup> bytes.</dd>
<dt>Per-rank spread</dt><dd>Kept, not averaged away: dots in the stall figure, the spread columns below and
<code>ranks.csv</code>.</dd></dl>
"""
