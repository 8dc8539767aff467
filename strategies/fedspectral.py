"""Strategies ``fedspectral`` and ``fedspectral-plus``: spectral clustering of a
graph whose edges are split over clients (Thakkar & Joshi, FedSpectral+).

Every client knows all N node ids and holds some edges (partitioner ``edge``;
each edge goes to ``r`` clients, ``partition.overlap`` / ``partition.replicas``;
the paper uses 5 clients, 40% overlap, i.e. r = 2). The math is in
``fedgraphcore.protocols.fedspectral``; this module only moves blocks.

Wire protocols: :mod:`fedgraphcore.protocols.fedspectral`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedgraphcore.config import ConfigError, RunConfig, SharedConfig
from fedgraphcore.data.types import GraphData
from fedgraphcore.privacy.gaussian import GaussianMechanism
from fedgraphcore.progress import Convergence
from fedgraphcore.protocols.fedspectral import baseline, block_iteration, plus, wire
from fedgraphcore.wire import LABELS, ProtocolError
from fedgraphcore.transport import pack, unpack
from strategies.base import ClusteringStrategy, StrategyOutput, common_node_count
from strategies.links import link_boundaries, uses_boundary

if TYPE_CHECKING:
    from fedgraphcore.session import ServerSession

# Paper settings (Experimental Setting): (iters, rounds) per dataset.
PAPER_SETTINGS = {"ego-facebook": (6, 20), "email-eu-core": (1, 1)}
PAPER_DEFAULT = (6, 20)
EXACT_MAX_ROUNDS = 2000


def _reference(strategy: FedSpectral | FedSpectralPlus, data: GraphData) -> np.ndarray:
    """Centralised normalised spectral clustering of the pooled graph, regularised as the run says."""
    from fedgraphcore.clustering import regularisation, spectral_graph

    k, cfg = strategy.shared.num_clusters, strategy.cfg
    tau = regularisation(data.adj, k, cfg.regularise, cfg.tau)
    return spectral_graph(data.adj, k, strategy.shared.seed, n_init=cfg.n_init, tau=tau)


def _reference_method(strategy: FedSpectral | FedSpectralPlus) -> str:
    cfg = strategy.cfg
    restarts = cfg.n_init or "n k / 50 (10 to 1000, at most 1e7 / (n k))"
    tau = f"tau={cfg.tau:g}" if cfg.tau > 0 else "tau = the average degree"
    regularised = {"on": f", regularised ({tau})", "off": "",
                   "auto": f", regularised ({tau}) where the graph has more components with an edge than k"}
    return ("centralised normalised spectral clustering of the pooled graph (top-k eigenvectors of "
            f"D^-1/2 A D^-1/2{regularised[cfg.regularise]}, rows normalised, k-means with {restarts} restarts), "
            f"{strategy._k_and_seed()}")


def _send_labels(session: ServerSession, labels: np.ndarray) -> None:
    session.broadcast(LABELS, pack({"labels": labels.astype(np.int64)}), wire.RECEIVED_REPLY)


def _check_degrees(d: np.ndarray, n: int, slack: float) -> None:
    """Reject a summed degree vector no graph on ``n`` nodes gives: every client's part
    ``A_c 1 / r`` lies in [0, n], so the sum does too, up to ``slack`` for the clients'
    Gaussian noise (12 standard deviations of the summed noise) and fixed-point rounding."""
    slack += 1e-6
    if d.size and (d.min() < -slack or d.max() > n + slack):
        raise ProtocolError(f"step 'fedspectral_degrees': the summed degrees range from {d.min():.6g} to "
                            f"{d.max():.6g}, outside [0, {n}] (noise allowance {slack:.3g}); an upload is malformed")


class FedSpectral(ClusteringStrategy[wire.FedSpectralConfig]):
    """The FedSpectral baseline (Thakkar & Joshi). Every client knows all node ids and holds some of
    the edges; it clusters its own graph spectrally and sends the label of every node once (no
    edge or degree leaves it). The server spectrally clusters the co-association graph of these
    labelings and sends the final labels back. Centralised reference: normalised spectral
    clustering of the whole graph."""

    name = "fedspectral"
    summary = "FedSpectral baseline: local spectral labels, co-association spectral clustering on the server"
    split = "edges: every client knows all node ids and holds some of the edges (with overlap)"
    ignores = ("num-rounds", "secagg.scale", "secagg.bound")
    partitioners = ("edge",)
    needs_edges = True
    local_graphs = True

    settings = wire.FedSpectralConfig

    def run(self, session: ServerSession) -> StrategyOutput:
        k, seed, n_init = self.shared.num_clusters, self.shared.seed, self.cfg.n_init
        n = common_node_count(session, self.name, "edge")
        replies = session.broadcast(wire.FEDSPECTRAL_LOCAL, pack(values={"k": k, "seed": seed, "n_init": n_init}),
                                    wire.local_reply(n, k))
        label_sets = [unpack(content)[0]["labels"].astype(np.int64) for content in replies.values()]
        labels = baseline.coassociation_labels(label_sets, k, seed, n_init)
        _send_labels(session, labels)
        return StrategyOutput(labels=labels, history=[{"round": 1, "clients": len(label_sets)}])

    def reference(self, data: GraphData) -> np.ndarray:
        return _reference(self, data)

    def reference_method(self) -> str:
        return _reference_method(self)


class FedSpectralPlus(ClusteringStrategy[wire.FedSpectralPlusConfig]):
    """FedSpectral+ (Thakkar & Joshi): spectral clustering of a graph whose edges are split over
    the clients, each knowing all node ids. In ``paper`` mode every round each client runs a few
    power iterations of its own normalised adjacency on the server's N x K block and sends the
    result; the server averages and orthonormalises. In ``exact`` mode the clients first
    secure-sum the degree vector, then each round send their share of the global operator applied
    to the server's block, so the iteration converges to the whole graph's spectral embedding.
    Uploads can be secure-aggregated and carry edge-level Gaussian DP noise. Centralised
    reference: normalised spectral clustering of the whole graph."""

    name = "fedspectral-plus"
    summary = "FedSpectral+: exact federated block iteration (default) or the paper's power iteration, edge split"
    split = "edges: every client knows all node ids and holds some of the edges (with overlap)"
    ignores = ("num-rounds",)
    partitioners = ("edge", "node-random", "node-community", "node-dirichlet")
    needs_edges = True
    refuses_weights = ("bounds the degrees by n and an edge's DP sensitivity by a unit weight (it counts every "
                       "edge as 1)")

    settings = wire.FedSpectralPlusConfig

    @classmethod
    def masks_uploads(cls, config: RunConfig, clients: int) -> bool:
        """Exact mode masks the degree shares whenever there is more than one client; both modes
        mask the blocks with ``fedspectral-plus.secure``."""
        view = wire.FedSpectralPlusConfig.of(config)
        return clients > 1 and (view.mode == "exact" or view.secure)

    @classmethod
    def check(cls, config: RunConfig) -> None:
        super().check(config)
        view = wire.FedSpectralPlusConfig.of(config)
        k, b = SharedConfig.of(config).num_clusters, view.block
        if b and k and b < k:
            raise ConfigError(f"fedspectral-plus.block={b} is smaller than num-clusters={k}; use 0 or >= {k}")
        if view.mode == "paper" and view.noise_multiplier > 0 and view.regularise == "on" and view.tau <= 0:
            raise ConfigError("fedspectral-plus.regularise=on in paper mode under noise needs fedspectral-plus.tau > 0 "
                              "(a client's average degree moves with each of its edges); valid: tau > 0, or "
                              "regularise=auto or off")
        partitioner = str(config["partitioner"])
        if partitioner.startswith("node-"):
            if not uses_boundary(config):
                raise ConfigError(f"fedspectral-plus on partitioner '{partitioner}' needs partition.boundary=true "
                                  "(each client's edges to other clients' nodes); valid: partition.boundary=true, "
                                  "or partitioner=edge")
            if wire.FedSpectralPlusConfig.of(config).mode != "exact":
                raise ConfigError(f"fedspectral-plus.mode=paper on partitioner '{partitioner}': the paper's local "
                                  "power iterations need every node on every client; valid: fedspectral-plus.mode="
                                  "exact, or partitioner=edge")
            if float(config["partition.overlap"]) > 0:
                raise ConfigError(f"partition.overlap={config['partition.overlap']} with fedspectral-plus on "
                                  f"partitioner '{partitioner}': a node copied to two clients would count twice; "
                                  "valid: partition.overlap=0")

    # -- schedule -------------------------------------------------------------
    def schedule(self) -> tuple[int, int]:
        """(iters, rounds) with the paper's per-dataset defaults resolved."""
        iters, rounds = self.cfg.iters, self.cfg.rounds
        p_iters, p_rounds = paper_settings(self.shared.dataset)
        if self.cfg.mode == "exact":
            return 1, rounds or EXACT_MAX_ROUNDS
        return iters or p_iters, rounds or p_rounds

    def solver(self) -> str:
        """Exact mode's iteration, ``auto`` resolved: under DP noise orthogonal iteration keeps
        the labels closer to centralised at the same noise multiplier and at the same epsilon
        (docs/results/fedspectral.md, server iteration), without noise block Krylov needs a third of
        the rounds for the same labels."""
        if self.cfg.solver != "auto":
            return self.cfg.solver
        return "chebyshev" if self.cfg.noise_multiplier > 0 else "krylov"

    def effective_tol(self, clients: int, secure: bool) -> float:
        """``fedspectral-plus.tol``, raised to what the wire can resolve: blocks are
        scaled to max |entry| 1, so float32 rounds them at 2^-24 and secure
        aggregation at ``clients / secagg.scale``; the subspace cannot be pinned
        down below ~32x that (measured on ego-Facebook: float32 floors near 1e-6)."""
        tol = self.cfg.tol
        if secure:
            tol = max(tol, 32.0 * clients / self.secagg.scale)
        elif self.cfg.wire_dtype == "float32":
            tol = max(tol, 32.0 * 2.0**-24)
        return tol

    # -- protocol -------------------------------------------------------------
    def run(self, session: ServerSession) -> StrategyOutput:
        self.k, self.seed = self.shared.num_clusters, self.shared.seed
        self.links = None
        if uses_boundary(session.config):
            if len(session.clients) > 1:
                session.setup_secure_aggregation()
            self.links = link_boundaries(session)
            self.n = self.links.total
        else:
            self.n = common_node_count(session, self.name, "edge")
        if self.k > self.n:
            raise ConfigError(f"num-clusters={self.k} exceeds the {self.n} nodes")
        self.session = session
        # a node split's products always go masked: a plain one shows which positions border a client
        self.secure = self.cfg.secure or (self.links is not None and len(session.clients) > 1)
        self.wire = self.cfg.wire_dtype
        nm = self.cfg.noise_multiplier
        self.dp = GaussianMechanism(1.0, nm, delta=self.cfg.delta, adjacency="remove") if nm > 0 else None
        self.releases: list[float] = []
        if self.secure and len(session.clients) < 2:
            raise ConfigError("fedspectral-plus.secure=true needs at least 2 clients; got 1")
        if self.secure:
            session.setup_secure_aggregation()
        out = self._run_exact(session) if self.cfg.mode == "exact" else self._run_paper(session)
        if self.dp is not None:
            self._record_dp()
        if self.links is None:
            _send_labels(session, out.labels)
        else:  # a node split: each party gets its own nodes' labels only
            out.ids = self.links.items(session)
        return out

    def _round(self, action: str, y: np.ndarray, bound: float, sensitivity, extra: dict) -> np.ndarray:
        """Broadcast block ``y``; return the (unmasked) sum of the client blocks.

        ``sensitivity()`` (called only when noise is on) is the L2 sensitivity of
        this release to one edge; every client adds ``noise_multiplier`` times it.
        """
        values = dict(extra)
        noise_std = 0.0
        if self.dp is not None:
            sensitivity = float(sensitivity())
            noise_std = self.dp.noise_multiplier * sensitivity
            self.dp.step()
            self.releases.append(sensitivity)
        values["noise_std"] = noise_std
        values["release"] = len(self.releases)  # tells the next release from this one re-sent (retries)
        values["wire_dtype"] = self.wire
        limit = bound * (1 + 1e-9) + 12.0 * noise_std + 1e-12  # the largest honest entry, declared to secagg too
        if self.secure:
            values.update(self.session.secagg_values("block", limit))
        # Paper mode averages whatever blocks arrive, so it can go on without a
        # client that dropped; exact mode (a sum that must cover every edge) and
        # secure aggregation (masks cancel only over all parties) cannot.
        tolerant = self.cfg.mode == "paper" and not self.secure
        spec = wire.upload_reply("block", (self.n, y.shape[1]), self.secure, self.dp is not None)
        replies = self.session.broadcast(action, pack({"block": y.astype(self.wire)}, values), spec,
                                         require_all=not tolerant)
        self.contributors = len(replies)
        if self.secure:
            return self.session.secure_sum(replies, "block", values)
        return self._plain_sum(action, replies, y.shape, limit)

    def _plain_sum(self, action: str, replies: dict, shape: tuple[int, int], limit: float) -> np.ndarray:
        """The sum of plain client blocks, each refused (naming the client) with an entry above ``limit``."""
        total = np.zeros(shape, dtype=np.float64)
        for node, content in replies.items():
            block = unpack(content)[0]["block"]
            largest = float(np.abs(block).max(initial=0.0))
            if largest > limit:
                raise ProtocolError(f"step '{action}': client {self.session.partition_of(node)} (node {node}) sent "
                                    f"a block entry {largest:.6g}, above {limit:.6g}, the largest an "
                                    "honest block (plus 12 noise std) can hold")
            total += block
        return total

    def _run_paper(self, session: ServerSession) -> StrategyOutput:
        """Paper mode, ``rounds`` x ``fedspectral_power``: down the N x K block V (scaled to max |entry| 1)
        -> up ``block`` = ``M_c^iters V``; the server averages and orthonormalises (QR)."""
        iters, rounds = self.schedule()
        c = len(session.clients)
        v = block_iteration.init_block(self.n, self.k, self.seed)
        history = []
        for round_ in range(1, rounds + 1):
            scale = 1.0 / max(float(np.abs(v).max()), 1e-300)
            y = v * scale
            if self.wire == "float32":
                y = y.astype(np.float32).astype(np.float64)
            total = self._round(wire.FEDSPECTRAL_POWER, y, plus.paper_bound(y),
                                lambda: plus.paper_edge_sensitivity(y, iters, holders=c), {"iters": iters})
            new = plus.paper_server_step(total / scale, self.contributors)
            history.append({"round": round_, "subspace_change": block_iteration.subspace_distance(new, v)})
            session.round_done(round_, rounds, subspace_change=history[-1]["subspace_change"])
            v = new
        labels = plus.embedding_labels(v, self.k, self.seed, self.cfg.n_init)
        return StrategyOutput(labels=labels, history=history,
                              metrics={"mode": "paper", "iters": iters, "protocol_rounds": rounds})

    def _run_exact(self, session: ServerSession) -> StrategyOutput:
        """Exact mode: the global degrees by one secure sum, then an eigensolver on the global operator
        whose every product is one ``fedspectral_product`` round; k-means on its top-k vectors.
        Regularised (``regularise=on``, or ``auto`` once the unregularised solve shows a (k+1)-th
        eigenvalue 1: more components than clusters), the operator is ``M_tau``; ``auto`` keeps the
        unregularised top-k once they have converged and the (k+1)-th eigenvalue is bounded below 1."""
        d, deg_noise = self._global_degrees(session)
        auto = self.cfg.regularise == "auto" and self.k < self.n  # k = N: every node its own cluster
        tau = self._tau(d) if self.cfg.regularise == "on" else 0.0
        result, solver, measure = self._solve(session, d, deg_noise, tau, self.k + 1 if auto else self.k, auto)
        rounds, history = result.rounds, list(result.history)
        # an unconverged solve's last measure bounds no eigenvalue: only a Ritz value at 1 itself shows a component
        error = result.history[-1][measure] if result.converged and result.history else None
        components = plus.more_components_than(result.values, self.k, None if result.stop == "settled" else error)
        stop, final = result.stop, result.history[-1][measure] if result.history else None
        if stop == "settled" and not components:  # the top k converged, the (k+1)-th is bounded below 1
            stop, final = "converged", float(result.norms[:self.k].max())
        if auto and components:
            tau = self._tau(d)
            result, solver, measure = self._solve(session, d, deg_noise, tau, self.k, used=rounds)
            rounds, history, stop = rounds + result.rounds, history + result.history, result.stop
            final = result.history[-1][measure] if result.history else None
        connected = d > 0.5 if tau == 0 else np.ones(self.n, dtype=bool)  # exact degrees are integers
        labels = plus.embedding_labels(result.vectors[:, :self.k], self.k, self.seed, self.cfg.n_init,
                                       connected=connected)
        return StrategyOutput(labels=labels, history=history, metrics={
            "mode": "exact", "solver": solver, "protocol_rounds": rounds, "converged": stop == "converged",
            "tol": self.effective_tol(len(session.clients), self.secure), "stop": stop,
            "block": self._block_width(self.k), "ritz_values": [float(t) for t in result.values[:self.k]],
            f"final_{measure}": final,
            "regularised": tau > 0, "tau": tau,
        })

    def _tau(self, d: np.ndarray) -> float:
        """The regularisation's tau: ``fedspectral-plus.tau``, or the average degree ``sum(d) / N``."""
        return self.cfg.tau if self.cfg.tau > 0 else float(d.sum()) / self.n

    def _block_width(self, k: int) -> int:
        return min(max(self.cfg.block or 2 * self.k, k), self.n)

    def _solve(self, session: ServerSession, d: np.ndarray, deg_noise: float, tau: float, k: int,
               detect: bool = False, used: int = 0) -> tuple[block_iteration.IterationResult, str, str]:
        """The top-``k`` eigenvectors of ``M_tau`` (``tau`` 0: ``M``) by the run's eigensolver, in at most
        the schedule's rounds less ``used``: (result, solver, the measure it stops on). ``detect``: stop
        ("settled") as soon as a k-th Ritz value reaches 1, which bounds the k-th eigenvalue from below:
        at least k components with an edge; or, once the top k - 1 have converged, as soon as the k-th
        eigenvalue is bounded below 1 (:func:`fedgraphcore.protocols.fedspectral.plus.at_most_components`)."""
        tol = self.effective_tol(len(session.clients), self.secure)

        def settled(theta: np.ndarray, norms: np.ndarray | None) -> bool:
            return detect and (plus.more_components_than(theta, k - 1, None)
                               or plus.at_most_components(theta, norms, k - 1, tol))

        block = self._block_width(k)
        solver = self.solver()
        residuals = Convergence(tol) if solver == "krylov" else None  # chebyshev measures once a cycle
        apply = self._global_operator(session, d, deg_noise, residuals, tau)
        max_rounds = max(self.schedule()[1] - used, 1)
        if solver == "krylov":
            result = block_iteration.block_krylov_iteration(apply, self.n, k, block, tol, max_rounds, self.seed,
                                                  basis_blocks=self.cfg.basis_blocks, settled=settled,
                                                  on_round=lambda entry: residuals.measures.append(entry["residual"]))
            return result, solver, "residual"
        result = block_iteration.chebyshev_subspace_iteration(apply, self.n, k, block, self.cfg.degree, tol,
                                                              max_rounds, self.seed, settled=settled)
        return result, solver, "subspace_change"

    def _global_degrees(self, session: ServerSession) -> tuple[np.ndarray, float]:
        """``fedspectral_degrees`` -> up ``degrees``, the client's share ``A_c 1 / r`` of every node's
        degree, masked whenever there are two or more clients (a single client's sum is its own
        vector) and noised under DP. Returns the summed degree vector and its noise std."""
        n = self.n
        masked = len(session.clients) > 1
        deg_noise = 0.0
        if self.dp is not None:
            deg_noise = self.dp.noise_multiplier * plus.DEGREE_SENSITIVITY
            self.dp.step()
            self.releases.append(plus.DEGREE_SENSITIVITY)
        values = {"noise_std": deg_noise}
        if masked:
            session.setup_secure_aggregation()
            # degrees are sums of 1/r shares: the finest scale, so that a coarse secagg.scale cannot round one away
            values.update(session.secagg_values("degrees", float(n) + 12.0 * deg_noise, finest=True))
        replies = session.broadcast(wire.FEDSPECTRAL_DEGREES, pack(values=values),
                                    wire.upload_reply("degrees", (n,), masked, self.dp is not None))
        if masked:
            d = session.secure_sum(replies, "degrees", values)
        else:
            d = np.asarray(unpack(next(iter(replies.values())))[0]["degrees"], dtype=np.float64)
        _check_degrees(d, n, 12.0 * deg_noise * np.sqrt(len(session.clients)))
        session.ledger.add_mechanism(
            "fedspectral-plus:global-degrees",
            protects=("per-client degrees (masked)" if masked else "nothing: one client, whose degrees are the sum")
            + "; the server learns the global degree vector d = sum_c A_c 1 / r"
                     + (" with Gaussian noise" if self.dp is not None else ""),
            params={"revealed": "global degree vector (N values, aggregate over all clients)"},
            guarantee="none: the aggregate degree vector is revealed to the server"
            if self.dp is None else "covered by gaussian:fedspectral-plus (the degree vector is one of its releases)",
        )
        return d, deg_noise

    def _global_operator(self, session: ServerSession, d: np.ndarray, deg_noise: float,
                         residuals: Convergence | None, tau: float = 0.0):
        """``apply(X) = D^-1/2 sum_c (A_c / r) D^-1/2 X``, the global normalised adjacency applied to X:
        one ``fedspectral_product`` round (down ``Y = D^-1/2 X`` scaled to max |entry| 1, up ``block`` =
        ``(A_c / r) Y``); with ``tau`` > 0 ``D_tau^-1/2 (sum_c (A_c / r) Y + (tau/N) 1 1^T Y)``,
        ``Y = D_tau^-1/2 X`` (:func:`fedgraphcore.protocols.fedspectral.plus.regularised_sum`); ``residuals``:
        what the eigensolver stops on, for the progress line."""
        dinv = plus.inverse_sqrt_degrees(d + tau, floor=0.5 if tau == 0 else 0.0)
        dmax = float(d.max(initial=0.0)) + 1.0 + 12.0 * deg_noise  # a client's row sum is <= the true degree
        _, max_rounds = self.schedule()
        products = 0

        def apply(x: np.ndarray) -> np.ndarray:
            nonlocal products
            y = dinv[:, None] * x
            scale = 1.0 / max(float(np.abs(y).max()), 1e-300)
            y *= scale
            if self.wire == "float32":
                y = y.astype(np.float32).astype(np.float64)
            z = plus.regularised_sum(self._round(wire.FEDSPECTRAL_PRODUCT, y, plus.product_bound(y, dmax),
                                                 lambda: plus.exact_edge_sensitivity(y), {}), y, tau)
            products += 1
            session.round_done(products, max_rounds, converging=residuals, capped=True)
            return dinv[:, None] * z / scale

        return apply

    def _record_dp(self) -> None:
        self.session.ledger.add_mechanism(
            "gaussian:fedspectral-plus",
            protects="one edge of the global graph (added or removed at every client holding it), over "
                     "every upload of the run",
            params={
                "noise_multiplier": self.dp.noise_multiplier,
                "delta": self.dp.delta,
                "releases": self.dp.steps,
                "sensitivity": "per release from the broadcast block: exact mode sqrt(top-2 row norms^2), "
                               "degrees sqrt(2); paper mode 4 * iters * ||V||_2 * sqrt(clients) (r <= clients holders)",
                "max_sensitivity": max(self.releases) if self.releases else 0.0,
                "noise_std": "noise_multiplier * sensitivity, added by every client to its own upload",
                "accountant": "rdp",
                "adjacency": "remove",
            },
            guarantee="(epsilon, delta)-DP per edge (add/remove adjacency, Opacus RDP accountant)",
            accountant=self.dp,
        )

    def reference(self, data: GraphData) -> np.ndarray:
        return _reference(self, data)

    def reference_method(self) -> str:
        return _reference_method(self)


def paper_settings(dataset: str) -> tuple[int, int]:
    """The paper's (iters, rounds) for ``dataset``."""
    return PAPER_SETTINGS.get(dataset, PAPER_DEFAULT)


