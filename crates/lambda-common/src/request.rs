//! What an acquire or release payload asks for, resolved against the function's configuration:
//! the one place that says which lock, limit, acquisition and work a payload is about. The
//! acquire and release functions use it, and so does anything that reads an acquire payload
//! back (the cleanup function, from an ended execution's history: [`Resolver::lock`]), so all
//! of them agree on the lock an execution took, however it was chosen.
//!
//! A payload comes in one of two shapes, which may be mixed:
//!
//! - the lock-protected state machine's: `{"input": $$.Execution.Input, "holder":
//!   $$.Execution.Id, "redrive_count": $$.Execution.RedriveCount, "started_at":
//!   $$.Execution.StartTime, "requested_at": $$.State.EnteredTime}` (a release sends the first
//!   three, and `"error"` after a failure). The lock, limit and work come from the execution
//!   input, else from the function's defaults; the acquisition is `r<redrive_count>`;
//! - a caller's own machine's: `{"lock", "limit", "holder", "acquisition", "requested_at"}`,
//!   every value given.
//!
//! Instead of `input`, `holder`, `redrive_count` and `started_at`, a payload may pass the
//! context object's whole execution node, `"execution.$": "$$.Execution"`: its `Input`, `Id`,
//! `RedriveCount` (absent = 0) and `StartTime` / `RedriveTime` are read in their place. It is
//! the only way a JSONPath state can pass `RedriveTime` (the path fails while the execution has
//! never been redriven), which the wait budget of a redriven execution needs.
//!
//! A field given in the payload wins over the same one from the input or the execution node.
//!
//! A later task of the same run (the lock-protected machine's wait and release) need not carry
//! the execution input, which may be near Step Functions' 256 KiB: it passes the acquire answer
//! it follows, `"answer.$": "$.semaphore"`, instead. The lock, limit, weight, rate and work are
//! read from the input first (an older payload that has it), else from that answer; the wait
//! budget's start from the answer's `waiting_since` when the payload gives no start of its own
//! run (a redriven run's `RedriveTime` is only in the execution node).

use semaphore_core::{
    AcquisitionId, HolderId, Identity, Limit, LockName, QueueKey, Rate, Run, TaskToken, Terms,
    Weight,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::HandlerError;
use crate::payload::{hint, quoted, Payload};

/// The acquire payload's fields, as named in errors.
pub const ACQUIRE_PAYLOAD: &str = r#"{"input": object (or "answer": the acquire answer), "holder": string, "redrive_count": integer, "started_at": RFC 3339 string, "requested_at": RFC 3339 string}, or {"lock": string, "limit": integer, "weight": integer (optional), "rate": number per second (optional), "holder": string, "acquisition": string, "requested_at": RFC 3339 string}"#;

/// The release payload's fields, as named in errors.
pub const RELEASE_PAYLOAD: &str = r#"{"input": object (or "answer": the acquire answer, or "state": the failed state's data), "holder": string, "redrive_count": integer, "error": {"Error": string, "Cause": string} if it failed}, or {"lock": string, "holder": string, "acquisition": string, "weight": integer (optional: the acquire's)}"#;

/// The key of the work's input under which it gets the semaphore's context: an execution input
/// must not have it (the work's input is the execution input merged with the context).
pub const RESERVED_INPUT_KEY: &str = "semaphore";

const INPUT_IS: &str = "the execution input, \"input.$\": \"$$.Execution.Input\"";
const EXECUTION_IS: &str = "Step Functions' context object node, \"execution.$\": \"$$.Execution\"";
const ANSWER_IS: &str = "the acquire answer this task follows, \"answer.$\": \"$.semaphore\"";
const STATE_IS: &str = "the failed state's data, \"state.$\": \"$\"";

/// What to pass when a value is found nowhere.
mod missing {
    pub const LOCK: &str = "pass \"lock\" in the execution input or in the payload, e.g. \
        \"lock\": \"demo-lock\", or set the function's DEFAULT_LOCK";
    pub const LIMIT: &str = "pass \"limit\" in the execution input or in the payload, a whole \
        number from 1 to 1000, e.g. \"limit\": 5, or set the function's DEFAULT_LIMIT";
    pub const ACQUISITION: &str = "pass \"redrive_count.$\": \"$$.Execution.RedriveCount\" (the \
        acquisition is then r<count>, one per run of the execution), or an id made once per \
        logical acquire, \"acquisition.$\": \"States.UUID()\"";
}

/// Defaults for what a payload leaves out: the function's `DEFAULT_LOCK`, `DEFAULT_LIMIT`,
/// `DEFAULT_WEIGHT` (1 when unset) and `DEFAULT_RATE` (none when unset).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Defaults {
    pub lock: Option<LockName>,
    pub limit: Option<Limit>,
    pub weight: Option<Weight>,
    pub rate: Option<Rate>,
}

/// What an allowed work ARN names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkKind {
    /// `arn:<partition>:states:<region>:<account>:stateMachine:<name>[:<version or alias>]`,
    /// started as the child execution.
    StateMachine,
    /// `arn:<partition>:lambda:<region>:<account>:function:<name>[:<version or alias>]`, run by
    /// the work-function runner machine as the child execution.
    Function,
}

impl WorkKind {
    /// The kind of resource `arn` names, from its form; `None` if it is neither.
    pub fn of(arn: &str) -> Option<Self> {
        let parts: Vec<&str> = arn.split(':').collect();
        if !(7..=8).contains(&parts.len())
            || parts[0] != "arn"
            || parts.iter().skip(1).any(|p| p.is_empty())
        {
            return None;
        }
        match (parts[2], parts[5]) {
            ("states", "stateMachine") => Some(Self::StateMachine),
            ("lambda", "function") => Some(Self::Function),
            _ => None,
        }
    }

