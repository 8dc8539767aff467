"""A member's release record: every reply its client sent, per dataset, over runs and restarts.

In a deployment the ServerApp is the operator's code, so a member's client treats every
request as a malicious server's and every reply as a release. Two things make a release
count beyond the run that asked for it, and both live here:

* the record itself, JSON lines appended under a file lock and never rewritten (no pickle:
  reading it runs no code), one line per reply::

      {"time": "2026-05-01T10:00:00+00:00", "run": 7, "dataset": "3f0c...", "strategy": "fedkmeans",
       "action": "kmeans_assign", "request": "<sha256 of the request>", "labels": 3}

  ``dataset`` is :func:`dataset_key` of the rows the reply came from, ``labels`` the number of
  classes of a reply that labels those rows (0 for any other reply). A client reads it to
  answer each step in the protocol's order and count within a run (a restarted node
  continues the run's count) and to cap a dataset's label releases over every run (the node
  policy's ``label-releases``);
* arrays a protocol keeps about what it released of a dataset (fedkmeans' audit of the row
  sets whose sums it sent), one ``.npz`` per dataset and name, replaced atomically, read with
  ``allow_pickle=False``.

Both live in the directory ``<privacy ledger>.releases`` (:func:`fedgraphcore.privacy.policy.ledger_path`:
node config ``privacy-ledger``, else beside the node's data); without a ledger path (simulation,
in-memory data) the run context keeps them, for one run only, as it keeps the ledger.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import os
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from fedgraphcore.config import ConfigError
from fedgraphcore.privacy.budget import JsonLines

RECORD_FILE = "records.jsonl"
FIELDS = ("time", "run", "dataset", "strategy", "action", "request", "labels")
#: ``context.state`` records of a node without a ledger path: the lines, and ``<record>:<name>`` arrays
STATE_RECORD = "release-record"


def record_dir(ledger: Path | None) -> Path | None:
    """The directory of a node's release record: beside its privacy ledger (None: no file)."""
    return None if ledger is None else Path(f"{ledger}.releases")


def dataset_key(dataset: str, items: np.ndarray, shape: tuple) -> str:
    """A short digest naming the rows a client holds: its dataset's label, its item ids (or
    keys) in row order and its data's shape. The same shard file gives the same key in every
    run; another cut of the rows gives another."""
    digest = hashlib.sha256(f"{dataset}|{tuple(int(s) for s in shape)}|".encode())
    items = np.asarray(items)
    if items.dtype.kind in "OUS":  # a party's own IDs: their text, not the objects' addresses
        digest.update("\x00".join(map(str, items.tolist())).encode())
    else:
        digest.update(np.ascontiguousarray(items).tobytes())
    return digest.hexdigest()[:24]


class ReleaseRecord(JsonLines):
    """One node's release record for one dataset (see module docstring): a directory, or the run
    context's ``state`` (``directory`` None)."""

    kind = "release record"
    state_record = STATE_RECORD

    def __init__(self, directory: Path | None, state: RecordDict, dataset: str) -> None:
        self.directory = None if directory is None else Path(directory)
        super().__init__(None if directory is None else self.directory / RECORD_FILE, state)
        self.dataset = dataset

    def check(self, record, where: str) -> dict:
        if not isinstance(record, dict) or set(record) != set(FIELDS):
            raise ConfigError(f"{where}: not a release record; expected the fields {', '.join(FIELDS)}")
        return record

    def records(self) -> list[dict]:
        """This dataset's records, checked (a line that is not a record stops with its line)."""
        return [r for r in super().records() if r["dataset"] == self.dataset]

    def append(self, run: int, strategy: str, action: str, request: str, labels: int = 0) -> None:
        self._append({"time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "run": int(run),
                      "dataset": self.dataset, "strategy": strategy, "action": action, "request": request,
                      "labels": int(labels)})

    # -- arrays a protocol keeps about a dataset ----------------------------------------------
    def _array_file(self, name: str) -> Path:
        return self.directory / f"{self.dataset}.{name}.npz"

    def load_arrays(self, name: str) -> dict[str, np.ndarray] | None:
        """The arrays kept under ``name`` for this dataset (None: none yet)."""
        if self.directory is None:
            kept = self.state.array_records.get(f"{STATE_RECORD}:{name}")
            return None if kept is None else {k: v.numpy() for k, v in kept.items()}
        try:
            with np.load(self._array_file(name), allow_pickle=False) as npz:
                return {k: npz[k] for k in npz.files}
        except FileNotFoundError:
            return None

    def save_arrays(self, name: str, **arrays: np.ndarray) -> None:
        """Keep ``arrays`` under ``name`` for this dataset, replacing what was kept (atomically)."""
        if self.directory is None:
            self.state[f"{STATE_RECORD}:{name}"] = ArrayRecord(
                {k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})
            return
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        target = self._array_file(name)
        partial = target.with_name(target.name + f".{os.getpid()}.partial")
        with open(partial, "wb") as handle:
            handle.write(buffer.getvalue())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, target)


