"""Client side of ``fedkmeans`` (see strategies/fedkmeans.py for the wire protocol)."""

from __future__ import annotations

import numpy as np

from app.protocols import fedkmeans as proto
from clients.base import ClusteringClient
from app.graph_filters import filtered_features


class FedKMeansClient(ClusteringClient):
    actions = ("kmeans_init", "kmeans_step", "kmeans_assign")

    def features(self) -> np.ndarray:
        """This client's (filtered) feature rows, computed once per run."""
        if "features" not in self.context.state.array_records:
            order = int(self.config["fedkmeans.filter-order"])
            self.save("features", x=filtered_features(self.shard.x, self.shard.adj, order))
        return self.load("features")["x"]

    def on_kmeans_init(self, arrays, values):
        centres, counts = proto.local_seeds(self.features(), int(values["k"]), int(values["seed"]))
        return {"centres": centres, "counts": counts}, {}

    def on_kmeans_step(self, arrays, values):
        stats = proto.join_statistics(*proto.lloyd_statistics(self.features(), arrays["centres"]))
        self.require_masking("kmeans_step", values, needed_by_run=bool(self.config["fedkmeans.secure"]))
        if "secagg_tag" in values:  # an honest server declares at least this client's rows x secagg.bound
            floor = proto.statistics_bound(len(self.shard.node_ids), float(self.config["secagg.bound"]))
            stats = self.masked(stats, values, floor=floor)
        return {"stats": stats}, {}

    def on_kmeans_assign(self, arrays, values):
        labels, _ = proto.assign(self.features(), arrays["centres"])
        self.save("labels", labels=labels)
        return {"node_ids": np.asarray(self.shard.node_ids, dtype=np.int64), "labels": labels.astype(np.int64)}, {}
