"""What ``python -m app.run --help``, ``list`` and ``describe`` print.

Generated from the strategy registry and the run-config schema (:class:`fedgraphcore.config.Param`),
so the text cannot drift from what a run reads: every strategy's description is its class
docstring, every key's line its Param (type, default, valid values, meaning).
"""

from __future__ import annotations

import inspect
import textwrap

from app import registry
from fedgraphcore.config import ConfigError, Param
from fedgraphcore.data import DATASETS
from fedgraphcore.data.datasets import BUILTIN_PROFILES, FILE_DATASETS

WIDTH = 100
GROUPS = {"shared": "shared", "strategy": "{strategy}", "data": "data (dataset {dataset}, partitioner {partitioner})"}


def _wrap(text: str, indent: str = "") -> str:
    return textwrap.fill(" ".join(text.split()), WIDTH, initial_indent=indent, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)


#: The built-ins' sizes as they load (sbm and circles at their default settings; a test checks the
#: embedded ones): nodes (or graphs), edges, feature columns, classes.
SIZES = {
    "karate": (34, 78, 34, 4), "sbm": (1000, 8177, 16, 4), "iris": (150, 0, 4, 3), "digits": (1797, 0, 64, 10),
    "circles": (1000, 0, 2, 2), "cora": (2708, 5278, 1433, 7), "citeseer": (3327, 4552, 3703, 6),
    "pubmed": (19717, 44324, 500, 3), "wiki": (2405, 11596, 4973, 17), "mutag": (188, None, None, 2),
    "proteins": (1113, None, None, 2), "imdb-binary": (1000, None, None, 2), "email-eu-core": (1005, 16064, 0, 42),
    "ego-facebook": (4039, 88234, 0, 0),
}


def dataset_kind(name: str) -> str:
    """``name``'s shape in a few words: one graph, a graph collection or points, its size, node
    features or none, its classes."""
    profile = BUILTIN_PROFILES[name]
    items, edges, features, classes = SIZES[name]
    if profile.collection:
        shape = f"graph collection: {items:,} graphs"
    elif not profile.edges:
        shape = f"points, no edges: {items:,} rows"
    else:
        shape = f"graph: {items:,} nodes, {edges:,} edges"
    if not profile.collection:
        shape += f", {features:,} features" if features else ", no node features"
    elif not profile.features:
        shape += ", no node features"
    shape += f", {classes} classes" if classes else ", no labels"
    settings = {"sbm": " (sbm.* keys set its size)", "circles": " (circles.samples)"}
    return shape + settings.get(name, "")


def accepted_datasets(strategy: str) -> list[str]:
    """The datasets ``strategy`` runs on with at least one of its partitioners."""
    partitioners = registry.get(strategy).strategy.partitioners
    return [d for d in DATASETS if any(_fits(strategy, d, p) for p in partitioners)]


def _fits(strategy: str, dataset: str, partitioner: str) -> bool:
    try:
        registry.validate({"strategy": strategy, "dataset": dataset, "partitioner": partitioner})
    except ConfigError:
        return False
    return True


def _fedkmeans_edges() -> str:
    """Whether fedkmeans uses the edges at its default setting (its filter order)."""
    order = registry.schema().params["fedkmeans.filter-order"].default
    if order:
        return (f"by default it smooths the features over the edges first (fedkmeans.filter-order={order}); "
                "fedkmeans.filter-order=0 ignores them")
    return "by default it ignores the edges (fedkmeans.filter-order=0); fedkmeans.filter-order=2 smooths the " \
           "features over them first"


def suits(name: str) -> str:
    """Which data ``name`` suits, and why (what it uses of the data and what it assumes)."""
    return {
        "fedkmeans": "rows whose features separate the clusters (node features or samples), split by rows; "
                     + _fedkmeans_edges() + "; fast, the baseline to beat",
        "fedspectral": "a graph whose edges are split among the parties, clusters as communities of edges; merges "
                       "each party's local spectral labels, so it weakens when each party sees few edges",
        "fedspectral-plus": "a graph whose clusters are communities of edges (no features needed), split by edges "
                            "or nodes; its exact mode gives centralised spectral clustering's labels",
        "fedsc": "samples (or node features) in clusters of non-convex shape (kernel similarity, e.g. circles), "
                 "split by rows; it ignores the edges unless fedsc.filter-order > 0",
        "gw-ldp": "a collection of small graphs (molecules, ego networks) clustered as whole graphs by their "
                  "structure; on one graph, its k-hop subgraphs; slow on large graphs (pairwise "
                  "Gromov-Wasserstein)",
        "fedavg-dmon": "an attributed graph split by nodes, each party with enough edges: a graph neural network "
                       "trained with the modularity (DMoN) loss uses edges and features; slower, needs tuning",
        "kcagc": "an attributed graph whose feature columns are split among the parties (the same nodes "
                 "everywhere): AGC's graph filter uses edges and features; its exact mode gives centralised "
                 "AGC's labels",
        "kcagc-basic": "as kcagc, by plain Lloyd over all nodes (the paper's baseline); kcagc is better",
    }.get(name, registry.get(name).strategy.summary)


