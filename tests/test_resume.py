"""Resuming an interrupted run from its journal (fedgraphcore/journal.py): the labels of an uninterrupted run,
nothing sent for a replayed step, and every resume that cannot be exact refused in one line."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from fedgraphcore import journal as J
from fedgraphcore.config import ConfigError
from app.inprocess import InProcessGrid
from fedgraphcore.protocols import fedkmeans
from app.run import main, run_experiment
from fedgraphcore.transport import bundle, pack, unpack
from fedgraphcore.wire import SECAGG_ENDORSED, SECAGG_PEER, ProtocolError

#: a small graph, no centralised reference: runs of a few seconds
SMALL = {"sbm.nodes": 240, "reference": False}
#: fedavg-dmon's clients keep nothing between rounds only so (fedgraphcore.journal.resume_refusal)
DMON_STATELESS = {**SMALL, "partition.boundary": False, "fedavg-dmon.optimizer-state": "reset",
                  "fedavg-dmon.dropout": 0.0, "num-rounds": 4, "fedavg-dmon.local-epochs": 2, "fedavg-dmon.hidden": 8}
#: strategy, run-config, the journal's entries when the run stops, the steps its resumption replays:
#: all of them, but a secure sum that survives dropouts whose unmask step the journal lacks
CASES = {
    "fedspectral-plus": ("fedspectral-plus", SMALL, 3, 3),
    "fedspectral-plus-secure": ("fedspectral-plus", {**SMALL, "fedspectral-plus.secure": True}, 4, 4),
    "fedavg-dmon": ("fedavg-dmon", DMON_STATELESS, 2, 2),
    "fedavg-dmon-secure": ("fedavg-dmon", {**DMON_STATELESS, "fedavg-dmon.secure": True}, 3, 2),
    "fedkmeans": ("fedkmeans", SMALL, 1, 1),
    "fedkmeans-secure": ("fedkmeans", {**SMALL, "fedkmeans.secure": True}, 3, 2),
    "fedkmeans-filtered-locally": ("fedkmeans", {**SMALL, "fedkmeans.filter-order": 2, "partition.boundary": False},
                                   1, 1),
}


class Interrupted(Exception):
    """Stands for the server being killed once the journal holds a given number of entries."""


def interrupt_after(monkeypatch, entries: int) -> None:
    """The next run stops as if killed right after its journal's entry ``entries`` was written."""
    record = J.Journal.record

    def record_then_stop(self, index, entry):
        record(self, index, entry)
        if index == entries:
            raise Interrupted
    monkeypatch.setattr(J.Journal, "record", record_then_stop)


@pytest.fixture
def pushed(monkeypatch):
    """The message types of every batch the in-process grid is given, in order."""
    batches: list[list[str]] = []
    push = InProcessGrid.push_messages

    def spy(self, messages):
        messages = list(messages)
        batches.append([m.metadata.message_type for m in messages])
        return push(self, messages)
    monkeypatch.setattr(InProcessGrid, "push_messages", spy)
    return batches


@pytest.fixture
def pushed_contents(monkeypatch):
    """The message type and arrays of every message the in-process grid is given, in order."""
    contents: list[tuple[str, dict]] = []
    push = InProcessGrid.push_messages

    def spy(self, messages):
        messages = list(messages)
        contents.extend((m.metadata.message_type, unpack(m.content)[0]) for m in messages)
        return push(self, messages)
    monkeypatch.setattr(InProcessGrid, "push_messages", spy)
    return contents


def lloyd_requests(contents) -> list[dict]:
    return [arrays for kind, arrays in contents if kind == f"query.{fedkmeans.KMEANS_STEP}"]


def labels(out) -> str:
    return (out / "labels.csv").read_text()


def journal_files(out) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / J.JOURNAL).iterdir())}


def interrupted_run(monkeypatch, strategy, overrides, out, entries: int, nodes=None) -> dict[str, bytes]:
    """Run until the journal holds ``entries`` entries, then stop; the journal's files."""
    with monkeypatch.context() as patch:
        interrupt_after(patch, entries)
        with pytest.raises(Interrupted):
            run_experiment(strategy, "sbm", 3, overrides, out, node_configs=nodes)
    files = journal_files(out)
    assert sorted(files) == [J.MANIFEST] + [J.entry_name(i) for i in range(1, entries + 1)]
    assert not (out / "result.json").exists()
    return files


