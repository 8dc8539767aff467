"""A malicious server's eyes: everything it can read in a run, and the party rows it must not find there.

:class:`Capture` records, at the server's receive seam, every array a run puts in the server's
hands, without changing what the run does:

* ``ServerSession._send`` (every exchange, the hello handshake included): the server's requests
  (arrays and values it sent) and every reply's arrays as they arrived, accepted or refused
  (a refused reply left the client all the same); masked arrays are kept apart (``kind="masked"``:
  uniform ring elements, unreadable alone);
* ``ServerSession.secure_sum``: each unmasked sum (``kind="sum"``), what masking leaves readable;
* ``ClusteringClient.handle``: the client object of each node, so that the rows a party holds (its
  shard, and what its strategy computes from it) can be read after the run.

:func:`leaks` then looks for a party's rows in what was read, directly (a row, or a column of an
``N x b`` block, equal to a party row; the mean ``sum / count`` of a statistic over one row) and
through the attacks the protocols admit (fedsc: the coefficients inverted with the landmarks;
fedspectral-plus: blocks of full rank solved for the operator, and a block row that is one row of
the server's own block, i.e. a node with one local edge).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from fedgraphcore.session import ServerSession
from fedgraphcore.transport import unpack
from fedgraphcore.wire import ArraySpec, ProtocolError
from clients.base import ClusteringClient
from clients.fedkmeans import FILTERED

#: Relative tolerance of "equal": values within ``RTOL x max(1, |row|)`` of a party row.
RTOL = 1e-6


@dataclass
class Read:
    """One array the server read: ``kind`` clear (a reply), refused (a reply the server rejected),
    masked (a ring upload), sum (an unmasked secure sum; ``node`` None)."""

    step: str
    node: int | None
    name: str
    array: np.ndarray
    kind: str
    order: int


@dataclass
class Request:
    """What the server sent one node in one step."""

    step: str
    node: int
    arrays: dict
    values: dict
    order: int


@dataclass
class Capture:
    """What the server read in one run, and the client object of every node (see module docstring)."""

    reads: list[Read] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    clients: dict[int, ClusteringClient] = field(default_factory=dict)  # node id -> its latest client object
    step: str = ""  # the step of the latest exchange: the one a secure sum unmasks
    _count: int = 0

    def _next(self) -> int:
        self._count += 1
        return self._count

    def install(self, monkeypatch) -> "Capture":
        """Wrap the seams (see module docstring); ``monkeypatch`` undoes it after the test."""
        send, secure_sum, handle = ServerSession._send, ServerSession.secure_sum, ClusteringClient.handle
        capture = self

        def recording_send(session, action, category, contents, expect):
            capture.step = action
            for node, content in contents.items():
                arrays, values = unpack(content)
                capture.requests.append(Request(action, node, arrays, values, capture._next()))
            result = send(session, action, category, contents, expect)
            for node, content in result.replies.items():
                capture._replied(action, node, content, expect, "clear")
            for node, content in result.refused:
                capture._replied(action, node, content, None, "refused")
            return result

        def recording_sum(session, replies, name, values, parties=None):
            step = capture.step  # the masked step (a sum that survives dropouts exchanges once more)
            total = secure_sum(session, replies, name, values, parties)
            capture.reads.append(Read(step, None, name,
                                      np.array(total, copy=True), "sum", capture._next()))
            return total

        def recording_handle(client, action, content):
            capture.clients[int(client.context.node_id)] = client
            return handle(client, action, content)

        monkeypatch.setattr(ServerSession, "_send", recording_send)
        monkeypatch.setattr(ServerSession, "secure_sum", recording_sum)
        monkeypatch.setattr(ClusteringClient, "handle", recording_handle)
        return self

    def _replied(self, action, node, content, expect, kind) -> None:
        try:
            arrays, _ = unpack(content)
        except Exception:  # a reply malformed beyond reading holds nothing the server can read
            return
        spec = expect.get(node) if isinstance(expect, Mapping) else expect
        for name, array in arrays.items():
            masked = spec is not None and spec.arrays.get(name, ArraySpec()).masked
            self.reads.append(Read(action, node, name, array, "masked" if masked else kind, self._next()))

    # -- what the parties hold ----------------------------------------------------------------
    def party(self, node: int) -> int:
        return int(self.clients[node].shard.client_id)

    def request_before(self, read: Read, name: str, node: int | None = None) -> Request | None:
        """The latest request of ``read``'s step carrying array ``name`` sent before ``read`` arrived."""
        found = None
        for r in self.requests:
            if r.order > read.order:
                break
            if r.step == read.step and name in r.arrays and (node is None or r.node == node):
                found = r
        return found


