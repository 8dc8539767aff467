"""Costs only a change inside Flower 1.42 removes, each measured against a local patch.

    python benchmarks/flower_costs.py [--requests 400] [--report]

* **HTTP stack per request**: a plain ``flower-superlink --insecure`` (the SuperLink's HTTP
  server, in a process of its own) answers ``--requests`` Control API ``list-runs`` requests
  (protobuf, one connection kept alive); its CPU seconds per request, then the same with Flower's
  middleware list cut to the two such a request needs, its caller's authentication and the
  protobuf translation (a local patch, for the measurement only: it leaves out node
  authentication, the licence check and the event logs), and with all eight made plain ASGI as
  the runtime shim runs them (``deploy.plain_asgi``: the same checks).
* **A record's object ID recomputed on every access**: ``ConfigRecord``, ``RecordDict`` and
  ``Message`` always count as changed, so every access to their ID deflates and hashes them (an
  inline bundle, up to Flower's 5 MB chunk, again and again): CPU seconds to count the bytes of four
  messages sharing one content, Flower's way and inside one ``no_object_id_recompute`` context.
* **A ClientApp's reply hashed two to three times**: Flower's ``push_message`` (``run_clientapp``)
  computes the reply's ID outside its no-recompute context and all IDs again inside; CPU seconds
  and bytes hashed, Flower's and with the one-context patch ``deploy.app_processes`` applies.

Each figure is the minimum of ``--repeats`` runs (CPU seconds of the process doing the work).
Writes ``benchmarks/results/flower_costs.json``; its section of ``docs/results/transport.md`` is
rendered by ``benchmarks/transport.py``; ``--report``: only the page.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pages import RESULTS_DIR, paragraph, render_page_of, table  # noqa: E402

MEASURE = "python benchmarks/flower_costs.py"
RESULTS = "flower_costs.json"
FLOWERS, PATCHED = "Flower's", "one context"
PLAIN_ASGI = "Flower's 8 as plain ASGI (the runtime shim)"
#: how the SuperLink's middleware list is changed for a measurement (Python run before Flower's entry point)
STACKS = {
    "Flower's 8 middlewares": "",
    "the 2 a Control API request needs": textwrap.dedent("""
        from starlette.middleware import Middleware
        from flwr.superlink.routers.control.middlewares import ControlAuthenticationMiddleware
        from flwr.supercore.protobuf.translation import ProtobufTranslationMiddleware
        import flwr.superlink.main as m
        m._get_middleware = lambda: [Middleware(ControlAuthenticationMiddleware),
                                     Middleware(ProtobufTranslationMiddleware)]
    """),
    PLAIN_ASGI: textwrap.dedent("""
        import flwr.superlink.main as m
        from deploy.plain_asgi import patch_superlink_app
        patch_superlink_app(m)
    """),
}


def _superlink(home: Path, port: int, patch: str) -> subprocess.Popen:
    code = patch + textwrap.dedent(f"""
        import sys
        from flwr.superlink.cli.flower_superlink import flower_superlink
        sys.argv = ["flower-superlink", "--insecure", "--port", "{port}", "--isolation", "process",
                    "--disable-runtime-dependency-installation"]
        flower_superlink()
    """)
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0"}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _cpu(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def http_stack(requests: int, patch: str) -> float:
    """SuperLink CPU seconds per ``list-runs`` request, its middlewares changed by ``patch``."""
    import httpx
    from flwr.proto.control_pb2 import ListRunsRequest  # pylint: disable=no-name-in-module

    from deploy.federation import free_port

    port, home = free_port(), Path(tempfile.mkdtemp(prefix="flower-costs-"))
    proc = _superlink(home, port, patch)
    try:
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(timeout=30.0) as client:
            while True:
                try:
                    if client.get(f"{url}/health").is_success:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError("the SuperLink did not start")
                time.sleep(0.2)
            body, headers = ListRunsRequest().SerializeToString(), {"content-type": "application/protobuf"}
            for _ in range(20):  # warm-up
                client.post(f"{url}/v1/control/list-runs", content=body, headers=headers)
            before = _cpu(proc.pid)
            for _ in range(requests):
                client.post(f"{url}/v1/control/list-runs", content=body, headers=headers).raise_for_status()
            return (_cpu(proc.pid) - before) / requests
    finally:
        proc.kill()
        proc.wait()


def _messages(rows: int, count: int = 4):
    import numpy as np
    from flwr.app import Message
    from flwr.supercore.task_identity import TaskIdentity

    from fedgraphcore.transport import pack

    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = 1, 1, 1
    content = pack({"block": np.random.default_rng(0).random(rows)})
    return [Message(content, dst_node_id=n + 1, message_type="query.x", group_id="1") for n in range(count)]


def record_ids(rows: int) -> dict[str, float]:
    """CPU seconds to count four messages' bytes (their objects deflated), Flower's way and in one context."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from fedgraphcore.transport import messages_bytes

    def flowers(messages):
        return sum(len(o.deflate()) for m in messages for o in get_all_nested_objects(m).values())

    out = {}
    for name, count in ((FLOWERS, flowers), (PATCHED, messages_bytes)):
        messages = _messages(rows)
        start = time.process_time()
        count(messages)
        out[name] = time.process_time() - start
    return out


