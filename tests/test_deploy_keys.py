"""Private keys are born private: every private key file the deployment writes is created
with mode 0600 by the system call that creates it, never written under another mode first and
chmod-ed afterwards (another local user could open it in between), and never overwritten.

Checked at the system-call level: under ``umask 0`` (so the mode a file gets is exactly the one
it was created with), Python's audit hooks record every ``open`` (path, mode: None for
``os.open``, the file mode for ``open()`` / ``Path.write_bytes``; flags) and every ``os.chmod``
(``chmod``, ``fchmod``, ``lchmod``, ``Path.chmod``) and ``os.mkdir`` while keys are made;
``strace`` (when installed) checks the same on the kernel's side.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from deploy.__main__ import main as deploy_main
from deploy.pki import KeyFileError, main as pki_main, make_all, make_node_keys
from deploy.signing import make_signing_key, sign_fab
from deploy.submit import _save_log

PRIVATE = ("ca.key", "superlink.key", "supernode-0", "supernode-1")

#: the audit hook cannot be removed once installed: it records only while a test holds this list
_RECORDING: list[list] = []


def _hook(event: str, args: tuple) -> None:
    if _RECORDING and event in ("open", "os.chmod", "os.mkdir"):
        _RECORDING[-1].append((event, args))


sys.addaudithook(_hook)


class Recorded:
    """The open / chmod / mkdir audit events of what runs inside ``with``, under umask 0."""

    def __enter__(self) -> list:
        self.events: list = []
        self.umask = os.umask(0)
        _RECORDING.append(self.events)
        return self.events

    def __exit__(self, *exc) -> None:
        _RECORDING.remove(self.events)
        os.umask(self.umask)


def _opens(events: list, path: Path) -> list[tuple]:
    """The opens of ``path``: by its name alone, as files are created relative to their directory's descriptor."""
    return [args for event, args in events if event == "open" and isinstance(args[0], (str, bytes, os.PathLike))
            and os.fsdecode(args[0]) in (str(path), path.name)]


def assert_born_private(events: list, path: Path) -> None:
    """``path`` was created once by ``os.open`` with O_CREAT|O_EXCL (no O_TRUNC, never through
    ``open()``), has mode 0600, and no chmod touched anything while the keys were made."""
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, f"{path}: mode {stat.S_IMODE(path.stat().st_mode):o}"
    opens = _opens(events, path)
    assert len(opens) == 1, f"{path} opened {len(opens)} times: {opens}"
    _, mode, flags = opens[0]
    assert mode is None, f"{path} opened by open()/write_bytes with mode {mode!r}, created 0666 before any chmod"
    assert flags & os.O_CREAT and flags & os.O_EXCL and not flags & os.O_TRUNC, f"{path}: flags {flags:o}"
    chmods = [args for event, args in events if event == "os.chmod"]
    assert chmods == [], f"chmod while making keys (a mode set after creation): {chmods}"


def test_every_private_key_of_the_pki_is_created_0600_by_the_call_that_creates_it(tmp_path):
    out = tmp_path / "pki"
    with Recorded() as events:
        make_all(out, 2)
    for name in PRIVATE:
        assert_born_private(events, out / name)
    mkdirs = [args for event, args in events if event == "os.mkdir" and os.fsdecode(args[0]) in (str(out), out.name)]
    assert [args[1] for args in mkdirs] == [0o700] and mkdirs[0][2] is not None  # relative to its parent's fd
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for name in ("ca.crt", "superlink.crt", "supernode-0.pub"):  # public: an ordinary new file's mode
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o666


