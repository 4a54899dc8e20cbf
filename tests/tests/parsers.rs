//! F15, fuzzed: what the four functions read from outside, given anything. A payload of any JSON
//! (nested, huge numbers, long strings, wrong types), and payloads shaped like the real ones with
//! any field replaced by anything, go through each function's parse step; so do an ended
//! execution's status-change event, the acquire payloads its history keeps, and what is read
//! back from the tables (a lock's item, a waiter's record and its kept answer). Each must answer
//! or refuse by name, never panic; what it accepts is within its bounds (a run at most
//! `Run::MAX`, which sizes the fences written later; a token at most `FencingToken::MAX`; the
//! core's limits); and its allocations peak within a small multiple of the input's JSON text,
//! never in proportion to a number in it (a release naming `r4294967295` once asked for 274 GB).
//!
//! The sweeper reads nothing from its event (the schedule's): its handler drops it unread, so it
//! has no parse step to fuzz.
//!
//! No AWS here: parsing sends nothing. Each property runs proptest's default 256 cases (seconds);
//! a longer run: `PROPTEST_CASES=20000 cargo test -p semaphore-tests --test parsers --release`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_sfn::primitives::DateTime;
use aws_sdk_sfn::types::{
    HistoryEvent, HistoryEventType as Kind, LambdaFunctionScheduledEventDetails,
    TaskScheduledEventDetails,
};
use lambda_common::history::{self, LockReading};
use lambda_common::{granted_answer, HandlerError, Resolver, Settings};
use proptest::prelude::*;
use proptest::sample::select;
use semaphore_core::dynamo::{decode, decode_waiter, encode, encode_waiter};
use semaphore_core::flow::acquire::Waiting;
use semaphore_core::input::{
    MAX_ACQUISITION_BYTES, MAX_HOLDER_BYTES, MAX_LIMIT, MAX_LOCK_NAME_BYTES, MAX_TASK_TOKEN_BYTES,
};
use semaphore_core::{
    AcquisitionId, Attempt, FencingToken, HolderId, Holding, Identity, Lease, Limit, LockName, Run,
    SemaphoreItem, TaskToken, Terms, Waiter, Weight,
};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Allocations, counted per thread (proptest runs each property on the test's own thread).

struct Counting;

thread_local! {
    /// Bytes allocated minus freed on this thread since the last `measured` began.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The most `LIVE` reached since then.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    // `try_with`: a thread being torn down has no counters any more.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            track(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            track(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        track(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            track(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most a parse may hold at once: `ALLOWED_PER_INPUT_BYTE` times its input's JSON text, plus
/// `ALLOWED_BASE`: the resolver's own strings and messages, and a payload parsed again from text
/// (a history keeps it as text), whose 128 levels of nesting (serde_json's limit) may hold a map
/// node each, about 80 KB. A parse that allocated by a number in its input passes both at once:
/// the fences of 12,500 runs alone are 100 KB of keys.
const ALLOWED_PER_INPUT_BYTE: usize = 4;
const ALLOWED_BASE: usize = 128 * 1024;

/// `f`'s result and the most it held allocated at once on this thread.
fn measured<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LIVE.with(|live| live.set(0));
    PEAK.with(|peak| peak.set(0));
    let out = f();
    let peak = PEAK.with(Cell::get);
    (out, usize::try_from(peak).unwrap_or(0))
}

fn allowed(input_bytes: usize) -> usize {
    ALLOWED_BASE + ALLOWED_PER_INPUT_BYTE * input_bytes
}

/// The longest refusal message: what to fix, never the input whole (`lambda_common::quoted`
/// cuts a value to 80 characters); the allowed work lists are the longest part.
const MAX_MESSAGE: usize = 2_048;

// ---------------------------------------------------------------------------------------------
// Strategies.

const HOLDER: &str = "arn:aws:states:us-east-1:123456789012:execution:LockProtected:run-1";
const DEMO: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:demo-work";
const FUNCTION: &str = "arn:aws:lambda:us-east-1:123456789012:function:my-work";
const RUNNER: &str = "arn:aws:states:us-east-1:123456789012:stateMachine:work-function";
const ACQUIRE: &str = "arn:aws:lambda:us-east-1:123456789012:function:stack-acquire";
const ENTERED: &str = "2026-12-03T10:15:30.123Z";

/// Numbers at and around every bound, and any.
fn number() -> BoxedStrategy<Value> {
    prop_oneof![
        select(vec![
            json!(0),
            json!(1),
            json!(-1),
            json!(Run::MAX.0),
            json!(Run::MAX.0 + 1),
            json!(20_000),
            json!(u32::MAX),
            json!(u64::from(u32::MAX) + 1),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(FencingToken::MAX),
            json!(FencingToken::MAX + 1),
            json!(MAX_LIMIT),
            json!(MAX_LIMIT + 1),
            json!(86_400),
            json!(86_401),
            json!(Waiting::MAX_POLL_SECONDS),
            json!(Waiting::MAX_POLL_SECONDS + 1),
            json!(0.5),
            json!(1e300),
            json!(-1e300),
            json!(f64::MIN_POSITIVE),
        ]),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("a JSON number", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
    ]
    .boxed()
}

/// Strings the parsers treat specially, long ones, and any.
fn text() -> BoxedStrategy<String> {
    prop_oneof![
        select(vec![
            "",
            "r0",
            "r1",
            "r12499",
            "r12500",
            "r20000",
            "r4294967295",
            "r4294967296",
            "r99999999999999999999",
            "r-1",
            "r",
            "r01",
            "demo-lock",
            HOLDER,
            DEMO,
            FUNCTION,
            ACQUIRE,
            ENTERED,
            "9999-12-31T23:59:59.999Z",
            "0001-01-01T00:00:00Z",
            "2026-12-03T10:15:30.123456789123+14:00",
            "FAILED",
            "TIMED_OUT",
            "aws.states",
            "Step Functions Execution Status Change",
            "a#b",
            "\u{7}",
            "{}",
            "[",
            "'arn:",
            "Execution Already Exists: 'arn:aws:states:us-east-1:1:execution:m:e'",
            "StepFunctions.ExecutionAlreadyExistsException",
        ])
        .prop_map(str::to_owned),
        "\\PC{0,24}",
        any::<String>(),
        ("[0-9]{1,140}").prop_map(|digits| format!("r{digits}")),
        (1usize..5_000, any::<char>()).prop_map(|(n, c)| c.to_string().repeat(n)),
    ]
    .boxed()
}

/// The fields the four parsers read, and any.
fn key() -> BoxedStrategy<String> {
    prop_oneof![
        3 => select(vec![
            "request", "execution", "redrive_count", "state", "EnteredTime", "RetryCount",
            "task_token", "starts_work", "lock", "limit", "weight", "rate", "lease",
            "poll_seconds", "work", "semaphore", "holder", "acquisition", "token", "error",
            "Error", "Cause", "detail", "detail-type", "source", "executionArn",
            "stateMachineArn", "name", "status", "startDate", "stopDate", "redriveCount",
            "FunctionName", "Payload",
        ])
        .prop_map(str::to_owned),
        1 => "\\PC{0,12}",
    ]
    .boxed()
}

/// Any JSON value, nested up to 8 deep.
fn any_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(8, 128, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..8)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
    .boxed()
}

/// A field as the real payload has it (mostly), anything, or absent.
fn field(valid: BoxedStrategy<Value>) -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        4 => valid.prop_map(Some),
        1 => any_json().prop_map(Some),
        1 => Just(None),
    ]
    .boxed()
}

