"""The self-play game core (trainer/selfplay.py) with the bundled network and tiny searches."""

from __future__ import annotations

import collections
import dataclasses
import io
import threading
import time

import chess
import chess.pgn
import numpy as np
import pytest

from engine.board import Board
from engine.encoding import legal_mask
from engine.network import Network
from engine.weights import default_weights_path
from trainer.records import ADJUDICATED_BIT, MAX_LENGTH_BIT, RECORD_DTYPE, decode_records
from trainer.selfplay import FinishedGame, SelfPlay, SelfPlaySettings


class Counting:
    """A network that counts its calls (to see which network a search used)."""

    def __init__(self, network: Network) -> None:
        self.network = network
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.network, name)

    def evaluate(self, planes):
        self.calls += 1
        return self.network.evaluate(planes)


@pytest.fixture(scope="module")
def network() -> Network:
    return Network(default_weights_path(), backend="cpu")


def tiny(**changes) -> SelfPlaySettings:
    base = dict(visits=8, fast_visits=2, max_plies=60, resign_q=None, seed=7, opening_plies=2)
    base.update(changes)
    return SelfPlaySettings(**base)


def play(selfplay: SelfPlay, count: int, max_steps: int = 2000) -> list[FinishedGame]:
    done: list[FinishedGame] = []
    for _ in range(max_steps):
        done += selfplay.step()
        if len(done) >= count:
            return done
    raise AssertionError(f"only {len(done)} of {count} games finished in {max_steps} steps")


def replay(game: FinishedGame) -> tuple[chess.pgn.Game, list[chess.Board]]:
    """The PGN read back by python-chess, and the board before each ply and at the end."""
    pgn = chess.pgn.read_game(io.StringIO(game.pgn))
    assert pgn is not None and not pgn.errors
    board = pgn.board()
    boards = [board.copy()]
    for move in pgn.mainline_moves():
        assert board.is_legal(move)
        board.push(move)
        boards.append(board.copy())
    return pgn, boards


def engine_board(boards: list[chess.Board], ply: int) -> Board:
    """An engine Board at ``ply`` of the game, with its history."""
    start = boards[0]
    board = Board(start.fen())
    for after in boards[1:ply + 1]:
        board.push_uci(after.peek().uci())
    return board


def test_games_are_legal_and_records_match_them(network):
    selfplay = SelfPlay(network, tiny(), games=6)
    games = play(selfplay, 6)
    for game in games:
        assert len(game.game_id) == 32 and game.generation == 0
        pgn, boards = replay(game)
        assert len(boards) - 1 == game.plies
        assert pgn.headers["Result"] == game.result
        assert pgn.headers["Termination"] == game.termination
        assert pgn.headers["Generation"] == "0"
        end = boards[-1]
        if game.termination == "max_plies":
            assert game.plies == 60 and game.result == "1/2-1/2"
        else:
            outcome = end.outcome(claim_draw=True)
            assert outcome is not None and outcome.result() == game.result
            assert outcome.termination.name.lower() == game.termination
        assert game.records.dtype == RECORD_DTYPE
        sample = decode_records(game.records)
        left = game.records["plies_left"]
        assert np.all(np.diff(left) < 0) and np.all(left >= 1) and np.all(left <= game.plies - 2)
        for i, record in enumerate(game.records):
            ply = game.plies - int(left[i])
            board = boards[ply]
            mask = legal_mask(engine_board(boards, ply))
            policy = sample.policy[i]
            assert np.array_equal(policy >= 0, mask)
            assert policy[mask].sum() == pytest.approx(1.0, abs=1e-5)
            assert record["side_to_move_or_enpassant"] == (0 if board.turn else 1)
            win, draw, loss = sample.wdl[i]
            if game.result == "1/2-1/2":
                assert (win, draw, loss) == (0, 1, 0)
            else:
                mover_won = (game.result == "1-0") == board.turn
                assert (win, loss) == ((1, 0) if mover_won else (0, 1))
            assert -1 <= record["root_q"] <= 1 and 0 <= record["root_d"] <= 1
        adjudicated = game.termination == "max_plies"
        assert np.all((game.records["invariance_info"] & ADJUDICATED_BIT != 0) == adjudicated)
        assert np.all((game.records["invariance_info"] & MAX_LENGTH_BIT != 0) == adjudicated)
    selfplay.close()


def test_only_full_searches_are_recorded(network):
    selfplay = SelfPlay(network, tiny(full_search_prob=0.5, max_plies=30, opening_plies=0), games=8)
    games = play(selfplay, 8)
    recorded = sum(len(g.records) for g in games)
    searched = sum(g.plies for g in games)
    assert 0.3 < recorded / searched < 0.7
    assert 0.3 < selfplay.positions / selfplay.moves < 0.7
    # A full search spends its visits (fewer only when it proves a mate); a fast one has 2.
    visits = np.concatenate([g.records["visits"] for g in games])
    assert np.mean(visits >= 8) > 0.9
    selfplay.close()


