"""Built-in datasets fetched on first use: from a loopback mirror of ../shared/datasets (or a
loopback server shaped like the publishers) into an empty cache, checked against their SHA-256."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from fedgraphcore.config import ConfigError
from fedgraphcore.data import DatasetNotFound, load_dataset
from fedgraphcore.data import fetch
from fedgraphcore.data.fetch import FILES, FetchError
from fedgraphcore.data.fingerprint import data_hash
from tests.conftest import REPO, DatasetMirror, closed_port_url, shared_datasets_or_skip, wait_until


@pytest.fixture
def shared() -> Path:
    return shared_datasets_or_skip()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache, and an empty data root set (so ../shared/datasets is not found)."""
    (tmp_path / "empty-root").mkdir()
    monkeypatch.setenv("FEDGRAPH_DATA_ROOT", str(tmp_path / "empty-root"))
    monkeypatch.setenv("FEDGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@contextmanager
def serving(root: Path, monkeypatch, before_reply=None):
    """A loopback mirror of ``root`` named by $FEDGRAPH_DATA_URL."""
    with DatasetMirror(root, before_reply) as mirror:
        monkeypatch.setenv("FEDGRAPH_DATA_URL", mirror.url)
        yield mirror


def cached_files(cache: Path) -> list[str]:
    """Every file in the cache but its lock."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file() and p.name != ".lock")


def paths(name: str) -> list[str]:
    return [f.path for f in FILES[name]]


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_dataset_fetched_into_an_empty_cache_loads_as_the_one_read_from_the_data_root(name, shared, cache,
                                                                                         monkeypatch):
    with serving(shared, monkeypatch) as mirror:
        fetched = load_dataset(name)
    assert data_hash(fetched) == data_hash(load_dataset(name, data_root=shared))
    assert sorted(mirror.requests) == sorted(f"/{p}" for p in paths(name))  # each file once, nothing else
    assert cached_files(cache) == sorted(paths(name))  # laid out as the data root, no partial file left
    for p in paths(name):
        assert (cache / p).read_bytes() == (shared / p).read_bytes()


def test_a_second_load_reads_the_cache_without_a_request_and_a_damaged_cached_file_is_fetched_again(
        shared, cache, monkeypatch):
    with serving(shared, monkeypatch) as mirror:
        first = data_hash(load_dataset("cora"))
        assert len(mirror.requests) == len(FILES["cora"])
        assert data_hash(load_dataset("cora")) == first
        assert len(mirror.requests) == len(FILES["cora"])
        (cache / "planetoid/Cora/raw/ind.cora.y").write_bytes(b"not the labels")
        assert data_hash(load_dataset("cora")) == first
    assert mirror.requests[len(FILES["cora"]):] == ["/planetoid/Cora/raw/ind.cora.y"]


@pytest.mark.parametrize("damage, problem", [
    (lambda b: bytes([b[0] ^ 1]) + b[1:], "SHA-256 "),
    (lambda b: b[:-10], "22109 bytes, expected 22119"),
])
def test_a_corrupt_mirror_file_is_refused_in_one_line_and_nothing_is_cached(damage, problem, shared, cache,
                                                                             monkeypatch, tmp_path):
    bad = tmp_path / "bad-mirror"
    shutil.copytree(shared / "planetoid" / "Cora", bad / "planetoid" / "Cora")
    x = bad / "planetoid/Cora/raw/ind.cora.x"  # the first file fetched
    x.write_bytes(damage(x.read_bytes()))
    with serving(bad, monkeypatch) as mirror, pytest.raises(FetchError) as err:
        load_dataset("cora")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"dataset 'cora': {mirror.url}/planetoid/Cora/raw/ind.cora.x does not hold the "
                              f"published planetoid/Cora/raw/ind.cora.x ({problem}")
    assert f"refused, not written into {cache}" in message
    assert cached_files(cache) == []


def test_an_unreachable_mirror_is_one_line_naming_the_url_the_cause_and_a_local_copy(cache, monkeypatch, tmp_path):
    url = closed_port_url()
    monkeypatch.setenv("FEDGRAPH_DATA_URL", url)
    with pytest.raises(FetchError) as err:
        load_dataset("wiki")
    assert str(err.value) == (
        f"dataset 'wiki': could not download {url}/agc/wiki.mat ([Errno 111] Connection refused); valid: "
        f"$FEDGRAPH_DATA_ROOT or run-config 'data-root' naming a folder that holds the files (searched: "
        f"{tmp_path / 'empty-root'}), or a working $FEDGRAPH_DATA_URL (it is {url})")
    assert cached_files(cache) == []


def test_the_cli_reports_a_failed_download_in_one_line(cache, tmp_path):
    url = closed_port_url()
    env = {**os.environ, "FEDGRAPH_DATA_URL": url}
    done = subprocess.run([sys.executable, "-m", "app.run", "--engine", "inprocess", "--strategy", "fedspectral",
                           "--dataset", "ego-facebook", "--num-clients", "2", "--set", "num-clusters=3",
                           "--out", str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if url in line]
    assert len(lines) == 1 and f"could not download {url}/snap/ego-Facebook/facebook_combined.txt" in lines[0]
    assert "Traceback" not in done.stderr


def test_a_download_interrupted_midway_leaves_nothing_and_the_next_load_completes(shared, cache, monkeypatch):
    def interrupt(self, done):
        raise KeyboardInterrupt

    with serving(shared, monkeypatch):
        with monkeypatch.context() as m:
            m.setattr(fetch.Progress, "update", interrupt)
            with pytest.raises(KeyboardInterrupt):
                load_dataset("wiki")
        assert cached_files(cache) == []
        assert load_dataset("wiki").num_nodes == 2405
    assert cached_files(cache) == ["agc/wiki.mat"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_one_line_in_place_on_a_terminal_and_log_lines_elsewhere(shared, cache, monkeypatch, caplog):
    with serving(shared, monkeypatch) as mirror:
        with monkeypatch.context() as m:
            m.setattr(sys, "stderr", Terminal())
            load_dataset("ego-facebook")
            shown = sys.stderr.getvalue()
        url = f"{mirror.url}/snap/ego-Facebook/facebook_combined.txt"
        assert shown.startswith(f"\rdownloading {url}: ") and shown.endswith("\n") and shown.count("\n") == 1
        assert shown.split("\r")[-1].rstrip() == f"downloading {url}: 0.9 MB, done"  # padded over the longer line
        caplog.clear()
        with caplog.at_level("INFO", logger="flwr"):
            load_dataset("wiki")
    assert [r.getMessage() for r in caplog.records] == [
        f"downloading {mirror.url}/agc/wiki.mat (4.1 MB)",
        f"dataset 'wiki': 1 file(s), 4.1 MB, checked against their SHA-256 and kept in {cache}"]


def test_a_download_over_its_limit_is_refused(shared, cache, monkeypatch):
    monkeypatch.setattr(fetch, "MAX_DOWNLOAD", 1000)
    with serving(shared, monkeypatch), pytest.raises(FetchError, match=r"/agc/wiki\.mat \(ValueError: more than "
                                                                         r"1000 bytes\); valid: "):
        load_dataset("wiki")
    assert cached_files(cache) == []


def _concurrent_loads(shared, monkeypatch, fetchers: int, locks: bool) -> tuple[DatasetMirror, list[str]]:
    """``fetchers`` threads load cora at once into one empty cache: the mirror holds its replies
    until every one of them has seen the files missing and reached the cache lock (``locks``) or,
    with no lock to wait on, has listed the files it is to download."""
    arrived = set()
    real_lock, real_fetch_url = fetch._cache_lock, fetch._fetch_url

    @contextmanager
    def counted_lock(cache_dir):
        arrived.add(threading.current_thread().name)
        with real_lock(cache_dir):
            yield

    def counted_fetch_url(*args):
        arrived.add(threading.current_thread().name)
        return real_fetch_url(*args)

    def hold_replies(path):
        # every reply waits (not only the first request's: two requests can arrive before either is
        # checked), so no file is in the cache before each fetcher has listed the ones it lacks
        wait_until(lambda: len(arrived) == fetchers, "every fetcher about to download")

    if locks:
        monkeypatch.setattr(fetch, "_cache_lock", counted_lock)
    else:
        monkeypatch.setitem(sys.modules, "fcntl", None)  # a platform without advisory locks
        monkeypatch.setattr(fetch, "_fetch_url", counted_fetch_url)
    with serving(shared, monkeypatch, hold_replies) as mirror, ThreadPoolExecutor(fetchers) as pool:
        hashes = [f.result() for f in [pool.submit(lambda: data_hash(load_dataset("cora"))) for _ in range(fetchers)]]
    return mirror, hashes


def test_concurrent_fetches_wait_for_one_download_and_agree(shared, cache, monkeypatch):
    mirror, hashes = _concurrent_loads(shared, monkeypatch, 3, locks=True)
    assert set(hashes) == {data_hash(load_dataset("cora", data_root=shared))}
    assert sorted(mirror.requests) == sorted(f"/{p}" for p in paths("cora"))  # one download of each file
    assert cached_files(cache) == sorted(paths("cora"))


def test_concurrent_fetches_without_file_locks_each_rename_whole_verified_files(shared, cache, monkeypatch):
    mirror, hashes = _concurrent_loads(shared, monkeypatch, 3, locks=False)
    assert set(hashes) == {data_hash(load_dataset("cora", data_root=shared))}
    assert len(mirror.requests) == 3 * len(FILES["cora"])  # each downloaded its own copy
    assert cached_files(cache) == sorted(paths("cora"))
    for p in paths("cora"):
        assert (cache / p).read_bytes() == (shared / p).read_bytes()


# ----------------------------------------------------------------------------- the publishers' shapes


@pytest.fixture
def upstream(shared, cache, monkeypatch, tmp_path):
    """A loopback server shaped like the publishers (Planetoid's raw files, a TU zip, SNAP's gzips,
    the AGC file), named in :data:`fedgraphcore.data.fetch.UPSTREAM`; no mirror set."""
    site = tmp_path / "site"
    shutil.copytree(shared / "planetoid" / "Cora" / "raw", site / "planetoid")
    (site / "tu").mkdir()
    with zipfile.ZipFile(site / "tu" / "MUTAG.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for f in sorted((shared / "tudataset" / "MUTAG" / "raw").iterdir()):
            archive.write(f, f"MUTAG/{f.name}")
    (site / "snap").mkdir()
    for f in paths("email-eu-core"):
        (site / "snap" / f"{Path(f).name}.gz").write_bytes(gzip.compress((shared / f).read_bytes()))
    monkeypatch.delenv("FEDGRAPH_DATA_URL")
    with DatasetMirror(site) as server:
        monkeypatch.setattr(fetch, "UPSTREAM", {key: f"{server.url}/{key}" for key in fetch.UPSTREAM})
        yield server


@pytest.mark.parametrize("name", ["cora", "mutag", "email-eu-core"])
def test_a_dataset_from_its_publishers_files_loads_as_the_one_read_from_the_data_root(name, upstream, shared, cache):
    assert data_hash(load_dataset(name)) == data_hash(load_dataset(name, data_root=shared))
    assert cached_files(cache) == sorted(paths(name))
    if name == "mutag":
        assert upstream.requests == ["/tu/MUTAG.zip"]  # one archive for all its files


def test_an_archive_without_a_file_is_refused_in_one_line(upstream, cache):
    path = upstream.root / "tu" / "MUTAG.zip"
    with zipfile.ZipFile(path) as archive:
        kept = {n: archive.read(n) for n in archive.namelist() if not n.endswith("_node_labels.txt")}
    with zipfile.ZipFile(path, "w") as archive:
        for member, content in kept.items():
            archive.writestr(member, content)
    with pytest.raises(FetchError) as err:
        load_dataset("mutag")
    assert str(err.value) == (f"dataset 'mutag': {upstream.url}/tu/MUTAG.zip is not the published archive holding "
                              "tudataset/MUTAG/raw/MUTAG_node_labels.txt (KeyError: \"There is no item named "
                              "'MUTAG/MUTAG_node_labels.txt' in the archive\"); refused, not written into "
                              f"{cache}; valid: $FEDGRAPH_DATA_ROOT or run-config 'data-root' naming a folder that "
                              f"holds the files (searched: {cache.parent / 'empty-root'}), or $FEDGRAPH_DATA_URL=<URL "
                              "of a mirror laid out like a data root>")
    assert "tudataset/MUTAG/raw/MUTAG_node_labels.txt" not in cached_files(cache)


def test_a_gzip_that_unpacks_past_the_files_size_is_cut_off_and_refused(upstream, cache):
    bomb = upstream.root / "snap" / "email-Eu-core.txt.gz"
    bomb.write_bytes(gzip.compress(b"0 1\n" * 10_000_000))  # 40 MB from 40 kB
    with pytest.raises(FetchError, match=r"email-Eu-core\.txt\.gz is not the published archive holding "
                                         r"snap/email-Eu-core/raw/email-Eu-core\.txt \(ValueError: more than 192699 "):
        load_dataset("email-eu-core")
    assert cached_files(cache) == []


# ----------------------------------------------------------------------------- where files come from


def test_a_data_root_holding_part_of_a_dataset_is_not_completed_by_a_download(cache, tmp_path, monkeypatch):
    root = tmp_path / "mine"
    (root / "snap/email-Eu-core/raw").mkdir(parents=True)
    (root / "snap/email-Eu-core/raw/email-Eu-core-department-labels.txt").write_text("0 1\n")
    with pytest.raises(DatasetNotFound, match=f"^dataset 'email-eu-core': missing {root}/snap/email-Eu-core/raw/"
                                              "email-Eu-core.txt; expected layout "):
        load_dataset("email-eu-core", data_root=root)


@pytest.mark.parametrize("value", ["mirror.example.org/datasets", "ftp://mirror.example.org"])
def test_a_mirror_url_that_is_not_http_or_file_is_refused(value, cache, monkeypatch):
    monkeypatch.setenv("FEDGRAPH_DATA_URL", value)
    with pytest.raises(ConfigError) as err:
        load_dataset("cora")
    assert str(err.value) == (f"invalid value {value!r} for $FEDGRAPH_DATA_URL; valid: an http://, https:// or "
                              "file:// URL of a folder laid out like a data root")


def test_a_file_url_mirror_serves_the_files(shared, cache, monkeypatch):
    monkeypatch.setenv("FEDGRAPH_DATA_URL", shared.as_uri())
    assert data_hash(load_dataset("mutag")) == data_hash(load_dataset("mutag", data_root=shared))


def test_the_cache_folder_follows_the_platform_and_its_override(monkeypatch, tmp_path):
    monkeypatch.delenv("FEDGRAPH_CACHE_DIR")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert fetch.cache_dir() == tmp_path / "xdg" / "fedgraph-clustering" / "datasets"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert fetch.cache_dir() == Path.home() / ".cache" / "fedgraph-clustering" / "datasets"
    monkeypatch.setenv("FEDGRAPH_CACHE_DIR", str(tmp_path / "mine"))
    assert fetch.cache_dir() == tmp_path / "mine"


def test_pubmed_without_a_data_root_is_one_line_and_not_downloaded(cache, monkeypatch):
    monkeypatch.delenv("FEDGRAPH_DATA_ROOT")
    monkeypatch.setattr("fedgraphcore.data.datasets.REPO_ROOT", cache / "nowhere" / "repo")
    with pytest.raises(DatasetNotFound) as err:
        load_dataset("pubmed")
    assert str(err.value) == ("dataset 'pubmed' needs a data root: set run-config 'data-root' or $FEDGRAPH_DATA_ROOT "
                              "to a folder holding its files (it is not downloaded: their checksums are not recorded)")