/// An object of `fields`, each as [`field`] makes it.
fn object(fields: Vec<(&'static str, BoxedStrategy<Value>)>) -> BoxedStrategy<Value> {
    let (names, values): (Vec<_>, Vec<_>) = fields
        .into_iter()
        .map(|(name, valid)| (name, field(valid)))
        .unzip();
    values
        .prop_map(move |values| {
            Value::Object(
                names
                    .iter()
                    .zip(values)
                    .filter_map(|(name, value)| Some(((*name).to_owned(), value?)))
                    .collect(),
            )
        })
        .boxed()
}

fn one_of(values: Vec<Value>) -> BoxedStrategy<Value> {
    select(values).boxed()
}

fn small(range: std::ops::RangeInclusive<u64>) -> BoxedStrategy<Value> {
    range.prop_map(Value::from).boxed()
}

/// A run as Step Functions counts them, near the bound, or past it.
fn run() -> BoxedStrategy<Value> {
    prop_oneof![
        small(0..=3),
        one_of(vec![
            json!(Run::MAX.0),
            json!(Run::MAX.0 + 1),
            json!(u32::MAX),
            json!(u64::MAX)
        ]),
    ]
    .boxed()
}

/// An acquire task's payload, as the acquire state renders it, any field replaced or left out.
fn acquire_payload() -> BoxedStrategy<Value> {
    let request = object(vec![
        ("lock", one_of(vec![json!("demo-lock"), json!("orders")])),
        ("limit", small(1..=10)),
        ("weight", small(1..=3)),
        ("rate", one_of(vec![json!(0.5), json!(2), json!(1000)])),
        ("lease", small(1..=600)),
        ("poll_seconds", small(1..=900)),
        ("work", one_of(vec![json!(DEMO), json!(FUNCTION)])),
    ]);
    prop_oneof![
        4 => object(vec![
            ("request", request),
            ("execution", one_of(vec![json!(HOLDER), json!("a-script")])),
            ("redrive_count", run()),
            (
                "state",
                object(vec![
                    ("EnteredTime", one_of(vec![json!(ENTERED)])),
                    ("RetryCount", small(0..=5)),
                ]),
            ),
            ("task_token", one_of(vec![json!("token-1")])),
            ("starts_work", any::<bool>().prop_map(Value::Bool).boxed()),
        ]),
        1 => any_json(),
    ]
    .boxed()
}

/// A release task's payload (the acquire answer, and what a Catch caught), any field replaced.
fn release_payload() -> BoxedStrategy<Value> {
    let acquisition = prop_oneof![
        run().prop_map(|n| json!(format!("r{n}"))),
        Just(json!("3f1c2a9e-5b7d-4c4c-8d8d-0123456789ab")),
    ]
    .boxed();
    let cause = prop_oneof![
        text().prop_map(Value::String),
        any_json().prop_map(|child| Value::String(child.to_string())),
        Just(json!(
            json!({"error": "E", "executionArn": DEMO, "status": "FAILED"}).to_string()
        )),
    ]
    .boxed();
    prop_oneof![
        4 => object(vec![
            (
                "semaphore",
                object(vec![
                    ("lock", one_of(vec![json!("demo-lock")])),
                    ("holder", one_of(vec![json!(HOLDER)])),
                    ("acquisition", acquisition),
                    (
                        "token",
                        prop_oneof![
                            small(1..=1_000),
                            one_of(vec![json!(FencingToken::MAX), json!(FencingToken::MAX + 1)])
                        ]
                        .boxed(),
                    ),
                    ("weight", small(1..=3)),
                ]),
            ),
            (
                "error",
                object(vec![
                    (
                        "Error",
                        one_of(vec![
                            json!("States.TaskFailed"),
                            json!("StepFunctions.ExecutionAlreadyExistsException"),
                        ]),
                    ),
                    ("Cause", cause),
                ]),
            ),
        ]),
        1 => any_json(),
    ]
    .boxed()
}

/// An EventBridge "Step Functions Execution Status Change" event, any field replaced.
fn status_change_event() -> BoxedStrategy<Value> {
    let detail = object(vec![
        ("executionArn", one_of(vec![json!(HOLDER)])),
        (
            "stateMachineArn",
            one_of(vec![json!(
                "arn:aws:states:us-east-1:123456789012:stateMachine:LockProtected"
            )]),
        ),
        ("name", one_of(vec![json!("run-1")])),
        ("status", one_of(vec![json!("FAILED"), json!("ABORTED")])),
        ("startDate", small(0..=1_800_000_000_000)),
        ("stopDate", small(0..=1_800_000_000_000)),
        ("redriveCount", run()),
        (
            "input",
            any_json()
                .prop_map(|v| Value::String(v.to_string()))
                .boxed(),
        ),
    ]);
    prop_oneof![
        4 => object(vec![
            ("detail-type", one_of(vec![json!("Step Functions Execution Status Change")])),
            ("source", one_of(vec![json!("aws.states")])),
            ("detail", detail),
            ("time", one_of(vec![json!(ENTERED)])),
            ("resources", one_of(vec![json!([])])),
        ]),
        1 => any_json(),
    ]
    .boxed()
}

// ---------------------------------------------------------------------------------------------
// The functions' parse steps, configured as the template configures them.

fn settings(
    vars: &'static [(&'static str, &'static str)],
) -> Settings<impl Fn(&str) -> Option<String>> {
    Settings::from_lookup(move |name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    })
}