# -- what a fully malicious server can learn from each reply ------------------------------------
#: Replies every strategy's client gives (:class:`clients.base.ClusteringClient`), and the linking
#: and masking steps several share.
COMMON_STEPS = {
    "hello": "once a run: the member's partition, counts (rows, graphs, edges, rows without an edge), its shard's "
             "cut, its public key (and a member's signature of it) where masking is set up, and the method's hello "
             "figures",
    "labels": "nothing of the member: the count of the labels the server sent",
    "secagg_setup": "a fresh X25519 public key and, from a member, its identity key's signature binding it to the "
                    "run, session, step, party and parties",
    "secagg_agree": "the number of peers the member agreed seeds with",
    "secagg_consistency": "a member's signature over the survivors and dropped parties it was told for a sum, once "
                          "a sum",
    "secagg_unmask": "shares of the survivors' self masks or the pair masks with the dropped parties, never both for "
                     "one party of a sum",
    "boundary_shares": "the member's group-key share sealed for each peer (unreadable to the server)",
    "boundary_tags": "keyed tags of the member's node IDs (keyed by the parties' group key) and its row ids",
    "boundary_links": "that the links were formed",
}

#: strategy -> step -> what a server that sends any accepted message in any order learns from the
#: reply, within the checks the member makes (docs/privacy.md shows the same table)
SERVER_LEARNS: dict[str, dict[str, str]] = {
    "fedkmeans": {
        "hello": "local centres, each the mean of at least min-rows rows, their sums audited with every sum of "
                 "earlier runs on these rows; where the filter may run over the whole graph, instead: whether the "
                 "member holds an edge (its own or to another member's node)",
        "kmeans_init": "as hello's centres, of the rows filtered over the whole graph (unfiltered where no member "
                       "holds an edge); once",
        "kmeans_filter": "nothing: padded, masked ring elements; filter-order times (of the rows times the "
                         "projection drawn from the run's seed, `fedkmeans.dims` columns: a public, data-free matrix, "
                         "so every sum of projected rows is a sum of the rows times it)",
        "kmeans_step": "for centres of its choice (per start, num-clusters finite rows; at most fedkmeans.restarts "
                       "starts a step, at most num-rounds steps): per-cluster sums, counts and inertia (masked: their "
                       "sum over the members), each over at least min-rows rows and none that determines a row with "
                       "every sum sent of these rows, by any start, in any run",
        "kmeans_assign": "once a run: each row's cluster under one start's last centres moved by a total it states "
                         "(holding the member's counts): log2(num-clusters) bits of each row",
    },
    "kcagc": {
        "kcagc_local": "once a run: the member's own k-means of its embedding into k_hat clusters: log2(k_hat) "
                       "bits of each row",
        "kcagc_joint": "masked squared row norms (their sum over the members)",
        "kcagc_step": "summed squared distances between virtual nodes and centres of its choice (masked per "
                      "group)",
        "kcagc_exact": "masked sums: the block's squared norm, F (F^T Y) for blocks Y of its choice, the "
                       "intra-cluster distance for labels of its choice",
    },
    "fedspectral": {
        "fedspectral_local": "once a run: spectral labels of the member's own graph into num-clusters clusters: "
                             "log2(num-clusters) bits of each row",
    },
    "fedspectral-plus": {
        "fedspectral_degrees": "once: the degree vector (masked and/or noised)",
        "fedspectral_product": "A_c Y for blocks of its choice, each column spread over at least min-block-support "
                               "nodes; noise-free, N/b of them give A_c (refused noise-free above min-rows 1)",
        "fedspectral_power": "M_c^t V for blocks of its choice, as fedspectral_product",
    },
    "fedsc": {
        "hello": "the feature count; with sigma estimated two distance statistics (ledger)",
        "fedsc_rank": "once: the landmark count of the spectral-mass rule",
        "fedsc_round": "Z_p for landmarks of its choice, at most num-rounds times (noised under dp-epsilon)",
        "fedsc_final": "once: C_p, which with the landmarks gives the samples noise-free (refused noise-free above "
                       "min-rows 1)",
    },
    "fedavg-dmon": {
        "hello": "the feature count (boundary mode: a power of two bounding the masked uploads)",
        "dmon_train": "weights trained from weights of its choice, at most num-rounds times, and the validation "
                      "modularity of those weights (DP: noised weights only)",
        "dmon_eval": "once: the validation modularity of weights of its choice",
        "dmon_assign": "once a run, after training: labels under weights of its choice of the run's shapes "
                       "(log2(num-clusters) bits of each row), and test modularity and conductance of those labels "
                       "on the member's edges",
        "dmon_features": "nothing: padded, masked ring elements; once",
        "dmon_spread": "masked sums only (padded rows, sums under the weights)",
        "dmon_gradient": "the masked sum of the gradients (one member: its gradient and loss)",
    },
    "gw-ldp": {
        "hello": "the feature width and graph counts",
        "fit": "weights trained from weights of its choice, at most num-rounds times (DP: noised)",
        "gw_norm": "BatchNorm moments over the member's training nodes (refused under training DP)",
        "gw_embed": "LDP-encoded node embeddings at the member's own epsilon, graph sizes, ids, splits and labels; "
                    "at most once a round",
    },
}
SERVER_LEARNS["kcagc-basic"] = SERVER_LEARNS["kcagc"]  # one client: its steps answer a kcagc-basic run's server too


def server_learns(strategy: str) -> dict[str, str]:
    """What a fully malicious server can learn from each reply of ``strategy``'s client, by step."""
    return {**COMMON_STEPS, **SERVER_LEARNS.get(strategy, {})}
