"""Remake tests/data/lc0/input-formats.json: lc0 v0.32.1's own evaluation of the repository's lc0
fixture (tests/data/lc0/cyzero-3x16.pb.gz) in each of lc0's input formats, for
tests/test_input_formats.py, which checks cyzero's encoder (engine.encoding, ``input_format=``)
against it.

    .venv/bin/python docs/recipes/lc0-input-formats.py --lc0 /tmp/lc0-build/lc0/build/release/lc0
        [--out tests/data/lc0/input-formats.json] [--formats 1,2,3,4,132,5,133]

(lc0 built as docs/recipes/lc0-fixture.py says; the leela2onnx patch is not needed here.)

How: the weights of a network do not depend on its input format, only the planes lc0 feeds it do,
so the fixture with the ``input`` field of its ``format.network_format`` (Net field 4, Format field
2, NetworkFormat field 1) rewritten to F is a network of input format F: lc0 encodes its input that
way (src/neural/encoder.cc). This script rewrites that varint in the protobuf wire format by hand
(every other byte kept), writes each variant to a temporary folder and runs, for each format and
each position (a fresh lc0 process per position: lc0's NN cache is keyed by the last position's
hash alone, so two histories of one position would share an entry),

    lc0 --weights=VARIANT.pb.gz --backend=eigen --threads=1
    uci / setoption name VerboseMoveStats value true / [setoption name HistoryFill value no] / isready
    position fen FEN [moves ...] / go nodes 1

and keeps the root's V (W - L), D and M and each legal move's P (percent at lc0's default policy
temperature 1.359) with lc0's move name and policy index, parsed as tests/lc0_files.py does.
HistoryFill=no for the v2 formats (5, 133): with the default fen_only, lc0 v0.32.1's
EncodePositionForNN never ends on a FEN with a non-zero halfmove clock (its skip-non-repeats loop
walks past the first position forever) and then crashes; ``no`` gives the planes those formats
intend. The other formats run with lc0's defaults (fen_only).

lc0 v0.32's policy index in a transposed (pawnless, our king above the a8-h1 diagonal of its
quadrant) position rotates the squares by 180 degrees (PR #2126) while its planes are reflected in
the diagonal, so its P there is the network's output at the rotated index; the test reads the logits
there for those positions. The indices lc0 prints (kept in the JSON) are every move's untransformed
one (format 1's, the side to move's view) in every format: the test matches moves by them.

The positions (POSITIONS below, built by ``positions()``): castling rights on and off for each side
with either side to move, en passant (a capture possible, a capturer pinned so that the capture is
illegal, an en-passant square with no capturer beside, and the same arising in the move list),
rule50 counts across 0..99, Chess960 positions with castling among the moves, promotions, pawnless
positions with our king on every triangle of the board (every combination of flip, mirror and
transpose, and diagonal ties) for both sides to move, and move histories of 1-40 plies with
repetitions, castling changes and captures (some random games from a fixed seed).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from lc0_files import _LC0_MOVE, _LC0_NODE, input_format_of, with_input_format  # noqa: E402  (as the tests)

FIXTURE = os.path.join(REPO, "tests", "data", "lc0", "cyzero-3x16.pb.gz")
OUT = os.path.join(REPO, "tests", "data", "lc0", "input-formats.json")
FORMATS = (1, 2, 3, 4, 132, 5, 133)
HISTORY_FILL_NO = (5, 133)
POLICY_TEMPERATURE = 1.359


# --------------------------------------------------------------------------- the positions

def _random_game(seed: int, plies: int, fen=None) -> list:
    from engine.board import Board

    rng = random.Random(seed)
    board, moves = Board(fen), []
    for _ in range(plies):
        legal = board.legal_moves()
        if not legal or board.is_game_over():
            break
        move = rng.choice(sorted(legal))
        board.push_uci(move)
        moves.append(move)
    return moves


def _playable(fen: str) -> bool:
    from engine.board import Board

    try:
        board = Board(fen)
    except ValueError:
        return False
    return bool(board.legal_moves()) and not board.is_check()


def positions() -> list:
    """[{"name", "fen" (None: startpos), "moves", "chess960"}]."""
    out = []

    def add(name, fen, moves=(), chess960=False):
        out.append({"name": name, "fen": fen, "moves": list(moves), "chess960": chess960})

    # castling rights: each right on and off, either side to move
    base = "r3k2r/pppq1ppp/2n1bn2/3pp3/3PP3/2N1BN2/PPPQ1PPP/R3K2R {} {} - 4 9"
    for stm in "wb":
        for rights in ("KQkq", "-", "K", "Q", "k", "q", "Kq", "Qk", "KQ", "kq"):
            add(f"castling {rights} {stm}", base.format(stm, rights))
    add("castling, king on a-d (no transform while rights remain)",
        "r3k2r/ppp2ppp/8/8/8/8/PPP2PPP/R3K2R w Qk - 0 20")
    # en passant
    add("ep capture possible", "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3")
    add("ep capturer pinned (fen)", "8/8/8/KPp4r/8/8/8/4k3 w - c6 0 1")
    add("ep capturer pinned (move)", "4k3/2p5/8/KP5r/8/8/8/8 b - - 0 1", ["c7c5"])
    add("ep square, no capturer beside", "rnbqkbnr/pppp1ppp/8/4p3/8/8/PPPPPPPP/RNBQKBNR w KQkq e6 0 2")
    add("ep black captures", "rnbqkbnr/pp1ppppp/8/8/2pPP3/8/PPP2PPP/RNBQKBNR b KQkq d3 0 3")
    add("ep in history", None, ["e2e4", "d7d5", "e4e5", "f7f5", "g1f3", "g8f6"])
    add("ep now, by moves", None, ["d2d4", "e7e6", "d4d5", "c7c5"])
    add("double push, nobody beside", None, ["e2e4"])
    # rule50 across 0..99, kings on either wing (flip or not), pawns on the board
    for hm in (0, 1, 7, 23, 50, 77, 99):
        add(f"rule50 {hm}, king c1", f"2kr4/ppp2ppp/8/8/8/8/PPP2PPP/2KR4 w - - {hm} 40")
        add(f"rule50 {hm}, king g8 to move", f"6k1/5ppp/8/8/8/8/5PPP/3R2K1 b - - {hm} 40")
    # Chess960 with castling
    add("960 both castlings", "1r1k2r1/pppppppp/8/8/8/8/PPPPPPPP/1R1K2R1 w GBgb - 0 1", chess960=True)
    add("960 black, one side", "1r1k2r1/pppppppp/8/8/8/8/PPPPPPPP/1R1K2R1 b Gb - 2 5", chess960=True)
    add("960 start", "bqnbrkrn/pppppppp/8/8/8/8/PPPPPPPP/BQNBRKRN w GEge - 0 1", chess960=True)
    add("960 king b1", "r1k4r/pppppppp/8/8/8/8/PPPPPPPP/RK5R w HAha - 0 1", chess960=True)
    # promotions
    add("promotion, king g2", "8/1P4k1/8/8/8/8/6K1/8 w - - 0 60")
    add("promotion, king b2 (flip)", "8/1P4k1/8/8/8/8/1K6/8 w - - 0 60")
    add("black promotions with capture", "8/8/1K6/8/8/8/5pk1/4R3 b - - 0 1")
    add("black promotion, king c2 (flip)", "8/8/6K1/8/8/8/2k3p1/7R b - - 3 1")
    # pawnless: our king on every triangle, both sides to move
    for sq in ("a1", "b3", "c2", "d4", "e1", "f3", "g1", "h4", "h2", "a6", "c7", "e5", "f8", "h7", "d6",
               "b8", "g6", "f5", "e8", "a4", "a5", "b6", "c5", "d7"):
        f, r = "abcdefgh".index(sq[0]), int(sq[1]) - 1
        for stm in "wb":
            board = [["."] * 8 for _ in range(8)]
            king_r, king_f = (r, f) if stm == "w" else (7 - r, f)
            board[king_r][king_f] = "K" if stm == "w" else "k"
            their = (king_r + 4) % 8, (king_f + 3) % 8
            board[their[0]][their[1]] = "k" if stm == "w" else "K"
            for piece, (rr, ff) in (("R", (2, 5)), ("n", (6, 1)), ("Q", (5, 6))):
                rr, ff = (rr + r) % 8, (ff + 2 * f) % 8
                if board[rr][ff] == ".":
                    board[rr][ff] = piece
            rows = []
            for rr in range(7, -1, -1):
                row, empty = "", 0
                for c in board[rr]:
                    if c == ".":
                        empty += 1
                    else:
                        row += (str(empty) if empty else "") + c
                        empty = 0
                rows.append(row + (str(empty) if empty else ""))
            fen = "/".join(rows) + f" {stm} - - 12 70"
            if _playable(fen):
                add(f"pawnless, our king {sq} (our view), {stm}", fen)
    # diagonal ties: our king on the h1-e4 diagonal (of its quadrant)
    add("diagonal tie, g2", "8/8/8/1k6/8/2R5/6K1/8 w - - 0 50")
    add("diagonal tie, g2 reflected", "8/3k4/5R2/8/8/8/6K1/8 w - - 0 50")
    add("diagonal tie, symmetric", "7k/8/8/8/8/8/8/K7 w - - 0 50")
    add("diagonal tie, e4 black", "8/8/3k4/8/8/5N2/1K6/8 b - - 9 50")
    add("diagonal tie, f3 queens", "7q/8/8/8/8/5K2/7k/Q7 w - - 0 50")
    add("diagonal tie, b7 black to move", "8/1k6/8/8/8/6R1/8/3K4 b - - 0 50")
    # histories
    knights = ["g1f3", "g8f6", "f3g1", "f6g8"]
    add("repetitions from startpos", None, knights * 2)
    add("repetitions from startpos, 3 times", None, knights * 3 + ["g1f3"])
    add("castling in history", None, ["e2e4", "e7e5", "g1f3", "b8c6", "f1c4", "f8c5", "e1g1", "g8f6", "d2d3"])
    add("pawnless repetitions", "8/8/3k4/8/8/8/1R6/1K6 w - - 10 50",
        ["b2b3", "d6d5", "b3b2", "d5d6", "b2b3", "d6d5", "b3b2", "d5d6", "b1c1"])
    add("pawnless, rights gone in history", "r3k3/8/8/8/8/8/8/4K2R w Kq - 0 30",
        ["e1f1", "a8a7", "h1h2", "a7a8", "f1e1", "e8d8"])
    add("repetition after a capture", "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 30",
        ["h1h8", "e8d7", "h8h1", "d7e8"] + ["h1h2", "e8d8", "h2h1", "d8e8"] * 2)
    add("one ply from fen", "6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 5 40", ["d1d7"])
    for seed, plies in ((1, 10), (2, 17), (3, 24), (4, 31), (5, 40)):
        add(f"random game {plies} plies", None, _random_game(seed, plies))
    add("random game from fen", "8/8/3k4/8/8/5N2/1K2B3/8 w - - 20 60",
        _random_game(6, 20, "8/8/3k4/8/8/5N2/1K2B3/8 w - - 20 60"))
    return out


# --------------------------------------------------------------------------- running lc0

def command(position: dict) -> str:
    base = f"fen {position['fen']}" if position["fen"] else "startpos"
    return f"position {base}" + (" moves " + " ".join(position["moves"]) if position["moves"] else "")


def evaluate(lc0: str, weights: str, position: dict, history_fill_no: bool, timeout: float = 30.0) -> dict:
    """lc0's root V, D, M and each move's [index, P] at one node, from a fresh process."""
    script = ["uci", "setoption name VerboseMoveStats value true"]
    if history_fill_no:
        script.append("setoption name HistoryFill value no")
    if position["chess960"]:
        script.append("setoption name UCI_Chess960 value true")
    script += ["isready", command(position), "go nodes 1"]
    proc = subprocess.Popen([lc0, f"--weights={weights}", "--backend=eigen", "--threads=1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    found: dict = {}
    moves: dict = {}
    try:
        proc.stdin.write("\n".join(script) + "\n")
        proc.stdin.flush()
        for line in proc.stdout:
            node, move = _LC0_NODE.search(line), _LC0_MOVE.match(line)
            if node:
                found.update(v=float(node.group(3)), d=float(node.group(1)), m=float(node.group(2)))
            elif move:
                moves[move.group(1)] = [int(move.group(2)), float(move.group(3))]
            if line.startswith("bestmove"):
                break
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if "v" not in found or not moves:
        raise RuntimeError(f"lc0 said no node or move statistics for {command(position)}")
    return {**found, "moves": moves}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lc0", required=True, help="an lc0 v0.32.1 binary with the eigen backend")
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--formats", default=",".join(map(str, FORMATS)))
    args = parser.parse_args()
    formats = [int(f) for f in args.formats.split(",")]
    with open(FIXTURE, "rb") as f:
        data = gzip.decompress(f.read())
    assert input_format_of(data) == 1
    todo = positions()
    record = {"weights": os.path.basename(FIXTURE),
              "lc0": "v0.32.1, eigen backend, go nodes 1, VerboseMoveStats; HistoryFill no for formats 5 and 133, "
                     "lc0's default (fen_only) for the others; a fresh process per position",
              "policy_temperature": POLICY_TEMPERATURE, "positions": todo, "formats": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in formats:
            variant = with_input_format(data, fmt)
            assert input_format_of(variant) == fmt and with_input_format(variant, 1) == data
            weights = os.path.join(tmp, f"cyzero-3x16-input{fmt}.pb.gz")
            with open(weights, "wb") as f:
                f.write(gzip.compress(variant, mtime=0))
            results = []
            for position in todo:
                results.append(evaluate(args.lc0, weights, position, fmt in HISTORY_FILL_NO))
            record["formats"][str(fmt)] = results
            print(f"format {fmt}: {len(results)} positions", flush=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("{\n")
        head = {k: v for k, v in record.items() if k not in ("positions", "formats")}
        for k, v in head.items():
            f.write(f" {json.dumps(k)}: {json.dumps(v)},\n")
        f.write(' "positions": [\n' + ",\n".join("  " + json.dumps(p) for p in todo) + "\n ],\n")
        f.write(' "formats": {\n')
        f.write(",\n".join(f'  "{fmt}": [\n' + ",\n".join("   " + json.dumps(r, separators=(",", ":"))
                                                        for r in results) + "\n  ]"
                           for fmt, results in record["formats"].items()))
        f.write("\n }\n}\n")
    print(f"{os.path.getsize(args.out):,} bytes  {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