def overview() -> str:
    """The strategies with their one-line summaries, which data each suits, and the datasets by
    where they come from."""
    width = max(map(len, registry.STRATEGIES))
    lines = [_wrap("strategies (python -m app.run describe NAME, or --strategy NAME --help: its description "
                   "and every key it reads):")]
    lines += [f"  {name:<{width}}  {entry.strategy.summary}" for name, entry in registry.STRATEGIES.items()]
    lines += ["", _wrap("which data each suits, and why (python -m app.run compare --dataset D runs every one "
                        "that fits D):")]
    lines += [textwrap.fill(suits(name), WIDTH, initial_indent=f"  {name:<{width}}  ",
                            subsequent_indent=" " * (width + 4), break_on_hyphens=False)
              for name in registry.STRATEGIES]
    embedded = [d for d in DATASETS if d not in FILE_DATASETS]
    lines += ["", "datasets, embedded (no files needed):"]
    lines += [f"  {d:<{width}}  {dataset_kind(d)}" for d in embedded]
    lines += ["", _wrap("datasets read from the data root (--set data-root=PATH, else $FEDGRAPH_DATA_ROOT, "
                        "else ../shared/datasets), else downloaded on first use into the user cache "
                        "($FEDGRAPH_CACHE_DIR, else ~/.cache/fedgraph-clustering/datasets; "
                        "$FEDGRAPH_DATA_URL: a mirror; pubmed from a data root only):")]
    lines += [f"  {d:<{width}}  {dataset_kind(d)}" for d in DATASETS if d in FILE_DATASETS]
    return "\n".join(lines)


def default_text(p: Param) -> str:
    if p.kind is bool:
        return "true" if p.default else "false"
    if p.kind is str:
        return repr(p.default)
    return f"{p.default:.12g}" if p.kind is float else str(p.default)


def param_lines(p: Param, width: int) -> list[str]:
    """One key: ``* key  type  default  valid values`` (``*``: a key that matters most; valid values
    too long for the line go below it), then its meaning."""
    head = f"  {'*' if p.primary else ' '} {p.key:<{width}}  {p.kind.__name__:<5}  {default_text(p):<10}"
    valid = p.valid()
    if len(head) + 2 + len(valid) <= WIDTH:
        return [f"{head}  {valid}", _wrap(p.help, " " * 8)]
    return [head.rstrip(), _wrap("valid: " + valid, " " * 8), _wrap(p.help, " " * 8)]


def _example_dataset(strategy: str, partitioner: str) -> str:
    """The default dataset where ``strategy`` (with ``partitioner``) takes it, else the first it takes."""
    default = registry.schema().params["dataset"].default
    fitting = [d for d in DATASETS if _fits(strategy, d, partitioner)]
    return default if default in fitting else (fitting or [default])[0]


def strategy_help(strategy: str, dataset: str | None = None, partitioner: str = "auto") -> str:
    """The description of ``strategy``, its data split, the datasets it accepts and every key a run
    of it on ``dataset`` (default: the default dataset if the strategy takes it) split by
    ``partitioner`` reads, with type, default, valid values and meaning."""
    cls = registry.get(strategy).strategy
    if dataset is None:
        dataset = _example_dataset(strategy, partitioner)
    resolved = cls.partitioners[0] if partitioner == "auto" else partitioner
    groups = registry.params_read(strategy, dataset, resolved)
    width = max(len(p.key) for group in groups.values() for p in group)
    partitioners = ", ".join(f"{p} (default)" if i == 0 else p for i, p in enumerate(cls.partitioners))
    lines = [f"{strategy}: {cls.summary}", "", _wrap((inspect.getdoc(cls) or "").replace("``", "'")), "",
             _wrap(f"data split: {cls.split}"), _wrap(f"suits: {suits(strategy)}"),
             _wrap(f"partitioners: {partitioners}"),
             _wrap("datasets: " + ", ".join(accepted_datasets(strategy))), "",
             _wrap(f"Keys a run on dataset '{dataset}' with partitioner '{resolved}' reads (set with --set "
                   "KEY=VALUE; --dataset and --set partitioner=... show those of another split); "
                   "* marks the keys that matter most:")]
    names = {"strategy": strategy, "dataset": dataset, "partitioner": resolved}
    for group, params in groups.items():
        if params:
            lines += ["", GROUPS[group].format(**names) + ":"]
            for p in sorted(params, key=lambda p: not p.primary):
                lines += param_lines(p, width)
    return "\n".join(lines)
