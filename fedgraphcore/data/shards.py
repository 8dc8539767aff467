"""Per-client shards: process-local cache, files on disk, and the server's copy.

* :func:`client_shard` - what the ClientApp calls on every message: the shard
  of ``partition_id``, built once per process (the dataset is loaded and cut
  once, then served from memory) or, with ``shard_path``, read once from a
  shard file written by ``python -m app.data.prepare``.
* :func:`server_data` - the full dataset, loaded once per process (server-side
  evaluation).
* :func:`write_shards` / :func:`load_shard_file` - the file format: one
  ``client-<i>.npz`` per client (plain arrays, ``allow_pickle=False``; a JSON
  header stored as a uint8 array) plus ``manifest.json`` with the dataset,
  partitioner, seed, params, data hash, and per-client sizes, file sha256 and
  content hash. Loading re-hashes the content and checks it against the
  header, the manifest (when next to the file) and the caller's expectations;
  any mismatch raises :class:`ShardError` with one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import scipy.sparse as sp

from fedgraphcore.config import ConfigError

from . import memory
from .fingerprint import data_hash, hash_array
from .datasets import load_dataset, resolve_data_root, source_stamp
from .partition import partition
from .types import Boundary, GraphCollection, GraphData, Shard

FORMAT = "fedgraph-shard/1"
MANIFEST = "manifest.json"
HEADER_KEY = "__header__"


class ShardError(ConfigError):
    """A shard file is missing, corrupted, or does not match the run (one line); ``rule``, the rule
    it breaks, is its public part (:mod:`fedgraphcore.disclosure`; the message names the file's path)."""

    def __init__(self, message: str, *, rule: str | None = None) -> None:
        super().__init__(message, public="shard file check failed" + ("" if rule is None else f", rule '{rule}'"))


def shard_filename(client_id: int) -> str:
    return f"client-{int(client_id)}.npz"


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray) and o.size <= 10_000:
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON-serialisable")


def _dumps(obj) -> str:
    return json.dumps(obj, sort_keys=True, allow_nan=True, default=_json_default)


def _content_hash(arrays: Mapping[str, np.ndarray], header: Mapping[str, Any]) -> str:
    h = hashlib.sha256()
    hdr = {k: v for k, v in header.items() if k != "content_hash"}
    h.update(_dumps(hdr).encode())
    for k in sorted(arrays):
        h.update(k.encode())
        hash_array(h, arrays[k])
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------- (de)serialisation


def put_matrix(arrays: dict, name: str, m) -> Any:
    """Store a dense/CSR matrix under ``name``; return its header description."""
    if m is None:
        return None
    if sp.issparse(m):
        if not sp.isspmatrix_csr(m):
            raise TypeError(f"{name}: only CSR sparse matrices can be stored, got {type(m).__name__}")
        arrays[f"{name}.data"] = m.data
        arrays[f"{name}.indices"] = m.indices
        arrays[f"{name}.indptr"] = m.indptr
        return {"kind": "csr", "shape": [int(s) for s in m.shape]}
    arrays[name] = np.asarray(m)
    return {"kind": "dense"}


def get_matrix(arrays, name: str, desc):
    if desc is None:
        return None
    if desc["kind"] == "csr":
        return sp.csr_matrix((arrays[f"{name}.data"], arrays[f"{name}.indices"], arrays[f"{name}.indptr"]),
                             shape=tuple(desc["shape"]))
    return arrays[name]


def _kind(m) -> str:
    return "none" if m is None else ("csr" if sp.issparse(m) else "dense")


