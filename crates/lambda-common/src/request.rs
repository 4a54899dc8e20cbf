//! What an acquire or release payload asks for, resolved against the function's configuration:
//! the one place that says which lock, limit, acquisition and work a payload is about. The
//! acquire and release functions use it, and so does the cleanup function when it reads an ended
//! execution's acquire payloads back from its history ([`Resolver::lock`], [`Resolver::waiter`]),
//! so that all of them agree on the lock an execution took. The payloads' fields and defaults are
//! in docs/using.md ("The request").

use semaphore_core::flow::acquire::{Request, Waiting};
use semaphore_core::flow::answer::{Work, WorkKind};
use semaphore_core::flow::release;
use semaphore_core::{
    AcquisitionId, Attempt, Identity, Limit, LockName, Rate, Run, TaskToken, Terms, WaiterId,
    Weight,
};
use serde_json::Value;

use crate::arn::ArnPatterns;
use crate::error::HandlerError;
use crate::payload::{quoted, Payload};

/// The acquire payload's fields, as named in errors.
pub const ACQUIRE_PAYLOAD: &str = r#"{"request": {"lock", "limit", "weight", "rate", "lease", "poll_seconds"} (each optional), "execution.$": "$$.Execution.Id", "redrive_count.$": "$$.Execution.RedriveCount", "state.$": "$$.State", "task_token.$": "$$.Task.Token" (a standard execution's; without it the caller polls and needs a lease)}"#;

/// The lease an Express workflow's acquire asks for: its 5-minute maximum duration plus the
/// default clock skew, so that it needs neither a heartbeat nor a cleanup.
pub const EXPRESS_LEASE_SECONDS: u64 = 302;

/// The release payload's fields, as named in errors.
pub const RELEASE_PAYLOAD: &str = r#"{"semaphore.$": "$.semaphore" (the acquire answer), "error.$": "$.error" (what a Catch caught, after a failure)}"#;

/// The key of the work's input under which it gets the semaphore's context: an execution input
/// that is the request of work must not have it (the work's input is the execution input
/// merged with the context).
pub const RESERVED_INPUT_KEY: &str = "semaphore";

/// What to pass when a field is missing.
mod hint {
    pub const REQUEST: &str = "pass what the execution asks for, e.g. \"request\": {\"lock\": \
        \"orders\"} (or the execution input, \"request.$\": \"$\")";
    pub const EXECUTION: &str = "pass the execution ARN, \"execution.$\": \"$$.Execution.Id\"";
    pub const STATE: &str = "pass the state's context object, \"state.$\": \"$$.State\" (its \
        EnteredTime is when the acquire was asked for)";
    pub const ENTERED: &str = "pass the state's context object whole, \"state.$\": \"$$.State\"";
    pub const ANSWER: &str = "pass the acquire answer, \"semaphore.$\": \"$.semaphore\"";
    pub const TOKEN: &str = "pass the acquire answer whole, \"semaphore.$\": \"$.semaphore\": \
        its token is the fencing token of the slot to free";
    pub const LOCK: &str = "pass \"lock\" in the request, e.g. \"lock\": \"demo-lock\", or set \
        the function's DEFAULT_LOCK";
    pub const LIMIT: &str = "pass \"limit\" in the request, a whole number from 1 to 10000, e.g. \
        \"limit\": 5, or set the function's DEFAULT_LIMIT";
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

/// Longest work ARN accepted, in bytes: `StartExecution` takes a state machine ARN of at most
/// 256 characters
/// (<https://docs.aws.amazon.com/step-functions/latest/apireference/API_StartExecution.html>)
/// and `Invoke` a function name or ARN of at most 256
/// (<https://docs.aws.amazon.com/lambda/latest/api/API_Invoke.html>). A longer one could never
/// start, and would size the waiter's record and the answer (F15).
pub const MAX_WORK_ARN_BYTES: usize = 256;

/// The work executions may run under a lock: the function's `DEFAULT_WORK`,
/// `WORK_STATE_MACHINES`, `WORK_FUNCTIONS` and `WORK_FUNCTION_RUNNER`, checked when read
/// ([`crate::Settings::allowed_work`]). The default allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedWork {
    pub(crate) default: Option<String>,
    pub(crate) state_machines: ArnPatterns,
    pub(crate) functions: ArnPatterns,
    /// The state machine that runs a Lambda function as a child execution.
    pub(crate) runner: Option<String>,
}

