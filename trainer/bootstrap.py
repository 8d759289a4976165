"""A supervised start: training records from a teacher UCI engine or from PGN game records.

Both write lc0 V6 records (:mod:`trainer.records`) into the run's replay store as
generation 0, through :meth:`trainer.store.ReplayStore.writer`, and both resume:
running the same command again continues where the last run stopped.

Teacher (:func:`bootstrap_teacher`)
    Several worker processes each own one teacher engine (python-chess
    ``SimpleEngine``, ``Threads 1``, a small hash, ``UCI_ShowWDL``) and play it
    against itself: ``opening_plies/2 .. opening_plies`` uniformly random plies
    first, then the teacher's best move, except for a ``random_move_share`` of
    uniformly random moves.  With a ``student`` network, the student plays one side
    of each game (drawn at random) with its policy's first choice, and the teacher
    the other: the positions are then those the student's own moves lead to (its
    hanging pieces, the attacks it walks into), which the teacher's games alone
    rarely reach, each still labelled by the teacher.  A game ends by the rules
    (mate, stalemate, insufficient material, and the draws a player may claim:
    fifty moves and threefold repetition), by Syzygy when tablebases are given
    (adjudicated), or as a draw at ``max_plies`` (adjudicated, max length exceeded).

    Every position a move was played from is labelled by one teacher search
    (``go depth D`` with ``MultiPV M``):

    * value: the teacher's WDL (Stockfish's ``UCI_ShowWDL``; for an engine without
      it, python-chess's Stockfish WDL model of its score) from the side to move's
      view, as ``q = w - l`` and ``d``.  It goes into ``result_q``/``result_d``,
      the value target the learner trains on (:func:`trainer.records.decode_records`),
      and into ``root``/``best``.  Why not the game's result: random moves and a
      shallow teacher make the outcome a noisy label of the positions before it,
      while the evaluation labels each position on its own.
    * the game's actual result (side to move's view) is kept in ``orig_q``/``orig_d``
      with ``orig_m`` = plies left.  lc0 puts the raw network's evaluation there
      (NaN without one); a teacher has no such value, and this keeps the outcome
      available for anyone who wants to train on results.
    * ``played_q``/``played_d``: the teacher's value of the position after the
      played move (for the last move: the game's result), from the mover's view.
    * policy: the softmax of the MultiPV scores over those moves,
      ``exp((cp - cp_best) / temperature)``, mates scored as ``MATE_CP`` minus the
      distance; other moves get 0.  With ``multipv=1`` the best move alone.
    * ``plies_left``: plies to the game's end (1 before the last move).

    Resume: the teacher positions already committed count towards ``positions``
    (the larger of the store's count and ``RUN/bootstrap/teacher.json``, which
    also remembers chunks the learner's retention has pruned since); a run
    writes only the difference and stops at exactly ``positions`` (the last
    game is cut).  Games are committed in groups
    (``positions_per_chunk``, and at least every ``commit_seconds``), so a killed
    run loses only the games not yet committed.

Defaults: depth 6, MultiPV 1 (temperature 50 cp for a MultiPV above 1); see
"Choosing the defaults" below for what was measured.

PGN (:func:`bootstrap_pgn`)
    Every game of standard chess with a decided or drawn result becomes records:
    the played move as the policy target (weight 1), the result from the side to
    move's view as the value target (``result``, ``root``, ``best`` and ``played``
    all carry it; ``orig`` is NaN as in lc0's data without a network), and
    ``plies_left`` = plies to the end of the game.  Games starting from a ``FEN``
    header are imported when :class:`engine.board.Board` accepts that FEN.
    Skipped, with one log line each and counted in the summary: no result
    (``*``), illegal moves or other parse errors, variants (Chess960 included),
    FENs the engine refuses, games without moves.  Resume state is
    ``RUN/bootstrap/pgn.json``: per file (by sha256) the games read so far.  It
    is written atomically around every commit with the commit marked pending, so
    a run killed between the commit and the state update is settled from the
    store's count on the next start: no game is imported twice.

Choosing the defaults
    Cost, Debian's Stockfish 15.1 on one thread of the project's 2-core machine,
    in play (python-chess and building records included, about 0.9 ms of it;
    :func:`labelling_cost` measures it on yours), ms a position: depth 4 1.3,
    depth 6 2.0, depth 8 5.0-5.6, depth 10 17; MultiPV 4 at depth 6 4.9, at
    depth 8 16-19; MultiPV 8 at depth 8 26-32.

    Learning per labelling time: each setting labelled an equal single-thread
    time budget of positions, a 2x32 network trained the same steps on each
    (AdamW, batches of 256), losses on the same 1,500 held-out positions
    labelled at depth 12, MultiPV 8 (policy target entropy 1.47, uniform over
    legal moves 3.20; value target entropy 0.13, a constant guess 1.10)::

        budget 240 s, 2000 steps   positions   policy CE   value CE   top-1
        depth 4, MultiPV 1           181,552       2.947      0.519   23.3%
        depth 6, MultiPV 1           119,853       3.005      0.562   23.4%
        depth 6, MultiPV 4            49,027       2.940      0.830   23.5%
        depth 8, MultiPV 1            43,812       3.413      0.895   20.5%
        budget 60 s, 1200 steps
        depth 6, MultiPV 1            29,021       3.397      1.008   20.1%
        depth 8, MultiPV 1            10,672       5.760      1.231   14.5%
        depth 8, MultiPV 4             3,219       5.161      1.969   15.7%
        depth 8, MultiPV 8             1,856       4.661      2.806   13.5%
        depth 10, MultiPV 1            3,504       6.843      2.151   15.5%

    More positions beat better labels at these sizes: the value head overfits
    on fewer than about 100k positions, and MultiPV's soft targets help the
    policy (depth 6 with MultiPV 4 matches depth 4 on a quarter of the
    positions) but starve the value head.  Depths 4 and 6 are within noise of
    each other, and the gap to deeper labels narrows as the budget grows
    (depth 6 against 8, best total loss over training: 0.55 apart at 60 s,
    0.28 at 240 s), so the default is depth 6, a little deeper than the
    optimum measured here, for the many-core, hours-long budgets of a real
    bootstrap.
"""

