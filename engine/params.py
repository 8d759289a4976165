"""Every search parameter, once: its name, type, default, range, unit and meaning.

:class:`SearchParams` is the single source. The tree's settings
(:meth:`SearchParams.tree_settings` -> ``engine.tree.Tree.configure``), the
UCI options (``uci.options`` declares one per parameter with a ``uci`` name),
the options table in docs/engine.md, the self-play configuration and the Python
reference search (``engine.tools.puct_reference``) all derive from it, so a
default is never written twice. See docs/architecture.md.

    >>> params = SearchParams(cpuct=2.0)            # checked: a bad value raises ValueError
    >>> params.tree_settings()["cpuct"]
    2.0
    >>> [p.uci for p in SearchParams.table()][:3]
    ['CPuct', 'CPuctBase', 'CPuctFactor']
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

__all__ = ["Param", "SearchParams", "markdown_table"]

Number = Union[int, float, bool]


@dataclass(frozen=True)
class Param:
    """One row of the table: what a parameter is and which values it takes."""

    name: str                 # the SearchParams attribute
    type: type                # int, float or bool
    default: Number
    min: Optional[float]      # inclusive bounds (None for bool)
    max: Optional[float]
    unit: str                 # "" for a pure number
    meaning: str              # one line, for docs/engine.md and `uci` help
    uci: Optional[str]        # the UCI option's name; None: not a UCI option
    tree: bool                # passed to engine.tree.Tree.configure

    def check(self, value: Any) -> Number:
        """``value`` converted to this parameter's type; ValueError naming the parameter if it does not fit."""
        label = self.uci or self.name
        if self.type is bool:
            if not isinstance(value, (bool, int)) or value not in (0, 1):
                raise ValueError(f"{label} must be true or false, got {value!r}")
            return bool(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{label} must be a number, got {value!r}")
        if self.type is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"{label} must be a whole number, got {value!r}")
            value = int(value)
        else:
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"{label} must be a finite number, got {value!r}")
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            raise ValueError(f"{label} must be within {self.min:g}..{self.max:g}, got {value:g}")
        return value


def _param(default: Number, lo: Optional[float], hi: Optional[float], unit: str, meaning: str,
           uci: Optional[str] = None, tree: bool = False) -> Any:
    return dataclasses.field(default=default, metadata=dict(
        min=lo, max=hi, unit=unit, meaning=meaning, uci=uci, tree=tree))


