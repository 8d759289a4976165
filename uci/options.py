"""UCI options: declarations, case-insensitive lookup, and value checking.

Each option knows how to declare itself (``option name ... type ...``) and how
to parse the text a GUI sends in ``setoption``; a bad value raises
``ValueError`` with a message for ``info string error: ...`` and leaves the
current value as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from engine.params import Param, SearchParams
from engine.processor import usable_cores

# The bundled network: an empty WeightsFile, declared `default <empty>` as Stockfish declares its
# empty strings (a `<default>` came back from python-chess as '>': its option parser splits on the
# word "default"). `<default>` is still read as the bundled network.
DEFAULT_WEIGHTS = ""
# NodesPerMove's largest value: far beyond any tree that fits in memory, within a GUI's 32-bit spin.
MAX_NODES_PER_MOVE = 1_000_000_000


@dataclass
class Option:
    name: str
    kind: str                      # check, spin, combo, string, button
    default: Any
    min: Optional[float] = None    # spin: int bounds; float options (declared as string): float bounds
    max: Optional[float] = None
    choices: tuple[str, ...] = ()
    is_float: bool = False         # declared as "type string" (as lc0 does for floats), parsed as float
    value: Any = field(init=False)

    def __post_init__(self) -> None:
        self.value = self.default

    def declaration(self) -> str:
        if self.kind == "button":
            return f"option name {self.name} type button"
        text = f"option name {self.name} type {self.kind} default {self._show(self.default)}"
        if self.kind == "spin":
            text += f" min {int(self.min)} max {int(self.max)}"
        for choice in self.choices:
            text += f" var {choice}"
        return text

    @staticmethod
    def _show(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return f"{value:g}"
        return str(value) if value != "" else "<empty>"

    def parse(self, text: Optional[str]) -> Any:
        """The value ``text`` stands for; ValueError (naming the option) if it is not valid."""
        text = "" if text is None else text.strip()
        if self.kind == "button":
            return True
        if self.kind == "check":
            low = text.lower()
            if low in ("true", "1", "on", "yes"):
                return True
            if low in ("false", "0", "off", "no"):
                return False
            raise ValueError(f"option {self.name} takes true or false, not {text!r}")
        if self.kind == "spin":
            try:
                number = int(text)
            except ValueError:
                try:
                    as_float = float(text)
                except ValueError:
                    raise ValueError(f"option {self.name} takes a whole number, not {text!r}") from None
                if not as_float.is_integer():
                    raise ValueError(f"option {self.name} takes a whole number, not {text!r}") from None
                number = int(as_float)
            if not self.min <= number <= self.max:
                raise ValueError(f"option {self.name} must be within {int(self.min)}..{int(self.max)}, got {number}")
            return number
        if self.kind == "combo":
            for choice in self.choices:
                if choice.lower() == text.lower():
                    return choice
            raise ValueError(f"option {self.name} must be one of {', '.join(self.choices)}, not {text!r}")
        if self.is_float:
            try:
                number = float(text)
            except ValueError:
                raise ValueError(f"option {self.name} takes a number, not {text!r}") from None
            if number != number or number in (float("inf"), float("-inf")):
                raise ValueError(f"option {self.name} takes a finite number, not {text!r}")
            if (self.min is not None and number < self.min) or (self.max is not None and number > self.max):
                raise ValueError(f"option {self.name} must be within {self.min:g}..{self.max:g}, got {number:g}")
            return number
        if text == "<empty>":
            return ""
        return text


def search_option(row: Param) -> Option:
    """The UCI option of one search parameter (floats are declared as strings, as lc0 does)."""
    if row.type is bool:
        return Option(row.uci, "check", row.default)
    if row.type is int:
        return Option(row.uci, "spin", row.default, row.min, row.max)
    return Option(row.uci, "string", row.default, row.min, row.max, is_float=True)


def default_threads() -> int:
    """ONNX Runtime threads on the CPU: one core fewer than the engine may use (at most 4), so
    that the search thread and the reader of stop always find a core. With both cores of a
    2-core machine given to ONNX Runtime, `cyzero bench uci` measured stop -> bestmove p99
    4.3 ms; with one, 0.7 ms, for 10% fewer nodes/s."""
    return max(1, min(usable_cores() - 1, 4))   # what a tournament manager's pinning leaves


def engine_options() -> list[Option]:
    """Every option cyzero declares, with valid defaults (lichess-bot's defaults all fit).

    The search's options come from :class:`engine.params.SearchParams`, the
    one table of search parameters; the rest choose the network and the protocol.
    """
    return [
        Option("WeightsFile", "string", DEFAULT_WEIGHTS),
        # Which heads of an lc0 multihead network (Leela's transformers) play, as lc0's backend
        # options policy_head and value_head choose them; other networks have one of each.
        Option("ValueHead", "string", "winner"),
        Option("PolicyHead", "string", "vanilla"),
        Option("Backend", "combo", "auto", choices=("auto", "cuda", "tensorrt", "openvino", "cpu")),
        Option("GPU", "spin", 0, 0, 15),
        Option("Threads", "spin", default_threads(), 1, 512),
        Option("Ponder", "check", False),
        # Caps the nodes of every move (0: no cap), for GUIs and bots that send only clocks:
        # 1 plays the network's top policy move after one evaluation, as lc0 plays Maia with
        # `go nodes 1` (but a mate in one, found at the root, is played). `go nodes N` searches min(N, cap); `go infinite` is not capped (the
        # rule: engine.limits.GoParams.with_node_cap). Not lc0's: lc0 has no such option.
        Option("NodesPerMove", "spin", 0, 0, MAX_NODES_PER_MOVE),
        Option("UCI_ShowWDL", "check", False),
        Option("UCI_Chess960", "check", False),
        Option("UCI_AnalyseMode", "check", False),
        Option("SyzygyPath", "string", ""),
        Option("OwnBook", "check", False),
        Option("BookFile", "string", ""),
        Option("TrainerEndpoint", "string", ""),
        Option("TrainerKeys", "string", ""),
        Option("Clear Hash", "button", None),
        *(search_option(row) for row in SearchParams.table() if row.uci is not None),
    ]


class Options:
    """The option set: lookup by name ignoring case (names may contain spaces)."""

    def __init__(self, options: Optional[list[Option]] = None) -> None:
        self._by_key = {opt.name.lower(): opt for opt in (options or engine_options())}

    def __iter__(self):
        return iter(self._by_key.values())

    def find(self, name: str) -> Optional[Option]:
        return self._by_key.get(" ".join(name.split()).lower())

    def __getitem__(self, name: str) -> Any:
        opt = self.find(name)
        if opt is None:
            raise KeyError(name)
        return opt.value

    def set(self, name: str, text: Optional[str]) -> Option:
        """Parse and store a value; ValueError (value unchanged) if the name or value is bad."""
        opt = self.find(name)
        if opt is None:
            raise ValueError(f"unknown option {name!r}")
        opt.value = opt.parse(text)
        return opt
