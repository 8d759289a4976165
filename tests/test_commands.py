"""Every ``cyzero`` and ``cyzero-train`` subcommand, run as a newcomer runs it.

Each gets only its required arguments and its smallest budget (``--seconds``, ``--games 2``,
``--steps 1``, a temporary run directory) and runs as a separate process from a temporary folder,
not the repository: the default files it needs (the bundled networks, openings, mate positions
and configs) must be found from the installed package. ``cyzero bench nn`` once looked for the
networks beside ``engine/tools/`` and failed with no arguments, while its test always passed
``--net``.

:func:`test_every_subcommand_is_run_here` keeps the list complete: a new subcommand without a case
here fails it. The commands that run until stopped (``run``, ``worker``) and the trainer's benchmarks
whose budget is fixed at a minute or so (``bench train``, ``bench selfplay``) are stopped once they
say they are under way.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import chess
import chess.pgn
import pytest

from uci import cli as cyzero_cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CYZERO = [sys.executable, "-m", "uci.cli"]          # what the `cyzero` console script runs
TRAIN = [sys.executable, "-m", "trainer.cli"]       # ... and `cyzero-train`
RANDOM_MOVER = f"{sys.executable} -m engine.tools.random_mover"
STOCKFISH = shutil.which("stockfish") or shutil.which("/usr/games/stockfish")
# Only turns a hang into a failure (the machine may be busy); no timing is asserted.
DEADLINE_S = 300

pytestmark = pytest.mark.timeout(600)


def _env() -> dict:
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")   # the checkout, wherever we run
    return env


def _run(argv: list[str], cwd, stdin: str = "") -> subprocess.CompletedProcess:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=cwd, env=_env(),
                          timeout=DEADLINE_S)
    _check(argv, done.returncode, done.stdout, done.stderr)
    return done


def _check(argv, code, out: str, err: str) -> None:
    shown = f"{' '.join(argv[2:])}\nstdout: {out[-2000:]}\nstderr: {err[-3000:]}"
    assert code == 0, shown
    assert "Traceback" not in err, shown
    # What a missing default file looked like ("no bundled network in .../engine/tools/nets").
    assert not re.search(r"no bundled|is missing|No such file|FileNotFoundError", out + err), shown


# --------------------------------------------------------------------------- the list


def _names(parser: argparse.ArgumentParser, prefix: str = "") -> set[str]:
    """Every runnable command below ``parser``: subparsers, and a positional's choices (``bench what``)."""
    names: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                below = _names(sub, f"{prefix}{name} ")
                names |= below or {f"{prefix}{name}"}
        elif not action.option_strings and action.choices and prefix:
            names |= {f"{prefix}{choice}" for choice in action.choices}
    return names


def _train_parser() -> argparse.ArgumentParser:
    from trainer import cli as train_cli

    return train_cli._build_parser()


CYZERO_CASES = {
    "perft": (["perft", "startpos", "1"], "20"),
    "bench perft": (["bench", "perft", "--seconds", "0.01"], "ratio"),
    "bench nn": (["bench", "nn", "--seconds", "0.01", "--batches", "1"], "int8"),
    "bench tree": (["bench", "tree", "--seconds", "0.01"], "playouts/s"),
    "bench uci": (["bench", "uci", "--trials", "1", "--starts", "1", "--movetimes", "10"], "stop -> bestmove"),
    "bench search": (["bench", "search", "--seconds", "0.01"], "nodes"),
    "bench null": (["bench", "null", "--seconds", "0.01", "--batches", "8", "--positions", "1", "--lc0", "none"],
                   "nodes/s"),
    "bench mates": (["bench", "mates", "--nodes", "1"], "%"),
    "match": (["match", "--engine2", RANDOM_MOVER, "--games", "2", "--nodes", "1"], "Elo difference"),
    "eval": (["eval", os.path.join(REPO, "engine", "nets", "default.onnx"), "--positions",
              os.path.join(REPO, "tests", "data", "eval-positions.jsonl")], '"policy": {'),
}
# Each cyzero-train subcommand and the test below that runs it.
TRAIN_CASES = {
    "keys": "test_keys_and_export",
    "export": "test_keys_and_export",
    "bootstrap": "test_bootstrap_learn_status_plot_evaluate",
    "learn": "test_bootstrap_learn_status_plot_evaluate",
    "status": "test_bootstrap_learn_status_plot_evaluate",
    "plot": "test_bootstrap_learn_status_plot_evaluate",
    "evaluate": "test_bootstrap_learn_status_plot_evaluate",
    "run": "test_run_and_a_worker",
    "worker": "test_run_and_a_worker",
    "bench train": "test_train_bench_until_its_first_figure",
    "bench bootstrap": "test_train_bench_bootstrap",
    "bench selfplay": "test_train_bench_until_its_first_figure",
    "bench fleet": "test_train_bench_fleet",
    "bench store": "test_train_bench_store",
}


