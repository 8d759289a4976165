"""``cyzero match``: play one UCI engine against another and measure the difference.

Two engine commands (cyzero by default, Debian's ``stockfish`` with
``UCI_LimitStrength``/``UCI_Elo`` as a convenience) play N games through
python-chess's asyncio engine API:

- under a clock (``10+0.1``: base seconds + increment), a fixed number of
  nodes, or a fixed time per move; an engine may also have nodes of its own
  (``--engine1-nodes 1``, cutechess-cli's per-engine ``nodes=``), sent besides the
  clock (``go wtime .. btime .. winc .. binc .. nodes 1``), which is still kept: a
  Maia at one node can play Stockfish on a clock;
- from a bundled set of varied, balanced openings (``engine/tools/openings.txt``),
  each opening played twice with colours reversed, so games come in pairs;
- K games at once (``--concurrency``), each worker with its own two engine
  processes;
- the runner keeps the clocks: it measures the wall time of every move and
  subtracts it; a move that arrives after the clock has run out loses on
  time, and the overshoot is recorded. A hard wall-clock guard per move (the
  time the engine may still use plus ``guard`` seconds) kills an engine that
  hangs, so no engine can hang the match;
- an engine that plays an illegal move, gives no move, hangs, crashes or
  breaks the protocol loses that game; the event is counted per engine, never
  a crash of the runner, and a dead engine is restarted for its next game;
- games end only by the rules (python-chess's outcome, draws claimed at once)
  or by the optional adjudications: a draw after ``adjudicate_moves`` full
  moves, and resignation with ``resign=(CP, MOVES)``;
- a PGN of all games, in game-number order: each game is appended as soon as
  it and every game before it have finished, and the whole file is rewritten
  atomically (temp file, fsync, rename) at the end;
- an optional early end (``MatchConfig.on_game`` / ``should_stop``), which the
  trainer's SPRT gating uses to stop once its test is decided;
- an optional SPRT (``--sprt ELO0,ELO1``, :mod:`engine.tools.sprt`): the GSPRT on the
  pentanomial counts of the finished pairs, after every game; the match stops as soon as it
  accepts H1 (engine1 is ELO1 stronger) or H0 (ELO0), and games under way then are abandoned
  (counted, not scored). When ``games`` runs out first, the test is "inconclusive";
- a summary: W/L/D from engine1's view, score, Elo difference with a 95%
  interval (trinomial model), LOS, failure counts per engine, time taken.

The command-line arguments are defined by :func:`add_parser`; :func:`main` takes
the parsed namespace. :func:`run_match` is the programmatic entry point.

This module is the command line and the public names; the parts live beside it:
``match_types`` (the config, specs, games and result), ``match_openings``,
``match_engine`` (one engine process), ``match_play`` (the scheduler and the clocks),
``match_pgn``, ``match_summary``, and the statistics in :mod:`engine.tools.elo` and
:mod:`engine.tools.sprt`.
"""


from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
from typing import Optional

from engine.tools.elo import PairStats, ScoreStats, elo_from_score, likelihood_of_superiority, score_stats
from engine.tools.match_engine import default_engine_command, parse_command, parse_option, stockfish_command
from engine.tools.match_openings import OPENINGS_PATH, load_openings, parse_openings
from engine.tools.match_pgn import game_to_pgn, pgn_text, write_pgn
from engine.tools.match_play import MatchInterrupted, run_match
from engine.tools.match_summary import format_summary, interval_too_small, pair_stats, sprt_state, summary
from engine.tools.match_types import (
    HANDSHAKE_TIMEOUT, EngineSpec, EngineStats, GameRecord, MatchConfig, MatchError, MatchResult, Opening, TimeControl,
)
from engine.tools.sprt import Sprt, parse_elo_bounds

# The public face of ``cyzero match`` (the trainer's gating and ladder, the tests, docs/recipes):
# each name lives in the module the docstring above names for its concern.
__all__ = [
    "HANDSHAKE_TIMEOUT", "OPENINGS_PATH", "EngineSpec", "EngineStats", "GameRecord", "MatchConfig", "MatchError",
    "MatchInterrupted", "MatchResult", "Opening", "PairStats", "QuietInfoLines", "ScoreStats", "Sprt", "TimeControl", "add_parser",
    "config_from_args", "default_engine_command", "elo_from_score", "format_summary", "game_to_pgn",
    "interval_too_small", "likelihood_of_superiority", "load_openings", "main", "pair_stats", "parse_command",
    "parse_openings", "parse_option", "parse_resign", "pgn_text", "run_match", "score_stats", "sprt_state",
    "stockfish_command", "summary", "write_pgn",
]


