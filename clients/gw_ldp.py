"""Client side of ``gw-ldp`` (wire protocol: :mod:`fedgraphcore.protocols.gw_ldp`).

What leaves this client: its feature width and graph counts, locally trained
GNN weights each round (optionally clipped and noised) with its number of
training graphs, before each embedding release (without training DP) the node
count and per-channel sum and sum of squares of each BatchNorm layer's input
over its training graphs' nodes (GIN), and once (or every s rounds) the LDP-encoded softmax node
embeddings of its graphs with their sizes, graph ids, split codes, train and
validation labels, and every graph's label for scoring (``eval_labels``: the
evaluation server sees the test graphs' labels too, as it sees the ground truth
in every strategy here). Never an adjacency or feature matrix.

Privacy noise (the LDP codes, DP-SGD's sampling and noise, DP-FedAvg's noise)
is drawn from fresh OS entropy at every release, never from the run's seed:
the server knows the seed and could otherwise replay the noise and remove it.
A simulated or in-process run repeats bit for bit with ``privacy.noise-seed``
(:meth:`clients.base.ClusteringClient.noise`), which a deployed node refuses. A ``gw_embed``
request the server sends again (its reply timed out, ``retries`` > 0) gets the
codes of the first draw back (kept in ``context.state``): the same output, no
second release for the server to average.

The privacy settings are this client's own run-config, never the server's
message: it encodes at its own ``gw-ldp.epsilon`` and refuses a request for
another one, and under training DP (``gw-ldp.dp`` not none) it refuses
``gw_norm``, whose moments the DP noise does not cover.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from fedgraphcore.config import ConfigError
from fedgraphcore.privacy.policy import PrivacyRefusal
from fedgraphcore.protocols import gw_ldp
from clients.base import ClusteringClient, Reply, answers

#: (shard, batch, labels, split) per shard and settings, the newest few kept
#: (a simulation process serves many clients and runs one after another).
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 64


class GWLDPClient(ClusteringClient[gw_ldp.GWLDPConfig]):
    settings = gw_ldp.GWLDPConfig

    def step_limits(self) -> dict[str, int]:
        """Training every round (``num-rounds``); the embeddings at most once a round."""
        rounds = self.shared.num_rounds
        return {**super().step_limits(), gw_ldp.FIT: rounds, gw_ldp.GW_EMBED: rounds}

    # -- local data ----------------------------------------------------------
    def _task(self) -> str:
        return "centre" if self.shard.partitioner == "khop" else "graph"

    def _local(self):
        """(batch, labels, split) of this client's graphs, built once per process."""
        degree_dim, seed, fold = self.cfg.degree_dim, self.shared.seed, self.cfg.fold
        # keyed by the shard object; the entry holds the shard, so its id cannot be reused while cached
        key = (id(self.shard), degree_dim, seed, fold)
        if key in _CACHE:
            _CACHE.move_to_end(key)
        else:
            s = self.shard
            if not s.graphs:
                raise ConfigError(f"client {s.client_id} holds no graphs (partitioner {s.partitioner})")
            batch = gw_ldp.make_batch(s.graphs, degree_dim)
            labels = np.asarray(s.graph_y, dtype=np.int64)
            split = gw_ldp.split_items(len(s.graphs), seed, s.client_id, fold=fold)
            _CACHE[key] = (s, batch, labels, split)
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
        return _CACHE[key][1:]

    def _train_graphs(self, labels: np.ndarray, split: np.ndarray) -> np.ndarray:
        """Indices of this client's labelled training graphs (what it trains on)."""
        return np.flatnonzero((split == gw_ldp.SPLIT_TRAIN) & (labels >= 0))

    def _model(self, arrays, num_classes: int | None = None):
        """The shared GNN with the message's weights ``w.<name>``."""
        from fedgraphcore.models import build_model

        batch, _, _ = self._local()
        weights = gw_ldp.message_weights(arrays)
        if num_classes is None:
            num_classes = int(np.asarray(weights[_last_bias(weights)]).shape[0])
        model = build_model(self.cfg.model, int(batch.x.shape[1]), num_classes, 0)
        gw_ldp.set_weights(model, weights)
        return model

    # -- steps ---------------------------------------------------------------
    def handle(self, action, content):
        with gw_ldp.torch_threads(1):
            return super().handle(action, content)

    def hello_figures(self, values) -> dict:
        """Feature width and graph counts, with hello; a client whose labels need more classes than
        ``num_classes`` refuses."""
        if not self.shard.graphs:
            return {"in_dim": 0, "graphs": 0, "train": 0}
        batch, labels, split = self._local()
        k = int(values["num_classes"])
        if labels.size and labels.max() >= k:
            raise ConfigError(f"graph label {labels.max()} needs at least {labels.max() + 1} classes, but "
                              f"num-clusters={k}: the shared GNN has one output per class")
        return {"in_dim": int(batch.x.shape[1]), "graphs": int(batch.num_graphs),
                "train": int((split == gw_ldp.SPLIT_TRAIN).sum())}

    @answers(gw_ldp.FIT, train=True)
    def on_fit(self, arrays, values) -> Reply:
        """Local training from the received weights; reply the new weights (under training DP
        noised, once per request: a re-sent request gets the first release back,
        :meth:`released_once`) and the number of training graphs."""
        if self.cfg.dp == "none":
            return self._fit(arrays, values)
        weights = self.released_once(gw_ldp.FIT, arrays, values, lambda: self._fit(arrays, values)[0])[0]
        _, labels, split = self._local()
        return weights, {"num_examples": int(self._train_graphs(labels, split).size)}

    def _fit(self, arrays, values) -> Reply:
        """The trained weights ``w.<name>`` (under ``client`` DP the noised update added to the
        received ones), ``num_examples`` and, without DP, the last ``loss``."""
        batch, labels, split = self._local()
        model = self._model(arrays)
        start = gw_ldp.get_weights(model)
        train = self._train_graphs(labels, split)
        dp, cfg = self.cfg.dp, self.cfg
        epochs, lr = int(values["epochs"]), float(values["lr"])
        if dp == "sgd":  # sampling and noise from OS entropy (see the module docstring)
            gw_ldp.dp_sgd_train(model, batch, labels, train, self._task(), epochs, lr, cfg.dp_clip, cfg.dp_noise,
                               cfg.dp_sample_rate, int(self.noise("fit").integers(2**63)))
        else:
            seed = int(values["seed"]) * 100_003 + int(values["round"]) * 1009 + self.shard.client_id
            loss = gw_ldp.local_train(model, batch, labels, train, self._task(), epochs, lr, seed,
                                     freeze_norm=dp == "client")
        new = gw_ldp.get_weights(model)
        reply = {"num_examples": int(train.size)}
        if dp == "client":
            new = gw_ldp.privatise_update(start, new, gw_ldp.trainable_names(model), gw_ldp.training_mechanism(cfg),
                                         self.noise("fit"))
        elif dp == "none":
            reply["loss"] = loss  # not sent under DP: it is not covered by the noise
        return gw_ldp.weights_message(new), reply

    @answers(gw_ldp.GW_NORM)
    def on_gw_norm(self, arrays, values) -> Reply:
        """Moments of one BatchNorm layer's input over this client's training-graph nodes."""
        if self.cfg.dp != "none":
            raise PrivacyRefusal("gw-ldp.dp", f"gw_norm refused: this client runs gw-ldp.dp='{self.cfg.dp}', whose "
                                              "noise does not cover the BatchNorm moments it would upload; valid "
                                              "only with gw-ldp.dp='none'")
        batch, labels, split = self._local()
        return {"moments": gw_ldp.norm_input_moments(self._model(arrays), batch, self._train_graphs(labels, split),
                                                    str(values["layer"]))}, {}

    @answers(gw_ldp.GW_EMBED)
    def on_gw_embed(self, arrays, values) -> Reply:
        eps = self.cfg.epsilon
        if float(values["epsilon"]) != eps:
            raise PrivacyRefusal("gw-ldp.epsilon", f"gw_embed at epsilon={values['epsilon']!r} refused: this "
                                                   f"client's gw-ldp.epsilon is {eps:g} (0 = 1/|V|, inf = no LDP); "
                                                   "valid: only its own")
        return self.released_once(gw_ldp.GW_EMBED, arrays, values, lambda: self._embeddings(arrays, values, eps))

    def _embeddings(self, arrays, values, eps: float) -> dict:
        """This client's ``gw_embed`` upload: node embeddings of every local graph, LDP-encoded below inf."""
        batch, labels, split = self._local()
        model = self._model(arrays)
        rng = self.noise(gw_ldp.GW_EMBED)  # a fresh draw at every release
        rows = []
        for h in gw_ldp.node_embeddings(model, batch, str(values["layer"])):
            if math.isinf(eps):
                rows.append(h)
            else:
                codes, _ = gw_ldp.encode_graph(h, gw_ldp.graph_epsilon(len(h), eps), rng)
                rows.append(codes)
        out = np.vstack(rows)
        return {
            "embeddings": out.astype(np.float64) if math.isinf(eps) else out.astype(np.int8),
            "sizes": np.diff(batch.offsets).astype(np.int64),
            "graph_ids": np.asarray(self.shard.graph_ids, dtype=np.int64),
            "split": split.astype(np.int8),
            "labels": np.where(split == gw_ldp.SPLIT_TEST, -1, labels).astype(np.int64),
            "eval_labels": labels.astype(np.int64),
        }


def _last_bias(weights: dict) -> str:
    """Name of the output layer's bias (its length is the number of classes)."""
    for name in ("lin2.bias", "conv2.bias"):
        if name in weights:
            return name
    raise KeyError("no output-layer bias among the weights")
