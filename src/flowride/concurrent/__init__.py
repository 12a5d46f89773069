"""Several collectives at once on shared links (``flowride synth --concurrent``): the SPEC
(:mod:`.spec`), each group's links on the base topology and its share of them (:mod:`.sharing`),
schedules made alone run together (:mod:`.contention`), the joint lower bound (:mod:`.bound`) and
the joint synthesis (:mod:`.joint`)."""

from flowride.concurrent.joint import JointOutcome, report, synthesize_concurrent
from flowride.concurrent.spec import Item, parse_spec, read_spec

__all__ = ["Item", "JointOutcome", "parse_spec", "read_spec", "report", "synthesize_concurrent"]
