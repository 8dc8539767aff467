"""Client side of ``fedspectral`` and ``fedspectral-plus`` (wire protocol:
:mod:`fedgraphcore.protocols.fedspectral`). The client's edges (``shard.adj``) never leave it:
it uploads local spectral labels (baseline), or products of its local operator
with the block the server sent, optionally noised (once per release: a re-sent
request gets the same draw back) and pairwise masked."""

from __future__ import annotations

import numpy as np

from fedgraphcore.privacy.policy import PrivacyRefusal
from fedgraphcore.protocols.fedspectral import baseline, plus, wire
from fedgraphcore.wire import ProtocolError
from clients.base import ClusteringClient, Reply, answers
from clients.boundary import BoundaryClient

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


class FedSpectralClient(ClusteringClient[wire.FedSpectralConfig]):
    """Baseline: spectral clustering of the local graph, labels uploaded."""

    settings = wire.FedSpectralConfig
    label_steps = (wire.FEDSPECTRAL_LOCAL,)

    def step_limits(self) -> dict[str, int]:
        """The local labels once."""
        return {**super().step_limits(), wire.FEDSPECTRAL_LOCAL: 1}

    @answers(wire.FEDSPECTRAL_LOCAL)
    def on_fedspectral_local(self, arrays, values) -> Reply:
        """The spectral clustering labels of this client's own graph into the run's ``k`` clusters
        (its num-clusters; the server's k when that is 0), a function of its edges alone."""
        own = self.shared.num_clusters
        if own and int(values["k"]) != own:
            raise PrivacyRefusal("server-input", f"'{wire.FEDSPECTRAL_LOCAL}' asked for k={values['k']!r}; valid: "
                                                 f"num-clusters={own}")
        labels = baseline.local_spectral_labels(self.shard.adj, int(values["k"]), int(values["seed"]),
                                                int(values["n_init"]), self.cfg.regularise, self.cfg.tau)
        return {"labels": labels.astype(np.int64)}, {}