def _run_to_a_closed_pipe(argv: list[str], cwd) -> subprocess.CompletedProcess:
    """``argv`` with its stdout a pipe whose reader has already gone, as ``... | head`` leaves it."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                              cwd=cwd, env=_env(), timeout=DEADLINE_S)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("argv", [
    CYZERO + ["perft", "startpos", "3", "--divide"],
    CYZERO + ["eval", os.path.join(REPO, "engine", "nets", "default.onnx"), "--positions",
              os.path.join(REPO, "tests", "data", "eval-positions.jsonl")],
    CYZERO + ["--help"],
    TRAIN + ["--help"],
    TRAIN + ["run", "--help"],
    TRAIN + ["status", "run"],
], ids=lambda argv: " ".join(argv[2:4]))
def test_a_command_whose_reader_left_stops_quietly(argv, tmp_path):
    """`cyzero-train status runs/cpu | head` said `error: [Errno 32] Broken pipe`."""
    (tmp_path / "run").mkdir()
    shutil.copy(os.path.join(REPO, "trainer", "configs", "cpu.toml"), tmp_path / "run" / "config.toml")
    done = _run_to_a_closed_pipe(argv, tmp_path)
    assert done.stderr == "" and done.returncode in (0, 141), (done.returncode, done.stderr[-2000:])


def test_a_broken_pipe_that_is_not_stdout_is_still_an_error():
    """A command writing to a child that died must not pass for one whose reader left."""
    code = ("import os; from engine.tools.closed_stdout import quiet_when_reader_gone\n"
            "@quiet_when_reader_gone\n"
            "def main():\n"
            "    r, w = os.pipe(); os.close(r); os.write(w, b'x')\n"
            "main()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert done.returncode == 1 and "BrokenPipeError" in done.stderr, done.stderr[-2000:]


def test_every_subcommand_is_run_here():
    assert _names(cyzero_cli.build_parser()) == set(CYZERO_CASES)
    assert _names(_train_parser()) == set(TRAIN_CASES)
    assert set(TRAIN_CASES.values()) <= set(globals())


# --------------------------------------------------------------------------- cyzero


def test_cyzero_speaks_uci_with_the_bundled_network(tmp_path):
    done = _run(CYZERO, tmp_path, "uci\nisready\nposition startpos\ngo nodes 5\n")
    lines = done.stdout.splitlines()
    assert any(line.startswith("info string loaded network default.") for line in lines), lines
    assert lines[-1].startswith("bestmove ") and not [line for line in lines if "error" in line], lines


@pytest.mark.parametrize("name", sorted(CYZERO_CASES))
def test_cyzero_subcommand_with_its_defaults(name, tmp_path):
    argv, expected = CYZERO_CASES[name]
    done = _run(CYZERO + argv, tmp_path)
    assert expected in done.stdout, done.stdout[-2000:]


# --------------------------------------------------------------------------- cyzero-train


@pytest.fixture
def torch_installed():
    pytest.importorskip("torch", reason="cyzero-train needs the train extra (pip install 'cyzero[train]')")


def test_keys_and_export(tmp_path, torch_installed):
    _run(TRAIN + ["keys", "keys"], tmp_path)
    assert (tmp_path / "keys" / "server").is_dir()
    _run(TRAIN + ["export", "--out", "out", "--positions", "16"], tmp_path)
    assert sorted(p.name for p in (tmp_path / "out").glob("*.onnx"))


def _pgn(path, games: int = 4) -> None:
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(games):
            board = chess.Board()
            while not board.is_game_over() and board.ply() < 60:
                board.push(rng.choice(list(board.legal_moves)))
            game = chess.pgn.Game.from_board(board)
            game.headers["Result"] = "1/2-1/2"
            print(game, file=f, end="\n\n")


def test_bootstrap_learn_status_plot_evaluate(tmp_path, torch_installed):
    _pgn(tmp_path / "games.pgn")
    # Four games make one chunk, and the default 5% validation split (by the hash of a random chunk
    # name) held that one chunk out in about one run in twenty: learn then had nothing to train on.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.toml").write_text("[replay]\nval_percent = 0.0\n")
    _run(TRAIN + ["bootstrap", "run", "--pgn", "games.pgn"], tmp_path)
    _run(TRAIN + ["learn", "run", "--steps", "1"], tmp_path)
    assert _run(TRAIN + ["status", "run"], tmp_path).stdout.strip()
    _run(TRAIN + ["plot", "run"], tmp_path)
    assert list((tmp_path / "run" / "plots").glob("*.png"))
    _run(TRAIN + ["evaluate", "run", "--games", "2", "--nodes", "1"], tmp_path)
    assert (tmp_path / "run" / "evaluation.jsonl").read_text().strip()


class _Started:
    """A long-running command: its stderr read on a thread, waited on for a line.

    Each pipe has one reader thread and nothing else reads it: ``communicate()`` beside the
    stderr thread took lines from it and closed the pipe under it (a ValueError in the thread).
    """

    def __init__(self, argv: list[str], cwd) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(argv, cwd=cwd, env=_env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.err: list[str] = []
        self._out: list[str] = []
        self._seen = threading.Condition()
        self._readers = [threading.Thread(target=self._read_err, daemon=True),
                         threading.Thread(target=self._out.extend, args=(self.proc.stdout,), daemon=True)]
        for reader in self._readers:
            reader.start()

    @property
    def out(self) -> str:
        return "".join(self._out)

    def _read_err(self) -> None:
        for line in self.proc.stderr:
            with self._seen:
                self.err.append(line)
                self._seen.notify_all()

    def _wait(self, timeout: float) -> None:
        self.proc.wait(timeout)
        for reader in self._readers:
            reader.join(10)
        if not any(reader.is_alive() for reader in self._readers):
            self.proc.stdout.close()
            self.proc.stderr.close()

    def wait_for(self, text: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        with self._seen:
            while not any(text in line for line in self.err):
                assert self.proc.poll() is None, f"{self.argv[2:]} ended: {''.join(self.err)[-3000:]}"
                assert time.monotonic() < deadline, f"no {text!r} from {self.argv[2:]}: {''.join(self.err)[-3000:]}"
                self._seen.wait(0.5)

    def stop(self, sig=signal.SIGINT) -> None:
        """Stop it as Ctrl-C does; it must end cleanly."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self._wait(DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.argv[2:]} did not stop: {''.join(self.err)[-3000:]}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self._wait(DEADLINE_S)


