"""Schedules made alone, run together: how long each takes when they share links.

This is the model for what NCCL does (each collective's rings or trees chosen as if it were
alone, its kernels then competing for the links) and for flowride's own independent schedules run
side by side. A fluid model: collective ``i`` alone takes ``T[i]`` seconds and puts ``B[i, l]``
bytes on link ``l``, spread evenly over its run, so at speed ``phi`` (1: as fast as alone) it
asks ``phi * B[i, l] / T[i]`` bytes/s of the link. While several run, speeds are max-min fair:
all rise together until a link is full or a collective reaches its own pace, those freeze, the
rest go on (progressive filling, as flows share a link). Speeds are recomputed whenever one
starts or finishes.

What it leaves out, stated where its figures are reported: bursts (a schedule that uses a link in
a burst collides more, or less, than its average says), and the latency part of a run is slowed
with the rest. It gives NCCL's concurrent collectives no penalty for their channels' own
interference, so it flatters them if anything.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-12


def fair_speeds(rates: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Max-min fair speeds in (0, 1] for collectives asking ``rates`` [k, links] bytes/s each at
    full speed from links of ``caps`` bytes/s."""
    k = rates.shape[0]
    phi = np.zeros(k)
    frozen = np.zeros(k, dtype=bool)
    used = np.zeros(rates.shape[1])
    while not frozen.all():
        live = ~frozen
        ask = rates[live].sum(axis=0)  # bytes/s one more unit of speed costs each link
        room = caps - used
        with np.errstate(divide="ignore", invalid="ignore"):
            step_links = np.where(ask > EPS, room / ask, np.inf)
        step = min(float(step_links.min()), float((1.0 - phi[live]).min()))
        step = max(step, 0.0)
        phi[live] += step
        used += step * ask
        full = (ask > EPS) & (caps - used <= 1e-9 * np.maximum(caps, 1.0))
        newly = live & ((phi >= 1.0 - 1e-12) | (rates[:, full] > EPS).any(axis=1))
        if not newly.any():  # numerical corner: freeze the rest where they are
            newly = live
        frozen |= newly
    return np.clip(phi, EPS, 1.0)


def run_together(starts: np.ndarray, alone_s: np.ndarray, loads: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Finish times (seconds, same origin as ``starts``) of collectives that alone take
    ``alone_s`` and put ``loads`` [k, links] bytes on links of ``caps`` bytes/s, run from ``starts``."""
    k = len(starts)
    starts = np.asarray(starts, dtype=float)
    alone_s = np.maximum(np.asarray(alone_s, dtype=float), EPS)
    rates = np.asarray(loads, dtype=float) / alone_s[:, None]
    left = np.ones(k)  # fraction of each collective still to run
    finish = np.full(k, np.nan)
    t = float(starts.min())
    while np.isnan(finish).any():
        active = (starts <= t + 1e-15) & np.isnan(finish)
        pending = starts[(starts > t + 1e-15) & np.isnan(finish)]
        if not active.any():
            t = float(pending.min())
            continue
        phi = np.zeros(k)
        phi[active] = fair_speeds(rates[active], caps)
        to_end = np.where(active, left * alone_s / np.maximum(phi, EPS), np.inf)
        dt = float(to_end.min())
        if pending.size:
            dt = min(dt, float(pending.min()) - t)
        left = np.where(active, left - dt * phi / alone_s, left)
        t += dt
        done = active & (left <= 1e-9)
        finish[done] = t
    return finish
