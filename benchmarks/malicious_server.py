"""What a malicious server gets from a member, per strategy: a fuzzing campaign against its real ClientApp.

    python benchmarks/malicious_server.py [--sequences N] [--length L] [--report]

For every strategy (the cases of tests/test_fuzz_server.py), the messages an honest run sends
member 0 are sent to a fresh member in seeded random order after hello, repeated, with crafted
arrays of the recorded shapes (tests/fuzz_server.py), each sequence one run under the default node
policy (fedsc and fedspectral-plus also noise-free under ``min-rows`` 5). Reports, per strategy,
the most the server learned: the member's rows the row search of tests/malicious_server.py finds
in every reply, the fewest rows behind a statistic it read, the label bits of each row it read per
run, and the releases answered and refused by rule. Writes benchmarks/results/malicious_server.json
and docs/results/malicious-server.md (``--report``: only the page, from the JSON).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fedgraphcore.config import ArgumentParser  # noqa: E402
from pages import RESULTS_DIR, paragraph, read_results, table, write_page  # noqa: E402

MEASURE = "python benchmarks/malicious_server.py --sequences 8 --length 24"
RESULTS = "malicious_server.json"


def run_case(case: str, strategy: str, keys: dict, policy: dict, sequences: int, length: int) -> dict:
    """One strategy's campaign: what the server got (see module docstring)."""
    import pytest

    from test_fuzz_server import campaign

    with tempfile.TemporaryDirectory() as out, pytest.MonkeyPatch.context() as patch:
        outcome = campaign(case, strategy, keys, policy, sequences, length, patch, Path(out))
    return {"case": case, "strategy": strategy, "policy": policy, "messages": outcome.messages,
            "rows_found": outcome.found, "fewest_rows": outcome.fewest_rows,
            "label_bits_per_run": outcome.most_label_bits, "answered": dict(outcome.answered),
            "refused": dict(outcome.refused)}


def measure(sequences: int, length: int) -> dict:
    from test_fuzz_server import CASES, plain

    cases = []
    for case, strategy, keys, policy in plain(CASES):
        cases.append(run_case(case, strategy, keys, policy, sequences, length))
        print(json.dumps(cases[-1]), flush=True)
    return {"measure": MEASURE, "sequences": sequences, "length": length, "cases": cases}


def render(results: dict) -> Path:
    rows = []
    for c in results["cases"]:
        policy = ", ".join(f"{k} {v}" for k, v in c["policy"].items()) or "default"
        refused = ", ".join(f"{rule} {n}" for rule, n in sorted(c["refused"].items())) or "-"
        rows.append([c["case"], policy, c["messages"], sum(c["answered"].values()), refused,
                     len(c["rows_found"]) or "none", "-" if c["fewest_rows"] is None else c["fewest_rows"],
                     f"{c['label_bits_per_run']:.1f}"])
    body = "\n\n".join([
        paragraph(f"Each strategy's member 0 driven by a fuzzing server: {results['sequences']} runs of "
                  f"{results['length']} messages, hello first, then the messages an honest run sends it in seeded "
                  "random order, one in five sent again at once, each float array as recorded or crafted with its "
                  "shape (random, a grid on one axis, one-hot rows, one row repeated, scaled 1e3). Answered: "
                  "releases (a request sent again gets its first reply, counted once). Rows found: the row search "
                  "of tests/malicious_server.py on every reply (a row, a column, a one-row mean, fedsc's "
                  "inversion, fedspectral-plus's solves, a weight update parallel to a row). Fewest rows: the "
                  "fewest of the member's rows behind a statistic the server read. Label bits: of each row, the "
                  "most in one run (log2 of the classes of a label reply; at most one a run). Errors: requests "
                  "the member could not answer (a step whose earlier steps it never saw, a masking tag used "
                  "before), which reach the server as the error's kind. A fedkmeans case names its filter order "
                  "(4, the default, sets up the boundary links and runs the filter's hops before any Lloyd step)."),
        table(["case", "node policy", "messages", "answered", "refused (rule: count)", "rows found", "fewest rows",
               "label bits in a run"], rows),
        paragraph("The attacks of the security page, one by one: `tests/test_rogue_server.py`; what each reply "
                  "can give: [privacy](../privacy.md#every-reply-is-a-release)."),
    ])
    return write_page("malicious-server", "What a malicious server gets from a member", body, MEASURE)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python benchmarks/malicious_server.py", description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--length", type=int, default=24)
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON")
    args = parser.parse_args(argv)
    if args.report:
        results = read_results(RESULTS, MEASURE)
    else:
        results = measure(args.sequences, args.length)
        (RESULTS_DIR / RESULTS).write_text(json.dumps(results, indent=1) + "\n")
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
