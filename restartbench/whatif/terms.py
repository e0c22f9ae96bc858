"""The cost model's terms, each a function of what it scales with, with its form and why.

Notation. ``Job`` says what a term scales with for one preset, layout, engine and cluster: the busiest rank's bytes
and files (``restartbench.plan``), the node's bytes and files, the ranks doing I/O at once on a node
(``concurrency``), the ranks and nodes, parameters per rank, and the tensors a rank holds and writes
(``restartbench.whatif.tensors``). ``Line`` holds a term's fitted constants: an intercept
and one coefficient per regressor (``restartbench.whatif.fit`` fits them on the study's run folders), with the
spread of the calibration's relative residuals, which gives every prediction its range. What sets one engine's
form apart (a pageable copy, a collective save, an asynchronous write, a side stream, a per-tensor cost, who writes
the stage module) is its registry entry's ``CostTraits`` (``restartbench.engines.base``), in the engine's folder.

Checkpoint:

- ``stall``: save blocks training while the busiest rank's state goes through the engine's blocking path:
  a device-to-host copy (on cuda; pinned for the engines that stage into a reused pinned buffer, pageable for
  ``torch.save`` of device tensors) plus the engine's host-side work, ``c·(a + f·files_rank + bytes_rank / r)``
  (serialisation, or the staging copy, at ``r`` bytes per second per process; per file a fixed cost: create, header,
  plan). Host-side rates are the calibration machine's (an assumption where the target's CPUs differ). An engine that
  saves one item per tensor (``per_tensor``: DCP plans, deduplicates and ``torch.save``s each tensor on its own) adds
  ``+ t·tensors_written``, a cost per tensor the rank writes (``restartbench.whatif.tensors`` says why and how they
  are counted). A ``side_stream`` engine on cuda (the lazy engine: its copies into its pinned buffer run on a CUDA
  side stream, and only the optimizer step after them waits for them) blocks for ``c·(a + f·files_rank)`` alone: its
  bytes go by the D2H copy, beside training, which is its host-side staging copy on cpu.
- ``durable``: the node's bytes go to storage at the node's bandwidth ``L`` (``node_write_limit``: the local disk, or
  the least of the shared file system's aggregate share per node, its per-client cap and the NIC), of which the
  engine reaches a fraction ``η`` (fitted against this machine's measured limit), plus a cost per file and a cost
  per rank, paid once for each of the ``k`` ranks a process handles one after another (``Job.sequential``: an
  emulated run's --ranks-per-process; 1 for real ranks): ``a·k + f·files_node/concurrency + bytes_node / (η·L)``.
  For a synchronous engine this includes the stall. A ``per_tensor`` engine adds ``+ t·k·tensors_written``: each
  rank's tensors cost their planning and serialisation on its own process, the ranks of one process in turn.
- ``slowdown``: an asynchronous engine's background work slows the iterations it overlaps by a fraction ``σ``
  of its duration: ``σ · (durable − stall)``; 0 for a synchronous engine (training waits). A ``side_stream`` engine
  on cuda adds its D2H copy whole, ``D2H + σ · (durable − stall − D2H)``: the copies share the GPU with the
  iterations they overlap, and the first optimizer step after them waits for what is left (an upper bound where
  the iteration's compute hides them: on one H100 at 1B, 1.0-1.2× the D2H at iterations of 0.18-0.20 s, 0.26× at
  0.38 s; bench/results/*-h100-gpu-engines-1B-lazy*.json).
- ``coordinator``: a ``collective`` engine's save (DCP) has its coordinator gather every rank's plan, deduplicate them
  and build the index alone while the other ranks wait: ``c·u·items_planned``, ``u`` the calibration machine's
  seconds per item planned (its ``collective planner`` probe, ``restartbench.engines.dcp.coordinator``). It grows with
  the ranks: 48,832 items at 70B tp8pp8dp8, 1.56 million at dp 256 (16,384 GPUs). In the stall of a synchronous
  engine, and in the durable time of both (an asynchronous engine plans on its save's thread). The fitted lines hold
  the calibration runs' own coordinator (a few hundred items: milliseconds). A load's coordinator (``dcp.load``
  gathers every rank's read plan and scatters it back) adds ``c·u_load·items_planned`` to the checkpoint load.
- whole cost = stall + slowdown.

CPU share (``cpu_share_factor``): the stall's host-side line and the start-up parts named in ``CPU_BOUND`` are CPU
work in each process (serialising, importing, building and initialising the model, the harness's Python between the
spans). With ``P`` processes on a node of ``C`` cores each gets about ``min(1, C/P)`` of a core, so each such time is
``max(1, P/C)`` × its time with a core of its own: the fit divides every calibration run's measured time by the run's
own factor (its processes per node, the calibrating machine's cores), the prediction multiplies by the target's.
On this study's 2-core machine the real runs of 4 ranks took about twice as long as those of 2 in each of these
parts (imports 7.0 s against 2.7-3.4 s, ds init 8.5 s against 2.0-3.0 s; torch's stall per byte twice as long);
``launch`` (the launcher, one process until it spawns the ranks: 2.9 s at 4 ranks, 2.4-2.5 s at 2) and the
iteration ratio (both of one run's iterations share its cores alike) are left as they are; so is the D2H copy (the
copy engine's), the durable line (the disk's: its bytes at the limit) and the load (its bytes through the node's read
limit; the share of the rank's deserialisation in it is not separated). On a GPU cluster (a rank per GPU, tens of
cores per GPU) the factor is 1.

Restart (each part by what it scales with):

- ``launch`` and ``imports``: a constant per process (the launcher, Python and the libraries: no dependence on the
  model); measured here; imports ``c·a`` (``c`` the CPU share factor, above). Imports from a shared file system at
  scale are not modelled.
- ``dist init``: ``c·(a + b·ranks)`` up to the calibrated world size; beyond it the rendezvous dominates and grows with
  the ranks that connect to one TCPStore server: the cited anchor's seconds per rank (assumed linear).
- ``model build``: ``c·(a + b·params_per_rank)`` (allocating and initialising the rank's weights).
- ``ds init``: ``c·(a + b·params_per_rank)`` (ZeRO's flat buffers and partitions, the optimizer's state).
- ``engine setup``: ``c·a + host_buffer_bytes / pin_rate`` (the lazy engine pins a buffer as large as the rank's
  optimizer state; on cpu nothing is pinned and the fitted ``a`` stands).
- ``ckpt load``: ``a + f·files_rank + held_rank·concurrency / (η·R)``: the rank's share of the node's read bandwidth
  ``R``, of which the engine reaches ``η`` (reads, deserialisation and copies into place together); ``held_rank`` is
  what the rank reads: what it holds (the busiest writer's bytes; for DCP, whose ranks write shares of the stage
  module, all of it and the whole ``.metadata``); a ``per_tensor`` engine adds ``+ t·tensors_rank``: it plans, seeks
  and deserialises every tensor the rank holds, those another data-parallel replica wrote included.
- a prefetched restart (the lazy engine's ``--lazy-prefetch``): the rank's files are read into its host buffer from
  just after the distributed init, beside the model build, ds init and engine set-up (``S``); the load then waits for
  what is left of the read and copies the tensors out: ``max(0, pin + load − copy − S) + copy``, where ``load`` is
  the line above (a read into the buffer and the copy out of it), ``copy = bytes_rank / d2h_pinned`` (the H2D from
  pinned memory on cuda, at the pinned D2H rate: 52.8 against 54.0 GB/s on the H100's probe; the memcpy on cpu, which
  a cpu cluster file gives as its d2h_pinned) and ``pin`` the buffer's pinning, moved from the engine set-up into the
  read (``prefetched_load_s``).
- ``1st iter``: ``k · iteration_s`` (the first iteration after a restore, with its warm-up, against a clean one).
- ``gaps``: the time between the timed spans (``c·a``: the harness's Python in each process).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from restartbench.engines import cost_traits
from restartbench.whatif.cluster import Cluster

GB = 1e9


@dataclass(frozen=True)
class Job:
    """What the terms scale with, for one preset, layout and engine on one cluster."""

    ranks: int
    """World size (GPUs)."""
    nodes: int
    """Nodes the ranks occupy."""
    concurrency: int
    """Ranks (processes) of one node doing checkpoint I/O at once."""
    bytes_rank: float
    """The busiest rank's checkpoint bytes (written at a save, read at a restore)."""
    files_rank: float
    """The busiest rank's checkpoint files."""
    bytes_node: float
    """The busiest node's checkpoint bytes."""
    files_node: float
    """The busiest node's checkpoint files."""
    params_rank: float
    """Parameters per rank: the model's parameters / (tp · pp)."""
    sequential: int = 1
    """Ranks each process handles one after another (an emulated run's --ranks-per-process; 1 for real ranks)."""
    tensors_rank: float = 0.0
    """The most tensors a rank holds (its stage module's and its optimizer's): what it plans and reads at a load."""
    tensors_written: float = 0.0
    """The most tensors a rank writes at a save (``restartbench.whatif.tensors``: DCP spreads the replicas' module
    tensors over them)."""
    items_planned: float = 0.0
    """The items every rank plans at a save of a collective engine (``restartbench.whatif.tensors.planned_items``),
    which its coordinator gathers and deduplicates alone, and as many at a load (a read of each); 0 for the others."""
    bytes_held: float | None = None
    """The most checkpoint bytes a rank reads into place at a load, where they are not ``bytes_rank``: a DCP rank
    holds its whole stage module, which its replicas wrote in shares, and reads the whole ``.metadata``."""

    @property
    def held_rank(self) -> float:
        """The most checkpoint bytes a rank reads at a load (``bytes_held``, else ``bytes_rank``)."""
        return self.bytes_rank if self.bytes_held is None else self.bytes_held


