"""Data held in memory, named for the in-process engine without touching the disk.

:func:`app.api.cluster` registers a Python object (a whole graph, or each
party's piece) under ``memory:<content hash>`` (:func:`fedgraphcore.data.fingerprint.data_hash`, IDs included); the in-process ClientApp and
ServerApp, which run in this process, look the name up where a run would
otherwise read a file. The table is process-local: Flower's simulation engine
(Ray workers) and a deployment cannot see it.
"""

from __future__ import annotations

import threading

from fedgraphcore.config import ConfigError

from .fingerprint import data_hash
from .types import GraphCollection, GraphData

PREFIX = "memory:"
_TABLE: dict[str, GraphData | GraphCollection] = {}
_USERS: dict[str, int] = {}  # runs holding each name: two runs may register the same content
_LABELS: dict[str, str] = {}  # the path the data was read from, where the user gave one
_LOCK = threading.Lock()


def register(data: GraphData | GraphCollection, label: str | None = None) -> str:
    """Keep ``data`` in this process's table until as many :func:`forget` calls; return
    its name ``memory:<hash>``. ``label``: the path it was read from, by which messages name it."""
    if not isinstance(data, (GraphData, GraphCollection)):
        raise TypeError(f"only GraphData or GraphCollection can be registered, not {type(data).__name__}")
    name = PREFIX + data_hash(data)
    with _LOCK:
        _TABLE[name] = data
        _USERS[name] = _USERS.get(name, 0) + 1
        if label:
            _LABELS[name] = str(label)
    return name


def is_memory(name: str) -> bool:
    return str(name).startswith(PREFIX)


def shown(name: str) -> str:
    """How a message names ``name``: quoted (the path in-memory data was read from), or as data
    given in memory (its hash means nothing to a user)."""
    if is_memory(name) and name not in _LABELS:
        return "given in memory"
    return repr(_LABELS.get(name, str(name)))


def described(name: str) -> str:
    """What a summary calls the data ``name``: a path or built-in name as is, the path in-memory data
    was read from, else "data given in memory"."""
    if not is_memory(name):
        return str(name)
    return _LABELS.get(name, "data given in memory")


def lookup(name: str) -> GraphData | GraphCollection:
    """The data registered as ``name``; a one-line ConfigError if this process has none."""
    with _LOCK:
        data = _TABLE.get(str(name))
    if data is None:
        raise ConfigError(f"no data registered as {name!r} in this process; in-memory data runs on the "
                          "in-process engine only (valid: engine='inprocess', or a file path)")
    return data


def forget(name: str) -> None:
    """Release one registration of ``name`` (after its run); the last one drops the data."""
    with _LOCK:
        left = _USERS.get(name, 0) - 1
        if left > 0:
            _USERS[name] = left
        else:
            _USERS.pop(name, None)
            _TABLE.pop(name, None)
            _LABELS.pop(name, None)
