"""Fixed-knob grid search over training recipes (ATTUNE's baseline, PAPERS.md B1): the fixed knob
space (claimbench.datasets.recipes.knob_space), each single-knob change first (in the space's order),
then the rest of the full product, blind to what earlier trials measured. Under a budget it tries a
prefix of that order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from claimbench.datasets import recipes
from claimbench.impl.tuner import fast_routes, full_routes
from claimbench.interfaces import RecipeProposer


@dataclass
class GridSearch(RecipeProposer):
    cores: int
    name = "grid search"
    _grid: list | None = field(default=None, repr=False)

    def propose(self, start: dict, best: dict, history: list[dict]) -> dict | None:
        if self._grid is None:
            knobs = recipes.knob_space(start, self.cores)
            singles = fast_routes(knobs)[1:]
            self._grid = singles + [route for route in full_routes(knobs)[1:] if route not in singles]
        return {**start, **self._grid.pop(0)} if self._grid else None
