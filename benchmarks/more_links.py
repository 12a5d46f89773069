"""Issue #35, gap 2: a topology with more links never gives a slower schedule, measured.

For each imported machine (``nvidia-smi topo -m`` and NCCL's topology XML, as shipped in
examples/topologies/), the same synthesis runs three ways in one process, one after another:

- **NVLinks only**: the import with ``nvlink_only=True`` (the smaller topology);
- **whole, before**: the whole import (NVLinks + PCIe tree) without the faster-subgraph candidates
  (``synthesize_with(..., subgraphs=False)``, what flowride did before this change);
- **whole, now**: the whole import as ``flowride synth`` runs it now (api/subgraphs.py).

"now ÷ NVLinks" must be ≤ 1. The figures are epoch-model finish times from the simulator (no GPU).

    .venv/bin/python benchmarks/more_links.py                       # the issue's DGX-1V case and the rest
    .venv/bin/python benchmarks/more_links.py --time-limit 120 --only dgx1-nvidia-smi
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flowride.api import synthesize_with
from flowride.synth.options import SynthOptions
from flowride.topology.nccl_xml import import_nccl_xml
from flowride.topology.nvsmi import import_nvidia_smi
from flowride.units import parse_size

EX = Path(__file__).resolve().parents[1] / "examples" / "topologies"
FILES = {"dgx1-nvidia-smi": (import_nvidia_smi, "dgx1-nvidia-smi.txt"), "dgx1-nccl-topo": (import_nccl_xml, "dgx1-nccl-topo.xml"),
         "dgx-h100-nvidia-smi": (import_nvidia_smi, "dgx-h100-nvidia-smi.txt")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(FILES), help="comma list of: " + ", ".join(FILES))
    ap.add_argument("--collectives", default="allgather,alltoall")
    ap.add_argument("--sizes", default="1MB,64MB")
    ap.add_argument("--epoch", default="slow")
    ap.add_argument("--time-limit", type=float, default=120.0)
    a = ap.parse_args()

    print(f"epoch {a.epoch}, --chunks auto, --time-limit {a.time_limit:g} s each\n")
    print("| machine | links (NVLink / whole) | collective | size | NVLinks only µs | whole, before µs | whole, now µs | now ÷ NVLinks | "
          "before ÷ NVLinks | made on | seconds (NVLinks / before / now) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key in a.only.split(","):
        reader, name = FILES[key]
        small = reader(EX / name, nvlink_only=True).topology
        whole = reader(EX / name).topology
        for coll in a.collectives.split(","):
            for size in a.sizes.split(","):
                opts = SynthOptions(epoch=a.epoch, time_limit=a.time_limit)
                b = parse_size(size)
                s = synthesize_with(small, coll, b, "auto", opts, nccl=False)
                old = synthesize_with(whole, coll, b, "auto", opts, nccl=False, subgraphs=False)
                new = synthesize_with(whole, coll, b, "auto", opts, nccl=False)
                assert s.sim.valid and old.sim.valid and new.sim.valid
                us = [o.finish_time_s * 1e6 for o in (s, old, new)]
                print(f"| {key} | {len(small.links)} / {len(whole.links)} | {coll} | {size} | {us[0]:.4g} | {us[1]:.4g} | {us[2]:.4g} | "
                      f"{us[2] / us[0]:.3f} | {us[1] / us[0]:.3f} | {new.schedule.meta.get('subgraph') or 'whole'} | "
                      f"{s.wall_seconds:.0f} / {old.wall_seconds:.0f} / {new.wall_seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
