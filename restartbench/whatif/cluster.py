"""A cluster description (YAML) as one typed, frozen object: ``load_cluster(path)``.

Every field of the file is a mapping ``{value: ..., basis: ..., source: "..."}``: the value, how it was obtained
(``basis``: ``calibration`` — fitted or probed by ``bench/whatif_validation.py`` on that machine; ``fio`` or
``probe`` — a measurement of the machine; ``cited`` — a published figure, named in ``source`` with the range it holds
for) and where it comes from. A ``cited`` value is marked "assumed" wherever the what-if shows a figure it enters.
A field that is missing, of the wrong type or negative is refused with its name; nothing is written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

BASES = ("calibration", "fio", "probe", "cited")
STORAGE = ("local", "shared")
DEVICES = ("cpu", "cuda")


class ClusterError(ValueError):
    """A cluster file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Cluster:
    """The machine a prediction is for. Bandwidths in GB/s (10^9 bytes per second)."""

    name: str
    """What the cluster is (free text)."""
    device: str
    """cpu (ranks hold their state in host memory) or cuda (the state is copied out of GPU memory first)."""
    nodes: int
    """Nodes a job can have: a layout needing more GPUs than nodes × gpus_per_node is refused."""
    gpus_per_node: int
    """Ranks per node (one per GPU; on a CPU machine, the ranks run per node)."""
    cpu_cores_per_node: int
    """CPU cores of one node (logical CPUs, as ``os.cpu_count()`` counts them). The start-up parts and the stall's
    host-side work are CPU work in each process: with more processes on a node than cores, each gets a share of a
    core (``restartbench.whatif.terms.cpu_share_factor``)."""
    d2h_pinned_GBps: float
    """One rank's device-to-host copy into pinned host memory (on cpu: a memcpy into host memory)."""
    d2h_pageable_GBps: float
    """One rank's device-to-host copy into pageable memory (what torch.save of a CUDA tensor does)."""
    pin_GBps: float
    """Rate of pinning (page-locking) host memory: the lazy engine's host buffer at set-up."""
    local_write_GBps: float
    """Node-local disk: write ending in fsync, all ranks of a node at once."""
    local_read_GBps: float
    """Node-local disk: cold read, all ranks of a node at once."""
    storage: str
    """Where checkpoints go: local (each node's own disk) or shared (the parallel file system)."""
    shared_write_GBps: float
    """The shared file system's aggregate write bandwidth (0: none)."""
    shared_read_GBps: float
    """The shared file system's aggregate read bandwidth (0: none)."""
    shared_per_client_GBps: float
    """Most one node (client) gets from the shared file system (0: none)."""
    nic_GBps: float
    """A node's network bandwidth to the storage (0: no network storage)."""
    dist_init_anchor_ranks: int
    """Ranks of the published distributed-init figure used beyond the calibrated scale."""
    dist_init_anchor_s: float
    """Seconds that figure took (the TCPStore rendezvous: every rank connects to one server)."""
    gpu_peak_tflops: float
    """Dense bf16 peak per GPU, TFLOP/s (the iteration time's estimate when none is given)."""
    mfu: float
    """Model FLOPs utilisation of training (the iteration time's estimate when none is given)."""
    async_slowdown_fraction: float
    """Fraction by which an asynchronous save's background work slows the iterations it overlaps."""
    calibration: str
    """The fit file (JSON, written by restartbench.whatif.fit; relative to this file): the engines' constants."""
    sources: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict, compare=False)
    """Per field: (basis, source) as the file states them."""
    path: str = ""
    """The file it was read from."""

    def assumed(self, field: str) -> bool:
        """Whether the field's value is a cited figure (shown as "assumed")."""
        return self.sources.get(field, ("", ""))[0] == "cited"

    def fit_path(self) -> Path:
        return (Path(self.path).parent / self.calibration) if self.path else Path(self.calibration)


NUMBER_FIELDS = {f.name: f.type for f in dataclasses.fields(Cluster) if f.type in ("int", "float")}
TEXT_FIELDS = ("name", "device", "storage", "calibration")
CHOICES = {"device": DEVICES, "storage": STORAGE}
#: Fields added after cluster files were first written: what a file written before them must add (no default: a
#: guessed core count would silently scale every start-up part).
ADDED = {"cpu_cores_per_node": "; added on 2026-11-26 for the start-up's CPU share: give the CPU cores of one node "
                               "(os.cpu_count() on a node: basis probe; or the node's datasheet: basis cited, with "
                               "its source), or rewrite the file with python -m restartbench.whatif --calibrate"}
