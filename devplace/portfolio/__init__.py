"""The portfolio: the layer above the placers that names, runs and combines them.

``devplace.placers`` holds algorithms that each place on their own. This layer holds what uses
them: the ``ALGO+opt+fwd`` spec syntax and the front door ``place`` (``devplace.place``,
``compare`` and the CLI call it), and placers that run other placers and keep the best, such as
sim-search. Those register into the placers' registry when this package is imported (which
``import devplace`` does), so ``available()`` lists every placer in one place.

Layering: ``placers`` < ``portfolio`` < ``compare`` < ``report``/``cli``; nothing imports upwards
(``tests/test_layers.py`` checks the placers).
"""

from __future__ import annotations

from devplace.placers import available
from devplace.portfolio import sim_search  # noqa: F401  (registers "sim-search")
from devplace.portfolio.variants import VARIANTS, parse_algo, place

__all__ = ["VARIANTS", "available", "parse_algo", "place"]