const ENV: &[(&str, &str)] = &[
    ("DEFAULT_LOCK", "demo-lock"),
    ("DEFAULT_LIMIT", "5"),
    ("DEFAULT_WORK", DEMO),
    ("WORK_STATE_MACHINES", DEMO),
    ("WORK_FUNCTIONS", FUNCTION),
    ("WORK_FUNCTION_RUNNER", RUNNER),
    ("ACQUIRE_FUNCTION_ARN", ACQUIRE),
];

fn acquire_resolver() -> Resolver {
    settings(ENV).resolver().expect("the template's settings")
}

fn release_resolver() -> Resolver {
    lambda_release::resolver(&settings(ENV)).expect("the template's settings")
}

fn cleanup_config() -> lambda_cleanup::Config {
    lambda_cleanup::Config::from_settings(&settings(ENV)).expect("the template's settings")
}

/// A refusal as the runtime reports it: by name, saying what to fix, in a few lines.
fn refused_by_name(e: &HandlerError) -> Result<(), TestCaseError> {
    prop_assert_eq!(e.error_type(), "SemaphoreInvalidInput", "{}", e);
    prop_assert!(!e.message().is_empty());
    prop_assert!(
        e.message().len() <= MAX_MESSAGE,
        "a message of {} bytes: {}...",
        e.message().len(),
        &e.message()[..e.message().floor_char_boundary(200)]
    );
    Ok(())
}

