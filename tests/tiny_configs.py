"""The small training configs the trainer's tests run on: a 1x8 network and batches of 16, each test
adding the keys it is about, written as TOML the way a user writes a partial config."""

from __future__ import annotations

from trainer.config import toml_value

TINY_BASE = {"model": {"net": "1x8"}, "train": {"batch_size": 16}}


def tiny_config(**sections: dict) -> str:
    """TOML text: ``TINY_BASE`` with each section's keys added (a key given replaces the base's)."""
    merged = {name: dict(keys) for name, keys in TINY_BASE.items()}
    for name, keys in sections.items():
        merged.setdefault(name, {}).update(keys)
    return "".join(f"[{name}]\n" + "".join(f"{key} = {toml_value(value)}\n" for key, value in keys.items())
                   for name, keys in merged.items())
