"""Looking at a schedule: a Chrome trace (opens in Perfetto) and a PNG of link utilisation.

A schedule is a list of sends; what a person wants to see is *when each link is busy* and *when
each GPU gets its data*. Both views here derive from the same epoch model the simulator uses
(:mod:`flowride.topology.timing`), so a picture never disagrees with the verifier:

- a chunk on a link of ``c = cap_per_epoch`` chunks per epoch takes ``1/c`` epochs of that link's
  time (its transmission, chunk bytes / bandwidth). With ``c >= 1`` that is a slice of the epoch
  it is sent in; with ``c < 1`` the link is busy for ``b + 1`` epochs (``b = beta_epochs``), and
  the model only bounds the starts in any ``b + 1`` consecutive epochs, so the chunk's ``1/c``
  epochs of work are spread evenly over them;
- the far end holds (GPU) or forwards (switch) the chunk from the start of epoch
  ``timing.arrival(link, epoch)``; the gap between the end of the transmission and that epoch is
  latency (alpha) and epoch rounding, during which the link is free for the next chunk.

Nothing here prints, exits or validates a schedule beyond what drawing needs: run
:func:`flowride.schedule.simulate` for that. A send that names no link of the topology or a
negative epoch cannot be placed on any track, so it is an :class:`~flowride.errors.InputError`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from flowride.errors import InputError
from flowride.files import write_json_atomic, write_with
from flowride.schedule.ir import Schedule, Send
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming
from flowride.units import format_size

LINKS_PID = 1  # Chrome-trace process holding one thread track per link (tid = link index)
GPUS_PID = 2  # Chrome-trace process holding one thread track per GPU (tid = node id)
MAX_ROW_LABELS = 48  # label every row of a heatmap up to this many rows, then only some
MAX_COLUMNS = 600  # epochs drawn one per column up to this many, then averaged in bins


# ------------------------------------------------------------------------------------ names
def node_name(topo: Topology, node: int) -> str:
    """``GPU3`` or ``switch8``, with the node's label when it has one (``switch16 (nic)``), so a
    track name says what a node is and its id matches the topology file and the simulator."""
    nd = topo.nodes[node]
    name = f"GPU{node}" if nd.is_gpu else f"switch{node}"
    return f"{name} ({nd.label})" if nd.label else name


def link_name(topo: Topology, link: int) -> str:
    """``GPU0->switch3``: a link by its two ends, as people name links."""
    lk = topo.links[link]
    return f"{node_name(topo, lk.src)}->{node_name(topo, lk.dst)}"


def _is_reduce(send: Send) -> bool:
    # ``reduce`` is an optional field of Send; schedules without it only copy.
    return bool(getattr(send, "reduce", False))


def _chunk_label(send: Send) -> str:
    text = f"chunk ({send.source},{send.chunk})"
    return f"reduce {text}" if _is_reduce(send) else text


def _checked_sends(schedule: Schedule) -> list[Send]:
    """The sends, after checking each can be drawn: a real link and an epoch of zero or more."""
    nl = len(schedule.topology.links)
    for i, s in enumerate(schedule.sends):
        if not 0 <= s.link < nl:
            raise InputError(
                f"sends[{i}]",
                f"names link {s.link}, but {schedule.topology.name} has links 0..{nl - 1}",
                "run flowride verify on the schedule",
            )
        if s.epoch < 0:
            raise InputError(
                f"sends[{i}]",
                f"has negative epoch {s.epoch}",
                "run flowride verify on the schedule",
            )
    return list(schedule.sends)


def horizon(schedule: Schedule, timing: EpochTiming | None = None) -> int:
    """Epochs the pictures span: until the last chunk is held or forwarded and the last link is
    free again (``epoch + b + 1``; a cut-through switch -> GPU hop can arrive before that)."""
    timing = timing or schedule.timing
    last = 0
    for s in _checked_sends(schedule):
        last = max(
            last, timing.arrival(s.link, s.epoch), s.epoch + int(timing.beta_epochs[s.link]) + 1
        )
    return last


# ------------------------------------------------------------------------------ utilisation
def link_utilisation(schedule: Schedule, epochs: int | None = None) -> np.ndarray:
    """Fraction of each link's capacity used in each epoch, shape ``[links, epochs]``.

    A chunk needs ``1/c`` epochs of a link with ``c = cap_per_epoch`` chunks per epoch. The model
    (and the simulator's capacity check) counts it against its send epoch and the ``b`` after it,
    so it adds ``1 / (c * (b + 1))`` to each of those ``b + 1`` epochs: ``1/c`` when ``c >= 1``
    (``b = 0``). A valid schedule starts at most ``floor((b + 1) * c)`` chunks in any ``b + 1``
    epochs, which keeps every value at or below 1; an over-full link shows above 1.

    ``epochs`` (default :func:`horizon`) sets the number of columns; later sends are cut off.
    The occupancy is accumulated as integer counts and scaled once per link, so the values are
    exact up to one rounding (no drift over thousands of epochs).
    """
    timing = schedule.timing
    sends = _checked_sends(schedule)
    n_epochs = horizon(schedule, timing) if epochs is None else int(epochs)
    if n_epochs < 0:
        raise InputError("epochs", f"{epochs} is negative", "give zero or more epochs")
    nl = len(schedule.topology.links)
    b = np.asarray(timing.beta_epochs, dtype=np.int64)
    cap = np.asarray(timing.cap_per_epoch, dtype=float)
    # chunks in flight on each link per epoch, as a difference array: +1 at the send epoch,
    # -1 after its last busy epoch; the cumulative sum is the count.
    diff = np.zeros((nl, n_epochs + 1), dtype=np.int64)
    if sends:
        link = np.fromiter((s.link for s in sends), dtype=np.int64, count=len(sends))
        start = np.fromiter((s.epoch for s in sends), dtype=np.int64, count=len(sends))
        stop = start + b[link] + 1
        np.add.at(diff, (link, np.minimum(start, n_epochs)), 1)
        np.add.at(diff, (link, np.minimum(stop, n_epochs)), -1)
    busy = np.cumsum(diff[:, :n_epochs], axis=1)
    per_chunk = 1.0 / (cap * (b + 1))
    return busy * per_chunk[:, None]


def _received(schedule: Schedule, epochs: int) -> tuple[list[int], np.ndarray]:
    """(GPU ids, distinct chunks each holds by the end of each epoch): a chunk counts from its
    first arrival, own chunks do not count. Shape ``[gpus, epochs]``."""
    topo = schedule.topology
    timing = schedule.timing
    gpus = list(topo.gpus)
    row = {g: i for i, g in enumerate(gpus)}
    first: dict[tuple[int, int, int], int] = {}
    for s in _checked_sends(schedule):
        dst = topo.links[s.link].dst
        if dst in row and dst != s.source:
            key = (dst, s.source, s.chunk)
            t = timing.arrival(s.link, s.epoch)
            first[key] = min(t, first.get(key, t))
    diff = np.zeros((len(gpus), epochs + 1), dtype=np.int64)
    for (dst, _, _), t in first.items():
        # held from the start of epoch t = by the end of epoch t - 1
        diff[row[dst], min(max(t - 1, 0), epochs)] += 1
    return gpus, np.cumsum(diff[:, :epochs], axis=1)


# ------------------------------------------------------------------------------ Chrome trace
def chrome_trace(schedule: Schedule) -> dict[str, Any]:
    """The schedule as Chrome trace events (JSON object format), for Perfetto or chrome://tracing.

    Process ``links`` has one thread track per link (tid = link index, named ``GPU0->switch3``);
    process ``gpus`` one per GPU (tid = node id). Each send is one complete event (``ph: X``) on
    its link track, named ``chunk (source,chunk)`` (``reduce chunk ...`` for a reduction), with
    its epoch, link, source, chunk and arrival epoch in ``args``.

    The slice covers the chunk's *transmission*, ``1/c`` epochs from the start of its send epoch,
    not the whole way to its arrival: with latency the next chunk is on the link before the
    previous one arrives, and trace viewers require the slices of one track to nest, so slices
    up to the arrival would overlap and be dropped or misdrawn. When ``c >= 1`` several chunks
    share an epoch; they are laid end to end in (source, chunk) order, which is how the link
    serialises them. For a valid schedule no two slices of a track overlap. The arrival is
    in ``args`` (``arrival_epoch``, ``arrival_us``) and on the GPU tracks.

    GPU tracks carry instant events: ``recv chunk (s,c)`` when the GPU holds a chunk
    (at the start of the arrival epoch) and ``send chunk (s,c)`` when it puts one on a link.
    Times are microseconds since the start of epoch 0, as the format requires.
    """
    topo = schedule.topology
    timing = schedule.timing
    sends = _checked_sends(schedule)
    tau_us = timing.tau * 1e6
    cap = timing.cap_per_epoch
    events: list[dict[str, Any]] = []

    def meta(name: str, pid: int, args: dict[str, Any], tid: int | None = None) -> None:
        ev: dict[str, Any] = {"name": name, "ph": "M", "pid": pid, "args": args}
        if tid is not None:
            ev["tid"] = tid
        events.append(ev)

    meta("process_name", LINKS_PID, {"name": "links"})
    meta("process_sort_index", LINKS_PID, {"sort_index": 0})
    meta("process_name", GPUS_PID, {"name": "gpus"})
    meta("process_sort_index", GPUS_PID, {"sort_index": 1})
    for li in range(len(topo.links)):
        meta("thread_name", LINKS_PID, {"name": link_name(topo, li)}, li)
        meta("thread_sort_index", LINKS_PID, {"sort_index": li}, li)
    for rank, g in enumerate(topo.gpus):
        meta("thread_name", GPUS_PID, {"name": node_name(topo, g)}, g)
        meta("thread_sort_index", GPUS_PID, {"sort_index": rank}, g)

    by_slot: dict[tuple[int, int], list[Send]] = defaultdict(list)
    for s in sends:
        by_slot[(s.link, s.epoch)].append(s)
    timed: list[dict[str, Any]] = []
    for (li, k), group in by_slot.items():
        group.sort(key=lambda s: (s.source, s.chunk, _is_reduce(s)))
        lk = topo.links[li]
        dur = tau_us / float(cap[li])
        for i, s in enumerate(group):
            arrival = timing.arrival(li, k)
            label = _chunk_label(s)
            cat = "reduce" if _is_reduce(s) else "copy"
            ts = k * tau_us + i * dur
            timed.append(
                {
                    "name": label,
                    "cat": cat,
                    "ph": "X",
                    "pid": LINKS_PID,
                    "tid": li,
                    "ts": ts,
                    "dur": dur,
                    "args": {
                        "epoch": k,
                        "link": li,
                        "source": s.source,
                        "chunk": s.chunk,
                        "reduce": _is_reduce(s),
                        "arrival_epoch": arrival,
                        "arrival_us": arrival * tau_us,
                    },
                }
            )
            if topo.nodes[lk.src].is_gpu:
                timed.append(
                    {
                        "name": f"send {label}",
                        "cat": cat,
                        "ph": "i",
                        "s": "t",
                        "pid": GPUS_PID,
                        "tid": lk.src,
                        "ts": k * tau_us,
                        "args": {"epoch": k, "link": li, "to": node_name(topo, lk.dst)},
                    }
                )
            if topo.nodes[lk.dst].is_gpu:
                timed.append(
                    {
                        "name": f"recv {label}",
                        "cat": cat,
                        "ph": "i",
                        "s": "t",
                        "pid": GPUS_PID,
                        "tid": lk.dst,
                        "ts": arrival * tau_us,
                        "args": {
                            "epoch": arrival,
                            "link": li,
                            "from": node_name(topo, lk.src),
                            "sent_epoch": k,
                        },
                    }
                )
    timed.sort(key=lambda e: (e["ts"], e["pid"], e["tid"], e["ph"] != "X"))
    events.extend(timed)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "topology": topo.name,
            "collective": schedule.collective.value,
            "size_bytes": schedule.size_bytes,
            "chunks": schedule.chunks,
            "chunk_bytes": timing.chunk_bytes,
            "epoch_us": tau_us,
            "epochs": horizon(schedule, timing),
            "sends": len(sends),
            "method": schedule.meta.get("method"),
        },
    }


def write_trace(schedule: Schedule, path: str | Path) -> None:
    """Write :func:`chrome_trace` as JSON, atomically (temp file + rename): a crash or a viewer
    reading while we write never sees half a trace."""
    write_json_atomic(path, chrome_trace(schedule))


# ------------------------------------------------------------------------------------ PNG
def _row_ticks(ax, labels: list[str]) -> None:
    """Row labels at row centres; with many rows only every n-th, so they stay legible."""
    n = len(labels)
    step = max(1, -(-n // MAX_ROW_LABELS))
    rows = list(range(0, n, step))
    ax.set_yticks([r + 0.5 for r in rows])
    ax.set_yticklabels([labels[r] for r in rows], fontsize=7 if n <= 24 else 6)


def _binned(a: np.ndarray, k: int, how: str) -> np.ndarray:
    """Columns of ``a`` in bins of ``k`` (the last one padded): their mean (``"mean"``, for
    utilisation, zero-padded) or their last value (``"last"``, for cumulative counts)."""
    if k <= 1:
        return a
    rows, cols = a.shape
    nb = -(-cols // k)
    mode = "constant" if how == "mean" else "edge"
    padded = np.pad(a, ((0, 0), (0, nb * k - cols)), mode=mode).reshape(rows, nb, k)
    return padded.mean(axis=2) if how == "mean" else padded[:, :, -1]


def write_png(schedule: Schedule, path: str | Path, title: str | None = None) -> None:
    """A heatmap of :func:`link_utilisation` (a row per link, a column per epoch, epochs below and
    microseconds above) over a heatmap of the chunks each GPU has received by the end of each
    epoch, written atomically (temp file in the same folder + rename).

    Drawn with ``imshow`` on a bare :class:`matplotlib.figure.Figure` (Agg canvas): one image per
    panel, however many links and epochs, so thousands of epochs still render in a second or
    two; and no pyplot, so the caller's backend and figure registry are left alone. With more
    epochs than :data:`MAX_COLUMNS` we average them in equal bins ourselves (and say so on the
    colour bar) rather than let the renderer drop or blend columns, which would show a
    half-busy link as either idle or full. Idle cells are white; over-full ones (a value above
    1: an invalid schedule) red.
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    topo = schedule.topology
    timing = schedule.timing
    n_epochs = horizon(schedule, timing)
    width = max(n_epochs, 1)  # an empty schedule still gets one (blank) column
    util = link_utilisation(schedule, width)
    gpus, held = _received(schedule, width)
    nl, ng = len(topo.links), len(gpus)
    tau_us = timing.tau * 1e6
    k = -(-width // MAX_COLUMNS)  # epochs per column
    util, held = _binned(util, k, "mean"), _binned(held, k, "last")
    right = util.shape[1] * k  # the binned image spans whole bins

    h_util = min(9.0, 0.9 + 0.16 * nl)
    h_held = min(5.0, 0.8 + 0.16 * ng)
    fig = Figure(figsize=(12, h_util + h_held + 1.6), layout="constrained")
    ax_u, ax_h = fig.subplots(2, 1, sharex=True, height_ratios=[h_util, h_held])

    # idle link-epochs (masked) stay blank, so the busy ones stand out; over-full ones are red
    cmap = colormaps["viridis"].with_extremes(over="#d62728", bad="white")
    over = bool(util.size and util.max() > 1 + 1e-9)
    im = ax_u.imshow(
        np.ma.masked_where(util <= 0, util),
        aspect="auto",
        cmap=cmap,
        vmin=0.0,
        vmax=1.0,
        interpolation="nearest",
        extent=(0, right, nl, 0),
    )
    label = "link utilisation" if k == 1 else f"link utilisation (mean of {k} epochs)"
    fig.colorbar(im, ax=ax_u, label=label, extend="max" if over else "neither", pad=0.01)
    _row_ticks(ax_u, [link_name(topo, li) for li in range(nl)])
    ax_u.set_ylabel("link")
    top = ax_u.secondary_xaxis("top", functions=(lambda e: e * tau_us, lambda t: t / tau_us))
    top.set_xlabel("µs")

    vmax = max(1, int(held.max())) if held.size else 1
    im2 = ax_h.imshow(
        held,
        aspect="auto",
        cmap="Blues",
        vmin=0,
        vmax=vmax,
        interpolation="nearest",
        extent=(0, right, ng, 0),
    )
    fig.colorbar(im2, ax=ax_h, label="chunks received", pad=0.01)
    _row_ticks(ax_h, [node_name(topo, g) for g in gpus])
    ax_h.set_ylabel("GPU")
    ax_h.set_xlabel(f"epoch ({tau_us:.4g} µs each)")
    ax_h.set_xlim(0, width)

    if title is None:
        title = (
            f"{topo.name} {schedule.collective.value}, {format_size(schedule.size_bytes)} in "
            f"{schedule.chunks} chunk(s): {len(schedule.sends)} sends over {n_epochs} epochs"
        )
    fig.suptitle(title, fontsize=10)

    write_with(path, lambda f: fig.savefig(f, format="png", dpi=110))
