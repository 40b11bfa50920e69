"""The shipped example of ATTUNE's external proposer: a script in the place of a coding agent.

    python -m claimbench.impl.attune_scripted_proposer DIR

DIR holds recipe.yaml (the best recipe so far), start.yaml and history.json (claimbench.impl.
attune_proposers.ExternalCommand). The script applies the first edit of a fixed list that this
recipe does not have yet and history does not show as tried, and writes recipe.yaml back; with
nothing left it leaves the file as it is (out of ideas). It reads and writes YAML only: like any
external proposer, it never sees the gate.
"""
import json
import sys
from pathlib import Path

import yaml

EDITS = [  # (section, key, value), in the order a person tuning CPU training might try them
    ("runtime", "optimizer_impl", "fused"),
    ("runtime", "activation_checkpointing", False),
    ("runtime", "micro_batch_rows", 4),
    ("runtime", "packing", True),
    ("moe", "dispatch", "sorted"),
]


def main(folder: Path) -> None:
    path = folder / "recipe.yaml"
    recipe = yaml.safe_load(path.read_text())
    tried = [trial["changes"] for trial in json.loads((folder / "history.json").read_text())]
    for section, key, value in EDITS:
        if section not in recipe or recipe[section].get(key) == value:
            continue
        if any(changes.get(f"{section}.{key}") == value for changes in tried):
            continue
        recipe[section][key] = value
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        return


if __name__ == "__main__":
    main(Path(sys.argv[1]))