    /// The form of an ARN of this kind, for messages.
    pub fn form(self) -> &'static str {
        match self {
            Self::StateMachine => "arn:<partition>:states:<region>:<account>:stateMachine:<name>",
            Self::Function => "arn:<partition>:lambda:<region>:<account>:function:<name>",
        }
    }
}

/// The work executions may run under a lock: the function's `DEFAULT_WORK`,
/// `WORK_STATE_MACHINES`, `WORK_FUNCTIONS` and `WORK_FUNCTION_RUNNER`, checked when read
/// ([`crate::Settings::allowed_work`]). The default allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedWork {
    pub(crate) default: Option<String>,
    pub(crate) state_machines: Vec<String>,
    pub(crate) functions: Vec<String>,
    /// The state machine that runs a Lambda function as a child execution.
    pub(crate) runner: Option<String>,
}

/// The work an acquire resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    /// The state machine or Lambda function to run, as the input or `DEFAULT_WORK` named it.
    pub arn: String,
    pub kind: WorkKind,
    /// The state machine the lock-protected machine starts: `arn` itself, or for a Lambda
    /// function the runner (which invokes `arn`).
    pub state_machine: String,
}

impl AllowedWork {
    /// What may be named, for messages.
    fn describe(&self) -> String {
        let list = |arns: &[String]| match arns {
            [] => "none".to_owned(),
            arns => arns.join(", "),
        };
        format!(
            "state machines: {}; Lambda functions: {}",
            list(&self.state_machines),
            list(&self.functions)
        )
    }

    /// `input.work`, else the default, checked against the allowed lists.
    fn resolve(&self, input: &Payload) -> Result<Work, HandlerError> {
        self.named(input.optional_string("work")?, &input.name("work"))
    }

    /// The work `named` (where it came from: `field`), else the default, checked against the
    /// allowed lists.
    fn named(&self, named: Option<&str>, field: &str) -> Result<Work, HandlerError> {
        let Some(arn) = named.or(self.default.as_deref()) else {
            return Err(HandlerError::InvalidInput(format!(
                "{field} is missing and the function has no DEFAULT_WORK: name the state machine or \
                 Lambda function to run under the lock, one of those this stack allows ({})",
                self.describe()
            )));
        };
        let kind = if self.state_machines.iter().any(|a| a == arn) {
            WorkKind::StateMachine
        } else if self.functions.iter().any(|a| a == arn) {
            WorkKind::Function
        } else {
            let default = match &self.default {
                Some(default) => format!(", or leave it out to run the default, {default}"),
                None => String::new(),
            };
            return Err(HandlerError::InvalidInput(format!(
                "{field} is {}, which this stack does not allow: name one it allows ({}){default}. \
                 To allow another, add it to the stack's WorkStateMachineArns or \
                 WorkFunctionArns parameter (the acquire function's WORK_STATE_MACHINES and \
                 WORK_FUNCTIONS)",
                quoted(&Value::String(arn.to_owned())),
                self.describe()
            )));
        };
        let state_machine = match kind {
            WorkKind::StateMachine => arn.to_owned(),
            // Checked when read: functions are allowed only with a runner.
            WorkKind::Function => self.runner.clone().unwrap_or_default(),
        };
        Ok(Work {
            arn: arn.to_owned(),
            kind,
            state_machine,
        })
    }
}

/// Whom a release (or the cleanup of an acquire) is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub lock: LockName,
    pub identity: Identity,
    /// `redrive_count` (or the execution node's `RedriveCount`), if the payload has one.
    pub redrive_count: Option<u32>,
    /// The weight its acquire asked for, resolved as for the acquire (1 when nothing names
    /// one): what a release expects to free, checked by the store, which finds the right one
    /// if it is not.
    pub weight: Weight,
}

/// A validated acquire request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    pub lock: LockName,
    /// The limit, weight and start rate asked for.
    pub terms: Terms,
    pub identity: Identity,
    /// The execution's run (its redrive count; the first run when the payload does not say):
    /// the run whose fence this acquire checks.
    pub run: Run,
    /// When the acquire was asked for (the acquire state's entry time), ms since the epoch.
    pub requested_at_ms: u64,
    /// Since when the execution has been waiting for a slot: when it started, or when it was
    /// last redriven. `None` when the payload does not say (a caller's own shape without
    /// `started_at`, or a redriven execution whose payload carries only its first start): then
    /// the wait has no budget and does not grow.
    pub waiting_since_ms: Option<u64>,
    /// The work to run under the slot; `None` without an execution input.
    pub work: Option<Work>,
    /// Present when the request comes from a parked task (`.waitForTaskToken`): wait in line.
    pub wait: Option<WaitRequest>,
}

/// A request to wait in line (see `semaphore_core::queue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitRequest {
    /// `task_token`: `$$.Task.Token` of the parked task.
    pub task_token: TaskToken,
    /// `queued_at`: when the execution first asked for the slot it waits for (the acquire
    /// answer's `queued_at`, which is that acquire's request time), ms since the epoch: its
    /// place in line, kept across fallback checks. The request time when absent.
    pub queued_at_ms: u64,
}

impl WaitRequest {
    /// The waiter's place in line.
    pub fn key(&self, identity: &Identity) -> QueueKey {
        QueueKey::new(identity, self.queued_at_ms)
    }
}

/// Resolves payloads against the function's defaults and allowed work. Build it once per cold
/// start ([`crate::Settings::resolver`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolver {
    pub defaults: Defaults,
    pub work: AllowedWork,
}

