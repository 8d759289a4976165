"""Remake tests/data/lc0/training-format*.gz and training-games.json: training records lc0 v0.32.1 wrote
itself, in the canonical input formats, for tests/test_records.py, which checks that trainer.records
writes and reads the same records (fields, planes and policy indices) for the positions of those games.

    .venv/bin/python docs/recipes/lc0-canonical-chunks.py --lc0 /tmp/lc0-build/release/lc0
        [--formats 4,133] [--records 48] [--out tests/data/lc0]

(lc0 built with its eigen or blas backend, as docs/recipes/lc0-fixture.py says, with one line of
src/selfplay/game.cc changed first: v0.32.1's SelfPlayGame gives its V6TrainingDataArray the input
format INPUT_CLASSICAL_112_PLANE whatever the network reads, so its selfplay writes format 1 only.
PATCH below replaces that constant by the format named in $LC0_TRAINING_INPUT_FORMAT, which this
script sets to the network's; the encoder and the record writer are lc0's own, untouched:

    sed -i "s|pblczero::NetworkFormat::INPUT_CLASSICAL_112_PLANE) {|$PATCH) {|" src/selfplay/game.cc

with PATCH the expression below, and `#include <cstdlib>` added at the top of that file.)

How: the repository's lc0 fixture (tests/data/lc0/cyzero-3x16.pb.gz) with its input format rewritten
to F (as docs/recipes/lc0-input-formats.py does; a network's weights do not depend on the format,
only the planes lc0 feeds it) plays ``lc0 selfplay --training`` at 8 visits and temperature 1 from
four openings: the standard position (castling, the transform once the rights are gone), a
position with pawns and one castling right each (the flip), a pawnless one (mirror and transpose),
and a pawn's double step beside an enemy pawn (en passant in a flipped position). lc0 writes one gzip file of V6 records a game, from the position after the opening's
moves; the first RECORDS records of each game are kept, the games back to back in one file a format,
and training-games.json says each game's opening (its FEN and moves) and how many records it kept, so
that the test replays the games.
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from lc0_files import with_input_format  # noqa: E402  (as the tests)
from trainer.records import RECORD_BYTES  # noqa: E402

PATCH = ('static_cast<pblczero::NetworkFormat::InputFormat>(std::getenv("LC0_TRAINING_INPUT_FORMAT") ? '
         'std::atoi(std::getenv("LC0_TRAINING_INPUT_FORMAT")) : 1)')
#: (FEN, the opening's moves in UCI) of each opening below, in its order.
GAMES = [(None, ["e2e4"]), ("r3k3/1pp5/8/8/8/8/5PP1/4K2R w Kq - 0 1", ["g2g3"]),
         ("8/8/3k4/8/8/2QK4/8/8 w - - 0 1", ["c3c4"]), ("3k4/8/8/8/3p4/8/4P3/4K3 w - - 0 1", ["e2e4"])]
OPENINGS = """[Event "standard"]
[Result "*"]

1. e4 *

[Event "pawns, a castling right each"]
[SetUp "1"]
[FEN "r3k3/1pp5/8/8/8/8/5PP1/4K2R w Kq - 0 1"]
[Result "*"]

1. g3 *

[Event "pawnless"]
[SetUp "1"]
[FEN "8/8/3k4/8/8/2QK4/8/8 w - - 0 1"]
[Result "*"]

1. Qc4 *

[Event "en passant, flipped"]
[SetUp "1"]
[FEN "3k4/8/8/8/3p4/8/4P3/4K3 w - - 0 1"]
[Result "*"]

1. e4 *
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lc0", required=True)
    parser.add_argument("--formats", default="4,133")
    parser.add_argument("--records", type=int, default=48, help="records kept of each game")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "lc0")
    args = parser.parse_args()
    source = gzip.decompress((REPO / "tests" / "data" / "lc0" / "cyzero-3x16.pb.gz").read_bytes())
    kept_counts = {}
    for fmt in (int(f) for f in args.formats.split(",")):
        with tempfile.TemporaryDirectory(prefix="lc0-chunks-") as tmp:
            weights = Path(tmp) / f"cyzero-3x16.format{fmt}.pb.gz"
            weights.write_bytes(gzip.compress(with_input_format(source, fmt)))
            openings = Path(tmp) / "openings.pgn"
            openings.write_text(OPENINGS)
            subprocess.run([args.lc0, "selfplay", "--training", f"--games={len(GAMES)}", "--parallelism=1", "--visits=8",
                            f"--weights={weights}", "--backend=eigen", "--threads=1", "--temperature=1",
                            f"--openings-pgn={openings}", "--openings-mode=sequential"],
                           check=True, env={**os.environ, "XDG_CACHE_HOME": tmp, "LC0_TRAINING_INPUT_FORMAT": str(fmt)}, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            games = sorted(Path(tmp, "lc0").glob("data-*/*.gz"), key=lambda p: p.stat().st_mtime)
            if len(games) != len(GAMES):
                raise SystemExit(f"lc0 wrote {len(games)} games, not {len(GAMES)}")
            if any(int.from_bytes(gzip.decompress(g.read_bytes())[4:8], "little") != fmt for g in games):
                raise SystemExit(f"lc0 wrote records of another format than {fmt}: is its selfplay patched?")
            parts = [gzip.decompress(g.read_bytes())[:args.records * RECORD_BYTES] for g in games]
        kept_counts[str(fmt)] = [len(part) // RECORD_BYTES for part in parts]
        out = args.out / f"training-format{fmt}.gz"
        out.write_bytes(gzip.compress(b"".join(parts), mtime=0))
        print(f"{out}: {sum(kept_counts[str(fmt)])} records of {len(GAMES)} games, {out.stat().st_size:,} bytes")
    info = {"lc0": "v0.32.1", "network": "cyzero-3x16, its input format rewritten", "visits": 8,
            "openings": [{"fen": fen, "moves": moves} for fen, moves in GAMES], "records": kept_counts}
    (args.out / "training-games.json").write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main()
