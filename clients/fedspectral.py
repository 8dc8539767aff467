"""Client side of ``fedspectral`` and ``fedspectral-plus`` (wire protocol in
strategies/fedspectral.py). The client's edges (``shard.adj``) never leave it:
it uploads local spectral labels (baseline), or products of its local operator
with the block the server sent, optionally noised (once per release: a re-sent
request gets the same draw back) and pairwise masked."""

from __future__ import annotations

import numpy as np

from app.protocols import fedspectral as proto
from clients.base import ClusteringClient

_OPERATORS: dict[tuple[int, str], tuple[object, object]] = {}


def _cached(shard, kind: str, make):
    """Per-process cache of a shard's derived operator (shards are cached per
    process too; the shard object is kept alive with the entry)."""
    key = (id(shard), kind)
    hit = _OPERATORS.get(key)
    if hit is None or hit[0] is not shard:
        if len(_OPERATORS) > 32:
            _OPERATORS.clear()
        hit = _OPERATORS[key] = (shard, make())
    return hit[1]


class FedSpectralClient(ClusteringClient):
    """Baseline: spectral clustering of the local graph, labels uploaded."""

    actions = ("fedspectral_local",)

    def on_fedspectral_local(self, arrays, values):
        labels = proto.local_spectral_labels(self.shard.adj, int(values["k"]), int(values["seed"]),
                                             int(values["n_init"]))
        return {"labels": labels.astype(np.int64)}, {}


class FedSpectralPlusClient(ClusteringClient):
    """Power iteration steps on the local graph (see the strategy docstring)."""

    actions = ("fedspectral_power", "fedspectral_degrees", "fedspectral_product")

    def _block(self, arrays) -> np.ndarray:
        y = np.asarray(arrays["block"], dtype=np.float64)
        n = self.shard.adj.shape[0]
        if y.ndim != 2 or y.shape[0] != n:
            raise ValueError(f"block has shape {y.shape}, expected ({n}, b)")
        return y

    def _upload(self, action: str, arrays, values, name: str, compute, sensitivity) -> tuple[dict, dict]:
        """Upload ``compute()`` as array ``name``: plus Gaussian noise of std ``noise_std`` (fresh
        OS entropy: the server must not be able to predict it), released once per request
        (:meth:`released_once`), masked under secure aggregation. A ``noise_std`` below this
        client's own ``fedspectral-plus.noise-multiplier`` times ``sensitivity()`` (the edge
        sensitivity it computes itself from the request) is refused: the server must not be able
        to lower the noise."""
        std = float(values.get("noise_std", 0.0))
        multiplier = float(self.config["fedspectral-plus.noise-multiplier"])
        needed = multiplier * sensitivity() if multiplier > 0 else 0.0
        if std < needed * (1 - 1e-9):
            raise ValueError(f"refusing {action} with noise_std={std:g}: this client's fedspectral-plus."
                             f"noise-multiplier={multiplier:g} needs at least {needed:.6g}")

        def reply() -> dict:
            out = compute()
            if std > 0:
                out = out + np.random.default_rng().normal(0.0, std, size=out.shape)
            if "secagg_tag" in values:
                return {name: self.masked(out, values)}
            return {name: out.astype(str(values.get("wire_dtype", "float64")))}

        return self.released_once(action, arrays, values, reply) if std > 0 else (reply(), {})

    def weighted_adjacency(self):
        """``A_c / r`` (each local edge divided by the number of clients holding it)."""
        return _cached(self.shard, "weighted",
                       lambda: proto.weighted_local_adjacency(self.shard.adj, self.shard.edge_weight))

    def on_fedspectral_power(self, arrays, values):
        op = _cached(self.shard, "normalised", lambda: proto.local_normalised_operator(self.shard.adj))
        # the server's sensitivity counts every client as a holder of an edge: one is a lower bound
        return self._upload("fedspectral_power", arrays, values, "block",
                            lambda: proto.paper_client_step(op, self._block(arrays), int(values["iters"])),
                            lambda: proto.paper_edge_sensitivity(self._block(arrays), int(values["iters"]), holders=1))

    def on_fedspectral_degrees(self, arrays, values):
        return self._upload("fedspectral_degrees", arrays, values, "degrees",
                            lambda: proto.local_degrees(self.weighted_adjacency()), lambda: proto.DEGREE_SENSITIVITY)

    def on_fedspectral_product(self, arrays, values):
        return self._upload("fedspectral_product", arrays, values, "block",
                            lambda: self.weighted_adjacency() @ self._block(arrays),
                            lambda: proto.exact_edge_sensitivity(self._block(arrays)))
