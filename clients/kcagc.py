"""Client side of ``kcagc`` / ``kcagc-basic`` (wire protocol: :mod:`fedgraphcore.protocols.kcagc`).

What leaves this client: the local cluster of every node (``kcagc_local``,
kcagc only; not the filter order, which AGC's adaptive rule picks from the
client's own features) and, in every ``kcagc_step``, a pairwise-masked vector (uint32 ring with unit rows)
whose sum over the clients of its group (all clients, except in the tree
variant) is the summed squared distances; with the ``projection-joint-unit`` or
``projection-mixed-unit`` embedding also, once (``kcagc_joint``), its squared row norms masked the same
way (the server unmasks, and sends back, only their sum over all clients); its
features, embedding, virtual nodes and centre blocks never leave it.

``kcagc.mode = exact`` (``kcagc_exact``): masked sums only - its filtered block's
squared norm (with its column count in clear), the products ``F_l (F_l^T Y)``
of the blocks Y the server sends, and with AGC's adaptive order its part of the
intra-cluster distance under the labels the server sends; never ``F_l`` itself.
"""

from __future__ import annotations

import numpy as np

from fedgraphcore.config import ConfigError
from fedgraphcore.protocols import kcagc
from fedgraphcore.protocols.kcagc import exact
from fedgraphcore.wire import ProtocolError
from clients.base import ClusteringClient, Reply, answers

_FILTERED: dict[tuple[int, str], tuple] = {}


def _filtered(shard, kind: str, order: int) -> tuple[np.ndarray, float]:
    """This process's ``G^order X^l`` of ``shard`` and its squared norm, continued from the highest
    order kept (AGC's adaptive search asks for 1, 2, 3, ...; a deployed SuperNode's fresh
    process filters from the start). The entry keeps the shard alive, so its id is not reused."""
    key = (id(shard), kind)
    hit = _FILTERED.get(key)
    start = (hit[1], hit[2]) if hit is not None and hit[0] is shard else None
    if start is None or start[0] != order:
        if len(_FILTERED) > 32:
            _FILTERED.clear()
        f = exact.filtered_block(shard.x, shard.adj, order, kind, start)
        hit = _FILTERED[key] = (shard, order, f, exact.squared_norm(f))
    return hit[2], hit[3]


