//! Just enough of the Amazon States Language to play a definition's states against the real
//! Lambda handlers: payload templates rendered with a context object, `ResultSelector` and
//! `ResultPath` applied to a task's result, and the paths `Choice`, `Pass` and `Fail` states and
//! a task's `TimeoutSecondsPath` read. A path that is not there panics, as Step Functions fails such a state with
//! `States.Runtime`: a field an answer lacks, or a definition reading one it does not give, is
//! noticed here. So is any expression this evaluator does not know, so a change of the
//! definitions is noticed too.

use std::process::Command;
use std::sync::OnceLock;

use serde_json::{json, Map, Value};

use crate::server::{endpoint, repo_root, Options};

/// The name of the state that takes a slot, in the stack's definitions and docs/using.md's
/// fragment: a `lambda:invoke.waitForTaskToken` task of the acquire function whose timeout is
/// the period of a waiting execution's checks.
pub const ACQUIRE_STATE: &str = "Acquire slot";

/// What `$$` holds for the state being played.
#[derive(Debug, Clone)]
pub struct Context {
    /// `$$.Execution`: `Id`, `Input`, `StartTime`, `RedriveCount`...
    pub execution: Value,
    /// `$$.State.EnteredTime`.
    pub entered_time: String,
    /// `$$.State.RetryCount`: the retries of the state's task since it was entered.
    pub retry_count: u32,
    /// `$$.Task.Token`: there only while a `.waitForTaskToken` task is played (see
    /// [`Context::with_task_token`]); reading it elsewhere fails as Step Functions does.
    pub task_token: Option<String>,
}

impl Context {
    /// An execution's context: `RedriveCount` 0 and `StartTime` equal to `entered_time`.
    pub fn new(id: &str, input: Value, entered_time: &str) -> Self {
        Self {
            execution: json!({
                "Id": id,
                "Input": input,
                "Name": id.rsplit(':').next().unwrap_or(id),
                "StartTime": entered_time,
                "RedriveCount": 0
            }),
            entered_time: entered_time.to_owned(),
            retry_count: 0,
            task_token: None,
        }
    }

    /// The same execution entering a state at `entered_time` (a plain state: no task token).
    pub fn entered(&self, entered_time: &str) -> Self {
        Self {
            execution: self.execution.clone(),
            entered_time: entered_time.to_owned(),
            retry_count: 0,
            task_token: None,
        }
    }

    /// The same state's task retried (`$$.State.RetryCount` one more), with a new task token
    /// as Step Functions gives every attempt of a callback task.
    pub fn retried(&self, token: &str) -> Self {
        Self {
            retry_count: self.retry_count + 1,
            task_token: Some(token.to_owned()),
            ..self.clone()
        }
    }

    /// The same state played as a `.waitForTaskToken` task whose token is `token` (Step
    /// Functions makes a new one each time the task is entered).
    pub fn with_task_token(&self, token: &str) -> Self {
        Self {
            task_token: Some(token.to_owned()),
            ..self.clone()
        }
    }

    /// The same execution after `redrive_count` redrives.
    pub fn redriven(&self, redrive_count: u32) -> Self {
        let mut next = self.clone();
        next.execution["RedriveCount"] = json!(redrive_count);
        next
    }

    fn value(&self) -> Value {
        let mut value = json!({
            "Execution": self.execution,
            "State": {"EnteredTime": self.entered_time, "RetryCount": self.retry_count}
        });
        if let Some(token) = &self.task_token {
            value["Task"] = json!({"Token": token});
        }
        value
    }
}

/// template.yaml as `sam deploy` makes it: deployed once per test binary to the local server by
/// `local/deploy_stack.py` (the SAM transform, then CloudFormation), as the local run deploys
/// it. Its description gives every state machine's definition with its `DefinitionSubstitutions`
/// applied and every function's ARN, so a test plays the definitions as deployed.
fn deployed() -> &'static Value {
    static DEPLOYED: OnceLock<Value> = OnceLock::new();
    DEPLOYED.get_or_init(|| {
        // The Python the local server runs on, with moto's CloudFormation.
        let python = Options::new().python;
        let output = Command::new(&python)
            .arg(repo_root().join("local/deploy_stack.py"))
            .args(["--endpoint", endpoint()])
            .args(["--stack-name", &crate::sfn::unique("semaphore-asl")])
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
        assert!(
            output.status.success(),
            "local/deploy_stack.py failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).expect("the stack's description is JSON")
    })
}

/// Deploys the stack now, if this test binary has not yet: it takes seconds, so a test that
/// takes the time (its acquire's request time) before it reads a definition deploys first.
pub fn deploy() {
    deployed();
}