def test_the_app_signing_key_is_created_0600_by_the_call_that_creates_it(tmp_path):
    with Recorded() as events:
        private, public = make_signing_key(tmp_path / "signer")
    assert_born_private(events, private)
    assert stat.S_IMODE((tmp_path / "signer").stat().st_mode) == 0o700
    assert stat.S_IMODE(public.stat().st_mode) == 0o666


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
@pytest.mark.integration
def test_the_kernel_sees_each_private_key_created_0600_and_no_chmod(tmp_path):
    """The same, from ``strace -f``: one openat with O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600 per
    private key, relative to the key directory's descriptor, and no chmod-family call at all, in
    a fresh process running the command members run."""
    trace = tmp_path / "trace"
    script = ("import os, sys; from pathlib import Path; from deploy.pki import make_all; "
              "from deploy.signing import make_signing_key; os.umask(0); "
              "make_all(Path(sys.argv[1]), 2); make_signing_key(Path(sys.argv[1]))")
    done = subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=openat,open,creat,chmod,fchmod,"
                           "fchmodat,mkdir,mkdirat", sys.executable, "-c", script, str(tmp_path / "pki")],
                          capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1])
    if done.returncode != 0 and "ptrace" in done.stderr:
        pytest.skip(f"strace cannot trace here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    calls = trace.read_text().splitlines()
    assert not [c for c in calls if re.search(r"\b(f?chmod(at)?)\(", c)], "chmod-family calls while making keys"
    for name in (*PRIVATE, "app-signing"):
        opens = [c for c in calls if re.search(rf'\bopen(at)?\(\d+, "{name}", ', c)]
        assert len(opens) == 1 and all(f in opens[0] for f in ("O_CREAT", "O_EXCL", "O_NOFOLLOW")) and opens[
            0].rstrip().split(", ")[-1].startswith("0600)"), f"{name}: {opens}"
        assert not [c for c in calls if f'{name}"' in c and c not in opens], f"{name} reached by another call"
    mkdir = [c for c in calls if re.search(r'\bmkdirat\(\d+, "pki", ', c)]
    assert len(mkdir) == 1 and ", 0700)" in mkdir[0], mkdir


# -- attacks ------------------------------------------------------------------


def test_an_existing_key_is_never_overwritten_and_nothing_is_half_written(tmp_path):
    out = tmp_path / "pki"
    make_all(out, 1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(KeyFileError, match=r"^.*pki/ca\.crt already exists.*valid: a new directory"):
        make_all(out, 2)  # also adds supernode-1: nothing of it may appear
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / "extra").mkdir(mode=0o700)
    make_node_keys(out / "extra", 0)
    with pytest.raises(KeyFileError, match="supernode-0 already exists"):
        make_node_keys(out / "extra", 0)


def test_a_planted_symlink_at_a_key_path_is_not_followed(tmp_path):
    """Another user plants ``supernode-0`` -> a file they can read: the key must not land there."""
    out = tmp_path / "pki"
    out.mkdir(mode=0o700)
    loot = tmp_path / "loot"
    loot.write_bytes(b"")
    (out / "supernode-0").symlink_to(loot)
    with pytest.raises(KeyFileError, match="supernode-0 already exists"):
        make_all(out, 1)
    assert loot.read_bytes() == b"" and sorted(p.name for p in out.iterdir()) == ["supernode-0"]
    dangling = tmp_path / "signer"
    dangling.mkdir(mode=0o700)
    (dangling / "app-signing").symlink_to(tmp_path / "not-yet")
    with pytest.raises(KeyFileError, match="app-signing already exists"):
        make_signing_key(dangling)
    assert not (tmp_path / "not-yet").exists()


def test_a_key_directory_others_can_write_is_refused(tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # e.g. /tmp: another user could replace a key after it is written
    with pytest.raises(KeyFileError, match=r"shared is writable by group or others \(mode 777\)"):
        make_all(shared, 1)
    with pytest.raises(KeyFileError, match="writable by group or others"):
        make_signing_key(shared)
    assert list(shared.iterdir()) == []
    readable = tmp_path / "readable"
    readable.mkdir()
    readable.chmod(0o755)  # the keys are 0600 in it, but their names are visible: a warning
    make_signing_key(readable)
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "readable" in err and len(err.splitlines()) == 1


def test_a_key_name_cannot_leave_the_key_directory(tmp_path):
    out = tmp_path / "signer"
    for name in ("../escaped", "a/b", "", ".hidden", "x.pub"):
        with pytest.raises(KeyFileError, match="valid: a plain file name"):
            make_signing_key(out, name)
    assert not (tmp_path / "escaped").exists() and not out.exists()


def test_the_commands_refuse_in_one_line_with_exit_code_2(tmp_path, capsys):
    assert deploy_main(["keygen", "--out", str(tmp_path / "signer")]) == 0
    capsys.readouterr()
    assert deploy_main(["keygen", "--out", str(tmp_path / "signer")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "app-signing already exists" in err and len(err.splitlines()) == 1
    assert pki_main(["--out", str(tmp_path / "pki"), "--nodes", "1"]) == 0
    capsys.readouterr()
    assert pki_main(["--out", str(tmp_path / "pki"), "--nodes", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "already exists" in err and len(err.splitlines()) == 1


def test_a_key_directory_of_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(KeyFileError, match=r"theirs belongs to another user \(uid 65534\)"):
        make_signing_key(theirs)
    assert list(theirs.iterdir()) == []


# -- another local user attacks (uid 65534 'nobody' in a forked child; the victim is this process) --

NOBODY = 65534


@pytest.fixture
def shared_tmp():
    """A directory directly in /tmp (``tmp_path`` lies in a 0700 directory the attacker cannot enter),
    owned by the victim (root) with mode 0755; removed afterwards."""
    if os.getuid() != 0:
        pytest.skip("an attacker of another uid needs root to setuid to 65534 in a child")
    base = Path(tempfile.mkdtemp(prefix="fedgraph-attack-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def as_attacker(attack) -> None:
    """Run ``attack()`` as uid/gid 65534 in a forked child; fails the test when the attack itself fails."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            attack()
            code = 0
        except BaseException as err:  # the child reports and exits: it must never return into pytest
            print(f"attacker failed: {type(err).__name__}: {err}", file=sys.stderr)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the attacker's own steps failed"


def victim_file(base: Path) -> Path:
    secret = base / "victim-secret"
    secret.write_text("the victim's own file\n")
    secret.chmod(0o600)
    return secret


def test_a_signatures_directory_planted_by_another_user_is_refused_and_nothing_is_clobbered(shared_tmp):
    """The attacker makes ``signatures/`` (0777) in a shared sticky directory and plants
    ``<sha256>.tmp`` as a symlink to a file of the victim (the FAB's hash is predictable: the build
    is deterministic). Signing must neither write through it nor accept the directory."""
    shared = shared_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    secret = victim_file(shared_tmp)
    fab = b"the app bundle the federation signs"
    digest = hashlib.sha256(fab).hexdigest()

    def plant():
        (shared / "signatures").mkdir()
        (shared / "signatures").chmod(0o777)
        (shared / "signatures" / f"{digest}.tmp").symlink_to(secret)

    as_attacker(plant)
    key, _ = make_signing_key(shared_tmp / "signer")
    with pytest.raises(KeyFileError, match=r"shared/signatures belongs to another user \(uid 65534\)"):
        sign_fab(fab, key, shared / "signatures")
    assert secret.read_text() == "the victim's own file\n"


def test_a_signatures_directory_others_can_write_is_refused_and_a_planted_json_link_is_not_read(tmp_path):
    secret = victim_file(tmp_path)
    key, _ = make_signing_key(tmp_path / "signer")
    fab = b"an app"
    signatures = tmp_path / "signatures"
    signatures.mkdir()
    signatures.chmod(0o777)
    with pytest.raises(KeyFileError, match=r"signatures is writable by group or others \(mode 777\)"):
        sign_fab(fab, key, signatures)
    assert list(signatures.iterdir()) == []
    signatures.chmod(0o755)  # a link planted while it was open: neither read nor written through
    (signatures / f"{hashlib.sha256(fab).hexdigest()}.json").symlink_to(secret)
    with pytest.raises(KeyFileError, match=r"\.json is a symbolic link"):
        sign_fab(fab, key, signatures)
    assert secret.read_text() == "the victim's own file\n"
    assert [p.name for p in signatures.iterdir()] == [f"{hashlib.sha256(fab).hexdigest()}.json"]


def test_a_key_directory_whose_parent_others_can_write_is_refused(shared_tmp):
    """In a 0777 parent without the sticky bit the attacker could rename ``pki/`` away after
    the keys are written and put their own ``pki/ca.crt`` in its place."""
    open_parent = shared_tmp / "open"
    open_parent.mkdir()
    open_parent.chmod(0o777)
    with pytest.raises(KeyFileError, match=r"open is writable by group or others without the sticky bit"):
        make_all(open_parent / "pki", 1)
    with pytest.raises(KeyFileError, match=r"open is writable by group or others without the sticky bit"):
        make_signing_key(open_parent / "deeper" / "signer")
    assert list(open_parent.iterdir()) == []
    theirs = shared_tmp / "theirs"  # an ancestor of another user: its owner can rename what is in it
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(KeyFileError, match=r"theirs belongs to another user \(uid 65534\)"):
        make_all(theirs / "pki", 1)
    assert list(theirs.iterdir()) == []
    sticky = shared_tmp / "sticky"  # like /tmp: others may create names in it but not rename ours
    sticky.mkdir()
    sticky.chmod(0o1777)
    make_all(sticky / "pki", 1)
    assert (sticky / "pki" / "ca.crt").is_file()


def test_a_parent_directory_planted_by_another_user_is_refused(shared_tmp):
    """``--out /tmp/x/pki``: the attacker made ``/tmp/x`` first and can swap ``pki`` inside it."""
    sticky = shared_tmp / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    as_attacker(lambda: ((sticky / "x").mkdir(), (sticky / "x").chmod(0o777)))
    with pytest.raises(KeyFileError, match=r"x belongs to another user \(uid 65534\)"):
        make_all(sticky / "x" / "pki", 1)
    assert list((sticky / "x").iterdir()) == []


def test_swapping_the_key_directory_after_its_check_puts_no_key_in_the_attackers_directory(shared_tmp, monkeypatch):
    """Forced race: the moment the first key file is created, the attacker has renamed the checked
    ``pki/`` away and put a symlink to their own directory in its place. Every file must still
    land in the directory that was checked."""
    race = shared_tmp / "race"
    race.mkdir(mode=0o755)
    (race / "pki").mkdir(mode=0o700)
    theirs = shared_tmp / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    theirs.chmod(0o777)
    real_open, swapped = os.open, []

    def swap_then_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & os.O_CREAT and not swapped:
            swapped.append(path)
            race.chmod(0o777)  # the window: the attacker may act in the parent for a moment
            as_attacker(lambda: ((race / "pki").rename(race / "pki.checked"), (race / "pki").symlink_to(theirs)))
            race.chmod(0o755)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", swap_then_open)
    make_all(race / "pki", 1)
    monkeypatch.undo()
    assert swapped and list(theirs.iterdir()) == []
    assert sorted(p.name for p in (race / "pki.checked").iterdir()) == sorted(
        ["ca.crt", "ca.key", "superlink.crt", "superlink.key", "supernode-0", "supernode-0.pub"])


def test_a_key_directory_made_by_another_user_in_a_race_is_named_accurately(shared_tmp, monkeypatch):
    """Forced race: the attacker creates ``pki/`` between the victim's look and its mkdir."""
    sticky = shared_tmp / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    real_mkdir = os.mkdir

    def race_then_mkdir(path, mode=0o777, *, dir_fd=None):
        if os.path.basename(os.fsdecode(path)) == "pki":
            as_attacker(lambda: real_mkdir(sticky / "pki", 0o777))
        return real_mkdir(path, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", race_then_mkdir)
    with pytest.raises(KeyFileError, match=r"sticky/pki belongs to another user \(uid 65534\)") as err:
        make_all(sticky / "pki", 1)
    monkeypatch.undo()
    assert len(str(err.value).splitlines()) == 1 and list((sticky / "pki").iterdir()) == []


def test_the_run_log_is_not_written_through_a_link_planted_in_a_shared_out_dir(shared_tmp):
    out = shared_tmp / "out"
    out.mkdir()
    out.chmod(0o1777)
    secret = victim_file(shared_tmp)
    as_attacker(lambda: ((out / "run-7.log").symlink_to(secret), (out / "run-8.log").symlink_to(out / "made")))
    assert _save_log(out, 7, "the run's log\n") is None
    assert _save_log(out, 8, "the run's log\n") is None
    assert secret.read_text() == "the victim's own file\n" and not (out / "made").exists()
    assert _save_log(out, 9, "the run's log\n") == out / "run-9.log"
    assert (out / "run-9.log").read_text() == "the run's log\n"


def test_a_key_directory_that_is_a_symlink_or_a_file_is_refused_in_one_line(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")  # opened with O_NOFOLLOW: its target may change
    with pytest.raises(KeyFileError, match=r"link is a symbolic link; valid: a directory"):
        make_all(tmp_path / "link", 1)
    (tmp_path / "file").write_text("")
    with pytest.raises(KeyFileError, match=r"file is not a directory; valid: a directory"):
        make_signing_key(tmp_path / "file")
    with pytest.raises(KeyFileError, match=r"file is not a directory"):
        make_signing_key(tmp_path / "file" / "below")
    assert list((tmp_path / "real").iterdir()) == []
