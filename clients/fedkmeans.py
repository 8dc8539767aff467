"""Client side of ``fedkmeans`` (see strategies/fedkmeans.py for the wire protocol).

On a node split with boundary edges and several clients the filter runs over the whole graph
(:class:`clients.boundary.BoundaryClient`'s padded sums); the filtered rows then live in
``context.state`` (they cannot be computed again from this party's data alone)."""

from __future__ import annotations

from collections import OrderedDict
from logging import WARNING

import numpy as np
from flwr.common.logger import log

from app.data.shards import _remember
from app.protocols import fedkmeans as proto
from app.protocols.boundary import PADDED_ROWS
from app.privacy.policy import PrivacyRefusal
from clients.base import ClusteringClient, Reply, answers
from clients.boundary import BoundaryClient

#: (shard, filtered rows) per (shard, filter order), computed once per process and not kept in
#: ``context.state``: a deployed SuperNode sends the state to, and takes it back from, the ClientApp
#: process of every message, and filtering a shard's rows again costs less than moving them twice
_FEATURES: OrderedDict = OrderedDict()
_KEPT_FEATURES = 64  # an in-process run keeps every client in one process
#: ``context.state`` record of this node's :class:`app.protocols.fedkmeans.Audit` (what it has sent of its rows)
AUDIT = "fedkmeans-audit"
#: ``context.state`` record of the rows filtered over the whole graph so far (``rows`` after ``hops`` hops)
FILTERED = "fedkmeans-filtered"


