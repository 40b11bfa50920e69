"""The adoption policies the dose gate is compared with (PAPERS.md B4): always adopt, adopt the
lowest calibration loss, and a dose threshold chosen on the calibration split. None adopts a run
that diverged."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from claimbench.interfaces import AdoptionPolicy


@dataclass
class AlwaysAdopt(AdoptionPolicy):
    name = "always adopt"

    def decide(self, runs, rtn):
        return [not run.diverged for run in runs]


@dataclass
class LowestLoss(AdoptionPolicy):
    """Of each learning-rate sweep (the runs sharing steps and seed: one practitioner's sweep), adopt
    the run with the lowest final calibration loss."""
    name = "lowest calibration loss"

    def decide(self, runs, rtn):
        best = {}
        for i, run in enumerate(runs):
            key = (run.steps, run.seed)
            if not run.diverged and (key not in best or run.final_loss < runs[best[key]].final_loss):
                best[key] = i
        return [i in best.values() for i in range(len(runs))]


@dataclass
class DoseThreshold(AdoptionPolicy):
    """Adopt the runs with dose at most the threshold chosen on the calibration split: the largest
    dose below which no run's mean calibration-split NDCG@10 falls under RTN's."""
    name = "dose threshold"

    def threshold(self, runs, rtn) -> float:
        rtn_mean = float(np.mean(rtn["calibration"]))
        limit = -np.inf
        for run in sorted((r for r in runs if not r.diverged), key=lambda r: r.dose):
            if float(np.mean(run.ndcg["calibration"])) < rtn_mean:
                break
            limit = run.dose
        return limit

    def decide(self, runs, rtn):
        limit = self.threshold(runs, rtn)
        return [not run.diverged and run.dose <= limit for run in runs]
