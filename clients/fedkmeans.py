"""Client side of ``fedkmeans`` (see strategies/fedkmeans.py for the wire protocol)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from app.data.shards import _remember
from app.protocols import fedkmeans as proto
from clients.base import ClusteringClient, Reply, answers

#: (shard, filtered rows) per (shard, filter order), computed once per process and not kept in
#: ``context.state``: a deployed SuperNode sends the state to, and takes it back from, the ClientApp
#: process of every message, and filtering a shard's rows again costs less than moving them twice
_FEATURES: OrderedDict = OrderedDict()
_KEPT_FEATURES = 64  # an in-process run keeps every client in one process


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
        """With hello: this client's local k-means++ centres and their sizes."""
        centres, counts = proto.local_seeds(self.features(), int(values["k"]), int(values["seed"]))
        return {"centres": centres, "counts": counts}

    @answers(proto.KMEANS_STEP)
    def on_kmeans_step(self, arrays, values) -> Reply:
        stats = proto.join_statistics(*proto.lloyd_statistics(self.features(), arrays["centres"]))
        self.require_masking(proto.KMEANS_STEP, values, needed_by_run=self.cfg.secure)
        if "secagg_tag" in values:  # an honest server declares at least this client's rows x secagg.bound
            floor = proto.statistics_bound(len(self.shard.node_ids), self.secagg.bound)
            stats = self.masked(stats, values, floor=floor)
        return {"stats": stats}, {}

    @answers(proto.KMEANS_ASSIGN)
    def on_kmeans_assign(self, arrays, values) -> Reply:
        labels, _ = proto.assign(self.features(), arrays["centres"])
        self.save("labels", labels=labels)
        return {"node_ids": np.asarray(self.shard.node_ids, dtype=np.int64), "labels": labels.astype(np.int64)}, {}