fn check_acquire(resolver: &Resolver, payload: &Value) -> Result<(), TestCaseError> {
    let input = payload.to_string().len();
    let (parsed, peak) = measured(|| resolver.acquire(payload));
    prop_assert!(
        peak <= allowed(input),
        "held {peak} bytes for {input} of input"
    );
    match parsed {
        Ok(request) => {
            prop_assert!(request.run <= Run::MAX);
            prop_assert!(request.terms.limit.get() <= MAX_LIMIT);
            prop_assert!(request.terms.weight.get() <= request.terms.limit.get());
            prop_assert!(request
                .terms
                .lease
                .is_none_or(|lease| lease.as_ms() <= Lease::MAX_MS));
            prop_assert!(request.lock.as_str().len() <= MAX_LOCK_NAME_BYTES);
            prop_assert!(request.identity.holder.as_str().len() <= MAX_HOLDER_BYTES);
            match &request.waiting {
                Waiting::Parked(token) => {
                    prop_assert!(token.as_str().len() <= MAX_TASK_TOKEN_BYTES)
                }
                Waiting::Polls { poll_ms } => {
                    prop_assert!(*poll_ms <= Waiting::MAX_POLL_SECONDS * 1000)
                }
            }
        }
        Err(e) => refused_by_name(&e)?,
    }
    Ok(())
}

