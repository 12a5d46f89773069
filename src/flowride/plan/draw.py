"""A plan's iteration drawn: one row per pipeline stage, compute by kind, tensor-parallel
communication inside each action, bubbles by type, the data-parallel synchronisation at the end."""

from __future__ import annotations

from pathlib import Path

from flowride.files import write_with
from flowride.plan.iteration import Timeline

COLOURS = {"F": "#4c72b0", "B": "#dd8452", "I": "#dd8452", "W": "#55a868"}


def write_png(tl: Timeline, tp_s: float, path: str | Path, title: str) -> None:
    """``tl`` as a PNG at ``path``: see the module. ``tp_s``: the TP (and CP) seconds inside a forward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    n = tl.ranks
    fig, ax = plt.subplots(figsize=(14, 0.45 * n + 1.8))
    scale = 1e3  # ms
    edges = sum(len(a) for a in tl.actions) <= 2000
    for r, acts in enumerate(tl.actions):  # one call per (stage, kind): a 10k-action plan draws in a second
        by_kind: dict[str, list[tuple[float, float]]] = {}
        tp_bars = []
        for s, e, a in acts:
            by_kind.setdefault(a.kind, []).append((s * scale, (e - s) * scale))
            if tp_s > 0 and a.kind in ("F", "B", "I"):
                tp_bars.append(((e - tp_s) * scale, tp_s * scale))
        for kind, bars in by_kind.items():
            ax.broken_barh(bars, (r - 0.4, 0.8), facecolors=COLOURS.get(kind, "grey"),
                           edgecolor="white" if edges else None, linewidth=0.3)
        if tp_bars:
            ax.broken_barh(tp_bars, (r - 0.4, 0.25), facecolors="#8172b3")
        if tl.dp_s[r] > 0 and tl.dp_start:
            ax.broken_barh([(tl.dp_start[r] * scale, tl.dp_s[r] * scale)], (r - 0.4, 0.8), facecolors="#937860")
    gaps: dict[int, list[tuple[float, float]]] = {}
    for g in tl.gaps:
        gaps.setdefault(g.rank, []).append((g.start * scale, g.seconds * scale))
    for r, bars in gaps.items():
        ax.broken_barh(bars, (r - 0.4, 0.8), facecolors="none", edgecolor="#999999", hatch="///", linewidth=0.0)
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"stage {r}" for r in range(n)])
    ax.invert_yaxis()
    ax.set_xlabel("time in the iteration (ms)")
    ax.set_xlim(0, tl.iteration_s * scale)
    ax.set_title(title, fontsize=9)
    ax.legend(handles=[Patch(color=COLOURS["F"], label="forward"), Patch(color=COLOURS["B"], label="backward (input grad)"),
                       Patch(color=COLOURS["W"], label="weight grad"), Patch(color="#8172b3", label="TP (and CP) comm."),
                       Patch(color="#937860", label="DP sync (exposed)"),
                       Patch(facecolor="none", edgecolor="#999999", hatch="///", label="bubble")],
              loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=6, fontsize=8, frameon=False)
    fig.tight_layout()
    write_with(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
