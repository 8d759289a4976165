"""The learner's processes: the rendezvous of spawned ranks, their start (forkserver on the CPU,
spawn on CUDA), their log lines forwarded to the parent, stop signals forwarded to them, and a
rank failure said in one line. What each rank runs is :func:`trainer.learner.run_rank`, passed in."""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.lifeline import end_with
from trainer.stop_signals import StopSignals, on_signals

__all__: Sequence[str] = [
    "rendezvous_store", "join_group", "end_rank_process", "spawned_rank", "forward_stop", "run_ranks",
]

Log = Callable[[str], Any]
#: A rank's work: (rank, world, local rank, launch, log, stop_signals=..., end_process=...) -> exit code.
RankMain = Callable[..., int]


def rendezvous_store(world: int, timeout_s: float = 60.0) -> dist.TCPStore:
    """The store that spawned ranks meet at (:func:`join_group`), held by their parent on a port
    the system picked, and bound while the ranks live. A port found free and named to the ranks
    to bind later was a race: any process could take it in between (the suite runs many learners
    at once), and a rank could then meet another run's ranks. The parent binds the socket itself,
    on loopback: a store left to bind its own listens on every interface."""
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        store = dist.TCPStore("127.0.0.1", listener.getsockname()[1], world, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=listener.fileno())
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store owns the descriptor now, and closes it
    return store


def join_group(backend: str, rank: int, world: int, store_port: int, timeout_s: float = 60.0) -> None:
    """Rank ``rank`` joins the process group at the parent's :func:`rendezvous_store`."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", store_port, world, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


#: What a CPU rank imports before it can train (torch, and the torch._dynamo its optimizer pulls
#: in), done once in the forkserver its ranks are forked from rather than again in each rank:
#: about 5 s of CPU a rank on a small machine.
_FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "trainer.learner"]


def _start_method(kind: str) -> str:
    """``forkserver`` for CPU ranks (forked from a process that has imported torch but never ran
    anything: no CUDA, and no thread but numpy's idle OpenBLAS pool), ``spawn`` for CUDA ranks,
    as torch recommends."""
    import multiprocessing

    if kind == "cuda" or "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload(_FORKSERVER_PRELOAD)
    _start_forkserver_deaf_to_sigterm()
    return "forkserver"


def _start_forkserver_deaf_to_sigterm() -> None:
    """Start the forkserver with SIGTERM ignored (it ignores SIGINT itself). `timeout` and
    systemd signal the whole process group: a forkserver killed by that left the learner
    unable to read its ranks' exit codes ("rank 0 exited with code 255"), and it stopped the
    ranks before their final checkpoint. Each rank takes SIGTERM back (:func:`spawned_rank`).
    Outside the main thread no handler can be set: the ranks' start then starts it as it is."""
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGTERM, previous)


def end_rank_process(code: int) -> None:
    """End a finished rank's process now, its learner (the DDP model, and the process group the
    model holds) still referenced, so that no teardown of either runs in Python.

    Freeing them deadlocked a finished rank (tests/test_learner.py, once in a few runs of the
    rank-dies test): the main thread, holding the GIL, freed the model, and gloo's destructor
    joined its work threads while one of them, freeing the final barrier's earlier all-reduce,
    waited for the GIL to free a gradient's Python object. The interpreter's own teardown has
    aborted a finished rank the same way ("terminate called without an active exception",
    SIGABRT). Its checkpoint is written and its log lines are in the pipe (a SimpleQueue writes
    as it puts)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def spawned_rank(local: int, world: int, rank_main: RankMain, launch, lines) -> None:
    """``spawn``'s entry: rank ``local`` of ``world`` runs ``rank_main`` (:func:`trainer.learner.run_rank`,
    which ``spawn`` pickles by name) with ``launch`` (a :class:`trainer.learner.Launch`); its log lines
    go to the parent through ``lines`` (a queue); a non-zero return becomes the exit code. A rank that dies by a signal
    (a native abort or crash) dumps every thread's Python stack to stderr first, so the parent's
    one-line failure has a stack beside it to say where."""
    faulthandler.enable(all_threads=True)
    if launch.environ is not None:
        os.environ.clear()
        os.environ.update(launch.environ)
    if launch.parent_pid is not None:
        # the learner, not getppid(): a CPU rank's parent is the forkserver, which outlives the
        # learner while its ranks live
        end_with(launch.parent_pid)
    # The parent passes SIGINT and SIGTERM on as one SIGTERM (a Ctrl-C reaches every process);
    # the forkserver's ignored SIGTERM (_start_forkserver_deaf_to_sigterm) is not the rank's.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    rank_main(local, world, local, launch, lines.put, stop_signals=(signal.SIGTERM,), end_process=True)


@contextlib.contextmanager
def forward_stop(processes: Sequence):
    """The spawning parent's SIGTERM or SIGINT becomes one SIGTERM to each rank (which stop
    together after a step, with a checkpoint); a second signal (:class:`~trainer.stop_signals.StopSignals`)
    interrupts the parent, whose ``spawn`` context then kills the ranks."""
    signals_seen = StopSignals()

    def handler(signum: int) -> None:
        if not signals_seen.is_first():
            return
        for process in processes:
            if process.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(process.pid, signal.SIGTERM)

    with on_signals(handler):
        yield


def _forward(lines, log: Log) -> None:
    """The parent's end of the ranks' log queue (None ends it)."""
    while (line := lines.get()) is not None:
        log(line)


def run_ranks(rank_main: RankMain, world: int, kind: str, launch, log: Log) -> int:
    """Start ``world`` processes that each run ``rank_main`` as one rank (``kind``: "cpu" or "cuda"),
    wait for all of them, and return the exit code: 0, or 1 with a line naming the rank that failed.
    ``launch`` names the parent's :func:`rendezvous_store`, which the caller holds open meanwhile."""
    method = _start_method(kind)
    lines = mp.get_context(method).SimpleQueue()
    forward = threading.Thread(target=_forward, args=(lines, log), name="rank-logs", daemon=True)
    forward.start()
    context = mp.start_processes(spawned_rank, args=(world, rank_main, launch, lines), nprocs=world, join=False,
                                 start_method=method)
    try:
        with forward_stop(context.processes):
            while not context.join():
                pass
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as exc:
        failure = _describe_failure(exc, context.processes, context.error_files)
    else:
        failure = ""
    finally:
        lines.put(None)
        forward.join(5.0)
    if failure:
        log(failure)
        return 1
    return 0


def _describe_failure(exc: BaseException, processes: Sequence, error_files: Sequence[str]) -> str:
    """One line naming the rank whose end brought the group down, and how it ended.

    ``spawn`` reports the first failure it noticed; when a rank dies, its peers fail too
    (their collectives lose the connection) and the rest are stopped with SIGTERM, so a rank
    that ended by itself without a Python exception (an exit code, a signal such as the OOM
    killer's SIGKILL) is named first, before ranks that raised or were terminated.
    """
    rank = getattr(exc, "error_index", 0)
    for i, process in enumerate(processes):
        code = process.exitcode
        if code and code != -signal.SIGTERM and not os.path.exists(error_files[i]):
            rank = i
            break
    code = processes[rank].exitcode if rank < len(processes) else None
    if code is not None and code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    elif code and not os.path.exists(error_files[rank]):
        how = f"exited with code {code}"
    else:
        lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
        how = f"failed: {lines[-1] if lines else type(exc).__name__}"
    return (f"learner: rank {rank} {how}; the other ranks were stopped. "
            "Resume by running the same command again (it continues from the last checkpoint)")
