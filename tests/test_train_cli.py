"""`cyzero-train` end to end: bootstrap from the real stockfish, learn, status, and the one-line errors."""

import json
import os
import shutil

import pytest

pytest.importorskip("torch", reason="cyzero-train needs the train extra (pip install 'cyzero[train]')")

from trainer.cli import main  # noqa: E402
from trainer.store import ReplayStore  # noqa: E402
from tiny_configs import tiny_config  # noqa: E402

STOCKFISH = shutil.which("stockfish") or shutil.which("/usr/games/stockfish")
needs_stockfish = pytest.mark.skipif(STOCKFISH is None, reason="no stockfish on PATH or at /usr/games/stockfish")

pytestmark = pytest.mark.timeout(180)

TINY = tiny_config(train={"checkpoint_every": 3},
                   replay={"floor": 1000, "workers": 0, "val_percent": 0, "validation_positions": 0})


@needs_stockfish
def test_bootstrap_learn_status_from_the_command_line(tmp_path, capsys):
    run = str(tmp_path / "run")
    # A bare --teacher finds Debian's stockfish even where /usr/games is not on PATH.
    args = ["bootstrap", run, "--teacher", "--positions", "60", "--workers", "1", "--depth", "2",
            "--max-plies", "40", "--opening-plies", "4", "--no-progress"]
    assert main(args) == 0
    assert ReplayStore(run).total_positions() == 60
    assert main(args) == 0  # resumed: nothing left to add
    assert ReplayStore(run).total_positions() == 60

    with open(os.path.join(run, "config.toml"), "w") as f:
        f.write(TINY)
    assert main(["learn", run, "--steps", "3", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["status", run, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["checkpoint"]["step"] == 3 and status["generation"]["generation"] == 1
    assert status["data"]["by_source"] == {"teacher": 60}
    assert os.path.exists(os.path.join(run, status["generation"]["onnx"]))


@pytest.mark.parametrize("args, message", [
    (["bootstrap", "{run}", "--teacher", "no-such-engine-here", "--positions", "5"], "cannot start teacher"),
    (["bootstrap", "{run}", "--teacher"], "--teacher needs --positions"),
    (["bootstrap", "{run}", "--pgn", "{run}/missing.pgn"], "missing.pgn"),
    (["learn", "{run}", "--devices", "tpu:3"], "--devices"),
    (["learn", "{run}", "--steps", "0"], "--steps must be at least 1"),
])
def test_bad_input_is_one_line_and_a_nonzero_exit(tmp_path, capsys, args, message):
    run = str(tmp_path / "run")
    try:
        code = main([a.format(run=run) for a in args])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    assert code != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["run", "learn"])
def test_a_config_name_that_is_neither_a_file_nor_bundled_lists_the_bundled_ones_and_creates_nothing(
        tmp_path, capsys, command):
    from trainer.config import bundled_config_names

    run = tmp_path / "run"
    assert main([command, str(run), "--config", "cpuu"]) == 2
    err = capsys.readouterr().err
    assert "cannot read config cpuu: no such file, and no bundled config is called that (bundled: " in err
    assert "cpu, gpu" in err and all(name in err for name in bundled_config_names())
    assert "No such file or directory" not in err and "Traceback" not in err
    assert not run.exists()


needs_no_cuda = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")


@needs_no_cuda
@pytest.mark.parametrize("flag", ["--devices", "--learner-devices"])
def test_run_refuses_gpu_devices_this_machine_does_not_have_at_start(tmp_path, capsys, flag):
    """`run --devices cuda:0` used to play on the CPU without a word, `run --learner-devices cuda:0`
    to restart the learner forever: both are refused at start with the line `learn` gives."""
    import torch

    run = tmp_path / "run"
    assert main(["run", str(run), flag, "cuda:0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"cyzero-train run: error: {flag} cuda:0: no CUDA device here (torch {torch.__version__}, "
                   f"CUDA build {torch.version.cuda or 'none'})"]
    assert not run.exists()
    assert main(["learn", str(run), "--devices", "cuda:0"]) == 2
    assert f"--devices cuda:0: no CUDA device here (torch {torch.__version__}" in capsys.readouterr().err


@needs_no_cuda
def test_a_simulated_gpu_needs_no_cuda_for_self_play_but_the_learner_does(tmp_path):
    from trainer.config import default_config
    from trainer.daemon import Daemon

    Daemon(tmp_path, default_config(), devices="cuda:0", simulate_gpu=True, learner_devices="cpu:1").check_devices()
    with pytest.raises(ValueError, match="--learner-devices cuda:0: no CUDA device here"):
        Daemon(tmp_path, default_config(), devices="cuda:0", simulate_gpu=True,
               learner_devices="cuda:0").check_devices()
    with pytest.raises(ValueError, match="daemon.devices cuda:0: no CUDA device here"):
        Daemon(tmp_path, default_config().replace(daemon={"devices": "cuda:0"})).check_devices()


def test_bootstrap_help_shows_the_teacher_defaults_the_labelling_uses(capsys):
    """`bootstrap --help` names each teacher setting's default (issue 46), and they are the ones
    trainer.bootstrap labels with when the option is left out."""
    from trainer import bootstrap

    with pytest.raises(SystemExit) as exit_:
        main(["bootstrap", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "positions the run's store should hold in all; required, no default" in text
    assert f"search depth per position (default {bootstrap.DEFAULT_DEPTH})" in text
    assert f"moves scored per position (default {bootstrap.DEFAULT_MULTIPV})" in text
    assert f"game length adjudicated a draw (default {bootstrap.DEFAULT_MAX_PLIES})" in text
    assert "teacher processes (default: one per core" in text
    assert "(default None)" not in text and "(default: None)" not in text


def test_run_help_names_every_bundled_config(capsys):
    """`run --help` named 2 bundled configs while `--config` took 7 (issue 46)."""
    from trainer.config import bundled_config_names

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = "".join(capsys.readouterr().out.split())   # argparse breaks lines, even inside names
    names = bundled_config_names()
    assert len(names) >= 7 and {"cpu", "gpu"} <= set(names)
    assert f"({','.join(names)})" in text
