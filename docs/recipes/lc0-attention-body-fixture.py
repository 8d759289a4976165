"""Remake the attention-body lc0 fixtures of the tests (tests/data/lc0/): two small transformer
networks of the structure of Leela's BT networks, and lc0's own evaluation of them.

    python docs/recipes/lc0-attention-body-fixture.py --lc0 /path/to/lc0 [--out tests/data/lc0]

What it writes, for each NAME below:

* ``NAME.pb.gz`` (about 200 KB and 100 KB): written from lc0's ``proto/net.proto`` by
  ``tests/lc0_files.py``'s own writer (which imports nothing from engine/lc0.py), random weights in
  LINEAR16, the one layer encoding lc0 v0.32.1 reads (its lczero-common proto knows no other: a
  FLOAT32 layer is decoded as LINEAR16 there, and lc0's outputs are then not the file's), small
  scales so that neither the value nor the policy saturates.

  - ``cyzero-bt-32x2-multihead``: NETWORK_ATTENTIONBODY_WITH_MULTIHEADFORMAT (7), what BT3/BT4
    are: the PE-dense embedding (ip_emb_preproc of the first 12 planes, ip_emb, its layer norm, the
    input gates, the embedding FFN with its layer norm), 2 encoder layers of width 32 with 4 heads
    and smolgen (global smolgen_w), Mish (the default activation and the FFN's), smolgen swish; value
    heads winner, q and st (WDL), policy heads vanilla and optimistic (attention, a shared
    embedding), a moves-left head.
  - ``cyzero-bt-32x2-pemap``: NETWORK_ATTENTIONBODY_WITH_HEADFORMAT (6) without an
    input_embedding field, which lc0 reads as the PE map (64 positional channels per square), the
    input gates, 2 encoder layers of width 32 with 4 heads and smolgen, ReLU, FFN ReLU^2, smolgen
    swish, an attention policy with one policy encoder layer of its own (2 heads), a WDL value head,
    no moves-left head.

* ``NAME.lc0.json``: lc0 v0.32.1's evaluation of that file at the positions of ``tests/lc0_files.py``'s ``ATTENTION_POSITIONS`` (``go nodes 1``
  with VerboseMoveStats, ``--backend=eigen --threads=1``, parsed by ``tests/lc0_files.py``'s
  ``lc0_evaluations``): V = W - L, D, M and each legal move's policy share at temperature 1.359
  with its lc0 index, with lc0's default heads (winner, vanilla).
* for the multihead net also ``NAME.q-optimistic.lc0.json``: the same with
  ``--backend-opts=value_head=q,policy_head=optimistic``.

Building lc0: as docs/recipes/lc0-fixture.py says (v0.32.1, the eigen backend, under /tmp).
"""

from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

import lc0_files as L  # noqa: E402  (the writer and lc0's parser the tests use too)

#: name -> (spec, {suffix: lc0's extra arguments})
FIXTURES = {
    "cyzero-bt-32x2-multihead": (L.BODY_MULTIHEAD.spec, {"": (), ".q-optimistic": (
        "--backend-opts=value_head=q,policy_head=optimistic",)}),
    "cyzero-bt-32x2-pemap": (L.BODY_PE_MAP.spec, {"": ()}),
}
POLICY_TEMPERATURE = L.POLICY_TEMPERATURE
POSITIONS = L.ATTENTION_POSITIONS


def main() -> int:
    for weights, targets in L.remake_fixtures(__doc__, FIXTURES, POSITIONS, POLICY_TEMPERATURE):
        for target in targets:
            print(f"wrote {target}")
        print(f"wrote {weights}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
