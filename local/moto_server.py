"""Run moto's server on 127.0.0.1 with every request serialized.

Why serialized: moto's DynamoDB backend evaluates a condition expression and then writes the
item with no lock around the two, so two concurrent conditional writes can both pass their
check (lost updates were reproduced here with Python's switch interval lowered). Real DynamoDB
applies each conditional write atomically. Wrapping the whole WSGI app in one lock restores that
atomicity, so the concurrency tests test our protocol and not moto's threading.

Optional Lambda bridge (the local run, `local/run.sh`): with --lambda-endpoint, the one route a
Lambda invoke uses, `POST /2015-03-31/functions/<name or ARN>/invocations`, is forwarded to a
local Lambda emulator (`cargo lambda watch`) instead of moto, which would start Docker. Moto's
Step Functions interpreter calls every service over HTTP at localhost:$MOTO_PORT, so its
`lambda:invoke` tasks then run our Rust Lambda binaries. The function name is the last segment
of the ARN (a `:qualifier` is dropped), and a function deployed from template.yaml is handed to
the binary its code was staged from (emulated_name). A forwarded call
does NOT hold the serialization lock: the Lambda calls DynamoDB back through this server.

Two deviations of moto's Step Functions interpreter from AWS in how a Task state ends are fixed
(each patch replaces or wraps methods of the pinned moto, checked by a digest of their source: a
moto upgrade that changes them stops the server with an error rather than silently running
without them). StopExecution of an execution whose Task state is waiting (for a Lambda, or for
a task token) left it RUNNING until the task answered; on AWS the execution is ABORTED at once
and the Lambda runs on (a zombie): exactly the situation the semaphore must survive, so the
local run and the tests of a waiter stopped in line need it. And a task token stayed good after
its task had ended (timed out, completed, or its execution ended): SendTaskSuccess to it
succeeded and did nothing, where AWS answers TaskTimedOut ("the task associated with the token
has already been closed"), which is how the semaphore learns that a waiter it granted a slot
did not take it. And a callback task's token was made once per state entry and kept through its
Retry attempts, where AWS gives every attempt a new one and closes the one it replaced
(patch_task_token_per_attempt).

A Catch whose Next is its own state (the acquire state catches its own States.Timeout to check
again, as AWS allows) was taken by moto for no Catch at all: the
execution went on to the state's Next, here the protected work, without a slot. Fixed by
wrapping the catcher and the choice of the next state.

Two more deviations, of the context object, are fixed too (all of them whether or not the
bridge is on): moto has no `$$.Execution.RedriveCount`, which AWS gives every execution (0
until it is redriven), so any definition reading it failed with States.Runtime; the patch adds
it, 0 (moto cannot redrive), and steps aside once moto has the field itself. And moto's `$$.Execution.StartTime` is a Python
datetime, not the ISO 8601 text AWS gives: a state output holding it broke DescribeExecution.
And the Step Functions integration (`states:startExecution`, `.sync`, `.sync:2`, what the
lock-protected machine runs its work with) did not work at all: moto 5.2.5 ships the methods
that map a task's parameters to the SDK's names and the answer back to the names AWS gives
(`StateMachineArn` -> `stateMachineArn`, `executionArn` -> `ExecutionArn`, `output` ->
`Output`) as no-ops, so every such task failed with States.Runtime "'StateMachineArn'". The
patch maps them for that integration, from botocore's model of the API, as AWS does.

One AWS limit moto does not have is enforced, before moto sees the request: StartExecution's
input of at most 256 KB (limit_start_execution_input).

DynamoDB's TransactWriteItems honours its ClientRequestToken (see
patch_transaction_idempotency): a committed transaction sent again with its token succeeds
without applying twice, as on AWS; moto evaluated it anew. And a transaction costs what its
items cost (patch_transaction_rollback_per_item): moto copied every table it named, to roll
back, so each write to a gate lock of 10,000 holdings copied all of them.

CloudFormation, which the local run deploys template.yaml with (local/deploy_stack.py, after the
SAM transform), has three gaps patched: an AWS::StepFunctions::StateMachine's
DefinitionSubstitutions were ignored (patch_state_machine_from_cloudformation), an
`AWS::NoValue` in a list stayed as a null (patch_no_value_in_lists), and AWS::CloudWatch::Alarm
was not a resource moto's CloudFormation makes (patch_alarm_from_cloudformation), so the
dashboard's `${Alarm.Arn}` failed the stack. And CloudFormation's deploy-time rules, none of which
moto had, are enforced (patch_deploy_time_rules, F16): a template from S3 over 1 MB, more
resources, outputs, parameters or mappings than the quotas, and, on the values as resolved, an
export that is empty or whitespace-only, over 1,024 characters, named with other characters than
alphanumerics, colons and hyphens or over 256, or a name already exported in the region; an
SSM parameter whose value is empty or over its tier's size. A broken rule of the resolved stack
rolls it back (ROLLBACK_COMPLETE, its reason naming the rule, the output or resource, and the
fix), as on AWS. And a template's Rules are evaluated on the parameters as resolved, before
anything is created or changed: a false assertion refuses CreateStack or UpdateStack with its
AssertDescription, as CloudFormation does (template.yaml's refuses an unacknowledged "*" prefix);
a rule function the local server does not evaluate is refused by name, never passed.

And one limit of AWS that moto leaves out is enforced: a task whose parameters (a Lambda
payload, a child execution's input) pass Step Functions' 256 KiB fails with
States.DataLimitExceeded, as on AWS (moto checks only results and state outputs); and that
error is terminal, as on AWS: a Catch or Retry of States.ALL does not match it.

Express workflows and Distributed Map (#27): moto kept every machine's interpreter type STANDARD
whatever it was created as (patch_state_machine_type); it refused a Distributed Map whose
children are Express (`"ExecutionType": "EXPRESS"`: its grammar has only STANDARD; the type is
never read when the map runs, so the definition is parsed as STANDARD there,
patch_distributed_map_definitions); it gave every child of a Distributed Map the parent's
`$$.Execution` (the children are threads of the parent's execution), so children that pass
`$$.Execution.Id` to the semaphore were all one holder (patch_distributed_child_context gives
each child an id of its own, `execution:<machine>/<map>:<uuid>`); it let a Distributed Map
whose children failed succeed, whatever its tolerated failures (patch_tolerated_failures: it
fails with States.ExceedToleratedFailureThreshold, as on AWS); it named an execution started
without a name `None`, so the second such start failed, and an Express start reusing a name
started nothing, where AWS starts a new one (patch_unnamed_executions). And three AWS rules for
Express that moto does not have are enforced: an Express definition with `.waitForTaskToken`,
`.sync` or an activity is refused (patch_express_definitions); an Express execution ends
TIMED_OUT after 5 minutes (patch_express_duration); and DescribeExecution, GetExecutionHistory
and ListExecutions of Express executions are refused as AWS refuses them
(patch_express_not_describable): what the semaphore does for Express must not rely on them.
Express execution ARNs keep moto's `:execution:` form (AWS writes `:express:`); nothing here
reads the kind from the ARN of an execution the local server made.

GetExecutionHistory answers in pages of maxResults events (100 by default, at most 1,000),
newest first on request (reverseOrder), with a nextToken to the next (patch_history_pages): moto
answered every event at once, oldest first, whatever was asked.

Step Functions' execution mode (moto runs the executions with its States Language interpreter)
is on from the start (execute_state_machines).

Usage: python moto_server.py [--port N] [--port-file PATH] [--parent-pid PID]
                             [--lambda-endpoint URL] [--lambda-concurrency N]
  --port 0 picks a free port; the chosen port is printed and written to --port-file.
  With --parent-pid the server exits when that process is gone (a test binary that spawned
  it cannot run destructors on exit).
  --lambda-endpoint URL forwards every Lambda invoke to the emulator at URL. Without it, the
  server is moto alone, as before.
  --lambda-concurrency N (default 64): at most N invokes are forwarded at once; the others wait
  in the bridge, as a Lambda concurrency limit holds invokes back. The emulator
  (cargo lambda watch 1.9.2) stopped handing invokes to idle function processes once about
  270 were pending (a 200-execution local run, every waiting execution polling acquire), and
  the run hung; with the cap it never has that many.
"""

import argparse
import functools
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid


def require_source(method, expected_sha256, patch):
    """Stops the server unless `method` is the moto code `patch` was written for (the sha256 of
    its source; `inspect` reads through a `functools.wraps` wrapper of an earlier patch): a moto
    upgrade must fail loudly, never run without the fix."""
    import hashlib
    import inspect

    digest = hashlib.sha256(inspect.getsource(method).encode()).hexdigest()
    if digest != expected_sha256:
        raise SystemExit(
            f"moto_server.py: moto's {method.__qualname__} is not the one the {patch} patch was "
            f"written for (sha256 {digest}); moto is pinned in local/requirements.txt: review "
            "the patch before changing the pin"
        )


def serialized(app):
    lock = threading.Lock()

    def wrapped(environ, start_response):
        with lock:
            # Drain the body inside the lock: a lazy iterable would run outside it.
            return [b"".join(app(environ, start_response))]

    return wrapped


INVOKE_PREFIX = "/2015-03-31/functions/"
INVOKE_SUFFIX = "/invocations"
# Request headers of the Invoke API that the emulator understands; everything else is moto's.
FORWARDED_REQUEST_HEADERS = ("X-Amz-Invocation-Type", "X-Amz-Log-Type", "X-Amz-Client-Context")


def function_name(path):
    """`/2015-03-31/functions/<name or ARN>/invocations` -> the bare function name, else None."""
    if not (path.startswith(INVOKE_PREFIX) and path.endswith(INVOKE_SUFFIX)):
        return None
    target = urllib.parse.unquote(path[len(INVOKE_PREFIX) : -len(INVOKE_SUFFIX)])
    if not target or "/" in target:
        return None
    if ":function:" in target:
        # arn:aws:lambda:REGION:ACCOUNT:function:NAME[:QUALIFIER]
        target = target.split(":function:", 1)[1]
    return target.split(":", 1)[0] or None


def emulated_name(name):
    """The emulator's name for the function `name`: `cargo lambda watch` serves the project's
    cargo binaries by their names, while a function deployed from template.yaml has the name
    CloudFormation gave it (`semaphore-local-AcquireFunction-X1Y2`). local/deploy_stack.py
    stages each function's code as `<binary>.zip`, so the function's S3Key names its binary. A
    function moto does not know (the local run's own work function) keeps its name."""
    from moto.awslambda.models import lambda_backends
    from moto.core import DEFAULT_ACCOUNT_ID

    for backend in list(lambda_backends[DEFAULT_ACCOUNT_ID].values()):
        try:
            key = backend.get_function(name).code.get("S3Key", "")
        except Exception:  # moto's UnknownFunctionException, or a function without code
            continue
        if key.endswith(".zip"):
            return key.rsplit("/", 1)[-1][: -len(".zip")]
    return name


def invoke_response(start_response, status, content_type, payload):
    """Answers as the Lambda Invoke API does, which is not what the emulator does.

    A function error is HTTP 200 with `X-Amz-Function-Error: Unhandled` and the error document
    (`{"errorType", "errorMessage"}`) as the payload: that is what Step Functions turns into a
    named error for Retry/Catch. cargo lambda's emulator answers it with HTTP 500 instead, which
    botocore (and so moto's interpreter) would take for a failure of the Lambda service itself.
    Every answer carries a request id, as botocore expects.
    """
    headers = [
        ("Content-Type", content_type),
        ("X-Amz-Executed-Version", "$LATEST"),
        ("x-amzn-RequestId", str(uuid.uuid4())),
    ]
    if status == 200:
        start_response("200 OK", headers + [("Content-Length", str(len(payload)))])
        return [payload]
    try:
        document = json.loads(payload)
    except ValueError:
        document = None
    if status == 500 and isinstance(document, dict) and "errorType" in document:
        headers.append(("X-Amz-Function-Error", "Unhandled"))
        start_response("200 OK", headers + [("Content-Length", str(len(payload)))])
        return [payload]
    # Anything else is the emulator refusing the call (e.g. an unknown function): a service
    # error, shaped like one.
    error_type = "ResourceNotFoundException" if status == 404 else "ServiceException"
    body = json.dumps(
        {"Type": "Service", "message": payload.decode("utf-8", "replace")[:2000]}
    ).encode()
    headers = [h for h in headers if h[0] != "Content-Type"] + [
        ("Content-Type", "application/json"),
        ("x-amzn-ErrorType", error_type),
        ("Content-Length", str(len(body))),
    ]
    code = status if status >= 400 else 502
    start_response(f"{code} {'Not Found' if code == 404 else 'Error'}", headers)
    return [body]