def test_run_and_a_worker(tmp_path, torch_installed):
    # The documented defaults, but free ports, not 5780-5782: another run (or test) may hold those.
    daemon = _Started(TRAIN + ["run", "run", "--port", "auto"], tmp_path)
    try:
        daemon.wait_for("serving")
        endpoint = json.loads((tmp_path / "run" / "daemon.json").read_text())["endpoint"]
        # A second run on the first one's ports is told whose they are and how to choose others, at once.
        port = endpoint.rsplit(":", 1)[1]
        second = subprocess.run(TRAIN + ["run", "second", "--port", port], capture_output=True, text=True,
                                cwd=tmp_path, env=_env(), timeout=DEADLINE_S)
        assert second.returncode == 2, second.stderr[-2000:]
        assert "Address already in use" in second.stderr and \
            f"held by the cyzero run in {tmp_path / 'run'} (pid {daemon.proc.pid})" in second.stderr and \
            "--port auto" in second.stderr, second.stderr[-2000:]
        assert not (tmp_path / "second" / "checkpoints").exists()   # it stopped before making generation 0
        worker = _Started(TRAIN + ["worker", "--connect", endpoint, "--games", "2"], tmp_path)
        try:
            worker.wait_for("playing 2 games")
            worker.stop()
            _check(worker.argv, worker.proc.returncode, worker.out, "".join(worker.err))
        finally:
            worker.kill()
        daemon.stop()
        _check(daemon.argv, daemon.proc.returncode, daemon.out, "".join(daemon.err))
    finally:
        daemon.kill()


