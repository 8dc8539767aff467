"""Assemble, write and summarise ``result.json``.

Stable top-level keys (other tools read them): ``strategy``, ``dataset``,
``num_clients``, ``config``, ``metrics``, ``reference``, ``timing``,
``communication``, ``privacy``; plus ``history`` (per-round records) and
``rejected`` (client replies the transport refused).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

RESULT_FILE = "result.json"
LABELS_FILE = "labels.npy"


def default_out_dir(strategy: str, dataset: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("results") / f"{strategy}-{dataset}-{stamp}"


def file_in_the_way(directory: Path) -> Path | None:
    """The first existing path that is a file, on the way to (and including) ``directory``:
    the directory cannot be created or written into while there is one."""
    return next((p for p in (directory, *directory.parents) if p.exists() and not p.is_dir()), None)


def jsonable(value):
    """``value`` with numpy arrays/scalars, paths and non-finite floats made JSON-safe."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if isinstance(value, Path):
        return str(value)
    return value


def write_result(result: dict, out_dir: str | Path, labels: np.ndarray | None = None) -> Path:
    """Write ``out_dir/result.json`` (and ``labels.npy``) atomically.

    The JSON is written last, via a temporary file and a rename, so a
    ``result.json`` on disk always belongs to a finished run.
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if labels is not None:
        np.save(out / LABELS_FILE, np.asarray(labels))
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".result-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(jsonable(result), f, indent=2)
            f.write("\n")
        os.replace(tmp, out / RESULT_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out / RESULT_FILE


def summary_table(result: dict) -> str:
    """A short plain-text table: federated vs centralised metrics, cost."""
    metrics = result.get("metrics", {})
    reference = result.get("reference", {}) or {}
    names = [k for k in ("acc", "f1", "nmi", "ari", "modularity", "conductance", "cluster_similarity") if k in metrics]
    lines = [
        f"{result['strategy']} on {result['dataset']} with {result['num_clients']} clients",
        f"{'metric':<20}{'federated':>12}{'centralised':>14}",
    ]
    for name in names:
        ref = reference.get(name)
        ref_s = f"{ref:>14.4f}" if isinstance(ref, (int, float)) else f"{'-':>14}"
        lines.append(f"{name:<20}{metrics[name]:>12.4f}{ref_s}")
    for name, value in (reference.get("agreement") or {}).items():
        lines.append(f"{'agreement ' + name:<20}{value:>12.4f}")
    t, c = result["timing"], result["communication"]
    lines.append(
        f"protocol {t['protocol_s']:.3f} s in {t['rounds']} rounds; "
        f"{c['bytes_down'] / 1e6:.3f} MB down, {c['bytes_up'] / 1e6:.3f} MB up, "
        f"{c['messages']} messages, {c['secure_aggregations']} secure aggregations"
    )
    privacy = result.get("privacy", {})
    if privacy.get("epsilon") is not None:
        lines.append(f"privacy: epsilon={privacy['epsilon']:.4g}, delta={privacy.get('delta')}")
    return "\n".join(lines)
