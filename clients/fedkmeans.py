"""Client side of ``fedkmeans`` (see strategies/fedkmeans.py for the wire protocol)."""

from __future__ import annotations

import numpy as np

from app.protocols import fedkmeans as proto
from clients.base import ClusteringClient, Reply, answers


class FedKMeansClient(ClusteringClient[proto.FedKMeansConfig]):
    settings = proto.FedKMeansConfig

    def features(self) -> np.ndarray:
        """This client's (filtered) feature rows, computed once per run."""
        if "features" not in self.context.state.array_records:
            self.save("features", x=proto.local_features(self.shard.x, self.shard.adj, self.cfg.filter_order))
        return self.load("features")["x"]

    @answers(proto.KMEANS_INIT)
    def on_kmeans_init(self, arrays, values) -> Reply:
        centres, counts = proto.local_seeds(self.features(), int(values["k"]), int(values["seed"]))
        return {"centres": centres, "counts": counts}, {}

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
