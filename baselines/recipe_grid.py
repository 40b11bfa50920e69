"""Fixed-knob grid search over training recipes (ATTUNE's baseline, PAPERS.md B1): every combination
of the fixed knob space (claimbench.datasets.recipes.knob_space) in product order, the first knob
varying slowest, blind to what earlier trials measured. Under a budget it tries a prefix of the grid.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from claimbench.datasets import recipes
from claimbench.impl.tuner import full_routes
from claimbench.interfaces import RecipeProposer


@dataclass
class GridSearch(RecipeProposer):
    cores: int
    name = "grid search"
    _grid: list | None = field(default=None, repr=False)

    def propose(self, start: dict, best: dict, history: list[dict]) -> dict | None:
        if self._grid is None:
            self._grid = [route for route in full_routes(recipes.knob_space(start, self.cores))
                          if any(start[k] != v for k, v in route.items())]
        return {**start, **self._grid.pop(0)} if self._grid else None