@dataclass(frozen=True)
class Line:
    """A term's fitted constants: ``value = intercept + Σ coefficient·regressor``."""

    intercept: float
    coefficients: dict[str, float] = field(default_factory=dict)
    low: float = 0.0
    """Smallest relative residual of the calibration runs (prediction × (1 + low) is the range's low end)."""
    high: float = 0.0
    """Largest relative residual of the calibration runs."""
    runs: tuple[str, ...] = ()
    """The calibration runs the constants were fitted on."""
    note: str = ""
    """What could not be fitted, and which runs would fit it."""
    intercept_per: str = ""
    """A regressor the intercept is paid once per unit of (``in_turn``: a cost per rank, paid by a process once for
    each rank it handles one after another); empty: paid once."""

    def __call__(self, **regressors: float) -> float:
        times = regressors.get(self.intercept_per, 1.0) if self.intercept_per else 1.0
        return self.intercept * times + sum(c * regressors[name] for name, c in self.coefficients.items())

    def range(self, value: float) -> tuple[float, float]:
        return max(0.0, value * (1 + self.low)), max(0.0, value * (1 + self.high))


@dataclass(frozen=True)
class Bound:
    """A bandwidth and the resource it is."""

    GBps: float
    resource: str


def node_write_limit(cluster: Cluster, nodes: int) -> Bound:
    """The node's write bandwidth: its local disk, or the least of the shared file system's aggregate divided among
    the job's nodes, its per-client cap and the node's NIC."""
    if cluster.storage == "local":
        return Bound(cluster.local_write_GBps, "node disk")
    return min((Bound(cluster.shared_write_GBps / nodes, "shared file system (aggregate share)"),
                Bound(cluster.shared_per_client_GBps, "shared file system (per-client cap)"),
                Bound(cluster.nic_GBps, "network (NIC)")), key=lambda b: b.GBps)