def reply_push(rows: int) -> dict[str, dict[str, float]]:
    """CPU seconds and MB hashed to push one reply, Flower's ``push_message`` and with one context."""
    from flwr.app import Message
    from flwr.supercore.inflatable import inflatable_object
    from flwr.supernode.runtime import run_clientapp

    from deploy.app_processes import hash_reply_once

    hashed, real = [], inflatable_object.get_object_id
    inflatable_object.get_object_id = lambda content: hashed.append(len(content)) or real(content)
    run_clientapp.make_push_object_fn_protobuf = lambda *args, **kwargs: lambda object_id, content: None
    client = types.SimpleNamespace(PushObject=None, PushMessages=lambda request: types.SimpleNamespace(
        session_id="s", objects_to_push=[t.object_id for t in
                                         inflatable_object.iterate_object_tree(request.message_object_trees[0])]))
    out = {}
    for name in (FLOWERS, PATCHED):
        if name == PATCHED:
            hash_reply_once(run_clientapp, inflatable_object)
        message = _messages(rows, 1)[0]
        reply = Message(message.content, reply_to=_messages(10, 1)[0])
        hashed.clear()
        start = time.process_time()
        run_clientapp.push_message(client, reply, types.SimpleNamespace(node_id=2, run_id=1))
        out[name] = {"cpu_s": time.process_time() - start, "hashed_mb": sum(hashed) / 1e6}
    return out


