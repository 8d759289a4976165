"""The UCI session: one state machine between the GUI's lines and the search.

The reader (``run``) owns stdin and handles every command at once; ``go``
starts the search on its own thread, whose info and best move come back
through callbacks to the single :class:`Writer` that owns stdout. Any bad
input gets one ``info string error: ...`` line and changes nothing else.
What the engine says unasked (a network loaded, switched to or refused in the
background, a book opened) waits for the next answer it may give (:class:`Floor`).
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Callable, Optional, TextIO

from engine import __version__
from engine.board import Board
from engine.limits import GoParams
from engine.params import SearchParams
from engine.search import Searcher
from engine.search_report import Info, SearchResult
from uci.options import Options
from uci.protocol import (format_go, format_info, format_result, go_to_search, parse_position, parse_setoption,
                          read_go)

AUTHOR = "the cyzero developers"

# Options that change how the network is built: a change that matters starts a reload at once
# (engine.network_manager.NetworkManager.reconfigure), which isready waits for.
_NETWORK_OPTIONS = {"weightsfile", "backend", "gpu", "threads", "minibatchsize", "valuehead", "policyhead"}
# The heads a multihead network plays unless ValueHead / PolicyHead say otherwise (lc0's defaults).
_DEFAULT_HEADS = {"value_head": "winner", "policy_head": "vanilla"}
# How long quit waits for a stopped search's bestmove (it comes at once; this only bounds a hang).
_QUIT_WAIT_S = 5.0
# Lines held between commands (the newest): an engine left idle for hours beside a trainer that
# publishes, or a broken publisher, would otherwise open its next answer with all of them.
_HELD_LINES = 50


class Writer:
    """The one owner of stdout: whole lines, flushed, from any thread."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self.closed = False

    def __call__(self, line: str) -> None:
        with self._lock:
            if self.closed:
                return
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (BrokenPipeError, OSError, ValueError):
                self.closed = True  # the GUI went away; the reader will see end of input


class Floor:
    """When the engine may speak unasked: only inside a search's output, up to its bestmove. A line
    said at any other time (a network loaded at ``isready``, a reload that finished or failed after
    a ``setoption``, a watcher's news) is held, and the held lines open the next search's output, in
    order: a client reads a line between commands, or before ``readyok``, as part of the answer to
    its command (python-chess: "Unexpected engine output").
    """

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write
        self._lock = threading.Lock()   # a line said as an answer ends is held, never written after it
        self._answers: set[object] = set()   # each search's (a ponder's and the next may overlap)
        self._held: collections.deque[str] = collections.deque(maxlen=_HELD_LINES)
        self._dropped = 0

    def say(self, line: str) -> None:
        with self._lock:
            if self._answers:
                self._write(line)
                return
            if len(self._held) == self._held.maxlen:
                self._dropped += 1
            self._held.append(line)

    def open(self) -> object:
        """An answer begins with the held lines; returns its token for :meth:`close`."""
        token = object()
        with self._lock:
            if self._dropped:
                self._write(f"info string {self._dropped} older lines said between commands were dropped")
            for line in self._held:
                self._write(line)
            self._held.clear()
            self._dropped = 0
            self._answers.add(token)
        return token

    def close(self, token: object, *last: str) -> None:
        """The answer ends with ``last`` (its bestmove, readyok); said later is held. Idempotent."""
        with self._lock:
            for line in last:
                self._write(line)
            self._answers.discard(token)