@pytest.mark.parametrize("case", CASES)
def test_a_resumed_run_gives_the_uninterrupted_labels_sending_nothing_for_replayed_steps(case, tmp_path,
                                                                                        monkeypatch, pushed):
    strategy, overrides, entries, replayed = CASES[case]
    full = run_experiment(strategy, "sbm", 3, overrides, tmp_path / "full")
    uninterrupted = list(pushed)
    interrupted_run(monkeypatch, strategy, overrides, tmp_path / "cut", entries)
    pushed.clear()
    resumed = run_experiment(strategy, "sbm", 3, {**overrides, "resume": True}, tmp_path / "cut")
    assert labels(tmp_path / "cut") == labels(tmp_path / "full")
    assert resumed["metrics"] == full["metrics"]
    assert resumed["resumed"] == {"from": str(tmp_path / "cut"), "replayed_steps": replayed, "journal_steps": entries}
    # hello and the key agreement are live; the replayed steps are not sent again, the rest are as before
    assert pushed == uninterrupted[:1] + uninterrupted[1 + replayed:]
    rounds = resumed["timing"]["per_round"]
    assert [r.get("replayed", False) for r in rounds] == [True] * replayed + [False] * (len(rounds) - replayed)
    assert all(r["bytes_down"] == r["bytes_up"] == 0 for r in rounds[:replayed])
    assert resumed["privacy"] == full["privacy"]  # the replayed uploads are in the ledger as the live ones
    assert not (tmp_path / "cut" / J.JOURNAL).exists()  # a finished run keeps no journal


# -- fedkmeans: each client's min-rows audit rebuilt from the replayed steps' centres ---------------
#: nodes whose policy makes fedkmeans withhold clusters in every round (min-rows 20 of their ~80 rows)
STRICT_NODES = [{"partition-id": i, "num-partitions": 3, "privacy.fedkmeans.min-rows": 20} for i in range(3)]


@pytest.mark.parametrize("secure,entries", [(False, 1), (True, 2)], ids=["plain", "secure"])
def test_a_resumed_fedkmeans_client_withholds_what_the_uninterrupted_one_withheld(secure, entries, tmp_path,
                                                                                  monkeypatch, pushed_contents):
    overrides = {**SMALL, "fedkmeans.secure": secure}
    full = run_experiment("fedkmeans", "sbm", 3, overrides, tmp_path / "full", node_configs=STRICT_NODES)
    assert len(full["history"]) == 2 and all(h["withheld"] > 0 for h in full["history"])
    interrupted_run(monkeypatch, "fedkmeans", overrides, tmp_path / "cut", entries, STRICT_NODES)
    shutil.copytree(tmp_path / "cut", tmp_path / "fresh")
    sent = lloyd_requests(pushed_contents)
    resumed = run_experiment("fedkmeans", "sbm", 3, {**overrides, "resume": True}, tmp_path / "cut",
                             node_configs=STRICT_NODES)
    assert resumed["history"] == full["history"] and labels(tmp_path / "cut") == labels(tmp_path / "full")
    assert resumed["metrics"] == full["metrics"] and resumed["resumed"]["replayed_steps"] == entries
    # round 2 (live) went to every client with round 1's centres (replayed: sent to none), as it was sent before
    live = lloyd_requests(pushed_contents)[len(sent):]
    assert len(sent) == 2 * 3 + 3 and len(live) == 3
    for arrays in live:
        assert np.array_equal(arrays["centres"], sent[3]["centres"])
        assert np.array_equal(arrays[fedkmeans.REPLAYED_CENTRES], sent[0]["centres"])  # every start's block
        assert np.array_equal(arrays[fedkmeans.REPLAYED_STARTS], sent[0]["starts"])
    if secure:
        return
    # a client whose audit started afresh lets out what the uninterrupted run withheld
    monkeypatch.setattr(fedkmeans, "replay_audit", lambda x, replayed, starts, min_rows, audits: audits)
    fresh = run_experiment("fedkmeans", "sbm", 3, {**overrides, "resume": True}, tmp_path / "fresh",
                           node_configs=STRICT_NODES)
    assert fresh["history"][1]["withheld"] != full["history"][1]["withheld"]


