"""flowride: win back the GPU time that large-model training wastes.

Two halves:
- collective schedules synthesized as a time-expanded multi-commodity flow (``topology`` ->
  ``collectives`` -> ``synth`` -> ``schedule``);
- pipeline bubbles harvested for side tasks (``pipeline`` -> ``harvest``).
"""

from flowride.errors import InputError

__all__ = ["InputError"]
__version__ = "0.1.0"