from __future__ import annotations

import bz2
import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import logging
import math
import multiprocessing
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, NamedTuple, cast

import chess
import chess.engine
import chess.pgn
import chess.syzygy
import numpy as np

from engine.board import Board
from trainer.atomic import atomic_write_text
from trainer.config import TEACHER_DEFAULTS, load_effective_config
from trainer.devices import usable_cores
from trainer.records import INPUT_FORMAT_CLASSICAL, RECORD_DTYPE, Eval, make_record
from trainer.rundir import bootstrap_state_path, run_lock

__all__ = [
    "DEFAULT_DEPTH",
    "DEFAULT_MULTIPV",
    "DEFAULT_TEMPERATURE",
    "MATE_CP",
    "TeacherError",
    "TeacherSummary",
    "PgnSummary",
    "default_teacher",
    "bootstrap_teacher",
    "bootstrap_pgn",
    "labelling_cost",
]

_logger = logging.getLogger(__name__)

DEFAULT_DEPTH: int = TEACHER_DEFAULTS["depth"]
DEFAULT_MULTIPV: int = TEACHER_DEFAULTS["multipv"]
DEFAULT_TEMPERATURE: float = TEACHER_DEFAULTS["temperature"]   # centipawns
DEFAULT_RANDOM_MOVE_SHARE: float = TEACHER_DEFAULTS["random_move_share"]
DEFAULT_OPENING_PLIES: int = TEACHER_DEFAULTS["opening_plies"]
DEFAULT_MAX_PLIES: int = TEACHER_DEFAULTS["max_plies"]
DEFAULT_HASH_MB = 16
DEFAULT_POSITIONS_PER_CHUNK = 4096
DEFAULT_COMMIT_SECONDS = 60.0
#: the score of a mate in 0 plies; a mate in n scores MATE_CP - n (python-chess's ``mate_score``)
MATE_CP = 100_000
#: seconds a teacher gets to answer ``uci`` (python-chess's own default is 10)
_START_TIMEOUT_S = 20.0

TEACHER_SOURCE = "teacher"
PGN_SOURCE = "pgn"
_PGN_STATE_VERSION = 1


class TeacherError(RuntimeError):
    """The teacher engine could not be started, does not speak UCI, or died; the message names its command."""


@dataclasses.dataclass(frozen=True)
class TeacherSummary:
    """What :func:`bootstrap_teacher` did."""

    teacher: str             # the engine's name (``id name``), or its command when nothing was started
    positions: int           # teacher positions in the store now
    added: int               # positions this run wrote
    games: int               # games this run wrote (the last one maybe cut to reach ``positions``)
    terminations: dict[str, int]   # how those games ended: python-chess's Termination names
                                   # ("checkmate", "threefold_repetition", ...), "syzygy", "max_plies"
    seconds: float
    stopped: bool = False    # asked to stop (SIGTERM, Ctrl-C) before reaching ``positions``


@dataclasses.dataclass(frozen=True)
class PgnSummary:
    """What :func:`bootstrap_pgn` did; ``skipped`` counts skipped games by reason."""

    files: int               # files given
    files_already_done: int  # files a previous run had imported completely
    games: int               # games imported by this run
    positions: int           # positions imported by this run
    skipped: dict[str, int]
    seconds: float


