"""deploy.flower_shim against the pinned Flower: the names and waits it patches are Flower's,
its clock maps them as documented, and a ClientApp forked from the preloaded server is Flower's."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import time
import types

import pytest

from conftest import HANG_GUARD_S
from deploy import flower_shim
from deploy.federation import BIN, supernode_command

SUPERNODE = importlib.import_module("flwr.supernode.start_client_internal")
EXECUTOR = importlib.import_module("flwr.supercore.superexec.executor.subprocess_executor")


def test_the_patched_names_and_waits_are_the_pinned_flowers():
    assert SUPERNODE.time is time and SUPERNODE.subprocess is subprocess
    loop = inspect.getsource(SUPERNODE.start_client_internal)
    assert f"time.sleep({flower_shim.FLOWER_IDLE_POLL_S})" in loop  # the idle wait after an empty pull
    assert "_pull_and_store_message(" in loop and "_push_messages(" in loop
    assert 'command = ["flower-superexec"]' in loop and "subprocess.Popen(command)" in loop
    assert f"time.sleep({flower_shim.FLOWER_REPLY_POLL_S})" in inspect.getsource(SUPERNODE._push_messages)
    assert inspect.signature(SUPERNODE._pull_and_store_message).return_annotation in ("int | None", int | None)
    assert EXECUTOR.subprocess is subprocess
    assert "subprocess.Popen(args)" in inspect.getsource(EXECUTOR.SubprocessExecutor.launch)
    from flwr.supercore.constant import TASK_TYPE_TO_COMMAND, TaskType

    assert TASK_TYPE_TO_COMMAND[TaskType.CLIENT_APP] == "flwr-clientapp"
    for name in flower_shim.PRELOAD:
        importlib.import_module(name)


class FakeTime:
    def __init__(self):
        self.now, self.slept = 100.0, []

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds

    def clock(self):
        return self.now


def test_the_idle_wait_grows_with_the_time_since_the_last_message_up_to_flowers():
    fake = FakeTime()
    clock = flower_shim.PollClock(fake.sleep, fake.clock)
    for _ in range(60):
        clock.sleep(3)
    waits = fake.slept
    assert waits[0] == flower_shim.FIRST_IDLE_POLL_S
    assert all(b >= a for a, b in zip(waits, waits[1:])) and waits[-1] == 3.0
    assert waits[10] == pytest.approx(flower_shim.IDLE_FRACTION * sum(waits[:10]))
    fake.slept.clear()
    clock.active()
    clock.sleep(3)
    clock.sleep(0.5)
    clock.sleep(0.25)  # any other wait is the caller's own
    assert fake.slept == [flower_shim.FIRST_IDLE_POLL_S, flower_shim.REPLY_POLL_S, 0.25]
    assert clock.monotonic is time.monotonic


def fake_supernode(pulled):
    module = types.ModuleType("fake_supernode")
    module.calls = []
    module.time = time
    module._pull_and_store_message = lambda **kw: pulled.pop(0)
    module._push_messages = lambda **kw: module.calls.append("push")
    module.subprocess = types.SimpleNamespace(Popen=lambda command: module.calls.append(command), DEVNULL=-3)
    return module


def test_patched_supernode_polls_soon_after_a_message_and_starts_the_shims_superexec():
    module = fake_supernode([None, 7])
    clock = flower_shim.patch_supernode(module)
    assert isinstance(module.time, flower_shim.PollClock) and module.time is clock
    clock.last_message = -1e9
    assert module._pull_and_store_message() is None and clock.last_message == -1e9
    assert module._pull_and_store_message() == 7 and time.monotonic() - clock.last_message < HANG_GUARD_S
    module._push_messages()
    module.subprocess.Popen(["flower-superexec", "--insecure", "--runtime-api-address", "127.0.0.1:9094"])
    module.subprocess.Popen(["something-else", "--x"])
    assert module.calls == ["push", [sys.executable, "-m", "deploy.flower_shim", "superexec", "--insecure",
                                     "--runtime-api-address", "127.0.0.1:9094"], ["something-else", "--x"]]
    assert module.subprocess.DEVNULL == -3  # the rest of the module is unchanged


@pytest.mark.deployment
def test_a_forked_clientapp_runs_flowers_flwr_clientapp_entry_point():
    module = types.ModuleType("fake_executor")
    module.subprocess = subprocess
    flower_shim.patch_executor(module)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    helped = module.subprocess.Popen(["flwr-clientapp", "--help"], **quiet)
    refused = module.subprocess.Popen(["flwr-clientapp", "--no-such-option"], **quiet)
    for process in (helped, refused):
        process.join(HANG_GUARD_S)
    assert (helped.exitcode, refused.exitcode) == (0, 2)  # argparse of Flower's entry point: help, usage error
    other = module.subprocess.Popen([sys.executable, "-c", "pass"])
    assert isinstance(other, subprocess.Popen) and other.wait(HANG_GUARD_S) == 0


def test_the_setting_switches_the_shim_off():
    assert supernode_command({}) == [sys.executable, "-m", "deploy.flower_shim", "supernode"]
    assert supernode_command({flower_shim.SETTING: "0"}) == [str(BIN / "flower-supernode")]
    assert flower_shim.main(["bogus"]) == 2
