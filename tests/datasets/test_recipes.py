import pytest

from claimbench.datasets import recipes

SHIPPED = recipes.load("moe-lm")


def test_shipped_recipes_validate_with_every_key_filled():
    for name in recipes.JOBS:
        flat = recipes.load(name)
        assert set(recipes.LOCKED) & set(flat) and all(k in flat for k in recipes.TUNABLE if k != "moe.dispatch")


def test_locked_digest_ignores_key_order_and_formatting(tmp_path):
    text = recipes.dump(SHIPPED)
    import yaml
    tree = yaml.safe_load(text)
    flipped = {k: tree[k] for k in reversed(list(tree))}
    flipped["train"]["optimizer"]["lr"] = 0.001  # 1.0e-3 written another way
    flipped["train"]["grad_clip"] = 1  # an int equal to the float
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(flipped, sort_keys=True, default_flow_style=True))
    assert recipes.locked_digest(recipes.read(path)) == recipes.locked_digest(SHIPPED)
    changed = dict(SHIPPED, **{"train.tokens_per_step": 1024})
    assert recipes.locked_digest(changed) != recipes.locked_digest(SHIPPED)
    tuned = dict(SHIPPED, **{"runtime.micro_batch_rows": 8})
    assert recipes.locked_digest(tuned) == recipes.locked_digest(SHIPPED)


@pytest.mark.parametrize("edit, named", [
    (lambda t: t["runtime"].update(turbo=True), "runtime.turbo"),
    (lambda t: t["train"].pop("precision"), "train.precision"),
    (lambda t: t["train"]["optimizer"].update(lr="1e-4"), "write 1.0e-4"),
    (lambda t: t["moe"].update(top_k=9), "moe.top_k"),
    (lambda t: t["model"].update(init="random"), "model.init"),
])
def test_bad_recipes_are_rejected_by_file_and_key(tmp_path, edit, named):
    import yaml
    tree = recipes.nest(SHIPPED)
    edit(tree)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(recipes.RecipeError, match="bad.yaml") as error:
        recipes.read(path)
    assert named in str(error.value)


def test_invalid_yaml_and_moe_keys_on_the_dense_job():
    with pytest.raises(recipes.RecipeError, match="not valid YAML"):
        recipes.parse("job: [", "x.yaml")
    dense = recipes.nest(recipes.load("causal-lm"))
    dense["moe"] = {"dispatch": "sorted"}
    with pytest.raises(recipes.RecipeError, match="moe.dispatch"):
        recipes.validate(dense)


def test_knob_space_starts_at_the_recipe_and_skips_absent_keys():
    knobs = {k.name: k for k in recipes.knob_space(recipes.load("causal-lm"), cores=2)}
    assert "moe.dispatch" not in knobs and knobs["runtime.micro_batch_rows"].values[0] == 1
    assert knobs["runtime.processes"].values == (1, 2)