fn check_release(resolver: &Resolver, payload: &Value) -> Result<(), TestCaseError> {
    let input = payload.to_string().len();
    let (parsed, peak) = measured(|| {
        let request = lambda_release::ReleaseRequest::parse(resolver, payload)?;
        // What the release answers after a failure: the caught cause is read as JSON.
        let failed = request
            .failure
            .as_ref()
            .map(|failure| lambda_release::fail_with(failure, &request.target));
        Ok::<_, HandlerError>((request, failed))
    });
    prop_assert!(
        peak <= allowed(input),
        "held {peak} bytes for {input} of input"
    );
    match parsed {
        Ok((request, _)) => {
            let target = request.target;
            prop_assert!(target.run.is_none_or(|run| run <= Run::MAX.0));
            prop_assert!((1..=FencingToken::MAX).contains(&target.token.0));
            prop_assert!(target.weight.get() <= MAX_LIMIT);
            prop_assert!(target.identity.acquisition.as_str().len() <= MAX_ACQUISITION_BYTES);
        }
        Err(e) => refused_by_name(&e)?,
    }
    Ok(())
}

fn check_event(payload: &Value) -> Result<(), TestCaseError> {
    let input = payload.to_string().len();
    let (parsed, peak) = measured(|| {
        lambda_cleanup::parse_event(payload.clone()).map(|event| {
            // What the cleanup checks before it asks Step Functions anything.
            let arn = event.detail.execution_arn.clone();
            let holder = HolderId::new(arn.as_str()).is_ok();
            let arn = lambda_common::arn::ExecutionArn::parse(&arn);
            (event, holder, arn)
        })
    });
    // The event is taken by value: a copy of it is part of the input.
    prop_assert!(
        peak <= allowed(2 * input),
        "held {peak} bytes for {input} of input"
    );
    match parsed {
        Ok((event, _, _)) => {
            prop_assert_eq!(event.source.as_str(), lambda_cleanup::SOURCE);
        }
        Err(e) => refused_by_name(&e)?,
    }
    Ok(())
}

fn scheduled(id: i64, parameters: String) -> HistoryEvent {
    HistoryEvent::builder()
        .id(id)
        .previous_event_id(id - 1)
        .timestamp(DateTime::from_secs(0))
        .r#type(Kind::TaskScheduled)
        .task_scheduled_event_details(
            TaskScheduledEventDetails::builder()
                .resource_type("lambda")
                .resource("invoke.waitForTaskToken")
                .region("us-east-1")
                .parameters(parameters)
                .build()
                .expect("the required fields"),
        )
        .build()
        .expect("the required fields")
}

fn lambda_scheduled(id: i64, input: String) -> HistoryEvent {
    HistoryEvent::builder()
        .id(id)
        .previous_event_id(id - 1)
        .timestamp(DateTime::from_secs(0))
        .r#type(Kind::LambdaFunctionScheduled)
        .lambda_function_scheduled_event_details(
            LambdaFunctionScheduledEventDetails::builder()
                .resource(ACQUIRE)
                .input(input)
                .build()
                .expect("the required fields"),
        )
        .build()
        .expect("the required fields")
}

/// The history events of an ended execution's acquire tasks, their payloads as given: as a
/// `lambda:invoke` task's `Payload` (an object, or JSON text), or a Lambda state's input.
fn history_of(payloads: &[(u8, Value)]) -> Vec<HistoryEvent> {
    payloads
        .iter()
        .enumerate()
        .map(|(n, (form, payload))| {
            let id = i64::try_from(n).unwrap_or_default() + 1;
            match form % 3 {
                0 => scheduled(
                    id,
                    json!({"FunctionName": ACQUIRE, "Payload": payload}).to_string(),
                ),
                1 => scheduled(
                    id,
                    json!({"FunctionName": ACQUIRE, "Payload": payload.to_string()}).to_string(),
                ),
                _ => lambda_scheduled(id, payload.to_string()),
            }
        })
        .collect()
}

