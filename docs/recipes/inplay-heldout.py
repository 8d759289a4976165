"""A held-out set from the positions cyzero meets in play, and networks scored on it.

    python docs/recipes/inplay-heldout.py label OUT_RUN DEPTH SHARE GAMES.pgn ...
    python docs/recipes/inplay-heldout.py score RUN NET.onnx ...

``label`` takes every position from ply 8 of the games (``cyzero match --pgn`` writes
them), keeps each with probability SHARE (seed 5), labels it with the teacher's best move
and WDL at DEPTH (Debian's stockfish, one process a core, as ``cyzero-train bootstrap``
labels) and writes the records into OUT_RUN's replay store. ``score`` prints, for each
network (an ONNX file or an lc0 one, as the engine loads it), the policy cross-entropy
against the teacher's move, the value cross-entropy against its WDL and how often the
network's first choice is the teacher's, on one CPU thread. Why: the teacher's own games are a narrow held-out set (PROVENANCE, "Stockfish
against cyzero's own positions"); on them four continued networks looked better and
played worse, where these positions ranked them as the matches did.
"""
import multiprocessing
import os
import random
import sys

import chess
import chess.pgn
import numpy as np

_teacher = None


def _label(moves: list[str], depth: int):
    global _teacher
    from trainer.bootstrap import _Teacher, default_teacher

    if _teacher is None:
        _teacher = _Teacher(default_teacher())
    board = chess.Board()
    for move in moves:
        board.push_uci(move)
    return _teacher.label(board, depth=depth, multipv=1, temperature=50.0, game=None)


def label(out: str, depth: int, share: float, pgns: list[str]) -> None:
    from engine.board import Board
    from trainer.records import RECORD_DTYPE, Eval, make_record
    from trainer.store import ReplayStore

    rng = random.Random(5)
    jobs = []
    for path in pgns:
        with open(path) as f:
            while (game := chess.pgn.read_game(f)) is not None:
                moves = [m.uci() for m in game.mainline_moves()]
                jobs += [moves[:i] for i in range(8, len(moves)) if rng.random() < share]
    print(f"{len(jobs)} positions", flush=True)
    with multiprocessing.Pool(os.cpu_count()) as pool:
        labels = pool.starmap(_label, [(moves, depth) for moves in jobs], chunksize=16)
    with ReplayStore(out).writer(generation=0, source="teacher", positions_per_chunk=4096) as writer:
        for moves, lab in zip(jobs, labels):
            board = Board()
            for move in moves:
                board.push_uci(move)
            record = np.zeros(1, dtype=RECORD_DTYPE)
            value = Eval(lab.q, lab.d, 1)
            record[0] = make_record(board, lab.weights, result_q=lab.q, result_d=lab.d, plies_left=1,
                                    played=lab.best, root=value, best=lab.best, best_eval=value,
                                    played_eval=value, nodes=lab.nodes)
            writer.add_game(record)


def score(run: str, nets: list[str]) -> None:
    from engine.network import Network
    from trainer.records import decode_records, read_chunk
    from trainer.store import ReplayStore

    records = np.concatenate([read_chunk(os.path.join(run, "replay", "chunks", e.name))
                              for e in ReplayStore(run).entries()])
    sample = decode_records(records)
    planes = np.asarray(sample.planes, np.float32)
    target = np.asarray(sample.policy, np.float64)
    wdl = np.asarray(sample.wdl, np.float64)
    legal = target >= 0
    print(f"{len(records)} positions")
    for net in nets:
        with Network(net, backend="cpu", intra_threads=1, max_batch=256) as network:
            policy, value, _ = network.evaluate(planes)
        logits = np.where(legal, policy.astype(np.float64), -np.inf)
        logits -= logits.max(1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
        policy_ce = -(np.where(legal, target * logp, 0.0)).sum(1).mean()
        value_ce = -(wdl * np.log(np.clip(value.astype(np.float64), 1e-12, 1))).sum(1).mean()
        top1 = (logits.argmax(1) == target.argmax(1)).mean()
        print(f"{net}: policy {policy_ce:.3f} value {value_ce:.3f} top1 {top1:.3f}")


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "label":
        label(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "score":
        score(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