def put_graphs(arrays: dict, graphs: list[GraphData]) -> dict:
    """Concatenate a list of small graphs into flat arrays (exactly invertible)."""
    desc: dict[str, Any] = {"count": len(graphs), "names": [g.name for g in graphs],
                            "metas": [g.meta for g in graphs]}
    if not graphs:
        return desc
    xk = {_kind(g.x) for g in graphs}
    yk = {g.y is None for g in graphs}
    if len(xk) != 1 or len(yk) != 1:
        raise TypeError("graphs of one shard must all have the same kind of x and y")
    desc["x"] = xk.pop()
    desc["y"] = not yk.pop()
    arrays["graphs.n"] = np.array([g.num_nodes for g in graphs], dtype=np.int64)
    arrays["graphs.adj.nnz"] = np.array([g.adj.nnz for g in graphs], dtype=np.int64)
    arrays["graphs.adj.indptr"] = np.concatenate([g.adj.indptr for g in graphs])
    arrays["graphs.adj.indices"] = np.concatenate([g.adj.indices for g in graphs])
    arrays["graphs.adj.data"] = np.concatenate([g.adj.data for g in graphs])
    if desc["x"] == "dense":
        arrays["graphs.x"] = np.concatenate([g.x for g in graphs])
    elif desc["x"] == "csr":
        desc["x_cols"] = int(graphs[0].x.shape[1])
        arrays["graphs.x.nnz"] = np.array([g.x.nnz for g in graphs], dtype=np.int64)
        arrays["graphs.x.indptr"] = np.concatenate([g.x.indptr for g in graphs])
        arrays["graphs.x.indices"] = np.concatenate([g.x.indices for g in graphs])
        arrays["graphs.x.data"] = np.concatenate([g.x.data for g in graphs])
    if desc["y"]:
        arrays["graphs.y"] = np.concatenate([g.y for g in graphs])
    return desc


def get_graphs(arrays, desc) -> list[GraphData]:
    count = desc["count"]
    if count == 0:
        return []
    n = arrays["graphs.n"]
    node_off = np.concatenate([[0], np.cumsum(n)])
    ptr_off = np.concatenate([[0], np.cumsum(n + 1)])
    nnz_off = np.concatenate([[0], np.cumsum(arrays["graphs.adj.nnz"])])
    if desc["x"] == "csr":
        xnnz_off = np.concatenate([[0], np.cumsum(arrays["graphs.x.nnz"])])
    out = []
    for i in range(count):
        ni = int(n[i])
        a, b = nnz_off[i], nnz_off[i + 1]
        adj = sp.csr_matrix((arrays["graphs.adj.data"][a:b], arrays["graphs.adj.indices"][a:b],
                             arrays["graphs.adj.indptr"][ptr_off[i]: ptr_off[i + 1]]), shape=(ni, ni))
        x = None
        if desc["x"] == "dense":
            x = arrays["graphs.x"][node_off[i]: node_off[i + 1]]
        elif desc["x"] == "csr":
            xa, xb = xnnz_off[i], xnnz_off[i + 1]
            x = sp.csr_matrix((arrays["graphs.x.data"][xa:xb], arrays["graphs.x.indices"][xa:xb],
                               arrays["graphs.x.indptr"][ptr_off[i]: ptr_off[i + 1]]),
                              shape=(ni, desc["x_cols"]))
        y = arrays["graphs.y"][node_off[i]: node_off[i + 1]] if desc["y"] else None
        out.append(GraphData(desc["names"][i], adj, x, y, desc["metas"][i]))
    return out


_ARRAY_FIELDS = ("node_ids", "y", "feature_cols", "edge_weight", "graph_ids", "graph_y", "owned")
_BOUNDARY_FIELDS = ("rows", "keys", "weight")