# --------------------------------------------------------------------------------------------
# shared plumbing


def _open_store(run_dir: str | os.PathLike, input_format: int) -> Any:
    from trainer.store import ReplayStore

    return ReplayStore(run_dir, input_format)


def run_input_format(run_dir: str | os.PathLike) -> int:
    """The input format of the run's network, which its records are written in: its config's
    ``model.input_format`` (RUN/config.effective.toml, else RUN/config.toml), else lc0's classical 1."""
    return load_effective_config(run_dir).model.input_format


def _source_positions(store: Any, source: str) -> int:
    return sum(e.positions for e in store.entries() if e.source == source)


def _progress_bar(total: int, initial: int, desc: str, enabled: bool, unit: str = "pos") -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, unit_scale=unit == "B",
                disable=not enabled, dynamic_ncols=True, smoothing=0.05)


def _wdl_of_result(winner: bool | None, turn: bool) -> tuple[float, float]:
    """(q, d) of a game result from the view of the side ``turn`` (True = white)."""
    if winner is None:
        return 0.0, 1.0
    return (1.0 if winner == turn else -1.0), 0.0


# --------------------------------------------------------------------------------------------
# the teacher


def default_teacher() -> list[str]:
    """Debian's ``stockfish``: on PATH, else ``/usr/games/stockfish`` (not on a user's PATH by default)."""
    found = shutil.which("stockfish") or shutil.which("/usr/games/stockfish")
    if found is None:
        raise TeacherError("no teacher given and no 'stockfish' on PATH or at /usr/games/stockfish "
                           "(install it, e.g. apt install stockfish, or pass --teacher CMD)")
    return [found]


class _Label(NamedTuple):
    weights: dict[str, float]   # policy target: UCI move -> weight (not normalised)
    best: str
    q: float
    d: float
    nodes: int


class _Teacher:
    """One teacher engine: starts it, labels positions, and turns its failures into TeacherError."""

    def __init__(self, command: Sequence[str], *, hash_mb: int = DEFAULT_HASH_MB,
                 syzygy: str | None = None) -> None:
        self.command = list(command)
        self.name = shlex.join(self.command)
        try:
            # its own session: a Ctrl-C or a SIGTERM to the labelling's process group stops the
            # labelling cleanly (trainer.stop_signals) instead of killing the teachers mid-game; one
            # whose worker is gone ends at the end of its input
            self.engine = chess.engine.SimpleEngine.popen_uci(self.command, timeout=_START_TIMEOUT_S,
                                                              start_new_session=True)
        except (OSError, ValueError) as exc:
            raise TeacherError(f"cannot start teacher {self.name}: {exc}") from None
        except (chess.engine.EngineError, chess.engine.EngineTerminatedError, TimeoutError) as exc:
            raise TeacherError(f"teacher {self.name} did not start as a UCI engine: "
                               f"{exc or type(exc).__name__}") from None
        options: dict[str, str | int | bool] = {"Threads": 1, "Hash": hash_mb, "UCI_ShowWDL": True}
        if syzygy:
            options["SyzygyPath"] = syzygy
        try:
            self.engine.configure({k: v for k, v in options.items() if k in self.engine.options})
        except (chess.engine.EngineError, chess.engine.EngineTerminatedError) as exc:
            self.close()
            raise TeacherError(f"teacher {self.name} refused its options {options}: {exc}") from None
        self.id_name = self.engine.id.get("name", self.name)

    def check_multipv(self, multipv: int) -> None:
        if multipv > 1 and "MultiPV" not in self.engine.options:
            raise TeacherError(f"teacher {self.name} has no MultiPV option: use multipv 1")

    def label(self, board: chess.Board, *, depth: int, multipv: int, temperature: float,
              game: object) -> _Label:
        limit = chess.engine.Limit(depth=depth)
        try:
            if multipv > 1:
                infos = self.engine.analyse(board, limit, multipv=multipv, game=game)
            else:   # without the MultiPV option, which not every engine has
                infos = [self.engine.analyse(board, limit, game=game)]
        except (chess.engine.EngineError, chess.engine.EngineTerminatedError) as exc:
            raise TeacherError(f"teacher {self.name} failed on {board.fen()}: "
                               f"{exc or type(exc).__name__}") from None
        lines = [i for i in infos if i.get("pv") and "score" in i]
        if not lines:
            raise TeacherError(f"teacher {self.name} gave no move for {board.fen()}")
        best = lines[0]
        wdl = best.get("wdl")
        if wdl is None:  # an engine without UCI_ShowWDL: Stockfish's model of its score
            wdl = best["score"].wdl(model="sf", ply=board.ply())
        w, d, l = wdl.relative.wins, wdl.relative.draws, wdl.relative.losses
        total = w + d + l
        q, draw = (w - l) / total, d / total
        scores = [i["score"].relative.score(mate_score=MATE_CP) for i in lines]
        top = max(scores)
        weights: dict[str, float] = {}
        for info, cp in zip(lines, scores):
            weights[info["pv"][0].uci()] = math.exp((cp - top) / temperature)
        return _Label(weights, lines[0]["pv"][0].uci(), q, draw, int(best.get("nodes", 0)))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.engine.quit()
        with contextlib.suppress(Exception):
            self.engine.close()


