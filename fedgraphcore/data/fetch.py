"""The built-in datasets' files, fetched on first use into a user cache and checked against the
SHA-256 written here.

The cache (:func:`cache_dir`: ``$FEDGRAPH_CACHE_DIR``, else the platform's cache folder, e.g.
``$XDG_CACHE_HOME/fedgraph-clustering/datasets`` or ``~/.cache/fedgraph-clustering/datasets``) is
laid out like a data root (``planetoid/Cora/raw/ind.cora.x``, ``tudataset/MUTAG/raw/...``,
``snap/...``, ``agc/wiki.mat``), so the readers take it as one. Each file comes from its
upstream publisher (:data:`UPSTREAM`: the Planetoid repository at a fixed commit, the TU
Dortmund zips PyG downloads, SNAP's gzipped files, the AGC repository at a fixed commit), or,
with ``$FEDGRAPH_DATA_URL`` set, from a mirror laid out like a data root
(``$FEDGRAPH_DATA_URL/planetoid/Cora/raw/ind.cora.x``).

A download goes to a temporary file in the cache folder, is unpacked (gzip, one zip member) to
another, checked against its size and SHA-256, and only then renamed into place: an interrupted
or corrupt download leaves no file under a dataset's name. One process fetches at a time (an
exclusive lock on ``<cache>/.lock`` where the platform has ``fcntl``; elsewhere two fetchers
each rename a complete, verified file). Files already in the cache are checked against their
SHA-256 at every use; one that fails is fetched again. Nothing fetched is executed or unpickled
here: the Planetoid files are read by the restricted unpickler of :mod:`fedgraphcore.data.planetoid`.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from logging import INFO
from pathlib import Path

from fedgraphcore.config import ConfigError

ENV_DATA_ROOT = "FEDGRAPH_DATA_ROOT"
ENV_CACHE_DIR = "FEDGRAPH_CACHE_DIR"
ENV_DATA_URL = "FEDGRAPH_DATA_URL"
#: Seconds a stalled connection is waited on before the download counts as failed.
NET_TIMEOUT_S = 60.0
#: The most bytes one download (a file, a gzip or a zip) may have.
MAX_DOWNLOAD = 256 << 20
CHUNK = 1 << 16
PART_PREFIX = ".fetch-"
#: Seconds between two updates of the progress line on a terminal.
PROGRESS_EVERY_S = 0.2

PLANETOID_COMMIT = "af6abf468a772cc055bec88c52e4d6f51b7c37e3"
AGC_COMMIT = "7425be3b6b9cc2b0adaf65b184f3cbb9beb1af7b"
#: Where each publisher's files are (the URL before a file's upstream name).
UPSTREAM = {
    "planetoid": f"https://raw.githubusercontent.com/kimiyoung/planetoid/{PLANETOID_COMMIT}/data",
    "tu": "https://www.chrsmrrs.com/graphkerneldatasets",
    "snap": "https://snap.stanford.edu/data",
    "agc": f"https://raw.githubusercontent.com/karenlatong/AGC-master/{AGC_COMMIT}",
}


@dataclass(frozen=True)
class DataFile:
    """One file of a built-in dataset: ``path`` under a data root, its ``size`` and ``sha256``, and
    where its publisher has it: ``upstream`` (a key of :data:`UPSTREAM`) and ``name`` there, stored
    as is (``packed=""``), gzipped (``"gzip"``) or as the zip member ``"zip:<member>"``."""

    path: str
    size: int
    sha256: str
    upstream: str
    name: str
    packed: str = ""

    def url(self, mirror: str | None) -> str:
        if mirror:
            return f"{mirror.rstrip('/')}/{self.path}"
        return f"{UPSTREAM[self.upstream]}/{self.name}"


class FetchError(ConfigError):
    """A dataset's files could not be fetched or failed their check (one line naming the URL, the
    cause and how to point at a local copy)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, public="dataset files could not be fetched on the node")


def _planetoid(name: str, folder: str, sums: dict[str, tuple[int, str]]) -> tuple[DataFile, ...]:
    return tuple(DataFile(f"planetoid/{folder}/raw/ind.{name}.{part}", size, sha, "planetoid", f"ind.{name}.{part}")
                 for part, (size, sha) in sums.items())


