"""The daemon's endpoints, without torch: which binds need keys, ``--port``, who holds a taken port,
and the addresses another machine reaches this one at (``cyzero-train run``, status and the docs name
them here, once)."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import socket
import struct
from typing import Optional, Sequence

import zmq

from trainer.config import TrainConfig
from trainer.rundir import DAEMON_FILE

__all__ = ["check_bind", "machine_addresses", "on_ports", "port_in_use"]


def _host(endpoint: str) -> Optional[str]:
    """The host of a ``tcp://HOST:PORT`` endpoint (None for ipc:// and inproc://, which stay local)."""
    match = re.fullmatch(r"tcp://(.+):([0-9]+|\*)", endpoint.strip())
    if match is None:
        if endpoint.startswith(("ipc://", "inproc://")):
            return None
        raise ValueError(f"endpoint {endpoint!r} is not tcp://HOST:PORT (a PORT of * picks a free one)")
    return match.group(1).strip("[]")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # an interface name or a host name: reachable from elsewhere


def check_bind(endpoints: Sequence[str], keys: str) -> None:
    """ValueError when an endpoint is not loopback and no keys are set (nothing may listen open)."""
    for endpoint in endpoints:
        host = _host(endpoint)
        if host is not None and not _is_loopback(host) and not keys:
            raise ValueError(f"binding {endpoint} needs CurveZMQ keys: run `cyzero-train keys DIR` and set "
                             "daemon.keys")


def on_ports(config: TrainConfig, port: str) -> TrainConfig:
    """``config`` with the daemon's three sockets (endpoint, publish, fetch) on PORT, PORT+1 and PORT+2,
    each keeping its host; ``auto``: on free ports, which RUN/daemon.json and the log then name."""
    d = config.daemon
    if port == "auto":
        ports = ["*"] * 3
    else:
        try:
            base = int(port)
        except ValueError:
            raise ValueError(f"--port {port!r}: a port number (it and the next two are used) or auto") from None
        if not 1 <= base <= 65533:
            raise ValueError(f"--port {base}: between 1 and 65533 (it and the next two are used)")
        ports = [str(base + i) for i in range(3)]
    endpoints = {}
    for name, port_ in zip(("endpoint", "publish", "fetch"), ports):
        current = getattr(d, name)
        if _host(current) is None:
            raise ValueError(f"--port: daemon.{name} is {current}, not a tcp:// endpoint")
        endpoints[name] = f"{current.strip().rsplit(':', 1)[0]}:{port_}"
    return config.replace(daemon=endpoints)


def port_in_use(endpoints: Sequence[str], error: zmq.ZMQError) -> str:
    """For a bind that failed because a port is taken: who holds it (another cyzero run: its folder),
    the first of ``endpoints`` that is held, and how to choose other ports. Empty for any other failure."""
    if error.errno != zmq.EADDRINUSE:
        return ""
    ports = [int(m.group(1)) for m in (re.fullmatch(r"tcp://.+:([0-9]+)", e.strip()) for e in endpoints) if m]
    holder = next((h for h in map(_port_holder, ports) if h), "")
    return (f"{holder}. Give this run other ports: `cyzero-train run RUN --port 5790` (5790, 5791 and 5792; with "
            "make: make train PORT=5790), --port auto for free ones, or daemon.endpoint, publish and fetch "
            "in RUN/config.toml")


def _port_holder(port: int) -> str:
    """``": held by the cyzero run in FOLDER (pid N)"``, ``": held by NAME (pid N)"``, or "" where the
    holder cannot be seen (no psutil, another user's process)."""
    try:
        import psutil

        pids = {c.pid for c in psutil.net_connections(kind="inet")
                if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid}
        for pid in sorted(pids):
            process = psutil.Process(pid)
            run = _run_folder_of(process.cmdline(), process.cwd())
            if run is not None:
                return f": held by the cyzero run in {run} (pid {pid})"
            return f": held by {process.name()} (pid {pid})"
    except Exception:  # noqa: BLE001 - naming the holder is a courtesy; the error stands without it
        pass
    return ""


def _run_folder_of(cmdline: Sequence[str], cwd: str) -> Optional[str]:
    """The run folder of a ``cyzero-train run RUN`` command line (None for any other command), checked
    against that folder's daemon.json."""
    words = list(cmdline)
    for i, word in enumerate(words[:-1]):
        if word == "run" and any(w.endswith(("cyzero-train", "trainer.cli")) for w in words[:i]):
            folder = os.path.normpath(os.path.join(cwd, words[i + 1]))
            return folder if os.path.exists(os.path.join(folder, DAEMON_FILE)) else None
    return None


def machine_addresses() -> list[str]:
    """This machine's addresses another machine may reach it at (not loopback), best first: the
    one the default route leaves from, the host name's own, then the host name itself."""
    found: list[str] = []
    try:  # a UDP "connect" sends nothing: it only asks the kernel which address the route uses
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never a real peer
            found.append(probe.getsockname()[0])
    except OSError:
        pass
    found += _interface_addresses()
    try:
        found += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        pass
    addresses = [a for a in dict.fromkeys(found) if not _is_loopback(a) and a != "0.0.0.0"]
    return addresses + [socket.gethostname()]


def _interface_addresses() -> list[str]:
    """Each network interface's IPv4 address (Linux's SIOCGIFADDR; elsewhere none): a machine with no
    default route (a cluster's private network) is still reachable at them."""
    found = []
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return []
    for name in names:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
        except OSError:
            continue  # no IPv4 address on it
        found.append(socket.inet_ntoa(packed[20:24]))
    return found