@dataclasses.dataclass(frozen=True)
class _GameSettings:
    depth: int
    multipv: int
    temperature: float
    random_move_share: float
    opening_plies: int
    max_plies: int
    syzygy: str | None
    student: str | None = None      # an ONNX file that plays one side of each game
    input_format: int = INPUT_FORMAT_CLASSICAL   # lc0's, the records' (the run's network's)


class _Student:
    """A network that plays its policy's first choice, on one CPU thread of a teacher's worker."""

    def __init__(self, path: str) -> None:
        from engine.network import Network, NetworkError

        try:
            self.net = Network(path, backend="cpu", intra_threads=1, max_batch=1, warmup_batch=1)
        except (NetworkError, OSError) as exc:
            raise TeacherError(f"cannot load student network {path}: {exc}") from None

    def move(self, board: Board) -> str:
        from engine.encoding import encode_board, legal_policy

        logits = self.net.evaluate(encode_board(board)[None])[0]
        names, priors = legal_policy(board, logits[0])
        return names[int(np.argmax(priors))]

    def close(self) -> None:
        self.net.close()


class _Game(NamedTuple):
    records: np.ndarray
    termination: str      # python-chess's Termination name (lower case), "syzygy" or "max_plies"


def _syzygy_result(tablebase: chess.syzygy.Tablebase | None,
                   board: chess.Board) -> tuple[bool, bool | None]:
    """(known, winner): whether the tablebases know the position, and the winner (None: a draw)."""
    if tablebase is None or board.castling_rights or chess.popcount(board.occupied) > 7:
        return False, None
    try:
        wdl = tablebase.probe_wdl(board)
    except (KeyError, ValueError):  # a missing table; castling or too many pieces
        return False, None
    if wdl in (-1, 0, 1):           # drawn, or decided only beyond the fifty-move rule
        return True, None
    return True, board.turn if wdl > 0 else not board.turn


def _play_game(teacher: _Teacher, settings: _GameSettings, rng: np.random.Generator,
               tablebase: chess.syzygy.Tablebase | None, stop: Any,
               student: _Student | None = None) -> _Game | None:
    """One game of the teacher against itself (or against ``student``), labelled; None when
    ``stop`` was set during it."""
    board = chess.Board()
    low = settings.opening_plies // 2
    random_plies = int(rng.integers(low, settings.opening_plies + 1)) if settings.opening_plies else 0
    # the student's side, and the game on the engine's board for its history planes
    student_side = bool(rng.integers(2)) if student is not None else None
    replay = Board() if student is not None else None
    game_id = object()
    labels: list[_Label] = []
    moves: list[str] = []
    adjudicated = max_length = False
    while True:
        outcome = board.outcome(claim_draw=True)
        if outcome is not None:
            winner, termination = outcome.winner, outcome.termination.name.lower()
            break
        if board.ply() >= settings.max_plies:
            winner, termination, adjudicated, max_length = None, "max_plies", True, True
            break
        known, winner = _syzygy_result(tablebase, board)
        if known:
            termination, adjudicated = "syzygy", True
            break
        if stop.is_set():
            return None
        label = teacher.label(board, depth=settings.depth, multipv=settings.multipv,
                              temperature=settings.temperature, game=game_id)
        if board.ply() < random_plies or rng.random() < settings.random_move_share:
            legal = list(board.legal_moves)
            move = legal[int(rng.integers(len(legal)))].uci()
        elif board.turn == student_side:
            move = student.move(replay)
        else:
            move = label.best
        labels.append(label)
        moves.append(move)
        board.push_uci(move)
        if replay is not None:
            replay.push_uci(move)
    return _Game(_teacher_records(labels, moves, winner, adjudicated, max_length, settings.input_format),
                 termination)