def node_read_limit(cluster: Cluster, nodes: int) -> Bound:
    """The node's read bandwidth, as ``node_write_limit`` for reads."""
    if cluster.storage == "local":
        return Bound(cluster.local_read_GBps, "node disk")
    return min((Bound(cluster.shared_read_GBps / nodes, "shared file system (aggregate share)"),
                Bound(cluster.shared_per_client_GBps, "shared file system (per-client cap)"),
                Bound(cluster.nic_GBps, "network (NIC)")), key=lambda b: b.GBps)




#: Start-up parts that are CPU work in each process, scaled by ``cpu_share_factor`` (see the module's notes).
CPU_BOUND = ("imports", "dist init", "model build", "ds init", "engine setup", "gaps")


def cpu_share_factor(processes_per_node: float, cores_per_node: float) -> float:
    """How much longer CPU work in each process takes with ``processes_per_node`` processes on ``cores_per_node``
    cores than with a core per process: ``max(1, P/C)`` (each process gets ``min(1, C/P)`` of a core)."""
    return max(1.0, processes_per_node / cores_per_node)


def job_cpu_factor(job: Job, cluster: Cluster) -> float:
    """The CPU share factor of ``job`` on ``cluster``: its processes on the busiest node (``Job.concurrency``: the
    node's ranks over the ranks each process handles) over the cluster's cores per node."""
    return cpu_share_factor(job.concurrency, cluster.cpu_cores_per_node)


