"""A driver for the real ``cyzero`` UCI process over pipes, shared by the ``test_uci*`` modules.

This module holds no tests.  :class:`UciEngine` starts ``python -m uci``
(``sys.executable``, the repository as working directory), writes command
lines to its stdin and reads its stdout on a thread, with the time each line
arrived.  Every stdout line is checked as it arrives: it must start with a
known UCI token (``id``, ``option``, ``uciok``, ``readyok``, ``info``,
``bestmove``), and every ``info`` line other than ``info string`` must be
integers only, with ``pv`` last (:func:`parse_info`).  :meth:`UciEngine.close`
fails the test if any line broke those rules.

``CYZERO_UCI_COMMAND`` (a shell-style command line) runs another command
instead, e.g. an installed ``cyzero``.
"""

from __future__ import annotations

import os
import queue
import random
import shlex
import subprocess
import sys
import threading
import time
from typing import Optional

import chess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KNOWN_TOKENS = ("id", "option", "uciok", "readyok", "info", "bestmove")
INFO_INT_FIELDS = ("depth", "seldepth", "multipv", "nodes", "nps", "time", "hashfull", "tbhits",
                   "currmovenumber", "cpuload")
# Generous bounds for "at once": the suite must pass on a loaded 2-core CI machine.
# The real latencies are measured by `cyzero bench uci`, not asserted here.
PROMPT_S = 3.0


def engine_command() -> list[str]:
    override = os.environ.get("CYZERO_UCI_COMMAND")
    if override:
        return shlex.split(override)
    return [sys.executable, "-m", "uci"]


class ProtocolError(AssertionError):
    pass


def parse_info(line: str) -> dict:
    """Parse a non-``string`` info line strictly; ProtocolError if it is not what clients expect.

    Returns {"depth": int, ..., "score": ("cp"|"mate", int), "wdl": (w, d, l), "pv": [moves]}.
    """
    words = line.split()
    if words[0] != "info":
        raise ProtocolError(f"not an info line: {line!r}")
    out: dict = {}
    i = 1
    while i < len(words):
        key = words[i]
        if key == "string":
            raise ProtocolError(f"info string must come first: {line!r}")
        if key == "pv":
            out["pv"] = words[i + 1:]
            if not out["pv"]:
                raise ProtocolError(f"empty pv: {line!r}")
            break
        if key in INFO_INT_FIELDS:
            try:
                out[key] = int(words[i + 1])
            except (IndexError, ValueError):
                raise ProtocolError(f"info {key} needs an integer: {line!r}") from None
            i += 2
        elif key == "score":
            kind = words[i + 1] if i + 1 < len(words) else ""
            if kind not in ("cp", "mate"):
                raise ProtocolError(f"score must be cp or mate: {line!r}")
            try:
                out["score"] = (kind, int(words[i + 2]))
            except (IndexError, ValueError):
                raise ProtocolError(f"score needs an integer: {line!r}") from None
            i += 3
            if i < len(words) and words[i] in ("lowerbound", "upperbound"):
                i += 1
        elif key == "wdl":
            try:
                out["wdl"] = tuple(int(w) for w in words[i + 1:i + 4])
            except ValueError:
                raise ProtocolError(f"wdl needs three integers: {line!r}") from None
            if len(out["wdl"]) != 3 or sum(out["wdl"]) != 1000 or min(out["wdl"]) < 0:
                raise ProtocolError(f"wdl must be three permille values summing to 1000: {line!r}")
            i += 4
        else:
            raise ProtocolError(f"unknown info field {key!r}: {line!r}")
    if out.get("depth") == 0 and set(out) == {"depth", "score"} and out["score"][1] == 0:
        return out  # a root without a legal move: "info depth 0 score mate 0" (or "score cp 0")
    for key in ("depth", "seldepth", "nodes", "nps", "time"):
        if key not in out:
            raise ProtocolError(f"info without {key}: {line!r}")
    if out["depth"] < 1 or out["seldepth"] < 1:
        raise ProtocolError(f"depth and seldepth must be >= 1: {line!r}")
    if min(out["nodes"], out["nps"], out["time"]) < 0:
        raise ProtocolError(f"negative count: {line!r}")
    if "pv" in out and ("score" not in out or "multipv" not in out):
        raise ProtocolError(f"a pv line needs score and multipv: {line!r}")
    return out


