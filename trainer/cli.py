"""The ``cyzero-train`` command (not built yet)."""

import sys


def main(argv=None) -> int:
    """Run the training daemon; returns the process exit code."""
    print("cyzero-train: the training daemon is not built yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
