"""``python -m uci``: speak UCI on stdin/stdout (not built yet)."""

import sys


def main(argv=None) -> int:
    """Run the UCI front end; returns the process exit code."""
    print("cyzero: the UCI front end is not built yet (issue 5)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
