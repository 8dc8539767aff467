"""Client side of ``fedkmeans`` (see strategies/fedkmeans.py for the wire protocol)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from app.data.shards import _remember
from app.protocols import fedkmeans as proto
from app.privacy.policy import PrivacyRefusal
from clients.base import ClusteringClient, Reply, answers

#: (shard, filtered rows) per (shard, filter order), computed once per process and not kept in
#: ``context.state``: a deployed SuperNode sends the state to, and takes it back from, the ClientApp
#: process of every message, and filtering a shard's rows again costs less than moving them twice
_FEATURES: OrderedDict = OrderedDict()
_KEPT_FEATURES = 64  # an in-process run keeps every client in one process
#: ``context.state`` record of this node's :class:`app.protocols.fedkmeans.Audit` (what it has sent of its rows)
AUDIT = "fedkmeans-audit"


class FedKMeansClient(ClusteringClient[proto.FedKMeansConfig]):
    settings = proto.FedKMeansConfig

    def features(self) -> np.ndarray:
        """This client's (filtered) feature rows, computed once per process."""
        order = self.cfg.filter_order
        # the entry holds the shard, so its id cannot be reused while cached
        return _remember(_FEATURES, (id(self.shard), order),
                         lambda: (self.shard, proto.local_features(self.shard.x, self.shard.adj, order)),
                         _KEPT_FEATURES)[1]

    def hello_arrays(self, values) -> dict[str, np.ndarray]:
        """With hello: this client's local k-means++ centres and their sizes, each centre the mean of at
        least this node's ``min-rows`` rows; the sums they are start this node's audit."""
        x, min_rows = self.features(), int(self.policy["min-rows"])
        if len(x) < min_rows:
            raise PrivacyRefusal("min-rows", f"this node holds fewer rows than its min-rows={min_rows}: "
                                             "any centre of them would be a statistic of fewer")
        centres, counts, labels = proto.local_seeds(x, int(values["k"]), int(values["seed"]), min_rows)
        if min_rows > 1:
            self._keep(proto.Audit.of_seeds(labels, len(centres), min_rows))
        return {"centres": centres, "counts": counts}

    @answers(proto.KMEANS_STEP)
    def on_kmeans_step(self, arrays, values) -> Reply:
        """Per-cluster sums, counts, rows withheld and inertia; above ``min-rows`` 1 only the clusters this
        node's audit of every sum it has sent lets go out (:func:`app.protocols.fedkmeans.release`)."""
        min_rows = int(self.policy["min-rows"])
        audit = proto.Audit(**self.load(AUDIT)) if min_rows > 1 else None
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
