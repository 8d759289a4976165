"""``cyzero eval WEIGHTS --positions FILE``: a network's raw outputs on given positions, exactly.

What lc0's ``VerboseMoveStats`` at ``go nodes 1`` shows a person who checks a network, without its
rounding and without a search: for each position, the network's win/draw/loss, its moves left and
the raw policy logit of every legal move, from the network file as it is (ONNX Runtime's CPU path
in the file's own precision by default, so the numbers are the file's, not a faster variant's),
the position encoded in the network's own input format (lc0's formats 1-5, 132, 133).

Input, JSON Lines (``-`` reads stdin)::

    {"fen": "startpos", "moves": ["e2e4", "e7e5"]}
    {"fen": "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3", "chess960": false}

Output, one JSON line per input line, in order (blank input lines are skipped)::

    {"wdl": [w, d, l], "mlh": m or null, "policy": {"g1f3": 2.6, ...}}

Castling is written as UCI_Chess960 writes it (``e1h1`` for a Chess960 position, ``e1g1``
otherwise). A line that cannot be read (not JSON, a bad FEN, an illegal move) gives
``{"error": "line N: ..."}`` in its place and the same text on stderr; every other line is
evaluated, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import IO, Iterable, Iterator, Optional

STARTPOS_WORD = "startpos"
DEFAULT_BATCH = 256


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "eval",
        help="a network's raw outputs (WDL, moves left, each legal move's logit) on positions",
        description="Evaluate a network on positions read as JSON Lines and write its raw outputs, one JSON "
        "line per position: what lc0's VerboseMoveStats at go nodes 1 shows, without rounding.",
    )
    parser.add_argument("weights", metavar="WEIGHTS", help="an ONNX network or an lc0 .pb.gz / .pb file")
    parser.add_argument("--positions", required=True, metavar="FILE",
                        help='JSON Lines of {"fen": FEN or "startpos", "moves": [uci, ...], "chess960": bool}; '
                        "- reads stdin")
    parser.add_argument("--backend", default="cpu", choices=("cpu", "auto", "openvino", "cuda", "tensorrt"),
                        help="the runtime (default cpu: ONNX Runtime in the file's own precision, the exact "
                        "outputs; the others may run a faster precision)")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="N",
                        help=f"positions per network call (default {DEFAULT_BATCH})")
    parser.add_argument("--value-head", default=None, metavar="NAME",
                        help="an lc0 multihead network's value head (default lc0's: winner)")
    parser.add_argument("--policy-head", default=None, metavar="NAME",
                        help="an lc0 multihead network's policy head (default lc0's: vanilla)")
    parser.set_defaults(func=main)
    return parser


@dataclass
class Request:
    """One input line: its number, and the board it names or why it names none."""

    line: int
    board: object = None
    error: Optional[str] = None


def read_requests(lines: Iterable[str]) -> Iterator[Request]:
    """Each non-blank line as a board (engine.board.Board, history included) or an error naming it."""
    from engine.board import Board

    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            item = json.loads(text)
        except json.JSONDecodeError as e:
            yield Request(number, error=f"line {number}: not JSON ({e.msg})")
            continue
        if not isinstance(item, dict):
            yield Request(number, error=f"line {number}: expected an object with a fen, got {type(item).__name__}")
            continue
        fen, moves, chess960 = item.get("fen", STARTPOS_WORD), item.get("moves", []), item.get("chess960", False)
        if not isinstance(fen, str) or not isinstance(moves, list) or not all(isinstance(m, str) for m in moves) \
                or not isinstance(chess960, bool):
            yield Request(number, error=f"line {number}: fen must be a string, moves a list of UCI strings and "
                                        "chess960 true or false")
            continue
        try:
            board = Board(None if fen == STARTPOS_WORD else fen, chess960=chess960)
        except ValueError as e:
            yield Request(number, error=f"line {number}: bad FEN {fen!r}: {e}")
            continue
        for ply, move in enumerate(moves, start=1):
            try:
                board.push_uci(move)
            except ValueError:
                yield Request(number, error=f"line {number}: illegal move {move!r} at ply {ply}")
                break
        else:
            yield Request(number, board=board)


def evaluate(network, boards: list) -> list[dict]:
    """The network's outputs on ``boards`` (one call), one dict each, as the output lines hold them."""
    from engine.encoding import encode_boards, move_to_index

    if not boards:
        return []
    input_format = getattr(network, "input_format", 1)     # the network's own, as lc0 feeds it
    policy, wdl, mlh = network.evaluate(encode_boards(boards, input_format=input_format))
    out = []
    for i, board in enumerate(boards):
        logits = {move: float(policy[i, move_to_index(board, move, input_format=input_format)])
                  for move in board.legal_moves()}
        out.append({"wdl": [float(x) for x in wdl[i]], "mlh": None if mlh is None else float(mlh[i]),
                    "policy": logits})
    return out


def run(network, lines: Iterable[str], out: IO[str], err: IO[str], batch: int = DEFAULT_BATCH) -> int:
    """Evaluate every line of ``lines`` in batches of ``batch``; returns the number of bad lines."""
    bad = 0
    pending: list[Request] = []

    def flush() -> None:
        results = iter(evaluate(network, [r.board for r in pending if r.error is None]))
        for request in pending:
            out.write(json.dumps({"error": request.error} if request.error else next(results)) + "\n")
        out.flush()
        pending.clear()

    for request in read_requests(lines):
        if request.error is not None:
            bad += 1
            print(f"cyzero eval: {request.error}", file=err)
        pending.append(request)
        if len(pending) >= batch:
            flush()
    flush()
    return bad


def main(args: argparse.Namespace) -> int:
    if args.batch < 1:
        print(f"cyzero eval: --batch must be at least 1, got {args.batch}", file=sys.stderr)
        return 2
    from engine.network import Network, NetworkError

    try:
        network = Network(args.weights, backend=args.backend, value_head=args.value_head,
                          policy_head=args.policy_head, log=lambda text: print(text, file=sys.stderr))
    except (NetworkError, OSError) as e:
        print(f"cyzero eval: {e}", file=sys.stderr)
        return 2
    try:
        source = sys.stdin if args.positions == "-" else open(args.positions, encoding="utf-8")
    except OSError as e:
        print(f"cyzero eval: cannot read --positions: {e}", file=sys.stderr)
        return 2
    with source:
        bad = run(network, source, sys.stdout, sys.stderr, batch=args.batch)
    return 1 if bad else 0
