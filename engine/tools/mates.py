"""Forced mates in 1, 2 and 3: a position set generated with Stockfish, and ``cyzero bench mates``.

Generator (``python -m engine.tools.mates generate --out FILE``, or :func:`generate`)
    Games start from a bundled opening (``openings.txt``), then 2 to 8 uniformly
    random plies, then a lopsided game: one side plays Stockfish's best move
    (``go depth 8``), the other a random legal move half of the time, so that
    decisive positions arise quickly.  When Stockfish scores the side to move
    with a mate in N <= 3 that is still wanted, the position (from its FEN alone,
    no history) is confirmed by a deeper search with MultiPV over every legal
    move: the shortest mate must be exactly N, and every move scored mate in N
    is checked once more (after it, Stockfish scores the opponent mated in N-1,
    or the opponent is checkmated for N=1).  All those moves are the ``bm``.
    One position per game at most, no duplicates; positions with a halfmove
    clock above 80 are skipped (the fifty-move rule could cut a mate short).

    Unseen: the training data (``cyzero-train bootstrap``) is Stockfish self-play
    from the standard start position after uniformly random plies, drawn by
    numpy.  Here every game starts from a named opening line, adds its own
    random plies from Python's ``random`` with its own seed, and one side then
    plays random moves half of the time: the game trees are disjoint from the
    teacher's almost surely, and a mate-in-N position lies 30 to 100 plies deep,
    so an exact repeat of a training position is negligible.

    Deterministic given the seed and the Stockfish build (one thread, fixed
    depths, a new game's hash for each game).

Benchmark (``cyzero bench mates``, :func:`run_bench`)
    For each node budget, the share of positions (per mate length and overall)
    whose best move after a ``go nodes N`` search is one of the ``bm`` moves.
    Every search is a fresh tree and a fresh network cache, in this process,
    on the CPU, with the UCI defaults otherwise.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import chess

from engine.tools.bench_common import report

__all__ = ["DEFAULT_NODES", "MATES_PATH", "MatePosition", "MatesError", "add_arguments", "engine_searcher",
           "generate", "load_positions", "mate_moves", "run_bench", "score"]

MATES_PATH = Path(__file__).with_name("mates.epd")
LENGTHS = (1, 2, 3)
DEFAULT_NODES = (400, 4000, 20000)

# The generator's Stockfish settings: cheap play, a deeper confirmation.
PLAY_DEPTH = 8
CONFIRM_DEPTH = 12
VERIFY_DEPTH = 10
RANDOM_PLIES = (2, 8)
WEAK_RANDOM_SHARE = 0.5
MAX_PLIES = 200
MAX_HALFMOVE_CLOCK = 80


class MatesError(Exception):
    """Bad input (a position file, a node list) or a generator that cannot run."""


@dataclass(frozen=True)
class MatePosition:
    id: str
    fen: str
    mate: int                 # dm: the side to move mates in exactly this many moves
    moves: tuple[str, ...]    # bm as UCI moves: every move that mates in exactly ``mate``


# --------------------------------------------------------------------------- the position file


def load_positions(path: str | Path = MATES_PATH) -> list[MatePosition]:
    """The EPD lines of ``path``; each needs ``bm`` and ``dm`` 1 to 3 (``id`` optional)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise MatesError(f"cannot read positions {str(path)!r}: {e.strerror or e}") from None
    positions = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            board, ops = chess.Board.from_epd(line)
        except ValueError as e:
            raise MatesError(f"{path}:{number}: not an EPD line: {e}") from None
        bm, dm = ops.get("bm"), ops.get("dm")
        if not bm or not isinstance(dm, int) or dm not in LENGTHS:
            raise MatesError(f"{path}:{number}: needs 'bm' moves and 'dm' 1, 2 or 3")
        positions.append(MatePosition(str(ops.get("id") or f"line {number}"), board.fen(), dm,
                                      tuple(m.uci() for m in bm)))
    if not positions:
        raise MatesError(f"{path}: no positions")
    return positions


def epd_line(position: MatePosition) -> str:
    board = chess.Board(position.fen)
    return board.epd(bm=[chess.Move.from_uci(m) for m in position.moves], dm=position.mate,
                     hmvc=board.halfmove_clock, fmvn=board.fullmove_number, id=position.id)


# --------------------------------------------------------------------------- generator


