"""Synthesis: the MILP formulation, its HiGHS backend, horizon search, and greedy baselines."""

from flowride.synth.greedy import baseline_sends, direct_alltoall, ring_allgather
from flowride.synth.horizon import SearchResult, bisect_horizon, epoch_lower_bound
from flowride.synth.milp import build_model, sends_from_solution

__all__ = [
    "SearchResult", "baseline_sends", "bisect_horizon", "build_model", "direct_alltoall", "epoch_lower_bound",
    "ring_allgather", "sends_from_solution",
]
