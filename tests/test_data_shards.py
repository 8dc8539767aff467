"""Shard files (exact round trip, refusal of bad files), per-process cache, CLI, params."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedgraphcore.config import ConfigError, Schema  # noqa: E402
from fedgraphcore.data import GraphCollection, GraphData, Shard, load_dataset  # noqa: E402
from fedgraphcore.data import shards as shards_mod  # noqa: E402
from fedgraphcore.data.params import DATA_PARAMS, data_root, dataset_kwargs, partition_kwargs  # noqa: E402
from fedgraphcore.data.partition import PARTITION_PARAMS, PARTITIONERS, partition  # noqa: E402
from fedgraphcore.data.prepare import main as prepare_main  # noqa: E402
from conftest import shared_datasets_or_skip  # noqa: E402
from fedgraphcore.data.shards import (ShardError, client_shard, clear_caches, data_hash, load_shard_file,  # noqa: E402
                             server_data, write_shards)

SHARED = ROOT.parent / "shared" / "datasets"


@pytest.fixture(scope="module")
def sbm() -> GraphData:
    return load_dataset("sbm", seed=1, nodes=300, blocks=3, features=6)


@pytest.fixture(scope="module")
def collection() -> GraphCollection:
    rng = np.random.default_rng(0)
    graphs = []
    for i in range(30):
        n = int(rng.integers(2, 9))
        a = sp.triu(sp.random(n, n, density=0.5, random_state=i), 1)
        a = ((a + a.T) > 0).astype(np.float64).tocsr()
        x = sp.csr_matrix(rng.random((n, 4)) > 0.5, dtype=np.float64)
        graphs.append(GraphData(f"toy/{i}", a, x, rng.integers(0, 3, n).astype(np.int64), {"index": i}))
    return GraphCollection("toy", graphs, (np.arange(30) % 2).astype(np.int64))


def _eq(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if sp.issparse(a) or sp.issparse(b):
        return (sp.issparse(a) and sp.issparse(b) and a.shape == b.shape and a.dtype == b.dtype
                and np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
                and np.array_equal(a.data, b.data))
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def assert_same_shard(a: Shard, b: Shard) -> None:
    for f in ("client_id", "num_clients", "dataset", "partitioner", "meta"):
        assert getattr(a, f) == getattr(b, f), f
    for f in ("node_ids", "adj", "x", "y", "feature_cols", "edge_weight", "graph_ids", "graph_y", "owned"):
        assert _eq(getattr(a, f), getattr(b, f)), f
    assert (a.graphs is None) == (b.graphs is None)
    for g, h in zip(a.graphs or [], b.graphs or []):
        assert g.name == h.name and g.meta == h.meta
        assert _eq(g.adj, h.adj) and _eq(g.x, h.x) and _eq(g.y, h.y)
    assert len(a.graphs or []) == len(b.graphs or [])


CASES = [
    ("node-random", {"overlap": 0.2}),
    ("edge", {"overlap": 0.5}),
    ("vertical", {"split": "random"}),
    ("khop", {"hops": 1, "centres": 20}),
    ("sample-dirichlet", {"alpha": 1.0}),
]


@pytest.mark.parametrize("name,kw", CASES)
def test_round_trip_exact(tmp_path, sbm, name, kw):
    shards = partition(sbm, name, 3, seed=2, **kw)
    man = write_shards(shards, tmp_path, {"seed": 2, "params": kw, "data_hash": data_hash(sbm)})
    assert man["num_clients"] == 3 and man["dataset"] == "sbm" and man["partitioner"] == name
    assert [c["file"] for c in man["clients"]] == ["client-0.npz", "client-1.npz", "client-2.npz"]
    for s in shards:
        back = load_shard_file(tmp_path / f"client-{s.client_id}.npz", dataset="sbm", num_clients=3,
                               client_id=s.client_id, data_hash=data_hash(sbm))
        assert_same_shard(s, back)
    # Content hashes are reproducible (same seed, same content).
    man2 = write_shards(partition(sbm, name, 3, seed=2, **kw), tmp_path / "again", {"seed": 2, "params": kw,
                                                                                    "data_hash": data_hash(sbm)})
    assert man2["content_hash"] == man["content_hash"]


def test_round_trip_sparse_features_and_collections(tmp_path, sbm, collection):
    xs = sp.csr_matrix(np.where(sbm.x > 1, sbm.x, 0.0))
    d = GraphData("sbm", sbm.adj, xs, sbm.y, {})
    for shards in (partition(d, "node-random", 2, seed=0), partition(d, "khop", 2, seed=0, centres=6),
                   partition(collection, "graph-dirichlet", 2, seed=0, alpha=5.0)):
        out = tmp_path / shards[0].partitioner
        write_shards(shards, out, {"seed": 0})
        for s in shards:
            assert_same_shard(s, load_shard_file(out / f"client-{s.client_id}.npz"))


def test_files_are_plain_arrays_without_pickle(tmp_path, sbm):
    write_shards(partition(sbm, "khop", 2, seed=0, centres=4), tmp_path, {"seed": 0})
    with np.load(tmp_path / "client-0.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)


@pytest.fixture
def written(tmp_path, sbm):
    out = tmp_path / "shards"
    write_shards(partition(sbm, "node-random", 3, seed=0), out, {"seed": 0, "data_hash": data_hash(sbm)})
    return out


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_refuses_truncated_file(written):
    p = written / "client-1.npz"
    p.write_bytes(p.read_bytes()[:-200])
    with pytest.raises(ShardError) as e:
        load_shard_file(p)
    assert "client-1.npz" in _one_line(e) and "corrupted" in str(e.value)


def test_refuses_flipped_bytes(written):
    p = written / "client-0.npz"
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(ShardError) as e:
        load_shard_file(p)
    assert "corrupted" in _one_line(e) or "does not match" in str(e.value)


def test_refuses_rewritten_array(written):
    # A well-formed npz whose arrays were changed (its hash does not match the header).
    p = written / "client-2.npz"
    with np.load(p) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["node_ids"] = arrays["node_ids"][::-1].copy()
    np.savez(p, **arrays)
    with pytest.raises(ShardError, match="content hash"):
        load_shard_file(p, use_manifest=False)


def test_refuses_mismatches(written, sbm):
    p = written / "client-1.npz"
    with pytest.raises(ShardError) as e:
        load_shard_file(p, num_clients=4)
    assert "cut for 3 clients" in _one_line(e) and "4" in str(e.value)
    with pytest.raises(ShardError, match="holds dataset 'sbm', but the run uses 'cora'"):
        load_shard_file(p, dataset="cora")
    with pytest.raises(ShardError, match="belongs to client 1"):
        load_shard_file(p, client_id=2)
    with pytest.raises(ShardError, match="different 'sbm' data"):
        load_shard_file(p, data_hash=data_hash(load_dataset("sbm", seed=2, nodes=300, blocks=3, features=6)))
    with pytest.raises(ShardError, match="cut by 'node-random'"):
        load_shard_file(p, partitioner="edge")


def test_refuses_shard_from_other_set(tmp_path, written, sbm):
    # client-1 from a different partition (other seed) dropped into this directory.
    other = tmp_path / "other"
    write_shards(partition(sbm, "node-random", 3, seed=9), other, {"seed": 0, "data_hash": data_hash(sbm)})
    shutil.copy(other / "client-1.npz", written / "client-1.npz")
    with pytest.raises(ShardError, match="does not match manifest.json"):
        load_shard_file(written / "client-1.npz")
    # A manifest claiming another client count.
    man = json.loads((other / "manifest.json").read_text())
    man["num_clients"] = 5
    (other / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ShardError, match="num_clients 3 != 5"):
        load_shard_file(other / "client-0.npz")


def test_missing_and_non_shard_files(tmp_path):
    with pytest.raises(ShardError, match="not found"):
        load_shard_file(tmp_path / "client-0.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ShardError, match="corrupted or not a shard"):
        load_shard_file(tmp_path / "junk.npz")
    np.savez(tmp_path / "plain.npz", a=np.arange(3))
    with pytest.raises(ShardError, match="not a shard file"):
        load_shard_file(tmp_path / "plain.npz")


def test_write_refuses_incomplete_partition(tmp_path, sbm):
    shards = partition(sbm, "node-random", 3, seed=0)
    with pytest.raises(ShardError, match="full partition"):
        write_shards(shards[:2], tmp_path, {})


# ----------------------------------------------------------------------------- caches


def test_client_shard_is_memoised(monkeypatch):
    clear_caches()
    calls = []
    real = shards_mod.load_dataset

    def counting(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(shards_mod, "load_dataset", counting)
    dkw = {"nodes": 200, "blocks": 2, "p_in": 0.1, "p_out": 0.01, "features": 4, "signal": 5.0}
    args = dict(dataset="sbm", partitioner="node-random", num_partitions=4, seed=3, data_root=None,
                dataset_kwargs=dkw, partition_kwargs={"overlap": 0.0})
    first = [client_shard(partition_id=i, **args) for i in range(4)]
    again = client_shard(partition_id=2, **args)
    assert again is first[2] and len(calls) == 1, "dataset loaded and cut once per process"
    assert server_data("sbm", None, 3, dkw) is server_data("sbm", None, 3, dict(reversed(dkw.items())))
    assert len(calls) == 1
    assert np.array_equal(np.sort(np.concatenate([s.node_ids for s in first])), np.arange(200))
    other = client_shard(partition_id=2, **{**args, "seed": 4})
    assert other is not first[2] and len(calls) == 2
    with pytest.raises(ConfigError, match="partition id 4 is out of range for 4"):
        client_shard(partition_id=4, **args)
    clear_caches()


def test_client_shard_from_file(written):
    clear_caches()
    args = dict(dataset="sbm", partitioner="node-random", num_partitions=3, seed=0, data_root=None,
                dataset_kwargs={}, partition_kwargs={})
    s = client_shard(partition_id=1, shard_path=str(written / "client-1.npz"), **args)
    assert s.client_id == 1 and client_shard(partition_id=1, shard_path=str(written / "client-1.npz"),
                                             **args) is s
    with pytest.raises(ShardError, match="cut for 3 clients, but the run has 4"):
        client_shard(partition_id=1, shard_path=str(written / "client-1.npz"), **{**args, "num_partitions": 4})
    with pytest.raises(ShardError, match="belongs to client 1, not partition 2"):
        client_shard(partition_id=2, shard_path=str(written / "client-1.npz"), **args)
    # load_shard_file itself is cached (the ClientApp may call it on every message)...
    p = written / "client-0.npz"
    a = load_shard_file(p)
    assert load_shard_file(p) is a and load_shard_file(p, cache=False) is not a
    # ...but a changed file is read (and checked) again.
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(ShardError, match="client-0.npz is corrupted"):
        load_shard_file(p)
    clear_caches()


# ----------------------------------------------------------------------------- params


def test_params_declared_and_valid():
    schema = Schema()
    schema.add(DATA_PARAMS)  # no duplicates
    keys = set(schema.params)
    assert {"data-root", "sbm.nodes", "sbm.blocks", "sbm.p-in", "sbm.p-out", "sbm.features", "sbm.signal",
            "partition.overlap", "partition.alpha", "partition.community", "khop.hops",
            "khop.centres"} <= keys
    assert not keys & {"dataset", "partitioner", "seed", "num-clusters"}
    for p in DATA_PARAMS:
        assert p.coerce(p.default) == p.default


def test_kwargs_mapping(sbm):
    cfg = {"dataset": "sbm", "sbm.nodes": "500", "sbm.p-in": 0.1, "partition.alpha": "0.3", "data-root": ""}
    assert dataset_kwargs(cfg) == {"nodes": 500, "blocks": 4, "p_in": 0.1, "p_out": 0.005, "features": 16,
                                   "signal": 5.0}
    assert dataset_kwargs({"dataset": "cora"}) == {}
    assert data_root(cfg) is None and data_root({"data-root": "/x"}) == "/x"
    assert partition_kwargs("node-dirichlet", cfg) == {"overlap": 0.0, "alpha": 0.3, "min_size": 2, "boundary": True}
    for name in PARTITIONERS:
        assert set(partition_kwargs(name, {})) == set(PARTITION_PARAMS[name])
    # The defaults are accepted by the loaders and partitioners.
    d = load_dataset("sbm", **dataset_kwargs({"dataset": "sbm"}))
    assert d.num_nodes == 1000
    with pytest.raises(ConfigError, match="unknown partitioner"):
        partition_kwargs("nope", {})
    with pytest.raises(ConfigError, match="partition.alpha"):
        partition_kwargs("node-dirichlet", {"partition.alpha": "x"})


# ----------------------------------------------------------------------------- CLI


def test_prepare_cli_writes_loadable_shards(tmp_path, capsys):
    out = tmp_path / "out"
    rc = prepare_main(["--dataset", "sbm", "--partitioner", "edge", "--num-clients", "4", "--seed", "5",
                       "--set", "sbm.nodes=400", "--set", "partition.overlap=0.5", "--out", str(out)])
    assert rc == 0
    man = json.loads((out / "manifest.json").read_text())
    assert (man["dataset"], man["partitioner"], man["num_clients"], man["seed"]) == ("sbm", "edge", 4, 5)
    assert man["params"]["overlap"] == 0.5 and man["dataset_params"]["nodes"] == 400
    assert len(man["data_hash"]) == 64 and len(man["content_hash"]) == 64
    shards = [load_shard_file(out / f"client-{i}.npz", num_clients=4, client_id=i) for i in range(4)]
    assert all(s.meta["replicas"] == 2 for s in shards)
    d = load_dataset("sbm", seed=5, nodes=400)
    assert man["data_hash"] == data_hash(d)
    assert sum(s.num_edges for s in shards) == 2 * d.num_edges
    assert "wrote 4 shards" in capsys.readouterr().out


@pytest.mark.parametrize("argv,match", [
    (["--dataset", "nope", "--partitioner", "edge", "--num-clients", "2"],
     "invalid value 'nope' for 'dataset': neither a built-in dataset nor an existing file"),
    (["--dataset", "sbm", "--partitioner", "nope", "--num-clients", "2"], "unknown partitioner 'nope'"),
    (["--dataset", "sbm", "--partitioner", "edge", "--num-clients", "0"], "num-clients"),
    (["--dataset", "sbm", "--partitioner", "edge", "--num-clients", "2", "--set", "foo=1"], "unknown config key"),
    (["--dataset", "sbm", "--partitioner", "edge", "--num-clients", "2", "--set", "sbm.nodes=x"], "sbm.nodes"),
    (["--dataset", "sbm", "--partitioner", "edge"], "required"),
    (["--dataset", "iris", "--partitioner", "graph-dirichlet", "--num-clients", "2"], "graph collection"),
    (["--dataset", "pubmed", "--partitioner", "edge", "--num-clients", "2", "--data-root", "/nonexistent"],
     "/nonexistent/planetoid/PubMed/raw"),
])
def test_prepare_cli_errors(tmp_path, capsys, argv, match):
    rc = prepare_main(argv + ["--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and match in err and err.count("\n") == 1 and err.startswith("error: ")


KARATE = ["--dataset", "karate", "--partitioner", "node-random", "--num-clients", "2"]


@pytest.mark.parametrize("extra, message", [
    (["--seed", "-1"], "value -1 for 'seed' is out of range; valid range: [0, 4294967295]"),
    (["--seed", str(2**32)], "value 4294967296 for 'seed' is out of range; valid range: [0, 4294967295]"),
    (["--eval-file", "{tmp}/eval.npz", "--eval-contents", "foo"],
     "invalid value 'foo' for '--eval-contents'; valid choices: labels-only, full"),
    (["--eval-file", "{tmp}/afile/eval.npz"], "--eval-file: '{tmp}/afile' is a file; valid: a file in a directory"),
    # these three are refused before any shard or manifest.json is written
    (["--eval-file", "{tmp}/adir"], "--eval-file: '{tmp}/adir' is a directory; valid: a file in a directory"),
    (["--eval-file", "/proc/no-such/eval.npz"],
     "--eval-file: '/proc/no-such' cannot be created or written (No such file or directory); valid: a file in a "
     "directory"),
    (["--set", "sbm.nodes=50", "--set", "sbm.nodes=60"], "--set sbm.nodes given twice ('50', '60'); valid: once"),
])
def test_prepare_refuses_bad_input_before_writing_anything(tmp_path, capsys, extra, message):
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    extra = [a.format(tmp=tmp_path) for a in extra]
    assert prepare_main(KARATE + extra + ["--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"error: {message.format(tmp=tmp_path)}\n"
    assert not (tmp_path / "o").exists() and not (tmp_path / "eval.npz").exists()  # no half-written output
    assert prepare_main(KARATE + ["--out", str(tmp_path / "afile" / "o")]) == 2
    assert capsys.readouterr().err == (f"error: --out: '{tmp_path / 'afile'}' is a file; valid: a directory for "
                                       "the shards\n")


def test_prepare_refuses_an_out_dir_it_cannot_write(tmp_path, capsys):
    assert prepare_main(KARATE + ["--out", "/proc/no-such/o"]) == 2
    assert capsys.readouterr().err == ("error: --out: '/proc/no-such/o' cannot be created or written (No such file or "
                                       "directory); valid: a directory for the shards\n")


def test_prepare_module_entry_point(tmp_path):
    r = subprocess.run([sys.executable, "-m", "app.data.prepare", "--dataset", "iris", "--partitioner",
                        "sample", "--num-clients", "2", "--out", str(tmp_path / "o")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o" / "client-1.npz").is_file()
    r = subprocess.run([sys.executable, "-m", "app.data.prepare", "--dataset", "iris"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_a_bad_eval_file_is_named_with_what_is_wrong(tmp_path):
    from fedgraphcore.data.evaluation import load_evaluation

    (tmp_path / "notes.txt").write_text("labels\n")
    for path, state in ((tmp_path, "is a directory"), (tmp_path / "none.npz", "does not exist"),
                        (tmp_path / "notes.txt", "is not an evaluation file")):
        with pytest.raises(ConfigError) as err:
            load_evaluation(path)
        assert str(err.value).startswith(f"eval-file {str(path)!r} {state}") and "\n" not in str(err.value)


def test_a_labels_only_eval_file_keeps_one_id_per_label(tmp_path):
    """The deployed server writes labels.csv from the evaluation file alone: a collection's labels
    without their graphs still name every graph, and the user's IDs come back as written."""
    from fedgraphcore.data.evaluation import load_evaluation, write_evaluation

    mutag = load_dataset("mutag", data_root=str(shared_datasets_or_skip()))
    labels_only = load_evaluation(write_evaluation(mutag, tmp_path / "mutag.npz"))
    assert labels_only.num_graphs == 0 and labels_only.keys.tolist() == list(range(len(mutag.y)))
    named = GraphData("named", sp.csr_matrix((3, 3)), None, np.array([0, 1, 0]), node_keys=np.array(["b", "a", "c"]))
    assert load_evaluation(write_evaluation(named, tmp_path / "named.npz")).keys.tolist() == ["b", "a", "c"]
    graphs = GraphCollection("g", mutag.graphs[:2], mutag.y[:2], graph_keys=np.array([17, 4]))
    assert load_evaluation(write_evaluation(graphs, tmp_path / "g.npz")).keys.tolist() == [17, 4]
