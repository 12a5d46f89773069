"""Synthesis: the models (MILP, LP, static LP), their HiGHS backend, the searches, the bounds, and
the greedy baselines. :func:`flowride.api.synthesize` runs them; these are the parts."""

from flowride.synth.bounds import Bounds, epoch_lower_bound, lower_bounds
from flowride.synth.greedy import baseline_sends, direct_alltoall, ring_allgather
from flowride.synth.horizon import bisect_horizon
from flowride.synth.milp import build_model, sends_from_solution
from flowride.synth.result import Probe, SearchResult

__all__ = [
    "Bounds", "Probe", "SearchResult", "baseline_sends", "bisect_horizon", "build_model", "direct_alltoall",
    "epoch_lower_bound", "lower_bounds", "ring_allgather", "sends_from_solution",
]
