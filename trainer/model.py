"""The PyTorch network: an SE-ResNet like lc0's "classical" networks.

Shape of the network (``B`` blocks of ``F`` filters, named ``"BxF"``)::

    planes [N,112,8,8]
      -> input scaling (rule50 plane / 100, every other plane as it is)
      -> stem: conv 3x3 (112 -> F), batch norm, ReLU
      -> B residual blocks: conv 3x3, BN, ReLU, conv 3x3, BN, SE unit, + skip, ReLU
      -> policy head: conv 3x3 (F -> F), BN, ReLU, conv 3x3 (F -> 73) with bias,
                      gathered into the 1858 policy entries (lc0's "conv policy")
         or ("fc")    conv 1x1 (F -> 32), BN, ReLU, linear 2048 -> 1858
      -> value head:  conv 1x1 (F -> 32), BN, ReLU, linear 2048 -> 128, ReLU, linear 128 -> 3
      -> moves left:  conv 1x1 (F -> 8), BN, ReLU, linear 512 -> 128, ReLU, linear 128 -> 1,
                      softplus (so never negative); optional

The sizes of the heads' convolutions and hidden layers are :class:`NetConfig` fields (the
defaults above are lc0's). So are three switches that exist for networks imported from lc0
files (:mod:`trainer.lc0_import`): ``se=False`` (residual blocks without the SE unit),
``activation="mish"`` (Mish instead of ReLU everywhere ReLU is above, the SE unit's hidden
layer included) and ``mlh_activation="relu"`` (the moves-left head ends in ReLU, as lc0's
does, instead of softplus). Their defaults leave a config's dict, a checkpoint and an export
as they were before the fields existed (:meth:`NetConfig.to_dict` leaves them out at their
defaults).

The attention body (``"bt-EMBxLAYERSxHEADSh"``, ``NetConfig.body = "attention"``) is lc0's BT3/BT4
structure, computed as lc0 v0.32.1's CPU backend computes it (engine/lc0.py builds the same graph from
an lc0 file; :mod:`trainer.lc0_export` writes one)::

    planes [N,112,8,8] -> [N, 64 squares, 112] (rule50 scaled as above)
      -> PE-dense embedding: the first 12 planes of all squares -> linear -> P channels per square;
         concat, linear (-> E), Mish, layer norm; input gates x * mult_gate + add_gate ([64, E]);
         embedding FFN (E -> 2E -> E), DeepNorm skip and layer norm
      -> L encoder layers: multi-head attention (H heads, smolgen's 64x64 bias per head from the
         compressed squares and the net-wide generator), then the FFN, each branch scaled by
         DeepNorm's alpha = (2L)^-1/4 before its skip and layer norm (epsilon 1e-3, post-norm)
      -> attention policy: per-square embedding (Mish), queries and keys, from-to dot products and
         the promotion offsets, gathered into the 1858 moves
      -> value: per-square linear (-> 32), flattened, 128, 3 WDL logits; moves left likewise (-> 8,
         128, 1, ReLU as lc0's)

The squeeze-excitation unit is lc0's: global average pool -> linear (F -> F/r) ->
ReLU -> linear (F/r -> 2F) split into ``gamma`` and ``beta``, and the block's output
is ``sigmoid(gamma) * x + beta``.

:meth:`Net.forward` returns raw logits for policy *and* WDL (what the training loss
wants); :class:`InferenceNet` wraps a :class:`Net` with the network contract of
``docs/contracts.md`` ("The network": WDL softmaxed in the graph, named outputs) and is what
:mod:`trainer.export` exports.

Why the rule50 plane is scaled inside the graph: the contract feeds it raw (0..100
plies), every other plane is 0 or 1. Scaling it to [0, 1] before the first
convolution keeps the stem's input in one small range, which int8 quantization of
that input needs (one scale for the whole tensor); it costs one elementwise Mul.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.encoding import PLANES, POLICY_SIZE
from trainer.checkpoints import read_checkpoint
from trainer.records import HECTOPLIES_FORMATS  # the rule50 plane in hundreds of plies
from engine.lc0 import move_plane
from engine.network import MLH_NAME, POLICY_NAME, WDL_NAME

RULE50_PLANE = 109
RULE50_SCALE = 1.0 / 100.0

#: output channels of the conv policy head: 56 queen-line (8 directions x 7
#: distances) + 8 knight + 9 promotion planes (3 directions x q, r, b).
CONV_POLICY_PLANES = 73

_NAME_RE = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$", re.IGNORECASE)
_BODY_NAME_RE = re.compile(r"^\s*bt-(\d+)x(\d+)x(\d+)h\s*$", re.IGNORECASE)
_POLICY_HEADS = ("conv", "fc", "attention")
_ACTIVATIONS = ("relu", "mish")
_MLH_ACTIVATIONS = ("softplus", "relu")
#: The attention body's FFN and smolgen activations (net.proto's ActivationFunction names).
_BODY_ACTIVATIONS = ("mish", "relu", "swish", "relu2", "selu")
#: NetConfig fields added after checkpoints and exports existed: left out of ``to_dict`` at
#: these defaults, so an unchanged config writes the dict it always wrote.
_OPTIONAL_DEFAULTS = {"se": True, "activation": "relu", "mlh_activation": "softplus", "body": "residual",
                      "input_format": 1}
#: The attention body's own fields: a residual config's dict leaves them out.
_BODY_FIELDS = ("heads", "ffn_hidden", "ffn_activation", "smolgen", "smolgen_channels", "smolgen_hidden",
                "smolgen_gen", "pe_channels", "policy_embedding", "policy_d_model")

_PROMO_PIECES = "qrb"


def _square_name(sq: int) -> str:
    return "abcdefgh"[sq % 8] + "12345678"[sq // 8]


def policy_index_and_map() -> tuple[list[str], list[int]]:
    """The 1858 policy moves (UCI, from white's view, contract order) and, for each,
    its flat index ``plane * 64 + from_square`` in the conv policy head's output.

    Built here from the move geometry rather than read from the compiled encoder, so
    that the test suite's check against ``engine.encoding.POLICY_INDEX`` compares two
    independent derivations.
    """
    moves: list[str] = []
    flat: list[int] = []
    for frm in range(64):
        for to in range(64):
            plane = move_plane(to % 8 - frm % 8, to // 8 - frm // 8)
            if plane is not None:
                moves.append(_square_name(frm) + _square_name(to))
                flat.append(plane * 64 + frm)
    for from_file in range(8):
        frm = 6 * 8 + from_file
        for to_file in (from_file - 1, from_file, from_file + 1):
            if not 0 <= to_file < 8:
                continue
            to = 7 * 8 + to_file
            for k, piece in enumerate(_PROMO_PIECES):
                moves.append(_square_name(frm) + _square_name(to) + piece)
                flat.append((64 + 3 * (to_file - from_file + 1) + k) * 64 + frm)
    assert len(moves) == POLICY_SIZE and len(set(flat)) == POLICY_SIZE
    return moves, flat


@dataclasses.dataclass(frozen=True)
class NetConfig:
    """Sizes of a :class:`Net`. ``NetConfig.from_name("10x128")`` for the usual ones, and
    ``NetConfig.from_name("bt-64x4x4h")`` for an attention body (embedding 64, 4 encoder layers of
    4 heads: ``filters`` is the embedding, ``blocks`` the encoder layers)."""

    blocks: int
    filters: int
    se_ratio: int = 4  # SE hidden width = filters // se_ratio (at least 1)
    moves_left: bool = True
    policy_head: str = "conv"  # "conv" (lc0's conv policy) or "fc" (1x1 conv + linear)
    policy_channels: int = 32  # "fc" head only
    value_channels: int = 32
    value_hidden: int = 128
    mlh_channels: int = 8
    mlh_hidden: int = 128
    se: bool = True  # a squeeze-excitation unit in each residual block
    activation: str = "relu"  # "relu" or "mish": every activation but the outputs'
    mlh_activation: str = "softplus"  # the moves-left output's: "softplus" or "relu" (lc0's)
    # The attention body (``body="attention"``, module doc): sizes left 0 are derived from the
    # embedding as :meth:`_derived` says, the way lc0's BT networks scale them.
    body: str = "residual"  # "residual" (SE tower) or "attention" (lc0's attention body)
    heads: int = 0  # attention heads of each encoder layer
    ffn_hidden: int = 0  # the encoder FFN's width
    ffn_activation: str = "mish"
    smolgen: bool = True  # smolgen in every encoder layer
    smolgen_channels: int = 0  # smolgen's per-square compression
    smolgen_hidden: int = 0  # its first dense layer
    smolgen_gen: int = 0  # its second, per head: each head's 64x64 logits come from this many values
    pe_channels: int = 0  # the PE-dense embedding's positional channels per square
    policy_embedding: int = 0  # the attention policy's per-square embedding
    policy_d_model: int = 0  # the width of its queries and keys
    # lc0's input format of the planes (engine.encoding.INPUT_FORMATS): 1 classical; a network read
    # from an lc0 file keeps its own, which its exports say (the learner trains format 1 only)
    input_format: int = 1

    def __post_init__(self) -> None:
        if self.body not in ("residual", "attention"):
            raise ValueError(f"NetConfig.body must be 'residual' or 'attention', got {self.body!r}")
        if self.body == "attention":
            for field, value in self._derived().items():
                if getattr(self, field) == 0:
                    object.__setattr__(self, field, value)
        for field in ("blocks", "filters", "se_ratio", "policy_channels", "value_channels",
                      "value_hidden", "mlh_channels", "mlh_hidden") + (_BODY_FIELDS if self.body == "attention" else ()):
            value = getattr(self, field)
            if field == "smolgen" or field == "ffn_activation":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"NetConfig.{field} must be a positive integer, got {value!r}")
        if self.policy_head not in _POLICY_HEADS:
            raise ValueError(f"NetConfig.policy_head must be one of {_POLICY_HEADS}, got {self.policy_head!r}")
        from engine.encoding import INPUT_FORMATS

        if self.input_format not in INPUT_FORMATS:
            raise ValueError(f"NetConfig.input_format must be one of lc0's {INPUT_FORMATS}, got {self.input_format!r}")
        if (self.policy_head == "attention") != (self.body == "attention"):
            raise ValueError("the attention policy head goes with the attention body (body='attention'), and "
                             f"the attention body plays it only, got policy_head {self.policy_head!r} on a "
                             f"{self.body} body")
        if self.body == "attention":
            if self.filters % self.heads:
                raise ValueError(f"NetConfig: an embedding of {self.filters} does not split into {self.heads} heads")
            if self.ffn_activation not in _BODY_ACTIVATIONS:
                raise ValueError(f"NetConfig.ffn_activation must be one of {_BODY_ACTIVATIONS}, "
                                 f"got {self.ffn_activation!r}")
            if not isinstance(self.smolgen, bool):
                raise ValueError(f"NetConfig.smolgen must be True or False, got {self.smolgen!r}")
        if not isinstance(self.se, bool):
            raise ValueError(f"NetConfig.se must be True or False, got {self.se!r}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"NetConfig.activation must be one of {_ACTIVATIONS}, got {self.activation!r}")
        if self.mlh_activation not in _MLH_ACTIVATIONS:
            raise ValueError(f"NetConfig.mlh_activation must be one of {_MLH_ACTIVATIONS}, "
                             f"got {self.mlh_activation!r}")

    def _derived(self) -> dict[str, int]:
        """The attention body's sizes from its embedding ``E``, as BT4 (E 1024) has them: FFN 2E
        (BT4 1.5E; 2E trains better at the small sizes here), smolgen compressing to E/32 per
        square, E/4 hidden and E/4 per head, E/32 positional channels, the policy embedding
        and its queries E. Never below 4 (compress, positional) or 16 (smolgen's layers)."""
        e = self.filters
        return {"ffn_hidden": 2 * e, "smolgen_channels": max(4, e // 32), "smolgen_hidden": max(16, e // 4),
                "smolgen_gen": max(16, e // 4), "pe_channels": max(4, e // 32), "policy_embedding": e,
                "policy_d_model": e}

    @classmethod
    def from_name(cls, name: str, **overrides) -> "NetConfig":
        """Parse ``"BxF"`` (blocks x filters), e.g. ``"6x64"``, ``"20x256"``, or
        ``"bt-EMBxLAYERSxHEADSh"`` (an attention body), e.g. ``"bt-64x4x4h"``.

        Other fields keep their defaults unless given as keyword arguments
        (``NetConfig.from_name("6x64", moves_left=False)``). An attention body's defaults are
        BT4's: Mish, smolgen with swish, the attention policy, a moves-left head ending in ReLU
        (as lc0's, so that an lc0 file holds it exactly); residual-only keywords are ignored.
        """
        if not isinstance(name, str):
            raise ValueError(f"network size must be a string like '6x64', got {name!r}")
        body = _BODY_NAME_RE.match(name)
        if body:
            filters, blocks, heads = (int(g) for g in body.groups())
            if min(filters, blocks, heads) < 1:
                raise ValueError(f"bad network size {name!r}: embedding, layers and heads must all be at least 1")
            for residual_only in ("se_ratio", "policy_head", "se", "policy_channels"):
                overrides.pop(residual_only, None)
            settings = {"activation": "mish", "mlh_activation": "relu", **overrides}
            return cls(blocks=blocks, filters=filters, body="attention", heads=heads, policy_head="attention",
                       **settings)
        match = _NAME_RE.match(name)
        if not match:
            raise ValueError(
                f"bad network size {name!r}: expected 'BLOCKSxFILTERS' such as '6x64', '10x128' or '20x256', "
                "or an attention body 'bt-EMBEDDINGxLAYERSxHEADSh' such as 'bt-64x4x4h'"
            )
        blocks, filters = int(match.group(1)), int(match.group(2))
        if blocks < 1 or filters < 1:
            raise ValueError(f"bad network size {name!r}: blocks and filters must both be at least 1")
        return cls(blocks=blocks, filters=filters, **overrides)

    @property
    def name(self) -> str:
        if self.body == "attention":
            return f"bt-{self.filters}x{self.blocks}x{self.heads}h"
        return f"{self.blocks}x{self.filters}"

    @property
    def se_channels(self) -> int:
        return max(1, self.filters // self.se_ratio)

    def to_dict(self) -> dict:
        """Every field, but the lc0-import switches (``se``, ``activation``, ``mlh_activation``)
        only where they differ from their defaults, and the attention body's only for one;
        :meth:`from_dict` reads either."""
        data = dataclasses.asdict(self)
        for key, default in _OPTIONAL_DEFAULTS.items():
            if data[key] == default:
                del data[key]
        if self.body == "residual":
            for key in _BODY_FIELDS:
                del data[key]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "NetConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown NetConfig fields: {sorted(unknown)}")
        return cls(**data)


def rule50_scale(config: NetConfig) -> float:
    """What the graph multiplies the rule50 plane by: 1/100 where the input format feeds plies,
    1 where it feeds hundreds of plies already (the hectoplies formats)."""
    return 1.0 if config.input_format in HECTOPLIES_FORMATS else RULE50_SCALE


class NetOutput(NamedTuple):
    policy: torch.Tensor  # [N,1858] raw logits
    wdl: torch.Tensor  # [N,3] raw logits (softmax -> win/draw/loss)
    mlh: torch.Tensor | None  # [N,1] non-negative moves left, or None


def _activation_module(name: str) -> nn.Module:
    return nn.Mish(inplace=True) if name == "mish" else nn.ReLU(inplace=True)


def _activation(name: str):
    return F.mish if name == "mish" else F.relu


class ConvBN(nn.Sequential):
    """Conv (no bias) + batch norm (+ ReLU, or ``activation``)."""

    def __init__(self, cin: int, cout: int, kernel: int, relu: bool = True, activation: str = "relu"):
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, padding=kernel // 2, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if relu:
            layers.append(_activation_module(activation))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    """lc0's SE unit: ``sigmoid(gamma) * x + beta`` with (gamma, beta) from the pooled input."""

    def __init__(self, channels: int, hidden: int, activation: str = "relu"):
        super().__init__()
        self.channels = channels
        self.fc1 = nn.Linear(channels, hidden)
        self.fc2 = nn.Linear(hidden, 2 * channels)
        self.act = _activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = x.mean(dim=(2, 3))
        gb = self.fc2(self.act(self.fc1(pooled)))
        gamma, beta = gb.split(self.channels, dim=1)
        return torch.sigmoid(gamma)[:, :, None, None] * x + beta[:, :, None, None]


class ResidualBlock(nn.Module):
    def __init__(self, channels: int, se_hidden: int, se: bool = True, activation: str = "relu"):
        super().__init__()
        self.conv1 = ConvBN(channels, channels, 3, activation=activation)
        self.conv2 = ConvBN(channels, channels, 3, relu=False)
        self.se = SqueezeExcitation(channels, se_hidden, activation) if se else None
        self.act = _activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        if self.se is not None:
            y = self.se(y)
        return self.act(x + y)


class ConvPolicyHead(nn.Module):
    """lc0's conv policy head: two 3x3 convs, then a fixed gather into the 1858 moves."""

    def __init__(self, filters: int, activation: str = "relu"):
        super().__init__()
        self.conv1 = ConvBN(filters, filters, 3, activation=activation)
        self.conv2 = nn.Conv2d(filters, CONV_POLICY_PLANES, 3, padding=1, bias=True)
        _, flat = policy_index_and_map()
        self.register_buffer("policy_map", torch.tensor(flat, dtype=torch.long), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x)).flatten(1)  # [N, 73*64], index plane*64 + square
        return y.index_select(1, self.policy_map)


class FCPolicyHead(nn.Module):
    def __init__(self, filters: int, channels: int, activation: str = "relu"):
        super().__init__()
        self.conv = ConvBN(filters, channels, 1, activation=activation)
        self.fc = nn.Linear(channels * 64, POLICY_SIZE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).flatten(1))


# --------------------------------------------------------------------------- the attention body


def _body_activation(name: str):
    """An attention body's activation by net.proto's name (``relu2`` is ReLU squared)."""
    if name == "relu2":
        return lambda x: F.relu(x).square()
    return {"mish": F.mish, "relu": F.relu, "swish": F.silu, "selu": F.selu}[name]


#: lc0's layer-norm epsilons for the PE-dense body: every layer norm of the body and of smolgen.
BODY_EPSILON = 1e-3


class Smolgen(nn.Module):
    """lc0's smolgen: each square's features compressed (no bias) and flattened, two dense layers
    with layer norms, then per head the net-wide ``generator`` makes the 64x64 attention bias."""

    def __init__(self, c: NetConfig):
        super().__init__()
        self.heads = c.heads
        self.compress = nn.Linear(c.filters, c.smolgen_channels, bias=False)
        self.dense1 = nn.Linear(64 * c.smolgen_channels, c.smolgen_hidden)
        self.ln1 = nn.LayerNorm(c.smolgen_hidden, eps=BODY_EPSILON)
        self.dense2 = nn.Linear(c.smolgen_hidden, c.heads * c.smolgen_gen)
        self.ln2 = nn.LayerNorm(c.heads * c.smolgen_gen, eps=BODY_EPSILON)
        self.act = _body_activation("swish")

    def forward(self, x: torch.Tensor, generator: nn.Linear) -> torch.Tensor:
        g = self.compress(x).flatten(1)                           # [N, 64 * C]
        g = self.ln2(self.act(self.dense2(self.ln1(self.act(self.dense1(g))))))
        g = generator(g.view(g.shape[0], self.heads, -1))         # [N, heads, 4096]
        return g.view(g.shape[0], self.heads, 64, 64)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
              fused: bool) -> torch.Tensor:
    """``softmax(q k^T / sqrt(depth) + bias) v`` over [N, heads, 64, depth]. ``fused`` takes
    PyTorch's fused kernels (what CUDA trains with); the plain products are faster on a CPU and
    are what an ONNX export writes."""
    if fused:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    logits = q @ k.transpose(2, 3) * (1.0 / math.sqrt(q.shape[-1]))
    return torch.softmax(logits if bias is None else logits + bias, dim=-1) @ v


class EncoderLayer(nn.Module):
    """lc0's encoder layer, post-norm with DeepNorm: ``x = ln1(alpha * mha(x) + x)``, then
    ``x = ln2(alpha * ffn(x) + x)``; smolgen adds its bias to the attention logits."""

    def __init__(self, c: NetConfig, alpha: float):
        super().__init__()
        e = c.filters
        self.heads, self.alpha = c.heads, alpha
        self.q, self.k, self.v, self.out = (nn.Linear(e, e) for _ in range(4))
        self.smolgen = Smolgen(c) if c.smolgen else None
        self.ln1 = nn.LayerNorm(e, eps=BODY_EPSILON)
        self.ffn1 = nn.Linear(e, c.ffn_hidden)
        self.ffn2 = nn.Linear(c.ffn_hidden, e)
        self.ln2 = nn.LayerNorm(e, eps=BODY_EPSILON)
        self.ffn_act = _body_activation(c.ffn_activation)

    def forward(self, x: torch.Tensor, generator: nn.Linear | None) -> torch.Tensor:
        n, squares, e = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:               # [N, 64, E] -> [N, heads, 64, depth]
            return t.view(n, squares, self.heads, e // self.heads).transpose(1, 2)

        bias = self.smolgen(x, generator) if self.smolgen is not None else None
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        attended = attention(q, k, v, bias, fused=x.is_cuda).transpose(1, 2).reshape(n, squares, e)
        x = self.ln1(self.alpha * self.out(attended) + x)
        return self.ln2(self.alpha * self.ffn2(self.ffn_act(self.ffn1(x))) + x)


class AttentionPolicyHead(nn.Module):
    """lc0's attention policy: per-square ``embedding`` (the default activation), queries and
    keys; ``q[from] . k[to] / sqrt(D)`` is a move's logit, and a promotion adds the
    ``promotion`` offset of its piece (q, r, b) and the shared fourth to its pawn move's."""

    def __init__(self, c: NetConfig):
        super().__init__()
        self.embedding = nn.Linear(c.filters, c.policy_embedding)
        self.wq = nn.Linear(c.policy_embedding, c.policy_d_model)
        self.wk = nn.Linear(c.policy_embedding, c.policy_d_model)
        self.promotion = nn.Linear(c.policy_d_model, 4, bias=False)
        self.act = _activation(c.activation)
        from engine.lc0 import ATTENTION_POLICY_MAP

        self.register_buffer("policy_map", torch.tensor(ATTENTION_POLICY_MAP, dtype=torch.long), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.act(self.embedding(x))
        q, k = self.wq(e), self.wk(e)
        logits = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])        # [N, from, to]
        offsets = self.promotion(k[:, 56:64])                            # [N, to file, 4]
        offsets = offsets[..., :3] + offsets[..., 3:]
        promotions = logits[:, 48:56, 56:64].unsqueeze(3) + offsets.unsqueeze(1)   # [N, from file, to file, 3]
        flat = torch.cat([logits.flatten(1), promotions.flatten(1)], dim=1)        # [N, 4096 + 192]
        return flat.index_select(1, self.policy_map)


class AttentionBody(nn.Module):
    """lc0's attention body with the PE-dense embedding (BT3/BT4): the first 12 planes of all
    squares make ``pe_channels`` positional channels per square (``preproc``); with the 112
    planes they are embedded (the default activation, a layer norm), gated
    (``x * mult_gate + add_gate``) and passed through the embedding FFN; then the encoder
    layers, whose smolgen shares one ``generator``. Output: [N, 64 squares, E]."""

    def __init__(self, c: NetConfig):
        super().__init__()
        e = c.filters
        self.alpha = float((2.0 * c.blocks) ** -0.25)
        self.pe_channels = c.pe_channels
        self.preproc = nn.Linear(64 * 12, 64 * c.pe_channels)
        self.embedding = nn.Linear(PLANES + c.pe_channels, e)
        self.embedding_ln = nn.LayerNorm(e, eps=BODY_EPSILON)
        self.mult_gate = nn.Parameter(torch.ones(64, e))
        self.add_gate = nn.Parameter(torch.zeros(64, e))
        self.ffn1 = nn.Linear(e, c.ffn_hidden)
        self.ffn2 = nn.Linear(c.ffn_hidden, e)
        self.ffn_ln = nn.LayerNorm(e, eps=BODY_EPSILON)
        self.encoders = nn.ModuleList(EncoderLayer(c, self.alpha) for _ in range(c.blocks))
        self.generator = nn.Linear(c.smolgen_gen, 4096, bias=False) if c.smolgen else None
        self.act = _activation(c.activation)
        self.ffn_act = _body_activation(c.ffn_activation)

    def forward(self, planes: torch.Tensor) -> torch.Tensor:
        x = planes.flatten(2).transpose(1, 2)                            # [N, 64, 112], squares a1..h8
        pre = self.preproc(x[:, :, :12].flatten(1)).view(x.shape[0], 64, self.pe_channels)
        x = self.embedding_ln(self.act(self.embedding(torch.cat([x, pre], dim=2))))
        x = x * self.mult_gate + self.add_gate
        x = self.ffn_ln(self.alpha * self.ffn2(self.ffn_act(self.ffn1(x))) + x)
        for layer in self.encoders:
            x = layer(x, self.generator)
        return x


class Net(nn.Module):
    """SE-ResNet with policy, WDL and (optional) moves-left heads; see the module doc."""

    def __init__(self, config: NetConfig, seed: int | None = 0):
        super().__init__()
        self.config = config
        c = config
        if seed is None:
            self._build(c)
        else:
            # Deterministic init that leaves the caller's global RNG as it was.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self._build(c)

    def _build(self, c: NetConfig) -> None:
        scale = torch.ones(PLANES)
        scale[RULE50_PLANE] = rule50_scale(c)
        self.register_buffer("input_scale", scale.view(1, PLANES, 1, 1), persistent=False)
        if c.body == "attention":
            self._build_body(c)
            return
        act = c.activation
        self.stem = ConvBN(PLANES, c.filters, 3, activation=act)
        self.blocks = nn.Sequential(*(ResidualBlock(c.filters, c.se_channels, c.se, act) for _ in range(c.blocks)))
        if c.policy_head == "conv":
            self.policy = ConvPolicyHead(c.filters, act)
        else:
            self.policy = FCPolicyHead(c.filters, c.policy_channels, act)
        self.value_conv = ConvBN(c.filters, c.value_channels, 1, activation=act)
        self.value_fc1 = nn.Linear(c.value_channels * 64, c.value_hidden)
        self.value_fc2 = nn.Linear(c.value_hidden, 3)
        if c.moves_left:
            self.mlh_conv = ConvBN(c.filters, c.mlh_channels, 1, activation=act)
            self.mlh_fc1 = nn.Linear(c.mlh_channels * 64, c.mlh_hidden)
            self.mlh_fc2 = nn.Linear(c.mlh_hidden, 1)
        self._init_weights()

    def _build_body(self, c: NetConfig) -> None:
        """The attention body and its heads (module doc); every head reads the body's squares."""
        self.body = AttentionBody(c)
        self.policy = AttentionPolicyHead(c)
        self.value_embedding = nn.Linear(c.filters, c.value_channels)
        self.value_fc1 = nn.Linear(64 * c.value_channels, c.value_hidden)
        self.value_fc2 = nn.Linear(c.value_hidden, 3)
        if c.moves_left:
            self.mlh_embedding = nn.Linear(c.filters, c.mlh_channels)
            self.mlh_fc1 = nn.Linear(64 * c.mlh_channels, c.mlh_hidden)
            self.mlh_fc2 = nn.Linear(c.mlh_hidden, 1)
        # DeepNorm's initialisation (its beta): the branches' value, output and FFN weights scaled
        # down with depth, so that a deep post-norm stack trains from the start.
        beta = (8.0 * c.blocks) ** -0.25
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for layer in self.body.encoders:
            for m in (layer.v, layer.out, layer.ffn1, layer.ffn2):
                nn.init.xavier_uniform_(m.weight, gain=beta)
        if self.body.generator is not None:
            nn.init.normal_(self.body.generator.weight, std=0.01)
        if c.moves_left:
            nn.init.constant_(self.mlh_fc2.bias, 2.0)  # the ReLU output open at the start

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        # Each residual branch starts near zero (its last BN scaled down), so that a
        # fresh deep net keeps activations of order one through the whole tower.
        for block in self.blocks:
            nn.init.constant_(block.conv2[1].weight, 0.1)

    @property
    def has_mlh(self) -> bool:
        return self.config.moves_left

    def forward(self, planes: torch.Tensor) -> NetOutput:
        act = _activation(self.config.activation)
        attention = self.config.body == "attention"
        if attention:
            x = self.body(planes * self.input_scale)
            policy = self.policy(x)
            v = act(self.value_embedding(x)).flatten(1)
        else:
            x = self.blocks(self.stem(planes * self.input_scale))
            policy = self.policy(x)
            v = self.value_conv(x).flatten(1)
        wdl = self.value_fc2(act(self.value_fc1(v)))
        mlh = None
        if self.config.moves_left:
            m = act(self.mlh_embedding(x)).flatten(1) if attention else self.mlh_conv(x).flatten(1)
            m = self.mlh_fc2(act(self.mlh_fc1(m)))
            mlh = F.relu(m) if self.config.mlh_activation == "relu" else F.softplus(m)
        return NetOutput(policy, wdl, mlh)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class InferenceNet(nn.Module):
    """A :class:`Net` with the network contract's outputs: ``(policy logits, WDL probabilities[, mlh])``."""

    def __init__(self, net: Net):
        super().__init__()
        self.net = net

    @property
    def output_names(self) -> list[str]:
        names = [POLICY_NAME, WDL_NAME]
        if self.net.has_mlh:
            names.append(MLH_NAME)
        return names

    def forward(self, planes: torch.Tensor):
        out = self.net(planes)
        wdl = torch.softmax(out.wdl, dim=1)
        if out.mlh is None:
            return out.policy, wdl
        return out.policy, wdl, out.mlh


def build_net(config: NetConfig | str, seed: int | None = 0) -> Net:
    """A fresh :class:`Net` from a config or a name like ``"6x64"``, deterministic given ``seed``."""
    if isinstance(config, str):
        config = NetConfig.from_name(config)
    return Net(config, seed=seed)


def deepen(source: Net, blocks: int, seed: int | None = 0) -> Net:
    """``source`` with ``blocks`` residual blocks, computing exactly what ``source`` computes.

    Why: a network that has stopped learning for want of capacity (its training loss no lower
    than its held-out loss) grows without starting over. The new blocks are spread evenly among
    the source's and start as the identity: their last batch norm's scale and shift are zero,
    so the branch adds nothing (the SE unit's shift is zero on a zero input, its layers' biases
    being zero), and the block's ReLU passes its input, which a ReLU produced, unchanged (so
    ReLU networks only: a Mish of a Mish is not the identity).
    Their first convolution is freshly initialised (deterministic given ``seed``), so gradients
    reach the whole branch once its last scale moves off zero."""
    if source.config.body != "residual":
        raise ValueError(f"cannot deepen {source.config.name}: only residual towers grow by blocks")
    have = len(source.blocks)
    if blocks < have:
        raise ValueError(f"cannot deepen a {source.config.name} network to {blocks} blocks: it has {have}")
    if source.config.activation != "relu":
        raise ValueError(f"cannot deepen a {source.config.activation} network: new blocks are the identity "
                         "only after a ReLU")
    grown = Net(dataclasses.replace(source.config, blocks=blocks), seed=seed)
    keep = {round(i * blocks / have): i for i in range(have)}  # new position -> source block
    state = grown.state_dict()
    for name, value in source.state_dict().items():
        if not name.startswith("blocks."):
            state[name] = value
    for position, i in keep.items():
        for name, value in source.blocks[i].state_dict().items():
            state[f"blocks.{position}.{name}"] = value
    grown.load_state_dict(state)
    for position, block in enumerate(grown.blocks):
        if position not in keep:
            nn.init.zeros_(block.conv2[1].weight)
            nn.init.zeros_(block.conv2[1].bias)
            if block.se is not None:
                nn.init.zeros_(block.se.fc1.bias)
                nn.init.zeros_(block.se.fc2.bias)
    return grown


def save_checkpoint_dict(net: Net) -> dict:
    """What a checkpoint needs to rebuild the net: its config and weights."""
    return {"config": net.config.to_dict(), "model": net.state_dict()}


def load_net(checkpoint: dict | str, config: NetConfig | None = None) -> Net:
    """Rebuild a :class:`Net` from a checkpoint (a dict or a path to ``torch.save``'d one).

    The checkpoint holds ``{"config": NetConfig fields, "model": state_dict}``; a bare
    state dict also works when ``config`` is given.
    """
    if isinstance(checkpoint, str):
        checkpoint = read_checkpoint(checkpoint)
    if not isinstance(checkpoint, dict):
        raise ValueError("checkpoint must be a dict with 'config' and 'model', or a state dict")
    if "model" in checkpoint:
        state = checkpoint["model"]
        if config is None:
            if "config" not in checkpoint:
                raise ValueError("checkpoint has no 'config'; pass config=")
            config = NetConfig.from_dict(checkpoint["config"])
    else:
        state = checkpoint
        if config is None:
            raise ValueError("a bare state dict needs config=")
    net = Net(config, seed=None)
    net.load_state_dict(state)
    return net


__all__: Sequence[str] = [
    "NetConfig", "NetOutput", "Net", "InferenceNet",
    "build_net", "load_net", "save_checkpoint_dict", "policy_index_and_map", "rule50_scale",
]
