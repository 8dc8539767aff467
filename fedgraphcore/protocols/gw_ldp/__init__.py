"""GW-LDP (Jin & Chen): FedAvg-trained GNN, LDP-encoded node embeddings and a
server-side Gromov-Wasserstein (GW) pairwise matrix between graphs.

Plain functions, no Flower (the transport is strategies/gw_ldp.py and
clients/gw_ldp.py), one module per job:

* :mod:`.wire`: the protocol's steps, reply specifications, the typed
  run-config view :class:`GWLDPConfig` and the keys' choices.
* :mod:`.graphs`: a client's graphs: node features, its 7:2:1 (or ten-fold)
  split, the block-diagonal batch.
* :mod:`.training`: local training, local DP-SGD, client-level DP-FedAvg
  (the mechanism client and server build alike), FedAvg. The models
  (:func:`fedgraphcore.models.build_model`: GCN, 2 layers, hidden 16, or GIN, 5
  layers, hidden 64, then two linear layers) end in per-node class scores
  ``z_v`` (``C`` = number of classes); the graph score is their mean.
* :mod:`.norms`: BatchNorm statistics of the union of the clients' training
  graphs, from per-client moments.
* :mod:`.embeddings`: softmax node embeddings and their multi-bit LDP
  encoding (paper Algorithm 1, ``epsilon_g``-LDP per graph).
* :mod:`.gw`: intra-distance spaces and the GW matrix (POT, process pool).
* :mod:`.selection`: SVC on ``exp(-gamma D)`` with (C, gamma) picked without
  the test graphs; spectral clustering or k-medoids of the graphs.
* :mod:`.uploads`: checks of the clients' replies (what an honest client
  can send).

The names below are the package's API; torch is imported only inside the
functions that train or run a model.
"""

from __future__ import annotations

from .embeddings import embedding_width, encode_graph, graph_epsilon, node_embeddings
from .graphs import GraphBatch, graph_slices, make_batch, node_features, split_items
from .gw import embedding_space, gw_matrix, gw_pair, intra_distance, merge_duplicates, shortest_path_matrix
from .norms import (freeze_norm_statistics, moments_problem, norm_input_moments, norm_layers,
                    pooled_norm_statistics, with_norm_statistics)
from .selection import C_GRID, CV_FOLDS, GAMMA_GRID, cluster_gw, kmedoids, normalise, svc_problem, svc_select
from .training import (dp_sgd_train, fedavg, get_weights, local_train, predict_graphs, privatise_update,
                       set_weights, torch_threads, trainable_names, training_mechanism)
from .uploads import SOFTMAX_ATOL, describe_problem, embedding_upload_problem
from .wire import (CLUSTERINGS, DP_MODES, EMBEDDING_LAYERS, FIT, FOLDS, HELLO_NUMBERS, GW_EMBED,
                   GW_NORM, MODELS, NORM_STATISTICS, SELECTIONS, SPLIT_TEST, SPLIT_TRAIN, SPLIT_VAL, GWLDPConfig,
                   embed_reply, fit_reply, message_weights, norm_reply, weights_message)

__all__ = [
    "embedding_width", "encode_graph", "graph_epsilon", "node_embeddings",
    "GraphBatch", "graph_slices", "make_batch", "node_features", "split_items",
    "embedding_space", "gw_matrix", "gw_pair", "intra_distance", "merge_duplicates", "shortest_path_matrix",
    "freeze_norm_statistics", "moments_problem", "norm_input_moments", "norm_layers", "pooled_norm_statistics",
    "with_norm_statistics",
    "C_GRID", "CV_FOLDS", "GAMMA_GRID", "cluster_gw", "kmedoids", "normalise", "svc_problem", "svc_select",
    "dp_sgd_train", "fedavg", "get_weights", "local_train", "predict_graphs", "privatise_update", "set_weights",
    "torch_threads", "trainable_names", "training_mechanism",
    "SOFTMAX_ATOL", "describe_problem", "embedding_upload_problem",
    "CLUSTERINGS", "DP_MODES", "EMBEDDING_LAYERS", "FIT", "FOLDS", "HELLO_NUMBERS", "GW_EMBED",
    "GW_NORM", "MODELS", "NORM_STATISTICS", "SELECTIONS", "SPLIT_TEST", "SPLIT_TRAIN", "SPLIT_VAL", "GWLDPConfig",
    "embed_reply", "fit_reply", "message_weights", "norm_reply", "weights_message",
]
