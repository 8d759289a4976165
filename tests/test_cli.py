"""The command lines a newcomer meets first.

* ``make engine`` is offered to GUIs as an engine command: its stdout must be
  UCI and nothing else, and a second start must not build anything.
* ``cyzero perft`` takes what its usage line says.
* ``cyzero-train`` on an engine-only install (no torch) says which extra to
  install; a bad ``--checkpoint`` gets a one-line reason, not a traceback.
* Results go to stdout, progress and errors to stderr.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from make_env import REPO, clean_make_env
from test_uci_harness import check_line
from uci import cli

VENV_PYTHON = os.path.join(REPO, ".venv", "bin", "python")
KIWIPETE = "r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1"


# --------------------------------------------------------------------------- make engine

needs_venv = pytest.mark.skipif(
    not (os.path.exists(VENV_PYTHON) and shutil.which("make")),
    reason="needs make and the repository's .venv (`make test` creates it)",
)


def _run_make_engine(argv: list[str], cwd) -> subprocess.CompletedProcess:
    # A clean make environment: no flags or variables inherited from a `make test` around us.
    env = clean_make_env()
    return subprocess.run(argv, input="uci\nisready\nquit\n", capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=850)


def _assert_only_uci(stdout: str) -> None:
    lines = stdout.splitlines()
    assert "uciok" in lines and lines[-1] == "readyok", stdout[-2000:]
    problems = [problem for problem in map(check_line, lines) if problem]
    assert not problems, problems


@needs_venv
@pytest.mark.timeout(900)  # the first run installs or builds whatever is out of date
def test_make_engine_prints_only_uci_and_starts_again_without_building(tmp_path):
    # As README tells a GUI to run it: from another folder.
    gui_command = ["make", "-s", "-C", REPO, "engine"]
    first = _run_make_engine(gui_command, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    _assert_only_uci(first.stdout)
    second = _run_make_engine(gui_command, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    _assert_only_uci(second.stdout)
    assert "compiling" not in second.stderr and "pip" not in second.stderr, second.stderr[-3000:]
    # In the repository itself plain `make engine` (no -s) is just as quiet: every recipe is silent.
    plain = _run_make_engine(["make", "engine"], REPO)
    assert plain.returncode == 0, plain.stderr[-3000:]
    _assert_only_uci(plain.stdout)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_engine_installs_the_engine_alone_and_make_test_the_rest(tmp_path):
    """`make engine` installed the whole trainer (torch, tensorboard, mypy: a 1.6 GB venv) to run an
    engine that never imports torch. What each target would install into a new venv (make -n):"""
    env = clean_make_env()

    def plan(target: str) -> str:
        done = subprocess.run(["make", "-n", "-C", REPO, f"VENV={tmp_path / 'venv'}", target],
                              capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    engine = plan("engine")
    assert "pip install" in engine and " -e '.'" in engine, engine
    assert "torch" not in engine.lower() and "[train" not in engine and "dev]" not in engine, engine
    for target in ("test", "train"):
        full = plan(target)
        assert "CYZERO_TORCH" in full and "-e '.[train,dev" in full, full
        pythons = set(re.findall(r"(\S+) -m pip", full))
        assert pythons == {f"{tmp_path / 'venv'}/bin/python"}, full      # one venv for all


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_train_takes_a_config_by_name_once(tmp_path):
    """`make train ARGS='--config gpu'` passed --config twice (argparse kept the second); CONFIG=gpu
    passes it once, a new run without CONFIG gets the CPU config, a resumed one its own config.toml."""
    env = clean_make_env()
    run = tmp_path / "run"

    def command(*variables: str) -> str:
        done = subprocess.run(["make", "-n", "-C", REPO, f"VENV={tmp_path / 'venv'}", f"RUN={run}", *variables,
                               "train"], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        return [line for line in done.stdout.splitlines() if "cyzero-train run" in line][-1].strip()

    assert command("CONFIG=gpu").count("--config") == 1 and command("CONFIG=gpu").endswith(f"run {run} --config gpu")
    assert command().endswith(f"run {run} --config cpu")
    run.mkdir()
    (run / "config.toml").write_text("")
    assert "--config" not in command()
    assert command("CONFIG=gpu").endswith("--config gpu")
    assert command("PORT=5790").endswith("--port 5790") and "--port" not in command()


@needs_venv
@pytest.mark.timeout(300)
def test_make_test_lists_the_reasons_of_skipped_tests(tmp_path):
    """The README says `make test` lists why tests were skipped; it printed only "1 skipped"."""
    (tmp_path / "test_skips.py").write_text(textwrap.dedent("""
        import pytest

        def test_needs_a_frobnicator():
            pytest.skip("no frobnicator on this machine")
        """))
    env = clean_make_env()
    # -o: the venv and the build are taken as they are (this suite runs in them); only the test
    # recipe runs, on a file of its own.
    up_to_date = [arg for stamp in (".cyzero-engine", ".cyzero-installed", ".cyzero-built")
                  for arg in ("-o", os.path.join(".venv", stamp))]
    done = subprocess.run(["make", "-s", "-C", REPO, *up_to_date, "test", f"TESTS={tmp_path / 'test_skips.py'}"],
                          capture_output=True, text=True, env=env, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "SKIPPED [1]" in done.stdout and "no frobnicator on this machine" in done.stdout, done.stdout[-3000:]


# --------------------------------------------------------------------------- cyzero perft


def test_perft_usage_is_what_the_parser_takes(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["perft", "--help"])
    assert info.value.code == 0
    usage = capsys.readouterr().out.splitlines()[0]
    assert usage == "usage: cyzero perft [-h] [--chess960] [--divide] FEN|startpos DEPTH"
    # Each form the usage line allows: options first or last, FEN quoted or as separate words.
    for argv, expected in [
        (["startpos", "3"], "8902"),
        ([KIWIPETE, "2"], "2039"),
        ([*KIWIPETE.split(), "2"], "2039"),
        (["--chess960", "startpos", "2"], "400"),
        (["startpos", "2", "--chess960"], "400"),
        (["startpos", "0"], "1"),
    ]:
        assert cli.main(["perft", *argv]) == 0, argv
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == (expected + "\n", ""), argv


def test_perft_divide_is_the_result_on_stdout(capsys):
    assert cli.main(["perft", "--divide", KIWIPETE, "1"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[-2:] == ["", "Nodes searched: 48"] and len(lines) == 50
    assert lines[0] == "a1b1: 1" and captured.err == ""


@pytest.mark.parametrize("argv, message", [
    (["startpos", "x"], "depth must be a whole number, got 'x'"),
    (["startpos", "-1"], "depth must be 0 or more, got -1"),
    (["startpos"], "expected a FEN (or 'startpos') and a depth"),
    (["8/8/8", "1"], "invalid FEN '8/8/8'"),
])
def test_perft_bad_input_is_one_line_on_stderr_and_status_2(capsys, argv, message):
    assert cli.main(["perft", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("cyzero perft: " + message) and captured.err.count("\n") == 1, captured.err


def test_perft_without_arguments_shows_the_usage(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["perft"])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "usage: cyzero perft" in captured.err


# --------------------------------------------------------------------------- an engine-only install

# Runs a module's main() with torch unimportable, as after `pip install .` without the train extra.
WITHOUT_TORCH = textwrap.dedent("""
    import runpy, sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, NoTorch())
    module = sys.argv[1]
    sys.argv = [module] + sys.argv[2:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    """)


def _without_torch(module: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, module, *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cyzero_train_without_torch_says_which_extra_to_install(tmp_path):
    done = _without_torch("trainer.cli", "export", "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("cyzero-train export: needs torch")
    assert "pip install 'cyzero[train]'" in done.stderr
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in done.stderr
    assert not (tmp_path / "out").exists()
    # --help needs no torch.
    helped = _without_torch("trainer.cli", "export", "--help")
    assert helped.returncode == 0 and "--checkpoint" in helped.stdout, helped.stderr


def test_the_engine_commands_run_without_torch():
    done = _without_torch("uci.cli", "perft", "startpos", "2")
    assert (done.returncode, done.stdout) == (0, "400\n"), done.stderr


# --------------------------------------------------------------------------- cyzero-train export


@pytest.fixture
def checkpoint_bytes():
    """A real torch checkpoint of a 1x8 network, as bytes."""
    torch = pytest.importorskip("torch", reason="cyzero-train needs the train extra (pip install 'cyzero[train]')")
    from trainer.model import build_net, save_checkpoint_dict

    buffer = io.BytesIO()
    torch.save(save_checkpoint_dict(build_net("1x8", seed=5)), buffer)
    return buffer.getvalue()


def _export(capsys, *argv: str):
    from trainer.cli import main

    status = main(["export", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_export_says_what_is_wrong_with_a_bad_checkpoint(tmp_path, capsys, checkpoint_bytes):
    import torch

    from trainer.model import build_net, save_checkpoint_dict

    missing_weight = save_checkpoint_dict(build_net("1x8", seed=5))
    missing_weight["model"].pop(next(iter(missing_weight["model"])))
    cases = {
        "empty.pt": (b"", "is empty (0 bytes)"),
        "notes.txt": (b"these are my notes, not a network\n", "is not a torch checkpoint"),
        "truncated.pt": (checkpoint_bytes[: len(checkpoint_bytes) // 2], "is a truncated or damaged zip archive"),
        "list.pt": ([1, 2, 3], "holds a list, not a dict"),
        "missing.pt": (missing_weight, "does not hold a network cyzero can load"),
    }
    out_dir = tmp_path / "out"
    for name, (content, message) in cases.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            torch.save(content, path)
        status, out, err = _export(capsys, "--checkpoint", str(path), "--out", str(out_dir), "--variants", "fp32")
        assert status == 2, name
        assert out == "", name
        assert err.startswith(f"cyzero-train export: error: checkpoint {path} {message}"), err
        assert err.count("\n") == 1 and "Traceback" not in err, err
    status, out, err = _export(capsys, "--checkpoint", str(tmp_path / "absent.pt"), "--out", str(out_dir))
    assert status == 2 and "cannot read checkpoint" in err and "No such file" in err, err
    assert not out_dir.exists()


def test_export_puts_reports_on_stdout_and_progress_on_stderr(tmp_path, capsys, checkpoint_bytes):
    path = tmp_path / "net.pt"
    path.write_bytes(checkpoint_bytes)
    argv = ["--checkpoint", str(path), "--out", str(tmp_path / "out"), "--variants", "fp32", "--positions", "8"]
    status, out, err = _export(capsys, *argv)
    assert status == 0, err
    assert out.startswith("fp32  ") and "max |diff| vs torch" in out and out.count("\n") == 1, out
    assert err.startswith("exporting 1x8"), err
    status, out, err = _export(capsys, *argv, "--json")
    assert status == 0, err
    assert [report["variant"] for report in json.loads(out)] == ["fp32"]