def parse_resign(text: Optional[str]) -> Optional[tuple]:
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not m or int(m.group(2)) < 1:
        raise MatchError(f"--resign takes CP:MOVES (e.g. 600:4), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def config_from_args(args: argparse.Namespace) -> MatchConfig:
    """The match :func:`add_parser` parsed; MatchError for arguments that make no sense."""
    e1_command = parse_command(args.engine1) if args.engine1 else default_engine_command()
    e1 = EngineSpec(e1_command, [parse_option(o) for o in args.engine1_option or []], args.engine1_name,
                    nodes=args.engine1_nodes)
    if args.engine2:
        e2_command = parse_command(args.engine2)
    elif args.stockfish_elo is not None:
        e2_command = [stockfish_command()]
    else:
        raise MatchError("give the opponent with --engine2 CMD or --stockfish-elo ELO")
    e2_options = [parse_option(o) for o in args.engine2_option or []]
    clamp = frozenset()
    if args.stockfish_elo is not None:
        e2_options += [("UCI_LimitStrength", "true"), ("UCI_Elo", str(args.stockfish_elo))]
        clamp = frozenset({"UCI_Elo"})
    e2 = EngineSpec(e2_command, e2_options, args.engine2_name, clamp, nodes=args.engine2_nodes)

    if args.nodes is not None:
        if args.nodes < 1:
            raise MatchError(f"--nodes must be 1 or more, got {args.nodes}")
        tc = TimeControl(nodes=args.nodes)
    elif args.movetime is not None:
        if args.movetime <= 0:
            raise MatchError(f"--movetime must be above 0 ms, got {args.movetime}")
        tc = TimeControl(movetime=args.movetime / 1000.0)
    else:
        tc = TimeControl.parse(args.tc)
    for name in ("guard", "nodes_guard", "time_margin"):
        if getattr(args, name) < 0:
            raise MatchError(f"--{name.replace('_', '-')} must be 0 or more")
    if not args.handshake_timeout > 0:
        raise MatchError(f"--handshake-timeout must be above 0 seconds, got {args.handshake_timeout:g}")
    if args.adjudicate_moves < 0:
        raise MatchError("--adjudicate-moves must be 0 (never) or more")
    sprt = None
    if args.sprt is not None:
        elo0, elo1 = args.sprt
        alpha = args.sprt_alpha if args.sprt_alpha is not None else 0.05
        beta = args.sprt_beta if args.sprt_beta is not None else 0.05
        sprt = Sprt(elo0, elo1, alpha, beta)
    elif args.sprt_alpha is not None or args.sprt_beta is not None:
        raise MatchError("--sprt-alpha and --sprt-beta need --sprt ELO0,ELO1")
    openings = load_openings(args.openings) if args.openings else load_openings()
    return MatchConfig(
        engine1=e1,
        engine2=e2,
        games=args.games,
        time_control=tc,
        concurrency=args.concurrency,
        openings=openings,
        openings_source=str(args.openings or OPENINGS_PATH),
        pgn_path=args.pgn,
        seed=args.seed,
        adjudicate_moves=args.adjudicate_moves,
        resign=parse_resign(args.resign),
        time_margin=args.time_margin / 1000.0,
        guard=args.guard,
        nodes_guard=args.nodes_guard,
        handshake_timeout=args.handshake_timeout,
        event=args.event,
        sprt=sprt,
    )


class QuietInfoLines(logging.Filter):
    """Drop python-chess's warnings about ``info`` lines an engine sends outside a search
    (e.g. ``info string`` while it starts or answers ``isready``): they are legal UCI."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Unexpected engine output: 'info" not in record.getMessage()


def _sprt_elos(text: str) -> tuple:
    """argparse type of --sprt: ``ELO0,ELO1``."""
    try:
        return parse_elo_bounds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _sprt_rate(text: str) -> float:
    """argparse type of --sprt-alpha / --sprt-beta: a probability above 0 and below 0.5."""
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not 0.0 < rate < 0.5:
        raise argparse.ArgumentTypeError(f"must be a probability above 0 and below 0.5 (e.g. 0.05), got {text!r}")
    return rate


def _engine_nodes(text: str) -> int:
    """argparse type of --engine1-nodes / --engine2-nodes: a whole number of nodes, 1 or more."""
    try:
        nodes = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of nodes, 1 or more, got {text!r}") from None
    if nodes < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of nodes, 1 or more, got {text!r}")
    return nodes


def add_parser(commands) -> argparse.ArgumentParser:
    match = commands.add_parser(
        "match",
        help="play one UCI engine against another",
        description="Play two UCI engines against each other (engine1 is cyzero unless given): "
        "openings from a bundled balanced set, each played twice with colours reversed; "
        "prints W/L/D from engine1's view, the Elo difference with a 95% interval, LOS, "
        "and time forfeits, illegal moves and crashes per engine. Progress goes to stderr.",
    )
    for n in (1, 2):
        default = "cyzero (the console script next to this Python, or `python -m uci`)" if n == 1 else None
        match.add_argument(
            f"--engine{n}",
            metavar="CMD",
            help=f"engine {n}'s command line, split like a shell does"
            + (f"; default: {default}" if default else "; or use --stockfish-elo"),
        )
        match.add_argument(
            f"--engine{n}-option",
            action="append",
            metavar="NAME=VALUE",
            help=f"set a UCI option of engine {n} (repeatable)",
        )
        match.add_argument(f"--engine{n}-name", metavar="NAME", help=f"engine {n}'s name (default: its `id name`)")
        match.add_argument(
            f"--engine{n}-nodes",
            type=_engine_nodes,
            metavar="N",
            help=f"engine {n}'s own nodes per move, as cutechess-cli's per-engine nodes=N: its `go` "
            "carries `nodes N` besides the clock or --movetime (`go wtime .. btime .. nodes N`), "
            "whose time is still kept and can still run out; with --nodes it replaces that for "
            f"engine {n}. E.g. a Maia network at one node (--engine{n}-option WeightsFile=maia-1100.pb.gz "
            f"--engine{n}-nodes 1) against Stockfish on a clock",
        )
    match.add_argument(
        "--stockfish-elo",
        type=int,
        metavar="ELO",
        help="engine2 is Debian's stockfish (unless --engine2 is given) with UCI_LimitStrength "
        "and this UCI_Elo, clamped into the range the installed stockfish accepts. At fast time "
        "controls also give it --engine2-option 'Move Overhead=100': Stockfish 15.1 at limited "
        "strength can overrun a clock of a fraction of a second",
    )
    match.add_argument("--games", type=int, default=20, metavar="N",
                       help="games to play (default 20); with --sprt, the most it plays")
    match.add_argument(
        "--sprt",
        type=_sprt_elos,
        metavar="ELO0,ELO1",
        help="stop as soon as a sequential probability ratio test (GSPRT, logistic Elo, pentanomial "
        "over the finished pairs) decides between H0: engine1 is ELO0 Elo stronger and H1: it is "
        "ELO1 stronger (e.g. 0,10; a negative ELO0 is written --sprt=-5,5); if --games runs out "
        "first the result is inconclusive. With --concurrency, games under way when it decides "
        "are abandoned",
    )
    match.add_argument("--sprt-alpha", type=_sprt_rate, metavar="P",
                       help="the SPRT's chance of accepting H1 when H0 holds (default 0.05)")
    match.add_argument("--sprt-beta", type=_sprt_rate, metavar="P",
                       help="the SPRT's chance of accepting H0 when H1 holds (default 0.05)")
    limit = match.add_mutually_exclusive_group()
    limit.add_argument(
        "--tc", default="10+0.1", metavar="BASE+INC", help="clock: base seconds + increment (default 10+0.1)"
    )
    limit.add_argument("--nodes", type=int, metavar="N", help="fixed nodes per move instead of a clock")
    limit.add_argument("--movetime", type=float, metavar="MS", help="fixed time per move instead of a clock")
    match.add_argument("--concurrency", type=int, default=1, metavar="K", help="games at once (default 1)")
    match.add_argument("--openings", metavar="FILE", help="openings: 'ECO | name | moves' lines, FEN/EPD lines or PGN")
    match.add_argument("--pgn", metavar="OUT.pgn", help="write the games here")
    match.add_argument("--seed", type=int, metavar="S", help="seed for the order of the openings (default: random)")
    match.add_argument(
        "--adjudicate-moves",
        type=int,
        default=300,
        metavar="N",
        help="draw after N full moves (default 300; 0: never)",
    )
    match.add_argument(
        "--resign",
        metavar="CP:MOVES",
        help="adjudicate a loss when, for MOVES moves each, the loser's score is -CP or worse "
        "and the winner's +CP or better (default: off)",
    )
    match.add_argument(
        "--time-margin",
        type=float,
        default=0.0,
        metavar="MS",
        help="how late a move may arrive after the clock ran out (default 0)",
    )
    match.add_argument(
        "--guard",
        type=float,
        default=5.0,
        metavar="S",
        help="a move not made within the rest of the clock (or --movetime) plus S seconds is "
        "stopped and loses on time (default 5)",
    )
    match.add_argument(
        "--nodes-guard",
        type=float,
        default=60.0,
        metavar="S",
        help="with --nodes (and no clock or --movetime), a move not made within S seconds is stopped "
        "and loses on time (default 60)",
    )
    match.add_argument(
        "--handshake-timeout",
        type=float,
        default=HANDSHAKE_TIMEOUT,
        metavar="S",
        help=f"an engine that does not answer `uci` with `uciok` within S seconds of starting is "
        f"not a UCI engine: the match stops with an error (default {HANDSHAKE_TIMEOUT:g})",
    )
    match.add_argument("--event", default="cyzero match", help="the PGN Event tag")
    match.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")
    match.set_defaults(func=main)
    return match


def main(args: argparse.Namespace) -> int:
    """``cyzero match``: play, print the summary (or one JSON object with --json)."""

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    quiet = QuietInfoLines()
    logger = logging.getLogger("chess.engine")
    logger.addFilter(quiet)
    status = 0
    try:
        config = config_from_args(args)
        result = run_match(config, progress)
    except MatchError as e:
        print(f"cyzero match: {e}", file=sys.stderr)
        return 2
    except MatchInterrupted as e:
        progress(f"cyzero match: interrupted after {len(e.result.games)} of {e.result.config.games} games")
        result, status = e.result, 130
    finally:
        logger.removeFilter(quiet)
    if args.json:
        data = summary(result)
        data["interrupted"] = status != 0
        print(json.dumps(data))
    else:
        print(format_summary(result))
    return status
