"""One side of a match: finding and parsing engine commands, and :class:`EngineProcess`, an engine
process driven through python-chess's asyncio UCI protocol (start, configure, play a move under
a hard guard, restart after a crash, close)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import chess
import chess.engine

from engine.tools.match_types import HANDSHAKE_TIMEOUT, EngineSpec, EngineStats, MatchError

STOCKFISH_FALLBACK = "/usr/games/stockfish"  # Debian installs it outside the usual PATH
READY_TIMEOUT = 30.0  # seconds to answer `isready` after `ucinewgame`
QUIT_TIMEOUT = 5.0  # seconds to exit after `quit` before it is killed
KILL_WAIT = 5.0  # seconds to wait for a killed engine's last command to finish


def stockfish_command() -> str:
    """Debian's stockfish: on PATH, or in /usr/games where Debian puts it."""
    found = shutil.which("stockfish")
    if found:
        return found
    if os.access(STOCKFISH_FALLBACK, os.X_OK):
        return STOCKFISH_FALLBACK
    raise MatchError("stockfish not found on PATH or at /usr/games/stockfish (apt-get install stockfish)")


def default_engine_command() -> list[str]:
    """cyzero: the console script next to the running Python, else ``python -m uci``."""
    script = Path(sys.executable).with_name("cyzero")
    if os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "uci"]


def parse_command(text: str) -> list[str]:
    """A shell-like command string -> argv; a bare name missing from PATH is looked up in /usr/games."""
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise MatchError(f"cannot parse engine command {text!r}: {e}") from None
    if not argv:
        raise MatchError("empty engine command")
    if os.sep not in argv[0] and shutil.which(argv[0]) is None:
        games = os.path.join("/usr/games", argv[0])
        if os.access(games, os.X_OK):
            argv[0] = games
    return argv


