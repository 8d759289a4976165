"""The run folder (trainer.rundir): the one run lock, process liveness, the config a start uses."""

import os
import subprocess
import sys

import pytest

from trainer.config import default_config, load_config
from trainer.rundir import (
    CONFIG_FILE, DAEMON_LOCK, LEARNER_LOCK, RunBusy, check_run_dir, lock_path, pid_alive, process_runs,
    resolve_config, run_lock,
)

_HOLD = "import sys, time; from trainer.rundir import run_lock\nwith run_lock(sys.argv[1], sys.argv[2]):\n" \
        "    print('held', flush=True); time.sleep(60)\n"


def test_a_second_holder_is_refused_with_the_first_ones_pid_until_it_dies(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path), LEARNER_LOCK], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(RunBusy, match=rf"another learner is running on {tmp_path} \(pid {holder.pid}\)"):
            with run_lock(tmp_path, LEARNER_LOCK):
                pass
        with run_lock(tmp_path, DAEMON_LOCK):  # another kind's lock is another file
            pass
    finally:
        holder.kill()
        holder.wait()
    with run_lock(tmp_path, LEARNER_LOCK):  # the kernel dropped the dead holder's lock
        assert open(lock_path(tmp_path, LEARNER_LOCK)).read() == f"{os.getpid()}\n"


def test_a_bootstrap_lock_lives_in_the_bootstrap_folder(tmp_path):
    with run_lock(tmp_path, "teacher"):
        assert os.path.exists(tmp_path / "bootstrap" / "teacher.lock")
        with pytest.raises(ValueError, match=r"another bootstrap \(teacher\) is running"):
            with run_lock(tmp_path, "teacher"):
                pass


def test_process_liveness(tmp_path):
    assert pid_alive(os.getpid()) is True
    assert pid_alive("12") is None and pid_alive(True) is None and pid_alive(0) is None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert pid_alive(child.pid) is False
    assert process_runs(os.getpid(), "run", str(tmp_path)) is False  # alive, but not `cyzero-train run RUN`


def test_a_start_uses_the_named_config_else_the_runs_else_the_defaults(tmp_path):
    assert resolve_config(tmp_path) == default_config()
    (tmp_path / CONFIG_FILE).write_text('[model]\nnet = "1x8"\n')
    assert resolve_config(tmp_path) == load_config(tmp_path / CONFIG_FILE)
    assert check_run_dir(tmp_path) == str(tmp_path)  # a run that only has its config counts
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is not a run directory: it holds none of a run's files"):
        check_run_dir(tmp_path / "empty")
