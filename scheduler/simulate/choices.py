"""The names a simulation is asked for: its policies and where it places the cluster."""

from __future__ import annotations

from idlegpu.forecast.nodes import STRATEGIES

POLICIES = ("night", "reactive", "forecast", "oracle", "clairvoyant")
CLAIRVOYANT = "clairvoyant"
# the clairvoyant's own plans (beside the oracle's): on the true future, and on the present
_CLAIRVOYANT_NOW = "clairvoyant on the present"
_CLAIRVOYANT_PLANS = ("clairvoyant on the future", _CLAIRVOYANT_NOW)
POOL = "pool"
PLACEMENTS = (POOL, *STRATEGIES)
