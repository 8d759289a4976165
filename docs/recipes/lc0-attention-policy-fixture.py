"""Remake the attention-policy lc0 fixture of the tests (tests/data/lc0/, issue 53): a small SE tower
with lc0's attention policy head, the structure of Leela's T60-T78 networks, and lc0's own evaluation
of it.

    python docs/recipes/lc0-attention-policy-fixture.py --lc0 /path/to/lc0 [--out tests/data/lc0]

What it writes (NAME = cyzero-2x16-attnpol):

* ``NAME.pb.gz`` (about 60 KB): written from lc0's ``proto/net.proto`` by ``tests/lc0_files.py``'s
  own writer (which imports nothing from engine/lc0.py): a 2x16 SE tower (8 SE channels), lc0's
  attention policy head on it (policy format POLICY_ATTENTION, network format
  NETWORK_SE_WITH_HEADFORMAT, no policy encoder layers: a 16-wide embedding, queries and keys 8
  wide, the four promotion offsets), a WDL value head and a moves-left head, Mish, random weights
  from seed 53 in LINEAR16, the one layer encoding lc0 v0.32.1 reads (its lczero-common proto knows
  no other: a FLOAT32 layer is decoded as LINEAR16 there, and lc0's outputs are then not the file's).
* ``NAME.lc0.json``: lc0 v0.32.1's evaluation of that file at the positions below, as
  ``docs/recipes/lc0-fixture.py`` records it for the classical fixture (``go nodes 1`` with
  VerboseMoveStats, ``--backend=eigen --threads=1``, parsed by ``tests/lc0_files.py``'s
  ``lc0_evaluations``): V = W - L, D, M and each legal move's policy share at temperature 1.359
  with its lc0 index. The positions have promotions among their moves (the head's promotion
  offsets), both sides to move, castling and en passant.

Building lc0: as docs/recipes/lc0-fixture.py says (v0.32.1, the eigen backend, under /tmp).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

import lc0_files as L  # noqa: E402  (the writer and lc0's parser the tests use too)

NAME = "cyzero-2x16-attnpol"
SPEC = L.Lc0Spec(blocks=2, filters=16, se=True, se_channels=8, policy="attention", value="wdl", moves_left=True,
                 activation="mish", encoding="linear16", policy_embedding=16, policy_d_model=8, seed=53)
POLICY_TEMPERATURE = 1.359

POSITIONS = [
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
    "rnbqkbnr/pppp1ppp/8/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R b KQkq - 1 2",
    "r3k2r/ppp2ppp/2n5/3qp3/8/2N2Q2/PPP2PPP/R3K2R w KQkq - 0 11",
    "rnbqkb1r/ppp1pppp/5n2/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 3",
    "8/P6k/8/8/8/8/6K1/8 w - - 0 1",                    # a promotion, straight
    "1n5k/P7/8/8/8/8/6K1/8 w - - 0 1",                  # promotions: straight and capturing
    "8/6K1/8/8/8/8/p6k/1N6 b - - 0 1",                  # black promotes (the board seen from black)
    "r3k3/1P6/8/8/8/8/6p1/4K2R w Kq - 0 30",            # promotions on both sides, castling rights
    "2r2rk1/pp1bqppp/2n1pn2/3p4/3P4/2PBPN2/P1Q2PPP/R4RK1 b - - 3 13",
    "8/5pk1/6p1/8/3R4/6P1/5PK1/2r5 w - - 40 60",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lc0", required=True, help="lc0 v0.32.1 with the eigen backend")
    parser.add_argument("--out", default=os.path.join(REPO, "tests", "data", "lc0"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    weights = os.path.join(args.out, f"{NAME}.pb.gz")
    L.write_lc0(weights, SPEC)
    record = {"weights": os.path.basename(weights), "lc0": "v0.32.1, eigen backend, go nodes 1, VerboseMoveStats",
              "policy_temperature": POLICY_TEMPERATURE,
              "positions": L.lc0_evaluations(args.lc0, weights, POSITIONS)}
    target = os.path.join(args.out, f"{NAME}.lc0.json")
    with open(target + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    os.replace(target + ".tmp", target)
    print(f"wrote {weights} and {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
