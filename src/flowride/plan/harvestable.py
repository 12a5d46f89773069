"""The side work a plan's bubbles hold, and what it is worth (FreeRide's rule and cost formula).

Each bubble of each stage takes the side task that fills it best under FreeRide's fit rule: a
step starts only while the bubble still has ``factor`` times the step's time left (the step time
rounded up to the millisecond, :func:`flowride.harvest.fitting.fit_time`), so a bubble of length
L holds ``n`` steps with ``L - (n-1)*step > fit``. A step done on a training GPU is taken to do
what it does on the task's reference device in the same time (the value of a step is its time
times the task's dedicated throughput); GPU memory is not checked (the plan does not model it).
The savings are FreeRide's ``S = 1 - T_f/T_v + (P/X) p_ref / (p_main T_v)`` per iteration, with
``T_f = T_v (1 + overhead)``, the harvested work of all ``tp*cp*pp*dp`` GPUs, and ``p_main`` the
price of all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flowride.harvest.cost import savings
from flowride.harvest.fitting import fit_time
from flowride.plan.iteration import Timeline
from flowride.plan.job import Job, SideTask


def steps_in(bubble_s: float, task: SideTask, factor: float) -> int:
    """Steps of ``task`` FreeRide's rule starts in a bubble of ``bubble_s`` seconds."""
    need = fit_time(task.step_s, factor)
    if bubble_s <= need:
        return 0
    return 1 + math.floor((bubble_s - need) / task.step_s + 1e-9)


@dataclass
class Harvestable:
    per_task_units: dict[str, float]  # per iteration, all GPUs
    dedicated_s: float  # per iteration, all GPUs: seconds of the reference device's work
    bubble_s: float  # per iteration, all GPUs
    used_bubbles: int
    bubbles: int
    efficiency: float | None
    cost: dict

    def as_dict(self) -> dict:
        return {"units_per_iteration": self.per_task_units, "dedicated_seconds_per_iteration": self.dedicated_s,
                "bubble_seconds_per_iteration": self.bubble_s, "bubbles_used": self.used_bubbles, "bubbles": self.bubbles,
                "efficiency": self.efficiency, "cost": self.cost}


def harvestable(job: Job, tl: Timeline) -> Harvestable:
    """What the job's side tasks harvest from the bubbles of ``tl`` (one pipeline, scaled to all
    GPUs: ``tp * cp * dp`` copies of each stage)."""
    h = job.harvest
    copies = job.parallel.tp * job.parallel.cp * job.parallel.dp
    units: dict[str, float] = {t.name: 0.0 for t in h.tasks}
    dedicated = used = 0
    bubble_total = 0.0
    for g in tl.gaps:
        bubble_total += g.seconds
        if g.seconds < h.min_bubble_s or not h.tasks:
            continue
        best = max(h.tasks, key=lambda t: steps_in(g.seconds, t, h.factor) * t.step_s)
        n = steps_in(g.seconds, best, h.factor)
        if n:
            used += 1
            units[best.name] += n * best.step_s * best.throughput * copies
            dedicated += n * best.step_s * copies
    bubble_all = bubble_total * copies
    t_v = tl.iteration_s
    t_f = t_v * (1.0 + h.overhead_pct / 100.0)
    p_main = (h.price_main or h.price_ref) * job.gpus
    cost = savings(t_v, t_f, dedicated, h.price_ref, p_main) if h.tasks else savings(t_v, t_v, 0.0, h.price_ref, p_main)
    eff = dedicated / bubble_all if bubble_all > 0 and h.tasks else None
    return Harvestable(units, float(dedicated), bubble_all, used, len(tl.gaps), eff, cost)
