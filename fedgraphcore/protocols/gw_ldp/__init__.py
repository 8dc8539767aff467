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

Wire protocol (what leaves each client, step by step):

1. With ``hello`` (down: ``num_classes``, the GNN's outputs; a client whose
   labels need more refuses) -> up: values ``in_dim``, ``graphs``, ``train``
   (feature width and counts only; whole numbers, ``train <= graphs``, else the
   run stops, :func:`fedgraphcore.protocols.gw_ldp.describe_problem`).
2. ``fit`` (message category ``train``) x ``num-rounds`` (down: the global
   GNN weights ``w.<name>``, epochs, learning rate) -> up: the locally
   trained weights ``w.<name>`` (same shapes), ``num_examples`` (training
   graphs, in clear also under DP) and, without DP only, ``loss`` (its mean
   training loss, a finite number). The server averages them weighted by
   ``num_examples`` (a whole number up to the client's described training
   graphs, else the run stops) with Flower's ``aggregate_arrayrecords``
   (FedAvg). A client that does not answer, or whose weights fail the
   shape/finiteness checks, is dropped (``dropped_clients``); one whose
   SuperNode left and came back with the same shard is taken back at the next
   round (``ServerSession.take_back``); the run stops when fewer than
   ``min-clients`` remain. With ``gw-ldp.dp = client``
   each client clips its update (L2 <= ``gw-ldp.dp-clip``) and adds Gaussian
   noise before uploading (client-level DP-FedAvg, Opacus RDP accountant);
   with ``gw-ldp.dp = sgd`` each client trains by local DP-SGD instead (one
   graph = one sample: Poisson sampling at ``gw-ldp.dp-sample-rate``,
   per-graph clipping, Gaussian noise; ``local-epochs`` DP-SGD steps per
   round, accounted by Opacus' RDP accountant). Under either DP mode the
   BatchNorm statistics (GIN) are frozen: they come back unchanged, not
   noised (the clients' DP step rejects a change), only the trainable
   weights carry the protected update.
2b. ``gw_norm`` x (BatchNorm layers: 10 for GIN, none for GCN), before every
   embedding release, with ``gw-ldp.norm-statistics`` ``auto`` (no training DP)
   or ``pooled`` (down: the weights, the layer name) -> up: ``moments`` =
   ``[N_c, sum_v a_v, sum_v a_v^2]`` of the layer's input over the client's
   training-graph nodes (per channel, 1 + 2h numbers). The server sets the
   layer's running mean and unbiased variance to those of the union of all
   clients' training graphs, layer by layer in forward order (a layer's input
   depends on the statistics before it), exactly as if one client held every
   training graph. FedAvg of
   the clients' exponential running averages (``averaged``) instead mixes
   per-client statistics that lag behind the weights (MUTAG, GIN: 10-fold
   results in docs/results/gw-ldp.md). Under training DP the statistics are
   frozen and not uploaded (``auto`` = ``averaged``; ``pooled`` is refused,
   and a client under training DP refuses ``gw_norm`` itself).
3. ``gw_embed`` (down: final weights, epsilon, layer, round) after training
   (and every ``gw-ldp.embed-every`` rounds if > 0, Algorithm 2's periodic
   signal) ->
   up: ``embeddings`` = the softmax node embeddings of all local graphs
   stacked (``sum n_i x d``: d = C for ``gw-ldp.embedding = classes``, the
   GNN's hidden width for ``hidden``), multi-bit LDP encoded (int8 in {-1,0,1},
   ``epsilon_g``-LDP per graph, Algorithm 1) unless ``gw-ldp.epsilon = inf``
   (then the float embeddings themselves), ``sizes`` (nodes per graph),
   ``graph_ids``, ``split`` (0/1/2), ``labels`` (train/validation labels,
   -1 for test graphs: the SVC needs them) and ``eval_labels`` (all graph
   labels / pseudo-labels, used only to score the result, like the final
   labels in other strategies). No adjacency or feature matrix is uploaded.
   An upload with codes outside {-1, 0, 1} or without Algorithm 1's m
   non-zeros per row, float rows that are not softmax rows (non-negative,
   summing to 1; NaN or inf included), split codes outside 0..2, labels
   outside -1..k-1, a label on a test graph, repeated graph ids or sizes that
   do not add up stops the run
   (:func:`fedgraphcore.protocols.gw_ldp.embedding_upload_problem`), as does a graph id
   two clients both upload or a periodic release whose graph ids, sizes,
   splits or labels differ from the client's release before. A client
   encodes at its own ``gw-ldp.epsilon`` and refuses a request for another;
   a request sent again after a timeout (``retries``) gets the first draw's
   codes back, so it is no new release.
   The server uses each client's newest release: a client that dropped
   before the last one keeps its periodic release in the matrix (Algorithm
   2's reason for the periodic signal; ``stale_clients`` lists it with that release's round), a
   client that never released is missing (``graphs_missing``). The LDP noise
   is fresh at every release (OS entropy on the client), so releases compose.

Splits: ``gw-ldp.fold = -1`` a random 7:2:1 split per client; ``0..9`` one
fold of a ten-fold cross-validation with the same 7:2:1 shape (test = fold f,
validation = the next two), so ten runs test every graph once.

Server: Euclidean intra-distance of each graph's uploaded embedding, GW (POT,
square loss, uniform weights; ``gw-ldp.alpha < 1``: fused GW with the
uploaded rows as node features, which unlike plain GW sees which class the
nodes lean to) for all pairs in a process pool, then SVC on
``exp(-gamma D)`` (C, gamma chosen on the validation graphs, or with
``gw-ldp.svc-selection = cv`` by 5-fold cross-validation over the train and
validation graphs; test accuracy in
``metrics``, beside ``svc_test_acc_grid_max``, the optimistic best test accuracy
over the grid, for comparison with test-tuned figures) and clustering of all
graphs (spectral on the GW affinity or k-medoids, k = ``num-clusters``), which
is the strategy's labelling.