@pytest.mark.parametrize("what", ["selfplay", "train"])
def test_train_bench_until_its_first_figure(what, tmp_path, torch_installed):
    """bench train and bench selfplay measure for a fixed minute or so whatever ``--seconds`` says
    (a warm-up, then each setting): they are stopped at their first figure, past their set-up."""
    smallest = ["--games", "2"] if what == "selfplay" else []
    bench = _Started(TRAIN + ["bench", what, "--seconds", "0.1"] + smallest, tmp_path)
    try:
        bench.wait_for(f"bench {what}:")
        assert not [line for line in bench.err if "Traceback" in line], "".join(bench.err)
    finally:
        bench.kill()


def test_train_bench_fleet(tmp_path, torch_installed):
    done = _run(TRAIN + ["bench", "fleet", "--workers", "2", "--rate", "4", "--seconds", "1",
                         "--followers", "1", "--network-mb", "0.1"], tmp_path)
    assert "every acknowledged game stored once: yes" in done.stdout, done.stdout[-2000:]


def test_train_bench_store(tmp_path, torch_installed):
    store = tmp_path / "store"
    done = _run(TRAIN + ["bench", "store", "--run", str(store), "--positions", "3000", "--window", "2000",
                         "--batches", "1", "--rank-workers", "0", "--json"], tmp_path)
    figures = json.loads(done.stdout)
    assert figures["store"]["positions"] >= 3000 and [r["ranks"] for r in figures["loader"]] == [1, 8, 1, 8]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.toml").write_text("")
    refused = subprocess.run(TRAIN + ["bench", "store", "--run", str(tmp_path / "run"), "--positions", "10"],
                             capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=DEADLINE_S)
    assert refused.returncode == 2 and "not a store `bench store` made" in refused.stderr, refused.stderr


@pytest.mark.skipif(STOCKFISH is None, reason="bench bootstrap plays its default teacher, Debian's stockfish: "
                                               "apt install stockfish (it goes to /usr/games)")
def test_train_bench_bootstrap(tmp_path, torch_installed):
    """Each labelling setting the table promises gets its row, with a cost and the positions it is from."""
    out = _run(TRAIN + ["bench", "bootstrap", "--seconds", "0.1"], tmp_path).stdout
    rows = re.findall(r"depth +(\d+) +MultiPV (\d+) +([\d.]+) ms a position +\(([\d,]+) positions\)", out)
    assert [(int(d), int(k)) for d, k, _, _ in rows] == [(4, 1), (6, 1), (6, 4), (8, 1), (8, 4), (8, 8)], out
    assert all(float(ms) > 0 and int(n.replace(",", "")) > 0 for _, _, ms, n in rows), out


@pytest.mark.parametrize("terminal", [True, False])
def test_typed_at_a_terminal_the_engine_says_on_stderr_that_it_is_ready(terminal):
    """`make engine` in a terminal waits for UCI after the build: one line on stderr says so.
    From a GUI's pipe, stderr stays silent; stdout carries nothing but UCI either way. The command
    it gives for a GUI is an absolute path that runs (a GUI starts engines from its own folder)."""
    import pty

    from uci.__main__ import terminal_hint

    if terminal:
        master, slave = pty.openpty()
        stdin = slave
    else:
        stdin = subprocess.PIPE
    engine = subprocess.Popen([sys.executable, "-m", "uci"], stdin=stdin, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    if terminal:
        os.close(slave)
        os.write(master, b"quit\n")
        out, err = engine.communicate(timeout=60)
        os.close(master)
    else:
        out, err = engine.communicate("quit\n", timeout=60)
    assert engine.returncode == 0 and out == ""
    assert err == (terminal_hint() + "\n" if terminal else ""), err
    command = terminal_hint().rsplit("runs it as ", 1)[1]
    assert os.path.isabs(command.split()[0]) and os.access(command.split()[0], os.X_OK), command


def test_bench_uci_reports_no_p99_from_fewer_than_a_hundred_samples():
    """A p99 of ten samples is their largest: it is not reported, and no target is judged on it."""
    from engine.tools.bench_uci import P99_SAMPLES, _summary_ms

    few = _summary_ms([i / 1000 for i in range(1, 11)])
    assert few["n"] == 10 and few["p99_ms"] is None and few["max_ms"] == 10.0 and few["p50_ms"] == 5.5
    many = _summary_ms([i / 1000 for i in range(1, P99_SAMPLES + 101)])
    assert many["p99_ms"] is not None and many["p99_ms"] < many["max_ms"]
