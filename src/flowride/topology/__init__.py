"""GPU topologies: nodes, directed links with bandwidth and latency, built-ins, JSON."""

from flowride.topology.builtins import (
    BUILTINS,
    build_topology,
    dgx1,
    dgx2,
    full,
    h100,
    mesh,
    mi250,
    ndv2,
    resolve_topology,
    ring,
    switch,
    torus,
)
from flowride.topology.io import load_topology, save_topology, topology_from_dict, topology_to_dict
from flowride.topology.model import Link, Node, Topology
from flowride.topology.timing import EpochTiming, epoch_timing

__all__ = [
    "BUILTINS", "EpochTiming", "Link", "Node", "Topology", "build_topology", "dgx1", "dgx2", "epoch_timing",
    "full", "h100", "load_topology", "mesh", "mi250", "ndv2", "resolve_topology", "ring", "save_topology", "switch", "topology_from_dict",
    "topology_to_dict", "torus",
]
