"""gw-ldp's wire: its steps, what a valid reply holds, its run-config keys and their choices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from fedgraphcore.config import ConfigView, setting
from fedgraphcore.protocols.gw_ldp.gw import AUTO_MERGE_DECIMALS, EXACT_MERGE_DECIMALS, MATRIX_MERGE_DECIMALS
from fedgraphcore.protocols.gw_ldp.solver import GW_SOLVERS, MATRIX_CG_ITERATIONS
from fedgraphcore.wire import ArraySpec, ReplySpec, ValueSpec

# -- the protocol's steps ------------------------------------------------------------------
GW_NORM = "gw_norm"
GW_EMBED = "gw_embed"
FIT = "fit"

# -- choices of the run-config keys --------------------------------------------------------
MODELS = ("gcn", "gin")
EMBEDDING_LAYERS = ("classes", "hidden")
CLUSTERINGS = ("spectral", "kmedoids")
SELECTIONS = ("validation", "cv")
DP_MODES = ("none", "client", "sgd")
NORM_STATISTICS = ("auto", "pooled", "averaged")

#: split codes of a client's graphs (``split`` in a ``gw_embed`` upload)
SPLIT_TRAIN, SPLIT_VAL, SPLIT_TEST = 0, 1, 2
FOLDS = 10


@dataclass(frozen=True)
class GWLDPConfig(ConfigView):
    """The ``gw-ldp.*`` keys of :class:`strategies.gw_ldp.GWLDP` and its client, declared here."""

    prefix: ClassVar[str] = "gw-ldp"
    model: str = setting("gin", "shared GNN: gcn (2 layers, 16) or gin (5 layers, 64)", choices=MODELS, primary=True)
    local_epochs: int = setting(1, "full-batch local epochs per FedAvg round (E)", low=0, high=10_000)
    lr: float = setting(0.01, "Adam learning rate of local training", low=1e-9, high=10.0)
    epsilon: float = setting(0.0, "LDP budget per graph embedding; 0 = 1/|V| (paper default), inf = no LDP",
                             low=0.0, infinite=True, primary=True)
    embedding: str = setting("hidden", "node embedding uploaded: softmax of the last message-passing layer (hidden: "
                             "n x 16 for GCN, n x 64 for GIN; the paper's h-dimensional H) or of the class scores "
                             "(classes: n x C)", choices=EMBEDDING_LAYERS)
    embed_every: int = setting(0, "also collect encoded embeddings every s rounds (0: only after training)",
                               low=0, high=1_000_000)
    clustering: str = setting("spectral", "clustering of the GW matrix", choices=CLUSTERINGS)
    workers: int = setting(2, "processes for the GW matrix (0 = all cores)", low=0, high=256)
    gw_max_iter: int = setting(MATRIX_CG_ITERATIONS, "conditional-gradient iterations (linear programs) per pair "
                               "of the GW matrix: 2 takes a fraction of POT's CPU time with the converged matrix's SVC "
                               "accuracy (docs/results/gw-solver.md); 10000 = converged, POT's values",
                               low=1, high=1_000_000)
    gw_solver: str = setting("cg", "the GW matrix's solver: cg (POT's conditional gradient without its per-call "
                             "cost: the same values at the same gw-max-iter, bit for bit) or pot "
                             "(ot.gromov.*gromov_wasserstein2)",
                             choices=GW_SOLVERS)
    merge_duplicates: bool = setting(True, "GW on distinct embedding rows weighted by multiplicity, rows compared "
                                     "after rounding to gw-ldp.merge-decimals (exact for LDP codes)")
    merge_decimals: int = setting(AUTO_MERGE_DECIMALS, "decimals the embedding rows are rounded to before equal "
                                  f"rows merge: {EXACT_MERGE_DECIMALS} merges only equal rows (the same metric-measure "
                                  "space); fewer put float rows on a coarser grid, fewer points per graph for a "
                                  f"faster, approximate matrix; {AUTO_MERGE_DECIMALS}: {MATRIX_MERGE_DECIMALS} on "
                                  f"class-score rows, {EXACT_MERGE_DECIMALS} on hidden ones (docs/results/gw-solver.md)",
                                  low=AUTO_MERGE_DECIMALS, high=EXACT_MERGE_DECIMALS)
    degree_dim: int = setting(64, "one-hot degree features for graphs without features", low=2, high=10_000)
    fold: int = setting(-1, "each client's 7:2:1 split: -1 random, 0..9 = test fold of a ten-fold cross-validation "
                        "(validation = the next two folds)", low=-1, high=FOLDS - 1)
    alpha: float = setting(1.0, "1 = GW on the embeddings' intra-distances (paper Eq. 3); < 1 = fused GW with the "
                           "embeddings as node features (feature term weight 1 - alpha)", low=0.0, high=1.0)
    svc: bool = setting(True, "fit the SVC on the GW kernel (needs labelled train/val graphs)")
    svc_selection: str = setting("validation", "how the SVC's C and gamma are picked: validation = best on the "
                                 "validation graphs (the paper's 7:2:1), cv = 5-fold cross-validation over the train "
                                 "and validation graphs, refit on both", choices=SELECTIONS)
    norm_statistics: str = setting("auto", "BatchNorm statistics (GIN) used for the embeddings: pooled = recomputed "
                                   "exactly over all clients' training graphs after training (one round per "
                                   "BatchNorm layer; clients upload per-channel sums and sums of squares), averaged "
                                   "= FedAvg of the clients' running statistics; auto = pooled without training DP, "
                                   "averaged with it", choices=NORM_STATISTICS)
    dp: str = setting("none", "DP for training: none, client (clip + Gaussian noise per client update, DP-FedAvg) or "
                      "sgd (local DP-SGD, one graph = one sample, Opacus accountant)", choices=DP_MODES)
    dp_sample_rate: float = setting(0.5, "local DP-SGD: Poisson sampling rate of training graphs per step",
                                    low=1e-6, high=1.0)
    dp_clip: float = setting(1.0, "DP: L2 clip of each update (client) or of each graph's gradient (sgd)", low=1e-9)
    dp_noise: float = setting(1.0, "DP: noise multiplier (sigma / clip), client or sgd", low=1e-9)
    dp_delta: float = setting(1e-5, "DP: delta of the reported epsilon, client or sgd", low=1e-12, high=0.5)


#: What a client adds to its hello reply (request value ``num_classes``, the GNN's outputs): its feature
#: width and the counts of its graphs and training graphs (0 without graphs: the shard check stops the run)
HELLO_NUMBERS = {name: ValueSpec(whole=True, low=0) for name in ("in_dim", "graphs", "train")}


def fit_reply(shapes: Mapping[str, tuple[int, ...]], trainable: set[str], dp: str) -> ReplySpec:
    """``fit``: the trained weights ``w.<name>`` (noised under training DP, except the frozen
    BatchNorm statistics, which are not ``trainable``), ``num_examples`` and, without DP, ``loss``."""
    noised = dp != "none"
    return ReplySpec(arrays={f"w.{n}": ArraySpec(tuple(shape), noised=noised and n in trainable)
                             for n, shape in shapes.items()},
                     values=("num_examples",) if noised else ("num_examples", "loss"))


def norm_reply(width: int) -> ReplySpec:
    """``gw_norm``: ``moments`` = ``[N, sum a, sum a^2]`` of a BatchNorm layer's ``width`` channels."""
    return ReplySpec(arrays={"moments": ArraySpec((1 + 2 * width,))})


def embed_reply(width: int, ldp: bool) -> ReplySpec:
    """``gw_embed``: node embeddings (int8 LDP codes when ``ldp``, else floats) and, per graph, its
    size, id, split code, label (-1 on test graphs) and evaluation label."""
    return ReplySpec(arrays={
        # finite=False: NaN/inf rows stop the run in embedding_upload_problem instead of dropping the client
        "embeddings": ArraySpec((None, width), kind="i" if ldp else "f", finite=False, noised=ldp),
        "sizes": ArraySpec((None,), kind="iu"),
        "graph_ids": ArraySpec((None,), kind="iu"),
        "split": ArraySpec((None,), kind="iu"),
        "labels": ArraySpec((None,), kind="iu"),
        "eval_labels": ArraySpec((None,), kind="iu"),
    })


def weights_message(weights: Mapping) -> dict:
    """The model's arrays as a message sends them: ``w.<name>``."""
    return {f"w.{n}": a for n, a in weights.items()}


def message_weights(arrays: Mapping) -> dict:
    """Inverse of :func:`weights_message`: the ``w.<name>`` arrays of a message, by name."""
    return {k[2:]: v for k, v in arrays.items() if k.startswith("w.")}
