"""Where the docs quote a bundled config or the bundled network, they quote them as they are.

The README said the cpu config makes "a new generation every 100 learner steps" for sessions after
trainer/configs/cpu.toml went to 50, and docs/gpu.md spoke of "the bundled 6x64" after the bundled
network became a 10x64. Each quote below is read from its page and compared with the file it quotes.
"""

from __future__ import annotations

import glob
import json
import os
import re

import pytest

from trainer.config import load_named_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _text(name: str) -> str:
    with open(os.path.join(REPO, name), encoding="utf-8") as f:
        return " ".join(f.read().split())  # a quote may wrap anywhere


def _quote(name: str, pattern: str) -> tuple[str, ...]:
    match = re.search(pattern, _text(name))
    assert match is not None, f"{name} no longer has the quote {pattern!r}: update this test with the page"
    return match.groups()


def _fraction(words: str) -> float:
    return {"half": 0.5, "a quarter": 0.25}[words]


def test_the_readme_quotes_the_cpu_config():
    cpu = load_named_config("cpu")
    net, visits, fast, every = _quote("README.md", r"`trainer/configs/cpu\.toml`: a (\S+) network, (\d+) visits on the "
                                                   r"recorded moves and (\d+) on the others, a new generation every "
                                                   r"(\d+) learner steps")
    assert (net, int(visits), int(fast), int(every)) == (
        cpu.model.net, cpu.selfplay.visits, cpu.selfplay.fast_visits, cpu.train.checkpoint_every)


FIRST_HOUR = os.path.join("docs", "first-hour.md")


def test_the_first_hour_quotes_the_cpu_config():
    cpu = load_named_config("cpu")
    got = _quote(FIRST_HOUR, r"a fresh (\S+) network; one self-play worker with both cores \(at nice (\d+)\), "
                                       r"playing (\d+) games at once with (\d+) visits on (a quarter) of the moves .*? "
                                       r"and (\d+) on the rest, games adjudicated drawn at (\d+) plies; one learner "
                                       r"process \(`([^`]+)`, one torch thread\) training batches of (\d+) on a value "
                                       r"target (half) the search's value .*? a new generation every (\d+) steps, at "
                                       r"most (\d+) samples per stored position")
    net, nice, games, visits, share, fast, plies, learner, batch, q_ratio, every, samples = got
    assert (net, int(nice), int(games), int(visits), _fraction(share), int(fast), int(plies), learner, int(batch),
            _fraction(q_ratio), int(every), float(samples)) == (
        cpu.model.net, cpu.daemon.worker_nice, cpu.selfplay.games_per_worker, cpu.selfplay.visits,
        cpu.selfplay.full_search_prob, cpu.selfplay.fast_visits, cpu.selfplay.max_plies, cpu.daemon.learner_devices,
        cpu.train.batch_size, cpu.loss.value_q_ratio, cpu.train.checkpoint_every,
        cpu.replay.max_samples_per_position)


def _bundled_shape() -> str:
    import onnx

    model = onnx.load(os.path.join(REPO, "engine", "nets", "default.onnx"), load_external_data=False)
    config = json.loads({p.key: p.value for p in model.metadata_props}["cyzero.config"])
    return f"{config['blocks']}x{config['filters']}"


PAGES = ["README.md", "engine/nets/PROVENANCE.md", *sorted(os.path.relpath(p, REPO) for p in
         glob.glob(os.path.join(REPO, "docs", "*.md")) + glob.glob(os.path.join(REPO, "trainer", "configs", "*.toml")))]


@pytest.mark.parametrize("page", PAGES)
def test_the_bundled_network_is_called_by_its_shape(page):
    """"the bundled NxM" names today's network; an earlier one is "the 6x64 bundled then"."""
    shape = _bundled_shape()
    said = re.findall(r"\bbundled (\d+x\d+)\b", _text(page), re.I)
    said += re.findall(r"\bbundled network \(`engine/nets/`, an? (\d+x\d+)\b", _text(page), re.I)
    assert all(s == shape for s in said), f"{page} calls the bundled {shape} {sorted(set(said) - {shape})}"
