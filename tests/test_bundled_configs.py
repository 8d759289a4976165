"""The configs that ship with the package (trainer/configs/*.toml): `cyzero-train run RUN --config cpu`."""

import ast
import dataclasses
import glob
import os

import pytest

from trainer.config import bundled_config, default_config, load_config, load_named_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


BUNDLED = sorted(os.path.basename(p)[:-len(".toml")] for p in glob.glob(os.path.join(ROOT, "trainer", "configs", "*.toml")))


@pytest.mark.parametrize("name", BUNDLED)
def test_each_bundled_config_loads_and_is_found_by_name(name):
    path = bundled_config(name)
    assert path == os.path.join(ROOT, "trainer", "configs", f"{name}.toml")
    config = load_config(path)  # every key known, every value in range
    assert config != default_config()


def test_the_cpu_config_plays_and_learns_on_the_cpu_and_the_gpu_config_on_cuda():
    cpu, gpu = load_config(bundled_config("cpu")), load_config(bundled_config("gpu"))
    assert (cpu.daemon.devices, cpu.daemon.workers_per_device, cpu.daemon.learner_devices) == ("cpu", 1, "cpu:1")
    assert gpu.daemon.devices.startswith("cuda") and gpu.daemon.learner_devices.startswith("cuda")
    blocks_filters = [tuple(map(int, c.model.net.split("x"))) for c in (cpu, gpu)]
    assert blocks_filters[0] < blocks_filters[1]  # a smaller net where evaluations are scarce
    assert cpu.selfplay.visits < gpu.selfplay.visits and cpu.train.batch_size < gpu.train.batch_size
    assert cpu.replay.floor < default_config().replay.floor  # the window follows the newest games sooner


def test_the_annealing_stage_changes_only_the_learning_rate_so_it_resumes_the_supervised_run():
    teacher, anneal = load_named_config("teacher-6x64"), load_named_config("teacher-6x64-anneal")
    assert anneal.optimizer.lr < teacher.optimizer.lr
    assert dataclasses.replace(anneal, optimizer=teacher.optimizer) == teacher
    assert load_named_config(bundled_config("cpu")) == load_config(bundled_config("cpu"))   # a path works too


def test_the_gpu_stretch_continues_the_bundled_network_at_the_rate_it_finished_at():
    anneal, stretch = load_named_config("teacher-6x64-anneal"), load_named_config("teacher-6x64-gpu")
    assert stretch.model == anneal.model and stretch.optimizer.lr == anneal.optimizer.lr
    assert stretch.replay.max_samples_per_position < default_config().replay.max_samples_per_position


def test_the_cpu_continuation_starts_near_the_finishing_rate_and_anneals_within_its_run():
    anneal, cont = load_named_config("teacher-6x64-anneal"), load_named_config("teacher-6x64-continue")
    assert cont.model == anneal.model and cont.train.batch_size == anneal.train.batch_size
    assert anneal.optimizer.lr <= cont.optimizer.lr < load_named_config("teacher-6x64").optimizer.lr
    assert cont.optimizer.schedule == "cosine" and round(cont.optimizer.min_lr / anneal.optimizer.lr, 9) <= 0.1


def test_self_play_on_the_bundled_network_fine_tunes_its_policy_gated_against_it():
    cpu, sp = load_named_config("cpu"), load_named_config("selfplay-6x64-continue")
    cont = load_named_config("teacher-6x64-continue")
    assert sp.model == cont.model and sp.optimizer.lr < cont.optimizer.lr   # fine-tuned, not retrained
    assert sp.gating.enabled and sp.loss.policy > 0 and sp.loss.value == sp.loss.moves_left == 0
    assert cpu.selfplay.visits < sp.selfplay.visits and sp.selfplay.temperature < default_config().selfplay.temperature
    assert sp.daemon == cpu.daemon


@pytest.mark.parametrize("name", ["nope", "", "../config", "cpu.toml", "configs/cpu", None])
def test_an_unknown_or_odd_name_is_none(name):
    assert bundled_config(name) is None


@pytest.mark.parametrize("package", ["trainer", "engine.tools", "engine.nets"])
def test_setup_ships_every_data_file_the_package_reads(package):
    """A file missing from package_data works from a checkout and breaks an installed copy."""
    tree = ast.parse(open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read())
    package_data = next(kw.value for node in ast.walk(tree) if isinstance(node, ast.Call)
                        for kw in node.keywords if kw.arg == "package_data")
    folder = os.path.join(ROOT, *package.split("."))
    patterns = ast.literal_eval(package_data)[package]
    shipped = {os.path.relpath(p, folder) for pattern in patterns for p in glob.glob(os.path.join(folder, pattern))}
    data = {os.path.relpath(p, folder) for p in glob.glob(os.path.join(folder, "**", "*"), recursive=True)
            if os.path.isfile(p) and "__pycache__" not in p and not p.endswith((".py", ".pyc", ".so"))}
    assert data and data <= shipped, sorted(data - shipped)


def test_the_transformer_configs_are_their_towers_runs_with_an_attention_body():
    from trainer.run_setup import net_config

    gpu, gpu_bt = load_named_config("gpu"), load_named_config("gpu-bt")
    assert dataclasses.replace(gpu_bt, model=gpu.model, optimizer=gpu.optimizer) == gpu
    assert net_config(gpu_bt).name == "bt-256x10x8h" and gpu_bt.optimizer.lr < gpu.optimizer.lr
    assert net_config(gpu_bt).input_format == 4 and net_config(gpu).input_format == 1   # Leela's transformers'
    assert gpu_bt.model.input_format == 4
    teacher, teacher_bt = load_named_config("teacher-6x64"), load_named_config("teacher-bt-64x6x4h")
    assert dataclasses.replace(teacher_bt, model=teacher.model, optimizer=teacher.optimizer) == teacher
    assert net_config(teacher_bt).body == "attention"
