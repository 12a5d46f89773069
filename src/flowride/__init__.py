"""flowride: win back the GPU time that large-model training wastes.

Two halves:
- collective schedules synthesized as a time-expanded multi-commodity flow: ``synth`` builds them
  on ``schedule`` (the IR and its verifier), over ``collectives`` and ``topology``; ``program``
  lowers them to per-rank programs and MSCCL XML, ``comm`` runs those; ``api`` ties synthesis up;
- pipeline bubbles harvested for side tasks: ``harvest`` on ``pipeline``, ``sidetasks`` on ``harvest``.

docs/architecture.md draws the floors (imports point down only).
"""

from flowride.errors import InputError

__all__ = ["InputError"]
__version__ = "0.1.0"