def check_line(line: str) -> Optional[str]:
    """None if ``line`` is a valid engine-to-GUI line, else what is wrong with it."""
    words = line.split()
    if not words or words[0] not in KNOWN_TOKENS:
        return f"not a UCI line: {line!r}"
    if line != line.strip() or "\r" in line:
        return f"stray whitespace: {line!r}"
    if words[0] == "info" and (len(words) < 2 or words[1] != "string"):
        try:
            parse_info(line)
        except ProtocolError as exc:
            return str(exc)
    if words[0] == "bestmove":
        if len(words) not in (2, 4) or (len(words) == 4 and words[2] != "ponder"):
            return f"malformed bestmove: {line!r}"
    return None


class UciEngine:
    """The cyzero process on pipes; ``lines`` is every stdout line as (monotonic time, text)."""

    def __init__(self, options: Optional[dict] = None, ready: bool = True, cwd: str = REPO,
                 env: Optional[dict] = None, command: Optional[list[str]] = None) -> None:
        self.started = time.monotonic()
        full_env = dict(os.environ)
        full_env.pop("CUDA_VISIBLE_DEVICES", None)
        full_env.update(env or {})
        self.proc = subprocess.Popen(command or engine_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=cwd, env=full_env, bufsize=0)
        self.lines: list[tuple[float, str]] = []
        self.bad: list[str] = []
        self.stderr: list[str] = []
        self._queue: "queue.Queue[Optional[tuple[float, str]]]" = queue.Queue()
        self._write_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._err_reader.start()
        self.eof = False
        self.options: list[str] = []
        if ready:
            self.send("uci")
            self.options = [line for line in self.until("uciok", timeout=30) if line.startswith("option ")]
            for name, value in {"Backend": "cpu", **(options or {})}.items():
                self.setoption(name, value)
            self.isready(timeout=60)

    # -- pipes -----------------------------------------------------------------

    def _read_stdout(self) -> None:
        stream = self.proc.stdout
        for raw in iter(stream.readline, b""):
            now = time.monotonic()
            text = raw.decode("utf-8", errors="replace").rstrip("\n")
            self.lines.append((now, text))
            problem = check_line(text)
            if problem:
                self.bad.append(problem)
            self._queue.put((now, text))
        self._queue.put(None)

    def _read_stderr(self) -> None:
        for raw in iter(self.proc.stderr.readline, b""):
            self.stderr.append(raw.decode("utf-8", errors="replace").rstrip("\n"))

    def send(self, line: str) -> float:
        """Write one line (a newline is added); returns the time it was written."""
        return self.send_bytes(line.encode("utf-8") + b"\n")

    def send_bytes(self, data: bytes) -> float:
        with self._write_lock:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
            return time.monotonic()

    def setoption(self, name: str, value=None) -> None:
        if value is None:
            self.send(f"setoption name {name}")
        else:
            if isinstance(value, bool):
                value = "true" if value else "false"
            self.send(f"setoption name {name} value {value}")

    # -- reading ---------------------------------------------------------------

    def next_line(self, timeout: float) -> tuple[float, str]:
        """The next stdout line (time, text); AssertionError on timeout or end of output."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output from the engine within {timeout} s; last lines: "
                                 f"{[text for _, text in self.lines[-5:]]}; stderr: {self.stderr[-5:]}") from None
        if item is None:
            self.eof = True
            self._queue.put(None)
            raise AssertionError(f"the engine's output ended (exit code {self.proc.poll()}); "
                                 f"stderr: {self.stderr[-10:]}")
        return item

    def until(self, match, timeout: float = 30.0, timed: bool = False):
        """Lines up to and including the first one matching ``match`` (a prefix or a predicate).

        With ``timed``, (time, line) pairs.
        """
        test = match if callable(match) else (lambda text: text == match or text.startswith(match + " "))
        got = []
        deadline = time.monotonic() + timeout
        while True:
            when, text = self.next_line(max(0.0, deadline - time.monotonic()))
            got.append((when, text) if timed else text)
            if test(text):
                return got

    def pending(self, wait: float = 0.0) -> list[str]:
        """Lines that arrived (waiting ``wait`` seconds first) and were not read yet."""
        if wait:
            time.sleep(wait)
        got = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return got
            if item is None:
                self._queue.put(None)
                return got
            got.append(item[1])

    def isready(self, timeout: float = 30.0) -> list[str]:
        """Send ``isready``; the lines before ``readyok``."""
        self.send("isready")
        return self.until("readyok", timeout)[:-1]

    def sync(self, timeout: float = 30.0) -> list[str]:
        """Wait until every line sent so far has been handled; the lines that came meanwhile.

        Unlike :meth:`isready`, this cannot be fooled by an older ``readyok`` still unread:
        it waits for the error line about a unique unknown command, then for a fresh readyok.
        """
        self._syncs = getattr(self, "_syncs", 0) + 1
        marker = f"cyzero-test-sync-{self._syncs}-{id(self)}"
        self.send(marker)
        got = self.until(lambda text: text.startswith("info string error") and marker in text, timeout)
        return got[:-1] + self.isready(timeout)

    def remarks(self, timeout: float = 30.0) -> list[str]:
        """The info strings the engine held since its last search (a network loaded or switched, a
        file refused): it says them as a search's output begins (uci.session.Floor), so a one-node
        search from the start position reads them."""
        self.send("position startpos")
        lines, _ = self.go("nodes 1", timeout)
        return info_strings(lines[:next((i for i, text in enumerate(lines) if text.startswith("info depth")),
                                        len(lines))])

    def go(self, args: str = "nodes 20", timeout: float = 30.0) -> tuple[list[str], str]:
        """Send ``go args``, wait for ``bestmove``: (lines before it, the bestmove line)."""
        self.send(f"go {args}".strip())
        lines = self.until("bestmove", timeout)
        return lines[:-1], lines[-1]

    def bestmove(self, board: chess.Board, args: str = "nodes 20", timeout: float = 30.0) -> chess.Move:
        """``go`` on the board's position (sent as a move list); checks the move is legal there."""
        self.position(board)
        _, best = self.go(args, timeout)
        return legal_bestmove(board, best)

    def position(self, board: chess.Board) -> None:
        self.send(position_command(board))

    # -- the end ---------------------------------------------------------------

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def close(self, check: bool = True) -> None:
        """``quit`` (kill if it does not end), then fail on any malformed stdout line."""
        if self.proc.poll() is None:
            try:
                self.send("quit")
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                if check:
                    raise AssertionError("the engine did not end within 10 s of quit")
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        self._reader.join(5)
        self._err_reader.join(5)
        if check:
            self.check_protocol()

    def check_protocol(self) -> None:
        assert not self.bad, f"malformed stdout lines: {self.bad[:10]}"
        tracebacks = [line for line in self.stderr if "Traceback" in line]
        assert not tracebacks, "the engine wrote a traceback on stderr:\n" + "\n".join(self.stderr[-30:])

    def __enter__(self) -> "UciEngine":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(check=exc_type is None)


