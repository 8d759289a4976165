"""Shared pytest configuration.

The repository root and this folder are put on ``sys.path`` so that the built
extension (``engine.board``) and the helper module ``chess_reference`` import
no matter which directory pytest is started from.
"""

import os
import sys

import pytest

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_TESTS_DIR)
for _path in (_REPO_ROOT, _TESTS_DIR):
    if _path not in sys.path:
        sys.path.insert(0, _path)


@pytest.fixture
def one_thread():
    """torch on one thread here and in subprocesses (the environment it yields): the same sums in
    the same order run to run, and no op's thread waits on a core another process holds (the
    machine is shared). Files that want it everywhere say ``pytest.mark.usefixtures("one_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield {**os.environ, "OMP_NUM_THREADS": "1"}
    torch.set_num_threads(before)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA GPU (torch.cuda); skipped with the reason shown where there is none"
    )


def _cuda_missing_reason():
    """Why the gpu tests cannot run here, or None when a CUDA device is usable."""
    try:
        import torch
    except ImportError:
        return "gpu test: torch is not installed"
    if not torch.cuda.is_available():
        return f"gpu test: no CUDA device (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'})"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return  # torch is imported only when a gpu test was collected
    reason = _cuda_missing_reason()
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))