class Session:
    """Handles UCI commands; ``handle(line)`` returns False once the engine should exit."""

    def __init__(self, write: Callable[[str], None], network_manager_factory=None) -> None:
        self.write = write
        self.floor = Floor(write)
        self.options = Options()
        self._manager_factory = network_manager_factory or _default_manager
        self.manager = None
        self._manager_lock = threading.Lock()
        self.board = Board()
        self._base_fen: Optional[str] = None
        self._moves: list[str] = []
        self._position_error: Optional[str] = None   # why the last position command was rejected
        self.searcher = Searcher(self._network)
        self.searcher.log = self.remark
        self._dirty_options: set[str] = set()
        self._book = None
        self._tablebases = None
        self._reported = threading.Event()   # the last search's bestmove is written
        self._reported.set()
        self._apply_options(set(o.name.lower() for o in self.options))

    # -- output ----------------------------------------------------------------

    def info_string(self, text: str) -> None:
        """Said now: the answer to the command being handled."""
        for line in str(text).splitlines() or [""]:
            self.write(f"info string {line}")

    def remark(self, text: str) -> None:
        """Said when the engine may speak (:class:`Floor`): from the search, the network manager, or
        a command that has no answer of its own (setoption)."""
        for line in str(text).splitlines() or [""]:
            self.floor.say(f"info string {line}")

    def error(self, text: str) -> None:
        self.info_string(f"error: {text}")

    # -- dispatch --------------------------------------------------------------

    def handle(self, line: str) -> bool:
        received = time.monotonic()
        words = line.split()
        if not words:
            return True
        command, args = words[0].lower(), words[1:]
        try:
            if command == "quit":
                self.quit()
                return False
            handler = getattr(self, f"cmd_{command}", None)
            if handler is None:
                self.error(f"unknown command {words[0]!r}")
            elif command == "go":
                handler(args, received)
            elif command == "setoption":
                handler(line.split(None, 1)[1] if len(words) > 1 else "")
            else:
                handler(args)
        except ValueError as exc:
            self.error(str(exc))
        except Exception as exc:  # never die on input: report and keep answering
            self.error(f"internal error handling {words[0]!r}: {type(exc).__name__}: {exc}")
        return True

    # -- commands --------------------------------------------------------------

    def cmd_uci(self, args: list[str]) -> None:
        self.write(f"id name cyzero {__version__}")
        self.write(f"id author {AUTHOR}")
        for opt in self.options:
            self.write(opt.declaration())
        self.write("uciok")

    def cmd_isready(self, args: list[str]) -> None:
        """``readyok``, and nothing else unless the load failed: what loading the network says waits
        for the next search's output (python-chess's ping reads any other line as unexpected)."""
        if not self.searcher.searching:
            from engine.weights import NoNetworkError

            try:
                self._apply_pending_options()
                self._network()          # load now, so the first go does not pay for it
                self.manager.wait_reloaded()   # and a reload for new options: the next go searches at once
                self.searcher.network_unavailable(None)
                self._swap_network_if_ready()
            except NoNetworkError as exc:   # said again on every go, which answers bestmove 0000
                self.searcher.network_unavailable(str(exc))
                self.error(f"no network loaded: {exc}")
            except ValueError as exc:    # e.g. a TrainerEndpoint that cannot be used: say so, stay ready
                self.error(str(exc))
            except Exception as exc:
                self.searcher.network_unavailable(f"{type(exc).__name__}: {exc}")
                self.error(f"cannot load the network: {type(exc).__name__}: {exc}")
        self.write("readyok")            # always: a GUI waits for it

    def cmd_debug(self, args: list[str]) -> None:
        """``debug on|off``: diagnostics as ``info string`` (why a search ended early, where a short
        search's time went)."""
        word = args[0].lower() if args else ""
        if word not in ("on", "off"):
            raise ValueError(f"debug takes on or off, not {' '.join(args)!r}")
        self.searcher.verbose = word == "on"

    def cmd_register(self, args: list[str]) -> None:
        pass

    def cmd_ucinewgame(self, args: list[str]) -> None:
        self._stop_search()
        self.searcher.new_game()
        self.board = Board(chess960=self.options["UCI_Chess960"])
        self._base_fen, self._moves = None, []
        self._position_error = None

    def cmd_setoption(self, text: str) -> None:
        name, value = parse_setoption(text)
        opt = self.options.set(name, value)
        key = opt.name.lower()
        if key in _NETWORK_OPTIONS:
            self._reconfigure_network()   # even during a search: the network in use plays on
        self._dirty_options.add(key)
        if not self.searcher.searching:
            self._apply_pending_options()

    def cmd_position(self, args: list[str]) -> None:
        """A position the GUI means, or none: a rejected command (a broken FEN, an illegal move)
        leaves no position to search, and every go answers ``bestmove 0000`` until a valid one
        arrives, never a move of another position (the previous one, or the one before an
        illegal move, where the other side may be to move)."""
        try:
            self._set_position(args)
        except ValueError as exc:
            self._position_error = str(exc)
            raise ValueError(f"{exc}; no position is set until a valid position command "
                             "(go answers bestmove 0000)") from None
        self._position_error = None

    def _set_position(self, args: list[str]) -> None:
        fen, moves = parse_position(args)
        chess960 = self.options["UCI_Chess960"]
        if fen == self._base_fen and moves[:len(self._moves)] == self._moves \
                and self.board.chess960 == chess960:
            board = self.board.copy()       # the usual case: the game went on by a move or two
            new_moves = moves[len(self._moves):]
            first_ply = len(self._moves)
        else:
            board = self._new_board(fen, chess960)
            new_moves = moves
            first_ply = 0
        for ply, move in enumerate(new_moves, start=first_ply + 1):
            try:
                board.push_uci(move)
            except ValueError:
                raise ValueError(f"illegal move {move!r} at ply {ply} in position command") from None
        self.board = board
        self._base_fen, self._moves = fen, list(moves)

    @staticmethod
    def _new_board(fen: Optional[str], chess960: bool) -> Board:
        if fen is None:
            return Board(chess960=chess960)
        try:
            return Board(fen, chess960=chess960)
        except ValueError as exc:
            if not chess960:
                try:  # a Chess960 FEN sent without UCI_Chess960: read it as Chess960
                    return Board(fen, chess960=True)
                except ValueError:
                    pass
            raise ValueError(f"bad FEN in position command: {exc}") from None

    def cmd_go(self, args: list[str], received: float) -> None:
        answer = self.floor.open()     # the held lines lead this go's output
        try:
            self._go(args, received, answer)
        except BaseException:
            self.floor.close(answer)   # no search runs: nothing else ends this answer
            raise

    def _go(self, args: list[str], received: float, answer: object) -> None:
        go, problems = read_go(args)
        if problems:   # said, then searched without them: every go gets its bestmove
            go = go_to_search(go)
            for text in problems[:-1]:
                self.error(f"{text} (ignored)")
            self.error(f"{problems[-1]} (ignored); searching {format_go(go)!r}")
        go = go.with_node_cap(self.options["NodesPerMove"])
        if self.searcher.searching:
            self.searcher.stop()    # its bestmove now; its thread ends in the background
        if self._position_error is not None:
            self.error(f"no position to search: the last position command was rejected "
                       f"({self._position_error})")
            self.floor.close(answer, "bestmove 0000")
            return
        self._apply_pending_options()
        self._swap_network_if_ready()
        board = self.board.copy()
        if not go.infinite and not go.ponder and self._play_book_move(board, answer):
            return
        self._restrict_to_tablebase(board, go)
        show_wdl = self.options["UCI_ShowWDL"]

        def on_info(info: Info) -> None:
            for text in format_info(info, show_wdl):
                self.write(text)

        reported = self._reported = threading.Event()   # this go's own: an older search cannot set it

        def on_best(result: SearchResult) -> None:
            try:
                self.floor.close(answer, *format_result(result, checkmated=board.is_checkmate()))
            finally:
                reported.set()

        try:
            self.searcher.start(board, go, on_info, on_best, start_time=received)
        except BaseException:
            reported.set()     # no search runs: quit has nothing to wait for
            raise

    def cmd_stop(self, args: list[str]) -> None:
        if self.searcher.searching:
            self.searcher.stop()

    def cmd_ponderhit(self, args: list[str]) -> None:
        self.searcher.ponderhit()

    def cmd_d(self, args: list[str]) -> None:
        """Not UCI: show the current position (as Stockfish's ``d`` does)."""
        self.info_string(f"fen {self.board.fen()}")

    def quit(self) -> None:
        """``quit``: a search in progress still answers its bestmove at once, then all closes.

        A GUI that sends ``quit`` during a search may still be waiting for that bestmove.
        """
        if self.searcher.searching:
            self.searcher.stop()
        self._reported.wait(_QUIT_WAIT_S)
        self.close()

    def end_of_input(self) -> None:
        """End of input: a search with a bound of its own (nodes, depth, movetime, a clock) runs to
        it and answers, as ``printf 'position startpos\\ngo nodes 800\\n' | cyzero`` expects;
        ``go infinite`` and ``go ponder`` (and a go with no bound) stop at once, as at ``quit``."""
        if self.searcher.searching and self.searcher.bounded:
            self._reported.wait()
        self.quit()

    # -- helpers ---------------------------------------------------------------

    def close(self) -> None:
        self.searcher.abort()
        self.searcher.wait(2.0)   # let a batch in flight finish before anything is torn down
        if self.manager is not None:
            self.manager.close()
        for resource in (self._book, self._tablebases):
            if resource is not None:
                resource.close()

    def _stop_search(self) -> None:
        if self.searcher.searching:
            self.searcher.stop()
        self.searcher.wait()

    def _network(self):
        """The current network, loaded on first use (called on isready or the search thread).

        Raises engine.weights.NoNetworkError (its message: why) when there is none.
        A new manager (after a network option changed) keeps the previous manager's network
        when its WeightsFile cannot be loaded, and says so once.
        """
        with self._manager_lock:   # the search thread, and a stop playing an unsearched move, may both ask
            if self.manager is None:
                self.manager = self._manager_factory(self.options, self.remark)
            manager = self.manager
        if manager.reloading() and manager.loaded and threading.current_thread().name == "cyzero-search":
            self.remark("the network for the new options is still loading; this search uses "
                        f"{manager.in_use.label()}")
        return manager.get()

    def _reconfigure_network(self) -> None:
        """The network options changed: a manager in use rebuilds its network if that changes it."""
        with self._manager_lock:   # a manager being made now reads the options as they are now
            manager = self.manager
        if manager is not None:
            manager.reconfigure(**_network_settings(self.options))

    def _swap_network_if_ready(self) -> None:
        if self.manager is not None:
            self.manager.apply_pending(self.searcher.network_changed)

    def _apply_pending_options(self) -> None:
        dirty, self._dirty_options = self._dirty_options, set()
        if dirty:
            self._apply_options(dirty)

    def _apply_options(self, names: set[str]) -> None:
        o = self.options
        params = SearchParams.from_uci(o.__getitem__)
        changed = params != self.searcher.params
        self.searcher.params = params
        if changed or "clear hash" in names:
            self.searcher.apply_options()
        if "clear hash" in names:
            self.searcher.new_game()
        if "uci_chess960" in names:
            self.board.chess960 = o["UCI_Chess960"]
        self.searcher.analysis = o["UCI_AnalyseMode"]
        if names & _NETWORK_OPTIONS:
            self.searcher.network_unavailable(None)   # not known until the next load
        if "trainerkeys" in names and self.manager is not None:
            try:
                self.manager.set_trainer_keys(o["TrainerKeys"] or None)
            except ValueError as exc:
                self.error(f"TrainerKeys: {exc}")
        if "trainerendpoint" in names and self.manager is not None:
            try:
                self.manager.set_endpoint(o["TrainerEndpoint"] or None)
            except ValueError as exc:
                self.error(f"TrainerEndpoint: {exc}")
        if "bookfile" in names or "ownbook" in names:
            self._open_book()
        if "syzygypath" in names:
            self._open_tablebases()

    def _open_book(self) -> None:
        if self._book is not None:
            self._book.close()
            self._book = None
        path = self.options["BookFile"]
        if not path or not self.options["OwnBook"]:
            return
        from engine.book import OpeningBook

        try:
            self._book = OpeningBook(path)
            self.remark(f"opening book {path}")
        except (ValueError, OSError) as exc:
            self.error(f"cannot open book: {exc}")

    def _open_tablebases(self) -> None:
        if self._tablebases is not None:
            self._tablebases.close()
            self._tablebases = None
        path = self.options["SyzygyPath"]
        if not path:
            return
        from engine.book import Tablebases

        try:
            self._tablebases = Tablebases(path)
            self.remark(f"Syzygy tablebases up to {self._tablebases.max_pieces} pieces from {path}")
        except (ValueError, OSError) as exc:
            self.error(f"cannot use SyzygyPath: {exc}")

    def _play_book_move(self, board: Board, answer: object) -> bool:
        if self._book is None:
            return False
        move = self._book.move(board)
        if move is None:
            return False
        self.info_string(f"book move {move}")
        self.floor.close(answer, f"bestmove {move}")
        return True

    def _restrict_to_tablebase(self, board: Board, go: GoParams) -> None:
        if self._tablebases is None:
            return
        found = self._tablebases.root_moves(board)
        if found is None:
            return
        moves, wdl = found
        if go.searchmoves:
            moves = [m for m in moves if m in go.searchmoves] or moves
        go.searchmoves = moves
        result = {2: "win", 1: "cursed win", 0: "draw", -1: "blessed loss", -2: "loss"}.get(wdl, str(wdl))
        self.info_string(f"tablebase {result}; searching {len(moves)} move(s)")


