"""UCI text in and out: parsing ``position``/``go``/``setoption`` and writing ``info``/``bestmove``.

Parsers raise ``ValueError`` with a message that says what was wrong; the
session turns it into one ``info string error: ...`` line. ``go`` is read
leniently (:func:`read_go`): a malformed argument is named and left out, and the
rest is searched, so that every ``go`` gets its ``bestmove``. Writers produce
integers only, with ``pv`` last, so every client can parse them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from engine.limits import GoParams
from engine.search_report import Info, SearchResult

STARTPOS = "startpos"

_GO_INT_FIELDS = ("wtime", "btime", "winc", "binc", "movestogo", "movetime", "nodes", "depth", "mate")
_GO_FLAGS = ("infinite", "ponder")
_GO_KEYWORDS = set(_GO_INT_FIELDS) | set(_GO_FLAGS) | {"searchmoves"}
# A go whose every limit was malformed searches this long (ms): every go gets its bestmove.
FALLBACK_MOVETIME_MS = 1000


def parse_position(tokens: list[str]) -> tuple[Optional[str], list[str]]:
    """``position startpos|fen <FEN> [moves ...]`` (tokens after ``position``) -> (fen or None, moves).

    A FEN missing its move counters gets ``0 1``.
    """
    if not tokens:
        raise ValueError("position needs 'startpos' or 'fen <FEN>'")
    head = tokens[0].lower()
    rest = tokens[1:]
    if "moves" in rest:
        cut = rest.index("moves")
        fen_tokens, moves = rest[:cut], rest[cut + 1:]
    else:
        fen_tokens, moves = rest, []
    if head == STARTPOS:
        if fen_tokens:
            raise ValueError(f"unexpected {' '.join(fen_tokens)!r} after 'position startpos'")
        return None, moves
    if head != "fen":
        raise ValueError(f"position needs 'startpos' or 'fen <FEN>', got {tokens[0]!r}")
    if not fen_tokens:
        raise ValueError("position fen needs a FEN")
    if len(fen_tokens) > 6:
        raise ValueError(f"position fen has {len(fen_tokens)} fields; a FEN has at most 6")
    fields = list(fen_tokens)
    if len(fields) == 4:
        fields += ["0", "1"]
    elif len(fields) == 5:
        fields += ["1"]
    return " ".join(fields), moves


def parse_go(tokens: list[str]) -> GoParams:
    """``go ...`` (tokens after ``go``) -> GoParams; ValueError on the first malformed argument."""
    go, problems = read_go(tokens)
    if problems:
        raise ValueError(problems[0])
    return go


def read_go(tokens: list[str]) -> tuple[GoParams, list[str]]:
    """``go ...`` (tokens after ``go``) -> (GoParams, problems): every malformed argument is left out
    and named in ``problems``; what is left is still a search (:func:`go_to_search`)."""
    go = GoParams()
    problems: list[str] = []
    i = 0
    while i < len(tokens):
        word = tokens[i].lower()
        if word in _GO_FLAGS:
            setattr(go, word, True)
            i += 1
        elif word in _GO_INT_FIELDS:
            if i + 1 >= len(tokens) or tokens[i + 1].lower() in _GO_KEYWORDS:
                problems.append(f"go {word} needs a number")
                i += 1
                continue
            text = tokens[i + 1]
            i += 2
            value = _whole_number(text)
            if value is None:
                problems.append(f"go {word} needs a whole number, got {text!r}")
            elif value < 0:   # a negative clock or movetime too: said and left out, never played at once
                problems.append(f"go {word} must not be negative, got {value}")
            else:
                setattr(go, word, value)
        elif word == "searchmoves":
            i += 1
            while i < len(tokens) and tokens[i].lower() not in _GO_KEYWORDS:
                go.searchmoves.append(tokens[i])
                i += 1
        else:
            problems.append(f"unknown go argument {tokens[i]!r}")
            i += 1
    return go, problems


def _whole_number(text: str) -> Optional[int]:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return int(float(text))      # "12.7" -> 12; "nan" and "inf" are no number of ms or nodes
    except (ValueError, OverflowError):
        return None


def go_to_search(go: GoParams) -> GoParams:
    """The go to search after malformed arguments were left out: when nothing is left that ends the
    search (a clock, ``movetime``, ``nodes``, ``depth``) or asks for one without end (``infinite``,
    ``ponder``), it gets ``movetime`` :data:`FALLBACK_MOVETIME_MS`, so that the GUI still gets its
    ``bestmove``."""
    limits = (go.wtime, go.btime, go.movetime, go.nodes, go.depth)
    if go.infinite or go.ponder or any(v is not None for v in limits):
        return go
    return replace(go, movetime=FALLBACK_MOVETIME_MS)


def format_go(go: GoParams) -> str:
    """``go`` as UCI text (what the engine searches, said back after a malformed ``go``)."""
    words = ["go"]
    for name in _GO_INT_FIELDS:
        value = getattr(go, name)
        if value is not None:
            words += [name, str(value)]
    words += [flag for flag in _GO_FLAGS if getattr(go, flag)]
    if go.searchmoves:
        words += ["searchmoves", *go.searchmoves]
    return " ".join(words)


def parse_setoption(text: str) -> tuple[str, Optional[str]]:
    """``setoption name <N...> [value <V...>]`` (text after ``setoption``) -> (name, value)."""
    words = text.split()
    if not words or words[0].lower() != "name":
        raise ValueError("setoption needs 'name <option>'")
    lowered = [w.lower() for w in words]
    if "value" in lowered[1:]:
        cut = lowered.index("value", 1)
        name, value = " ".join(words[1:cut]), " ".join(words[cut + 1:])
    else:
        name, value = " ".join(words[1:]), None
    if not name:
        raise ValueError("setoption needs an option name")
    return name, value


def format_info(info: Info, show_wdl: bool) -> list[str]:
    """One ``info`` line per MultiPV line (or a bare progress line when there is none)."""
    head = f"info depth {info.depth} seldepth {info.seldepth}"
    tail = f"nodes {info.nodes} nps {info.nps} time {info.time_ms}"
    if not info.lines:
        return [f"{head} {tail}"]
    out = []
    for line in info.lines:
        score = f"score mate {line.mate}" if line.mate is not None else f"score cp {line.cp}"
        wdl = f" wdl {line.wdl[0]} {line.wdl[1]} {line.wdl[2]}" if show_wdl else ""
        out.append(f"{head} multipv {line.multipv} {score}{wdl} {tail} pv {' '.join(line.pv)}")
    return out


def format_result(result: SearchResult, checkmated: bool) -> list[str]:
    """The lines that end a search, ``bestmove`` last.

    A search that could not run says why and answers the null move ``0000``,
    never an invented move. A root without a legal move gets Stockfish's
    ``info depth 0 score mate 0`` (``checkmated``) or ``score cp 0``
    (stalemate) first, so that a GUI still sees the game's result.
    """
    if result.error:
        reason = result.error.splitlines() or [""]
        return [f"info string error: {line}" for line in reason] + ["bestmove 0000"]
    if result.best is None:
        return [f"info depth 0 score {'mate 0' if checkmated else 'cp 0'}", "bestmove (none)"]
    if result.ponder:
        return [f"bestmove {result.best} ponder {result.ponder}"]
    return [f"bestmove {result.best}"]