/// `statemachines/<file>` as deployed: its definition, substitutions applied.
pub fn definition(file: &str) -> Value {
    let uri = format!("statemachines/{file}");
    let machine = deployed()["machines"]
        .as_array()
        .expect("machines")
        .iter()
        .find(|m| m["definition_uri"] == json!(uri))
        .unwrap_or_else(|| panic!("no state machine of template.yaml is defined by {uri}"));
    serde_json::from_str(machine["definition"].as_str().expect("a definition"))
        .unwrap_or_else(|e| panic!("{uri} as deployed is not JSON: {e}"))
}

/// The deployed ARN of the function built from the cargo binary `binary`: what the
/// definitions' tasks invoke.
pub fn function_arn(binary: &str) -> String {
    deployed()["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .find(|f| f["binary"] == json!(binary))
        .and_then(|f| f["arn"].as_str())
        .unwrap_or_else(|| panic!("template.yaml has no function built from {binary}"))
        .to_owned()
}

/// The state named `name`.
pub fn state<'a>(definition: &'a Value, name: &str) -> &'a Value {
    definition["States"]
        .get(name)
        .unwrap_or_else(|| panic!("no state {name:?} in the definition"))
}

/// Every Task state that invokes `function` (its `FunctionName`), by name.
pub fn tasks_calling<'a>(definition: &'a Value, function: &str) -> Vec<(&'a str, &'a Value)> {
    definition["States"]
        .as_object()
        .expect("States")
        .iter()
        .filter(|(_, s)| s["Parameters"]["FunctionName"] == json!(function))
        .map(|(name, s)| (name.as_str(), s))
        .collect()
}

/// The value at a JSONPath of the forms `$`, `$.a.b.c` and `$[0]` / `$.a[1]`, if it is there.
pub fn read<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    let rest = path
        .strip_prefix('$')
        .unwrap_or_else(|| panic!("the test reads only $ paths, not {path:?}"));
    let mut at = value;
    let mut rest = rest;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('[') {
            let (index, after) = after
                .split_once(']')
                .unwrap_or_else(|| panic!("an unclosed [ in {path:?}"));
            let index: usize = index
                .parse()
                .unwrap_or_else(|_| panic!("the test reads only [N] indices, not {path:?}"));
            at = at.get(index)?;
            rest = after;
        } else if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            at = at.get(&after[..end])?;
            rest = &after[end..];
        } else {
            panic!("the test reads only $, $.a.b and $[N] paths, not {path:?}");
        }
    }
    Some(at)
}

/// The value at `path` of the state's input (`$...`) or of the context object (`$$...`);
/// panics, as Step Functions fails the state, when it is not there.
pub fn path(expression: &str, input: &Value, context: &Context) -> Value {
    let (root, path) = match expression.strip_prefix('$') {
        Some(rest) if rest.starts_with('$') => (context.value(), rest.to_owned()),
        _ => (input.clone(), expression.to_owned()),
    };
    read(&root, &path)
        .unwrap_or_else(|| {
            panic!("States.Runtime: the JSONPath {expression} could not be found in {root}")
        })
        .clone()
}

/// Evaluates a `.$` value: a path, or one of the intrinsic functions the definitions use.
pub fn evaluate(expression: &str, input: &Value, context: &Context) -> Value {
    if let Some(args) = expression
        .strip_prefix("States.JsonMerge(")
        .and_then(|rest| rest.strip_suffix(')'))
    {
        let args: Vec<&str> = args.split(',').map(str::trim).collect();
        let [left, right, "false"] = args.as_slice() else {
            panic!("the test knows States.JsonMerge(a, b, false) only, not {expression}");
        };
        let (Value::Object(mut merged), Value::Object(right)) =
            (path(left, input, context), path(right, input, context))
        else {
            panic!("States.Runtime: States.JsonMerge of something not an object in {expression}");
        };
        // A shallow merge: the right's keys win.
        merged.extend(right);
        return Value::Object(merged);
    }
    if expression.starts_with('$') {
        return path(expression, input, context);
    }
    panic!("the test does not know how to evaluate {expression:?}; update tests/src/asl.rs");
}

/// Renders a template (`Parameters`, `Payload`, `ResultSelector`): keys ending in `.$` are
/// expressions.
pub fn render(template: &Value, input: &Value, context: &Context) -> Value {
    match template {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(key, value)| match key.strip_suffix(".$") {
                    Some(name) => (
                        name.to_owned(),
                        evaluate(
                            value.as_str().expect("an expression is a string"),
                            input,
                            context,
                        ),
                    ),
                    None => (key.clone(), render(value, input, context)),
                })
                .collect::<Map<String, Value>>(),
        ),
        other => other.clone(),
    }
}

/// What a `ResultPath` makes of the state's input and a result: absent or `$` is the result,
/// `null` the input unchanged, `$.a` the input with `a` set.
pub fn apply_result_path(input: &Value, result_path: Option<&Value>, result: Value) -> Value {
    match result_path {
        None => result,
        Some(Value::Null) => input.clone(),
        Some(Value::String(p)) if p == "$" => result,
        Some(Value::String(p)) => {
            let key = p
                .strip_prefix("$.")
                .filter(|k| !k.contains('.'))
                .unwrap_or_else(|| panic!("the test knows ResultPath $ and $.key only, not {p}"));
            let mut output = input.clone();
            output
                .as_object_mut()
                .expect("a ResultPath of $.key needs an object input")
                .insert(key.to_owned(), result);
            output
        }
        Some(other) => panic!("ResultPath {other} is not a path"),
    }
}

/// A Task state's output for its raw `result` (for `lambda:invoke`, `{"Payload": answer}`):
/// `ResultSelector`, then `ResultPath`.
pub fn task_output(task: &Value, input: &Value, context: &Context, result: Value) -> Value {
    let selected = match task.get("ResultSelector") {
        Some(selector) => render(selector, &result, context),
        None => result,
    };
    apply_result_path(input, task.get("ResultPath"), selected)
}

/// What a `Catch` makes of the state's input and an error.
pub fn caught(catcher: &Value, input: &Value, error: &str, cause: &str) -> Value {
    apply_result_path(
        input,
        catcher.get("ResultPath"),
        json!({"Error": error, "Cause": cause}),
    )
}

/// The catcher of `task` that matches `error` (exactly, or `States.ALL`), in order.
pub fn catcher<'a>(task: &'a Value, error: &str) -> &'a Value {
    task["Catch"]
        .as_array()
        .expect("the task has a Catch")
        .iter()
        .find(|c| {
            c["ErrorEquals"]
                .as_array()
                .expect("ErrorEquals")
                .iter()
                .any(|e| e == error || e == "States.ALL")
        })
        .unwrap_or_else(|| panic!("no catcher matches {error}"))
}

/// The state a `Choice` goes to for `input`. Knows `BooleanEquals` and `StringEquals`; the
/// variable of a rule must be there (Step Functions fails the state otherwise).
pub fn choose<'a>(choice: &'a Value, input: &Value) -> &'a str {
    for rule in choice["Choices"].as_array().expect("Choices") {
        let variable = rule["Variable"].as_str().expect("a Variable");
        let value = read(input, variable)
            .unwrap_or_else(|| panic!("States.Runtime: {variable} not found in {input}"));
        let matched = if let Some(expected) = rule.get("BooleanEquals") {
            value == expected
        } else if let Some(expected) = rule.get("StringEquals") {
            value == expected
        } else {
            panic!("the test does not know the Choice rule {rule}; update tests/src/asl.rs");
        };
        if matched {
            return rule["Next"].as_str().expect("Next");
        }
    }
    choice["Default"]
        .as_str()
        .unwrap_or_else(|| panic!("States.NoChoiceMatched for {input}"))
}

/// The timeout of a Task state in seconds: its `TimeoutSeconds`, or the value at its
/// `TimeoutSecondsPath` in `input`, which must be a whole number from 1 (Step Functions fails
/// the state otherwise).
pub fn timeout_seconds(task: &Value, input: &Value) -> u64 {
    if let Some(seconds) = task.get("TimeoutSeconds") {
        return seconds
            .as_u64()
            .filter(|s| *s >= 1)
            .unwrap_or_else(|| panic!("TimeoutSeconds {seconds} is not a whole number from 1"));
    }
    let timeout_path = task["TimeoutSecondsPath"]
        .as_str()
        .expect("a TimeoutSeconds or TimeoutSecondsPath");
    read(input, timeout_path)
        .and_then(Value::as_u64)
        .filter(|s| *s >= 1)
        .unwrap_or_else(|| {
            panic!("States.Runtime: {timeout_path} is not a whole number from 1 in {input}")
        })
}

/// The error and cause a `Fail` state with `ErrorPath` and `CausePath` fails with: both must
/// be strings.
pub fn fail(fail: &Value, input: &Value) -> (String, String) {
    let text = |field: &str| {
        let p = fail[field].as_str().unwrap_or_else(|| panic!("a {field}"));
        read(input, p)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("States.Runtime: {field} {p} is not a string in {input}"))
            .to_owned()
    };
    (text("ErrorPath"), text("CausePath"))
}