def _tu(name: str, sums: dict[str, tuple[int, str]]) -> tuple[DataFile, ...]:
    """The data files of a TU zip (not its README: the readers do not use it)."""
    return tuple(DataFile(f"tudataset/{name}/raw/{name}_{part}.txt", size, sha, "tu", f"{name}.zip",
                          f"zip:{name}/{name}_{part}.txt") for part, (size, sha) in sums.items())


#: The files each built-in file dataset reads (pubmed has none here: its files' checksums are not known).
FILES: dict[str, tuple[DataFile, ...]] = {
    "cora": _planetoid("cora", "Cora", {
        "x": (22119, "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab"),
        "tx": (148025, "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a"),
        "allx": (257305, "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543"),
        "y": (4054, "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1"),
        "ty": (28135, "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad"),
        "ally": (47959, "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71"),
        "graph": (59847, "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d"),
        "test.index": (5000, "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875"),
    }),
    "citeseer": _planetoid("citeseer", "CiteSeer", {
        "x": (31087, "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6"),
        "tx": (260321, "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21"),
        "allx": (595021, "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668"),
        "y": (3014, "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924"),
        "ty": (24135, "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce"),
        "ally": (55623, "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95"),
        "graph": (61987, "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7"),
        "test.index": (5000, "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4"),
    }),
    "mutag": _tu("MUTAG", {
        "A": (76940, "d9656ca7493f3445d737c711710bb36fd432dddd1c0ea32e1d4713c86ebd28e2"),
        "edge_labels": (14884, "4669ce755075ff86c3240709345745886400908fa637a49310459b9c267b3e56"),
        "graph_indicator": (11532, "7d520a4d6c7961c0cdeabe076d8fe27e795b6d373485c9a2b744987e560a2056"),
        "graph_labels": (439, "a1518ea39ba3426bd42f57396b9c4baffe68e9adc718caeeab0119c6591a5f2c"),
        "node_labels": (6742, "678f429965490e84dd27713017538c995fc05d1621beac910848b600015ee863"),
    }),
    "proteins": _tu("PROTEINS", {
        "A": (2022990, "4c4b33e272fc95cac6d27ed6d5d12b9a852c8610e91fff59f8f0dbdd5a20df67"),
        "graph_indicator": (169673, "8d4ff1e852a5c28561e9bffb44cf9490bc552b13a3b6156dd12dc7f44e9afc4a"),
        "graph_labels": (2226, "c0ef9810c440775252872318d0c8adc385588e14bc4c47a2c34aa96ee3c7cdcd"),
        "node_attributes": (478190, "54eef829abb37e458a5fbf3a3c581e48e5810e220463c2cd951856b9ceb08f07"),
        "node_labels": (86942, "f758e8ad3d6e3c026b50833d75f6f90735b94eb3345e4243707f495ca8afea8d"),
    }),
    "imdb-binary": _tu("IMDB-BINARY", {
        "A": (4596012, "23c8964bab82f81469271186d721131714a265d0ca8c44ae048118da1d0c4092"),
        "graph_indicator": (76924, "415cc3ba25b8c647dcf34d3de034f675ee070616f3b803be939cb26773489f26"),
        "graph_labels": (2000, "63a44411fd6342b9c4429828c16e144a2a11ef5244e25bb60f0ffa8b3ee2ffce"),
    }),
    "email-eu-core": (
        DataFile("snap/email-Eu-core/raw/email-Eu-core.txt", 192698,
                 "23e0ca0bce21a053025e78f7e9691ac9210ae806a0689bd5edff3c3bac572d4c", "snap", "email-Eu-core.txt.gz",
                 "gzip"),
        DataFile("snap/email-Eu-core/raw/email-Eu-core-department-labels.txt", 6537,
                 "91a089f21ee35eb224066456fa5322c8ad57c0f07b2da7a58a3220c72b5d54b5", "snap",
                 "email-Eu-core-department-labels.txt.gz", "gzip"),
    ),
    "ego-facebook": (
        DataFile("snap/ego-Facebook/facebook_combined.txt", 854362,
                 "f41c026ed8af3cc3359f1ca5573d0605fb09ae0eefa34544b820fd8c6e2ef296", "snap",
                 "facebook_combined.txt.gz", "gzip"),
    ),
    "wiki": (
        DataFile("agc/wiki.mat", 4073106, "1b59b0b19cbf398bbc5c1c940f3c262300bcd56dae04890094666f9d220533b3", "agc",
                 "wiki.mat"),
    ),
}


