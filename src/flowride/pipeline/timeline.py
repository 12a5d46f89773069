"""Drawing a run: a timeline PNG (one row per stage) and a Chrome trace (opens in Perfetto)."""

from __future__ import annotations

from pathlib import Path

from flowride.files import write_json_atomic, write_with
from flowride.pipeline.bubbles import Gap

COLORS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868", "O": "#8C8C8C"}
MIN_LABELLED = 0.02  # label bubbles longer than this fraction of the iteration


def _iteration(ranks: list[dict], gaps: list[Gap], it: int | None) -> tuple[int, float, float]:
    its = ranks[0]["iterations"]
    idx = its[-1]["iteration"] if it is None else it
    start = min(r["iterations"][idx]["start"] for r in ranks)
    end = max(r["iterations"][idx]["end"] for r in ranks)
    return idx, start, end


def write_png(ranks: list[dict], gaps: list[Gap], path: str | Path, title: str, iteration: int | None = None,
              side_steps: list[dict] | None = None) -> None:
    """One row per stage: compute coloured by kind, bubbles hatched and typed, and side-task
    steps (``side_steps``: dicts with stage, t0, t1, name) as green bars inside the bubbles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    idx, t0, t1 = _iteration(ranks, gaps, iteration)
    span = (t1 - t0) * 1e3
    p = len(ranks)
    fig, ax = plt.subplots(figsize=(12, 0.9 * p + 1.4))
    for rr in ranks:
        y = rr["rank"]
        for rec in rr["iterations"][idx]["records"]:
            a, b = (rec["compute"] - t0) * 1e3, (rec["end"] - t0) * 1e3
            ax.broken_barh([(a, b - a)], (y - 0.4, 0.8), facecolors=COLORS[rec["kind"]], edgecolor="white", linewidth=0.3)
            if rec["kind"] in "FBW" and (b - a) > span * 0.02:
                ax.text((a + b) / 2, y, f"{rec['kind']}{rec['mb']}", ha="center", va="center", fontsize=6, color="white")
    for g in gaps:
        if g.iteration != idx or g.seconds <= 0:
            continue
        a, b = (g.start - t0) * 1e3, (g.end - t0) * 1e3
        ax.broken_barh([(a, b - a)], (g.stage - 0.4, 0.8), facecolors="none", edgecolor="#C44E52", hatch="///", linewidth=0.5)
        if g.type != "S" and (b - a) > span * MIN_LABELLED:
            ax.text((a + b) / 2, g.stage + 0.25, g.type, ha="center", va="center", fontsize=8, color="#C44E52", weight="bold")
    for st in side_steps or []:
        a, b = (st["t0"] - t0) * 1e3, (st["t1"] - t0) * 1e3
        if b < 0 or a > span:
            continue
        ax.broken_barh([(a, b - a)], (st["stage"] - 0.15, 0.3), facecolors="#2CA02C", edgecolor="none")
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {r}" for r in range(p)])
    ax.invert_yaxis()
    ax.set_xlabel("ms since iteration start")
    ax.set_title(title)
    handles = [Patch(facecolor=c, label={"F": "forward", "B": "backward", "W": "weight grad", "O": "optimizer"}[k]) for k, c in COLORS.items()]
    handles.append(Patch(facecolor="none", edgecolor="#C44E52", hatch="///", label="bubble (A/B/C/D)"))
    if side_steps:
        handles.append(Patch(facecolor="#2CA02C", label="side-task step"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=6, fontsize=8, frameon=False)
    fig.tight_layout()
    write_with(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


def write_trace(ranks: list[dict], gaps: list[Gap], path: str | Path, side_steps: list[dict] | None = None) -> None:
    """Chrome trace events: compute spans per stage (thread), bubbles and side-task steps as
    their own processes, one thread per stage."""
    t0 = min(r["iterations"][0]["start"] for r in ranks)
    ev = []
    for rr in ranks:
        ev.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rr["rank"], "args": {"name": f"stage {rr['rank']}"}})
        for it in rr["iterations"]:
            for rec in it["records"]:
                if rec["compute"] > rec["start"]:
                    ev.append({"name": "recv wait", "cat": "comm", "ph": "X", "pid": 0, "tid": rr["rank"],
                               "ts": (rec["start"] - t0) * 1e6, "dur": (rec["compute"] - rec["start"]) * 1e6})
                name = "optimizer" if rec["kind"] == "O" else f"{rec['kind']}{rec['mb']}.{rec['chunk']}"
                ev.append({"name": name, "cat": rec["kind"], "ph": "X", "pid": 0, "tid": rr["rank"],
                           "ts": (rec["compute"] - t0) * 1e6, "dur": (rec["end"] - rec["compute"]) * 1e6,
                           "args": {"iteration": it["iteration"]}})
    for g in gaps:
        if g.seconds > 0:
            ev.append({"name": f"bubble {g.type}", "cat": "bubble", "ph": "X", "pid": 1, "tid": g.stage,
                       "ts": (g.start - t0) * 1e6, "dur": g.seconds * 1e6, "args": {"iteration": g.iteration}})
    for st in side_steps or []:
        ev.append({"name": st["name"], "cat": "side", "ph": "X", "pid": 2, "tid": st["stage"],
                   "ts": (st["t0"] - t0) * 1e6, "dur": (st["t1"] - st["t0"]) * 1e6, "args": {"task": st["task"]}})
    ev.append({"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "side tasks"}})
    ev.append({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "compute"}})
    ev.append({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "bubbles"}})
    write_json_atomic(path, {"traceEvents": ev, "displayTimeUnit": "ms"})
