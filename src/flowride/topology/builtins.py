"""Built-in topologies with the numbers the TE-CCL paper and artifact publish (bandwidth GB/s,
alpha in seconds; each builder's docstring gives its source).

Every builder returns a validated :class:`Topology`. Node ids: GPUs first (chassis-major), then
switches. ``BUILTINS`` maps a name to its builder and the parameters it accepts.

Switch copy. Whether a switch can replicate a chunk onto several out-links is part of every
switch. The physical default is no: first- and second-generation NVSwitch (DGX-2, DGX A100),
InfiniBand and NIC switches forward what they receive, and NCCL's collectives do not use
InfiniBand multicast. Third-generation NVSwitch with NVLink SHARP (NVLS, H100-class HGX) does
replicate; the ``h100`` preset has it. The published TE-CCL results model every switch as able to
copy: ``teccl_compat=True`` (the CLI's ``--teccl-compat``) builds that published model, and
``--switch-copy on|off`` sets any topology's switches either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flowride.errors import InputError
from flowride.sizes import MAX_GPUS, MAX_LINKS
from flowride.topology.fabrics import (
    DGX1_ADJ,
    FABRIC_PARAMS,
    MI250_ADJ,
    MI250_UNIT_GBPS,
    build_fabric,
)
from flowride.topology.io import load_topology
from flowride.topology.model import Link, Node, Topology

US = 1e-6

NVLINK_ALPHA = 0.7 * US
NDV2_IB_GBPS, NDV2_IB_ALPHA = 12.5, 1.3 * US

DGX2_GPU_GBPS, DGX2_NVSWITCH_ALPHA = 125.0, 0.35 * US
DGX2_IB_GBPS, DGX2_IB_ALPHA = 12.5, 2.6 * US

# Assumed (the shared notes give none for MI250): xGMI like NVLink, NICs like NDv2's InfiniBand.
MI250_XGMI_ALPHA, MI250_NIC_GBPS, MI250_NIC_ALPHA = 0.7 * US, 25.0, 1.3 * US


class _Builder:
    """Collects nodes and links, then validates them as one Topology."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.links: list[Link] = []

    def gpu(self, group: int | None = None, label: str = "") -> int:
        self.nodes.append(Node(len(self.nodes), "gpu", group=group, label=label))
        return len(self.nodes) - 1

    def switch(self, copy: bool, group: int | None = None, label: str = "") -> int:
        self.nodes.append(Node(len(self.nodes), "switch", copy=copy, group=group, label=label))
        return len(self.nodes) - 1

    def link(self, a: int, b: int, gbps: float, alpha: float) -> None:
        self.links.append(Link(a, b, float(gbps), float(alpha)))

    def both(self, a: int, b: int, gbps: float, alpha: float) -> None:
        self.link(a, b, gbps, alpha)
        self.link(b, a, gbps, alpha)

    @classmethod
    def with_gpus(cls, n: int) -> _Builder:
        b = cls()
        for _ in range(n):
            b.gpu()
        return b

    def build(self, name: str, **kw) -> Topology:
        return Topology(name, tuple(self.nodes), tuple(self.links), **kw)


