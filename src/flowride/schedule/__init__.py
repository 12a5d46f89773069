"""Schedules: the IR, an independent simulator/verifier, and metrics."""

from flowride.schedule.ir import Schedule, Send, load_schedule
from flowride.schedule.metrics import Bounds, algbw_GBps, lower_bounds
from flowride.schedule.simulate import SimResult, simulate

__all__ = ["Bounds", "Schedule", "Send", "SimResult", "algbw_GBps", "load_schedule", "lower_bounds", "simulate"]
