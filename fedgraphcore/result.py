"""Assemble, write and summarise ``result.json``.

Stable top-level keys (other tools read them): ``strategy``, ``dataset``,
``num_clients``, ``config``, ``metrics``, ``reference``, ``timing``,
``communication``, ``privacy``; plus ``history`` (per-round records),
``rejected`` (client replies the transport refused) and ``notes`` (what the
data reader repaired or found, e.g. self-loops dropped). Beside it,
``labels.npy`` (the cluster of every item, in row order), ``reference_labels.npy``
(the centralised method's, where it ran) and ``labels.csv`` (the same with the
user's node or graph IDs: columns ``node,cluster[,centralised]`` or
``graph,cluster[,centralised]``; -1 where no client returned a label), and the
run's page ``report.html`` (:mod:`fedgraphcore.report`).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import numpy as np

from fedgraphcore.config import ConfigError
from fedgraphcore.data import memory
from fedgraphcore.files import temporary_file, unwritable

RESULT_FILE = "result.json"
LABELS_FILE = "labels.npy"
LABELS_CSV = "labels.csv"
REFERENCE_LABELS_FILE = "reference_labels.npy"
REPORT_FILE = "report.html"  # the run's page (fedgraphcore.report)


def default_out_dir(strategy: str, dataset: str) -> Path:
    """A new directory ``results/<strategy>-<dataset>-<time>``, created here (see :func:`new_dir`)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return new_dir(Path("results") / f"{strategy}-{dataset}-{stamp}")


def new_dir(path: Path) -> Path:
    """Create ``path``, or ``path-2``, ``path-3``, ... when taken, and return it: runs started in
    the same second would otherwise share a default directory; creating it claims it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        candidate = path if n == 1 else path.with_name(f"{path.name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue


def check_out_dir(out: Path) -> None:
    """``out`` can hold the result: checked when a run starts, which would otherwise be lost at its end."""
    if (out / RESULT_FILE).exists():
        raise ConfigError(f"out-dir {str(out)!r} already holds a {RESULT_FILE}; valid: a new or empty directory")
    problem = unwritable(out)
    if problem is not None:
        raise ConfigError(f"out-dir: {problem}; valid: a writable directory for {RESULT_FILE}")


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


def write_result(result: dict, out_dir: str | Path, labels: np.ndarray | None = None,
                 keys: np.ndarray | None = None, key_column: str = "node", reference: np.ndarray | None = None) -> Path:
    """Write ``out_dir/result.json`` (and ``labels.npy`` and ``labels.csv``; with ``reference``, the
    centralised method's labels, ``reference_labels.npy`` too); never replace a result.json.

    ``labels.csv`` pairs each label with its item's ID: ``keys`` (the user's node or graph IDs,
    default ``0..len(labels)-1``) in a column named ``key_column``, and the centralised label in
    column ``centralised`` (with ``reference``), so the two compare item by item. Every file is written to a
    temporary file first and the JSON is put in place first, by a hard link that fails if the
    name is taken, so a ``result.json`` on disk always belongs to a finished run and a run never
    overwrites another's. If another run's result.json is there (one that appeared while this run
    ran), this run's files go to a new directory next to ``out_dir`` (see :func:`new_dir`) and a
    ConfigError names both.
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    text = (json.dumps(jsonable(result), indent=2) + "\n").encode()
    files = {RESULT_FILE: temporary_file(out, ".json", lambda f: f.write(text))}
    try:
        if labels is not None:
            files[LABELS_FILE] = temporary_file(out, ".npy", lambda f: np.save(f, np.asarray(labels)))
            table = labels_table(labels, keys, key_column)
            if reference is not None:
                files[REFERENCE_LABELS_FILE] = temporary_file(out, ".npy", lambda f: np.save(f, np.asarray(reference)))
                table["centralised"] = np.asarray(reference)
            files[LABELS_CSV] = temporary_file(out, ".csv", lambda f: table.to_csv(f, index=False))
        if _publish(files, out):
            return out / RESULT_FILE
        kept = new_dir(out)
        _publish(files, kept)
    finally:
        for tmp in files.values():
            tmp.unlink(missing_ok=True)
    raise ConfigError(f"out-dir {str(out)!r} already holds another run's {RESULT_FILE}; this run's result is in "
                      f"{str(kept / RESULT_FILE)!r} instead; valid: a new or empty out-dir for each run")