def _isolated(function: str, *args) -> object:
    """``function(*args)`` of this module in a fresh interpreter (the patches stay there)."""
    code = f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import flower_costs as f; " \
           f"print(json.dumps(f.{function}(*{args!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=HERE.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(requests: int, repeats: int) -> dict:
    stacks = {name: min(http_stack(requests, patch) for _ in range(repeats)) for name, patch in STACKS.items()}
    sizes = {"inline bundle, 4.8 MB": 600_000, "array in chunks, 12.8 MB": 1_600_000}
    ids = {size: _best([_isolated("record_ids", rows) for _ in range(repeats)]) for size, rows in sizes.items()}
    pushes = {size: _best([_isolated("reply_push", rows) for _ in range(repeats)]) for size, rows in sizes.items()}
    return {"requests": requests, "repeats": repeats, "load_average": f"{os.getloadavg()[0]:.1f}",
            "http_stack_cpu_ms": {k: 1e3 * v for k, v in stacks.items()}, "record_ids_cpu_s": ids,
            "reply_push": pushes}


def _best(runs: list) -> dict:
    """The minimum of each figure over ``runs`` (dicts of numbers, or of dicts of numbers)."""
    first = runs[0]
    return {k: (_best([r[k] for r in runs]) if isinstance(first[k], dict) else min(r[k] for r in runs)) for k in first}


def section(result: dict) -> str:
    """The transport page's section on what only Flower can cut (markdown)."""
    stack = result["http_stack_cpu_ms"]
    ids, pushes = result["record_ids_cpu_s"], result["reply_push"]
    return "\n\n".join([
        "## What only Flower can cut",
        paragraph(f"`{MEASURE}` (minimum of {result['repeats']} runs, load {result['load_average']}). Each "
                  "item is a change to propose upstream, measured with a local patch."),
        paragraph("1. **Every HTTP request crosses eight middlewares** (`flwr/superlink/main.py`, "
                  "`_get_middleware`), each a Starlette `BaseHTTPMiddleware`, which starts an anyio "
                  "task group and memory streams per request and layer. Every poll (a SuperNode's "
                  "pull-messages, a SuperExec's acquire-task, the ServerApp's pull-messages) and every object "
                  "(a message is 5 to 20 objects, each its own request) pays it. SuperLink CPU per "
                  f"`list-runs` request, {result['requests']} requests on one kept-alive connection:"),
        table(["middlewares", "SuperLink CPU ms per request"], [[k, f"{v:.2f}"] for k, v in stack.items()]),
        paragraph("Proposal: the same middlewares as pure ASGI middleware (Starlette's own advice for "
                  "`BaseHTTPMiddleware`), and a long-poll (or a stream) for pull-messages and acquire-task, "
                  "so that waiting costs no request. The runtime shim does both for the SuperLinks and "
                  "SuperNodes it starts (`deploy.plain_asgi`: Flower's own checks in plain ASGI layers; "
                  "`deploy.fleet_pulls`: an empty pull held until a message for its node is stored; a "
                  "SuperExec woken through a pipe), so it is the change to make upstream, not a workaround "
                  "to keep."),
        paragraph("2. **A record's object ID is computed again at every access** "
                  "(`flwr/supercore/inflatable/inflatable_object.py`, `InflatableObject.object_id`): "
                  "`ConfigRecord`, `RecordDict` and `Message` have no `is_dirty` of their own, so each access "
                  "deflates and hashes them, an inline bundle of up to 5 MB with them. CPU seconds to count the "
                  "bytes of four messages sharing one content:"),
        table(["content", "Flower's", "in one no-recompute context"],
              [[k, f"{v[FLOWERS]:.3f}", f"{v[PATCHED]:.3f}"] for k, v in ids.items()]),
        paragraph("Proposal: track changes in these records as `ArrayRecord` and `Array` do. This project counts "
                  "its bytes inside one context (`fedgraphcore.transport.messages_bytes`)."),
        paragraph("3. **A ClientApp hashes its reply two to three times** "
                  "(`flwr/supernode/runtime/run_clientapp.py`, `push_message`: the reply's ID outside the "
                  "`no_object_id_recompute` context, every ID again inside it, an array's chunks made anew each "
                  "time). Per reply:"),
        table(["reply", "Flower's CPU s", "MB hashed", "one context CPU s", "MB hashed"],
              [[k, f"{v[FLOWERS]['cpu_s']:.3f}", f"{v[FLOWERS]['hashed_mb']:.1f}",
                f"{v[PATCHED]['cpu_s']:.3f}", f"{v[PATCHED]['hashed_mb']:.1f}"] for k, v in pushes.items()]),
        paragraph("Proposal: compute the ID inside the context. `deploy.app_processes.hash_reply_once` does this "
                  "in the ClientApps the shim forks."),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--report", action="store_true", help="only render the page from the JSON file")
    args = parser.parse_args()
    if not args.report:
        result = measure(args.requests, args.repeats)
        print(json.dumps(result, indent=2))
        (RESULTS_DIR / RESULTS).write_text(json.dumps({"measure": MEASURE, **result}, indent=2) + "\n")
    render_page_of("transport.py")  # its page holds this section


if __name__ == "__main__":
    main()
