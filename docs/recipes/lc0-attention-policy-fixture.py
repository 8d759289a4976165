"""Remake the attention-policy lc0 fixtures of the tests (tests/data/lc0/, issue 53): small SE towers
with lc0's attention policy head, the structure of Leela's T60-T78 networks, and lc0's own evaluation
of them.

    python docs/recipes/lc0-attention-policy-fixture.py --lc0 /path/to/lc0 [--out tests/data/lc0]

What it writes, for each NAME below:

* ``NAME.pb.gz`` (about 95 KB and 105 KB): written from lc0's ``proto/net.proto`` by
  ``tests/lc0_files.py``'s own writer (which imports nothing from engine/lc0.py): a 2x16 SE tower
  (8 SE channels), lc0's attention policy head on it (policy format POLICY_ATTENTION, network format
  NETWORK_SE_WITH_HEADFORMAT: a 16-wide embedding, queries and keys 8 wide, the four promotion
  offsets), a WDL value head and a moves-left head, Mish, random weights in LINEAR16, the one layer
  encoding lc0 v0.32.1 reads (its lczero-common proto knows no other: a FLOAT32 layer is decoded as
  LINEAR16 there, and lc0's outputs are then not the file's).

  - ``cyzero-2x16-attnpol`` (seed 53): no policy encoder layers.
  - ``cyzero-2x16-attnpol-enc`` (seed 54): the head's own encoder layers (pol_encoder, pol_headcount),
    2 of width 16 with 2 heads and a 32-wide FFN, which lc0's CPU backend runs with no smolgen, a SELU
    FFN, DeepNorm alpha 1 and layer-norm epsilon 1e-6.
* ``NAME.lc0.json``: lc0 v0.32.1's evaluation of that file at the positions of ``tests/lc0_files.py``'s ``ATTENTION_POSITIONS``, as
  ``docs/recipes/lc0-fixture.py`` records it for the classical fixture (``go nodes 1`` with
  VerboseMoveStats, ``--backend=eigen --threads=1``, parsed by ``tests/lc0_files.py``'s
  ``lc0_evaluations``): V = W - L, D, M and each legal move's policy share at temperature 1.359
  with its lc0 index. The positions have promotions among their moves (the head's promotion
  offsets), both sides to move, castling and en passant.

Building lc0: as docs/recipes/lc0-fixture.py says (v0.32.1, the eigen backend, under /tmp).
"""

from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

import lc0_files as L  # noqa: E402  (the writer and lc0's parser the tests use too)

#: name -> (spec, {suffix: lc0's extra arguments}: None, one run without): the tests' fixtures
FIXTURES = {fixture.name: (fixture.spec, None) for fixture in (L.ATTENTION_POLICY, L.ATTENTION_POLICY_ENCODERS)}
POLICY_TEMPERATURE = L.POLICY_TEMPERATURE
POSITIONS = L.ATTENTION_POSITIONS


def main() -> int:
    for weights, (target,) in L.remake_fixtures(__doc__, FIXTURES, POSITIONS, POLICY_TEMPERATURE):
        print(f"wrote {weights} and {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
