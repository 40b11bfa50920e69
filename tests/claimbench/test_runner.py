import json
import os
import subprocess
import sys

import pytest
from asv.machine import Machine, MachineCollection

from claimbench import environment, registry, runner

from tests.conftest import asv_repo


def test_code_stamp_sees_an_edit_in_any_code_folder(tmp_path):
    for folder in runner.CODE_FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text("x = 1\n")
    before = runner.code_stamp(tmp_path)
    assert runner.code_stamp(tmp_path) == before
    (tmp_path / "suites" / "a.py").write_text("x = 2\n")
    assert runner.code_stamp(tmp_path) != before
    (tmp_path / "suites" / "a.py").write_text("x = 1\n")
    (tmp_path / "impl" / "b.py").write_text("")
    assert runner.code_stamp(tmp_path) != before


def test_asv_runs_on_a_machine_file_of_its_own(tmp_path):
    """A run reads and rewrites only its private machine file: another run's half-written
    ~/.asv-machine.json (empty, as asv's in-place rewrite leaves it for a moment) cannot stop it."""
    repo, home = tmp_path / "repo", tmp_path / "home"
    commit = asv_repo(repo, "one", "def track_one():\n    return 1.0\n")
    home.mkdir()
    (home / ".asv-machine.json").write_text("")
    private = tmp_path / "private.json"
    MachineCollection.save("box", {**Machine.get_defaults(), "machine": "box"}, _path=str(private))
    done = subprocess.run([sys.executable, "-m", "claimbench.asv_run", str(private), "--config",
                           str(repo / "asv.conf.json"), "--python=same", "--set-commit-hash", commit,
                           "--machine", "box"],
                          cwd=repo, env={**os.environ, "HOME": str(home)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p.name for p in (repo / "results" / "box").glob("*.json") if p.name != "machine.json"]
    assert (home / ".asv-machine.json").read_text() == ""
    assert "box" in json.loads(private.read_text())


def test_a_run_refuses_a_name_whose_reference_results_are_other_hardware(tmp_path, monkeypatch, capsys):
    """A run under another machine's name would file this machine's numbers in that machine's series; a dry
    run says so, and neither touches ~/.asv-machine.json."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    here = Machine.get_defaults()
    for name, cpu in [("twin", here["cpu"]), ("other", "Some Other CPU")]:
        (tmp_path / runner.REFERENCE_RESULTS / name).mkdir(parents=True)
        (tmp_path / runner.REFERENCE_RESULTS / name / "machine.json").write_text(
            json.dumps({**here, "machine": name, "cpu": cpu, "ram": "1", "os": "another kernel"}))
    assert runner.other_hardware("new-name", tmp_path) is None
    assert runner.other_hardware("twin", tmp_path) is None  # the OS and RAM differ between boots
    why = runner.other_hardware("other", tmp_path)
    assert "cpu 'Some Other CPU'" in why and f"cpu {here['cpu']!r}" in why
    with pytest.raises(ValueError, match="were measured on cpu 'Some Other CPU'"):
        runner.run(registry.load(), machine="other", root=tmp_path)
    assert runner.run(registry.load(), ["lychee"], machine="other", root=tmp_path, dry_run=True) == 0
    out = capsys.readouterr().out
    assert "would run asv on other (full mode), benchmarks matching ^lychee\\." in out
    assert "and would refuse: other's reference results" in out
    with pytest.raises(ValueError, match="Run it on other itself"):
        runner.run_kernels("other", root=tmp_path)
    assert not (tmp_path / "home" / ".asv-machine.json").exists()


def test_a_run_refuses_a_name_whose_runs_had_avx512_on_a_cpu_without_it(tmp_path, monkeypatch):
    """One CPU model name ('AMD EPYC') came with and without AVX-512: the runs' environment records tell them
    apart (their own field, or the numba vector width claimbench widens exactly where AVX-512 is)."""
    folder = tmp_path / runner.REFERENCE_RESULTS / "twin"
    folder.mkdir(parents=True)
    (folder / "machine.json").write_text(json.dumps({**Machine.get_defaults(), "machine": "twin"}))
    (folder / f"aaaaaaaa{environment.RECORD_SUFFIX}").write_text(
        json.dumps({"environment": {"numba_vectors": "full width (AVX-512)"}}))
    monkeypatch.setattr(environment, "avx512", lambda: False)
    why = runner.other_hardware("twin", tmp_path)
    assert why.startswith("twin's reference results (reports/results/twin) were measured on AVX-512; this machine "
                          "has no AVX-512. Run it on twin itself")
    monkeypatch.setattr(environment, "avx512", lambda: True)
    assert runner.other_hardware("twin", tmp_path) is None
    (folder / f"bbbbbbbb{environment.RECORD_SUFFIX}").write_text(json.dumps({"environment": {"avx512": False}}))
    assert runner.other_hardware("twin", tmp_path) is None  # records of both kinds already: the model name decides
