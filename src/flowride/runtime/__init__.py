"""What a collective costs when a runtime runs it, held to measurements.

flowride's epoch model (:mod:`flowride.topology.timing`) prices links; this package prices what
NCCL (and the runtimes flowride exports to) actually pay: a launch floor, per-step latencies per
hop kind and protocol, achievable bandwidth below the line rate and the channels it takes to
reach it. Its parameters are fitted to measured collectives: the published nccl-tests curves the
project carries (``measured``), or a user's own nccl-tests logs (``nccl_tests``, ``flowride
calibrate``)."""
