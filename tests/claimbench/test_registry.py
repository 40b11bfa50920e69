import tomllib

import pytest

from claimbench import registry

MINIMAL = '''
[[paper]]
id = "p"
title = "P"
tier = "A"
task = "t"
baselines = ["b"]

[[paper.claims]]
id = "c"
metric = "m"
unit = "x"
direction = "higher"
claimed = [2, 1]
claimed_text = "1-2x"
conditions = "c"
baseline = "b"
'''


def write(tmp_path, text):
    path = tmp_path / "papers.toml"
    path.write_text(text)
    return path


def test_repository_registry_lists_every_paper():
    reg = registry.load()
    assert len(reg.papers) == len(tomllib.loads(registry.DEFAULT_PAPERS.read_text())["paper"])  # nothing dropped
    assert {p.tier for p in reg.papers} == {"A", "B", "C"}
    lychee = reg.paper("lychee").claims[0]
    assert lychee.claimed == (9.7, 117.0) and lychee.target == 9.7 and lychee.gate is not None


def test_minimal_registry_and_defaults(tmp_path):
    claim = registry.load(write(tmp_path, MINIMAL)).claims[0]
    assert claim.claimed == (1.0, 2.0)  # sorted
    assert claim.fold == "max" and claim.tolerance == 0.1 and claim.benchmark is None


@pytest.mark.parametrize("edit, message", [
    (('direction = "higher"', 'direction = "up"'), r"paper\[0\] \(p\)\.claims\[0\]\.direction: must be one of"),
    (('tier = "A"', 'tier = "Z"'), r"paper\[0\] \(p\)\.tier"),
    (('claimed = [2, 1]', 'claimed = "lots"'), r"claims\[0\]\.claimed: expected a number"),
    (('metric = "m"\n', ''), r"claims\[0\]\.metric: missing"),
    (('baseline = "b"', 'baseline = "b"\nspeed = 3'), r"claims\[0\]: unknown key\(s\) speed"),
    (('baseline = "b"', 'baseline = "b"\ngate = { benchmark = "x" }'), r"claims\[0\]\.gate: needs min or max"),
    (('baseline = "b"', 'baseline = "b"\ntolerance = 2'), r"claims\[0\]\.tolerance"),
    (('title = "P"', 'title = 3'), r"paper\[0\] \(p\)\.title: expected str"),
    (('baseline = "b"', 'baseline = "b"\nexplain = [3]'), r"claims\[0\]\.explain: expected a list of benchmark"),
])
def test_validation_names_file_and_key(tmp_path, edit, message):
    path = write(tmp_path, MINIMAL.replace(*edit))
    with pytest.raises(registry.RegistryError, match=message) as err:
        registry.load(path)
    assert str(path) in str(err.value)


def test_duplicate_and_missing(tmp_path):
    with pytest.raises(registry.RegistryError, match=r"paper\[1\]\.id: duplicate id 'p'"):
        registry.load(write(tmp_path, MINIMAL + MINIMAL.replace("[[paper.claims]]", "[[paper.claims]]")))
    with pytest.raises(registry.RegistryError, match="file not found"):
        registry.load(tmp_path / "absent.toml")
    with pytest.raises(registry.RegistryError, match="not valid TOML"):
        registry.load(write(tmp_path, "[[paper]\n"))
    with pytest.raises(registry.RegistryError, match="no paper with id 'q'"):
        registry.load(write(tmp_path, MINIMAL)).paper("q")
