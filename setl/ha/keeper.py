"""Ephemeral ZooKeeper nodes held across sessions (`Keeper`): a node's registration and its
standby marks, created again by one owned thread on every new session of the `Coordinator`."""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from setl.errors import MetaStoreError

log = logging.getLogger("setl.ha")


class Session(Protocol):
    """What the keeper needs of the session (`setl.ha.coordinator.Coordinator`)."""

    @property
    def session_id(self) -> int: ...

    def claim(self, path: str, data: bytes, *, wait: float = 0.0) -> None: ...

    def unclaim(self, path: str) -> None: ...


class Keeper:
    """Holds ephemeral nodes (`keep`) on this and every later session, until `unkeep`.

    `new_session()` (the session's state listener: it never blocks) wakes the keeper's thread,
    which claims every kept node again; a claim that fails is tried again after 0.5 s.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self._lock = threading.Lock()
        self._kept: dict[str, bytes] = {}
        self._keep_lock = threading.Lock()  # the keeper's check-and-create vs unkeep's remove-and-delete
        self._new_session = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="setl-ha-keeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._closing.set()
        self._new_session.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def new_session(self) -> None:
        """A new session began: claim every kept node again (never blocks)."""
        self._new_session.set()

    def keep(self, path: str, data: bytes) -> None:
        """Hold ephemeral node `path` on this and every later session, until `unkeep`."""
        with self._lock:
            self._kept[path] = data
        self._new_session.set()

    def unkeep(self, path: str) -> None:
        """Stop holding `path` and delete it. Serialised with the keeper's re-registration
        (`_keep_lock`): a keeper that read `path` among the kept ones before this call must not
        create it again after it (a new holder would be listed among its own standbys)."""
        with self._keep_lock:
            with self._lock:
                self._kept.pop(path, None)
            self.session.unclaim(path)

    def _loop(self) -> None:
        while not self._closing.is_set():
            self._new_session.wait()
            self._new_session.clear()
            if self._closing.is_set():
                return
            with self._lock:
                kept = dict(self._kept)
            for path, data in kept.items():
                try:
                    with self._keep_lock:
                        with self._lock:
                            if path not in self._kept:
                                continue  # unkept since the snapshot: do not bring it back
                        self.session.claim(path, data)
                except MetaStoreError as exc:
                    log.warning("ha: cannot register %s: %s", path, exc)
                    self._closing.wait(0.5)
                    self._new_session.set()
                except Exception:  # never let the keeper die silently
                    log.exception("ha: registering %s failed", path)