def shard_to_arrays(shard: Shard, extra_header: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Flatten a shard into named arrays plus a JSON header (key ``__header__``)."""
    arrays: dict[str, np.ndarray] = {}
    header: dict[str, Any] = {
        "format": FORMAT,
        "client_id": int(shard.client_id),
        "num_clients": int(shard.num_clients),
        "dataset": shard.dataset,
        "partitioner": shard.partitioner,
        "meta": shard.meta,
        "arrays": [f for f in _ARRAY_FIELDS if getattr(shard, f) is not None],
        "adj": put_matrix(arrays, "adj", shard.adj),
        "x": put_matrix(arrays, "x", shard.x),
        "graphs": None if shard.graphs is None else put_graphs(arrays, shard.graphs),
        "boundary": shard.boundary is not None,
        **(extra_header or {}),
    }
    if shard.boundary is not None:
        arrays.update({f"boundary.{f}": getattr(shard.boundary, f) for f in _BOUNDARY_FIELDS})
    for f in header["arrays"]:
        arrays[f] = np.asarray(getattr(shard, f))
    try:
        header = json.loads(_dumps(header))  # canonical JSON types, as a reader sees them
    except TypeError as e:
        raise TypeError(f"shard meta must be JSON-serialisable: {e}") from None
    header["content_hash"] = _content_hash(arrays, header)
    raw = _dumps(header).encode()
    arrays[HEADER_KEY] = np.frombuffer(raw, dtype=np.uint8)
    return arrays


def shard_from_arrays(arrays: Mapping[str, np.ndarray], where: str = "shard") -> tuple[Shard, dict]:
    """Inverse of :func:`shard_to_arrays`; verifies the content hash."""
    if HEADER_KEY not in arrays:
        raise ShardError(f"{where} is not a shard file (no header); write it with python -m app.data.prepare",
                         rule="a shard file of python -m app.data.prepare")
    try:
        header = json.loads(bytes(arrays[HEADER_KEY]).decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ShardError(f"{where} is corrupted: unreadable header", rule="an intact shard file") from None
    if header.get("format") != FORMAT:
        raise ShardError(f"{where} has format {header.get('format')!r}, expected {FORMAT!r}",
                         rule="the shard format of this version")
    body = {k: v for k, v in arrays.items() if k != HEADER_KEY}
    if _content_hash(body, header) != header.get("content_hash"):
        raise ShardError(f"{where} is corrupted: content hash does not match its header", rule="an intact shard file")
    try:
        shard = Shard(
            client_id=header["client_id"], num_clients=header["num_clients"], dataset=header["dataset"],
            partitioner=header["partitioner"], node_ids=body["node_ids"],
            adj=get_matrix(body, "adj", header["adj"]), x=get_matrix(body, "x", header["x"]),
            graphs=None if header["graphs"] is None else get_graphs(body, header["graphs"]),
            meta=header["meta"],
        )
        for f in header["arrays"]:
            setattr(shard, f, body[f])
        if header.get("boundary"):
            shard.boundary = Boundary(*(body[f"boundary.{f}"] for f in _BOUNDARY_FIELDS)).validate(
                shard.num_nodes, f"{where}: boundary")
    except (KeyError, ValueError, TypeError, IndexError) as e:
        raise ShardError(f"{where} is corrupted: {type(e).__name__}: {e}", rule="an intact shard file") from None
    return shard, header


# --------------------------------------------------------------------------- files


def write_shards(shards: list[Shard], out_dir: str | os.PathLike, manifest_info: Mapping[str, Any]) -> dict:
    """Write ``client-<i>.npz`` for every shard and ``manifest.json``; return the manifest.

    ``manifest_info`` is copied into the manifest and into every shard header
    (e.g. ``seed``, ``params``, ``data_hash``, ``dataset_params``). Existing
    ``client-*.npz``/``manifest.json`` in ``out_dir`` are replaced.
    """
    if not shards:
        raise ShardError("no shards to write")
    num_clients = shards[0].num_clients
    ids = sorted(s.client_id for s in shards)
    if ids != list(range(num_clients)) or any(s.num_clients != num_clients for s in shards):
        raise ShardError(f"shards do not form a full partition: client ids {ids}, num_clients {num_clients}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("client-*.npz")) + [out / MANIFEST]:
        if old.exists():
            old.unlink()
    info = {k: v for k, v in dict(manifest_info).items()}
    clients = []
    for s in sorted(shards, key=lambda s: s.client_id):
        arrays = shard_to_arrays(s, {"info": info})
        header = json.loads(bytes(arrays[HEADER_KEY]).decode())
        path = out / shard_filename(s.client_id)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
        clients.append({
            "client_id": s.client_id, "file": path.name, "bytes": path.stat().st_size,
            "sha256": _file_sha256(path), "content_hash": header["content_hash"],
            "num_nodes": s.num_nodes, "num_edges": s.num_edges, "num_graphs": s.num_graphs,
            "num_features": 0 if s.x is None else int(s.x.shape[1]),
        })
    manifest = {
        "format": FORMAT,
        "dataset": shards[0].dataset,
        "partitioner": shards[0].partitioner,
        "num_clients": num_clients,
        **info,
        "content_hash": hashlib.sha256("".join(c["content_hash"] for c in clients).encode()).hexdigest(),
        "clients": clients,
    }
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, out / MANIFEST)
    return manifest


def load_shard_file(path: str | os.PathLike, *, dataset: str | None = None, partitioner: str | None = None,
                    num_clients: int | None = None, client_id: int | None = None,
                    data_hash: str | None = None, use_manifest: bool = True, cache: bool = True) -> Shard:
    """Read one shard file and check it; raise :class:`ShardError` (one line) if
    it is missing, corrupted, disagrees with the ``manifest.json`` next to it,
    or does not match any of the given expectations.

    With ``cache`` (default) a file that was already read and checked in this
    process, and has not changed since (same size and mtime, same manifest),
    is served from memory: the ClientApp may call this on every message. The
    returned shard is then shared: do not mutate it. The expectation checks
    run on every call.
    """
    p = Path(path)
    if not p.is_file():
        raise ShardError(f"shard file {p} not found; write shards with python -m app.data.prepare --out DIR",
                         rule="an existing shard file")
    if cache:
        man = p.parent / MANIFEST
        st = p.stat()
        mst = man.stat() if (use_manifest and man.is_file()) else None
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns, use_manifest,
               None if mst is None else (mst.st_size, mst.st_mtime_ns))
        shard, info = remember(_FILES, key, lambda: _read_shard_file(p, use_manifest), _MAX_FILES)
    else:
        shard, info = _read_shard_file(p, use_manifest)
    _check_expected(p, shard, info, dataset, partitioner, num_clients, client_id, data_hash)
    return shard


def _read_shard_file(p: Path, use_manifest: bool) -> tuple[Shard, dict]:
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, zipfile.LargeZipFile) as e:
        raise ShardError(f"shard file {p} is corrupted or not a shard ({type(e).__name__}: {e})",
                         rule="an intact shard file") from None
    shard, header = shard_from_arrays(arrays, where=f"shard file {p}")
    info = header.get("info", {})
    shard.cut = shard_cut(info)
    if use_manifest and (p.parent / MANIFEST).is_file():
        try:
            man = json.loads((p.parent / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError):
            raise ShardError(f"manifest {p.parent / MANIFEST} is corrupted (not JSON)",
                             rule="a shard file matching its manifest") from None
        for key, val in (("dataset", shard.dataset), ("partitioner", shard.partitioner),
                         ("num_clients", shard.num_clients), ("data_hash", info.get("data_hash")),
                         ("seed", info.get("seed"))):
            if key in man and man[key] != val:
                raise ShardError(f"shard file {p} does not match {MANIFEST} next to it: "
                                 f"{key} {val!r} != {man[key]!r}", rule="a shard file matching its manifest")
        entry = {c["client_id"]: c for c in man.get("clients", [])}.get(shard.client_id)
        if entry is None or entry.get("content_hash") != header["content_hash"]:
            raise ShardError(f"shard file {p} does not match {MANIFEST} next to it: content hash differs "
                             f"for client {shard.client_id}", rule="a shard file matching its manifest")
        if entry.get("sha256") and entry["sha256"] != _file_sha256(p):
            raise ShardError(f"shard file {p} does not match {MANIFEST} next to it: file sha256 differs",
                             rule="a shard file matching its manifest")
    return shard, info


def shard_cut(info: Mapping[str, Any]) -> str:
    """Which cut of the data a shard file belongs to, from its header's ``info``: the seed, the
    data hash and a digest of the split and dataset parameters; equal for every file of one
    ``python -m app.data.prepare`` run, and readable in an error that names two cuts."""
    params = hashlib.sha256(_dumps([info.get("params"), info.get("dataset_params")]).encode()).hexdigest()
    return f"seed {info.get('seed')}, data {str(info.get('data_hash'))[:12]}, parameters {params[:8]}"


def _check_expected(p: Path, shard: Shard, info: dict, dataset, partitioner, num_clients, client_id,
                    data_hash) -> None:
    if dataset is not None and shard.dataset != dataset:
        raise ShardError(f"shard file {p} holds dataset {shard.dataset!r}, but the run uses {dataset!r}",
                         rule="a shard of the run's dataset")
    if partitioner is not None and shard.partitioner != partitioner:
        raise ShardError(f"shard file {p} was cut by {shard.partitioner!r}, but the run uses {partitioner!r}",
                         rule="a shard cut by the run's partitioner")
    if num_clients is not None and shard.num_clients != num_clients:
        raise ShardError(f"shard file {p} was cut for {shard.num_clients} clients, but the run has {num_clients}",
                         rule="a shard cut for the run's number of clients")
    if client_id is not None and shard.client_id != client_id:
        raise ShardError(f"shard file {p} belongs to client {shard.client_id}, not partition {client_id}",
                         rule="the shard of this node's partition")
    if data_hash is not None and info.get("data_hash") != data_hash:
        raise ShardError(f"shard file {p} was cut from different '{shard.dataset}' data "
                         f"(data hash {str(info.get('data_hash'))[:12]} != {data_hash[:12]})",
                         rule="a shard cut from the run's data")


# --------------------------------------------------------------------------- per-process caches

_LOCK = threading.RLock()
_DATA: "OrderedDict[tuple, GraphData | GraphCollection]" = OrderedDict()
_PARTS: "OrderedDict[tuple, list[Shard]]" = OrderedDict()
_FILES: "OrderedDict[tuple, Shard]" = OrderedDict()
_MAX_ENTRIES = 2
_MAX_FILES = 64


def _freeze(d: Mapping[str, Any] | None) -> tuple:
    return tuple(sorted((k, v) for k, v in (d or {}).items()))


def remember(cache: OrderedDict, key, make, max_entries: int = _MAX_ENTRIES):
    with _LOCK:
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        value = make()
        cache[key] = value
        while len(cache) > max_entries:
            cache.popitem(last=False)
        return value


def clear_caches() -> None:
    """Forget cached datasets, partitions and shard files (tests)."""
    with _LOCK:
        _DATA.clear()
        _PARTS.clear()
        _FILES.clear()


def server_data(dataset: str, data_root: str | None = None, seed: int = 0,
                dataset_kwargs: Mapping[str, Any] | None = None) -> GraphData | GraphCollection:
    """The full dataset, loaded once per process (data registered in this process by
    :mod:`fedgraphcore.data.memory`: that object). Shared object: do not mutate."""
    if memory.is_memory(dataset):
        return memory.lookup(dataset)
    root = resolve_data_root(data_root)
    key = (dataset, str(root), int(seed), _freeze(dataset_kwargs), source_stamp(dataset, dataset_kwargs))
    return remember(_DATA, key, lambda: load_dataset(dataset, data_root=root, seed=seed,
                                                      **dict(dataset_kwargs or {})))


def client_shard(dataset: str, partitioner: str, partition_id: int, num_partitions: int, seed: int,
                 data_root: str | None, dataset_kwargs: Mapping[str, Any] | None,
                 partition_kwargs: Mapping[str, Any] | None, shard_path: str | None = None) -> Shard:
    """Shard of ``partition_id`` out of ``num_partitions``, cached per process.

    Without ``shard_path`` (simulation) the dataset is loaded and partitioned
    once per process and all shards are kept, so repeated messages and other
    virtual clients in the same process reuse them. With ``shard_path``
    (deployment: ``--node-config "shard=DIR/client-3.npz"``) the file is read
    once and checked against ``dataset``, ``partitioner``, ``num_partitions``
    and ``partition_id``. Shared object: do not mutate.
    """
    if isinstance(partition_id, bool) or not 0 <= int(partition_id) < int(num_partitions):
        raise ConfigError(f"partition id {partition_id!r} is out of range for {num_partitions} partitions")
    if shard_path:
        return load_shard_file(shard_path, dataset=dataset, partitioner=partitioner,
                               num_clients=int(num_partitions), client_id=int(partition_id))
    root = resolve_data_root(data_root)
    key = (dataset, partitioner, int(num_partitions), int(seed), str(root),
           _freeze(dataset_kwargs), _freeze(partition_kwargs), source_stamp(dataset, dataset_kwargs))

    def make():
        data = server_data(dataset, data_root, seed, dataset_kwargs)
        return partition(data, partitioner, int(num_partitions), seed=seed, **dict(partition_kwargs or {}))

    return remember(_PARTS, key, make)[int(partition_id)]