/// A payload's parts: the payload itself, the execution node, the execution input and the
/// acquire answer a later task passes instead of the input.
struct Parts<'a> {
    payload: Payload<'a>,
    execution: Option<Payload<'a>>,
    input: Option<Payload<'a>>,
    answer: Option<Payload<'a>>,
}

impl<'a> Parts<'a> {
    fn new(value: &'a Value, expected: &str) -> Result<Self, HandlerError> {
        let payload = Payload::new(value, expected)?;
        let execution = payload.object("execution", "execution.", EXECUTION_IS)?;
        let input = match (payload.get("input"), &execution) {
            (Some(_), _) => payload.object("input", "input.", INPUT_IS)?,
            // Named as the caller knows it: the execution input.
            (None, Some(execution)) => execution.object("Input", "input.", INPUT_IS)?,
            (None, None) => None,
        };
        // A failed state's data (the release after a failure): the acquire answer under
        // `semaphore` (an input never has that key: the acquire refuses it), else the input.
        let state = payload.object("state", "state.", STATE_IS)?;
        let state_answer = match &state {
            Some(state) => state.object("semaphore", "state.semaphore.", ANSWER_IS)?,
            None => None,
        };
        let input = match (input, &state) {
            (Some(input), _) => Some(input),
            (None, Some(state)) if state_answer.is_none() => Some(*state),
            (None, _) => None,
        };
        let answer = match payload.object("answer", "answer.", ANSWER_IS)? {
            Some(answer) => Some(answer),
            None => state_answer,
        };
        Ok(Self {
            payload,
            execution,
            input,
            answer,
        })
    }

