"""Resuming an interrupted run: the server's journal of completed steps in the run's out-dir.

After every completed step (one :meth:`fedgraphcore.session.ServerSession.exchange`) the server writes
``OUT/journal/step-NNNNNN.bin``: the step's action, a digest of the requests it sent (per
partition id: arrays and values as the strategy built them) and the replies it accepted (per
partition id, in :func:`fedgraphcore.transport.bundle` form with JSON values; never pickled), each file
written to a temporary name and renamed. ``OUT/journal/manifest.json`` names the run-config and
what each client announced in the hello handshake. Every entry carries the SHA-256 of the one
before (the manifest for the first) and is preceded by its own: a damaged, edited, missing or
reordered entry is found before anything is sent. The digests catch damage, not a forger who
can write the directory and recompute them; a replayed reply is checked like a live one.

A run started with ``resume=true`` (``python -m app.run ... --resume OUT``) on the same
run-config connects live (hello and the secure-aggregation key agreement are never replayed:
every client draws fresh keys), then answers each step whose action and request digest equal
the journal's next entry with the recorded replies, sending nothing. A deterministic server so
reaches the interrupted step at once; the first step that differs (or the journal's end, a step
where the interrupted run lost a client, or a secure sum that survives dropouts whose
``secagg_unmask`` step the journal lacks) and every step after it run live and are journaled in
place of the old entries. A masked reply replays as it was: pairwise masks cancel
in the sum whatever the session that drew them.

Only a method whose clients keep no state between steps, or keep only what they can rebuild
from their own data and the replayed steps' requests, can resume this way (:func:`resume_refusal`):
its first live step then carries, under keys starting with :data:`REPLAYED`, what the clients
need to rebuild it (fedkmeans: the centres of every replayed Lloyd step, from which each client
recomputes the sums it sent and so its ``min-rows`` audit). A step's digest leaves out those keys
(a function of the requests already matched) and the peers' relayed public keys and their
endorsements (added afterwards); its secure-aggregation tag is the step's number, the same in
both runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from logging import INFO
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.common.logger import log

from fedgraphcore.config import ConfigError, RunConfig
from fedgraphcore.transport import BUNDLE_KEY, VALUES, Exchange, bundle, describe, pack, reply_problem, unpack
from fedgraphcore.wire import (HELLO, SECAGG_AGREE, SECAGG_ENDORSED, SECAGG_PEER, SECAGG_SETUP, SECAGG_THRESHOLD, SECAGG_UNMASK,
                      ProtocolError)

if TYPE_CHECKING:
    from fedgraphcore.session import ClientInfo, ServerSession

JOURNAL = "journal"
MANIFEST = "manifest.json"
FORMAT = 1
#: steps that always run live: they set up what a client keeps for the run (fresh keys)
LIVE_ACTIONS = frozenset({HELLO, SECAGG_SETUP, SECAGG_AGREE})
#: run-config keys a resumed run may set otherwise: where it writes, how it waits and scores
MAY_DIFFER = frozenset({"out-dir", "resume", "timeout", "retries", "transport", "reference", "eval-file"})
#: prefix of the request keys a step's digest leaves out: what a resumed run's first live step adds
#: for the clients to rebuild what the replayed steps, never sent to them, would have left with them
REPLAYED = "replayed_"
_DIGEST_BYTES = 32
_META = "meta"


def entry_name(index: int) -> str:
    return f"step-{index:06d}.bin"


# -- which configurations resume -------------------------------------------------------------
def _linked(config: RunConfig) -> bool:
    """A node split with boundary edges: the clients keep their links and the pads of padded sums."""
    return str(config["partitioner"]).startswith("node-") and bool(config["partition.boundary"])


def _fedspectral_plus(config: RunConfig) -> str | None:
    if _linked(config) and config["num-clients"] != 1:
        return ("on a node split with partition.boundary=true its clients keep their boundary links and the pads "
                "of padded sums between steps; valid: partitioner=edge or partition.boundary=false")
    return None


def _fedavg_dmon(config: RunConfig) -> str | None:
    stateless = (config["fedavg-dmon.mode"] == "federated" and not _linked(config)
                 and config["fedavg-dmon.optimizer-state"] == "reset" and config["fedavg-dmon.dropout"] == 0)
    if stateless:
        return None
    return ("its clients keep between rounds their model (mode isolated/centralised), Adam moments "
            "(optimizer-state=keep), dropout stream (dropout > 0) or boundary links (partition.boundary=true); "
            "valid: fedavg-dmon.mode=federated, partition.boundary=false, fedavg-dmon.optimizer-state=reset, "
            "fedavg-dmon.dropout=0")


def _fedkmeans(config: RunConfig) -> str | None:
    """Its clients' min-rows audit is rebuilt from the replayed steps' centres (clients/fedkmeans.py);
    the rows filtered over the whole graph come from padded sums that cannot be recomputed."""
    if _linked(config) and config["num-clients"] != 1 and config["fedkmeans.filter-order"] > 0:
        return ("with fedkmeans.filter-order > 0 (the default) on a node split with partition.boundary=true its "
                "clients keep their boundary links and the rows filtered over the whole graph (padded sums) between "
                "steps; valid: fedkmeans.filter-order=0, partition.boundary=false or partitioner=sample")
    return None


#: per resumable method: why a configuration of it cannot resume (None: it can)
RESUMABLE: dict[str, Callable[[RunConfig], str | None]] = {
    "fedspectral": lambda config: None,
    "fedspectral-plus": _fedspectral_plus,
    "fedavg-dmon": _fedavg_dmon,
    "fedkmeans": _fedkmeans,
}
#: what the clients of the other methods keep between steps
KEPT = {
    "kcagc": "its clients' filtered embedding",
    "kcagc-basic": "its clients' filtered embedding",
    "fedsc": "its clients' perturbed samples (drawn once per run)",
    "gw-ldp": "its clients' first noised draw",
}


def resume_refusal(config: RunConfig) -> str | None:
    """Why a run of ``config`` cannot resume (one line), or None: its clients would keep state
    between steps that a replayed step never gives them."""
    strategy = str(config["strategy"])
    check = RESUMABLE.get(strategy)
    if check is None:
        return (f"strategy '{strategy}' cannot resume: {KEPT.get(strategy, 'its clients keep state')} is kept "
                "between steps; valid: " + ", ".join(RESUMABLE))
    why = check(config)
    return None if why is None else f"strategy '{strategy}' cannot resume: {why}"


# -- the wire form of recorded values and requests ---------------------------------------------
def _jsonable(value):
    """A message value as JSON: bytes as ``{"bytes": hex}`` (a message value is never a mapping)."""
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _from_json(value):
    if isinstance(value, dict):
        return bytes.fromhex(value["bytes"])
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def _sorted_bundle(arrays: Mapping[str, np.ndarray]) -> bytes:
    return bundle({name: arrays[name] for name in sorted(arrays)})


def request_digest(action: str, category: str, requests: Mapping[int, RecordDict]) -> str:
    """SHA-256 of one step's requests (``requests``: partition id -> content): the action and, per
    partition in order, its values (less the peers' relayed keys and endorsements) and arrays
    (less both, :data:`REPLAYED` ones)."""
    h = hashlib.sha256(json.dumps([action, category]).encode())
    for partition in sorted(requests):
        arrays, values = unpack(requests[partition])
        relayed = (SECAGG_PEER, SECAGG_ENDORSED, REPLAYED)
        own = {k: _jsonable(v) for k, v in values.items() if not k.startswith(relayed)}
        arrays = {k: a for k, a in arrays.items() if not k.startswith(REPLAYED)}
        for part in (json.dumps([partition, own], sort_keys=True).encode(), _sorted_bundle(arrays)):
            h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()


def _unbundle(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of a :func:`fedgraphcore.transport.bundle` (checked as a message's bundle is)."""
    return unpack(RecordDict({VALUES: ConfigRecord({BUNDLE_KEY: data})}))[0]


# -- entries ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One completed step: its action, request digest, accepted replies (partition id -> content),
    the clients it lost (partition id -> reason) and whether it is a secure sum that survives
    dropouts (``recoverable``: its masks come off in the ``secagg_unmask`` step after it)."""

    action: str
    request: str
    replies: dict[int, RecordDict]
    rejected: dict[int, str]
    recoverable: bool = False


def encode_entry(index: int, previous: str, entry: Entry) -> bytes:
    """An entry file: its SHA-256, then one bundle of the replies' arrays (``<partition>/<name>``)
    and ``meta``, the JSON of index, previous digest, action, request digest, values and rejects."""
    arrays, values = {}, {}
    for partition, content in entry.replies.items():
        own, values[str(partition)] = unpack(content)
        arrays.update({f"{partition}/{name}": a for name, a in own.items()})
    meta = {"format": FORMAT, "index": index, "previous": previous, "action": entry.action,
            "request": entry.request, "values": {p: {k: _jsonable(v) for k, v in vs.items()}
                                                  for p, vs in values.items()},
            "rejected": {str(p): r for p, r in entry.rejected.items()}, "recoverable": entry.recoverable}
    body = bundle({_META: np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays})
    return hashlib.sha256(body).digest() + body


def decode_entry(data: bytes, index: int, previous: str) -> Entry:
    """The entry of an entry file's bytes; ValueError saying what is wrong with it."""
    digest, body = data[:_DIGEST_BYTES], data[_DIGEST_BYTES:]
    if len(digest) < _DIGEST_BYTES or hashlib.sha256(body).digest() != digest:
        raise ValueError("its digest does not match its contents (damaged or edited)")
    arrays = _unbundle(body)
    meta = json.loads(arrays.pop(_META).tobytes())
    if meta.get("format") != FORMAT or meta.get("index") != index or meta.get("previous") != previous:
        raise ValueError("it is not the entry that follows the one before (missing, reordered or from another run)")
    replies = {}
    for partition, values in meta["values"].items():
        own = {name.split("/", 1)[1]: a for name, a in arrays.items() if name.split("/", 1)[0] == partition}
        replies[int(partition)] = pack(own, {k: _from_json(v) for k, v in values.items()})
    return Entry(str(meta["action"]), str(meta["request"]), replies,
                 {int(p): str(r) for p, r in meta["rejected"].items()}, bool(meta["recoverable"]))


def write_atomically(path: Path, data: bytes) -> None:
    """``data`` at ``path``, never half-written: a temporary file in the same folder, synced, renamed."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the journal of one run --------------------------------------------------------------------
def _config_values(config: RunConfig) -> dict:
    """The run-config a resumed run must repeat: every key but :data:`MAY_DIFFER`."""
    return {k: _jsonable(v) for k, v in config.as_dict().items() if k not in MAY_DIFFER}


def _clients(clients: list[ClientInfo]) -> list[dict]:
    """What each client announced in hello (its counts and figures, a digest of its arrays), by
    partition: other data or another split announces otherwise."""
    return json.loads(json.dumps([{"partition": c.partition_id, "summary": _jsonable_dict(c.summary),
                                   "arrays": _digest(_sorted_bundle(c.arrays))} for c in clients]))


def _jsonable_dict(values: Mapping) -> dict:
    return {str(k): _jsonable(v) for k, v in values.items()}


class Journal:
    """The journal of one run in ``folder`` (see module docstring): ``entries`` recorded by the
    interrupted run (verified, in order; empty for a fresh run), replayed while the steps match."""

    def __init__(self, folder: Path, config: dict, entries: list[Entry], digests: list[str],
                 manifest: dict | None) -> None:
        self.folder, self.config, self.entries, self.manifest = folder, config, entries, manifest
        self.digests = digests  # the manifest's SHA-256, then each entry file's
        self.resumed = manifest is not None
        self.replaying = self.resumed
        self.completed = 0  # journaled steps done in this run, replayed ones included
        self._manifest: bytes | None = None  # a fresh journal's manifest, written with its first step
        self.replayed = 0

    @classmethod
    def open(cls, config: RunConfig) -> Journal | None:
        """The journal of the run ``config`` (before anything is sent): the interrupted run's,
        verified, with ``resume=true``; else a fresh one where the run can resume, None where not
        (its clients keep state) or where it has no out-dir. One-line ConfigError: a resume
        refused (:func:`resume_refusal`, another run-config, a damaged journal, none), or an
        out-dir holding an interrupted run's journal without ``resume=true``."""
        out_dir = str(config["out-dir"])
        folder = Path(out_dir) / JOURNAL
        if not config["resume"]:
            if out_dir and (folder / MANIFEST).exists():
                raise ConfigError(f"out-dir {out_dir!r} holds the journal of an interrupted run; valid: resume=true "
                                  f"(python -m app.run ... --resume {out_dir}) to continue it, or another out-dir")
            return None if not out_dir or resume_refusal(config) else cls(folder, _config_values(config), [], [], None)
        refusal = resume_refusal(config)
        if refusal or not out_dir:
            raise ConfigError(refusal or "resume=true needs out-dir: the interrupted run's directory")
        return cls._interrupted(folder, config)

    @classmethod
    def _interrupted(cls, folder: Path, config: RunConfig) -> Journal:
        """The interrupted run's journal in ``folder``, checked whole against ``config``."""
        try:
            data = (folder / MANIFEST).read_bytes()
            manifest = json.loads(data)
        except (OSError, ValueError) as err:
            raise ConfigError(f"resume: no readable journal in {str(folder.parent)!r} ({err}); valid: the out-dir "
                              "of an interrupted run of a method that can resume") from None
        ours = _config_values(config)
        stored = manifest.get("config", {}) if isinstance(manifest, dict) else {}
        differ = sorted(k for k in set(ours) | set(stored) if ours.get(k) != stored.get(k))
        if differ:
            raise ConfigError("resume with another run-config than the interrupted run's: " + ", ".join(
                f"{k}={ours.get(k)!r} (journal: {stored.get(k)!r})" for k in differ) + "; valid: the journal's values")
        entries, digests = _read_entries(folder, _digest(data))
        return cls(folder, ours, entries, digests, manifest)

    def begin(self, session: ServerSession) -> None:
        """After hello: a fresh journal makes its manifest (written with the first step, so that a run
        that stops before any leaves nothing to resume); a resumed one checks that the clients
        announce what they did in the interrupted run. The session journals its steps from here."""
        clients = _clients(session.clients)
        if self.resumed:
            _check_same_clients(self.manifest.get("clients"), clients)
        else:
            self._manifest = json.dumps({"format": FORMAT, "config": self.config, "clients": clients},
                                        indent=1).encode()
            self.digests = [_digest(self._manifest)]
        session.journal = self

    def step(self, session: ServerSession, action: str, category: str, contents: Mapping[int, RecordDict],
             expect) -> Step | None:
        """The step about to be sent (None: one that always runs live), with the recorded replies
        when it is the journal's next entry (same action, same requests)."""
        if action in LIVE_ACTIONS:
            return None
        requests = {session.partition_of(n): c for n, c in contents.items()}
        digest = request_digest(action, category, requests)
        index = self.completed + 1
        recoverable = any(SECAGG_THRESHOLD in describe(c)[1] for c in contents.values())
        if self._replays(index, action, digest):
            replay = _replayed(session, self.entries[index - 1], index, set(requests), expect)
            return Step(self, session, index, action, digest, recoverable, replay)
        self._go_live(index)
        return Step(self, session, index, action, digest, recoverable, None)

    def _replays(self, index: int, action: str, digest: str) -> bool:
        """Whether step ``index`` replays: it is the next entry, which lost no client, and, for a
        secure sum that survives dropouts, its ``secagg_unmask`` step follows it in the journal
        (the fresh clients cannot take masks of the interrupted run's session off)."""
        if not self.replaying or index > len(self.entries):
            return False
        entry = self.entries[index - 1]
        if (entry.action, entry.request) != (action, digest) or entry.rejected:
            return False
        after = self.entries[index] if index < len(self.entries) else None
        return not entry.recoverable or (after is not None and after.action == SECAGG_UNMASK and not after.rejected)

    def _go_live(self, index: int) -> None:
        """From step ``index`` on the run is live: the interrupted run's later entries are dropped."""
        if not self.replaying:
            return
        self.replaying = False
        for later in range(index, len(self.entries) + 1):
            (self.folder / entry_name(later)).unlink(missing_ok=True)
        del self.digests[index:]
        log(INFO, "resumed from %s: %d step(s) replayed from its journal, live from step %d", self.folder.parent,
            self.replayed, index)

    def record(self, index: int, entry: Entry) -> None:
        """Journal the completed live step ``index`` (a fresh journal's manifest first)."""
        if self._manifest is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            for stale in self.folder.glob("step-*"):
                stale.unlink()
            write_atomically(self.folder / MANIFEST, self._manifest)
            self._manifest = None
        data = encode_entry(index, self.digests[index - 1], entry)
        write_atomically(self.folder / entry_name(index), data)
        self.digests.append(_digest(data))

    def summary(self) -> dict:
        """result.json's ``resumed`` section: the steps replayed and the interrupted run's journal."""
        return {"from": str(self.folder.parent), "replayed_steps": self.replayed, "journal_steps": len(self.entries)}

    def finish(self) -> None:
        """The run's result is written: its journal is no longer needed."""
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass
class Step:
    """One journaled step of a run: ``replay``, the recorded outcome, or None (sent live)."""

    journal: Journal
    session: ServerSession
    index: int
    action: str
    request: str
    recoverable: bool
    replay: Exchange | None

    def done(self, replies: Mapping[int, RecordDict], rejected: Mapping[int, str]) -> None:
        """The step completed with ``replies`` (node id -> content) and ``rejected`` clients."""
        journal, session = self.journal, self.session
        journal.completed = self.index
        if self.replay is not None:
            journal.replayed += 1
            session.stats.rounds[-1]["replayed"] = True
            return
        journal.record(self.index, Entry(self.action, self.request,
                                         {session.partition_of(n): c for n, c in replies.items()},
                                         {session.partition_of(n): r for n, r in rejected.items()}, self.recoverable))


def last_step_replayed(session: ServerSession) -> bool:
    """Whether the session's last exchange was taken from a resumed run's journal (nothing sent)."""
    return bool(session.stats.rounds) and bool(session.stats.rounds[-1].get("replayed"))


def _replayed(session: ServerSession, entry: Entry, index: int, requested: set[int], expect) -> Exchange:
    """The recorded replies of ``entry`` as a step's outcome at this run's node ids, each checked
    as a live reply is (a reply no client could send stops the run)."""
    where = f"journal entry {entry_name(index)}"
    if set(entry.replies) != requested:
        raise ProtocolError(f"{where} holds replies of clients {sorted(entry.replies)} to a step sent to "
                            f"{sorted(requested)}; valid: the journal as the run wrote it")
    node_of = {c.partition_id: c.node_id for c in session.clients}
    replies = {}
    for partition, content in entry.replies.items():
        node = node_of[partition]
        spec = expect.get(node) if isinstance(expect, Mapping) else expect
        problem = reply_problem(spec, content) if spec is not None else None
        if problem:
            raise ProtocolError(f"{where}: the recorded reply of client {partition} to '{entry.action}': {problem}; "
                                "valid: the journal as the run wrote it")
        replies[node] = content
    return Exchange(replies, {}, 0.0, 0, 0)


def _read_entries(folder: Path, manifest_digest: str) -> tuple[list[Entry], list[str]]:
    """Every entry of ``folder`` in order, each checked against its digest and the one before;
    a one-line ConfigError for the first that fails (nothing is written)."""
    names = sorted(p.name for p in folder.glob("step-*.bin"))
    if names != [entry_name(i) for i in range(1, len(names) + 1)]:
        raise ConfigError(f"resume: the journal in {str(folder)!r} lacks entries (it holds {', '.join(names)}); "
                          "valid: the journal as the run wrote it")
    entries, digests = [], [manifest_digest]
    for i, name in enumerate(names, start=1):
        data = (folder / name).read_bytes()
        try:
            entries.append(decode_entry(data, i, digests[-1]))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
            raise ConfigError(f"resume: journal entry {folder / name} is refused: {err}; valid: the journal as the "
                              "run wrote it, or a new run without resume") from None
        digests.append(_digest(data))
    return entries, digests


def _check_same_clients(stored, clients: list[dict]) -> None:
    """The clients of a resumed run announce in hello what those of the interrupted run did."""
    if stored == clients:
        return
    before = {c["partition"]: c for c in stored or []}
    now = {c["partition"]: c for c in clients}
    if set(before) != set(now):
        raise ProtocolError(f"resume: clients {sorted(now)} connected, the interrupted run had {sorted(before)}; "
                            "valid: the clients and data of the interrupted run")
    for p in sorted(now):
        if now[p] != before[p]:
            keys = sorted(k for k in set(now[p]["summary"]) | set(before[p]["summary"])
                          if now[p]["summary"].get(k) != before[p]["summary"].get(k))
            what = ", ".join(keys) if keys else "its hello arrays"
            raise ProtocolError(f"resume: client {p} holds other data than in the interrupted run ({what} "
                                "differ); valid: the data and split of the interrupted run")
