"""Shared fixtures: a temp results dir, the shared datasets root and a loopback mirror of it."""

from __future__ import annotations

import http.server
import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from app.inprocess import InProcessGrid
from flwr.app import Context, RecordDict

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"

# Keep torch / BLAS to one thread per process: the machine has 2 cores and
# the simulation tests run clients in parallel.
os.environ.setdefault("OMP_NUM_THREADS", "1")

#: Seconds after which a test gives up on an event (a subprocess ending, a log line, a process
#: exiting): a guard against a hang only, minutes long, so that a busy machine never fails a test.
HANG_GUARD_S = 600.0
#: A deployed run starts a ClientApp process per message; on a busy machine (load 25 on 2 cores) the
#: small deployed runs of the suite took up to a quarter of an hour. This guard only ends a hang.
RUN_GUARD_S = 3600.0

#: markers that make a test an integration test (``make test-integration``, which CI runs too)
INTEGRATION_KINDS = ("simulation", "deployment")
#: how a test module applies a marker of an integration test: by its name, in the module
#: (tests/test_architecture.py holds every test module to it)
INTEGRATION_MARK = re.compile(r"\bmark\.(?:integration|" + "|".join(INTEGRATION_KINDS) + r")\b")


def only_integration_selected(config) -> bool:
    """The ``-m`` expression selects integration tests only: ``integration``, alone or in a conjunction
    (``make test-integration``'s ``integration and not slow``)."""
    expr = " ".join((config.getoption("markexpr") or "").split())
    return expr == "integration" or (expr.startswith("integration and ") and " or " not in f" {expr} ")


def pytest_ignore_collect(collection_path, config):
    """A test module that applies no integration marker is not collected when only integration tests
    are selected: it holds none, and every xdist worker would import it (half the CPU a worker spends
    collecting for ``make test-integration``)."""
    if (collection_path.suffix == ".py" and collection_path.name.startswith("test_")
            and only_integration_selected(config)
            and not INTEGRATION_MARK.search(collection_path.read_text(encoding="utf-8"))):
        return True
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """A test that runs Flower's simulation engine or a deployment is an integration test too:
    ``make test`` leaves it out, ``make test-integration`` runs it (selection by ``-m``, which
    reads the markers only after this hook)."""
    for item in items:
        if any(item.get_closest_marker(kind) for kind in INTEGRATION_KINDS):
            item.add_marker(pytest.mark.integration)


def wait_until(condition, what: str, guard_s: float = HANG_GUARD_S, poll_s: float = 0.1) -> None:
    """Return once ``condition()`` holds; fail naming ``what`` if it still does not after ``guard_s``."""
    deadline = time.monotonic() + guard_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {guard_s:g} s")
        time.sleep(poll_s)


def run_labels(party_out: Path) -> Path:
    """The one run's labels.csv a party wrote into its out-dir ``party_out`` (``run-<run id>/``)."""
    found = sorted(Path(party_out).glob("run-*/labels.csv"))
    assert len(found) == 1, f"{party_out}: {len(found)} runs' labels.csv, expected 1"
    return found[0]


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    return tmp_path / "out"


@pytest.fixture(autouse=True)
def _pages_where_looked_at(request, monkeypatch):
    """A run's page costs about a quarter of a second of plotting: a test marked ``shipped_defaults`` sees the
    run-config's defaults as shipped (report=true: its runs write their page, as a user's do); the others,
    which never look at a page, run with report=false unless they set it (a run in another process keeps the
    shipped default). Likewise fedkmeans' graph filter (eight more rounds on a node split): the others run
    with fedkmeans.filter-order=0 unless they set it; tests/test_fedkmeans_boundary.py runs the filter."""
    if request.node.get_closest_marker("shipped_defaults") is None:
        from fedgraphcore.config import Schema

        shipped = Schema.defaults

        def without_pages(schema: Schema) -> dict:
            cheaper = {"report": False, "fedkmeans.filter-order": 0}
            return {**shipped(schema), **{key: value for key, value in cheaper.items() if key in schema.params}}

        monkeypatch.setattr(Schema, "defaults", without_pages)  # every schema, however registry caches them


#: the sections of every run's page, in order (fedgraphcore.report.page.render)
PAGE_SECTIONS = ("The run", "The clusters", "Federated, centralised and the truth", "Rounds",
                 "Privacy ledger: what left each client", "Notes", "Settings")


def check_page(run_dir: Path, figures: int) -> str:
    """The run's report.html beside its result.json: every section in order, ``figures`` images,
    each an inline PNG, no script, no link out of the page, under 5 MB; its text."""
    page = Path(run_dir) / "report.html"
    html = page.read_text(encoding="utf-8")
    found = re.findall(r"<h2>(.*?)</h2>", html)
    assert tuple(h.replace("&#x27;", "'") for h in found) == PAGE_SECTIONS, found
    sources = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert len(sources) == figures and all(s.startswith("data:image/png;base64,") for s in sources), len(sources)
    assert "<script" not in html and page.stat().st_size < 5_000_000
    assert (Path(run_dir) / "report-data.npz").is_file()
    return html