def _network_batch(minibatch: int) -> dict:
    """The network's own batch sizes, unless an explicit MinibatchSize needs a larger one (a GPU
    network keeps a session per size, up to its largest)."""
    from engine.network import DEFAULT_MAX_BATCH

    return {"max_batch": minibatch} if minibatch > DEFAULT_MAX_BATCH else {}


def _network_settings(options: Options) -> dict:
    """The options a network is built with, as NetworkManager takes them."""
    heads = {key: options[option] for key, option in (("value_head", "ValueHead"), ("policy_head", "PolicyHead"))
             if options[option] and options[option] != _DEFAULT_HEADS[key]}
    return dict(weights=options["WeightsFile"], backend=options["Backend"], device_id=options["GPU"],
                threads=options["Threads"], network_options={**_network_batch(options["MinibatchSize"]), **heads})


def _default_manager(options: Options, log: Callable[[str], None]):
    """The network manager for the current options; the WeightsFile is checked on its first use."""
    from engine.network_manager import NetworkManager

    settings = _network_settings(options)
    manager = NetworkManager(settings.pop("weights"), log=log, **settings)
    try:
        manager.set_trainer_keys(options["TrainerKeys"] or None)
        manager.set_endpoint(options["TrainerEndpoint"] or None)
    except ValueError as exc:   # bad keys or endpoint: say so, and play on without following
        log(f"error: {exc}; not following TrainerEndpoint")
    return manager


def run(stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    """Speak UCI until ``quit`` or end of input; returns the exit code."""
    writer = Writer(stdout)
    session = Session(writer)
    try:
        while True:
            line = stdin.readline()
            if not line:          # end of input: a bounded search still finishes
                session.end_of_input()
                return 0
            if not session.handle(line):
                return 0
    except KeyboardInterrupt:
        session.close()
        return 130
