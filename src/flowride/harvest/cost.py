"""What harvesting is worth: overhead, harvest efficiency and cost savings.

Savings (FreeRide's definition, with the overhead term its artifact left out), with T_v the
training time without side tasks, T_f with them, P the side work done, X the task's throughput on a dedicated reference device, p_ref
that device's hourly price and p_main the training job's hourly price:

    S = 1 - T_f / T_v  +  (P / X) * p_ref / (p_main * T_v)

The first term is the overhead (negative when training slows down), the second the value of the
harvested work. For a mix of tasks, P / X is summed over tasks (seconds of dedicated work).
Default prices are per device-hour and equal (p_ref = 1, p_main = stages): on this CPU machine a
"device" is one core, so a stage's core and the reference core cost the same.
"""

from __future__ import annotations


def savings(t_v: float, t_f: float, dedicated_seconds: float, p_ref: float, p_main: float) -> dict:
    overhead_term = 1.0 - t_f / t_v
    value_term = dedicated_seconds * p_ref / (p_main * t_v)
    return {"overhead_term": overhead_term, "value_term": value_term, "savings": overhead_term + value_term,
            "t_v_s": t_v, "t_f_s": t_f, "dedicated_seconds": dedicated_seconds, "p_ref": p_ref, "p_main": p_main}


def harvest_efficiency(dedicated_seconds: float, bubble_seconds: float) -> float:
    """Side work done over what a dedicated device would do in all the bubble time."""
    return dedicated_seconds / bubble_seconds if bubble_seconds > 0 else 0.0
