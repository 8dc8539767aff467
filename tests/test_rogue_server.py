"""A malicious server drives one member's ClientApp with messages of its own; no row of the member may follow.

Each attack is written from the server's side (:class:`rogue_server.Member`: the real ClientApp,
one context a run, the default node policy: only ``shard=`` in the node config, the member's
release record beside its shard as in a deployment) on an SBM of 300 nodes over 3 members, and
measures what it reads of member 0's 100 feature rows:

* fedkmeans ``kmeans_assign`` as a label oracle: 4,096 centres on one feature axis, two calls a
  feature (the second grid shifted by half a cell), no hello;
* a second ``hello`` to reset the row audit, then differencing of two Lloyd statistics whose row
  sets differ by one row (a plane bisected through the rows);
* the same differencing with a new run for every reading;
* fedavg-dmon ``dmon_assign`` with crafted weights: a one-unit first layer on one feature, a head
  that places K levels, and run-config ``hidden=1``, ``val-fraction=0.9``, ``test-fraction=0.09``
  (most nodes keep no training edge, so the layer reads their raw feature).

Without the defences (the member's steps in any order and count, its audit in the run's context)
the first takes every row within 2.4e-3, the others rows exactly or within 6e-3; with them none.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedgraphcore.protocols import boundary
from fedgraphcore.protocols import fedavg_dmon as dmon
from fedgraphcore.protocols import fedkmeans
from rogue_server import Member, shard_files

CLIENTS, NODES, FEATURES = 3, 300, 8
DATA = {"sbm.nodes": NODES, "sbm.features": FEATURES, "sbm.blocks": 3, "sbm.p-in": 0.1, "sbm.p-out": 0.01}
RUN = {"dataset": "sbm", "partitioner": "node-random", "num-clients": CLIENTS, "seed": 0, "reference": False,
       **DATA}


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list:
    return shard_files(tmp_path_factory.mktemp("shards"), CLIENTS, **DATA)


@pytest.fixture
def member(shards, tmp_path):
    """Member 0 with its own copy of its shard (a fresh release record beside it), default policy."""
    copy = tmp_path / shards[0].name
    copy.write_bytes(shards[0].read_bytes())
    for extra in shards[0].parent.glob("manifest.json"):
        (tmp_path / extra.name).write_bytes(extra.read_bytes())
    return lambda raw: Member({**RUN, **raw}, {"shard": str(copy)})


def pinned(estimate: np.ndarray, x: np.ndarray, tol: float) -> int:
    """Rows of ``x`` whose every coordinate the server has within ``tol`` (NaN: not read)."""
    return int((np.abs(estimate - x) <= tol).all(axis=1).sum())


# -- fedkmeans: the labels of centres the server picks ---------------------------------------------
GRID = 4096


def one_start(centres: np.ndarray, start: int = 0) -> dict[str, np.ndarray]:
    """A ``kmeans_step`` request advancing the one start ``start`` to ``centres``."""
    return {"starts": np.array([start]), "centres": centres[None]}


def grid_centres(axis: int, shift: float, low=-12.0, high=12.0) -> tuple[np.ndarray, np.ndarray]:
    """``GRID`` centres on feature ``axis`` (the others 0), shifted by ``shift`` cells; their positions."""
    cell = (high - low) / GRID
    positions = low + (np.arange(GRID) + shift) * cell
    centres = np.zeros((GRID, FEATURES))
    centres[:, axis] = positions
    return centres, positions


def read_axis(send, axis: int, x_rows: int) -> np.ndarray:
    """Each row's coordinate on ``axis`` from two label replies (grids half a cell apart): the middle of
    the two cells it fell in (NaN where a reply was refused)."""
    found = []
    for shift in (0.0, 0.5):
        centres, positions = grid_centres(axis, shift)
        reply = send(centres)
        found.append(positions[reply.arrays["labels"]] if reply.answered else np.full(x_rows, np.nan))
    return (found[0] + found[1]) / 2


def test_a_server_reads_no_row_through_fedkmeans_labels_of_its_centres(member):
    """16 ``kmeans_assign`` with 4,096 centres on one axis, no hello; then the most a server can make
    the protocol give: hello, a Lloyd step on its grid, and a final step whose summed statistics it
    forges so that the final centres are its grid again (each member derives them). One label reply
    a run: one coordinate, no row."""
    m = member({"strategy": "fedkmeans", "num-clusters": 3})
    x = m.features()
    estimate = np.column_stack([read_axis(lambda c: m.send(fedkmeans.KMEANS_ASSIGN, {"centres": c}), d, len(x))
                                for d in range(FEATURES)])
    assert pinned(estimate, x, 2.5e-3) == 0
    assert m.send(fedkmeans.KMEANS_ASSIGN, {"centres": grid_centres(0, 0)[0]}).refused == "protocol-order"

    m.new_run({**RUN, "strategy": "fedkmeans", "num-clusters": GRID, "num-rounds": 20})
    assert m.send("hello", values={"k": GRID, "seed": 0}).answered
    refused = m.send(fedkmeans.KMEANS_STEP, one_start(np.zeros((5, FEATURES)))).refused
    assert refused == "server-input"  # centres of another k than the run's

    def forged(centres):
        step = m.send(fedkmeans.KMEANS_STEP, one_start(centres))
        if not step.answered:
            return step
        _, counts, withheld, inertia = fedkmeans.split_statistics(step.arrays["stats"][0], GRID)
        total = fedkmeans.join_statistics(centres * (counts + 1)[:, None], counts + 1, withheld, inertia)
        return m.send(fedkmeans.KMEANS_ASSIGN, {"centres": centres, "stats": total}, {"start": 0})

    assert np.isnan(read_axis(forged, 0, len(x))).all()  # one label reply a run: one grid, half a read


# -- fedkmeans: differencing after a second hello, or across runs ---------------------------------
#: readings a differencing server takes (one row takes it about 20 without the defences)
READINGS = 30


def bisect_a_row(read, rows: int) -> list[np.ndarray]:
    """A plane moved through the rows until the rows below it differ by one between two readings;
    their below-sums' difference is that row. ``read(theta)`` -> (rows below, their sum) or None
    (nothing new: the interval is left). Bisects the interval holding the most rows (at the ends a
    one-row difference is withheld within one reading already)."""
    known = {theta: r for theta in (-30.0, 30.0) if (r := read(theta)) is not None}
    left = set()
    for _ in range(READINGS):
        ts = sorted(known)
        pairs = [(a, b) for a, b in zip(ts, ts[1:]) if known[b][0] > known[a][0] and (a, b) not in left]
        for a, b in pairs:
            if known[b][0] - known[a][0] == 1:
                return [known[b][1] - known[a][1]]
        if not pairs:
            return []
        a, b = max(pairs, key=lambda p: known[p[1]][0] - known[p[0]][0])  # the most rows inside
        found = read((a + b) / 2)
        if found is None:
            left.add((a, b))
        else:
            known[(a + b) / 2] = found
    return []


def plane(u: np.ndarray, theta: float) -> np.ndarray:
    """Two centres whose bisector is the plane ``u.x = theta``."""
    return np.stack([(theta - 1.0) * u, (theta + 1.0) * u])


def below_of(stats: np.ndarray, rows: int, seen: dict) -> tuple[int, np.ndarray] | None:
    """The rows below a plane and their sum, from one start's statistics (the total less the upper
    side when the lower is withheld; ``seen`` keeps the total once a reading gives it), None when
    they do not follow."""
    sums, counts, _, _ = fedkmeans.split_statistics(stats, 2)
    if counts.sum() == rows or (counts[0] > 0 and counts[1] == 0):  # all sent, or the upper side withheld
        below = (int(counts[0]), sums[0])
    elif counts[1] > 0 and counts[0] == 0 and "total" in seen:
        below = (int(rows - counts[1]), seen["total"] - sums[1])
    else:
        return None
    if below[0] == 0:
        seen["total"] = sums[1]
    return below


def below_reader(m: Member, u: np.ndarray, fresh, rows: int):
    """``read(theta)``: the plane ``u.x = theta``; ``fresh()`` before each reading (a second hello, or a
    new run: start 0 again; or another start of the run: its index). The rows below and their sum,
    None when the member sends nothing new."""
    seen = {}

    def read(theta):
        reply = m.send(fedkmeans.KMEANS_STEP, one_start(plane(u, theta), fresh() or 0))
        return below_of(reply.arrays["stats"][0], rows, seen) if reply.answered else None

    return read


@pytest.mark.parametrize("reset", ["second-hello", "new-run", "new-start"])
def test_differencing_takes_no_row_after_a_second_hello_in_a_new_run_or_start(member, reset):
    """Every reading after a hello that would start the member's audit anew (a second hello in the run,
    or a new run), or with a start the member has not advanced yet (its first statistics); without
    the defences the difference of two readings is one row, exactly."""
    raw = {"strategy": "fedkmeans", "num-clusters": 2, "num-rounds": 1000, "fedkmeans.tol": 0.0,
           "fedkmeans.restarts": READINGS + 2 if reset == "new-start" else 1}  # a start for every reading
    m = member(raw)
    x = m.features()
    u = np.random.default_rng(0).normal(size=FEATURES)
    u /= np.linalg.norm(u)
    seeds = iter(range(10_000))
    if reset == "new-start":
        m.send("hello", values={"k": 2, "seed": 0})

    def fresh():
        if reset == "new-start":
            return next(seeds)
        if reset == "new-run":
            m.new_run()
        m.send("hello", values={"k": 2, "seed": next(seeds)})  # another seed: a new request

    taken = bisect_a_row(below_reader(m, u, fresh, len(x)), len(x))
    hits = [t for t in taken if np.isclose(x, t, rtol=1e-9, atol=1e-9).all(axis=1).any()]
    assert not hits, f"{len(hits)} row(s) taken"
    if reset == "second-hello":
        assert m.send("hello", values={"k": 2, "seed": 10**6}).refused == "protocol-order"


def test_differencing_takes_no_row_with_every_start_of_one_step(member):
    """One Lloyd step whose starts put the plane between every two neighbouring rows (a server that knew
    the rows could do no better): each start's below-set differs from the next one's by one row.
    The starts share the member's audit, so no two of the sets it sends differ by one row."""
    starts = NODES + 1  # more than a member's rows
    m = member({"strategy": "fedkmeans", "num-clusters": 2, "num-rounds": 2, "fedkmeans.restarts": starts})
    x = m.features()
    u = np.random.default_rng(0).normal(size=FEATURES)
    u /= np.linalg.norm(u)
    side = np.sort(x @ u)
    thetas = np.concatenate([[side[0] - 1.0], (side[1:] + side[:-1]) / 2, [side[-1] + 1.0]])
    m.send("hello", values={"k": 2, "seed": 0})
    reply = m.send(fedkmeans.KMEANS_STEP, {"starts": np.arange(len(thetas)),
                                       "centres": np.stack([plane(u, t) for t in thetas])})
    assert reply.answered and reply.arrays["stats"].shape[0] == len(thetas)
    seen, below = {}, {}
    for theta, stats in zip(thetas, reply.arrays["stats"]):
        below[theta] = below_of(stats, len(x), seen)
    readings = [below[t] for t in thetas if below[t] is not None]
    taken = [b[1] - a[1] for a in readings for b in readings if b[0] - a[0] == 1]
    hits = [t for t in taken if np.isclose(x, t, rtol=1e-9, atol=1e-9).all(axis=1).any()]
    assert not hits, f"{len(hits)} row(s) taken"
    over = {"starts": np.arange(starts + 1), "centres": np.zeros((starts + 1, 2, FEATURES))}
    assert m.send(fedkmeans.KMEANS_STEP, over).refused == "server-input"  # more starts than fedkmeans.restarts


