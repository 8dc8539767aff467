"""Strategy ``fedsc``: federated spectral clustering by secure similarity reconstruction.

Qiao, Ding & Fan (2023). Samples (rows) are split over the clients; together
they factorise the Gaussian kernel's feature map, ``phi(X_p) ~ phi(Z) C_p``,
with shared landmarks ``Z`` (d x m) and private coefficients ``C_p``
(d x N_p); the server then clusters ``C' K(Z, Z) C``, an approximation of the
full n x n kernel matrix. Math in ``fedgraphcore.protocols.fedsc``.

Wire protocol: :mod:`fedgraphcore.protocols.fedsc`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from fedgraphcore.config import ConfigError, RunConfig
from fedgraphcore.data.types import GraphData
from fedgraphcore.protocols import fedsc
from fedgraphcore.wire import LABELS, ProtocolError, ReplySpec
from fedgraphcore.transport import pack, unpack
from strategies.base import (ClusteringStrategy, StrategyOutput, announced_rows, common_feature_dimension,
                             check_item_ids, concat_int64)

if TYPE_CHECKING:
    from fedgraphcore.session import ServerSession


class FedSC(ClusteringStrategy[fedsc.FedSCConfig]):
    """Federated spectral clustering by secure similarity reconstruction (Qiao, Ding & Fan, 2023).
    Each client holds some samples (or the features of some nodes of a graph). Together they
    factorise the Gaussian kernel's feature map with shared landmarks Z and private coefficients:
    every round each client improves its coefficients and sends its update of Z (optionally
    secure-aggregated, noised or under a calibrated Gaussian mechanism); at the end each client
    sends its coefficients, from which the server clusters an approximation of the full kernel
    matrix. Centralised reference: spectral clustering on the exact kernel of the pooled samples."""

    name = "fedsc"
    summary = "federated spectral clustering by kernel factorisation (secure similarity reconstruction)"
    split = "samples: each client holds some rows (samples, or the node features of some nodes)"
    partitioners = ("sample", "sample-dirichlet", "node-random", "node-community", "node-dirichlet")
    needs_features = True
    tolerates_dropouts = True  # Z is the average over the clients that answered

    settings = fedsc.FedSCConfig

    @classmethod
    def hello_values(cls, config: RunConfig) -> dict:
        """Step 1 rides on hello: whether to estimate sigma (the figures of :meth:`_bandwidth`)."""
        return {"estimate": _estimates_sigma(config)}

    @classmethod
    def hello_reply(cls, config: RunConfig) -> ReplySpec:
        return fedsc.bandwidth_reply(_estimates_sigma(config))

    @classmethod
    def check(cls, config: RunConfig) -> None:
        super().check(config)
        cfg = fedsc.FedSCConfig.of(config)
        if cfg.dp_epsilon > 0 and (cfg.noise_z > 0 or cfg.noise_c > 0):
            raise ConfigError(
                "fedsc.dp-epsilon and fedsc.noise-z/noise-c are alternative noise variants; "
                "valid choices: set either dp-epsilon or the noise ratios, not both"
            )
        sigma, landmarks = cfg.sigma, cfg.landmarks
        if 0 < sigma < fedsc.SIGMA_RANGE[0]:
            low, high = fedsc.SIGMA_RANGE
            raise ConfigError(f"invalid value {sigma:g} for 'fedsc.sigma': 2 sigma^2 underflows to 0, the kernel "
                              f"is 0/0 at distance 0; valid: 0 (estimate) or a bandwidth in [{low:g}, {high:g}]")
        if cfg.dp_epsilon > 0 and not (sigma > 0 and landmarks > 0):
            clear = [what for what, given in (("distance_sum/pairs (sigma estimate)", sigma > 0),
                                              ("spectral-mass landmark count", landmarks > 0)) if not given]
            raise ConfigError(
                f"fedsc.dp-epsilon={cfg.dp_epsilon:g} with fedsc.sigma={sigma:g}, "
                f"fedsc.landmarks={landmarks}: each client would upload its {' and '.join(clear)} without noise; "
                "valid choices: set fedsc.sigma > 0 and fedsc.landmarks > 0, or fedsc.dp-epsilon=0"
            )

    # ------------------------------------------------------------------ protocol
    def run(self, session: ServerSession) -> StrategyOutput:
        self._record_noise(session)
        sigma, m = self._bandwidth(session)
        d = self._landmark_count(session, sigma)
        z = fedsc.init_landmarks(d, m, self.shared.seed)
        dp = self._dp_mechanisms(self.shared.num_rounds) if self.cfg.dp_epsilon > 0 else None
        if dp:
            self._record_dp(session, dp)
        if self.cfg.secure:
            session.setup_secure_aggregation()
        common = {"sigma": sigma, "lambda": self.cfg.lambda_}
        if dp:
            # each client clips at its own fedsc.dp-clip-* and checks the multipliers against its own budget
            common.update(dp_nm_z=dp["z"].noise_multiplier, dp_nm_c=dp["c"].noise_multiplier)
        z, history = self._landmark_rounds(session, z, common, dp)
        blocks, ids = self._coefficients(session, z, common, dp)
        affinity = fedsc.reconstruct(z, np.hstack([b["c"] for b in blocks.values()]), sigma)
        if not np.isfinite(affinity).all():
            raise ProtocolError("step 'fedsc_final': the reconstructed affinity C'K(Z,Z)C is not finite: an upload "
                                "of Z_p or C_p is far out of range")
        labels = fedsc.cluster_affinity(affinity, self.shared.num_clusters, self.shared.seed, self.cfg.n_init)
        self._send_labels(session, blocks, labels)
        return StrategyOutput(labels=labels, ids=ids, history=history, metrics={"sigma": sigma, "landmarks": d})

    def _landmark_rounds(self, session: ServerSession, z: np.ndarray, common: dict,
                         dp: dict | None) -> tuple[np.ndarray, list[dict]]:
        """Step 3, ``num-rounds`` x ``fedsc_round``: down the landmarks ``z`` -> up ``update``, the
        client's ``Z_p`` and objective (masked with ``fedsc.secure``; the objective left out when
        ``Z_p`` is noised); the new landmarks are the average ``Z_p``. Returns them and the history."""
        d, m = z.shape
        secure, rounds = self.cfg.secure, self.shared.num_rounds
        noised = bool(dp) or self.cfg.noise_z > 0  # then the objective is not sent
        spec = fedsc.round_reply(d * m + (0 if noised else 1), secure, noised)
        bound = fedsc.update_bound(max(announced_rows(session).values()), self.secagg.bound)
        history = []
        for r in range(1, rounds + 1):
            values = dict(common, round=r)
            if secure:
                values.update(session.secagg_values("update", bound, recover=self.tolerates_dropouts))
            # Without secure aggregation Z is a plain average over the clients
            # that answered, so a client that drops out is left out (its
            # samples then get no label); masks only cancel over everyone.
            replies = session.broadcast(fedsc.FEDSC_ROUND, pack({"z": z}, values), session.secure_reply(spec, values),
                                        require_all=secure and not session.recovers(values))
            if secure:
                total = session.secure_sum(replies, "update", values)
            else:
                total = np.sum([unpack(c)[0]["update"] for c in replies.values()], axis=0)
            if dp:
                dp["z"].step()
            z_new = total[: d * m].reshape(d, m) / len(replies)
            record = {"round": r, "shift": float(np.abs(z_new - z).max())}
            if not noised:
                record["objective"] = float(total[-1])  # sum_p f_p(Z^{r-1}, C_p)
            history.append(record)
            session.round_done(r, rounds, objective=record.get("objective"), shift=record["shift"])
            z = z_new
        return z, history

    def _coefficients(self, session: ServerSession, z: np.ndarray, common: dict,
                      dp: dict | None) -> tuple[dict, np.ndarray]:
        """Step 4, ``fedsc_final``: down the final ``z`` -> up ``c`` = C_p (one column per sample the
        client announced in hello, noised with ``fedsc.noise-c`` / ``dp-epsilon``) and the samples'
        ``node_ids``. Returns the replies by node and the ids in the order of their columns."""
        rows = announced_rows(session)
        noised_c = bool(dp) or self.cfg.noise_c > 0
        specs = {node: fedsc.final_reply(len(z), count, noised_c) for node, count in rows.items()}
        final = session.broadcast(fedsc.FEDSC_FINAL, pack({"z": z}, common), specs, require_all=self.cfg.secure)
        if dp:
            dp["c"].step()
            self._record_dp(session, dp)  # refresh the release counts in the ledger
        blocks = {node: unpack(content)[0] for node, content in final.items()}
        # without partition.overlap every sample lives on one client: else a client's columns
        # would stand for another's samples and leave some unlabelled
        ids_of = {node: session.positions(fedsc.FEDSC_FINAL, node, b["node_ids"]) for node, b in blocks.items()}
        check_item_ids(session, fedsc.FEDSC_FINAL, ids_of,
                       exclusive=self.config["partition.overlap"] == 0, below=sum(rows.values()))
        return blocks, concat_int64(ids_of.values())

    @staticmethod
    def _send_labels(session: ServerSession, blocks: dict, labels: np.ndarray) -> None:
        """Step 5, ``labels``: each client gets the labels of its own samples (its columns of C)."""
        start = 0
        contents = {}
        for node, b in blocks.items():
            n_p = b["c"].shape[1]
            contents[node] = pack({"labels": labels[start:start + n_p]})
            start += n_p
        session.exchange(LABELS, contents, fedsc.RECEIVED_REPLY)

    def _bandwidth(self, session: ServerSession) -> tuple[float, int]:
        """Step 1, with ``hello``: sigma (given, or from the clients' distance sums) and the
        feature dimension m."""
        vals = [c.summary for c in session.clients]
        features = common_feature_dimension(v["features"] for v in vals)
        if not _estimates_sigma(self.config):
            return self.cfg.sigma, features
        rows = announced_rows(session)
        for client, v in zip(session.clients, vals):  # the pairs of a client's own samples: fixed by its row count
            count = rows[client.node_id]
            pairs = count * (count - 1) // 2
            if v["pairs"] != pairs:
                raise ProtocolError(f"step 'hello': client {client.partition_id} reports {v['pairs']!r} pairs for "
                                    f"its {count} samples; expected {pairs}")
        try:
            sigma = fedsc.combine_bandwidth([v["distance_sum"] for v in vals], [v["pairs"] for v in vals])
        except ValueError as err:
            raise ConfigError(f"fedsc.sigma=0 cannot be estimated: {err}; set fedsc.sigma > 0") from None
        return sigma, features

    @staticmethod
    def _record_dp(session: ServerSession, dp: dict) -> None:
        dp["z"].record(session.ledger, "fedsc:gaussian-z",
                       "each client's landmark upload Z_p, every round (client-level unit: the whole array)")
        dp["c"].record(session.ledger, "fedsc:gaussian-c",
                       "each sample's coefficient column c_i of the final C_p upload (sample-level unit)")

    def _landmark_count(self, session: ServerSession, sigma: float) -> int:
        """Step 2, ``fedsc_rank``: d from ``fedsc.landmarks``, else the spectral-mass rule on each
        client's kernel (largest count)."""
        rows = announced_rows(session)
        configured = self.cfg.landmarks
        if configured > sum(rows.values()):  # K(Z, Z) is d x d, and its rank is at most the samples
            raise ConfigError(f"fedsc.landmarks={configured} exceeds the {sum(rows.values())} samples of all "
                              f"clients; valid: 0 (spectral-mass rule) to {sum(rows.values())}")
        if configured > 0:
            return configured
        replies = session.broadcast(fedsc.FEDSC_RANK, pack(values={"sigma": sigma, "mass": self.cfg.mass}),
                                    fedsc.RANK_REPLY)
        counts = {}
        for node, content in replies.items():
            count = int(unpack(content)[1]["landmarks"])
            if count > rows[node]:  # the mass count of a client's n_p x n_p kernel is at most its rank <= n_p
                raise ProtocolError(f"client {session.partition_of(node)} (node {node}) sent landmarks={count}, "
                                    f"more than its {rows[node]} samples")
            counts[node] = count
        return fedsc.combine_landmark_counts(counts.values())

    def _record_noise(self, session: ServerSession) -> None:
        from fedgraphcore.privacy.gaussian import record_noise_ratio

        if self.cfg.data_noise > 0:
            record_noise_ratio(session.ledger, "fedsc:data-noise",
                               "each client's samples, perturbed once before anything is computed",
                               self.cfg.data_noise)
        if self.cfg.noise_z > 0:
            record_noise_ratio(session.ledger, "fedsc:noise-z", "each client's landmark upload Z_p, every round",
                               self.cfg.noise_z)
        if self.cfg.noise_c > 0:
            record_noise_ratio(session.ledger, "fedsc:noise-c", "each client's final coefficients C_p",
                               self.cfg.noise_c)

    def _dp_mechanisms(self, rounds: int) -> dict:
        """Calibrated Gaussian mechanisms for the Z_p uploads and for C_p.

        The total (epsilon, delta) is split in half. Z: the whole array Z_p is
        the unit (client-level, replace adjacency, sensitivity 2 * clip), one
        release per round, so any change of a client's samples, in particular
        of one sample, is covered. C: each column c_i depends on sample i only
        (``c_i = (K_zz + lambda I)^-1 k(Z, x_i)``), so per-column clipping
        gives a sample-level release, once. The ledger composes the two by
        summation: (epsilon, delta)-DP per sample (replace adjacency: one
        row of a client's feature matrix changes) for everything the server
        receives that depends on the feature values, i.e. the Z_p and C_p
        uploads. The per-round objective value is then not uploaded, and
        :meth:`check` requires ``fedsc.sigma`` and ``fedsc.landmarks`` to be
        given, so the distance statistics and the landmark count are not
        uploaded either. Outside the guarantee (independent of the feature
        values, so unchanged by that adjacency): the feature dimension m,
        each client's sample count and its samples' global ids
        (``node_ids``); ``fedsc.sigma`` must be a public choice (one read off
        the private data is a release the accountant does not see). A "sample" is a row of
        the matrix the client clusters: with ``fedsc.filter-order`` > 0 a
        node's raw features enter the filtered rows of its neighbours up to
        that many hops too, so the C guarantee covers one filtered row, not
        one node (Z_p is covered at client level regardless). The
        server's mechanism objects only account (``step()`` per release); the
        clients clip and add the noise, from their own entropy, so the
        ledger's ``clipped`` count stays 0 (the server does not learn it).
        """
        eps, delta = self.cfg.dp_epsilon / 2, self.cfg.dp_delta / 2
        return {"z": fedsc.dp_mechanism(self.cfg, "z", _noise_multiplier(eps, delta, rounds)),
                "c": fedsc.dp_mechanism(self.cfg, "c", _noise_multiplier(eps, delta, 1))}

    # ----------------------------------------------------------------- reference
    def reference(self, data: GraphData) -> np.ndarray:
        """Centralised spectral clustering on the exact kernel ``K(X, X)`` of the pooled samples.

        Same features as the clients use (filtered), same sigma rule (the
        estimate from the per-client statistics), same kNN rule and k-means.
        With ``fedsc.data-noise`` > 0 the clients' noise comes from their own
        entropy and cannot be reproduced here: the reference perturbs the
        pooled samples with its own draw of the same mechanism (seeded, see
        :func:`fedgraphcore.protocols.fedsc.pooled_features`), so agreement figures then compare two draws
        of the same perturbation, not the same perturbed data (and an
        estimated sigma is the estimate on the reference's draw).
        """
        x, ids, sigma = fedsc.pooled_features(data, self.config)
        labels = fedsc.centralised_sc(x, sigma, self.shared.num_clusters, self.shared.seed, self.cfg.n_init)
        out = np.full(data.num_nodes, -1, dtype=np.int64)
        out[ids[::-1]] = labels[::-1]  # first occurrence wins, as in StrategyOutput
        return out

    def reference_method(self) -> str:
        cfg = self.cfg
        sigma = f"sigma {cfg.sigma:g}" if cfg.sigma > 0 else "sigma from the clients' distance statistics"
        noise = f"; features perturbed by its own draw of data-noise {cfg.data_noise:g}" if cfg.data_noise > 0 else ""
        return (f"centralised spectral clustering on the exact Gaussian kernel of the pooled samples ({sigma}, "
                f"kNN-sparsified, k-means with {cfg.n_init} restarts; features AGC-filtered {cfg.filter_order} "
                f"times{noise}), {self._k_and_seed()}")


def _estimates_sigma(config: RunConfig) -> bool:
    """Whether the clients' distance statistics set sigma (``fedsc.sigma = 0``)."""
    return not config["fedsc.sigma"] > 0


@lru_cache(maxsize=64)
def _noise_multiplier(epsilon: float, delta: float, steps: int) -> float:
    """Opacus calibration (a binary search, ~1 s), cached per process."""
    from fedgraphcore.privacy.gaussian import calibrate_noise_multiplier

    return calibrate_noise_multiplier(epsilon, delta, steps)
