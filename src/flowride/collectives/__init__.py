"""Collectives expressed as demands (who needs which chunk)."""

from flowride.collectives.demand import Collective, Commodity, Demand, make_demand

__all__ = ["Collective", "Commodity", "Demand", "make_demand"]