# -- the rows each party holds ------------------------------------------------------------------
def _dense(a) -> np.ndarray:
    return np.asarray(a.toarray() if hasattr(a, "toarray") else a, dtype=np.float64)


def party_rows(client: ClusteringClient) -> dict[str, np.ndarray]:
    """The rows a party holds, by what they are: ``features`` (raw), ``filtered`` (what the
    strategy clusters, where it filters or embeds first), ``adjacency`` (local edges, divided by
    the clients holding each edge as the edge protocols weight them), ``graph-features`` (node
    features of a party's graphs). All-zero rows are left out (nothing to find)."""
    shard, strategy = client.shard, client.shared.strategy
    rows: dict[str, np.ndarray] = {}
    if shard.x is not None:
        rows["features"] = _dense(shard.x)
    if shard.adj is not None and shard.adj.shape[0] <= 5000:
        adj = shard.adj.astype(np.float64).tocsr(copy=True)
        if shard.edge_weight is not None:
            adj.data = adj.data / np.asarray(shard.edge_weight, dtype=np.float64)
        rows["adjacency"] = _dense(adj)
    if shard.graphs:
        rows["graph-features"] = np.vstack([_dense(g.x) for g in shard.graphs if g.x is not None])
    filtered = _filtered(client, strategy)
    if filtered is not None:
        rows["filtered"] = filtered
    out = {k: v[np.abs(v).max(axis=1) > 1e-12] for k, v in rows.items() if v.ndim == 2 and v.size}
    if "adjacency" in rows:
        out["adjacency_full"] = rows["adjacency"]  # every node's row, in node order: for the solves
    return out


def _filtered(client: ClusteringClient, strategy: str) -> np.ndarray | None:
    """What the strategy's client clusters, as it computed it (fedsc: before its data noise, which
    only stands between the server and the party's rows when it is on)."""
    from fedgraphcore.graph_filters import filtered_features

    state = client.context.state.array_records
    if strategy == "fedkmeans":
        try:
            return _dense(client.features())
        except ProtocolError:  # its filter over the whole graph stopped part-way: the rows of the last hop it ran
            kept = client.load(FILTERED)
            return _dense(kept["rows"]) if "rows" in kept else None
    if strategy == "fedsc" and client.shard.x is not None:
        return filtered_features(client.shard.x, client.shard.adj, client.cfg.filter_order)
    if strategy in ("kcagc", "kcagc-basic") and "kcagc_z" in state:
        return np.asarray(state["kcagc_z"]["z"].numpy(), dtype=np.float64)
    return None


# -- finding rows ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Leak:
    """A party's row the server read (``how``: the array's row, column, a mean, an attack)."""

    step: str
    array: str
    kind: str
    party: int
    rows: str
    how: str
    count: int

    def __str__(self) -> str:
        return (f"{self.step}/{self.array} ({self.kind}): {self.count} {self.rows} row(s) of party {self.party} "
                f"[{self.how}]")


def equal_rows(candidates: np.ndarray, rows: np.ndarray, rtol: float = RTOL, atol: float = 0.0) -> np.ndarray:
    """Indices of the party ``rows`` some row of ``candidates`` equals, within ``rtol`` of the
    row's scale (plus ``atol``: the fixed-point resolution of a secure sum)."""
    if candidates.ndim != 2 or candidates.shape[1] != rows.shape[1] or not candidates.size or not rows.size:
        return np.zeros(0, dtype=np.int64)
    cand = np.asarray(candidates, dtype=np.float64)
    cand = cand[np.isfinite(cand).all(axis=1)]
    tol = rtol * np.maximum(1.0, np.abs(rows).max(axis=1)) + atol
    hit = np.zeros(len(rows), dtype=bool)
    for start in range(0, len(cand), 256):
        diff = np.abs(cand[start:start + 256, None, :] - rows[None, :, :]).max(axis=2)
        hit |= (diff <= tol[None, :]).any(axis=0)
    return np.flatnonzero(hit)