def labels_table(labels: np.ndarray, keys: np.ndarray | None = None, key_column: str = "node"):
    """A DataFrame of ``key_column`` (``keys``, default ``0..len-1``) and ``cluster`` (``labels``)."""
    import pandas as pd

    labels = np.asarray(labels)
    keys = np.arange(len(labels), dtype=np.int64) if keys is None else np.asarray(keys)
    if len(keys) != len(labels):
        raise ValueError(f"{len(keys)} IDs for {len(labels)} labels")
    return pd.DataFrame({key_column: keys, "cluster": labels})


def _publish(files: dict[str, Path], directory: Path) -> bool:
    """Give the temporary ``files`` their names in ``directory``, result.json first and only
    if it is not taken (False then); the labels files follow, so they are never another run's."""
    try:
        os.link(files[RESULT_FILE], directory / RESULT_FILE)
    except FileExistsError:
        return False
    for name in (LABELS_FILE, REFERENCE_LABELS_FILE, LABELS_CSV):
        if name in files:
            os.replace(files[name], directory / name)
    return True


#: the quality metrics of the summary: against the ground truth, else of the graph
LABEL_METRICS, GRAPH_METRICS = ("acc", "f1", "nmi", "ari"), ("modularity", "conductance")


def summary_table(result: dict) -> str:
    """A short plain-text summary a reader cannot misread: the clustering's quality (against the
    ground truth, else the graph's modularity and conductance) federated beside centralised, the
    agreement of the two clusterings, the verdict with what it compares (see :mod:`fedgraphcore.quality`),
    the paper's figure, cost and what the privacy guarantee covers. A section with nothing to
    show is left out."""
    dataset = result.get("dataset_name") or memory.described(str(result["dataset"]))
    partitioner = (result.get("config") or {}).get("partitioner")
    lines = [f"{result['strategy']} on {dataset} with {result['num_clients']} clients"
             + (f" (split '{partitioner}')" if partitioner else "")]
    lines += _metric_lines(result.get("metrics", {}), result.get("reference") or {})
    lines += _quality_lines(result)
    t, c = result["timing"], result["communication"]
    lines.append(
        f"protocol {t['protocol_s']:.3f} s in {t['rounds']} rounds; "
        f"{c['bytes_down'] / 1e6:.3f} MB down, {c['bytes_up'] / 1e6:.3f} MB up, "
        f"{c['messages']} messages, {c['secure_aggregations']} secure aggregations"
    )
    lines += privacy_lines(result.get("privacy", {}))
    return "\n".join(lines)


def _metric_lines(metrics: dict, reference: dict) -> list[str]:
    """The quality table (federated, centralised) and the agreement table, each only when it has rows."""
    names = [k for k in LABEL_METRICS if k in metrics]
    what = "quality against the ground truth"
    if not names:
        names, what = [k for k in GRAPH_METRICS if k in metrics], "quality of the graph's cut (no ground truth)"
    lines = []
    if names:
        lines.append(f"{what:<34}{'federated':>10}{'centralised':>13}")
        for name in names + [k for k in GRAPH_METRICS if k in metrics and k not in names]:
            ref = reference.get(name)
            ref_s = f"{ref:>13.4f}" if isinstance(ref, (int, float)) else f"{'-':>13}"
            lines.append(f"  {name:<32}{metrics[name]:>10.4f}{ref_s}")
    agreement = reference.get("agreement") or {}
    if agreement:
        lines.append("agreement of the federated and the centralised clusters (1: the same clustering)")
        lines += [f"  {name:<32}{value:>10.4f}" for name, value in agreement.items()]
    if "cluster_sizes" in metrics:
        lines.append(f"cluster sizes: {', '.join(map(str, metrics['cluster_sizes']))} (of {metrics.get('items')} "
                     "items; the server holds no pooled data or ground truth to score them against)")
    return lines


