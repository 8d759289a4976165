"""Remake the trainer's transformer fixture of the tests (tests/data/lc0/cyzero-trainer-bt-32x2x2h.*):
an attention-body network of trainer.model's family written as an lc0 file by the trainer's own writer
(what ``cyzero-train export --lc0`` writes), and lc0 v0.32.1's evaluation of it.

    python docs/recipes/lc0-transformer-fixture.py --lc0 /path/to/lc0 [--out tests/data/lc0]

What it writes:

* ``cyzero-trainer-bt-32x2x2h.pb.gz``: ``tests/lc0_files.py``'s ``trainer_transformer()`` (bt-32x2x2h from
  a fixed seed, every parameter moved by N(0, 0.05) so that the outputs are far from uniform), written by
  ``trainer.lc0_export.lc0_file_bytes``: network format 7 (BT3/BT4's multihead format) with the PE-dense
  embedding, input gates, the embedding FFN, smolgen (swish) with its global weights, Mish, the attention
  policy (vanilla) and WDL (winner) heads, a moves-left head, LINEAR16 weights.
* ``cyzero-trainer-bt-32x2x2h.lc0.json``: lc0's evaluation of that file at ``ATTENTION_POSITIONS`` (one node,
  VerboseMoveStats, ``--backend=eigen --threads=1``; see docs/recipes/lc0-attention-body-fixture.py).

The tests compare lc0's numbers with the PyTorch network the file was written from, and with the engine's
graph of the file: the trainer's export is lc0's network in both directions.

Building lc0: as docs/recipes/lc0-fixture.py says (v0.32.1, the eigen backend, under /tmp).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

import lc0_files as L  # noqa: E402

from trainer.lc0_export import lc0_file_bytes  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lc0", required=True, help="lc0 v0.32.1 with the eigen backend")
    parser.add_argument("--out", default=os.path.join(REPO, "tests", "data", "lc0"))
    args = parser.parse_args()
    fixture = L.TRAINER_BODY
    os.makedirs(args.out, exist_ok=True)
    weights = os.path.join(args.out, fixture.name + ".pb.gz")
    with open(weights + ".tmp", "wb") as f:
        f.write(gzip.compress(lc0_file_bytes(L.trainer_transformer()), compresslevel=9, mtime=0))
    os.replace(weights + ".tmp", weights)
    record = {"weights": os.path.basename(weights), "lc0": "v0.32.1, eigen backend, go nodes 1, VerboseMoveStats",
              "policy_temperature": L.POLICY_TEMPERATURE,
              "positions": L.lc0_evaluations(args.lc0, weights, L.ATTENTION_POSITIONS)}
    target = os.path.join(args.out, fixture.name + ".lc0.json")
    with open(target + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    os.replace(target + ".tmp", target)
    print(f"wrote {weights}\nwrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