POSITIVE = ("nodes", "gpus_per_node", "cpu_cores_per_node", "d2h_pinned_GBps", "d2h_pageable_GBps", "pin_GBps",
            "dist_init_anchor_ranks", "dist_init_anchor_s", "gpu_peak_tflops", "mfu")


def load_cluster(path: Path | str) -> Cluster:
    """The cluster file at ``path``; refuses a missing, mistyped, negative or (where it must be) zero field."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ClusterError(f"{path}: cannot read the cluster file: {error}") from error
    return cluster_from_mapping(raw, str(path))


def cluster_from_mapping(raw: Any, where: str = "<cluster>") -> Cluster:
    if not isinstance(raw, dict):
        raise ClusterError(f"{where}: a cluster file is a mapping of fields, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(NUMBER_FIELDS) - set(TEXT_FIELDS))
    if unknown:
        raise ClusterError(f"{where}: unknown field(s) {', '.join(unknown)}; known: "
                           f"{', '.join([*TEXT_FIELDS, *NUMBER_FIELDS])}")
    values, sources = {}, {}
    for name in [*TEXT_FIELDS, *NUMBER_FIELDS]:
        values[name], sources[name] = _field(raw, name, where)
    _check(values, where)
    return Cluster(**values, sources=sources, path=where)


def _field(raw: dict, name: str, where: str) -> tuple[Any, tuple[str, str]]:
    entry = raw.get(name)
    if entry is None:
        raise ClusterError(f"{where}: field {name!r} is missing (each field is {{value: ..., basis: ..., "
                           f"source: ...}}; basis one of {', '.join(BASES)}){ADDED.get(name, '')}")
    if not isinstance(entry, dict) or not {"value", "basis", "source"} <= set(entry):
        raise ClusterError(f"{where}: field {name!r} must be a mapping with value, basis and source, got {entry!r}")
    if entry["basis"] not in BASES:
        raise ClusterError(f"{where}: field {name!r} has basis {entry['basis']!r}; one of {', '.join(BASES)}")
    if not str(entry["source"]).strip():
        raise ClusterError(f"{where}: field {name!r} says no source: say where its value comes from")
    return _typed(entry["value"], name, where), (entry["basis"], str(entry["source"]))


def _typed(value: Any, name: str, where: str) -> Any:
    if name in TEXT_FIELDS:
        if not isinstance(value, str) or not value.strip():
            raise ClusterError(f"{where}: field {name!r} must be a non-empty text, got {value!r}")
        return value
    wanted = NUMBER_FIELDS[name]
    ok = isinstance(value, int) if wanted == "int" else isinstance(value, (int, float))
    if not ok or isinstance(value, bool):
        raise ClusterError(f"{where}: field {name!r} must be a{'n integer' if wanted == 'int' else ' number'}, "
                           f"got {value!r}")
    if value < 0:
        raise ClusterError(f"{where}: field {name!r} is negative ({value}); it must be at least 0")
    return int(value) if wanted == "int" else float(value)


def _check(values: dict[str, Any], where: str) -> None:
    for name, allowed in CHOICES.items():
        if values[name] not in allowed:
            raise ClusterError(f"{where}: field {name!r} is {values[name]!r}; one of {', '.join(allowed)}")
    for name in POSITIVE:
        if values[name] <= 0:
            raise ClusterError(f"{where}: field {name!r} must be above 0, got {values[name]}")
    if values["mfu"] > 1:
        raise ClusterError(f"{where}: field 'mfu' is a fraction of the peak, at most 1, got {values['mfu']}")
    needed = ("shared_write_GBps", "shared_read_GBps", "shared_per_client_GBps", "nic_GBps") \
        if values["storage"] == "shared" else ("local_write_GBps", "local_read_GBps")
    for name in needed:
        if values[name] <= 0:
            raise ClusterError(f"{where}: field {name!r} is {values[name]}, but checkpoints go to "
                               f"{values['storage']} storage, which needs it above 0")


def to_mapping(cluster: Cluster) -> dict[str, Any]:
    """The cluster as a file's mapping (``{field: {value, basis, source}}``)."""
    return {name: {"value": getattr(cluster, name), "basis": cluster.sources[name][0],
                   "source": cluster.sources[name][1]} for name in [*TEXT_FIELDS, *NUMBER_FIELDS]}


def cluster_text(cluster: Cluster, header: str = "") -> str:
    """The cluster file's text: ``header`` as comment lines, then the fields with their basis and source."""
    body = yaml.safe_dump(to_mapping(cluster), sort_keys=False, width=118, allow_unicode=True)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body


def write_cluster(cluster: Cluster, path: Path, header: str = "") -> None:
    path.write_text(cluster_text(cluster, header))
