"""Remake the lc0 fixture of the tests (tests/data/lc0/, issue 46): a small cyzero network written as an
lc0 weights file by ``cyzero-train export --lc0``, lc0's own evaluation of it and lc0's own ONNX export.

    python docs/recipes/lc0-fixture.py --lc0 /path/to/lc0 [--out tests/data/lc0]
    python docs/recipes/lc0-fixture.py --lc0 /path/to/lc0 --evaluate DIR/maia-1100.pb.gz   (the extras)

What it writes (NAME = cyzero-3x16):

* ``NAME.pb.gz`` (129 KB): a 3x16 network: SE (4 channels), lc0's convolutional policy head, WDL
  value head (8 channels, 32 hidden), a ReLU moves-left head (4 channels, 16 hidden): Maia's kind of
  network plus lc0's moves-left head, small. Random weights from a fixed seed, every batch norm with
  non-trivial statistics (the running statistics of 256 sample positions in training mode, gammas
  U(0.5, 1.5), betas N(0, 0.1)) so that the readers' batch-norm folding is exercised; the
  moves-left output is moved to 20-40 plies (its ReLU open) and the value head's bias shifted so
  that the positions' W - L spread over [-0.5, 0.8]. Written by ``cyzero-train export --checkpoint
  CKPT --lc0`` (which checks the file against PyTorch before it writes it).
* ``NAME.lc0.json``: lc0's evaluation of that file at the 11 positions below (those of Maia's
  fixture): for each position ``v`` = W - L, ``d`` and ``m`` (moves left; lc0 says 0 for a net
  without the head) of the raw network, and each legal move's policy share ``p`` in percent at
  lc0's default policy softmax temperature 1.359 with its ``index`` in lc0's 1858-entry policy
  (from the side to move's view). lc0 names castling king-takes-rook (``e1h1``); the file keeps
  lc0's names. lc0 runs as

      lc0 --weights=NAME.pb.gz --backend=eigen --threads=1
      uci / setoption name VerboseMoveStats value true / isready
      position fen FEN / go nodes 1          (for each position, waiting for its bestmove)

  and ``tests/lc0_files.py``'s ``lc0_evaluations`` parses each ``info string`` line: a move line
  ``info string e2e4  (322 ) N: 0 (+ 0) (P: 12.34%) ...`` gives the move, its index and P; the line
  ``info string node  ( 20) N: 1 ... (D: 0.060) (M: 21.0) (Q: ...) (V:  0.7710)`` gives D, M and V
  of the root: the network's outputs at the position (one node, no search).
* ``NAME.leela2onnx.onnx`` (279 KB): ``lc0 leela2onnx --input=NAME.pb.gz --output=...`` (defaults:
  float32, input ``/input/planes``, outputs ``/output/policy`` logits, ``/output/wdl`` softmaxed,
  ``/output/mlh``).

Building lc0 (never part of the repository; under /tmp): v0.32.1 from github:LeelaChessZero/lc0 with
its submodule libs/lczero-common (commit b326b154) and abseil-cpp 20240722.0 unpacked as
subprojects/abseil-cpp-20240722.0 with subprojects/packagefiles/abseil-cpp-20240722.0 copied over it
(meson's wrap would download it); Debian's libeigen3-dev and zlib1g-dev; meson from PyPI:

    meson setup build/release --buildtype release --wrap-mode=nodownload \
        -Dcpp_args=-I/usr/include/eigen3 -Dopenblas=false -Dgtest=false -Dispc=false \
        -Dplain_cuda=false -Dcudnn=false -Donnx=false -Dopencl=false
    ninja -C build/release lc0                      (about 12 minutes on 2 cores)

(``-Dcpp_args``: meson finds eigen3 by pkg-config but checks for ``Eigen/Core`` without its include
folder, then falls back to the eigen wrap.) v0.32.1's ``leela2onnx`` (``src/neural/onnx/converter.cc``,
``MakeValueHead``, unchanged on lc0's master as of November 2026) assumes lc0's usual value head for a
residual network, 32 channels and 128 hidden, and crashes (SIGSEGV) on a smaller one such as this
fixture's; lc0's own engine (``--backend=eigen``) plays it. LEELA2ONNX_PATCH below makes it read
both sizes from the file (``python docs/recipes/lc0-fixture.py --patch | patch -p0`` in lc0's
source folder); patched, it writes Maia 1100's export byte for byte as before.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from lc0_files import lc0_evaluations  # noqa: E402  (the parser the tests use too)

LEELA2ONNX_PATCH = """\
--- src/neural/onnx/converter.cc
+++ src/neural/onnx/converter.cc
@@ -1004,1 +1004,2 @@
-  const int val_channels = NumEncBlocks() > 0 ? head.ip_val_b.size() : 32;
+  const int val_channels = NumEncBlocks() > 0 ? head.ip_val_b.size() : head.value.biases.size();
+  const int val_hidden = head.ip1_val_b.size();
@@ -1024,3 +1025,3 @@
-      *GetWeghtsConverter(head.ip1_val_w, {val_channels * 8 * 8, 128}, {1, 0}));
+      *GetWeghtsConverter(head.ip1_val_w, {val_channels * 8 * 8, val_hidden}, {1, 0}));
   flow = builder->Add("/value/dense1/add", flow,
-                      *GetWeghtsConverter(head.ip1_val_b, {128}));
+                      *GetWeghtsConverter(head.ip1_val_b, {val_hidden}));
@@ -1034,1 +1035,1 @@
-                        *GetWeghtsConverter(head.ip2_val_w, {128, 3}, {1, 0}));
+                        *GetWeghtsConverter(head.ip2_val_w, {val_hidden, 3}, {1, 0}));
@@ -1045,1 +1046,1 @@
-                        *GetWeghtsConverter(head.ip2_val_w, {128, 1}, {1, 0}));
+                        *GetWeghtsConverter(head.ip2_val_w, {val_hidden, 1}, {1, 0}));
"""

NAME = "cyzero-3x16"
SEED = 46
POLICY_TEMPERATURE = 1.359  # lc0's default PolicyTemperature

# Both sides to move, castling rights (and castling among the legal moves), en-passant squares, non-zero
# rule50 counts, endgames: the positions of Maia's fixture.
POSITIONS = [
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
    "rnbqkbnr/pppp1ppp/8/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R b KQkq - 1 2",
    "r1bqkb1r/pppp1ppp/2n2n2/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4",
    "r1bq1rk1/ppp2ppp/2np1n2/2b1p3/2B1P3/2PP1N2/PP3PPP/RNBQ1RK1 w - - 0 7",
    "2r2rk1/pp1bqppp/2n1pn2/3p4/3P4/2PBPN2/P1Q2PPP/R4RK1 b - - 3 13",
    "8/5pk1/6p1/8/3R4/6P1/5PK1/2r5 w - - 0 40",
    "r3k2r/ppp2ppp/2n5/3qp3/8/2N2Q2/PPP2PPP/R3K2R w KQkq - 0 11",
    "8/8/3k4/8/2K5/8/4P3/8 b - - 0 60",
    "6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1",
    "r1bqkbnr/pppp1ppp/2n5/4p3/3PP3/5N2/PPP2PPP/RNBQKB1R b KQkq d3 0 3",
    "rnbqkb1r/ppp1pppp/5n2/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 3",
]


def make_network():
    """The PyTorch network of the fixture (deterministic given SEED)."""
    import torch

    from trainer.export import sample_positions
    from trainer.model import NetConfig, build_net

    config = NetConfig(blocks=3, filters=16, se_ratio=4, moves_left=True, mlh_activation="relu",
                       policy_head="conv", value_channels=8, value_hidden=32, mlh_channels=4, mlh_hidden=16)
    net = build_net(config, seed=SEED)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.reset_running_stats()
                module.momentum = None  # a cumulative average over the forward pass below
                module.weight.uniform_(0.5, 1.5, generator=generator)
                module.bias.normal_(0.0, 0.1, generator=generator)
        net.train()
        net(torch.from_numpy(sample_positions(256, seed=SEED)[0]))
        net.eval()
        # moves left in the tens of plies (an open ReLU), and W - L spread around zero
        net.mlh_fc2.weight.mul_(5.0)
        net.mlh_fc2.bias.fill_(40.0)
        net.value_fc2.bias.copy_(torch.tensor([-1.5, 0.0, 0.5]))
    return net


def export(out: str) -> str:
    """``cyzero-train export --checkpoint CKPT --lc0``: OUT/NAME.pb.gz (its .sha256 is not kept)."""
    import torch

    from trainer.model import save_checkpoint_dict

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = os.path.join(tmp, f"{NAME}.pt")
        torch.save(save_checkpoint_dict(make_network()), checkpoint)
        subprocess.run([sys.executable, "-m", "trainer.cli", "export", "--checkpoint", checkpoint, "--lc0",
                        "--out", os.path.abspath(out), "--name", NAME, "--positions", "64", "--seed", str(SEED)],
                       check=True, cwd=REPO)
    os.remove(os.path.join(out, f"{NAME}.pb.gz.sha256"))
    return os.path.join(out, f"{NAME}.pb.gz")


def lc0_outputs(lc0: str, weights: str) -> None:
    """NAME.lc0.json and NAME.leela2onnx.onnx next to ``weights`` (NAME.pb.gz)."""
    stem = weights[: -len(".pb.gz")] if weights.endswith(".pb.gz") else os.path.splitext(weights)[0]
    record = {"weights": os.path.basename(weights), "lc0": "v0.32.1, eigen backend, go nodes 1, VerboseMoveStats",
              "policy_temperature": POLICY_TEMPERATURE, "positions": lc0_evaluations(lc0, weights, POSITIONS)}
    with open(f"{stem}.lc0.json", "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    subprocess.run([lc0, "leela2onnx", f"--input={weights}", f"--output={stem}.leela2onnx.onnx"], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--patch", action="store_true", help="print LEELA2ONNX_PATCH and stop")
    parser.add_argument("--lc0", help="an lc0 v0.32.1 binary (built from source, eigen backend, the patch applied)")
    parser.add_argument("--out", default=os.path.join(REPO, "tests", "data", "lc0"))
    parser.add_argument("--evaluate", metavar="FILE.pb.gz",
                        help="instead of the repository's network, lc0's outputs for this lc0 file (Maia 1100 "
                             "for the tests' extras), written next to it")
    args = parser.parse_args()
    if args.patch:
        sys.stdout.write(LEELA2ONNX_PATCH)
        return 0
    if not args.lc0:
        parser.error("--lc0 LC0 please")
    if args.evaluate:
        lc0_outputs(args.lc0, args.evaluate)
        return 0
    os.makedirs(args.out, exist_ok=True)
    lc0_outputs(args.lc0, export(args.out))
    for name in sorted(os.listdir(args.out)):
        print(f"{os.path.getsize(os.path.join(args.out, name)):>9,}  {os.path.join(args.out, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
