"""Flower 1.42's SuperNode changed so that no message or reply is lost to a transient failure.

A message is not lost to a failure Flower's own retries give up on (any
status but 502-504; Flower drops the message or the reply, or ends the loop):

* a message received whose run, app bundle or objects cannot be pulled is
  answered with an error reply saying it was not received and why
  (:func:`answer_what_is_not_received`), which the ServerApp
  (:mod:`fedgraphcore.transport`) answers by sending the message again; a failed
  pull-messages is an empty one, a failed confirm-message-received leaves the
  message processed;
* a reply whose push-messages or push-object fails is pushed again, an object
  the SuperLink refuses settled by asking the SuperLink for it, and for a new
  push session when it lacks it (:func:`push_until_stored`);
* a heartbeat answered with an error status is sent again rather than ending
  the heartbeats, an activate-node answered 500 is tried again
  (:func:`survive_error_statuses`);
* a ClientApp reports its finished task to its SuperNode even when the SuperNode
  is slow to answer (:func:`report_task_end`), so that the SuperNode never counts
  it crashed and fails the next round's message with it.

Used by :mod:`deploy.flower_shim` (which applies these changes to the SuperNode it starts and its ClientApps).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from types import ModuleType


class Namespace:
    """A module with some names replaced."""

    def __init__(self, module: ModuleType, **replaced) -> None:
        self._module = module
        self.__dict__.update(replaced)

    def __getattr__(self, name: str):
        return getattr(self._module, name)


def _say(text: str) -> None:
    print(f"deploy.flower_shim: {text}", file=sys.stderr, flush=True)


def _cause(err: BaseException) -> str:
    """``err`` in one line: its type and the first line of its text, at most 300 characters."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def answer_what_is_not_received(module: ModuleType):
    """Flower's ``_pull_and_store_message`` of ``module`` (``flwr.supernode.start_client_internal``)
    with three failures handled (Flower's own handling in brackets):

    * pull-messages failing with a status Flower does not retry (its loop ends, the SuperNode
      stops): no message this time, the loop polls again;
    * the message received, then its run, app bundle or objects not (the message is dropped,
      and the ServerApp waits for a reply until its timeout): the message is answered with an
      error reply, code ``MESSAGE_UNAVAILABLE``, reason :data:`fedgraphcore.transport.NOT_RECEIVED` and the
      cause, pushed like any reply (as Flower answers an app bundle that fails verification):
      the ServerApp sends the message again at once;
    * confirm-message-received failing once every object is in (the message is dropped): the
      message is processed (confirming only lets the SuperLink delete the objects early)."""
    from flwr.common.constant import SubStatus

    pull = module._pull_and_store_message

    def pull_and_store_message(*args, **kwargs):
        seen, failures = {}, []
        receive, confirm, state = kwargs["receive"], kwargs["confirm_message_received"], kwargs["state"]

        def receiving():
            try:
                got = receive()
            except Exception as err:  # pylint: disable=broad-except
                _say(f"pull-messages failed ({_cause(err)}); polling again")
                return None
            if got is not None:
                seen["message"] = got[0]
            return got

        def confirming(run_id: int, message_id: str) -> None:
            try:
                confirm(run_id, message_id)
            except Exception as err:  # pylint: disable=broad-except
                _say(f"confirm-message-received of message {message_id} failed ({_cause(err)}); it is processed")

        def finish_task(*task_args, **task_kwargs):
            if task_kwargs.get("sub_status") == SubStatus.FAILED:
                failures.append(task_kwargs.get("details", "failed"))
            return state.finish_task(*task_args, **task_kwargs)

        try:
            run_id = pull(*args, **{**kwargs, "receive": receiving, "confirm_message_received": confirming,
                                    "state": Namespace(state, finish_task=finish_task)})
        except Exception as err:  # pylint: disable=broad-except
            if "message" not in seen:
                raise
            failures.append(_cause(err))
            run_id = None
        if not failures or "message" not in seen:
            return run_id
        return _answer_not_received(module, seen["message"], failures[-1], state, kwargs["object_store"])

    return pull_and_store_message


