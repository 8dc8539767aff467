"""Client side of ``fedsc`` (see strategies/fedsc.py for the wire protocol).

The client's samples ``X_p`` are never sent: it uploads the feature dimension,
distance statistics (two numbers, only when ``fedsc.sigma`` is estimated), a
landmark count (one number, only when ``fedsc.landmarks = 0``), its landmark
copy ``Z_p`` each round (optionally masked and/or noised) and, once, its
coefficients ``C_p`` (from which, noise-free, the server can recover ``X_p``:
see strategies/fedsc.py).
Noise for ``fedsc.data-noise/noise-z/noise-c/dp-epsilon`` comes from the
operating system's entropy (the server, which knows the seed and the client
id, cannot regenerate it). The data noise is drawn once per run and kept; the
centralised reference cannot reproduce it and perturbs its pooled copy with
its own draw.
"""

from __future__ import annotations

import numpy as np

from app.protocols import fedsc as proto
from clients.base import ClusteringClient
from strategies.fedsc import client_features


class FedSCClient(ClusteringClient):
    actions = ("fedsc_bandwidth", "fedsc_rank", "fedsc_round", "fedsc_final")

    def features(self) -> np.ndarray:
        """This client's (filtered, perturbed) sample rows, computed once per run
        (``fedsc.data-noise`` from fresh OS entropy)."""
        if "fedsc" not in self.context.state.array_records:
            self.save("fedsc", x=client_features(self.shard, self.config, np.random.default_rng()))
        return self.load("fedsc")["x"]

    def on_fedsc_bandwidth(self, arrays, values):
        x = self.features()
        if not values.get("estimate", True):  # sigma is given: no statistic of the samples leaves
            return {}, {"features": int(x.shape[1])}
        total, pairs = proto.local_distance_sum(x)
        return {}, {"features": int(x.shape[1]), "distance_sum": total, "pairs": pairs}

    def on_fedsc_rank(self, arrays, values):
        d = proto.local_landmark_count(self.features(), float(values["sigma"]), float(values["mass"]))
        return {}, {"landmarks": int(d)}

    def on_fedsc_round(self, arrays, values):
        """Z_p (and the objective unless noised) for the server's average; a noised Z_p is
        one release: the same request re-sent gets it back (:meth:`released_once`)."""
        if "dp_nm_z" in values or float(self.config["fedsc.noise-z"]) > 0:
            return self.released_once("fedsc_round", arrays, values, lambda: self._round(arrays, values)[0])
        return self._round(arrays, values)

    def _round(self, arrays, values):
        x = self.features()
        _, z_p, f = proto.client_round(x, arrays["z"], float(values["sigma"]), float(values["lambda"]))
        if "dp_nm_z" in values:
            z_p = self._gaussian(z_p, values["dp_clip_z"], values["dp_nm_z"], per_row=False)
            update = z_p.ravel()  # the objective value is not protected: left out
        else:
            noise = float(self.config["fedsc.noise-z"])
            z_p = proto.perturb(z_p, noise, np.random.default_rng())
            # the objective would go up un-noised beside the noised Z_p: left out then
            update = z_p.ravel() if noise > 0 else np.concatenate([z_p.ravel(), [f]])
        if "secagg_tag" in values:
            update = self.masked(update, values)
        return {"update": update}, {}

    def on_fedsc_final(self, arrays, values):
        """The coefficients C_p with this client's sample ids; noised C_p is one release
        (:meth:`released_once`)."""
        if "dp_nm_c" in values or float(self.config["fedsc.noise-c"]) > 0:
            return self.released_once("fedsc_final", arrays, values, lambda: self._final(arrays, values)[0])
        return self._final(arrays, values)

    def _final(self, arrays, values):
        c = proto.solve_coefficients(self.features(), arrays["z"], float(values["sigma"]), float(values["lambda"]))
        if "dp_nm_c" in values:
            # rows of c.T are the samples' columns c_i: clip each, add noise
            c = self._gaussian(c.T, values["dp_clip_c"], values["dp_nm_c"], per_row=True).T
        else:
            c = proto.perturb(c, float(self.config["fedsc.noise-c"]), np.random.default_rng())
        return {"c": c, "node_ids": np.asarray(self.shard.node_ids, dtype=np.int64)}, {}

    @staticmethod
    def _gaussian(array: np.ndarray, clip: float, noise_multiplier: float, per_row: bool) -> np.ndarray:
        """Clip (whole array or each row) and add N(0, (noise_multiplier * clip)^2) noise."""
        from app.privacy.gaussian import GaussianMechanism

        mech = GaussianMechanism(float(clip), float(noise_multiplier), per_row=per_row)
        return mech.apply(array, np.random.default_rng())