def lambda_bridge(app, endpoint, concurrency):
    """Forwards Lambda invokes to the emulator at `endpoint`, at most `concurrency` at once;
    everything else goes to app."""
    slots = threading.BoundedSemaphore(concurrency)

    def wrapped(environ, start_response):
        name = None
        if environ.get("REQUEST_METHOD") == "POST":
            # PATH_INFO is already percent-decoded by the WSGI server; RAW_URI/REQUEST_URI
            # are not. Either form works with function_name().
            name = function_name(environ.get("PATH_INFO", ""))
        if name is None:
            return app(environ, start_response)
        name = emulated_name(name)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        url = f"{endpoint.rstrip('/')}{INVOKE_PREFIX}{urllib.parse.quote(name, safe='')}{INVOKE_SUFFIX}"
        request = urllib.request.Request(url, data=body, method="POST")
        request.add_header("Content-Type", environ.get("CONTENT_TYPE") or "application/json")
        for header in FORWARDED_REQUEST_HEADERS:
            value = environ.get("HTTP_" + header.upper().replace("-", "_"))
            if value:
                request.add_header(header, value)
        with slots:
            try:
                # Longer than any function's timeout in template.yaml (the sweeper's 300 s).
                response = urllib.request.urlopen(request, timeout=900)
            except urllib.error.HTTPError as error:
                response = error
            except OSError as error:
                message = f"lambda bridge: {url} unreachable: {error}".encode()
                return invoke_response(start_response, 502, "text/plain", message)
            with response:
                payload = response.read()
                status = getattr(response, "status", None) or response.code
                content_type = response.headers.get("Content-Type") or "application/json"
        return invoke_response(start_response, status, content_type, payload)

    return wrapped


# sha256 of the source of moto 5.2.5's ExecutionState._evaluate_with_timeout, the method that
# patch_stop_aborts_waiting_tasks() replaces.
EVALUATE_WITH_TIMEOUT_SHA256 = "c56deda08a42e98d3958bfb2ab95de74c7ec7a515085614a80e1ea4948722485"


def patch_stop_aborts_waiting_tasks():
    """Makes a Task state stop waiting for its work when the execution is stopped or timed out.

    Moto's version waits for the task's worker thread for up to TimeoutSeconds without looking
    at the execution's state. This one waits in slices and, once the execution is no longer
    running, closes the task's frame and returns: the state then ends without output, the
    execution records ExecutionAborted and reports ABORTED, and the worker thread (the Lambda
    call, or the wait for a task token, whose token is then unknown: InvalidToken) carries on
    unobserved, as a Lambda does on AWS after StopExecution.
    """
    import copy

    from moto.stepfunctions.parser.asl.component.common.timeouts.timeout import (
        EvalTimeoutError,
    )
    from moto.stepfunctions.parser.asl.component.state.exec import execute_state
    from moto.stepfunctions.parser.utils import TMP_THREADS

    state_class = execute_state.ExecutionState
    require_source(state_class._evaluate_with_timeout, EVALUATE_WITH_TIMEOUT_SHA256, "StopExecution")

    def _evaluate_with_timeout(self, env):
        self.timeout.eval(env=env)
        timeout_seconds = env.stack.pop()

        frame = env.open_frame()
        frame.states.reset(input_value=env.states.get_input())
        frame.stack = copy.deepcopy(env.stack)
        execution_outputs = []
        execution_exceptions = [None]
        terminated_event = threading.Event()

        def _exec_and_notify():
            try:
                self._eval_execution(frame)
                execution_outputs.extend(frame.stack)
            except Exception as ex:
                execution_exceptions.append(ex)
            terminated_event.set()

        thread = threading.Thread(target=_exec_and_notify, daemon=True)
        TMP_THREADS.append(thread)
        thread.start()

        deadline = time.monotonic() + timeout_seconds
        finished_on_time = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if terminated_event.wait(min(remaining, 0.1)):
                finished_on_time = True
                break
            if not env.is_running():
                # Stopped (or timed out) while the task runs: leave it running, unobserved.
                env.close_frame(frame)
                return
        frame.set_ended()
        env.close_frame(frame)

        execution_exception = execution_exceptions.pop()
        if execution_exception:
            raise execution_exception

        if not finished_on_time:
            raise EvalTimeoutError()

        execution_output = execution_outputs.pop()
        env.stack.append(execution_output)

        if not self._is_language_query_jsonpath():
            env.states.set_result(execution_output)

        if self.assign_decl:
            self.assign_decl.eval(env=env)

        if self.result_selector:
            self.result_selector.eval(env=env)

        if self.result_path:
            self.result_path.eval(env)
        else:
            res = env.stack.pop()
            env.states.reset(input_value=res)

    state_class._evaluate_with_timeout = _evaluate_with_timeout


# sha256 of the sources of moto 5.2.5's StateTaskServiceCallback._eval_body (makes a task's
# token and runs the task) and CallbackPoolManager.add (registers a token), which
# patch_closed_task_tokens() wraps.
CALLBACK_EVAL_BODY_SHA256 = "1565ede7010df6af128057e199741623fe7d813996476dea3b2f9d647a1d9ab4"
CALLBACK_POOL_ADD_SHA256 = "642af2a3229b6856bc2fddd992cf4a4b2e9fd3ca37208d6eed5bdfb46280e225"

# The tokens of tasks that have ended (patch_closed_task_tokens) or of attempts a retry replaced
# (patch_task_token_per_attempt): SendTask* with one of them answers TaskTimedOut.
CLOSED_TASK_TOKENS = set()
CLOSED_TASK_TOKENS_LOCK = threading.Lock()


def close_task_token(token):
    with CLOSED_TASK_TOKENS_LOCK:
        CLOSED_TASK_TOKENS.add(token)


def patch_closed_task_tokens():
    """Makes a task token unusable once its task has ended, as on AWS.

    Moto keeps every token of an execution in its callback pool for good, so SendTaskSuccess,
    SendTaskFailure and SendTaskHeartbeat with the token of a task that timed out or was already
    completed succeed while the execution runs, and change nothing. (Its own code for such a
    token raises TaskTimedOut or TaskDoesNotExist without the message their constructor needs:
    an HTTP 500.) AWS answers TaskTimedOut. Once a `.waitForTaskToken` task's state has been
    evaluated, however it ended, its token is remembered as closed, and the three calls answer
    it with TaskTimedOut.
    """
    import inspect

    from moto.stepfunctions.parser.api import TaskTimedOut
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (
        StateTaskServiceCallback,
    )
    from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackPoolManager
    from moto.stepfunctions.parser.models import StepFunctionsParserBackend

    for method, expected in (
        (StateTaskServiceCallback._eval_body, CALLBACK_EVAL_BODY_SHA256),
        (CallbackPoolManager.add, CALLBACK_POOL_ADD_SHA256),
    ):
        require_source(method, expected, "task-token")
    callbacks = ("send_task_success", "send_task_failure", "send_task_heartbeat")
    for name in callbacks:
        parameters = list(inspect.signature(getattr(StepFunctionsParserBackend, name)).parameters)
        if parameters[:2] != ["self", "task_token"]:
            raise SystemExit(
                f"moto_server.py: moto's StepFunctionsParserBackend.{name} takes {parameters}, "
                "not (self, task_token, ...): review the task-token patch"
            )

    # The endpoint a task state's thread registered last: _eval_body registers its task's
    # token and evaluates the task in the same thread (branches of Parallel and Map states run
    # in threads of their own).
    registered = threading.local()
    original_add = CallbackPoolManager.add
    original_eval_body = StateTaskServiceCallback._eval_body

    def add(self, callback_id):
        endpoint = original_add(self, callback_id)
        registered.endpoint = endpoint
        return endpoint

    def _eval_body(self, env):
        registered.endpoint = None
        try:
            original_eval_body(self, env)
        finally:
            endpoint = registered.endpoint
            registered.endpoint = None
            if endpoint is not None:
                close_task_token(endpoint.callback_id)

    def refuse_closed(original):
        def callback(self, task_token, *args, **kwargs):
            with CLOSED_TASK_TOKENS_LOCK:
                is_closed = task_token in CLOSED_TASK_TOKENS
            if is_closed:
                raise TaskTimedOut(
                    "Task Timed Out: 'Provided task does not exist anymore'", "TaskTimedOut"
                )
            return original(self, task_token, *args, **kwargs)

        return callback

    CallbackPoolManager.add = add
    StateTaskServiceCallback._eval_body = _eval_body
    for name in callbacks:
        setattr(
            StepFunctionsParserBackend,
            name,
            refuse_closed(getattr(StepFunctionsParserBackend, name)),
        )


# sha256 of the sources of moto 5.2.5's ExecutionState._eval_state (a state's attempts: its
# Retry loop, one _evaluate_with_timeout per attempt, RetryCount counted by _handle_retry) and
# ContextObject.update_task_token (makes a task's token), which patch_task_token_per_attempt()
# relies on.
EVAL_STATE_SHA256 = "88a5f8e4c72b10849ada6345c535c9eb30519136b9bb838952f2d9b5ce38ff0b"
UPDATE_TASK_TOKEN_SHA256 = "16d3cd21a9fc8463ded4dbe92a4dbdae27754b418b6b45aff7ed9e9bf31d4d32"


