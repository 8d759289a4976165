"""Shared pytest configuration.

The repository root and this folder are put on ``sys.path`` so that the built
extension (``engine.board``) and the helper module ``chess_reference`` import
no matter which directory pytest is started from.
"""

import os
import sys

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_TESTS_DIR)
for _path in (_REPO_ROOT, _TESTS_DIR):
    if _path not in sys.path:
        sys.path.insert(0, _path)

