"""Kernel micro-benchmarks (pytest-benchmark), one file per kernel family: the kernels whose speed
decides a claim, each timed on small pinned inputs with its correctness asserted beside the timing
(a kernel that answers wrongly fails and records no time). `claimbench kernels` runs them into the
machine's results folder, named and stamped as asv's runs are, and ingests the JSON."""
import os
from pathlib import Path

from claimbench import inputs

MACHINE_ENV = "CLAIMBENCH_MACHINE"


def pytest_benchmark_update_machine_info(config, machine_info):
    """The asv machine name, so kernel series sit beside the suites' on the same machine."""
    machine_info["node"] = os.environ.get(MACHINE_ENV) or machine_info["node"]


def pytest_benchmark_update_json(config, benchmarks, output_json):
    """The run's mode and each kernel file's input digests (they declare INPUTS as suites do), keyed
    as inputs.suite_of names the kernels' series."""
    here = Path(__file__).resolve().parent
    output_json["claimbench"] = {"mode": "full", "inputs": {f"{here.name}/{name}": digests for name, digests
                                                            in inputs.recorded(here).items()}}