def _answer_not_received(module: ModuleType, message, cause: str, state, store) -> int:
    """Store the error reply to ``message`` (code ``MESSAGE_UNAVAILABLE``, reason
    :data:`fedgraphcore.transport.NOT_RECEIVED` and ``cause``) as Flower stores any reply; its run id."""
    from flwr.app import Error, Message
    from flwr.common.constant import ErrorCode

    from fedgraphcore.transport import NOT_RECEIVED

    reason = f"{NOT_RECEIVED}: {cause}"
    module._insert_message(Message(Error(ErrorCode.MESSAGE_UNAVAILABLE, reason), reply_to=message), state, store)
    _say(f"message {message.metadata.message_id} not received; answered with the error reply '{reason}'")
    return message.metadata.run_id


#: tries of one push-messages, or of one object of a reply, before the reply is given up
PUSH_ATTEMPTS = 4
PUSH_RETRY_S = 0.5
#: tries of activate-node answered with a 5xx Flower does not retry (500)
ACTIVATE_ATTEMPTS = 5


#: where an object is for the SuperLink (its pull-object): complete, preregistered and awaited, unknown
HELD, PENDING, GONE = "held", "pending", "gone"


def push_until_stored(push, pull_object):
    """Flower's ``_push_messages`` (``push``), a reply's push tried again after a failure Flower's
    own retries give up on (a status other than 502-504: Flower drops the reply, and the ServerApp
    waits for it), up to :data:`PUSH_ATTEMPTS` times for push-messages and for each object.
    ``pull_object(run_id, object_id)`` (Flower's pull-object, which any node may call) tells where
    an object is (:data:`HELD`, :data:`PENDING`, :data:`GONE`).

    * An object whose push failed or was refused (``stored=false``: a repeat whose first answer was
      lost after the SuperLink stored it, or a push session replaced or expired) is done when the
      SuperLink holds it (or no longer knows it: the reply was taken whole). Otherwise the reply's
      message is pushed again, which the SuperLink takes again (same id) and answers with the
      objects it lacks under a new push session; the object is pushed under that session, or,
      not listed there, with no session id (the SuperLink then finds the session awaiting it).
    * A push-messages whose first answer was lost after the ServerApp took the reply's metadata
      (the ServerApp's pull deletes the message, so the SuperLink takes the repeat as nothing and
      lists no objects, though it still awaits them in the first push session, whose id never
      arrived): the objects still awaited are pushed with no session id."""
    from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
    from flwr.supercore.run import RunNotRunningException

    send_retrying = functools.partial(_retrying_send, RunNotRunningException)
    whereabouts = functools.partial(_whereabouts, pull_object)

    def push_messages(*args, **kwargs):
        send, push_object = kwargs["send"], kwargs["push_object"]
        lock, current = threading.Lock(), {}

        def sending(message, object_tree, runtime):
            missing, session = send_retrying(send, (message, object_tree, runtime))
            run_id = message.metadata.run_id
            if not missing and whereabouts(run_id, object_tree.object_id) == PENDING:
                missing, session = {tree.object_id for tree in iterate_object_tree(object_tree)
                                    if whereabouts(run_id, tree.object_id) == PENDING}, ""
                _say(f"reply {object_tree.object_id[:12]}: the SuperLink took it before and awaits "
                     f"{len(missing)} of its objects; pushed without a session id")
            current.update(args=(message, object_tree, runtime), session=session)
            return missing, session

        def pushing(run_id: int, _session: str, object_id: str, content: bytes) -> None:
            def settled(err: Exception, attempt: int) -> bool:
                _say(f"push-object {object_id[:12]} failed ({_cause(err)}); attempt {attempt + 1} of {PUSH_ATTEMPTS}")
                with lock:
                    if whereabouts(run_id, object_id) != PENDING:
                        return True
                    missing, session = send_retrying(send, current["args"])
                    current["session"] = session if object_id in missing else ""
                return False

            _retrying(lambda: push_object(run_id, current["session"], object_id, content), PUSH_ATTEMPTS, settled,
                      (RunNotRunningException,))

        push(*args, **{**kwargs, "send": sending, "push_object": pushing})

    return push_messages


def _retrying_send(passing, send, args):
    """``send(*args)`` (push-messages) tried up to :data:`PUSH_ATTEMPTS` times; ``passing`` passes at once."""
    failed = _try_again(lambda err: f"push-messages failed ({_cause(err)})", PUSH_ATTEMPTS)
    return _retrying(lambda: send(*args), PUSH_ATTEMPTS, failed, (passing,))


def _whereabouts(pull_object, run_id: int, object_id: str) -> str:
    """Where the SuperLink has ``object_id`` (:data:`HELD`, :data:`PENDING`, :data:`GONE`), asked
    with ``pull_object``; no answer counts as pending."""
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError

    try:
        pull_object(run_id, object_id)
    except ObjectPullError:
        return GONE
    except Exception:  # pylint: disable=broad-except  # awaited (ObjectUnavailableError), or no answer
        return PENDING
    return HELD


