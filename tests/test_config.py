"""The training config (trainer/config.py): TOML in and out, documented defaults, errors naming the key."""

from __future__ import annotations

import dataclasses
import os
import tomllib

import pytest

from trainer.config import (
    CONFIG_FILE, TrainConfig, default_config, from_dict, load_config, load_run_config, loads_config,
    markdown_table, model_differences, to_toml,
)


def _all_fields(config: TrainConfig):
    for section in dataclasses.fields(config):
        part = getattr(config, section.name)
        for field in dataclasses.fields(part):
            yield section.name, field


def test_every_key_has_a_default_and_a_meaning():
    config = default_config()
    keys = list(_all_fields(config))
    assert len(keys) > 30
    for section, field in keys:
        assert field.metadata.get("doc"), f"{section}.{field.name} has no documentation"
    table = markdown_table()
    for section, field in keys:
        assert f"| `{section}.{field.name}` |" in table


def test_toml_round_trip_of_defaults_and_changed_values():
    config = default_config()
    assert loads_config(to_toml(config)) == config
    changed = config.replace(
        model={"net": "2x16", "moves_left": False, "policy_head": "fc"},
        optimizer={"kind": "adamw", "lr": 3e-4, "weight_decay": 1e-5, "milestones": [10, 20]},
        train={"average": "swa", "batch_size": 48},
        replay={"floor": 1000, "val_percent": 12.5},
    )
    text = to_toml(changed)
    assert loads_config(text) == changed
    assert tomllib.loads(text)["optimizer"]["lr"] == 3e-4
    assert "# residual blocks x filters" in text  # the file documents itself


def test_a_file_names_only_what_it_changes(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[train]\nbatch_size = 64\n[optimizer]\nlr = 1  # an integer is a fine number\n')
    config = load_config(path)
    assert config.train.batch_size == 64
    assert config.optimizer.lr == 1.0 and isinstance(config.optimizer.lr, float)
    assert config.model == default_config().model


@pytest.mark.parametrize("text, key", [
    ("[train]\nbatchsize = 64\n", "train.batchsize"),
    ("[trian]\n", "[trian]"),
    ("[train]\nbatch_size = 6.5\n", "train.batch_size"),
    ("[train]\nbatch_size = 0\n", "train.batch_size"),
    ("[train]\nbatch_size = true\n", "train.batch_size"),
    ("[optimizer]\nkind = \"adam\"\n", "optimizer.kind"),
    ("[optimizer]\nlr = \"0.1\"\n", "optimizer.lr"),
    ("[optimizer]\nlr = 0\n", "optimizer.lr"),
    ("[optimizer]\nlr = nan\n", "optimizer.lr"),
    ("[optimizer]\nmilestones = [30, 10]\n", "optimizer.milestones"),
    ("[model]\nnet = \"big\"\n", "model.net"),
    ("[model]\nmoves_left = 1\n", "model.moves_left"),
    ("[replay]\nval_percent = 101\n", "replay.val_percent"),
    ("model = 3\n", "[model]"),
])
def test_bad_keys_and_values_are_errors_naming_the_key(tmp_path, text, key):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_config(path)
    assert key in str(err.value) and str(path) in str(err.value)


def test_unreadable_files_say_so(tmp_path):
    with pytest.raises(ValueError, match="cannot read config"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nbatch_size = 1\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ValueError, match="unknown config section"):
        from_dict({"nope": {}})


def test_run_config_and_model_differences(tmp_path):
    assert load_run_config(tmp_path) == default_config()
    (tmp_path / CONFIG_FILE).write_text('[model]\nnet = "1x8"\n')
    run = load_run_config(tmp_path)
    assert run.model.net == "1x8"
    assert model_differences(run, default_config()) == ["model.net"]
    assert model_differences(run, run.replace(optimizer={"lr": 0.5})) == []
    assert model_differences(run.to_dict(), run.replace(model={"se_ratio": 2}).to_dict()) == ["model.se_ratio"]


def test_configs_are_frozen():
    config = default_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.train.batch_size = 3  # type: ignore[misc]


def test_the_training_guide_shows_the_config_table():
    """docs/training.md's table is markdown_table() as it is now (regenerate it when a key changes)."""
    from trainer.config import markdown_table

    guide = open(os.path.join(os.path.dirname(__file__), "..", "docs", "training.md"), encoding="utf-8").read()
    start = guide.index("<!-- config-table")
    body = guide[guide.index("\n", start) + 1: guide.index("<!-- end config-table -->")]
    assert body.strip() == markdown_table().strip()