def cache_dir() -> Path:
    """``$FEDGRAPH_CACHE_DIR``, else ``fedgraph-clustering/datasets`` in the platform's cache folder
    (``$XDG_CACHE_HOME`` or ``~/.cache``; ``~/Library/Caches`` on macOS; ``%LOCALAPPDATA%`` on Windows)."""
    env = os.environ.get(ENV_CACHE_DIR, "")
    if env:
        return Path(env).expanduser().resolve()
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or "~/AppData/Local"
    elif sys.platform == "darwin":
        base = "~/Library/Caches"
    else:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        base = xdg if os.path.isabs(xdg) else "~/.cache"
    return Path(base).expanduser() / "fedgraph-clustering" / "datasets"


def mirror_url() -> str | None:
    """``$FEDGRAPH_DATA_URL`` (an http, https or file URL), None when unset; anything else a one-line ConfigError."""
    url = os.environ.get(ENV_DATA_URL, "").strip()
    if not url:
        return None
    if url.split(":", 1)[0].lower() not in ("http", "https", "file") or ":" not in url:
        raise ConfigError(f"invalid value {url!r} for ${ENV_DATA_URL}; valid: an http://, https:// or file:// URL of a "
                          "folder laid out like a data root")
    return url


def fetch(dataset: str, searched: Path | None = None) -> Path:
    """The cache folder holding every file of ``dataset`` (a key of :data:`FILES`), after fetching the
    ones it lacks or holds corrupt. ``searched``: the data root that did not hold them, for the
    error message. Raises :class:`FetchError` (one line) when a file cannot be fetched or fails its check."""
    cache = cache_dir()
    if not _stale(cache, FILES[dataset]):
        return cache
    mirror = mirror_url()
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _cache_lock(cache):
        stale = _stale(cache, FILES[dataset])
        for url in dict.fromkeys(f.url(mirror) for f in stale):
            _fetch_url(dataset, url, [f for f in stale if f.url(mirror) == url], cache, mirror, searched)
    if stale:
        _log(f"dataset '{dataset}': {len(stale)} file(s), {_mb(sum(f.size for f in stale))}, checked against their "
             f"SHA-256 and kept in {cache}")
    return cache


def _stale(cache: Path, files: tuple[DataFile, ...]) -> list[DataFile]:
    """The files not in ``cache`` with their size and SHA-256."""
    return [f for f in files if not (cache / f.path).is_file() or _digest_error(cache / f.path, f) is not None]


def _digest_error(path: Path, f: DataFile) -> str | None:
    """Why ``path`` is not ``f`` (its size or SHA-256), None when it is."""
    size = path.stat().st_size
    if size != f.size:
        return f"{size} bytes, expected {f.size}"
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    got = digest.hexdigest()
    return None if got == f.sha256 else f"SHA-256 {got[:16]}..., expected {f.sha256[:16]}..."