Epsilon: ``gw-ldp.epsilon`` is the LDP budget of one graph's whole embedding
matrix (Algorithm 1 / Theorem 1); 0 selects the paper's default
``1/|V|``; ``inf`` uploads the embeddings without LDP (the paper writes this
case as "epsilon = 0"). The ledger reports the largest per-graph epsilon
times the number of releases, and lists everything uploaded without noise
(counts, labels, graph sizes and ids, and without training DP the weights,
loss and BatchNorm moments) as ``gw-ldp:clear-uploads``, guarantee none.
At ``1/|V|`` each sampled entry is an ``epsilon/(m n)``-randomised
response, P(+1) within ``1/(4 n^2)`` of 1/2 (n = 18 on MUTAG: 0.0008), so the uploaded codes carry almost nothing but
the graph size: no server-side classifier can then beat
``min(1, e^(1/n) max_c P(c | n))`` on size-n graphs (the bound reported by
``benchmarks/gw_ldp.py --parts bound``).
"""

from __future__ import annotations

from .embeddings import embedding_width, encode_graph, graph_epsilon, node_embeddings
from .graphs import GraphBatch, graph_slices, make_batch, node_features, split_items
from .gw import (AUTO_MERGE_DECIMALS, EXACT_MERGE_DECIMALS, MATRIX_MERGE_DECIMALS, embedding_space, gw_matrix, gw_pair,
                 intra_distance, merge_decimals, merge_duplicates, shortest_path_matrix)
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
    "AUTO_MERGE_DECIMALS", "EXACT_MERGE_DECIMALS", "MATRIX_MERGE_DECIMALS", "embedding_space", "gw_matrix", "gw_pair",
    "intra_distance", "merge_decimals", "merge_duplicates", "shortest_path_matrix",
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
