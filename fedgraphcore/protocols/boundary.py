"""Boundary links: a node split's cut edges joined up across parties, and products with the
whole graph's adjacency that no party's contribution leaves in clear.

Setting. C parties each hold some nodes (rows ``0..n_p-1``), the edges among them and their
boundary edges (:class:`fedgraphcore.data.types.Boundary`): edges from their own nodes to node IDs
another party holds. A cut edge is a boundary edge of both its ends' parties. The parties'
rows laid end to end in partition order are the *positions* ``0..N-1`` (party p's row r at
``offset_p + r``).

Linking (three steps, once per run, after the secure-aggregation key exchange):

1. ``boundary_shares``: every party p draws a 32-byte share ``g_p`` and seals it for each
   peer q under their pair's channel key (:meth:`SecAggParty.seal`).
2. ``boundary_tags``: the server relays the sealed shares; each party opens them and forms the
   group key ``G = SHA-256(g_0 || ... || g_{C-1})``, which the server cannot form. It replies
   the tags ``BLAKE2b_G(ID)`` (16 bytes, :func:`tags`) of its rows in row order.
3. ``boundary_links``: the server sends every party the directory (all tags in position order)
   and its offset; the party finds the position of each boundary edge's other end
   (:func:`link`; an ID no party holds is refused) and keeps them (:class:`Links`).

The server learns N, each party's row count (as from hello) and tags it cannot invert; no
ID, no edge. Each party learns every tag's position: for an ID it can name, whether some
party holds it and where (so which party, given the row counts).

Products. Party c's *column block* ``B_c`` (N x n_c, :func:`column_block`) holds its nodes'
edges at positions: ``B_c[offset_c + i, j] = w_ij`` for its edges and ``B_c[far_e, row_e] =
w_e`` for its boundary edges. Column j of ``B_c`` is the column of the whole adjacency A at
party c's node j, so for any ``H`` laid out by positions, ``A H = sum_c B_c H_c`` with
``H_c`` party c's rows: each party's term needs only its own rows. Two uses:

* the server holds ``H`` (``fedspectral-plus``): it sends ``H`` and securely sums the
  replies ``B_c H_c`` to ``A H`` (N x b), as on an edge split;
* each party holds its rows of ``H`` (features, soft assignments): the *padded* sum. Party
  c uploads ``B_c H_c`` fixed-point encoded, pairwise masked, with its own one-time pad
  ``R_c`` added on its own positions (:func:`pad_rows`). The server's ring sum is ``A H + R``
  (R: every party's pad on its own rows): uniform, so it learns nothing, not even which
  positions border which party. It returns to each party its rows, from which the party
  removes its pad (:func:`unpad_rows`) and reads ``(A H)_c``, its nodes' sums over all their
  neighbours. A party learns only those sums: for a node with one neighbour elsewhere, that
  neighbour's row (as a centralised filter would hand the node's owner).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from fedgraphcore.data.types import Boundary, Shard
from fedgraphcore.wire import ArraySpec, ReplySpec, ValueSpec

BOUNDARY_SHARES = "boundary_shares"
BOUNDARY_TAGS = "boundary_tags"
BOUNDARY_LINKS = "boundary_links"

SHARE_BYTES = 32
SEALED_BYTES = 12 + SHARE_BYTES + 16  # nonce, share, Poly1305 tag
TAG_BYTES = 16

SHARES_REPLY = ReplySpec(arrays={"sealed": ArraySpec((None, SEALED_BYTES), "u")})
TAGS_REPLY = ReplySpec(arrays={"tags": ArraySpec((None, TAG_BYTES), "u"), "ids": ArraySpec((None,), "i")})
LINKS_REPLY = ReplySpec(numbers={"linked": ValueSpec(whole=True, low=1, high=1)})

#: What a step that relays a padded sum's rows calls them (ring elements of the party's own rows).
PADDED_ROWS = "padded_rows"


def share_label(sender: int, receiver: int) -> str:
    """What a sealed group-key share is bound to (one use, one direction)."""
    return f"boundary-group-share|{int(sender)}->{int(receiver)}"


def group_key(shares: list[bytes]) -> bytes:
    """``G = SHA-256(g_0 || ... || g_{C-1})``: every party's share in partition order."""
    if any(len(g) != SHARE_BYTES for g in shares):
        raise ValueError(f"a group-key share is not {SHARE_BYTES} bytes")
    return hashlib.sha256(b"".join(shares)).digest()


