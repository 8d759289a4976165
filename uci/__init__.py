"""The UCI protocol front end: parsing, options, the session state machine, the stdout writer.

Run it with ``python -m uci`` or the ``cyzero`` command with no arguments.
"""
