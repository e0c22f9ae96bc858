"""What the calibration under Slurm (``--calibrate --slurm``) reads and writes: the nodes ``sinfo`` lists and whether
they are one host, the shared storage probe's cluster fields and summary line, and multi-node runs of one host fitted
as one node. Asking ``sinfo`` (and refusing where no Slurm is usable) is ``calibrate.slurm_nodes``'s."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from restartbench.whatif.limits import spread_text

#: Slurm nodes of the calibration's multi-node steps.
SLURM_NODES = 2
SLURM_HOWTO = ("run --slurm where Slurm's commands reach its controller and at least 2 nodes are idle (a login node "
               "or inside an allocation; export SLURM_CONF=PATH where the configuration is not in /etc/slurm); on one "
               "machine, scripts/slurm-local.sh up DIR 8 2 and export SLURM_CONF=DIR/slurm.conf; or calibrate the "
               "node you are on without --slurm")


@dataclass(frozen=True)
class SlurmNodes:
    """What ``sinfo`` says: the nodes, those idle, and whether their addresses are one machine."""

    nodes: tuple[str, ...]
    idle: tuple[str, ...]
    addresses: dict[str, str]
    one_host: bool
    """Every node's NodeAddr resolves to one address (or all to loopback): a guess, before the shared probe's boot
    ids settle it."""

    def line(self) -> str:
        where = ("one host: every NodeAddr resolves to " + next(iter(set(self.addresses.values())))
                 if self.one_host else "NodeAddrs " + ", ".join(sorted(set(self.addresses.values()))))
        return (f"Slurm: {len(self.nodes)} node(s), {len(self.idle)} idle ({', '.join(self.idle)}); {where}"
                + ("; its 2-node runs and the shared probe share this machine's disk and CPUs" if self.one_host
                   else ""))


def _resolve(address: str) -> str:
    try:
        return socket.gethostbyname(address)
    except OSError:
        return address


def parse_sinfo(text: str, resolve: Callable[[str], str] = _resolve) -> SlurmNodes:
    """``run_sinfo``'s lines as nodes (each once: sinfo -N repeats a node per partition), the idle ones (state idle or
    mixed: not down, drained, allocated, not responding ``*`` or powered off ``~``) and whether one machine."""
    states: dict[str, str] = {}
    addresses: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0]:
            continue
        states[parts[0]] = parts[1].strip().lower()
        address = parts[2].strip() or parts[0]
        addresses[parts[0]] = resolve(address) or address
    idle = tuple(name for name, state in states.items() if state in ("idle", "mixed"))
    distinct = set(addresses.values())
    same = len(distinct) == 1 or (bool(distinct) and all(a.startswith("127.") for a in distinct))
    return SlurmNodes(tuple(states), idle, addresses, one_host=len(addresses) > 1 and same)


def shared_fields(shared: dict[str, Any], slurm: SlurmNodes | None, made: str) -> dict[str, tuple[Any, str, str]]:
    """The cluster file's storage fields from ``limits.shared_storage_limits``'s figures (MB/s medians → GB/s)."""
    write, read = shared["write"], shared["read"]
    nodes = ", ".join(shared["nodes"])
    host = (f"; the {len(shared['nodes'])} nodes are one host ({shared['hosts'][0]}: one boot id), so this is its one "
            "disk shared by the nodes, not a shared file system's figure" if shared["one_host"] else
            f"; hosts {', '.join(shared['hosts'])}")
    how = (f"{made}: {shared['method']}; {shared['jobs_per_node']} writer(s) per node (the 2-node runs' "
           f"concurrency), {shared['size_mib_per_job']} MiB each, {shared['repeats']} repeat(s) on "
           f"{shared['target']}, nodes {nodes}{host}")

    per_client = max(write["alone_MBps"]["median"], read["alone_MBps"]["median"]) / 1e3
    fields: dict[str, tuple[Any, str, str]] = {
        "storage": ("shared", "calibration", f"{made}: --logs' file system ({shared['target']}), written and read "
                    f"by nodes {nodes} at once" + (" (one host: its disk)" if shared["one_host"] else "")),
        "shared_write_GBps": (write["aggregate_MBps"]["median"] / 1e3, "calibration",
                              f"aggregate write of the nodes at once, {spread_text(write['aggregate_MBps'])} "
                              f"(each node {spread_text(write['per_node_MBps'])}); {how}"),
        "shared_read_GBps": (read["aggregate_MBps"]["median"] / 1e3, "calibration",
                             f"aggregate read of the nodes at once, {spread_text(read['aggregate_MBps'])} (each node "
                             f"{spread_text(read['per_node_MBps'])}); {how}"),
        "shared_per_client_GBps": (per_client, "calibration",
                                   f"one node alone, the larger of its write ({spread_text(write['alone_MBps'])}) and "
                                   f"read ({spread_text(read['alone_MBps'])}); {how}"),
        "nic_GBps": (per_client, "calibration", f"{made}: " + (
            "the nodes are one host: no network stands between a node and the disk; the per-client figure stands in "
            "(shared_per_client_GBps)" if shared["one_host"] else
            f"not measured apart: one node alone reached {per_client:.3g} GB/s from the storage through it "
            "(shared_per_client_GBps), a lower bound")),
    }
    if slurm is not None:
        fields["nodes"] = (len(slurm.nodes), "calibration", f"{made}: sinfo: {len(slurm.nodes)} node(s) "
                           f"({', '.join(slurm.nodes)}); the calibration ran on {len(shared['nodes'])} at most"
                           + (", two nodes on one host" if shared["one_host"] else ""))
    return fields


def shared_summary(shared: dict[str, Any]) -> str:
    """The shared probe's figures in one line (printed after its step)."""
    write, read = shared["write"], shared["read"]
    where = (f"{len(shared['nodes'])} nodes on one host ({shared['hosts'][0]}, one boot id): one disk, not a shared "
             "file system" if shared["one_host"] else f"hosts {', '.join(shared['hosts'])}")
    return (f"nodes {', '.join(shared['nodes'])} at once: write {write['aggregate_MBps']['median']:.0f} MB/s, read "
            f"{read['aggregate_MBps']['median']:.0f} MB/s in all; one node alone: write "
            f"{write['alone_MBps']['median']:.0f} MB/s, read {read['alone_MBps']['median']:.0f} MB/s; {where}")


def one_host_as_one_node(table):
    """Multi-node runs whose nodes are one host, as one node: every process of theirs wrote to and read from the one
    disk the storage probe measured, so the fit's node bytes and concurrency are the whole run's (fit.py divides a
    run's bytes among its nodes, each at the one-node limit). Returns the table and a note ({} where none)."""
    multi = table["nodes"].fillna(1).astype(int) > 1
    if not multi.any():
        return table, {}
    table = table.copy()
    table.loc[multi, "nodes"] = 1
    runs = sorted(set(table.loc[multi, "run_id"]))
    return table, {"multi-node runs": f"{len(runs)} run(s) on Slurm nodes of one host fitted as one node of all "
                                      f"their processes (one disk): {', '.join(runs)}"}
