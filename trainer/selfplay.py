"""The self-play game core: many games at once through the engine's one search driver.

A worker process builds one :class:`SelfPlay` and calls :meth:`SelfPlay.step`
in a loop. Each step is one :class:`engine.search.MultiSearch` call over every
unfinished game (their leaves share the network's batches), one move played in
each game, and the finished games handed back as :class:`FinishedGame` (V6
records and a PGN); a new game takes each finished game's place, so the batch
stays full.

AlphaZero's settings by default (:class:`SelfPlaySettings`), with KataGo's
playout cap randomisation: a share ``full_search_prob`` of the moves gets the
full visits and Dirichlet noise and becomes a training record; the other moves
get ``fast_visits`` without noise and are only played. So a short game can
finish with no record (a game of n searched moves has none with probability
``(1 - full_search_prob) ** n``): it is still a finished game, with its result
and PGN, but teaches nothing (the worker counts it and sends nothing).
Resignation has a checked false-positive rate: a share ``resign_playthrough``
of the games never resigns, and those report whether a resignation would have
lost them a result they got (``would_have_resigned_wrongly``). With Syzygy
``tablebases`` a game that reaches a position in the tables ends with the
tables' result (termination ``"syzygy"``): playing out a known ending teaches
nothing.

:func:`settings_from_config` turns a run's ``[selfplay]`` section (what the
daemon sends a worker) into :class:`SelfPlaySettings`.

No torch here: numpy, the engine and :mod:`trainer.records`.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Optional, Sequence, Union, cast

import chess
import chess.pgn
import numpy as np

from engine.board import Board
from engine.limits import GoParams
from engine.params import SearchParams
from engine.search import MultiSearch
from engine.search_report import SearchResult
from trainer.config import SelfPlayConfig, from_dict
from trainer.records import RECORD_DTYPE, Eval, make_record

__all__ = ["FinishedGame", "SelfPlay", "SelfPlaySettings", "settings_from_config"]

# Random opening plies that end the game are drawn again, at most this many times.
_OPENING_TRIES = 100


@dataclass(frozen=True)
class SelfPlaySettings:
    """How self-play games are played. Frozen; bad values raise ValueError with the field's name."""

    visits: int = 800                 # root visits of a full search (AlphaZero: 800)
    fast_visits: int = 100            # root visits of a fast search (KataGo's playout cap: ~1/8)
    full_search_prob: float = 0.25    # share of moves searched in full and recorded for training
    noise_alpha: float = 0.3          # Dirichlet alpha at the root of full searches (AlphaZero chess)
    noise_epsilon: float = 0.25       # weight of that noise (0: none)
    temperature: float = 1.0          # moves drawn with probability visits^(1/T) ...
    temp_cutoff_ply: int = 30         # ... before this ply of the game, the most visited after (0: always T)
    max_plies: int = 450              # a game this long is adjudicated a draw ("max_plies")
    resign_q: Optional[float] = -0.9  # resign when the mover's root Q (W - L) is at or below this (None: never)
    resign_playthrough: float = 0.1   # share of games that never resign (to measure false positives)
    opening_plies: int = 0            # uniformly random plies played (unrecorded) at each game's start
    opening_fens: tuple[str, ...] = ()  # start positions, one drawn per game (empty: the standard one)
    seed: Optional[int] = None        # fixes every draw of every game (None: a fresh seed per run)
    search: SearchParams = field(default_factory=SearchParams)  # the rest of the search's settings

    def __post_init__(self) -> None:
        for name in ("visits", "fast_visits", "max_plies"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        for name in ("temp_cutoff_ply", "opening_plies"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
        for name in ("full_search_prob", "noise_epsilon", "resign_playthrough"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within 0..1, got {value!r}")
        if self.full_search_prob <= 0.0:
            raise ValueError("full_search_prob must be > 0: no move would be recorded")
        if self.resign_q is not None and not -1.0 <= self.resign_q <= 1.0:
            raise ValueError(f"resign_q must be within -1..1 or None, got {self.resign_q!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or self.seed < 0):
            raise ValueError(f"seed must be a whole number >= 0 or None, got {self.seed!r}")
        if isinstance(self.opening_fens, str):
            raise ValueError("opening_fens must be a sequence of FENs, not one string")
        object.__setattr__(self, "opening_fens", tuple(self.opening_fens))
        for fen in self.opening_fens:
            try:
                board = chess.Board(fen)
            except ValueError as exc:
                raise ValueError(f"opening FEN {fen!r} is not valid: {exc}") from None
            if not board.is_valid() or board.is_game_over(claim_draw=True):
                raise ValueError(f"opening FEN {fen!r} is not a playable position")
        # Validates the search settings that self-play sets (noise alpha, temperature).
        self.search_params()

    def search_params(self) -> SearchParams:
        """The search's settings for self-play: noise and temperature from here, no smart pruning
        (a full search must spend all its visits: its visit counts are the policy target)."""
        return self.search.replace(noise_alpha=self.noise_alpha, noise_epsilon=self.noise_epsilon,
                                   temperature=self.temperature, temp_cutoff_ply=self.temp_cutoff_ply,
                                   smart_pruning_factor=0.0, seed=0)


# [selfplay] keys that are not settings of a game: the worker (games_per_worker, syzygy) and the
# daemon (openings, the file it resolves to FENs) deal with them.
_NOT_GAME_SETTINGS = frozenset({"games_per_worker", "openings", "syzygy", "resign"})


def settings_from_config(selfplay: Union[dict, SelfPlayConfig], openings: Sequence[str] = (),
                         seed: Optional[int] = None) -> SelfPlaySettings:
    """The :class:`SelfPlaySettings` of a run's ``[selfplay]`` section (a dict, as ``Registered``
    carries it, or a :class:`trainer.config.SelfPlayConfig`), with ``openings`` as FENs.

    A dict is checked as the config file is, so a bad value is a ValueError naming the key
    (``selfplay.visits must be >= 1``); keys left out keep their defaults.
    """
    if isinstance(selfplay, dict):
        selfplay = from_dict({"selfplay": dict(selfplay)}).selfplay
    elif not isinstance(selfplay, SelfPlayConfig):
        raise ValueError(f"selfplay settings must be a dict or SelfPlayConfig, got {type(selfplay).__name__}")
    values = {key: value for key, value in dataclasses.asdict(selfplay).items() if key not in _NOT_GAME_SETTINGS}
    values["resign_q"] = selfplay.resign_q if selfplay.resign else None
    if isinstance(openings, str):
        raise ValueError("openings must be a sequence of FENs, not one string")
    return SelfPlaySettings(**values, opening_fens=tuple(openings), seed=seed)


@dataclass
class FinishedGame:
    """One finished self-play game: what the worker sends to the replay store."""

    game_id: str                   # uuid4 hex: the store drops a game id it already holds
    generation: int                # the generation that played the game's first move (the oldest)
    generations: tuple[int, ...]   # every generation that played a move of it, in order
    records: np.ndarray            # RECORD_DTYPE, the full-search positions, results filled in; empty
                                   # when no move had a full search (a short game may have none)
    pgn: str                       # the whole game (opening plies included), with headers
    result: str                    # "1-0", "0-1" or "1/2-1/2"
    termination: str               # Board.outcome's name, "max_plies", "resignation" or "syzygy"
    plies: int                     # plies played, opening plies included
    would_have_resigned_wrongly: Optional[bool]  # playthrough games that hit the threshold; else None


class _Game:
    """One game in progress."""

    def __init__(self, key: str, rng: np.random.Generator, fen: Optional[str], board: Board,
                 moves: list[str], playthrough: bool, generation: int) -> None:
        self.key = key
        self.rng = rng
        self.fen = fen
        self.board = board
        self.moves = moves                       # every ply from the start position
        self.playthrough = playthrough
        self.generations = [generation]
        self.records: list[np.void] = []
        self.turns: list[bool] = []              # side to move of each record
        self.record_plies: list[int] = []        # len(moves) at each record
        self.would_resign: Optional[bool] = None  # the side that would have resigned (playthrough)


# The largest batch a GPU worker's network runs (one session per power of two up to it).
GPU_MAX_BATCH = 1024


def worker_max_batch(games: int, settings: SelfPlaySettings) -> int:
    """The largest batch of a worker's network on a GPU: half its games' leaves of one round
    (two batches are in flight), a power of two from 256 to :data:`GPU_MAX_BATCH`."""
    from engine.move_search import CPU_MINIBATCH
    from engine.network import DEFAULT_MAX_BATCH

    leaves = games * (settings.search.minibatch_size or CPU_MINIBATCH) // 2
    return max(DEFAULT_MAX_BATCH, min(GPU_MAX_BATCH, 1 << max(0, leaves - 1).bit_length()))


class SelfPlay:
    """``games`` self-play games kept going at once through one :class:`MultiSearch`.

    ``network`` has ``evaluate(planes) -> (policy, wdl, mlh)`` (an
    :class:`engine.network.Network`). ``pipeline`` keeps two batches in flight
    (the network on a helper thread while the next batch is gathered);
    ``max_batch`` caps the driver's batch. ``tablebases``: an
    :class:`engine.book.Tablebases` (``max_pieces`` and ``root_moves(board)``)
    that adjudicates positions with few enough pieces, or None.
    """

    def __init__(self, network: Any, settings: Optional[SelfPlaySettings] = None, games: int = 1, *,
                 generation: int = 0, pipeline: bool = True, max_batch: Optional[int] = None,
                 tablebases: Any = None) -> None:
        if isinstance(games, bool) or not isinstance(games, int) or games < 1:
            raise ValueError(f"games must be a whole number >= 1, got {games!r}")
        self.settings = settings or SelfPlaySettings()
        self.generation = generation
        self.tablebases = tablebases
        self.search = MultiSearch(network, self.settings.search_params(), pipeline=pipeline,
                                  max_batch=max_batch)
        self._seeds = np.random.SeedSequence(self.settings.seed)
        self.positions = 0    # moves searched in full (recorded) so far
        self.moves = 0        # moves played by search so far
        self.games: list[_Game] = [self._new_game() for _ in range(games)]

    # -- the loop ---------------------------------------------------------------------------

    def step(self) -> list[FinishedGame]:
        """Search and play one move in every game; return the games that ended (replaced by new ones)."""
        s = self.settings
        full: dict[str, bool] = {}
        wanted: dict[Hashable, tuple[Board, GoParams]] = {}
        for game in self.games:
            full[game.key] = bool(game.rng.random() < s.full_search_prob)
            tree = self.search.trees[game.key]
            tree.configure(noise_epsilon=s.noise_epsilon if full[game.key] else 0.0)
            nodes = s.visits if full[game.key] else s.fast_visits
            wanted[game.key] = (game.board.copy(), GoParams(nodes=nodes))
        results = cast(dict[Hashable, SearchResult], self.search.search(wanted))
        finished = []
        for i, game in enumerate(self.games):
            result = results[game.key]
            if result.error is not None or result.best is None:
                raise RuntimeError(f"self-play search failed: {result.error or 'no move in ' + game.board.fen()}")
            end = self._play(game, result, full[game.key])
            if end is not None:
                finished.append(self._finish(game, *end))
                self.games[i] = self._new_game()
        return finished

    def set_network(self, network: Any, generation: int) -> None:
        """Play the next moves with ``network``; the games go on. The old evaluations (the cache
        and the trees' values) are dropped, so no move is searched with two networks' values."""
        self.search.network = network
        self.search.cache.clear()
        for tree in self.search.trees.values():
            tree.reset()
        self.generation = generation

    def close(self) -> None:
        """Stop the driver's helper thread."""
        self.search.close()

    # -- one game ---------------------------------------------------------------------------

    def _new_game(self) -> _Game:
        s = self.settings
        rng = np.random.default_rng(self._seeds.spawn(1)[0])
        fen = s.opening_fens[int(rng.integers(len(s.opening_fens)))] if s.opening_fens else None
        for _ in range(_OPENING_TRIES):
            board = Board(fen) if fen else Board()
            moves: list[str] = []
            for _ply in range(s.opening_plies):
                legal = board.legal_moves()
                if not legal or board.outcome(claim_draw=True) is not None:
                    break
                move = legal[int(rng.integers(len(legal)))]
                board.push_uci(move)
                moves.append(move)
            if board.outcome(claim_draw=True) is None and len(moves) < s.max_plies:
                break
        else:
            raise RuntimeError(f"no playable opening after {_OPENING_TRIES} tries of {s.opening_plies} random plies")
        playthrough = s.resign_q is not None and bool(rng.random() < s.resign_playthrough)
        key = uuid.uuid4().hex   # never from the seed: a rerun's games must not share ids
        tree_seed = int(rng.integers(1, 2**31 - 1)) if s.seed is not None else None
        self.search.new_game(key, seed=tree_seed)
        return _Game(key, rng, fen, board, moves, playthrough, self.generation)

    def _play(self, game: _Game, result: SearchResult, full: bool
              ) -> Optional[tuple[Optional[bool], str, bool]]:
        """Record (if ``full``) and play the searched move; ``(winner, termination, adjudicated)``
        when the game is over."""
        s = self.settings
        board = game.board
        turn = board.turn
        move = result.best
        assert move is not None
        if game.generations[-1] != self.generation:
            game.generations.append(self.generation)
        self.moves += 1
        if s.resign_q is not None and result.q <= s.resign_q:
            if not game.playthrough:
                return (not turn), "resignation", True
            if game.would_resign is None:
                game.would_resign = turn
        if full and result.visits:
            tree = self.search.trees[game.key]
            children = {c["move"]: c for c in tree.root_children()}
            best = max(result.visits, key=lambda m: result.visits[m])
            root = Eval(result.q, result.d, math.nan)
            game.records.append(make_record(
                board, result.visits, result_q=0.0, result_d=1.0, plies_left=0.0, played=move, root=root,
                best=best, best_eval=_child_eval(children.get(best), root),
                played_eval=_child_eval(children.get(move), root), nodes=result.nodes,
                input_format=tree.input_format))   # the searching network's: its planes and indices
            game.turns.append(turn)
            game.record_plies.append(len(game.moves))
            self.positions += 1
        board.push_uci(move)
        game.moves.append(move)
        outcome = board.outcome(claim_draw=True)
        if outcome is not None:
            termination, winner = outcome
            return winner, termination, False
        end = self._syzygy(board) if self.tablebases is not None else None
        if end is not None:
            return end
        if len(game.moves) >= s.max_plies:
            return None, "max_plies", True
        return None

    def _syzygy(self, board: Board) -> Optional[tuple[Optional[bool], str, bool]]:
        """``(winner, "syzygy", True)`` when the tables know the position (a cursed win or blessed
        loss, lost to the fifty-move rule, is a draw); None otherwise."""
        if sum(c.isalpha() for c in board.board_fen()) > self.tablebases.max_pieces:
            return None
        known = self.tablebases.root_moves(board)
        if known is None:
            return None
        wdl = known[1]
        winner = board.turn if wdl >= 2 else (not board.turn) if wdl <= -2 else None
        return winner, "syzygy", True

    def _finish(self, game: _Game, winner: Optional[bool], termination: str, adjudicated: bool) -> FinishedGame:
        self.search.forget(game.key)
        plies = len(game.moves)
        records = np.array(game.records, dtype=RECORD_DTYPE) if game.records else np.zeros(0, RECORD_DTYPE)
        if len(records):
            turns = np.array(game.turns)
            if winner is None:
                records["result_q"], records["result_d"] = 0.0, 1.0
            else:
                records["result_q"] = np.where(turns == winner, 1.0, -1.0)
                records["result_d"] = 0.0
            left = plies - np.array(game.record_plies, dtype=np.float32)
            records["plies_left"] = left
            records["root_m"] = left
            records["best_m"] = left
            records["played_m"] = left
            flags = (1 << 5 if adjudicated else 0) | (1 << 4 if termination == "max_plies" else 0)
            records["invariance_info"] |= flags
        result = "1/2-1/2" if winner is None else ("1-0" if winner else "0-1")
        wrongly = None
        if game.would_resign is not None:
            wrongly = winner != (not game.would_resign)
        return FinishedGame(game_id=game.key, generation=game.generations[0],
                            generations=tuple(game.generations), records=records,
                            pgn=_pgn(game, result, termination), result=result, termination=termination,
                            plies=plies, would_have_resigned_wrongly=wrongly)


def _child_eval(child: Optional[Mapping[str, Any]], root: Eval) -> Eval:
    """A root move's (q, d) from the root's side to move; the root's own when it has no visits."""
    if child is None or child["q"] is None or child["d"] is None:
        return root
    return Eval(float(child["q"]), float(child["d"]), math.nan)


def _pgn(game: _Game, result: str, termination: str) -> str:
    """The game as PGN text, its moves replayed (and so checked) by python-chess."""
    pgn = chess.pgn.Game()
    pgn.headers["Event"] = "cyzero self-play"
    pgn.headers["White"] = pgn.headers["Black"] = "cyzero"
    pgn.headers["Result"] = result
    pgn.headers["Termination"] = termination
    pgn.headers["Generation"] = ",".join(str(g) for g in game.generations)
    pgn.headers["GameId"] = game.key
    if game.fen:
        pgn.setup(chess.Board(game.fen))
    node: chess.pgn.GameNode = pgn
    for move in game.moves:
        node = node.add_variation(chess.Move.from_uci(move))
    return str(pgn)