def parse_option(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` (the name may contain spaces, e.g. ``Move Overhead=100``)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise MatchError(f"engine option must be NAME=VALUE, got {text!r}")
    return name.strip(), value.strip()


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class EngineProcess:
    """One engine process of one worker: start, configure, play moves, restart, close."""

    def __init__(self, spec: EngineSpec, label: str, stats: EngineStats, notes: Callable[[str], None],
                 handshake_timeout: float = HANDSHAKE_TIMEOUT):
        self.spec = spec
        self.label = label
        self.handshake_timeout = handshake_timeout
        self.stats = stats
        self.notes = notes
        self.transport: Optional[asyncio.SubprocessTransport] = None
        self.protocol: Optional[chess.engine.UciProtocol] = None
        self.id_name: Optional[str] = None
        self.applied_options: dict = {}
        self.started_once = False

    @property
    def alive(self) -> bool:
        return self.protocol is not None and not self.protocol.returncode.done()

    def exit_code(self) -> Optional[int]:
        if self.protocol is not None and self.protocol.returncode.done():
            return self.protocol.returncode.result()
        return None

    async def start(self) -> None:
        """Start the process and configure it; MatchError (process cleaned up) when it cannot."""
        await self.kill()
        command = " ".join(shlex.quote(a) for a in self.spec.command)
        try:
            transport, protocol = await chess.engine.UciProtocol.popen(self.spec.command)
        except OSError as e:
            raise MatchError(f"{self.label}: cannot start {command!r}: {e.strerror or e}") from None
        self.transport, self.protocol = transport, protocol
        try:
            await asyncio.wait_for(protocol.initialize(), self.handshake_timeout)
            await self._configure(protocol)
        except asyncio.TimeoutError:
            await self.kill()
            raise MatchError(
                f"{self.label}: {command!r} did not answer `uci` with `uciok` within {self.handshake_timeout:g} s: "
                "is it a UCI engine? (--handshake-timeout S waits longer)"
            ) from None
        except chess.engine.EngineTerminatedError as e:
            await self.kill()
            raise MatchError(f"{self.label}: {command!r} exited during start-up ({e})") from None
        except (chess.engine.EngineError, MatchError) as e:
            await self.kill()
            raise MatchError(str(e) if isinstance(e, MatchError) else f"{self.label}: {command!r}: {e}") from None
        if self.started_once:
            self.stats.restarts += 1
        self.started_once = True
        self.id_name = protocol.id.get("name") or os.path.basename(self.spec.command[0])

    async def _configure(self, protocol: chess.engine.UciProtocol) -> None:
        config: dict = {}
        for name, value in self.spec.options:
            if name not in protocol.options:
                known = ", ".join(sorted(protocol.options)) or "none"
                raise MatchError(f"{self.label}: the engine has no option {name!r} (it has: {known})")
            option = protocol.options[name]
            name = option.name
            if option.type == "check":
                if value.lower() not in _TRUE | _FALSE:
                    raise MatchError(f"{self.label}: option {name} is true or false, got {value!r}")
                config[name] = value.lower() in _TRUE
            elif option.type == "spin":
                try:
                    number = int(value)
                except ValueError:
                    raise MatchError(f"{self.label}: option {name} takes a whole number, got {value!r}") from None
                low = option.min if option.min is not None else number
                high = option.max if option.max is not None else number
                if not low <= number <= high:
                    if name not in self.spec.clamp:
                        raise MatchError(f"{self.label}: option {name}={number} is outside the engine's range {low}..{high}")
                    clamped = min(max(number, low), high)
                    self.notes(f"{self.label}: the engine accepts {name} {low}..{high}; using {clamped} instead of {number}")
                    number = clamped
                config[name] = number
            elif option.type == "button":
                config[name] = None
            else:
                config[name] = value
        try:
            await protocol.configure(config)
        except chess.engine.EngineError as e:
            raise MatchError(f"{self.label}: cannot set options {config}: {e}") from None
        self.applied_options = {k: v for k, v in config.items() if v is not None}

    async def kill(self) -> None:
        """Kill the process (if any) and forget it; a later start() starts a fresh one."""
        transport, self.transport, self.protocol = self.transport, None, None
        if transport is None:
            return
        with contextlib.suppress(Exception):
            transport.kill()
        with contextlib.suppress(Exception):
            transport.close()
        await asyncio.sleep(0)

    async def close(self) -> None:
        """Ask the engine to quit; kill it when it does not."""
        if self.alive:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.protocol.quit(), QUIT_TIMEOUT)
        await self.kill()

    async def new_game(self) -> Optional[str]:
        """Make sure the engine runs and has seen ``ucinewgame``; an error text when it cannot."""
        for _ in range(2):
            if self.protocol is not None and not self.alive:
                self.stats.crashes += 1  # died between games
                await self.kill()
            if self.protocol is None:
                try:
                    await self.start()
                except MatchError as e:
                    self.stats.disconnects += 1
                    return f"could not be started: {e}"
            # ucinewgame and its isready round trip happen before the clock starts
            # (python-chess's play() is then called with game=None, so it does not repeat them).
            try:
                self.protocol.send_line("ucinewgame")
                await asyncio.wait_for(self.protocol.ping(), READY_TIMEOUT)
                return None
            except asyncio.TimeoutError:
                self.stats.disconnects += 1
                await self.kill()
            except chess.engine.EngineError:
                if self.alive:  # otherwise the next round counts the crash
                    self.stats.disconnects += 1
                    await self.kill()
        return "did not answer `isready` after `ucinewgame`"

    async def play(self, board: chess.Board, limit: chess.engine.Limit, guard: float):
        """One move. Returns (kind, value, elapsed seconds): ("move", PlayResult), ("hang", None),
        ("crash", text), ("illegal", text) or ("disconnect", text)."""
        protocol = self.protocol
        if protocol is None:
            return "crash", "the engine is not running", 0.0
        t0 = time.monotonic()
        task = asyncio.ensure_future(
            protocol.play(board, limit, info=chess.engine.INFO_BASIC | chess.engine.INFO_SCORE)
        )
        try:
            done, _ = await asyncio.wait({task}, timeout=guard)
        except asyncio.CancelledError:  # the match is being stopped
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            raise
        elapsed = time.monotonic() - t0
        if not done:
            await self._kill_with_task(task)
            return "hang", None, elapsed
        try:
            return "move", task.result(), elapsed
        except chess.engine.EngineTerminatedError as e:
            code = self.exit_code()
            await self.kill()
            return "crash", f"the engine process died (exit code {code})" if code is not None else str(e), elapsed
        except chess.engine.EngineError as e:
            cause = e.args[0] if e.args else None
            if isinstance(cause, ValueError):  # python-chess could not play the move it sent
                return "illegal", str(cause), elapsed
            await self.kill()
            return "disconnect", f"protocol error: {e}", elapsed

    async def _kill_with_task(self, task: asyncio.Future) -> None:
        transport = self.transport
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.kill()
        # python-chess fails the command once it sees the process exit; retrieve that.
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, KILL_WAIT)
        if not task.done():
            task.cancel()
        await self.kill()
