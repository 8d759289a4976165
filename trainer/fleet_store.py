"""What ``cyzero-train bench fleet``'s run stored: the replay store's new chunks against the acknowledged games.

Every acknowledged game id is looked up in the store's manifest (each chunk's line lists its games'
ids): each must be there exactly once. The chunks' rate and bytes a position come from there too.
"""

from __future__ import annotations

import collections
import os

from trainer.atomic import read_jsonl
from trainer.rundir import MANIFEST, PGN_DIR, REPLAY_DIR

__all__ = ["check_store", "manifest_adds", "store_state"]


def manifest_adds(run_dir: str) -> list[dict]:
    """The manifest's ``add`` lines whole, game ids included: an audit of the store reads them itself."""
    return [r for r in read_jsonl(os.path.join(run_dir, MANIFEST))
            if r.get("op") == "add" and isinstance(r.get("name"), str)]


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names)


def store_state(run_dir: str) -> dict:
    return {"chunks": {r["name"] for r in manifest_adds(run_dir)},
            "manifest_bytes": _size(os.path.join(run_dir, MANIFEST)),
            "pgn_bytes": _size(os.path.join(run_dir, PGN_DIR))}


def check_store(run_dir: str, acked_ids: set[str], before: dict, window: tuple[float, float]) -> dict:
    """The chunks stored since ``before`` (:func:`store_state`) against the acknowledged ids: each
    acknowledged id in the manifest exactly once; the rate of the chunks made within ``window`` (unix
    times); their bytes on disk per position."""
    from trainer.records import RECORD_BYTES

    adds = manifest_adds(run_dir)
    counts = collections.Counter(i for r in adds for i in (r.get("game_ids") or []) if isinstance(i, str))
    new = [r for r in adds if r["name"] not in before["chunks"]]
    new_ids = {i for r in new for i in (r.get("game_ids") or []) if isinstance(i, str)}
    missing = sorted(i for i in acked_ids if counts[i] == 0)
    duplicated = sorted(i for i in acked_ids if counts[i] > 1)
    positions = sum(int(r.get("positions", 0)) for r in new)
    chunk_bytes = sum(_size(os.path.join(run_dir, REPLAY_DIR, "chunks", r["name"])) for r in new)
    inside = [r for r in new if window[0] <= float(r.get("time", 0)) <= window[1]]
    span = max(window[1] - window[0], 1e-9)
    per_position = (lambda n: n / positions if positions else None)
    return {
        "chunks": len(new), "games": sum(int(r.get("games", 0)) for r in new), "positions": positions,
        "games_per_s": sum(int(r.get("games", 0)) for r in inside) / span,
        "positions_per_s": sum(int(r.get("positions", 0)) for r in inside) / span,
        "positions_per_chunk": positions / len(new) if new else None,
        "bytes_per_position": {
            "chunks": per_position(chunk_bytes),
            "manifest": per_position(_size(os.path.join(run_dir, MANIFEST)) - before["manifest_bytes"]),
            "pgn": per_position(_size(os.path.join(run_dir, PGN_DIR)) - before["pgn_bytes"]),
            "record": RECORD_BYTES,
        },
        "cache_bytes": _size(os.path.join(run_dir, REPLAY_DIR, "cache")),
        "acked_missing": len(missing), "acked_duplicated": len(duplicated), "missing_examples": missing[:5],
        "stored_twice": sum(1 for i in new_ids if counts[i] > 1),
        "stored_not_acked": len(new_ids - acked_ids),
        "every_acked_stored_once": not missing and not duplicated,
    }