def _teacher_records(labels: list[_Label], moves: list[str], winner: bool | None,
                     adjudicated: bool, max_length: bool, input_format: int) -> np.ndarray:
    """The game's records, built on an engine Board that replays it (so history planes are right)."""
    n = len(moves)
    records = np.zeros(n, dtype=RECORD_DTYPE)
    board = Board()
    for i, (label, move) in enumerate(zip(labels, moves)):
        turn = i % 2 == 0   # teacher games start from the standard position: white first
        left = n - i
        game_q, game_d = _wdl_of_result(winner, turn)
        if i + 1 < n:
            after = labels[i + 1]
            played = Eval(-after.q, after.d, left - 1)
        else:
            played = Eval(*_wdl_of_result(winner, turn), left - 1)
        root = Eval(label.q, label.d, left)
        records[i] = make_record(
            board, label.weights, result_q=label.q, result_d=label.d, plies_left=left,
            played=move, root=root, best=label.best, best_eval=root, played_eval=played,
            orig=Eval(game_q, game_d, left), adjudicated=adjudicated,
            max_length_exceeded=max_length, nodes=label.nodes, input_format=input_format,
        )
        board.push_uci(move)
    return records


def _teacher_worker(conn: Connection, command: list[str], hash_mb: int, settings: _GameSettings,
                    seed: list[int], stop: Any) -> None:
    """A worker process: plays and labels games until ``stop``; sends each as (JSON header, record bytes)."""
    teacher = None
    tablebase = None
    student = None
    # The parent stops the workers (``stop``) after a Ctrl-C or a SIGTERM to the process group:
    # a worker killed by it mid-send would look like a teacher that died. (One still starting
    # dies of it; _receive_game takes that for the stop it is.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        teacher = _Teacher(command, hash_mb=hash_mb, syzygy=settings.syzygy)
        if settings.syzygy:
            tablebase = chess.syzygy.Tablebase()
            for folder in settings.syzygy.split(os.pathsep):
                tablebase.add_directory(folder)
        if settings.student:
            student = _Student(settings.student)
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            game = _play_game(teacher, settings, rng, tablebase, stop, student)
            if game is None:
                break
            header = {"positions": len(game.records), "termination": game.termination}
            conn.send_bytes(json.dumps(header).encode())
            conn.send_bytes(game.records.tobytes())
    except (BrokenPipeError, KeyboardInterrupt):
        pass    # the parent stopped listening: nothing to report to
    except Exception as exc:  # noqa: BLE001 - anything reaches the parent as one line
        error = str(exc) if isinstance(exc, TeacherError) else (
            f"teacher worker failed: {type(exc).__name__}: {exc}")
        with contextlib.suppress(OSError):
            conn.send_bytes(json.dumps({"error": error}).encode())
    finally:
        if tablebase is not None:
            tablebase.close()
        if teacher is not None:
            teacher.close()
        if student is not None:
            student.close()
        conn.close()


