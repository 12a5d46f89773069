"""The alpha-beta model cut into epochs: what one epoch of length tau means on each link.

This is the physics both the formulation (``flowride.synth``) and the simulator
(``flowride.schedule``) use, after the TE-CCL paper (SIGCOMM 2024; docs/synthesis.md):

- capacity: a link carries at most ``cap * tau`` chunks per epoch (cap in chunks/s);
- beta: when one chunk needs more than an epoch (cap*tau < 1) the link is busy for
  ``b = ceil(1/(cap*tau)) - 1`` extra epochs and at most ``floor((b+1)*cap*tau)`` chunks start in
  any b+1 consecutive epochs;
- alpha: ``a = ceil(alpha/tau)`` whole epochs, taken as 0 when alpha/tau <= 0.1;
- a chunk sent into a GPU in epoch k arrives at the start of epoch k + 1 + a + b;
- switches (the topology's ``switching``, :func:`link_hop_delay`): by default they cut through,
  as NVSwitch, InfiniBand and Ethernet switches do: a path through switches pays its
  transmission once, at its slowest hop, plus every hop's alpha. A switch forwards a chunk in the
  epoch its head arrives there; the delay into a switch is its alpha (plus, from a GPU, the one
  transmission epoch, and the extra epochs by which this link is slower than the switch's
  fastest way out), and the hop out to a GPU adds ``a + b``. ``store-and-forward`` charges every
  hop its own beta (the rule of flowride before cut-through was modelled), and the TE-CCL compat
  topologies keep the published rule (a switch -> GPU hop costs only ``a``).
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


SWITCHING = ("cut-through", "store-and-forward")


def link_hop_delay(src_switch: bool, dst_switch: bool, a: int, b: int, teccl_compat: bool = False,
                   switching: str = "cut-through", b_out_min: int = 0, copy_end: bool = False) -> int:
    """Epochs between a send and its arrival (into a GPU: it holds the chunk; into a switch: the
    switch forwards it in that epoch).

    - into a GPU from a GPU: ``1 + a + b`` (one transmission, its latency, its extra epochs when
      the link carries less than one chunk per epoch);
    - into a GPU from a switch: ``a + b``: the transfer is already under way;
    - ``cut-through`` (the physical default), into a switch: ``a`` plus ``max(0, b - b_out_min)``,
      the epochs by which this link is slower than the switch's fastest way out (so a chunk that
      comes in slowly does not leave faster than it came), plus 1 from a GPU (the transmission
      starts there) or where either end copies (a copying switch needs a real epoch between two
      switches, or a chunk could circle between them in no time and be copied out of nothing).
      A GPU -> switch* -> GPU path then costs ``1 + sum(a) + max(b)`` when the switches' links out
      to the path's next hop are their fastest, and never less;
    - ``store-and-forward``, into a switch: ``1 + a + b`` (every hop pays its own beta: flowride's
      rule before cut-through was modelled);
    - the published TE-CCL model (``teccl_compat``): ``1 + a + b`` into a switch and only ``a``
      out of one, which lets a chunk cross a slow switch -> GPU link faster than its bandwidth."""
    if not dst_switch:
        if src_switch:
            return a if teccl_compat else a + b
        return 1 + a + b
    if teccl_compat or switching == "store-and-forward":
        return 1 + a + b
    first = 1 if (not src_switch or copy_end) else 0
    return first + a + max(0, b - b_out_min)


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
    b_out_min = np.zeros(topo.num_nodes, dtype=np.int64)
    if len(b):
        b_out_min[:] = np.iinfo(np.int64).max
        np.minimum.at(b_out_min, topo.link_ends[0], b)
    for i, lk in enumerate(topo.links):
        copy_end = bool(src_sw[i] and dst_sw[i] and (topo.nodes[lk.src].copy or topo.nodes[lk.dst].copy))
        delay[i] = link_hop_delay(bool(src_sw[i]), bool(dst_sw[i]), int(a[i]), int(b[i]), topo.teccl_compat,
                                  topo.switching, int(b_out_min[lk.dst]), copy_end)
    return EpochTiming(tau, float(chunk_bytes), requested, cap, a, b, win, delay, src_sw, dst_sw)
