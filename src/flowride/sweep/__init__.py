"""Sizes swept: synthesis at many sizes, each warm-started from the previous (:mod:`.synth`), and
MSCCL algorithms exported per message-size range from such sweeps (:mod:`.ranges`).

A floor above :mod:`flowride.api` (it calls the synthesis) and :mod:`flowride.program` (it
writes MSCCL XML); only the CLI imports it."""

from flowride.sweep.ranges import (
    PROTOCOL_RULE,
    Candidate,
    RangeAlgo,
    RangePlan,
    SizePick,
    export_ranges,
    gpu_bus_GBps,
    nccl_protocol,
    plan_ranges,
    write_ranges,
)
from flowride.sweep.synth import SweepPoint, sweep_sizes_for, synthesize_sweep

__all__ = [
    "PROTOCOL_RULE", "Candidate", "RangeAlgo", "RangePlan", "SizePick", "SweepPoint", "export_ranges", "gpu_bus_GBps",
    "nccl_protocol", "plan_ranges", "sweep_sizes_for", "synthesize_sweep", "write_ranges",
]
