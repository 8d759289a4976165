"""engine.watchers: the WeightsFile watcher proposes replaced files (through the NetworkManager
facade, with real bundled networks); endpoints and the rate limit of dropped-message lines."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from engine.announce import is_wildcard, rehost
from engine.watchers import RateLimit, peer_endpoint, validate_endpoint
from engine.weights import WeightsError
from weights_helpers import FAST, WAIT, A, B, C, CountingLoader, FakeNet, Log, make_manager, replace_atomically, sha


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "weights.onnx"
    path.write_bytes(A)
    return str(path)


def test_replaced_file_is_swapped_between_searches(weights):
    log, loader = Log(), CountingLoader()
    cleared = []
    with make_manager(weights, log, loader) as manager:
        old = manager.get()
        replace_atomically(weights, B)
        assert manager.wait_pending(WAIT)
        assert manager.get() is old, "nothing changes before apply_pending"
        assert log.wait_for("verified; switching before the next search")
        assert manager.apply_pending(lambda: cleared.append(True))
        assert cleared == [True]
        new = manager.get()
        assert new is not old and new.sha256 == manager.sha256 == sha(B)
        assert manager.description == new.description != old.description
        assert log.lines[-1] == f"switched to network {new.description}; search cache cleared"
        assert not manager.swap_pending() and not manager.apply_pending()
        assert loader.calls[-1] == (weights, sha(B))  # the candidate was held to the sha256 it was hashed at
        old.evaluate(np.zeros((1, 112, 8, 8), np.float32))  # a search still holding the old one is fine


def test_truncated_file_is_refused_once_and_old_network_stays(weights):
    log, loader = Log(), CountingLoader()
    with make_manager(weights, log, loader) as manager:
        old = manager.get()
        replace_atomically(weights, B[: len(B) // 2])
        refused = log.wait_for("refused network")
        assert refused[0].startswith(f"refused network {weights}: ")
        assert "truncated" in refused[0] and "keeping weights.onnx" in refused[0]
        calls = len(loader.calls)
        time.sleep(8 * FAST)  # many polls: the same bad file is not tried again
        os.utime(weights)  # new mtime, same bad bytes: still not tried again
        time.sleep(8 * FAST)
        assert len(log.having("refused")) == 1 and len(loader.calls) == calls
        assert not manager.swap_pending() and manager.get() is old and manager.sha256 == sha(A)
        # Once the file changes again (a good network), it is taken.
        replace_atomically(weights, C)
        assert manager.wait_pending(WAIT) and manager.apply_pending()
        assert manager.sha256 == sha(C)


def test_identical_file_is_not_swapped(weights):
    log, loader = Log(), CountingLoader()
    with make_manager(weights, log, loader) as manager:
        manager.get()
        replace_atomically(weights, A)  # new inode and mtime, same sha256
        time.sleep(10 * FAST)
        assert not manager.swap_pending() and len(loader.calls) == 1 and len(log.lines) == 1


def test_file_being_written_is_not_read_half_way(tmp_path):
    path = str(tmp_path / "weights.onnx")
    with open(path, "wb") as f:
        f.write(A)
    log, loader = Log(), CountingLoader()
    # A writer that pauses for less than one poll interval is never caught half-way: the
    # watcher waits for the same stat on two polls in a row.
    with make_manager(path, log, loader, poll_interval=0.5) as manager:
        manager.get()
        with open(path, "r+b") as f:  # rewritten in place, not atomically
            f.truncate(0)
            f.write(B[: len(B) // 2])
            f.flush()
            time.sleep(0.1)
            f.write(B[len(B) // 2 :])
        assert manager.wait_pending(WAIT) and manager.apply_pending()
        assert manager.sha256 == sha(B)
        assert loader.calls == [(path, None), (path, sha(B))]  # never asked for the half file
        assert loader.loaded == [sha(A), sha(B)] and not log.having("refused")


def test_sha256_side_file_is_checked(weights):
    log, loader = Log(), CountingLoader()
    with open(weights + ".sha256", "w") as f:
        f.write(f"{sha(A)}  weights.onnx\n")
    with make_manager(weights, log, loader) as manager:
        manager.get()
        assert loader.calls == [(weights, sha(A))]
        replace_atomically(weights, B)  # the side file still says A
        refused = log.wait_for("refused network")
        assert "does not match" in refused[0] and "weights.onnx.sha256" in refused[0]
        assert not manager.swap_pending()
        # The publisher finishes: the side file now matches, and the network is taken.
        replace_atomically(weights + ".sha256", f"{sha(B)}  weights.onnx\n".encode())
        assert manager.wait_pending(WAIT) and manager.apply_pending()
        assert manager.sha256 == sha(B) and len(log.having("refused")) == 1


def test_wrong_io_network_is_refused(weights):
    pytest.importorskip("onnx", reason="builds its test network with onnx: pip install 'cyzero[train]'")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "wrong",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 112, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 112, 8, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    log = Log()
    with make_manager(weights, log) as manager:
        old = manager.get()
        replace_atomically(weights, model.SerializeToString())
        refused = log.wait_for("refused network")
        assert "the input is named 'x'" in refused[0]
        assert manager.get() is old and not manager.swap_pending()


def test_nan_network_is_refused_and_released(weights):
    nan = np.full((1, 1858), np.nan, np.float32)
    made = []

    def loader(path, **kwargs):
        with open(path, "rb") as f:
            data = f.read()
        made.append(FakeNet(policy=nan if data == B else None, sha256=sha(data)))
        return made[-1]

    log = Log()
    with make_manager(weights, log, loader) as manager:
        manager.get()
        replace_atomically(weights, B)
        refused = log.wait_for("refused network")
        assert "not finite" in refused[0] and manager.sha256 == sha(A)
        assert made[-1].closed  # the refused candidate was released
        assert not manager.swap_pending()


def test_a_missing_weights_file_that_appears_later_is_taken(tmp_path, weights):
    """A WeightsFile that cannot be loaded keeps the fallback, and is watched until it can be."""
    log = Log()
    with make_manager(weights, log) as first:
        first.get()
    later = tmp_path / "later.onnx"
    with make_manager(str(later), log, fallback=first.in_use) as manager:
        assert manager.get() is first.in_use.network
        assert log.lines[-1] == f"WeightsFile not found: {later}; keeping network weights.onnx (sha256 {sha(A)[:12]}...)"
        replace_atomically(later, B)
        assert manager.wait_pending(WAIT) and manager.apply_pending() and manager.sha256 == sha(B)


# --------------------------------------------------------------------------- endpoints


def test_validate_endpoint():
    for good in ("tcp://127.0.0.1:5557", "tcp://localhost:1", "tcp://[::1]:5557",
                 "TCP://daemon.example.org:65535", "ipc:///tmp/cyzero.sock", "inproc://weights"):
        assert validate_endpoint(good).lower() == good.lower()
    for bad in ("", "127.0.0.1:5557", "udp://127.0.0.1:5557", "tcp://127.0.0.1", "tcp://*:5557",
                "tcp://127.0.0.1:0", "tcp://127.0.0.1:70000", "tcp://:5557", "ipc://", "inproc://",
                "tcp://eth0;127.0.0.1:5557", "tcp://a b:1", 5557):
        with pytest.raises(WeightsError):
            validate_endpoint(bad)


def test_an_announced_wildcard_is_dialled_at_the_host_the_peer_was_reached_at():
    def fetch(announced, subscribed):
        return peer_endpoint(announced, subscribed, "fetch endpoint", "TrainerEndpoint")

    assert fetch("tcp://*:5558", "tcp://10.0.0.5:5557") == "tcp://10.0.0.5:5558"
    assert fetch("tcp://0.0.0.0:5558", "tcp://gpu-box:5557") == "tcp://gpu-box:5558"
    assert fetch("tcp://[::]:5558", "tcp://[::1]:5557") == "tcp://[::1]:5558"
    assert fetch("tcp://gpu-box:5558", "tcp://10.0.0.5:5557") == "tcp://gpu-box:5558"
    assert fetch("ipc:///run/fetch", "tcp://10.0.0.5:5557") == "ipc:///run/fetch"
    with pytest.raises(WeightsError, match="needs a tcp:// TrainerEndpoint"):
        fetch("tcp://*:5558", "ipc:///run/announce")
    with pytest.raises(WeightsError, match="bad fetch endpoint"):
        fetch("tcp://*:99999", "tcp://10.0.0.5:5557")


def test_rehost_rewrites_only_a_wildcard_host():
    assert rehost("tcp://0.0.0.0:5780", "*") == "tcp://*:5780"
    assert rehost("tcp://[::]:5780", "*") == "tcp://*:5780"
    assert rehost("tcp://0.0.0.0:5780", "127.0.0.1", "[::1]") == "tcp://127.0.0.1:5780"
    assert rehost("tcp://[::]:5780", "127.0.0.1", "[::1]") == "tcp://[::1]:5780"
    assert rehost("tcp://*:5780", "10.0.0.5") == "tcp://10.0.0.5:5780"
    for kept in ("tcp://10.0.0.5:5780", "tcp://gpu-box:5780", "ipc:///run/x", "tcp://[::1]:5780"):
        assert rehost(kept, "*") == kept
        assert not is_wildcard(kept)


def test_rate_limit_summarises_what_it_dropped():
    limit = RateLimit(burst=2, window=0.3)
    assert [limit.admit() for _ in range(5)] == [0, 0, None, None, None]
    time.sleep(0.35)
    assert limit.admit() == 3
