"""Content fingerprints of a dataset: what identifies the same data across processes.

:func:`data_hash` names the data a shard file, an evaluation file and an in-memory piece
(:mod:`fedgraphcore.data.memory`) were made from; :func:`hash_array` feeds one array to a running hash.
"""

from __future__ import annotations

import hashlib

import numpy as np
import scipy.sparse as sp

from .types import GraphCollection, GraphData


def hash_array(h, a: np.ndarray) -> None:
    """Feed ``a`` (dtype, shape, then its bytes in C order) to the running hash ``h``."""
    a = np.ascontiguousarray(a)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes() if a.dtype != object else repr(a.tolist()).encode())


def _hash_matrix(h, m) -> None:
    if m is None:
        h.update(b"none")
    elif sp.issparse(m):
        m = sp.csr_matrix(m)
        if not m.has_sorted_indices:
            m = m.sorted_indices()
        h.update(f"csr{m.shape}".encode())
        for a in (m.indptr, m.indices, m.data):
            hash_array(h, a.astype(np.int64) if a is not m.data else a)
    else:
        h.update(b"dense")
        hash_array(h, np.asarray(m))


def _hash_keys(h, keys: np.ndarray | None) -> None:
    """User IDs, when there are any (data without them hashes as it always has); unicode IDs by
    their text, not by numpy's fixed width, which depends on how the array was made."""
    if keys is None:
        return
    if keys.dtype.kind == "U":
        h.update(f"keys:str{len(keys)}".encode())
        h.update("\0".join(keys.tolist()).encode())
    else:
        h.update(b"keys:int")
        hash_array(h, keys)


def data_hash(data: GraphData | GraphCollection) -> str:
    """sha256 fingerprint of a dataset's content (adjacency, features, labels, and the user's
    node and graph IDs where given)."""
    h = hashlib.sha256()
    h.update(data.name.encode())
    graphs = data.graphs if isinstance(data, GraphCollection) else [data]
    if isinstance(data, GraphCollection):
        hash_array(h, np.asarray(data.y))
        _hash_keys(h, data.graph_keys)
    for g in graphs:
        _hash_matrix(h, g.adj)
        _hash_matrix(h, g.x)
        _hash_matrix(h, g.y)
        _hash_keys(h, g.node_keys)
    return h.hexdigest()
