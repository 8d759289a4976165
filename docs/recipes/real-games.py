"""Games between Stockfish levels: real positions, with their history, for precision checks.

    python docs/recipes/real-games.py OUT.pgn GAMES SEED

Each game starts with 0-3 random legal plies from the standard position, then Debian's
stockfish plays both sides at a UCI_Elo drawn from 1400-2800 for each side, 20 ms a move,
until the game ends or 160 plies. ``tests/data/stockfish-games.pgn`` (seed 1) is what the
backend parity tests read (``tests/real_positions.py``); a second set with another seed
calibrates the int8 export (``trainer/export.py``), so no position is both.
Why not random games: a random game's positions (material hanging everywhere, kings in
the open) are not what the engine meets, and a quantized network's errors there say
little about its errors in play.
"""
import random
import sys

import chess
import chess.engine
import chess.pgn


def main(out: str, games: int, seed: int) -> None:
    rng = random.Random(seed)
    engine = chess.engine.SimpleEngine.popen_uci("/usr/games/stockfish")
    engine.configure({"Threads": 1, "Hash": 16, "UCI_LimitStrength": True})
    with open(out, "w", encoding="utf-8") as f:
        for number in range(games):
            board = chess.Board()
            for _ in range(rng.randrange(4)):
                board.push(rng.choice(list(board.legal_moves)))
            elos = {chess.WHITE: rng.randrange(1400, 2801), chess.BLACK: rng.randrange(1400, 2801)}
            while not board.is_game_over(claim_draw=True) and board.ply() < 160:
                engine.configure({"UCI_Elo": elos[board.turn]})
                board.push(engine.play(board, chess.engine.Limit(time=0.02)).move)
            game = chess.pgn.Game.from_board(board)
            game.headers.update(Event=f"real-games seed {seed}", Round=str(number + 1),
                                White=f"Stockfish {elos[chess.WHITE]}", Black=f"Stockfish {elos[chess.BLACK]}")
            print(game, file=f, end="\n\n")
    engine.quit()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
