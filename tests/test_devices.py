"""One device grammar (trainer.devices) for self-play workers, the learner and the daemon, and the
cores this process may use."""

import os
import subprocess
import sys

import pytest

from trainer.devices import learner_devices, learner_ranks, selfplay_devices, usable_cores


def test_selfplay_devices():
    assert selfplay_devices("cpu") == ["cpu"]
    assert selfplay_devices("cuda:0,1") == ["cuda:0", "cuda:1"] == selfplay_devices("cuda:0,cuda:1")
    for bad in ("gpu", "cuda:0,cuda:0", ""):
        with pytest.raises(ValueError, match="--devices"):
            selfplay_devices(bad)


def test_selfplay_devices_name_the_key_they_came_from_and_take_no_cpu_count():
    assert selfplay_devices(" CPU , cuda ") == ["cpu", "cuda:0"]
    with pytest.raises(ValueError, match=r"^daemon\.devices 'cpu:2': self-play runs one worker a device"):
        selfplay_devices("cpu:2", "daemon.devices")


def test_learner_devices_on_the_cpu():
    devices = learner_devices("cpu:3")
    assert (devices.kind, devices.ids, devices.world) == ("cpu", (0, 1, 2), 3)
    assert learner_devices("cpu").ids == (0,)
    with pytest.raises(ValueError, match="--learner-devices cpu:0: need at least one CPU process"):
        learner_devices("cpu:0", "--learner-devices")
    for bad in ("gpu:1", "cpu,cuda:0", "cpu:1,cpu:2", "cuda,1"):
        with pytest.raises(ValueError, match="--devices"):
            learner_devices(bad)


def test_the_learner_reads_a_gpu_list_as_self_play_does(monkeypatch):
    """``cuda:0,cuda:1`` (self-play's spelling) names the learner's two GPUs too."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert learner_devices("cuda:0,cuda:1").ids == learner_devices("cuda:0,1").ids == (0, 1)
    assert learner_devices("cuda").ids == (0, 1)
    with pytest.raises(ValueError, match="--devices cuda:2: no GPU 2 \\(this machine has 2\\)"):
        learner_devices("cuda:2")


def test_learner_ranks_share_the_machine_out():
    assert learner_ranks("cpu:2") == {"cpu": 2} and learner_ranks("cuda:0,1") == {"cuda:0": 1, "cuda:1": 1}
    assert learner_ranks("none") == {} and learner_ranks("cpu") == {"cpu": 1}


def test_usable_cores_follows_the_affinity_so_taskset_sizes_the_workers():
    assert usable_cores() == len(os.sched_getaffinity(0))
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from trainer.devices import usable_cores; print(usable_cores())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1"