class FedKMeansClient(BoundaryClient, ClusteringClient[proto.FedKMeansConfig]):
    settings = proto.FedKMeansConfig

    def features(self) -> np.ndarray:
        """This client's (filtered) feature rows: filtered over the whole graph (kept in state), or
        over its own subgraph (computed once per process)."""
        order = self.cfg.filter_order
        if FILTERED in self.context.state.array_records:
            kept = self.load(FILTERED)
            if int(kept["hops"][0]) != order:
                raise ValueError(f"the filter over the whole graph has run {int(kept['hops'][0])} of its {order} hops")
            return kept["rows"]
        # the entry holds the shard, so its id cannot be reused while cached
        return _remember(_FEATURES, (id(self.shard), order),
                         lambda: (self.shard, proto.local_features(self.shard.x, self.shard.adj, order)),
                         _KEPT_FEATURES)[1]

    def hello_arrays(self, values) -> dict[str, np.ndarray]:
        """With hello: this client's local k-means++ centres and their sizes (:meth:`seeds`), unless the
        filter runs over the whole graph first (``filter_hops``): then nothing, the seeds follow it."""
        hops = int(values.get(proto.FILTER_HOPS, 0))
        if not hops:
            return self.seeds(values)
        if hops != self.cfg.filter_order or self.shard.num_clients < 2:
            raise ValueError(f"{proto.FILTER_HOPS}={hops} for filter-order {self.cfg.filter_order} and "
                             f"{self.shard.num_clients} client(s)")
        self._check_rows()
        self.save(FILTERED, hops=np.array([0]))
        return {}

    def _check_rows(self) -> None:
        min_rows = int(self.policy["min-rows"])
        if self.shard.num_nodes < min_rows:
            raise PrivacyRefusal("min-rows", f"this node holds fewer rows than its min-rows={min_rows}: "
                                             "any centre of them would be a statistic of fewer")

    def seeds(self, values) -> dict[str, np.ndarray]:
        """This client's local k-means++ centres (``values``: ``k``, ``seed``) and their sizes, each
        centre the mean of at least this node's ``min-rows`` rows; the sums they are start this node's audit."""
        self._check_rows()
        x, min_rows = self.features(), int(self.policy["min-rows"])
        centres, counts, labels = proto.local_seeds(x, int(values["k"]), int(values["seed"]), min_rows)
        if min_rows > 1:
            self._keep(proto.Audit.of_seeds(labels, len(centres), min_rows))
        return {"centres": centres, "counts": counts}

    # -- the filter over the whole graph ------------------------------------------------------
    @answers(proto.KMEANS_FILTER)
    def on_kmeans_filter(self, arrays, values) -> Reply:
        """Hop ``hop`` (down: from hop 2 on, this party's rows of the last hop's padded sum). Up: the
        padded ``B_c U`` of this party's rows ``F`` filtered ``hop - 1`` times (``U = D~^-1/2 F``)."""
        hop = int(values["hop"])
        if not 1 <= hop <= self.cfg.filter_order:
            raise ValueError(f"filter hop {hop}; valid: 1..{self.cfg.filter_order} (filter-order)")
        floor = proto.hop_bound(self.links.total, self.secagg.bound)
        if not float(values["secagg_bound"]) >= floor * (1 - 1e-12):
            raise PrivacyRefusal("secagg-bound", f"secagg_bound={float(values['secagg_bound']):.6g} for "
                                                 f"'{values['secagg_tag']}', below {floor:.6g}, the bound this step "
                                                 "declares honestly")
        rows = self._filtered(arrays, values, hop - 1)
        return {proto.NEIGHBOURS: self.padded(proto.scaled_rows(rows, self.whole_degrees), values)}, {}

    @answers(proto.KMEANS_INIT)
    def on_kmeans_init(self, arrays, values) -> Reply:
        """Down: this party's rows of the last hop's padded sum, ``k`` and ``seed``. Up: the local
        seeds of its rows filtered over the whole graph, as hello's (:meth:`seeds`)."""
        self._filtered(arrays, values, self.cfg.filter_order)
        return self.seeds(values), {}

    def _filtered(self, arrays, values, hops: int) -> np.ndarray:
        """This party's rows filtered ``hops`` times over the whole graph: its features (0), or the
        kept rows of ``hops - 1`` hops taken one hop on with the neighbour sums in ``arrays`` (kept)."""
        kept = self.load(FILTERED)
        done = int(kept["hops"][0])
        if done != max(hops - 1, 0) or (PADDED_ROWS in arrays) != (hops > 0):
            raise ValueError(f"a request that takes the filter to {hops} hop(s) after {done}, "
                             + ("with" if PADDED_ROWS in arrays else "without") + " a padded sum's rows")
        if not hops:
            features = proto.local_features(self.shard.x, None, 0)
            self._check_bound(features, float(values["secagg_bound"]))
            return features
        before = kept["rows"] if done else proto.local_features(self.shard.x, None, 0)
        rows = proto.filter_hop(before, self.unpadded(arrays[PADDED_ROWS], values), self.whole_degrees)
        self.save(FILTERED, hops=np.array([hops]), rows=rows)
        return rows

    def _check_bound(self, features: np.ndarray, bound: float) -> None:
        """Log (here only: the server hears nothing) when this party's uploads may exceed the hop
        bound and be clipped: a feature beyond ``secagg.bound`` or a node whose edges into this
        party weigh more than the bound allows (:func:`app.protocols.fedkmeans.hop_bound`)."""
        heaviest = float(np.asarray(self.column_block.sum(axis=1)).max(initial=0.0))
        largest = float(np.abs(features).max(initial=0.0))
        if largest > self.secagg.bound or heaviest * self.secagg.bound > bound:
            log(WARNING, "fedkmeans: a feature beyond secagg.bound=%g or edge weights summing above %g at a node: "
                "this party's filter uploads may be clipped (the filter then differs from the centralised one); "
                "valid: a larger secagg.bound", self.secagg.bound, bound / self.secagg.bound)

    @answers(proto.KMEANS_STEP)
    def on_kmeans_step(self, arrays, values) -> Reply:
        """Per-cluster sums, counts, rows withheld and inertia; above ``min-rows`` 1 only the clusters this
        node's audit of every sum it has sent lets go out (:func:`app.protocols.fedkmeans.release`).
        A resumed run's first live step also carries the centres of the steps replayed from its
        journal: the audit first takes in the sums they give (:func:`app.protocols.fedkmeans.replay_audit`,
        which can only make it stricter)."""
        min_rows = int(self.policy["min-rows"])
        audit = proto.Audit(**self.load(AUDIT)) if min_rows > 1 else None
        if proto.REPLAYED_CENTRES in arrays:
            audit = proto.replay_audit(self.features(), arrays[proto.REPLAYED_CENTRES], arrays["centres"].shape,
                                       self.shared.num_rounds - 1, min_rows, audit)
        sums, counts, withheld, inertia, audit = proto.lloyd_statistics(self.features(), arrays["centres"],
                                                                        min_rows, audit)
        self.require_masking(proto.KMEANS_STEP, values, needed_by_run=self.cfg.secure)
        if audit is not None:
            self._keep(audit)
        stats = proto.join_statistics(sums, counts, withheld, inertia)
        if "secagg_tag" in values:  # an honest server declares at least this client's rows x secagg.bound
            floor = proto.statistics_bound(len(self.shard.node_ids), self.secagg.bound)
            stats = self.masked(stats, values, floor=floor)
        return {"stats": stats}, {}

    def _keep(self, audit: proto.Audit) -> None:
        self.save(AUDIT, **{name: value for name, value in vars(audit).items() if value is not None})

    @answers(proto.KMEANS_ASSIGN)
    def on_kmeans_assign(self, arrays, values) -> Reply:
        labels, _ = proto.assign(self.features(), arrays["centres"])
        self.save("labels", labels=labels)
        return {"node_ids": np.asarray(self.shard.node_ids, dtype=np.int64), "labels": labels.astype(np.int64)}, {}
