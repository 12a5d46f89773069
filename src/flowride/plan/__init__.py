"""Whole-job pricing: a training job on a whole cluster, one iteration simulated in seconds.

A floor above ``synth``/``api`` (collectives priced on the fabric), ``pipeline`` (the schedules'
actions and their simulator) and ``harvest`` (FreeRide's fit rule and cost formula); only the CLI
imports it. :mod:`.job` the job file, :mod:`.costs` compute and bytes per micro-batch,
:mod:`.comm` collectives priced and cached, :mod:`.memory` memory per GPU, :mod:`.iteration`
the iteration simulated, :mod:`.harvestable` side work in the bubbles, :mod:`.price` the whole
plan, :mod:`.sweep` configurations ranked, :mod:`.search` the fastest configuration that fits on N GPUs,
:mod:`.draw` the timeline.
"""

from flowride.plan.comm import DEFAULT_CACHE, Group, Priced, Pricer
from flowride.plan.job import Job, job_from_dict, load_job, with_overrides
from flowride.plan.price import Plan, plan_job
from flowride.plan.search import SearchResult, search

__all__ = ["DEFAULT_CACHE", "Group", "Job", "Plan", "Priced", "Pricer", "SearchResult", "job_from_dict", "load_job", "plan_job",
           "search", "with_overrides"]
