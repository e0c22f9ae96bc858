"""The cost model's terms, each a function of what it scales with, with its form and why.

Notation. ``Job`` says what a term scales with for one preset, layout, engine and cluster: the busiest rank's bytes
and files (``restartbench.plan``), the node's bytes and files, the ranks doing I/O at once on a node
(``concurrency``), the ranks and nodes, parameters per rank, and the tensors a rank holds and writes
(``restartbench.whatif.tensors``). ``Line`` holds a term's fitted constants: an intercept
and one coefficient per regressor (``restartbench.whatif.fit`` fits them on the study's run folders), with the
spread of the calibration's relative residuals, which gives every prediction its range.

Checkpoint:

- ``stall``: save blocks training while the busiest rank's state goes through the engine's blocking path:
  a device-to-host copy (on cuda; pinned for the engines that stage into a reused pinned buffer, pageable for
  ``torch.save`` of device tensors) plus the engine's host-side work, ``a + f·files_rank + bytes_rank / r``
  (serialisation, or the staging copy, at ``r`` bytes per second per process; per file a fixed cost: create, header,
  plan). Host-side rates are the calibration machine's (an assumption where the target's CPUs differ). An engine that
  saves one item per tensor (``PER_TENSOR``: DCP plans, deduplicates and ``torch.save``s each tensor on its own) adds
  ``+ t·tensors_written``, a cost per tensor the rank writes (``restartbench.whatif.tensors`` says why and how they
  are counted).
- ``durable``: the node's bytes go to storage at the node's bandwidth ``L`` (``node_write_limit``: the local disk, or
  the least of the shared file system's aggregate share per node, its per-client cap and the NIC), of which the
  engine reaches a fraction ``η`` (fitted against this machine's measured limit), plus a cost per file and a cost
  per rank, paid once for each of the ``k`` ranks a process handles one after another (``Job.sequential``: an
  emulated run's --ranks-per-process; 1 for real ranks): ``a·k + f·files_node/concurrency + bytes_node / (η·L)``.
  For a synchronous engine this includes the stall. A ``PER_TENSOR`` engine adds ``+ t·k·tensors_written``: each
  rank's tensors cost their planning and serialisation on its own process, the ranks of one process in turn.
- ``slowdown``: an asynchronous engine's background work slows the iterations it overlaps by a fraction ``σ``
  of its duration: ``σ · (durable − stall)``; 0 for a synchronous engine (training waits).
- whole cost = stall + slowdown.

Restart (each part by what it scales with):

- ``launch`` and ``imports``: a constant per process (the launcher, Python and the libraries: no dependence on the
  model); measured here. Imports from a shared file system at scale are not modelled.
- ``dist init``: ``a + b·ranks`` up to the calibrated world size; beyond it the rendezvous dominates and grows with
  the ranks that connect to one TCPStore server: the cited anchor's seconds per rank (assumed linear).
- ``model build``: ``a + b·params_per_rank`` (allocating and initialising the rank's weights).
- ``ds init``: ``a + b·params_per_rank`` (ZeRO's flat buffers and partitions, the optimizer's state).
- ``engine setup``: ``a + host_buffer_bytes / pin_rate`` (the lazy engine pins a buffer as large as the rank's
  optimizer state; on cpu nothing is pinned and the fitted ``a`` stands).
- ``ckpt load``: ``a + f·files_rank + bytes_rank·concurrency / (η·R)``: the rank's share of the node's read bandwidth
  ``R``, of which the engine reaches ``η`` (reads, deserialisation and copies into place together); a ``PER_TENSOR``
  engine adds ``+ t·tensors_rank``: it plans, seeks and deserialises every tensor the rank holds, those another
  data-parallel replica wrote included.
- ``1st iter``: ``k · iteration_s`` (the first iteration after a restore, with its warm-up, against a clean one).
- ``gaps``: the time between the timed spans (a constant).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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


#: Engines whose save copies device tensors into pageable memory (torch.save of CUDA tensors; DCP's sync save);
#: the others stage into a pinned buffer they reuse.
PAGEABLE = ("torch", "fastpersist", "dcp", "torchsnapshot")
#: Engines whose save is a collective: every rank of the group takes part at once (DCP's save plans and gathers).
COLLECTIVE = ("dcp", "dcp-async")
#: Engines whose durable write runs in the background while training goes on.
ASYNCHRONOUS = ("lazy", "dcp-async")
#: Engines whose save and load handle one item per tensor (DCP: a WriteItem and a ``torch.save`` entry per tensor at
#: a save, a ReadItem and a ``torch.load`` per tensor at a load), whose lines have a cost per tensor. The others'
#: per-item costs are per file: DeepSpeed's engines write a file per layer, whose tensors go through one
#: ``torch.save``; the lazy engine writes each rank's tensors as one stream. (On this study's CPU calibration a
#: tensor term improves none of the torch and lazy lines left out in turn but torch's emulated load, whose tensors
#: follow its layer files.)
PER_TENSOR = ("dcp", "dcp-async")


def d2h_s(engine: str, job: Job, cluster: Cluster) -> float:
    """The copy out of GPU memory of the busiest rank's bytes (0 on cpu: the state is in host memory already)."""
    if cluster.device == "cpu":
        return 0.0
    rate = cluster.d2h_pageable_GBps if base_engine(engine) in PAGEABLE else cluster.d2h_pinned_GBps
    return job.bytes_rank / (rate * GB)


