"""The real ``cyzero`` UCI process on a slow stand-in network, for tests (holds no tests).

``python tests/slow_network_engine.py [--eval-ms N] [--load-ms N]`` runs ``uci``'s main with
every :class:`engine.network.Network` made ``--load-ms`` slower to load and each of its
``evaluate`` calls ``--eval-ms`` slower (a big network on a slow machine, or a GPU's first load),
the rest untouched: the protocol, the search and the real network's outputs.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import network  # noqa: E402


def slow_down(load_s: float, eval_s: float) -> None:
    original_init, original_evaluate = network.Network.__init__, network.Network.evaluate

    def __init__(self, *args, **kwargs):
        time.sleep(load_s)
        original_init(self, *args, **kwargs)

    def evaluate(self, *args, **kwargs):
        time.sleep(eval_s)
        return original_evaluate(self, *args, **kwargs)

    network.Network.__init__ = __init__
    network.Network.evaluate = evaluate


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--eval-ms", type=float, default=50.0)
    parser.add_argument("--load-ms", type=float, default=0.0)
    args = parser.parse_args()
    slow_down(args.load_ms / 1000.0, args.eval_ms / 1000.0)
    from uci.__main__ import main

    sys.exit(main())