def mate_moves(engine, board: chess.Board, depth: int = CONFIRM_DEPTH,
               verify_depth: int = VERIFY_DEPTH) -> Optional[tuple[int, list[chess.Move]]]:
    """(N, every move that mates in exactly N) when Stockfish proves the side to move's shortest
    mate is N; None when it finds none, or when a move's second check disagrees."""
    import chess.engine

    legal = list(board.legal_moves)
    if not legal:
        return None
    infos = engine.analyse(board, chess.engine.Limit(depth=depth), multipv=len(legal))
    scored = [(info["pv"][0], info["score"].relative.mate()) for info in infos if info.get("pv")]
    mates = [n for _, n in scored if n is not None and n > 0]
    if not mates:
        return None
    n = min(mates)
    moves = []
    for move, m in scored:
        if m != n:
            continue
        board.push(move)
        try:
            if n == 1:
                ok = board.is_checkmate()
            else:
                reply = engine.analyse(board, chess.engine.Limit(depth=verify_depth))
                ok = reply["score"].relative.mate() == -(n - 1)
        finally:
            board.pop()
        if not ok:
            return None   # the two searches disagree: not a position to trust
        moves.append(move)
    return n, moves


def generate(out: str | Path, per_length: int = 50, seed: int = 20251123,
             teacher: Optional[Sequence[str]] = None, log: Callable[[str], object] = lambda s: None,
             max_games: Optional[int] = None) -> list[MatePosition]:
    """Write ``per_length`` positions of each mate length 1 to 3 to ``out`` (EPD) and return them."""
    import chess.engine

    from engine.files import atomic_open
    from engine.tools.match import load_openings, stockfish_command

    if per_length < 1:
        raise MatesError(f"--per-length must be 1 or more, got {per_length}")
    rng = random.Random(seed)
    openings = load_openings()
    command = list(teacher) if teacher else [stockfish_command()]
    found: dict[int, list[MatePosition]] = {n: [] for n in LENGTHS}
    seen: set[str] = set()
    max_games = max_games if max_games is not None else 100 * per_length * len(LENGTHS)
    try:
        engine = chess.engine.SimpleEngine.popen_uci(command)
    except (OSError, chess.engine.EngineError) as e:
        raise MatesError(f"cannot start {' '.join(command)}: {e}") from None
    try:
        engine.configure({"Threads": 1, "Hash": 16})
        games = 0
        while any(len(v) < per_length for v in found.values()):
            if games >= max_games:
                raise MatesError(f"only {', '.join(f'{len(v)} mates in {n}' for n, v in found.items())} "
                                 f"after {games} games")
            games += 1
            hit = _play_one(engine, rng, openings, found, per_length, seen, games)
            if hit is not None:
                found[hit.mate].append(hit)
                log(f"game {games}: {hit.id} {hit.fen} ({len(hit.moves)} mating moves)")
    finally:
        engine.quit()
    positions = [p for n in LENGTHS for p in found[n]]
    with atomic_open(out, "w") as f:
        for p in positions:
            f.write(epd_line(p) + "\n")
    return positions


def _play_one(engine, rng: random.Random, openings, found, per_length: int, seen: set[str],
              game: int) -> Optional[MatePosition]:
    """Play one lopsided game; the first wanted, confirmed mate position of it (or None)."""
    import chess.engine

    board = openings[rng.randrange(len(openings))].board()
    for _ in range(rng.randint(*RANDOM_PLIES)):
        legal = list(board.legal_moves)
        if not legal:
            return None
        board.push(rng.choice(legal))
    weak = rng.choice((chess.WHITE, chess.BLACK))
    key = object()   # a new game for the engine: ucinewgame, a fresh hash
    while not board.is_game_over(claim_draw=True) and board.ply() < MAX_PLIES:
        info = engine.analyse(board, chess.engine.Limit(depth=PLAY_DEPTH), game=key)
        n = info["score"].relative.mate()
        fen = board.fen()
        if (n is not None and 0 < n <= max(LENGTHS) and len(found[n]) < per_length
                and board.halfmove_clock <= MAX_HALFMOVE_CLOCK and fen not in seen):
            seen.add(fen)
            confirmed = mate_moves(engine, chess.Board(fen))
            if confirmed is not None and len(found[confirmed[0]]) < per_length:
                mate, moves = confirmed
                pid = f"m{mate}.{len(found[mate]) + 1:03d}"
                moves.sort(key=board.san)   # EPD's order, so the file reads back equal
                return MatePosition(pid, fen, mate, tuple(m.uci() for m in moves))
        legal = list(board.legal_moves)
        if board.turn == weak and rng.random() < WEAK_RANDOM_SHARE or "pv" not in info:
            board.push(rng.choice(legal))
        else:
            board.push(info["pv"][0])
    return None


# --------------------------------------------------------------------------- benchmark


# search(fen, nodes) -> (best move in UCI or None, seconds)
SearchFn = Callable[[str, int], tuple[Optional[str], float]]