def shared_datasets_or_skip() -> Path:
    if not SHARED_DATASETS.exists():
        pytest.skip(f"shared datasets not found at {SHARED_DATASETS}")
    return SHARED_DATASETS


def closed_port_url() -> str:
    """An http URL on loopback where nothing listens (a port just bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class DatasetMirror:
    """A loopback HTTP server (``http.server`` in a thread) over ``root``, a folder laid out like a
    data root. ``requests``: the paths asked for, in order; ``before_reply(path)``, when given,
    runs in the server's thread before each reply."""

    def __init__(self, root: Path, before_reply=None) -> None:
        self.root, self.requests, self.before_reply = Path(root), [], before_reply
        mirror = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(mirror.root), **kwargs)

            def do_GET(self):
                mirror.requests.append(self.path)
                if mirror.before_reply is not None:
                    mirror.before_reply(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "DatasetMirror":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture(scope="session", autouse=True)
def _no_dataset_downloads(tmp_path_factory):
    """No test downloads a dataset from its publisher or writes the user's cache: a built-in dataset
    no data root holds is fetched from a closed loopback port (one-line error) into a temp cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDGRAPH_DATA_URL", closed_port_url())
        mp.setenv("FEDGRAPH_CACHE_DIR", str(tmp_path_factory.mktemp("dataset-cache")))
        yield


@pytest.fixture(scope="session")
def dataset_mirror(tmp_path_factory):
    """A loopback mirror of ../shared/datasets and a cache folder, empty at first, for the session
    (skips when ../shared/datasets is missing)."""
    with DatasetMirror(shared_datasets_or_skip()) as mirror:
        mirror.cache = tmp_path_factory.mktemp("mirrored-cache")
        yield mirror


@pytest.fixture
def mirrored_datasets(dataset_mirror, tmp_path, monkeypatch):
    """Built-in datasets as on a machine without them: no data root holds any (an empty one set, so
    ../shared/datasets is not found), each fetched on first use from the loopback mirror into the
    session's cache."""
    (tmp_path / "empty-data-root").mkdir()
    monkeypatch.setenv("FEDGRAPH_DATA_ROOT", str(tmp_path / "empty-data-root"))
    monkeypatch.setenv("FEDGRAPH_DATA_URL", dataset_mirror.url)
    monkeypatch.setenv("FEDGRAPH_CACHE_DIR", str(dataset_mirror.cache))
    return dataset_mirror


class LeavingGrid(InProcessGrid):
    """The last node disconnects before the ``leave_at``-th ``action`` round."""

    def __init__(self, *args, leave_at: int, action: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.leave_at, self.action, self.rounds = leave_at, f"query.{action}", 0

    def push_messages(self, messages):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == self.action:
            self.rounds += 1
            if self.rounds == self.leave_at:
                self.dropped.add(max(self.contexts))
        return super().push_messages(messages)


class RestartingGrid(InProcessGrid):
    """The last node's SuperNode goes down before the ``leave_at``-th ``<category>.<action>``
    round and starts again before the ``back_at``-th, with an empty state (its ClientApp state
    died with it) and its node config updated by ``changed_config``."""

    def __init__(self, *args, leave_at: int, back_at: int, action: str, category: str = "query",
                 changed_config=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.leave_at, self.back_at, self.action, self.rounds = leave_at, back_at, f"{category}.{action}", 0
        self.changed_config = dict(changed_config or {})

    def push_messages(self, messages):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == self.action:
            self.rounds += 1
            node = max(self.contexts)
            if self.rounds == self.leave_at:
                self.dropped.add(node)
            if self.rounds == self.back_at:
                old = self.contexts[node]
                self.contexts[node] = Context(run_id=old.run_id, node_id=node, state=RecordDict(), run_config={},
                                              node_config={**old.node_config, **self.changed_config})
                self.dropped.discard(node)
        return super().push_messages(messages)


def patch_reply(monkeypatch, client_cls, action: str, tamper, client: int | None = None) -> None:
    """Make ``client_cls`` answer ``action`` with its honest reply passed through
    ``tamper(shard, arrays, values) -> (arrays, values)``: on partition ``client``
    only, or on every client when ``client`` is None (a misbehaving client)."""
    honest = getattr(client_cls, f"on_{action}")

    def patched(self, arrays, values):
        out, vals = honest(self, arrays, values)
        if client is None or self.shard.client_id == client:
            out, vals = tamper(self.shard, out, vals)
        return out, vals

    monkeypatch.setattr(client_cls, f"on_{action}", patched)


class LateReplyGrid(InProcessGrid):
    """Node ``node`` computes its first ``<category>.<action>`` reply, which then never arrives
    (a reply later than the timeout): the session asks again when ``retries`` > 0."""

    def __init__(self, *args, node: int, action: str, category: str = "query", **kwargs):
        super().__init__(*args, **kwargs)
        self.node, self.action, self.late = node, f"{category}.{action}", []

    def push_messages(self, messages):
        messages = list(messages)
        ids = list(super().push_messages(messages))
        for message_id, message in zip(ids, messages):
            if (message.metadata.message_type == self.action and message.metadata.dst_node_id == self.node
                    and not self.late):
                self.late.append(self._replies.pop(message_id))
        return ids