def test_noise_only_on_full_searches(network):
    selfplay = SelfPlay(network, tiny(full_search_prob=0.5, noise_epsilon=0.25, opening_plies=0), games=8)
    seen = set()
    for _ in range(4):
        before = {g.key: len(g.records) for g in selfplay.games}
        assert selfplay.step() == []
        for game in selfplay.games:
            full = len(game.records) > before[game.key]
            epsilon = selfplay.search.trees[game.key].settings()["noise_epsilon"]
            assert epsilon == pytest.approx(0.25 if full else 0.0)
            seen.add(full)
    assert seen == {True, False}
    selfplay.close()


def test_max_plies_adjudicates_a_draw(network):
    selfplay = SelfPlay(network, tiny(max_plies=6, full_search_prob=1.0, opening_plies=0), games=3)
    for game in play(selfplay, 3):
        assert (game.termination, game.result, game.plies) == ("max_plies", "1/2-1/2", 6)
        assert list(game.records["plies_left"]) == [6, 5, 4, 3, 2, 1]
        assert np.all(game.records["invariance_info"] & (ADJUDICATED_BIT | MAX_LENGTH_BIT)
                      == ADJUDICATED_BIT | MAX_LENGTH_BIT)
        assert np.all(game.records["result_d"] == 1.0)
    selfplay.close()


def test_resignation_ends_the_game_for_the_mover(network):
    # Q <= 1 always: every game resigns at its first searched move.
    selfplay = SelfPlay(network, tiny(resign_q=1.0, resign_playthrough=0.0, opening_plies=3), games=2)
    for game in play(selfplay, 4):
        assert game.termination == "resignation" and game.plies == 3
        assert game.result == "1-0"      # black, to move after three plies, resigned
        assert game.would_have_resigned_wrongly is None
        assert len(game.records) == 0
        replay(game)   # legal moves
    selfplay.close()


def test_playthrough_games_report_a_wrong_resignation(network):
    # Every game plays through; all would resign at once, and a drawn game shows it was wrong.
    settings = tiny(resign_q=1.0, resign_playthrough=1.0, max_plies=6, opening_plies=0)
    selfplay = SelfPlay(network, settings, games=2)
    for game in play(selfplay, 2):
        assert (game.termination, game.result) == ("max_plies", "1/2-1/2")
        assert game.would_have_resigned_wrongly is True
    selfplay.close()
    # With resignation off there is nothing to check.
    selfplay = SelfPlay(network, tiny(max_plies=4, resign_playthrough=1.0), games=1)
    assert play(selfplay, 1)[0].would_have_resigned_wrongly is None
    selfplay.close()


def test_set_network_between_steps_keeps_the_games(network):
    first, second = Counting(network), Counting(network)
    selfplay = SelfPlay(first, tiny(max_plies=12, opening_plies=0), games=3)
    done = selfplay.step() + selfplay.step()
    assert done == [] and first.calls > 0
    keys = [g.key for g in selfplay.games]
    selfplay.set_network(second, generation=5)
    calls = first.calls
    done = play(selfplay, 3)
    assert first.calls == calls and second.calls > 0
    old = [g for g in done if g.game_id in keys]
    assert len(old) == 3
    for game in old:
        assert game.plies == 12 and game.generation == 0 and game.generations == (0, 5)
        assert chess.pgn.read_game(io.StringIO(game.pgn)).headers["Generation"] == "0,5"
    later = play(selfplay, 3)
    assert all(g.generations == (5,) for g in later)
    selfplay.close()


def test_a_seed_repeats_the_games(network):
    def run() -> list[tuple[str, bytes]]:
        selfplay = SelfPlay(network, tiny(max_plies=16), games=3)
        games = play(selfplay, 3)
        selfplay.close()
        return [(str(chess.pgn.read_game(io.StringIO(g.pgn)).mainline_moves()), g.records.tobytes())
                for g in games]
    assert run() == run()


def test_opening_fens_start_the_games(network):
    fen = "4k3/8/8/8/8/8/4P3/4K3 w - - 0 1"
    selfplay = SelfPlay(network, tiny(opening_fens=(fen,), opening_plies=0, max_plies=8), games=2)
    for game in play(selfplay, 2):
        pgn, boards = replay(game)
        assert pgn.headers["FEN"] == fen and boards[0].fen() == fen
    selfplay.close()


