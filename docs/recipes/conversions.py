"""Which games cyzero had won by its opponent's own reckoning, and what became of them.

    python docs/recipes/conversions.py [--pawns 3] GAMES.pgn ...

Reads ``cyzero match --pgn`` files (each move's comment holds the mover's score, "+1.25/12
0.301s" or "+M3/..."). A game counts as *won on the board* when the opponent's own
search saw itself ``--pawns`` or more behind (or mated) after one of its moves. Prints,
per file, cyzero's score over all games, then how those won-on-the-board games ended
(W-D-L) and how their draws came about. Why: PROVENANCE's "Won games not won" asks how
many points are lost after the game is won, not before; this counts them from the games
themselves, with the stronger engine's eyes.
"""
import argparse
import collections
import re

import chess
import chess.pgn

_SCORE = re.compile(r"\s*([+-]?)(M?)([\d.]+)/")


def _advantage(node: chess.pgn.ChildNode) -> float | None:
    """The mover's score in pawns from the move's comment (a mate counts as 100)."""
    m = _SCORE.match(node.comment or "")
    if not m:
        return None
    value = 100.0 if m.group(2) else float(m.group(3))
    return -value if m.group(1) == "-" else value


def summarise(path: str, pawns: float) -> str:
    games = 0
    total = 0.0
    won_on_board = collections.Counter()
    draws = collections.Counter()
    with open(path) as handle:
        while (game := chess.pgn.read_game(handle)) is not None:
            cyzero_white = game.headers.get("White", "").startswith("cyzero")
            result = {"1-0": 1.0, "0-1": 0.0}.get(game.headers.get("Result", ""), 0.5)
            score = result if cyzero_white else 1.0 - result
            games += 1
            total += score
            best = max((-v for node in game.mainline()
                        if (v := _advantage(node)) is not None
                        and node.board().turn == cyzero_white),     # the opponent just moved
                       default=0.0)
            if best >= pawns:
                won_on_board[score] += 1
                if score == 0.5:
                    outcome = game.end().board().outcome(claim_draw=True)
                    draws[outcome.termination.name.lower() if outcome else "adjudicated"] += 1
    n = sum(won_on_board.values())
    return (f"{path}: {games} games, cyzero {total:g} points ({100 * total / max(1, games):.1f}%); "
            f"won on the board in {n}: {won_on_board[1.0]}-{won_on_board[0.5]}-{won_on_board[0.0]} "
            f"(W-D-L), {won_on_board[1.0] + 0.5 * won_on_board[0.5]:g} of {n} points; draws: "
            + (", ".join(f"{k} {v}" for k, v in sorted(draws.items())) or "none"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pawns", type=float, default=3.0,
                        help="the opponent's own deficit that counts as won (default 3)")
    parser.add_argument("pgn", nargs="+")
    args = parser.parse_args()
    for path in args.pgn:
        print(summarise(path, args.pawns))


if __name__ == "__main__":
    main()
