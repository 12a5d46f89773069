"""Sizes swept: synthesis at many sizes, each warm-started from the previous (:mod:`.synth`), and
MSCCL algorithms exported per message-size range from such sweeps (:mod:`.ranges`), and the CSV
NCCL's example tuner plugin reads (:mod:`.nccl_tuner`, checked by :mod:`.nccl_tuner_rules`).

A floor above :mod:`flowride.api` (it calls the synthesis) and :mod:`flowride.program` (it
writes MSCCL XML); only the CLI imports it."""

from flowride.runtime.nccl_tuning import NCCL_TUNING_SOURCE, PROTOCOL_RULE, nccl_protocol
from flowride.sizes import DEFAULT_MAX_LOSS
from flowride.sweep.nccl_tuner import (
    Choice,
    SizeChoice,
    TunerPlan,
    TunerRange,
    export_nccl_tuner,
    plan_tuner,
    side_table_path,
    size_choice,
    tile,
    tuner_collectives,
    write_tuner,
)
from flowride.sweep.nccl_tuner_rules import (
    Finding,
    Kept,
    TunerRow,
    check_tuner_csv,
    parse_tuner_csv,
)
from flowride.sweep.ranges import (
    Candidate,
    RangeAlgo,
    RangePlan,
    SizePick,
    check_export,
    check_no_relays,
    export_ranges,
    export_unit,
    gpu_bus_GBps,
    plan_ranges,
    split_by_loss,
    stale_files,
    write_ranges,
)
from flowride.sweep.synth import (
    SweepPoint,
    sweep_file_name,
    sweep_files,
    sweep_sizes_for,
    synthesize_sweep,
)

__all__ = [
    "Choice", "Finding", "Kept", "SizeChoice", "TunerPlan", "TunerRange", "TunerRow", "check_tuner_csv", "export_nccl_tuner",
    "parse_tuner_csv", "plan_tuner", "side_table_path", "size_choice", "tile", "tuner_collectives", "write_tuner",
    "DEFAULT_MAX_LOSS", "NCCL_TUNING_SOURCE", "PROTOCOL_RULE", "Candidate", "RangeAlgo", "RangePlan", "SizePick", "SweepPoint",
    "check_export", "check_no_relays", "export_ranges", "export_unit", "gpu_bus_GBps", "nccl_protocol", "plan_ranges", "split_by_loss",
    "stale_files", "sweep_file_name", "sweep_files", "sweep_sizes_for", "synthesize_sweep", "write_ranges",
]
