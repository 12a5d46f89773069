"""Configuration of one pipeline-parallel training run (plain data, JSON round trip)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from flowride.errors import InputError


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
        if self.device not in ("auto", "cpu", "cuda"):
            raise InputError("--device", f"unknown device {self.device!r}", "use auto, cpu or cuda")
        if not self.lr > 0:
            raise InputError("--lr", f"{self.lr} is not positive", "give a learning rate above zero")
        build_schedule(self.schedule, self.stages, self.microbatches, self.chunks)
        mcfg = preset(self.model)
        split_layers(mcfg, self.stages * self.chunks)
        if self.data:
            from flowride.pipeline.data import TokenSource

            TokenSource(mcfg.vocab_size, mcfg.seq_len, self.seed, self.data)  # readable, long enough