fn check_history(
    config: &lambda_cleanup::Config,
    payloads: &[(u8, Value)],
) -> Result<(), TestCaseError> {
    let events = history_of(payloads);
    let input: usize = payloads.iter().map(|(_, p)| p.to_string().len() + 64).sum();
    let lock_of = |payload: &Value| config.resolver.lock(payload);
    let waiter_of = |payload: &Value| config.resolver.waiter(payload).ok();
    let (footprint, peak) = measured(|| {
        history::read(
            &events,
            Some(LockReading {
                acquire: &config.acquire,
                lock_of: &lock_of,
                waiter_of: &waiter_of,
            }),
        )
    });
    prop_assert!(
        peak <= allowed(input),
        "held {peak} bytes for {input} of input"
    );
    // At most one lock, one line and one note per acquire task: what the cleanup writes and
    // answers grows with the history (at most 25,000 events), never with a number in it.
    prop_assert!(footprint.locks.len() <= payloads.len());
    prop_assert!(footprint.waiters.len() <= payloads.len());
    prop_assert!(footprint.notes.len() <= payloads.len());
    prop_assert!(footprint.children.is_empty());
    // A payload the acquire refuses (a run past the bound, say) puts nobody in line: the
    // acquire never queued it.
    for (_, payload) in payloads {
        if let Ok((lock, waiter)) = config.resolver.waiter(payload) {
            prop_assert!(footprint.waiters.contains(&(lock, waiter)));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// What is read back from the tables.

/// Any attribute value, and numbers past every range a decoder checks.
fn attribute() -> BoxedStrategy<AttributeValue> {
    let leaf = prop_oneof![
        prop_oneof![
            "[0-9]{1,45}",
            "-?[0-9]{0,5}(\\.[0-9]{0,3})?(e[0-9]{1,3})?",
            select(vec![
                "0".to_owned(),
                "12499".to_owned(),
                "12500".to_owned(),
                "10001".to_owned(),
                "4294967295".to_owned(),
                "4294967296".to_owned(),
                "18446744073709551616".to_owned(),
                "99999999999999999999999999999999999999".to_owned(),
            ]),
        ]
        .prop_map(AttributeValue::N),
        text().prop_map(AttributeValue::S),
        prop::collection::vec(any::<u8>(), 0..20).prop_map(|b| AttributeValue::B(Blob::new(b))),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..12), 0..12)
            .prop_map(|set| AttributeValue::Bs(set.into_iter().map(Blob::new).collect())),
        any::<bool>().prop_map(AttributeValue::Bool),
        Just(AttributeValue::Null(true)),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(AttributeValue::L),
            prop::collection::hash_map("\\PC{0,140}", inner, 0..6).prop_map(AttributeValue::M),
        ]
    })
    .boxed()
}

/// A lock's item as this version writes it: two holders (one leased), fences, a configuration.
fn stored_item() -> HashMap<String, AttributeValue> {
    let mut item = SemaphoreItem::empty(LockName::new("demo-lock").unwrap());
    item.version = semaphore_core::Version(9);
    item.limit = Some(Limit::new(5).unwrap());
    for (n, acquisition) in ["r0", "r3"].into_iter().enumerate() {
        let identity = Identity::new(
            HolderId::new(HOLDER).unwrap(),
            AcquisitionId::new(acquisition).unwrap(),
        );
        item.holders.insert(
            identity.clone(),
            Holding {
                token: FencingToken(7 + n as u64),
                acquired_at_ms: 1_796_292_930_123,
                weight: Weight::new(2).unwrap(),
            },
        );
        item.fences
            .young
            .insert(semaphore_core::FenceKey::acquisition(&identity));
    }
    item.used = 4;
    item.held_bytes = item.bytes_held();
    encode(&item)
}

/// A waiter's record as this version writes it.
fn stored_waiter() -> HashMap<String, AttributeValue> {
    let identity = Identity::new(
        HolderId::new(HOLDER).unwrap(),
        AcquisitionId::new("r2").unwrap(),
    );
    let waiter = Waiter::new(
        LockName::new("demo-lock").unwrap(),
        identity,
        Run(2),
        Terms::from(Limit::new(5).unwrap()),
        1_796_292_930_123,
        TaskToken::new("token-1").unwrap(),
        Attempt::new(1_796_292_930_123, 0),
        json!({"lock": "demo-lock"}).to_string(),
    );
    encode_waiter(&waiter)
}

