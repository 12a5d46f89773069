"""Schedules: the IR, an independent simulator/verifier, pruning, timelines and metrics.

This floor imports nothing above it (no synth/, no program/): the searches find schedules, this
floor verifies them (and reverses a found AllGather into a reduction, :mod:`flowride.schedule.reduce`).
"""

from flowride.schedule.ir import Schedule, Send, load_schedule
from flowride.schedule.metrics import algbw_GBps
from flowride.schedule.simulate import SimResult, simulate

__all__ = ["Schedule", "SimResult", "Send", "algbw_GBps", "load_schedule", "simulate"]