class KCAGCClient(ClusteringClient[kcagc.KCAGCConfig]):
    settings = kcagc.KCAGCConfig
    label_steps = (kcagc.KCAGC_LOCAL,)

    def step_limits(self) -> dict[str, int]:
        """The local clustering once, the joint row norms' two stages once each."""
        return {**super().step_limits(), kcagc.KCAGC_LOCAL: 1, kcagc.KCAGC_JOINT: 2}

    def label_classes(self, action: str, values) -> int:
        """The local clustering's ``k_hat`` classes."""
        return int(values["k_hat"]) if action == kcagc.KCAGC_LOCAL else 0

    def masking_groups(self, parties: int) -> list[set[int]]:
        """All clients; with ``kcagc.tree`` (more than two clients) every internal node of
        :func:`fedgraphcore.protocols.kcagc.tree_groups`, none of which leaves a client alone."""
        if self.cfg.tree and parties > 2:
            return [set(g) for level in kcagc.tree_groups(parties)[1:] for g in level]
        return [set(range(parties))]

    def _masked_if_several(self, action: str, part: np.ndarray, values, **kwargs) -> np.ndarray:
        """``part`` masked (:meth:`masked`); in clear only with a single client, whose part is the sum."""
        self.require_masking(action, values, needed_by_run=self.shard.num_clients > 1)
        return self.masked(part, values, **kwargs) if "secagg_tag" in values else part

    def features(self, values, unscaled: bool = False) -> np.ndarray:
        """This client's embedding ``Z^l`` (n x d), computed once per run and kept in state.

        The ``svd`` embedding is scaled by sqrt(n) (k-means is unchanged by a
        global scale) so that squared distances are O(1), like those of the
        unit rows of ``projection-unit`` / ``normalized``. A
        ``projection-joint-unit`` or ``projection-mixed-unit`` embedding is usable only after
        ``kcagc_joint`` has scaled it (``unscaled``: the part before that).
        """
        state = self.context.state.array_records
        if "kcagc_z" not in state:
            kind = str(values["filter"])
            order = kcagc.filter_order(self.shard.dataset, int(values["order"]), kind)
            z, _ = kcagc.embedding(self.shard.x, self.shard.adj, int(values["dim"]), order,
                                   int(values["seed"]), str(values["embedding"]), int(values["k"]), kind)
            z = z * np.sqrt(z.shape[0]) if str(values["embedding"]) == "svd" else z
            self.save("kcagc_z", z=z, scaled=np.array([int(str(values["embedding"]) not in kcagc.JOINT_EMBEDDINGS)]))
        state = self.load("kcagc_z")
        if not unscaled and not state["scaled"][0]:
            raise ProtocolError(f"the {values['embedding']} embedding is used before its joint row norms arrived")
        return state["z"]

    @answers(kcagc.KCAGC_JOINT)
    def on_kcagc_joint(self, arrays, values) -> Reply:
        """The joint row scaling of ``projection-joint-unit`` / ``projection-mixed-unit``.
        ``stage="sum"``: this client's squared row norms (n), masked for the sum over
        all clients; ``stage="scale"``: scale the rows with the square root of that sum
        (``sq_norms``, from the server; :func:`fedgraphcore.protocols.kcagc.joint_unit_rows`,
        own-norm exponent ``mix`` for the mixed embedding, 0 for the joint one)."""
        z = self.features(values, unscaled=True)
        if values["stage"] == "sum":
            return {"s": self._masked_if_several(kcagc.KCAGC_JOINT, (z ** 2).sum(1), values)}, {}
        state = self.load("kcagc_z")
        if state["scaled"][0]:
            raise ProtocolError("the joint row norms arrived twice")
        beta = float(values["mix"]) if values["embedding"] == "projection-mixed-unit" else 0.0
        self.save("kcagc_z", z=kcagc.joint_unit_rows(z, arrays["sq_norms"], beta), scaled=np.array([1]))
        return {}, {"received": 1}

    @answers(kcagc.KCAGC_LOCAL)
    def on_kcagc_local(self, arrays, values) -> Reply:
        """Protocol 1 on this client's columns: local cluster of every node (k_hat clusters), nothing else."""
        z = self.features(values)
        labels = kcagc.local_clusters(z, int(values["k_hat"]), int(values["seed"]),
                                      n_init=self.cfg.local_restarts, pruned=self.cfg.prune)
        return {"labels": labels.astype(np.int64)}, {}

    @answers(kcagc.KCAGC_STEP)
    def on_kcagc_step(self, arrays, values) -> Reply:
        """One secure-aggregation round of the weighted k-means on the virtual nodes.

        ``stage="seed"``: partial squared distances of every virtual node to the
        newest seed of each restart (R x m). ``stage="lloyd"``: set (``seeds``)
        or update (``assign`` of the restarts of the ``moved`` centres) this
        client's centre blocks, then partial squared distances of every virtual node to each
        ``moved`` centre (P x m; after ``seeds``, the last seed of each restart). The
        result is masked with the other clients of this client's ``group``
        only (the server unmasks one sum per group); a client in no group
        this level (tree variant: its group moves up unchanged) sends an empty array.
        """
        size = int(values["size"])
        if not size:
            return {"d": np.zeros(0, dtype=np.uint32)}, {}
        y, weights = self._virtual_nodes(arrays, values)
        if values["stage"] == "seed":
            part = kcagc.seed_distances(y, arrays["index"])
        else:
            centres = self._centres(y, weights, arrays)
            flat = centres.reshape(-1, centres.shape[2])  # (restart, centre) pairs, restart-major
            part = kcagc.point_distances(y, flat[arrays["moved"].astype(np.int64)])
        if part.size != size:
            raise ProtocolError(f"partial distances have {part.size} values, the server expects {size}")
        floor = kcagc.distance_bound(str(values["embedding"]), self.secagg.bound)
        return {"d": self._masked_if_several(kcagc.KCAGC_STEP, part.ravel(), values, floor=floor,
                                             participants=arrays["group"].astype(np.int64).tolist())}, {}

    def _virtual_nodes(self, arrays, values) -> tuple[np.ndarray, np.ndarray]:
        """This client's block of the virtual nodes (m x d) and their weights, built from ``members``
        on the first round of a level and kept for the level's other rounds."""
        if "members" in arrays:
            members = arrays["members"].astype(np.int64)
            y = kcagc.virtual_block(self.features(values), members)
            self.save("kcagc_vn", y=y, weights=np.bincount(members).astype(np.float64))
        vn = self.load("kcagc_vn")
        return vn["y"], vn["weights"]

    def _centres(self, y: np.ndarray, weights: np.ndarray, arrays) -> np.ndarray:
        """This client's block of every restart's centres (R x kk x d), kept between rounds: the
        virtual nodes ``seeds`` on the first Lloyd round, after that the weighted means of the
        ``assign``-ed virtual nodes for the restarts of the ``moved`` centres."""
        if "seeds" in arrays:
            centres = y[arrays["seeds"].astype(np.int64)]
        else:
            centres = self.load("kcagc_centres")["c"].copy()
            active = kcagc.moved_restarts(arrays["moved"], centres.shape[1])
            centres[active] = kcagc.update_centres(y, weights, arrays["assign"].astype(np.int64), centres[active])
        self.save("kcagc_centres", c=centres)
        return centres

    @answers(exact.KCAGC_EXACT)
    def on_kcagc_exact(self, arrays, values) -> Reply:
        """Exact mode: this client's part of one sum, times ``gain``, masked (in clear with one client).
        ``stage="norm"``: ``||F_l||_F^2`` (and ``cols``); ``"product"``: ``F_l (F_l^T Y)`` for ``block`` Y
        (n x b); ``"intra"``: its part of AGC's intra-cluster distance under ``labels`` (n). Each is
        refused under a declared bound below the honest one for what this client holds."""
        stage, gain, n = str(values["stage"]), float(values["gain"]), self.shard.x.shape[0]
        if stage not in exact.STAGES:
            raise ProtocolError(f"unknown kcagc_exact stage {stage!r}; valid choices: " + ", ".join(exact.STAGES))
        if not gain > 0:
            raise ProtocolError(f"kcagc_exact gain must be > 0, got {gain}")
        f, own = _filtered(self.shard, str(values["filter"]), int(values["order"]))
        if stage == "norm":
            floor = exact.norm_bound(n, self.secagg.bound)
            if own > floor:
                raise ConfigError(f"a feature row's squared norm exceeds secagg.bound={self.secagg.bound:g}; "
                                  "valid: a secagg.bound above every row's squared norm")
            name, part, extra = "s", np.array([own]), {"cols": int(f.shape[1])}
        elif stage == "product":
            y = np.asarray(arrays["block"], dtype=np.float64)
            if y.ndim != 2 or y.shape[0] != n:
                raise ProtocolError(f"block has shape {y.shape}, expected ({n}, b)")
            name, part, floor, extra = "p", exact.gram_product(f, y), exact.product_bound(own, y), {}
        else:
            labels = np.asarray(arrays["labels"], dtype=np.int64)
            if labels.shape != (n,):
                raise ProtocolError(f"labels have shape {labels.shape}, expected ({n},)")
            name, part, floor, extra = "d", np.array([exact.intra_part(f, labels)]), exact.intra_bound(own), {}
        upload = self._masked_if_several(exact.KCAGC_EXACT, gain * part, values, floor=gain * floor)
        return {name: upload}, extra