    /// The payload's value, else the execution input's, else the acquire answer's: `read`
    /// reads one of them.
    fn given<T>(
        &self,
        read: impl Fn(&Payload<'a>) -> Result<Option<T>, HandlerError>,
    ) -> Result<Option<T>, HandlerError> {
        if let Some(value) = read(&self.payload)? {
            return Ok(Some(value));
        }
        if let Some(value) = self.input.as_ref().map(&read).transpose()?.flatten() {
            return Ok(Some(value));
        }
        Ok(self.answer.as_ref().map(read).transpose()?.flatten())
    }

    /// The work: the execution input's `work` (or the default) when the payload has the
    /// input; else the work the acquire answer named (its `work.context.semaphore.function`
    /// for a Lambda function, its `work.state_machine` otherwise), checked again against the
    /// allowed lists; `None` with neither.
    fn work(&self, allowed: &AllowedWork) -> Result<Option<Work>, HandlerError> {
        if let Some(input) = &self.input {
            return allowed.resolve(input).map(Some);
        }
        let Some(answer) = &self.answer else {
            return Ok(None);
        };
        let Some(work) = answer.object("work", "answer.work.", "the work the answer named")? else {
            return Ok(None);
        };
        let function = work
            .object("context", "answer.work.context.", "the work's context")?
            .and_then(|c| {
                c.object(
                    "semaphore",
                    "answer.work.context.semaphore.",
                    "the semaphore context",
                )
                .transpose()
            })
            .transpose()?
            .map(|semaphore| semaphore.optional_string("function"))
            .transpose()?
            .flatten();
        let named = match function {
            Some(function) => function,
            None => work.string("state_machine", "pass the acquire answer as it was given")?,
        };
        allowed.named(Some(named), "answer.work").map(Some)
    }

    /// The payload's, else the input's, else the default.
    fn lock(&self, defaults: &Defaults) -> Result<LockName, HandlerError> {
        self.given(|p| p.optional_lock("lock"))?
            .or_else(|| defaults.lock.clone())
            .ok_or_else(|| {
                HandlerError::InvalidInput(format!("lock is missing: {}", missing::LOCK))
            })
    }

    /// The payload's, else the input's, else the default.
    fn limit(&self, defaults: &Defaults) -> Result<Limit, HandlerError> {
        self.given(|p| p.optional_limit("limit"))?
            .or(defaults.limit)
            .ok_or_else(|| {
                HandlerError::InvalidInput(format!("limit is missing: {}", missing::LIMIT))
            })
    }

    /// The limit, weight and rate, each resolved on its own; a weight above the limit is
    /// refused.
    fn terms(&self, defaults: &Defaults) -> Result<Terms, HandlerError> {
        Terms::new(
            self.limit(defaults)?,
            self.weight(defaults)?,
            self.rate(defaults)?,
        )
        .map_err(|e| HandlerError::InvalidInput(e.to_string()))
    }

    fn holder(&self) -> Result<HolderId, HandlerError> {
        if let Some(holder) = self.payload.optional_holder("holder")? {
            return Ok(holder);
        }
        if let Some(holder) = self
            .execution
            .map(|e| e.optional_holder("Id"))
            .transpose()?
            .flatten()
        {
            return Ok(holder);
        }
        Err(HandlerError::InvalidInput(format!(
            "holder is missing: {}",
            hint::HOLDER
        )))
    }

    /// The payload's, else the execution node's (absent there means never redriven: 0).
    fn redrive_count(&self) -> Result<Option<u32>, HandlerError> {
        const SOURCE: &str = "$$.Execution.RedriveCount";
        if let Some(count) = self.payload.optional_count("redrive_count", SOURCE)? {
            return Ok(Some(count));
        }
        match &self.execution {
            Some(execution) => Ok(Some(
                execution
                    .optional_count("RedriveCount", SOURCE)?
                    .unwrap_or(0),
            )),
            None => Ok(None),
        }
    }

    /// The payload's, else `r<redrive count>`: one acquisition per run (incarnation) of the
    /// execution, so every retry and poll of one run shares it, and a redriven run gets a new
    /// one (the old one may have been released, and a release fences it).
    fn acquisition(&self, redrive_count: Option<u32>) -> Result<AcquisitionId, HandlerError> {
        if let Some(acquisition) = self.payload.optional_acquisition("acquisition")? {
            return Ok(acquisition);
        }
        match redrive_count {
            Some(count) => Ok(incarnation_acquisition(count)),
            None => Err(HandlerError::InvalidInput(format!(
                "acquisition is missing: {}",
                missing::ACQUISITION
            ))),
        }
    }

    fn target(&self, defaults: &Defaults) -> Result<Target, HandlerError> {
        let lock = self.lock(defaults)?;
        let holder = self.holder()?;
        let redrive_count = self.redrive_count()?;
        let acquisition = self.acquisition(redrive_count)?;
        Ok(Target {
            lock,
            identity: Identity::new(holder, acquisition),
            redrive_count,
            weight: self.weight(defaults)?,
        })
    }

    /// The payload's, else the input's, else the default, else 1.
    fn weight(&self, defaults: &Defaults) -> Result<Weight, HandlerError> {
        Ok(self
            .given(|p| p.optional_weight("weight"))?
            .or(defaults.weight)
            .unwrap_or_default())
    }

    /// The payload's, else the input's, else the default (none: no rate limit).
    fn rate(&self, defaults: &Defaults) -> Result<Option<Rate>, HandlerError> {
        Ok(self.given(|p| p.optional_rate("rate"))?.or(defaults.rate))
    }

    /// `task_token` and `queued_at`, when the payload waits in line.
    fn wait(&self, requested_at_ms: u64) -> Result<Option<WaitRequest>, HandlerError> {
        let Some(token) = self.payload.optional_string("task_token")? else {
            return Ok(None);
        };
        let task_token = TaskToken::new(token)
            .map_err(|e| HandlerError::InvalidInput(format!("task_token: {e}")))?;
        let queued_at_ms = self
            .payload
            .optional_time_ms("queued_at", "the acquire answer's queued_at")?
            .unwrap_or(requested_at_ms);
        Ok(Some(WaitRequest {
            task_token,
            queued_at_ms,
        }))
    }

    /// Since when the execution has waited: its start, or its last redrive if it was redriven.
    fn waiting_since_ms(&self, redrive_count: Option<u32>) -> Result<Option<u64>, HandlerError> {
        const START: &str = "$$.Execution.StartTime";
        const REDRIVE: &str = "$$.Execution.RedriveTime";
        let redriven_at = match &self.execution {
            Some(execution) => execution.optional_time_ms("RedriveTime", REDRIVE)?,
            None => None,
        };
        let started_at = match self.payload.optional_time_ms("started_at", START)? {
            Some(at) => Some(at),
            None => match &self.execution {
                Some(execution) => execution.optional_time_ms("StartTime", START)?,
                None => None,
            },
        };
        // A redriven execution keeps its first StartTime: waiting since then would count the
        // time it lay failed before its redrive, and time it out at once.
        let own = match redrive_count {
            Some(count) if count > 0 => redriven_at,
            _ => started_at,
        };
        if own.is_some() {
            return Ok(own);
        }
        // A payload without the execution node: the answer's start, if the answer is this
        // run's (a run redriven into its wait task follows an answer of the run before).
        let Some(answer) = &self.answer else {
            return Ok(None);
        };
        let this_run = incarnation_acquisition(redrive_count.unwrap_or(0));
        if answer.optional_string("acquisition")? != Some(this_run.as_str()) {
            return Ok(None);
        }
        answer.optional_time_ms("waiting_since", "the acquire answer's waiting_since")
    }
}

/// The acquisition of run `redrive_count` of an execution: `r0` for its first run.
pub fn incarnation_acquisition(redrive_count: u32) -> AcquisitionId {
    AcquisitionId::new(format!("r{redrive_count}")).expect("r<digits> is a valid acquisition id")
}

/// The name of the work's child execution for an acquisition: the same for every attempt and
/// poll of one acquisition, so a redrive into the work after its slot was freed meets the name
/// of the child that already ran (Step Functions refuses to start a second execution with that
/// name). Readable and within Step Functions' rules (at most 80 characters of `0-9 A-Z a-z - _`):
/// the first 40 characters of the holder's execution name (its ARN's last part), `-`, and 16 hex
/// digits of SHA-256 of `holder#acquisition` (the slot key), which tell two holders apart.
pub fn child_execution_name(identity: &Identity) -> String {
    const READABLE: usize = 40;
    let execution = identity
        .holder
        .as_str()
        .rsplit(':')
        .next()
        .unwrap_or_default();
    // Anything outside CloudWatch's safe set becomes '-': the digest, not this part, makes the
    // name unique.
    let readable: String = execution
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(READABLE)
        .collect();
    let digest = Sha256::digest(identity.slot_key().as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    if readable.is_empty() {
        hex
    } else {
        format!("{readable}-{hex}")
    }
}

impl Resolver {
    /// The lock an acquire payload asks for: its `lock`, else its input's `lock`, else
    /// `DEFAULT_LOCK`. What the cleanup function reads from the payloads of an ended
    /// execution's acquire states; an error means the acquire refused that payload the same way,
    /// so nothing was held under it.
    pub fn lock(&self, payload: &Value) -> Result<LockName, HandlerError> {
        Parts::new(payload, ACQUIRE_PAYLOAD)?.lock(&self.defaults)
    }

    /// The lock and identity a release payload names (lock, holder and acquisition resolved as
    /// for an acquire).
    pub fn target(&self, payload: &Value) -> Result<Target, HandlerError> {
        Parts::new(payload, RELEASE_PAYLOAD)?.target(&self.defaults)
    }

    /// A validated acquire request. With an execution input, the input must be an object
    /// without the reserved key `semaphore`, and the work it names (or the default) must be
    /// one this stack allows.
    pub fn acquire(&self, payload: &Value) -> Result<AcquireRequest, HandlerError> {
        let parts = Parts::new(payload, ACQUIRE_PAYLOAD)?;
        if let Some(input) = &parts.input {
            if input.has(RESERVED_INPUT_KEY) {
                return Err(HandlerError::InvalidInput(format!(
                    "the execution input has the key \"{RESERVED_INPUT_KEY}\", which is reserved: \
                     the work's input is the execution input plus \"{RESERVED_INPUT_KEY}\": \
                     {{lock, fencing_token, holder, acquisition}}; rename that key of the input"
                )));
            }
        }
        let Target {
            lock,
            identity,
            redrive_count,
            ..
        } = parts.target(&self.defaults)?;
        let terms = parts.terms(&self.defaults)?;
        let requested_at_ms = parts.payload.requested_at_ms()?;
        let waiting_since_ms = parts.waiting_since_ms(redrive_count)?;
        let work = parts.work(&self.work)?;
        let wait = parts.wait(requested_at_ms)?;
        Ok(AcquireRequest {
            lock,
            terms,
            identity,
            run: Run(redrive_count.unwrap_or(0)),
            requested_at_ms,
            waiting_since_ms,
            work,
            wait,
        })
    }

    /// The lock and place in line a wait payload (one with `task_token`) names, resolved as
    /// [`Resolver::acquire`] resolves them; `None` for a payload that does not wait.
    pub fn waiter(&self, payload: &Value) -> Result<Option<(LockName, QueueKey)>, HandlerError> {
        let parts = Parts::new(payload, ACQUIRE_PAYLOAD)?;
        let Some(wait) = parts.wait(parts.payload.requested_at_ms()?)? else {
            return Ok(None);
        };
        let target = parts.target(&self.defaults)?;
        Ok(Some((target.lock, wait.key(&target.identity))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";
    const DEMO: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:demo-work";
    const MINE: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:mine";
    const FUNCTION: &str = "arn:aws:lambda:us-east-1:123456789012:function:mine";
    const RUNNER: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:work-function";

    fn resolver() -> Resolver {
        Resolver {
            defaults: Defaults {
                lock: Some(LockName::new("demo-lock").unwrap()),
                limit: Some(Limit::new(5).unwrap()),
                ..Defaults::default()
            },
            work: AllowedWork {
                default: Some(DEMO.to_owned()),
                state_machines: vec![DEMO.to_owned(), MINE.to_owned()],
                functions: vec![FUNCTION.to_owned()],
                runner: Some(RUNNER.to_owned()),
            },
        }
    }

    fn machine_payload(input: Value) -> Value {
        json!({
            "input": input,
            "holder": HOLDER,
            "redrive_count": 0,
            "started_at": "2026-12-03T10:15:00.000Z",
            "requested_at": "2026-12-03T10:15:30.123Z"
        })
    }

    #[test]
    fn the_payload_wins_over_the_input_which_wins_over_the_defaults() {
        let r = resolver();
        let from_defaults = r.acquire(&machine_payload(json!({}))).unwrap();
        assert_eq!(from_defaults.lock.as_str(), "demo-lock");
        assert_eq!(from_defaults.terms.limit.get(), 5);
        assert_eq!(from_defaults.identity.acquisition.as_str(), "r0");
        assert_eq!(from_defaults.waiting_since_ms, Some(1_796_292_900_000));
        assert_eq!(from_defaults.requested_at_ms, 1_796_292_930_123);
        assert_eq!(
            from_defaults.work,
            Some(Work {
                arn: DEMO.to_owned(),
                kind: WorkKind::StateMachine,
                state_machine: DEMO.to_owned()
            })
        );

        let from_input = r
            .acquire(&machine_payload(
                json!({"lock": "a", "limit": 2, "work": FUNCTION}),
            ))
            .unwrap();
        assert_eq!(
            (from_input.lock.as_str(), from_input.terms.limit.get()),
            ("a", 2)
        );
        assert_eq!(
            from_input.work,
            Some(Work {
                arn: FUNCTION.to_owned(),
                kind: WorkKind::Function,
                state_machine: RUNNER.to_owned()
            })
        );

        let mut explicit = machine_payload(json!({"lock": "a", "limit": 2}));
        explicit["lock"] = json!("b");
        explicit["limit"] = json!(3);
        explicit["acquisition"] = json!("uuid-1");
        let explicit = r.acquire(&explicit).unwrap();
        assert_eq!(
            (
                explicit.lock.as_str(),
                explicit.terms.limit.get(),
                explicit.identity.acquisition.as_str()
            ),
            ("b", 3, "uuid-1")
        );

        // Without defaults and without the input, the lock is named as missing.
        let bare = Resolver::default();
        let err = bare
            .acquire(&json!({"holder": HOLDER, "redrive_count": 0, "requested_at": "2026-12-03T10:15:30Z"}))
            .unwrap_err();
        assert_eq!(err.message(), format!("lock is missing: {}", missing::LOCK));
        // Without an input there is no work to resolve.
        let explicit = bare
            .acquire(
                &json!({"lock": "l", "limit": 1, "holder": HOLDER, "acquisition": "a",
                "requested_at": "2026-12-03T10:15:30Z"}),
            )
            .unwrap();
        assert_eq!(explicit.work, None);
        assert_eq!(explicit.run, Run::FIRST);
        assert_eq!(explicit.waiting_since_ms, None);
    }

    #[test]
    fn a_redriven_run_gets_its_own_acquisition_and_waits_since_its_redrive() {
        let r = resolver();
        let mut payload = machine_payload(json!({}));
        payload["redrive_count"] = json!(2);
        let request = r.acquire(&payload).unwrap();
        assert_eq!(request.identity.acquisition.as_str(), "r2");
        assert_eq!(request.run, Run(2), "it checks the fence of its own run");
        // Only the first start is known: the wait has no budget rather than a spent one.
        assert_eq!(request.waiting_since_ms, None);

        // The whole execution node carries the redrive time.
        let node = json!({
            "execution": {
                "Id": HOLDER,
                "Input": {"lock": "x"},
                "Name": "run-1",
                "StartTime": "2026-12-01T00:00:00.000Z",
                "RedriveCount": 1,
                "RedriveTime": "2026-12-03T10:00:00.000Z"
            },
            "requested_at": "2026-12-03T10:15:30.123Z"
        });
        let request = r.acquire(&node).unwrap();
        assert_eq!(request.lock.as_str(), "x");
        assert_eq!(request.identity.holder.as_str(), HOLDER);
        assert_eq!(request.identity.acquisition.as_str(), "r1");
        assert_eq!(request.waiting_since_ms, Some(1_796_292_000_000));
        // Never redriven: no RedriveCount in the node (moto's context object has none) is 0.
        let mut first = node.clone();
        let execution = first["execution"].as_object_mut().unwrap();
        execution.remove("RedriveCount");
        execution.remove("RedriveTime");
        let request = r.acquire(&first).unwrap();
        assert_eq!(request.identity.acquisition.as_str(), "r0");
        assert_eq!(request.waiting_since_ms, Some(1_796_083_200_000));
        assert_eq!(
            r.target(&json!({"execution": first["execution"]}))
                .unwrap()
                .identity,
            request.identity
        );
    }

    #[test]
    fn bad_inputs_are_named() {
        let r = resolver();
        let message = |input: Value| r.acquire(&machine_payload(input)).unwrap_err().to_string();
        assert_eq!(
            message(json!([1])),
            format!("input must be a JSON object ({INPUT_IS}); got an array [1]")
        );
        assert!(message(json!({"semaphore": 1}))
            .starts_with("the execution input has the key \"semaphore\", which is reserved"));
        assert_eq!(
            message(json!({"limit": 0})),
            "input.limit: limit must be a whole number from 1 to 1000; got 0"
        );
        assert_eq!(
            message(json!({"lock": 3})),
            "input.lock must be a JSON string; got a number 3"
        );
        assert_eq!(
            message(json!({"work": 3})),
            "input.work must be a JSON string; got a number 3"
        );
        let other = "arn:aws:states:us-east-1:123456789012:stateMachine:other";
        assert_eq!(
            message(json!({"work": other})),
            format!(
                "input.work is \"{other}\", which this stack does not allow: name one it allows \
                 (state machines: {DEMO}, {MINE}; Lambda functions: {FUNCTION}), or leave it out \
                 to run the default, {DEMO}. To allow another, add it to the stack's \
                 WorkStateMachineArns or WorkFunctionArns parameter (the acquire function's \
                 WORK_STATE_MACHINES and WORK_FUNCTIONS)"
            )
        );
        let mut no_default = r.clone();
        no_default.work.default = None;
        assert!(no_default
            .acquire(&machine_payload(json!({})))
            .unwrap_err()
            .message()
            .starts_with("input.work is missing and the function has no DEFAULT_WORK"));
        let mut payload = machine_payload(json!({}));
        payload["redrive_count"] = json!(-1);
        assert_eq!(
            r.acquire(&payload).unwrap_err().message(),
            "redrive_count must be a whole number from 0 (Step Functions' \
             $$.Execution.RedriveCount); got a number -1"
        );
        payload.as_object_mut().unwrap().remove("redrive_count");
        assert_eq!(
            r.acquire(&payload).unwrap_err().message(),
            format!("acquisition is missing: {}", missing::ACQUISITION)
        );
    }

    #[test]
    fn weight_and_rate_come_from_the_payload_else_the_input_else_the_defaults() {
        let weight = |r: &Resolver, payload: &Value| r.acquire(payload).unwrap().terms.weight.get();
        let rate = |r: &Resolver, payload: &Value| {
            r.acquire(payload)
                .unwrap()
                .terms
                .rate
                .map(|rate| rate.spacing_ms())
        };
        // Nothing anywhere: weight 1, no rate.
        let r = resolver();
        let bare = machine_payload(json!({}));
        assert_eq!((weight(&r, &bare), rate(&r, &bare)), (1, None));
        // The function's defaults.
        let mut with_defaults = resolver();
        with_defaults.defaults.weight = Some(Weight::new(2).unwrap());
        with_defaults.defaults.rate = Some(Rate::per_second(4.0).unwrap());
        assert_eq!(
            (weight(&with_defaults, &bare), rate(&with_defaults, &bare)),
            (2, Some(250))
        );
        // The input wins over the defaults.
        let from_input = machine_payload(json!({"weight": 3, "rate": 0.5}));
        assert_eq!(
            (
                weight(&with_defaults, &from_input),
                rate(&with_defaults, &from_input)
            ),
            (3, Some(2_000))
        );
        // The payload wins over the input.
        let mut explicit = from_input.clone();
        explicit["weight"] = json!(4);
        explicit["rate"] = json!(10);
        assert_eq!(
            (
                weight(&with_defaults, &explicit),
                rate(&with_defaults, &explicit)
            ),
            (4, Some(100))
        );
        // null is "not given": the next source decides.
        let nulls = machine_payload(json!({"weight": null, "rate": null}));
        assert_eq!(
            (weight(&with_defaults, &nulls), rate(&with_defaults, &nulls)),
            (2, Some(250))
        );
        // The release resolves the weight alike (its hint of what to free).
        assert_eq!(with_defaults.target(&explicit).unwrap().weight.get(), 4);
        assert_eq!(with_defaults.target(&from_input).unwrap().weight.get(), 3);
        assert_eq!(with_defaults.target(&bare).unwrap().weight.get(), 2);
        assert_eq!(r.target(&bare).unwrap().weight, Weight::ONE);
    }

    #[test]
    fn bad_weights_and_rates_are_named_where_they_came_from() {
        let r = resolver();
        let weight = "weight must be a whole number from 1 to the limit (1000 at most)";
        let rate = "rate must be a number of acquisitions per second from 0.000011574074074074073 \
                    (one a day) to 1000";
        let cases: Vec<(Value, String)> = vec![
            (
                json!({"weight": 0}),
                format!("input.weight: {weight}; got 0"),
            ),
            (
                json!({"weight": -1}),
                format!("input.weight: {weight}; got -1"),
            ),
            (
                json!({"weight": 2.5}),
                format!("input.weight: {weight}; got 2.5"),
            ),
            (
                json!({"weight": "4"}),
                format!("input.weight: {weight}; got the string \"4\""),
            ),
            (
                json!({"weight": 6}),
                "weight 6 is above the limit 5: it could never be granted; ask for at most 5, \
                 or raise the limit"
                    .to_owned(),
            ),
            (
                json!({"limit": 2, "weight": 3}),
                "weight 3 is above the limit 2: it could never be granted; ask for at most 2, \
                 or raise the limit"
                    .to_owned(),
            ),
            (json!({"rate": 0}), format!("input.rate: {rate}; got 0")),
            (json!({"rate": -2}), format!("input.rate: {rate}; got -2")),
            (
                json!({"rate": "fast"}),
                format!("input.rate: {rate}; got the string \"fast\""),
            ),
            (
                json!({"rate": 1e9}),
                format!("input.rate: {rate}; got 1000000000"),
            ),
        ];
        for (input, message) in cases {
            let err = r.acquire(&machine_payload(input.clone())).unwrap_err();
            assert_eq!(err.error_type(), "SemaphoreInvalidInput", "{input}");
            assert_eq!(err.message(), message, "{input}");
        }
        // In the payload itself, the field is named without a prefix, and a bad payload value
        // is refused even when the input has a good one.
        let mut payload = machine_payload(json!({"weight": 1, "rate": 1}));
        payload["weight"] = json!(0);
        assert_eq!(
            r.acquire(&payload).unwrap_err().message(),
            format!("{weight}; got 0")
        );
        payload["weight"] = json!(1);
        payload["rate"] = json!("2/s");
        assert_eq!(
            r.acquire(&payload).unwrap_err().message(),
            format!("{rate}; got the string \"2/s\"")
        );
    }

    /// The answer the acquire function gave `machine_payload(input)`, as the lock-protected
    /// machine keeps it in `$.semaphore` (the fields a later task reads).
    fn answer(lock: &str, work: Value, acquisition: &str, waiting_since: &str) -> Value {
        json!({
            "acquired": false, "outcome": "full", "token": null, "limit": 2, "weight": 2,
            "rate": 0.5, "lock": lock, "holder": HOLDER, "acquisition": acquisition,
            "queued_at": "2026-12-03T10:15:30.123Z", "fallback_seconds": 300,
            "waiting_since": waiting_since, "work": work
        })
    }

    #[test]
    fn a_wait_or_release_that_passes_the_answer_instead_of_the_input_resolves_alike() {
        let r = resolver();
        let input = json!({"lock": "a", "limit": 2, "weight": 2, "rate": 0.5, "work": FUNCTION});
        let first = r.acquire(&machine_payload(input)).unwrap();
        let work = json!({
            "state_machine": RUNNER, "name": "run-1-0123456789abcdef",
            "context": {"semaphore": {"lock": "a", "fencing_token": null, "holder": HOLDER,
                                      "acquisition": "r0", "function": FUNCTION}}
        });
        let since = "2026-12-03T10:15:00.000Z";
        // The lock-protected machine's wait payload: no input, no execution node.
        let wait = json!({
            "holder": HOLDER, "redrive_count": 0, "started_at": since,
            "answer": answer("a", work.clone(), "r0", since),
            "requested_at": "2026-12-03T10:20:30.000Z", "task_token": "token-1",
            "queued_at": "2026-12-03T10:15:30.123Z"
        });
        let waited = r.acquire(&wait).unwrap();
        assert_eq!(
            (
                &waited.lock,
                waited.terms,
                &waited.identity,
                waited.work.as_ref()
            ),
            (
                &first.lock,
                first.terms,
                &first.identity,
                first.work.as_ref()
            )
        );
        assert_eq!(waited.waiting_since_ms, first.waiting_since_ms);
        assert_eq!(
            r.waiter(&wait).unwrap().map(|(lock, _)| lock.to_string()),
            Some("a".to_owned())
        );
        // State machine work is named by the answer's state_machine.
        let mut mine = wait.clone();
        mine["answer"]["work"] = json!({"state_machine": MINE, "name": "n", "context": {}});
        assert_eq!(r.acquire(&mine).unwrap().work.unwrap().arn, MINE);
        // A work the stack no longer allows is refused, and named where it came from.
        let mut gone = wait.clone();
        gone["answer"]["work"]["context"]["semaphore"]["function"] =
            json!("arn:aws:lambda:us-east-1:123456789012:function:gone");
        let err = r.acquire(&gone).unwrap_err().to_string();
        assert!(err.starts_with("answer.work is \"arn:aws:lambda"), "{err}");
        // A redriven run's wait with no execution node: the answer's start is its own run's
        // only if the answer is (a run redriven into its wait follows the earlier run's answer).
        let redriven_at = "2026-12-04T08:00:00.000Z";
        let mut own = wait.clone();
        own["redrive_count"] = json!(1);
        own["answer"] = answer("a", work.clone(), "r1", redriven_at);
        assert_eq!(
            r.acquire(&own).unwrap().waiting_since_ms,
            Some(1_796_371_200_000)
        );
        let mut stale = own.clone();
        stale["answer"]["acquisition"] = json!("r0");
        assert_eq!(r.acquire(&stale).unwrap().waiting_since_ms, None);
        // The release payload: the answer gives the lock and the weight.
        let release =
            json!({"holder": HOLDER, "redrive_count": 0, "answer": answer("a", work, "r0", since)});
        let target = r.target(&release).unwrap();
        assert_eq!(
            (
                target.lock.as_str(),
                target.weight.get(),
                target.identity.acquisition.as_str()
            ),
            ("a", 2, "r0")
        );
        // An input, where a payload has one, wins over the answer.
        let mut both = wait;
        both["input"] = json!({"lock": "b", "limit": 2});
        assert_eq!(r.acquire(&both).unwrap().lock.as_str(), "b");
    }

    #[test]
    fn a_release_after_failure_reads_the_failed_states_data() {
        let r = resolver();
        let since = "2026-12-03T10:15:00.000Z";
        let error = json!({"Error": "States.TaskFailed", "Cause": "the child's description"});
        // The work failed: the state holds the acquire answer (the lock the input named).
        let after_work = json!({
            "holder": HOLDER, "redrive_count": 0,
            "state": {"semaphore": answer("a", json!(null), "r0", since), "error": error}
        });
        let target = r.target(&after_work).unwrap();
        assert_eq!((target.lock.as_str(), target.weight.get()), ("a", 2));
        // The acquire failed: the state is the execution input with what the Catch caught.
        let after_acquire = json!({
            "holder": HOLDER, "redrive_count": 0,
            "state": {"lock": "b", "limit": 3, "weight": 3, "error": error}
        });
        let target = r.target(&after_acquire).unwrap();
        assert_eq!((target.lock.as_str(), target.weight.get()), ("b", 3));
        // An input naming none: the default lock, as for its acquire.
        let defaults = json!({"holder": HOLDER, "redrive_count": 0, "state": {"error": error}});
        assert_eq!(r.target(&defaults).unwrap().lock.as_str(), "demo-lock");
        // A state that is not an object is named.
        let bad = json!({"holder": HOLDER, "redrive_count": 0, "state": [1]});
        assert!(r
            .target(&bad)
            .unwrap_err()
            .to_string()
            .starts_with("state must be a JSON object"));
    }

    #[test]
    fn the_lock_of_an_acquire_payload_is_read_back_alike() {
        let r = resolver();
        assert_eq!(
            r.lock(&machine_payload(json!({"lock": "in-input"})))
                .unwrap()
                .as_str(),
            "in-input"
        );
        assert_eq!(
            r.lock(&machine_payload(json!({}))).unwrap().as_str(),
            "demo-lock"
        );
        let explicit = json!({"lock": "mine", "limit": 1, "holder": HOLDER, "acquisition": "a"});
        assert_eq!(r.lock(&explicit).unwrap().as_str(), "mine");
    }

    #[test]
    fn child_names_are_deterministic_short_and_safe() {
        let id = |holder: &str, acquisition: &str| {
            Identity::new(
                HolderId::new(holder).unwrap(),
                AcquisitionId::new(acquisition).unwrap(),
            )
        };
        let name = child_execution_name(&id(HOLDER, "r0"));
        assert_eq!(name, child_execution_name(&id(HOLDER, "r0")));
        assert!(name.starts_with("run-1-"), "{name}");
        assert_eq!(name.len(), "run-1-".len() + 16);
        assert_ne!(name, child_execution_name(&id(HOLDER, "r1")));
        let long = format!(
            "arn:aws:states:us-east-1:123456789012:execution:M:{}",
            "é x".repeat(40)
        );
        let name = child_execution_name(&id(&long, "r0"));
        assert_eq!(name.len(), 40 + 1 + 16, "{name}");
        assert!(name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        assert_eq!(child_execution_name(&id("x:", "a")).len(), 16);
    }

    #[test]
    fn work_arns_are_told_apart_by_form() {
        assert_eq!(WorkKind::of(MINE), Some(WorkKind::StateMachine));
        assert_eq!(
            WorkKind::of(&format!("{MINE}:prod")),
            Some(WorkKind::StateMachine)
        );
        assert_eq!(WorkKind::of(FUNCTION), Some(WorkKind::Function));
        assert_eq!(
            WorkKind::of(&format!("{FUNCTION}:$LATEST")),
            Some(WorkKind::Function)
        );
        for bad in [
            "mine",
            "arn:aws:states:us-east-1:123456789012:execution:mine:x",
            "arn:aws:states:us-east-1::stateMachine:mine",
            "arn:aws:s3:::bucket",
        ] {
            assert_eq!(WorkKind::of(bad), None, "{bad}");
        }
    }
}