def _views(read: Read, capture: Capture, k: int) -> list[tuple[str, np.ndarray]]:
    """Ways to read ``read.array`` as rows: itself (2-D: rows and columns; 1-D: one row), and
    the strategy layouts (fedkmeans statistics: sums and means; fedsc: Z_p)."""
    a = np.asarray(read.array)
    if a.dtype.kind not in "fc":
        return []
    a = a.astype(np.float64)
    views = []
    if a.ndim == 2:
        views += [("row", a), ("column", a.T)]
    elif a.ndim == 1:
        views.append(("whole", a[None, :]))
    for sums, counts in _statistics(read, a, k):
        seen = counts > 0.5
        views += [("sum", sums), ("mean", sums[seen] / counts[seen, None])]
    if read.name == "update" and a.ndim == 1:
        request = capture.request_before(read, "z")
        if request is not None:
            d, m = request.arrays["z"].shape
            average = a[:d * m].reshape(d, m) / (len(capture.clients) if read.kind == "sum" else 1)
            views.append(("Z_p row" if read.kind != "sum" else "average Z row", average))
    return views


def _statistics(read: Read, a: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """fedkmeans' Lloyd statistics (``stats``: one vector, or one per start) as (sums, counts) per
    start (:func:`fedgraphcore.protocols.fedkmeans.split_statistics`); none for any other array."""
    from fedgraphcore.protocols.fedkmeans import split_statistics

    if read.name != "stats" or k < 1 or a.ndim not in (1, 2) or not a.size or (a.shape[-1] - k - 2) % k:
        return []
    return [split_statistics(row, k)[:2] for row in a.reshape(-1, a.shape[-1])]


def counted_statistics(capture: Capture, k: int) -> list[tuple[Read, int]]:
    """Statistics whose rows the server is told, with the fewest rows behind one of them
    (fedkmeans: cluster counts of the hello centres and of every statistics vector; gw-ldp:
    the node count of the BatchNorm moments)."""
    out = []
    for read in capture.reads:
        a = np.asarray(read.array, dtype=np.float64) if np.asarray(read.array).dtype.kind in "fiu" else None
        if a is None or read.kind == "masked":
            continue
        counts = None
        if read.name == "counts":
            counts = a
        elif _statistics(read, a, k):
            counts = np.concatenate([c for _, c in _statistics(read, a, k)])
        elif read.name == "moments" and a.size:
            counts = a.ravel()[:1]
        if counts is not None:
            behind = np.rint(counts[counts > 0.5])
            if behind.size:
                out.append((read, int(behind.min())))
    return out


def leaks(capture: Capture, k: int, secagg_scale: float = float(2**20)) -> list[Leak]:
    """Every party row the server read or can compute (see module docstring)."""
    parties = {node: party_rows(client) for node, client in capture.clients.items()}
    found: list[Leak] = []
    for read in capture.reads:
        if read.kind == "masked":
            continue
        atol = 4.0 * len(parties) / secagg_scale if read.kind == "sum" else 0.0
        if np.asarray(read.array).dtype == np.float32:
            atol += 1e-6
        owners = parties if read.node is None else {read.node: parties.get(read.node, {})}
        for how, view in _views(read, capture, k):
            for node, rows in owners.items():
                for what, party in _searched(rows):
                    hit = equal_rows(view, party, atol=atol)
                    if hit.size:
                        found.append(Leak(read.step, read.name, read.kind, capture.party(node), what, how, hit.size))
    found += _fedsc_inversion(capture, parties)
    found += _spectral_solve(capture, parties)
    found += _power_solve(capture, parties)
    found += _weight_directions(capture, parties)
    return _merged(found)


def _searched(rows: dict[str, np.ndarray]):
    """The row sets to look for (every one but the solves' full adjacency, zero rows included)."""
    return [(what, r) for what, r in rows.items() if not what.endswith("_full")]


def _merged(found: list[Leak]) -> list[Leak]:
    """One leak per (step, array, kind, party, rows, how): the most rows any round gave."""
    best: dict[tuple, Leak] = {}
    for leak in found:
        key = (leak.step, leak.array, leak.kind, leak.party, leak.rows, leak.how)
        if key not in best or leak.count > best[key].count:
            best[key] = leak
    return list(best.values())


def _fedsc_inversion(capture: Capture, parties) -> list[Leak]:
    """fedsc: each clear ``c`` inverted with the landmarks and sigma the server sent
    (:func:`fedgraphcore.protocols.fedsc.invert_coefficients`)."""
    from fedgraphcore.protocols.fedsc import invert_coefficients

    found = []
    for read in capture.reads:
        if read.name != "c" or read.kind == "masked":
            continue
        request = capture.request_before(read, "z", read.node)
        if request is None:
            continue
        z, sigma, lam = request.arrays["z"], float(request.values["sigma"]), float(request.values["lambda"])
        with np.errstate(all="ignore"):
            x_hat = invert_coefficients(z, np.asarray(read.array, dtype=np.float64), sigma, lam)
        for what, rows in _searched(parties.get(read.node, {})):
            hit = equal_rows(x_hat, rows, rtol=1e-4)
            if hit.size:
                found.append(Leak(read.step, "c", read.kind, capture.party(read.node), what,
                                  "C_p inverted with Z (rtol 1e-4)", hit.size))
    return found


def _spectral_solve(capture: Capture, parties) -> list[Leak]:
    """fedspectral-plus exact mode: the products ``S = A Y`` of the server's blocks ``Y``; with
    ``[Y_1 .. Y_t]`` of rank N, ``A = S Y^+`` (every row); below it, a clear block row equal to
    ``w`` times a row of ``Y`` over every round is a node with one local edge (its whole row)."""
    found = []
    for node in [None, *capture.clients]:
        reads = [r for r in capture.reads if r.step == "fedspectral_product" and r.name == "block"
                 and r.node == node and r.kind != "masked"]
        pairs = [(capture.request_before(r, "block", node), r) for r in reads]
        pairs = [(q.arrays["block"].astype(np.float64), r.array.astype(np.float64)) for q, r in pairs if q is not None]
        if not pairs:
            continue
        y = np.hstack([p[0] for p in pairs])
        s = np.hstack([p[1] for p in pairs])
        owners = capture.clients if node is None else {node: capture.clients[node]}
        if np.linalg.matrix_rank(y) == y.shape[0]:
            solved = s @ np.linalg.pinv(y)
            if node is None and _global_adjacency(parties) is not None:
                hit = equal_rows(solved, _global_adjacency(parties), rtol=1e-6, atol=1e-6)
                if hit.size:
                    found.append(Leak("fedspectral_product", "block", "sum", -1, "global adjacency",
                                      "blocks of full rank solved", hit.size))
            for owner in owners:
                rows = parties[owner].get("adjacency")
                hit = equal_rows(solved, rows, rtol=1e-6, atol=1e-6) if rows is not None else np.zeros(0)
                if hit.size:
                    found.append(Leak("fedspectral_product", "block", "sum" if node is None else "clear",
                                      capture.party(owner), "adjacency", "blocks of full rank solved", hit.size))
        if node is not None:
            found += _single_edges(capture, node, y, s, parties[node].get("adjacency_full"))
    return found


def _global_adjacency(parties) -> np.ndarray | None:
    """``sum_c A_c / r``: the whole graph, each edge once (edge split: every party holds all nodes)."""
    blocks = [rows["adjacency_full"] for rows in parties.values() if "adjacency_full" in rows]
    if not blocks or len({b.shape for b in blocks}) != 1:
        return None
    total = np.sum(blocks, axis=0)
    return total[np.abs(total).max(axis=1) > 1e-12]


def _power_solve(capture: Capture, parties) -> list[Leak]:
    """fedspectral-plus paper mode with one power iteration: ``S = M_c V`` is linear in the local
    normalised operator; with the server's blocks ``[V_1 .. V_t]`` of rank N, ``M_c = S V^+``, whose
    non-zero pattern is the party's adjacency (every row of it)."""
    found = []
    for node in capture.clients:
        pairs = []
        for r in capture.reads:
            if r.step == "fedspectral_power" and r.name == "block" and r.node == node and r.kind != "masked":
                q = capture.request_before(r, "block", node)
                if q is not None and int(q.values.get("iters", 0)) == 1:
                    pairs.append((q.arrays["block"].astype(np.float64), r.array.astype(np.float64)))
        rows = parties[node].get("adjacency_full")
        if not pairs or rows is None:
            continue
        y, s = np.hstack([p[0] for p in pairs]), np.hstack([p[1] for p in pairs])
        if np.linalg.matrix_rank(y) < y.shape[0]:
            continue
        pattern = (np.abs(s @ np.linalg.pinv(y)) > 1e-9).astype(np.float64)
        edges = (rows != 0).astype(np.float64)
        same = [(pattern[i] == edges[i]).all() for i in range(len(edges)) if edges[i].any()]
        if any(same):
            found.append(Leak("fedspectral_power", "block", "clear", capture.party(node), "adjacency",
                              "one-iteration blocks of full rank solved (edge pattern)", int(sum(same))))
    return found


def _weight_directions(capture: Capture, parties) -> list[Leak]:
    """Model uploads (fedavg-dmon, gw-ldp): a row or column of the update ``uploaded - sent`` of a
    weight matrix parallel to a party row (gradient inversion of a one-row batch)."""
    found = []
    for read in capture.reads:
        a = np.asarray(read.array)
        if read.kind == "masked" or read.node is None or a.ndim != 2 or a.dtype.kind != "f":
            continue
        request = capture.request_before(read, read.name, read.node)
        if request is None or request.arrays[read.name].shape != a.shape:
            continue
        delta = a.astype(np.float64) - request.arrays[read.name].astype(np.float64)
        for what, rows in _searched(parties.get(read.node, {})):
            for view in (delta, delta.T):
                if view.shape[1] != rows.shape[1]:
                    continue
                v = view[np.linalg.norm(view, axis=1) > 1e-12]
                if not v.size:
                    continue
                cos = (v / np.linalg.norm(v, axis=1)[:, None]) @ (rows / np.linalg.norm(rows, axis=1)[:, None]).T
                hit = np.flatnonzero((np.abs(cos) > 1 - 1e-6).any(axis=0))
                if hit.size:
                    found.append(Leak(read.step, read.name, read.kind, capture.party(read.node), what,
                                      "update parallel to a row", hit.size))
    return found


def _single_edges(capture: Capture, node: int, y: np.ndarray, s: np.ndarray, adjacency) -> list[Leak]:
    """Rows ``i`` of a clear block sum ``S = A Y`` equal to ``w Y[j]`` for one ``j`` over every
    round: node ``i``'s local row is ``w e_j`` (a node with one local edge; checked against the row)."""
    if adjacency is None or y.shape[1] < 2:
        return []
    unit = y / np.maximum(np.linalg.norm(y, axis=1), 1e-300)[:, None]
    determined = 0
    for i in range(len(s)):
        norm = np.linalg.norm(s[i])
        if norm < 1e-12:
            continue
        cos = unit @ (s[i] / norm)
        j = int(np.argmax(np.abs(cos)))
        if abs(cos[j]) > 1 - 1e-9:
            guess = np.zeros(len(s))
            guess[j] = s[i] @ y[j] / (y[j] @ y[j])
            determined += bool(np.allclose(guess, adjacency[i], atol=1e-6))
    if not determined:
        return []
    return [Leak("fedspectral_product", "block", "clear", capture.party(node), "adjacency",
                 "one-edge rows read off the block", determined)]