@pytest.mark.parametrize("case,first,second", [("fedspectral-plus", 2, 4), ("fedkmeans", 1, 2)])
def test_a_run_interrupted_again_after_resuming_resumes_again(case, first, second, tmp_path, monkeypatch):
    """fedkmeans: the step that carried the rebuild replays too (its digest leaves that out), and the
    live one after it carries both replayed steps' centres."""
    strategy, overrides, _, _ = CASES[case]
    full = run_experiment(strategy, "sbm", 3, overrides, tmp_path / "full")
    interrupted_run(monkeypatch, strategy, overrides, tmp_path / "cut", first)
    resume = {**overrides, "resume": True}
    with monkeypatch.context() as patch:
        interrupt_after(patch, second)
        with pytest.raises(Interrupted):
            run_experiment(strategy, "sbm", 3, resume, tmp_path / "cut")
    result = run_experiment(strategy, "sbm", 3, resume, tmp_path / "cut")
    assert result["resumed"]["replayed_steps"] == second
    assert labels(tmp_path / "cut") == labels(tmp_path / "full")
    assert result.get("history") == full.get("history")
    assert fedkmeans.REPLAYED_CENTRES.startswith(J.REPLAYED)  # what a step's digest leaves out


def test_a_step_that_differs_from_the_journal_and_every_later_one_run_live(tmp_path, monkeypatch, pushed):
    strategy, overrides, _, _ = CASES["fedspectral-plus"]
    files = interrupted_run(monkeypatch, strategy, overrides, tmp_path / "cut", 3)
    # the journal's second step recorded for another request: only the first one replays
    second = J.decode_entry(files[J.entry_name(2)], 2, _digest(files[J.entry_name(1)]))
    forged = J.Entry(second.action, "0" * 64, second.replies, {})
    rewrite(tmp_path / "cut", {2: forged})
    pushed.clear()
    result = run_experiment(strategy, "sbm", 3, {**overrides, "resume": True}, tmp_path / "cut")
    assert result["resumed"] == {"from": str(tmp_path / "cut"), "replayed_steps": 1, "journal_steps": 3}
    assert len(pushed) == len(result["timing"]["per_round"])  # hello, then every step but the first


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rewrite(out, changed: dict[int, J.Entry]) -> None:
    """Write the journal's entries again, ``changed`` ones replaced, every digest recomputed: what
    someone who can write the run's directory can do."""
    folder = out / J.JOURNAL
    previous = written = _digest((folder / J.MANIFEST).read_bytes())
    for index in range(1, len(list(folder.glob("step-*.bin"))) + 1):
        path = folder / J.entry_name(index)
        old = path.read_bytes()
        entry = changed.get(index) or J.decode_entry(old, index, previous)
        data = J.encode_entry(index, written, entry)
        path.write_bytes(data)
        previous, written = _digest(old), _digest(data)


# -- refused, in one line, with nothing written ---------------------------------------------------
@pytest.fixture
def cut(tmp_path, monkeypatch):
    """A fedspectral-plus run interrupted after two steps: its out-dir and its journal's files."""
    strategy, overrides, _, _ = CASES["fedspectral-plus"]
    out = tmp_path / "cut"
    return out, overrides, interrupted_run(monkeypatch, strategy, overrides, out, 2)


