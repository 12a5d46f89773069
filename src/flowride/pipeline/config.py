"""Configuration of one pipeline-parallel training run (plain data, JSON round trip)."""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from flowride.errors import InputError
from flowride.pipeline.torch_compat import SCHEDULE_CLASSES as TORCH_SCHEDULES
from flowride.ranks import pick_device

ENGINES = ("builtin", "torch")
RANKS_FILE = "ranks.json"  # in run_dir: every rank's record as rank 0 gathered them, {"config", "ranks"}
# schedules that hold several model chunks per rank (both engines' names)
MULTI_CHUNK_SCHEDULES = frozenset({"interleaved", "interleaved1f1b", "loopedbfs", "interleavedzb", "zbv", "dualpipev"})


def default_chunks(schedule: str) -> int:
    """Model chunks per stage when none are asked for: 2 for the schedules that hold several
    per rank, else 1."""
    return 2 if str(schedule).lower() in MULTI_CHUNK_SCHEDULES else 1


@dataclass
class TrainConfig:
    schedule: str = "1f1b"
    stages: int = 2
    microbatches: int = 8
    chunks: int = 1  # model chunks per stage (interleaved schedules)
    model: str = "tiny"
    iters: int = 20
    microbatch_size: int = 4
    seed: int = 0
    lr: float = 1e-3
    data: str | None = None  # a text file; None: the synthetic stream
    run_dir: str = "runs/train"
    bubble_port: int | None = None  # UDP port on 127.0.0.1 that bubble events go to
    profile: str | None = None  # bubble profile JSON used for predicted ends
    timeout_s: float = 120.0  # a rank waiting longer than this on a peer fails the run
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 1  # torch threads per rank
    save_params: bool = False
    warmup_iters: int = 2  # iterations left out of medians
    pin_cores: bool = False  # pin stage r to core r (mod cores); side tasks of stage r share it
    # torch (torch.distributed.pipelining) | builtin (flowride's instruction lists) | auto: torch
    # for every schedule torch has, builtin for the others (interleaved, zbh1)
    engine: str = "auto"
    min_bubble_s: float = 0.002  # waits predicted shorter than this are not announced
    paired_block: int = 0  # > 0: harvesting alternates on/off in randomized blocks of this many iterations
    paired_seed: int = 0
    # one pair in this many runs training alone in both blocks (an A/A pair: the noise floor); 0: none
    paired_aa_every: int = 5
    # a one-machine rehearsal (flowride.pipeline.rehearsal): this stage real, the others stand-ins
    rehearse_stage: int | None = None
    stand_in: str = "same"  # the stand-ins' action times: same | F=s,B=s,W=s | a JSON file

    def __post_init__(self) -> None:
        if self.engine == "auto":
            self.engine = "torch" if str(self.schedule).lower() in TORCH_SCHEDULES else "builtin"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        return cls(**json.loads(Path(path).read_text()))

    def validate(self) -> None:
        from flowride.pipeline.model import preset, split_layers
        from flowride.pipeline.schedules import build_schedule

        for name in ("stages", "microbatches", "chunks", "iters", "microbatch_size", "threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise InputError(f"--{name.replace('_', '-')}", f"{v!r} is not a positive integer", "give 1 or more")
        pick_device(self.device, field="--device")  # cuda without CUDA: refused before any stage starts
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise InputError("--lr", f"{self.lr} is not a positive number", "give a learning rate above zero")
        if not (isinstance(self.min_bubble_s, (int, float)) and math.isfinite(self.min_bubble_s) and self.min_bubble_s >= 0):
            raise InputError("--min-bubble", f"{self.min_bubble_s!r} is not a length in seconds", "give 0 or more, e.g. 0.002")
        if not isinstance(self.paired_aa_every, int) or self.paired_aa_every < 0 or self.paired_aa_every == 1:
            raise InputError("--paired-aa-every", f"{self.paired_aa_every!r} is not a pair count",
                             "give 0 (no A/A pairs) or 2 or more (one A/A pair in that many)")
        if not isinstance(self.paired_block, int) or self.paired_block < 0:
            raise InputError("--paired-block", f"{self.paired_block!r} is not a block length", "give 0 (off) or a positive number of iterations")
        aa = self.paired_aa_every
        n_pairs = 3 if aa == 2 else 2  # pairs that hold 2 harvest-vs-alone pairs besides the A/A ones
        if self.paired_block and self.iters < self.warmup_iters + 2 * n_pairs * self.paired_block:
            need = self.warmup_iters + 2 * n_pairs * self.paired_block
            raise InputError("--iters", f"{self.iters} iterations hold fewer than 2 pairs of on/off blocks of {self.paired_block} "
                             f"after {self.warmup_iters} warm-up iterations", f"give --iters {need} or more, or --paired-block 0")
        if self.stand_in != "same" and self.rehearse_stage is None:
            raise InputError("--stand-in", "stand-in times without a rehearsal", "add --rehearse STAGE, or leave --stand-in out")
        if self.rehearse_stage is not None:
            from flowride.pipeline.rehearsal import parse_stand_in

            if not isinstance(self.rehearse_stage, int) or not 0 <= self.rehearse_stage < self.stages or self.stages < 2:
                raise InputError("--rehearse", f"stage {self.rehearse_stage!r} is not one of the {self.stages} stages",
                                 f"give 0 (first) to {self.stages - 1} (last), with --stages 2 or more")
            parse_stand_in(self.stand_in, self.stages)
        if self.engine not in ENGINES:
            raise InputError("--engine", f"unknown engine {self.engine!r}", f"use auto or one of {', '.join(ENGINES)}")
        if self.engine == "torch":
            from flowride.pipeline.torch_compat import dry_schedule

            dry_schedule(self.schedule, self.stages, self.microbatches, self.chunks)
        else:
            build_schedule(self.schedule, self.stages, self.microbatches, self.chunks)
        mcfg = preset(self.model)
        split_layers(mcfg, self.stages * self.chunks)
        if self.data:
            from flowride.pipeline.data import TokenSource

            TokenSource(mcfg.vocab_size, mcfg.seq_len, self.seed, self.data)  # readable, long enough


def onoff_blocks(cfg: TrainConfig) -> list[bool] | None:
    """Harvesting on (True) or off (False) in each iteration of a paired run, or None.

    Warm-up iterations are on (the bubble lengths are being learned; they are left out of every
    statistic). The rest is cut into blocks of ``paired_block`` iterations, taken in pairs; each
    pair runs its on block and its off block in an order drawn from ``paired_seed``, so slow drift
    of the machine cannot line up with either arm. One pair in ``paired_aa_every`` is off in both
    blocks (A/A): what the measurement reads when nothing differs, the noise floor of the others.
    Iterations that do not fill a pair stay on. Every rank computes the same list from the config,
    so no rank has to tell another.
    """
    if not cfg.paired_block:
        return None
    rng = random.Random(cfg.paired_seed)
    out = [True] * min(cfg.warmup_iters, cfg.iters)
    pair = 2 * cfg.paired_block
    k = 0
    while len(out) + pair <= cfg.iters:
        first = rng.random() < 0.5
        if cfg.paired_aa_every and k % cfg.paired_aa_every == cfg.paired_aa_every - 1:
            out += [False] * pair
        else:
            out += [first] * cfg.paired_block + [not first] * cfg.paired_block
        k += 1
    out += [True] * (cfg.iters - len(out))
    return out