@pytest.mark.parametrize("changes, message", [
    (dict(visits=0), "visits"),
    (dict(full_search_prob=0.0), "full_search_prob"),
    (dict(full_search_prob=1.5), "full_search_prob"),
    (dict(resign_q=-2.0), "resign_q"),
    (dict(noise_alpha=0.0), "NoiseAlpha"),
    (dict(opening_fens="8/8/8/8/8/8/8/8 w - - 0 1"), "opening_fens"),
    (dict(opening_fens=("not a fen",)), "not a fen"),
    (dict(opening_fens=("7k/5Q2/6K1/8/8/8/8/8 b - - 0 1",)), "playable"),
])
def test_bad_settings_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        SelfPlaySettings(**changes)


def test_bad_game_count_is_refused(network):
    with pytest.raises(ValueError, match="games"):
        SelfPlay(network, tiny(), games=0)


# --------------------------------------------------------------------------- short games


def play_short_games(network) -> list:
    """64 short games (``tiny(max_plies=30)``, 8 steps), checked as played: the settings of the GPU
    test, under which a game can finish with no full search."""
    settings = tiny(max_plies=30)
    selfplay = SelfPlay(network, settings, games=64)
    try:
        games = play(selfplay, 8)
    finally:
        selfplay.close()
    check_games_as_played(games, settings)
    return games


def check_games_as_played(games: list[FinishedGame], settings: SelfPlaySettings) -> None:
    """What is true of every finished game, short ones included: a legal PGN and a result; one record
    per full search, so anything from none up to one per searched ply, about ``full_search_prob`` of
    all searched plies together."""
    for game in games:
        _, boards = replay(game)
        assert len(boards) == game.plies + 1 and game.result in ("1-0", "0-1", "1/2-1/2")
        assert game.records.dtype == RECORD_DTYPE and game.records.ndim == 1
        assert 0 <= len(game.records) <= game.plies - settings.opening_plies
    recorded = sum(len(g.records) for g in games)
    searched = sum(g.plies - settings.opening_plies for g in games)
    assert abs(recorded / searched - settings.full_search_prob) < 0.1, (recorded, searched)


def test_a_short_game_can_finish_without_a_record(network):
    """Under playout cap randomisation only full searches are recorded, so a game of n searched plies
    has no record with probability (1 - full_search_prob) ** n. Such a game is still a finished game
    (result, PGN), with an empty record array. These are the GPU test's settings and seed: game 49 of
    the 64 (28 searched plies, all fast) is one, on the CPU as on the GPU."""
    games = play_short_games(network)
    empty = [g for g in games if len(g.records) == 0]
    assert empty, "seed 7 plays a game with no full search"
    for game in empty:
        assert game.records.shape == (0,) and game.plies == 30 and game.termination == "max_plies"


def test_the_worker_counts_a_game_without_a_record_and_sends_nothing(network):
    """The replay store keeps no empty game (and writes no empty chunk), so the worker's link counts
    such a game as finished (in its games/h) and never sends it; a game with records goes out."""
    from trainer import wire
    from trainer.worker import _Link

    selfplay = SelfPlay(network, tiny(max_plies=4, full_search_prob=1.0, opening_plies=0), games=1)
    try:
        (full,) = play(selfplay, 1)
    finally:
        selfplay.close()
    assert len(full.records) == 4
    empty = dataclasses.replace(full, game_id="0" * 32, records=np.zeros(0, RECORD_DTYPE))
    stop = threading.Event()
    register = wire.Register("w1", "host", 1, ("cpu",), "cyzero test")
    # Nothing listens there: the link keeps what it queued, unacknowledged.
    link = _Link("tcp://127.0.0.1:9", register, None, stop, lambda line: None)
    try:
        link.submit(empty)
        link.submit(full)
        deadline = time.monotonic() + 10.0
        while link.games < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (link.games, link.empty) == (1, 1)
        assert list(link.unacked) == [full.game_id]
        assert link._rate(collections.deque([(time.monotonic() - 3600.0, 0, 0)]), time.monotonic())[1] == (
            pytest.approx(2.0, rel=0.01))
    finally:
        link.close()


@pytest.mark.gpu
@pytest.mark.parametrize("backend, provider", [("cuda", "CUDAExecutionProvider"),
                                               ("tensorrt", "TensorrtExecutionProvider")])
def test_selfplay_on_the_gpu_plays_the_same_kind_of_games(backend, provider):
    """Self-play through ONNX Runtime's CUDA (and TensorRT, where its libraries are there)
    provider, with many games batched as a GPU worker plays them: what is true of the CPU's games
    (test_a_short_game_can_finish_without_a_record, same settings) is true of these."""
    gpu = Network(default_weights_path(), backend=backend)
    if gpu.provider != provider:
        pytest.skip(f"{backend}: ONNX Runtime fell back to {gpu.provider} here")
    play_short_games(gpu)