def refused(out, overrides, error=ConfigError, strategy="fedspectral-plus") -> str:
    before = journal_files(out)
    with pytest.raises(error) as caught:
        run_experiment(strategy, "sbm", 3, {**overrides, "resume": True}, out)
    assert journal_files(out) == before and not (out / "result.json").exists()
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_resume_with_another_run_config_is_refused_naming_the_keys(cut):
    out, overrides, _ = cut
    message = refused(out, {**overrides, "seed": 7, "fedspectral-plus.block": 9})
    assert "fedspectral-plus.block=9 (journal: 0)" in message and "seed=7 (journal: 0)" in message


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "missing entry", "swapped entries", "edited manifest"])
def test_a_damaged_journal_is_refused_naming_the_entry(cut, damage):
    out, overrides, files = cut
    folder = out / J.JOURNAL
    first, second = folder / J.entry_name(1), folder / J.entry_name(2)
    if damage == "flipped byte":
        data = bytearray(files[first.name])
        data[len(data) // 2] ^= 1
        first.write_bytes(bytes(data))
    elif damage == "truncated":
        second.write_bytes(files[second.name][:-10])
    elif damage == "missing entry":
        first.unlink()
    elif damage == "swapped entries":
        first.write_bytes(files[second.name])
        second.write_bytes(files[first.name])
    else:  # the run-config in the manifest edited to match another run: the first entry no longer follows it
        (folder / J.MANIFEST).write_bytes(files[J.MANIFEST].replace(b'"seed": 0', b'"seed": 0 '))
    message = refused(out, overrides)
    assert "journal" in message and "valid: the journal as the run wrote it" in message


@pytest.mark.parametrize("meta", [b"[1, 2]", b"{}", b"not json", b'{"format": 1, "index": 1, "previous": 5}'])
def test_an_entry_with_a_valid_digest_but_crafted_contents_is_refused(cut, meta):
    out, overrides, _ = cut
    body = bundle({"meta": np.frombuffer(meta, dtype=np.uint8)})
    (out / J.JOURNAL / J.entry_name(1)).write_bytes(hashlib.sha256(body).digest() + body)
    assert f"journal entry {out / J.JOURNAL / J.entry_name(1)} is refused" in refused(out, overrides)


def test_a_forged_journal_gives_only_replies_a_client_could_send(cut):
    """An attacker who can write the run's directory recomputes every digest: the replayed replies
    are checked as live ones are, so a reply no client could send stops the run naming the entry."""
    out, overrides, files = cut
    second = J.decode_entry(files[J.entry_name(2)], 2, _digest(files[J.entry_name(1)]))
    arrays, values = unpack(second.replies[0])
    forged = {**second.replies, 0: pack({"block": np.full_like(arrays["block"], np.nan)}, values)}
    rewrite(out, {2: J.Entry(second.action, second.request, forged, {})})
    message = refused(out, overrides, ProtocolError)
    assert J.entry_name(2) in message and "client 0" in message


@pytest.mark.parametrize("strategy,overrides,why", [
    ("fedavg-dmon", {}, "Adam moments"),
    ("fedspectral-plus", {"partitioner": "node-random"}, "boundary links"),
    ("fedkmeans", {"fedkmeans.filter-order": 2}, "rows filtered over the whole graph"),
    ("kcagc", {}, "valid: fedspectral, fedspectral-plus, fedavg-dmon, fedkmeans"),
])
def test_a_method_whose_clients_keep_state_is_refused_before_anything_is_sent(strategy, overrides, why, tmp_path,
                                                                              pushed):
    with pytest.raises(ConfigError, match="cannot resume") as caught:
        run_experiment(strategy, "sbm", 3, {**overrides, "resume": True}, tmp_path / "out")
    assert why in str(caught.value) and "\n" not in str(caught.value)
    assert pushed == []


@pytest.mark.shipped_defaults
def test_a_default_fedkmeans_run_on_a_graph_is_refused_before_anything_is_sent(tmp_path, pushed):
    """The shipped default filters over the whole graph on a node split: its clients keep the padded
    sums' rows, so a resume is refused in one line naming the settings that resume."""
    with pytest.raises(ConfigError, match=r"cannot resume.*filter-order > 0 \(the default\)") as caught:
        run_experiment("fedkmeans", "sbm", 3, {"resume": True}, tmp_path / "out")
    assert "valid: fedkmeans.filter-order=0" in str(caught.value) and "\n" not in str(caught.value)
    assert pushed == []


def test_such_a_method_writes_no_journal(tmp_path):
    run_experiment("fedkmeans", "sbm", 2, {"num-rounds": 2, "fedkmeans.filter-order": 1}, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "labels.csv", "labels.npy", "reference_labels.npy", "result.json"]  # no journal (and here report=false)


def test_a_new_run_into_an_interrupted_runs_directory_is_refused(cut):
    out, overrides, files = cut
    with pytest.raises(ConfigError, match="holds the journal of an interrupted run; valid: resume=true"):
        run_experiment("fedspectral-plus", "sbm", 3, overrides, out)
    assert journal_files(out) == files


def test_resuming_a_directory_without_a_journal_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no readable journal"):
        run_experiment("fedspectral-plus", "sbm", 3, {"resume": True}, tmp_path / "empty")


def test_a_resume_with_other_data_is_refused_naming_what_differs(tmp_path, monkeypatch):
    graph = tmp_path / "graph.csv"
    rng = np.random.default_rng(0)
    edges = {tuple(sorted(e)) for e in rng.integers(0, 60, size=(300, 2)) if e[0] != e[1]}
    graph.write_text("source,target\n" + "".join(f"{a},{b}\n" for a, b in sorted(edges)))
    overrides = {"num-clusters": 3, "reference": False}
    out = tmp_path / "cut"
    with monkeypatch.context() as patch:
        interrupt_after(patch, 1)
        with pytest.raises(Interrupted):
            run_experiment("fedspectral-plus", str(graph), 2, overrides, out)
    graph.write_text(graph.read_text() + "0,59\n" if (0, 59) not in edges else graph.read_text() + "0,58\n")
    with pytest.raises(ProtocolError, match=r"client \d holds other data than in the interrupted run \(num_\w+.* differ\)"):
        run_experiment("fedspectral-plus", str(graph), 2, {**overrides, "resume": True}, out)


# -- the command line --------------------------------------------------------------------------
def test_app_run_resume_continues_the_run(cut, capsys):
    out, overrides, _ = cut
    sets = [f"--set={k}={v}" for k, v in overrides.items()]
    argv = ["--strategy", "fedspectral-plus", "--dataset", "sbm", "--num-clients", "3", "--engine", "inprocess", *sets]
    assert main([*argv, "--resume", str(out), "--out", str(tmp := out.parent / "elsewhere")]) == 2
    assert f"--resume {out} and out-dir {tmp} both given" in capsys.readouterr().err
    assert main([*argv, "--resume", str(out)]) == 0
    assert f"result: {out / 'result.json'}" in capsys.readouterr().out


def test_app_run_names_the_resume_command_when_a_run_stops(tmp_path, monkeypatch, capsys):
    interrupt_after(monkeypatch, 1)
    monkeypatch.setattr(J.Journal, "record", _stop_with_protocol_error(J.Journal.record))
    out = tmp_path / "out"
    assert main(["--strategy", "fedspectral-plus", "--dataset", "sbm", "--num-clients", "2", "--engine", "inprocess",
                 "--out", str(out)]) == 1
    assert f"the same command with --resume {out} continues it" in capsys.readouterr().err


def _stop_with_protocol_error(record):
    def stop(self, index, entry):
        try:
            record(self, index, entry)
        except Interrupted:
            raise ProtocolError("step 'fedspectral_product' rejected 1 client(s): node 1: no reply within 600 s") from None
    return stop


# -- a deployed run ------------------------------------------------------------------------------
@pytest.mark.deployment
@pytest.mark.slow
def test_a_deployed_run_whose_supernode_died_resumes_with_the_uninterrupted_labels(tmp_path):
    """``python -m deploy local``: a SuperNode killed once the journal holds a step stops the run
    (the server cannot finish without it); ``--resume OUT`` on a fresh federation finishes it."""
    import subprocess
    import sys

    import psutil

    from conftest import HANG_GUARD_S, REPO, wait_until
    from deploy.__main__ import main as deploy

    sets = {"sbm.nodes": 240, "reference": False, "fedspectral-plus.mode": "paper", "fedspectral-plus.rounds": 8,
            "fedspectral-plus.secure": True,
            "timeout": 30}
    argv = ["local", "--nodes", "3", "--strategy", "fedspectral-plus", "--dataset", "sbm",
            *[f"--set={k}={v}" for k, v in sets.items()]]
    out = tmp_path / "deployed"
    first = tmp_path / "first"
    proc = subprocess.Popen([sys.executable, "-m", "deploy", *argv, "--out", str(out)], cwd=REPO,
                            stdout=first.with_suffix(".log").open("w"), stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: (out / "result" / J.JOURNAL / J.entry_name(1)).exists() or proc.poll() is not None,
                   "the journal's first entry", poll_s=0.01)
        assert proc.poll() is None and not (out / "result" / "result.json").exists()
        node = [p for p in psutil.Process(proc.pid).children(recursive=True)
                if "supernode" in " ".join(p.cmdline()) and "client-0.npz" in " ".join(p.cmdline())]
        assert node, "supernode-0 not found among the deployment's processes"
        for p in node:
            p.kill()
        assert proc.wait(timeout=HANG_GUARD_S) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (out / "result" / "result.json").exists()
    assert deploy([*argv, "--resume", str(out)]) == 0
    resumed = json.loads((out / "result" / "result.json").read_text())
    assert resumed["resumed"]["replayed_steps"] >= 1
    run_experiment("fedspectral-plus", "sbm", 3, sets, tmp_path / "inprocess")
    assert np.array_equal(np.load(out / "result" / "labels.npy"), np.load(tmp_path / "inprocess" / "labels.npy"))


# -- the audit rebuilt from replayed centres, on a client's rows (no Flower) -----------------------
RESTARTS = 2


def client_rows(seed: int = 3, min_rows: int = 5):
    """Three groups of 14 rows, the audit of two starts after their local seeds (min-rows ``min_rows``),
    and three steps of centres near the groups' for both starts (that with seed 3 make the third
    step withhold)."""
    rng = np.random.default_rng(seed)
    x = np.vstack([rng.normal(c, 0.8, size=(14, 2)) for c in ((0, 0), (3, 0), (0, 3))])
    _, _, seed_labels = fedkmeans.local_seeds(x, 3, 0, min_rows)
    audit = fedkmeans.Audit.of_seeds(seed_labels, int(seed_labels.max()) + 1, min_rows)
    audits = fedkmeans.StartAudits.starting(audit.basis, RESTARTS, 3)
    steps = [np.array([[0, 0], [3, 0], [0, 3.0]]) + rng.normal(0, 0.7, size=(RESTARTS, 3, 2)) for _ in range(3)]
    return x, audits, steps


def lloyd_run(x, audits, steps, min_rows: int = 5):
    """Every step's statistics (starts x size) and the audit after them."""
    out = []
    for centres in steps:
        stats, _, audits = fedkmeans.start_statistics(x, centres, np.arange(len(centres)), min_rows, audits)
        out.append(stats)
    return out, audits


def same_audit(a: fedkmeans.StartAudits, b: fedkmeans.StartAudits) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("basis", "labels", "sent"))


