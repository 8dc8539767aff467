"""Client side of the boundary links (:mod:`fedgraphcore.protocols.boundary`): the three linking steps,
this party's column block of the whole adjacency, and its padded uploads.

A method whose client uses boundary edges inherits :class:`BoundaryClient` beside
:class:`clients.base.ClusteringClient`. What leaves the party: sealed group-key shares (for
one peer each), the keyed tags of its node IDs and its row ids (a party's own data: its rows
0..n-1), and later only masked and padded ring arrays.
"""

from __future__ import annotations

import os
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from fedgraphcore.config import ConfigError
from fedgraphcore.data.types import no_boundary
from fedgraphcore.privacy.secagg import FixedPointEncoder
from fedgraphcore.protocols import boundary as boundary_protocol
from fedgraphcore.wire import ProtocolError
from clients.base import answers

#: The state record of this party's links (kept for the run: its offset, N and the positions of
#: its boundary edges' other ends).
LINKS_RECORD = "boundary-links"


def _refused(rule: str, detail: str) -> ConfigError:
    """A party's boundary edges the run cannot use: ``detail`` for its log, ``rule`` for the server."""
    return ConfigError(f"{rule}: {detail}", public=f"data check failed: the party's boundary edges, rule '{rule}'")


class BoundaryClient:
    """Mixin for a :class:`~clients.base.ClusteringClient` whose method uses boundary edges."""

    @answers(boundary_protocol.BOUNDARY_SHARES)
    def on_boundary_shares(self, arrays, values):
        """Draw this party's group-key share; up: it sealed for each peer (row q for party q)."""
        try:
            boundary_protocol.check_shard(self.shard)
        except ValueError as err:
            raise _refused("every row owned by its client", str(err)) from None
        me, parties = self.shard.client_id, self.shard.num_clients
        share = os.urandom(boundary_protocol.SHARE_BYTES)
        self.save("boundary-share", share=np.frombuffer(share, dtype=np.uint8))
        sealed = np.zeros((parties, boundary_protocol.SEALED_BYTES), dtype=np.uint8)
        party = self._load_party() if parties > 1 else None  # one client: nobody to seal for
        for q in range(parties):
            if q != me:
                sealed[q] = np.frombuffer(party.seal(q, share, boundary_protocol.share_label(me, q)), dtype=np.uint8)
        return {"sealed": sealed}, {}

    @answers(boundary_protocol.BOUNDARY_TAGS)
    def on_boundary_tags(self, arrays, values):
        """Down: every peer's share sealed for this party (row p from party p). Form the group key;
        up: the keyed tags of this party's node IDs in row order, and its row ids."""
        me, parties = self.shard.client_id, self.shard.num_clients
        sealed = np.asarray(arrays["sealed"], dtype=np.uint8)
        if sealed.shape != (parties, boundary_protocol.SEALED_BYTES):
            raise ProtocolError(f"sealed shares of shape {sealed.shape}, expected {(parties, boundary_protocol.SEALED_BYTES)}")
        party = self._load_party() if parties > 1 else None
        own = self.load("boundary-share")["share"].tobytes()
        shares = [own if p == me else party.unseal(p, sealed[p].tobytes(), boundary_protocol.share_label(p, me))
                  for p in range(parties)]
        key = boundary_protocol.group_key(shares)
        self.save("boundary-key", key=np.frombuffer(key, dtype=np.uint8))
        return {"tags": boundary_protocol.tags(key, self.shard.item_keys),
                "ids": np.asarray(self.shard.node_ids, dtype=np.int64)}, {}

    @answers(boundary_protocol.BOUNDARY_LINKS)
    def on_boundary_links(self, arrays, values):
        """Down: the directory (every party's tags in position order) and this party's offset.
        Locate each boundary edge's other end and keep the positions; an edge to an ID no party
        holds stops the run (the server hears the rule, this party's log the count)."""
        key = self.load("boundary-key")["key"].tobytes()
        boundary = self.shard.boundary if self.shard.boundary is not None else no_boundary(self.shard.item_keys.dtype)
        try:
            links = boundary_protocol.link(arrays["directory"], boundary, key, int(values["offset"]),
                               boundary_protocol.tags(key, self.shard.item_keys))
        except ValueError as err:
            where = self.context.node_config.get("data") or "this client's shard"
            raise _refused("boundary edges to nodes some party holds", f"{where}: {err}") from None
        self.save(LINKS_RECORD, offset=np.array([links.offset]), total=np.array([links.total]), far=links.far)
        return {}, {"linked": 1}

    # -- using the links -------------------------------------------------------
    @property
    def linked(self) -> bool:
        """Whether the run linked this party's boundary edges (a node split)."""
        return LINKS_RECORD in self.context.state.array_records

    @cached_property
    def links(self) -> boundary_protocol.Links:
        """This party's links (after ``boundary_links``)."""
        kept = self.load(LINKS_RECORD)
        return boundary_protocol.Links(int(kept["offset"][0]), int(kept["total"][0]), kept["far"])

    @cached_property
    def column_block(self) -> sp.csr_matrix:
        """``B_c`` (N x n): this party's columns of the whole adjacency at positions."""
        return boundary_protocol.column_block(self.shard.adj, self.shard.boundary, self.links)

    @cached_property
    def whole_degrees(self) -> np.ndarray:
        """This party's nodes' degrees in the whole graph (its edges and its boundary edges)."""
        return boundary_protocol.degrees(self.shard.adj, self.shard.boundary)

    def padded(self, rows: np.ndarray, values) -> np.ndarray:
        """Up: ``B_c rows`` (N x f) encoded, pairwise masked and padded on this party's own rows
        with a pad only it can remove (``values``: the step's ``secagg_values``)."""
        product = self.column_block @ np.asarray(rows, dtype=np.float64).reshape(self.shard.num_nodes, -1)
        masked = self.masked(product, values)
        pad = self._load_party().pad(str(values["secagg_tag"]), masked[: self.shard.num_nodes].size, masked.dtype)
        return boundary_protocol.pad_rows(masked, pad, self.links)

    def unpadded(self, ring_rows: np.ndarray, values) -> np.ndarray:
        """This party's rows of a padded sum (``values``: that sum's ``secagg_values``, relayed under
        ``padded.``): its nodes' sums over all their neighbours, in row order."""
        encoder = FixedPointEncoder(values["padded.secagg_scale"], values["padded.secagg_bound"],
                                    values["padded.secagg_parties"])
        ring_rows = np.asarray(ring_rows)
        if ring_rows.dtype != encoder.dtype or ring_rows.shape[0] != self.shard.num_nodes:
            raise ProtocolError(f"padded rows of {ring_rows.dtype} {ring_rows.shape}, expected {encoder.dtype} with "
                                f"{self.shard.num_nodes} rows")
        pad = self._load_party().pad(str(values["padded.secagg_tag"]), ring_rows.size, ring_rows.dtype)
        total = encoder.decode(boundary_protocol.unpad_rows(ring_rows, pad))
        most = encoder.num_parties * encoder.max_q / encoder.scale
        if total.size and float(np.abs(total).max()) > most:
            raise ProtocolError("a padded sum beyond the parties' declared bound: not this step's sum")
        return total