def bootstrap_teacher(
    run_dir: str | os.PathLike,
    *,
    teacher: Sequence[str] | None = None,
    positions: int,
    workers: int | None = None,
    depth: int = DEFAULT_DEPTH,
    multipv: int = DEFAULT_MULTIPV,
    temperature: float = DEFAULT_TEMPERATURE,
    random_move_share: float = DEFAULT_RANDOM_MOVE_SHARE,
    opening_plies: int = DEFAULT_OPENING_PLIES,
    max_plies: int = DEFAULT_MAX_PLIES,
    syzygy: str | None = None,
    hash_mb: int = DEFAULT_HASH_MB,
    seed: int = 0,
    student: str | os.PathLike | None = None,
    positions_per_chunk: int = DEFAULT_POSITIONS_PER_CHUNK,
    commit_seconds: float = DEFAULT_COMMIT_SECONDS,
    progress: bool = True,
    stop: threading.Event | None = None,
    input_format: int | None = None,
) -> TeacherSummary:
    """Fill the run's store up to ``positions`` teacher-labelled positions (see the module docstring),
    in ``input_format`` (lc0's; default: the run's config's network's, :func:`run_input_format`).

    ``teacher`` is the engine's command line (default: :func:`default_teacher`);
    ``workers`` teacher processes run at once (default: one per CPU).  Raises
    :class:`TeacherError` naming the command when the teacher cannot be started
    or dies, or when the ``student`` network cannot be loaded; games committed before that stay
    in the store.  ``stop`` set (within a second;
    :func:`trainer.stop_signals.stop_on_signals`): every finished game is committed and the summary says so; the
    games still being played are lost.
    """
    command = list(teacher) if teacher else default_teacher()
    workers = usable_cores() if workers is None else workers
    stop = threading.Event() if stop is None else stop
    _check_teacher_args(positions=positions, workers=workers, depth=depth, multipv=multipv,
                        temperature=temperature, random_move_share=random_move_share,
                        opening_plies=opening_plies, max_plies=max_plies, syzygy=syzygy,
                        hash_mb=hash_mb, positions_per_chunk=positions_per_chunk)
    student = os.path.abspath(student) if student is not None else None
    input_format = run_input_format(run_dir) if input_format is None else input_format
    settings = _GameSettings(depth, multipv, float(temperature), float(random_move_share),
                             opening_plies, max_plies, syzygy, student, input_format)
    started = time.monotonic()
    with run_lock(run_dir, TEACHER_SOURCE):
        store = _open_store(run_dir, input_format)
        progress_path = bootstrap_state_path(run_dir, TEACHER_SOURCE)
        done = max(_source_positions(store, TEACHER_SOURCE), _read_teacher_state(progress_path))
        if done >= positions:
            return TeacherSummary(shlex.join(command), done, 0, 0, {}, time.monotonic() - started)
        probe = _Teacher(command, hash_mb=hash_mb)   # a bad command fails here, before any worker
        name = probe.id_name
        try:
            probe.check_multipv(multipv)
        finally:
            probe.close()
        if student is not None:   # a bad network fails here too
            _Student(student).close()
        need = positions - done
        ctx = multiprocessing.get_context("spawn")
        workers_stop = ctx.Event()
        procs: list[Any] = []
        conns: dict[Connection, int] = {}
        added = games = 0
        terminations: dict[str, int] = {}
        bar = _progress_bar(positions, done, "teacher", progress)
        try:
            for k in range(min(workers, need)):
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_teacher_worker, name=f"cyzero-teacher-{k}", daemon=True,
                                   args=(send, command, hash_mb, settings, [seed, done, k], workers_stop))
                proc.start()
                send.close()
                procs.append(proc)
                conns[recv] = k
            with store.writer(generation=0, source=TEACHER_SOURCE,
                              positions_per_chunk=positions_per_chunk) as writer:
                last_commit = time.monotonic()
                while added < need and not stop.is_set():
                    for conn in cast(list[Connection], wait(list(conns), timeout=1.0)):
                        game = _receive_game(conn, procs[conns[conn]], command, stop)
                        if game is None:
                            stop.set()
                            break
                        header, records = game
                        take = min(len(records), need - added)
                        if take:
                            committed = writer.add_game(records[:take])
                            added += take
                            if committed is not None:
                                last_commit = _committed(progress_path, done + added, writer)
                            games += 1
                            end = header["termination"]
                            terminations[end] = terminations.get(end, 0) + 1
                            bar.update(take)
                        if added >= need:
                            break
                    if time.monotonic() - last_commit >= commit_seconds and writer.commit():
                        last_commit = _committed(progress_path, done + added, writer)
            _committed(progress_path, done + added, writer)
        finally:
            workers_stop.set()
            bar.close()
            _stop_workers(procs, list(conns))
    return TeacherSummary(name, done + added, added, games, terminations, time.monotonic() - started,
                          stopped=added < need)


def _read_teacher_state(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            return int(json.load(f)["positions"])
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"teacher resume state {path} cannot be read ({exc}); remove it to count "
                           f"the teacher positions in the store instead") from None


def _committed(path: str, positions: int, writer: Any) -> float:
    """Record the teacher positions committed so far; returns the time, the start of the next commit interval."""
    atomic_write_text(path, json.dumps({"positions": positions - writer.buffered_positions}) + "\n")
    return time.monotonic()


def labelling_cost(
    teacher: Sequence[str] | None = None,
    settings: Sequence[tuple[int, int]] = ((4, 1), (6, 1), (6, 4), (8, 1), (8, 4), (8, 8)),
    *,
    seconds: float = 10.0,
    temperature: float = DEFAULT_TEMPERATURE,
    seed: int = 0,
) -> list[dict[str, float]]:
    """Milliseconds a position costs one teacher process at each (depth, multipv), measured in play.

    Each setting plays and labels games as :func:`bootstrap_teacher` does (one
    thread, everything included) for about ``seconds``; this machine's figures
    for choosing ``depth`` and ``multipv``.
    """
    never = threading.Event()
    engine = _Teacher(list(teacher) if teacher else default_teacher())
    rows = []
    try:
        for depth, multipv in settings:
            engine.check_multipv(multipv)
            game_settings = _GameSettings(depth, multipv, float(temperature), DEFAULT_RANDOM_MOVE_SHARE,
                                          DEFAULT_OPENING_PLIES, DEFAULT_MAX_PLIES, None)
            rng = np.random.default_rng([seed, depth, multipv])
            positions = 0
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                game = _play_game(engine, game_settings, rng, None, never)
                assert game is not None
                positions += len(game.records)
            elapsed = time.perf_counter() - start
            rows.append({"depth": depth, "multipv": multipv, "positions": positions,
                         "ms_per_position": 1e3 * elapsed / positions})
    finally:
        engine.close()
    return rows