def replayed_blocks(steps) -> tuple[np.ndarray, np.ndarray]:
    """The blocks of ``steps`` as a resumed run's first live step carries them, and their starts."""
    return np.concatenate(steps), np.concatenate([np.arange(len(c)) for c in steps])


def test_an_audit_rebuilt_from_the_replayed_centres_is_the_uninterrupted_one():
    x, seeds, steps = client_rows()
    uninterrupted, after = lloyd_run(x, seeds, steps)
    rebuilt = fedkmeans.replay_audit(x, *replayed_blocks(steps[:2]), 5, seeds)
    resumed, resumed_after = lloyd_run(x, rebuilt, steps[2:])
    assert (uninterrupted[2][:, -2] > 0).any()  # the live step withholds rows
    assert np.array_equal(resumed[0], uninterrupted[2])
    assert same_audit(resumed_after, after)
    fresh, _ = lloyd_run(x, seeds, steps[2:])  # without the rebuild another release goes out
    assert not np.array_equal(fresh[0], uninterrupted[2])
    assert fedkmeans.replay_audit(x, *replayed_blocks(steps[:2]), 1, None) is None  # min-rows 1: no audit


def leverage(basis: np.ndarray) -> float:
    return float(np.einsum("ij,ij->i", basis, basis).max(initial=0.0))