@contextmanager
def _cache_lock(cache: Path):
    """Hold the cache's exclusive lock (where the platform has ``fcntl``); under it, no other fetch
    runs, so partial files are leftovers of a fetch that was killed and are removed."""
    try:
        import fcntl
    except ImportError:  # no advisory locks: each fetcher renames only complete, verified files
        yield
        return
    with open(cache / ".lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            for leftover in cache.glob(f"{PART_PREFIX}*"):
                leftover.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_url(dataset: str, url: str, files: list[DataFile], cache: Path, mirror: str | None,
               searched: Path | None) -> None:
    """Download ``url`` once and put each of ``files`` it holds into ``cache``, verified."""
    download = _download(dataset, url, cache, mirror, searched)
    try:
        for f in files:
            unpacked = download if mirror or not f.packed else \
                _unpack(dataset, url, download, f, cache, _local_copy(mirror, searched))
            try:
                problem = _digest_error(unpacked, f)
                if problem is not None:
                    raise FetchError(f"dataset '{dataset}': {url} does not hold the published {f.path} ({problem}); "
                                     f"refused, not written into {cache}; valid: {_local_copy(mirror, searched)}")
                target = cache / f.path
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(unpacked, target)
            finally:
                if unpacked != download:
                    unpacked.unlink(missing_ok=True)
    finally:
        download.unlink(missing_ok=True)


def _local_copy(mirror: str | None, searched: Path | None) -> str:
    """How to point at a local copy instead (the tail of a fetch error)."""
    where = f" (searched: {searched})" if searched is not None else ""
    source = f"a working ${ENV_DATA_URL} (it is {mirror})" if mirror else \
        f"${ENV_DATA_URL}=<URL of a mirror laid out like a data root>"
    return (f"${ENV_DATA_ROOT} or run-config 'data-root' naming a folder that holds the files{where}, "
            f"or {source}")


def _part(cache: Path) -> Path:
    handle, name = tempfile.mkstemp(dir=cache, prefix=PART_PREFIX, suffix=".part")
    os.close(handle)
    return Path(name)


def _download(dataset: str, url: str, cache: Path, mirror: str | None, searched: Path | None) -> Path:
    """``url`` in a new partial file in ``cache`` (removed again if the download fails)."""
    part = _part(cache)
    try:
        with urllib.request.urlopen(url, timeout=NET_TIMEOUT_S) as response, open(part, "wb") as out:
            total = response.headers.get("Content-Length")
            _copy(response, out, MAX_DOWNLOAD, Progress(url, int(total) if total and total.isdigit() else None))
    except (OSError, ValueError, http.client.HTTPException) as err:
        part.unlink(missing_ok=True)
        raise FetchError(f"dataset '{dataset}': could not download {url} ({_cause(err)}); "
                         f"valid: {_local_copy(mirror, searched)}") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return part


def _cause(err: BaseException) -> str:
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {err.reason}"
    if isinstance(err, urllib.error.URLError):
        return str(err.reason)
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def _unpack(dataset: str, url: str, download: Path, f: DataFile, cache: Path, valid: str) -> Path:
    """``f`` out of the gzip or zip ``download``, in a new partial file (at most one byte past its size);
    ``valid``: the error's tail (:func:`_local_copy`)."""
    part = _part(cache)
    try:
        if f.packed == "gzip":
            with gzip.open(download) as source, open(part, "wb") as out:
                _copy(source, out, f.size + 1)
        else:
            member = f.packed.removeprefix("zip:")
            with zipfile.ZipFile(download) as archive, archive.open(member) as source, open(part, "wb") as out:
                _copy(source, out, f.size + 1)
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile, zlib.error) as err:
        part.unlink(missing_ok=True)
        raise FetchError(f"dataset '{dataset}': {url} is not the published archive holding {f.path} "
                         f"({type(err).__name__}: {err}); refused, not written into {cache}; valid: {valid}") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return part


def _copy(source, out, limit: int, progress: "Progress | None" = None) -> None:
    """Copy ``source`` to ``out`` in chunks, stopping once more than ``limit`` bytes came."""
    done = 0
    while chunk := source.read(CHUNK):
        done += len(chunk)
        if done > limit:
            raise ValueError(f"more than {limit} bytes")
        out.write(chunk)
        if progress is not None:
            progress.update(done)
    if progress is not None:
        progress.end(done)


class Progress:
    """A download's progress: one line updated in place on a terminal (stderr); elsewhere a log
    line when it starts (:func:`fetch` logs one more when a dataset's files are in place)."""

    def __init__(self, url: str, total: int | None) -> None:
        self.url, self.total, self.shown, self.width = url, total, 0.0, 0
        self.terminal = sys.stderr.isatty()
        if not self.terminal:
            _log(f"downloading {url}" + (f" ({_mb(total)})" if total else ""))

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self.terminal and now - self.shown >= PROGRESS_EVERY_S:
            self.shown = now
            of = f" / {_mb(self.total)}" if self.total else ""
            self._show(f"downloading {self.url}: {_mb(done)}{of}")

    def end(self, done: int) -> None:
        if self.terminal:
            self._show(f"downloading {self.url}: {_mb(done)}, done")
            sys.stderr.write("\n")

    def _show(self, text: str) -> None:
        """``text`` over the line shown before (padded to its width)."""
        sys.stderr.write(f"\r{text:<{self.width}}")
        sys.stderr.flush()
        self.width = len(text)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def _log(message: str) -> None:
    from flwr.common.logger import log

    log(INFO, message)