def _check_teacher_args(**kw: Any) -> None:
    for name in ("positions", "workers", "depth", "multipv", "max_plies", "hash_mb",
                 "positions_per_chunk"):
        if int(kw[name]) < 1:
            raise ValueError(f"{name} must be at least 1, got {kw[name]}")
    if not kw["temperature"] > 0:
        raise ValueError(f"temperature must be > 0 centipawns, got {kw['temperature']}")
    if not 0.0 <= kw["random_move_share"] <= 1.0:
        raise ValueError(f"random_move_share must be in [0, 1], got {kw['random_move_share']}")
    if kw["opening_plies"] < 0:
        raise ValueError(f"opening_plies must be >= 0, got {kw['opening_plies']}")
    if kw["syzygy"] and not all(os.path.isdir(p) for p in kw["syzygy"].split(os.pathsep)):
        raise ValueError(f"syzygy path {kw['syzygy']!r} is not a directory (or ':'-separated list of them)")


#: A worker that died of one of these was asked to stop, not failed: a signal to the whole
#: process group (`timeout`, systemd, Ctrl-C) can reach a worker while it is still starting,
#: before it ignores the signal and leaves stopping to the parent.
_STOP_EXIT_CODES = (-signal.SIGTERM, -signal.SIGINT)


def _receive_game(conn: Connection, proc: Any, command: list[str],
                  stop: threading.Event) -> tuple[dict, np.ndarray] | None:
    """A worker's next game; None when the worker ended because the labelling is stopping:
    ``stop`` is set, or a stop signal reached the worker while it was still starting."""
    try:
        header = json.loads(conn.recv_bytes())
        if "error" in header:
            raise TeacherError(header["error"])
        data = conn.recv_bytes()
    except EOFError:
        proc.join(timeout=5)
        if stop.is_set() or proc.exitcode in _STOP_EXIT_CODES:
            return None
        raise TeacherError(f"a teacher worker for {shlex.join(command)} exited unexpectedly "
                           f"(exit code {proc.exitcode})") from None
    records = np.frombuffer(data, dtype=RECORD_DTYPE)
    if len(records) != header["positions"]:
        raise TeacherError(f"a teacher worker for {shlex.join(command)} sent a damaged game")
    return header, records


def _stop_workers(procs: list[Any], conns: list[Connection]) -> None:
    """Workers stop at their next position (``stop`` is set) or at their next send (closed pipe);
    one that does not within a few seconds is terminated."""
    for conn in conns:
        conn.close()
    deadline = time.monotonic() + 10.0
    for proc in procs:
        proc.join(timeout=max(0.1, deadline - time.monotonic()))
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)


# --------------------------------------------------------------------------------------------
# PGN


class _QuietBuilder(chess.pgn.GameBuilder):
    """Collects parse errors in ``game.errors`` without python-chess's traceback per error."""

    def handle_error(self, error: Exception) -> None:
        self.game.errors.append(error)


_RESULTS = {"1-0": True, "0-1": False, "1/2-1/2": None}


