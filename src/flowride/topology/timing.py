"""The alpha-beta model cut into epochs: what one epoch of length tau means on each link.

This is the physics both the formulation (``flowride.synth``) and the simulator
(``flowride.schedule``) use, after the TE-CCL paper (SIGCOMM 2024; docs/synthesis.md):

- capacity: a link carries at most ``cap * tau`` chunks per epoch (cap in chunks/s);
- beta: when one chunk needs more than an epoch (cap*tau < 1) the link is busy for
  ``b = ceil(1/(cap*tau)) - 1`` extra epochs and at most ``floor((b+1)*cap*tau)`` chunks start in
  any b+1 consecutive epochs;
- alpha: ``a = ceil(alpha/tau)`` whole epochs, taken as 0 when alpha/tau <= 0.1;
- a chunk sent into a GPU or a switch in epoch k arrives at the start of epoch k + 1 + a + b;
  a switch forwards it in that very epoch, and a switch -> GPU hop adds its ``a + b``
  (cut-through: one transmission per GPU -> switch -> GPU transfer, its capacity still counted).
  The TE-CCL compat topologies charge that hop only ``a``, as the published model does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from flowride.errors import InputError
from flowride.topology.model import Topology

ALPHA_IGNORED_BELOW = 0.1  # alpha/tau at or below this costs no epoch
MAX_ALPHA_PER_EPOCH = 200.0  # tau is raised to alpha_min/200 when alpha_min/tau exceeds this
_EPS = 1e-9


def _ceil(x: float) -> int:
    return int(math.ceil(x - _EPS))


def _floor(x: float) -> int:
    return int(math.floor(x + _EPS))


@dataclass(frozen=True)
class EpochTiming:
    """Per-link integers of the epoch model, as numpy arrays indexed by link."""

    tau: float  # epoch length, seconds
    chunk_bytes: float
    requested_tau: float  # before the alpha_min/200 raise
    cap_per_epoch: np.ndarray  # float chunks per epoch
    alpha_epochs: np.ndarray  # a
    beta_epochs: np.ndarray  # b
    window_cap: np.ndarray  # chunks that may start in any b+1 consecutive epochs
    hop_delay: np.ndarray  # epochs from send to arrival/forwarding at the link's far end
    src_is_switch: np.ndarray
    dst_is_switch: np.ndarray

    def arrival(self, link: int, epoch: int) -> int:
        """Epoch at whose start the far end holds (GPU) or forwards (switch) a chunk sent in ``epoch``."""
        return epoch + int(self.hop_delay[link])


def link_hop_delay(src_switch: bool, dst_switch: bool, a: int, b: int, teccl_compat: bool = False) -> int:
    """Epochs between a send and its arrival: 1 + a + b into a GPU or a switch. Out of a switch
    into a GPU the transfer is already under way (cut-through), so it adds a + b: its latency, and
    the extra epochs a chunk needs on that link when it is slower than one chunk per epoch. The
    published TE-CCL model charges only a there (``teccl_compat``), which lets a chunk cross a slow
    switch -> GPU link faster than its bandwidth allows."""
    if src_switch and not dst_switch:
        return a if teccl_compat else a + b
    return 1 + a + b


def resolve_tau(topo: Topology, chunk_bytes: float, epoch: str | float) -> tuple[float, float]:
    """(tau, requested tau) for preset 'fast' / 'slow' or a length in seconds."""
    bws = np.array([lk.bytes_per_s for lk in topo.links])
    if isinstance(epoch, str):
        key = epoch.strip().lower()
        if key == "fast":
            requested = chunk_bytes / bws.max()
        elif key == "slow":
            requested = chunk_bytes / bws.min()
        else:
            try:
                requested = float(key)
            except ValueError:
                raise InputError("epoch", f"{epoch!r} is neither a preset nor seconds", "use fast, slow or e.g. 5e-6") from None
    else:
        requested = float(epoch)
    if not requested > 0 or not math.isfinite(requested):
        raise InputError("epoch", f"{requested!r} is not a positive length", "give seconds above zero")
    tau = requested
    alpha_min = min(lk.alpha_s for lk in topo.links)
    if alpha_min / tau > MAX_ALPHA_PER_EPOCH:
        tau = alpha_min / MAX_ALPHA_PER_EPOCH
    return tau, requested


def epoch_timing(topo: Topology, chunk_bytes: float, epoch: str | float = "fast") -> EpochTiming:
    """The epoch model of ``topo`` for chunks of ``chunk_bytes`` and epoch preset/length ``epoch``."""
    if not chunk_bytes > 0:
        raise InputError("size", "gives chunks of zero bytes", "use a larger size or fewer chunks")
    tau, requested = resolve_tau(topo, chunk_bytes, epoch)
    nl = len(topo.links)
    cap = np.empty(nl)
    a = np.empty(nl, dtype=np.int64)
    b = np.empty(nl, dtype=np.int64)
    win = np.empty(nl, dtype=np.int64)
    delay = np.empty(nl, dtype=np.int64)
    src_sw = np.empty(nl, dtype=bool)
    dst_sw = np.empty(nl, dtype=bool)
    for i, lk in enumerate(topo.links):
        cap[i] = lk.bytes_per_s * tau / chunk_bytes
        ratio = lk.alpha_s / tau
        a[i] = 0 if ratio <= ALPHA_IGNORED_BELOW else _ceil(ratio)
        b[i] = max(0, _ceil(1.0 / cap[i]) - 1)
        win[i] = _floor((b[i] + 1) * cap[i])
        src_sw[i] = not topo.nodes[lk.src].is_gpu
        dst_sw[i] = not topo.nodes[lk.dst].is_gpu
        delay[i] = link_hop_delay(bool(src_sw[i]), bool(dst_sw[i]), int(a[i]), int(b[i]), topo.teccl_compat)
    return EpochTiming(tau, float(chunk_bytes), requested, cap, a, b, win, delay, src_sw, dst_sw)
