"""Server side of ``kcagc.mode = exact``: centralised AGC's labels over vertically split features.

The math is in :mod:`fedgraphcore.protocols.kcagc.exact`; this module only moves data. Every
request is one ``kcagc_exact`` broadcast (values: ``stage``, the filter ``filter`` and
order ``order`` psi, ``gain`` t, a power of two every upload is multiplied by so that
its declared bound lies in (2^31, 2^32] and picks the 64-bit ring at its finest scale;
the server divides the sum by t):

1. ``norm`` (once, at the first order used) -> up ``s``: ``||F_l||_F^2`` of the client's
   filtered block ``F_l = G^psi X^l`` (masked; bound n x ``secagg.bound``) and ``cols``,
   its number of feature columns (in clear). The server learns ``c = ||F||_F^2`` summed
   over the clients and the total width.
2. ``product`` (one per eigensolver round) - down ``block`` Y (n x b, b = 2 min(k, columns))
   -> up ``p`` = ``F_l (F_l^T Y)`` (n x b, masked; bound ``c max_j ||Y_j||``). The server's
   sum divided by c is ``M Y`` for ``M = F F^T / c``; block Krylov (the solver of
   fedspectral-plus exact mode) runs until every top Ritz pair's residual is <= 1e-9.
3. ``intra`` (adaptive order only, once per psi tried) - down ``labels`` (n, the k-means labels
   of psi's embedding) -> up ``d``: the client's part of AGC's intra-cluster distance of
   ``G^psi X`` (masked; bound 2c). The server stops the search as AGC does.

Then k-means on the top eigenvectors (as the reference) and ``labels`` down. With a single
client nothing is masked (its part is the sum).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedgraphcore.graph_filters import AGC_MAX_ORDER
from fedgraphcore.protocols.kcagc import exact
from fedgraphcore.transport import pack, unpack
from fedgraphcore.wire import LABELS, ProtocolError, ReplySpec
from strategies.base import StrategyOutput

if TYPE_CHECKING:
    from fedgraphcore.session import ServerSession

#: The final ``labels`` step's acknowledgement (as in ``kcagc``'s paper mode).
RECEIVED_REPLY = ReplySpec(values=("received",))


class ExactAGC:
    """One exact-mode run: the sums the clients supply, the eigensolver and k-means on the server."""

    def __init__(self, session: ServerSession, n: int, k: int, seed: int, kind: str, order: int | None,
                 row_bound: float) -> None:
        self.session, self.n, self.k, self.seed, self.kind, self.order = session, n, k, seed, kind, order
        self.row_bound = row_bound
        self.secure = len(session.clients) > 1
        self.rounds = 0  # message rounds of this mode (every kcagc_exact broadcast)
        self.products = 0

    def run(self) -> StrategyOutput:
        if self.secure:
            self.session.setup_secure_aggregation()
        first = self.order if self.order is not None else 1
        self.total, cols = self.norms(first)
        dim = min(self.k, cols)
        outcome = exact.exact_agc(self.product, self.intra, self.n, self.k, dim, self.seed, self.order,
                                  AGC_MAX_ORDER)
        self.record_ledger()
        self.session.broadcast(LABELS, pack({"labels": outcome.labels}), RECEIVED_REPLY)
        return StrategyOutput(labels=outcome.labels, ids=np.arange(self.n),
                              history=[h for s in outcome.solves for h in s.history],
                              metrics=self.metrics(outcome, dim))

    def metrics(self, outcome: exact.ExactOutcome, dim: int) -> dict:
        last = outcome.solves[-1]
        stats = self.session.stats
        return {"mode": "exact", "filter_order": outcome.order,
                "adaptive_order": self.order is None, "embed_dim": dim, "block": exact.block_width(self.n, dim),
                "protocol_rounds": self.rounds + 1, "product_rounds": self.products,
                "solver_rounds": [s.rounds for s in outcome.solves],
                "converged": all(s.converged for s in outcome.solves), "stop": last.stop,
                "final_residual": last.history[-1]["residual"] if last.history else None,
                "ritz_values": [float(t) for t in last.values], "intra_distances": outcome.intra,
                "secure_aggregations": int(stats.secure_aggregations),
                "bytes_up": int(stats.bytes_up), "bytes_down": int(stats.bytes_down)}

    # -- the three sums -------------------------------------------------------------------------
    def _sum(self, stage: str, order: int, arrays: dict, bound: float, name: str, spec: ReplySpec,
             numbers: tuple[str, ...] = ()) -> tuple[np.ndarray, list[dict]]:
        """One ``kcagc_exact`` round: every client's part of ``name`` times the gain t, summed
        (securely with several clients) and divided by t; also the replies' ``numbers``."""
        gain = exact.wire_scale(bound)
        values = {"stage": stage, "filter": self.kind, "order": int(order), "gain": gain}
        if self.secure:
            values.update(self.session.secagg_values(f"exact-{stage}", gain * bound, finest=True))
        replies = self.session.broadcast(exact.KCAGC_EXACT, pack(arrays, values), spec)
        self.rounds += 1
        if self.secure:
            total = self.session.secure_sum(replies, name, values)
        else:
            total = np.asarray(unpack(next(iter(replies.values())))[0][name], dtype=np.float64)
        figures = [unpack(c)[1] for c in replies.values()] if numbers else []
        return total / gain, figures

    def norms(self, order: int) -> tuple[float, int]:
        """Stage ``norm``: ``c``, the clients' summed ``||F_l||_F^2`` raised by the largest decoding
        error of the sum (so that it bounds the true sum, whatever the rounding), and the total width."""
        total, figures = self._sum("norm", order, {}, exact.norm_bound(self.n, self.row_bound), "s",
                                   exact.norm_reply(self.secure), ("cols",))
        value = float(total[0])
        if value < 0:
            raise ProtocolError(f"step '{exact.KCAGC_EXACT}' (norm): the summed squared norm is {value:.6g} < 0; "
                                "every client's part is >= 0, so an upload is malformed")
        slack = len(self.session.clients) ** 2 * exact.norm_bound(self.n, self.row_bound) * 2.0 ** -62
        return value * (1 + 1e-9) + slack, int(sum(int(f["cols"]) for f in figures))

    def product(self, order: int, y: np.ndarray) -> np.ndarray:
        """Stage ``product``: ``M Y = (sum_l F_l F_l^T Y) / c`` for the order-``order`` block."""
        y = np.ascontiguousarray(y, dtype=np.float64)
        total, _ = self._sum("product", order, {"block": y}, exact.product_bound(self.total, y), "p",
                             exact.product_reply(self.n, y.shape[1], self.secure))
        self.products += 1
        self.session.round_done(self.rounds, None, order=order)
        return total / self.total

    def intra(self, order: int, labels: np.ndarray) -> float:
        """Stage ``intra``: the pooled intra-cluster distance of ``G^order X`` under ``labels``."""
        total, _ = self._sum("intra", order, {"labels": labels.astype(np.int64)}, exact.intra_bound(self.total),
                             "d", exact.intra_reply(self.secure))
        self.session.round_done(self.rounds, None, order=order, intra=float(total[0]))
        return float(total[0])

    def record_ledger(self) -> None:
        adaptive = self.order is None
        self.session.ledger.add_mechanism(
            "kcagc:exact-gram-products",
            protects="each client's filtered block F_l = G^psi X^l: only sums over all clients leave the "
                     "secure aggregation (with one client, its own block's products, the sum itself)",
            params={"revealed": "to the server: c = ||F||_F^2 and the clients' column counts; per round the n x b "
                                "products F F^T Y of the server's blocks Y (so F F^T on their span: the inner "
                                "products of the nodes' pooled filtered rows there, all of them once the blocks "
                                "span F's columns, i.e. F up to an orthogonal map of its columns; never one "
                                "client's block), hence the final embedding and labels"
                                + ("; per filter order tried, the pooled intra-cluster distance (one number), "
                                   "and to every client that order's k-means labels" if adaptive else ""),
                    "product_rounds": self.products},
            guarantee="secure aggregation: the server sees sums over the clients, not one client's part; the sums "
                      "themselves are revealed",
        )