# --------------------------------------------------------------------------- helpers


def position_command(board: chess.Board) -> str:
    """``position startpos|fen ... moves ...`` for a python-chess board and its move stack."""
    root = board.root()
    moves = " ".join(uci_moves(board))
    if root.fen() == chess.STARTING_FEN and not board.chess960:
        head = "position startpos"
    else:
        head = f"position fen {root.fen()}"
    return f"{head} moves {moves}" if moves else head


def uci_moves(board: chess.Board) -> list[str]:
    """The board's move stack in UCI notation (king-takes-rook castling on a Chess960 board)."""
    replay = board.root()
    out = []
    for move in board.move_stack:
        out.append(replay.uci(move, chess960=board.chess960))
        replay.push(move)
    return out


def legal_bestmove(board: chess.Board, line: str) -> chess.Move:
    """The move of a ``bestmove`` line; AssertionError unless it is legal on ``board``."""
    words = line.split()
    assert words[0] == "bestmove" and len(words) >= 2, line
    assert words[1] != "(none)", f"bestmove (none) in a live position {board.fen()}"
    try:
        move = board.parse_uci(words[1])
    except ValueError:
        raise AssertionError(f"illegal bestmove {words[1]} in {board.fen()} (chess960={board.chess960})") from None
    if len(words) == 4:
        after = board.copy(stack=False)
        after.push(move)
        try:
            after.parse_uci(words[3])
        except ValueError:
            raise AssertionError(f"illegal ponder move in {line!r} from {board.fen()}") from None
    return move