def patch_task_token_per_attempt():
    """Gives every attempt of a `.waitForTaskToken` task a token of its own, as AWS does.

    moto 5.2.5 makes a callback task's token once per state entry and keeps it through the
    state's Retry attempts. On AWS each attempt gets a new token, and the attempt it replaced is
    over: a callback with that token answers TaskTimedOut. The acquire state retries
    SemaphoreRateLimited (and Lambda's transient errors): the acquire function gives the
    waiter's record each attempt's token, and a wake-up sent to a replaced one must fail here as
    it does on AWS, or a test could not tell a design that keeps the first token from one that
    follows them. Wraps the per-attempt evaluation: from the second attempt on (RetryCount > 0),
    the token before is closed and a new one made and registered. Applied after
    patch_stop_aborts_waiting_tasks (which replaces that method) and patch_closed_task_tokens
    (whose close at the state's end then closes the last attempt's token).
    """
    from moto.stepfunctions.parser.asl.component.state.exec import execute_state
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.resource import (
        ResourceCondition,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (
        StateTaskServiceCallback,
    )
    from moto.stepfunctions.parser.asl.eval.states import ContextObject

    require_source(execute_state.ExecutionState._eval_state, EVAL_STATE_SHA256, "task-token-per-attempt")
    require_source(ContextObject.update_task_token, UPDATE_TASK_TOKEN_SHA256, "task-token-per-attempt")
    original = execute_state.ExecutionState._evaluate_with_timeout

    def _evaluate_with_timeout(self, env):
        context = env.states.context_object
        data = context.context_object_data
        if (
            isinstance(self, StateTaskServiceCallback)
            and self.resource.condition == ResourceCondition.WaitForTaskToken
            and (data.get("State") or {}).get("RetryCount", 0) > 0
        ):
            previous = (data.get("Task") or {}).get("Token")
            if previous is not None:
                close_task_token(previous)
            env.callback_pool_manager.add(context.update_task_token())
        return original(self, env)

    execute_state.ExecutionState._evaluate_with_timeout = _evaluate_with_timeout


def patch_context_object():
    """Makes `$$.Execution` what AWS gives: `RedriveCount: 0` and `StartTime` as text.

    moto 5.2.5 builds `$$.Execution` without RedriveCount (and has no RedriveExecution), so a
    definition that passes it to a Lambda, as lock-protected.asl.json does, failed in its first
    Task state; and its StartTime is a datetime, which a state's output cannot be serialized
    with. Wraps the method that builds an execution's environment.
    """
    import datetime

    from moto.stepfunctions.parser.asl.eval.states import ExecutionData
    from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker

    has_redrive_count = "RedriveCount" in ExecutionData.__annotations__
    original = ExecutionWorker._get_evaluation_environment

    def _get_evaluation_environment(self):
        env = original(self)
        # Frames share this dict, so every state of the execution sees the change.
        execution = env.states.context_object.context_object_data["Execution"]
        if not has_redrive_count:
            execution.setdefault("RedriveCount", 0)
        if isinstance(execution.get("StartTime"), datetime.datetime):
            # As EnteredTime is written: ISO 8601, UTC offset included.
            execution["StartTime"] = execution["StartTime"].isoformat()
        return env

    ExecutionWorker._get_evaluation_environment = _get_evaluation_environment


def patch_catch_to_the_same_state():
    """Lets a Catch send a state back to itself, as AWS does.

    moto 5.2.5 decides a state's next state after its Catch ran by comparing the next state's
    name with the state's own: equal means "nothing overrode Next", so a Catch whose Next is the
    state itself (the acquire state, "Acquire slot", catches its own States.Timeout to
    park again) is taken for no Catch at all, and the execution goes on to the state's Next,
    here into the protected work without a slot. Wraps the catcher (to mark the state it sent
    the execution to) and the choice of the next state (to keep that choice).
    """
    from moto.stepfunctions.parser.asl.component.common.catch.catcher_decl import CatcherDecl
    from moto.stepfunctions.parser.asl.component.common.catch.catcher_outcome import (
        CatcherOutcomeCaught,
    )
    from moto.stepfunctions.parser.asl.component.state.state import CommonStateField

    original_catch = CatcherDecl._eval_body
    original_set_next = CommonStateField._set_next

    def _eval_body(self, env):
        original_catch(self, env)
        if env.stack and isinstance(env.stack[-1], CatcherOutcomeCaught):
            env._caught_to = self.next_decl.name

    def _set_next(self, env):
        if getattr(env, "_caught_to", None) == self.name == env.next_state_name:
            env._caught_to = None
            return
        env._caught_to = None
        original_set_next(self, env)

    CatcherDecl._eval_body = _eval_body
    CommonStateField._set_next = _set_next


def patch_step_functions_integration():
    """Maps the `states` integration's parameters and answers between the names AWS uses and
    the SDK's, which moto 5.2.5 leaves undone (its two methods for it are stubs).

    AWS takes `StateMachineArn`, `Name`, `Input` and answers `ExecutionArn`, `StartDate` (and
    for `.sync:2` the child's DescribeExecution as `Output`, `Status`, `Error`, `Cause`, ...):
    moto's own `.sync` code expects the answer so named. Only this integration is mapped, with
    moto's own mapping helpers and botocore's model of the API; a moto whose methods are no
    longer stubs is left alone.
    """
    import datetime
    import inspect

    import botocore.session
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service import (
        StateTaskService,
    )
    from moto.stepfunctions.parser.utils import snake_to_camel_case

    def is_stub(method):
        return inspect.getsource(method).rstrip().endswith("pass")

    original_parameters = StateTaskService._normalise_parameters
    original_response = StateTaskService._normalise_response
    if not (is_stub(original_parameters) and is_stub(original_response)):
        return
    model = botocore.session.get_session().get_service_model("stepfunctions")

    def operation(task, boto_service_name, service_action_name):
        if task._get_boto_service_name(boto_service_name=boto_service_name) != "stepfunctions":
            return None
        action = task._get_boto_service_action(service_action_name=service_action_name)
        return model.operation_model(snake_to_camel_case(action))

    def _normalise_parameters(self, parameters, boto_service_name=None, service_action_name=None):
        op = operation(self, boto_service_name, service_action_name)
        if op is None or op.input_shape is None:
            return original_parameters(self, parameters, boto_service_name, service_action_name)
        self._to_boto_request(parameters, op.input_shape)

    def epoch_millis(value):
        # AWS gives the answer's dates as epoch milliseconds; a datetime left in a state's
        # output made moto's DescribeExecution of the parent fail.
        if isinstance(value, datetime.datetime):
            return int(value.timestamp() * 1000)
        if isinstance(value, dict):
            return {k: epoch_millis(v) for k, v in value.items()}
        return value

    def _normalise_response(self, response, boto_service_name=None, service_action_name=None):
        op = operation(self, boto_service_name, service_action_name)
        if op is None or op.output_shape is None:
            return original_response(self, response, boto_service_name, service_action_name)
        self._from_boto_response(response, op.output_shape)
        if isinstance(response, dict):
            response.update(epoch_millis(response))

    StateTaskService._normalise_parameters = _normalise_parameters
    StateTaskService._normalise_response = _normalise_response


# StartExecution's input, at most 262,144 bytes of UTF-8 (Step Functions API reference,
# StartExecution / ExecutionStartedEventDetails: "Length Constraints: Maximum length of 262144",
# "expressed as bytes in UTF-8 encoding"). Moto 5.2.5 starts an execution with any input.
START_EXECUTION_INPUT_MAX_BYTES = 262144


def limit_start_execution_input(app):
    """Refuses a StartExecution (or StartSyncExecution) whose input is over 256 KB, as AWS does.

    Moto starts it; AWS answers ValidationException before anything starts. Whatever starts an
    execution meets it: a client, EventBridge delivering a status event to the cleanup machine
    (the local run plays that delivery through the same API), or a `states:startExecution` task
    (moto's interpreter calls this server over HTTP). A wrapper of the WSGI app, not of moto's
    code; the number is checked against botocore's model of the API at start, so a change there
    stops the server instead of enforcing a stale limit.
    """
    import io

    import botocore.session

    shape = (
        botocore.session.get_session()
        .get_service_model("stepfunctions")
        .operation_model("StartExecution")
        .input_shape.members["input"]
    )
    if shape.metadata.get("max") != START_EXECUTION_INPUT_MAX_BYTES:
        raise SystemExit(
            "moto_server.py: botocore's model gives StartExecution's input a maximum of "
            f"{shape.metadata.get('max')}, not {START_EXECUTION_INPUT_MAX_BYTES}: review "
            "limit_start_execution_input"
        )
    targets = {"AWSStepFunctions.StartExecution", "AWSStepFunctions.StartSyncExecution"}

    def wrapped(environ, start_response):
        if environ.get("HTTP_X_AMZ_TARGET") not in targets:
            return app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        try:
            given = json.loads(body or b"{}").get("input") or ""
        except ValueError:
            return app(environ, start_response)
        size = len(given.encode("utf-8"))
        if size <= START_EXECUTION_INPUT_MAX_BYTES:
            return app(environ, start_response)
        payload = json.dumps(
            {
                "__type": "ValidationException",
                "message": "1 validation error detected: Value at 'input' failed to satisfy "
                f"constraint: Member must have length less than or equal to "
                f"{START_EXECUTION_INPUT_MAX_BYTES} (it is {size} bytes)",
            }
        ).encode()
        start_response(
            "400 Bad Request",
            [
                ("Content-Type", "application/x-amz-json-1.0"),
                ("Content-Length", str(len(payload))),
                ("x-amzn-ErrorType", "ValidationException"),
            ],
        )
        return [payload]

    return wrapped


# sha256 of the source of moto 5.2.5's DynamoHandler.transact_write_items, which
# patch_transaction_idempotency() wraps.
TRANSACT_WRITE_ITEMS_SHA256 = "61c163fff213f33a39317a17fda194a9c1e800992421575d2080f4500bf45372"
# "A client request token is valid for 10 minutes after the first request that uses it is
# completed" (TransactWriteItems, ClientRequestToken, Amazon DynamoDB API Reference).
IDEMPOTENCY_WINDOW_SECONDS = 600


def patch_transaction_idempotency():
    """Makes TransactWriteItems honour its ClientRequestToken, as DynamoDB does.

    Moto ignores the token: a transaction sent again after its answer was lost (the SDK re-sends
    the same request, token included) is evaluated anew, and a grant that committed is then
    refused by its own effects. DynamoDB (API Reference, TransactWriteItems, ClientRequestToken):
    "multiple identical calls have the same effect as one single call"; "If the original
    TransactWriteItems call was successful, subsequent TransactWriteItems calls with the same
    client token return successfully without making any changes"; the token is valid for 10
    minutes after the first request that used it completed, after which it is a new request;
    "If you submit a request with the same client token but a change in other parameters within
    the 10-minute idempotency window, DynamoDB returns an IdempotentParameterMismatch
    exception". This wrapper remembers each committed transaction's token with a digest of the
    rest of its request, answers a repeat success without applying it, and a repeat with other
    parameters IdempotentParameterMismatchException. A cancelled transaction is not
    remembered: nothing of it committed. (Requests are serialized, so the "in progress" case,
    TransactionInProgressException, cannot arise here; tests produce it through the proxy.)
    """
    import hashlib

    from moto.core.responses import ActionResult
    from moto.dynamodb.exceptions import ERROR_TYPE_PREFIX, DynamodbException
    from moto.dynamodb.responses import DynamoHandler

    original = DynamoHandler.transact_write_items
    require_source(original, TRANSACT_WRITE_ITEMS_SHA256, "idempotency")

    class IdempotentParameterMismatchException(DynamodbException):
        def __init__(self):
            super().__init__(
                ERROR_TYPE_PREFIX + "IdempotentParameterMismatchException",
                message="The request uses the same client token as a previous, but non-identical "
                "request. Do not reuse a client token with different requests, unless the "
                "requests are identical.",
            )

    # (account, region, token) -> (digest of the other parameters, when it committed)
    committed = {}

    def transact_write_items(self):
        token = self.body.get("ClientRequestToken")
        if not token:
            return original(self)
        rest = {k: v for k, v in self.body.items() if k != "ClientRequestToken"}
        # Binary attribute values are parsed into bytes: written as their repr.
        text = json.dumps(rest, sort_keys=True, default=repr)
        fingerprint = hashlib.sha256(text.encode()).hexdigest()
        key = (self.current_account, self.region, token)
        now = time.monotonic()
        for stale in [k for k, (_, at) in committed.items() if now - at > IDEMPOTENCY_WINDOW_SECONDS]:
            del committed[stale]
        seen = committed.get(key)
        if seen is not None:
            if seen[0] != fingerprint:
                raise IdempotentParameterMismatchException()
            # Committed already: succeed again without applying it again.
            return ActionResult({"ConsumedCapacity": [], "ItemCollectionMetrics": {}})
        result = original(self)
        committed[key] = (fingerprint, time.monotonic())
        return result

    DynamoHandler.transact_write_items = transact_write_items


# sha256 of the source of moto 5.2.5's StateTaskService._before_eval_execution (records a
# service task's TaskScheduled with its parameters), which patch_task_parameters_quota() wraps.
BEFORE_EVAL_EXECUTION_SHA256 = "6c5ad214e88d62d5e6f1ca69aefee77cf1218f8711eec905b37f9b4beb38820b"


def patch_task_parameters_quota():
    """Fails a task whose parameters pass Step Functions' 256 KiB quota, as AWS does.

    Step Functions service quotas, "Maximum input or output size for a task, state, or
    execution: 256 KiB of data as a UTF-8 encoded string", which "affects tasks (activity,
    Lambda function, or integrated service), state or execution output, and input data when
    scheduling a task, entering a state, or starting an execution"; the history's
    TaskScheduled parameters and LambdaFunctionScheduled input have a "Maximum length of
    262144" (Step Functions API reference). Past it the task fails with
    States.DataLimitExceeded. moto 5.2.5 checks a state's output and a task's result against
    that quota (moto.stepfunctions.parser.quotas, 256 * 1024 bytes), but not the parameters a
    task is scheduled with: a lambda:invoke payload of any size went through, so a payload that
    carries the execution input beside more (the whole $$.Execution, a task token) never failed
    here. Lambda's own limit on a synchronous invoke is 6 MB, so the 256 KiB of Step Functions is
    the one that binds. Wraps the method that schedules a service task (lambda:invoke,
    states:startExecution, ...).
    """

    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service import (
        StateTaskService,
    )
    from moto.stepfunctions.parser.api import HistoryEventType, TaskFailedEventDetails
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEvent,
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import (
        StatesErrorName,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails
    from moto.stepfunctions.parser.asl.utils.encoding import to_json_str
    from moto.stepfunctions.parser.quotas import MAX_STATE_SIZE_UTF8_BYTES

    method = StateTaskService._before_eval_execution
    require_source(method, BEFORE_EVAL_EXECUTION_SHA256, "task-parameters quota")
    if MAX_STATE_SIZE_UTF8_BYTES != 256 * 1024:
        raise SystemExit(
            f"moto_server.py: moto's state size quota is {MAX_STATE_SIZE_UTF8_BYTES} bytes, "
            "not Step Functions' 256 KiB: review the task-parameters quota patch"
        )
    original = method

    def _before_eval_execution(self, env, resource_runtime_part, raw_parameters, state_credentials):
        size = len(to_json_str(raw_parameters).encode("utf-8"))
        if size > MAX_STATE_SIZE_UTF8_BYTES:
            error = StatesErrorNameType.StatesStatesDataLimitExceeded
            raise FailureEventException(
                failure_event=FailureEvent(
                    env=env,
                    error_name=StatesErrorName(typ=error),
                    event_type=HistoryEventType.TaskFailed,
                    event_details=EventDetails(
                        taskFailedEventDetails=TaskFailedEventDetails(
                            error=error.to_name(),
                            cause=(
                                f"The task's parameters are {size} bytes, more than the "
                                f"{MAX_STATE_SIZE_UTF8_BYTES} bytes a task may be scheduled with."
                            ),
                            resourceType=self._get_sfn_resource_type(),
                            resource=self._get_sfn_resource(),
                        )
                    ),
                )
            )
        return original(self, env, resource_runtime_part, raw_parameters, state_credentials)

    StateTaskService._before_eval_execution = _before_eval_execution


# sha256 of the source of moto 5.2.5's ErrorEqualsDecl._eval_body (whether a Retry's or a
# Catch's ErrorEquals matches an error), which patch_data_limit_is_terminal() wraps.
ERROR_EQUALS_EVAL_BODY_SHA256 = "aeda14a0cc01747d7fe2e620ba35c9c78b43178fbb03665b8578c206f196b019"


def patch_data_limit_is_terminal():
    """Makes States.DataLimitExceeded the terminal error AWS makes it: States.ALL does not match it.

    Step Functions, "Handling errors in Step Functions workflows", error names:
    "States.DataLimitExceeded: a terminal error that can't be caught by the States.ALL error
    type" (reported when a connector's output, a state's output, or a state's input after
    Parameters is larger than the payload size quota). moto 5.2.5 matched States.ALL with every
    error, so a Catch of States.ALL (the lock-protected machine's "Release after failure")
    handled a payload over the quota that on AWS fails the execution outright, its slot left for
    the cleanup. An ErrorEquals that names States.DataLimitExceeded itself still matches it.
    """

    from moto.stepfunctions.parser.asl.component.common.error_name.error_equals_decl import (
        ErrorEqualsDecl,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import (
        StatesErrorName,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )

    require_source(ErrorEqualsDecl._eval_body, ERROR_EQUALS_EVAL_BODY_SHA256, "terminal DataLimitExceeded")
    terminal = StatesErrorName(typ=StatesErrorNameType.StatesStatesDataLimitExceeded)
    original = ErrorEqualsDecl._eval_body

    def _eval_body(self, env):
        if env.stack and env.stack[-1] == terminal and terminal not in self.error_names:
            env.stack.pop()
            env.stack.append(False)
            return
        original(self, env)

    ErrorEqualsDecl._eval_body = _eval_body


# DynamoDB's limit on an expression string, "Constraints in Amazon DynamoDB", section "Expression
# parameters": "The maximum length of any expression string is 4 KB" (1 KB = 1024 bytes there).
# Moto enforces none of it, so a write whose condition names every slot of a holder was accepted
# here and refused on AWS, after the fence had landed (issue 18, item 4).
MAX_EXPRESSION_BYTES = 4 * 1024
# The expression parameters of a request, as DynamoDB names them in its error messages.
EXPRESSION_FIELDS = (
    "ConditionExpression",
    "UpdateExpression",
    "KeyConditionExpression",
    "FilterExpression",
    "ProjectionExpression",
)
# sha256 of the sources of moto 5.2.5's DynamoHandler methods that patch_expression_limits()
# wraps: each reads its expressions from the request body under the names above (a transaction
# per action in TransactItems); a change of how they read them could leave the check blind.
DYNAMODB_HANDLER_SHA256 = {
    "put_item": "4c9efb73275195eccc6268d6c3952decc1b240da158661ad59421ccec55a74e0",
    "update_item": "638893af1afd43d274f3788d61ac13b447729de915c6f5ad3bbf008b92dd8e80",
    "delete_item": "677cb014c5c455d9fa3088aa5213b34b514a9773156f62847f114159b9a75d05",
    "transact_write_items": "61c163fff213f33a39317a17fda194a9c1e800992421575d2080f4500bf45372",
    "query": "681834c64038af93f0bf17657b7d24065f907f31e2d5cafb67f8cc15bb5e9f96",
    "scan": "530223d9fd284f2be3f3ed302ad8eab62f3fbe2cbeecd56a4ce4c7e1f006db05",
}


def expression_too_long(parameters):
    """The error DynamoDB answers a request with an expression over 4 KB, or None."""
    for field in EXPRESSION_FIELDS:
        expression = parameters.get(field)
        if isinstance(expression, str) and len(expression.encode()) > MAX_EXPRESSION_BYTES:
            return (
                f"Invalid {field}: Expression size has exceeded the maximum allowed size; "
                f"expression size: {len(expression.encode())}"
            )
    return None


def patch_expression_limits():
    """Makes the local DynamoDB refuse an expression over 4 KB, as AWS does.

    A ValidationException, before anything is written (for a transaction, before any of its
    actions), as AWS answers it.
    """

    from moto.dynamodb.exceptions import MockValidationException
    from moto.dynamodb.responses import DynamoHandler

    for name, expected in DYNAMODB_HANDLER_SHA256.items():
        require_source(getattr(DynamoHandler, name), expected, "expression-limit")

    def checked(original):
        # functools.wraps: a later patch's digest guard reads the original's source through it.
        @functools.wraps(original)
        def handler(self):
            requests = [self.body]
            for action in self.body.get("TransactItems") or []:
                requests.extend(action.values())
            for parameters in requests:
                problem = expression_too_long(parameters)
                if problem:
                    raise MockValidationException(problem)
            return original(self)

        return handler

    for name in DYNAMODB_HANDLER_SHA256:
        setattr(DynamoHandler, name, checked(getattr(DynamoHandler, name)))


# sha256 of the source of moto 5.2.5's StateMachine.create_from_cloudformation_json, which
# patch_state_machine_from_cloudformation() replaces.
STATE_MACHINE_FROM_CLOUDFORMATION_SHA256 = (
    "97e9fc1f9bd3ba26ace6f66e81c28f52368fac2e48927dea8f87d6378f33964a"
)
# A DefinitionSubstitutions placeholder, as CloudFormation reads them: ${Name}.
DEFINITION_PLACEHOLDER = r"\$\{([A-Za-z0-9_]+)\}"


def patch_state_machine_from_cloudformation():
    """Makes CloudFormation's AWS::StepFunctions::StateMachine create the machine AWS would.

    The local run deploys template.yaml through the SAM transform and moto's CloudFormation
    (local/deploy_stack.py). Moto 5.2.5 reads only the resource's DefinitionString: its
    DefinitionSubstitutions were dropped, so every machine kept its `${AcquireFunctionArn}`
    placeholders, and its `Definition` (an object) and StateMachineType were ignored too. (Moto
    ships the substitution in its Step Functions resource provider, which nothing calls.) And it
    created the machine in the backend without the execution mode: with the mode on, the API
    serves another backend, where the machine did not exist. This one takes DefinitionString
    or Definition, replaces each `${Name}` with its substitution (a placeholder without one
    fails the stack, as on AWS), and creates the machine, with its type, where the API finds it.
    Substitutions are not folded into Fn::Sub: moto's Fn::Sub turns the definitions' `$$.`
    into `$.`.
    """
    import re

    from moto.cloudformation.exceptions import ValidationError
    from moto.stepfunctions.models import StateMachine
    from moto.stepfunctions.responses import get_backend
    from moto.stepfunctions.utils import cfn_to_api_tags

    require_source(
        StateMachine.create_from_cloudformation_json,
        STATE_MACHINE_FROM_CLOUDFORMATION_SHA256,
        "DefinitionSubstitutions",
    )

    def create_from_cloudformation_json(
        cls, resource_name, cloudformation_json, account_id, region_name, **kwargs
    ):
        properties = cloudformation_json["Properties"]
        definition = properties.get("DefinitionString")
        if definition is None and "Definition" in properties:
            definition = json.dumps(properties["Definition"])
        substitutions = properties.get("DefinitionSubstitutions") or {}

        def substitute(match):
            name = match.group(1)
            if name not in substitutions:
                raise ValidationError(
                    message=f"state machine {resource_name}: ${{{name}}} has no DefinitionSubstitutions entry"
                )
            return str(substitutions[name])

        definition = re.sub(DEFINITION_PLACEHOLDER, substitute, definition or "")
        return get_backend(account_id, region_name).create_state_machine(
            properties.get("StateMachineName", resource_name),
            definition,
            properties.get("RoleArn", ""),
            tags=cfn_to_api_tags(properties.get("Tags", [])),
            sm_type=properties.get("StateMachineType"),
        )

    StateMachine.create_from_cloudformation_json = classmethod(create_from_cloudformation_json)


# sha256 of the source of moto 5.2.5's cloudformation.parsing.clean_json, which
# patch_no_value_in_lists() wraps.
CLEAN_JSON_SHA256 = "9fbe5dedab810616dba1c7ee506131dcb3b24945d5a99b2e1363ea23aa4f2856"


def patch_no_value_in_lists():
    """Drops `AWS::NoValue` from lists, as CloudFormation does.

    template.yaml leaves a policy statement out with `!If [Cond, {statement}, !Ref
    AWS::NoValue]` inside a Statement list (HandOffPolicy, the functions' policies). Moto 5.2.5
    drops NoValue from a mapping but leaves it in a list as null, and its IAM then refuses the
    whole policy ("Syntax errors in policy"): the stack did not deploy. Moto resolves NoValue
    (and nothing else) to None, so a None item of a resolved list is one.
    """
    from moto.cloudformation import parsing

    require_source(parsing.clean_json, CLEAN_JSON_SHA256, "AWS::NoValue in a list")
    original = parsing.clean_json

    # The original calls the module's clean_json for nested values, so they come here too.
    def clean_json(resource_json, resources_map):
        if isinstance(resource_json, list):
            cleaned = (clean_json(item, resources_map) for item in resource_json)
            return [item for item in cleaned if item is not None]
        return original(resource_json, resources_map)

    parsing.clean_json = clean_json


# sha256 of the source of moto 5.2.5's CloudWatchBackend.put_metric_alarm, which
# patch_alarm_from_cloudformation() calls with an alarm's CloudFormation properties.
PUT_METRIC_ALARM_SHA256 = "aff786ddccbc9f135373cec565c38ac5016cbdf68a3e8196fa36ec2325829fbb"


def patch_alarm_from_cloudformation():
    """Makes CloudFormation create AWS::CloudWatch::Alarm, as AWS does.

    Moto 5.2.5's CloudFormation has no model for alarms: it skips them, and a reference to one
    (the dashboard's `${ReclaimedSlotsAlarm.Arn}`, template.yaml's alarms widget) fails the
    whole stack with "Fn::GetAtt references undefined resource". This model puts the alarm
    through moto's own PutMetricAlarm (so the local stack has the alarms, their actions and
    thresholds, readable with DescribeAlarms); Ref is its name and GetAtt Arn its ARN, as
    CloudFormation documents for AWS::CloudWatch::Alarm.
    """
    from moto.cloudformation import parsing
    from moto.cloudwatch.models import CloudWatchBackend, cloudwatch_backends
    from moto.core.common_models import CloudFormationModel

    require_source(
        CloudWatchBackend.put_metric_alarm, PUT_METRIC_ALARM_SHA256, "AWS::CloudWatch::Alarm"
    )
    if "AWS::CloudWatch::Alarm" in parsing.get_model_map():
        raise SystemExit("moto_server.py: moto already models AWS::CloudWatch::Alarm: drop the patch")

    class CloudFormationAlarm(CloudFormationModel):
        # moto's model metaclass files every model under the service its module names.
        __module__ = "moto.cloudwatch.models"

        def __init__(self, alarm):
            self.alarm = alarm

        @staticmethod
        def cloudformation_type():
            return "AWS::CloudWatch::Alarm"

        @staticmethod
        def cloudformation_name_type():
            return "AlarmName"

        @property
        def physical_resource_id(self):
            return self.alarm.name

        @classmethod
        def has_cfn_attr(cls, attr):
            return attr == "Arn"

        def get_cfn_attribute(self, attribute_name):
            if attribute_name == "Arn":
                return self.alarm.alarm_arn
            return super().get_cfn_attribute(attribute_name)

        @classmethod
        def create_from_cloudformation_json(
            cls, resource_name, cloudformation_json, account_id, region_name, **kwargs
        ):
            p = cloudformation_json["Properties"]
            number = lambda key, kind: kind(p[key]) if key in p else None  # noqa: E731
            alarm = cloudwatch_backends[account_id][region_name].put_metric_alarm(
                name=p.get("AlarmName") or resource_name,
                namespace=p.get("Namespace"),
                metric_name=p.get("MetricName"),
                comparison_operator=p.get("ComparisonOperator"),
                evaluation_periods=number("EvaluationPeriods", int),
                period=number("Period", int),
                threshold=number("Threshold", float),
                statistic=p.get("Statistic"),
                description=p.get("AlarmDescription"),
                dimensions=p.get("Dimensions", []),
                alarm_actions=p.get("AlarmActions", []),
                ok_actions=p.get("OKActions", []),
                insufficient_data_actions=p.get("InsufficientDataActions", []),
                datapoints_to_alarm=number("DatapointsToAlarm", int),
                extended_statistic=p.get("ExtendedStatistic"),
                unit=p.get("Unit"),
                actions_enabled=p.get("ActionsEnabled", True),
                treat_missing_data=p.get("TreatMissingData"),
            )
            return cls(alarm)

    # The model map is computed once from CloudFormationModel's subclasses: recompute it.
    for cached in (parsing.get_model_list, parsing.get_model_map, parsing.get_name_type_map):
        cached.cache_clear()
    assert parsing.get_model_map()["AWS::CloudWatch::Alarm"] is CloudFormationAlarm


# CloudFormation's deploy-time rules that moto 5.2.5 does not have (F16: the first `sam deploy`
# of a template the local deploy accepted must not fail on them). Sources, one per rule:
# - "Understand CloudFormation quotas",
#   https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/cloudformation-limits.html:
#   500 resources, 200 outputs, 200 parameters, 200 mappings and 200 attributes a mapping in a
#   template; a template body of 1 MB from S3 (`sam deploy` uploads it: resolve_s3).
TEMPLATE_SECTION_MAX = {"Resources": 500, "Outputs": 200, "Parameters": 200, "Mappings": 200}
MAPPING_ATTRIBUTES_MAX = 200
TEMPLATE_S3_MAX_BYTES = 1_000_000
# - Outputs,
#   https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/outputs-section-structure.html:
#   export names are unique within a region and account. CloudFormation's own errors name the
#   rest: "The Name field of every Export member must be specified and consist only of
#   alphanumeric characters, colons, or hyphens" (quoted in aws/aws-cdk#28563) and "must not be
#   longer than 256 characters" (aws/aws-cdk#9733); "Cannot export output X with length 1368.
#   Max length of 1024 exceeded" (aws-cloudformation/cloudformation-coverage-roadmap#685);
#   "Exported values must not be empty or whitespace-only" (this project's first `sam deploy`,
#   issue 37: the docs do not state it).
EXPORT_NAME = r"[A-Za-z0-9:-]+"
EXPORT_NAME_MAX = 256
EXPORT_VALUE_MAX = 1024
# - Systems Manager PutParameter, Value,
#   https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_PutParameter.html:
#   "Standard parameters have a value limit of 4 KB. Advanced parameters have a value limit of
#   8 KB"; an empty value fails its length constraint (at least 1). AWS's error counts
#   characters ("a maximum parameter value of 4096 characters").
SSM_VALUE_MAX = {"Standard": 4096, "Advanced": 8192, "Intelligent-Tiering": 8192}

# sha256 of the sources of moto 5.2.5's methods that patch_deploy_time_rules() replaces
# (CloudFormationBackend.create_stack, OutputMap.exports) or wraps (the others).
CFN_CREATE_STACK_SHA256 = "dcb835c34772ed6c3a2785c44571cba7bea8a9edaf80bd4533428b093c3351a6"
CFN_UPDATE_STACK_SHA256 = "83a62d954ef05565636c254a1fa1910fa7124479cbbf974b4c2a6ebf433cc63b"
CFN_OUTPUT_EXPORTS_SHA256 = "0d51444b6ba8d443b12a719dbeb730f367f47f27cc1f39e6163523759dd5b2ee"
CFN_TEMPLATE_FROM_S3_SHA256 = "642af50810d9b6f904ac28d816832560c81dd6d00349da23808a465c2e01e704"
SSM_PARAMETER_FROM_CLOUDFORMATION_SHA256 = (
    "1fb1b42f9179105910ffdc00ea554d7b84307b64eadb3c0ebc39c2d1233fa349"
)
SSM_PARAMETER_UPDATE_FROM_CLOUDFORMATION_SHA256 = (
    "69316a791ff69d56ca06e91e4f97f2f093fde2713794d86bef9f35f779ae6ef8"
)
# ... and of the methods whose parameter resolution the Rules are evaluated on: a stack's
# parameters (defaults, then the request's values; ResourceMap.load_parameters, run by the
# Stack's constructor), and an update's (UsePreviousValue; a request naming none keeps the
# stack's: ResourceMap.update).
CFN_LOAD_PARAMETERS_SHA256 = "610002572ab169506351f0657f02cc56115c502e555a6328c8cee2bfcd4f71e6"
CFN_CREATE_RESOURCE_MAP_SHA256 = "e0127acf6c7a67083bbdbfcb3be460aceb3859546356185d8974bf67ce226ada"
CFN_RESOLVE_UPDATE_PARAMETERS_SHA256 = (
    "02438a8e37001724f940ce70b7916531374cb64094564fd091fcb1e2505cee61"
)
CFN_RESOURCE_MAP_UPDATE_SHA256 = "e34b0c357f3c8e357e4e9446843985fd88c0dc52e828d17ef3e08e14dfb88c8a"


class DeployRuleBroken(Exception):
    """A resource CloudFormation would fail to create: the stack is rolled back."""


def refusal(message, fix):
    """CloudFormation's message, then what to change: every refusal of a deploy-time rule."""
    return f"{message} Fix: {fix}"


def template_refusals(template):
    """What CloudFormation refuses in a template body before it creates anything: more
    resources, outputs, parameters, mappings or mapping attributes than its quotas allow."""
    refused = []
    for section, most in TEMPLATE_SECTION_MAX.items():
        count = len(template.get(section) or {})
        if count > most:
            refused.append(
                refusal(
                    f"Template format error: Number of {section.lower()}, {count}, is greater "
                    f"than maximum allowed, {most}.",
                    f"declare at most {most} {section.lower()} (split the stack, e.g. into "
                    "nested stacks; the count is of the template after the SAM transform).",
                )
            )
    for name, mapping in (template.get("Mappings") or {}).items():
        for key, attributes in (mapping or {}).items():
            if isinstance(attributes, dict) and len(attributes) > MAPPING_ATTRIBUTES_MAX:
                refused.append(
                    refusal(
                        f"Template format error: Mapping {name} key {key} has "
                        f"{len(attributes)} attributes, more than the maximum allowed, "
                        f"{MAPPING_ATTRIBUTES_MAX}.",
                        "split the attributes over more mappings.",
                    )
                )
    return refused


def export_refusals(stack, exports_elsewhere):
    """What CloudFormation refuses in a stack's exports once their values are resolved: names
    that are not alphanumerics, colons and hyphens or are too long, values that are empty,
    whitespace-only or too long, and names exported twice in the region (by this stack, or
    already by another: `exports_elsewhere`, name -> Export)."""
    import re

    refused, seen = [], {}
    for export in stack.exports:
        output, name = export.output_key, export.name
        # Moto leaves a Number parameter's value a number; CloudFormation's is text.
        value = "" if export.value is None else str(export.value)
        if not isinstance(name, str) or not re.fullmatch(EXPORT_NAME, name):
            refused.append(
                refusal(
                    f"Template format error: Output {output} is malformed. The Name field of "
                    "every Export member must be specified and consist only of alphanumeric "
                    f"characters, colons, or hyphens (it is {name!r}).",
                    f"build output {output}'s Export.Name from letters, digits, ':' and '-' only.",
                )
            )
        elif len(name) > EXPORT_NAME_MAX:
            refused.append(
                refusal(
                    f"Template format error: Output {output} is malformed. The Name field of "
                    f"every Export member must not be longer than {EXPORT_NAME_MAX} characters "
                    f"(it is {len(name)}).",
                    f"shorten output {output}'s Export.Name.",
                )
            )
        if not value.strip():
            refused.append(
                refusal(
                    f"Exported values must not be empty or whitespace-only: output {output} "
                    f"exports {value!r} as {name}.",
                    f"give output {output} a value that is never empty, or export it only "
                    "under a Condition that holds when it has one.",
                )
            )
        elif len(value) > EXPORT_VALUE_MAX:
            refused.append(
                refusal(
                    f"Cannot export output {output} with length {len(value)}. Max length of "
                    f"{EXPORT_VALUE_MAX} exceeded.",
                    f"export at most {EXPORT_VALUE_MAX} characters from output {output}.",
                )
            )
        if name in seen:
            refused.append(
                refusal(
                    f"Export with name {name} is already exported by this stack's output "
                    f"{seen[name]} (output {output} exports it too).",
                    "give every Export its own name, e.g. ${AWS::StackName}-<output>.",
                )
            )
        elif name in exports_elsewhere:
            other = exports_elsewhere[name].exporting_stack_id.split("/")[1]
            refused.append(
                refusal(
                    f"Export with name {name} is already exported by stack {other} "
                    f"(output {output}).",
                    f"deploy under another stack name, rename the export, or delete stack {other}.",
                )
            )
        seen.setdefault(name, output)
    return refused


# - Rules: "CloudFormation template Rules syntax",
#   https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/rules-section-structure.html:
#   each rule has an optional RuleCondition and its required Assertions, each an Assert with an
#   optional AssertDescription, "validate parameter values before CloudFormation creates or
#   updates any resources"; "Rule functions",
#   https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/intrinsic-function-reference-rules.html:
#   the functions, their arguments (Fn::And and Fn::Or take 2 to 10 conditions), "If the
#   condition evaluates to false, CloudFormation doesn't check the parameter value", and that only
#   Ref and the rule functions themselves may be used inside them. A failed Assert refuses the
#   request with a ValidationError whose message is its AssertDescription (template.yaml's
#   AccountWidePrefixesAcknowledged is written to be read so).
RULE_CONDITIONS = (
    "Fn::And",
    "Fn::Contains",
    "Fn::EachMemberEquals",
    "Fn::EachMemberIn",
    "Fn::Equals",
    "Fn::Not",
    "Fn::Or",
)
# Rule functions of CloudFormation's that the local server does not evaluate: Fn::RefAll,
# Fn::ValueOf and Fn::ValueOfAll read the account's VPCs, subnets and security groups behind
# AWS-specific parameter types, Fn::If a condition (no page says how a rule reads one). A
# template using one is refused by name: passing it would accept what AWS may refuse.
RULE_FUNCTIONS_NOT_EVALUATED = ("Fn::If", "Fn::RefAll", "Fn::ValueOf", "Fn::ValueOfAll")
RULE_LOGIC_ARGUMENTS = range(2, 11)


class RuleUnreadable(Exception):
    """A Rules section CloudFormation refuses as malformed, or one the local server cannot
    evaluate: the message names the rule, the place and the function."""


def rule_text(value):
    """A value as a rule compares it: text, as CloudFormation reads a template's and a
    parameter's scalars (a Number parameter is a number to moto, `true` in YAML a boolean);
    lists member by member."""
    if isinstance(value, list):
        return [rule_text(member) for member in value]
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


class RuleEvaluator:
    """Evaluates rule functions over `values`, what a Ref in a rule reads: the stack's
    parameters as resolved (defaults, then the request's values) and the pseudo parameters.

    Every function of a rule is evaluated, whatever the values, so that an unreadable rule is
    refused on every deploy and not only on those whose values reach it."""

    def __init__(self, values):
        self.values = values

    def arguments(self, name, argument, where, count):
        if not isinstance(argument, list) or len(argument) not in count:
            wanted = f"{count.start} to {count.stop - 1}" if len(count) > 1 else str(count.start)
            raise RuleUnreadable(
                refusal(
                    f"Template format error: {name} at {where} takes a list of {wanted} "
                    f"arguments, not {json.dumps(argument)}.",
                    f"give {name} a list of {wanted} arguments.",
                )
            )
        return argument

    def function(self, node, where):
        if not isinstance(node, dict) or len(node) != 1:
            raise RuleUnreadable(
                refusal(
                    f"Template format error: {where} is {json.dumps(node)}, not a rule function.",
                    f"give {where} one of {', '.join(RULE_CONDITIONS)}.",
                )
            )
        return next(iter(node.items()))

    def truth(self, node, where):
        """The value of a condition: a rule function that is true or false."""
        name, argument = self.function(node, where)
        if name not in RULE_CONDITIONS:
            self.value(node, where)  # names an unsupported or foreign function
            raise RuleUnreadable(
                refusal(
                    f"Template format error: {where} is {name}, which is not true or false: "
                    "a rule condition or assertion must be.",
                    f"give {where} one of {', '.join(RULE_CONDITIONS)}.",
                )
            )
        at = f"{where}.{name}"
        if name in ("Fn::And", "Fn::Or"):
            conditions = self.arguments(name, argument, where, RULE_LOGIC_ARGUMENTS)
            results = [self.truth(c, f"{at}[{i}]") for i, c in enumerate(conditions)]
            return all(results) if name == "Fn::And" else any(results)
        if name == "Fn::Not":
            (condition,) = self.arguments(name, argument, where, range(1, 2))
            return not self.truth(condition, f"{at}[0]")
        first, second = (
            rule_text(self.value(a, f"{at}[{i}]"))
            for i, a in enumerate(self.arguments(name, argument, where, range(2, 3)))
        )
        if name == "Fn::Equals":
            return first == second
        if not isinstance(first, list):
            raise RuleUnreadable(
                refusal(
                    f"Template format error: the first argument of {name} at {where} is "
                    f"{json.dumps(first)}, not a list of strings.",
                    "give it a list, or a Ref to a CommaDelimitedList or List<...> parameter.",
                )
            )
        if name == "Fn::EachMemberIn":
            if not isinstance(second, list):
                raise RuleUnreadable(
                    refusal(
                        f"Template format error: the second argument of Fn::EachMemberIn at "
                        f"{where} is {json.dumps(second)}, not a list of strings.",
                        "give it a list of the strings to match.",
                    )
                )
            return all(member in second for member in first)
        if isinstance(second, list):
            raise RuleUnreadable(
                refusal(
                    f"Template format error: the second argument of {name} at {where} is a "
                    "list, not a string.",
                    "give it the one string to compare.",
                )
            )
        if name == "Fn::Contains":
            return second in first
        return all(member == second for member in first)  # Fn::EachMemberEquals

    def value(self, node, where):
        """An argument: a literal, a list, a Ref, or a nested condition."""
        if isinstance(node, list):
            return [self.value(member, f"{where}[{i}]") for i, member in enumerate(node)]
        if not isinstance(node, dict):
            return node
        name, argument = self.function(node, where)
        if name == "Ref":
            if not isinstance(argument, str) or argument not in self.values:
                raise RuleUnreadable(
                    refusal(
                        f"Template format error: the Ref {json.dumps(argument)} at {where} is "
                        "not a parameter or a pseudo parameter, which are all a rule can read "
                        "(rules run before any resource exists).",
                        f"declare parameter {argument} or refer to one that is declared.",
                    )
                )
            return self.values[argument]
        if name in RULE_CONDITIONS:
            return self.truth(node, where)
        if name in RULE_FUNCTIONS_NOT_EVALUATED:
            raise RuleUnreadable(
                refusal(
                    f"Unsupported rule function {name} at {where}: the local server "
                    f"evaluates {', '.join(RULE_CONDITIONS)} and Ref, not {name} "
                    "(CloudFormation does; a deploy that passed here untested could fail "
                    "there).",
                    f"write the rule without {name}, or add {name} to local/moto_server.py's "
                    "RuleEvaluator with a test in harness/local-aws/tests/deploy_rules.rs.",
                )
            )
        raise RuleUnreadable(
            refusal(
                f"Template format error: {name} at {where} is not a rule function: in Rules "
                "only Ref and the rule functions may be used.",
                f"compare the parameters themselves in the rule, without {name}.",
            )
        )


def rule_values(template, resolved_parameters, pseudo_parameters):
    """What a Ref in a rule reads: every parameter as the stack resolved it (a
    CommaDelimitedList or List<...> a list: moto splits a request's value, not a default) and
    the pseudo parameters."""
    values = {name: value for name, value in pseudo_parameters.items() if value is not None}
    declared = template.get("Parameters") or {}
    for name, value in resolved_parameters.items():
        kind = str((declared.get(name) or {}).get("Type", "String"))
        if isinstance(value, str) and (kind == "CommaDelimitedList" or kind.startswith("List<")):
            value = value.split(",")
        values[name] = value
    return values


def rule_refusal(template, values):
    """CloudFormation's refusal of a request by the template's Rules, or None: the
    AssertDescription of the first assertion, in the template's order, that is false in a
    rule whose RuleCondition is true or absent."""
    rules = template.get("Rules")
    if rules is None:
        return None
    if not isinstance(rules, dict):
        raise RuleUnreadable(
            refusal(
                "Template format error: the Rules section is not a mapping of rules.",
                "declare each rule under its logical name.",
            )
        )
    evaluator, refused = RuleEvaluator(values), None
    for name, rule in rules.items():
        assertions = rule.get("Assertions") if isinstance(rule, dict) else None
        if not isinstance(assertions, list) or not assertions:
            raise RuleUnreadable(
                refusal(
                    f"Template format error: rule {name} has no Assertions.",
                    f"give rule {name} a list of Assertions, each with an Assert.",
                )
            )
        applies = (
            evaluator.truth(rule["RuleCondition"], f"Rules.{name}.RuleCondition")
            if "RuleCondition" in rule
            else True
        )
        for i, assertion in enumerate(assertions):
            where = f"Rules.{name}.Assertions[{i}]"
            if not isinstance(assertion, dict) or "Assert" not in assertion:
                raise RuleUnreadable(
                    refusal(
                        f"Template format error: {where} has no Assert.",
                        f"give {where} an Assert.",
                    )
                )
            holds = evaluator.truth(assertion["Assert"], f"{where}.Assert")
            if applies and not holds and refused is None:
                # No page gives CloudFormation's words for an assertion without a
                # description; this names the rule instead.
                refused = str(
                    assertion.get("AssertDescription")
                    or f"Assertion {i} of rule {name} failed (it has no AssertDescription)."
                )
    return refused


def patch_deploy_time_rules():
    """Makes moto's CloudFormation refuse what CloudFormation refuses at deploy time (F16).

    Moto 5.2.5 created a stack whatever its size, counts and exports: an export whose value was
    empty, a name with `_` or `.`, a name the same stack exports twice, 201 outputs, an SSM
    parameter over 4 KB, all deployed locally and would have failed on AWS (the first `sam
    deploy` of template.yaml did, on its empty ProtectedStateMachinePrefix export). Now:

    - CreateStack and UpdateStack refuse a template over a quota (resources, outputs,
      parameters, mappings, mapping attributes), and any request a TemplateURL whose object is
      over 1 MB, with a ValidationError, creating nothing;
    - CreateStack creates the resources, then checks the exports as resolved (outputs whose
      Condition is false export nothing, as on AWS; moto exported them all) and an
      AWS::SSM::Parameter's value (not empty, within its tier's size); a broken rule rolls the
      stack back as CloudFormation does: its resources deleted (as moto deletes them: the state
      machines and alarms that this file's patches create stay behind, under the stack's
      names), its exports not registered, no outputs, status ROLLBACK_COMPLETE with the
      reason (the rule, the output or resource, the fix). Moto refused a clash with another
      stack's export before creating anything, without naming it;
    - UpdateStack (which moto cannot roll back) refuses an SSM parameter's value with a
      ValidationError. Its exports are not checked: moto does not update them either;
    - CreateStack and UpdateStack evaluate the template's Rules (moto ignored them, so a "*"
      prefix that CloudFormation refuses deployed locally) on the parameters the request
      resolves (defaults, the request's values, UsePreviousValue, the pseudo parameters), before
      anything is created or changed: a false Assert of a rule whose RuleCondition is true or
      absent refuses the request with a ValidationError, its AssertDescription; a malformed
      rule, or a rule function the local server does not evaluate (RuleEvaluator), is a
      ValidationError that names it, whatever the values.
    """
    from moto.cloudformation import parsing
    from moto.cloudformation.exceptions import AlreadyExistsException, ValidationError
    from moto.cloudformation.models import CloudFormationBackend, Export, Stack
    from moto.cloudformation.responses import CloudFormationResponse
    from moto.cloudformation.utils import generate_stack_id
    from moto.ssm.models import Parameter

    require_source(CloudFormationBackend.create_stack, CFN_CREATE_STACK_SHA256, "deploy-time rules")
    require_source(CloudFormationBackend.update_stack, CFN_UPDATE_STACK_SHA256, "deploy-time rules")
    require_source(parsing.OutputMap.exports.fget, CFN_OUTPUT_EXPORTS_SHA256, "deploy-time rules")
    require_source(
        CloudFormationResponse._get_stack_from_s3_url,
        CFN_TEMPLATE_FROM_S3_SHA256,
        "deploy-time rules",
    )
    require_source(
        Parameter.create_from_cloudformation_json,
        SSM_PARAMETER_FROM_CLOUDFORMATION_SHA256,
        "deploy-time rules",
    )
    require_source(
        Parameter.update_from_cloudformation_json,
        SSM_PARAMETER_UPDATE_FROM_CLOUDFORMATION_SHA256,
        "deploy-time rules",
    )
    for method, digest in (
        (parsing.ResourceMap.load_parameters, CFN_LOAD_PARAMETERS_SHA256),
        (Stack._create_resource_map, CFN_CREATE_RESOURCE_MAP_SHA256),
        (CloudFormationBackend._resolve_update_parameters, CFN_RESOLVE_UPDATE_PARAMETERS_SHA256),
        (parsing.ResourceMap.update, CFN_RESOURCE_MAP_UPDATE_SHA256),
    ):
        require_source(method, digest, "deploy-time rules (Rules)")

    def refuse_template(template):
        parsed = Stack.parse_template(template) if isinstance(template, str) else template
        refused = template_refusals(parsed)
        if refused:
            raise ValidationError(message=" ".join(refused))
        return parsed

    def refuse_by_rules(template, resource_map):
        """The template's Rules on the parameters `resource_map` resolved (loaded, nothing
        created): a failed assertion or an unreadable rule is a ValidationError."""
        pseudo = {
            name: value
            for name, value in resource_map._parsed_resources.items()
            if name.startswith("AWS::")
        }
        values = rule_values(template, resource_map.resolved_parameters, pseudo)
        try:
            refused = rule_refusal(template, values)
        except RuleUnreadable as unreadable:
            raise ValidationError(message=str(unreadable))
        if refused is not None:
            raise ValidationError(message=refused)

    @property
    def exports(self):
        found = []
        for key, declared in (self._output_json_map or {}).items():
            # self[key] is the resolved output, None when its Condition is false.
            if not declared.get("Export") or self[key] is None:
                continue
            name = parsing.clean_json(declared["Export"].get("Name"), self._resource_map)
            export = Export(self._stack_id, name, self[key].value)
            export.output_key = key
            found.append(export)
        return found

    parsing.OutputMap.exports = exports

    def roll_back(stack, reason):
        stack._add_stack_event("ROLLBACK_IN_PROGRESS", resource_status_reason=reason)
        stack.resource_map.delete()
        # A rolled-back stack has neither resources nor outputs. Moto's maps are lazy: reading
        # an output (DescribeStacks) or a resource after the deletion would create it again.
        stack.resource_map._resource_json_map = {}
        stack.output_map = parsing.OutputMap(stack.resource_map, {"Outputs": {}}, stack.stack_id)
        stack.status = "ROLLBACK_COMPLETE"
        stack.stack_status_reason = reason
        stack._add_stack_event("ROLLBACK_COMPLETE")

    # moto's create_stack, with the rules: the exports are registered only once the stack's
    # resources exist and its exports passed, as CloudFormation creates them.
    def create_stack(
        self,
        name,
        template,
        parameters,
        notification_arns=None,
        tags=None,
        role_arn=None,
        enable_termination_protection=False,
        timeout_in_mins=None,
        stack_policy_body=None,
    ):
        if name in [stack.name for stack in self.stacks.values()]:
            raise AlreadyExistsException(f"Stack {name} already exists")
        stack_id = generate_stack_id(name, self.region_name, self.account_id)
        new_stack = Stack(
            stack_id=stack_id,
            name=name,
            template=template,
            parameters=parameters,
            account_id=self.account_id,
            region_name=self.region_name,
            notification_arns=notification_arns,
            tags=tags,
            role_arn=role_arn,
            cross_stack_resources=self.exports,
            enable_termination_protection=enable_termination_protection,
            timeout_in_mins=timeout_in_mins,
            stack_policy_body=stack_policy_body,
        )
        refuse_template(new_stack.template_dict)
        # The Stack's constructor resolved the parameters and created nothing yet.
        refuse_by_rules(new_stack.template_dict, new_stack.resource_map)
        self.stacks[stack_id] = new_stack
        new_stack._add_stack_event("CREATE_IN_PROGRESS", resource_status_reason="User Initiated")
        try:
            new_stack.create_resources()
        except DeployRuleBroken as broken:
            roll_back(new_stack, str(broken))
            return new_stack
        refused = export_refusals(new_stack, self.exports)
        if refused:
            roll_back(new_stack, " ".join(refused))
            return new_stack
        for export in new_stack.exports:
            self.exports[export.name] = export
        return new_stack

    CloudFormationBackend.create_stack = create_stack

    original_update_stack = CloudFormationBackend.update_stack

    @functools.wraps(original_update_stack)
    def update_stack(self, name, template, role_arn, parameters, tags):
        parsed = refuse_template(template)
        # The parameters the update will resolve, as moto's update will (a request that names
        # none keeps the stack's), on a map of their own: moto's update deletes resources
        # before it loads them, and CloudFormation checks the Rules before it changes anything.
        stack = self.get_stack(name)
        requested = self._resolve_update_parameters(instance=stack, incoming_params=parameters)
        resource_map = parsing.ResourceMap(
            stack.stack_id,
            stack.name,
            requested or stack.resource_map.input_parameters,
            {},
            region_name=self.region_name,
            account_id=self.account_id,
            template=parsed,
            cross_stack_resources=self.exports,
        )
        resource_map.load_mapping()
        resource_map.load_parameters()
        refuse_by_rules(parsed, resource_map)
        try:
            return original_update_stack(self, name, template, role_arn, parameters, tags)
        except DeployRuleBroken as broken:
            raise ValidationError(message=str(broken))

    CloudFormationBackend.update_stack = update_stack

    original_from_s3 = CloudFormationResponse._get_stack_from_s3_url

    @functools.wraps(original_from_s3)
    def template_from_s3(self, template_url):
        body = original_from_s3(self, template_url)
        size = len(body.encode())
        if size > TEMPLATE_S3_MAX_BYTES:
            raise ValidationError(
                message=refusal(
                    f"Template may not exceed {TEMPLATE_S3_MAX_BYTES} bytes in size "
                    f"({template_url} has {size:,}).",
                    "split the stack (nested stacks), or shorten what the template carries "
                    "inline (definitions, dashboard bodies, policies).",
                )
            )
        return body

    CloudFormationResponse._get_stack_from_s3_url = template_from_s3

    def check_ssm_value(logical_id, properties):
        # Moto leaves a Number parameter's value a number; CloudFormation's is text.
        value = "" if properties.get("Value") is None else str(properties["Value"])
        tier = properties.get("Tier") or "Standard"
        if value == "":
            raise DeployRuleBroken(
                refusal(
                    f"The following resource(s) failed to create: [{logical_id}]. "
                    f"{logical_id} (AWS::SSM::Parameter): 1 validation error detected: Value "
                    f"{value!r} at 'value' failed to satisfy constraint: Member must have "
                    "length greater than or equal to 1.",
                    f"give {logical_id} a value that is never empty (a placeholder such as "
                    "\"-\" under an Fn::If when what it holds may be empty).",
                )
            )
        most = SSM_VALUE_MAX.get(tier, SSM_VALUE_MAX["Standard"])
        if len(value) > most:
            raise DeployRuleBroken(
                refusal(
                    f"The following resource(s) failed to create: [{logical_id}]. "
                    f"{logical_id} (AWS::SSM::Parameter): {tier} tier parameters support a "
                    f"maximum parameter value of {most} characters (its value has {len(value)}).",
                    f"shorten {logical_id}'s value, or give it Tier: Advanced (8 KB).",
                )
            )

    original_create_parameter = Parameter.create_from_cloudformation_json.__func__
    original_update_parameter = Parameter.update_from_cloudformation_json.__func__

    def create_parameter(
        cls, resource_name, cloudformation_json, account_id, region_name, **kwargs
    ):
        check_ssm_value(kwargs.get("LogicalId", resource_name), cloudformation_json["Properties"])
        return original_create_parameter(
            cls, resource_name, cloudformation_json, account_id, region_name, **kwargs
        )

    # Checked before moto's update deletes the parameter it replaces.
    def update_parameter(
        cls, original_resource, new_resource_name, cloudformation_json, account_id, region_name
    ):
        check_ssm_value(original_resource.name, cloudformation_json["Properties"])
        return original_update_parameter(
            cls, original_resource, new_resource_name, cloudformation_json, account_id, region_name
        )

    Parameter.create_from_cloudformation_json = classmethod(create_parameter)
    Parameter.update_from_cloudformation_json = classmethod(update_parameter)


EXPRESS_MAX_SECONDS = 300  # AWS: an Express execution runs at most 5 minutes.


def patch_state_machine_type():
    """moto keeps a machine's type in `.type` but gives its interpreter `.sm_type = "STANDARD"`:
    make the interpreter see the real type (the Express patches below read it)."""
    from moto.stepfunctions.models import StateMachineInstance

    require_source(
        StateMachineInstance.__init__,
        "37bffc8dafc63d45684888905bd88dbc79edb5848a25fb934551c25a866df081",
        "state machine type",
    )
    original = StateMachineInstance.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.sm_type = self.type

    StateMachineInstance.__init__ = __init__


def patch_unnamed_executions():
    """StartExecution without a name: AWS names it with a UUID (moto used `None`, so a second
    one failed ExecutionAlreadyExists). And an asynchronous Express start has no name
    idempotency on AWS: each is a new execution, its ARN ending `<name>:<uuid>`."""
    from moto.stepfunctions.parser.models import StepFunctionsParserBackend

    require_source(
        StepFunctionsParserBackend.start_execution,
        "0f8d9dd57baf0c2803dda23c5250b1c787a4a1a3d05239cafbddff1ef905be3a",
        "unnamed executions",
    )
    original = StepFunctionsParserBackend.start_execution

    @functools.wraps(original)
    def start_execution(self, state_machine_arn, name=None, execution_input=None, trace_header=None):
        name = name or str(uuid.uuid4())
        if self.describe_state_machine(state_machine_arn).type == "EXPRESS":
            name = f"{name}:{uuid.uuid4()}"
        return original(self, state_machine_arn, name, execution_input, trace_header)

    StepFunctionsParserBackend.start_execution = start_execution


def patch_express_definitions():
    """AWS refuses an Express machine whose definition uses `.waitForTaskToken`, `.sync` or an
    activity (Express cannot wait for a callback); moto ships the check (ExpressStaticAnalyser)
    but never calls it."""
    from moto.stepfunctions.parser.api import InvalidDefinition
    from moto.stepfunctions.parser.asl.static_analyser.express_static_analyser import (
        ExpressStaticAnalyser,
    )
    from moto.stepfunctions.parser.models import StepFunctionsParserBackend

    require_source(
        StepFunctionsParserBackend.create_state_machine,
        "dc56ec54216f7b975da2fe4653e4675e85ea2773e3167dad3017dbfa89c0bbd5",
        "express definitions",
    )
    require_source(
        StepFunctionsParserBackend.update_state_machine,
        "03b6b2ec8ffdfbb0c8e75574810521875200207fbacd0b563e008f82f3f9515f",
        "express definitions",
    )
    create = StepFunctionsParserBackend.create_state_machine
    update = StepFunctionsParserBackend.update_state_machine

    def check(definition):
        try:
            ExpressStaticAnalyser().analyse(definition)
        except ValueError as error:
            raise InvalidDefinition(f"Express state machine: {error}", "InvalidDefinition")

    @functools.wraps(create)
    def create_state_machine(self, name, definition, roleArn, *args, sm_type=None, **kwargs):
        if sm_type == "EXPRESS":
            check(definition)
        return create(self, name, definition, roleArn, *args, sm_type=sm_type, **kwargs)

    @functools.wraps(update)
    def update_state_machine(self, arn, definition=None, *args, **kwargs):
        if definition is not None and self.describe_state_machine(arn).type == "EXPRESS":
            check(definition)
        return update(self, arn, definition, *args, **kwargs)

    StepFunctionsParserBackend.create_state_machine = create_state_machine
    StepFunctionsParserBackend.update_state_machine = update_state_machine


def patch_express_duration():
    """An Express execution ends TIMED_OUT after 5 minutes on AWS; moto let it run on. Caps the
    top-level program's timeout for Express machines (not a Distributed Map's Express children,
    which are threads of their parent here)."""
    from moto.stepfunctions.parser.asl.component.common.timeouts.timeout import TimeoutSeconds
    from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker

    require_source(
        ExecutionWorker._get_evaluation_entrypoint,
        "2b25949ae855da8035b347b28ac72f90d7d6542bf26ef7e1f03a50ce6a981fde",
        "express duration",
    )
    original = ExecutionWorker._get_evaluation_entrypoint

    @functools.wraps(original)
    def _get_evaluation_entrypoint(self):
        program = original(self)
        if self._evaluation_details.state_machine_details.typ == "EXPRESS":
            given = program.timeout_seconds
            if (
                not isinstance(given, TimeoutSeconds)
                or given.timeout_seconds > EXPRESS_MAX_SECONDS
            ):
                program.timeout_seconds = TimeoutSeconds(EXPRESS_MAX_SECONDS)
        return program

    ExecutionWorker._get_evaluation_entrypoint = _get_evaluation_entrypoint


def patch_distributed_map_definitions():
    """moto's grammar knows only STANDARD as a Distributed Map's ProcessorConfig.ExecutionType,
    so `"ExecutionType": "EXPRESS"` was a syntax error. The type is never read when the map runs
    (its children are frames of the parent here), so the definition is parsed with STANDARD in
    its place; what DescribeStateMachine shows is the definition as given."""
    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

    require_source(
        AmazonStateLanguageParser.parse,
        "a59a7d18760fb22efc9fd46d8f0fb3bb6c0293abbce2b9053e1589181c6f0711",
        "distributed map definitions",
    )
    original = AmazonStateLanguageParser.parse

    def rewrite(node):
        if isinstance(node, dict):
            config = node.get("ProcessorConfig")
            if isinstance(config, dict) and config.get("ExecutionType") == "EXPRESS":
                config["ExecutionType"] = "STANDARD"
            for value in node.values():
                rewrite(value)
        elif isinstance(node, list):
            for value in node:
                rewrite(value)

    def parse(definition):
        try:
            document = json.loads(definition)
        except ValueError:
            return original(definition)
        rewrite(document)
        return original(json.dumps(document))

    AmazonStateLanguageParser.parse = staticmethod(parse)


def patch_distributed_child_context():
    """A Distributed Map's child is an execution of its own on AWS (of `<machine>/<map>`, with
    its own `$$.Execution`); here it is a thread of the parent sharing the parent's context, so
    every child passing `$$.Execution.Id` to the semaphore was one holder. Gives each child its
    own `$$.Execution` and `$$.StateMachine`, after its ItemSelector (which is evaluated with
    the parent's)."""
    import datetime

    from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration.itemprocessor.distributed_item_processor_worker import (
        DistributedItemProcessorWorker,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration.itemprocessor.inline_item_processor_worker import (
        InlineItemProcessorWorker,
    )

    require_source(
        DistributedItemProcessorWorker._eval_job,
        "c97e0ed4aba18b55041cf230e08702bac92d4aa7ad4f891330dd7a5fa906a72c",
        "distributed child context",
    )
    require_source(
        InlineItemProcessorWorker._eval_input,
        "c8a62d1f4864ec80d774a77d4a582cdf50ad6a56c51499f0bc50e3a7102ad843",
        "distributed child context",
    )
    original = InlineItemProcessorWorker._eval_input

    def _eval_input(self, env_frame):
        original(self, env_frame)
        machine = self._map_run_record.map_state_machine_arn
        data = env_frame.states.context_object.context_object_data
        name = str(uuid.uuid4())
        # A new dict: the frames share the parent's by reference.
        data["Execution"] = dict(
            data["Execution"],
            Id=f"{machine.replace(':stateMachine:', ':execution:')}:{name}",
            Name=name,
            Input=env_frame.states.get_input(),
            RedriveCount=0,
            StartTime=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        )
        data["StateMachine"] = {"Id": machine, "Name": machine.split(":stateMachine:", 1)[1]}

    DistributedItemProcessorWorker._eval_input = _eval_input


def patch_tolerated_failures():
    """A Distributed Map whose failed children pass its ToleratedFailureCount/Percentage
    (default 0) fails with States.ExceedToleratedFailureThreshold on AWS; moto only recorded
    the tolerances and succeeded with a null per failed child, so a map's success said nothing
    of its children. Judged once the children ended (AWS stops early; the outcome is the same).
    An explicit 0 beside another tolerance set above 0 is taken for unset."""
    from moto.stepfunctions.parser.api import HistoryEventType, MapRunFailedEventDetails
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEvent,
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import (
        StatesErrorName,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration.distributed_iteration_component import (
        DistributedIterationComponent,
    )
    from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails

    require_source(
        DistributedIterationComponent._map_run,
        "e45cb604929ff3468863fd1b485b32f379489ef43e67b4718145de9ef4e160d8",
        "tolerated failures",
    )
    original = DistributedIterationComponent._map_run

    @functools.wraps(original)
    def _map_run(self, env, eval_input):
        original(self, env, eval_input)
        items = eval_input.map_run_record.item_counter
        failed = items.failed.get() + items.timed_out.get() + items.aborted.get()
        total = max(items.total.get(), 1)
        count = eval_input.tolerated_failure_count
        percentage = eval_input.tolerated_failure_percentage
        if count or percentage:
            exceeded = (count > 0 and failed > count) or (
                percentage > 0 and failed * 100.0 / total > percentage
            )
        else:
            exceeded = failed > 0
        if exceeded:
            env.stack.pop()  # the children's outputs
            error = StatesErrorNameType.StatesExceedToleratedFailureThreshold
            cause = f"The specified tolerated failure threshold was exceeded: {failed} of {total} items failed"
            raise FailureEventException(
                FailureEvent(
                    env=env,
                    error_name=StatesErrorName(typ=error),
                    event_type=HistoryEventType.MapRunFailed,
                    event_details=EventDetails(
                        mapRunFailedEventDetails=MapRunFailedEventDetails(
                            error=error.to_name(), cause=cause
                        )
                    ),
                )
            )

    DistributedIterationComponent._map_run = _map_run


# sha256 of the source of moto 5.2.5's StepFunctionResponse.get_execution_history, which
# patch_history_pages() replaces.
GET_EXECUTION_HISTORY_SHA256 = "3889cc6224ac2f762d44a217cdd02255957d21862ad88af0c6b30af47b17a206"
# GetExecutionHistory's maxResults: "The default is 100 and the maximum allowed page size is
# 1000. A value of 0 uses the default" (AWS Step Functions API Reference, GetExecutionHistory).
HISTORY_PAGE_DEFAULT = 100
HISTORY_PAGE_MAX = 1000


def patch_history_pages():
    """Makes GetExecutionHistory answer in pages, newest first on request, as AWS does.

    Moto answered every event in one response, oldest first, whatever the request asked: a
    reader that asks for the newest page first (reverseOrder) and stops once it has read back
    far enough got the oldest events instead, and no test could count the pages it read. AWS
    (API Reference, GetExecutionHistory): maxResults "The maximum number of results that are
    returned per call ... The default is 100 and the maximum allowed page size is 1000. A value
    of 0 uses the default"; reverseOrder "Lists events in descending order of their
    timeStamp"; nextToken "If nextToken is returned, there are more results available ... Keep
    all other arguments unchanged", an invalid one is refused (InvalidToken). The token here
    names the execution, the order and the offset of the next page."""
    import base64

    from moto.stepfunctions.exceptions import InvalidToken, ValidationException
    from moto.stepfunctions.responses import StepFunctionResponse
    from moto.core.responses import ActionResult

    require_source(
        StepFunctionResponse.get_execution_history, GET_EXECUTION_HISTORY_SHA256, "history pages"
    )

    def get_execution_history(self):
        arn = self._get_param("executionArn")
        reverse = bool(self._get_param("reverseOrder", False))
        size = self._get_param("maxResults", 0) or HISTORY_PAGE_DEFAULT
        if not isinstance(size, int) or size < 0 or size > HISTORY_PAGE_MAX:
            raise ValidationException(
                f"1 validation error detected: Value '{size}' at 'maxResults' failed to satisfy "
                f"constraint: Member must have value less than or equal to {HISTORY_PAGE_MAX}"
            )
        offset = 0
        token = self._get_param("nextToken")
        if token:
            try:
                told = json.loads(base64.b64decode(token.encode()).decode())
                if told["arn"] != arn or told["reverse"] != reverse:
                    raise ValueError("another request's token")
                offset = int(told["offset"])
            except (ValueError, KeyError, TypeError):
                raise InvalidToken(f"'{token}'")
        events = list(self.stepfunction_backend.get_execution_history(arn)["events"])
        if reverse:
            events.reverse()
        page = events[offset : offset + size]
        answer = {"events": page}
        if offset + size < len(events):
            answer["nextToken"] = base64.b64encode(
                json.dumps({"arn": arn, "reverse": reverse, "offset": offset + size}).encode()
            ).decode()
        return ActionResult(answer)

    StepFunctionResponse.get_execution_history = get_execution_history


def patch_express_not_describable():
    """AWS refuses DescribeExecution and GetExecutionHistory of an Express execution (InvalidArn
    "Resource type not valid in this context: express") and ListExecutions of an Express machine
    (StateMachineTypeNotSupported); moto answered them. Refused for clients only: moto's own
    interpreter (its clients sign with access key "ak") describes a `.sync` child, as AWS may."""
    from moto.stepfunctions.parser.api import InvalidArn, StateMachineTypeNotSupported
    from moto.stepfunctions.responses import StepFunctionResponse

    require_source(
        StepFunctionResponse.describe_execution,
        "c3953bdc9ce21fda47ee3e996bf749950fb31c22a169464f6f2c878aa8372977",
        "express not describable",
    )
    require_source(
        StepFunctionResponse.list_executions,
        "6fec14cfc5afd6b885954398772bfbf30a82bf37da8b30c4005ec49b1c84df9a",
        "express not describable",
    )

    def from_interpreter(response):
        return "Credential=ak/" in (response.headers.get("Authorization") or "")

    def refusing_express(original):
        @functools.wraps(original)
        def handler(self):
            if not from_interpreter(self):
                execution = self.stepfunction_backend.describe_execution(
                    self._get_param("executionArn")
                )
                if getattr(execution, "sm_type", "STANDARD") == "EXPRESS":
                    raise InvalidArn(
                        "Invalid Arn: 'Resource type not valid in this context: express'",
                        "InvalidArn",
                    )
            return original(self)

        return handler

    original_list = StepFunctionResponse.list_executions

    @functools.wraps(original_list)
    def list_executions(self):
        arn = self._get_param("stateMachineArn")
        if arn and self.stepfunction_backend.describe_state_machine(arn).type == "EXPRESS":
            raise StateMachineTypeNotSupported(
                "This operation is not supported by this type of state machine",
                "StateMachineTypeNotSupported",
            )
        return original_list(self)

    for name in ("describe_execution", "get_execution_history"):
        setattr(StepFunctionResponse, name, refusing_express(getattr(StepFunctionResponse, name)))
    StepFunctionResponse.list_executions = list_executions


def execute_state_machines():
    """Step Functions runs the executions it starts, from the server's start: moto's execution
    mode (its States Language interpreter, histories as AWS records them), which is otherwise
    off and sees no machine made before it is switched on."""
    from moto.core.config import default_user_config

    default_user_config["stepfunctions"] = {"execute_state_machine": True}


def watch_parent(pid):
    while True:
        try:
            os.kill(pid, 0)
        except OSError:
            os._exit(0)
        time.sleep(0.5)


# sha256 of the source of moto 5.2.5's DynamoDBBackend.transact_write_items, which
# patch_transaction_rollback_per_item() replaces.
BACKEND_TRANSACT_WRITE_ITEMS_SHA256 = "81db2cb7d94e39c90b3a2077e1f4bb41a449c558ef9b1b1e2910fdaa39978ad4"


def patch_transaction_rollback_per_item():
    """Makes a TransactWriteItems cost what its items cost, not what its tables hold.

    Moto 5.2.5 deep-copies every table a transaction names before applying it, to roll back on
    a cancellation: each transaction costs time in proportion to the whole table. A lock of
    the gate layout keeps one item per holding in the holdings table, so filling a lock of
    10,000 took the local server most of an hour, each acquire slower than the last, where
    DynamoDB's cost is per item. The replacement keeps moto's evaluation, item by item and in
    order, with the same errors, and snapshots only the items the transaction names (at most
    100, each distinct), putting them back as they were when it is cancelled. Atomicity is
    unchanged: a cancelled transaction leaves every item it named as it found it (tested by
    harness/local-aws/tests/server.rs and every test of a refused grant).
    """
    import copy

    from moto.dynamodb.exceptions import (
        ConditionalCheckFailed,
        MockValidationException,
        MultipleTransactionsException,
        TooManyTransactionsException,
        TransactionCanceledException,
        TransactWriteSingleOpException,
    )
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.comparisons import get_filter_expression

    require_source(
        DynamoDBBackend.transact_write_items,
        BACKEND_TRANSACT_WRITE_ITEMS_SHA256,
        "transaction rollback per item",
    )

    def item_key(backend, op_type, op):
        if op_type != "Put":
            return op["Key"]
        table = backend.get_table(op["TableName"])
        attrs = op["Item"]
        key = {table.hash_key_attr: attrs[table.hash_key_attr]}
        if table.range_key_attr is not None:
            key[table.range_key_attr] = attrs[table.range_key_attr]
        return key

    def transact_write_items(self, transact_items):
        if len(transact_items) > 100:
            raise TooManyTransactionsException()
        # (table, key, the item's attributes before, or None when it did not exist)
        snapshots = []

        def roll_back():
            for table_name, key, before in reversed(snapshots):
                if before is None:
                    self.delete_item(table_name, key)
                else:
                    self.put_item(table_name, before)

        target_items = set()
        errors = []
        for item in transact_items:
            original_item = None
            if len(list(item.keys())) > 1:
                raise TransactWriteSingleOpException
            try:
                op_type, op = next(iter(item.items()))
                if op_type not in {"ConditionCheck", "Put", "Delete", "Update"}:
                    raise ValueError("Unsupported transaction operation")
                table_name = op["TableName"]
                condition_expression = op.get("ConditionExpression")
                names = op.get("ExpressionAttributeNames")
                values = op.get("ExpressionAttributeValues")
                key = item_key(self, op_type, op)
                unique = (str(table_name), str(dict(sorted(key.items()))))
                if unique in target_items:
                    raise MultipleTransactionsException()
                target_items.add(unique)

                current = self.get_item(table_name, key)
                if op_type != "ConditionCheck":
                    before = None if current is None else current.to_json()["Attributes"]
                    snapshots.append((table_name, key, copy.deepcopy(before)))
                if condition_expression is not None:
                    condition_op = get_filter_expression(condition_expression, names, values)
                    if not condition_op.expr(current):
                        if op.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" and current:
                            original_item = current.to_json()["Attributes"]
                        raise ConditionalCheckFailed(item=original_item)

                if op_type == "Put":
                    self.put_item(
                        table_name,
                        op["Item"],
                        condition_expression=condition_expression,
                        expression_attribute_names=names,
                        expression_attribute_values=values,
                    )
                elif op_type == "Delete":
                    self.delete_item(
                        table_name,
                        key,
                        condition_expression=condition_expression,
                        expression_attribute_names=names,
                        expression_attribute_values=values,
                    )
                elif op_type == "Update":
                    self.update_item(
                        table_name,
                        key,
                        update_expression=op["UpdateExpression"],
                        condition_expression=condition_expression,
                        expression_attribute_names=names,
                        expression_attribute_values=values,
                    )
                errors.append((None, None, None))
            except (MultipleTransactionsException, MockValidationException):
                roll_back()
                raise
            except ConditionalCheckFailed as e:
                errors.append(("ConditionalCheckFailed", str(e.message), original_item))
            except Exception as e:  # noqa: E722, as moto: any other failure cancels
                errors.append((type(e).__name__, str(e), original_item))

        if any(code is not None for code, _, _ in errors):
            roll_back()
            raise TransactionCanceledException(errors)

    DynamoDBBackend.transact_write_items = transact_write_items


def patch_sync_poll_interval():
    """Lets a large local run choose how often a `.sync` task asks whether its child ended.

    Moto's `.sync` integration asks every 0.5 s, each time a DescribeExecution through this
    one-request-at-a-time server that scans the child machine's executions: a run of 1,000
    executions each holding a slot while its child works made ~2,000 such requests a second,
    and starts crawled to one a second. AWS tells a `.sync` task of its child's end by an event,
    at no cost to anyone. LOCAL_AWS_SYNC_POLL_SECONDS (a number of seconds; unset: moto's 0.5)
    sets the interval; a parent then learns of its child's end up to that much later, which
    only lengthens its hold (the child has ended before the release, as on AWS).
    """
    value = os.environ.get("LOCAL_AWS_SYNC_POLL_SECONDS")
    if not value:
        return
    seconds = float(value)
    if not 0 < seconds <= 60:
        raise SystemExit("LOCAL_AWS_SYNC_POLL_SECONDS: expected seconds from 0 to 60")
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
        state_task_service_callback as callback,
    )

    if getattr(callback, "_DELAY_SECONDS_SYNC_CONDITION_CHECK", None) != 0.5:
        raise SystemExit(
            "moto_server.py: moto's .sync poll interval is not the 0.5 s the "
            "LOCAL_AWS_SYNC_POLL_SECONDS patch was written for: review it before changing the pin"
        )
    callback._DELAY_SECONDS_SYNC_CONDITION_CHECK = seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file")
    parser.add_argument("--parent-pid", type=int)
    parser.add_argument("--lambda-endpoint", metavar="URL")
    parser.add_argument("--lambda-concurrency", type=int, default=64, metavar="N")
    args = parser.parse_args()
    if args.lambda_endpoint and not args.lambda_endpoint.startswith("http://"):
        parser.error("--lambda-endpoint: expected http://HOST:PORT")
    if args.lambda_concurrency < 1:
        parser.error("--lambda-concurrency: expected a whole number of at least 1")

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class NoDelayHandler(MotoRequestHandler):
        # Werkzeug writes the head and the body of a response separately; with Nagle's
        # algorithm on, the body then waits for the client's delayed ACK (~40 ms a request).
        def setup(self):
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    patch_context_object()
    patch_catch_to_the_same_state()
    patch_step_functions_integration()
    patch_stop_aborts_waiting_tasks()
    patch_closed_task_tokens()
    patch_task_token_per_attempt()
    patch_expression_limits()
    patch_transaction_idempotency()
    patch_transaction_rollback_per_item()
    patch_sync_poll_interval()
    patch_task_parameters_quota()
    patch_data_limit_is_terminal()
    patch_state_machine_from_cloudformation()
    patch_no_value_in_lists()
    patch_alarm_from_cloudformation()
    patch_deploy_time_rules()
    patch_state_machine_type()
    patch_unnamed_executions()
    patch_express_definitions()
    patch_express_duration()
    patch_distributed_map_definitions()
    patch_distributed_child_context()
    patch_tolerated_failures()
    patch_history_pages()
    patch_express_not_describable()
    execute_state_machines()
    app = limit_start_execution_input(serialized(DomainDispatcherApplication(create_backend_app)))
    if args.lambda_endpoint:
        app = lambda_bridge(app, args.lambda_endpoint, args.lambda_concurrency)
    server = make_server(
        "127.0.0.1", args.port, app, threaded=True, request_handler=NoDelayHandler
    )
    port = server.socket.getsockname()[1]
    # moto's own service-to-service calls (e.g. Step Functions tasks) go to MOTO_PORT.
    os.environ["MOTO_PORT"] = str(port)
    if args.parent_pid:
        threading.Thread(target=watch_parent, args=(args.parent_pid,), daemon=True).start()
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, args.port_file)
    bridge = f", Lambda invokes -> {args.lambda_endpoint}" if args.lambda_endpoint else ""
    print(f"moto (serialized) listening on http://127.0.0.1:{port}{bridge}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
