"""``flowride topologies`` and ``flowride topology``: the built-in topologies listed, one built (or
read) and saved as JSON."""

from __future__ import annotations

import argparse

from rich.table import Table

from flowride.argtypes import out_file
from flowride.cli.common import as_options, console, topology_args
from flowride.errors import InputError


def load_topology(a: argparse.Namespace):
    """The topology the options name; a library error about a parameter the user gave names its
    option (``--chassis``, ``--switch-copy``, ...)."""
    from flowride.topology.builtins import TOPOLOGY_PARAMS, resolve_topology

    params = {k: getattr(a, k) for k in TOPOLOGY_PARAMS}
    copy = getattr(a, "switch_copy", None)
    switching = getattr(a, "switching", None)
    given = [k for k, v in params.items() if v is not None] + ([] if copy is None else ["switch_copy"])
    given += [] if switching is None else ["switching"]
    with as_options(**{k: f"--{k.replace('_', '-')}" for k in given}):
        topo = resolve_topology(a.topology, params, None if copy is None else copy == "on", switching)
    return with_group(topo, getattr(a, "ranks", None), getattr(a, "relay", None))


def with_group(topo, ranks: str | None, relay: str | None):
    """The process group ``--ranks`` names (``--relay``: may non-members forward), or ``topo``."""
    from flowride.topology.group import select_group

    if ranks is None:
        if relay is not None:
            raise InputError("--relay", "applies only to a process group", "add --ranks, e.g. --ranks 0,2,4,6")
        return topo
    with as_options(ranks="--ranks", relay="--relay"):
        return select_group(topo, ranks, relay == "on")


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


IMPORT_OPTIONS = {"gpu_generation": "--gpu-generation", "link_table": "--link-table", "nvlink_only": "--nvlink-only"}


IMPORT_FLAGS = {"from_nvidia_smi": "--from-nvidia-smi", "from_nccl_xml": "--from-nccl-xml", "from_rocm_smi": "--from-rocm-smi"}


def import_topology(a: argparse.Namespace):
    """(topology, notes) from --from-nvidia-smi, --from-nccl-xml or --from-rocm-smi; the options
    that shape only a built-in are refused rather than ignored."""
    from flowride.topology.builtins import TOPOLOGY_PARAMS
    from flowride.topology.nccl_xml import import_nccl_xml
    from flowride.topology.nvsmi import import_nvidia_smi
    from flowride.topology.rocm_smi import import_rocm_smi

    dest = next(k for k in IMPORT_FLAGS if getattr(a, k, None))
    flag = IMPORT_FLAGS[dest]
    for k in TOPOLOGY_PARAMS:
        if getattr(a, k) is not None:
            raise InputError(f"--{k.replace('_', '-')}", f"does not apply to {flag}", "it shapes a built-in; --link-table prices an imported machine")
    importer = {"from_nvidia_smi": import_nvidia_smi, "from_nccl_xml": import_nccl_xml, "from_rocm_smi": import_rocm_smi}[dest]
    path = getattr(a, dest)
    with as_options(switch_copy="--switch-copy", **IMPORT_FLAGS, **IMPORT_OPTIONS):
        done = importer(path, a.gpu_generation, a.link_table, a.nvlink_only)
        topo = done.topology
        if a.switch_copy is not None:  # it would set PCIe switches and CPU sockets too, which never replicate
            raise InputError("switch_copy", f"would make every switch of {topo.name} copy, PCIe switches and CPU sockets included",
                             'let only the NVSwitch copy with {"nvswitch_copy": true} in --link-table')
    return with_group(topo, getattr(a, "ranks", None), getattr(a, "relay", None)), done.notes


def cmd_topology(a: argparse.Namespace) -> int:
    from flowride.topology import save_topology

    given = [f for f, v in (("--topology", a.topology), *((flag, getattr(a, k)) for k, flag in IMPORT_FLAGS.items())) if v]
    if len(given) != 1:
        raise InputError(given[1] if given else "--topology", f"cannot be given with {given[0]}" if given else "is missing",
                         f"give exactly one of -t/--topology, {', '.join(IMPORT_FLAGS.values())}")
    notes: tuple[str, ...] = ()
    if a.topology:
        extra = [flag for k, flag in IMPORT_OPTIONS.items() if getattr(a, k)]
        if extra:
            raise InputError(extra[0], f"applies only to {', '.join(IMPORT_FLAGS.values())}", f"leave it out with -t {a.topology}")
        topo = load_topology(a)
    else:
        topo, notes = import_topology(a)
    for note in notes:
        console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
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
    topology_args(tp, required=False)
    tp.add_argument("--out", "-o", type=out_file, help="write the topology JSON here")
    tp.add_argument("--from-nvidia-smi", metavar="FILE", help="instead of -t: read the machine from the text `nvidia-smi topo -m` "
                    "prints (docs/topology-import.md)")
    tp.add_argument("--from-nccl-xml", metavar="FILE", help="instead of -t: read the machine from NCCL's topology XML "
                    "(the file NCCL_TOPO_DUMP_FILE writes)")
    tp.add_argument("--from-rocm-smi", metavar="FILE", help="instead of -t: read an AMD machine from the text "
                    "`rocm-smi --showtopo` prints (MI300X, MI250)")
    tp.add_argument("--gpu-generation", metavar="GEN", help="with --from-*: the GPU whose link table prices the links: v100, a100, "
                    "h100, h200, h20, h800, a800, b200, b300, gb200, a6000, rtx3090, l40s, l4, rtx4090, rtx6000ada, mi300x, mi250 "
                    "(default: guessed from a GPU name in the file, the NV# counts, the XML's sm or the xGMI graph, and said)")
    tp.add_argument("--link-table", metavar="FILE", help='with --from-*: a JSON file overriding table entries, '
                    'e.g. {"sys": {"bandwidth_GBps": 30, "alpha_us": 2}}')
    tp.add_argument("--nvlink-only", action="store_true", help="with --from-*: keep only the GPU fabric (NVLink, NVSwitch, "
                    "xGMI; no PCIe switches or CPUs)")
    tp.set_defaults(func=cmd_topology)