impl AllowedWork {
    /// What may be named, for messages.
    fn describe(&self) -> String {
        format!(
            "state machines: {}; Lambda functions: {}",
            self.state_machines, self.functions
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
        if arn.len() > MAX_WORK_ARN_BYTES {
            return Err(HandlerError::InvalidInput(format!(
                "{field} is {} bytes long; a state machine or Lambda function ARN is at most \
                 {MAX_WORK_ARN_BYTES}: name one this stack allows ({})",
                arn.len(),
                self.describe()
            )));
        }
        let kind = if WorkKind::of(arn) == Some(WorkKind::StateMachine)
            && self.state_machines.matches(arn)
        {
            WorkKind::StateMachine
        } else if WorkKind::of(arn) == Some(WorkKind::Function) && self.functions.matches(arn) {
            WorkKind::Function
        } else {
            let default = match &self.default {
                Some(default) => format!(", or leave it out to run the default, {default}"),
                None => String::new(),
            };
            return Err(HandlerError::InvalidInput(format!(
                "{field} is {}, which this stack does not allow: name one it allows ({}){default}. \
                 To allow another, name it under the stack's WorkStateMachinePrefix or \
                 WorkFunctionPrefix parameter (the acquire function's WORK_STATE_MACHINES and \
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

/// Resolves payloads against the function's defaults and allowed work. Build it once per cold
/// start ([`crate::Settings::resolver`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolver {
    pub defaults: Defaults,
    pub work: AllowedWork,
}

/// An acquire payload's parts: the payload itself and its request.
struct Acquire<'a> {
    payload: Payload<'a>,
    request: Payload<'a>,
}

impl<'a> Acquire<'a> {
    fn new(value: &'a Value) -> Result<Self, HandlerError> {
        let payload = Payload::new(value, ACQUIRE_PAYLOAD)?;
        let request = payload
            .object("request", "request.", "what the execution asks for")?
            .ok_or_else(|| payload.missing("request", hint::REQUEST))?;
        Ok(Self { payload, request })
    }

    fn lock(&self, defaults: &Defaults) -> Result<LockName, HandlerError> {
        self.request
            .optional_lock("lock")?
            .or_else(|| defaults.lock.clone())
            .ok_or_else(|| HandlerError::InvalidInput(format!("lock is missing: {}", hint::LOCK)))
    }

    /// The limit, weight and rate, each the request's else the default; a weight above the
    /// limit is refused.
    fn terms(&self, lock: &LockName, defaults: &Defaults) -> Result<Terms, HandlerError> {
        let asked_limit = self.request.optional_limit("limit")?;
        let asked_rate = self.request.optional_rate("rate")?;
        // F14: the stack's default lock is configured by its parameters (LockName,
        // ConcurrencyLimit, DefaultRate): its limit and rate are those, whatever an execution
        // asks. A configuration its operator stored in the lock (`semctl lock set`) wins over
        // both, when the write lands.
        let (limit, rate) = match (&defaults.lock, defaults.limit) {
            (Some(default), Some(limit)) if default == lock => (Some(limit), defaults.rate),
            _ => (asked_limit.or(defaults.limit), asked_rate.or(defaults.rate)),
        };
        let limit = limit.ok_or_else(|| {
            HandlerError::InvalidInput(format!("limit is missing: {}", hint::LIMIT))
        })?;
        let weight = self
            .request
            .optional_weight("weight")?
            .or(defaults.weight)
            .unwrap_or_default();
        let lease = self.request.optional_lease("lease")?;
        Terms::new(limit, weight, rate)
            .map(|terms| terms.with_lease(lease))
            .map_err(|e| HandlerError::InvalidInput(e.to_string()))
    }

    /// The execution's identity in its run: `r<redrive_count>` (absent: its first run).
    fn identity(&self) -> Result<(Identity, Run), HandlerError> {
        let holder = self
            .payload
            .optional_holder("execution")?
            .ok_or_else(|| self.payload.missing("execution", hint::EXECUTION))?;
        let count = self
            .payload
            .optional_count("redrive_count", "$$.Execution.RedriveCount")?
            .unwrap_or(0);
        // F15: the run sizes the fences a cleanup or a redriven release writes.
        let run = Run::new(count)
            .map_err(|e| HandlerError::InvalidInput(format!("redrive_count: {e}")))?;
        Ok((Identity::new(holder, incarnation_acquisition(count)), run))
    }

    /// The state's entry time (the request time) and its attempt there.
    fn entered(&self) -> Result<(u64, Attempt), HandlerError> {
        let state = self
            .payload
            .object("state", "state.", hint::ENTERED)?
            .ok_or_else(|| self.payload.missing("state", hint::STATE))?;
        let entered_at_ms = state
            .optional_time_ms("EnteredTime", "$$.State.EnteredTime")?
            .ok_or_else(|| state.missing("EnteredTime", hint::ENTERED))?;
        let retries = state
            .optional_count("RetryCount", "$$.State.RetryCount")?
            .unwrap_or(0);
        Ok((
            entered_at_ms,
            Attempt::new(entered_at_ms, u64::from(retries)),
        ))
    }

    /// Parked on `task_token` when there is one; else it polls, its place kept for
    /// `request.poll_seconds` between polls.
    fn waiting(&self) -> Result<Waiting, HandlerError> {
        let poll = self
            .request
            .optional_count("poll_seconds", "poll_seconds")?;
        match self.payload.optional_string("task_token")? {
            Some(token) => {
                if poll.is_some() {
                    return Err(HandlerError::InvalidInput(
                        "request.poll_seconds is for a caller without a task_token (which polls): \
                         a parked task is woken, leave it out"
                            .to_owned(),
                    ));
                }
                TaskToken::new(token)
                    .map(Waiting::Parked)
                    .map_err(|e| HandlerError::InvalidInput(format!("task_token: {e}")))
            }
            None => {
                let seconds = u64::from(poll.unwrap_or(Waiting::DEFAULT_POLL_SECONDS as u32));
                if !(1..=Waiting::MAX_POLL_SECONDS).contains(&seconds) {
                    return Err(HandlerError::InvalidInput(format!(
                        "request.poll_seconds must be a whole number of seconds from 1 to {} \
                         (how long the caller's place in line is kept between two polls); got {seconds}",
                        Waiting::MAX_POLL_SECONDS
                    )));
                }
                Ok(Waiting::Polls {
                    poll_ms: seconds * 1000,
                })
            }
        }
    }
}

/// The acquisition of run `redrive_count` of an execution: `r0` for its first run.
pub fn incarnation_acquisition(redrive_count: u32) -> AcquisitionId {
    AcquisitionId::new(format!("r{redrive_count}")).expect("r<digits> is a valid acquisition id")
}

impl Resolver {
    /// The lock an acquire payload asks for: its request's `lock`, else `DEFAULT_LOCK`. What the
    /// cleanup function reads from the payloads of an ended execution's acquire tasks; an error
    /// means the acquire refused that payload the same way, so nothing was held under it.
    pub fn lock(&self, payload: &Value) -> Result<LockName, HandlerError> {
        Acquire::new(payload)?.lock(&self.defaults)
    }

    /// The lock and the waiter an acquire payload is about: where the execution may stand in
    /// line (every acquire task may have queued it).
    pub fn waiter(&self, payload: &Value) -> Result<(LockName, WaiterId), HandlerError> {
        let acquire = Acquire::new(payload)?;
        let (identity, _) = acquire.identity()?;
        Ok((acquire.lock(&self.defaults)?, WaiterId::of(&identity)))
    }

    /// A validated acquire request. A request that is the input of work must be an object
    /// without the reserved key `semaphore`, and the work it names (or the default) must be one
    /// this stack allows.
    pub fn acquire(&self, payload: &Value) -> Result<Request, HandlerError> {
        let acquire = Acquire::new(payload)?;
        let starts_work = acquire
            .payload
            .optional_bool("starts_work")?
            .unwrap_or(false);
        let work = if starts_work {
            if acquire.request.has(RESERVED_INPUT_KEY) {
                return Err(HandlerError::InvalidInput(format!(
                    "the execution input has the key \"{RESERVED_INPUT_KEY}\", which is reserved: \
                     the work's input is the execution input plus \"{RESERVED_INPUT_KEY}\": \
                     {{lock, fencing_token, holder, acquisition}}; rename that key of the input"
                )));
            }
            Some(self.work.resolve(&acquire.request)?)
        } else {
            if acquire.request.get("work").is_some() {
                return Err(HandlerError::InvalidInput(
                    "request.work names work to run under the slot, which only a payload with \
                     \"starts_work\": true (the lock-protected machine's) runs: leave it out and \
                     run your work in your own states after the acquire"
                        .to_owned(),
                ));
            }
            None
        };
        // Who asks and from which task first: a payload the acquire state did not render is
        // named as such before what it asks for.
        let (identity, run) = acquire.identity()?;
        let (requested_at_ms, attempt) = acquire.entered()?;
        let waiting = acquire.waiting()?;
        let lock = acquire.lock(&self.defaults)?;
        let terms = acquire.terms(&lock, &self.defaults)?;
        if matches!(waiting, Waiting::Polls { .. }) {
            if terms.lease.is_none() {
                return Err(HandlerError::InvalidInput(format!(
                    "request.lease is missing: a caller without a task_token (an Express \
                     workflow, a function, a script) holds its slot under a lease, which nobody \
                     else can end for it: pass \"lease\" in seconds, e.g. \"lease\": {} for an \
                     Express workflow (its 5-minute maximum plus the clock skew). A standard \
                     execution passes \"task_token.$\": \"$$.Task.Token\" instead",
                    EXPRESS_LEASE_SECONDS
                )));
            }
            // A poller finds a granted slot at its next poll: a poll window longer than the lease
            // could let the lease pass before it comes (model-check --pollers --poll-ticks 2).
            if let (Waiting::Polls { poll_ms }, Some(lease)) = (&waiting, terms.lease) {
                if *poll_ms > lease.as_ms() {
                    return Err(HandlerError::InvalidInput(format!(
                        "request.poll_seconds ({} s) must be at most the lease ({lease}): a \
                         poller granted a slot finds it at its next poll, which must come before \
                         the lease passes",
                        poll_ms / 1000
                    )));
                }
            }
            if work.is_some() {
                return Err(HandlerError::InvalidInput(
                    "starts_work needs a task_token: the lock-protected machine parks on \
                     .waitForTaskToken"
                        .to_owned(),
                ));
            }
        }
        Ok(Request {
            terms,
            lock,
            identity,
            run,
            requested_at_ms,
            asked_at_ms: requested_at_ms,
            attempt,
            waiting,
            work,
        })
    }

    /// Whom a release payload is about: the lock, holder, acquisition and weight of the acquire
    /// answer it passes (the weight else `DEFAULT_WEIGHT`, else 1).
    pub fn target(&self, payload: &Value) -> Result<release::Request, HandlerError> {
        let payload = Payload::new(payload, RELEASE_PAYLOAD)?;
        let answer = payload
            .object("semaphore", "semaphore.", hint::ANSWER)?
            .ok_or_else(|| payload.missing("semaphore", hint::ANSWER))?;
        let lock = answer
            .optional_lock("lock")?
            .ok_or_else(|| answer.missing("lock", hint::ANSWER))?;
        let holder = answer
            .optional_holder("holder")?
            .ok_or_else(|| answer.missing("holder", hint::ANSWER))?;
        let acquisition = answer
            .optional_acquisition("acquisition")?
            .ok_or_else(|| answer.missing("acquisition", hint::ANSWER))?;
        let token = answer
            .optional_token("token")?
            .ok_or_else(|| answer.missing("token", hint::TOKEN))?;
        let weight = answer
            .optional_weight("weight")?
            .or(self.defaults.weight)
            .unwrap_or_default();
        let run = incarnation_of(&acquisition)
            .map(|n| {
                Run::new(n).map_err(|e| {
                    HandlerError::InvalidInput(format!("semaphore.acquisition {acquisition}: {e}"))
                })
            })
            .transpose()?;
        Ok(release::Request {
            lock,
            run: run.map(|run| run.0),
            identity: Identity::new(holder, acquisition),
            token,
            weight,
        })
    }
}

/// The run an acquisition `r<n>` was made in: n (an acquisition named so by the acquire;
/// another, a caller's own id, names no run).
pub(crate) fn incarnation_of(acquisition: &AcquisitionId) -> Option<u32> {
    let digits = acquisition.as_str().strip_prefix('r')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Digits past a u32 are a run past any an execution can have.
    Some(digits.parse().unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use semaphore_core::FencingToken;
    use serde_json::json;

    const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";
    const DEMO: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:demo-work";
    const MINE: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:mine";
    const FUNCTION: &str = "arn:aws:lambda:us-east-1:123456789012:function:mine";
    const RUNNER: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:work-function";
    /// 2026-12-03T10:15:30.123Z
    const ENTERED_MS: u64 = 1_796_292_930_123;

    fn resolver() -> Resolver {
        Resolver {
            defaults: Defaults {
                lock: Some(LockName::new("demo-lock").unwrap()),
                limit: Some(Limit::new(5).unwrap()),
                ..Defaults::default()
            },
            work: AllowedWork {
                default: Some(DEMO.to_owned()),
                state_machines: ArnPatterns::parse(&format!("{DEMO},{MINE}"), |_| true).unwrap(),
                functions: ArnPatterns::parse(FUNCTION, |_| true).unwrap(),
                runner: Some(RUNNER.to_owned()),
            },
        }
    }

    /// The payload of an acquire task asking for `request` (as the fragment sends it).
    fn payload(request: Value) -> Value {
        json!({
            "request": request,
            "execution": HOLDER,
            "redrive_count": 0,
            "state": {"EnteredTime": "2026-12-03T10:15:30.123Z", "Name": "Acquire slot", "RetryCount": 0},
            "task_token": "token-1"
        })
    }

    /// As the lock-protected machine sends it: its input as the request, and its work.
    fn machine_payload(input: Value) -> Value {
        let mut payload = payload(input);
        payload["starts_work"] = json!(true);
        payload
    }

    #[test]
    fn the_request_wins_over_the_defaults() {
        let r = resolver();
        let bare = r.acquire(&payload(json!({}))).unwrap();
        assert_eq!(bare.lock.as_str(), "demo-lock");
        assert_eq!(
            (bare.terms.limit.get(), bare.terms.weight, bare.terms.rate),
            (5, Weight::ONE, None)
        );
        assert_eq!(bare.identity.holder.as_str(), HOLDER);
        assert_eq!(bare.identity.acquisition.as_str(), "r0");
        assert_eq!(bare.run, Run::FIRST);
        assert_eq!(bare.requested_at_ms, ENTERED_MS);
        assert_eq!(bare.attempt, Attempt::new(ENTERED_MS, 0));
        assert_eq!(
            bare.waiting,
            Waiting::Parked(TaskToken::new("token-1").unwrap())
        );
        assert_eq!(
            bare.work, None,
            "only the lock-protected machine starts work"
        );

        let asked = r
            .acquire(&payload(
                json!({"lock": "a", "limit": 3, "weight": 2, "rate": 0.5}),
            ))
            .unwrap();
        assert_eq!(
            (
                asked.lock.as_str(),
                asked.terms.limit.get(),
                asked.terms.weight.get(),
                asked.terms.rate.map(|r| r.spacing_ms())
            ),
            ("a", 3, 2, Some(2_000))
        );
        // The function's defaults fill in what the request leaves out; null is left out.
        let mut with_defaults = resolver();
        with_defaults.defaults.weight = Some(Weight::new(2).unwrap());
        with_defaults.defaults.rate = Some(Rate::per_second(4.0).unwrap());
        let defaulted = with_defaults
            .acquire(&payload(json!({"weight": null})))
            .unwrap();
        assert_eq!(
            (
                defaulted.terms.weight.get(),
                defaulted.terms.rate.map(|r| r.spacing_ms())
            ),
            (2, Some(250))
        );
        // Without defaults, the lock and the limit are named as missing.
        let bare = Resolver::default();
        let err = bare.acquire(&payload(json!({}))).unwrap_err();
        assert_eq!(err.message(), format!("lock is missing: {}", hint::LOCK));
        let err = bare.acquire(&payload(json!({"lock": "l"}))).unwrap_err();
        assert_eq!(err.message(), format!("limit is missing: {}", hint::LIMIT));
    }

    #[test]
    fn the_lock_protected_machine_gets_its_work_from_its_input_else_the_default() {
        let r = resolver();
        let default = r.acquire(&machine_payload(json!({}))).unwrap();
        assert_eq!(
            default.work,
            Some(Work {
                arn: DEMO.to_owned(),
                kind: WorkKind::StateMachine,
                state_machine: DEMO.to_owned()
            })
        );
        let function = r
            .acquire(&machine_payload(json!({"work": FUNCTION, "order": 42})))
            .unwrap();
        assert_eq!(
            function.work,
            Some(Work {
                arn: FUNCTION.to_owned(),
                kind: WorkKind::Function,
                state_machine: RUNNER.to_owned()
            })
        );
    }

    #[test]
    fn each_run_and_each_attempt_is_told_apart() {
        let r = resolver();
        let mut redriven = payload(json!({}));
        redriven["redrive_count"] = json!(2);
        redriven["state"]["RetryCount"] = json!(3);
        let request = r.acquire(&redriven).unwrap();
        assert_eq!(request.identity.acquisition.as_str(), "r2");
        assert_eq!(request.run, Run(2), "it checks the fence of its own run");
        assert_eq!(request.attempt, Attempt::new(ENTERED_MS, 3));
        assert!(request.attempt > r.acquire(&payload(json!({}))).unwrap().attempt);
        // moto's context object may lack RedriveCount and RetryCount: the first run, no retry.
        let mut bare = payload(json!({}));
        bare.as_object_mut().unwrap().remove("redrive_count");
        bare["state"] = json!({"EnteredTime": "2026-12-03T10:15:30.123456+00:00"});
        let request = r.acquire(&bare).unwrap();
        assert_eq!(
            (request.identity.acquisition.as_str(), request.attempt),
            ("r0", Attempt::new(ENTERED_MS, 0))
        );
    }

    #[test]
    fn bad_inputs_are_named() {
        let r = resolver();
        let message = |payload: Value| r.acquire(&payload).unwrap_err().to_string();
        assert_eq!(
            message(json!([1])),
            format!("the payload must be a JSON object {ACQUIRE_PAYLOAD}; got an array [1]")
        );
        assert_eq!(
            message(payload(json!([1]))),
            "request must be a JSON object (what the execution asks for); got an array [1]"
        );
        let mut no_request = payload(json!({}));
        no_request.as_object_mut().unwrap().remove("request");
        assert_eq!(
            message(no_request),
            format!("request is missing: {}", hint::REQUEST)
        );
        assert!(message(machine_payload(json!({"semaphore": 1})))
            .starts_with("the execution input has the key \"semaphore\", which is reserved"));
        assert!(message(payload(json!({"work": MINE})))
            .starts_with("request.work names work to run under the slot"));
        assert_eq!(
            message(payload(json!({"limit": 0}))),
            "request.limit: limit must be a whole number from 1 to 10000; got 0"
        );
        assert_eq!(
            message(payload(json!({"lock": 3}))),
            "request.lock must be a JSON string; got a number 3"
        );
        let other = "arn:aws:states:us-east-1:123456789012:stateMachine:other";
        assert!(
            message(machine_payload(json!({"work": other}))).starts_with(&format!(
                "request.work is \"{other}\", which this stack does not allow"
            ))
        );
        let mut no_default = r.clone();
        no_default.work.default = None;
        assert!(no_default
            .acquire(&machine_payload(json!({})))
            .unwrap_err()
            .message()
            .starts_with("request.work is missing and the function has no DEFAULT_WORK"));
        let mut bad = payload(json!({}));
        bad["redrive_count"] = json!(-1);
        assert_eq!(
            message(bad),
            "redrive_count must be a whole number from 0 (Step Functions' \
             $$.Execution.RedriveCount); got a number -1"
        );
        for (field, hint) in [("execution", hint::EXECUTION), ("state", hint::STATE)] {
            let mut without = payload(json!({}));
            without.as_object_mut().unwrap().remove(field);
            assert_eq!(message(without), format!("{field} is missing: {hint}"));
        }
        let mut not_entered = payload(json!({}));
        not_entered["state"] = json!({"Name": "Acquire slot"});
        assert_eq!(
            message(not_entered),
            format!("state.EnteredTime is missing: {}", hint::ENTERED)
        );
        let mut not_bool = machine_payload(json!({}));
        not_bool["starts_work"] = json!("yes");
        assert_eq!(
            message(not_bool),
            "starts_work must be true or false; got a string \"yes\""
        );
    }

    #[test]
    fn bad_weights_and_rates_are_named() {
        let r = resolver();
        let weight = "weight must be a whole number from 1 to the limit (10000 at most)";
        let rate = "rate must be a number of acquisitions per second from 0.000011574074074074073 \
                    (one a day) to 1000";
        let cases: Vec<(Value, String)> = vec![
            (
                json!({"weight": 0}),
                format!("request.weight: {weight}; got 0"),
            ),
            (
                json!({"weight": -1}),
                format!("request.weight: {weight}; got -1"),
            ),
            (
                json!({"weight": 2.5}),
                format!("request.weight: {weight}; got 2.5"),
            ),
            (
                json!({"weight": "4"}),
                format!("request.weight: {weight}; got the string \"4\""),
            ),
            (
                json!({"weight": 6}),
                "weight 6 is above the limit 5: it could never be granted; ask for at most 5, \
                 or raise the limit"
                    .to_owned(),
            ),
            (json!({"rate": 0}), format!("request.rate: {rate}; got 0")),
            (json!({"rate": -2}), format!("request.rate: {rate}; got -2")),
            (
                json!({"rate": "fast"}),
                format!("request.rate: {rate}; got the string \"fast\""),
            ),
            (
                json!({"rate": 1e9}),
                format!("request.rate: {rate}; got 1000000000"),
            ),
        ];
        for (request, message) in cases {
            let err = r.acquire(&payload(request.clone())).unwrap_err();
            assert_eq!(err.error_type(), "SemaphoreInvalidInput", "{request}");
            assert_eq!(err.message(), message, "{request}");
        }
    }

    #[test]
    fn a_release_is_about_the_answer_it_passes() {
        let r = resolver();
        let answer = json!({"semaphore": {"acquired": true, "lock": "a", "holder": HOLDER,
                                          "acquisition": "r1", "weight": 3, "token": 7}});
        let target = r.target(&answer).unwrap();
        assert_eq!(target.lock.as_str(), "a");
        assert_eq!(target.identity.holder.as_str(), HOLDER);
        assert_eq!(target.identity.acquisition.as_str(), "r1");
        assert_eq!((target.run, target.weight.get()), (Some(1), 3));
        assert_eq!(target.token, FencingToken(7));
        // No weight: the default, else 1; an acquisition not made per run names no run.
        let bare = json!({"semaphore": {"lock": "a", "holder": HOLDER, "acquisition": "uuid-1",
                                        "token": 2}});
        let target = r.target(&bare).unwrap();
        assert_eq!((target.run, target.weight), (None, Weight::ONE));
        let message = |payload: Value| r.target(&payload).unwrap_err().to_string();
        assert_eq!(
            message(json!({})),
            format!("semaphore is missing: {}", hint::ANSWER)
        );
        assert_eq!(
            message(json!({"semaphore": {"lock": "a", "holder": HOLDER}})),
            format!("semaphore.acquisition is missing: {}", hint::ANSWER)
        );
        assert_eq!(
            message(json!({"semaphore": {"lock": "", "holder": HOLDER, "acquisition": "r0"}})),
            "semaphore.lock: lock name is empty: pass the name of the semaphore, e.g. \"demo-lock\""
        );
        // F15: no token, or one no lock gives, is refused by name.
        assert_eq!(
            message(json!({"semaphore": {"lock": "a", "holder": HOLDER, "acquisition": "r0"}})),
            format!("semaphore.token is missing: {}", hint::TOKEN)
        );
        for (token, got) in [
            (json!(0), "0"),
            (json!(1_000_000_000_000_000u64), "1000000000000000"),
            (json!(-3), "-3"),
            (json!("7"), "the string \"7\""),
            (json!(2.5), "2.5"),
        ] {
            let payload = json!({"semaphore": {"lock": "a", "holder": HOLDER,
                                               "acquisition": "r0", "token": token}});
            assert_eq!(
                message(payload),
                format!(
                    "semaphore.token: token must be the fencing token of the acquire answer, a \
                     whole number from 1 to {}; got {got}",
                    FencingToken::MAX
                )
            );
        }
        // F15: a run no execution can have (its release would fence every run before it).
        for acquisition in ["r12500", "r4294967295", "r99999999999999999999"] {
            let payload = json!({"semaphore": {"lock": "a", "holder": HOLDER,
                                               "acquisition": acquisition, "token": 1}});
            assert!(
                message(payload).starts_with(&format!("semaphore.acquisition {acquisition}: run ")),
                "{acquisition}"
            );
        }
        let last = json!({"semaphore": {"lock": "a", "holder": HOLDER, "acquisition": "r12499",
                                        "token": 1}});
        assert_eq!(r.target(&last).unwrap().run, Some(Run::MAX.0));
    }

    #[test]
    fn the_cleanup_reads_an_acquire_payloads_lock_and_waiter_as_the_acquire_does() {
        let r = resolver();
        for request in [json!({}), json!({"lock": "mine", "limit": 1})] {
            let p = payload(request);
            let acquired = r.acquire(&p).unwrap();
            assert_eq!(r.lock(&p).unwrap(), acquired.lock);
            assert_eq!(
                r.waiter(&p).unwrap(),
                (acquired.lock.clone(), WaiterId::of(&acquired.identity))
            );
        }
        assert!(r.lock(&payload(json!({"lock": 3}))).is_err());
    }
}
