"""``python -m deploy local``: app.run's summary with the reference, secrets kept out of the results."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from fedgraphcore.result import summary_table
from deploy.__main__ import RUN_TIMING, _ended_processes, main
from deploy.pki import make_all


def test_the_ca_key_can_be_left_unwritten(tmp_path):
    make_all(tmp_path / "kept", 1)
    make_all(tmp_path / "unkept", 1, keep_ca_key=False)
    assert (tmp_path / "kept" / "ca.key").exists() and not (tmp_path / "unkept" / "ca.key").exists()
    assert {p.name for p in (tmp_path / "unkept").iterdir()} == {"ca.crt", "superlink.crt", "superlink.key",
                                                                  "supernode-0", "supernode-0.pub"}


def _pki_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("fedgraph-pki-*"))


@pytest.mark.deployment
@pytest.mark.slow
def test_deploy_local_prints_the_summary_with_the_reference_and_keeps_no_key_in_the_results(tmp_path, capsys):
    before = _pki_dirs()
    out = tmp_path / "deployed"
    code = main(["local", "--nodes", "2", "--strategy", "fedkmeans", "--dataset", "sbm", "--out", str(out),
                 "--set", "sbm.nodes=300", "--set", "sbm.features=8", "--set", "num-rounds=3"])
    printed = capsys.readouterr().out
    assert code == 0
    path = out / "result" / "result.json"
    result = json.loads(path.read_text())
    assert printed.endswith(summary_table(result) + f"\nresult: {path}\nreport: {path.parent / 'report.html'}\n")
    assert result["reference"]["method"].startswith("centralised k-means") and "agreement" in result["reference"]
    timing = json.loads((out / RUN_TIMING).read_text())
    assert timing["federation_start_s"] > 0 and timing["flwr_run_s"] > result["timing"]["total_s"]
    assert "verdict: " in printed
    files = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in files if b"PRIVATE KEY" in p.read_bytes()]
    assert not [p for p in files if p.name in ("ca.key", "superlink.key") or p.name.startswith("supernode-")
                and not p.name.endswith(".log")]
    assert _pki_dirs() <= before  # the run's keys went with its temporary directory
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_run_without_result_names_what_ended_mid_run(tmp_path):
    assert _ended_processes(tmp_path, {"superlink": -9}) == (
        f": the SuperLink ended mid-run (exit code -9, log {tmp_path / 'superlink.log'}); its runs are lost with "
        "it, and the SuperNodes stop reconnecting after 300 s; start the deployment again")
    assert _ended_processes(tmp_path, {"supernode-1": -9}) == (
        f": these processes ended mid-run: supernode-1 (exit code -9, log {tmp_path / 'supernode-1.log'})")
    assert _ended_processes(tmp_path, {}) == ""


def test_a_key_flower_does_not_register_is_named_with_why_and_the_others_are_still_tried(monkeypatch, capsys):
    from deploy import registration

    tried, answers = [], iter(["Public key file 'a.pub' does not exist.", None])
    monkeypatch.setattr(registration, "register", lambda connection, key: tried.append((connection, key))
                        or next(answers))
    assert registration.main(["fedgraph", "a.pub", "b.pub"]) == 1
    assert tried == [("fedgraph", "a.pub"), ("fedgraph", "b.pub")]
    assert capsys.readouterr().out == f"{registration.NOT_REGISTERED}: a.pub (Public key file 'a.pub' does not exist.)\n"


def test_flowers_own_cli_refuses_a_missing_key_file_in_one_line(tmp_path):
    from deploy import registration

    assert registration.register("fedgraph", str(tmp_path / "none.pub")) == (
        f"ClickException: Public key file '{tmp_path / 'none.pub'}' does not exist.")