def _retrying(call, attempts: int, failed, passing: tuple = ()):
    """``call()``, tried up to ``attempts`` times: after each failure but the last (an exception
    of ``passing`` passes at once), ``failed(error, attempt)`` says True when the failure turned
    out a success (then None is returned), False to try again."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except passing:
            raise
        except Exception as err:  # pylint: disable=broad-except
            if attempt == attempts:
                raise
            if failed(err, attempt):
                return None
    raise AssertionError("unreachable")


def _try_again(describe, attempts: int, retried=lambda err: True):
    """A ``failed`` for :func:`_retrying`: an error ``retried`` refuses is raised; any other is said
    in one line, ``describe(error)`` and the attempt to come, and tried again after a wait that
    grows with each failure."""
    def failed(err: Exception, attempt: int) -> bool:
        if not retried(err):
            raise err
        _say(f"{describe(err)}; attempt {attempt + 1} of {attempts}")
        time.sleep(PUSH_RETRY_S * attempt)
        return False

    return failed


def survive_error_statuses(module: ModuleType) -> None:
    """Make ``module`` (``flwr.supernode.fleet_http_connection``) count a heartbeat answered with an
    error status as a failed heartbeat, sent again with Flower's back-off (Flower retries only
    502-504 and transport errors; any other status ends the heartbeat thread for good, and the
    SuperLink counts the node gone a few heartbeats later), and try an activate-node answered
    with another 5xx up to :data:`ACTIVATE_ATTEMPTS` times (Flower's SuperNode exits at once)."""
    import httpx

    sender, client = module.HeartbeatSender, module.FleetHttpClient
    activate = client.ActivateNode

    def heartbeat_sender(heartbeat_fn):
        def heartbeat() -> bool:
            try:
                return heartbeat_fn()
            except httpx.HTTPStatusError as err:
                _say(f"heartbeat answered {err.response.status_code}; sent again")
                return False

        return sender(heartbeat)

    def activate_node(self, request, *args, **kwargs):
        failed = _try_again(lambda err: f"activate-node answered {err.response.status_code}", ACTIVATE_ATTEMPTS,
                            lambda err: isinstance(err, httpx.HTTPStatusError) and err.response.status_code >= 500)
        return _retrying(lambda: activate(self, request, *args, **kwargs), ACTIVATE_ATTEMPTS, failed)

    module.HeartbeatSender = heartbeat_sender
    client.ActivateNode = activate_node


#: tries of a ClientApp's report that its task ended
TASK_END_ATTEMPTS = 4


def report_task_end(module: ModuleType, exit_module: ModuleType) -> None:
    """Make ``module`` (``flwr.supernode.runtime.run_clientapp``) report its task's end until the
    SuperNode has it, within the heartbeat patience.

    Flower's ClientApp, its reply pushed, reports the end once (its retries cut to one try) under
    ``exit_module``'s (``flwr.supercore.exit.exit``) 5 s force-exit timer. A SuperNode busy
    forwarding a large reply (64 MB at 1,000,000 nodes) answers later; the ClientApp is killed
    first, its task stays running without heartbeats, and when the task's token expires Flower's
    SuperNode answers every open message of the run, the next round's too, with "ClientApp
    stopped responding". Here the report is tried up to :data:`TASK_END_ATTEMPTS` times, each
    failure in one line, and the force-exit timer waits the heartbeat patience, after which the
    SuperNode counts the task crashed whatever the ClientApp does."""
    import httpx
    from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE

    def push_task_output(client, context, sub_status: str, details: str) -> None:
        request = module.PushTaskOutputRequest(
            context=module.context_to_proto(context) if context else None, sub_status=sub_status, details=details)

        failed = _try_again(lambda err: f"push-task-output failed ({_cause(err)})", TASK_END_ATTEMPTS,
                            lambda err: isinstance(err, httpx.HTTPError))
        try:
            _retrying(lambda: client.PushTaskOutput(request), TASK_END_ATTEMPTS, failed)
        except httpx.HTTPError as err:
            _say(f"the task's end was not reported ({_cause(err)}); its SuperNode counts it crashed")

    module.push_task_output = push_task_output
    exit_module.FORCE_EXIT_TIMEOUT_SECONDS = HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL
