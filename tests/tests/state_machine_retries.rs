//! The definitions' Retry lists against the errors AWS gives for faults the local server never
//! makes: a Lambda service error (`Lambda.ClientExecutionTimeoutException` among them), a
//! function that timed out or crashed (`Lambda.Unknown`, or `Sandbox.Timedout`, the `errorType`
//! Lambda answers a timed-out invoke with), and a refused or throttled `StartExecution` of the
//! protected work. The definitions are read as deployed (`local_aws::asl::definition`).
//!
//! Why each is safe to retry: the semaphore's functions are idempotent by design (an acquire is
//! one acquisition per run, so a retry whose first attempt landed is answered `already_held`; a
//! release or cleanup fences before it frees), and the work's child execution is started under
//! a name made from the acquisition, so a start sent again meets the same execution.
//!
//! Sources: Step Functions' "Handle Lambda service exceptions"
//! (docs.aws.amazon.com/step-functions/latest/dg/bp-lambda-serviceexception.html): retry
//! `Lambda.ClientExecutionTimeoutException`, `Lambda.ServiceException`,
//! `Lambda.AWSLambdaException`, `Lambda.SdkClientException`; "unhandled errors in Lambda are
//! reported as Lambda.Unknown ... These include out-of-memory errors and function timeouts";
//! "when Lambda hits the maximum number of invocations, the error is
//! Lambda.TooManyRequestsException". The Step Functions integration names a `StartExecution`
//! error `StepFunctions.<exception>` (`StepFunctions.ExecutionLimitExceededException` when the
//! account's open executions are at their quota).

use local_aws::asl::{definition, function_arn};
use serde_json::Value;

/// The Lambda service's transient errors: every Lambda task retries them.
const LAMBDA_SERVICE: [&str; 5] = [
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.ClientExecutionTimeoutException",
    "Lambda.TooManyRequestsException",
];

/// A function that timed out or crashed: the semaphore's own functions are retried (they are
/// idempotent); the user's work function is not (its work may have run).
const FUNCTION_FAILED: [&str; 2] = ["Lambda.Unknown", "Sandbox.Timedout"];

/// A `StartExecution` of the protected work that Step Functions refused or could not answer:
/// nothing started, or the same named execution is met again.
const START_REFUSED: [&str; 4] = [
    "StepFunctions.ExecutionLimitExceededException",
    "StepFunctions.ThrottlingException",
    "StepFunctions.SdkClientException",
    "StepFunctions.AWSStepFunctionsException",
];

/// The semaphore's functions: the binaries whose deployed functions the definitions invoke.
const OURS: [&str; 4] = ["acquire", "release", "cleanup", "sweeper"];

const DEFINITIONS: [&str; 7] = [
    "lock-protected.asl.json",
    "protect-your-workflow.asl.json",
    "cleanup-from-incomplete.asl.json",
    "sweeper.asl.json",
    "work-function.asl.json",
    "demo-work.asl.json",
    "test-runner.asl.json",
];

/// Every Task state of a definition, nested ones (Parallel, Map) included: (name, state).
fn tasks(states: &Value) -> Vec<(String, Value)> {
    let mut found = Vec::new();
    for (name, state) in states.as_object().expect("States is an object") {
        if state["Type"] == "Task" {
            found.push((name.clone(), state.clone()));
        }
        for branch in state["Branches"].as_array().into_iter().flatten() {
            found.extend(tasks(&branch["States"]));
        }
        for inner in ["Iterator", "ItemProcessor"] {
            if state[inner].is_object() {
                found.extend(tasks(&state[inner]["States"]));
            }
        }
    }
    found
}

/// Whether a retrier of `task` (before any catch-all) matches `error`. `States.ALL` matches
/// everything but `States.Runtime`, so it covers these too.
fn retried(task: &Value, error: &str) -> bool {
    task["Retry"].as_array().into_iter().flatten().any(|r| {
        r["ErrorEquals"]
            .as_array()
            .expect("ErrorEquals is an array")
            .iter()
            .any(|e| e == error || e == "States.ALL")
            && r["MaxAttempts"].as_u64().unwrap_or(3) > 0
    })
}

#[test]
fn every_lambda_task_retries_the_lambda_service_errors_and_ours_retry_a_timed_out_function() {
    let mut lambda_tasks = 0;
    let mut ours = 0;
    let mut missing = Vec::new();
    let ours_arns: Vec<String> = OURS.into_iter().map(function_arn).collect();
    for file in DEFINITIONS {
        let definition = definition(file);
        for (name, task) in tasks(&definition["States"]) {
            let resource = task["Resource"].as_str().unwrap_or_default();
            if !resource.starts_with("arn:aws:states:::lambda:invoke") {
                continue;
            }
            lambda_tasks += 1;
            let function = task["Parameters"]["FunctionName"].as_str().unwrap_or("");
            let is_ours = ours_arns.iter().any(|arn| arn == function);
            ours += usize::from(is_ours);
            let expected = LAMBDA_SERVICE
                .iter()
                .chain(FUNCTION_FAILED.iter().filter(|_| is_ours));
            for error in expected {
                if !retried(&task, error) {
                    missing.push(format!("{file} \"{name}\" does not retry {error}"));
                }
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    // Eight tasks call the semaphore's functions (acquire and two releases in each of the two
    // machines that take a slot, and the cleanup and the sweeper), one the user's work: a
    // definition that stops calling them through lambda:invoke is noticed.
    assert_eq!((lambda_tasks, ours), (9, 8));
}

#[test]
fn the_protected_work_retries_a_refused_or_throttled_start_and_nothing_else() {
    let definition = definition("lock-protected.asl.json");
    let work = &definition["States"]["Protected work"];
    assert_eq!(
        work["Resource"], "arn:aws:states:::states:startExecution.sync:2",
        "the work runs as a child execution"
    );
    for error in START_REFUSED {
        assert!(
            retried(work, error),
            "Protected work does not retry {error}"
        );
    }
    // The child's own failure (States.TaskFailed) and a name already taken by a closed child
    // (the redrive guard) must reach the Catch at once, not be retried.
    for error in [
        "States.TaskFailed",
        "StepFunctions.ExecutionAlreadyExistsException",
    ] {
        assert!(!retried(work, error), "Protected work retries {error}");
    }
}
