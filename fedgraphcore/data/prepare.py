"""Write one shard file per client (plus manifest.json) for a deployment.

    python -m app.data.prepare --dataset cora --partitioner node-random \\
        --num-clients 4 --seed 0 --set partition.overlap=0.1 --out shards/cora-4

Each SuperNode then loads only its own file, e.g.
``--node-config "shard=shards/cora-4/client-3.npz"``. With ``--format files``
it writes ``OUT/party-<i>/`` instead: what party i would hold, in the user file
format (:mod:`fedgraphcore.data.rehearsal`), for a rehearsal of a deployment in which
every party brings its own data (``dataset='parties'``, node config
``data=OUT/party-<i>``; ``python -m deploy local --parties OUT``). ``--set`` takes the data
keys of :data:`fedgraphcore.data.params.DATA_PARAMS` (``sbm.nodes=5000``,
``partition.alpha=0.3``, ``data-root=...``). Bad input: one line on stderr and
exit code 2.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from fedgraphcore.config import ArgumentParser, ConfigError, exit_code, parse_assignments
from fedgraphcore.files import unwritable

from .datasets import DATASETS, FILE_DATASETS, check_dataset_value, dataset_root
from .evaluation import CONTENTS
from .params import DATA_PARAMS, SEED, data_root as config_data_root, dataset_kwargs, partition_kwargs
from .partition import PARTITIONERS, partition
from .fingerprint import data_hash
from .shards import write_shards

FORMATS = ("shards", "files")


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m app.data.prepare", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", required=True, help="one of: " + ", ".join(DATASETS)
                   + ", or the path of a graph file or directory")
    p.add_argument("--partitioner", required=True, help="one of: " + ", ".join(PARTITIONERS))
    p.add_argument("--num-clients", required=True, type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-root", default=None, help="datasets folder (default: data-root key, "
                   "$FEDGRAPH_DATA_ROOT, ../shared/datasets, else the download cache)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="data run-config key, e.g. sbm.nodes=5000 (repeatable)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--format", default="shards", help="shards (default: client-<i>.npz for node config shard=) or "
                   "files (party-<i>/ folders in the user file format, for node config data=)")
    p.add_argument("--eval-file", default=None,
                   help="also write the server's evaluation file here (see fedgraphcore/data/evaluation.py)")
    p.add_argument("--eval-contents", default="labels-only", help="labels-only (default) or full")
    p.add_argument("--eval-graph", action="store_true",
                   help="labels-only file: include the adjacency for modularity/conductance")
    return p


def parse_data_sets(items: list[str]) -> dict:
    """``--set`` items of the data run-config keys, typed (a one-line ConfigError for another key)."""
    keys = {p.key: p for p in DATA_PARAMS}
    values = parse_assignments(items)
    for k, v in values.items():
        if k not in keys:
            raise ConfigError(f"unknown config key '{k}'; valid keys: " + ", ".join(sorted(keys)))
        values[k] = keys[k].coerce(v)
    return values


def _check_dir(flag: str, directory: Path, valid: str) -> None:
    """``directory`` can be created or is one (no file on its path), and files can be written into it."""
    problem = unwritable(directory)
    if problem is not None:
        raise ConfigError(f"{flag}: {problem}; valid: {valid}")


def _check_eval_file(path: Path) -> None:
    if path.is_dir():
        raise ConfigError(f"--eval-file: {str(path)!r} is a directory; valid: a file in a directory")
    _check_dir("--eval-file", path.parent, "a file in a directory")


def run(argv: list[str] | None = None) -> dict:
    args = _parser().parse_args(argv)
    _check_args(args)  # everything that can be refused is refused before any file is written
    values = parse_data_sets(args.set)
    root = args.data_root or config_data_root(values)
    dkw = dataset_kwargs(values, args.dataset)
    pkw = partition_kwargs(args.partitioner, values)
    from .datasets import load_dataset

    t0 = time.perf_counter()
    data = load_dataset(args.dataset, data_root=root, seed=args.seed, **dkw)
    shards = partition(data, args.partitioner, args.num_clients, seed=args.seed, **pkw)
    if args.format == "files":
        return _write_files(data, shards, Path(args.out), args, time.perf_counter() - t0)
    info = {
        "seed": args.seed,
        "params": pkw,
        "dataset_params": dkw,
        "data_hash": data_hash(data),
        "data_root": str(dataset_root(args.dataset, root)) if args.dataset in FILE_DATASETS else None,
    }
    manifest = write_shards(shards, args.out, info)
    if args.eval_file:
        from .evaluation import write_evaluation

        write_evaluation(data, args.eval_file, args.eval_contents, args.eval_graph)
        print(f"wrote evaluation file ({args.eval_contents}) to {args.eval_file}")
    dt = time.perf_counter() - t0
    for c in manifest["clients"]:
        print(f"{args.out}/{c['file']}: nodes={c['num_nodes']} edges={c['num_edges']} "
              f"graphs={c['num_graphs']} features={c['num_features']} bytes={c['bytes']}")
    print(f"wrote {len(shards)} shards of {args.dataset} ({args.partitioner}, seed {args.seed}) to "
          f"{args.out} in {dt:.2f}s; content hash {manifest['content_hash'][:16]}")
    return manifest


def _check_args(args) -> None:
    """A one-line ConfigError for a dataset, partitioner, client count, seed, format or output
    the command cannot take."""
    check_dataset_value(args.dataset)
    if args.partitioner not in PARTITIONERS:
        raise ConfigError(f"unknown partitioner {args.partitioner!r}; valid choices: " + ", ".join(PARTITIONERS))
    if args.num_clients < 1:
        raise ConfigError(f"invalid value {args.num_clients} for '--num-clients'; need >= 1")
    SEED.coerce(args.seed)  # the run-config's seed range
    if args.eval_contents not in CONTENTS:
        raise ConfigError(f"invalid value {args.eval_contents!r} for '--eval-contents'; valid choices: "
                          + ", ".join(CONTENTS))
    if args.format not in FORMATS:
        raise ConfigError(f"invalid value {args.format!r} for '--format'; valid choices: " + ", ".join(FORMATS))
    _check_dir("--out", Path(args.out), "a directory for the shards")
    if args.format == "files":
        taken = sorted(p.name for p in Path(args.out).glob("party-*"))
        if taken:
            raise ConfigError(f"--out {args.out!r} already holds {', '.join(taken[:3])}; valid: a new or empty "
                              "directory for the party folders")
        if args.eval_file:
            raise ConfigError("--eval-file with --format files: a run on the parties' own data has no eval-file; "
                              "valid: leave it out")
    if args.eval_file:
        _check_eval_file(Path(args.eval_file))


def _write_files(data, shards, out: Path, args, seconds: float) -> dict:
    """``--format files``: one folder per party (:func:`fedgraphcore.data.rehearsal.write_party_folder`)."""
    from .rehearsal import write_party_folder

    t0 = time.perf_counter()
    parties = {}
    for s in shards:
        folder = out / f"party-{s.client_id}"
        parties[folder.name] = write_party_folder(data, s, folder)
        print(f"{folder}: {', '.join(parties[folder.name])} (nodes={s.num_nodes} edges={s.num_edges} "
              f"graphs={s.num_graphs} features={0 if s.x is None else s.x.shape[1]})")
    print(f"wrote {len(shards)} party folders of {args.dataset} ({args.partitioner}, seed {args.seed}) to {out} in "
          f"{seconds + time.perf_counter() - t0:.2f}s; run with dataset='parties' partitioner='{args.partitioner}'")
    return {"format": "files", "dataset": args.dataset, "partitioner": args.partitioner, "parties": parties}


def main(argv: list[str] | None = None) -> int:
    return exit_code(run, argv)


if __name__ == "__main__":
    sys.exit(main())
