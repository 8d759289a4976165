"""The games of a match as PGN: headers, the opening marked as book, each move's score, depth and time."""

from __future__ import annotations

from typing import Iterable

import chess
import chess.pgn

from engine.files import atomic_open
from engine.tools.match_types import EngineSpec, GameRecord, MatchConfig, TimeControl


def engine_limit(tc: TimeControl, spec: EngineSpec) -> str:
    """One engine's limit in words: the match's, with its own nodes (``10+0.1, nodes=1``)."""
    if spec.nodes is None:
        return str(tc)
    if tc.kind == "nodes":
        return f"nodes={spec.nodes}"
    return f"{tc}, nodes={spec.nodes}"


def game_to_pgn(record: GameRecord, config: MatchConfig, date: str = "????.??.??") -> chess.pgn.Game:
    game = chess.pgn.Game()
    h = game.headers
    h["Event"] = config.event
    h["Site"] = "cyzero match"
    h["Date"] = date
    h["Round"] = str(record.index + 1)
    h["White"] = record.white
    h["Black"] = record.black
    h["Result"] = record.result
    opening = record.opening
    if opening.fen is not None:
        game.setup(opening.start_board())  # FEN and SetUp tags
    if opening.eco:
        h["ECO"] = opening.eco
    h["Opening"] = opening.name
    h["TimeControl"] = config.time_control.pgn_tag()
    if config.time_control.kind != "clock":
        h["SearchLimit"] = str(config.time_control)
    if config.engine1.nodes is not None or config.engine2.nodes is not None:
        white, black = (config.engine1, config.engine2) if record.engine1_white else (config.engine2, config.engine1)
        h["WhiteSearchLimit"] = engine_limit(config.time_control, white)
        h["BlackSearchLimit"] = engine_limit(config.time_control, black)
    h["Termination"] = record.termination
    h["PlyCount"] = str(len(opening.moves) + len(record.moves))
    node = game
    for move in opening.moves:
        node = node.add_variation(move)
    if opening.moves:
        node.comment = "book"
    for move, comment in zip(record.moves, record.comments):
        node = node.add_variation(move)
        node.comment = comment
    node.comment = f"{node.comment}; {record.reason}" if node.comment else record.reason
    return game


def pgn_text(record: GameRecord, config: MatchConfig, date: str = "????.??.??") -> str:
    exporter = chess.pgn.StringExporter(headers=True, variations=True, comments=True)
    return game_to_pgn(record, config, date).accept(exporter) + "\n\n"




def write_pgn(path: str, games: Iterable[GameRecord], config: MatchConfig, date: str = "????.??.??") -> None:
    """Write all games at once, atomically (:func:`engine.files.atomic_open`)."""
    with atomic_open(path, "w") as f:
        for record in games:
            f.write(pgn_text(record, config, date))
