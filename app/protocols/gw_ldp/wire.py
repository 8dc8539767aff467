"""gw-ldp's wire: its steps, what a valid reply holds, its run-config keys and their choices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping

from app.config import ConfigView
from app.wire import ArraySpec, ReplySpec, ValueSpec

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
    """The ``gw-ldp.*`` keys (declared in :class:`strategies.gw_ldp.GWLDP`)."""

    prefix: ClassVar[str] = "gw-ldp"
    model: str
    local_epochs: int
    lr: float
    epsilon: float
    embedding: str
    embed_every: int
    clustering: str
    workers: int
    gw_max_iter: int
    merge_duplicates: bool
    degree_dim: int
    fold: int
    alpha: float
    svc: bool
    svc_selection: str
    norm_statistics: str
    dp: str
    dp_sample_rate: float
    dp_clip: float
    dp_noise: float
    dp_delta: float


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
