"""The flowride argument parser: the subcommands in the order ``flowride --help`` lists them, each
registered by the group module that runs it (its options beside its code)."""

from __future__ import annotations

import argparse

from flowride.cli import calibrate, demo, export, harvest, plan, run, synth, topology, train
from flowride.cli.common import Parser

REGISTRATIONS = (
    synth.add_synth, synth.add_verify, export.add_export, synth.add_show, run.add_run, topology.add_topologies,
    train.add_train, harvest.add_manager, harvest.add_profile_task, harvest.add_tasks, train.add_profile_bubbles,
    train.add_schedule_show, plan.add_plan, calibrate.add_calibrate, demo.add_demo,
)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="flowride", description="Collective schedule synthesis and pipeline-bubble harvesting.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for register in REGISTRATIONS:
        register(sub)
    return p