def in_span(basis: np.ndarray, vectors: np.ndarray) -> bool:
    return np.allclose(basis @ (basis.T @ vectors), vectors, atol=1e-8)


@pytest.mark.parametrize("attack", ["a row's neighbourhood", "every row in one cluster", "random far centres"])
def test_replayed_centres_a_server_crafts_only_make_the_audit_stricter(attack):
    """The attacker's side: the server sends made-up replayed centres, then live centres that single
    out each row in turn, one start a row apart from the other. The rebuilt audit spans at least the
    fresh one, and every set the client sends after it, with either start, lies in its span, which
    determines no row (every leverage below 1)."""
    x, seeds, _ = client_rows()
    rng = np.random.default_rng(1)
    far = np.full((2, 2), 1e3)
    crafted = {"a row's neighbourhood": [np.vstack([x[i], x.mean(0), far[0]]) for i in range(0, 42, 7)],
               "every row in one cluster": [np.vstack([x.mean(0), far])] * 3,
               "random far centres": [rng.normal(0, 50, size=(3, 2)) for _ in range(6)]}[attack]
    audits = fedkmeans.replay_audit(x, np.stack(crafted), np.arange(len(crafted)) % RESTARTS, 5, seeds)
    assert in_span(audits.basis, seeds.basis) and leverage(audits.basis) < 1 - 1e-9
    for i in range(len(x) - 1):
        probes = np.stack([np.vstack([x[i], x.mean(0), far[0]]), np.vstack([x[i + 1], x.mean(0), far[0]])])
        stats, counts, audits = fedkmeans.start_statistics(x, probes, np.arange(RESTARTS), 5, audits)
        for start in range(RESTARTS):
            sent = np.eye(3)[audits.labels[start]][:, audits.sent[start]]
            assert in_span(audits.basis, sent) and leverage(audits.basis) < 1 - 1e-9
        assert (counts.sum(1) + stats[:, -2] == len(x)).all() and (counts[counts > 0] >= 5).all()


