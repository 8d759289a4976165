"""Positions for screening search settings, each legal move scored by Stockfish.

Games of Stockfish against itself at 3,000 nodes a move, from the match openings, each
move drawn among its MultiPV-3 moves within 0.6 pawns of the best (varied, sensible
play); from ply 12 on, one position in every 5 to 9 plies is kept with every legal
move's score at depth 11 (MultiPV over all moves). Appends JSON lines
``{"fen": ..., "cp": {uci: centipawns for the side to move}}``.

    python docs/recipes/settings-positions.py SEED GAMES OUT.jsonl [STOCKFISH]

About one position a second per process on one core of the development machine.
"""
import json
import random
import sys
from pathlib import Path

import chess
import chess.engine

OPENINGS = Path(__file__).resolve().parents[2] / "engine" / "tools" / "openings.txt"


def main() -> None:
    seed, games, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    rng = random.Random(seed)
    openings = [[t for t in line.split("|")[2].split() if not t[0].isdigit()]
                for line in OPENINGS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    sf = chess.engine.SimpleEngine.popen_uci(sys.argv[4] if len(sys.argv) > 4 else "/usr/games/stockfish")
    sf.configure({"Threads": 1, "Hash": 32})
    with open(out, "a") as f:
        for _ in range(games):
            board = chess.Board()
            for san in rng.choice(openings):
                board.push_san(san)
            wait = rng.randrange(4, 9)
            while not board.is_game_over(claim_draw=True) and board.ply() < 160:
                lines = sf.analyse(board, chess.engine.Limit(nodes=3000), multipv=3)
                best = lines[0]["score"].relative.score(mate_score=10000)
                near = [i["pv"][0] for i in lines if best - i["score"].relative.score(mate_score=10000) <= 60]
                if board.ply() >= 12 and wait <= 0:
                    wait = rng.randrange(5, 10)
                    n = board.legal_moves.count()
                    if n >= 2:
                        scored = sf.analyse(board, chess.engine.Limit(depth=11), multipv=n)
                        cp = {i["pv"][0].uci(): i["score"].relative.score(mate_score=10000) for i in scored}
                        f.write(json.dumps({"fen": board.fen(), "cp": cp}) + "\n")
                        f.flush()
                wait -= 1
                board.push(rng.choice(near))
    sf.quit()


if __name__ == "__main__":
    main()
