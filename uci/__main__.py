"""``python -m uci``: speak UCI on stdin/stdout."""

import os
import sys
import threading

from uci.session import run

# CPython hands the GIL to a waiting thread only once it has waited this long without a switch
# (5 ms by default). The reader that gets `stop` or `isready`, and the writer of the answer, wait
# for the GIL of the search thread, which holds it between its batches and takes it back after
# each short section without it, often before the waiting thread has woken: `cyzero bench uci`
# measured stop -> bestmove p99 5.8 ms (Stockfish: 0.3 ms). 0.1 ms shortens that wait. Nothing
# switches more often while no thread waits: the search thread alone, or ONNX Runtime's threads,
# which run without the GIL.
SWITCH_INTERVAL_S = 0.0001
# Libraries whose threads outlive the engine's own: the process leaves with os._exit once they are in.
NATIVE_RUNTIMES = ("onnxruntime", "openvino")


def terminal_hint() -> str:
    """What a person at a terminal reads first: how to talk to it, and the command a GUI needs (an
    absolute path: a GUI starts engines from a folder of its own)."""
    command = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "cyzero")
    if not os.path.exists(command):
        command = f"{os.path.abspath(sys.executable)} -m uci"
    return ("cyzero is ready and speaks UCI: type `uci`, `isready`, `position startpos`, "
            f"`go movetime 1000`; `quit` ends it. A chess GUI runs it as {command}")


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def _end_children() -> None:
    """Nothing outlives ``quit``: os._exit skips multiprocessing's exit handler, which ends the
    processes a library started (OpenVINO's telemetry did; engine.sessions.import_openvino keeps it
    from starting), so end them here."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None:
        return
    for child in multiprocessing.active_children():
        child.kill()


def main(argv=None) -> int:
    """Run the UCI front end; returns the process exit code."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # Whatever the locale: undecodable input bytes must not kill the reader (a strict UTF-8 or
    # ASCII stdin raised UnicodeDecodeError on the first junk byte), and echoing them back in an
    # error line must not fail the writer (which then closes stdout for good).
    for stream, errors in ((sys.stdin, "surrogateescape"), (sys.stdout, "backslashreplace")):
        try:
            stream.reconfigure(errors=errors)
        except (AttributeError, ValueError, OSError):
            pass
    if _is_terminal(sys.stdin):
        # Typed at a terminal (`make engine`), the engine otherwise waits in silence after the
        # build and looks hung. stderr: stdout carries nothing but UCI.
        print(terminal_hint(), file=sys.stderr, flush=True)
    code = run()
    if threading.active_count() > 1 or any(name in sys.modules for name in NATIVE_RUNTIMES):
        # A search or a network load may still be inside ONNX Runtime on a daemon thread, and
        # the runtimes keep native threads of their own that Python does not count (OpenVINO's
        # pool); finalizing the interpreter under either aborts the process ("terminate called
        # without an active exception", SIGABRT: once in a clean-clone test run, at quit after a
        # first load inside go, no Python thread left). Everything was written and flushed:
        # leave at once.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        _end_children()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