@pytest.mark.parametrize("replayed,starts,why", [
    (np.zeros((2, 3)), [0, 1], r"shape \(2, 3\); valid: 1..19 blocks of centres \(3, 2\)"),
    (np.zeros((1, 4, 2)), [0], r"shape \(1, 4, 2\)"),
    (np.zeros((20, 3, 2)), [0] * 20, r"shape \(20, 3, 2\); valid: 1..19"),
    (np.zeros((0, 3, 2)), [], r"shape \(0, 3, 2\)"),
    (np.full((1, 3, 2), np.nan), [0], "not finite"),
    (np.full((1, 3, 2), np.inf), [0], "not finite"),
    (np.zeros((2, 3, 2)), [0], r"replayed_starts of int64 \(1,\); valid: 2 starts in 0..1"),
    (np.zeros((2, 3, 2)), [0, 2], r"replayed_starts of int64 \(2,\); valid: 2 starts in 0..1"),
    (np.zeros((2, 3, 2)), [0.0, 1.0], r"replayed_starts of float64"),
])
def test_malformed_replayed_centres_are_refused(replayed, starts, why):
    with pytest.raises(ValueError, match=why):
        fedkmeans.check_replayed(replayed, np.asarray(starts), (3, 2), RESTARTS, 19)


def test_replayed_centres_after_the_first_lloyd_statistics_are_refused():
    """A server cannot rebuild the audit of a client that has answered a Lloyd step (to loosen it)."""
    x, seeds, steps = client_rows()
    _, audit = lloyd_run(x, seeds, steps[:1])
    with pytest.raises(ValueError, match="after this client's first Lloyd statistics"):
        fedkmeans.replay_audit(x, *replayed_blocks(steps[1:]), 5, audit)


def test_a_steps_digest_leaves_out_the_relayed_keys_and_their_endorsements():
    """A resumed secure run relays a new session's keys, endorsed anew: its steps still match."""
    centres = {"centres": np.zeros((2, 2))}

    def digest(k, key, endorsement):
        values = {"k": k, f"{SECAGG_PEER}1": key, f"{SECAGG_ENDORSED}1": endorsement}
        return J.request_digest(fedkmeans.KMEANS_STEP, "train", {0: pack(centres, values)})
    assert digest(2, b"a" * 32, b"x" * 96) == digest(2, b"b" * 32, b"y" * 96)
    assert digest(2, b"a" * 32, b"x" * 96) != digest(3, b"a" * 32, b"x" * 96)