@dataclass(frozen=True)
class SearchParams:
    """The search's settings. Frozen: change one with :meth:`replace` (which checks it)."""

    # -- PUCT selection (lc0's defaults; the tree applies them) ------------------------------
    cpuct: float = _param(1.745, 0.0, 100.0, "", "exploration constant of PUCT below the root",
                          "CPuct", tree=True)
    cpuct_base: float = _param(38739.0, 1.0, 1e9, "visits", "visits at which cpuct has grown by cpuct_factor * ln 2",
                               "CPuctBase", tree=True)
    cpuct_factor: float = _param(3.894, 0.0, 1000.0, "", "how fast cpuct grows with the parent's visits (log)",
                                 "CPuctFactor", tree=True)
    cpuct_root: float = _param(1.745, 0.0, 100.0, "", "exploration constant of PUCT at the root",
                               "CPuctAtRoot", tree=True)
    cpuct_base_root: float = _param(38739.0, 1.0, 1e9, "visits", "cpuct_base at the root",
                                    "CPuctBaseAtRoot", tree=True)
    cpuct_factor_root: float = _param(3.894, 0.0, 1000.0, "", "cpuct_factor at the root",
                                      "CPuctFactorAtRoot", tree=True)
    fpu_value: float = _param(0.330, -100.0, 100.0, "Q units",
                              "first-play urgency: an unvisited move's Q is the parent's Q minus this "
                              "times sqrt(visited policy)", "FpuValue", tree=True)
    fpu_value_root: float = _param(0.330, -100.0, 100.0, "Q units", "fpu_value at the root",
                                   "FpuValueAtRoot", tree=True)
    policy_temperature: float = _param(1.359, 0.1, 10.0, "", "softmax temperature applied to the policy logits",
                                       "PolicyTemperature", tree=True)
    two_fold_draws: bool = _param(True, None, None, "", "a position repeated once inside the tree scores as a draw",
                                  "TwoFoldDraws", tree=True)
    # -- moves-left utility (lc0's MovesLeft* settings; off until a match says otherwise) -------
    moves_left_max_effect: float = _param(0.0, 0.0, 1.0, "Q units",
                                          "cap of the moves-left utility added to a child's score: when "
                                          "abs(Q) is past the threshold, shorter wins and longer losses are "
                                          "preferred (0: off; lc0: 0.0345)", "MovesLeftMaxEffect", tree=True)
    moves_left_threshold: float = _param(0.8, 0.0, 0.999, "Q units", "the utility applies where the position's "
                                         "abs(Q) exceeds this", "MovesLeftThreshold", tree=True)
    moves_left_slope: float = _param(0.0027, 0.0, 1.0, "Q units per ply",
                                     "utility per ply of difference between a child's moves left and "
                                     "its parent's", "MovesLeftSlope", tree=True)
    moves_left_constant_factor: float = _param(0.0, -10.0, 10.0, "", "utility scale: constant term",
                                               "MovesLeftConstantFactor", tree=True)
    moves_left_scaled_factor: float = _param(1.6521, -10.0, 10.0, "", "utility scale: term in abs(Q) past "
                                             "the threshold", "MovesLeftScaledFactor", tree=True)
    moves_left_quadratic_factor: float = _param(-0.6521, -10.0, 10.0, "", "utility scale: term in the "
                                                "square of that", "MovesLeftQuadraticFactor", tree=True)
    # -- root noise and move choice (self-play) -----------------------------------------------
    noise_epsilon: float = _param(0.0, 0.0, 1.0, "share", "weight of Dirichlet noise mixed into the root priors "
                                  "(AlphaZero self-play: 0.25)", "NoiseEpsilon", tree=True)
    noise_alpha: float = _param(0.3, 0.001, 100.0, "", "Dirichlet alpha of the root noise (AlphaZero chess: 0.3)",
                                "NoiseAlpha", tree=True)
    temperature: float = _param(0.0, 0.0, 100.0, "", "> 0: play a move drawn with probability visits^(1/T)",
                                "Temperature")
    temp_cutoff_ply: int = _param(0, 0, 10000, "plies", "from this ply of the game on, play the most visited "
                                  "move (0: never; AlphaZero samples the first 30 plies)", "TempCutoffPly")
    seed: int = _param(0, 0, 2**31 - 1, "", "random seed of noise and temperature (0: a new one each game)", "Seed")
    # -- the search loop --------------------------------------------------------------------
    minibatch_size: int = _param(0, 0, 4096, "positions", "most leaves sent to the network in one batch "
                                 "(0: the backend's choice: 8 on the CPU, the network's largest batch size "
                                 "on a GPU)", "MinibatchSize")
    search_threads: int = _param(1, 1, 16, "threads", "threads gathering leaves into the one tree, each with "
                                 "its own batch at the network (ONNX Runtime's own threads are Threads); "
                                 "more than 1 was no faster on the CPU or the GPU stand-in, and a fixed-node "
                                 "search no longer repeats", "SearchThreads")
    multipv: int = _param(1, 1, 500, "lines", "root moves reported in each info; above 1, each of the best "
                          "N moves gets at least a 2N-th of the root's visits, so that every line is searched, "
                          "and smart pruning is off", "MultiPV", tree=True)
    smart_pruning_factor: float = _param(1.33, 0.0, 10.0, "",
                                         "stop early when no other move can catch the best one at this "
                                         "speed-up (0: off)", "SmartPruningFactor")
    nn_cache_size: int = _param(200_000, 0, 100_000_000, "positions", "network evaluations kept for reuse",
                                "NNCacheSize")
    hash_mb: int = _param(256, 1, 1 << 20, "MiB", "memory the search tree may use", "Hash")
    move_overhead_ms: int = _param(50, 0, 10_000, "ms", "time the GUI and network take per move, "
                                   "kept off every budget", "Move Overhead")
    time_extension: bool = _param(True, None, None, "", "go on past the time target, up to the hard limit, "
                                  "while the best move is unstable", "TimeExtension")

    def __post_init__(self) -> None:
        for row in self.table():
            object.__setattr__(self, row.name, row.check(getattr(self, row.name)))

    @classmethod
    def table(cls) -> list[Param]:
        """The parameters in declaration order."""
        return [Param(f.name, _TYPES[f.type], f.default, f.metadata["min"], f.metadata["max"],
                      f.metadata["unit"], f.metadata["meaning"], f.metadata["uci"], f.metadata["tree"])
                for f in dataclasses.fields(cls)]

    @classmethod
    def row(cls, name: str) -> Param:
        """The table row of ``name`` (KeyError if there is none)."""
        for row in cls.table():
            if row.name == name:
                return row
        raise KeyError(name)

    def replace(self, **changes: Any) -> "SearchParams":
        """A copy with ``changes`` applied and checked (unknown names raise ValueError)."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown search parameter(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)

    def tree_settings(self) -> dict[str, Number]:
        """The settings ``engine.tree.Tree.configure`` takes, by name."""
        return {row.name: getattr(self, row.name) for row in self.table() if row.tree}

    @classmethod
    def from_uci(cls, value_of: Callable[[str], Any]) -> "SearchParams":
        """Build from UCI option values: ``value_of(uci_name)`` returns each option's current value."""
        return cls(**{row.name: value_of(row.uci) for row in cls.table() if row.uci is not None})


# dataclasses.fields() gives annotations as strings under `from __future__ import annotations`.
_TYPES = {"float": float, "int": int, "bool": bool}


def markdown_table() -> str:
    """The table of search parameters as Markdown: docs/engine.md holds it between its
    ``params-table`` markers, and tests/test_params.py keeps the two equal."""
    lines = ["| UCI option | type | default | range | unit | meaning |",
             "|---|---|---|---|---|---|"]
    for row in SearchParams.table():
        name = f"`{row.uci}`" if row.uci else f"`{row.name}` (not a UCI option)"
        span = "true, false" if row.type is bool else f"{_shown(row.min)} .. {_shown(row.max)}"
        meaning = row.meaning.replace("|", "\\|")
        lines.append(f"| {name} | {row.type.__name__} | {_shown(row.default)} | {span} | {row.unit} | {meaning} |")
    return "\n".join(lines)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
