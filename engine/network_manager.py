"""The UCI layer's one handle on networks: the swap plus the watchers that feed it.

    >>> manager = NetworkManager("<default>", backend="cpu", log=print)
    >>> net = manager.get()                   # loads on first use (isready, or the first go)
    loaded network default.onnx sha256:1e24186e84ad CPU fp32 6x64, float32 io
    >>> manager.set_endpoint("tcp://127.0.0.1:5781")   # follow a training daemon
    ...                                       # (a new network is loaded and verified in the background)
    >>> manager.apply_pending(searcher.network_changed)   # between searches only
    True
    >>> manager.reconfigure("<default>", backend="cpu", device_id=0, threads=2)   # UCI Threads 2
    True                                      # (built in the background; the network in use plays on)
    >>> manager.wait_reloaded()               # isready waits for it
    >>> manager.close()

The parts: :mod:`engine.weights` (locating, verifying, building),
:mod:`engine.watchers` (the ``WeightsFile`` watcher and the ``TrainerEndpoint``
follower), :mod:`engine.swap` (the network in use and the loader).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Optional

from engine.announce import ClientKeys, load_client_keys
from engine.network import Network, NetworkError
from engine.swap import NetworkSwap
from engine.watchers import (
    POLL_INTERVAL_S,
    SILENCE_S,
    TrainerFollower,
    WeightsFileWatcher,
    signature_of,
    validate_endpoint,
)
from engine.swap import Proposal
from engine.weights import (DEFAULT_WEIGHTS, Candidate, NetworkBuilder, planned_cpu_provider, resolve_weights,
                            weights_path, without_file_name)

__all__ = ["NetworkManager"]

_logger = logging.getLogger(__name__)


class NetworkManager:
    """Owns the network in use and hot-swaps new ones between searches.

    Parameters
    ----------
    weights
        The ``WeightsFile`` value (a path, or ``"<default>"``); also the file
        watched for replacements.  It is checked on the first :meth:`get`.
    backend, device_id, threads, network_options, loader
        How every network is built (:class:`engine.weights.NetworkBuilder`).
    log
        Called (from any thread) with one line for the user: loads, swaps,
        refusals, dropped messages.  The UCI layer prints them as ``info string``
        when the engine may speak (``uci.session.Floor``: between commands they wait).
    endpoint, keys
        A ``TrainerEndpoint`` to follow at once, and the ``TrainerKeys`` for it
        (see :meth:`set_endpoint`, :meth:`set_trainer_keys`).
    watch, poll_interval
        Watch the file for replacements (after the first load), this often.
    fallback
        The network to keep (said once) when ``weights`` cannot be loaded:
        the one in use before a ``WeightsFile`` change.
    zmq_context, cache_dir, silence_s
        For the follower (:class:`engine.watchers.TrainerFollower`).
    """

    def __init__(
        self,
        weights: str | os.PathLike | None = DEFAULT_WEIGHTS,
        *,
        backend: str = "auto",
        device_id: int = 0,
        threads: Optional[int] = None,
        log: Optional[Callable[[str], object]] = None,
        loader: Callable[..., Any] = Network,
        endpoint: Optional[str] = None,
        keys: Optional[str] = None,
        watch: bool = True,
        poll_interval: float = POLL_INTERVAL_S,
        network_options: Optional[dict] = None,
        fallback: Optional[Candidate] = None,
        zmq_context: Any = None,
        cache_dir: Optional[str] = None,
        silence_s: Optional[float] = None,
    ) -> None:
        self._weights = weights
        self.path = weights_path(weights)
        self._log = log if log is not None else _logger.warning
        self._loader = loader
        self._builder = NetworkBuilder(loader, backend=backend, device_id=device_id, threads=threads,
                                       options=network_options, log=self._log)
        self._settings = self._effective(self.path, backend, device_id, threads, network_options)
        self._reloads = 0
        self._swap = NetworkSwap(self._load_first, self._build, self._log, fallback=fallback)
        self._watch = watch
        self._poll = float(poll_interval)
        self._baseline: Optional[tuple] = None
        self._lock = threading.Lock()
        self.watcher: Optional[WeightsFileWatcher] = None
        self.follower: Optional[TrainerFollower] = None
        self.endpoint: Optional[str] = None
        self._keys: Optional[ClientKeys] = None
        self._follower_options = dict(context=zmq_context, cache_dir=cache_dir, silence_s=silence_s)
        if keys:
            self.set_trainer_keys(keys)
        if endpoint:
            self.set_endpoint(endpoint)

    # ------------------------------------------------------------------ the network in use

    def _build(self, *args, **kwargs) -> Candidate:
        return self._builder.build(*args, **kwargs)    # the builder of the settings in force

    def _load_first(self) -> Candidate:
        self._baseline = signature_of(self.path)  # a change while loading is seen by the watcher
        path = resolve_weights(self._weights)
        try:
            return self._builder.load_weights_file(path)
        except NetworkError as e:
            raise NetworkError(f"WeightsFile {path}: {without_file_name(str(e), path)}") from None

    def get(self) -> Any:
        """The network in use, loaded (and verified) on the first call.

        Raises :class:`engine.weights.NoNetworkError` (a ``ValueError``) when
        there is none: the ``WeightsFile`` cannot be used and there is no
        ``fallback``.  The next call tries again.  Thread-safe; the caller
        keeps the returned reference for a whole search.
        """
        network = self._swap.get()
        if self._watch and self.watcher is None:
            with self._lock:
                if self.watcher is None and not self._swap.closed:
                    self.watcher = WeightsFileWatcher(self.path, self._swap, self._log,
                                                      baseline=self._baseline or signature_of(self.path),
                                                      poll_interval=self._poll)
        return network

    # ------------------------------------------------------------------ settings

    @staticmethod
    def _effective(path: str, backend: str, device_id: int, threads: Optional[int],
                   network_options: Optional[dict]) -> tuple:
        """What a network built with these settings depends on: on a CPU provider known before a
        load, neither the ``Backend`` that names it (``auto`` and ``openvino`` land on the same
        one on a CPU machine) nor the GPU number."""
        options = tuple(sorted((network_options or {}).items()))
        provider = planned_cpu_provider(backend)
        if provider is not None:
            return path, provider, None, threads or None, options
        return path, backend, device_id, threads or None, options

    def reconfigure(self, weights: str | os.PathLike | None, *, backend: str, device_id: int = 0,
                    threads: Optional[int] = None, network_options: Optional[dict] = None) -> bool:
        """Build networks with these settings from now on; returns whether a reload started.

        Nothing is reloaded when the network would come out the same (``GPU`` on a CPU, ``auto``
        for the provider it already is). Otherwise the network in use (a trainer's generation
        stays that generation) or, for a new ``WeightsFile``, that file is built again on the
        loader thread while the network in use goes on playing; it is switched to between
        searches (:meth:`apply_pending`) and :meth:`wait_reloaded` waits for it. A reload that
        fails is said and the network in use stays. Before the first load, the first
        :meth:`get` simply uses the new settings.
        """
        path = weights_path(weights)
        settings = self._effective(path, backend, device_id, threads, network_options)
        with self._lock:
            if self._swap.closed:
                raise RuntimeError("the network manager is closed")
            if settings == self._settings:
                return False
            self._settings = settings
            self._builder = NetworkBuilder(self._loader, backend=backend, device_id=device_id, threads=threads,
                                           options=network_options, log=self._log)
            old_watcher = None
            new_file = path != self.path
            if new_file:
                self._weights, self.path = weights, path
                self._baseline = signature_of(path)
                old_watcher, self.watcher = self.watcher, None   # the next get() watches the new file
            self._reloads += 1
            key = ("reload", self._reloads)
        if old_watcher is not None:
            old_watcher.close()
        current = self._swap.current
        if current is None:
            return False
        if not new_file and current.generation is not None and current.source:
            load = lambda: self._builder.build(current.source, current.sha256, generation=current.generation,  # noqa: E731
                                               run=current.run, reported_path=current.path)
        else:
            load = self._load_first
        return self._swap.propose(Proposal(self.path, None, key, load=load,
                                           failed=lambda reason: f"{reason}; keeping network {current.label()}"))

    def reloading(self) -> bool:
        """Whether a reload for new settings is waiting or being built."""
        return self._swap.reloading()

    def wait_reloaded(self, timeout: Optional[float] = None) -> bool:
        """Block until the reload for the newest settings is built (then pending) or refused."""
        return self._swap.wait_reloaded(timeout)

    def apply_pending(self, clear_cache: Optional[Callable[[], object]] = None) -> bool:
        """Install the verified candidate, if any; call between searches only (see :class:`NetworkSwap`)."""
        return self._swap.apply_pending(clear_cache)

    def swap_pending(self) -> bool:
        return self._swap.swap_pending()

    def wait_pending(self, timeout: Optional[float] = None) -> bool:
        return self._swap.wait_pending(timeout)

    @property
    def swap(self) -> NetworkSwap:
        return self._swap

    @property
    def fallback(self) -> Optional[Candidate]:
        """The network to keep when the ``WeightsFile`` cannot be loaded (set before the first :meth:`get`)."""
        return self._swap.fallback

    @fallback.setter
    def fallback(self, candidate: Optional[Candidate]) -> None:
        self._swap.fallback = candidate

    @property
    def in_use(self) -> Optional[Candidate]:
        """The network in use with where it came from (kept after :meth:`close`, for a ``fallback``)."""
        return self._swap.current

    @property
    def loaded(self) -> bool:
        return self._swap.current is not None

    @property
    def generation(self) -> Optional[int]:
        """The training generation of the network in use (``None``: not from a trainer)."""
        current = self._swap.current
        return None if current is None else current.generation

    @property
    def sha256(self) -> Optional[str]:
        current = self._swap.current
        return None if current is None else current.sha256

    @property
    def network_path(self) -> str:
        """The file of the network in use (the announced path after a trainer's swap)."""
        current = self._swap.current
        return self.path if current is None else current.path

    @property
    def description(self) -> str:
        """One line about the network in use, for ``info string``."""
        current = self._swap.current
        if current is None:
            return f"{os.path.basename(self.path)} (not loaded yet)"
        return current.label(long=True)

    # ------------------------------------------------------------------ following a trainer

    def set_trainer_keys(self, keys: Optional[str]) -> None:
        """Use the CurveZMQ keys in directory ``keys`` (``None`` or ``""``: none) for the trainer.

        Raises :class:`engine.announce.KeyFileError` (a ``ValueError``) naming
        a missing or bad key file; the keys in use stay then.  A follower that
        is running reconnects with the new keys.
        """
        new = load_client_keys(keys) if keys else None
        if new != self._keys:
            self._keys = new
            if self.endpoint is not None:
                self._follow(self.endpoint)

    def set_endpoint(self, endpoint: Optional[str]) -> None:
        """Follow a training daemon's announcements at ``endpoint`` (``None`` or ``""``: stop).

        Raises :class:`engine.weights.WeightsError` for an endpoint that is not
        ``tcp://HOST:PORT``, ``ipc://PATH`` or ``inproc://NAME``.  Connecting is
        asynchronous (ZeroMQ reconnects by itself), so a daemon that starts
        later is picked up; silence is reported once after ``silence_s``.
        """
        new = validate_endpoint(endpoint) if endpoint else None
        if new != self.endpoint:
            self._follow(new)

    def _follow(self, endpoint: Optional[str]) -> None:
        """(Re)start the follower at ``endpoint`` with the current keys, or stop it (``None``)."""
        with self._lock:
            if self._swap.closed:
                raise RuntimeError("the network manager is closed")
            old, self.follower = self.follower, None
            self.endpoint = None
        if old is not None:
            old.close()
        if not endpoint:
            return
        follower = TrainerFollower(endpoint, self._swap, self._log, keys=self._keys, **self._follower_options)
        with self._lock:
            self.follower, self.endpoint = follower, follower.endpoint

    # ------------------------------------------------------------------ closing

    def close(self, timeout: float = 1.0) -> None:
        """Stop the threads (within about ``timeout`` seconds) and drop a pending network.

        The network in use is not closed (a search may still hold it; it is
        freed with its last reference) and stays readable as :attr:`in_use`.
        Idempotent.
        """
        deadline = time.monotonic() + timeout
        parts = [part for part in (self.follower, self.watcher) if part is not None]
        for part in parts:
            part.close(0)  # tell every thread first, then wait for them
        self._swap.close(timeout)
        for part in parts:
            part.close(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "NetworkManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<NetworkManager {self.description}>"
