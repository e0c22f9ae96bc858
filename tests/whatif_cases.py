"""What the what-if tests share: the H100 example cluster, changed field by field, and a 16-rank job on it."""

from pathlib import Path

import yaml

from restartbench.whatif.cluster import Cluster, cluster_from_mapping
from restartbench.whatif.terms import GB, Job

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "clusters" / "h100-pfs.yaml"

#: 16 ranks on 2 nodes, 8 processes on the busiest node (concurrency).
JOB = Job(ranks=16, nodes=2, concurrency=8, bytes_rank=2 * GB, files_rank=3, bytes_node=10 * GB, files_node=24,
          params_rank=1e9)


def h100_raw() -> dict:
    """clusters/h100-pfs.yaml as YAML read it: {field: {value, basis, source}}."""
    return yaml.safe_load(H100.read_text())


def h100_cluster(**changes) -> Cluster:
    """clusters/h100-pfs.yaml with the named fields' values changed."""
    raw = h100_raw()
    for name, value in changes.items():
        raw[name]["value"] = value
    return cluster_from_mapping(raw, "test.yaml")
