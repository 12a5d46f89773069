"""Fit flowride's built-in calibrations to the published nccl-tests curves and judge them.

    python benchmarks/nccl_fit.py [--write]

For each measured node type, the fields of what happens inside a node are fitted on its one-node
curves; then, holding those, the fields of what crossing nodes adds are fitted per network kind
on the two-node curves. Prints, per curve, the median |predicted/measured - 1| at and above 1 MiB
and below it, and the worst ratio; then the same for the two-node curves predicted from the
one-node fit alone (network fields at their priors: NIC efficiency 0.94 from NCCL's maintainers'
46-48 GB/s per 400 Gb/s NIC, nothing else). ``--write`` stores the fit in
src/flowride/runtime/data/calibrations.json (the defaults). Modelled figures against published
measurements; nothing here runs a collective.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from flowride.runtime.defaults import fields_for
from flowride.runtime.fit import (
    INTRA_FIELDS,
    NET_FIELDS,
    NVLS_FIELDS,
    Observed,
    fit,
    judge,
    observed,
    summary,
)
from flowride.runtime.measured import Curve, load_curves
from flowride.runtime.nccl_tuning import IDENTITY
from flowride.topology.fabrics import NODE_TYPES

DST = Path(__file__).resolve().parents[1] / "src" / "flowride" / "runtime" / "data" / "calibrations.json"
PRIOR_NET = {"bw_net": 0.94}


def network_of(c: Curve) -> str:
    return "efa" if c.id.startswith("aws") else "ib"


def points(curves: list[Curve]) -> list[Observed]:
    return observed(curves)


def fit_all(curves: tuple[Curve, ...]) -> dict:
    intra, net = {}, {}
    for node in sorted({c.node_type for c in curves if c.nodes == 1}):
        one = [c for c in curves if c.node_type == node and c.nodes == 1]
        names = tuple(f for f in INTRA_FIELDS if NODE_TYPES[node].multicast or f not in NVLS_FIELDS)
        cal = fit(points(one), names)
        intra[node] = {"fields": {k: getattr(cal, k) for k in names}, "fitted_on": [c.id for c in one]}
    for node in sorted(intra):
        base = replace(IDENTITY, **intra[node]["fields"], **PRIOR_NET)
        for kind in ("ib", "efa"):
            two = [c for c in curves if c.node_type == node and c.nodes > 1 and network_of(c) == kind]
            if two:
                cal = fit(points(two), NET_FIELDS, start=base)
                net[f"{node}+{kind}"] = {"fields": {k: getattr(cal, k) for k in NET_FIELDS}, "fitted_on": [c.id for c in two]}
    # a node type measured alone on one node borrows the network fields of another on the same kind
    fallback = {node: next((n for n in ("dgx-h100", "dgx-a100") if f"{n}+ib" in net), node) for node in intra}
    return {"about": "fitted by benchmarks/nccl_fit.py on src/flowride/runtime/data/nccl_measured.json",
            "intra": intra, "net": net, "net_fallback": fallback}


def calibration_for(tab: dict, c: Curve, one_node_only: bool = False):
    if one_node_only and c.nodes > 1:
        return replace(IDENTITY, **tab["intra"][c.node_type]["fields"], **PRIOR_NET)
    return replace(IDENTITY, **fields_for(tab, c.node_type, c.nodes, network_of(c))[0])


def _f(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def table(tab: dict | None, curves: tuple[Curve, ...], one_node_only: bool = False) -> tuple[list[str], list]:
    """Per curve, the calibration of ``tab`` against it (None: NCCL's own model, uncorrected)."""
    rows = ["| curve | points | median err >= 1 MiB | median err < 1 MiB | worst ratio (at) |", "|---|---:|---:|---:|---|"]
    every = []
    for c in curves:
        if one_node_only and c.nodes == 1:
            continue
        j = judge(IDENTITY if tab is None else calibration_for(tab, c, one_node_only), points([c]))
        every += j
        s = summary(j)
        rows.append(f"| {c.id} | {s['points']} | {_f(s['median_err_ge_1MiB'])} | {_f(s['median_err_lt_1MiB'])} | "
                    f"{s['worst_ratio']:.2f} ({s['worst_at'].split()[-2]} B) |")
    s = summary(every)
    rows.append(f"| **all** | {s['points']} | {_f(s['median_err_ge_1MiB'])} | {_f(s['median_err_lt_1MiB'])} | "
                f"{s['worst_ratio']:.2f} ({s['worst_at']}) |")
    return rows, every


def main(argv: list[str]) -> None:
    curves = load_curves()
    tab = fit_all(curves)
    if "--write" in argv:
        DST.write_text(json.dumps(tab, indent=1) + "\n")
    print("Calibrated NCCL model against the published curves (modelled vs measured, out-of-place time)\n")
    print("\n".join(table(tab, curves)[0]))
    print("\nTwo-node curves predicted from the one-node fit alone (network fields at their priors)\n")
    print("\n".join(table(tab, curves, one_node_only=True)[0]))
    print("\nNCCL's own model, uncorrected, on the same points\n")
    print("\n".join(table(None, curves)[0]))
    every = table(tab, curves)[1]
    known = [(j, p) for j, p in zip(every, points(list(curves)), strict=True) if p.known]
    print(f"\nNCCL's stated choice reproduced at {sum(j.algorithm == p.known for j, p in known)} of {len(known)} points")
    print("\nfields:", json.dumps({k: v["fields"] for k, v in {**tab["intra"], **tab["net"]}.items()}, indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
