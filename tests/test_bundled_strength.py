"""The bundled network is trained: it beats an untrained network of its own size.

Both sides run the same engine with the same search at the same fixed node count, so
the only difference is what the weights learned.  The match is seeded and every game
is searched deterministically (temperature 0, fixed nodes), so the result is the same
on every run; and 20 games (10 opening pairs) leave chance little room besides: a side
no better than its opponent, winning or losing each game on a coin flip, scores 80% or
more with probability 0.6%, and the test also asks for the pairs' 95% interval to lie
wholly above zero.  engine/nets/PROVENANCE.md has the strength against Stockfish.
"""

import json

import onnxruntime as ort
import pytest

from engine.tools.match import EngineSpec, MatchConfig, TimeControl, default_engine_command, pair_stats, run_match
from engine.weights import default_weights_path

torch = pytest.importorskip("torch", reason="the untrained network is made with the train extra: pip install 'cyzero[train]'")
from trainer.export import export_onnx  # noqa: E402
from trainer.model import Net, NetConfig  # noqa: E402


def bundled_net_config() -> NetConfig:
    """The bundled network's shape, from the metadata its export wrote."""
    meta = ort.InferenceSession(default_weights_path(), providers=["CPUExecutionProvider"]).get_modelmeta()
    return NetConfig.from_dict(json.loads(meta.custom_metadata_map["cyzero.config"]))


def test_the_bundled_network_beats_an_untrained_network_of_its_size(tmp_path):
    untrained = tmp_path / "untrained.onnx"
    export_onnx(Net(bundled_net_config(), seed=0), untrained)
    options = [("Threads", "1"), ("Backend", "cpu")]
    config = MatchConfig(
        engine1=EngineSpec(default_engine_command(), options, "bundled"),
        engine2=EngineSpec(default_engine_command(), options + [("WeightsFile", str(untrained))], "untrained"),
        games=20,
        time_control=TimeControl(nodes=16),
        seed=7,
        adjudicate_moves=100,
    )
    result = run_match(config)
    assert len(result.games) == 20
    scores = [g.engine1_score() for g in result.games]
    assert sum(scores) / len(scores) >= 0.8, [(g.result, g.reason) for g in result.games]
    pairs = pair_stats(result.games)
    assert pairs.pairs == 10 and pairs.elo_low > 0
