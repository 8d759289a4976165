"""The openings of a match: the bundled set (``engine/tools/openings.txt``), or lines of
``ECO | name | SAN moves``, FEN / EPD positions, or a PGN file."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Optional

import chess
import chess.pgn

from engine.tools.match_types import MatchError, Opening

OPENINGS_PATH = Path(__file__).with_name("openings.txt")


_MOVE_NUMBER = re.compile(r"\d+\.(\.\.)?|\d+\.\.\.")


def _parse_san_moves(board: chess.Board, text: str) -> tuple:
    moves = []
    for token in text.split():
        token = _MOVE_NUMBER.sub("", token)
        if not token:
            continue
        moves.append(board.push_san(token))  # raises ValueError for illegal / ambiguous moves
    return tuple(moves)


def parse_openings(text: str, source: str = "<openings>") -> list[Opening]:
    """Openings from text: one a line, ``ECO | name | SAN moves`` or a FEN / EPD position.

    Blank lines and lines starting with ``#`` are skipped. An EPD line may name
    itself with an ``id`` operation. A PGN text (one that has ``[`` tags) is read
    game by game: the FEN tag and the main line of moves.
    """
    if re.search(r"^\s*\[\w+\s+\"", text, re.MULTILINE):
        return _parse_pgn_openings(text, source)
    openings = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        try:
            if "|" in line:
                fields = [f.strip() for f in line.split("|")]
                if len(fields) != 3:
                    raise ValueError("expected 'ECO | name | moves'")
                eco, name, moves_text = fields
                board = chess.Board()
                moves = _parse_san_moves(board, moves_text)
                openings.append(Opening(name=name or moves_text, eco=eco, moves=moves))
            else:
                try:
                    board = chess.Board(line)
                    name = line
                except ValueError:
                    board, ops = chess.Board.from_epd(line)
                    name = str(ops.get("id") or board.fen())
                if not board.is_valid():
                    raise ValueError(f"not a valid position: {board.status()!r}")
                openings.append(Opening(name=name, fen=board.fen()))
        except ValueError as e:
            raise MatchError(f"{where}: cannot read opening {line!r}: {e}") from None
    return openings


def _parse_pgn_openings(text: str, source: str) -> list[Opening]:
    openings = []
    stream = io.StringIO(text)
    while True:
        game = chess.pgn.read_game(stream)
        if game is None:
            break
        if game.errors:
            raise MatchError(f"{source}: game {len(openings) + 1}: {game.errors[0]}")
        start = game.board()
        fen = None if start == chess.Board() else start.fen()
        h = game.headers
        name = h.get("Opening") or h.get("Event") or f"{source} #{len(openings) + 1}"
        openings.append(Opening(name=name, eco=h.get("ECO", ""), fen=fen, moves=tuple(game.mainline_moves())))
    return openings


def load_openings(path: Optional[str | os.PathLike] = None) -> list[Opening]:
    """The openings in ``path`` (default: the bundled set); each must leave a game still to play."""
    path = Path(path) if path is not None else OPENINGS_PATH
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise MatchError(f"cannot read openings {str(path)!r}: {e.strerror or e}") from None
    openings = parse_openings(text, str(path))
    if not openings:
        raise MatchError(f"no openings in {str(path)!r}")
    for opening in openings:
        board = opening.board()
        if board.is_game_over(claim_draw=True):
            raise MatchError(f"{str(path)!r}: opening {opening.name!r} is already decided")
    return openings