def tags(key: bytes, ids: np.ndarray) -> np.ndarray:
    """``BLAKE2b_key(ID)`` (16 bytes) of each ID, as text with its length in front: an integer
    ID 7 and a text ID "7" are one node (as in :func:`fedgraphcore.data.parties.node_set_digest`)."""
    out = np.empty((len(ids), TAG_BYTES), dtype=np.uint8)
    for i, value in enumerate(np.asarray(ids).tolist()):
        text = str(value).encode()
        out[i] = np.frombuffer(hashlib.blake2b(len(text).to_bytes(8, "little") + text, key=key,
                                               digest_size=TAG_BYTES).digest(), dtype=np.uint8)
    return out


@dataclass(frozen=True)
class Links:
    """Where a party's rows and its boundary edges' other ends are among the positions."""

    offset: int  # position of its row 0
    total: int  # N, every party's rows
    far: np.ndarray  # position of each boundary edge's other end, aligned with the boundary


def link(directory: np.ndarray, boundary: Boundary, key: bytes, offset: int, own: np.ndarray) -> Links:
    """Each boundary edge's other end located in ``directory`` (every party's tags in position
    order); ``own``: this party's tags in row order. ``ValueError`` (without the ID: the message
    may travel) when the directory does not hold this party's tags exactly at ``offset`` (a
    server placing its rows, and so its pad, elsewhere would read its neighbour sums) or holds
    one twice, or when an edge reaches an ID no party holds."""
    directory = np.ascontiguousarray(directory, dtype=np.uint8)
    total, rows = int(directory.shape[0]), int(len(own))
    if directory.ndim != 2 or directory.shape[1] != TAG_BYTES or not 0 <= offset <= total - rows:
        raise ValueError(f"offset {offset} with {rows} rows does not fit a directory of shape {directory.shape}")
    if not np.array_equal(directory[offset: offset + rows], own):
        raise ValueError(f"the directory does not hold this party's rows at offset {offset}")
    as_bytes = directory.view(f"V{TAG_BYTES}").ravel()
    if np.unique(as_bytes).size != total:
        raise ValueError("the directory holds a tag twice")
    order = np.argsort(as_bytes, kind="stable")
    sought = tags(key, boundary.keys).view(f"V{TAG_BYTES}").ravel()
    at = np.searchsorted(as_bytes[order], sought)
    found = at < total
    found[found] = as_bytes[order][at[found]] == sought[found]
    if not found.all():
        raise ValueError(f"{int((~found).sum())} boundary edge(s) reach a node ID no party holds")
    return Links(int(offset), total, order[at].astype(np.int64))


def column_block(adj: sp.csr_matrix, boundary: Boundary | None, links: Links) -> sp.csr_matrix:
    """``B_c`` (N x n_c): this party's columns of the whole adjacency, at positions."""
    n = adj.shape[0]
    coo = sp.coo_matrix(adj)
    far = links.far if boundary is not None else np.zeros(0, np.int64)
    rows = np.concatenate([coo.row.astype(np.int64) + links.offset, far])
    cols = np.concatenate([coo.col.astype(np.int64), boundary.rows if boundary is not None else far])
    data = np.concatenate([coo.data, boundary.weight if boundary is not None else np.zeros(0)])
    return sp.csr_matrix((data, (rows, cols)), shape=(links.total, n))


def degrees(adj: sp.csr_matrix, boundary: Boundary | None) -> np.ndarray:
    """Each own node's degree in the whole graph: its edges here plus its boundary edges."""
    d = np.asarray(adj.sum(axis=1), dtype=np.float64).ravel()
    if boundary is not None and len(boundary):
        d += np.bincount(boundary.rows, weights=boundary.weight, minlength=d.size)
    return d


def pad_rows(masked: np.ndarray, pad: np.ndarray, links: Links) -> np.ndarray:
    """A masked N x f upload with this party's pad added on its own rows (ring arithmetic)."""
    out = np.array(masked, copy=True)
    rows = pad.size // max(1, int(np.prod(out.shape[1:])))
    own = out[links.offset: links.offset + rows]
    np.add(own, pad.reshape(own.shape), out=own)
    return out


def unpad_rows(rows: np.ndarray, pad: np.ndarray) -> np.ndarray:
    """This party's rows of a padded ring sum with its pad removed (still fixed-point encoded)."""
    rows = np.asarray(rows)
    return rows - pad.reshape(rows.shape).astype(rows.dtype)


def slice_rows(ring_sum: np.ndarray, offset: int, rows: int) -> np.ndarray:
    """Party rows ``offset .. offset + rows - 1`` of a ring sum (what the server returns to it)."""
    return np.ascontiguousarray(ring_sum[offset: offset + rows])


def check_shard(shard: Shard) -> None:
    """``ValueError`` unless the shard can take part: a node split whose every row is its own."""
    if shard.owned is not None and not np.asarray(shard.owned).all():
        raise ValueError("boundary links need every row owned by its client (partition.overlap=0)")
