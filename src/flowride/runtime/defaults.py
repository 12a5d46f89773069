"""The calibrations flowride uses when the user gives none: fitted to the published curves
(``data/calibrations.json``, written by ``benchmarks/nccl_fit.py``).

A calibration belongs to a node type (what happens inside the node: fitted on one-node curves)
and a network kind (what crossing nodes adds: fitted on two-node curves with the node's part
held): ``ib`` (InfiniBand, the default) or ``efa`` (AWS EFA). A node type no curve measured
borrows the closest measured one's (``borrowed``, stated in every report that uses it). The name
``nccl`` is NCCL's own model, uncorrected."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from flowride.errors import InputError
from flowride.runtime.nccl_tuning import IDENTITY, Calibration
from flowride.runtime.profile import calibration_from_dict, read_profile

DATA = Path(__file__).resolve().parent / "data" / "calibrations.json"
NETWORKS = ("ib", "efa")
NAMES = ("default", "nccl", *NETWORKS)
# node types without a measured curve, and whose figures stand in for theirs
BORROW = {"h800": "dgx-h100", "hgx-b200": "dgx-h100", "a800": "dgx-a100", "dgx2": "dgx-a100", "ndv2": "dgx-a100",
          "mi250": "mi300x"}


@dataclass(frozen=True)
class Chosen:
    calibration: Calibration
    name: str  # what a report prints: "fitted: dgx-h100 + ib", "NCCL's own model", a file
    fitted_on: tuple[str, ...]  # the curves behind it
    borrowed: str | None = None  # the node type whose figures were used, when not this one
    errors: tuple[tuple[int, float], ...] = ()  # (bytes, |predicted/measured - 1|) on the points behind it

    def error_at(self, size_bytes: int, within: float = 4.0) -> float | None:
        """The median error of the points within a factor ``within`` of ``size_bytes`` (None: none there)."""
        near = sorted(e for b, e in self.errors if size_bytes / within <= b <= size_bytes * within)
        if not near:
            return None
        mid = len(near) // 2
        return near[mid] if len(near) % 2 else (near[mid - 1] + near[mid]) / 2


@cache
def _table() -> dict:
    return json.loads(DATA.read_text())


def fields_for(tab: dict, node: str, nodes: int, network: str) -> tuple[dict, list[str], str] | None:
    """From a table of fits (``data/calibrations.json``'s shape): the calibration's fields for
    ``nodes`` x ``node`` on ``network``, the curves behind them and the node type they belong to
    (``node``, or the one it borrows); None for a node type with none."""
    own = node if node in tab["intra"] else BORROW.get(node)
    if own is None:
        return None
    values = dict(tab["intra"][own]["fields"])
    fitted_on = list(tab["intra"][own]["fitted_on"])
    if nodes > 1:
        net = tab["net"].get(f"{own}+{network}") or tab["net"][f"{tab['net_fallback'][own]}+{network}"]
        values.update(net["fields"])
        fitted_on += net["fitted_on"]
    return values, fitted_on, own


@cache
def builtin(node: str, nodes: int, network: str = "ib") -> Chosen:
    """The fitted calibration for ``nodes`` nodes of ``node`` on ``network``."""
    if network not in NETWORKS:
        raise InputError("--network-kind", f"unknown network kind {network!r}", f"one of {', '.join(NETWORKS)}")
    found = fields_for(_table(), node, nodes, network)
    if found is None:
        return Chosen(IDENTITY, "NCCL's own model (no curve measured this node type)", ())
    values, fitted_on, own = found
    cal = calibration_from_dict(values)
    name = f"fitted: {own}" + (f" + {network}" if nodes > 1 else "")
    return Chosen(cal, name, tuple(fitted_on), None if own == node else own, _errors(cal, fitted_on, nodes))


def _errors(cal: Calibration, curve_ids: list[str], nodes: int) -> tuple[tuple[int, float], ...]:
    """How ``cal`` does on the curves it was fitted on that have ``nodes`` nodes (or, if none, all of them)."""
    from flowride.runtime.fit import judge, observed
    from flowride.runtime.measured import curve

    cs = [curve(i) for i in curve_ids]
    cs = [c for c in cs if c.nodes == nodes] or cs
    return tuple((j.bytes, abs(j.ratio - 1)) for j in judge(cal, observed(cs)))


def for_topology(topo, spec: str | Chosen | None = None, network: str | None = "ib") -> Chosen:
    """``--calibration`` for a topology: a fabric's node type and node count look up the built-in
    calibration; a topology with no node type (a preset of its own links, a file) gets NCCL's own
    model, unless ``spec`` names a profile file. A :class:`Chosen` is taken as it is; ``network``
    None is ``ib``."""
    if isinstance(spec, Chosen):
        return spec
    network = network or "ib"
    fab = topo.params.get("fabric") or {}
    node = fab.get("node")
    if node is None and spec in (None, "default", *NETWORKS):
        return Chosen(IDENTITY, "NCCL's own model (the topology names no node type; give --calibration FILE)", ())
    return resolve(spec, str(node or ""), int(fab.get("nodes", 1)), network)


def resolve(spec: str | None, node: str, nodes: int, network: str = "ib") -> Chosen:
    """``--calibration``: a built-in name (``default``: fitted; ``nccl``: NCCL's own model;
    ``ib``/``efa``: fitted for that network) or a profile file written by ``flowride calibrate``."""
    if spec in (None, "default"):
        return builtin(node, nodes, network)
    if spec == "nccl":
        return Chosen(IDENTITY, "NCCL's own model (uncorrected)", ())
    if spec in NETWORKS:
        return builtin(node, nodes, spec)
    prof = read_profile(spec)
    errs = tuple((int(r["bytes"]), abs(float(r["ratio"]) - 1)) for r in prof.fit if "bytes" in r and "ratio" in r)
    return Chosen(prof.calibration, f"profile {spec}", prof.fitted_on, None, errs)
