"""engine.swap: the network in use, proposals, the loader and the swap between searches.

Networks here are stand-ins (a builder that records what it was asked for),
so these tests need no ONNX Runtime and run in a moment.
"""

from __future__ import annotations

import os
import threading

import pytest

from engine.network import NetworkError
from engine.swap import NetworkSwap, Proposal
from engine.weights import Candidate, NoNetworkError
from weights_helpers import WAIT, Log


class Net:
    def __init__(self, name: str) -> None:
        self.name, self.description, self.closed = name, f"{name} (stand-in)", False

    def close(self) -> None:
        self.closed = True


class Builder:
    """Builds stand-ins; a path in ``bad`` fails; ``gate`` (if set) holds every build until released."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.bad: dict[str, str] = {}
        self.gate: threading.Event | None = None
        self.started = threading.Event()

    def __call__(self, path, sha256=None, *, generation=None, run=None, reported_path=None):
        self.calls.append((path, sha256, generation))
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT)
        if path in self.bad:
            raise NetworkError(f"{os.path.basename(path)}: {self.bad[path]}")
        return Candidate(Net(path), sha256 or "0" * 64, reported_path or path, generation, run)


def first(name="first.onnx", sha="a" * 64):
    return lambda: Candidate(Net(name), sha, f"/nets/{name}")


def proposal(name, sha, generation=None, **kwargs) -> Proposal:
    key = ("trainer", generation, sha) if generation is not None else ("file", sha, None)
    return Proposal(f"/nets/{name}", sha, key, generation, **kwargs)


@pytest.fixture
def swap():
    log, build = Log(), Builder()
    s = NetworkSwap(first(), build, log)
    s.log, s.build = log, build
    yield s
    s.close()


def test_first_load_once_then_swap_between_searches(swap):
    net = swap.get()
    assert swap.get() is net and swap.current.path == "/nets/first.onnx"
    assert swap.log.lines == ["loaded network first.onnx (stand-in)"]
    assert swap.propose(proposal("b.onnx", "b" * 64))
    assert swap.wait_pending(WAIT) and swap.get() is net  # nothing changes before apply_pending
    assert swap.log.lines[-1] == "new network b.onnx (sha256 bbbbbbbbbbbb...) verified; switching before the next search"
    cleared = []
    assert swap.apply_pending(lambda: cleared.append(True)) and cleared == [True]
    assert swap.get().name == "/nets/b.onnx" and swap.current.sha256 == "b" * 64
    assert swap.log.lines[-1] == "switched to network /nets/b.onnx (stand-in); search cache cleared"
    assert not swap.swap_pending() and not swap.apply_pending()


def test_what_is_not_proposed_twice(swap):
    swap.get()
    assert not swap.propose(proposal("same.onnx", "a" * 64))  # the network in use
    swap.build.bad["/nets/bad.onnx"] = "truncated"
    assert swap.propose(proposal("bad.onnx", "c" * 64, generation=3))
    refused = swap.log.wait_for("refused network")
    assert refused == ["refused network /nets/bad.onnx (generation 3): truncated; keeping first.onnx (sha256 aaaaaaaaaaaa...)"]
    assert not swap.propose(proposal("bad.onnx", "c" * 64, generation=3))  # refused before: quiet
    assert swap.propose(proposal("g5.onnx", "d" * 64, generation=5))
    assert swap.wait_pending(WAIT) and swap.newest_generation() == 5
    for older in (4, 5):  # an older generation, or the same one re-announced
        assert not swap.propose(proposal("old.onnx", "e" * 64, generation=older))
    assert swap.apply_pending() and swap.current.generation == 5
    assert [call[0] for call in swap.build.calls] == ["/nets/bad.onnx", "/nets/g5.onnx"]


def test_the_newest_proposal_wins(swap):
    swap.get()
    swap.build.gate = threading.Event()
    swap.propose(proposal("b.onnx", "b" * 64))
    assert swap.build.started.wait(WAIT)  # b is loading
    swap.propose(proposal("c.onnx", "c" * 64))
    swap.propose(proposal("d.onnx", "d" * 64))  # replaces c before it was started
    swap.build.gate.set()
    swap.log.wait_for("new network d.onnx")
    assert [call[0] for call in swap.build.calls] == ["/nets/b.onnx", "/nets/d.onnx"]
    assert swap.apply_pending() and swap.current.sha256 == "d" * 64


def test_a_network_known_by_sha256_only_takes_the_generation(swap):
    swap.get()
    assert swap.propose(proposal("first.onnx", "a" * 64, generation=4, run="r1"))
    swap.log.wait_for("the network in use is first.onnx")
    assert swap.current.generation == 4 and swap.current.run == "r1" and swap.build.calls == []


def test_a_superseded_failure_is_not_a_refusal(swap):
    swap.get()
    swap.build.bad["/nets/half.onnx"] = "truncated"
    done = threading.Event()

    def superseded():
        done.set()
        return True

    assert swap.propose(proposal("half.onnx", "b" * 64, superseded=superseded))
    assert done.wait(WAIT)
    swap.close()
    assert not swap.log.having("refused") and not swap.was_refused(("file", "b" * 64, None))


def test_a_fetch_runs_on_the_loader_and_the_announced_path_is_reported(swap):
    swap.get()
    got = []

    def fetch(stop):
        got.append(stop is swap.stop)
        return "/cache/g7.0123.onnx"

    assert swap.propose(proposal("g7.onnx", "b" * 64, generation=7, fetch=fetch))
    assert swap.wait_pending(WAIT) and got == [True]
    assert swap.build.calls == [("/cache/g7.0123.onnx", "b" * 64, 7)]
    assert swap.apply_pending() and swap.current.path == "/nets/g7.onnx"


def test_no_network_at_all_raises_each_time_and_retries():
    attempts = []

    def broken():
        attempts.append(1)
        raise NetworkError("WeightsFile /x.onnx: not an ONNX model")

    log = Log()
    swap = NetworkSwap(broken, Builder(), log)
    for _ in range(2):
        with pytest.raises(NoNetworkError, match="^WeightsFile /x.onnx: not an ONNX model$"):
            swap.get()
    assert len(attempts) == 2 and swap.current is None and log.lines == []


def test_a_fallback_is_kept_and_said_once():
    kept = Candidate(Net("old.onnx"), "a" * 64, "/nets/old.onnx", generation=2)

    def broken():
        raise NetworkError("WeightsFile /x.onnx: truncated")

    log = Log()
    swap = NetworkSwap(broken, Builder(), log, fallback=kept)
    assert swap.get() is kept.network and swap.get() is kept.network
    assert log.lines == ["WeightsFile /x.onnx: truncated; keeping network old.onnx (sha256 aaaaaaaaaaaa...), generation 2"]
    swap.close()


def test_a_network_verified_before_the_first_use_is_taken():
    log, build = Log(), Builder()
    swap = NetworkSwap(first(), build, log)
    assert swap.propose(proposal("g1.onnx", "b" * 64, generation=1))
    assert swap.wait_pending(WAIT)
    assert swap.get().name == "/nets/g1.onnx" and swap.current.generation == 1
    assert log.lines[-1].startswith("loaded network /nets/g1.onnx")
    swap.close()


def test_close_drops_the_pending_network_and_keeps_the_one_in_use(swap):
    net = swap.get()
    swap.propose(proposal("b.onnx", "b" * 64))
    assert swap.wait_pending(WAIT)
    pending = swap._pending.network
    swap.close()
    swap.close()  # idempotent
    assert pending.closed and not net.closed and swap.current.network is net
    assert not swap.swap_pending() and not swap.apply_pending() and not swap.propose(proposal("c", "c" * 64))
    with pytest.raises(RuntimeError, match="closed"):
        swap.get()
    swap.loader_thread.join(WAIT)
    assert not swap.loader_thread.is_alive()


# --------------------------------------------------------------------------- reloads for new settings


def reload(name, sha="c" * 64, build=None, failed=None) -> Proposal:
    return Proposal(f"/nets/{name}", None, ("reload", name),
                    load=build or (lambda: Candidate(Net(f"/nets/{name}"), sha, f"/nets/{name}")), failed=failed)


def test_a_reload_is_built_beside_the_network_in_use_and_waited_for(swap):
    """A reload (new Backend/Threads...) is built on the loader while the network in use plays on;
    wait_reloaded (isready) returns once it is pending; it switches only at apply_pending."""
    net = swap.get()
    gate = threading.Event()

    def slow():
        assert gate.wait(WAIT)
        return Candidate(Net("/nets/rebuilt.onnx"), "c" * 64, "/nets/rebuilt.onnx")

    assert swap.propose(reload("rebuilt.onnx", build=slow))
    assert swap.reloading() and not swap.wait_reloaded(0.05)      # still being built
    assert swap.get() is net                                     # the network in use plays on
    gate.set()
    assert swap.wait_reloaded(WAIT) and not swap.reloading()
    assert swap.get() is net and swap.apply_pending()
    assert swap.get().name == "/nets/rebuilt.onnx"
    assert not [line for line in swap.log.lines if "verified" in line]   # the switch line says it


def test_a_watchers_proposal_never_displaces_a_waiting_reload(swap):
    swap.get()
    swap.build.gate = gate = threading.Event()
    assert swap.propose(proposal("busy.onnx", "b" * 64))     # occupies the loader
    assert swap.build.started.wait(WAIT)
    assert swap.propose(reload("rebuilt.onnx"))
    assert not swap.propose(proposal("late.onnx", "d" * 64))  # refused: the reload waits
    assert swap.propose(reload("newer.onnx", sha="e" * 64))   # a newer reload replaces the older
    gate.set()
    assert swap.wait_reloaded(WAIT) and swap.apply_pending()
    assert swap.current.path == "/nets/newer.onnx" and "/nets/late.onnx" not in [c[0] for c in swap.build.calls]


def test_a_failed_reload_is_said_its_way_and_the_network_in_use_stays(swap):
    net = swap.get()

    def broken():
        raise NetworkError("WeightsFile /x.onnx: not an ONNX model")

    assert swap.propose(reload("x.onnx", build=broken, failed=lambda why: f"{why}; keeping network first"))
    assert swap.wait_reloaded(WAIT)
    assert swap.log.lines[-1] == "WeightsFile /x.onnx: not an ONNX model; keeping network first"
    assert not swap.apply_pending() and swap.get() is net