def _quality_lines(result: dict) -> list[str]:
    reference, quality = result.get("reference") or {}, result.get("quality") or {}
    lines = []
    if reference.get("method"):
        lines.append(f"centralised method: {reference['method']}")
    if quality.get("summary"):
        compares = ("federated vs centralised clusters, not vs the ground truth"
                    if quality.get("verdict") else "nothing to compare")
        lines.append(f"verdict ({compares}): {quality['summary']}")
        lines += _method_fit(result.get("metrics", {}), reference)
    paper = quality.get("paper")
    if paper:
        run = paper["run"]
        line = f"paper: {paper['source']}: {paper['reports']}; this run: {paper['metric']} " + (
            f"{run:.4f}" if isinstance(run, (int, float)) else "not measured")
        if paper["setting_differs"]:
            line += "; its setting differs: " + ", ".join(
                f"{key} {v['paper']} (this run {v['run']})" for key, v in paper["setting_differs"].items())
        lines.append(line)
    lines += [f"note: {note}" for note in quality.get("notes", [])]
    return lines


def _method_fit(metrics: dict, reference: dict) -> list[str]:
    """Where the run matches the ground truth poorly, whether the method or the federation is the
    cause: the centralised method's own figure says it."""
    acc, ref_acc = metrics.get("acc"), reference.get("acc")
    if not isinstance(acc, (int, float)) or acc >= 0.9:
        return []
    if isinstance(ref_acc, (int, float)) and acc >= ref_acc - 0.02:
        return [f"quality: ACC {acc:.3f} against the ground truth, and the centralised method's is {ref_acc:.3f}: "
                "the method, not the federation, limits it on this data; another may fit it better (python -m "
                "app.run compare runs them all; describe says which methods suit which data)"]
    return [f"quality: ACC {acc:.3f} against the ground truth"
            + (f", the centralised method's {ref_acc:.3f}" if isinstance(ref_acc, (int, float)) else "")]


def _upload_list(uploads: list[dict]) -> str:
    """``action (name, ...), ...`` of ``uploads``, in the order they were first sent."""
    names: dict[str, list[str]] = {}
    for u in uploads:
        listed = names.setdefault(u["action"], [])
        if u["name"] not in listed:
            listed.append(u["name"])
    return ", ".join(f"{action} ({', '.join(found)})" for action, found in names.items())


def privacy_lines(privacy: dict) -> list[str]:
    """What the DP guarantee covers and what it does not, from the ledger (``privacy`` of
    result.json): the noised uploads under (epsilon, delta); masked and clear ones outside it."""
    uploads = privacy.get("uploads", [])
    noised = [u for u in uploads if u["noised"]]
    masked = [u for u in uploads if u["masked"] and not u["noised"]]
    clear = [u for u in uploads if not u["masked"] and not u["noised"]]
    if privacy.get("epsilon") is not None:
        lines = [f"privacy: (epsilon={privacy['epsilon']:.4g}, delta={privacy.get('delta'):.3g}) covers the noised "
                 f"uploads only: {_upload_list(noised) or 'none'}"]
    else:
        lines = ["privacy: no differential privacy guarantee" + (
            f"; noised without a guarantee: {_upload_list(noised)}" if noised else "")]
    if masked:
        lines.append(f"privacy: masked by secure aggregation (the server sees sums), not covered by DP: "
                     f"{_upload_list(masked)}")
    if clear:
        lines.append(f"privacy: sent in clear, not covered by DP: {_upload_list(clear)}")
    return lines