/// `stored` with some attributes replaced by anything and others added.
fn corrupted(
    stored: HashMap<String, AttributeValue>,
) -> BoxedStrategy<HashMap<String, AttributeValue>> {
    let names: Vec<String> = stored.keys().cloned().collect();
    let replaced = prop::collection::vec((select(names), attribute()), 1..4);
    let added = prop::collection::vec(("\\PC{0,12}", attribute()), 0..3);
    (replaced, added)
        .prop_map(move |(replaced, added)| {
            let mut item = stored.clone();
            item.extend(replaced);
            item.extend(added);
            item
        })
        .boxed()
}

/// A rough size of what DynamoDB would hand back (at most 400 KB an item).
fn stored_bytes(item: &HashMap<String, AttributeValue>) -> usize {
    format!("{item:?}").len()
}

// ---------------------------------------------------------------------------------------------
// The properties.

proptest! {
    #[test]
    fn any_acquire_payload_is_taken_within_its_bounds_or_refused_by_name(
        payload in acquire_payload(),
    ) {
        check_acquire(&acquire_resolver(), &payload)?;
    }

    #[test]
    fn any_release_payload_is_taken_within_its_bounds_or_refused_by_name(
        payload in release_payload(),
    ) {
        check_release(&release_resolver(), &payload)?;
    }

    #[test]
    fn any_status_change_event_is_read_or_refused_by_name(event in status_change_event()) {
        check_event(&event)?;
    }

    #[test]
    fn any_history_of_acquire_payloads_names_at_most_a_lock_and_a_line_per_task(
        payloads in prop::collection::vec((any::<u8>(), acquire_payload()), 0..12),
    ) {
        check_history(&cleanup_config(), &payloads)?;
    }

    #[test]
    fn any_stored_lock_item_is_read_within_its_bounds_or_refused_by_name(
        attrs in corrupted(stored_item()),
    ) {
        let input = stored_bytes(&attrs);
        let (decoded, peak) = measured(|| decode(&attrs));
        prop_assert!(peak <= allowed(input), "held {peak} bytes for {input} of input");
        if let Ok(item) = decoded {
            prop_assert!(item.limit.is_none_or(|limit| limit.get() <= MAX_LIMIT));
            prop_assert!(item.version.0 <= FencingToken::MAX);
            for holding in item.holders.values() {
                prop_assert!(holding.token.0 <= FencingToken::MAX);
                prop_assert!(holding.weight.get() <= MAX_LIMIT);
            }
        }
    }

    #[test]
    fn any_stored_waiter_is_read_within_its_bounds_or_refused_by_name(
        attrs in corrupted(stored_waiter()),
        token in 1..=FencingToken::MAX,
    ) {
        let input = stored_bytes(&attrs);
        let (decoded, peak) = measured(|| {
            decode_waiter(&attrs).map(|waiter| {
                // The hand-off's answer to the granted waiter, made from its kept context.
                let answer = granted_answer(&waiter.context, FencingToken(token)).ok();
                (waiter, answer)
            })
        });
        prop_assert!(peak <= allowed(input), "held {peak} bytes for {input} of input");
        if let Ok((waiter, _)) = decoded {
            prop_assert!(waiter.run <= Run::MAX);
            prop_assert!(waiter.terms.limit.get() <= MAX_LIMIT);
            prop_assert!(waiter.terms.weight.get() <= waiter.terms.limit.get());
            if let Some(token) = waiter.task_token() {
                prop_assert!(token.as_str().len() <= MAX_TASK_TOKEN_BYTES);
            }
        }
    }

    #[test]
    fn any_kept_answer_makes_a_granted_answer_or_a_named_error(
        context in prop_oneof![
            any_json().prop_map(|v| v.to_string()),
            text(),
        ],
        token in 1..=FencingToken::MAX,
    ) {
        let input = context.len();
        let (answer, peak) = measured(|| granted_answer(&context, FencingToken(token)));
        prop_assert!(peak <= allowed(input), "held {peak} bytes for {input} of input");
        if let Ok(answer) = answer {
            let answer: Value = serde_json::from_str(&answer).expect("JSON");
            prop_assert_eq!(&answer["token"], &json!(token));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Nesting, and the runs of issue #37 by name.

/// The payload as the Lambda runtime hands it over: parsed from the invocation's JSON text, which
/// serde_json nests at most 128 deep. Deeper text is refused before the handler runs; text just
/// within it goes through every parser.
#[test]
fn payloads_nested_to_serde_jsons_limit_are_parsed_and_deeper_ones_refused_before_the_handler() {
    let nested = |depth: usize, inner: &str| {
        format!(
            "{}{inner}{}",
            "{\"request\":".repeat(depth),
            "}".repeat(depth)
        )
    };
    let too_deep = serde_json::from_str::<Value>(&nested(100_000, "{}"));
    assert!(
        too_deep
            .as_ref()
            .is_err_and(|e| e.to_string().contains("recursion limit")),
        "{too_deep:?}"
    );
    let (acquire, release, cleanup) = (acquire_resolver(), release_resolver(), cleanup_config());
    for inner in ["{}", "[1]", "\"r4294967295\"", "4294967295"] {
        let text = nested(126, inner);
        let payload: Value = serde_json::from_str(&text).expect("within the recursion limit");
        check_acquire(&acquire, &payload).unwrap();
        check_release(&release, &payload).unwrap();
        check_event(&payload).unwrap();
        check_history(
            &cleanup,
            &[(0, payload.clone()), (1, payload.clone()), (2, payload)],
        )
        .unwrap();
        let (answer, _) = measured(|| granted_answer(&text, FencingToken(1)));
        assert!(answer.is_ok(), "{answer:?}");
    }
}

/// The runs of issue #37 and the bound's edge, through every parser that reads a run.
#[test]
fn a_run_past_the_history_bound_is_refused_by_every_parser_and_the_last_one_taken() {
    let (acquire, release, cleanup) = (acquire_resolver(), release_resolver(), cleanup_config());
    let acquire_payload = |run: u64| {
        json!({"request": {}, "execution": HOLDER, "redrive_count": run,
               "state": {"EnteredTime": ENTERED}, "task_token": "token-1"})
    };
    let release_payload = |acquisition: &str| {
        json!({"semaphore": {"lock": "demo-lock", "holder": HOLDER,
                             "acquisition": acquisition, "token": 7}})
    };
    for run in [u64::from(Run::MAX.0) + 1, 20_000, u64::from(u32::MAX)] {
        let err = acquire.acquire(&acquire_payload(run)).unwrap_err();
        assert_eq!(err.error_type(), "SemaphoreInvalidInput");
        assert!(err.message().contains("past the last run"), "{err}");
        let err =
            lambda_release::ReleaseRequest::parse(&release, &release_payload(&format!("r{run}")))
                .unwrap_err();
        assert!(err.message().contains("past the last run"), "{err}");
        // The cleanup reads the lock the payload names (its fence stops any late acquire of
        // it), and no place in line: the acquire refused it before queueing.
        let payload = acquire_payload(run);
        assert_eq!(
            cleanup.resolver.lock(&payload).unwrap().as_str(),
            "demo-lock"
        );
        assert!(cleanup.resolver.waiter(&payload).is_err());
    }
    let last = acquire
        .acquire(&acquire_payload(u64::from(Run::MAX.0)))
        .unwrap();
    assert_eq!(
        (last.run, last.identity.acquisition.as_str()),
        (Run::MAX, "r12499")
    );
    let last = lambda_release::ReleaseRequest::parse(&release, &release_payload("r12499")).unwrap();
    assert_eq!(last.target.run, Some(Run::MAX.0));
}