def d2h_s(engine: str, job: Job, cluster: Cluster) -> float:
    """The copy out of GPU memory of the busiest rank's bytes (0 on cpu: the state is in host memory already)."""
    if cluster.device == "cpu":
        return 0.0
    rate = cluster.d2h_pageable_GBps if cost_traits(engine).pageable_copy else cluster.d2h_pinned_GBps
    return job.bytes_rank / (rate * GB)


def stall_s(line: Line, engine: str, job: Job, cluster: Cluster) -> float:
    """The training stall: D2H + ``c·(a + f·files_rank + bytes_rank·s)`` (``s`` = 1/r, the host-side rate with a
    core per process; ``c`` the CPU share factor, ``job_cpu_factor``), ``+ c·t·tensors_written`` where the line has
    a per-tensor coefficient (``per_tensor`` engines). A ``side_stream`` engine on cuda: ``c·(a + f·files_rank)``
    (its bytes go by the D2H copy beside training: ``slowdown_s``)."""
    if side_stream(engine, cluster):
        return job_cpu_factor(job, cluster) * line(files=job.files_rank, bytes=0.0, tensors=job.tensors_written)
    return d2h_s(engine, job, cluster) + job_cpu_factor(job, cluster) * line(files=job.files_rank,
                                                                             bytes=job.bytes_rank,
                                                                             tensors=job.tensors_written)


def coordinator_s(per_item_s: float | None, engine: str, job: Job, cluster: Cluster) -> float:
    """A collective engine's coordinator at a save or a load: ``c·u·items_planned``, ``u`` the calibration's seconds
    per item planned (``Fit.collective_plan_s_per_item`` or ``collective_load_plan_s_per_item``; 0 where it has
    none), ``c`` the CPU share factor (rank 0's process among the node's). 0 for an engine whose ranks save and load
    alone."""
    if not cost_traits(engine).collective or per_item_s is None:
        return 0.0
    return job_cpu_factor(job, cluster) * per_item_s * job.items_planned


def side_stream(engine: str, cluster: Cluster) -> bool:
    """Whether ``engine`` copies out of the GPU beside training on ``cluster`` (``side_stream``, on cuda)."""
    return cluster.device == "cuda" and cost_traits(engine).side_stream


def write_seconds(job: Job, limit: Bound) -> float:
    """The node's bytes at the node's write limit (the regressor of the durable time's byte term)."""
    return job.bytes_node / (limit.GBps * GB)


def durable_s(line: Line, engine: str, job: Job, cluster: Cluster) -> float:
    """Save start → the busiest node's files fsync'd: D2H + ``a·k + f·files_node/concurrency + (1/η)·bytes_node/L``
    (``k``: ranks a process handles in turn, ``line.intercept_per`` = ``in_turn``), ``+ t·k·tensors_written`` where
    the line has a per-tensor coefficient."""
    limit = node_write_limit(cluster, job.nodes)
    return d2h_s(engine, job, cluster) + line(files=job.files_node / job.concurrency,
                                              at_limit=write_seconds(job, limit), in_turn=job.sequential,
                                              tensors=job.tensors_written * job.sequential)


