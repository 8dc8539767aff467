"""A party's outputs of a run, written where it keeps them: ``<out-dir>/run-<run id>/labels.csv``.

The file is written whole or not at all, and never over another run's: a party's client writes
its items' clusters there at the end of a run (``labels`` step), the server never sees them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from fedgraphcore.config import ConfigError
from fedgraphcore.data.parties import OUT_KEY
from fedgraphcore.files import temporary_file
from fedgraphcore.result import LABELS_CSV, labels_table


#: A party's outputs of one run go to ``<out-dir>/run-<Flower's run id>/``: a later run, whoever
#: started it, writes beside them, never over them.
RUN_DIR_PREFIX = "run-"


def run_dir(out_dir: str | os.PathLike, run_id: Any) -> Path:
    """``out_dir/run-<run_id>``, the directory of one run's outputs; ``run_id`` is Flower's run id,
    a whole number >= 0 written in decimal, so the directory is always a child of ``out_dir``
    (a run id of another type, e.g. text with path characters, is a one-line ConfigError)."""
    return Path(out_dir) / f"{RUN_DIR_PREFIX}{run_number(run_id)}"


def run_number(run_id: Any) -> int:
    """Flower's run id as a whole number >= 0, else a one-line ConfigError (the server hears the rule)."""
    if isinstance(run_id, (bool, np.bool_)) or not isinstance(run_id, (int, np.integer)) or run_id < 0:
        raise ConfigError(f"run id {run_id!r}; valid: Flower's run id, a whole number >= 0",
                          public="run id, rule 'a whole number >= 0'")
    return int(run_id)


def taken(out_dir: str | os.PathLike, run_id: Any) -> Path | None:
    """The labels.csv of run ``run_id`` in ``out_dir`` where one exists already, else None."""
    path = run_dir(out_dir, run_id) / LABELS_CSV
    return path if path.exists() or path.is_symlink() else None


def write_party_labels(out_dir: str | os.PathLike, run_id: Any, keys: np.ndarray, labels: np.ndarray,
                       item: str = "node") -> Path:
    """Write ``out_dir/run-<run_id>/labels.csv`` (:func:`run_dir`): one row ``<item ID>,<cluster>``
    per item, in row order (cluster -1: the method gave this item none, e.g. a node that is no
    k-hop centre). Written to a temporary file in the run's directory and linked to its name, so a
    reader never sees half a file and an existing labels.csv is never replaced: the same labels
    again (a retried labels step) leave it as it is, other labels are a one-line ConfigError."""
    table = labels_table(np.asarray(labels, dtype=np.int64), np.asarray(keys), item)
    out = run_dir(out_dir, run_id)
    out.mkdir(parents=True, exist_ok=True)
    tmp = temporary_file(out, ".csv", lambda f: table.to_csv(f, index=False))
    try:
        return _publish_once(tmp, out / LABELS_CSV)
    finally:
        tmp.unlink(missing_ok=True)


def _publish_once(tmp: Path, path: Path) -> Path:
    """Give ``tmp`` the name ``path`` unless ``path`` exists (hard link: atomic and exclusive; a
    file system without hard links: checked, then renamed). An existing ``path`` that holds the
    same bytes is kept; one that differs is a ConfigError."""
    try:
        os.link(tmp, path)
        return path
    except FileExistsError:
        pass
    except OSError:  # no hard links here: the run's own directory, where only this run writes
        if not (path.exists() or path.is_symlink()):
            os.replace(tmp, path)
            return path
    if path.is_file() and not path.is_symlink() and path.read_bytes() == tmp.read_bytes():
        return path
    raise ConfigError(f"{str(path)!r} exists and holds other labels; valid: one labels.csv per run",
                      public=f"node config '{OUT_KEY}', rule 'one labels.csv per run'")
