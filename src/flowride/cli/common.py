"""What every flowride subcommand shares: the consoles, the parser that exits 2 on one line,
library field names shown as the options the user wrote, and the exit codes.

Exit codes (README, "Exit codes"): 0 success; 1 the input was understood and found wrong, or the
work failed (an invalid schedule or algorithm, a failed run or training, wrong results); 2 bad
input (an option or file the command cannot use); 130 interrupted. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

from flowride.argtypes import SECONDS, THREADS, integer, number, out_dir
from flowride.errors import InputError, InvalidSchedule
from flowride.sizes import MAX_GPUS, MAX_MICROBATCHES, MAX_STAGES

OFF_TERMINAL_WIDTH = 1000  # piped or in a CI log: wide enough that no table is squeezed or cut


def _console(stderr: bool = False) -> Console:
    """A console that keeps tables whole off a terminal: rich falls back to 80 columns (or
    ``$COLUMNS``) there and squeezes a wide table until names and verdicts are cut to "…"; a log
    file has no width, so the table keeps its natural one."""
    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=OFF_TERMINAL_WIDTH)


console = _console()
err = _console(stderr=True)


# the pipeline library's field names -> the options of train, profile-bubbles and schedule-show
PIPELINE_OPTIONS = {"schedule": "--schedule", "model": "--model", "chunks": "--chunks", "stages": "--stages",
                    "microbatches": "--microbatches", "engine": "--engine"}


@contextmanager
def as_options(**option_of: str) -> Iterator[None]:
    """Within the block, the library's field ``name`` is what the user wrote as ``option_of[name]``
    (only around calls whose values came from those options, never around reading a file)."""
    try:
        yield
    except InputError as e:
        key = e.field.replace(" ", "_")
        if key not in option_of:
            raise
        raise InputError(option_of[key], e.problem, e.fix) from None


def refuse_unused(a: argparse.Namespace, when: str, fix: str, **flag_of: str) -> None:
    """Options the command, as it was given, would not use: refused in one line, never dropped
    silently (a sweep's ``--out-dir`` given with one size would save nothing). An option counts
    as given when it is not None or False, so these options default to None."""
    for dest, flag in flag_of.items():
        v = getattr(a, dest, None)
        if v is not None and v is not False:
            raise InputError(flag, f"is used only {when}", fix)


def say_error(msg: str) -> None:
    """One plain line on stderr (no wrapping or markup, so it stays one line for scripts)."""
    print(f"error: {msg}", file=sys.stderr)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, exit 2
        say_error(f"{self.prog}: {message}")
        sys.exit(2)


class RunFailed(Exception):
    """A training rank failed: shown with its error, exit code 1."""


def run_command(args: argparse.Namespace) -> int:
    """Call the subcommand ``args`` was parsed for and turn what it raises into an exit code and
    one line on stderr."""
    try:
        return int(args.func(args) or 0)
    except InvalidSchedule as e:  # understood and found wrong: a failed verification, not a usage error
        print(f"invalid: {e}", file=sys.stderr)
        return 1
    except InputError as e:
        say_error(str(e))
        return 2
    except RunFailed as e:
        print(f"error: training failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except OSError as e:  # the work ran and could not write or read what it had to (a full disk, ...)
        say_error(f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}")
        return 1


def topology_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--topology", "-t", required=required, help="built-in name (see `flowride topologies`) or a topology JSON file")
    p.add_argument("--chassis", type=integer(1, 64, "chassis"), help="chassis count (ndv2, dgx2, mi250)")
    p.add_argument("--teccl-compat", action="store_true", default=None,
                   help="the published TE-CCL model (ndv2, dgx2): every switch copies and a switch->GPU hop costs only its alpha; "
                        "ndv2 x2 also models GPU 0 as a bufferless switch. Default: the physical model")
    p.add_argument("--switch-copy", choices=("on", "off"),
                   help="whether every switch can replicate a chunk (on: NVLS-class multicast; off: forwarding only). "
                        "Default: each preset's physical model (only h100's NVSwitch copies)")
    p.add_argument("--n", type=integer(2, MAX_GPUS, "GPUs"), help="GPU count (ring, full, switch)")
    p.add_argument("--rows", type=integer(1, MAX_GPUS, "rows"), help="rows (mesh, torus)")
    p.add_argument("--cols", type=integer(1, MAX_GPUS, "columns"), help="columns (mesh, torus)")
    p.add_argument("--bandwidth", type=number(1e-3, 1e6, what="GB/s"), help="GB/s per link (generic topologies)")
    p.add_argument("--alpha-us", type=number(0, 1e6, what="microseconds"), help="link latency in microseconds (generic topologies)")
    p.add_argument("--switching", choices=("cut-through", "store-and-forward"),
                   help="how switches pass a chunk on: cut-through (default: a path through switches pays its transfer once, "
                        "at its slowest hop, plus every hop's alpha) or store-and-forward (every hop pays its own transfer)")
    f = p.add_argument_group("clusters (-t fabric): N nodes of one node type on a network (docs/fabrics.md)") \
        if isinstance(p, argparse.ArgumentParser) else p
    f.add_argument("--node", help="node type: dgx-a100, a800, dgx-h100, h800, hgx-b200, mi300x, dgx2, ndv2 or mi250")
    f.add_argument("--nodes", type=integer(1, MAX_GPUS, "nodes"), help="how many nodes (default 2)")
    f.add_argument("--network", choices=("rail", "clos", "single"), help="rail (NIC k of every node on rail switch k; default), "
                   "clos (leaf/spine) or single (one switch)")
    f.add_argument("--nic", help="NIC line rate, e.g. 200Gbps, 400Gbps, 800Gbps (default: the node type's)")
    f.add_argument("--nic-share", type=integer(1, 16, "GPUs per NIC"), help="GPUs per NIC: 1 (default for most node types) or 2, ...")
    f.add_argument("--rails", type=integer(1, 64, "rails"), help="rail network: rail switches (default one per NIC of a node)")
    f.add_argument("--leaf-nodes", type=integer(1, MAX_GPUS, "nodes"), help="clos: nodes per leaf switch (default 2)")
    f.add_argument("--spines", type=integer(1, 1024, "spines"), help="clos: spine switches (default: NICs per node)")
    f.add_argument("--oversubscription", type=number(1, 64, what="a ratio"), help="clos: leaf down / up bandwidth (default 1)")
    f.add_argument("--nic-latency-us", type=number(0, 1e4, what="microseconds"), help="per NIC hop (GPU -> leaf, leaf -> GPU; default 1.0)")
    f.add_argument("--switch-latency-us", type=number(0, 1e4, what="microseconds"), help="per switch-to-switch hop (default 0.15)")
    f.add_argument("--link-latency-us", type=number(0, 1e4, what="microseconds"), help="per hop inside a node (default: the node type's)")
    p.add_argument("--ranks", help="a process group: only these GPUs take part, e.g. 0,2,4,6, 0-3, 0,2,5-7, every:8 or every:8+1")
    p.add_argument("--relay", choices=("on", "off"), help="with --ranks: whether GPUs outside the group may forward chunks "
                   "(default off; a schedule that relays cannot be exported or run)")


def train_args(p: argparse.ArgumentParser, iters: int) -> None:
    p.add_argument("--stages", "-p", type=integer(1, MAX_STAGES, "stages"), default=2, help="pipeline stages (one process each)")
    p.add_argument("--microbatches", "-m", type=integer(1, MAX_MICROBATCHES, "micro-batches"), default=8)
    p.add_argument("--schedule", default="1f1b", help="builtin engine: gpipe, 1f1b, interleaved, zbh1; torch engine: "
                   "gpipe, 1f1b, interleaved1f1b, loopedbfs, interleavedzb, zbv, dualpipev")
    p.add_argument("--engine", default="auto", help="torch (torch.distributed.pipelining), builtin (flowride's instruction "
                   "lists) or auto (default: torch for the schedules torch has, builtin for interleaved and zbh1)")
    p.add_argument("--chunks", "-v", type=integer(1, 16, "chunks"), default=None, help="model chunks per stage (interleaved; default 2 there, else 1)")
    p.add_argument("--model", default="tiny", help="tiny, small, medium or large (GPT presets, pipeline/model.py; large: bubbles of 0.1-0.5 s on 2 CPU cores)")
    p.add_argument("--iters", type=integer(1, 10**7, "iterations"), default=iters)
    p.add_argument("--microbatch-size", type=integer(1, 65536, "samples"), default=4)
    p.add_argument("--seed", type=integer(0, 2**63 - 1, "a seed"), default=0)
    p.add_argument("--lr", type=number(0, 100, lo_open=True, what="a learning rate"), default=1e-3)
    p.add_argument("--data", help="a text file to train on (bytes as tokens); default: generated tokens")
    p.add_argument("--run-dir", type=out_dir, default="runs/train", help="where ranks write their logs and records")
    p.add_argument("--timeout", type=SECONDS, default=120.0, help="seconds a rank may wait on a peer before the run fails")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--threads", type=THREADS, default=1, help="torch threads per rank")
    p.add_argument("--min-bubble", type=number(0, 60, what="seconds"), default=0.002, help="seconds: waits predicted shorter are not announced")


def calibration_args(p: argparse.ArgumentParser) -> None:
    """``--calibration`` and ``--network-kind``: which calibrated model of the runtime prices NCCL
    and flowride's schedules (docs/calibration.md)."""
    p.add_argument("--calibration", help="the communication model's calibration: default (fitted to published nccl-tests "
                   "runs for the node type), nccl (NCCL's own model, uncorrected), ib, efa, or a profile written by "
                   "`flowride calibrate`")
    p.add_argument("--network-kind", choices=("ib", "efa"),
                   help="the network's kind for the built-in calibration: ib (InfiniBand/RoCE, default) or efa (AWS EFA)")


def chosen_calibration(a: argparse.Namespace, topo):
    """The :class:`~flowride.runtime.defaults.Chosen` calibration the options name for ``topo``."""
    from flowride.runtime.defaults import for_topology

    with as_options(network_kind="--network-kind", calibration="--calibration"):
        return for_topology(topo, getattr(a, "calibration", None), getattr(a, "network_kind", None))
