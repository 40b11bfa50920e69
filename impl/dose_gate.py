"""Dose-gated adoption of a learned 4-bit calibration (PAPERS.md B4; the dose-gated PTQ digest).

A learned calibration is adopted only when it is statistically better than RTN on held-aside
queries: a one-sided paired sign-flip randomization test on the per-query NDCG@10 differences
(calibrated minus RTN) over the gate split, the usual paired test in IR. The many runs of a sweep
are one family: Holm's step-down correction holds the chance of adopting any run that is not
better at alpha. A run that diverged is never adopted. Reconstructed: the digest names the test's
kind and the outcome, not the test, its alpha or a correction; those are this module's choices.

The dose, how far a calibration moves the model, is measured twice: on embeddings, 1 - the mean
cosine between the calibrated and the fp32 model's embeddings of held-out text; on weights, the
Frobenius norm of (calibrated - RTN dequantized weights) over that of the fp32 weights, all linear
layers together.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from claimbench.interfaces import AdoptionPolicy, CalibrationRun
from claimbench.intervals import holm, sign_flip_pvalue

MAX_DOSE = 2.0  # 1 - cos at its largest: what a diverged run reports


def embedding_dose(calibrated: np.ndarray, reference: np.ndarray) -> float:
    """1 - mean cosine between rows of two (n, d) arrays of unit vectors."""
    assert calibrated.shape == reference.shape and calibrated.ndim == 2, (calibrated.shape, reference.shape)
    return float(1 - np.mean(np.sum(calibrated * reference, axis=1)))


def weight_change(calibrated: dict, rtn: dict, fp32: dict) -> float:
    """||calibrated - RTN|| / ||fp32||, Frobenius over every layer together (torch tensors by name)."""
    moved = sum(float(((calibrated[k] - rtn[k]) ** 2).sum()) for k in fp32)
    return float(np.sqrt(moved / sum(float((w ** 2).sum()) for w in fp32.values())))


@dataclass
class DoseGate(AdoptionPolicy):
    """Adopt the runs whose gate-split NDCG@10 beats RTN's (one-sided sign-flip test, Holm over the runs):
    the paper's validation-gated abstention, named for the paper. It reads no dose; a rule on the dose
    alone is the DoseThreshold baseline."""
    name = "dose gate"
    alpha: float = 0.05
    permutations: int = 10_000
    seed: int = 0

    def pvalues(self, runs: list[CalibrationRun], rtn: dict[str, np.ndarray]) -> list[float]:
        return [1.0 if run.diverged else sign_flip_pvalue(run.ndcg["gate"] - rtn["gate"], self.permutations, self.seed)
                for run in runs]

    def decide(self, runs, rtn):
        return holm(self.pvalues(runs, rtn), self.alpha)
