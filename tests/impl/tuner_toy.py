"""A toy backend and workload for the tuner's tests (module level: child processes import them)."""
import os
import time

import numpy as np

from claimbench.impl.tuner import GateSpec
from claimbench.interfaces import EngineBackend, Knob


class ToyWorkload:
    name = "toy"
    gate_spec = GateSpec(atol=1e-3, rtol=1e-3, max_outside=0.0, min_cosine=0.9999)

    def timing_feeds(self):
        return {"x": np.ones(4)}

    def gate_feeds(self):
        return [{"x": np.arange(4.0)}]

    def held_out_feeds(self):
        return [{"x": np.arange(4.0) + 10}]

    def reference(self):
        return [[np.arange(4.0)]], [[np.arange(4.0) + 10]]

    def held_out_check(self, outputs, reference):
        ok = np.allclose(outputs[0][0], reference[0][0], atol=0.5)
        return float(ok), bool(ok)


class ToyBackend(EngineBackend):
    """speed: sleeps per call; noise: adds error (fails the gate); crash: kills the process."""
    name = "toy"

    @staticmethod
    def available():
        return True

    def knobs(self, workload):
        return [Knob("speed", ("slow", "fast"), "slow"), Knob("noise", (0.0, 1.0), 0.0),
                Knob("crash", (False, True), False)]

    def build(self, workload, route, workdir):
        if route["crash"]:
            os._exit(3)
        return route

    def run(self, engine, feeds):
        time.sleep(0.004 if engine["speed"] == "slow" else 0.001)
        return [feeds["x"] + engine["noise"]]