# -- fedavg-dmon: labels of weights the server picks ----------------------------------------------
LEVELS = 2048


def selu(v):
    return 1.0507009873554805 * np.where(v > 0, v, 1.6732632423543772 * np.expm1(np.minimum(v, 0)))


def level_weights(axis: int, shift: float, low=-6.0, high=6.0) -> tuple[dict, np.ndarray]:
    """A one-unit layer reading feature ``axis`` and a head whose argmax is the level nearest to its
    output: ``2 t_j h - t_j^2`` for the SELU images ``t_j`` of ``LEVELS`` positions."""
    cell = (high - low) / LEVELS
    positions = low + (np.arange(LEVELS) + shift) * cell
    t = selu(positions)
    lin = np.zeros((1, FEATURES), dtype=np.float32)
    lin[0, axis] = 1.0
    weights = {"conv.bias": np.zeros(1, np.float32), "conv.lin.weight": lin,
               "head.weight": (2 * t)[:, None].astype(np.float32), "head.bias": (-t * t).astype(np.float32)}
    return weights, positions


def test_a_server_reads_no_row_through_fedavg_dmon_labels_of_its_weights(member):
    m = member({"strategy": "fedavg-dmon", "num-clusters": LEVELS, "fedavg-dmon.hidden": 1,
                "fedavg-dmon.val-fraction": 0.9, "fedavg-dmon.test-fraction": 0.09, "partition.boundary": False})
    x = m.features()
    estimate = np.full(x.shape, np.nan)
    for d in range(FEATURES):
        found = []
        for shift in (0.0, 0.5):
            weights, positions = level_weights(d, shift)
            reply = m.send(dmon.DMON_ASSIGN, weights, {"k": LEVELS})
            found.append(positions[reply.arrays["labels"]] if reply.answered else np.full(len(x), np.nan))
        estimate[:, d] = (found[0] + found[1]) / 2
    assert pinned(estimate, x, 6e-3) == 0


# -- a step before the one that keeps its state ----------------------------------------------------
def test_a_step_sent_before_the_step_that_keeps_its_state_is_refused_as_a_protocol_error(member):
    """``boundary_links`` with no ``boundary_tags`` before: the member names the protocol fault, not a
    ``KeyError`` (a bug) from its empty state."""
    m = member({"fedkmeans.filter-order": 4})
    assert m.send("hello", values={"k": 3, "seed": 0}).answered
    reply = m.send(boundary.BOUNDARY_LINKS, {"directory": np.zeros((1, 16), np.uint8)}, {"offset": 0})
    assert "ProtocolError in step 'boundary_links'" in (reply.error or ""), reply
