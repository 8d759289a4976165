"""The GPU path without a GPU: the real Network, search and self-play on the GPU stand-in.

The stand-in (``engine.tools.gpu_standin``) takes the place of ONNX Runtime's session factory,
so what is tested here is cyzero's own code: one session per fixed batch size, the padding,
the warm-up at load, and the search's and self-play's batches. Only structure is asserted
(which sizes, which shapes, when a session was planned), never a time.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from engine.board import Board
from engine.limits import GoParams
from engine.move_search import CPU_MINIBATCH
from engine.network import NetworkError, fixed_batch_sizes
from engine.params import SearchParams
from engine.search import MultiSearch, Searcher, default_pipeline, search_batch
from engine.tools.gpu_standin import PROFILES, SimulatedGPU, simulated_gpu, simulated_network
from engine.weights import default_weights_path

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def standin(**costs) -> SimulatedGPU:
    """A stand-in whose re-plans are short (tests need not wait half a second each)."""
    return SimulatedGPU(**{"new_shape_s": 0.002, **costs})


def one_shape_each(gpu: SimulatedGPU) -> bool:
    return all(len(session.shapes) <= 1 for session in gpu.sessions)


def search(net, go: GoParams, params: SearchParams | None = None) -> Searcher:
    searcher = Searcher(lambda: net, params or SearchParams(move_overhead_ms=0))
    done = threading.Event()
    searcher.start(Board(), go, lambda info: None, lambda result: done.set())
    assert done.wait(60), "no bestmove"
    searcher.wait()
    return searcher


# --------------------------------------------------------------------------- the network


def test_the_h200_profile_costs_half_the_h100s_and_a_wrong_name_says_which_exist():
    h100, h200 = simulated_gpu("h100"), simulated_gpu("h200", new_shape_s=0.002)
    for size in (1, 8, 256):
        assert h200.seconds_for(size) == pytest.approx(h100.seconds_for(size) / 2)
    assert h200.new_shape_s == 0.002 and h100.new_shape_s == SimulatedGPU().new_shape_s
    with pytest.raises(ValueError, match="choose one of " + ", ".join(PROFILES)):
        simulated_gpu("h300")


def test_a_gpu_network_keeps_one_warmed_session_per_fixed_size():
    gpu = standin()
    before = time.monotonic()
    net, _ = simulated_network(gpu=gpu)
    loaded = time.monotonic()
    assert net.provider == "CUDAExecutionProvider"
    assert net.batch_sizes == SIZES and net.max_batch == 256
    assert len(gpu.sessions) == len(SIZES)
    assert sorted(next(iter(s.shapes)) for s in gpu.sessions) == list(SIZES)   # every size warmed
    assert one_shape_each(gpu)
    assert all(before <= when <= loaded for when, _, _ in gpu.stalls)          # all planned at load
    assert "batch 1/2/4/8/16/32/64/128/256" in net.description


def test_a_batch_is_padded_to_the_next_size_and_the_padding_ignored():
    net, gpu = simulated_network(gpu=standin())
    rng = np.random.default_rng(1)
    planes = (rng.random((37, 112, 8, 8)) < 0.1).astype(np.float32)
    calls = len(gpu.calls)
    policy, wdl, mlh = net.evaluate(planes)
    assert [c.size for c in gpu.calls[calls:]] == [64]
    assert policy.shape == (37, 1858) and wdl.shape == (37, 3) and mlh.shape == (37,)
    for row in (0, 17, 36):        # each row as its own batch gives the same answer
        alone = net.evaluate(planes[row:row + 1])
        np.testing.assert_allclose(alone[1][0], wdl[row], rtol=1e-6)
    assert [net.padded(n) for n in (1, 3, 64, 65, 256)] == [1, 4, 64, 128, 256]
    assert one_shape_each(gpu)


def test_a_float16_network_is_padded_and_cast_the_same_way():
    net32, _ = simulated_network(gpu=standin())
    net16, gpu16 = simulated_network(gpu=standin(fp16=True))
    assert net16.input_dtype is np.float16
    planes = (np.random.default_rng(2).random((37, 112, 8, 8)) < 0.1).astype(np.float32)
    _, wdl32, mlh32 = net32.evaluate(planes)
    policy16, wdl16, mlh16 = net16.evaluate(planes)
    assert policy16.dtype == wdl16.dtype == np.float32 and wdl16.shape == (37, 3)
    np.testing.assert_allclose(wdl16, wdl32, atol=2e-3)
    np.testing.assert_allclose(mlh16, mlh32)
    assert one_shape_each(gpu16)


def test_a_batch_above_the_largest_size_runs_in_chunks_of_fixed_sizes():
    net, gpu = simulated_network(gpu=standin())
    calls = len(gpu.calls)
    net.evaluate(np.zeros((300, 112, 8, 8), np.float32))
    assert [c.size for c in gpu.calls[calls:]] == [256, 64]
    assert one_shape_each(gpu)


def test_explicit_sizes_and_a_cpu_network_keeps_variable_shapes():
    net, gpu = simulated_network(gpu=standin(), batch_sizes=(8, 64, 512), max_batch=512)
    assert net.batch_sizes == (8, 64, 512) and net.padded(9) == 64
    assert fixed_batch_sizes(1000)[-3:] == (256, 512, 1000)
    with pytest.raises(NetworkError, match="batch sizes"):
        fixed_batch_sizes(256, (0, 4))
    from engine.network import Network

    cpu = Network(default_weights_path(), backend="cpu", warmup_batch=1)
    assert cpu.batch_sizes == () and cpu.padded(37) == 37


def test_a_network_too_big_for_its_largest_size_is_refused_clearly():
    with pytest.raises(NetworkError, match=r"at batch 128: .*out of memory.*lower the largest batch size"):
        simulated_network(gpu=standin(memory_rows=64))


# --------------------------------------------------------------------------- the search


def test_minibatch_size_zero_is_the_backends_choice():
    gpu_net, _ = simulated_network(gpu=standin())
    cpu_like = object()
    assert search_batch(SearchParams(), gpu_net) == 256
    assert search_batch(SearchParams(), cpu_like) == CPU_MINIBATCH
    assert search_batch(SearchParams(minibatch_size=24), gpu_net) == 24     # explicit wins
    assert default_pipeline(gpu_net) and not default_pipeline(cpu_like)


def test_the_uci_search_sends_only_fixed_sizes_and_plans_nothing():
    net, gpu = simulated_network(gpu=standin())
    started = time.monotonic()
    searcher = search(net, GoParams(nodes=3000))
    assert searcher.tree.nodes == 3000
    used = gpu.sizes_used(started)
    assert set(used) <= set(SIZES)
    assert used.get(256, 0) >= 5                      # full batches, not one position at a time
    assert not [s for s in gpu.stalls if s[0] >= started]
    assert one_shape_each(gpu)


def test_a_timed_search_gets_many_full_batches():
    net, gpu = simulated_network(gpu=standin())
    started = time.monotonic()
    search(net, GoParams(movetime=600))
    used = gpu.sizes_used(started)
    assert set(used) <= set(SIZES)
    assert sum(used.values()) >= 8
    assert max(used) == 256
    assert not [s for s in gpu.stalls if s[0] >= started]


def test_batches_grow_back_after_one_slow_call():
    """One full-size call held up (another process on the GPU) must not keep the batches small:
    priced by it, every batch of that size would look too slow for a timed search's share."""
    net, gpu = simulated_network(gpu=standin())
    searcher = Searcher(lambda: net, SearchParams(move_overhead_ms=0, smart_pruning_factor=0))

    def timed_search(hiccup: float) -> None:
        searcher.new_game()
        gpu.hiccup(hiccup, size=256)
        done = threading.Event()
        searcher.start(Board(), GoParams(movetime=1000), lambda info: None, lambda result: done.set())
        assert done.wait(60)
        searcher.wait()

    timed_search(0.0)                  # measures the speed
    started = time.monotonic()
    timed_search(0.8)                  # held up once
    slow = next(i for i, c in enumerate(gpu.calls) if c.start >= started and c.seconds > 0.5)
    # On a starved machine a second of search makes few calls: search on (the speed estimate
    # lives in the searcher) until ten calls came after the slow one.
    deadline = time.monotonic() + 60
    while len(gpu.calls) - slow - 1 < 10 and time.monotonic() < deadline:
        timed_search(0.0)
    sizes = [c.size for c in gpu.calls if c.start >= started]
    after = [c.size for c in gpu.calls[slow + 1:]]
    assert len(after) >= 10 and after.count(256) >= len(after) // 2, sizes


# --------------------------------------------------------------------------- self-play


def test_selfplay_batches_every_game_at_the_networks_sizes():
    from trainer.selfplay import SelfPlay, SelfPlaySettings, worker_max_batch

    settings = SelfPlaySettings(visits=64, fast_visits=16, max_plies=40, seed=3)
    net, gpu = simulated_network(gpu=standin(), max_batch=worker_max_batch(48, settings))
    assert net.batch_sizes[-1] == 256          # half of 48 games x 8 leaves, at least 256
    started = time.monotonic()
    play = SelfPlay(net, settings, games=48)
    try:
        for _ in range(4):
            play.step()
    finally:
        play.close()
    used = gpu.sizes_used(started)
    assert set(used) <= set(net.batch_sizes)
    assert max(used) == net.batch_sizes[-1]          # the games fill the largest size
    assert not [s for s in gpu.stalls if s[0] >= started]
    assert one_shape_each(gpu)


def test_multisearch_capacity_is_the_largest_size():
    net, _ = simulated_network(gpu=standin())
    multi = MultiSearch(net, SearchParams(), pipeline=True)
    assert multi._driver_for(64).capacity == 256
    assert MultiSearch(object(), SearchParams())._driver_for(4).capacity == 4 * CPU_MINIBATCH