def engine_searcher(weights: Optional[str] = None) -> SearchFn:
    """``go nodes N`` with the engine's search in this process on the CPU: a fresh tree and
    network cache for every search, the UCI defaults otherwise."""
    from engine.board import Board
    from engine.limits import GoParams
    from engine.params import SearchParams
    from engine.search import MultiSearch
    from engine.weights import NetworkBuilder, resolve_weights

    params = SearchParams()
    try:   # the file the engine would load: the bundled network's CPU variant by default
        builder = NetworkBuilder(backend="cpu")
        net = builder.load_weights_file(resolve_weights(weights)).network
    except Exception as e:   # a missing or broken file: one line, not a traceback
        raise MatesError(f"cannot load network {weights or 'default'}: {e}") from None

    def search(fen: str, nodes: int) -> tuple[Optional[str], float]:
        games = MultiSearch(net, params, pipeline=False)
        try:
            start = time.perf_counter()
            result = games.search([(Board(fen), GoParams(nodes=nodes))])[0]
            return result.best, time.perf_counter() - start
        finally:
            games.close()

    return search


def score(positions: Sequence[MatePosition], nodes: Sequence[int], search: SearchFn,
          progress: Callable[[str], object] = lambda s: None) -> dict:
    """Per node budget: solved counts and shares by mate length and overall, and the mean
    seconds per search."""
    budgets = []
    for n in nodes:
        solved = {m: 0 for m in LENGTHS}
        total = {m: 0 for m in LENGTHS}
        seconds = []
        for p in positions:
            best, secs = search(p.fen, n)
            seconds.append(secs)
            total[p.mate] += 1
            solved[p.mate] += best in p.moves
        by_length = {str(m): {"positions": total[m], "solved": solved[m],
                              "share": round(solved[m] / total[m], 4) if total[m] else None}
                     for m in LENGTHS}
        all_solved = sum(solved.values())
        budgets.append({"nodes": n, "by_mate": by_length, "solved": all_solved, "positions": len(positions),
                        "share": round(all_solved / len(positions), 4) if positions else None,
                        "mean_search_s": round(statistics.fmean(seconds), 4) if seconds else None})
        progress(f"{n} nodes: {all_solved}/{len(positions)} solved")
    return {"budgets": budgets}


def _node_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of node counts: {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"node counts must be 1 or more: {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--positions", default=str(MATES_PATH), metavar="FILE",
                        help="EPD positions with bm and dm (default: the bundled mates.epd)")
    parser.add_argument("--nodes", type=_node_list, default=DEFAULT_NODES, metavar="N,N,...",
                        help="node budgets (default " + ",".join(map(str, DEFAULT_NODES)) + ")")
    parser.add_argument("--weights", default=None, metavar="FILE",
                        help="network (default: the bundled one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")


def run_bench(args: argparse.Namespace, search: Optional[SearchFn] = None) -> int:
    """``cyzero bench mates``: prints the table (or one JSON object); returns the exit code."""
    positions = load_positions(args.positions)
    started = time.perf_counter()
    search = search or engine_searcher(args.weights)
    say = (lambda s: None) if args.json else (lambda s: print(s, flush=True))
    say(f"{len(positions)} positions ("
        + ", ".join(f"{sum(p.mate == m for p in positions)} mates in {m}" for m in LENGTHS)
        + f") from {args.positions}; network {args.weights or 'bundled default'}")
    result = score(positions, args.nodes, search, say)
    summary = {"benchmark": "mates", "positions_file": str(args.positions), "weights": args.weights,
               **result, "wall_seconds": round(time.perf_counter() - started, 3)}
    return report(args, summary, _bench_text)


def _bench_text(summary: dict) -> Iterator[str]:
    """The table: the share solved by mate length and overall, a row a node budget."""
    yield f"{'nodes':>8}" + "".join(f"{'mate in ' + str(m):>14}" for m in LENGTHS) + f"{'all':>14}{'s/search':>10}"
    for b in summary["budgets"]:
        cells = [b["by_mate"][str(m)] for m in LENGTHS] + [b]
        yield (f"{b['nodes']:>8}" + "".join(
            f"{(c['share'] or 0):>8.0%} {c['solved']:>2}/{c['positions']:<2}" for c in cells)
            + f"{b['mean_search_s']:>10.3f}")
    yield f"{summary['wall_seconds']:.1f} s"


# --------------------------------------------------------------------------- command line


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.mates", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate a mate position set with Stockfish")
    gen.add_argument("--out", required=True, metavar="FILE")
    gen.add_argument("--per-length", type=int, default=50, metavar="K", help="positions per mate length (default 50)")
    gen.add_argument("--seed", type=int, default=20251123, metavar="S")
    gen.add_argument("--teacher", default=None, metavar="CMD", help="UCI engine command (default: Debian stockfish)")
    args = parser.parse_args(argv)
    from engine.tools.match import MatchError, parse_command
    try:
        teacher = parse_command(args.teacher) if args.teacher else None
        started = time.perf_counter()
        positions = generate(args.out, args.per_length, args.seed, teacher,
                             log=lambda s: print(s, file=sys.stderr, flush=True))
    except (MatesError, MatchError) as e:
        print(f"mates generate: {e}", file=sys.stderr)
        return 1
    print(f"wrote {len(positions)} positions to {args.out} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
