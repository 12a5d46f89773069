"""Bubble predictors compared on the same measured waits, replayed from a run's rank records.

Separate runs on a noisy machine differ by more than predictors do, so this replays the waits a
``flowride train`` run measured (``RUN_DIR/rank*.json``) through each predictor, iteration by
iteration as the reporter would have seen them, and prints the median relative error per bubble
type: the plain median of the last 5 lengths (flowride's predictor before issue #32), the
pace-scaled one alone, and both with the better chosen per key (the reporter now). Only waits of
the bubble types (A-D) long enough to be announced (>= 2 ms predicted) count.

    python benchmarks/predictors.py RUN_DIR/rank0.json [RUN_DIR/rank1.json ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from flowride.pipeline.reporter import GapPredictor

MODES = ("plain", "pace", "auto")


def replay(rank_file: Path, min_bubble_s: float = 0.002) -> dict[str, dict[str, list[float]]]:
    r = json.loads(rank_file.read_text())
    its = {it["iteration"]: it for it in r["iterations"]}
    by_it: dict[int, list[dict]] = {}
    for w in r["waits"]:
        by_it.setdefault(w["iteration"], []).append(w)
    preds = {m: GapPredictor(5, mode=m) for m in MODES}
    errs: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
    for i in sorted(by_it):
        ws, t0 = by_it[i], its[i]["start"]
        for w in ws:
            length = w["end"] - w["start"]
            plain = preds["plain"].predict(w["key"])
            if length <= 0 or plain is None or plain < min_bubble_s or w["type"] == "S":
                continue
            for m, p in preds.items():
                errs[m].setdefault(w["type"], []).append(abs(p.predict(w["key"], w["start"] - t0) - length) / length)
        for p in preds.values():
            p.observe_iteration([(w["key"], w["end"] - w["start"], w["start"] - t0) for w in ws], its[i]["end"] - t0)
    return errs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ranks", nargs="+", type=Path, help="rank*.json files of flowride train runs")
    a = ap.parse_args()
    print("| run | rank | " + " | ".join(f"{m} (all; by type)" for m in MODES) + " |")
    print("|---|---|" + "---|" * len(MODES))
    for f in a.ranks:
        if "iterations" not in json.loads(f.read_text()):
            continue  # ranks.json (every rank gathered) sits beside them: skip it
        e = replay(f)
        cells = []
        for m in MODES:
            allv = [x for v in e[m].values() for x in v]
            by = ", ".join(f"{t} {statistics.median(v) * 100:.0f}" for t, v in sorted(e[m].items()))
            cells.append(f"{statistics.median(allv) * 100:.1f}% ({by})" if allv else "-")
        print(f"| {f.parent.name} | {f.stem} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
