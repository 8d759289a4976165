"""The environment for a `make` that a test starts.

A `make test TORCH_INDEX=...` around the suite passes its command-line variables down to every make
started below it (in MAKEFLAGS, and exported), and the Makefile exports some of its own: a nested
make would take them for the test's. The test's make sees only the variables the test names.
"""

from __future__ import annotations

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# How make hands its flags and command-line variables to the makes below it.
MAKE_CHANNELS = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "GNUMAKEFLAGS")


def makefile_variables() -> set[str]:
    """Every variable the Makefile lets a caller set (``NAME ?=``) or exports to its recipes."""
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as f:
        text = f.read()
    return set(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)\s*\?=", text, re.M)) | \
        set(re.findall(r"^export\s+([A-Za-z_][A-Za-z0-9_]*)", text, re.M))


def clean_make_env(**extra: str) -> dict[str, str]:
    """This process's environment without make's channels and the Makefile's variables, plus ``extra``."""
    drop = set(MAKE_CHANNELS) | makefile_variables()
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env