def _positive(value: int, field: str, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InputError(field, f"{value!r} is not an integer >= {minimum}", f"give {field} >= {minimum}")
    return value


def _fits(field: str, gpus: int, links: int) -> None:
    """Refuse a preset before building it when it would pass the topology limits."""
    if gpus > MAX_GPUS:
        raise InputError(field, f"gives {gpus:,} GPUs, over the limit of {MAX_GPUS:,}", "give a smaller topology")
    if links > MAX_LINKS:
        raise InputError(field, f"gives {links:,} links, over the limit of {MAX_LINKS:,}", "give a smaller topology")


def dgx1() -> Topology:
    """One DGX-1 (= one NDv2 chassis): 8 V100 on the hybrid cube-mesh."""
    t = ndv2(1)
    return Topology("dgx1", t.nodes, t.links, description="8 V100, hybrid cube-mesh NVLink", params={})


def ndv2(chassis: int = 2, teccl_compat: bool = False) -> Topology:
    """Azure NDv2: DGX-1 chassis. 2 chassis: 0->9 and 8->1 InfiniBand links; >=3: one NIC switch.

    ``teccl_compat`` reproduces the published TE-CCL model for >= 2 chassis: global GPU 0 is a
    bufferless copy-capable switch with no demand of its own, the buffer is still split 16
    (8 x chassis) ways, and a switch -> GPU hop costs only its alpha. The NIC switch of >= 3
    chassis copies in that model; physically (the default) an InfiniBand switch forwards.
    """
    chassis = _positive(chassis, "chassis")
    b = _Builder()
    for c in range(chassis):
        for local in range(8):
            if teccl_compat and chassis >= 2 and c == 0 and local == 0:
                b.switch(copy=True, group=c, label="gpu0-as-switch")
            else:
                b.gpu(group=c)
    for c in range(chassis):
        for i, peers in DGX1_ADJ.items():
            for j, gbps in peers.items():
                b.link(8 * c + i, 8 * c + j, gbps, NVLINK_ALPHA)
    if chassis == 2:
        b.link(0, 9, NDV2_IB_GBPS, NDV2_IB_ALPHA)
        b.link(8, 1, NDV2_IB_GBPS, NDV2_IB_ALPHA)
    elif chassis >= 3:
        nic = b.switch(copy=teccl_compat, label="nic")
        for c in range(chassis):
            b.link(8 * c + 0, nic, NDV2_IB_GBPS, NDV2_IB_ALPHA)
            b.link(nic, 8 * c + 1, NDV2_IB_GBPS, NDV2_IB_ALPHA)
    name = "ndv2" if chassis > 1 else "dgx1"
    kw = {}
    if teccl_compat and chassis >= 2:
        name += "-teccl-compat"
        kw["nominal_gpus"] = 8 * chassis
        kw["teccl_compat"] = True
    desc = f"{chassis} x NDv2 (DGX-1) chassis"
    return b.build(name, description=desc, params={"chassis": chassis, "teccl_compat": teccl_compat}, **kw)


def _switched_chassis(chassis: int, per: int, gbps: float, alpha: float, copy: bool) -> _Builder:
    """``chassis`` groups of ``per`` GPUs, each group on its own NVSwitch (joined both ways): the
    intra-chassis part of dgx2 and h100 (GPU ids chassis-major, then the switches)."""
    b = _Builder()
    for c in range(chassis):
        for _ in range(per):
            b.gpu(group=c)
    for c in range(chassis):
        sw = b.switch(copy=copy, group=c, label=f"nvswitch{c}")
        for local in range(per):
            b.both(per * c + local, sw, gbps, alpha)
    return b


def dgx2(chassis: int = 1, teccl_compat: bool = False) -> Topology:
    """DGX-2: 16 V100 per chassis on one NVSwitch (125 GB/s per GPU each way).

    2 chassis: 8 directed 12.5 GB/s links each way, odd local GPU l -> local GPU l-1 of the other.
    >= 3 chassis (our model): 8 rail NIC switches; rail r takes local GPU 2r+1 of every chassis in
    and feeds local GPU 2r of every chassis, 12.5 GB/s, alpha 1.3 us per hop (2.6 us end to end).

    The physical default: first-generation NVSwitch cannot replicate (it forwards). With
    ``teccl_compat`` every switch copies and a switch -> GPU hop costs only its alpha: the model
    the published TE-CCL DGX-2 results were computed in.
    """
    chassis = _positive(chassis, "chassis")
    b = _switched_chassis(chassis, 16, DGX2_GPU_GBPS, DGX2_NVSWITCH_ALPHA, copy=teccl_compat)
    if chassis == 2:
        for local in range(1, 16, 2):
            b.link(local, 16 + local - 1, DGX2_IB_GBPS, DGX2_IB_ALPHA)
            b.link(16 + local, local - 1, DGX2_IB_GBPS, DGX2_IB_ALPHA)
    elif chassis >= 3:
        for rail in range(8):
            sw = b.switch(copy=teccl_compat, label=f"rail{rail}")
            for c in range(chassis):
                b.link(16 * c + 2 * rail + 1, sw, DGX2_IB_GBPS, DGX2_IB_ALPHA / 2)
                b.link(sw, 16 * c + 2 * rail, DGX2_IB_GBPS, DGX2_IB_ALPHA / 2)
    if teccl_compat:
        return b.build("dgx2-teccl-compat", description=f"{chassis} x DGX-2 chassis, the published TE-CCL model (switches copy)",
                       params={"chassis": chassis, "teccl_compat": True}, teccl_compat=True)
    return b.build("dgx2", description=f"{chassis} x DGX-2 chassis", params={"chassis": chassis, "teccl_compat": False})


def mi250(chassis: int = 1) -> Topology:
    """AMD MI250: 16 GCDs per chassis on xGMI. Several chassis: per chassis 8 NIC switches (switch k
    joined to GCDs 2k and 2k+1 at 25 GB/s each way), every NIC switch joined to one global switch
    at 25 GB/s each way. Alphas are assumptions: 0.7 us on xGMI, 1.3 us per NIC hop."""
    chassis = _positive(chassis, "chassis")
    b = _Builder()
    for c in range(chassis):
        for _ in range(16):
            b.gpu(group=c)
    for c in range(chassis):
        for i, peers in MI250_ADJ.items():
            for j, units in peers.items():
                b.link(16 * c + i, 16 * c + j, units * MI250_UNIT_GBPS, MI250_XGMI_ALPHA)
    if chassis >= 2:  # NIC and InfiniBand switches forward (no copy)
        top = b.switch(copy=False, label="global")
        for c in range(chassis):
            for k in range(8):
                nic = b.switch(copy=False, group=c, label=f"nic{c}.{k}")
                b.both(16 * c + 2 * k, nic, MI250_NIC_GBPS, MI250_NIC_ALPHA)
                b.both(16 * c + 2 * k + 1, nic, MI250_NIC_GBPS, MI250_NIC_ALPHA)
                b.both(nic, top, MI250_NIC_GBPS, MI250_NIC_ALPHA)
    return b.build("mi250", description=f"{chassis} x AMD MI250 chassis", params={"chassis": chassis})


H100_NVLINK_GBPS, H100_NVLINK_ALPHA = 450.0, 0.7 * US
H100_NIC_GBPS, H100_NIC_ALPHA = 50.0, 1.3 * US


def h100(chassis: int = 1) -> Topology:
    """HGX H100: 8 H100 per chassis on third-generation NVSwitch, which replicates (NVLink SHARP /
    NVLS multicast): the copy model's physical counterpart. 450 GB/s per GPU each way (18 NVLink4
    links); alpha 0.7 us assumed, as for NVLink elsewhere. >= 2 chassis: rail-optimised
    InfiniBand, one 400 Gb/s NIC (50 GB/s) per GPU, local GPU r on rail switch r, alpha 1.3 us per
    hop (assumed); InfiniBand switches forward (no copy)."""
    chassis = _positive(chassis, "chassis")
    b = _switched_chassis(chassis, 8, H100_NVLINK_GBPS, H100_NVLINK_ALPHA, copy=True)
    if chassis >= 2:
        for rail in range(8):
            sw = b.switch(copy=False, label=f"rail{rail}")
            for c in range(chassis):
                b.both(8 * c + rail, sw, H100_NIC_GBPS, H100_NIC_ALPHA)
    return b.build("h100", description=f"{chassis} x HGX H100 (NVSwitch with NVLS multicast)", params={"chassis": chassis})


def ring(n: int = 8, bandwidth: float = 50.0, alpha_us: float = 0.7, bidirectional: bool = True) -> Topology:
    """n GPUs on a ring (both directions unless ``bidirectional`` is false)."""
    n = _positive(n, "n", 2)
    _fits("n", n, 2 * n)
    _fits("n", n, 2 * n)
    b = _Builder.with_gpus(n)
    pairs = {(i, (i + 1) % n) for i in range(n)}
    if bidirectional:
        pairs |= {((i + 1) % n, i) for i in range(n)}
    for i, j in sorted(pairs):
        b.link(i, j, bandwidth, alpha_us * US)
    return b.build("ring", description=f"{n}-GPU ring", params={"n": n})


def _grid(name: str, rows: int, cols: int, wrap: bool, bandwidth: float, alpha_us: float) -> Topology:
    rows, cols = _positive(rows, "rows"), _positive(cols, "cols")
    if rows * cols < 2:
        raise InputError("rows x cols", "gives fewer than 2 GPUs", "use at least 2 GPUs")
    _fits("rows x cols", rows * cols, 4 * rows * cols)
    b = _Builder.with_gpus(rows * cols)
    pairs: set[tuple[int, int]] = set()
    for r in range(rows):
        for c in range(cols):
            me = r * cols + c
            nbrs = []
            if c + 1 < cols:
                nbrs.append(r * cols + c + 1)
            elif wrap and cols > 2:
                nbrs.append(r * cols)  # wrap within the same row
            if r + 1 < rows:
                nbrs.append((r + 1) * cols + c)
            elif wrap and rows > 2:
                nbrs.append(c)  # wrap within the same column
            for o in nbrs:
                pairs.add((me, o))
                pairs.add((o, me))
    for i, j in sorted(pairs):
        b.link(i, j, bandwidth, alpha_us * US)
    return b.build(name, description=f"{rows}x{cols} {name}", params={"rows": rows, "cols": cols})


def mesh(rows: int = 4, cols: int = 4, bandwidth: float = 50.0, alpha_us: float = 0.7) -> Topology:
    """A rows x cols 2-D grid, links both ways between horizontal and vertical neighbours."""
    return _grid("mesh", rows, cols, False, bandwidth, alpha_us)


def torus(rows: int = 4, cols: int = 4, bandwidth: float = 50.0, alpha_us: float = 0.7) -> Topology:
    """A 2-D torus: the mesh plus wrap-around links within each row and each column (for a side
    of 2 the wrap link would duplicate the neighbour link, so it is left out)."""
    return _grid("torus", rows, cols, True, bandwidth, alpha_us)


def full(n: int = 8, bandwidth: float = 50.0, alpha_us: float = 0.7) -> Topology:
    """n GPUs with a direct link between every ordered pair."""
    n = _positive(n, "n", 2)
    _fits("n", n, n * (n - 1))
    b = _Builder.with_gpus(n)
    for i in range(n):
        for j in range(n):
            if i != j:
                b.link(i, j, bandwidth, alpha_us * US)
    return b.build("full", description=f"{n} fully connected GPUs", params={"n": n})


def switch(n: int = 8, bandwidth: float = 50.0, alpha_us: float = 0.7, copy: bool = False) -> Topology:
    """n GPUs on one switch, a link each way per GPU (``copy``: the switch may multicast)."""
    n = _positive(n, "n", 2)
    b = _Builder.with_gpus(n)
    sw = b.switch(copy=copy)
    for i in range(n):
        b.both(i, sw, bandwidth, alpha_us * US)
    return b.build("switch", description=f"{n} GPUs on one switch", params={"n": n, "copy": copy})


@dataclass(frozen=True)
class BuiltinSpec:
    build: Callable[..., Topology]
    params: tuple[str, ...]
    example: dict


BUILTINS: dict[str, BuiltinSpec] = {
    "dgx1": BuiltinSpec(dgx1, (), {}),
    "ndv2": BuiltinSpec(ndv2, ("chassis", "teccl_compat"), {"chassis": 2}),
    "dgx2": BuiltinSpec(dgx2, ("chassis", "teccl_compat"), {"chassis": 1}),
    "h100": BuiltinSpec(h100, ("chassis",), {"chassis": 1}),
    "mi250": BuiltinSpec(mi250, ("chassis",), {"chassis": 1}),
    "ring": BuiltinSpec(ring, ("n", "bandwidth", "alpha_us"), {"n": 8}),
    "mesh": BuiltinSpec(mesh, ("rows", "cols", "bandwidth", "alpha_us"), {"rows": 4, "cols": 4}),
    "torus": BuiltinSpec(torus, ("rows", "cols", "bandwidth", "alpha_us"), {"rows": 4, "cols": 4}),
    "full": BuiltinSpec(full, ("n", "bandwidth", "alpha_us"), {"n": 8}),
    "switch": BuiltinSpec(switch, ("n", "bandwidth", "alpha_us", "copy"), {"n": 8}),
    # clusters: N nodes of a node type on a network (topology/fabrics.py)
    "fabric": BuiltinSpec(build_fabric, FABRIC_PARAMS, {"node": "dgx-h100", "nodes": 2, "network": "rail"}),
}


def build_topology(name: str, **params) -> Topology:
    """Build a built-in by name; parameters it does not take are an error naming them."""
    spec = BUILTINS.get(name)
    if spec is None:
        raise InputError("topology", f"unknown topology {name!r}", f"choose one of {', '.join(BUILTINS)} or a JSON file")
    given = {k: v for k, v in params.items() if v is not None}
    extra = sorted(set(given) - set(spec.params))
    if extra:
        raise InputError(extra[0], f"is not a parameter of {name}", f"{name} takes: {', '.join(spec.params) or 'nothing'}")
    return spec.build(**given)


TOPOLOGY_PARAMS = ("chassis", "teccl_compat", "n", "rows", "cols", "bandwidth", "alpha_us") + FABRIC_PARAMS


def resolve_topology(name: str, params: dict | None = None, switch_copy: bool | None = None,
                     switching: str | None = None) -> Topology:
    """A topology JSON file (``name`` ending in .json, or an existing file) or a built-in built
    with ``params`` (None values are left out), then, if ``switch_copy`` is given, every switch
    set to copy or not, and if ``switching`` is given, every switch cutting through or storing and
    forwarding. Errors name the parameter at fault (``chassis``, ``teccl_compat``,
    ``switch_copy``, ...): a built-in parameter given with a file, ``teccl_compat`` for a built-in
    without a published model, ``switch_copy`` or ``switching`` for a topology without switches,
    ``switching`` with the published model (which has its own rule)."""
    given = {k: v for k, v in (params or {}).items() if v is not None}
    if name.endswith(".json") or Path(name).is_file():
        extra = [k for k in TOPOLOGY_PARAMS if k in given]
        if extra:
            raise InputError(extra[0], "does not apply to a topology file", "edit the JSON instead")
        topo = load_topology(name)
    else:
        if given.get("teccl_compat") and name in BUILTINS and "teccl_compat" not in BUILTINS[name].params:
            with_model = ", ".join(n for n, spec in BUILTINS.items() if "teccl_compat" in spec.params)
            raise InputError("teccl_compat", f"{name} has no published TE-CCL model", f"the published results cover {with_model}")
        topo = build_topology(name, **given)
    if switch_copy is not None:
        if not topo.switches:
            raise InputError("switch_copy", f"{topo.name} has no switches", "leave --switch-copy out")
        topo = topo.with_switch_copy(switch_copy)
    if switching is not None:
        if not topo.switches:
            raise InputError("switching", f"{topo.name} has no switches", "leave --switching out")
        if topo.teccl_compat:
            raise InputError("switching", "the published TE-CCL model has its own switch rule", "leave --switching out with --teccl-compat")
        if switching not in ("cut-through", "store-and-forward"):
            raise InputError("switching", f"{switching!r} is not a switching model", "use cut-through or store-and-forward")
        topo = topo.with_switching(switching)
    return topo