def stall_s(line: Line, engine: str, job: Job, cluster: Cluster) -> float:
    """The training stall: D2H + ``a + f·files_rank + bytes_rank·s`` (``s`` = 1/r, the host-side rate), ``+
    t·tensors_written`` where the line has a per-tensor coefficient (``PER_TENSOR`` engines)."""
    return d2h_s(engine, job, cluster) + line(files=job.files_rank, bytes=job.bytes_rank,
                                              tensors=job.tensors_written)


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


def slowdown_s(fraction: float, engine: str, stall: float, durable: float) -> float:
    """σ · (durable − stall) for an asynchronous engine, 0 for a synchronous one."""
    return fraction * max(0.0, durable - stall) if base_engine(engine) in ASYNCHRONOUS else 0.0


def read_seconds(job: Job, limit: Bound) -> float:
    """The rank's bytes at its share of the node's read limit (the load's byte regressor)."""
    return job.bytes_rank * job.concurrency / (limit.GBps * GB)


def load_s(line: Line, job: Job, cluster: Cluster) -> float:
    """The checkpoint load: ``a + f·files_rank + (1/η)·bytes_rank·concurrency/R``, ``+ t·tensors_rank`` where the
    line has a per-tensor coefficient."""
    return line(files=job.files_rank, at_limit=read_seconds(job, node_read_limit(cluster, job.nodes)),
                tensors=job.tensors_rank)


def dist_init_s(line: Line, job: Job, cluster: Cluster, calibrated_ranks: int) -> tuple[float, bool]:
    """``a + b·ranks`` within the calibrated world size; beyond it the cited rendezvous figure per rank is added
    for the ranks past it. Returns (seconds, whether the cited figure entered)."""
    measured = line(ranks=min(job.ranks, calibrated_ranks))
    if job.ranks <= calibrated_ranks:
        return measured, False
    per_rank = cluster.dist_init_anchor_s / cluster.dist_init_anchor_ranks
    return measured + per_rank * (job.ranks - calibrated_ranks), True


def engine_setup_s(line: Line, engine: str, job: Job, cluster: Cluster) -> float:
    """The engine's set-up: fitted ``a`` plus, on cuda for the lazy engine, pinning its host buffer (as large as the
    rank's optimizer state, about its checkpoint bytes) at ``pin_GBps``."""
    pinned = job.bytes_rank / (cluster.pin_GBps * GB) if cluster.device == "cuda" and base_engine(engine) == "lazy" \
        else 0.0
    return line() + pinned


def iteration_estimate_s(params: float, tokens: float, gpus: int, cluster: Cluster) -> float:
    """One training iteration: 6·P·tokens FLOPs (forward and backward of a dense decoder) over the GPUs at the
    cluster's peak × MFU."""
    return 6.0 * params * tokens / (gpus * cluster.gpu_peak_tflops * 1e12 * cluster.mfu)


def base_engine(engine: str) -> str:
    """``torch-emulated`` → ``torch``."""
    return engine.removesuffix("-emulated")


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else math.inf
