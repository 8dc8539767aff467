"""Server side of the boundary links (:mod:`fedgraphcore.protocols.boundary`): link the parties' boundary
edges once, then padded sums over neighbours held elsewhere.

The server relays sealed shares and tags it cannot read; it learns N and each party's row
count (as from hello). A padded sum it only adds up in the ring and hands back row blocks:
the sum is uniform to it (every party's pad lies on its own rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import RecordDict

from fedgraphcore.config import RunConfig
from fedgraphcore.privacy.ledger import GUARANTEE_SECAGG
from fedgraphcore.privacy.secagg import sum_masked
from fedgraphcore.protocols import boundary
from fedgraphcore.session import ServerSession
from fedgraphcore.transport import pack, unpack
from fedgraphcore.wire import ArraySpec, ProtocolError, ReplySpec


def uses_boundary(config: RunConfig) -> bool:
    """Whether a run links boundary edges: a node split (``node-*``; ``auto`` not yet resolved is
    none) with ``partition.boundary``."""
    return str(config["partitioner"]).startswith("node-") and bool(config["partition.boundary"])


@dataclass(frozen=True)
class ServerLinks:
    """The positions: each client's offset and row count (by partition id), N, and each client's
    row ids (the server's item ids of its rows: global ids, or a party's rows 0..n-1)."""

    offsets: list[int]
    counts: list[int]
    total: int
    ids: list[np.ndarray]

    def items(self, session: ServerSession) -> np.ndarray:
        """The server's item position of every link position (for labels laid out by link position)."""
        return np.concatenate([session.positions(boundary.BOUNDARY_TAGS, c.node_id, self.ids[c.partition_id])
                               for c in session.clients])


def link_boundaries(session: ServerSession) -> ServerLinks:
    """The three linking steps (module docstring of :mod:`fedgraphcore.protocols.boundary`); needs the
    secure-aggregation key exchange done (:meth:`ServerSession.setup_secure_aggregation`)."""
    parties = len(session.clients)
    sealed_spec = ReplySpec(arrays={"sealed": ArraySpec((parties, boundary.SEALED_BYTES), "u")})
    replies = session.broadcast(boundary.BOUNDARY_SHARES, pack(), sealed_spec)
    sealed = {session.partition_of(n): unpack(c)[0]["sealed"] for n, c in replies.items()}
    relay = {c.node_id: pack({"sealed": np.stack([sealed[p][c.partition_id] for p in range(parties)])})
             for c in session.clients}
    replies = session.exchange(boundary.BOUNDARY_TAGS, relay, boundary.TAGS_REPLY)
    tags, ids = {}, {}
    for node, content in replies.items():
        arrays = unpack(content)[0]
        if arrays["tags"].shape[0] != arrays["ids"].shape[0]:
            raise ProtocolError(f"step '{boundary.BOUNDARY_TAGS}': client {session.partition_of(node)} sent "
                                f"{arrays['tags'].shape[0]} tags for {arrays['ids'].shape[0]} rows")
        tags[session.partition_of(node)], ids[session.partition_of(node)] = arrays["tags"], arrays["ids"]
    counts = [int(tags[p].shape[0]) for p in range(parties)]
    offsets = [int(v) for v in np.concatenate([[0], np.cumsum(counts)[:-1]])]
    directory = np.ascontiguousarray(np.concatenate([tags[p] for p in range(parties)]).astype(np.uint8))
    contents = {c.node_id: pack({"directory": directory}, {"offset": offsets[c.partition_id]})
                for c in session.clients}
    session.exchange(boundary.BOUNDARY_LINKS, contents, boundary.LINKS_REPLY)
    session.ledger.add_mechanism(
        "boundary-links", "which node IDs the parties hold and which positions border which party",
        {"positions": int(sum(counts)), "tag_bytes": boundary.TAG_BYTES},
        "keyed tags (BLAKE2b under a group key the server cannot form): the server sees row counts and "
        "tags only; each party learns, for an ID it can name, whether and where some party holds it")
    return ServerLinks(offsets, counts, int(sum(counts)), [ids[p] for p in range(parties)])


def padded_spec(name: str, links: ServerLinks, width: int) -> ReplySpec:
    """The reply of a padded upload: one N x width masked ring array."""
    return ReplySpec(arrays={name: ArraySpec((links.total, width), "u", masked=True)})


def padded_sum(session: ServerSession, replies: dict[int, RecordDict], name: str, values: dict,
               links: ServerLinks) -> dict[int, np.ndarray]:
    """The ring sum of every client's padded upload ``name``, cut into each client's own rows
    (by node id). Every client must be present (its pad and masks are in the sum)."""
    if len(replies) != len(session.clients):
        raise ProtocolError(f"padded sum {name!r}: {len(replies)} of {len(session.clients)} clients replied")
    uploads = {session.partition_of(n): unpack(c)[0][name] for n, c in replies.items()}
    ring = sum_masked([uploads[p] for p in sorted(uploads)])
    session.stats.secure_aggregations += 1
    session.ledger.add_mechanism(
        f"padded-sum:{name}", f"each client's {name} (its nodes' terms of sums over neighbours)",
        {"rows": links.total}, GUARANTEE_SECAGG + "; the sum itself is hidden by each owner's one-time pad")
    return {c.node_id: boundary.slice_rows(ring, links.offsets[c.partition_id], links.counts[c.partition_id])
            for c in session.clients}


def relayed(values: dict) -> dict:
    """The ``secagg_values`` of a padded sum as the values that return its rows (``padded.``)."""
    return {f"padded.{k}": v for k, v in values.items()}
