"""Client side of ``fedsc`` (wire protocol: :mod:`fedgraphcore.protocols.fedsc`).

The client's samples ``X_p`` are never sent: it uploads the feature dimension,
distance statistics (two numbers, only when ``fedsc.sigma`` is estimated), a
landmark count (one number, only when ``fedsc.landmarks = 0``), its landmark
copy ``Z_p`` each round (optionally masked and/or noised) and, once, its
coefficients ``C_p`` (from which, noise-free, the server can recover ``X_p``:
see strategies/fedsc.py; what it clusters: :func:`fedgraphcore.protocols.fedsc.client_features`).
Noise for ``fedsc.data-noise/noise-z/noise-c/dp-epsilon`` comes from the
operating system's entropy (the server, which knows the seed and the client
id, cannot regenerate it). The data noise is drawn once per run and kept; the
centralised reference cannot reproduce it and perturbs its pooled copy with
its own draw.
"""

from __future__ import annotations

import numpy as np

from fedgraphcore.privacy.policy import PrivacyRefusal
from fedgraphcore.protocols import fedsc
from clients.base import ClusteringClient, Reply, answers, request_digest


class FedSCClient(ClusteringClient[fedsc.FedSCConfig]):
    settings = fedsc.FedSCConfig

    def step_limits(self) -> dict[str, int]:
        """Z_p every round (``num-rounds``), the landmark count and C_p once."""
        return {**super().step_limits(), fedsc.FEDSC_ROUND: self.shared.num_rounds, fedsc.FEDSC_RANK: 1,
                fedsc.FEDSC_FINAL: 1}

    def features(self) -> np.ndarray:
        """This client's (filtered, perturbed) sample rows, computed once per run
        (``fedsc.data-noise`` from :meth:`noise`: fresh OS entropy unless a simulated run sets a seed)."""
        if "fedsc" not in self.context.state.array_records:
            self.save("fedsc", x=fedsc.client_features(self.shard, self.cfg, self.noise("fedsc_data")))
        return self.load("fedsc")["x"]

    def hello_figures(self, values) -> dict:
        """With hello, the feature dimension; when sigma is estimated also two un-noised
        statistics of the samples (one release, :data:`fedgraphcore.protocols.fedsc.FEDSC_BANDWIDTH`,
        in this node's ledger)."""
        x = self.features()
        if not values["estimate"]:  # sigma is given: no statistic of the samples leaves
            return {"features": int(x.shape[1])}
        self.policy.check_noise(fedsc.FEDSC_BANDWIDTH, None)
        with self.spending(fedsc.FEDSC_BANDWIDTH, request_digest({}, values), None):
            total, pairs = fedsc.local_distance_sum(x)
        return {"features": int(x.shape[1]), "distance_sum": total, "pairs": pairs}

    @answers(fedsc.FEDSC_RANK)
    def on_fedsc_rank(self, arrays, values) -> Reply:
        """The landmark count of the spectral-mass rule: an un-noised release."""
        self.policy.check_noise(fedsc.FEDSC_RANK, None)
        with self.spending(fedsc.FEDSC_RANK, request_digest(arrays, values), None):
            d = fedsc.local_landmark_count(self.features(), float(values["sigma"]), float(values["mass"]))
        return {}, {"landmarks": int(d)}

    @answers(fedsc.FEDSC_ROUND)
    def on_fedsc_round(self, arrays, values) -> Reply:
        """Z_p (and the objective unless noised) for the server's average: one release in this
        node's ledger (:meth:`release`; the same request re-sent gets it back)."""
        dp = self._dp_request(values, "z")
        self.policy.check_noise(fedsc.FEDSC_ROUND, dp and dp.noise_multiplier)
        self.require_masking(fedsc.FEDSC_ROUND, values, needed_by_run=self.cfg.secure)
        return self.release(fedsc.FEDSC_ROUND, arrays, values, lambda: self._round(arrays, values, dp),
                            multiplier=dp and dp.effective_noise_multiplier, most=self._budget("z"))

    def _round(self, arrays, values, dp) -> dict:
        x = self.features()
        _, z_p, f = fedsc.client_round(x, arrays["z"], float(values["sigma"]), float(values["lambda"]))
        if dp:
            z_p = dp.apply(z_p, self.noise(fedsc.FEDSC_ROUND))
            update = z_p.ravel()  # the objective value is not protected: left out
        else:
            noise = self.cfg.noise_z
            z_p = fedsc.perturb(z_p, noise, self.noise(fedsc.FEDSC_ROUND))
            # the objective would go up un-noised beside the noised Z_p: left out then
            update = z_p.ravel() if noise > 0 else np.concatenate([z_p.ravel(), [f]])
        if "secagg_tag" in values:  # an honest server declares at least this client's update_bound
            update = self.masked(update, values, floor=fedsc.update_bound(len(x), self.secagg.bound))
        return {"update": update}

    @answers(fedsc.FEDSC_FINAL)
    def on_fedsc_final(self, arrays, values) -> Reply:
        """The coefficients C_p with this client's sample ids: one release in this node's
        ledger (:meth:`release`)."""
        dp = self._dp_request(values, "c")
        self.policy.check_noise(fedsc.FEDSC_FINAL, dp and dp.noise_multiplier)
        self.policy.check_row_images(fedsc.FEDSC_FINAL, dp and dp.noise_multiplier)
        return self.release(fedsc.FEDSC_FINAL, arrays, values, lambda: self._final(arrays, values, dp),
                            multiplier=dp and dp.effective_noise_multiplier, most=self._budget("c"))

    def _final(self, arrays, values, dp) -> dict:
        c = fedsc.solve_coefficients(self.features(), arrays["z"], float(values["sigma"]), float(values["lambda"]))
        if dp:  # rows of c.T are the samples' columns c_i: clip each, add noise
            c = dp.apply(c.T, self.noise(fedsc.FEDSC_FINAL)).T
        else:
            c = fedsc.perturb(c, self.cfg.noise_c, self.noise(fedsc.FEDSC_FINAL))
        return {"c": c, "node_ids": np.asarray(self.shard.node_ids, dtype=np.int64)}

    def _budget(self, which: str) -> int | None:
        """How many noised uploads of ``which`` ("z": Z_p, every round; "c": C_p, once) this
        client's ``fedsc.dp-epsilon`` covers; None without one."""
        if not self.cfg.dp_epsilon > 0:
            return None
        return self.shared.num_rounds if which == "z" else 1

    def _dp_request(self, values, which: str):
        """The Gaussian mechanism for upload ``which`` ("z": Z_p, the whole array clipped; "c":
        C_p, each sample's column clipped), or None without one. The clip is this client's own
        ``fedsc.dp-clip-<which>``; the noise multiplier comes with the request, and a request
        that would spend more than half this client's own ``fedsc.dp-epsilon`` over the uploads
        it covers (:meth:`_budget`, at half its delta: the split the server makes), or leaves
        the noise out, is refused: the server must not be able to lower the noise. Noise from
        fresh OS entropy, which the server cannot predict (:meth:`noise`)."""
        releases = self._budget(which)
        key = f"dp_nm_{which}"
        if key not in values:
            if releases is not None:
                raise PrivacyRefusal("fedsc.dp-epsilon", f"fedsc_{'round' if which == 'z' else 'final'} was "
                                                         f"requested without noise; this client's fedsc.dp-epsilon is "
                                                         f"{self.cfg.dp_epsilon:g}")
            return None
        mech = fedsc.dp_mechanism(self.cfg, which, float(values[key]))
        if releases is not None:  # the mechanism's own accountant serves this check only: the server accounts
            mech.step(releases)
            budget = self.cfg.dp_epsilon / 2
            if mech.epsilon() > budget * (1 + 1e-6):
                raise PrivacyRefusal("fedsc.dp-epsilon", f"{key}={values[key]!r}: {releases} release(s) would spend "
                                                         f"epsilon {mech.epsilon():.4g}, above this client's "
                                                         f"{budget:g} (half its fedsc.dp-epsilon)")
        return mech
