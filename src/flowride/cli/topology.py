"""``flowride topologies`` and ``flowride topology``: the built-in topologies listed, one built (or
read) and saved as JSON."""

from __future__ import annotations

import argparse

from rich.table import Table

from flowride.argtypes import out_file
from flowride.cli.common import as_options, console, topology_args


def load_topology(a: argparse.Namespace):
    """The topology the options name; a library error about a parameter the user gave names its
    option (``--chassis``, ``--switch-copy``, ...)."""
    from flowride.topology.builtins import TOPOLOGY_PARAMS, resolve_topology

    params = {k: getattr(a, k) for k in TOPOLOGY_PARAMS}
    copy = getattr(a, "switch_copy", None)
    given = [k for k, v in params.items() if v is not None] + ([] if copy is None else ["switch_copy"])
    with as_options(**{k: f"--{k.replace('_', '-')}" for k in given}):
        return resolve_topology(a.topology, params, None if copy is None else copy == "on")


def cmd_topologies(a: argparse.Namespace) -> int:
    from flowride.topology import BUILTINS, build_topology

    t = Table(title="built-in topologies")
    for c in ("name", "parameters", "example", "GPUs", "switches", "links"):
        t.add_column(c)
    for name, spec in BUILTINS.items():
        topo = build_topology(name, **spec.example)
        ex = ", ".join(f"{k}={v}" for k, v in spec.example.items()) or "-"
        t.add_row(name, ", ".join(spec.params) or "-", ex, str(len(topo.gpus)), str(len(topo.switches)), str(len(topo.links)))
    console.print(t)
    return 0


def cmd_topology(a: argparse.Namespace) -> int:
    from flowride.topology import save_topology

    topo = load_topology(a)
    if a.out:
        save_topology(topo, a.out)
        console.print(f"{topo.summary()} written to {a.out}")
    else:
        console.print(topo.summary())
    return 0


def add_topologies(sub) -> None:
    """``flowride topologies`` and ``flowride topology``."""
    t = sub.add_parser("topologies", help="list the built-in topologies")
    t.set_defaults(func=cmd_topologies)

    tp = sub.add_parser("topology", help="build a topology and optionally save it as JSON")
    topology_args(tp)
    tp.add_argument("--out", "-o", type=out_file, help="write the topology JSON here")
    tp.set_defaults(func=cmd_topology)