class FedSpectralPlusClient(BoundaryClient, ClusteringClient[wire.FedSpectralPlusConfig]):
    """Power iteration steps on the local graph (see the strategy docstring). On a node split
    with boundary edges the client's operator is its column block of the whole adjacency
    (:mod:`fedgraphcore.protocols.boundary`): it answers for the columns of its own nodes."""

    settings = wire.FedSpectralPlusConfig

    def step_limits(self) -> dict[str, int]:
        """The degrees once (the blocks: as many as the run's rounds and solver take, each audited by
        its support, its noise and this node's ledger)."""
        return {**super().step_limits(), wire.FEDSPECTRAL_DEGREES: 1}

    def _block(self, arrays) -> np.ndarray:
        y = np.asarray(arrays["block"], dtype=np.float64)
        n = self.links.total if self.linked else self.shard.adj.shape[0]
        if y.ndim != 2 or y.shape[0] != n:
            raise ProtocolError(f"block has shape {y.shape}, expected ({n}, b)")
        return y

    def _own_rows(self, y: np.ndarray) -> np.ndarray:
        """The rows of a block this client's operator reads: all (edge split), its own (node split)."""
        if not self.linked:
            return y
        return y[self.links.offset: self.links.offset + self.shard.num_nodes]

    def _spread_block(self, action: str, arrays) -> np.ndarray:
        """The request's block, refused when a column sits on fewer nodes than this node's
        ``min-block-support`` (:func:`fedgraphcore.protocols.fedspectral.plus.block_support`): its product
        would read those nodes' rows of the adjacency (an identity block: every edge). On a node
        split the products are always masked, so the server sees only their sum ``A Y``, the
        same product as on an edge split: the whole block's support is what counts."""
        y = self._block(arrays)
        support, column = plus.block_support(y)
        floor = float(self.policy["min-block-support"])
        if support < floor:
            raise PrivacyRefusal("min-block-support", f"'{action}' block column {column} spreads over "
                                                      f"{support:.3g} node(s) (||y||_1^2 / ||y||_2^2), below this "
                                                      f"node's min-block-support={floor:g}: its product would read "
                                                      "those nodes' rows of the adjacency")
        return y

    def _upload(self, action: str, arrays, values, name: str, compute, sensitivity: float, *,
                masked_by_run: bool, floor: float, row_images: bool = True) -> tuple[dict, dict]:
        """Upload ``compute()`` as array ``name``: plus Gaussian noise of std ``noise_std`` (fresh
        OS entropy, :meth:`noise`: the server must not be able to predict it), masked under secure
        aggregation (declared bound at least ``floor``), one release in this node's ledger
        (:meth:`release`; a re-sent request gets the same draw). Refused: a noise multiplier
        ``noise_std / sensitivity`` (the edge sensitivity this client computes itself from
        the request) below this node's ``noise-multiplier`` or its run's
        ``fedspectral-plus.noise-multiplier`` (the server must not be able to lower the
        noise), an unmasked request when masking is required (``masked_by_run``: by
        this client's view of the run), and, for ``row_images`` (one row of the upload per
        node: a block), a noise-free request above this node's ``min-rows``."""
        std = float(values.get("noise_std", 0.0))
        multiplier = std / sensitivity if std > 0 and sensitivity > 0 else None
        self.policy.check_noise(action, multiplier, self.cfg.noise_multiplier)
        if row_images:
            self.policy.check_row_images(action, multiplier)
        self.require_masking(action, values, masked_by_run)

        def reply() -> dict:
            out = compute()
            if std > 0:
                out = out + self.noise(action).normal(0.0, std, size=out.shape)
            if "secagg_tag" in values:
                return {name: self.masked(out, values, floor=floor)}
            return {name: out.astype(str(values.get("wire_dtype", "float64")))}

        return self.release(action, arrays, values, reply, multiplier=multiplier)

    def weighted_adjacency(self):
        """``A_c / r`` (each local edge divided by the number of clients holding it)."""
        return _cached(self.shard, "weighted",
                       lambda: plus.weighted_local_adjacency(self.shard.adj, self.shard.edge_weight))

    def share_of_product(self, y: np.ndarray) -> np.ndarray:
        """This client's term of ``A y``: ``(A_c / r) y`` (edge split) or ``B_c y_c`` (node split)."""
        if self.linked:
            return self.column_block @ self._own_rows(y)
        return self.weighted_adjacency() @ y

    def share_of_degrees(self) -> np.ndarray:
        """This client's term of the degree vector ``A 1`` (length N)."""
        if self.linked:
            return self.column_block @ np.ones(self.shard.num_nodes)
        return plus.local_degrees(self.weighted_adjacency())

    @answers(wire.FEDSPECTRAL_POWER)
    def on_fedspectral_power(self, arrays, values) -> Reply:
        y = self._spread_block(wire.FEDSPECTRAL_POWER, arrays)
        tau = _cached(self.shard, f"tau-{y.shape[1]}", lambda: plus.paper_tau(
            self.shard.adj, y.shape[1], self.cfg.regularise, self.cfg.tau, self.cfg.noise_multiplier > 0))
        op = _cached(self.shard, f"normalised-{tau!r}", lambda: plus.local_normalised_operator(self.shard.adj, tau))
        # the server's sensitivity counts every client as a holder of an edge: one is a lower bound
        return self._upload(wire.FEDSPECTRAL_POWER, arrays, values, "block",
                            lambda: plus.paper_client_step(op, y, int(values["iters"])),
                            plus.paper_edge_sensitivity(y, int(values["iters"]), holders=1),
                            masked_by_run=self.cfg.secure, floor=plus.paper_bound(y))

    @answers(wire.FEDSPECTRAL_DEGREES)
    def on_fedspectral_degrees(self, arrays, values) -> Reply:
        n = self.links.total if self.linked else self.shard.adj.shape[0]
        return self._upload(wire.FEDSPECTRAL_DEGREES, arrays, values, "degrees", self.share_of_degrees,
                            plus.DEGREE_SENSITIVITY, masked_by_run=self.shard.num_clients > 1, floor=float(n),
                            row_images=False)

    @answers(wire.FEDSPECTRAL_PRODUCT)
    def on_fedspectral_product(self, arrays, values) -> Reply:
        y = self._spread_block(wire.FEDSPECTRAL_PRODUCT, arrays)
        # the honest bound needs the global largest degree, which no client knows: no floor
        return self._upload(wire.FEDSPECTRAL_PRODUCT, arrays, values, "block", lambda: self.share_of_product(y),
                            plus.exact_edge_sensitivity(y),
                            masked_by_run=self.cfg.secure or (self.linked and self.shard.num_clients > 1), floor=0.0)