def slowdown_s(fraction: float, engine: str, stall: float, durable: float, copies: float = 0.0) -> float:
    """σ · (durable − stall) for an asynchronous engine, 0 for a synchronous one; ``copies``: a ``side_stream``
    engine's D2H on cuda, added whole and taken out of the background time σ applies to."""
    if not cost_traits(engine).asynchronous:
        return 0.0
    return copies + fraction * max(0.0, durable - stall - copies)


def read_seconds(job: Job, limit: Bound) -> float:
    """The bytes a rank reads at its share of the node's read limit (the load's byte regressor)."""
    return job.held_rank * job.concurrency / (limit.GBps * GB)


def load_s(line: Line, job: Job, cluster: Cluster) -> float:
    """The checkpoint load: ``a + f·files_rank + (1/η)·held_rank·concurrency/R``, ``+ t·tensors_rank`` where the
    line has a per-tensor coefficient."""
    return line(files=job.files_rank, at_limit=read_seconds(job, node_read_limit(cluster, job.nodes)),
                tensors=job.tensors_rank)


def copy_out_s(job: Job, cluster: Cluster) -> float:
    """The bytes a rank reads copied out of a host buffer into its tensors: H2D from pinned memory on cuda (at the
    pinned D2H rate), a memcpy on cpu (a cpu cluster's ``d2h_pinned_GBps``)."""
    return job.held_rank / (cluster.d2h_pinned_GBps * GB)


def prefetched_load_s(load: float, start_up: float, pin: float, job: Job, cluster: Cluster) -> float:
    """A prefetched load: ``max(0, pin + load − copy − start_up) + copy`` (``load``: ``load_s``, the read into the
    buffer and the copy out of it; ``start_up``: the model build, ds init and engine set-up the read runs beside;
    ``pin``: the buffer's pinning, on the read's thread)."""
    copy = min(load, copy_out_s(job, cluster))
    return max(0.0, pin + load - copy - start_up) + copy


def dist_init_s(line: Line, job: Job, cluster: Cluster, calibrated_ranks: int) -> float:
    """``c·(a + b·ranks)`` within the calibrated world size (``c``: the CPU share factor); beyond it the cited
    rendezvous figure per rank is added for the ranks past it."""
    measured = job_cpu_factor(job, cluster) * line(ranks=min(job.ranks, calibrated_ranks))
    if job.ranks <= calibrated_ranks:
        return measured
    per_rank = cluster.dist_init_anchor_s / cluster.dist_init_anchor_ranks
    return measured + per_rank * (job.ranks - calibrated_ranks)


def engine_setup_s(line: Line, engine: str, job: Job, cluster: Cluster, prefetch: bool = False) -> float:
    """The engine's set-up: ``c·a`` (fitted ``a``, ``c`` the CPU share factor) plus, on cuda for an engine that pins
    at set-up (the lazy engine), pinning its host buffer (``pin_s``); a prefetched restart pins it on the read's thread
    instead."""
    return job_cpu_factor(job, cluster) * line() + (0.0 if prefetch else pin_s(engine, job, cluster))


def pin_s(engine: str, job: Job, cluster: Cluster) -> float:
    """The pinning of a host buffer at set-up on cuda, for an engine whose ``CostTraits`` say it pins one (the lazy
    engine: as large as the rank's optimizer state, about its checkpoint bytes), at ``pin_GBps`` (the cluster's
    measured pinning rate, unscaled); 0 elsewhere."""
    return job.bytes_rank / (cluster.pin_GBps * GB) if cluster.device == "cuda" and cost_traits(engine).pins_at_setup \
        else 0.0


def startup_s(line: Line, job: Job, cluster: Cluster, **regressors: float) -> float:
    """A start-up part that is CPU work in each process (imports, model build, ds init, gaps): ``c·line`` (``c``
    the CPU share factor)."""
    return job_cpu_factor(job, cluster) * line(**regressors)


def iteration_estimate_s(params: float, tokens: float, gpus: int, cluster: Cluster) -> float:
    """One training iteration: 6·P·tokens FLOPs (forward and backward of a dense decoder) over the GPUs at the
    cluster's peak × MFU."""
    return 6.0 * params * tokens / (gpus * cluster.gpu_peak_tflops * 1e12 * cluster.mfu)


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else math.inf
