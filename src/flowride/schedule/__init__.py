"""Schedules: the IR, an independent simulator/verifier, pruning, timelines and metrics.

This floor imports nothing above it (no synth/, no program/): the searches build schedules, this
floor judges them.
"""

from flowride.schedule.ir import Schedule, Send, load_schedule
from flowride.schedule.metrics import algbw_GBps
from flowride.schedule.simulate import SimResult, simulate

__all__ = ["Schedule", "SimResult", "Send", "algbw_GBps", "load_schedule", "simulate"]