class _PgnReader:
    """A PGN file (plain, .gz or .bz2) read as text, with the compressed bytes read so far."""

    def __init__(self, path: str) -> None:
        self.raw = open(path, "rb")
        if path.endswith(".gz"):
            stream: Any = gzip.GzipFile(fileobj=self.raw)
        elif path.endswith(".bz2"):
            stream = bz2.BZ2File(self.raw)
        else:
            stream = self.raw
        self.text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace")

    def position(self) -> int:
        return self.raw.tell()

    def close(self) -> None:
        self.text.close()
        self.raw.close()


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class _Skip(Exception):
    """A game that is not imported: ``reason`` is the summary's key, the message the log line's detail."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def _pgn_records(game: chess.pgn.Game, input_format: int) -> np.ndarray:
    """The records of one game; raises :class:`_Skip` for a game that cannot be imported."""
    if game.errors:
        raise _Skip("parse error", str(game.errors[0]))
    headers = game.headers
    result = headers.get("Result", "*")
    if result not in _RESULTS:
        raise _Skip("no result", repr(result))
    try:
        standard = headers.variant() is chess.Board and not headers.is_chess960() and not headers.is_wild()
    except ValueError:
        standard = False
    if not standard:
        raise _Skip("variant", repr(headers.get("Variant")))
    start = game.board()
    if start.chess960:
        raise _Skip("variant", "Chess960 castling rights in the FEN")
    moves = [m.uci() for m in game.mainline_moves()]
    if not moves:
        raise _Skip("no moves")
    try:
        board = Board(start.fen(en_passant="fen") if "FEN" in headers else None)
    except ValueError as exc:
        raise _Skip("FEN refused", str(exc)) from None
    winner = _RESULTS[result]
    n = len(moves)
    records = np.zeros(n, dtype=RECORD_DTYPE)
    turn = start.turn
    for i, move in enumerate(moves):
        q, d = _wdl_of_result(winner, turn)
        value = Eval(q, d, n - i)
        try:
            records[i] = make_record(board, {move: 1.0}, result_q=q, result_d=d, plies_left=n - i,
                                     played=move, root=value, best=move, best_eval=value,
                                     played_eval=Eval(q, d, n - i - 1), nodes=0, input_format=input_format)
        except ValueError as exc:  # a move or a rule-50 count the engine's board refuses
            raise _Skip("position refused", str(exc)) from None
        board.push_uci(move)
        turn = not turn
    return records


def bootstrap_pgn(
    run_dir: str | os.PathLike,
    files: Sequence[str | os.PathLike],
    *,
    positions_per_chunk: int = DEFAULT_POSITIONS_PER_CHUNK,
    progress: bool = True,
    input_format: int | None = None,
) -> PgnSummary:
    """Import the games of PGN ``files`` (plain, .gz, .bz2) into the run's store (see the module docstring),
    in ``input_format`` (default: the run's network's, :func:`run_input_format`).

    Files are recognised by content (sha256): a file imported completely before
    is skipped, one imported in part continues after its last imported game.
    """
    if positions_per_chunk < 1:
        raise ValueError(f"positions_per_chunk must be at least 1, got {positions_per_chunk}")
    paths = [os.fspath(f) for f in files]
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"PGN file {path} does not exist")
    started = time.monotonic()
    state_path = bootstrap_state_path(run_dir, PGN_SOURCE)
    skipped: dict[str, int] = {}
    games = positions = already_done = 0
    input_format = run_input_format(run_dir) if input_format is None else input_format
    with run_lock(run_dir, PGN_SOURCE):
        store = _open_store(run_dir, input_format)
        state = _load_pgn_state(state_path, _source_positions(store, PGN_SOURCE))
        # Commits are ours (no auto-commit, no commit on exit): each is bracketed by resume states.
        writer = store.writer(generation=0, source=PGN_SOURCE, positions_per_chunk=sys.maxsize)
        buffered = 0

        def commit() -> None:
            nonlocal state, buffered
            after = dict(state, store_positions=state["store_positions"] + buffered)
            _write_pgn_state(state_path, dict(state, pending=after))
            writer.commit()
            state, buffered = after, 0
            _write_pgn_state(state_path, state)

        bar = _progress_bar(sum(os.path.getsize(p) for p in paths), 0, "pgn", progress, unit="B")
        try:
            for path in paths:
                size = os.path.getsize(path)
                entry = state["files"].setdefault(
                    _file_sha256(path), {"name": os.path.basename(path), "games": 0, "complete": False})
                if entry["complete"]:
                    already_done += 1
                    bar.update(size)
                    continue
                base = bar.n
                reader = _PgnReader(path)
                try:
                    for _ in range(entry["games"]):
                        chess.pgn.skip_game(reader.text)
                    while (game := chess.pgn.read_game(reader.text, Visitor=_QuietBuilder)) is not None:
                        try:
                            records = _pgn_records(game, input_format)
                        except _Skip as skip:
                            skipped[skip.reason] = skipped.get(skip.reason, 0) + 1
                            _logger.warning("%s: game %d skipped: %s", path, entry["games"] + 1, skip)
                        else:
                            writer.add_game(records)
                            buffered += len(records)
                            games += 1
                            positions += len(records)
                        entry["games"] += 1
                        if buffered >= positions_per_chunk:
                            commit()
                        bar.update(base + reader.position() - bar.n)
                        rate = positions / max(bar.format_dict["elapsed"], 1e-3)
                        bar.set_postfix_str(f"{games} games, {positions} positions, {rate:.0f} pos/s",
                                            refresh=False)
                finally:
                    reader.close()
                entry["complete"] = True
                bar.update(base + size - bar.n)
            if buffered:
                commit()
            else:
                _write_pgn_state(state_path, state)
        finally:
            bar.close()
    return PgnSummary(len(paths), already_done, games, positions, skipped, time.monotonic() - started)


def _load_pgn_state(path: str, store_positions: int) -> dict:
    """The resume state; a commit marked pending counts as done when the store holds its positions."""
    if not os.path.exists(path):
        return {"version": _PGN_STATE_VERSION, "store_positions": store_positions, "files": {}}
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        if state.get("version") != _PGN_STATE_VERSION:
            raise ValueError(f"version {state.get('version')!r}, expected {_PGN_STATE_VERSION}")
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"PGN resume state {path} cannot be read ({exc}); "
                           f"remove it to import every file again") from None
    pending = state.pop("pending", None)
    if pending is not None and store_positions >= pending["store_positions"]:
        state = pending
    state["store_positions"] = store_positions
    return state


def _write_pgn_state(path: str, state: dict) -> None:
    atomic_write_text(path, json.dumps(state, indent=1, sort_keys=True) + "\n")