def check_pv(board: chess.Board, pv: list[str]) -> None:
    """The PV is legal from ``board`` and ends at the first game-ending position."""
    replay = board.copy()
    for i, text in enumerate(pv):
        assert not replay.is_game_over(), f"pv {pv} goes on after the game ended at move {i}"
        try:
            move = replay.parse_uci(text)
        except ValueError:
            raise AssertionError(f"pv {pv}: {text} is illegal in {replay.fen()}") from None
        replay.push(move)


def infos(lines: list[str]) -> list[dict]:
    """The parsed search info lines (not ``info string``) among ``lines``."""
    return [parse_info(line) for line in lines if line.startswith("info ") and not line.startswith("info string")]


def info_strings(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("info string")]


def long_game(plies: int, seed: int = 0) -> chess.Board:
    """A legal game of ``plies`` half-moves from the start that never ends by the rules.

    Random non-capturing piece moves, with a pawn move now and then to keep the
    fifty-move count low; no move may checkmate, stalemate, repeat a position
    (so no threefold) or leave insufficient material.
    """
    rng = random.Random(seed)
    board = chess.Board()
    seen: dict = {}
    while len(board.move_stack) < plies:
        moves = list(board.legal_moves)
        rng.shuffle(moves)
        want_pawn = board.halfmove_clock >= 60

        def rank(m: chess.Move) -> tuple:
            pawn = board.piece_type_at(m.from_square) == chess.PAWN
            capture = board.is_capture(m)
            return (capture, pawn != want_pawn)

        moves.sort(key=rank)
        for move in moves:
            board.push(move)
            key = board._transposition_key()
            ok = (not board.is_game_over(claim_draw=True) and seen.get(key, 0) == 0
                  and board.halfmove_clock < 90)
            if ok:
                seen[key] = 1
                break
            board.pop()
        else:
            raise RuntimeError("long_game: stuck")
    return board


def random_game(rng: random.Random, plies: int, board: Optional[chess.Board] = None) -> chess.Board:
    """Random legal moves from ``board`` (default the start) for at most ``plies`` plies, never ending the game."""
    board = board.copy() if board is not None else chess.Board()
    for _ in range(plies):
        moves = list(board.legal_moves)
        rng.shuffle(moves)
        for move in moves:
            board.push(move)
            if not board.is_game_over(claim_draw=True):
                break
            board.pop()
        else:
            break
    return board


class SessionOutput:
    """An in-process ``uci.session.Session``'s output lines, with a way to wait for its next
    bestmove (written on the search thread)."""

    def __init__(self, timeout: float = 60.0) -> None:
        self.lines: list[str] = []
        self.timeout = timeout
        self._bestmove = threading.Event()

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if line.startswith("bestmove"):
            self._bestmove.set()

    def wait_bestmove(self) -> None:
        assert self._bestmove.wait(self.timeout), f"no bestmove; output: {self.lines}"
        self._bestmove.clear()
